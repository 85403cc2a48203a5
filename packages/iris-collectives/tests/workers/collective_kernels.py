"""Test kernels for every collective, shared by the multi-rank worker and the sm_90 compile check.

Import it after ``iris.runtime`` has chosen the backend (``import iris.collectives`` does that).
Every kernel loops over its tiles with a persistent grid (``range(pid, tiles, num_programs)``), the
way GPU kernels run them, and uses the bound form (``ctx.all_reduce_one_shot(...)``) or the free
function (``ic.all_reduce_one_shot(ctx, ...)``) as ``BOUND`` says. The ``strided_*`` kernels take
both strides of every view (any layout) and a ``TRACE`` switch, and use the free functions;
``view_helpers_kernel`` and ``barrier_exchange_kernel`` run one program per tile or slot.
"""

import triton
import triton.language as tl

import iris.collectives as ic
from iris.device import load

# VARIANT numbers of all_reduce_kernel.
ATOMIC, SPINLOCK, ONE_SHOT, TWO_SHOT, RING, REDUCE_SCATTER = range(6)
VARIANT_NAMES = {ATOMIC: "all_reduce_atomic", SPINLOCK: "all_reduce_spinlock", ONE_SHOT: "all_reduce_one_shot",
                 TWO_SHOT: "all_reduce_two_shot", RING: "all_reduce_ring", REDUCE_SCATTER: "reduce_scatter"}


@triton.jit
def all_reduce_kernel(context, inp, src, dst, locks, M, N, stride_in, stride_src, stride_dst,
                      rank: tl.constexpr, world_size: tl.constexpr, VARIANT: tl.constexpr, BOUND: tl.constexpr,
                      STAGE: tl.constexpr, TRACE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One all-reduce (or reduce-scatter) of ``inp`` (M x N, any memory of this rank) into ``dst``.

    ``STAGE``: copy the tile into the symmetric ``src`` first (the fused pattern: the data exists
    only in registers); otherwise ``inp`` is ``src``.
    """
    ctx = ic.DeviceContext.initialize(context, rank, world_size, tracing=TRACE)
    in_view = ic.TensorView(inp, M, N, stride_in, 1)
    src_view = ic.TensorView(src, M, N, stride_src, 1)
    dst_view = ic.TensorView(dst, M, N, stride_dst, 1)
    tiles_n = dst_view.num_tiles_n(BLOCK_N)
    for t in range(tl.program_id(0), dst_view.num_tiles(BLOCK_M, BLOCK_N), tl.num_programs(0)):
        pid_m, pid_n = ic.tile_coords(t, tiles_n)
        view = ic.TileView(pid_m, pid_n, BLOCK_M, BLOCK_N)
        data = in_view.load(view)
        if STAGE:
            src_view.store(view, data)
        tile = ic.Tile(pid_m, pid_n, BLOCK_M, BLOCK_N, data)
        if VARIANT == 0:
            if BOUND:
                ctx.all_reduce_atomic(tile, dst_view)
            else:
                ic.all_reduce_atomic(ctx, tile, dst_view)
        elif VARIANT == 1:
            if BOUND:
                ctx.all_reduce_spinlock(tile, dst_view, locks)
            else:
                ic.all_reduce_spinlock(ctx, tile, dst_view, locks)
        elif VARIANT == 2:
            if BOUND:
                ctx.all_reduce_one_shot(tile, src_view, dst_view, locks)
            else:
                ic.all_reduce_one_shot(ctx, tile, src_view, dst_view, locks)
        elif VARIANT == 3:
            if BOUND:
                ctx.all_reduce_two_shot(tile, src_view, dst_view, locks)
            else:
                ic.all_reduce_two_shot(ctx, tile, src_view, dst_view, locks)
        elif VARIANT == 4:
            if BOUND:
                ctx.all_reduce_ring(view, src_view, dst_view)
            else:
                ic.all_reduce_ring(ctx, view, src_view, dst_view)
        else:
            if BOUND:
                ctx.reduce_scatter(tile, src_view, dst_view, locks)
            else:
                ic.reduce_scatter(ctx, tile, src_view, dst_view, locks)


@triton.jit
def all_reduce_rmsnorm_kernel(context, src, residual, weight, dst, res_out, scale, locks, M, N, eps,
                              rank: tl.constexpr, world_size: tl.constexpr, TWO_SHOT: tl.constexpr,
                              RANGE: tl.constexpr, BOUND: tl.constexpr, ROW_SCALES: tl.constexpr,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``all_reduce_rmsnorm`` of ``src`` (M x N, symmetric) with ``residual`` into ``dst`` and
    ``res_out`` (in place when it is ``residual``; symmetric for two-shot), tiles of whole rows
    (``BLOCK_N >= N``): one call per tile, or with ``RANGE`` one per program on its range. ``scale``
    (fp8 ``dst`` only): the per-tensor scale, or with ``ROW_SCALES`` where the rows' scales go."""
    ctx = ic.DeviceContext.initialize(context, rank, world_size)
    src_view, residual_view = ic.TensorView(src, M, N, N, 1), ic.TensorView(residual, M, N, N, 1)
    dst_view, res_view = ic.TensorView(dst, M, N, N, 1), ic.TensorView(res_out, M, N, N, 1)
    tiles = ic.cdiv(M, BLOCK_M)
    if RANGE:
        rows = ic.TileRange(tl.program_id(0), tiles, tl.num_programs(0), 1, BLOCK_M, BLOCK_N)
        if BOUND:
            ctx.all_reduce_rmsnorm(rows, src_view, dst_view, locks, weight, eps, residual_view, res_view,
                                   scale, ROW_SCALES, TWO_SHOT)
        else:
            ic.all_reduce_rmsnorm(ctx, rows, src_view, dst_view, locks, weight, eps, residual_view, res_view,
                                  scale, ROW_SCALES, TWO_SHOT)
    else:
        for t in range(tl.program_id(0), tiles, tl.num_programs(0)):
            view = ic.TileView(t, 0, BLOCK_M, BLOCK_N)
            if BOUND:
                ctx.all_reduce_rmsnorm(view, src_view, dst_view, locks, weight, eps, residual_view, res_view,
                                       scale, ROW_SCALES, TWO_SHOT)
            else:
                ic.all_reduce_rmsnorm(ctx, view, src_view, dst_view, locks, weight, eps, residual_view, res_view,
                                      scale, ROW_SCALES, TWO_SHOT)


@triton.jit
def all_gather_kernel(context, inp, dst, flags, out, M_local, N_local, M, N, stride_in, stride_dst, stride_out,
                      rank: tl.constexpr, world_size: tl.constexpr, DIM: tl.constexpr, BOUND: tl.constexpr,
                      BARRIER: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """All-gather ``inp`` (M_local x N_local) into ``dst`` (M x N). With ``BARRIER``, a device
    barrier per tile follows, after which this rank copies the tile's gathered part from every
    rank's slot of its own ``dst`` into ``out`` (same shape as ``dst``, any memory)."""
    ctx = ic.DeviceContext.initialize(context, rank, world_size)
    in_view = ic.TensorView(inp, M_local, N_local, stride_in, 1)
    dst_view = ic.TensorView(dst, M, N, stride_dst, 1)
    tiles_n = in_view.num_tiles_n(BLOCK_N)
    for t in range(tl.program_id(0), in_view.num_tiles(BLOCK_M, BLOCK_N), tl.num_programs(0)):
        pid_m, pid_n = ic.tile_coords(t, tiles_n)
        view = ic.TileView(pid_m, pid_n, BLOCK_M, BLOCK_N)
        tile = ic.Tile(pid_m, pid_n, BLOCK_M, BLOCK_N, in_view.load(view))
        if BOUND:
            ctx.all_gather(tile, dst_view, DIM)
        else:
            ic.all_gather(ctx, tile, dst_view, DIM)
        if BARRIER:
            ic.device_barrier(ctx, flags + ic.BARRIER_WORDS * t)
            rows = view.rows()
            cols = view.cols()
            mask = (rows[:, None] < M_local) & (cols[None, :] < N_local)
            for r in tl.static_range(world_size):
                if DIM == 0:
                    g_rows = rows + r * M_local
                    g_cols = cols
                else:
                    g_rows = rows
                    g_cols = cols + r * N_local
                vals = tl.load(dst + g_rows[:, None] * stride_dst + g_cols[None, :], mask=mask)
                tl.store(out + g_rows[:, None] * stride_out + g_cols[None, :], vals, mask=mask)


@triton.jit
def gather_kernel(context, src, out, M, N, stride_src, stride_out, rank: tl.constexpr, world_size: tl.constexpr,
                  SOURCE: tl.constexpr, BOUND: tl.constexpr, HINT_N: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    """``out`` (this rank's memory) = rank ``SOURCE``'s ``src`` (M x N, symmetric), tile by tile;
    with ``HINT_N`` > 0, gather gets ``hint=(1, HINT_N)`` (rows contiguous and aligned by HINT_N)."""
    ctx = ic.DeviceContext.initialize(context, rank, world_size)
    src_view = ic.TensorView(src, M, N, stride_src, 1)
    out_view = ic.TensorView(out, M, N, stride_out, 1)
    tiles_n = src_view.num_tiles_n(BLOCK_N)
    for t in range(tl.program_id(0), src_view.num_tiles(BLOCK_M, BLOCK_N), tl.num_programs(0)):
        pid_m, pid_n = ic.tile_coords(t, tiles_n)
        view = ic.TileView(pid_m, pid_n, BLOCK_M, BLOCK_N)
        # A tuple hint must be written in the kernel: Triton 3.6 cannot pass a tuple constexpr
        # argument on to tl.multiple_of.
        if HINT_N > 0:
            if BOUND:
                data = ctx.gather(view, src_view, SOURCE, hint=(1, HINT_N))
            else:
                data = ic.gather(ctx, view, src_view, SOURCE, (1, HINT_N))
        else:
            if BOUND:
                data = ctx.gather(view, src_view, SOURCE)
            else:
                data = ic.gather(ctx, view, src_view, SOURCE)
        out_view.store(view, data)


@triton.jit
def all_to_all_kernel(context, src, dst, M, stride_src, stride_dst, rank: tl.constexpr, world_size: tl.constexpr,
                      N_PER_RANK: tl.constexpr, BOUND: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """All-to-all of ``src`` into ``dst`` (both M x world_size*N_PER_RANK)."""
    ctx = ic.DeviceContext.initialize(context, rank, world_size)
    src_view = ic.TensorView(src, M, world_size * N_PER_RANK, stride_src, 1)
    dst_view = ic.TensorView(dst, M, world_size * N_PER_RANK, stride_dst, 1)
    tiles_n = ic.cdiv(N_PER_RANK, BLOCK_N)
    tiles = ic.cdiv(M, BLOCK_M) * tiles_n
    for t in range(tl.program_id(0), tiles, tl.num_programs(0)):
        pid_m, pid_n = ic.tile_coords(t, tiles_n)
        view = ic.TileView(pid_m, pid_n, BLOCK_M, BLOCK_N)
        if BOUND:
            ctx.all_to_all(view, src_view, dst_view, N_PER_RANK)
        else:
            ic.all_to_all(ctx, view, src_view, dst_view, N_PER_RANK)


# --- any strides: every view takes (stride_m, stride_n); free-function form; optional tracing ------

@triton.jit
def strided_all_reduce_kernel(context, inp, src, dst, locks, M, N, sim, sin, ssm, ssn, sdm, sdn,
                              rank: tl.constexpr, world_size: tl.constexpr, VARIANT: tl.constexpr,
                              STAGE: tl.constexpr, TRACE: tl.constexpr, BLOCK_M: tl.constexpr,
                              BLOCK_N: tl.constexpr):
    """:func:`all_reduce_kernel` on views with both strides given: ``inp`` (``sim``, ``sin``),
    ``src`` (``ssm``, ``ssn``) and ``dst`` (``sdm``, ``sdn``), so any layout (column slices,
    transposes, padded rows) reaches the collective as it is."""
    ctx = ic.DeviceContext.initialize(context, rank, world_size, tracing=TRACE)
    in_view = ic.TensorView(inp, M, N, sim, sin)
    src_view = ic.TensorView(src, M, N, ssm, ssn)
    dst_view = ic.TensorView(dst, M, N, sdm, sdn)
    tiles_n = dst_view.num_tiles_n(BLOCK_N)
    for t in range(tl.program_id(0), dst_view.num_tiles(BLOCK_M, BLOCK_N), tl.num_programs(0)):
        pid_m, pid_n = ic.tile_coords(t, tiles_n)
        view = ic.TileView(pid_m, pid_n, BLOCK_M, BLOCK_N)
        data = in_view.load(view)
        if STAGE:
            src_view.store(view, data)
        tile = ic.Tile(pid_m, pid_n, BLOCK_M, BLOCK_N, data)
        if VARIANT == 0:
            ic.all_reduce_atomic(ctx, tile, dst_view)
        elif VARIANT == 1:
            ic.all_reduce_spinlock(ctx, tile, dst_view, locks)
        elif VARIANT == 2:
            ic.all_reduce_one_shot(ctx, tile, src_view, dst_view, locks)
        elif VARIANT == 3:
            ic.all_reduce_two_shot(ctx, tile, src_view, dst_view, locks)
        elif VARIANT == 4:
            ic.all_reduce_ring(ctx, view, src_view, dst_view)
        else:
            ic.reduce_scatter(ctx, tile, src_view, dst_view, locks)


@triton.jit
def strided_all_gather_kernel(context, inp, dst, M_local, N_local, M, N, sim, sin, sdm, sdn, rank: tl.constexpr,
                              world_size: tl.constexpr, DIM: tl.constexpr, TRACE: tl.constexpr,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """All-gather ``inp`` (M_local x N_local, strides ``sim``, ``sin``) into ``dst`` (M x N, strides
    ``sdm``, ``sdn``)."""
    ctx = ic.DeviceContext.initialize(context, rank, world_size, tracing=TRACE)
    in_view = ic.TensorView(inp, M_local, N_local, sim, sin)
    dst_view = ic.TensorView(dst, M, N, sdm, sdn)
    tiles_n = in_view.num_tiles_n(BLOCK_N)
    for t in range(tl.program_id(0), in_view.num_tiles(BLOCK_M, BLOCK_N), tl.num_programs(0)):
        pid_m, pid_n = ic.tile_coords(t, tiles_n)
        view = ic.TileView(pid_m, pid_n, BLOCK_M, BLOCK_N)
        ic.all_gather(ctx, ic.Tile(pid_m, pid_n, BLOCK_M, BLOCK_N, in_view.load(view)), dst_view, DIM)


@triton.jit
def strided_gather_kernel(context, src, out, M, N, ssm, ssn, som, son, rank: tl.constexpr, world_size: tl.constexpr,
                          SOURCE: tl.constexpr, TRACE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``out`` (strides ``som``, ``son``) = rank ``SOURCE``'s ``src`` (strides ``ssm``, ``ssn``)."""
    ctx = ic.DeviceContext.initialize(context, rank, world_size, tracing=TRACE)
    src_view = ic.TensorView(src, M, N, ssm, ssn)
    out_view = ic.TensorView(out, M, N, som, son)
    tiles_n = src_view.num_tiles_n(BLOCK_N)
    for t in range(tl.program_id(0), src_view.num_tiles(BLOCK_M, BLOCK_N), tl.num_programs(0)):
        pid_m, pid_n = ic.tile_coords(t, tiles_n)
        view = ic.TileView(pid_m, pid_n, BLOCK_M, BLOCK_N)
        out_view.store(view, ic.gather(ctx, view, src_view, SOURCE))


@triton.jit
def strided_all_to_all_kernel(context, src, dst, M, ssm, ssn, sdm, sdn, rank: tl.constexpr, world_size: tl.constexpr,
                              N_PER_RANK: tl.constexpr, TRACE: tl.constexpr, BLOCK_M: tl.constexpr,
                              BLOCK_N: tl.constexpr):
    """All-to-all of ``src`` (strides ``ssm``, ``ssn``) into ``dst`` (strides ``sdm``, ``sdn``), both
    M x world_size*N_PER_RANK."""
    ctx = ic.DeviceContext.initialize(context, rank, world_size, tracing=TRACE)
    src_view = ic.TensorView(src, M, world_size * N_PER_RANK, ssm, ssn)
    dst_view = ic.TensorView(dst, M, world_size * N_PER_RANK, sdm, sdn)
    tiles_n = ic.cdiv(N_PER_RANK, BLOCK_N)
    for t in range(tl.program_id(0), ic.cdiv(M, BLOCK_M) * tiles_n, tl.num_programs(0)):
        pid_m, pid_n = ic.tile_coords(t, tiles_n)
        ic.all_to_all(ctx, ic.TileView(pid_m, pid_n, BLOCK_M, BLOCK_N), src_view, dst_view, N_PER_RANK)


@triton.jit
def view_helpers_kernel(src, dst, dst2, blocks, offsets, counts, M, N, ssm, ssn, sdm, sdn, s2m, s2n, OTHER,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Every :class:`TensorView` helper on this rank's memory, one program per tile:
    ``dst`` = ``src`` through ``load``/``store`` (``frame``); ``dst2`` = ``src`` through
    ``offsets``/``pointers``/``mask``; ``blocks[t]`` = tile ``t`` as ``load(other=OTHER)`` gives
    it and ``offsets[t]`` = its ``offsets`` in ``src`` (both ``[tiles, BLOCK_M, BLOCK_N]``, dense);
    program 0 writes ``num_tiles_m``, ``num_tiles_n`` and ``num_tiles`` into ``counts``."""
    src_view = ic.TensorView(src, M, N, ssm, ssn)
    dst_view = ic.TensorView(dst, M, N, sdm, sdn)
    dst2_view = ic.TensorView(dst2, M, N, s2m, s2n)
    t = tl.program_id(0)
    pid_m, pid_n = ic.tile_coords(t, src_view.num_tiles_n(BLOCK_N))
    view = ic.TileView(pid_m, pid_n, BLOCK_M, BLOCK_N)
    dst_view.store(view, src_view.load(view))
    data = tl.load(src_view.ptr + src_view.offsets(view), mask=src_view.mask(view))
    tl.store(dst2_view.pointers(view), data, mask=dst2_view.mask(view))
    dense = t * BLOCK_M * BLOCK_N + tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    tl.store(blocks + dense, src_view.load(view, other=OTHER))
    tl.store(offsets + dense, src_view.offsets(view).to(tl.int64))
    if t == 0:
        tl.store(counts, src_view.num_tiles_m(BLOCK_M))
        tl.store(counts + 1, src_view.num_tiles_n(BLOCK_N))
        tl.store(counts + 2, src_view.num_tiles(BLOCK_M, BLOCK_N))


# --- device barrier -------------------------------------------------------------------------------

@triton.jit
def barrier_exchange_kernel(context, buf, flags, out, value, epoch, rank: tl.constexpr, world_size: tl.constexpr,
                            EXPLICIT: tl.constexpr, TRACE: tl.constexpr, BLOCK: tl.constexpr):
    """Program ``p`` writes ``value + i`` into elements ``i`` of its ``BLOCK`` of this rank's ``buf``
    (int32, symmetric), crosses :func:`device_barrier` on slot ``p`` of ``flags`` (with
    ``epoch=epoch`` when ``EXPLICIT``, else the slot's own count), then copies its block of every
    rank's ``buf`` into ``out[q]`` (``out``: world_size x num_programs*BLOCK, this rank's memory)."""
    ctx = ic.DeviceContext.initialize(context, rank, world_size, tracing=TRACE)
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(buf + offs, value + offs)
    slot = flags + ic.BARRIER_WORDS * pid
    if EXPLICIT:
        ic.device_barrier(ctx, slot, epoch=epoch)
    else:
        ic.device_barrier(ctx, slot)
    width = tl.num_programs(0) * BLOCK
    for q in tl.static_range(world_size):
        tl.store(out + q * width + offs, load(buf + offs, rank, q, ctx.heap_bases))


@triton.jit
def message_ring_kernel(context, x, inbox, flags, out, n, rounds, before, rank: tl.constexpr,
                        world_size: tl.constexpr, BLOCK: tl.constexpr):
    """``rounds`` messages of ``n`` elements to the next rank with ``put_with_signal`` (message k
    from ``x + k * BLOCK`` into the next rank's ``inbox + k * BLOCK``, one counter for all), then
    ``wait_signal`` for each from the rank before (the counter's ``before + k + 1``-th signal) and
    a copy of it into ``out``. One program."""
    ctx = ic.DeviceContext.initialize(context, rank, world_size)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    nxt = (rank + 1) % world_size
    for k in range(rounds):
        ic.put_with_signal(x + k * BLOCK + offs, inbox + k * BLOCK + offs, flags, rank, nxt, ctx.heap_bases,
                           mask=mask)
    for k in range(rounds):
        ic.wait_signal(flags, before + k + 1, ctx.heap_bases, peer=(rank + world_size - 1) % world_size, index=0)
        tl.store(out + k * BLOCK + offs, tl.load(inbox + k * BLOCK + offs, mask=mask), mask=mask)


# --- on a group of ranks: the context keeps global ranks, the collectives take group= -------------

@triton.jit
def group_all_reduce_kernel(context, group_context, inp, src, dst, locks, M, N, stride, rank: tl.constexpr,
                            world_size: tl.constexpr, group_rank: tl.constexpr, group_size: tl.constexpr,
                            VARIANT: tl.constexpr, BOUND: tl.constexpr, BLOCK_M: tl.constexpr,
                            BLOCK_N: tl.constexpr):
    """:func:`all_reduce_kernel` (staged, every view ``stride`` x 1) among the members of a group:
    ``ic.<collective>(ctx, ..., group=group)``, or the bound form with ``BOUND``."""
    ctx = ic.DeviceContext.initialize(context, rank, world_size)
    group = ic.DeviceGroup.initialize(group_context, group_rank, group_size)
    in_view = ic.TensorView(inp, M, N, stride, 1)
    src_view = ic.TensorView(src, M, N, stride, 1)
    dst_view = ic.TensorView(dst, M, N, stride, 1)
    tiles_n = dst_view.num_tiles_n(BLOCK_N)
    for t in range(tl.program_id(0), dst_view.num_tiles(BLOCK_M, BLOCK_N), tl.num_programs(0)):
        pid_m, pid_n = ic.tile_coords(t, tiles_n)
        view = ic.TileView(pid_m, pid_n, BLOCK_M, BLOCK_N)
        data = in_view.load(view)
        src_view.store(view, data)
        tile = ic.Tile(pid_m, pid_n, BLOCK_M, BLOCK_N, data)
        if VARIANT == 0:
            if BOUND:
                ctx.all_reduce_atomic(tile, dst_view, group=group)
            else:
                ic.all_reduce_atomic(ctx, tile, dst_view, group=group)
        elif VARIANT == 1:
            if BOUND:
                ctx.all_reduce_spinlock(tile, dst_view, locks, group=group)
            else:
                ic.all_reduce_spinlock(ctx, tile, dst_view, locks, group=group)
        elif VARIANT == 2:
            if BOUND:
                ctx.all_reduce_one_shot(tile, src_view, dst_view, locks, group=group)
            else:
                ic.all_reduce_one_shot(ctx, tile, src_view, dst_view, locks, group=group)
        elif VARIANT == 3:
            if BOUND:
                ctx.all_reduce_two_shot(tile, src_view, dst_view, locks, group=group)
            else:
                ic.all_reduce_two_shot(ctx, tile, src_view, dst_view, locks, group=group)
        elif VARIANT == 4:
            if BOUND:
                ctx.all_reduce_ring(view, src_view, dst_view, group=group)
            else:
                ic.all_reduce_ring(ctx, view, src_view, dst_view, group=group)
        else:
            if BOUND:
                ctx.reduce_scatter(tile, src_view, dst_view, locks, group=group)
            else:
                ic.reduce_scatter(ctx, tile, src_view, dst_view, locks, group=group)


# OP numbers of group_move_kernel.
ALL_GATHER, GATHER, ALL_TO_ALL = range(3)


@triton.jit
def group_move_kernel(context, group_context, src, dst, flags, M, M_dst, N, stride_src, stride_dst, source,
                      rank: tl.constexpr, world_size: tl.constexpr, group_rank: tl.constexpr,
                      group_size: tl.constexpr, OP: tl.constexpr, N_PER_RANK: tl.constexpr, BOUND: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """On a group: ``ALL_GATHER`` (``src`` M x N into ``dst`` M_dst = group_size*M x N, dim 0, then
    a device barrier of the group per tile on ``flags``), ``GATHER`` (``dst`` = group rank
    ``source``'s ``src``, both M x N) or ``ALL_TO_ALL`` (``src`` and ``dst`` M x group_size*N,
    column blocks of N = N_PER_RANK)."""
    ctx = ic.DeviceContext.initialize(context, rank, world_size)
    group = ic.DeviceGroup.initialize(group_context, group_rank, group_size)
    if OP == 0:
        in_view = ic.TensorView(src, M, N, stride_src, 1)
        dst_view = ic.TensorView(dst, M_dst, N, stride_dst, 1)
    elif OP == 1:
        in_view = ic.TensorView(src, M, N, stride_src, 1)
        dst_view = ic.TensorView(dst, M, N, stride_dst, 1)
    else:
        in_view = ic.TensorView(src, M, group_size * N, stride_src, 1)
        dst_view = ic.TensorView(dst, M, group_size * N, stride_dst, 1)
    tiles_n = ic.cdiv(N, BLOCK_N)
    for t in range(tl.program_id(0), ic.cdiv(M, BLOCK_M) * tiles_n, tl.num_programs(0)):
        pid_m, pid_n = ic.tile_coords(t, tiles_n)
        view = ic.TileView(pid_m, pid_n, BLOCK_M, BLOCK_N)
        if OP == 0:
            tile = ic.Tile(pid_m, pid_n, BLOCK_M, BLOCK_N, in_view.load(view))
            if BOUND:
                ctx.all_gather(tile, dst_view, 0, group=group)
            else:
                ic.all_gather(ctx, tile, dst_view, 0, group=group)
            ic.device_barrier(ctx, flags + ic.BARRIER_WORDS * t, group=group)
        elif OP == 1:
            if BOUND:
                data = ctx.gather(view, in_view, source, group=group)
            else:
                data = ic.gather(ctx, view, in_view, source, group=group)
            dst_view.store(view, data)
        else:
            if BOUND:
                ctx.all_to_all(view, in_view, dst_view, N_PER_RANK, group=group)
            else:
                ic.all_to_all(ctx, view, in_view, dst_view, N_PER_RANK, group=group)


@triton.jit
def group_barrier_kernel(context, group_context, buf, flags, out, members, value, rank: tl.constexpr,
                         world_size: tl.constexpr, group_rank: tl.constexpr, group_size: tl.constexpr,
                         BLOCK: tl.constexpr):
    """:func:`barrier_exchange_kernel` on a group: program ``p`` writes ``value + i`` into its
    ``BLOCK`` of ``buf``, crosses ``device_barrier(..., group=)`` on slot ``p`` of ``flags``, then
    copies its block of every member's ``buf`` into ``out[q]`` (q: group rank), reading with the
    context's global ranks (``group.global_rank(q)``); program 0 writes every member's global rank
    into ``members``."""
    ctx = ic.DeviceContext.initialize(context, rank, world_size)
    group = ic.DeviceGroup.initialize(group_context, group_rank, group_size)
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(buf + offs, value + offs)
    ic.device_barrier(ctx, flags + ic.BARRIER_WORDS * pid, group=group)
    width = tl.num_programs(0) * BLOCK
    for q in tl.static_range(group_size):
        tl.store(out + q * width + offs, ctx.load(buf + offs, group.global_rank(q)))
    if pid == 0:
        for q in tl.static_range(group.size):
            tl.store(members + q, group.global_rank(q))


@triton.jit
def group_misuse_kernel(context, x, rank: tl.constexpr, world_size: tl.constexpr, BLOCK: tl.constexpr):
    """A mistake that must not compile: the context passed as ``group=``."""
    ctx = ic.DeviceContext.initialize(context, rank, world_size)
    view = ic.TensorView(x, BLOCK, BLOCK, BLOCK, 1)
    tile = ic.Tile(0, 0, BLOCK, BLOCK, view.load(ic.TileView(0, 0, BLOCK, BLOCK)))
    ic.all_reduce_atomic(ctx, tile, view, group=ctx)
