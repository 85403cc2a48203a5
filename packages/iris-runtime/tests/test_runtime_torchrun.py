"""iris-runtime under torchrun (``python -m torch.distributed.run --standalone``), no MPI launcher:
one launch per world size runs every scenario of workers/torchrun_worker.py (ranks against
torchrun's variables, ctx.comm's collectives, resident_grid agreement, heap bases, kernels writing
into every peer, broadcast, barrier, verify, close and reopen, tracing's gather); one launch
where the program makes its own process group and bootstrap='mpi' is refused; one where a rank
raises and the job must end at once."""

from __future__ import annotations

import re
import time

import pytest
from runtime_test_helpers import existing, worker

from iris.runtime.testing import run_torchrun, world_sizes

WORKER = worker("torchrun_worker.py")
SCENARIOS = ["ranks", "resident_grid_agrees", "heap_bases", "heap_files_unlinked", "device_context",
             "kernels_write_every_peer", "broadcast", "barrier", "verify_allocation_order", "close_and_reopen",
             "tracing_export", "groups"]
OWN_GROUP = ["ranks", "kernels_write_every_peer", "mpi_under_torchrun_fails"]


def passed(stdout: str) -> list[str]:
    return re.findall(r"^PASS (\w+) \(", stdout, re.M)


@pytest.mark.multirank
# once: what torchrun changes is the bootstrap (torch.distributed, no MPI); the kernels it runs are
# those of test_runtime_multirank, which runs on every Triton line
@pytest.mark.once
@pytest.mark.parametrize("nranks", world_sizes())
def test_torchrun_scenarios(nranks):
    proc = run_torchrun(nranks, WORKER, *SCENARIOS, timeout=300)
    out = proc.stdout + proc.stderr
    assert passed(proc.stdout) == SCENARIOS, out
    assert "CHECK ranks torch " in proc.stdout and f", {nranks} ranks, " in proc.stdout, out
    assert "CHECK groups-freed True" in proc.stdout, out  # before interpreter finalization
    assert f"CHECK groups torch {tuple(reversed(range(nranks)))}" in proc.stdout, out
    files = re.search(r"^CHECK heap-files ?(.*)$", proc.stdout, re.M).group(1).split()
    assert not existing(files), existing(files)


@pytest.mark.multirank
@pytest.mark.once
def test_torchrun_with_the_programs_own_group():
    """The program calls init_process_group itself (nccl on the cuda backend, so the runtime needs
    its own gloo group), then iris(bootstrap='torch'); bootstrap='mpi' is refused with the fix."""
    proc = run_torchrun(2, WORKER, "--own-group", *OWN_GROUP, timeout=300)
    out = proc.stdout + proc.stderr
    assert passed(proc.stdout) == OWN_GROUP, out
    assert re.search(r"^CHECK own-group (gloo|nccl)$", proc.stdout, re.M), out
    assert "CHECK groups-freed True" in proc.stdout, out
    assert "CHECK mpi-error iris.runtime.iris(bootstrap='mpi'): MPI sees a world of 1, but torchrun" in out, out
    assert "WORLD_SIZE=2 ranks" in out and "pass bootstrap='torch' (or 'auto')" in out, out


@pytest.mark.multirank
@pytest.mark.once
@pytest.mark.gpu_fault  # the job ends on purpose: on the GPU, run without MPS (tools/gpu-tests.sh)
def test_torchrun_exception_mid_run_ends_the_job():
    """A rank that raises exits at once (its peers sit in a barrier); torchrun ends the others."""
    start = time.monotonic()
    proc = run_torchrun(2, worker("crash_worker.py"), "midrun", timeout=120, expect_failure=True)
    ended, elapsed = time.time(), time.monotonic() - start
    out = proc.stdout + proc.stderr
    raised = re.search(r"^CHECK raising-at ([0-9.]+)$", proc.stdout, re.M)
    assert raised, out
    assert ended - float(raised.group(1)) < 10, f"job ended {ended - float(raised.group(1)):.1f} s after the raise"
    assert elapsed < 60, f"the job took {elapsed:.1f} s\n{out}"
    assert "rank 1 fails on purpose in the middle of the run" in out, out
    assert "[1/2] iris: rank 1 failed; aborting all 2 ranks" in out, out
    files = re.search(r"^CHECK heap-files ?(.*)$", proc.stdout, re.M).group(1).split()
    assert not existing(files), f"left behind: {existing(files)}"
