"""What the front doors (``ccl.all_reduce(ctx, out, inp)``, ``ops.matmul_all_reduce(ctx, out, a, b)``,
...) do while ``torch.compile`` traces them: call the functional operator and copy its result
into ``out``, so that the compiler sees one ``iris::`` node and a copy instead of a graph break.
In eager mode the front doors launch their kernels directly and never come here: the torch
dispatcher would add tens of microseconds of Python to a call whose whole host cost is a few.
"""

from __future__ import annotations

import sys

import torch

from iris.runtime import IrisUsageError

from .._compiling import use_front
from ..ccl._config import Config as CclConfig
from ..ops._config import Config as OpsConfig
from . import _collective_ops, _fused_ops, _moe_ops, _norm_ops, _p2p_ops  # noqa: F401  (registers the operators)
from ._handles import encode_config, handle_of


def _into(call: str, out: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    if out.shape != result.shape:
        raise IrisUsageError(f"{call}: out has shape {tuple(out.shape)} but the result has {tuple(result.shape)}; "
                             f"pass an out of that shape")
    return out.copy_(result)


def collective(name: str, ctx, out, inp, *args, config=None):
    """``out`` = the result of ``iris::<name>(ctx, inp, *args)``."""
    call = f"iris.collectives.ccl.{name}"
    op = getattr(torch.ops.iris, name)
    return _into(call, out, op(handle_of(ctx), inp, *args, encode_config(config, CclConfig, call)))


def broadcast(ctx, tensor, src, config=None):
    """``tensor`` = rank ``src``'s, through ``iris::broadcast``."""
    call = "iris.collectives.ccl.broadcast"
    return tensor.copy_(torch.ops.iris.broadcast(handle_of(ctx), tensor, src, encode_config(config, CclConfig, call)))


def barrier(ctx) -> None:
    torch.ops.iris.barrier(handle_of(ctx))


def all_to_all_v(ctx, out, inp, in_splits, out_splits, out_offsets=None, config=None):
    """``out``, ``out_splits`` (and ``out_offsets``) = the results of ``iris::all_to_all_v`` (rows of
    ``out`` past the received ones become zeros, where the eager call leaves them as they were)."""
    call = "iris.collectives.ccl.all_to_all_v"
    result, splits, offsets = torch.ops.iris.all_to_all_v(handle_of(ctx), inp, in_splits, out.shape[0],
                                                          encode_config(config, CclConfig, call))
    out_splits.copy_(splits)
    if out_offsets is not None:
        out_offsets.copy_(offsets)
    return _into(call, out, result)


def send(ctx, tensor, dst, tag=0) -> None:
    torch.ops.iris.send(handle_of(ctx), tensor, dst, tag)


def recv(ctx, tensor, src, tag=0):
    """``tensor`` = what rank ``src`` sends, through ``iris::recv``."""
    return tensor.copy_(torch.ops.iris.recv(handle_of(ctx), list(tensor.shape), tensor.dtype, src, tag))


def fused(name: str, ctx, out, a, b, bias=None, config=None):
    """``out`` = the result of ``iris::<name>(ctx, a, b, bias)``, in ``out``'s dtype."""
    call = f"iris.collectives.ops.{name}"
    op = getattr(torch.ops.iris, name)
    return _into(call, out, op(handle_of(ctx), a, b, bias, encode_config(config, OpsConfig, call), out.dtype))


def fused_gathered(ctx, out, gathered, a, b, bias=None, config=None):
    """``out`` and ``gathered`` = the results of ``iris::all_gather_matmul_gathered(ctx, a, b, bias)``."""
    call = "iris.collectives.ops.all_gather_matmul"
    result, rows = torch.ops.iris.all_gather_matmul_gathered(handle_of(ctx), a, b, bias,
                                                             encode_config(config, OpsConfig, call), out.dtype)
    _into(call, gathered, rows)
    return _into(call, out, result)


def all_reduce_residual_rmsnorm(ctx, out, residual_out, partial, residual, weight, eps=1e-6, scale=None,
                                config=None):
    """``out`` (and ``residual_out``, and per-row fp8 scales) = the results of
    ``iris::all_reduce_residual_rmsnorm``, in ``out``'s dtype."""
    call = "iris.collectives.ops.all_reduce_residual_rmsnorm"
    # a per-tensor fp8 scale is read (it goes to the operator); per-row scales come back from it
    row_scales = out.dtype == torch.float8_e4m3fn and scale is not None and tuple(scale.shape) not in ((), (1,))
    result, new_residual, scales = torch.ops.iris.all_reduce_residual_rmsnorm(
        handle_of(ctx), partial, residual, weight, eps, None if row_scales else scale, out.dtype,
        encode_config(config, OpsConfig, call))
    if residual_out is not None:
        _into(call, residual_out, new_residual)
    if row_scales:
        _into(call, scale, scales)
    return _into(call, out, result)


use_front(sys.modules[__name__])
