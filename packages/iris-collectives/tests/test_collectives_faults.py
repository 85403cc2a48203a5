"""Faults in the middle of a collective (workers/fault_worker.py): each ends the job within
seconds with a non-zero exit and a message that says what happened, and leaves no heap file.

- ``skip``: the last rank skips an all-reduce (and sleeps, in no host call). The others' waits run
  out (``IRIS_TIMEOUT_S=3``, 15 on the GPU) and the watchdog names the waiting rank, the collective, the flag, the
  tile and the missing peer.
- ``recv_without_send``: rank 0 receives from the last rank, which never sends (and sleeps, in no
  host call, as in ``skip``): the watchdog names the recv, the rank, the peer and the tag (2
  ranks: one launch).
- ``message_size`` (GPU only; the cpu backend's error is a ccl_worker.py scenario): the last rank
  receives 12 elements where rank 0 sends 10; the watchdog names both sizes and ends the job, and
  the receive never returns (the rank cannot print what it holds).
- ``kill``: the last rank is SIGKILLed while the others wait in the kernel: the launcher ends
  the job.
- ``raise``: the last rank raises between two launches while the others wait in the kernel.
- ``exhaust``, ``double_free``, ``foreign`` (a tensor of another context), ``bad_pointer`` (a
  remote store through a plain torch tensor, off the heap): the last rank's misuse is an IrisError
  that names it while the others wait in the kernel, and the job ends. On the cpu backend the bad
  pointer is refused by default, in one line naming the call, the rank, the kernel argument and
  ``ctx.zeros()``; on the GPU it runs in debug mode (``IRIS_DEBUG=1``), where it is a device
  assert.
- ``mismatch_collective``, ``mismatch_tiles``, ``mismatch_shape``, ``mismatch_grid`` (debug mode):
  the last rank makes another call on the same lock array (two-shot for one-shot, 16 x 4 tiles for
  8 x 8, 16 x 8 for 16 x 16, 4 programs for 2). The call signatures in the lock records end the job
  at once (no wait runs out: the watchdog's limit is raised to 60 s for them), naming both ranks
  and what differs; ``matched`` shows that calls that agree pass in debug mode.

World sizes 2 and 4 (those of ``IRIS_TEST_WORLD_SIZES``) for ``skip``, ``kill`` and ``raise``, 2 for
the misuses (one rank's error); on the GPU several ranks share it under
MPS, and the case after ``kill`` shows that the next job starts at once.

Each case prints its measured time to exit (``pytest -s`` shows it).

Every job here ends on purpose, and on the GPU a rank may end while a peer's kernel still reads its
heap, a fault that under MPS ends every job sharing the GPU: the module is marked ``gpu_fault``, and
tools/gpu-tests.sh runs it after the other tests, without MPS."""

from __future__ import annotations

import os
import re
import time

import pytest

import iris.runtime
from iris.runtime.testing import run_ranks, world_sizes

pytestmark = pytest.mark.gpu_fault

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "workers", "fault_worker.py")
CUDA = iris.runtime.DEFAULT_BACKEND in ("cuda", "nvshmem")
# The waits' limit. On the GPU a rank may still be compiling a kernel (seconds, cold cache, other
# jobs beside it) while its peers wait for it in a barrier: a limit that short would end the job
# before the fault.
TIMEOUT_S = 15 if CUDA else 3
WORLDS = [n for n in (2, 4) if n <= max(world_sizes())]
# The cases where ranks wait for each other run at every world size; a misuse is one rank's error
# and runs at 2 ranks only (each case is one MPI launch: CI time on the cpu backend, and on the GPU
# a job of its own in the suite's fault phase; the peers waiting in a kernel that the misuse must
# end are the same code at 2 ranks as at 4).
SPREAD = ("skip", "kill", "raise")
# A job that hangs fails the test after this long instead of hanging it.
ENV = {"IRIS_TIMEOUT_S": str(TIMEOUT_S), "MPIEXEC_TIMEOUT": "90"}
# Mismatches must be caught by the signatures, long before any wait could run out.
MISMATCH_TIMEOUT_S = 60
MISMATCH_ENV = dict(ENV, IRIS_DEBUG="1", IRIS_TIMEOUT_S=str(MISMATCH_TIMEOUT_S),
                    IRIS_DEBUG_TIMEOUT_S=str(MISMATCH_TIMEOUT_S))
MISMATCH_ENDS_WITHIN_S = 15


def expected(case: str, nranks: int) -> list[str]:
    """Regular expressions the job's output must match."""
    last = nranks - 1
    aborted = re.escape(f"iris: rank {last} failed; aborting all {nranks} ranks")
    return {
        # the waiting ranks are every rank but the last, which skipped the call
        "skip": [rf"iris watchdog: rank ({'|'.join(map(str, range(last)))}) waited {TIMEOUT_S}\.",
                 re.escape("in iris.collectives.all_reduce_one_shot on flag"),
                 re.escape(f"still missing: rank(s) {last}, which had not made this call on the tile"),
                 "IRIS_TIMEOUT_S"],
        # Open MPI (the GPU machine) names the killed rank, and so does iris's watchdog when it sees the
        # process gone first; MPICH's launcher (CPU CI) ends the job faster and names only the pid.
        "kill": ([rf"process rank {last} with PID \d+ on node \S+ exited on signal 9|iris watchdog: rank {last} "
                  rf"\(pid \d+\) ended without closing"] if CUDA else ["Killed \\(signal 9\\)|signal 9"]),
        "recv_without_send": [rf"iris watchdog: rank 0 waited {TIMEOUT_S}\.",
                              re.escape("in iris.collectives.ccl.recv on flag 'ready' of tag 1: it holds 0, "
                                        f"expected >= 1, still missing: peer {last}"),
                              re.escape(f"Rank {last} did not make the matching send to rank 0 with tag 1")],
        "message_size": [re.escape(f"iris watchdog: iris.collectives.ccl.recv: rank {last} received a message from "
                                   f"rank 0 with tag 0 of 10 x float32, but this call expects 12 x float32")],
        "raise": [re.escape(f"rank {last} fails on purpose between two launches"), aborted],
        "exhaust": ["CHECK raised HeapExhaustedError", aborted],
        "double_free": ["CHECK raised IrisUsageError", "freed twice", aborted],
        "foreign": ["CHECK raised NotOnHeapError", "is not on this rank's symmetric heap", aborted],
        "bad_pointer": (["a pointer is not inside the symmetric heap"] if CUDA else
                        ["CHECK raised NotOnHeapError",
                         rf"NotOnHeapError: iris\.device\.store: rank {last}, peer 0: argument 'target' of "
                         rf"remote_store_kernel \(a float32 tensor of shape \(16,\)\) is not on the symmetric heap, "
                         rf"and another rank reaches only memory on the heap: allocate the tensor with "
                         rf"ctx\.zeros\(\) .*\n", aborted]),
    }[case] if not case.startswith("mismatch_") else mismatch_expected(case, nranks)


#: What the last rank changes in each mismatch case, as the message names it: (differs, its call).
MISMATCHES = {
    "mismatch_collective": ("collective", "all_reduce_two_shot of 16 x 16 in 8 x 8 tiles, grid (2, 1, 1)"),
    "mismatch_tiles": ("tile shape", "all_reduce_one_shot of 16 x 16 in 16 x 4 tiles, grid (2, 1, 1)"),
    "mismatch_shape": ("M x N", "all_reduce_one_shot of 16 x 8 in 8 x 8 tiles, grid (2, 1, 1)"),
    "mismatch_grid": ("grid", "all_reduce_one_shot of 16 x 16 in 8 x 8 tiles, grid (4, 1, 1)"),
}


def mismatch_expected(case: str, nranks: int) -> list[str]:
    """A rank names itself and the last rank (or the last rank names a peer), both calls, what
    differs and the fix; no wait ran out."""
    last = nranks - 1
    if CUDA:
        # On the GPU the check is a device assert: the kernel prints the ranks, tile, call and
        # both signatures as numbers (device_print has no strings), traps with the message, and
        # the failing ranks abort the job (seen on an H200: it ends within 1.2 s of the fault).
        return ["calls differ on a lock array: rank, peer, tile, call",
                re.escape("two ranks made different calls on the same lock array"),
                rf"iris: rank \d failed; aborting all {nranks} ranks"]
    differs, theirs = MISMATCHES[case]
    ours = "all_reduce_one_shot of 16 x 16 in 8 x 8 tiles, grid (2, 1, 1)"
    pair = (rf"rank (?P<a>\d) and rank (?P<b>\d) made different calls on the same lock array \(tile 0, call 2 on "
            rf"it\): rank (?P=a) called ({re.escape(ours)}|{re.escape(theirs)}), rank (?P=b) called "
            rf"({re.escape(ours)}|{re.escape(theirs)}); they differ in {re.escape(differs)}\.")
    return [pair, rf"rank {last}", "IrisCallMismatchError",
            re.escape("Every rank must make the same collective call with the same shapes, tiles and grid on a "
                      "lock array"),
            rf"iris: rank \d failed; aborting all {nranks} ranks"]


def mismatch_pairs(out: str) -> set[tuple[int, int]]:
    """(rank, peer) of every mismatch report in a job's output (the cpu backend's message)."""
    return {(int(a), int(b)) for a, b in re.findall(r"rank (\d) and rank (\d) made different calls", out)}


def device_report_ranks(out: str) -> tuple[set[int], set[int]]:
    """The ranks and peers that the GPU's mismatch reports name. A report is the device print of
    ``_signature._report``: one line per value and thread, ``pid (x, y, z) idx () <prefix>: (operand
    i) value`` (measured on an H200, Triton 3.6), values 0 and 1 being the rank and its peer. Lines of
    different ranks interleave, so the two are collected apart."""
    named: tuple[set[int], set[int]] = (set(), set())
    for value_index, value in re.findall(r"calls differ on a lock array.*?grid =:? ?\(operand ([01])\) (-?\d+)", out):
        named[int(value_index)].add(int(value))
    return named


CASES = ["skip", "recv_without_send", *(["message_size"] if CUDA else []), "kill", "raise", "exhaust", "double_free",
         "foreign", "bad_pointer", *MISMATCHES]


@pytest.mark.multirank
@pytest.mark.once
@pytest.mark.parametrize("case, nranks", [(c, n) for c in CASES for n in WORLDS
                                          if n == WORLDS[0] or c in SPREAD])
def test_fault_ends_the_job_and_says_why(case, nranks):
    mismatch = case in MISMATCHES
    env = MISMATCH_ENV if mismatch else dict(ENV, IRIS_DEBUG="1") if case == "bad_pointer" and CUDA else ENV
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
    assert after_fault < (MISMATCH_ENDS_WITHIN_S if mismatch else 30), \
        f"the job ended {after_fault:.1f} s after the fault\n{out}"
    assert f"CHECK timeout {MISMATCH_TIMEOUT_S if mismatch else TIMEOUT_S}" in proc.stdout, out
    for pattern in expected(case, nranks):
        assert re.search(pattern, out), f"{pattern!r} not in\n{out}"
    if case == "skip":  # no report names the rank that skipped the call as one that waited
        waiting = {int(r) for r in re.findall(r"iris watchdog: rank (\d+) (?:waited|stopped waiting)", out)}
        assert waiting and waiting <= set(range(nranks - 1)), (waiting, out)
    if mismatch:
        reports = "\n".join(line for line in out.splitlines() if "calls differ" in line or "different calls" in line)
        if CUDA:
            # the reports name the last rank (the odd one out) and other ranks, and only ranks of the job
            ranks, peers = device_report_ranks(out)
            named = ranks | peers
            assert ranks and peers and nranks - 1 in named and len(named) >= 2, (ranks, peers, reports[:4000])
            assert named <= set(range(nranks)), (ranks, peers, reports[:4000])
        else:
            # every report names the last rank and another one
            pairs = mismatch_pairs(out)
            assert pairs and all(nranks - 1 in pair and pair[0] != pair[1] for pair in pairs), (pairs, reports[:4000])
        assert "timed out" not in out and "waited" not in out, out  # the signatures, not a time limit
    assert "went on past the barrier" not in out, out
    assert "CHECK result" not in proc.stdout, f"a rank printed the result of a call that went wrong\n{out}"
    # an IrisError raised in a kernel reaches the caller as itself, not wrapped by the interpreter
    assert "InterpreterError" not in out, out
    # not anchored at a line's start: the launcher may put another rank's output before it on the
    # same line (seen once on the GPU, with 4 ranks aborting together)
    listed = re.search(r"CHECK heap-files ?(.*)$", proc.stdout, re.M)
    assert listed, out
    files = listed.group(1).split()
    left = [f for f in files if os.path.exists(f)]
    assert not left, f"left behind: {left}"


@pytest.mark.multirank
@pytest.mark.once
def test_matched_calls_pass_in_debug_mode():
    """IRIS_DEBUG=1: every lock-using collective, back to back with grids and shapes that change from
    call to call (the same on every rank), passes the signature checks and gives the sums."""
    proc = run_ranks(WORLDS[0], WORKER, "matched", timeout=120, env=MISMATCH_ENV)
    assert "PASS matched" in proc.stdout, proc.stdout + proc.stderr


# --- the call agreement (iris.collectives.ccl): wrong calls fail loudly ---------------------------
#
# Each case is one job that must fail (one launch each, 2 ranks; on the GPU the cases whose report
# reads the kernels' own call records from the heap also at 4, the host-side agreement being the same
# code at every world size and on either backend). No rank may
# print a result ("CHECK result"), and the job must end within seconds of the fault: a mismatch is
# found without waiting for the time limit (60 s here), except in calls_late, whose point is the
# limit (3 s) and the report that names the missing rank.

#: case -> (IRIS_TIMEOUT_S, seconds within which the job ends after the fault, patterns)
CALL_CASES = {
    "calls_skip_first": (60, 15, [
        re.escape("the ranks made different calls (an IrisCallMismatchError)"),
        r"rank \d is in iris\.runtime\.Iris\.barrier\(\) within iris\.runtime\.Iris\.close\(\)",
        re.escape("the agreement on iris.collectives.ccl.all_reduce(out=float32[1000], inp=out (in place), "
                  "op='sum', config=None)")]),
    "calls_skip_warm": (60, 15, [
        re.escape("the ranks made different calls (an IrisCallMismatchError)"),
        r"after its kernels entered 1 collective call\(s\), but rank\(s\) [\d, ]+ entered more before coming here",
        re.escape("kernels' latest collective call: #2, iris.collectives.ccl.all_reduce(out=float32[1000]"),
        # the drained rank's own report; on the GPU its kernel may not have stopped before the abort
        *([] if CUDA else ["because a rank found that the ranks made different collective calls"])]),
    "calls_late": (3, 30, [
        r"iris watchdog: rank \d still waiting after \d+ s in the agreement on iris\.collectives\.ccl\.all_reduce",
        r"iris watchdog: rank \d waited 3\.\d s in the agreement on iris\.collectives\.ccl\.all_reduce\(out=float32"
        r"\[1000\]",
        r"rank (?P<late>\d) is past its host call #\d+ \(iris\.runtime\.Iris\.barrier\(\)\), in no host call",
        "IRIS_TIMEOUT_S"]),
    # a group's host waits: a deadline and a mismatch report of their own (the group's board)
    "group_calls_late": (3, 30, [
        r"iris watchdog: rank \d waited 3\.\d s in the agreement on iris\.collectives\.ccl\.all_reduce\(out=float32"
        r"\[1000\].* on group \[0, \d\]",
        r"rank (?P<late>\d) has made no host call of the group yet",
        "IRIS_TIMEOUT_S"]),
    "group_calls_skip_first": (60, 15, [
        re.escape("the ranks made different calls (an IrisCallMismatchError)"),
        r"rank \d is in iris\.runtime\.Group\.barrier\(\) on group \[0, \d\]",
        re.escape("the agreement on iris.collectives.ccl.all_reduce(out=float32[1000]")]),
    "calls_hit": (60, 15, [
        r"rank \d and rank \d made different collective calls \(an IrisCallMismatchError; call #3 of the context",
        re.escape("called iris.collectives.ccl.all_reduce(out=float32[1000], inp=out (in place)"),
        re.escape("called iris.collectives.ccl.all_reduce(out=float32[1024], inp=out (in place)")]),
    # on the GPU the watchdog reads the kernels' calls only when the limit runs out (10 s here)
    "calls_hit_workspaces": (10, 30, [
        re.escape("float32[1000], inp=out (in place)"), re.escape("float64[1000], inp=out (in place)"),
        "made different collective calls" if not CUDA else "kernels' latest collective call: #3"]),
    # the same with the heap's words unreadable from the host: the kernels' reports name the calls
    "calls_hit_unread": (10, 30, [
        re.escape("Rank 0's kernels' latest collective call: #3, iris.collectives.ccl.all_reduce(out=float32[1000], "
                  "inp=out (in place)"),
        r"Rank \d's kernels' latest collective call: #3, iris\.collectives\.ccl\.all_reduce\(out=float64\[1000\], "
        r"inp=out \(in place\)"]),
}

#: the cases whose report comes from the kernels' call records in every rank's heap (GPU: also 4 ranks)
KERNEL_RECORD_CASES = ("calls_hit", "calls_hit_workspaces")


@pytest.mark.multirank
@pytest.mark.parametrize("case, nranks", [pytest.param(c, n, marks=() if c == "calls_hit" else pytest.mark.once)
                                          for c in CALL_CASES for n in WORLDS
                                          if n == WORLDS[0] or (CUDA and c in KERNEL_RECORD_CASES)])
def test_wrong_calls_fail_loudly(case, nranks):
    timeout_s, within_s, patterns = CALL_CASES[case]
    env = dict(ENV, IRIS_TIMEOUT_S=str(timeout_s))
    proc = run_ranks(nranks, WORKER, case, timeout=120, env=env, expect_failure=True)
    ended = time.time()
    out = proc.stdout + proc.stderr
    fault = re.search(r"^CHECK fault-at ([0-9.]+) (.*)$", proc.stdout, re.M)
    assert fault, out
    after_fault = ended - float(fault.group(1))
    print(f"\n{case}, {nranks} ranks: exit code {proc.returncode}, job ended {after_fault:.1f} s after the fault")
    assert proc.returncode != 0, out
    assert f"CHECK timeout {timeout_s}" in proc.stdout, out
    assert "CHECK result" not in proc.stdout, f"a rank printed the result of a call that went wrong\n{out}"
    assert after_fault < within_s, f"the job ended {after_fault:.1f} s after the fault\n{out}"
    for pattern in patterns:
        assert re.search(pattern, out), f"{pattern!r} not in\n{out}"
    if case == "calls_late":  # the report names the rank that is late, and only it
        assert {int(r) for r in re.findall(r"rank (\d) is past its host call", out)} == {nranks - 1}, out
    if case == "group_calls_late":
        assert {int(r) for r in re.findall(r"rank (\d) has made no host call", out)} == {nranks - 1}, out
    listed = re.search(r"CHECK heap-files ?(.*)$", proc.stdout, re.M)
    assert listed, out
    left = [f for f in listed.group(1).split() if os.path.exists(f)]
    assert not left, f"left behind: {left}"
