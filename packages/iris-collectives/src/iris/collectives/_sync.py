"""Flags between ranks: signal, wait, per-call epochs, and the device-side barrier.

Every cross-rank flag here is an int32 counter that only grows. A writer publishes after a CTA
barrier (so the stores of every thread of the program are ordered before it) with a release add
at system scope, or, for several peers at once on the GPU, one system-scope fence followed by
relaxed adds. A reader polls until the counter reaches its target: on the GPU with acquire loads
at system scope in every thread, under the interpreter with volatile loads and then one acquire
read; then it passes a CTA barrier (so every thread's later loads see what the writers
published). Because counters never go back, nothing has to be reset between calls: the n-th
call waits for ``n * expected`` and a peer that is already one call ahead only adds to the count,
which the proofs in each collective's docstring account for.

Wait loops are bounded. In production by the watchdog (``IRIS_TIMEOUT_S``, default 60 s): the
wait reports itself and stops, and the runtime ends the job with the report (see
``iris.device._watchdog``). In debug mode (``IRIS_DEBUG=1``) also by ``IRIS_DEBUG_TIMEOUT_S``
(default 60): the kernel fails with a message naming the call, the rank, the peer, the flag and
the values. Under Triton's interpreter a waiting program gives up its CPU between polls.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from iris.device import DEBUG, INTERPRETER, TraceEvent, atomic_add, device_clock_ns
from iris.device._debug import host_scalar
from iris.device._group import on_group
from iris.device._vote import cta_all
from iris.device._watchdog import (
    CHECK_POLLS,
    WATCHDOG,
    watchdog_arguments,
    watchdog_look,
    watchdog_thread_stop,
    watchdog_thread_tick,
)

from ._errors import IrisWaitTimeoutError
from ._signature import CHECK_POLLS as SIGNATURE_POLLS
from ._signature import SIGNATURE_WORDS, check_signatures, publish_signature

#: int32 flag words per tile in a lock record: ``ARRIVE`` (0) counts arrivals or "data ready"
#: signals from peers, ``DONE`` (1) counts "done" signals, ``MUTEX`` (2) is the spinlock, ``EPOCH``
#: (3) counts this rank's own calls (written by this rank only; the spinlock lets peers read it).
#: The ring's records in the signal pad have the same size and their own meanings (see ``_ring``).
FLAG_WORDS = 4
#: int32 words per tile in a lock array (tile ``t``'s record at ``locks + LOCK_WORDS*t``): the flag
#: words, and in debug mode (``IRIS_DEBUG=1``) the call's signature after them (see ``_signature``),
#: rounded up to 16 words. Read at import, like ``IRIS_DEBUG``; size lock arrays with
#: :func:`lock_words`, which follows it.
LOCK_WORDS = 16 if DEBUG.value else FLAG_WORDS
assert FLAG_WORDS + SIGNATURE_WORDS <= 16, "the debug-mode signature must fit a lock record"
ARRIVE: tl.constexpr = tl.constexpr(0)
DONE: tl.constexpr = tl.constexpr(1)
MUTEX: tl.constexpr = tl.constexpr(2)
EPOCH: tl.constexpr = tl.constexpr(3)
LOCK_WORDS_C: tl.constexpr = tl.constexpr(LOCK_WORDS)

#: int32 words per slot of a :func:`device_barrier` flag array (arrivals, private generation).
BARRIER_WORDS = 2
BARRIER_WORDS_C: tl.constexpr = tl.constexpr(BARRIER_WORDS)


def _timeout_seconds() -> float:
    return float(os.environ.get("IRIS_DEBUG_TIMEOUT_S", "60"))


#: Debug-mode time limit of one wait, in ns (``IRIS_DEBUG_TIMEOUT_S``, read at import).
WAIT_TIMEOUT_NS: tl.constexpr = tl.constexpr(int(_timeout_seconds() * 1e9))


#: Interpreter only: polls of a wait that yield the CPU (``sleep(0)``) before the wait backs off
#: with real sleeps, 10 us doubling up to ``IDLE_SLEEP_MAX_S``.
IDLE_YIELDS = 16
IDLE_SLEEP_MAX_S = 1e-3


@triton.constexpr_function
def _yield_cpu(idle):
    # Interpreter only: the programs that this one waits for run in other processes, which may
    # share this CPU (CI runs 4 ranks on 2 cores). A spinning Python loop would slow them down, and
    # sleep(0) alone still spins: a wait that has polled IDLE_YIELDS times in vain sleeps, longer
    # the longer it waits (at most IDLE_SLEEP_MAX_S, a small delay next to an interpreted poll).
    import time

    idle = host_scalar(idle)
    time.sleep(0 if idle < IDLE_YIELDS else min(IDLE_SLEEP_MAX_S, 1e-5 * 2 ** min(idle - IDLE_YIELDS, 10)))
    return 0


@triton.constexpr_function
def _call_text(call):
    return "iris.collectives.wait_at_least" if call is None else call


@triton.constexpr_function
def _what_text(what):
    return "flag" if what is None else what


@triton.constexpr_function
def _peer_text(peer):
    peer = host_scalar(peer)
    return "every peer" if peer < 0 else f"peer {peer}"


@triton.constexpr_function
def _raise_timeout(call, what, rank, peer, index, seen, target, seconds):
    raise IrisWaitTimeoutError(
        f"iris debug: {_call_text(call)}: rank {host_scalar(rank)} waited {seconds:.0f} s for "
        f"{_peer_text(peer)} on flag '{_what_text(what)}' of tile/slot {host_scalar(index)}: it holds "
        f"{host_scalar(seen)}, expected >= {host_scalar(target)}. A peer did not make the matching call "
        f"(every rank must call the collective for the same tiles, in the same order, with the same grid), "
        f"or the lock array was reset, shared with another collective or not zeroed at allocation; raise "
        f"IRIS_DEBUG_TIMEOUT_S if the peers are just slow")


@triton.constexpr_function
def _timeout_prefix(call, what):
    return (f"iris debug: {_call_text(call)}: wait timed out on flag '{_what_text(what)}': rank, peer (-1 = every "
            f"peer), tile, seen, expected = ")


@triton.constexpr_function
def _timeout_message(call, what):
    return (f"iris debug: {_call_text(call)}: a wait on flag '{_what_text(what)}' timed out; the line printed "
            f"above names rank, peer, tile and values. Every rank must make the same collective calls with "
            f"zeroed, unshared lock arrays")


@triton.jit
def pause(idle=0):
    """Between two polls of a wait loop: under the interpreter, give the CPU to the processes
    being waited for (``idle``: polls of this wait so far; a wait that has polled long sleeps a
    little, see IDLE_YIELDS); on the GPU, nothing."""
    if INTERPRETER:
        _yield_cpu(idle)


@triton.jit
def check_wait_time(start, call: tl.constexpr, what: tl.constexpr, rank, peer, index, seen, target):
    """Debug mode only (call it under ``if DEBUG``): fail when the wait that began at ``start``
    (``device_clock_ns()``) has lasted longer than ``IRIS_DEBUG_TIMEOUT_S``. The failure names
    the call, the rank, the peer (-1: several), the flag (``what``, tile ``index``) and the values."""
    if device_clock_ns() - start > WAIT_TIMEOUT_NS:
        if INTERPRETER:
            _raise_timeout(call, what, rank, peer, index, seen, target, WAIT_TIMEOUT_NS / 1e9)
        else:
            tl.device_print(_timeout_prefix(call, what), rank, peer, index, seen, target)
            tl.device_assert(seen >= target, _timeout_message(call, what))


@triton.jit
def wait_at_least(flag, target, call: tl.constexpr = None, what: tl.constexpr = None, rank=-1, peer=-1, index=-1,
                  heap_bases=None, calls=None, record=None):
    """Wait until the int32 counter at ``flag`` is ``>= target``.

    ``flag`` is usually this rank's memory (peers add to it with :func:`signal`), but any address
    of this process works (a peer's word, translated). Granularity: per program (a scalar flag).
    Memory semantics: acquire at system scope, then a CTA barrier, so every thread of the program
    sees the writes the signalling peers released. ``call``, ``what`` (names of the caller and of
    the flag), ``rank``, ``peer`` (-1: several) and ``index`` (tile or slot) only go into the
    timeout messages.

    With ``heap_bases`` (the context's), the wait is bounded by the watchdog's timeout
    (``IRIS_TIMEOUT_S``, see ``iris.device._watchdog``): past it the wait reports itself and returns
    with the flag short of its target, and the runtime ends the job. Every wait of the collectives
    passes it. Without it (or with ``IRIS_TIMEOUT_S=0``) the wait is unbounded outside debug mode.
    ``calls``: this rank's int32 count of calls on the tile, which every rank keeps at the same
    heap offset (the lock record's ``EPOCH`` word): the report then names the ranks that are
    behind, i.e. never made the call.

    ``record`` (debug mode only; the collectives pass it): this rank's lock record of the tile,
    whose call signature is published (``_signature.publish_signature``). The wait then compares
    the signatures of ``peer`` (-1: every other rank) with this rank's, when it starts to spin,
    every few polls and when it ends, and fails at once on a mismatch (see ``_signature``). Pass it
    only where no peer can finish the call before this rank signals again.

    Example::

        iris.collectives.signal(flags + slot, ctx.rank, peer, ctx.heap_bases)  # on the producer
        iris.collectives.wait_at_least(flags + slot, 1, heap_bases=ctx.heap_bases)  # on the consumer
    """
    seen = poll(flag)
    if DEBUG:
        start = device_clock_ns()
        spins = 0
    polls = 0
    since = tl.full([], 0, tl.int64)
    stop = 0
    if _votes(heap_bases):
        # GPU, debug mode, watchdog on: the threads poll on their own, then agree by a vote (a CTA
        # barrier) whether the wait goes on, and only then run the debug checks, which have CTA
        # barriers in them and name the call and the flag at compile time.
        reached = cta_all(seen >= target)
        while (reached == 0) & (stop == 0):
            polls = 0
            while (seen < target) & (polls < CHECK_POLLS):  # no barrier in here
                seen = poll(flag)
                polls += 1
            reached = cta_all(seen >= target)
            if reached == 0:
                if record is not None:
                    check_signatures(record, rank, peer, heap_bases, call, index)
                check_wait_time(start, call, what, rank, peer, index, seen, target)
                since, stop = watchdog_look(heap_bases, since, call, what, peer, index, seen, target, calls)
        # the last vote was the CTA barrier after every thread's acquire
    else:
        # Each thread polls on its own and leaves when it has seen the target (or its watchdog
        # check stopped it); the CTA barrier after the loop brings the threads together. The
        # watchdog's check is a small barrier-free branch of each thread's loop, taken every
        # CHECK_POLLS polls, and its report a short barrier-free branch after the loop, taken by
        # the threads it stopped: a wait whose flag is set runs the code it runs with the
        # watchdog compiled out. Keep both small: code at a wait costs time where it never runs
        # (a longer report here made a two-shot all-reduce of 256 MiB 13 % slower on an H200).
        idle = 0
        while (seen < target) & (stop == 0):
            pause(idle)
            idle += 1
            if DEBUG:
                if record is not None:
                    # a peer that arrived with another call will never send what this wait counts
                    if spins % SIGNATURE_POLLS == 0:
                        check_signatures(record, rank, peer, heap_bases, call, index)
                    spins += 1
                check_wait_time(start, call, what, rank, peer, index, seen, target)
            if WATCHDOG:
                if heap_bases is not None:
                    polls, since, stop = watchdog_thread_tick(heap_bases, polls, since)
            seen = poll(flag)
        if WATCHDOG:
            if heap_bases is not None:
                if stop != 0:  # this thread's check stopped the wait: report it (no barrier in there)
                    args = watchdog_arguments(call, what, peer, index, seen, target, calls)
                    watchdog_thread_stop(heap_bases, since, args[0], args[1], args[2], args[3], args[4], args[5],
                                         args[6])
        if INTERPRETER:
            # The interpreter polls with volatile loads: confirm with one acquire read.
            seen = tl.atomic_add(flag, 0, sem="acquire", scope="sys")
        tl.debug_barrier()
    if DEBUG:
        if record is not None:
            # the peers waited for have arrived (unless the call differs): their signatures are there
            check_signatures(record, rank, peer, heap_bases, call, index)


@triton.constexpr_function
def _votes(heap_bases):
    # Whether the wait decides by a CTA vote when it goes on: in debug mode on the GPU (an
    # interpreted program is one thread) with the watchdog compiled in and bounding this wait.
    # Each thread polls with its own acquire load, so for a moment some threads may have seen the
    # flag and others not; without checks in the loop that only makes some leave a poll earlier,
    # and the barrier after it brings them together. The debug checks have CTA barriers in them:
    # threads that had left would pair with the wrong barrier and the program could deadlock
    # (seen on an H200 with the first watchdog, whose check had barriers: fused ops with long
    # kernels, ranks sharing the GPU). The production check has none (watchdog_thread_tick).
    return tl.constexpr(bool(WATCHDOG.value) and bool(DEBUG.value) and heap_bases is not None and not INTERPRETER)


@triton.jit
def poll(flag):
    """One poll of a wait: the int32 at ``flag``. On the GPU an acquire load at system scope in every
    thread, so the poll that sees the target is also the acquire: one L2 round trip when the peers
    are already there (a relaxed poll followed by an acquire read, which Triton makes thread 0's
    load plus a shared-memory broadcast between two CTA barriers, costs a second round trip and the
    barriers on every wait). Under the interpreter, which has no inline PTX, a volatile load."""
    if INTERPRETER:
        return tl.load(flag, volatile=True)
    else:
        return load_acquire_sys(flag)


@triton.jit
def load_acquire_sys(flag):
    """Load the int32 word at ``flag`` with acquire semantics at system scope
    (``ld.acquire.sys.global.b32``; GPU only, the interpreter has no inline PTX).

    Granularity: every thread of the program loads (a scalar ``flag`` gives each thread the same
    word). Memory semantics: acquire, system scope: the calling thread's later reads see every
    write that a peer released before the value it returns (peers on other GPUs included)."""
    return tl.inline_asm_elementwise("ld.acquire.sys.global.b32 $0, [$1];", "=r,l", [flag], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def peer_flag(flag, rank, peer, heap_bases):
    # ``flag`` (an int32 address of this rank's heap) as the address of the same word on ``peer``.
    # The translation of iris.device.translate, written out: flags are signalled in the hot path of
    # every collective, and under the interpreter each nested jit call costs milliseconds. Debug
    # builds go through iris.device instead (see signal), which checks ranks and addresses.
    return flag + (tl.load(heap_bases + peer) - tl.load(heap_bases + rank)) // 4


@triton.jit
def signal(flag, from_rank, to_rank, heap_bases, CHECKED: tl.constexpr = True, amount=1):
    """Add ``amount`` (1 unless given: several units at once) to the int32 counter at ``flag`` on
    ``to_rank`` (``flag`` is this rank's address).

    Granularity: per program. Memory semantics: a CTA barrier, then release at system scope:
    every store (and load) the program's threads made before it is visible to (done before) a
    peer that acquires the counter. ``CHECKED=False`` skips the debug-mode address check (for
    flags in the signal pad, which lies outside the heap).
    """
    tl.debug_barrier()
    if DEBUG and CHECKED:
        atomic_add(flag, amount, from_rank, to_rank, heap_bases, sem="release", scope="sys")
    else:
        tl.atomic_add(peer_flag(flag, from_rank, to_rank, heap_bases), amount, sem="release", scope="sys")


@triton.jit
def release_fence_sys():
    """A system-scope release fence in one thread of the program (``fence.acq_rel.sys`` in thread
    0; GPU only). With a CTA barrier before it and relaxed system-scope writes after it, it is the
    PTX memory model's release pattern for every one of those writes: one fence serves all of
    them, where a release atomic per write would fence once per write."""
    tl.inline_asm_elementwise(
        "{ .reg .pred first; .reg .u32 tid; mov.u32 tid, %tid.x; setp.eq.u32 first, tid, 0; "
        "@first fence.acq_rel.sys; mov.u32 $0, 0; }",
        "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def signal_all(flag, rank: tl.constexpr, world_size: tl.constexpr, heap_bases, SELF: tl.constexpr = False):
    """:func:`signal` every other rank (and this one too with ``SELF``), starting with the next
    rank so that ranks do not all hit the same peer first. Per program. Memory semantics: a CTA
    barrier, then release at system scope for every rank's counter. On the GPU that is one
    system-scope fence followed by relaxed system-scope adds (a fence costs microseconds; a
    release atomic per peer would pay it ``world_size - 1`` times); under the interpreter and in
    debug mode, one release add per rank."""
    tl.debug_barrier()
    first: tl.constexpr = 0 if SELF else 1
    local_base = tl.load(heap_bases + rank)
    if DEBUG:
        for i in tl.static_range(first, world_size):
            atomic_add(flag, 1, rank, (rank + i) % world_size, heap_bases, sem="release", scope="sys")
    else:
        if not INTERPRETER:
            release_fence_sys()  # the interpreter has no inline PTX: release adds there
        sem: tl.constexpr = "release" if INTERPRETER else "relaxed"
        for i in tl.static_range(first, world_size):
            peer = (rank + i) % world_size
            # peer_flag, inlined: one jit call for all peers
            tl.atomic_add(flag + (tl.load(heap_bases + peer) - local_base) // 4, 1, sem=sem, scope="sys")


@triton.jit
def advance(counter, amount):
    """Add ``amount`` to this rank's private counter at ``counter`` and return the old value,
    the same in every thread of the program.

    Granularity: per program (a scalar). Memory semantics: relaxed, GPU scope: only this rank's
    program for the tile touches the word, and kernel boundaries order successive calls.
    Why an atomic and not a load and a store: Triton runs a scalar load in every thread but a
    scalar store in one, so a warp that loads after another warp's store would see the new value
    and wait for a target one call ahead, forever. The atomic runs in one thread and its result
    reaches every thread through shared memory.
    """
    return tl.atomic_add(counter, amount, sem="relaxed", scope="gpu")


@triton.jit
def enter_tile(tile, dst_view, locks, call: tl.constexpr = None):
    """Start this rank's call of a lock-using collective on ``tile``: its row-major tile id over
    ``dst_view``, its ``LOCK_WORDS`` record in ``locks`` and this rank's call count for the tile
    (1 for the first call; see :func:`next_epoch`). In debug mode it also publishes the call's
    signature (``call``, the shapes, tiles and grid) in the record, for peers to compare with
    (see ``_signature``): call it before the call's first signal. Per program."""
    t = tile.tile_id(dst_view.num_tiles_n(tile.BLOCK_N))
    record = locks + t * LOCK_WORDS_C
    # next_epoch(record + EPOCH), written out: under the interpreter every nested jit call costs
    # about 0.2 ms, and this runs once per tile and call
    epoch = advance(record + EPOCH, 1) + 1
    if DEBUG:
        publish_signature(record, epoch, call, dst_view.M, dst_view.N, tile.BLOCK_M, tile.BLOCK_N)
    return t, record, epoch


@triton.jit
def enter_range(tiles, dst_view, locks, call: tl.constexpr = None):
    """:func:`enter_tile` for a :class:`~iris.collectives.TileRange`: the range's lock record is
    its first tile's (``tiles.first``), so one record serves every tile of it. Returns the record's
    index, the record and this rank's call count on it. Per program."""
    slot = tiles.first
    record = locks + slot * LOCK_WORDS_C
    epoch = advance(record + EPOCH, 1) + 1
    if DEBUG:
        publish_signature(record, epoch, call, dst_view.M, dst_view.N, tiles.BLOCK_M, tiles.BLOCK_N)
    return slot, record, epoch


@triton.jit
def signal_and_wait_all(ctx, record, FLAG: tl.constexpr, epoch, call: tl.constexpr, what: tl.constexpr, index,
                        check_record=None):
    """Signal flag word ``FLAG`` of the lock record ``record`` on every other rank, then wait until
    every other rank has signalled this rank's for call ``epoch`` (the count reaches ``epoch *
    (world_size - 1)``). Per program; release and acquire at system scope (:func:`signal_all`,
    :func:`wait_at_least`). ``check_record`` (debug mode): compare the peers' signatures there
    while waiting, where no peer can finish the call without this rank."""
    signal_all(record + FLAG, ctx.rank, ctx.world_size, ctx.heap_bases)
    wait_at_least(record + FLAG, epoch * (ctx.world_size - 1), call, what, ctx.rank, -1, index, ctx.heap_bases,
                  record + EPOCH, check_record)


@triton.jit
def next_epoch(counter):
    """Add 1 to this rank's private call counter at ``counter`` and return the new value (1 for
    the first call), the same in every thread of the program (see :func:`advance`)."""
    return advance(counter, 1) + 1


@triton.jit
def device_barrier(ctx, flags, epoch=None, group=None):
    """Device-side barrier among the programs of every rank that use the same barrier slot.

    ``flags`` points at ``BARRIER_WORDS`` (2) int32 words of a symmetric array, zeroed once at
    allocation and never reset: word 0 counts arrivals, word 1 counts this rank's own calls. Each
    rank's program signals every rank, then waits until all ``world_size`` ranks have arrived for
    this generation. The generation is ``epoch`` when given (1 for the first use of the slot,
    then 2, ...), else this rank's call count at word 1.

    Granularity: per program, for one slot. Use one slot per program that synchronises (e.g.
    ``flags + BARRIER_WORDS * tile_id``); exactly one program per rank may use a slot per
    generation, and every rank must use it the same number of times. Under Triton's interpreter the
    programs of a launch run one after another, so a barrier among the programs of one rank would
    deadlock; a barrier per tile (the same tile's program on every rank) works on every backend.

    Memory semantics: release at system scope before arriving and acquire at system scope after
    the wait: everything any rank's program wrote before the barrier is visible to every rank's
    program after it. Back to back calls need no reset: arrivals only grow, and a rank cannot be
    more than one generation ahead of a rank it waits for.

    Example::

        iris.collectives.all_gather(ctx, tile, dst_view, 0)
        iris.collectives.device_barrier(ctx, flags + iris.collectives.BARRIER_WORDS * tile_id)
        # the gathered rows of this tile are now complete on this rank

    ``group``: an :class:`iris.device.DeviceGroup` (None: every rank of ``ctx``): a barrier among
    the group's members only (``group.size`` arrivals per generation). Its ``flags`` serve this
    group alone: allocate them per group (e.g. ``group.zeros`` on the host).
    """
    if group is not None:
        ctx = on_group(ctx, group, "iris.collectives.device_barrier")
    if ctx.tracing.enabled:
        handle = ctx.tracing.record_event_start(TraceEvent().barrier, -1, flags, -1, -1)
    if epoch is None:
        generation = next_epoch(flags + 1)
    else:
        generation = epoch
    signal_all(flags, ctx.rank, ctx.world_size, ctx.heap_bases, SELF=True)
    if epoch is None:
        wait_at_least(flags, generation * ctx.world_size, "iris.collectives.device_barrier", "arrivals", ctx.rank,
                      -1, 0, ctx.heap_bases, flags + 1)
    else:
        wait_at_least(flags, generation * ctx.world_size, "iris.collectives.device_barrier", "arrivals", ctx.rank,
                      -1, 0, ctx.heap_bases)
    if ctx.tracing.enabled:
        ctx.tracing.record_event_end(handle)
