"""The torch operators, their gradients and the tensor-parallel layers on several ranks: one launch
runs every scenario of workers/torch_ops_worker.py (operators against the front doors, the front
doors inside ``torch.compile(fullgraph=True)``, ``torch.autograd.gradcheck`` in fp64 of every
collective and fused op across the ranks, a compiled tensor-parallel MLP training one step against
the single-device model, argument errors).

On the cpu backend it runs at 2 ranks and compiles with ``aot_eager`` (inductor's kernels cannot
run in Triton's interpreter); on the GPU (``tools/gpu-tests.sh``) at the world sizes of
``IRIS_TEST_WORLD_SIZES``, and the GPU scenario also compiles with inductor, plain and with
``mode="reduce-overhead"`` (CUDA graphs), in bf16."""

from __future__ import annotations

import os
import re

import pytest

from iris.runtime.testing import run_ranks, world_sizes

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "workers", "torch_ops_worker.py")
with open(WORKER) as _f:
    SCENARIOS = re.findall(r"^def scenario_(\w+)\(", _f.read(), re.M)
ON_GPU = os.environ.get("IRIS_BACKEND") in ("cuda", "nvshmem")


@pytest.mark.multirank
@pytest.mark.parametrize("nranks", world_sizes() if ON_GPU else [2])
def test_torch_ops_scenarios(nranks):
    # A bound on hangs, not a budget (about a minute at 2 ranks on 2 cores).
    proc = run_ranks(nranks, WORKER, *SCENARIOS, timeout=600, env={"MPIEXEC_TIMEOUT": "580"})
    assert re.findall(r"^PASS (\w+) \(", proc.stdout, re.M) == SCENARIOS, proc.stdout + proc.stderr
    assert f", {nranks} ranks, " in proc.stdout
