"""Deadlines for the host's waits: every host collective of a context (the call agreement, plan
building, registration, ``barrier()``, ``close()``) is watched by the watchdog thread, like the
kernels' waits.

A rank blocked in MPI (or gloo) cannot time out by itself: its main thread is inside the library
call. So each host collective of the bootstrap goes through :class:`WatchedBootstrap`, which notes
on the node's *board* (shared memory, one slot per rank of the node) that this rank has entered its
``k``-th host collective, of which kind (allgather, barrier, ...) and in which call (a label such
as ``iris.runtime.Iris.close()`` or ``the agreement on iris.collectives.ccl.all_reduce(...)``), and
that it has left it. The watchdog thread (:meth:`HostWaits.check`) reads the board every poll:

- a rank of the node inside its ``k``-th host collective too, but of another kind, for more than
  ``MISMATCH_S``: the ranks made different calls (``close()`` where the others agree on an
  ``all_reduce``: a rank skipped the collective), which no library call would ever complete. The
  job ends at once, naming both calls;
- after ``still_waiting_s`` (10 s, or half the time limit when that is shorter): one line saying
  which ranks of the node have not come (they have made fewer host collectives) and where they are;
- after the watchdog's time limit: the report (the call, how long, the missing ranks and where
  they are), and the job ends as it does for a kernel's wait (every rank's kernels drained first).

Ranks of other nodes have no slot here: a wait for them is bounded all the same, and their own
watchdogs report where they are. Cost: a few hundred nanoseconds of Python per host collective
(no extra message); the per-call path of a cached collective has none.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import time
import uuid

#: Kinds of host collectives, as numbers on the board.
KINDS = ("none", "allgather", "allgather_int64", "gather", "gather_int64", "bcast", "allreduce", "barrier",
         "node_allgather", "node_barrier")
_KIND_IDS = {name: i for i, name in enumerate(KINDS)}
#: Bytes of one rank's slot on the board: a header of int64 words, then the label (UTF-8).
SLOT_BYTES = 1024
_HEADER = struct.Struct("<qqqqqq")  # exited, seq, inside, start_ns, kind, label length
LABEL_BYTES = SLOT_BYTES - _HEADER.size
#: Seconds two ranks must sit in host collectives of different kinds with the same number before
#: the watchdog calls it a mismatch (a moment's overlap is a rank about to leave one).
MISMATCH_S = 1.0
#: Seconds after which a host wait prints its first "still waiting" line (or half the limit).
STILL_WAITING_S = 10.0


class NodeBoard:
    """One slot per rank of the node, in shared host memory: whether that rank has closed its
    context or is exiting normally, and the host collective it is in. Set up collectively through
    the bootstrap ``boot``."""

    def __init__(self, boot):
        self.local_rank = local_rank = boot.local_rank
        local_size = boot.local_size
        size = SLOT_BYTES * local_size
        path = boot.node_allgather(f"/dev/shm/iris-board-{uuid.uuid4().hex[:16]}" if local_rank == 0 else None)[0]
        if local_rank == 0:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.ftruncate(fd, size)
            os.close(fd)
        boot.node_barrier()
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        boot.node_barrier()
        if local_rank == 0:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self.words = memoryview(self._map).cast("q")
        self._mine = local_rank * SLOT_BYTES // 8

    # --- exit flags ------------------------------------------------------------------------------
    def mark_exit(self) -> None:
        self.words[self._mine] = 1

    def exited(self, local_rank: int) -> bool:
        return self.words[local_rank * SLOT_BYTES // 8] != 0

    # --- host collectives --------------------------------------------------------------------------
    def enter(self, seq: int, kind: int, label: bytes) -> None:
        """This rank enters its ``seq``-th host collective: the label, then the header, ``inside`` last."""
        base, words = self._mine, self.words
        start = self.local_rank * SLOT_BYTES + _HEADER.size
        self._map[start:start + len(label)] = label
        words[base + 5] = len(label)
        words[base + 4] = kind
        words[base + 3] = time.monotonic_ns()
        words[base + 1] = seq
        words[base + 2] = 1

    def leave(self) -> None:
        self.words[self._mine + 2] = 0

    def read(self, local_rank: int) -> tuple[int, bool, int, int, str]:
        """``(seq, inside, start_ns, kind, label)`` of a rank of the node (read twice until stable:
        the owner may be writing)."""
        for _ in range(3):
            start = local_rank * SLOT_BYTES
            _, seq, inside, since, kind, length = _HEADER.unpack_from(self._map, start)
            label = bytes(self._map[start + _HEADER.size:start + _HEADER.size + max(0, min(length, LABEL_BYTES))])
            if _HEADER.unpack_from(self._map, start)[1:3] == (seq, inside):
                break
        return seq, bool(inside), since, kind, label.decode(errors="replace")


class HostWaits:
    """This rank's host collectives as the board shows them, and the watchdog thread's view of
    them (see the module docstring). ``node``: ``(rank, local rank)`` of every rank of the node."""

    def __init__(self, board: NodeBoard, rank: int, world_size: int, node: list[tuple[int, int]],
                 device_calls=None, call_counts=None, scope: str = ""):
        self.board, self.rank, self.world_size = board, rank, world_size
        self.node = node
        #: Whose host collectives these are, named in the labels ("group [0, 2]"); "" for the context's.
        self.scope = scope
        #: ``device_calls(ranks)``: text saying which collective call those ranks' kernels (and
        #: this rank's) are in, for the reports; "" where unknown.
        self.device_calls = device_calls or (lambda ranks: "")
        #: ``call_counts()``: every rank's count of collective calls its kernels entered (the
        #: device side of the call agreement), or None where unknown.
        self.call_counts = call_counts or (lambda: None)
        self.seq = 0
        self._labels: list[tuple[str, bool]] = []
        self._synced = False  # the host collective this rank is in follows a device synchronisation
        self._warned_seq = 0  # the host collective whose "still waiting" line was printed

    @contextlib.contextmanager
    def label(self, text: str, synced: bool = False):
        """Name the host collectives made inside the block (``text``: the call, as messages show it).
        ``synced``: this rank's kernels have all ended before them (``Iris.barrier()``), so its
        count of collective calls is final while it waits in them."""
        self._labels.append((text, synced))
        try:
            yield
        finally:
            self._labels.pop()

    def enter(self, kind: str) -> None:
        self.seq += 1
        # the innermost call first: "iris.runtime.Iris.barrier() within the plan of ..."
        text = (" within ".join(t for t, _ in reversed(self._labels)) if self._labels
                else f"a host {kind} of iris.runtime")
        if self.scope:
            text += f" on {self.scope}"
        self._synced = bool(self._labels) and self._labels[-1][1]
        self.board.enter(self.seq, _KIND_IDS.get(kind, 0), text.encode()[:LABEL_BYTES])

    def leave(self) -> None:
        self.board.leave()

    def _where(self, seq: int, inside: bool, label: str) -> str:
        if seq == 0:
            return f"has made no host call{' of the ' + self.scope.split()[0] if self.scope else ''} yet"
        if inside:
            return f"in {label} (its host call #{seq})"
        return f"past its host call #{seq} ({label}), in no host call"

    def check(self, timeout_s: float) -> tuple[str, str] | None:
        """What the watchdog thread must do about this rank's host wait, if anything:
        ``("mismatch" | "timeout" | "waiting", message)``, or None."""
        seq, inside, since, kind, label = self.board.read(self.board.local_rank)
        if not inside or seq != self.seq:
            return None
        waited = (time.monotonic_ns() - since) / 1e9
        if waited < min(MISMATCH_S, timeout_s or MISMATCH_S):
            return None
        # The kernels' call counts first, then the board: a rank seen outside this host call
        # had not entered it when its count was read.
        counts = self.call_counts() if self._synced else None
        missing, differing, absent, ahead = [], [], [], []
        for rank, local_rank in self.node:
            if rank == self.rank:
                continue
            p_seq, p_inside, p_since, p_kind, p_label = self.board.read(local_rank)
            if p_seq < seq:
                where = self._where(p_seq, p_inside, p_label)
                missing.append(f"rank {rank} {where}" if p_seq == 0 else f"rank {rank} is {where}")
                absent.append(rank)
                if counts is not None and counts[rank] is not None and counts[self.rank] is not None \
                        and counts[rank] > counts[self.rank]:
                    ahead.append(rank)
            elif p_seq == seq and p_inside and p_kind != kind and (time.monotonic_ns() - p_since) / 1e9 >= MISMATCH_S:
                differing.append((rank, p_label))
        me = f"rank {self.rank} is in {label} (its host call #{seq}: {_a(KINDS[kind])} of every rank)"
        if differing:
            others = "; ".join(f"rank {r} is in {text} (its host call #{seq} too)" for r, text in differing)
            return "mismatch", (
                f"iris watchdog: the ranks made different calls (an IrisCallMismatchError): {me}; {others}. No rank "
                f"can leave such a call: a rank skipped a collective call, or made one that the others did not. Every "
                f"rank must make the same collective calls in the same order. Ending the job.")
        if ahead:
            # This rank's kernels have all ended (it synchronised before this host call), and a rank
            # that has not come has entered more collective calls: calls this rank never made.
            return "mismatch", (
                f"iris watchdog: the ranks made different calls (an IrisCallMismatchError): {me}, after its kernels "
                f"entered {counts[self.rank]} collective call(s), but rank(s) {', '.join(map(str, ahead))} entered "
                f"more before coming here{self.device_calls(ahead)}: a rank skipped a collective call (here: rank "
                f"{self.rank}), or made one that the others did not. Every rank must make the same collective calls "
                f"in the same order. Ending the job.")
        remote = (" (ranks on other nodes are not seen from here: their own reports say where they are)"
                  if len(self.node) < self.world_size else "")
        who = "; ".join(missing) if missing else "no rank of this node is missing"
        if timeout_s and waited > timeout_s:
            return "timeout", (
                f"iris watchdog: rank {self.rank} waited {waited:.1f} s in {label} (its host call #{seq}: "
                f"{_a(KINDS[kind])} of every rank) for the other ranks: {who}{remote}"
                f"{self.device_calls(absent)}. A rank did not make the matching "
                f"call, died, or is slower than the timeout ({timeout_s:g} s) allows: raise it with IRIS_TIMEOUT_S or "
                f"iris.runtime.iris(timeout_s=...), or set 0 to switch the watchdog off. Ending the job.")
        if waited > still_waiting_s(timeout_s) and self._warned_seq != seq:
            self._warned_seq = seq
            return "waiting", (f"iris watchdog: rank {self.rank} still waiting after {waited:.0f} s in {label} (its "
                               f"host call #{seq}): {who}{remote}{self.device_calls(absent)}")
        return None


def _a(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def still_waiting_s(timeout_s: float) -> float:
    """When a host wait prints its "still waiting" line: after 10 s, or half the limit if shorter."""
    return min(STILL_WAITING_S, timeout_s / 2) if timeout_s else STILL_WAITING_S


class WatchedBootstrap:
    """The bootstrap ``boot`` with every host collective noted on the board (``waits``); anything
    else is ``boot``'s own."""

    def __init__(self, boot, waits: HostWaits):
        self._boot, self._waits = boot, waits

    def __getattr__(self, name):
        return getattr(self._boot, name)

    def _watched(self, kind: str, call, *args, **kwargs):
        waits = self._waits
        waits.enter(kind)
        try:
            return call(*args, **kwargs)
        finally:
            waits.leave()

    def allgather(self, obj) -> list:
        return self._watched("allgather", self._boot.allgather, obj)

    def allgather_int64(self, array):
        return self._watched("allgather_int64", self._boot.allgather_int64, array)

    def gather(self, obj, root: int = 0):
        return self._watched("gather", self._boot.gather, obj, root)

    def gather_int64(self, array, root: int = 0):
        return self._watched("gather_int64", self._boot.gather_int64, array, root)

    def bcast(self, obj, root: int = 0):
        return self._watched("bcast", self._boot.bcast, obj, root)

    def allreduce(self, value, op: str = "sum"):
        return self._watched("allreduce", self._boot.allreduce, value, op)

    def barrier(self) -> None:
        return self._watched("barrier", self._boot.barrier)

    def node_allgather(self, obj) -> list:
        return self._watched("node_allgather", self._boot.node_allgather, obj)

    def node_barrier(self) -> None:
        return self._watched("node_barrier", self._boot.node_barrier)
