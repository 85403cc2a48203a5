"""Tile all-reduce by atomics, by spinlock, one-shot and two-shot.

Each function runs once per program, on the tile the program holds, and sums that tile over
every rank. They differ in who reads whom, what they need from the caller and what is complete
when they return; each docstring says so. The lock-using ones (all but ``all_reduce_atomic``)
keep a private call counter per tile in the lock array and count flags up monotonically, so they
can be called back to back, with new data each time, without a host barrier and without
resetting the locks (see :mod:`iris.collectives._sync`).

Under Triton's interpreter the programs of a launch run one after another; every wait below is
for the *same tile's* program on other ranks, which publishes before it waits, so that works as
long as every rank launches the same grid with the same tile-to-program mapping (on a GPU this
also keeps a grid that is not all resident from deadlocking).
"""

# No "from __future__ import annotations": Triton resolves jit globals by name at compile time.
import triton
import triton.language as tl

from iris.device import DEBUG, TraceEvent, atomic_add, atomic_cas, atomic_xchg, device_clock_ns, load, round_to, store
from iris.device._group import on_group
from iris.device._watchdog import WATCHDOG, watchdog_tick

from ._dtypes import accumulator_type, atomic_destination_type, check_lock_array
from ._signature import publish_signature
from ._sync import (
    ARRIVE,
    DONE,
    EPOCH,
    LOCK_WORDS_C,
    MUTEX,
    advance,
    check_wait_time,
    enter_range,
    enter_tile,
    pause,
    peer_flag,
    signal,
    signal_all,
    signal_and_wait_all,
    wait_at_least,
)
from ._views import Tile, TileView, has_tiles, is_range

#: Reductions of the internal ``OP`` argument (a compile-time int; ``None`` means SUM). The public
#: tile collectives sum; the host collectives (``iris.collectives.ccl``) pass the others.
SUM: tl.constexpr = tl.constexpr(0)
AVG: tl.constexpr = tl.constexpr(1)
MAX: tl.constexpr = tl.constexpr(2)
MIN: tl.constexpr = tl.constexpr(3)
PROD: tl.constexpr = tl.constexpr(4)


@triton.constexpr_function
def _is_sum(OP):
    # avg is a sum divided once at the end (see _finish)
    return OP is None or OP == 0 or OP == 1


@triton.jit
def _combine(acc, x, OP: tl.constexpr):
    # One step of a non-sum reduction, per element (accumulator type).
    if OP == MAX:
        result = tl.maximum(acc, x)
    elif OP == MIN:
        result = tl.minimum(acc, x)
    else:
        result = acc * x
    return result


@triton.jit
def _finish(acc, world_size: tl.constexpr):
    # avg: one correctly rounded division of the sum. tl's fp32 "/" is approximate on the GPU, so
    # fp32 takes div_rn (which has no fp64 form); fp64 "/" is IEEE division already.
    if acc.dtype == tl.float64:
        result = acc / world_size
    else:
        result = tl.math.div_rn(acc, tl.full(acc.shape, world_size, acc.dtype))
    return result


@triton.jit
def _fold(acc, x, p: tl.constexpr, OP: tl.constexpr):
    # Fold rank p's values into acc for a reduction other than sum: they start from rank 0's.
    if p == 0:
        acc = x
    else:
        acc = _combine(acc, x, OP)
    return acc


@triton.constexpr_function
def rank_is_static(rank):
    """Whether a context's ``rank`` is a compile-time value (the spec's ``DeviceContext``), not a
    run-time one (``RuntimeRankContext``, which ``iris.collectives.ccl``'s kernels use)."""
    return not isinstance(rank, tl.tensor)


@triton.jit
def _sum_in_rank_order(ctx, tile, src_ptrs, mask, acc_ty: tl.constexpr, OP: tl.constexpr = None, src_bases=None):
    # tile.data for this rank, src_view on every other: the same order on every rank, so every
    # rank computes bit-identical sums. The loads are unrolled and independent. OP (see SUM):
    # another reduction, in the same order. Sums add to zeros with no helper call (the default
    # path is unchanged, -0.0 included, and the interpreter pays no extra jit calls).
    # src_bases: where the peers' src lies (a registration's bases, iris.runtime.Registration);
    # None: on the heap.
    bases = ctx.heap_bases if src_bases is None else src_bases  # inline: no jit call per tile
    acc = tl.full([tile.BLOCK_M, tile.BLOCK_N], 0, acc_ty)
    for p in tl.static_range(ctx.world_size):
        if rank_is_static(ctx.rank):
            if p == ctx.rank:
                x = tile.data.to(acc_ty)
            else:
                x = load(src_ptrs, ctx.rank, p, bases, mask=mask, other=0).to(acc_ty)
        else:
            # A run-time rank: no branch (a load inside one completes before the branch joins, so
            # the peers' loads would follow one another): every rank's load is issued, this rank's
            # masked off with its own values as what a masked-off lane holds. The same terms in
            # the same order: the same sums.
            # (tl.where, not "mask & (rank != p)": Triton's interpreter refuses some scalar & block masks)
            theirs = tl.where(ctx.rank != p, mask, False)
            x = load(src_ptrs, ctx.rank, p, bases, mask=theirs, other=tile.data).to(acc_ty)
        if _is_sum(OP):
            acc = acc + x
        else:
            acc = _fold(acc, x, p, OP)
    if OP == AVG:
        acc = _finish(acc, ctx.world_size)
    return acc


@triton.jit
def all_reduce_atomic(ctx, tile, dst_view, group=None):
    """Add ``tile.data`` into ``dst_view`` at the tile's position on every rank, with atomics.

    Granularity: per program; one atomic add per element of the tile per rank (masked to the
    tensor). Memory semantics: relaxed atomics at system scope; they are complete (visible to a
    peer that synchronises with this rank afterwards) once the kernel has finished, or after a
    :func:`device_barrier` that follows them.

    Preconditions: ``dst_view`` (M x N, on the symmetric heap) is zero, or holds what the sum
    should be added to, on every rank before any rank's first add; zeroing it again for another
    call must be ordered after every rank's adds of the previous call (a barrier). ``dst_view``
    must be fp32, fp64, int32, int64, uint32 or uint64; fp16/bf16 ``tile.data`` is added into an
    fp32 ``dst_view`` (a 16-bit destination raises :class:`~iris.device.IrisUnsupportedError`:
    it would round at every addition, and the CPU backend has no 16-bit atomics).

    When it returns on a rank: this rank's contribution is in every rank's ``dst_view``. The sum
    on a rank is complete only when every rank has returned (host barrier, or a
    :func:`device_barrier` per tile). The order of additions differs between ranks, so float
    results may differ in the last bits.

    ``group``: an :class:`iris.device.DeviceGroup` (None: every rank of ``ctx``): the call runs
    among the group's members, with the group's ranks and size in place of ``ctx``'s.
    """
    if group is not None:
        ctx = on_group(ctx, group, "iris.collectives.all_reduce_atomic")
    call: tl.constexpr = "iris.collectives.all_reduce_atomic"
    dst_ty: tl.constexpr = atomic_destination_type(call, tile.data.dtype, dst_view.ptr.dtype.element_ty)
    dst_ptrs, mask = dst_view.frame(tile)
    if ctx.tracing.enabled:
        handle = ctx.tracing.record_event_start(TraceEvent().collective, -1, dst_ptrs, tile.pid_m, tile.pid_n, mask)
    contribution = round_to(tile.data, dst_ty)
    for i in tl.static_range(ctx.world_size):
        peer = (ctx.rank + i) % ctx.world_size
        atomic_add(dst_ptrs, contribution, ctx.rank, peer, ctx.heap_bases, mask=mask, sem="relaxed", scope="sys")
    if ctx.tracing.enabled:
        ctx.tracing.record_event_end(handle)


@triton.jit
def _try_lock(mutex, rank: tl.constexpr, peer: tl.constexpr, heap_bases):
    # One compare-and-swap 0 -> 1 on peer's mutex (acquire, system scope); returns the old value.
    if DEBUG:
        return atomic_cas(mutex, 0, 1, rank, peer, heap_bases, sem="acquire", scope="sys")
    else:
        return tl.atomic_cas(peer_flag(mutex, rank, peer, heap_bases), 0, 1, sem="acquire", scope="sys")


@triton.jit
def _lock(mutex, rank: tl.constexpr, peer: tl.constexpr, heap_bases, index, calls):
    # Spin until the compare-and-swap succeeds; bounded like every wait (see wait_at_least).
    old = _try_lock(mutex, rank, peer, heap_bases)
    if DEBUG:
        start = device_clock_ns()
    polls = 0
    since = tl.full([], 0, tl.int64)
    stop = 0
    while (old != 0) & (stop == 0):
        pause(polls)
        if DEBUG:
            check_wait_time(start, "iris.collectives.all_reduce_spinlock", "mutex", rank, peer, index, -old, 0)
        if WATCHDOG:
            polls, since, stop = watchdog_tick(heap_bases, polls, since, "iris.collectives.all_reduce_spinlock",
                                               "mutex", peer, index, -old, 0, calls)
        old = _try_lock(mutex, rank, peer, heap_bases)
    tl.debug_barrier()


@triton.jit
def _unlock(mutex, rank: tl.constexpr, peer: tl.constexpr, heap_bases):
    # Release peer's mutex (release, system scope; the caller's CTA barrier came before).
    if DEBUG:
        atomic_xchg(mutex, 0, rank, peer, heap_bases, sem="release", scope="sys")
    else:
        tl.atomic_xchg(peer_flag(mutex, rank, peer, heap_bases), 0, sem="release", scope="sys")


@triton.jit
def all_reduce_spinlock(ctx, tile, dst_view, locks, group=None):
    """Add ``tile.data`` into ``dst_view`` on every rank, one rank at a time per tile, under a lock.

    Publish this rank's call count for the tile (release). Then for each rank (starting with the
    next one, so ranks spread over the locks): wait until that rank has entered this call (its
    call count, read with acquire), take its lock for this tile (compare-and-swap 0 -> 1,
    acquire), read its ``dst_view`` tile, add ``tile.data``, write it back, count the arrival and
    release the lock (release, system scope). Then wait until every rank's contribution has
    arrived in this rank's tile. Waiting for a rank to enter the call keeps a rank that is a call
    ahead from adding to a tile whose previous sum its owner is still counting.

    Granularity: per program. ``locks``: int32, ``LOCK_WORDS`` per tile of ``dst_view`` (see
    :func:`lock_words`), on the symmetric heap, zeroed once at allocation, used only by this
    collective for tensors of this tiling (never reset: the counts only grow).

    Preconditions: as for :func:`all_reduce_atomic`, ``dst_view`` is zero (or the base to add to)
    on every rank before any rank adds, and fp16/bf16 data needs an fp32 ``dst_view`` (it is
    accumulated there and rounded once by the caller; a 16-bit destination raises).

    When it returns on a rank: this rank's ``dst_view`` tile holds the full sum (every rank's
    contribution arrived and is visible), and this rank's contribution is in every other rank's
    tile. Back to back calls work when each call adds into a destination zeroed beforehand (e.g. a
    fresh slice); the lock words need no reset. Order of additions differs between ranks.

    ``group``: an :class:`iris.device.DeviceGroup` (None: every rank of ``ctx``): the call runs
    among the group's members, with the group's ranks and size in place of ``ctx``'s. Its
    ``locks`` serve this group alone: allocate them per group (e.g. ``group.zeros`` on the host).
    """
    if group is not None:
        ctx = on_group(ctx, group, "iris.collectives.all_reduce_spinlock")
    call: tl.constexpr = "iris.collectives.all_reduce_spinlock"
    check_lock_array(call, locks.dtype)
    dst_ty: tl.constexpr = atomic_destination_type(call, tile.data.dtype, dst_view.ptr.dtype.element_ty)
    dst_ptrs, mask = dst_view.frame(tile)
    if ctx.tracing.enabled:
        handle = ctx.tracing.record_event_start(TraceEvent().collective, -1, dst_ptrs, tile.pid_m, tile.pid_n, mask)
    t = tile.tile_id(dst_view.num_tiles_n(tile.BLOCK_N))
    record = locks + t * LOCK_WORDS_C
    # The call count is read by peers: count it with a release at system scope (next_epoch's
    # relaxed add would do for this rank alone, as in the other collectives), after a CTA barrier,
    # so that it releases every thread's earlier accesses to this tile, not only thread 0's (as
    # signal does). One thread adds and every thread gets the same result (see _sync.advance).
    if DEBUG:
        # the signature goes out before the count that lets peers in (its release covers it)
        publish_signature(record, advance(record + EPOCH, 0) + 1, call, dst_view.M, dst_view.N, tile.BLOCK_M,
                          tile.BLOCK_N)
    tl.debug_barrier()
    epoch = tl.atomic_add(record + EPOCH, 1, sem="release", scope="sys") + 1
    contribution = round_to(tile.data, dst_ty)
    for i in tl.static_range(ctx.world_size):
        peer = (ctx.rank + i) % ctx.world_size
        if i > 0:
            # peer cannot leave this call before this rank's arrival below: its signature holds
            wait_at_least(peer_flag(record + EPOCH, ctx.rank, peer, ctx.heap_bases), epoch, call, "entered", ctx.rank,
                          peer, t, ctx.heap_bases, record + EPOCH, record)
        _lock(record + MUTEX, ctx.rank, peer, ctx.heap_bases, t, record + EPOCH)
        current = load(dst_ptrs, ctx.rank, peer, ctx.heap_bases, mask=mask, other=0)
        store(dst_ptrs, current + contribution, ctx.rank, peer, ctx.heap_bases, mask=mask)
        signal(record + ARRIVE, ctx.rank, peer, ctx.heap_bases)
        _unlock(record + MUTEX, ctx.rank, peer, ctx.heap_bases)
    wait_at_least(record + ARRIVE, epoch * ctx.world_size, call, "arrivals", ctx.rank, -1, t,
                  ctx.heap_bases, record + EPOCH)
    if ctx.tracing.enabled:
        ctx.tracing.record_event_end(handle)


@triton.jit
def all_reduce_one_shot(ctx, tile, src_view, dst_view, locks, group=None):
    """Every rank reads every rank's tile and sums locally (one shot, no intermediate step).

    Per tile: signal "my ``src_view`` tile is ready" to every peer, wait for every peer's, load
    every peer's ``src_view`` tile and sum them with ``tile.data`` in rank order (the same on every
    rank: bit-identical results everywhere), store the sum into this rank's ``dst_view``, then
    tell every peer "done reading yours" and wait until every peer is done reading this rank's.

    ``tile`` may also be a :class:`TileRange`: the program's tiles, with one "ready" and one
    "done" for all of them (this rank's values are then read from its ``src_view``, which must
    hold every tile of the range before the call). A persistent kernel whose data is in place
    before the call should pass its range: the synchronisation is paid once per program instead
    of once per tile.

    Granularity: per program. Memory semantics: flags released and acquired at system scope.
    ``locks``: int32, ``LOCK_WORDS`` per tile (see :func:`lock_words`), symmetric, zeroed once
    at allocation, used only by this collective with this tiling (and one form: tiles or ranges).

    Preconditions: this rank's ``src_view`` (symmetric heap, M x N) holds this rank's data at the
    tile (stored before the call, by this program or earlier kernels) and ``tile.data`` equals
    it. fp16/bf16 are summed in fp32 and rounded once into ``dst_view`` (which may be any type the
    sum converts to; usually the data's).

    When it returns on a rank: this rank's ``dst_view`` tile holds the sum, and no peer reads this
    rank's ``src_view`` tile any more, so the caller may overwrite it (e.g. with the next call's
    data) right away: back to back calls need neither a barrier nor a lock reset.

    ``group``: an :class:`iris.device.DeviceGroup` (None: every rank of ``ctx``): the call runs
    among the group's members, with the group's ranks and size in place of ``ctx``'s. Its
    ``locks`` serve this group alone: allocate them per group (e.g. ``group.zeros`` on the host).
    """
    if group is not None:
        ctx = on_group(ctx, group, "iris.collectives.all_reduce_one_shot")
    all_reduce_one_shot_op(ctx, tile, src_view, dst_view, locks, None)


@triton.jit
def all_reduce_one_shot_op(ctx, tile, src_view, dst_view, locks, OP: tl.constexpr, mine_view=None, src_bases=None):
    # all_reduce_one_shot's body with the reduction OP (see SUM); for iris.collectives.ccl.
    # mine_view (ranges only): where this rank's own values are read (a local copy of src_view's
    # data, e.g. the caller's tensor that src_view stages for the peers); default src_view.
    # src_bases (ranges only): see _sum_in_rank_order.
    call: tl.constexpr = "iris.collectives.all_reduce_one_shot"
    check_lock_array(call, locks.dtype)
    if is_range(tile):
        _one_shot_range(ctx, tile, src_view, dst_view, locks, OP, mine_view, call, src_bases)
    else:
        acc_ty: tl.constexpr = accumulator_type(call, tile.data.dtype)
        dst_ptrs, mask = dst_view.frame(tile)
        if ctx.tracing.enabled:
            handle = ctx.tracing.record_event_start(TraceEvent().collective, -1, dst_ptrs, tile.pid_m, tile.pid_n,
                                                    mask)
        if ctx.world_size == 1:
            tl.store(dst_ptrs, round_to(tile.data.to(acc_ty), dst_view.ptr.dtype.element_ty), mask=mask)
        else:
            t, record, epoch = enter_tile(tile, dst_view, locks, call)
            signal_all(record + ARRIVE, ctx.rank, ctx.world_size, ctx.heap_bases)
            # no peer can leave this call before this rank's "done": their signatures hold
            wait_at_least(record + ARRIVE, epoch * (ctx.world_size - 1), call, "ready", ctx.rank, -1, t,
                          ctx.heap_bases, record + EPOCH, record)
            acc = _sum_in_rank_order(ctx, tile, src_view.frame(tile)[0], mask, acc_ty, OP)
            tl.store(dst_ptrs, round_to(acc, dst_view.ptr.dtype.element_ty), mask=mask)
            signal_all(record + DONE, ctx.rank, ctx.world_size, ctx.heap_bases)
            wait_at_least(record + DONE, epoch * (ctx.world_size - 1), call, "done", ctx.rank, -1, t,
                          ctx.heap_bases, record + EPOCH)
        if ctx.tracing.enabled:
            ctx.tracing.record_event_end(handle)


@triton.jit
def _one_shot_range(ctx, tiles, src_view, dst_view, locks, OP: tl.constexpr, mine_view, call: tl.constexpr,
                    src_bases):
    # The one-shot protocol once for every tile of the range: ready, every tile summed, done. An
    # empty range (more programs than tiles) has no lock record: nothing to do, nobody to meet.
    if has_tiles(tiles):
        if ctx.world_size > 1:
            slot, record, epoch = enter_range(tiles, dst_view, locks, call)
            # no peer can leave this call before this rank's "done": their signatures hold
            signal_and_wait_all(ctx, record, ARRIVE, epoch, call, "ready", slot, record)
        reduce_range_in_rank_order(ctx, tiles, src_view, dst_view, OP, mine_view, call, src_bases)
        if ctx.world_size > 1:
            signal_and_wait_all(ctx, record, DONE, epoch, call, "done", slot)


@triton.jit
def reduce_range_in_rank_order(ctx, tiles, src_view, dst_view, OP: tl.constexpr, mine_view, call: tl.constexpr,
                               src_bases=None):
    """The reduction step of the one-shot range protocol, with no flags: for every tile of the
    range, ``dst_view = OP(src_view of every rank)`` in rank order, this rank's values read from
    ``mine_view`` (None: ``src_view``). The caller has acquired every peer's ``src_view`` tiles
    ("ready") and keeps them from being overwritten until this returns. ``src_bases``: the table
    that translates ``src_view`` to the peers (a registration's ``bases``; None: the heap's).
    Per program; weak loads from the peers, weak stores to this rank's ``dst_view``; ``call``
    names the caller in compile-time errors."""
    acc_ty: tl.constexpr = accumulator_type(call, src_view.ptr.dtype.element_ty)
    dst_ty: tl.constexpr = dst_view.ptr.dtype.element_ty
    for t in range(tiles.first, tiles.stop, tiles.step):
        view = tiles.tile(t)
        src_ptrs, mask = src_view.frame(view)
        dst_ptrs = dst_view.frame(view)[0]
        if ctx.tracing.enabled:
            handle = ctx.tracing.record_event_start(TraceEvent().collective, -1, dst_ptrs, view.pid_m, view.pid_n,
                                                    mask)
        if mine_view is None:
            mine = tl.load(src_ptrs, mask=mask, other=0)
        else:
            mine = mine_view.load(view)
        acc = _sum_in_rank_order(ctx, Tile(view.pid_m, view.pid_n, tiles.BLOCK_M, tiles.BLOCK_N, mine), src_ptrs,
                                 mask, acc_ty, OP, src_bases)
        tl.store(dst_ptrs, round_to(acc, dst_ty), mask=mask)
        if ctx.tracing.enabled:
            ctx.tracing.record_event_end(handle)


@triton.jit
def _reduce_share_to_all(ctx, src_ptrs, dst_ptrs, mine, acc_ty: tl.constexpr, dst_ty: tl.constexpr,
                         OP: tl.constexpr = None, local_src=None, local_dst=None, src_bases=None, dst_bases=None):
    # Sum the share over every rank's src_view in rank order (bit-identical on every rank), then
    # store it into every rank's dst_view, starting with the next rank so that the ranks'
    # stores spread over the destinations instead of all hitting rank 0 first. OP: see SUM.
    # local_src / local_dst: pointers at the same elements of this rank's own copy of the input
    # and of the output (e.g. the caller's tensors that src_view and dst_view stand in for on the
    # heap): this rank's term is read there and its result stored there. src_bases / dst_bases:
    # the tables that translate src_ptrs / dst_ptrs to the peers (None: the heap's).
    sources = ctx.heap_bases if src_bases is None else src_bases
    targets = ctx.heap_bases if dst_bases is None else dst_bases
    acc = tl.zeros(src_ptrs.shape, acc_ty)
    if local_src is not None:
        if not rank_is_static(ctx.rank):
            own = tl.load(local_src, mask=mine, other=0)  # this rank's term, read once
    for p in tl.static_range(ctx.world_size):
        if local_src is None:
            x = load(src_ptrs, ctx.rank, p, sources, mask=mine, other=0).to(acc_ty)
        elif rank_is_static(ctx.rank):
            if p == ctx.rank:
                x = tl.load(local_src, mask=mine, other=0).to(acc_ty)
            else:
                x = load(src_ptrs, ctx.rank, p, sources, mask=mine, other=0).to(acc_ty)
        else:  # a run-time rank: this rank's load masked off, its term the masked-off value (see _sum_in_rank_order)
            x = load(src_ptrs, ctx.rank, p, sources, mask=tl.where(ctx.rank != p, mine, False), other=own).to(acc_ty)
        if _is_sum(OP):
            acc = acc + x
        else:
            acc = _fold(acc, x, p, OP)
    if OP == AVG:
        acc = _finish(acc, ctx.world_size)
    result = round_to(acc, dst_ty)
    for i in tl.static_range(ctx.world_size):
        target = (ctx.rank + i + 1) % ctx.world_size
        # this rank comes last (i == W - 1): a compile-time test where the rank is a run-time value
        # (ccl's RuntimeRankContext)
        if i == ctx.world_size - 1 and local_dst is not None:
            tl.store(local_dst, result, mask=mine)
        else:
            store(dst_ptrs, result, ctx.rank, target, targets, mask=mine)


@triton.jit
def own_share_rows(tile_id, BLOCK_M: tl.constexpr, rank: tl.constexpr, world_size: tl.constexpr):
    """``[BLOCK_M]`` booleans: the rows of tile ``tile_id`` whose sum this rank computes in
    :func:`all_reduce_two_shot` (its share: ``(rank + tile_id) % world_size``, in blocks of
    ``ceil(BLOCK_M / world_size)`` rows). Per program, no memory access."""
    rows_per_share: tl.constexpr = (BLOCK_M + world_size - 1) // world_size
    share = (rank + tile_id) % world_size
    return (tl.arange(0, BLOCK_M) // rows_per_share) == share


@triton.jit
def all_reduce_two_shot(ctx, tile, src_view, dst_view, locks, group=None):
    """Every rank reduces its share of the tile's rows, then writes it to every rank (two shots).

    Per tile: signal every peer "my ``src_view`` tile is ready" and wait for every peer's; then
    reduce this rank's share of the rows (``two_shot_rows`` on the host says which): read them
    from every rank's ``src_view`` (this one's too), sum in rank order, store the sum into every
    rank's ``dst_view``; then tell every peer "done" (your share of my tile is written, and I no longer
    read your ``src_view``) and wait for every peer's "done". Each element is read once from
    every rank and written once to every rank, and every rank's program works on every tile: the
    least memory traffic of the all-reduces, spread over all programs. Pick ``BLOCK_M`` a multiple
    of the world size: a share is then a tile of ``BLOCK_M / W`` rows that all threads work on
    (otherwise the full tile is masked down to the share, and most threads idle).

    ``tile`` may also be a :class:`TileRange`: the program's tiles, with one "ready" and one
    "done" for all of them, which is what a persistent kernel whose data is in place before the
    call should pass (the synchronisation is paid once per program instead of once per tile).

    Granularity: per program. ``tile``: a :class:`Tile`, a :class:`TileView` or a
    :class:`TileRange`. Memory
    semantics: flags released and acquired at system scope. ``locks``: int32, ``LOCK_WORDS`` per
    tile (see :func:`lock_words`), symmetric, zeroed once at allocation, used only by this
    collective with this tiling (and one form: tiles or ranges).

    Preconditions: this rank's ``src_view`` (symmetric heap) holds its data at the tile, stored
    before the call (by this program or earlier kernels). ``tile.data`` is not read: every share
    is read from ``src_view``, so a kernel whose data is already there need not load it. A rank
    must be done reading its ``dst_view`` tile when it calls again (peers write into it once it
    has entered the next call). fp16/bf16 are summed in fp32 and rounded once.

    When it returns on a rank: this rank's ``dst_view`` tile holds the sum (bit-identical on every
    rank: each element is summed once, in rank order), and no peer reads this rank's ``src_view``
    tile any more (it may be overwritten at once): back to back calls need neither a barrier nor
    a lock reset.

    ``group``: an :class:`iris.device.DeviceGroup` (None: every rank of ``ctx``): the call runs
    among the group's members, with the group's ranks and size in place of ``ctx``'s. Its
    ``locks`` serve this group alone: allocate them per group (e.g. ``group.zeros`` on the host).
    """
    if group is not None:
        ctx = on_group(ctx, group, "iris.collectives.all_reduce_two_shot")
    all_reduce_two_shot_op(ctx, tile, src_view, dst_view, locks, None)


@triton.jit
def all_reduce_two_shot_op(ctx, tile, src_view, dst_view, locks, OP: tl.constexpr, mine_src=None, mine_dst=None,
                           src_bases=None, dst_bases=None):
    # all_reduce_two_shot's body with the reduction OP (see SUM); for iris.collectives.ccl.
    # mine_src / mine_dst (ranges only): this rank's own copy of the input and the output, where
    # its own share is read and its result stored (see _reduce_share_to_all); default the views.
    # src_bases / dst_bases (ranges only): the tables translating src_view and dst_view (None:
    # the heap's; a registration's bases for registered tensors).
    call: tl.constexpr = "iris.collectives.all_reduce_two_shot"
    check_lock_array(call, locks.dtype)
    acc_ty: tl.constexpr = accumulator_type(call, src_view.ptr.dtype.element_ty)
    dst_ty: tl.constexpr = dst_view.ptr.dtype.element_ty
    if is_range(tile):
        if has_tiles(tile):  # an empty range (more programs than tiles): nothing to do, nobody to meet
            if ctx.world_size > 1:
                slot, record, epoch = enter_range(tile, dst_view, locks, call)
                # no peer can leave this call before this rank's "done": their signatures hold
                signal_and_wait_all(ctx, record, ARRIVE, epoch, call, "ready", slot, record)
            for t in range(tile.first, tile.stop, tile.step):
                _two_shot_tile(ctx, tile.tile(t), t, src_view, dst_view, acc_ty, dst_ty, OP, mine_src, mine_dst,
                               src_bases, dst_bases)
            if ctx.world_size > 1:
                signal_and_wait_all(ctx, record, DONE, epoch, call, "done", slot)
    elif ctx.world_size == 1:
        _two_shot_tile(ctx, tile, 0, src_view, dst_view, acc_ty, dst_ty, OP, None, None)
    else:
        t, record, epoch = enter_tile(tile, dst_view, locks, call)
        signal_all(record + ARRIVE, ctx.rank, ctx.world_size, ctx.heap_bases)
        # no peer can leave this call before this rank's "done": their signatures hold
        wait_at_least(record + ARRIVE, epoch * (ctx.world_size - 1), call, "ready", ctx.rank, -1, t,
                      ctx.heap_bases, record + EPOCH, record)
        _two_shot_tile(ctx, tile, t, src_view, dst_view, acc_ty, dst_ty, OP, None, None)
        signal_all(record + DONE, ctx.rank, ctx.world_size, ctx.heap_bases)
        wait_at_least(record + DONE, epoch * (ctx.world_size - 1), call, "done", ctx.rank, -1, t,
                      ctx.heap_bases, record + EPOCH)


@triton.jit
def _two_shot_tile(ctx, tile, t, src_view, dst_view, acc_ty: tl.constexpr, dst_ty: tl.constexpr, OP: tl.constexpr,
                   mine_src, mine_dst, src_bases=None, dst_bases=None):
    # This rank's share of tile t (row-major id t), reduced over every rank and written to every
    # rank (with one rank, the whole tile: its own share).
    dst_ptrs, mask = dst_view.frame(tile)
    if ctx.tracing.enabled:
        handle = ctx.tracing.record_event_start(TraceEvent().collective, -1, dst_ptrs, tile.pid_m, tile.pid_n, mask)
    if ctx.world_size == 1:
        local = src_view.frame(tile)[0] if mine_src is None else mine_src.frame(tile)[0]
        data = round_to(tl.load(local, mask=mask, other=0).to(acc_ty), dst_ty)
        if mine_dst is None:
            tl.store(dst_ptrs, data, mask=mask)
        else:
            tl.store(mine_dst.frame(tile)[0], data, mask=mask)
    elif tile.BLOCK_M % ctx.world_size == 0:
        # Equal shares: a share is itself a tile of BLOCK_M / W rows, so every thread of the
        # program has elements of it (masking the full tile instead would leave (W-1)/W of
        # the threads idle and cut the bytes in flight per program by W).
        share = (ctx.rank + t) % ctx.world_size
        part = TileView(tile.pid_m * ctx.world_size + share, tile.pid_n, tile.BLOCK_M // ctx.world_size,
                        tile.BLOCK_N)
        part_dst, part_mask = dst_view.frame(part)
        local_src = None if mine_src is None else mine_src.frame(part)[0]
        local_dst = None if mine_dst is None else mine_dst.frame(part)[0]
        _reduce_share_to_all(ctx, src_view.frame(part)[0], part_dst, part_mask, acc_ty, dst_ty, OP, local_src,
                             local_dst, src_bases, dst_bases)
    else:
        # Ragged shares (W does not divide BLOCK_M): the full tile, masked to the share's
        # rows. The mask is constant along each row, so accesses keep their vector width.
        mine = mask & own_share_rows(t, tile.BLOCK_M, ctx.rank, ctx.world_size)[:, None]
        local_src = None if mine_src is None else mine_src.frame(tile)[0]
        local_dst = None if mine_dst is None else mine_dst.frame(tile)[0]
        _reduce_share_to_all(ctx, src_view.frame(tile)[0], dst_ptrs, mine, acc_ty, dst_ty, OP, local_src, local_dst,
                             src_bases, dst_bases)
    if ctx.tracing.enabled:
        ctx.tracing.record_event_end(handle)
