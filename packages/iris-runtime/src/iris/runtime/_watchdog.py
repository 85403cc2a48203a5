"""The watchdog's host side: read the report a stopped wait wrote, say it, end the job.

The device side (``iris.device._watchdog``) bounds every wait of iris.collectives by the timeout
in the context tensor and, when one runs out, writes a short report into the host-visible words
that this module allocates. A daemon thread polls those words every ``POLL_S`` seconds: plain reads
of pinned host memory, no CUDA call, so it works while kernels spin, while another thread captures
a CUDA graph, and while the main thread is blocked in a synchronisation or in a host collective.
When a report appears, the thread first raises every rank's drain word if the wait ran out of
time (so that every rank's waits stop and report theirs), compares the ranks' call counters for
the tile to name the ranks that never made the call (heap words read on a private stream, which
does not wait for the spinning kernels), prints the report on stderr, waits ``GRACE_S`` so that
the other ranks' reports get out too, and ends the whole job through the bootstrap
(``MPI_Abort``, or under torchrun this rank's exit, which makes the elastic agent end the others;
exit code ``EXIT_CODE``). ``Iris.barrier()`` and
``Iris.close()`` also look, so a program never goes on past a wait that gave up.

A stopped wait does not let its kernel end: it waits for the record's ``ack`` word. The thread
writes it last (:meth:`Watchdog._end_job`): after the report is out, it points this rank's stdout
at ``/dev/null``, keeps the interpreter lock from then on (a huge switch interval, and no call
that releases it), writes ``ack`` and ends the job. Between the kernel's end and the process's,
the main thread cannot run a line of Python: no rank prints a result of a call that gave up.
Ranks that were only drained write ``ack`` once their report is out and then wait, holding the
lock, for the job to end, so that no kernel spins when the job is aborted.

The same thread bounds the host's waits (:mod:`._host_waits`): a host collective that lasts longer
than the limit is reported (the call, the missing ranks and where they are) and ends the job the
same way; one that another rank of the node cannot match (another call at the same point) ends it
at once; after ``still_waiting_s`` one line says who is missing. Reports also name the collective
call each rank's kernels were in (the device side of the call agreement,
:mod:`iris.device._calls`), and a kernel that found the ranks' calls differ (``STATE_CALL_MISMATCH``)
has both calls named.

Two more ways a job ends without a hang, and without killing ranks whose kernels still spin
(which leaves MPS refusing new clients for a while):

- a rank that fails (an uncaught exception, or the watchdog ending the job) first raises every
  rank's *drain* word (``drain_all``): the waiting kernels stop within a millisecond and report,
  then the bootstrap's abort ends the processes;
- the thread also watches the other ranks of its node: a rank whose process is gone without
  having closed its context or exited normally (``NodeExitFlags``) was killed. The thread names
  it, drains every rank and ends the job.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time

import torch

from iris.device import _calls as device_calls
from iris.device import _layout as layout
from iris.device import _watchdog as device_watchdog

from ._errors import IrisTimeoutError
from ._host_waits import MISMATCH_S, NodeBoard

#: How often the thread looks at the report, in seconds.
POLL_S = 0.05
#: How long the rank whose wait ran out waits before aborting, so that peers print their reports.
GRACE_S = 1.0
#: The exit code of a job that the watchdog ended.
EXIT_CODE = 75
#: How long a failing rank lets the drained kernels end before it aborts the job.
DRAIN_S = 0.3
#: How long the thread lets this rank's kernels end after it acknowledged their stopped waits.
ACK_S = 0.05

_FIELDS = device_watchdog.RECORD_FIELDS


def describe(words: list[int], world_size: int, timeout_s: float, behind: int = 0, rank: int | None = None) -> str:
    """The report of a stopped wait (``words``: the record's int64 words) as one message; ``behind``
    has bit r set when rank r had made fewer calls on the tile than the reporting rank. ``rank``:
    the rank whose process holds the record, i.e. the one that waited (the watchdog passes its
    own); None takes the record's word, which is what the kernel read from the table it was given."""
    r = dict(zip(_FIELDS, words))
    if rank is not None:
        r["rank"] = rank
    call = device_watchdog.WAIT_CALLS[r["call"]] if 0 <= r["call"] < len(device_watchdog.WAIT_CALLS) else "an iris wait"
    flag = device_watchdog.WAIT_FLAGS[r["flag"]] if 0 <= r["flag"] < len(device_watchdog.WAIT_FLAGS) else "flag"
    if r["state"] == device_watchdog.STATE_SIZE_MISMATCH:
        text = device_watchdog.mismatch_text(call, r["rank"], r["peer"], r["index"], r["seen"], r["target"])
        return f"iris watchdog: {text}. Ending the job."
    if r["state"] == device_watchdog.STATE_CAPACITY:
        text = device_watchdog.capacity_text(call, r["rank"], flag, r["index"], r["seen"], r["target"])
        return f"iris watchdog: {text}. Ending the job."
    tagged = call in device_watchdog.TAGGED_CALLS  # point to point: the index is the message's tag
    missing = [rank for rank in range(world_size) if behind >> rank & 1]
    if missing:
        peers = f"rank(s) {', '.join(map(str, missing))}, which had not made this call on the tile"
    elif r["peer"] >= 0:
        peers = f"peer {r['peer']}"
    elif world_size == 2:
        peers = f"peer {1 - r['rank']}"
    else:
        peers = f"{r['target'] - r['seen']} arrival(s) from the other {world_size - 1} ranks"
    where = (f"in {call} on flag '{flag}' of {'tag' if tagged else 'tile/slot'} {r['index']}: it holds {r['seen']}, "
             f"expected >= {r['target']}, still missing: {peers}")
    if r["state"] == device_watchdog.STATE_TIMED_OUT:
        if tagged:
            matching = f"recv from rank {r['rank']}" if call.endswith(".send") else f"send to rank {r['rank']}"
            cause = (f"Rank {r['peer']} did not make the matching {matching} with tag {r['index']} (the calls of a "
                     f"peer and tag pair up in the order they are made)")
            if call.endswith(".send") and flag in ("credit", "request", "done"):
                # a send that waits for its receive: two ranks sending each other such messages before
                # either receives wait for each other, a common way to get here
                cause += ("; a message larger than an inbox waits for its receive, so ranks that send each other "
                          "such messages before receiving wait for each other: receive first on one of them, or "
                          "use ccl.batch_isend_irecv (on the cpu backend an isend completes before it returns)")
        else:
            cause = ("A rank did not make the matching call (every rank must call each collective for the same tiles, "
                     "in the same order, with the same grid)")
        return (f"iris watchdog: rank {r['rank']} waited {r['waited_ns'] / 1e9:.1f} s {where}. {cause}, died, or is "
                f"slower than the timeout ({timeout_s:g} s) allows: raise it with IRIS_TIMEOUT_S or "
                f"iris.runtime.iris(timeout_s=...), or set 0 to switch the watchdog off. Ending the job.")
    causes = {device_watchdog.STATE_DRAINED: "a wait timed out on some rank (its report says which)",
              device_watchdog.STATE_CALLS_DIFFER: "a rank found that the ranks made different collective calls "
                                                  "(its report names them)"}
    cause = causes.get(r["state"], "a rank failed (see its message)")
    waited = r["waited_ns"] / 1e9
    return f"iris watchdog: rank {r['rank']} stopped waiting after {waited:.1f} s {where}, because {cause}."


def process_gone(pid: int) -> bool:
    """True when process ``pid`` no longer runs (it does not exist, or is a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return False


class Watchdog:
    """The report words of this rank and the thread that watches them, the node's ranks and this
    rank's host waits."""

    def __init__(self, rank: int, world_size: int, device: torch.device, timeout_s: float, heap=None,
                 heap_size: int = 0, boot=None):
        self.boot, self.rank, self.world_size, self.timeout_s = boot, rank, world_size, timeout_s
        self.heap, self.heap_size = heap, heap_size
        # Pinned host memory: with unified addressing its address is valid on the GPU as well.
        self.record = torch.zeros(device_watchdog.RECORD_WORDS, dtype=torch.int64,
                                  pin_memory=device.type == "cuda")
        self._words = self.record.numpy()
        self._stop = threading.Event()
        self._closing = False
        self._thread = None
        self.board = None
        #: This rank's host collectives, which the thread bounds (None without a bootstrap).
        self.host_waits = None
        #: The host collectives of the groups this rank is a member of (each on a board of its own).
        self._group_waits: tuple = ()
        #: ``fingerprint -> text`` of the agreed collective calls (set by the context), or None.
        self.describe_call = None
        #: ``(rank, peer, call, mine, theirs) -> message`` of a kernel's call mismatch, or None.
        self.mismatch_message = None
        self._peers: list[tuple[int, int, int]] = []  # (rank, local rank, pid) of the node's other ranks
        self._suspect = None  # (this rank's call, a peer's, since): calls_differ's suspicion
        # held while the thread reads the heap, and by detach_heap(): close() unmaps it afterwards
        self._heap_lock = threading.Lock()
        if boot is not None:
            from ._host_waits import HostWaits

            self.board = NodeBoard(boot)
            node = boot.node_allgather((rank, boot.local_rank, os.getpid()))
            self._peers = [p for p in node if p[0] != rank]
            self.host_waits = HostWaits(self.board, rank, world_size, [(r, local) for r, local, _ in node],
                                        self._device_calls_text, self._call_counts)
        if timeout_s > 0:
            self._thread = threading.Thread(target=self._watch, name=f"iris-watchdog-{rank}", daemon=True)
            self._thread.start()

    @property
    def address(self) -> int:
        return self.record.data_ptr()

    @property
    def timeout_ns(self) -> int:
        return int(self.timeout_s * 1e9) if device_watchdog.WATCHDOG.value else 0

    def report(self) -> str | None:
        """The message of this rank's report, or None while no wait stopped."""
        if int(self._words[0]) == 0:
            return None
        words = [int(w) for w in self._words]
        r = dict(zip(_FIELDS, words))
        if r["state"] == device_watchdog.STATE_CALL_MISMATCH:
            args = (r["rank"], r["peer"], r["index"], r["target"], r["seen"])
            text = self.mismatch_message(*args) if self.mismatch_message is not None else None
            if text is not None:
                return f"{text} Ending the job."
            return (f"iris: rank {args[0]} and rank {args[1]} made different collective calls (call #{args[2]}, "
                    f"fingerprints {args[3]:#x} and {args[4]:#x}). Ending the job.")
        # the waiting rank is this process's, whose kernels alone write this record: named from the
        # host, not from the word a kernel read out of whatever table it was passed
        message = describe(words, self.world_size, self.timeout_s, self.ranks_behind(r["calls"]),
                           rank=self.rank)
        latest = self.latest_call(r["latest"])
        return message if latest is None else f"{message} {latest}"

    def device_calls(self) -> list[tuple[int, int] | None] | None:
        """Every rank's latest collective call as its kernels published it into this rank's signal
        pad (the device side of the call agreement, ``iris.device._calls``): ``(n, fingerprint)``
        per rank, ``(0, 0)`` before its first, None where a word cannot be read; None altogether
        where the check is off. Host reads of this rank's heap (on the GPU, copies on a private
        stream: for reports, not for every poll)."""
        if not device_calls.CHECK_CALLS.value or not 1 < self.world_size <= layout.CALL_CHECK_MAX_RANKS:
            return None
        with self._heap_lock:
            heap = self.heap
            if heap is None:
                return None
            slots = heap.bases[self.rank] + self.heap_size + device_calls.SLOTS_OFFSET
            calls: list[tuple[int, int] | None] = []
            for q in range(self.world_size):
                latest = None
                for parity in (0, 1):
                    address = slots + (parity * self.world_size + q) * 8
                    low, high = heap.read_int32(address), heap.read_int32(address + 4)
                    if low is not None and high is not None and (latest is None or high > latest[0]):
                        latest = (high, low & device_calls.FINGERPRINT_MASK)
                calls.append(latest)
        return calls

    def detach_heap(self) -> None:
        """From now on the thread leaves the heap alone (``close()`` is about to unmap it)."""
        with self._heap_lock:
            self.heap = None

    def _call_counts(self) -> list[int | None] | None:
        calls = self.device_calls()
        return None if calls is None else [None if c is None else c[0] for c in calls]

    def _device_calls_text(self, ranks: list[int]) -> str:
        # For the host waits' reports: where the kernels of ``ranks`` (and this rank's) are.
        calls = self.device_calls()
        if calls is None:
            return ""
        parts = [f"rank {q}'s kernels' latest collective call: {self.call_text(calls[q])}"
                 for q in (*ranks, self.rank)]
        return f" ({'; '.join(parts)})"

    def call_text(self, call: tuple[int, int] | None) -> str:
        """``call`` (``(n, fingerprint)``) as "collective call #n, <the call>"."""
        if call is None:
            return "unknown (its words could not be read)"
        if call[0] == 0:
            return "none yet"
        text = self.describe_call(call[1]) if self.describe_call is not None else None
        return f"#{call[0]}, {text or f'a call with fingerprint {call[1]:#x}'}"

    def latest_call(self, reported: int = 0) -> str | None:
        """Where this rank's collective calls are: "Rank r's kernels' latest collective call: #n,
        ...", or None where it cannot be read. ``reported``: the word a stopped wait's report
        carries (the record's ``latest``, ``(n << 32) | fingerprint``), read by the kernel itself;
        without it (0), the heap's words, whose host copies can fail while the main thread waits
        for a spinning kernel (``HostWordAccess``)."""
        if not device_calls.CHECK_CALLS.value:
            return None
        if reported > 0:
            call = (reported >> 32, reported & device_calls.FINGERPRINT_MASK)
        else:
            calls = self.device_calls()
            call = None if calls is None else calls[self.rank]
        if call is None or call[0] == 0:
            return None
        return f"Rank {self.rank}'s kernels' latest collective call: {self.call_text(call)}."

    def calls_differ(self) -> str | None:
        """The cpu backend's host-side view of the device check, for calls whose kernels never meet
        (different workspaces: their waits would only end at the time limit): a peer whose latest
        collective call has this rank's number and another fingerprint, for ``MISMATCH_S`` in a
        row, gives the message that ends the job; else None. Reading the pad is a memory read
        there; on the GPU it would be a copy per word, so this is the cpu backend's only (the
        report at the time limit names both calls there)."""
        calls = self.device_calls() if getattr(self.heap, "backend", None) == "cpu" else None
        if calls is None or calls[self.rank] is None or calls[self.rank][0] == 0:
            self._suspect = None
            return None
        mine = calls[self.rank]
        peer = next((q for q, c in enumerate(calls) if c is not None and c[0] == mine[0] and c[1] != mine[1]), None)
        if peer is None:
            self._suspect = None
            return None
        now = time.monotonic()
        if self._suspect is None or self._suspect[:2] != (mine, calls[peer]):
            self._suspect = (mine, calls[peer], now)
            return None
        if now - self._suspect[2] < MISMATCH_S or self.mismatch_message is None:
            return None
        message = self.mismatch_message(self.rank, peer, mine[0], mine[1], calls[peer][1],
                                        "found by the watchdog in the calls their kernels entered, which never meet")
        return None if message is None else f"{message} Ending the job."

    def ranks_behind(self, calls: int) -> int:
        """Bit r set when rank r's call counter at ``calls`` (an address of this rank's heap; every
        rank keeps the counter at the same offset) is below this rank's: rank r never made the call
        that this rank waited in. 0 without an address or a heap, or where a word cannot be read
        (a peer on another node)."""
        if not calls or self.heap is None:
            return 0
        bases = self.heap.bases
        mine = self.heap.read_int32(calls)
        if mine is None:
            return 0
        behind = 0
        for rank, base in enumerate(bases):
            theirs = self.heap.read_int32(base + calls - bases[self.rank]) if base else None
            if theirs is not None and theirs < mine:
                behind |= 1 << rank
        return behind

    def check(self, call: str) -> None:
        """Raise :class:`IrisTimeoutError` if a wait of this rank stopped (``call`` names the caller)."""
        message = self.report()
        if message is not None:
            raise IrisTimeoutError(f"{call}: {message}")

    def drain_all(self, reason: int = device_watchdog.DRAIN_FAILED) -> int:
        """Raise every rank's drain word to ``reason`` (never lower it: a "rank failed" stays), so
        that every waiting kernel stops and reports (best effort; returns how many ranks' words
        hold ``reason`` or more afterwards)."""
        with self._heap_lock:
            return self._drain_all(reason)

    def _drain_all(self, reason: int) -> int:
        heap = self.heap
        if heap is None:
            return 0
        done = 0
        for base in heap.bases:
            if not base:
                continue  # another node's heap (nvshmem backend): its own watchdog drains it
            address = base + self.heap_size + device_watchdog.DRAIN_OFFSET
            current = heap.read_int32(address)
            if current is not None and current >= reason:
                done += 1
            else:
                done += bool(heap.write_int32(address, reason))
        return done

    def before_abort(self) -> None:
        """What a failing rank does before the job is aborted: stop every rank's waiting kernels, and give
        them a moment to end (a process killed while its kernels spin upsets MPS)."""
        if self.timeout_s > 0 and not self._closing and self.drain_all() > 0:
            time.sleep(DRAIN_S)

    def _dead_peer(self) -> tuple[int, int] | None:
        if self._closing or self.board is None:
            return None
        for rank, local_rank, pid in self._peers:
            if not self.board.exited(local_rank) and process_gone(pid):
                # the flag again: a peer that exits normally sets it before its process goes away
                if not self.board.exited(local_rank):
                    return rank, pid
        return None

    def _end_job(self, message: str, grace: float | None) -> None:
        """Print ``message`` and end the job. ``grace``: this rank's failure ends the job after
        ``grace`` seconds (the other ranks' reports get out meanwhile); None: another rank's does
        (this rank was drained), and this one only if that has not happened in ``10 * GRACE_S``.
        Either way this rank's stopped waits are acknowledged only once this thread holds the
        interpreter lock for good and stdout is silenced (see the module docstring)."""
        print(message, file=sys.stderr, flush=True)
        if grace is not None:
            time.sleep(grace)  # this rank's stopped kernels still wait, the others report
        print(f"iris watchdog: rank {self.rank}: {self.boot.abort_call}({EXIT_CODE})"
              if grace is not None else f"iris watchdog: rank {self.rank} ends with the job", file=sys.stderr,
              flush=True)
        _silence_stdout()
        sys.setswitchinterval(_FOREVER_S)  # from here this thread keeps the interpreter lock
        self._words[device_watchdog.ACK_INDEX] = 1  # the stopped waits may return: the kernels end
        _sleep_holding_lock(ACK_S if grace is not None else 10 * GRACE_S)
        self.boot.end_job(EXIT_CODE)

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            state = int(self._words[0])
            # A wait of this rank ran out of time, a message of this rank's had the wrong size, or rows
            # did not fit its output: every rank's waits stop and report theirs.
            stopped = (device_watchdog.STATE_TIMED_OUT, device_watchdog.STATE_SIZE_MISMATCH,
                       device_watchdog.STATE_CAPACITY)
            first = state in stopped + (device_watchdog.STATE_CALL_MISMATCH,)
            if state in stopped:
                self.drain_all(device_watchdog.DRAIN_TIMED_OUT)
            elif state == device_watchdog.STATE_CALL_MISMATCH:
                self.drain_all(device_watchdog.DRAIN_CALLS_DIFFER)
            message = self.report()
            if message is not None:
                # The rank whose wait timed out (or that found a mismatch) ends the job after a
                # grace period, so that the others' reports get out; the ranks it drained only if
                # it could not.
                self._end_job(message, GRACE_S if first else None)
                return
            differ = self.calls_differ()
            if differ is not None:
                self.drain_all(device_watchdog.DRAIN_CALLS_DIFFER)
                self._end_job(differ, GRACE_S)
                return
            ended = False
            for waits in (self.host_waits, *self._group_waits) if self.host_waits is not None else ():
                found = waits.check(self.timeout_s)
                if found is not None:
                    kind, text = found
                    if kind == "waiting":
                        print(text, file=sys.stderr, flush=True)
                    else:
                        self.drain_all(device_watchdog.DRAIN_TIMED_OUT if kind == "timeout"
                                       else device_watchdog.DRAIN_CALLS_DIFFER)
                        self._end_job(text, GRACE_S)
                        ended = True
                        break
            if ended:
                return
            dead = self._dead_peer()
            if dead is not None:
                rank, pid = dead
                self.drain_all()
                self._end_job(f"iris watchdog: rank {rank} (pid {pid}) ended without closing its iris context "
                              f"(killed, or crashed outside Python) while rank {self.rank} runs; ending the job.",
                              DRAIN_S)
                return

    def watch_host_waits(self, waits) -> None:
        """Bound a group's host collectives too (``waits``: its :class:`HostWaits`)."""
        # a new tuple, not a list grown in place: the thread iterates the one it read
        self._group_waits = (*self._group_waits, waits)

    def mark_exit(self) -> None:
        """This rank closes or exits normally: peers must not take its end for a crash."""
        self._closing = True
        if self.board is not None:
            self.board.mark_exit()

    def close(self) -> None:
        self.mark_exit()
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5 * POLL_S)


#: A switch interval no thread reaches: the watchdog's thread keeps the interpreter lock.
_FOREVER_S = 1e6


def _silence_stdout() -> None:
    # This rank's stdout goes to /dev/null: whatever the main thread might still print is lost.
    try:
        sys.stdout.flush()
    except Exception:  # a closed or broken stdout: nothing to keep
        pass
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:
        pass


def _sleep_holding_lock(seconds: float) -> None:
    """Sleep without releasing the interpreter lock (a C call through ``ctypes.PyDLL``, which keeps
    it): the main thread cannot run Python meanwhile."""
    try:
        usleep = ctypes.PyDLL(None).usleep
        for _ in range(int(seconds / 0.5)):
            usleep(500_000)  # POSIX allows usleep to refuse a second or more
        usleep(int(seconds % 0.5 * 1e6))
    except (OSError, AttributeError):  # no usleep here: spin instead, which keeps the lock as well
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass


def write_watchdog_info(context: torch.Tensor, world_size: int, timeout_ns: int, record_ptr: int) -> None:
    """Update the watchdog words of ``context`` in place (kernels launched afterwards see them)."""
    trailer = layout.HEAP_BASES + world_size
    assert layout.WATCHDOG_RECORD - layout.WATCHDOG_NS == 1  # the two words are adjacent
    values = torch.tensor([timeout_ns, record_ptr], dtype=torch.int64)
    context[trailer + layout.WATCHDOG_NS:trailer + layout.WATCHDOG_NS + 2].copy_(values.to(context.device))
