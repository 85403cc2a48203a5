"""iris-runtime on 1..N ranks: one launch per world size runs every scenario of
workers/runtime_worker.py (heap bases, context layout, kernels writing into every peer,
factories, free and reuse, broadcast, barrier, logging, errors, verify, close and reopen)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from runtime_test_helpers import existing, worker

from iris.runtime.testing import run_ranks, world_sizes

WORKER = worker("runtime_worker.py")
with open(WORKER) as _f:
    SCENARIOS = re.findall(r"^def scenario_(\w+)\(", _f.read(), re.M)
HEAP_SIZE_TEXT = "4.0 MiB"  # run_scenarios(heap_size=1 << 22) in the worker


def passed(stdout: str) -> list[str]:
    return re.findall(r"^PASS (\w+) \(", stdout, re.M)


def heap_files(stdout: str) -> list[str]:
    match = re.search(r"^CHECK heap-files ?(.*)$", stdout, re.M)
    assert match, "the worker did not report its heap files"
    return match.group(1).split()


@pytest.mark.multirank
@pytest.mark.parametrize("nranks", world_sizes())
def test_runtime_scenarios(nranks):
    proc = run_ranks(nranks, WORKER, timeout=300, env={"IRIS_LOG_LEVEL": "INFO", "MPIEXEC_TIMEOUT": "280"})
    out = proc.stdout + proc.stderr
    assert passed(proc.stdout) == SCENARIOS, out
    assert f", {nranks} ranks, " in proc.stdout

    # logging: level from IRIS_LOG_LEVEL, every line prefixed with [rank/N], set_log_level obeyed
    for r in range(nranks):
        prefix = f"iris [{r}/{nranks}]"
        assert re.search(rf"^{re.escape(prefix)} INFO: \w+ heap of {HEAP_SIZE_TEXT} per rank on \w+", out, re.M), out
        assert f"{prefix} INFO: marker from rank {r}\n" in out, out
        assert f"{prefix} WARNING: warning from rank {r}\n" in out, out
    assert "this line must not appear" not in out

    # the cpu heap's files were unlinked at start-up and are not back after close
    files = heap_files(proc.stdout)
    if "cpu)" in proc.stdout.splitlines()[-1]:
        assert len(files) == nranks and all("/iris-heap-" in f for f in files), files
    assert not existing(files), existing(files)


def test_plain_python_is_a_world_of_one():
    """No mpiexec: ``python worker.py`` runs as world size 1."""
    names = ["ranks", "heap_bases", "device_context", "kernels_write_every_peer", "factories", "broadcast",
             "errors", "close_and_reopen"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, WORKER, *names], capture_output=True, text=True, timeout=180, env=env)
    out = f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    assert proc.returncode == 0, out
    assert passed(proc.stdout) == names, out
    assert all(", 1 ranks, " in line for line in proc.stdout.splitlines() if line.startswith("PASS")), out
