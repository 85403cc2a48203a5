"""Faults in the middle of a collective (workers/fault_worker.py): each ends the job within
seconds with a non-zero exit and a message that says what happened, and leaves no heap file.

- ``skip``: the last rank skips an all-reduce. The others' waits run out (``IRIS_TIMEOUT_S=3``)
  and the watchdog names the waiting rank, the collective, the flag, the tile and the missing peer.
- ``kill``: the last rank is SIGKILLed while the others wait in the kernel: the launcher ends
  the job.
- ``raise``: the last rank raises between two launches while the others wait in the kernel.

Each case prints its measured time to exit (``pytest -s`` shows it)."""

from __future__ import annotations

import os
import re
import time

import pytest

from iris.runtime.testing import run_ranks

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "workers", "fault_worker.py")
NRANKS = 2
TIMEOUT_S = 3
# A job that hangs fails the test after this long instead of hanging it.
ENV = {"IRIS_TIMEOUT_S": str(TIMEOUT_S), "MPIEXEC_TIMEOUT": "90"}
EXPECT = {
    "skip": [f"iris watchdog: rank 0 waited {TIMEOUT_S}.", "in iris.collectives.all_reduce_one_shot on flag",
             f"still missing: peer {NRANKS - 1}", "IRIS_TIMEOUT_S"],
    "kill": ["Killed (signal 9)|signal 9|SIGKILL"],
    "raise": [f"rank {NRANKS - 1} fails on purpose between two launches",
              f"iris: rank {NRANKS - 1} failed; aborting all {NRANKS} ranks"],
}


@pytest.mark.multirank
@pytest.mark.parametrize("case", list(EXPECT))
def test_fault_ends_the_job_and_says_why(case):
    start = time.monotonic()
    proc = run_ranks(NRANKS, WORKER, case, timeout=120, env=ENV, expect_failure=True)
    ended, elapsed = time.time(), time.monotonic() - start
    out = proc.stdout + proc.stderr
    fault = re.search(r"^CHECK fault-at ([0-9.]+) (.*)$", proc.stdout, re.M)
    assert fault, out
    after_fault = ended - float(fault.group(1))
    print(f"\nfault {case}: exit code {proc.returncode}, job ended {after_fault:.1f} s after the fault "
          f"({elapsed:.1f} s in all)")
    assert proc.returncode != 0
    assert after_fault < 30, f"the job ended {after_fault:.1f} s after the fault\n{out}"
    assert f"CHECK timeout {TIMEOUT_S}" in proc.stdout, out
    for pattern in EXPECT[case]:
        assert re.search(pattern if case == "kill" else re.escape(pattern), out), f"{pattern!r} not in\n{out}"
    assert "went on past the barrier" not in out, out
    files = re.search(r"^CHECK heap-files ?(.*)$", proc.stdout, re.M).group(1).split()
    left = [f for f in files if os.path.exists(f)]
    assert not left, f"left behind: {left}"
