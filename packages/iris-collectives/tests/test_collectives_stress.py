"""Randomised stress (workers/stress_worker.py): seeded cases of every all-reduce variant and
reduce-scatter, random dtypes, ragged shapes, tiles and grids, launched back to back in batches,
each result checked bit for bit. CI runs ``IRIS_STRESS_CASES`` (default 48) cases at each world
size of ``IRIS_STRESS_WORLDS`` (default 3); ``nox -s stress`` runs many more, at 2, 3 and 4 ranks.
``IRIS_STRESS_SEED`` picks another sequence (the failure message names the case to replay)."""

from __future__ import annotations

import ast
import os
import re

import pytest

from iris.runtime.testing import run_ranks

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers", "stress_worker.py")
CASES = int(os.environ.get("IRIS_STRESS_CASES", "48"))
SEED = int(os.environ.get("IRIS_STRESS_SEED", "2026"))
WORLDS = [int(w) for w in os.environ.get("IRIS_STRESS_WORLDS", "3").split(",") if w.strip()]


@pytest.mark.multirank
@pytest.mark.once
@pytest.mark.parametrize("nranks", WORLDS)
def test_random_collectives_back_to_back(nranks):
    proc = run_ranks(nranks, WORKER, str(CASES), str(SEED), timeout=3000, env={"MPIEXEC_TIMEOUT": "2900"})
    line = re.search(rf"^STRESS cases={CASES} seed={SEED} ranks={nranks} (.*) ok$", proc.stdout, re.M)
    assert line, proc.stdout + proc.stderr
    counts = ast.literal_eval(line.group(1))  # the worker prints a dict literal of cases per collective
    assert sum(counts.values()) == CASES and all(counts.values()), counts  # every collective drawn
