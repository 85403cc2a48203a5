"""Tile data movement without reduction: ``all_gather``, ``gather`` and ``all_to_all``.

These take no flags (the spec gives them none): they push (``all_gather``, ``all_to_all``) or
pull (``gather``) one tile and return. Ordering against the peers is the caller's: a
:func:`device_barrier` per tile, or a host barrier between kernels.
"""

# No "from __future__ import annotations": Triton resolves jit globals by name at compile time.
import triton
import triton.language as tl

from iris.device import TraceEvent, load, round_to, store
from iris.device._group import on_group

from ._views import INDEX_TYPE


@triton.jit
def all_gather(ctx, tile, dst_view, dim: tl.constexpr, group=None):
    """Write this rank's tile into every rank's gathered tensor, at this rank's slot.

    ``dst_view`` is the full gathered tensor (symmetric heap). Along ``dim`` = 0 it is
    ``world_size`` blocks of ``M // world_size`` rows, one per rank in rank order; along ``dim``
    = 1, blocks of ``N // world_size`` columns. ``tile`` is positioned in this rank's local
    tensor (``M // world_size`` x ``N`` for dim 0): its rows go to rows
    ``rank * (M // world_size) + rows`` of every rank's ``dst_view`` (or columns, for dim 1).
    The gathered extent along ``dim`` must be a multiple of ``world_size``.

    Granularity: per program; one weak store of the tile per rank. Memory semantics: none of its
    own (no flags).

    Preconditions: no rank still reads the part of its ``dst_view`` this call overwrites (order
    it with a barrier after the previous use).

    When it returns on a rank: this rank's tile has been written to every rank (visible to a peer
    after a barrier). The gathered tensor on a rank is complete once every rank's programs have
    done so: follow with :func:`device_barrier` on a per-tile slot (then this tile's rows from
    every rank are there), or a host barrier.

    ``group``: an :class:`iris.device.DeviceGroup` (None: every rank of ``ctx``): the call runs
    among the group's members, with the group's ranks and size in place of ``ctx``'s.
    """
    if group is not None:
        ctx = on_group(ctx, group, "iris.collectives.all_gather")
    tl.static_assert((dim == 0) | (dim == 1), "iris.collectives.all_gather: dim must be 0 (rows) or 1 (columns)")
    rows = tile.pid_m * tile.BLOCK_M + tl.arange(0, tile.BLOCK_M).to(INDEX_TYPE)
    cols = tile.pid_n * tile.BLOCK_N + tl.arange(0, tile.BLOCK_N).to(INDEX_TYPE)
    if dim == 0:
        local = dst_view.M // ctx.world_size
        mask = (rows[:, None] < local) & (cols[None, :] < dst_view.N)
        rows = rows + ctx.rank * local
    else:
        local = dst_view.N // ctx.world_size
        mask = (rows[:, None] < dst_view.M) & (cols[None, :] < local)
        cols = cols + ctx.rank * local
    ptrs = dst_view.ptr + rows[:, None] * dst_view.stride_m + cols[None, :] * dst_view.stride_n
    if ctx.tracing.enabled:
        handle = ctx.tracing.record_event_start(TraceEvent().collective, -1, ptrs, tile.pid_m, tile.pid_n, mask)
    data = round_to(tile.data, dst_view.ptr.dtype.element_ty)
    for i in tl.static_range(ctx.world_size):
        peer = (ctx.rank + i) % ctx.world_size
        store(ptrs, data, ctx.rank, peer, ctx.heap_bases, mask=mask)
    if ctx.tracing.enabled:
        ctx.tracing.record_event_end(handle)


@triton.jit
def gather(ctx, tile, src_view, source_rank, hint: tl.constexpr = None, group=None):
    """Load ``tile`` of ``source_rank``'s ``src_view`` and return it, ``[BLOCK_M, BLOCK_N]``.

    ``src_view`` is on the symmetric heap (this rank's address of the allocation); elements
    outside the tensor come back as 0. ``hint`` (an int, or a tuple per dimension such as
    ``(1, 16)``) is passed to ``tl.multiple_of``/``tl.max_contiguous`` on the translated pointers.

    Granularity: per program; one weak load of the tile. Memory semantics: none of its own: the
    data must have been published before (a flag the caller acquired, a barrier).

    When it returns: the values are in registers; nothing else changed.

    ``group``: an :class:`iris.device.DeviceGroup` (None: every rank of ``ctx``): the call runs
    among the group's members, with the group's ranks and size in place of ``ctx``'s
    (``source_rank`` is a group rank).
    """
    if group is not None:
        ctx = on_group(ctx, group, "iris.collectives.gather")
    ptrs, mask = src_view.frame(tile)
    if ctx.tracing.enabled:
        handle = ctx.tracing.record_event_start(TraceEvent().collective, source_rank, ptrs, tile.pid_m, tile.pid_n,
                                                mask)
    data = load(ptrs, ctx.rank, source_rank, ctx.heap_bases, mask=mask, other=0, hint=hint)
    if ctx.tracing.enabled:
        ctx.tracing.record_event_end(handle)
    return data


@triton.jit
def all_to_all(ctx, tile, src_view, dst_view, N_per_rank: tl.constexpr, group=None):
    """Exchange column blocks: rank ``r``'s columns ``[p*N_per_rank, (p+1)*N_per_rank)`` go to
    rank ``p``'s columns ``[r*N_per_rank, (r+1)*N_per_rank)``, for every pair of ranks.

    ``src_view`` (this rank's memory) and ``dst_view`` (symmetric heap) are ``M`` x
    ``world_size * N_per_rank``. ``tile`` is positioned in one rank's block, ``M`` x
    ``N_per_rank``: the program moves that tile of each of the ``world_size`` blocks, pushing
    block ``p`` to rank ``p``.

    Granularity: per program; one local load and one weak store of the tile per rank. Memory
    semantics: none of its own (no flags).

    Preconditions: no rank still reads the part of its ``dst_view`` this call overwrites.

    When it returns on a rank: this rank's blocks have been written to every rank. A rank's
    ``dst_view`` is complete once every rank's programs have done so (a :func:`device_barrier`
    per tile, or a host barrier).

    ``group``: an :class:`iris.device.DeviceGroup` (None: every rank of ``ctx``): the call runs
    among the group's members, with the group's ranks and size in place of ``ctx``'s.
    """
    if group is not None:
        ctx = on_group(ctx, group, "iris.collectives.all_to_all")
    rows = tile.pid_m * tile.BLOCK_M + tl.arange(0, tile.BLOCK_M).to(INDEX_TYPE)
    cols = tile.pid_n * tile.BLOCK_N + tl.arange(0, tile.BLOCK_N).to(INDEX_TYPE)
    mask = (rows[:, None] < src_view.M) & (cols[None, :] < N_per_rank)
    src_rows = src_view.ptr + rows[:, None] * src_view.stride_m
    dst_base = dst_view.ptr + rows[:, None] * dst_view.stride_m + (ctx.rank * N_per_rank + cols[None, :]) * \
        dst_view.stride_n
    if ctx.tracing.enabled:
        handle = ctx.tracing.record_event_start(TraceEvent().collective, -1, dst_base, tile.pid_m, tile.pid_n, mask)
    for i in tl.static_range(ctx.world_size):
        peer = (ctx.rank + i) % ctx.world_size
        block = tl.load(src_rows + (peer * N_per_rank + cols[None, :]) * src_view.stride_n, mask=mask)
        store(dst_base, round_to(block, dst_view.ptr.dtype.element_ty), ctx.rank, peer, ctx.heap_bases, mask=mask)
    if ctx.tracing.enabled:
        ctx.tracing.record_event_end(handle)
