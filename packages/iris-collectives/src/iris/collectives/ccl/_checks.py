"""Argument checks of the host collectives, run when a call's key is new (the key then proves
them for later calls): every failure is an ``IrisError`` naming the call, the argument, the
values and the fix."""

from __future__ import annotations

import torch

from iris.runtime import IrisUsageError, UnsupportedDtypeError

#: Element types the host collectives move and reduce.
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64)
#: Reductions, by name, as the kernels' OP codes (iris.collectives._all_reduce.SUM ...).
OPS = {"sum": 0, "avg": 1, "max": 2, "min": 3, "prod": 4}


def check_op(call: str, op, dtype: torch.dtype) -> int:
    """The OP code of ``op``; ``avg`` of integers is refused (it would truncate)."""
    if op not in OPS:
        raise IrisUsageError(f"{call}: op={op!r} is not one of {tuple(OPS)}")
    if op == "avg" and not dtype.is_floating_point:
        raise IrisUsageError(f"{call}: op='avg' on {dtype} would truncate the mean; use a float dtype "
                             f"(e.g. t.float()) or op='sum' and divide yourself")
    return OPS[op]


def check_tensor(call: str, ctx, name: str, t, dtypes=DTYPES) -> None:
    """``t`` is a non-empty contiguous torch tensor of one of ``dtypes`` on the context's device."""
    if not isinstance(t, torch.Tensor):
        raise IrisUsageError(f"{call}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise UnsupportedDtypeError(f"{call}: {name} has dtype {t.dtype}; pass one of "
                                    f"{', '.join(str(d) for d in dtypes)} (convert with .to(...))")
    if t.device != ctx.device:
        raise IrisUsageError(f"{call}: {name} is on {t.device} but the Iris context runs on {ctx.device}; "
                             f"move it with .to({str(ctx.device)!r})")
    if not t.is_contiguous():
        raise IrisUsageError(f"{call}: {name} (shape {tuple(t.shape)}, strides {t.stride()}) is not contiguous; "
                             f"pass {name}.contiguous()")
    if t.numel() == 0:
        raise IrisUsageError(f"{call}: {name} is empty (shape {tuple(t.shape)}); pass at least one element")


def check_same_dtype(call: str, out: torch.Tensor, inp: torch.Tensor) -> None:
    if out.dtype != inp.dtype:
        raise UnsupportedDtypeError(f"{call}: out is {out.dtype} but inp is {inp.dtype}; pass both in one dtype")


def check_disjoint(call: str, out: torch.Tensor, inp: torch.Tensor, same_allowed: bool) -> None:
    """``out`` and ``inp`` do not overlap (or, where ``same_allowed``, are exactly the same memory)."""
    if overlap(out, inp) and not (same_allowed and out.data_ptr() == inp.data_ptr()
                                  and out.numel() == inp.numel()):
        fix = "pass out=inp for an in-place call, or" if same_allowed else "pass"
        raise IrisUsageError(f"{call}: out and inp overlap in memory (out at {out.data_ptr():#x}, "
                             f"{out.numel()} elements; inp at {inp.data_ptr():#x}, {inp.numel()}); {fix} "
                             f"tensors that do not overlap")


def overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the (contiguous) memory of ``a`` and ``b`` intersects."""
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def check_dim0(call: str, big_name: str, big: torch.Tensor, small_name: str, small: torch.Tensor, W: int) -> None:
    """``big`` holds ``W`` times ``small``'s elements, and along dim 0 ``W`` times its rows."""
    example = (W * (small.shape[0] if small.dim() else 1), *small.shape[1:])
    rows_ok = big.dim() == 0 or small.dim() == 0 or big.shape[0] == W * small.shape[0]
    if big.numel() != W * small.numel() or not rows_ok:
        raise IrisUsageError(f"{call}: {big_name} has shape {tuple(big.shape)} and {small_name} "
                             f"{tuple(small.shape)}; with {W} ranks {big_name} must have {W} x {small_name}'s "
                             f"elements ({W * small.numel()}) and {W} x its rows along dim 0 "
                             f"(e.g. {big_name} of shape {example})")

