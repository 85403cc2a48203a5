"""Nothing hangs: an exception on one rank ends the whole job within seconds, prints that rank's
message and leaves no heap files in /dev/shm (workers/crash_worker.py). No kernel runs here (MPI,
the heap's files and the abort path only), so CI runs these on one Triton line (``once``)."""

from __future__ import annotations

import contextlib
import glob
import os
import re
import time

import pytest
from runtime_test_helpers import SHM, existing, worker

from iris.runtime._backend import resolve_backend
from iris.runtime.testing import run_ranks

CRASH = worker("crash_worker.py")
NRANKS = 2  # the smallest job with a rank left waiting
# A hung job fails the test after this long instead of hanging it (MPIEXEC_TIMEOUT kills the ranks).
JOB_LIMIT = {"MPIEXEC_TIMEOUT": "60"}


@pytest.mark.multirank
@pytest.mark.once
@pytest.mark.gpu_fault  # the job ends on purpose: on the GPU, run without MPS (tools/gpu-tests.sh)
def test_exception_mid_run_aborts_the_job():
    shm_before = set(os.listdir(SHM))
    start = time.monotonic()
    proc = run_ranks(NRANKS, CRASH, "midrun", timeout=90, env=JOB_LIMIT, expect_failure=True)
    ended, elapsed = time.time(), time.monotonic() - start
    out = proc.stdout + proc.stderr
    last = NRANKS - 1
    assert elapsed < 30, f"the job took {elapsed:.1f} s to end\n{out}"
    raised = re.search(r"^CHECK raising-at ([0-9.]+)$", proc.stdout, re.M)
    assert raised, out
    assert ended - float(raised.group(1)) < 10, f"job ended {ended - float(raised.group(1)):.1f} s after the raise"
    assert f"rank {last} fails on purpose in the middle of the run" in out, out
    assert f"[{last}/{NRANKS}] iris: rank {last} failed; aborting all {NRANKS} ranks" in out, out
    files = re.search(r"^CHECK heap-files ?(.*)$", proc.stdout, re.M).group(1).split()
    assert not existing(files), f"left behind: {existing(files)}"
    # MPI_Abort leaves MPICH's own segment; run_ranks removes it once no process maps it
    mpich = sorted(n for n in set(os.listdir(SHM)) - shm_before if n.startswith("mpich_shm_"))
    assert not mpich, f"the aborted job left {mpich} in {SHM}"


@pytest.mark.multirank
@pytest.mark.once
@pytest.mark.gpu_fault
def test_exception_after_torch_init_process_group_still_says_why():
    # torch's excepthook buffers stderr around ours, and our hook aborts before torch writes it out
    proc = run_ranks(NRANKS, CRASH, "midrun_in_torch_group", timeout=90, env=JOB_LIMIT, expect_failure=True)
    out = proc.stdout + proc.stderr
    last = NRANKS - 1
    assert f"RuntimeError: rank {last} fails on purpose in the middle of the run" in out, out
    assert f"[{last}/{NRANKS}] iris: rank {last} failed; aborting all {NRANKS} ranks" in out, out


@pytest.mark.multirank
@pytest.mark.once
@pytest.mark.skipif(resolve_backend(None) != "cpu",
                    reason="only the cpu backend has a start-up window with files in /dev/shm; the cuda heap has none")
def test_failure_during_heap_startup_leaves_no_files():
    start = time.monotonic()
    proc = run_ranks(NRANKS, CRASH, "startup", timeout=90, env=JOB_LIMIT, expect_failure=True)
    elapsed = time.monotonic() - start
    out = proc.stdout + proc.stderr
    injected = re.search(r"^CHECK injected (\S+)$", proc.stdout, re.M)
    assert injected, out
    job = re.match(r".*/iris-heap-([0-9a-f]+)-\d+$", injected.group(1)).group(1)
    left = glob.glob(f"{SHM}/iris-heap-{job}-*")
    for path in left:  # don't leave them to the next run even when the test fails
        with contextlib.suppress(OSError):
            os.unlink(path)
    assert not left, f"start-up failure left {left}\n{out}"
    assert elapsed < 30, f"the job took {elapsed:.1f} s to end\n{out}"
    assert f"injected start-up failure on rank {NRANKS - 1}" in out, out
    assert "IrisBackendError: cpu backend: could not create the" in out, out
    # Every rank raises and aborts at once here; the launcher must still pass on each one's message.
    for r in range(NRANKS):
        assert f"[{r}/{NRANKS}] iris: rank {r} failed; aborting all {NRANKS} ranks" in out, out
