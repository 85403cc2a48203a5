"""The watchdog's device side: production waits that end, and say why.

A wait for a peer's flag spins until the peer arrives. If the peer never comes (it skipped the
call, launched another grid, died), the spin would never end and the job would hang in silence.
So every wait of iris.collectives is bounded, in production too, by the timeout that the runtime
writes into the context tensor (``IRIS_TIMEOUT_S``, default 300 s; see ``iris.runtime.iris``).

How, at no measurable cost:

- a wait that finds its flag already set never reaches this code;
- a wait that spins counts its polls and looks at the clock every ``CHECK_POLLS`` polls only;
- when the time is up, the program writes one report (rank, call, flag, tile, peer, values) into
  host-visible memory whose address is in the context tensor, raises the *drain* word in every
  rank's signal pad, and stops waiting. A waiting program that finds its rank's drain word raised
  stops too and reports its own wait, so every rank that waits says what it waited for. The
  runtime raises the drain words too, when a rank fails, so that no kernel is left spinning when
  the job is aborted;
- the runtime's watchdog thread reads the report from the host (no CUDA call, so it works while
  kernels spin or a graph is being captured), prints it and ends the job with ``MPI_Abort``.

A wait that gave up returns with its flag not reached; the job ends before the results matter.
``IRIS_TIMEOUT_S=0`` (read at import, like ``IRIS_DEBUG``) compiles all of this out.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from . import _layout
from ._interpreter import INTERPRETER
from ._layout import HEAP_SIZE_C, WATCHDOG_NS_C, WATCHDOG_RECORD_C
from ._tracing import device_clock_ns
from ._vote import cta_any


def timeout_from_env(default: float = 300.0) -> float:
    """``IRIS_TIMEOUT_S`` in seconds (``default`` when unset); 0 switches the watchdog off."""
    text = os.environ.get("IRIS_TIMEOUT_S", "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0:
        from ._errors import IrisUsageError

        raise IrisUsageError(f"IRIS_TIMEOUT_S={text!r}: set a number of seconds >= 0 (0 switches the watchdog off)")
    return value


#: Compile-time switch: bounded waits are compiled in unless ``IRIS_TIMEOUT_S=0`` at import.
WATCHDOG: tl.constexpr = tl.constexpr(timeout_from_env() > 0)

#: Polls between two looks at the clock. A poll is an acquire load at system scope (about a
#: microsecond on the GPU), so the clock is read about once a millisecond; under the interpreter
#: a poll costs far more.
CHECK_POLLS: tl.constexpr = tl.constexpr(4 if INTERPRETER else 1024)

#: The report: int64 words in host-visible memory (``WATCHDOG_RECORD`` in the context tensor), in
#: this order. ``state`` is written last: 0 (nothing), STATE_TIMED_OUT or STATE_DRAINED; ``call``
#: and ``flag`` index WAIT_CALLS and WAIT_FLAGS; ``peer`` is -1 when the wait was for several;
#: ``behind`` has bit r set when rank r had made fewer calls on the tile than this rank (0 when the
#: wait has no call counter to compare).
RECORD_FIELDS = ("state", "call", "flag", "rank", "peer", "index", "seen", "target", "waited_ns", "behind")
RECORD_WORDS = len(RECORD_FIELDS)
STATE_TIMED_OUT = 1  #: this rank's wait ran out of time
STATE_DRAINED = 2    #: this rank stopped waiting because another wait (maybe a peer's) ran out of time
STATE_FAILED = 3     #: this rank stopped waiting because a rank failed (see the runtime's message)
#: Values of the drain word (the state a draining wait reports is ``1 + value``).
DRAIN_TIMED_OUT = 1  #: a wait ran out of time somewhere
DRAIN_FAILED = 2     #: a rank failed: it raised, or its process is gone
_STATE: tl.constexpr = tl.constexpr(0)
_CALL: tl.constexpr = tl.constexpr(1)
_FLAG: tl.constexpr = tl.constexpr(2)
_RANK: tl.constexpr = tl.constexpr(3)
_PEER: tl.constexpr = tl.constexpr(4)
_INDEX: tl.constexpr = tl.constexpr(5)
_SEEN: tl.constexpr = tl.constexpr(6)
_TARGET: tl.constexpr = tl.constexpr(7)
_WAITED: tl.constexpr = tl.constexpr(8)
_BEHIND: tl.constexpr = tl.constexpr(9)
_TIMED_OUT: tl.constexpr = tl.constexpr(STATE_TIMED_OUT)
_DRAIN_TIMED_OUT: tl.constexpr = tl.constexpr(DRAIN_TIMED_OUT)
# Where the header words sit relative to heap_bases (context + HEAP_BASES).
_CUR_RANK_AT: tl.constexpr = tl.constexpr(_layout.CUR_RANK - _layout.HEAP_BASES)
_NUM_RANKS_AT: tl.constexpr = tl.constexpr(_layout.NUM_RANKS - _layout.HEAP_BASES)

#: Byte offset in the signal pad of the drain word (int32; raised once, never lowered) and of the
#: claim word after it (the first program of the process that reports takes it).
DRAIN_OFFSET = _layout.SIGNAL_PAD_BYTES - _layout.PAD_RESERVED_BYTES + _layout.WATCHDOG_WORDS_AT
DRAIN_OFFSET_C: tl.constexpr = tl.constexpr(DRAIN_OFFSET)

#: Names a report can carry; a name that is not here is reported as the first one.
WAIT_CALLS = ("an iris wait", "iris.collectives.wait_at_least", "iris.collectives.all_reduce_one_shot",
              "iris.collectives.all_reduce_two_shot", "iris.collectives.all_reduce_spinlock",
              "iris.collectives.all_reduce_ring", "iris.collectives.reduce_scatter",
              "iris.collectives.device_barrier", "iris.collectives.all_gather", "iris.collectives.gather",
              "iris.collectives.all_to_all", "iris.collectives.all_reduce_atomic",
              "iris.collectives.ops.matmul_reduce_scatter", "iris.collectives.ops.all_gather_matmul",
              "iris.collectives.ccl.all_gather", "iris.collectives.ccl.all_to_all", "iris.collectives.ccl.broadcast")
WAIT_FLAGS = ("flag", "arrivals", "ready", "done", "entered", "mutex", "credit", "partial", "result",
              "done reading")


@triton.constexpr_function
def _call_index(call):
    # A loop, not tuple.index: Triton refuses bound methods of globals in what a kernel references.
    for i, name in enumerate(WAIT_CALLS):
        if name == call:
            return i
    return 0


@triton.constexpr_function
def _flag_index(what):
    for i, name in enumerate(WAIT_FLAGS):
        if name == what:
            return i
    return 0


@triton.jit
def _int64(value):
    # Scalars reach the report as int64 whether they are constants or int32/int64 tensors.
    return tl.full([], 0, tl.int64) + value


@triton.jit
def _fence_sys():
    # The report's fields must reach the host before its state word: one system-scope fence.
    if not INTERPRETER:
        tl.inline_asm_elementwise("fence.acq_rel.sys; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False,
                                  pack=1)


@triton.jit
def _report(trailer, drain, state, call_id, flag_id, rank, peer, index, seen, target, waited, behind):
    # The first program of this process to stop writes the report; the rest only stop.
    if tl.atomic_cas(drain + 1, 0, 1, sem="relaxed", scope="gpu") == 0:
        record = tl.cast(tl.load(trailer + WATCHDOG_RECORD_C), tl.pointer_type(tl.int64))
        tl.store(record + _CALL, _int64(call_id))
        tl.store(record + _FLAG, _int64(flag_id))
        tl.store(record + _RANK, _int64(rank))
        tl.store(record + _PEER, _int64(peer))
        tl.store(record + _INDEX, _int64(index))
        tl.store(record + _SEEN, _int64(seen))
        tl.store(record + _TARGET, _int64(target))
        tl.store(record + _WAITED, _int64(waited))
        tl.store(record + _BEHIND, _int64(behind))
        _fence_sys()
        tl.store(record + _STATE, _int64(state))


@triton.jit
def _ranks_behind(heap_bases, num_ranks, local, calls):
    # Bit r set: rank r's call counter for the tile is below this rank's (0 without a counter).
    behind = tl.full([], 0, tl.int64)
    if calls != 0:
        counter = tl.cast(calls, tl.pointer_type(tl.int32))
        mine = tl.load(counter, volatile=True)
        for r in range(num_ranks):
            theirs = tl.load(counter + (tl.load(heap_bases + r) - local) // 4, volatile=True)
            behind = behind | tl.where(theirs < mine, tl.full([], 1, tl.int64) << r, 0)
    return behind


@triton.jit(noinline=True)  # one copy per kernel, not one per wait site: waits are many, timeouts rare
def watchdog_check(heap_bases, start, call_id, flag_id, peer, index, seen, target, calls):
    """Look at the clock and the drain word during a wait; returns ``(start, stop)``.

    ``call_id`` and ``flag_id`` index WAIT_CALLS and WAIT_FLAGS (runtime values, so that one copy
    of this function serves every wait of a kernel). ``calls``: the address (int64) of this rank's
    call counter for the tile, which every rank keeps at the same heap offset, or 0: a stopping
    wait compares it with the peers' and reports the ranks that are behind (who never came).
    ``start`` is the wait's start time (0 before the first look, which sets it). ``stop`` (int32)
    is 1 when the wait must end: it has lasted longer than the context's timeout, or a wait of
    this rank already ran out of time. Stopping writes the report and, on a timeout, raises every
    rank's drain word. Granularity: per program (scalars). Memory semantics: the drain words are
    relaxed system-scope exchanges (nothing is published with them); the report's words are
    fenced at system scope before its state word. Scope: the waits of one job.
    """
    me = tl.load(heap_bases + _CUR_RANK_AT)
    num_ranks = tl.load(heap_bases + _NUM_RANKS_AT)
    trailer = heap_bases + num_ranks
    limit = tl.load(trailer + WATCHDOG_NS_C)
    now = device_clock_ns()
    start = tl.where(start == 0, now, start)
    local = tl.load(heap_bases + me)
    drain = tl.cast(local + tl.load(trailer + HEAP_SIZE_C) + DRAIN_OFFSET_C, tl.pointer_type(tl.int32))
    reason = tl.load(drain, volatile=True)
    timed_out = now - start > limit
    # The clock and the drain word are read by every thread, at slightly different times: vote,
    # so that every thread takes the same branch (the report has CTA barriers in it).
    stop = cta_any((limit > 0) & ((reason != 0) | timed_out)) != 0
    if stop:
        state = tl.where(reason != 0, 1 + reason, _TIMED_OUT)
        _report(trailer, drain, state, call_id, flag_id, me, peer, index, seen, target, now - start,
                _ranks_behind(heap_bases, num_ranks, local, calls))
        if reason == 0:
            # This wait timed out: every rank (this one too) stops waiting and reports what it
            # waited for. A max, so that a "rank failed" already there stays.
            for r in range(num_ranks):
                tl.atomic_max(drain + (tl.load(heap_bases + r) - local) // 4, _DRAIN_TIMED_OUT, sem="relaxed",
                              scope="sys")
    return start, stop.to(tl.int32)


@triton.jit
def watchdog_look(heap_bases, start, call: tl.constexpr, what: tl.constexpr, peer, index, seen, target, calls=None):
    """One look at the clock and the drain word for a wait (see :func:`watchdog_check`); returns
    ``(start, stop)``. Start a wait with ``start = 0`` (int64). ``calls``: this rank's int32 call
    counter for the tile, or None. Per program: every thread of the program must make the same
    call (it has CTA barriers in it), so a wait whose threads poll on their own must first agree
    that it goes on, e.g. with :func:`iris.device._vote.cta_all`."""
    # Every argument as an int64 tensor: one specialisation of the function for all waits.
    if calls is None:
        address = tl.full([], 0, tl.int64)
    else:
        address = calls.to(tl.int64)
    return watchdog_check(heap_bases, start, _int64(_call_index(call)), _int64(_flag_index(what)), _int64(peer),
                          _int64(index), _int64(seen), _int64(target), address)


@triton.jit
def watchdog_tick(heap_bases, polls, start, call: tl.constexpr, what: tl.constexpr, peer, index, seen, target,
                  calls=None):
    """Count one poll of a wait; every ``CHECK_POLLS`` polls, :func:`watchdog_look`. Returns
    ``(polls, start, stop)``. Start a wait with ``polls = 0``, ``start = 0`` (int64) and loop while
    the flag is short of its target and ``stop == 0``. For waits whose loop condition is the same
    in every thread (a scalar atomic's result, or the interpreter's single thread); see
    :func:`watchdog_look`."""
    polls += 1
    stop = 0
    if polls % CHECK_POLLS == 0:
        start, stop = watchdog_look(heap_bases, start, call, what, peer, index, seen, target, calls)
    return polls, start, stop
