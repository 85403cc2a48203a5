"""The GEMM core alone, ``out = a @ b + bias``, with no communication and no host context.

It is what every fused op computes before it communicates, as its own kernel: the compute floor
the benchmark (``benchmarks/fused_ops.py --gemm-only``) holds against ``torch.matmul``. Private:
users call ``torch.matmul`` for a plain GEMM.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from iris.device import round_to

from ._checks import check_inputs, check_matrix
from ._config import choose
from ._gemm import add_bias, gemm_operands, grouped_tile, row_major_descriptor, tile_cols, tile_product, tile_rows
from ._launch import TMA_OFF, b_operand, tma_ok

CALL = "iris.collectives.ops._matmul.matmul"


@triton.jit
def _matmul_kernel(a, b, bias, out, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_om, stride_on,
                   HAS_BIAS: tl.constexpr, USE_TMA: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, FLATTEN: tl.constexpr,
                   TMA_STORE: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    """Persistent GEMM: program ``p`` computes tiles ``p, p + P, ...`` in the grouped order.
    ``FLATTEN``, ``WARP_SPECIALIZE``: see ``Config``; ``TMA_STORE``: the epilogue stores through a
    tensor descriptor of ``out`` (GPU, 16-byte aligned rows)."""
    tiles_m = (M + BLOCK_M - 1) // BLOCK_M
    tiles_n = (N + BLOCK_N - 1) // BLOCK_N
    a_op, b_op = gemm_operands(a, M, K, stride_am, b, N, stride_bk, stride_bn, USE_TMA, BLOCK_M, BLOCK_N, BLOCK_K)
    if TMA_STORE:
        out_desc = row_major_descriptor(out, M, N, stride_om, BLOCK_M, BLOCK_N)
    for t in tl.range(tl.program_id(0), tiles_m * tiles_n, tl.num_programs(0), flatten=FLATTEN):
        pid_m, pid_n = grouped_tile(t, tiles_m, tiles_n, GROUP_M)
        rows = tile_rows(pid_m, BLOCK_M)
        cols = tile_cols(pid_n, BLOCK_N)
        acc = tile_product(a_op, b_op, pid_m * BLOCK_M, pid_n * BLOCK_N, rows, rows < M, cols, N, K, stride_am,
                           stride_ak, stride_bk, stride_bn, USE_TMA, PRECISION, BLOCK_M, BLOCK_N, BLOCK_K,
                           WARP_SPECIALIZE)
        acc = add_bias(acc, bias, cols, N, HAS_BIAS)
        if TMA_STORE:
            out_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], round_to(acc, out.dtype.element_ty))
        else:
            mask = (rows[:, None] < M) & (cols[None, :] < N)
            tl.store(out + rows[:, None] * stride_om + cols[None, :] * stride_on,
                     round_to(acc, out.dtype.element_ty), mask=mask)


class _DeviceOnly(NamedTuple):
    """What ``check_inputs`` reads of a context (its device), for a call that has none."""

    device: torch.device


def matmul(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, config=None,
           programs: int | None = None, tma_store: bool = False) -> torch.Tensor:
    """``out = a @ b + bias`` with the fused ops' GEMM core, on torch's current stream. ``programs``:
    the persistent grid (default: one program per tile on the cpu backend; on a GPU 2 per SM, or 1
    per SM when warp-specialised). The config defaults to the fused ops' (``Config``)."""

    check_inputs(CALL, _DeviceOnly(a.device), out, a, b, bias)
    M, N, K = a.shape[0], b.shape[1], a.shape[1]
    check_matrix(CALL, "out", out, (M, N))
    cfg = choose("matmul_all_reduce", M, N, K, 1, a.device.type, config, a.element_size())
    # Under warp specialisation the tile goes out through a descriptor store: with the masked
    # pointer store, Triton 3.6's specialised kernel wrote wrong tiles on an H200 (docs/performance.md).
    b, use_tma = b_operand(cfg, b, a)
    out_tma = use_tma != TMA_OFF and tma_ok(cfg, out)
    warp_specialize = cfg.warp_specialize and out_tma
    tma_store = (tma_store or warp_specialize) and out_tma
    tiles = -(-M // cfg.block_m) * -(-N // cfg.block_n)
    if programs is None:
        programs = tiles
        if a.device.type == "cuda":
            # two programs per SM hide one's epilogue behind the other's loads; a specialised
            # program fills an SM alone (12 warps, ~210 KB of shared memory)
            per_sm = 1 if warp_specialize else 2
            programs = min(tiles, per_sm * torch.cuda.get_device_properties(a.device).multi_processor_count)
    _matmul_kernel[(programs,)](
        a, b, bias if bias is not None else a, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        out.stride(0), out.stride(1), HAS_BIAS=bias is not None, USE_TMA=use_tma,
        PRECISION=cfg.input_precision, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m, FLATTEN=cfg.flatten, TMA_STORE=tma_store, WARP_SPECIALIZE=warp_specialize,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out
