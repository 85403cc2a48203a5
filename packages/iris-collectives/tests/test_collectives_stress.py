"""Randomised stress (workers/stress_worker.py): seeded cases of every all-reduce variant and
reduce-scatter, random dtypes, ragged shapes, tiles and grids, launched back to back in batches,
each result checked bit for bit. CI runs 200 cases, one launch per world size of
``IRIS_STRESS_WORLDS`` (default 2, 3, 4): 100 at 2 ranks, 60 at 3, 40 at 4, fewer where more
ranks share CI's two cores. ``IRIS_STRESS_CASES`` runs that many at every world size instead
(``nox -s stress``: 400). ``IRIS_STRESS_SEED`` picks another sequence (the failure message names
the case to replay)."""

from __future__ import annotations

import ast
import os
import re

import pytest

from iris.runtime.testing import run_ranks

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers", "stress_worker.py")
#: Cases per world size in CI, unless IRIS_STRESS_CASES gives one count for all.
DEFAULT_CASES = {2: 100, 3: 60, 4: 40}
SEED = int(os.environ.get("IRIS_STRESS_SEED", "2026"))
WORLDS = [int(w) for w in os.environ.get("IRIS_STRESS_WORLDS", "2,3,4").split(",") if w.strip()]


@pytest.mark.multirank
@pytest.mark.once
@pytest.mark.parametrize("nranks", WORLDS)
def test_random_collectives_back_to_back(nranks):
    cases = int(os.environ.get("IRIS_STRESS_CASES", DEFAULT_CASES.get(nranks, 40)))
    proc = run_ranks(nranks, WORKER, str(cases), str(SEED), timeout=3000, env={"MPIEXEC_TIMEOUT": "2900"})
    line = re.search(rf"^STRESS cases={cases} seed={SEED} ranks={nranks} (.*) ok$", proc.stdout, re.M)
    assert line, proc.stdout + proc.stderr
    counts = ast.literal_eval(line.group(1))  # the worker prints a dict literal of cases per collective
    assert sum(counts.values()) == cases and all(counts.values()), counts  # every collective drawn
