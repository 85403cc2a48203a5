"""Point to point as torch operators: ``iris::send`` (returns nothing) and ``iris::recv`` (a new
tensor of the shape and dtype asked for), both kept by the compiler as side effects, so that
``ccl.send`` / ``ccl.recv`` and :func:`iris.collectives.functional.send` / ``recv`` are one node
each inside ``torch.compile`` instead of a graph break. No gradients: a pipeline's backward sends
and receives its gradients itself (examples/06_pipeline.py)."""

from __future__ import annotations

import torch

from ._handles import context_of


@torch.library.custom_op("iris::send", mutates_args=(), schema="(int ctx, Tensor x, int dst, int tag=0) -> ()")
def send(ctx: int, x: torch.Tensor, dst: int, tag: int = 0) -> None:
    """``x`` to rank ``dst`` (``iris.collectives.ccl.send``)."""
    from .. import ccl

    ccl.send(context_of(ctx, "iris::send"), x.contiguous(), dst, tag)


@send.register_fake
def _(ctx, x, dst, tag=0):
    return None


@torch.library.custom_op("iris::recv", mutates_args=(),
                         schema="(int ctx, SymInt[] shape, ScalarType dtype, int src, int tag=0) -> Tensor")
def recv(ctx: int, shape: list[int], dtype: torch.dtype, src: int, tag: int = 0) -> torch.Tensor:
    """A new tensor of ``shape`` and ``dtype`` holding what rank ``src`` sends (``ccl.recv``)."""
    from .. import ccl

    context = context_of(ctx, "iris::recv")
    return ccl.recv(context, torch.empty(shape, dtype=dtype, device=context.device), src, tag)


@recv.register_fake
def _(ctx, shape, dtype, src, tag=0):
    return torch.empty(shape, dtype=dtype, device=context_of(ctx, "iris::recv").device)


# Both are side effects: a send returns nothing, and a recv whose result goes unused must still
# take its message, or the next recv of the channel would get it. Without this the compiler would
# drop them as dead code.
if hasattr(torch.fx.node, "has_side_effect"):
    torch.fx.node.has_side_effect(torch.ops.iris.send.default)
    torch.fx.node.has_side_effect(torch.ops.iris.recv.default)
