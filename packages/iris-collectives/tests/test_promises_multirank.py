"""Promises that small integers, two ranks and short runs cannot show, one launch per world size of
workers/promises_worker.py: the fused ops and the host collectives sum in rank order and round once
to nearest even (random floats in fp32, bf16 and fp16, bit for bit against a host reference summed
in rank order and across ranks); ``device_barrier`` waits for the generation given as ``epoch=``
when the caller keeps its own count in the slot; one-shot and two-shot called back to back in one
kernel, the source overwritten as soon as a call returns.

World sizes: ``IRIS_TEST_WORLD_SIZES`` without 1, else 3 and 4 (the order of a sum shows from three
ranks on: ``a + b == b + a``). Where those have no 3 or more (CI's lowest Triton line asks for 2),
one small 3-rank launch runs the rank-order promises of the reduce-scatters (:data:`THREE_RANKS`),
so that both Triton lines check them. ``IRIS_TIMEOUT_S`` (default here 120) bounds a wait
whose peers never come: a barrier that counted for itself would wait for a generation that never
comes. ``python tools/mutations.py --quick`` breaks each promise and checks that a scenario fails.
"""

from __future__ import annotations

import os
import re

import pytest

from iris.runtime.testing import run_ranks, scenario_params, world_sizes

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "workers", "promises_worker.py")
with open(WORKER) as _f:
    SCENARIOS = re.findall(r"^def scenario_(\w+)\(", _f.read(), re.M)


@pytest.mark.multirank
@pytest.mark.parametrize("nranks, scenarios", scenario_params([n for n in world_sizes("3,4") if n >= 2], SCENARIOS))
def test_promises(nranks, scenarios):
    # A bound on hangs, not a budget (4 interpreted ranks on 2 cores take about 20 s).
    env = {"MPIEXEC_TIMEOUT": "380", "IRIS_TIMEOUT_S": os.environ.get("IRIS_TIMEOUT_S", "120")}
    proc = run_ranks(nranks, WORKER, *scenarios, timeout=400, env=env)
    assert re.findall(r"^PASS (\w+) \(", proc.stdout, re.M) == scenarios, proc.stdout + proc.stderr
    assert f", {nranks} ranks, " in proc.stdout


#: The rank-order promises that the 3-rank launch runs where the world sizes have no 3: the fused
#: reduce-scatter's owner and ccl's reduce-scatter (seconds at 3 ranks on 2 cores).
THREE_RANKS = ("matmul_reduce_scatter", "ccl_reduce_scatter")
SUMS_SHOW_ORDER = any(n >= 3 for n in world_sizes("3,4"))


@pytest.mark.multirank
@pytest.mark.skipif(SUMS_SHOW_ORDER, reason="test_promises runs every promise at 3 or more ranks")
def test_rank_order_at_three_ranks():
    env = {"MPIEXEC_TIMEOUT": "280", "IRIS_TIMEOUT_S": os.environ.get("IRIS_TIMEOUT_S", "120")}
    proc = run_ranks(3, WORKER, *THREE_RANKS, timeout=300, env=env)
    assert re.findall(r"^PASS (\w+) \(", proc.stdout, re.M) == list(THREE_RANKS), proc.stdout + proc.stderr
    assert ", 3 ranks, " in proc.stdout
