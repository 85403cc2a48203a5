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


def sum_gradients(ctx, x: torch.Tensor) -> torch.Tensor:
    """``x`` unchanged; its gradient becomes the sum over ranks of the gradients that reach it.

    For a replicated tensor (the same on every rank) that per-rank computation consumes, as the
    input of a column-parallel layer is: each rank's gradient is then only its part (its columns'
    contribution), and the tensor's gradient is their sum, an ``all_reduce`` (Megatron-LM's
    "copy to the tensor-parallel region"). The fused ops that gather their input
    (``all_gather_matmul``) need none: their gradient already sums over the ranks."""
    return SumGradients.apply(x, handle_of(ctx))
