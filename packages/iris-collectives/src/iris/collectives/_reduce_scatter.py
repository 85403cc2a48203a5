"""Tile reduce-scatter: each rank reduces a contiguous block of tiles and keeps the result."""

# No "from __future__ import annotations": Triton resolves jit globals by name at compile time.
import triton
import triton.language as tl

from iris.device import DEBUG, TraceEvent, round_to
from iris.device._group import on_group

from ._all_reduce import _sum_in_rank_order
from ._dtypes import accumulator_type, check_lock_array
from ._signature import check_signatures
from ._sync import ARRIVE, DONE, EPOCH, enter_tile, signal, signal_all, wait_at_least


@triton.jit
def reduce_scatter_owner(tile_id, num_tiles, world_size: tl.constexpr):
    """The rank that owns tile ``tile_id`` in :func:`reduce_scatter`: ``tile_id * world_size //
    num_tiles``. Rank ``r`` owns the contiguous tiles ``[ceil(r*T/W), ceil((r+1)*T/W))``."""
    return (tile_id * world_size) // num_tiles


@triton.jit
def reduce_scatter(ctx, tile, src_view, dst_view, locks, group=None):
    """Sum the tile over every rank on the rank that owns it; only the owner stores the result.

    Tiles (row-major over ``dst_view``) are split into ``world_size`` contiguous blocks, rank
    ``r`` owning tiles ``[ceil(r*T/W), ceil((r+1)*T/W))`` (:func:`reduce_scatter_owner`). A rank
    that does not own the tile signals the owner that its ``src_view`` tile is ready, then waits
    until the owner is done reading it. The owner waits for every peer's signal, sums every
    rank's tile in rank order (``tile.data`` for its own), stores the sum into its own
    ``dst_view`` at the same position, and tells each peer it is done.

    Granularity: per program. Memory semantics: flags released and acquired at system scope.
    ``locks``: int32, ``LOCK_WORDS`` per tile (see :func:`lock_words`), symmetric, zeroed once at
    allocation, used only by this collective with this tiling.

    Preconditions: this rank's ``src_view`` (symmetric heap) holds its data at the tile, and
    ``tile.data`` equals it (it is only used on the owner). fp16/bf16 are summed in fp32 and
    rounded once.

    When it returns on a rank: if it owns the tile, its ``dst_view`` tile holds the sum; other
    tiles of ``dst_view`` are not touched. Either way no peer reads this rank's ``src_view`` tile
    any more, so it may be overwritten at once: back to back calls need neither a barrier nor a
    lock reset.

    ``group``: an :class:`iris.device.DeviceGroup` (None: every rank of ``ctx``): the call runs
    among the group's members, with the group's ranks and size in place of ``ctx``'s. Its
    ``locks`` serve this group alone: allocate them per group (e.g. ``group.zeros`` on the host).
    """
    if group is not None:
        ctx = on_group(ctx, group, "iris.collectives.reduce_scatter")
    call: tl.constexpr = "iris.collectives.reduce_scatter"
    check_lock_array(call, locks.dtype)
    acc_ty: tl.constexpr = accumulator_type(call, tile.data.dtype)
    dst_ptrs, mask = dst_view.frame(tile)
    if ctx.tracing.enabled:
        handle = ctx.tracing.record_event_start(TraceEvent().collective, -1, dst_ptrs, tile.pid_m, tile.pid_n, mask)
    if ctx.world_size == 1:
        tl.store(dst_ptrs, round_to(tile.data.to(acc_ty), dst_view.ptr.dtype.element_ty), mask=mask)
    else:
        t, record, epoch = enter_tile(tile, dst_view, locks, call)
        owner = reduce_scatter_owner(t, dst_view.num_tiles(tile.BLOCK_M, tile.BLOCK_N), ctx.world_size)
        if owner == ctx.rank:
            # no peer can leave this call before the owner's "done": their signatures hold
            wait_at_least(record + ARRIVE, epoch * (ctx.world_size - 1), call, "ready", ctx.rank, -1, t,
                          ctx.heap_bases, record + EPOCH, record)
            acc = _sum_in_rank_order(ctx, tile, src_view.frame(tile)[0], mask, acc_ty)
            tl.store(dst_ptrs, round_to(acc, dst_view.ptr.dtype.element_ty), mask=mask)
            signal_all(record + DONE, ctx.rank, ctx.world_size, ctx.heap_bases)
        else:
            if DEBUG:
                # before the "ready" that lets the owner finish: the owner's signature holds (the
                # owner compares every peer's in its wait)
                check_signatures(record, ctx.rank, owner, ctx.heap_bases, call, t)
            signal(record + ARRIVE, ctx.rank, owner, ctx.heap_bases)
            wait_at_least(record + DONE, epoch, call, "done", ctx.rank, owner, t, ctx.heap_bases, record + EPOCH)
    if ctx.tracing.enabled:
        ctx.tracing.record_event_end(handle)
