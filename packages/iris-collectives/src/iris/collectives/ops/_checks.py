"""Argument checks shared by the fused ops: every failure is an ``IrisError`` naming the call,
the argument, the values and the fix."""

from __future__ import annotations

import torch

from iris.runtime import IrisUsageError, UnsupportedDtypeError

#: Input dtypes of the GEMM core (fp32 runs as tf32 unless ``Config.input_precision="ieee"``; fp64
#: accumulates in fp64, for checking gradients, and takes the pointer path).
INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def check_matrix(call: str, name: str, t, shape: tuple[int, int] | None = None) -> None:
    """``t`` is a 2-D torch tensor of a supported float dtype (and of ``shape`` when given)."""
    if not isinstance(t, torch.Tensor):
        raise IrisUsageError(f"{call}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        raise IrisUsageError(f"{call}: {name} must be 2-D, got shape {tuple(t.shape)}")
    if t.dtype not in INPUT_DTYPES:
        raise UnsupportedDtypeError(f"{call}: {name} has dtype {t.dtype}; pass float32, float16, bfloat16 or float64")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise IrisUsageError(f"{call}: {name} has shape {tuple(t.shape)}, expected {tuple(shape)}")


def check_device(call: str, ctx, **tensors) -> None:
    """Every tensor is on the context's device."""
    for name, t in tensors.items():
        if t is not None and t.device != ctx.device:
            raise IrisUsageError(f"{call}: {name} is on {t.device} but the Iris context runs on {ctx.device}; "
                                 f"move it with .to({str(ctx.device)!r})")


def check_inputs(call: str, ctx, out, a, b, bias) -> None:
    """Common checks: 2-D float matrices, same input dtype, inner dimensions, devices, bias [N]."""
    check_matrix(call, "a", a)
    check_matrix(call, "b", b)
    check_matrix(call, "out", out)
    if a.dtype != b.dtype:
        raise UnsupportedDtypeError(f"{call}: a is {a.dtype} but b is {b.dtype}; pass both in one dtype")
    if a.shape[1] != b.shape[0]:
        raise IrisUsageError(f"{call}: a is {tuple(a.shape)} and b is {tuple(b.shape)}: a's columns ({a.shape[1]}) "
                             f"must equal b's rows ({b.shape[0]})")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or bias.dim() != 1 or bias.shape[0] != b.shape[1]:
            shape = tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__
            raise IrisUsageError(f"{call}: bias must be a 1-D tensor of N={b.shape[1]} values, got {shape}")
        if bias.dtype not in INPUT_DTYPES:
            raise UnsupportedDtypeError(f"{call}: bias has dtype {bias.dtype}; pass float32, float16, bfloat16 or "
                                        f"float64")
        if bias.stride(0) != 1:
            raise IrisUsageError(f"{call}: bias must be contiguous (stride 1), got stride {bias.stride(0)}; "
                                 f"pass bias.contiguous()")
    check_device(call, ctx, out=out, a=a, b=b, bias=bias)
    if a.numel() == 0 or b.numel() == 0:
        raise IrisUsageError(f"{call}: empty operand (a {tuple(a.shape)}, b {tuple(b.shape)}); M, N and K must be "
                             f"positive")


def check_rows_divide(call: str, name: str, M: int, world_size: int) -> int:
    """``M // world_size``, or an error when ``world_size`` does not divide ``M``."""
    if M % world_size:
        raise IrisUsageError(f"{call}: {name} has M={M} rows, which {world_size} ranks cannot split evenly; "
                             f"pad M to a multiple of {world_size} (e.g. {-(-M // world_size) * world_size})")
    return M // world_size
