"""``matmul_all_reduce``: ``out = all_reduce(a @ b) + bias``, K split over the ranks.

Strategy ``one_shot`` / ``two_shot`` (the fused "reduce each tile right after computing it"): each
program computes an output tile of this rank's partial product in fp32 (rank 0's partial
includes the bias), publishes it to an fp32 staging buffer on the heap and hands it to
:func:`iris.collectives.all_reduce_one_shot` (every rank reads every rank's tile and sums; the
result goes straight into ``out``) or :func:`iris.collectives.all_reduce_two_shot` (each rank sums
a share of the tile's rows and writes it to every rank: less traffic, but ``out`` must be on the
heap, else a heap copy of it is written and copied out). Both sum in rank order in fp32 and
round once, so every rank gets bit-identical results; their lock records count calls, so
back-to-back calls need no barrier.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from iris.device import round_to
from iris.device._calls import call_check, call_enter

from .. import _host
from .._agree import agree_fused, out_place
from .._all_reduce import all_reduce_one_shot, all_reduce_two_shot
from .._compiling import is_compiling, traced
from .._context import RuntimeRankContext
from .._views import TensorView, Tile
from .._workspace import workspace
from ..ccl._groups import on_group
from ._checks import check_inputs, check_matrix
from ._config import choose
from ._gemm import add_bias, gemm_operands, grouped_tile, tile_cols, tile_product, tile_rows
from ._launch import accumulator_dtype, b_operand, launch
from ._matmul_reduce_scatter import rotated
from ._unfused import unfused

CALL = "iris.collectives.ops.matmul_all_reduce"


@triton.jit(do_not_specialize=["call_fp", "rank"])
def _matmul_all_reduce_kernel(context, a, b, bias, partial, out, locks, M, N, K, stride_am, stride_ak, stride_bk,
                              stride_bn, stride_om, stride_on, call_fp, rank, world_size: tl.constexpr,
                              TWO_SHOT: tl.constexpr, HAS_BIAS: tl.constexpr, USE_TMA: tl.constexpr,
                              PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """Persistent: program ``p`` computes tiles ``p, p + P, ...`` (grouped order, the same on every
    rank) of ``a @ b`` and all-reduces each one at once. ``partial`` (fp32, M x N, contiguous) is
    the heap staging the peers read; ``out`` is where the sum goes (on the heap for two-shot)."""
    ctx = RuntimeRankContext.initialize(context, rank, world_size)
    entered = call_enter(ctx.heap_bases, call_fp, rank, world_size)
    src = TensorView(partial, M, N, N, 1)
    dst = TensorView(out, M, N, stride_om, stride_on)
    tiles_m = (M + BLOCK_M - 1) // BLOCK_M
    tiles_n = (N + BLOCK_N - 1) // BLOCK_N
    a_op, b_op = gemm_operands(a, M, K, stride_am, b, N, stride_bk, stride_bn, USE_TMA, BLOCK_M, BLOCK_N, BLOCK_K)
    for t in range(tl.program_id(0), tiles_m * tiles_n, tl.num_programs(0)):
        pid_m, pid_n = grouped_tile(t, tiles_m, tiles_n, GROUP_M)
        rows = tile_rows(pid_m, BLOCK_M)
        cols = tile_cols(pid_n, BLOCK_N)
        acc = tile_product(a_op, b_op, pid_m * BLOCK_M, pid_n * BLOCK_N, rows, rows < M, cols, N, K, stride_am,
                           stride_ak, stride_bk, stride_bn, USE_TMA, PRECISION, BLOCK_M, BLOCK_N, BLOCK_K)
        if rank == 0:  # a run-time branch (ops._gemm.add_bias_if spilled more here, not less)
            # The bias joins the sum once, in fp32, before the single rounding.
            acc = add_bias(acc, bias, cols, N, HAS_BIAS)
        tile = Tile(pid_m, pid_n, BLOCK_M, BLOCK_N, acc)
        if world_size == 1:
            dst.store(tile, round_to(acc, out.dtype.element_ty))
        else:
            # Publish the tile where peers read it; the collective's signal orders these stores
            # (its CTA barrier, then a system-scope release) before any peer's loads.
            src.store(tile, acc)
            if TWO_SHOT:
                all_reduce_two_shot(ctx, tile, src, dst, locks)
            else:
                all_reduce_one_shot(ctx, tile, src, dst, locks)
    call_check(ctx.heap_bases, call_fp, entered, rank, world_size)


def matmul_all_reduce(ctx, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
                      config=None, group=None) -> torch.Tensor:
    """``out = all_reduce(a @ b) + bias`` on every rank; returns ``out``.

    ``a`` is ``[M, K_local]`` and ``b`` ``[K_local, N]`` (this rank's share of the inner
    dimension), ``out`` ``[M, N]`` on every rank, ``bias`` an optional ``[N]`` added once. Inputs
    are fp32 (tf32 unless ``Config(input_precision="ieee")``), fp16, bf16 or fp64; the product and
    the sum accumulate in fp32 (fp64 for fp64) and are rounded once to ``out.dtype``. Ordinary torch
    tensors work;
    what peers must reach is staged on the symmetric heap in a cached workspace (two-shot writes
    into ``out`` in place when it is on the heap: then it must be on the heap on every rank, the
    same allocation, as for any symmetric tensor). Collective:
    every rank calls it with the same shapes and config. Enqueued on torch's current stream; no
    host barrier is needed between calls.
    ``group``: an :class:`iris.runtime.Group` of the context to run among its members only (``W``
    and ranks are the group's); None: every rank.
    """
    if group is not None:
        ctx = on_group(ctx, group, CALL)
    if is_compiling():
        return traced().fused("matmul_all_reduce", ctx, out, a, b, bias, config=config)
    check_inputs(CALL, ctx, out, a, b, bias)
    M, N, K = a.shape[0], b.shape[1], a.shape[1]
    check_matrix(CALL, "out", out, (M, N))
    cfg = choose("matmul_all_reduce", M, N, K, ctx.world_size, ctx.device.type, config, a.element_size())
    # the chosen config follows torch's fp32 setting; out's place decides two-shot's workspace, whose
    # peers write into out where it is
    placed = out_place(ctx, out) if cfg.variant == "two_shot" and ctx.world_size > 1 else None
    fp = agree_fused(ctx, CALL, (M, N, K, a.dtype, out.dtype, bias is not None and bias.dtype, cfg, placed),
                     (("out", out), ("a", a), ("b", b), ("bias", bias)), config=config, chosen=cfg,
                     **({} if placed is None else {"out_place": placed}))
    if cfg.variant == "unfused":
        key = ("matmul_all_reduce", M, N, K, a.dtype, out.dtype, ctx.world_size, cfg, out.is_contiguous())
        unfused(ctx, key, out, a, b, bias, cfg, scatter=False)
        return out
    if cfg.variant == "rotated" and ctx.world_size > 1 and M % ctx.world_size == 0:
        rotated(CALL, ctx, ("matmul_all_reduce", M, N, K, a.dtype, out.dtype, ctx.world_size, cfg), out, a, b, bias,
                cfg, gather=True, fp=fp)
        return out
    two_shot = cfg.variant == "two_shot" and ctx.world_size > 1
    out_on_heap = ctx.is_symmetric(out)
    key = ("matmul_all_reduce", M, N, K, a.dtype, out.dtype, ctx.world_size, cfg, two_shot and not out_on_heap)

    def make(ctx):
        buffers = {"partial": ctx.zeros(M, N, dtype=accumulator_dtype(a.dtype)),
                   "locks": ctx.zeros(_host.lock_words(M, N, cfg.block_m, cfg.block_n), dtype=torch.int32)}
        if two_shot and not out_on_heap:
            buffers["out"] = ctx.zeros(M, N, dtype=out.dtype)
        return buffers

    ws = workspace(ctx, key, make)
    dst = ws.buffers.get("out", out)
    b, use_tma = b_operand(cfg, b, a)
    args = (ctx.get_device_context(), a, b, bias if bias is not None else a, ws.buffers["partial"], dst,
            ws.buffers["locks"], M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), dst.stride(0),
            dst.stride(1), fp, ctx.rank)
    constexprs = dict(world_size=ctx.world_size, TWO_SHOT=two_shot, HAS_BIAS=bias is not None,
                      USE_TMA=use_tma, PRECISION=cfg.input_precision, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                      BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m)
    launch(ctx, ws, _matmul_all_reduce_kernel, _host.num_tiles(M, N, cfg.block_m, cfg.block_n), cfg, args,
           constexprs)
    if dst is not out:
        out.copy_(dst)
    return out
