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

import contextlib
import mmap
import os
import sys
import threading
import time
import uuid

import torch

from iris.device import _layout as layout
from iris.device import _watchdog as device_watchdog

from ._errors import IrisTimeoutError

#: How often the thread looks at the report, in seconds.
POLL_S = 0.05
#: How long the rank whose wait ran out waits before aborting, so that peers print their reports.
GRACE_S = 1.0
#: The exit code of a job that the watchdog ended.
EXIT_CODE = 75
#: How long a failing rank lets the drained kernels end before it aborts the job.
DRAIN_S = 0.3

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
    if r["state"] == device_watchdog.STATE_MISMATCH:
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
        else:
            cause = ("A rank did not make the matching call (every rank must call each collective for the same tiles, "
                     "in the same order, with the same grid)")
        return (f"iris watchdog: rank {r['rank']} waited {r['waited_ns'] / 1e9:.1f} s {where}. {cause}, died, or is "
                f"slower than the timeout ({timeout_s:g} s) allows: raise it with IRIS_TIMEOUT_S or "
                f"iris.runtime.iris(timeout_s=...), or set 0 to switch the watchdog off. Ending the job.")
    cause = ("a wait timed out on some rank (its report says which)"
             if r["state"] == device_watchdog.STATE_DRAINED else "a rank failed (see its message)")
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


class NodeExitFlags:
    """One int32 per rank of the node, in shared host memory: 1 once that rank has closed its
    context or is exiting normally. Set up collectively through the bootstrap ``boot``."""

    def __init__(self, boot):
        self.local_rank = local_rank = boot.local_rank
        local_size = boot.local_size
        path = boot.node_allgather(f"/dev/shm/iris-exit-{uuid.uuid4().hex[:16]}" if local_rank == 0 else None)[0]
        if local_rank == 0:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.ftruncate(fd, 4 * local_size)
            os.close(fd)
        boot.node_barrier()
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, 4 * local_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        boot.node_barrier()
        if local_rank == 0:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self.words = memoryview(self._map).cast("i")

    def mark_exit(self) -> None:
        self.words[self.local_rank] = 1

    def exited(self, local_rank: int) -> bool:
        return self.words[local_rank] != 0


class Watchdog:
    """The report words of this rank and the thread that watches them (and the node's ranks)."""

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
        self.exit_flags = None
        self._peers: list[tuple[int, int, int]] = []  # (rank, local rank, pid) of the node's other ranks
        if boot is not None:
            self.exit_flags = NodeExitFlags(boot)
            node = boot.node_allgather((rank, boot.local_rank, os.getpid()))
            self._peers = [p for p in node if p[0] != rank]
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
        # the waiting rank is this process's, whose kernels alone write this record: named from the
        # host, not from the word a kernel read out of whatever table it was passed
        return describe(words, self.world_size, self.timeout_s, self.ranks_behind(words[_FIELDS.index("calls")]),
                        rank=self.rank)

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
        if self.heap is None:
            return 0
        done = 0
        for base in self.heap.bases:
            if not base:
                continue  # another node's heap (nvshmem backend): its own watchdog drains it
            address = base + self.heap_size + device_watchdog.DRAIN_OFFSET
            current = self.heap.read_int32(address)
            if current is not None and current >= reason:
                done += 1
            else:
                done += bool(self.heap.write_int32(address, reason))
        return done

    def before_abort(self) -> None:
        """What a failing rank does before the job is aborted: stop every rank's waiting kernels, and give
        them a moment to end (a process killed while its kernels spin upsets MPS)."""
        if self.timeout_s > 0 and not self._closing and self.drain_all() > 0:
            time.sleep(DRAIN_S)

    def _dead_peer(self) -> tuple[int, int] | None:
        if self._closing or self.exit_flags is None:
            return None
        for rank, local_rank, pid in self._peers:
            if not self.exit_flags.exited(local_rank) and process_gone(pid):
                # the flag again: a peer that exits normally sets it before its process goes away
                if not self.exit_flags.exited(local_rank):
                    return rank, pid
        return None

    def _abort(self, message: str, grace: float) -> None:
        print(message, file=sys.stderr, flush=True)
        time.sleep(grace)
        print(f"iris watchdog: rank {self.rank}: {self.boot.abort_call}({EXIT_CODE})", file=sys.stderr, flush=True)
        self.boot.abort(EXIT_CODE)

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            # A wait of this rank ran out of time, a message of this rank's had the wrong size, or rows
            # did not fit its output: every rank's waits stop and report theirs.
            first = int(self._words[0]) in (device_watchdog.STATE_TIMED_OUT, device_watchdog.STATE_MISMATCH,
                                            device_watchdog.STATE_CAPACITY)
            if first:
                self.drain_all(device_watchdog.DRAIN_TIMED_OUT)
            message = self.report()
            if message is not None:
                # The rank that timed out ends the job after a grace period, so that the others'
                # reports get out; the ranks it drained only if it could not.
                self._abort(message, GRACE_S if first else 10 * GRACE_S)
                return
            dead = self._dead_peer()
            if dead is not None:
                rank, pid = dead
                self.drain_all()
                self._abort(f"iris watchdog: rank {rank} (pid {pid}) ended without closing its iris context "
                            f"(killed, or crashed outside Python) while rank {self.rank} runs; ending the job.",
                            DRAIN_S)
                return

    def mark_exit(self) -> None:
        """This rank closes or exits normally: peers must not take its end for a crash."""
        self._closing = True
        if self.exit_flags is not None:
            self.exit_flags.mark_exit()

    def close(self) -> None:
        self.mark_exit()
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5 * POLL_S)


def write_watchdog_info(context: torch.Tensor, world_size: int, timeout_ns: int, record_ptr: int) -> None:
    """Update the watchdog words of ``context`` in place (kernels launched afterwards see them)."""
    trailer = layout.HEAP_BASES + world_size
    assert layout.WATCHDOG_RECORD - layout.WATCHDOG_NS == 1  # the two words are adjacent
    values = torch.tensor([timeout_ns, record_ptr], dtype=torch.int64)
    context[trailer + layout.WATCHDOG_NS:trailer + layout.WATCHDOG_NS + 2].copy_(values.to(context.device))
