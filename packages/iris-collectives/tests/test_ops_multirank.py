"""iris.collectives.ops on 1..N ranks: one launch per world size runs every scenario of
workers/ops_worker.py (the four fused ops, both all-reduce strategies, fp32/fp16/bf16, ragged
shapes, bias on and off, back-to-back calls without barriers, the tensor-descriptor path under the
interpreter, argument errors). World sizes from ``IRIS_TEST_WORLD_SIZES`` (default 1,2,3,4)."""

from __future__ import annotations

import os
import re

import pytest

from iris.runtime.testing import run_ranks, scenario_params, world_sizes

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "workers", "ops_worker.py")
GRAPH_WORKER = os.path.join(HERE, "workers", "ops_graph_worker.py")
with open(WORKER) as _f:
    SCENARIOS = re.findall(r"^def scenario_(\w+)\(", _f.read(), re.M)


@pytest.mark.multirank
@pytest.mark.parametrize("nranks, scenarios", scenario_params(world_sizes(), SCENARIOS))
def test_ops_scenarios(nranks, scenarios):
    # A bound on hangs, not a budget (4 interpreted ranks on 2 cores take well under a minute).
    proc = run_ranks(nranks, WORKER, *scenarios, timeout=400, env={"MPIEXEC_TIMEOUT": "380"})
    assert re.findall(r"^PASS (\w+) \(", proc.stdout, re.M) == scenarios, proc.stdout + proc.stderr
    assert f", {nranks} ranks, " in proc.stdout


@pytest.mark.multirank
@pytest.mark.skipif(os.environ.get("IRIS_BACKEND") != "cuda",
                    reason="CUDA graphs: cuda backend only (tools/gpu-tests.sh)")
@pytest.mark.parametrize("nranks", world_sizes())
def test_ops_cuda_graph_replays(nranks):
    # Every op and strategy captured once and replayed 20 times with new data (workers/ops_graph_worker.py).
    proc = run_ranks(nranks, GRAPH_WORKER, timeout=400, env={"MPIEXEC_TIMEOUT": "380"})
    assert re.search(r"^PASS graph_replays \(", proc.stdout, re.M), proc.stdout + proc.stderr
