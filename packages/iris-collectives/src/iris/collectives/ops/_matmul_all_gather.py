"""``matmul_all_gather``: ``out = all_gather(a @ b + bias, dim 0)``.

Strategy ``push``: each program computes a tile of this rank's ``[M / W, N]`` block, writes it
into its own rows of ``out`` and pushes it, rounded once to ``out.dtype``, into every rank's
heap staging buffer with :func:`iris.collectives.all_gather`; a
:func:`iris.collectives.device_barrier` on the tile's slot then says that every rank's tile is
there, and the program copies the peers' rows of the tile from its staging into ``out``.

The staging buffer is double-buffered by the slot's call counter (``epoch % 2``, a device-side
count, never the host's): a rank one call ahead pushes into the other half, and it cannot get two
calls ahead, because the barrier of its next call waits for this rank, which arrives only after
copying this call's rows out. So calls need no host barrier, and ``out`` may be any tensor.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from iris.device import round_to
from iris.device._calls import call_check, call_enter

from .. import _host
from .._agree import agree_fused
from .._compiling import is_compiling, traced
from .._context import RuntimeRankContext
from .._gather import all_gather
from .._sync import BARRIER_WORDS_C, device_barrier, next_epoch
from .._views import TensorView, Tile
from .._workspace import workspace
from ..ccl._groups import on_group
from ._checks import check_inputs, check_matrix
from ._config import choose
from ._gemm import add_bias, gemm_operands, grouped_tile, tile_cols, tile_product, tile_rows
from ._launch import b_operand, launch
from ._unfused import unfused_gather

CALL = "iris.collectives.ops.matmul_all_gather"


@triton.jit
def _copy_peer_rows(ctx, staged, out, local_rows, cols, M_LOCAL, N, stride_om, stride_on):
    """Copy every peer's rows of the tile (``peer * M_LOCAL + local_rows``) from this rank's
    staging (``M x N`` contiguous) into ``out``. Per program; weak loads and stores, after the
    barrier that acquired the peers' pushes."""
    mask = (local_rows[:, None] < M_LOCAL) & (cols[None, :] < N)
    for i in tl.static_range(1, ctx.world_size):
        rows = ((ctx.rank + i) % ctx.world_size) * M_LOCAL + local_rows
        values = tl.load(staged + rows[:, None] * N + cols[None, :], mask=mask)
        tl.store(out + rows[:, None] * stride_om + cols[None, :] * stride_on, values, mask=mask)


@triton.jit(do_not_specialize=["call_fp", "rank"])
def _matmul_all_gather_kernel(context, a, b, bias, staging, out, flags, M, N, K, M_LOCAL, stride_am, stride_ak,
                              stride_bk, stride_bn, stride_om, stride_on, call_fp, rank, world_size: tl.constexpr,
                              HAS_BIAS: tl.constexpr, USE_TMA: tl.constexpr, PRECISION: tl.constexpr,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                              GROUP_M: tl.constexpr):
    """Persistent: program ``p`` computes tiles ``p, p + P, ...`` of this rank's ``M_LOCAL x N``
    block (grouped order, the same on every rank) and gathers each at once. ``staging``: two
    halves of ``M x N`` (``out``'s dtype, contiguous) on the heap; ``flags``: one barrier slot per
    tile."""
    ctx = RuntimeRankContext.initialize(context, rank, world_size)
    entered = call_enter(ctx.heap_bases, call_fp, rank, world_size)
    tiles_m = (M_LOCAL + BLOCK_M - 1) // BLOCK_M
    tiles_n = (N + BLOCK_N - 1) // BLOCK_N
    a_op, b_op = gemm_operands(a, M_LOCAL, K, stride_am, b, N, stride_bk, stride_bn, USE_TMA, BLOCK_M, BLOCK_N, BLOCK_K)
    for t in range(tl.program_id(0), tiles_m * tiles_n, tl.num_programs(0)):
        pid_m, pid_n = grouped_tile(t, tiles_m, tiles_n, GROUP_M)
        local_rows = tile_rows(pid_m, BLOCK_M)
        cols = tile_cols(pid_n, BLOCK_N)
        acc = tile_product(a_op, b_op, pid_m * BLOCK_M, pid_n * BLOCK_N, local_rows, local_rows < M_LOCAL, cols, N,
                           K, stride_am, stride_ak, stride_bk, stride_bn, USE_TMA, PRECISION, BLOCK_M, BLOCK_N,
                           BLOCK_K)
        result = round_to(add_bias(acc, bias, cols, N, HAS_BIAS), out.dtype.element_ty)
        own_rows = rank * M_LOCAL + local_rows
        mask = (local_rows[:, None] < M_LOCAL) & (cols[None, :] < N)
        tl.store(out + own_rows[:, None] * stride_om + cols[None, :] * stride_on, result, mask=mask)
        if world_size > 1:
            slot = flags + t * BARRIER_WORDS_C
            epoch = next_epoch(slot + 1)
            staged = staging + (epoch % 2) * M * N
            all_gather(ctx, Tile(pid_m, pid_n, BLOCK_M, BLOCK_N, result), TensorView(staged, M, N, N, 1), 0)
            device_barrier(ctx, slot, epoch)
            _copy_peer_rows(ctx, staged, out, local_rows, cols, M_LOCAL, N, stride_om, stride_on)
    call_check(ctx.heap_bases, call_fp, entered, rank, world_size)


def matmul_all_gather(ctx, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
                      config=None, group=None) -> torch.Tensor:
    """``out = all_gather(a @ b + bias, dim 0)`` on every rank; returns ``out``.

    ``a`` is this rank's ``[M / W, K]`` rows, ``b`` ``[K, N]``, ``out`` ``[M, N]`` (rank ``r``'s
    product in rows ``[r * M / W, (r + 1) * M / W)``), ``bias`` an optional ``[N]``. fp32
    accumulation, one rounding to ``out.dtype``. Collective; enqueued on torch's current stream;
    no barrier between calls.
    ``group``: an :class:`iris.runtime.Group` of the context to run among its members only (``W``
    and ranks are the group's); None: every rank.
    """
    if group is not None:
        ctx = on_group(ctx, group, CALL)
    if is_compiling():
        return traced().fused("matmul_all_gather", ctx, out, a, b, bias, config=config)
    check_inputs(CALL, ctx, out, a, b, bias)
    m_local, N, K = a.shape[0], b.shape[1], a.shape[1]
    M = m_local * ctx.world_size
    check_matrix(CALL, "out", out, (M, N))
    cfg = choose("matmul_all_gather", M, N, K, ctx.world_size, ctx.device.type, config, a.element_size())
    fp = agree_fused(ctx, CALL, (M, N, K, a.dtype, out.dtype, bias is not None and bias.dtype, cfg),
                     (("out", out), ("a", a), ("b", b), ("bias", bias)), config=config, chosen=cfg)
    key = ("matmul_all_gather", M, N, K, a.dtype, out.dtype, ctx.world_size, cfg)
    if cfg.variant == "unfused":
        unfused_gather(ctx, key, out, a, b, bias, gather_first=False)
        return out
    num_tiles = _host.num_tiles(m_local, N, cfg.block_m, cfg.block_n)

    def make(ctx):
        return {"staging": ctx.zeros(2, M, N, dtype=out.dtype),
                "flags": ctx.zeros(_host.barrier_words(num_tiles), dtype=torch.int32)}

    ws = workspace(ctx, key, make)
    b, use_tma = b_operand(cfg, b, a)
    args = (ctx.get_device_context(), a, b, bias if bias is not None else a, ws.buffers["staging"], out,
            ws.buffers["flags"], M, N, K, m_local, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
            out.stride(1), fp, ctx.rank)
    constexprs = dict(world_size=ctx.world_size, HAS_BIAS=bias is not None,
                      USE_TMA=use_tma, PRECISION=cfg.input_precision, BLOCK_M=cfg.block_m,
                      BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m)
    launch(ctx, ws, _matmul_all_gather_kernel, num_tiles, cfg, args, constexprs)
    return out
