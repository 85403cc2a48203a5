"""The torch operators, their gradients and the tensor-parallel layers on several ranks: one launch
runs every scenario of workers/torch_ops_worker.py (operators against the front doors, the front
doors inside ``torch.compile(fullgraph=True)``, ``torch.autograd.gradcheck`` in fp64 of every
collective and fused op across the ranks, a compiled tensor-parallel MLP training one step against
the single-device model, argument errors, every operator and both layers on sub-groups).

On the cpu backend it runs at 2 ranks, and the group scenarios again at 4 (TP and DP pairs, a
non-contiguous group of 3: the layout sub-groups are for), and compiles with ``aot_eager`` (inductor's kernels cannot
run in Triton's interpreter); on the GPU (``tools/gpu-tests.sh``) at the world sizes of
``IRIS_TEST_WORLD_SIZES``, the scenarios shared out among them (``IRIS_TEST_SPREAD_CASES``: each
scenario at one world size, the group scenarios at those of 4 ranks and more; the operators'
host code is the same at every world size, and the kernels under them run at every world size in
the ccl and ops workers), and the GPU scenario also compiles with inductor, plain and with
``mode="reduce-overhead"`` (CUDA graphs), in bf16."""

from __future__ import annotations

import os
import re

import pytest

from iris.runtime.testing import run_ranks, scenario_params, spread, world_sizes

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "workers", "torch_ops_worker.py")
with open(WORKER) as _f:
    SCENARIOS = re.findall(r"^def scenario_(\w+)\(", _f.read(), re.M)
ON_GPU = os.environ.get("IRIS_BACKEND") in ("cuda", "nvshmem")
#: Run at 4 ranks on the cpu backend too (on the GPU at the world sizes of 4 ranks and more).
GROUP_SCENARIOS = [s for s in SCENARIOS if s.endswith("on_groups")]


def gpu_params() -> list:
    """Each world size's jobs on the GPU: its share of the scenarios (every scenario at every world
    size unless the cases are spread), the group scenarios where there are 4 ranks or more."""
    plain = [s for s in SCENARIOS if s not in GROUP_SCENARIOS]
    params = []
    for n in world_sizes():
        mine = set(spread(plain, n)) | (set(GROUP_SCENARIOS) if n >= 4 else set())
        params += scenario_params([n], [s for s in SCENARIOS if s in mine])
    return params


@pytest.mark.multirank
@pytest.mark.parametrize("nranks, scenarios", gpu_params() if ON_GPU else scenario_params([2], SCENARIOS))
def test_torch_ops_scenarios(nranks, scenarios):
    # A bound on hangs, not a budget (about a minute at 2 ranks on 2 cores).
    proc = run_ranks(nranks, WORKER, *scenarios, timeout=600, env={"MPIEXEC_TIMEOUT": "580"})
    assert re.findall(r"^PASS (\w+) \(", proc.stdout, re.M) == scenarios, proc.stdout + proc.stderr
    assert f", {nranks} ranks, " in proc.stdout


@pytest.mark.multirank
@pytest.mark.skipif(ON_GPU, reason="on the GPU the scenarios above run the group scenarios at 4 ranks")
def test_torch_ops_on_groups_at_4_ranks():
    # at 2 ranks the groups are cut down (a TP pair, DP singletons); 4 ranks give TP [0,1],[2,3],
    # DP [0,2],[1,3] and the non-contiguous [3,0,2]
    proc = run_ranks(4, WORKER, *GROUP_SCENARIOS, timeout=600, env={"MPIEXEC_TIMEOUT": "580"})
    assert re.findall(r"^PASS (\w+) \(", proc.stdout, re.M) == GROUP_SCENARIOS, proc.stdout + proc.stderr
    assert ", 4 ranks, " in proc.stdout
