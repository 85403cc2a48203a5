"""``matmul_reduce_scatter``: ``out = reduce_scatter(a @ b, dim 0) + bias``, K split over the ranks.

Strategy ``owner``: the rows of the product are ``world_size`` chunks of ``M / W`` rows, chunk
``c`` owned by rank ``c``. The tiles are laid out chunk by chunk (``BLOCK_M``-row tiles inside
each chunk, so no tile straddles two owners), in the same grouped order on every rank. A program
computes a tile of this rank's partial product and, as soon as it has it:

- on a rank that does not own it: waits until the owner has read this rank's previous call's
  tile (``DONE`` of the previous call: usually long done, so the wait is free), stores the fp32
  partial into its heap staging buffer and signals the owner (``ARRIVE``), and moves on;
- on the owner: waits for every peer's ``ARRIVE``, sums the ``W`` partials in rank order (its
  own from registers) in fp32, adds the bias once, rounds once into ``out`` and signals every
  peer ``DONE``.

The flags are the lock records and call counters of :mod:`iris.collectives._sync` (the same
words :func:`iris.collectives.reduce_scatter` uses), one record per tile; counters only grow, so
back-to-back calls need no barrier and no reset.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from iris.device import round_to
from iris.device._calls import call_check, call_enter

from .. import _host
from .._agree import agree_fused
from .._all_reduce import _sum_in_rank_order
from .._compiling import is_compiling, traced
from .._context import RuntimeRankContext
from .._sync import ARRIVE, DONE, EPOCH, LOCK_WORDS_C, next_epoch, signal, signal_all, wait_at_least
from .._views import Tile
from .._workspace import workspace
from ..ccl._groups import on_group
from ._checks import check_inputs, check_matrix, check_rows_divide
from ._config import choose
from ._gemm import add_bias, gemm_operands, grouped_tile, tile_cols, tile_product, tile_rows
from ._launch import accumulator_dtype, b_operand, launch
from ._rotated import record_words, rotated_buffers, rotated_kernel
from ._unfused import unfused

CALL = "iris.collectives.ops.matmul_reduce_scatter"
CALL_C: tl.constexpr = tl.constexpr(CALL)


@triton.jit
def _hand_to_owner(ctx, tile, owner, record, epoch, partial_ptrs, mask):
    """Non-owner side of a tile: publish this rank's fp32 partial for ``owner``. Per program.
    Waits (acquire, system scope) until the owner is done with the previous call's partial, stores
    the new one (weak) and signals ``ARRIVE`` on the owner (CTA barrier, release, system scope)."""
    wait_at_least(record + DONE, epoch - 1, CALL_C, "done", ctx.rank, owner,
                  -1, ctx.heap_bases, record + EPOCH)
    tl.store(partial_ptrs, tile.data, mask=mask)
    signal(record + ARRIVE, ctx.rank, owner, ctx.heap_bases)


@triton.jit(do_not_specialize=["call_fp", "rank"])
def _matmul_reduce_scatter_kernel(context, a, b, bias, partial, out, locks, M, N, K, M_LOCAL, stride_am, stride_ak,
                                  stride_bk, stride_bn, stride_om, stride_on, call_fp, rank,
                                  world_size: tl.constexpr, HAS_BIAS: tl.constexpr, USE_TMA: tl.constexpr,
                                  PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                  BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """Persistent: program ``p`` handles tiles ``p, p + P, ...`` of the chunked tiling (chunk
    ``c`` = tiles ``[c * T_c, (c + 1) * T_c)``, grouped order inside a chunk; the same on every
    rank). ``partial`` is fp32 ``M x N`` contiguous on the heap; ``out`` is ``M_LOCAL x N``."""
    ctx = RuntimeRankContext.initialize(context, rank, world_size)
    entered = call_enter(ctx.heap_bases, call_fp, rank, world_size)
    tiles_m = (M_LOCAL + BLOCK_M - 1) // BLOCK_M
    tiles_n = (N + BLOCK_N - 1) // BLOCK_N
    per_chunk = tiles_m * tiles_n
    a_op, b_op = gemm_operands(a, M, K, stride_am, b, N, stride_bk, stride_bn, USE_TMA, BLOCK_M, BLOCK_N, BLOCK_K)
    for t in range(tl.program_id(0), world_size * per_chunk, tl.num_programs(0)):
        owner = t // per_chunk
        pid_m, pid_n = grouped_tile(t % per_chunk, tiles_m, tiles_n, GROUP_M)
        local_rows = tile_rows(pid_m, BLOCK_M)
        rows = owner * M_LOCAL + local_rows
        row_mask = local_rows < M_LOCAL
        cols = tile_cols(pid_n, BLOCK_N)
        # With descriptors, rows past the chunk are computed (they belong to the next chunk) but never stored.
        acc = tile_product(a_op, b_op, owner * M_LOCAL + pid_m * BLOCK_M, pid_n * BLOCK_N, rows, row_mask, cols, N,
                           K, stride_am, stride_ak, stride_bk, stride_bn, USE_TMA, PRECISION, BLOCK_M, BLOCK_N,
                           BLOCK_K)
        mask = row_mask[:, None] & (cols[None, :] < N)
        out_ptrs = out + local_rows[:, None] * stride_om + cols[None, :] * stride_on
        if world_size == 1:
            tl.store(out_ptrs, round_to(add_bias(acc, bias, cols, N, HAS_BIAS), out.dtype.element_ty), mask=mask)
        else:
            record = locks + t * LOCK_WORDS_C
            epoch = next_epoch(record + EPOCH)
            partial_ptrs = partial + rows[:, None] * N + cols[None, :]
            tile = Tile(pid_m, pid_n, BLOCK_M, BLOCK_N, acc)
            if owner == rank:  # a run-time branch: owner and rank are run-time values
                wait_at_least(record + ARRIVE, epoch * (world_size - 1), CALL_C, "ready", rank, -1, t,
                              ctx.heap_bases, record + EPOCH)
                total = _sum_in_rank_order(ctx, tile, partial_ptrs, mask, partial.dtype.element_ty)
                total = add_bias(total, bias, cols, N, HAS_BIAS)  # once, after the sum
                tl.store(out_ptrs, round_to(total, out.dtype.element_ty), mask=mask)
                signal_all(record + DONE, rank, world_size, ctx.heap_bases)
            else:
                _hand_to_owner(ctx, tile, owner, record, epoch, partial_ptrs, mask)
    call_check(ctx.heap_bases, call_fp, entered, rank, world_size)



def matmul_reduce_scatter(ctx, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                          bias: torch.Tensor | None = None, config=None, group=None) -> torch.Tensor:
    """``out = reduce_scatter(a @ b, dim 0) + bias``: rank ``r`` gets rows ``[r * M / W, (r + 1) * M / W)``
    of the sum over ranks of ``a @ b``; returns ``out``.

    ``a`` is ``[M, K_local]``, ``b`` ``[K_local, N]``, ``out`` ``[M / W, N]`` (``W`` must divide
    ``M``), ``bias`` an optional ``[N]`` added once after the sum. fp32 accumulation, one rounding
    to ``out.dtype``. Collective; enqueued on torch's current stream; no barrier between calls.
    ``group``: an :class:`iris.runtime.Group` of the context to run among its members only (``W``
    and ranks are the group's); None: every rank.
    """
    if group is not None:
        ctx = on_group(ctx, group, CALL)
    if is_compiling():
        return traced().fused("matmul_reduce_scatter", ctx, out, a, b, bias, config=config)
    check_inputs(CALL, ctx, out, a, b, bias)
    M, N, K = a.shape[0], b.shape[1], a.shape[1]
    m_local = check_rows_divide(CALL, "a", M, ctx.world_size)
    check_matrix(CALL, "out", out, (m_local, N))
    cfg = choose("matmul_reduce_scatter", M, N, K, ctx.world_size, ctx.device.type, config, a.element_size())
    fp = agree_fused(ctx, CALL, (M, N, K, a.dtype, out.dtype, bias is not None and bias.dtype, cfg),
                     (("out", out), ("a", a), ("b", b), ("bias", bias)), config=config, chosen=cfg)
    key = ("matmul_reduce_scatter", M, N, K, a.dtype, out.dtype, ctx.world_size, cfg)
    if cfg.variant == "unfused":
        unfused(ctx, key + (out.is_contiguous(),), out, a, b, bias, cfg, scatter=True)
        return out
    if cfg.variant == "rotated" and ctx.world_size > 1:
        rotated(CALL, ctx, key, out, a, b, bias, cfg, gather=False, fp=fp)
        return out
    num_tiles = ctx.world_size * _host.num_tiles(m_local, N, cfg.block_m, cfg.block_n)

    def make(ctx):
        return {"partial": ctx.zeros(M, N, dtype=accumulator_dtype(a.dtype)),
                "locks": ctx.zeros(num_tiles * _host.LOCK_WORDS, dtype=torch.int32)}

    ws = workspace(ctx, key, make)
    b, use_tma = b_operand(cfg, b, a)
    args = (ctx.get_device_context(), a, b, bias if bias is not None else a, ws.buffers["partial"], out,
            ws.buffers["locks"], M, N, K, m_local, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            out.stride(0), out.stride(1), fp, ctx.rank)
    constexprs = dict(world_size=ctx.world_size, HAS_BIAS=bias is not None,
                      USE_TMA=use_tma, PRECISION=cfg.input_precision, BLOCK_M=cfg.block_m,
                      BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m)
    launch(ctx, ws, _matmul_reduce_scatter_kernel, num_tiles, cfg, args, constexprs)
    return out


def rotated(call: str, ctx, key: tuple, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias, cfg,
            gather: bool, fp: int = 0) -> None:
    """Launch strategy ``rotated`` (``ops._rotated``) of ``matmul_reduce_scatter`` (``out`` is
    ``[M / W, N]``) or, with ``gather``, of ``matmul_all_reduce`` (``out`` is ``[M, N]``); ``fp``:
    the fingerprint of the agreed call."""
    M, N, K = a.shape[0], b.shape[1], a.shape[1]
    m_local = M // ctx.world_size
    per_chunk = _host.num_tiles(m_local, N, cfg.block_m, cfg.block_n)  # more programs would idle
    staged = a.dtype if cfg.partial_dtype == "input" else accumulator_dtype(a.dtype)
    ws = workspace(ctx, key, lambda ctx: rotated_buffers(ctx, M, N, staged, out.dtype, per_chunk, gather))
    b, use_tma = b_operand(cfg, b, a)
    args = (ctx.get_device_context(), a, b, bias if bias is not None else a, ws.buffers["partial"],
            ws.buffers.get("gathered", ws.buffers["partial"]), out, ws.buffers["flags"], M, N, K, m_local, a.stride(0),
            a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1), fp, ctx.rank)
    constexprs = dict(call=call, world_size=ctx.world_size, RECORD=record_words(ctx.world_size),
                      GATHER=gather, HAS_BIAS=bias is not None, USE_TMA=use_tma,
                      PRECISION=cfg.input_precision, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                      GROUP_M=cfg.group_m)
    launch(ctx, ws, rotated_kernel, per_chunk, cfg, args, constexprs)
