"""The range form of the tile collectives (``TileRange``: one synchronisation per program over its
tiles) on 1..N ranks: every scenario of workers/ranges_worker.py in one launch per world size."""

from __future__ import annotations

import os
import re

import pytest

from iris.runtime.testing import run_ranks, world_sizes

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "workers", "ranges_worker.py")
with open(WORKER) as _f:
    SCENARIOS = re.findall(r"^def scenario_(\w+)\(", _f.read(), re.M)


@pytest.mark.multirank
@pytest.mark.parametrize("nranks", world_sizes())
def test_range_scenarios(nranks):
    # A bound on hangs, not a budget.
    proc = run_ranks(nranks, WORKER, *SCENARIOS, timeout=400, env={"MPIEXEC_TIMEOUT": "380"})
    assert re.findall(r"^PASS (\w+) \(", proc.stdout, re.M) == SCENARIOS, proc.stdout + proc.stderr
    assert f", {nranks} ranks, " in proc.stdout
