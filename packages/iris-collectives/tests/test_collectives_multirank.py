"""iris.collectives on 1..N ranks: one launch per world size runs every scenario of
workers/collectives_worker.py (all nine collectives, fp32/fp16/bf16/int32, ragged shapes, blocks
larger than the tensor, 130x257, back-to-back launches, non-contiguous views, the ring's source off
the heap, device barrier with explicit epochs and late ranks, tracing of every collective, errors; at 4 ranks
every collective and the barrier on groups of ranks, group= inside the kernel),
plus one debug-mode launch (waits bounded within a window of IRIS_DEBUG_TIMEOUT_S, checked flags)."""

from __future__ import annotations

import os
import re

import pytest

import iris.runtime
from iris.runtime.testing import run_ranks, scenario_params, world_sizes

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "workers", "collectives_worker.py")
with open(WORKER) as _f:
    _ALL = re.findall(r"^def scenario_(\w+)\(", _f.read(), re.M)
DEBUG_SCENARIOS = ["debug_wait_times_out", "debug_mode_collectives"]
SCENARIOS = [s for s in _ALL if s not in DEBUG_SCENARIOS]


def passed(stdout: str) -> list[str]:
    return re.findall(r"^PASS (\w+) \(", stdout, re.M)


@pytest.mark.multirank
@pytest.mark.parametrize("nranks, scenarios", scenario_params(world_sizes(), SCENARIOS))
def test_collectives_scenarios(nranks, scenarios):
    # A bound on hangs, not a budget: 4 interpreted ranks on a 2-core CI machine take minutes.
    proc = run_ranks(nranks, WORKER, *scenarios, timeout=600, env={"MPIEXEC_TIMEOUT": "580"})
    assert passed(proc.stdout) == scenarios, proc.stdout + proc.stderr
    assert f", {nranks} ranks, " in proc.stdout


@pytest.mark.multirank
def test_debug_mode_bounds_waits_and_checks_flags():
    """IRIS_DEBUG=1: a wait whose peers never come fails after IRIS_DEBUG_TIMEOUT_S naming rank,
    peers and flag; the lock-using collectives still give the right sums with checks on."""
    nranks = max(2, min(3, max(world_sizes())))
    # On the GPU a timed-out wait is a device assert, which ends the process's CUDA context: the
    # timeout is checked on the CPU backend (its GPU code is compiled in test_collectives_compile).
    scenarios = DEBUG_SCENARIOS if iris.runtime.DEFAULT_BACKEND == "cpu" else DEBUG_SCENARIOS[1:]
    proc = run_ranks(nranks, WORKER, *scenarios, timeout=300,
                     env={"IRIS_DEBUG": "1", "IRIS_DEBUG_TIMEOUT_S": "3", "MPIEXEC_TIMEOUT": "280"})
    assert passed(proc.stdout) == scenarios, proc.stdout + proc.stderr
