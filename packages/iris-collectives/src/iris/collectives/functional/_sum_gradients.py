"""``sum_gradients``: a replicated tensor entering per-rank computation."""

from __future__ import annotations

import torch

from ._handles import handle_of


class SumGradients(torch.autograd.Function):
    """``x`` itself forward (a view, no copy); backward, the sum over ranks of its gradients."""

    @staticmethod
    def forward(ctx, x, handle: int):
        ctx.handle = handle
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return torch.ops.iris.all_reduce(ctx.handle, grad.contiguous()), None


def sum_gradients(ctx, x: torch.Tensor, group=None) -> torch.Tensor:
    """``x`` unchanged; its gradient becomes the sum over ranks of the gradients that reach it.

    For a tensor that is the same on every rank and that each rank consumes its own way: the input
    of a column-parallel layer (each rank multiplies it by its own columns), a bias added to each
    rank's own rows (a sequence-parallel row layer's). Each rank's gradient is then only its part,
    and the tensor's gradient is their sum, an ``all_reduce`` (Megatron-LM's "copy to the
    tensor-parallel region"). The ops that gather (``all_gather``, ``all_gather_matmul``) need
    none: their gradients already sum over the ranks. ``group``: sum over its members only (the
    ranks of a tensor-parallel group)."""
    return SumGradients.apply(x, handle_of(ctx, group, "iris.collectives.functional.sum_gradients"))
