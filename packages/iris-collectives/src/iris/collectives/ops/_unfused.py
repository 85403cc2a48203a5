"""Strategy ``unfused`` of the ops that reduce: torch's GEMM (cuBLAS on the GPU) writes this rank's
partial product into a heap buffer, then the host collective (:mod:`iris.collectives.ccl`) sums the
partials in place on the heap, with no staging.

Why a strategy that does not fuse: with every rank on one GPU, the partial products' traffic is
HBM traffic of the same chip, and in the fused kernels the warps that run the MMAs also issue it,
so it adds to the GEMM instead of hiding behind it (docs/fused-ops.md). Then cuBLAS followed by a
collective that runs at its floor can take less time than the fused kernel. Which is faster
depends on the world size and the shape; ``benchmarks/fused_ops.py --variants unfused`` measures
it. With fp32 partials (the default) the fused ``rotated`` stayed faster on one H200, so
:data:`iris.collectives.ops.DEFAULTS` keeps it; with partials in the inputs' dtype this one was
faster, and ``Config(partial_dtype="input")`` picks it on the GPU (``_config.INPUT_PARTIALS``).

The promises of the fused strategies hold: each rank's partial product is exact in fp32 (or, with
``partial_dtype="input"``, rounded once to the inputs' dtype, as strategy ``rotated`` does), rank
0's partial holds the bias, ``ccl`` sums in rank order in fp32 and the result is rounded once, so
every rank gets the same bits. fp32 inputs go through torch's matmul, whose TF32 use is torch's
setting (``torch.backends.cuda.matmul``), not ``Config.input_precision``.
"""

from __future__ import annotations

import torch

from .. import ccl
from .._workspace import workspace
from ._launch import accumulator_dtype


def partial_product(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, partial: torch.Tensor,
                    rounded: bool) -> None:
    """``partial = a @ b (+ bias)``: rounded once to the inputs' dtype (``rounded``, in torch's GEMM
    epilogue; then widened exactly if ``partial`` is wider), else the exact fp32 (fp64) product of
    cuBLAS's accumulation (``torch.mm(..., out_dtype=)`` where torch has it for the device, else the
    inputs widened, which gives the same values)."""
    if rounded or partial.dtype == a.dtype:
        into = partial if partial.dtype == a.dtype else torch.empty_like(partial, dtype=a.dtype)
        if bias is None:
            torch.matmul(a, b, out=into)
        else:
            torch.addmm(bias.to(a.dtype), a, b, out=into)
        if into is not partial:
            partial.copy_(into)
        return
    try:
        torch.mm(a, b, out_dtype=partial.dtype, out=partial)
    except (RuntimeError, TypeError, NotImplementedError):  # no mm.dtype for this device or torch
        torch.matmul(a.to(partial.dtype), b.to(partial.dtype), out=partial)
    if bias is not None:
        partial.add_(bias.to(partial.dtype))


def unfused(ctx, key: tuple, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, cfg,
            scatter: bool) -> None:
    """``out = reduce_scatter(a @ b) + bias`` (``scatter``) or ``all_reduce(a @ b) + bias``, the
    GEMM by torch into a heap buffer (cached in the workspace of ``key``) and the sum by ``ccl``
    in place on the heap. Checks are the caller's. The bias is where the fused strategies put it:
    in rank 0's partial for the all-reduce, after the sum for the reduce-scatter."""
    M, N = a.shape[0], b.shape[1]
    rounded = cfg.partial_dtype == "input" and ctx.world_size > 1  # one rank hands nothing over
    late_bias = bias if scatter else None
    # the sum runs in the partials' dtype and rounds once to it: the inputs' dtype only when that
    # is also the output's and no bias follows the sum, else the accumulator's (a rounded partial
    # widens exactly)
    narrow = rounded and out.dtype == a.dtype and late_bias is None
    dtype = a.dtype if narrow else accumulator_dtype(a.dtype)
    rows = M // ctx.world_size if scatter else M

    def make(ctx):
        buffers = {"partial": ctx.zeros(M, N, dtype=dtype)}
        if dtype != out.dtype or not out.is_contiguous():
            buffers["result"] = ctx.zeros(rows, N, dtype=dtype)
        return buffers

    ws = workspace(ctx, key + (bias is not None,), make)
    partial, result = ws.buffers["partial"], ws.buffers.get("result")
    partial_product(a, b, bias if ctx.rank == 0 and not scatter else None, partial, rounded)
    target = out if result is None else result
    if scatter:
        ccl.reduce_scatter(ctx, target, partial)
    else:
        ccl.all_reduce(ctx, target, partial)
    if late_bias is not None:
        target.add_(late_bias.to(target.dtype))  # in the accumulator's dtype, before the rounding
    if result is not None:
        out.copy_(result)  # the single rounding, to nearest even
