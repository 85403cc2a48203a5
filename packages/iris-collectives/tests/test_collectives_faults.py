"""Faults in the middle of a collective (workers/fault_worker.py): each ends the job within
seconds with a non-zero exit and a message that says what happened, and leaves no heap file.

- ``skip``: the last rank skips an all-reduce. The others' waits run out (``IRIS_TIMEOUT_S=3``)
  and the watchdog names the waiting rank, the collective, the flag, the tile and the missing peer.
- ``kill``: the last rank is SIGKILLed while the others wait in the kernel: the launcher ends
  the job.
- ``raise``: the last rank raises between two launches while the others wait in the kernel.
- ``exhaust``, ``double_free``, ``foreign`` (a tensor of another context), ``bad_pointer`` (a
  remote store through an off-heap pointer, debug mode): the last rank's misuse is an IrisError
  that names it (on the GPU the bad pointer is a device assert) while the others wait in the
  kernel, and the job ends.

World sizes 2 and 4 (those of ``IRIS_TEST_WORLD_SIZES``); on the GPU several ranks share it under
MPS, and the case after ``kill`` shows that the next job starts at once.

Each case prints its measured time to exit (``pytest -s`` shows it)."""

from __future__ import annotations

import os
import re
import time

import pytest

import iris.runtime
from iris.runtime.testing import run_ranks, world_sizes

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "workers", "fault_worker.py")
TIMEOUT_S = 3
WORLDS = [n for n in (2, 4) if n <= max(world_sizes())]
# The cases where ranks wait for each other run at every world size; a misuse is one rank's error
# and runs at 2 ranks on the CPU backend (each case is one MPI launch: CI time), everywhere on the GPU.
SPREAD = ("skip", "kill", "raise")
CUDA = iris.runtime.DEFAULT_BACKEND == "cuda"
# A job that hangs fails the test after this long instead of hanging it.
ENV = {"IRIS_TIMEOUT_S": str(TIMEOUT_S), "MPIEXEC_TIMEOUT": "90"}


def expected(case: str, nranks: int) -> list[str]:
    """Regular expressions the job's output must match."""
    last = nranks - 1
    aborted = re.escape(f"iris: rank {last} failed; aborting all {nranks} ranks")
    return {
        "skip": [rf"iris watchdog: rank \d waited {TIMEOUT_S}\.",
                 re.escape("in iris.collectives.all_reduce_one_shot on flag"),
                 re.escape(f"still missing: rank(s) {last}, which had not made this call on the tile"),
                 "IRIS_TIMEOUT_S"],
        # Open MPI (the GPU machine) names the killed rank, and so does iris's watchdog when it sees the
        # process gone first; MPICH's launcher (CPU CI) ends the job faster and names only the pid.
        "kill": ([rf"process rank {last} with PID \d+ on node \S+ exited on signal 9|iris watchdog: rank {last} "
                  rf"\(pid \d+\) ended without closing"] if CUDA else ["Killed \\(signal 9\\)|signal 9"]),
        "raise": [re.escape(f"rank {last} fails on purpose between two launches"), aborted],
        "exhaust": ["CHECK raised HeapExhaustedError", aborted],
        "double_free": ["CHECK raised IrisUsageError", "freed twice", aborted],
        "foreign": ["CHECK raised NotOnHeapError", "is not on this rank's symmetric heap", aborted],
        "bad_pointer": (["a pointer is not inside the symmetric heap"] if CUDA else
                        ["CHECK raised IrisUsageError", "outside the symmetric heap", aborted]),
    }[case]


CASES = ["skip", "kill", "raise", "exhaust", "double_free", "foreign", "bad_pointer"]


@pytest.mark.multirank
@pytest.mark.once
@pytest.mark.parametrize("case, nranks", [(c, n) for c in CASES for n in WORLDS
                                          if n == WORLDS[0] or c in SPREAD or CUDA])
def test_fault_ends_the_job_and_says_why(case, nranks):
    env = dict(ENV, IRIS_DEBUG="1") if case == "bad_pointer" else ENV
    start = time.monotonic()
    proc = run_ranks(nranks, WORKER, case, timeout=120, env=env, expect_failure=True)
    ended, elapsed = time.time(), time.monotonic() - start
    out = proc.stdout + proc.stderr
    fault = re.search(r"^CHECK fault-at ([0-9.]+) (.*)$", proc.stdout, re.M)
    assert fault, out
    after_fault = ended - float(fault.group(1))
    print(f"\nfault {case}, {nranks} ranks: exit code {proc.returncode}, job ended {after_fault:.1f} s after the fault "
          f"({elapsed:.1f} s in all)")
    assert proc.returncode != 0
    assert after_fault < 30, f"the job ended {after_fault:.1f} s after the fault\n{out}"
    assert f"CHECK timeout {TIMEOUT_S}" in proc.stdout, out
    for pattern in expected(case, nranks):
        assert re.search(pattern, out), f"{pattern!r} not in\n{out}"
    assert "went on past the barrier" not in out, out
    files = re.search(r"^CHECK heap-files ?(.*)$", proc.stdout, re.M).group(1).split()
    left = [f for f in files if os.path.exists(f)]
    assert not left, f"left behind: {left}"
