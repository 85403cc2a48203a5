"""iris.collectives.ccl on 1..N ranks: one launch per world size runs every scenario of
workers/ccl_worker.py (every collective, op and dtype; 1 element to several ragged tiles; heap and
non-heap tensors, in place and not; 100 back-to-back calls; a mixed sequence; argument errors;
reduce, gather and scatter at every root; point to point: a ring, either order, tags in flight,
batches, a size mismatch, and on groups (the same tags on overlapping groups, against the
context's exchange); groups (TP and DP pairs, a non-contiguous group, interleaved; the bad
inputs of new_group and group=); all_to_all_v and the MoE dispatch and combine with counts on the device;
CUDA-graph and capacity-report scenarios that only run on the GPU). World sizes from ``IRIS_TEST_WORLD_SIZES``
(default 1,2,3,4)."""

from __future__ import annotations

import os
import re

import pytest

from iris.runtime.testing import run_ranks, scenario_params, world_sizes

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "workers", "ccl_worker.py")
with open(WORKER) as _f:
    ALL_SCENARIOS = re.findall(r"^def scenario_(\w+)\(", _f.read(), re.M)
#: Run by their own tests below: debug mode only, the GPU only.
SPECIAL = ("debug_mismatch", "cuda_graph", "exchanges_in_cuda_graph", "capacity_report")
SCENARIOS = [s for s in ALL_SCENARIOS if s not in SPECIAL]
ON_GPU = os.environ.get("IRIS_BACKEND") in ("cuda", "nvshmem")


@pytest.mark.multirank
@pytest.mark.parametrize("nranks, scenarios", scenario_params(world_sizes(), SCENARIOS))
def test_ccl_scenarios(nranks, scenarios):
    # A bound on hangs, not a budget.
    proc = run_ranks(nranks, WORKER, *scenarios, timeout=400, env={"MPIEXEC_TIMEOUT": "380"})
    assert re.findall(r"^PASS (\w+) \(", proc.stdout, re.M) == scenarios, proc.stdout + proc.stderr
    assert f", {nranks} ranks, " in proc.stdout


@pytest.mark.multirank
@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs: cuda backend only (tools/gpu-tests.sh)")
@pytest.mark.parametrize("nranks", [n for n in world_sizes() if n > 1])
def test_ccl_cuda_graph_replays(nranks):
    # A mixed sequence captured once and replayed 20 times with new data, every replay checked.
    proc = run_ranks(nranks, WORKER, "cuda_graph", timeout=300, env={"MPIEXEC_TIMEOUT": "280"})
    assert "PASS cuda_graph (" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.multirank
@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs: cuda backend only (tools/gpu-tests.sh)")
@pytest.mark.parametrize("nranks", [n for n in world_sizes() if n > 1])
def test_exchanges_in_cuda_graph(nranks):
    # all_to_all_v, moe.dispatch and moe.combine captured once, replayed with new counts each time
    proc = run_ranks(nranks, WORKER, "exchanges_in_cuda_graph", timeout=300, env={"MPIEXEC_TIMEOUT": "280"})
    assert "PASS exchanges_in_cuda_graph (" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.multirank
@pytest.mark.gpu_fault  # the watchdog ends the job on purpose: on the GPU, run without MPS (tools/gpu-tests.sh)
@pytest.mark.skipif(not ON_GPU, reason="the kernel's capacity report: cuda backend only (the cpu backend raises, "
                                       "scenario all_to_all_v)")
def test_exchange_capacity_is_reported():
    # rows that do not fit: the watchdog prints the kernel's report and ends the job
    proc = run_ranks(2, WORKER, "capacity_report", timeout=300, env={"MPIEXEC_TIMEOUT": "280"}, expect_failure=True)
    text = proc.stdout + proc.stderr
    assert "iris.collectives.ccl.all_to_all_v: rank 0 receives 4 rows but its output holds 2" in text, text


@pytest.mark.multirank
@pytest.mark.gpu_fault
def test_ccl_debug_reports_mismatch():
    # Debug mode: two ranks passing different sizes of one size class get an error naming both.
    # On the cpu backend it is an exception the worker catches; on the GPU a device assert
    # (the kernel traps with the message, the job ends with an error). The call agreement, which
    # would refuse the call first, is switched off (IRIS_CHECK_CALLS=0): this is also the test that
    # the switch turns it off, on the host and on the device.
    proc = run_ranks(2, WORKER, "debug_mismatch", timeout=300,
                     env={"IRIS_DEBUG": "1", "IRIS_CHECK_CALLS": "0", "MPIEXEC_TIMEOUT": "280"}, expect_failure=ON_GPU)
    if ON_GPU:
        assert "calls differ on a lock array" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    else:
        assert "PASS debug_mismatch (" in proc.stdout, proc.stdout + proc.stderr
