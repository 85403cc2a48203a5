"""``iris::all_reduce_residual_rmsnorm``: :func:`iris.collectives.ops.all_reduce_residual_rmsnorm` as
a torch operator, with a fake (shape) implementation, so that ``torch.compile(fullgraph=True)``
records it as one node and CUDA graphs replay it.

``(int ctx, Tensor partial, Tensor? residual, Tensor weight, float eps=1e-06, Tensor? scale=None,
ScalarType? out_dtype=None, str config="") -> (Tensor out, Tensor residual_out, Tensor row_scales)``:
new tensors out. ``residual_out`` is ``residual + all_reduce(partial)`` (the sum alone without a
residual). ``out_dtype``: ``partial``'s by default; ``torch.float8_e4m3fn`` quantises, with
``scale`` (a per-tensor scale, read) or, without it, one scale per row, computed and returned as
``row_scales`` (``partial.shape[:-1] + (1,)``, float32; an empty tensor otherwise).

An inference op: no gradient is registered (an opaque ``custom_op`` node, for the reasons given in
:mod:`._collective_ops`).
"""

from __future__ import annotations

import torch

from iris.runtime import IrisUsageError

from ..ops._config import Config
from ._handles import context_of, decode_config

#: The operator's schema (given, not inferred: see ``_collective_ops``).
SCHEMA = ('(int ctx, Tensor partial, Tensor? residual, Tensor weight, float eps=1e-06, Tensor? scale=None, '
          'ScalarType? out_dtype=None, str config="") -> (Tensor, Tensor, Tensor)')
NAME = "iris::all_reduce_residual_rmsnorm"


def _shapes(partial, out_dtype, scale) -> tuple:
    """The shapes of (out, residual_out, row_scales)."""
    if partial.dim() == 0:
        raise IrisUsageError(f"{NAME}: partial is a scalar; pass rows of activations, shape [..., hidden]")
    row_scales = out_dtype == torch.float8_e4m3fn and scale is None
    if row_scales and partial.dim() < 2:
        raise IrisUsageError(f"{NAME}: per-row fp8 scales need rows: partial has shape {tuple(partial.shape)}; pass "
                             f"it as [rows, hidden] (e.g. partial[None]), or a per-tensor scale=")
    rows = tuple(partial.shape[:-1]) + (1,) if row_scales else (0,)
    return tuple(partial.shape), tuple(partial.shape), rows


@torch.library.custom_op(NAME, mutates_args=(), schema=SCHEMA)
def all_reduce_residual_rmsnorm(ctx: int, partial: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                                eps: float = 1e-6, scale: torch.Tensor | None = None,
                                out_dtype: torch.dtype | None = None, config: str = ""):
    """``iris.collectives.ops.all_reduce_residual_rmsnorm`` into new tensors (see the module doc)."""
    from .. import ops  # at call time: the ops' front doors import this package when compiled

    context = context_of(ctx, NAME)
    partial = partial.contiguous()
    shape, _, rows = _shapes(partial, out_dtype, scale)
    out = partial.new_empty(shape, dtype=out_dtype or partial.dtype)
    residual_out = torch.empty_like(partial)
    row_scales = partial.new_empty(rows, dtype=torch.float32)
    ops.all_reduce_residual_rmsnorm(context, out, residual_out, partial,
                                    None if residual is None else residual.contiguous(), weight.contiguous(), eps,
                                    scale if scale is not None else row_scales if row_scales.numel() else None,
                                    config=decode_config(config, Config))
    return out, residual_out, row_scales


@all_reduce_residual_rmsnorm.register_fake
def _(ctx, partial, residual, weight, eps=1e-6, scale=None, out_dtype=None, config=""):
    shape, _, rows = _shapes(partial, out_dtype, scale)
    return (partial.new_empty(shape, dtype=out_dtype or partial.dtype), partial.new_empty(shape),
            partial.new_empty(rows, dtype=torch.float32))
