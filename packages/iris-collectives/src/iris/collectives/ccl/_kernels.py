"""The device side of the host collectives: one persistent kernel per collective family.

Every kernel flattens its tensors into :class:`FlatView` tiles of ``BLOCK_M x BLOCK_N``
elements and loops over them (``tile = program_id, program_id + num_programs, ...``: the same
mapping on every rank, which the waits need, since every wait is for the same tile's program on
other ranks and Triton's interpreter runs a launch's programs one after another). Staging of a
tensor that is not on the symmetric heap happens inside the kernel, before the tile's first
signal: the program loads its local tile and stores it into the heap staging buffer that peers
read, so there is no separate copy kernel.

The flags are the tile collectives' (``iris.collectives._sync``: per-tile lock records whose
``EPOCH`` counts calls, counters that only grow), so back-to-back calls need no barrier and a
CUDA graph replays them correctly.
"""

# No "from __future__ import annotations": Triton resolves jit globals by name at compile time.
import triton
import triton.language as tl

from iris.device import load

from .._all_reduce import all_reduce_one_shot_op, all_reduce_two_shot_op
from .._context import DeviceContext
from .._sync import ARRIVE, DONE, EPOCH, device_barrier, enter_tile, signal_all, wait_at_least
from .._views import INDEX_TYPE, Tile, TileView
from ._flat import FlatView

#: ``MODE`` of :func:`pull_kernel`.
GATHER: tl.constexpr = tl.constexpr(0)
ALL_TO_ALL: tl.constexpr = tl.constexpr(1)
BROADCAST: tl.constexpr = tl.constexpr(2)

#: Names the pull kernel's waits report (see iris.device._watchdog.WAIT_CALLS).
PULL_CALLS = ("iris.collectives.ccl.all_gather", "iris.collectives.ccl.all_to_all", "iris.collectives.ccl.broadcast")


@triton.constexpr_function
def _pull_call(MODE):
    return PULL_CALLS[MODE]


@triton.jit
def all_reduce_kernel(context, inp, src, dst, out, locks, n, rank: tl.constexpr, world_size: tl.constexpr,
                      OP: tl.constexpr, TWO_SHOT: tl.constexpr, STAGE_IN: tl.constexpr, COPY_OUT: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``out = reduce(inp over ranks)``, ``n`` elements, through ``all_reduce_one_shot`` or
    ``all_reduce_two_shot``. ``src``: what peers read (``inp`` itself when it is on the heap and
    not ``out``, else a heap staging buffer this kernel fills: ``STAGE_IN``). Two-shot writes into
    every rank's ``dst`` (``out`` on the heap, or a heap buffer copied to ``out`` once the tile is
    complete: ``COPY_OUT``)."""
    ctx = DeviceContext.initialize(context, rank, world_size)
    rows = (n + BLOCK_N - 1) // BLOCK_N
    s = FlatView(src, n, rows, BLOCK_N)
    o = FlatView(out, n, rows, BLOCK_N)
    d = FlatView(dst, n, rows, BLOCK_N)
    # The kernel's own accesses index the flat tensors directly (no FlatView method calls: under
    # the interpreter every nested jit call costs milliseconds, and this runs per tile and call).
    within = (tl.arange(0, BLOCK_M).to(INDEX_TYPE)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :])
    for t in range(tl.program_id(0), (rows + BLOCK_M - 1) // BLOCK_M, tl.num_programs(0)):
        view = TileView(t, 0, BLOCK_M, BLOCK_N)
        offsets = t * (BLOCK_M * BLOCK_N) + within
        mask = offsets < n
        if TWO_SHOT:
            if STAGE_IN:
                tl.store(src + offsets, tl.load(inp + offsets, mask=mask), mask=mask)
            all_reduce_two_shot_op(ctx, view, s, d, locks, OP)
            if COPY_OUT:
                # two-shot returned: every share of this tile has arrived in dst
                tl.store(out + offsets, tl.load(dst + offsets, mask=mask), mask=mask)
        else:
            data = tl.load(inp + offsets, mask=mask)
            if STAGE_IN:
                # published by the collective's "ready" signal (a CTA barrier, then a release)
                tl.store(src + offsets, data, mask=mask)
            all_reduce_one_shot_op(ctx, Tile(t, 0, BLOCK_M, BLOCK_N, data), s, o, locks, OP)


@triton.jit
def reduce_scatter_kernel(context, inp, src, out, locks, m, src_stride, rank: tl.constexpr,
                          world_size: tl.constexpr, OP: tl.constexpr, STAGE_IN: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr):
    """``out = reduce over ranks of chunk rank of inp`` (chunks of ``m`` elements). It is
    ``all_reduce_one_shot`` on a view of chunk ``rank``: every rank reads chunk ``rank`` of every
    peer's ``src`` (chunk ``j`` at ``src + j * src_stride``: ``inp`` itself on the heap, else the
    staging buffer, whose chunks start at tile boundaries) and reduces it into ``out``."""
    ctx = DeviceContext.initialize(context, rank, world_size)
    rows = (m + BLOCK_N - 1) // BLOCK_N
    o = FlatView(out, m, rows, BLOCK_N)
    peers_read = FlatView(src + rank * src_stride, m, rows, BLOCK_N)
    within = (tl.arange(0, BLOCK_M).to(INDEX_TYPE)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :])
    for t in range(tl.program_id(0), (rows + BLOCK_M - 1) // BLOCK_M, tl.num_programs(0)):
        offsets = t * (BLOCK_M * BLOCK_N) + within
        mask = offsets < m
        if STAGE_IN:
            for j in tl.static_range(world_size):
                tl.store(src + j * src_stride + offsets, tl.load(inp + j * m + offsets, mask=mask), mask=mask)
        data = tl.load(inp + rank * m + offsets, mask=mask)
        all_reduce_one_shot_op(ctx, Tile(t, 0, BLOCK_M, BLOCK_N, data), peers_read, o, locks, OP)


@triton.jit
def _pull_tile(ctx, src, out, m, src_stride, offsets, mask, root, MODE: tl.constexpr):
    # Read this tile of what this rank needs from the peers' src and store it into out.
    if MODE == BROADCAST:
        if ctx.rank != root:
            tl.store(out + offsets, load(src + offsets, ctx.rank, root, ctx.heap_bases, mask=mask), mask=mask)
    else:
        ptrs = src + offsets
        if MODE == ALL_TO_ALL:
            ptrs = src + ctx.rank * src_stride + offsets
        for i in tl.static_range(ctx.world_size):
            # starting with this rank, then the next: the ranks spread their reads over the peers
            p = (ctx.rank + i) % ctx.world_size  # a compile-time value: rank and i are
            if p == ctx.rank:
                data = tl.load(ptrs, mask=mask)
            else:
                data = load(ptrs, ctx.rank, p, ctx.heap_bases, mask=mask)
            tl.store(out + p * m + offsets, data, mask=mask)


@triton.jit(do_not_specialize=["root"])
def pull_kernel(context, inp, src, out, locks, m, src_stride, root, rank: tl.constexpr, world_size: tl.constexpr,
                MODE: tl.constexpr, STAGE_IN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """all_gather (``MODE`` GATHER), all_to_all or broadcast from ``root``, ``m`` elements per
    chunk, by pulling from the peers' heap ``src`` (``inp`` on the heap, else staged here).

    Per tile, the one-shot protocol of ``all_reduce_one_shot``: signal every peer "my src tile is
    ready", wait for every peer's, read, signal "done reading yours", wait until every peer is done
    reading this rank's. So ``src`` may be overwritten by the next call at once, and ``out`` may
    be any tensor (only this rank writes it)."""
    call: tl.constexpr = _pull_call(MODE)
    ctx = DeviceContext.initialize(context, rank, world_size)
    rows = (m + BLOCK_N - 1) // BLOCK_N
    view_of_out = FlatView(out, m, rows, BLOCK_N)
    within = (tl.arange(0, BLOCK_M).to(INDEX_TYPE)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :])
    for t in range(tl.program_id(0), (rows + BLOCK_M - 1) // BLOCK_M, tl.num_programs(0)):
        view = TileView(t, 0, BLOCK_M, BLOCK_N)
        offsets = t * (BLOCK_M * BLOCK_N) + within
        mask = offsets < m
        if STAGE_IN:
            # this program's tile of every chunk peers will read, into the heap staging
            if MODE == ALL_TO_ALL:
                for j in tl.static_range(world_size):
                    tl.store(src + j * src_stride + offsets, tl.load(inp + j * m + offsets, mask=mask), mask=mask)
            elif MODE == BROADCAST:
                if rank == root:
                    tl.store(src + offsets, tl.load(inp + offsets, mask=mask), mask=mask)
            else:
                tl.store(src + offsets, tl.load(inp + offsets, mask=mask), mask=mask)
        if world_size == 1:
            _pull_tile(ctx, src, out, m, src_stride, offsets, mask, root, MODE)
        else:
            tile, record, epoch = enter_tile(view, view_of_out, locks, call)
            signal_all(record + ARRIVE, rank, world_size, ctx.heap_bases)
            # no peer can leave this call before this rank's "done": their signatures hold
            wait_at_least(record + ARRIVE, epoch * (world_size - 1), call, "ready", rank, -1, tile, ctx.heap_bases,
                          record + EPOCH, record)
            _pull_tile(ctx, src, out, m, src_stride, offsets, mask, root, MODE)
            signal_all(record + DONE, rank, world_size, ctx.heap_bases)
            wait_at_least(record + DONE, epoch * (world_size - 1), call, "done", rank, -1, tile, ctx.heap_bases,
                          record + EPOCH)


@triton.jit
def barrier_kernel(context, flags, rank: tl.constexpr, world_size: tl.constexpr):
    """One program: :func:`iris.collectives.device_barrier` on ``flags`` (two int32 words)."""
    device_barrier(DeviceContext.initialize(context, rank, world_size), flags)
