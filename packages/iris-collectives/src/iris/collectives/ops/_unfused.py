"""Strategy ``unfused``: torch's GEMM (cuBLAS on the GPU) and a host collective
(:mod:`iris.collectives.ccl`) one after the other. For the ops that reduce, the GEMM writes this
rank's partial product into a heap buffer and the collective sums the partials in place on the
heap, with no staging. ``all_gather_matmul`` gathers the shards of A, then multiplies;
``matmul_all_gather`` multiplies this rank's rows into a heap buffer, then gathers them.

Why a strategy that does not fuse: with every rank on one GPU, the partial products' traffic is
HBM traffic of the same chip, and in the fused kernels the warps that run the MMAs also issue it,
so it adds to the GEMM instead of hiding behind it (docs/fused-ops.md). Then cuBLAS followed by a
collective that runs at its floor can take less time than the fused kernel. Which is faster
depends on the world size and the shape; ``benchmarks/fused_ops.py --variants unfused`` measures
it. With fp32 partials (the default) the fused ``rotated`` stayed faster on one H200, so
:data:`iris.collectives.ops.DEFAULTS` keeps it; with partials in the inputs' dtype this one was
faster, and ``Config(partial_dtype="input")`` picks it on the GPU (``_config.INPUT_PARTIALS``).
fp32 inputs take it for every op when the call asks for torch's own fp32 precision, the default
(``_config.FP32_INPUTS``): it then multiplies exactly as asked, and in tf32 it was the faster for
every op, as the GEMM core in tf32 is slower than cuBLAS's.

The promises of the fused strategies hold: each rank's partial product is exact in fp32 (or, with
``partial_dtype="input"``, rounded once to the inputs' dtype, as strategy ``rotated`` does), rank
0's partial holds the bias, ``ccl`` sums in rank order in fp32 and the result is rounded once, so
every rank gets the same bits. fp32 inputs go through torch's matmul, whose tf32 use is torch's
setting (``torch.backends.cuda.matmul``), not ``Config.input_precision``: a call that names this
strategy and asks for another precision than torch's gets torch's.
"""

from __future__ import annotations

import torch

from .. import ccl
from .._workspace import workspace
from ._launch import accumulator_dtype

#: The collective of a workspace buffer that only the peers read: on the heap, at the same offset
#: on every rank (the workspaces are allocated collectively), so the peers read it in place with no
#: agreement per call (the host allgather that plain tensors from ``ccl.REGISTER_FROM`` bytes cost).
_IN_PLACE = ccl.Config(register=False)


def partial_product(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, partial: torch.Tensor,
                    rounded: bool) -> None:
    """``partial = a @ b (+ bias)``, rounded once: to the inputs' dtype where ``rounded`` (then
    widened exactly if ``partial`` is wider), else to ``partial``'s dtype (none where that is the
    accumulator's: the exact fp32, fp64 for fp64, product of cuBLAS's accumulation plus the bias).
    ``partial`` may have any float dtype and strides. The rounding is torch's GEMM epilogue where
    ``partial`` and the bias, if any, have the inputs' dtype; else the exact product plus the bias,
    rounded by a copy (rounding a bias of another dtype to the inputs' first would round twice).
    The exact product is ``torch.mm(..., out_dtype=)`` where torch has it for the device, else the
    product of the inputs widened, which gives the same values. fp16 and bf16 products rounded in
    the epilogue follow torch's settings for cuBLAS's reductions
    (``torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction`` and the fp16 one)."""
    narrow = rounded or partial.dtype == a.dtype
    if narrow and (bias is None or bias.dtype == a.dtype):
        into = partial if partial.dtype == a.dtype else torch.empty_like(partial, dtype=a.dtype)
        if bias is None:
            torch.matmul(a, b, out=into)
        else:
            torch.addmm(bias, a, b, out=into)
        if into is not partial:
            partial.copy_(into)
        return
    wide = accumulator_dtype(a.dtype)
    exact = partial if partial.dtype == wide and not rounded else torch.empty_like(partial, dtype=wide)
    try:
        torch.mm(a, b, out_dtype=exact.dtype, out=exact)
    except (RuntimeError, TypeError, NotImplementedError):  # no mm.dtype for this device or torch
        torch.matmul(a.to(exact.dtype), b.to(exact.dtype), out=exact)
    if bias is not None:
        exact.add_(bias.to(exact.dtype))
    if exact is not partial:
        # the single rounding, to nearest even (where rounded, to the inputs' dtype, then widened exactly)
        partial.copy_(exact.to(a.dtype) if rounded else exact)


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
        ccl.reduce_scatter(ctx, target, partial, config=_IN_PLACE)  # target is this rank's alone
    else:
        # the peers also write into target (two-shot): a plain out is better registered on the fly
        # (agreed per call from ccl.REGISTER_FROM bytes) than staged
        ccl.all_reduce(ctx, target, partial)
    if late_bias is not None:
        target.add_(late_bias.to(target.dtype))  # in the accumulator's dtype, before the rounding
    if result is not None:
        out.copy_(result)  # the single rounding, to nearest even


def unfused_gather(ctx, key: tuple, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None,
                   gather_first: bool, gathered: torch.Tensor | None = None) -> None:
    """``all_gather_matmul`` (``gather_first``): this rank's rows of A copied into a heap buffer,
    ``ccl.all_gather`` of every rank's into a cached buffer, then torch's GEMM of all of them into
    ``out`` (and, where ``gathered`` is given, a contiguous ``[M, K]`` tensor the caller keeps, a
    copy of the gathered rows: a new tensor per call would be a new address to ``ccl``, whose
    plans are cached by address, and a missed plan agrees with the peers on the host);
    ``matmul_all_gather``: torch's GEMM of this rank's rows into a heap buffer, then
    ``ccl.all_gather`` of them into ``out``. The peers read only the heap buffers, in place; the
    other buffers are this rank's alone (torch's memory). Buffers are cached in the workspace of
    ``key``; checks are the caller's. One rounding to ``out.dtype`` (:func:`partial_product`)."""
    W, N = ctx.world_size, b.shape[1]
    rows, K = a.shape

    def make(ctx):
        if gather_first:
            return {"shard": ctx.zeros(rows, K, dtype=a.dtype),
                    "a": torch.empty(W * rows, K, dtype=a.dtype, device=ctx.device)}
        buffers = {"rows": ctx.zeros(rows, N, dtype=out.dtype)}
        if not out.is_contiguous():  # ccl writes contiguous tensors
            buffers["gathered"] = torch.empty(W * rows, N, dtype=out.dtype, device=ctx.device)
        return buffers

    ws = workspace(ctx, key + (out.is_contiguous(),), make)
    if gather_first:
        shard, rows_of_all = ws.buffers["shard"], ws.buffers["a"]
        shard.copy_(a)  # stream-ordered: the last call's all_gather has read it (its kernel is before)
        ccl.all_gather(ctx, rows_of_all, shard, config=_IN_PLACE)
        if gathered is not None:
            gathered.copy_(rows_of_all)  # 2 M K bytes of local traffic, next to the GEMM's
        partial_product(rows_of_all, b, bias, out, rounded=False)
        return
    own = ws.buffers["rows"]
    partial_product(a, b, bias, own, rounded=False)
    target = ws.buffers.get("gathered", out)
    ccl.all_gather(ctx, target, own, config=_IN_PLACE)
    if target is not out:
        out.copy_(target)
