"""Strategy ``rotated`` of ``matmul_reduce_scatter`` and ``matmul_all_reduce``: no rank waits
for a peer's GEMM.

The rows of ``a @ b`` are ``W`` chunks of ``M / W`` rows, chunk ``c`` owned by rank ``c``. Every
rank visits the chunks in a rotated order, ``rank + 1, rank + 2, ...``, its own chunk last, so
that in any step the ranks work on ``W`` different chunks:

- a peer's chunk: each program computes its tiles of this rank's partial product (in fp32) and
  stores them straight into the owner's staging slot for this rank (remote stores, no wait), then
  signals the owner once for the whole chunk;
- its own chunk, last: the peers computed their partials of it in earlier steps, so the wait for
  their signals is normally already over; each tile is this rank's partial (stored to its own
  slot) plus the peers' (loaded from the local slots), summed in rank order in fp32, rounded once
  into ``out``. The slots hold fp32 or, with ``Config(partial_dtype="input")``, the inputs' dtype
  (each partial then rounded once before the sum, as torch's fused ops do). The bias is added
  once: after the sum for the reduce-scatter, to rank 0's partial for the all-reduce (as its
  other strategies do, so all strategies give the same bits).

``matmul_all_reduce`` adds a third phase (``GATHER``): the owner also stores its rounded chunk
in a heap buffer and signals; every rank then copies the other ranks' chunks into ``out``. Every
rank therefore holds the owner's rounding of each chunk: bit-identical results on every rank.

Program ``p`` handles tiles ``p, p + P, ...`` of *every* chunk (the tiles of a chunk in the
grouped order), so the only programs it waits for are the programs ``p`` of the other ranks, for
work those do before any wait of their own in the same call: this also holds when the programs
of one rank run one after another (Triton's interpreter).

Flags: per program, a record of ``record_words(W)`` int32 counters on each rank (only growing;
the ``n``-th call waits for ``n``). Staging slots and gathered chunks are double-buffered by the
parity of the call, so a rank may start call ``n + 1`` while a peer still reads call ``n``;
before reusing a buffer (call ``n + 2``) a writer waits until its readers have released it, which
back-to-back calls have long done. Back-to-back calls need no barrier and no reset.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from iris.device import round_to, translate
from iris.device._calls import call_check, call_enter

from .._context import RuntimeRankContext
from .._sync import advance, signal, wait_at_least
from ._gemm import add_bias, add_bias_if, gemm_operands, grouped_tile, tile_cols, tile_product, tile_rows

#: Words of a program's record: its call count, then the counters below, then one arrival and one
#: release counter per source rank (see :func:`record_words`).
CALLS: tl.constexpr = tl.constexpr(0)
CONSUMED: tl.constexpr = tl.constexpr(1)  # the owner has read call n's partials from its slots
REDUCED: tl.constexpr = tl.constexpr(2)  # the owner has stored call n's rounded chunk (GATHER)
ARRIVED: tl.constexpr = tl.constexpr(3)  # + src: src has stored its partials of this chunk for call n
# ARRIVED + W + src: src has copied call n's rounded chunk out of this rank's buffer (GATHER)


def record_words(world_size: int) -> int:
    """int32 words of one program's flag record: 3 counters, ``W`` arrivals, ``W`` releases of
    the gathered chunk, rounded up to 16 words (64 bytes) so records do not share a sector."""
    return -(-(3 + 2 * world_size) // 16) * 16


@triton.jit
def _slot(owner, src, world_size: tl.constexpr):
    # Index of src's staging slot on owner (0 .. W - 2): the own slot is never used.
    return (src - owner - 1 + world_size) % world_size


@triton.jit
def _push_partials(ctx, a_op, b_op, bias, partial, owner, parity, M_LOCAL, N, K, tiles_m, tiles_n, stride_am,
                   stride_ak, stride_bk, stride_bn, BIAS_FIRST: tl.constexpr, USE_TMA: tl.constexpr,
                   PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr):
    """This program's tiles of ``owner``'s chunk of this rank's partial product (rank 0's with the
    bias when ``BIAS_FIRST``), stored (weak, in the slots' dtype) into this rank's slot on ``owner``. Per program;
    the caller signals afterwards."""
    slot = (parity * (ctx.world_size - 1) + _slot(owner, ctx.rank, ctx.world_size)).to(tl.int64)
    remote = translate(partial + slot * M_LOCAL * N, ctx.rank, owner, ctx.heap_bases)
    for j in range(tl.program_id(0), tiles_m * tiles_n, tl.num_programs(0)):
        pid_m, pid_n = grouped_tile(j, tiles_m, tiles_n, GROUP_M)
        local_rows = tile_rows(pid_m, BLOCK_M)
        row_mask = local_rows < M_LOCAL
        cols = tile_cols(pid_n, BLOCK_N)
        acc = tile_product(a_op, b_op, owner * M_LOCAL + pid_m * BLOCK_M, pid_n * BLOCK_N, owner * M_LOCAL + local_rows,
                           row_mask, cols, N, K, stride_am, stride_ak, stride_bk, stride_bn, USE_TMA, PRECISION,
                           BLOCK_M, BLOCK_N, BLOCK_K)
        acc = add_bias_if(acc, bias, cols, N, BIAS_FIRST, ctx.rank == 0)  # rank 0's partial only
        tl.store(remote + local_rows[:, None] * N + cols[None, :], round_to(acc, partial.dtype.element_ty),
                 mask=row_mask[:, None] & (cols[None, :] < N))


@triton.constexpr_function
def _slice_rows(BLOCK_M):
    # Rows of the tile the owner sums at a time: a 128 x 256 fp32 tile is 128 registers per thread
    # (8 warps), and holding it, the running sum and a peer's tile at once spilled (the reduction
    # then cost 0.27 ms of a 1.11 ms call at 4 ranks); 32-row slices keep the sum small.
    return min(32, BLOCK_M)


@triton.jit
def _reduce_own(ctx, a_op, b_op, bias, partial, out, gathered, parity, M_LOCAL, N, K, tiles_m, tiles_n, stride_am,
                stride_ak, stride_bk, stride_bn, stride_om, stride_on, OUT_ROW0, GATHER: tl.constexpr,
                HAS_BIAS: tl.constexpr, USE_TMA: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's tiles of this rank's own chunk: its partial (stored to the own slot first)
    plus every peer's (from the local slots, which the caller acquired), in rank order, 32 rows at
    a time, bias once, one rounding into ``out`` (rows from ``OUT_ROW0``) and, with ``GATHER``,
    into this rank's ``gathered`` buffer. Per program."""
    rank = ctx.rank
    SLICE: tl.constexpr = _slice_rows(BLOCK_M)
    OWN_SLOT: tl.constexpr = 2 * (ctx.world_size - 1)  # after the peers' slots, two per peer
    own_slot = partial + tl.full([], OWN_SLOT, tl.int64) * M_LOCAL * N
    for j in range(tl.program_id(0), tiles_m * tiles_n, tl.num_programs(0)):
        pid_m, pid_n = grouped_tile(j, tiles_m, tiles_n, GROUP_M)
        local_rows = tile_rows(pid_m, BLOCK_M)
        row_mask = local_rows < M_LOCAL
        cols = tile_cols(pid_n, BLOCK_N)
        acc = tile_product(a_op, b_op, rank * M_LOCAL + pid_m * BLOCK_M, pid_n * BLOCK_N, rank * M_LOCAL + local_rows,
                           row_mask, cols, N, K, stride_am, stride_ak, stride_bk, stride_bn, USE_TMA, PRECISION,
                           BLOCK_M, BLOCK_N, BLOCK_K)
        # the all-reduce's bias joins rank 0's part
        acc = add_bias_if(acc, bias, cols, N, HAS_BIAS and GATHER, rank == 0)
        # rounded like the peers' partials (Config.partial_dtype), so every rank sums the same values
        tl.store(own_slot + local_rows[:, None] * N + cols[None, :], round_to(acc, partial.dtype.element_ty),
                 mask=row_mask[:, None] & (cols[None, :] < N))
        tl.debug_barrier()  # the slices below read what other threads of the program stored
        for r0 in tl.static_range(0, BLOCK_M, SLICE):
            rows = pid_m * BLOCK_M + r0 + tl.arange(0, SLICE)
            mask = (rows < M_LOCAL)[:, None] & (cols[None, :] < N)
            offsets = rows[:, None] * N + cols[None, :]
            total = tl.zeros([SLICE, BLOCK_N], dtype=acc.dtype)  # fp32 (fp64) whatever the slots hold
            for p in tl.static_range(ctx.world_size):  # rank order on every rank: the same sum everywhere
                # p's slot, or this rank's own (a run-time choice, the rank being a run-time value):
                # one load either way, no branch around it
                slot = tl.where(rank == p, OWN_SLOT, parity * (ctx.world_size - 1) + _slot(rank, p, ctx.world_size))
                total = total + tl.load(partial + slot.to(tl.int64) * M_LOCAL * N + offsets, mask=mask, other=0)
            result = round_to(add_bias(total, bias, cols, N, HAS_BIAS and not GATHER), out.dtype.element_ty)
            tl.store(out + (OUT_ROW0 + rows)[:, None] * stride_om + cols[None, :] * stride_on, result, mask=mask)
            if GATHER:
                own = gathered + parity.to(tl.int64) * M_LOCAL * N
                tl.store(own + offsets, result, mask=mask)


@triton.jit
def _copy_chunk(ctx, gathered, owner, parity, out, M_LOCAL, N, tiles_m, tiles_n, stride_om, stride_on,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's tiles of ``owner``'s rounded chunk, read from its ``gathered`` buffer (weak
    loads through a translated pointer; the caller acquired them) into ``out``. Per program."""
    remote = translate(gathered + parity.to(tl.int64) * M_LOCAL * N, ctx.rank, owner, ctx.heap_bases)
    for j in range(tl.program_id(0), tiles_m * tiles_n, tl.num_programs(0)):
        pid_m, pid_n = grouped_tile(j, tiles_m, tiles_n, GROUP_M)
        local_rows = tile_rows(pid_m, BLOCK_M)
        cols = tile_cols(pid_n, BLOCK_N)
        mask = (local_rows < M_LOCAL)[:, None] & (cols[None, :] < N)
        x = tl.load(remote + local_rows[:, None] * N + cols[None, :], mask=mask)
        tl.store(out + (owner * M_LOCAL + local_rows)[:, None] * stride_om + cols[None, :] * stride_on, x, mask=mask)


@triton.jit(do_not_specialize=["call_fp", "rank"])
def rotated_kernel(context, a, b, bias, partial, gathered, out, flags, M, N, K, M_LOCAL, stride_am, stride_ak,
                   stride_bk, stride_bn, stride_om, stride_on, call_fp, rank, call: tl.constexpr,
                   world_size: tl.constexpr, RECORD: tl.constexpr, GATHER: tl.constexpr, HAS_BIAS: tl.constexpr,
                   USE_TMA: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """Persistent; see the module docstring. ``partial``: ``[(2 * (W - 1) + 1) * M_LOCAL, N]`` in
    fp32 or the inputs' dtype on the heap (the staging slots, two per peer, and this rank's own); ``gathered``:
    ``[2 * M_LOCAL, N]`` in ``out``'s dtype on the heap (``GATHER`` only); ``out``: ``[M, N]``
    with ``GATHER``, else ``[M_LOCAL, N]``; ``flags``: ``RECORD`` int32 words per program on the
    heap, zeroed once."""
    ctx = RuntimeRankContext.initialize(context, rank, world_size)
    entered = call_enter(ctx.heap_bases, call_fp, rank, world_size)
    tiles_m = (M_LOCAL + BLOCK_M - 1) // BLOCK_M
    tiles_n = (N + BLOCK_N - 1) // BLOCK_N
    a_op, b_op = gemm_operands(a, M, K, stride_am, b, N, stride_bk, stride_bn, USE_TMA, BLOCK_M, BLOCK_N, BLOCK_K)
    record = flags + tl.program_id(0) * RECORD
    epoch = advance(record + CALLS, 1) + 1  # this program's call count, 1 for the first call
    parity = epoch % 2
    for step in tl.static_range(1, world_size):
        owner = (rank + step) % world_size
        # call epoch - 2 used the same slot on owner: wait until owner has read it (long done)
        wait_at_least(translate(record + CONSUMED, rank, owner, ctx.heap_bases), epoch - 2, call, "consumed", rank,
                      owner, tl.program_id(0), ctx.heap_bases)
        _push_partials(ctx, a_op, b_op, bias, partial, owner, parity, M_LOCAL, N, K, tiles_m, tiles_n, stride_am,
                       stride_ak, stride_bk, stride_bn, HAS_BIAS and GATHER, USE_TMA, PRECISION, BLOCK_M, BLOCK_N,
                       BLOCK_K, GROUP_M)
        signal(record + ARRIVED + rank, rank, owner, ctx.heap_bases)
    for step in tl.static_range(1, world_size):
        src = (rank + step) % world_size
        wait_at_least(record + ARRIVED + src, epoch, call, "partials", rank, src, tl.program_id(0), ctx.heap_bases)
    if GATHER:
        # call epoch - 2 used the same gathered buffer: wait until every peer has copied it out
        for step in tl.static_range(1, world_size):
            src = (rank + step) % world_size
            wait_at_least(record + (ARRIVED + world_size) + src, epoch - 2, call, "released", rank, src,
                          tl.program_id(0), ctx.heap_bases)
    _reduce_own(ctx, a_op, b_op, bias, partial, out, gathered, parity, M_LOCAL, N, K, tiles_m, tiles_n, stride_am,
                stride_ak, stride_bk, stride_bn, stride_om, stride_on, rank * M_LOCAL if GATHER else 0, GATHER,
                HAS_BIAS, USE_TMA, PRECISION, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
    # one signal for both: the slots are read (loads before a release) and the chunk is stored
    signal(record + CONSUMED, rank, rank, ctx.heap_bases)
    if GATHER:
        signal(record + REDUCED, rank, rank, ctx.heap_bases)
        for step in tl.static_range(1, world_size):
            owner = (rank + step) % world_size
            wait_at_least(translate(record + REDUCED, rank, owner, ctx.heap_bases), epoch, call, "reduced", rank,
                          owner, tl.program_id(0), ctx.heap_bases)
            _copy_chunk(ctx, gathered, owner, parity, out, M_LOCAL, N, tiles_m, tiles_n, stride_om, stride_on,
                        BLOCK_M, BLOCK_N, GROUP_M)
            signal(record + (ARRIVED + world_size) + rank, rank, owner, ctx.heap_bases)
    call_check(ctx.heap_bases, call_fp, entered, rank, world_size)


def rotated_buffers(ctx, M: int, N: int, staged_dtype: torch.dtype, out_dtype: torch.dtype, programs: int,
                    gather: bool) -> dict:
    """The heap buffers of :func:`rotated_kernel` for ``M`` rows over ``W`` ranks and at most
    ``programs`` programs per rank: the partials' slots in ``staged_dtype``, flags zeroed,
    ``gathered`` (in ``out_dtype``) only with ``gather``."""
    W = ctx.world_size
    m_local = M // W
    buffers = {"partial": ctx.zeros((2 * (W - 1) + 1) * m_local, N, dtype=staged_dtype),
               "flags": ctx.zeros(programs * record_words(W), dtype=torch.int32)}
    if gather:
        buffers["gathered"] = ctx.zeros(2 * m_local, N, dtype=out_dtype)
    return buffers
