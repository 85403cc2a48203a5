"""Argument checks of :func:`iris.collectives.ops.all_reduce_residual_rmsnorm`, run when a call's
key is new (the key then proves them for later calls): every failure is an ``IrisError`` naming the
call, the argument, the values and the fix, raised before any allocation or launch, so every rank
raises alike."""

from __future__ import annotations

import math

import torch

from iris.device import interpreter_enabled
from iris.runtime import IrisUsageError, UnsupportedDtypeError

from .._all_reduce_norm import NO_SCALE, ROW_SCALES, TENSOR_SCALE
from ..ccl._checks import check_tensor, overlap

#: Element types of the activations (``partial``, ``residual``, ``residual_out``) and of ``weight``.
FLOATS = (torch.float32, torch.float16, torch.bfloat16)
#: The quantised output's type (fp8 e4m3, the variant with no infinities: torch.float8_e4m3fn).
FP8 = torch.float8_e4m3fn
#: The widest row (``hidden``) a tile holds: each program keeps whole rows in registers.
MAX_HIDDEN = 65536


def _like(call: str, ctx, name: str, t, partial: torch.Tensor, dtypes=None) -> None:
    """``t`` is a contiguous tensor on the context's device with ``partial``'s shape, and its dtype
    (or, with ``dtypes``, one of those)."""
    check_tensor(call, ctx, name, t, dtypes or FLOATS)
    if t.shape != partial.shape:
        raise IrisUsageError(f"{call}: {name} has shape {tuple(t.shape)} but partial {tuple(partial.shape)}; pass "
                             f"a {name} of partial's shape")
    if dtypes is None and t.dtype != partial.dtype:
        raise UnsupportedDtypeError(f"{call}: {name} is {t.dtype} but partial is {partial.dtype}; pass both in one "
                                    f"dtype")


def _disjoint(call: str, tensors: dict, allowed=()) -> None:
    """No two of ``tensors`` (name -> tensor or None) overlap, but the pairs of ``allowed`` may be
    the very same memory."""
    named = [(k, t) for k, t in tensors.items() if t is not None]
    for i, (a, ta) in enumerate(named):
        for b, tb in named[i + 1:]:
            same = ta.data_ptr() == tb.data_ptr() and ta.numel() == tb.numel() and ta.dtype == tb.dtype
            if overlap(ta, tb) and not ((a, b) in allowed and same):
                in_place = f" (or {b}={a}, in place)" if (a, b) in allowed else ""
                fix = f"pass {a} and {b} that do not overlap{in_place}"
                raise IrisUsageError(f"{call}: {a} and {b} overlap in memory ({a} at {ta.data_ptr():#x}, "
                                     f"{ta.numel()} elements; {b} at {tb.data_ptr():#x}, {tb.numel()}); {fix}")


def check_call(call: str, ctx, out, residual_out, partial, residual, weight, eps, scale) -> int:
    """Every check of a call; returns its quantisation (``_all_reduce_norm.NO_SCALE``,
    ``ROW_SCALES`` or ``TENSOR_SCALE``)."""
    check_tensor(call, ctx, "partial", partial, FLOATS)
    if partial.dim() == 0:
        raise IrisUsageError(f"{call}: partial is a scalar; pass rows of activations, shape [..., hidden]")
    hidden = partial.shape[-1]
    if hidden > MAX_HIDDEN:
        raise IrisUsageError(f"{call}: partial has hidden size {hidden} (its last dimension); a tile holds whole "
                             f"rows, at most {MAX_HIDDEN} values: normalise wider rows with ccl.all_reduce and "
                             f"torch.nn.functional.rms_norm")
    if residual is not None:
        _like(call, ctx, "residual", residual, partial)
    if residual_out is not None:
        _like(call, ctx, "residual_out", residual_out, partial)
    check_tensor(call, ctx, "weight", weight, FLOATS)
    if tuple(weight.shape) != (hidden,):
        raise IrisUsageError(f"{call}: weight has shape {tuple(weight.shape)}; pass one weight per column of the "
                             f"rows, shape ({hidden},)")
    _like(call, ctx, "out", out, partial, (*FLOATS, FP8))
    if out.dtype not in (partial.dtype, FP8):
        raise UnsupportedDtypeError(f"{call}: out is {out.dtype} but partial is {partial.dtype}; pass an out of "
                                    f"partial's dtype, or torch.float8_e4m3fn (with scale=) for fp8")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise IrisUsageError(f"{call}: eps={eps!r} must be a finite float >= 0 (the norm's epsilon, e.g. 1e-6)")
    quant = _check_scale(call, ctx, out, partial, scale)
    _disjoint(call, {"partial": partial, "residual": residual, "weight": weight, "residual_out": residual_out,
                     "scale": scale, "out": out}, allowed={("residual", "residual_out")})
    return quant


def _check_scale(call: str, ctx, out, partial, scale) -> int:
    if out.dtype != FP8:
        if scale is not None:
            raise IrisUsageError(f"{call}: scale= is for an fp8 out (torch.float8_e4m3fn); out is {out.dtype}: "
                                 f"drop scale, or pass an fp8 out")
        return NO_SCALE.value
    if interpreter_enabled():
        raise UnsupportedDtypeError(
            f"{call}: an fp8 out (torch.float8_e4m3fn) runs on the GPU only: Triton's interpreter, which runs the "
            f"kernels of the cpu backend, converts fp32 to e4m3 wrongly (subnormals flushed to zero, values that "
            f"round up to a power of two halved); pass an out of partial's dtype ({partial.dtype}) there, and "
            f"quantise with torch")
    if scale is None:
        raise IrisUsageError(f"{call}: an fp8 out needs scale=: a float32 tensor of shape () or (1,) holding the "
                             f"per-tensor scale the call divides by, or of shape "
                             f"{tuple(partial.shape[:-1]) + (1,)} where it writes each row's scale")
    check_tensor(call, ctx, "scale", scale, (torch.float32,))
    if tuple(scale.shape) in ((), (1,)):
        return TENSOR_SCALE.value
    if partial.dim() >= 2 and scale.shape == partial.shape[:-1] + (1,):
        return ROW_SCALES.value
    raise IrisUsageError(f"{call}: scale has shape {tuple(scale.shape)}; pass shape () or (1,) for a per-tensor "
                         f"scale, or {tuple(partial.shape[:-1]) + (1,)} (partial at least 2-D) for one per row")
