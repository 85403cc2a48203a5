"""The host collectives as torch operators: ``iris::all_reduce``, ``reduce_scatter``, ``all_gather``,
``all_to_all``, ``broadcast`` (functional: a new tensor out) and ``barrier``, with fake (shape)
implementations for the compiler and autograd formulas.

Each is a ``torch.library.custom_op``: opaque to the compiler, which sees its schema and its fake
implementation and calls it as one node. Not a ``triton_op``: a call is more than a kernel launch
(a plan looked up or built, a heap workspace allocated on first use with every rank waiting, a grid
agreed with the peers), and the kernels wait on flags of the other ranks, so nothing is gained by
letting the compiler fuse into or reorder their launches.

Gradients follow the convention of :mod:`iris.collectives.functional`: exact adjoints
(``all_gather`` reduce-scatters the gradients, ``reduce_scatter`` all-gathers them, ``all_to_all``
sends each chunk back, ``broadcast`` sums them onto the source rank), except ``all_reduce``,
whose replicated result's gradient, the same on every rank, passes back as it is (``avg``:
divided by the world size).
"""

from __future__ import annotations

import torch

from iris.runtime import IrisUsageError

from ..ccl._config import Config
from ._handles import context_of, decode_config

# Schemas are given, not inferred from the annotations: inference makes ``ctx: int`` a SymInt,
# which the compiler could turn symbolic; a handle is a constant.

#: Reductions whose gradient the operators know.
DIFFERENTIABLE_OPS = ("sum", "avg")


def _run(name: str, handle: int, config: str):
    # The context and decoded config of one operator call, and the front door it runs through.
    from .. import ccl  # at call time: ccl's front doors import this package when compiled

    return context_of(handle, f"iris::{name}"), decode_config(config, Config), getattr(ccl, name)


def _world(handle: int, name: str) -> int:
    return context_of(handle, f"iris::{name}").world_size


# --- all_reduce ------------------------------------------------------------------------------------

@torch.library.custom_op("iris::all_reduce", mutates_args=(),
                         schema='(int ctx, Tensor x, str op="sum", str config="") -> Tensor')
def all_reduce(ctx: int, x: torch.Tensor, op: str = "sum", config: str = "") -> torch.Tensor:
    """``op`` over every rank's ``x``, as a new tensor (``iris.collectives.ccl.all_reduce``)."""
    context, cfg, front = _run("all_reduce", ctx, config)
    x = x.contiguous()
    return front(context, torch.empty_like(x), x, op=op, config=cfg)


@all_reduce.register_fake
def _(ctx, x, op="sum", config=""):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _setup_reduce(ctx, inputs, output):
    ctx.handle, ctx.op = inputs[0], inputs[2]
    if ctx.op not in DIFFERENTIABLE_OPS:
        raise IrisUsageError(f"iris.collectives: the gradient of a reduction with op={ctx.op!r} is not defined "
                             f"here; use op='sum' or 'avg' where gradients are needed (or detach the input)")


def _divided(grad, world_size: int):
    """``grad / world_size`` rounded as IEEE division, as the forward's ``avg`` divides on every
    backend: with a Python number torch's CUDA kernels multiply by its reciprocal instead, one ulp
    off for world sizes that are not powers of two (7, seen with a group of 7 of 8 ranks)."""
    return torch.div(grad, torch.full((), world_size, dtype=grad.dtype, device=grad.device))


def _all_reduce_backward(ctx, grad):
    if ctx.op == "avg":
        grad = _divided(grad, _world(ctx.handle, "all_reduce"))
    return None, grad, None, None


all_reduce.register_autograd(_all_reduce_backward, setup_context=_setup_reduce)


# --- reduce_scatter ----------------------------------------------------------------------------------

@torch.library.custom_op("iris::reduce_scatter", mutates_args=(),
                         schema='(int ctx, Tensor x, str op="sum", str config="") -> Tensor')
def reduce_scatter(ctx: int, x: torch.Tensor, op: str = "sum", config: str = "") -> torch.Tensor:
    """Chunk ``rank`` (along dim 0) of ``op`` over every rank's ``x`` (``ccl.reduce_scatter``)."""
    context, cfg, front = _run("reduce_scatter", ctx, config)
    x = x.contiguous()
    out = x.new_empty(_scattered_shape(x, context.world_size))
    return front(context, out, x, op=op, config=cfg)


def _scattered_shape(x, world_size: int) -> tuple:
    if x.dim() == 0 or x.shape[0] % world_size:
        raise IrisUsageError(f"iris::reduce_scatter: x has shape {tuple(x.shape)}, which {world_size} ranks cannot "
                             f"split into equal chunks along dim 0; pass a multiple of {world_size} rows")
    return (x.shape[0] // world_size, *x.shape[1:])


@reduce_scatter.register_fake
def _(ctx, x, op="sum", config=""):
    return x.new_empty(_scattered_shape(x, _world(ctx, "reduce_scatter")))


def _reduce_scatter_backward(ctx, grad):
    grad = torch.ops.iris.all_gather(ctx.handle, grad.contiguous())
    if ctx.op == "avg":
        grad = _divided(grad, _world(ctx.handle, "reduce_scatter"))
    return None, grad, None, None


reduce_scatter.register_autograd(_reduce_scatter_backward, setup_context=_setup_reduce)


# --- all_gather ----------------------------------------------------------------------------------------

@torch.library.custom_op("iris::all_gather", mutates_args=(), schema='(int ctx, Tensor x, str config="") -> Tensor')
def all_gather(ctx: int, x: torch.Tensor, config: str = "") -> torch.Tensor:
    """Every rank's ``x`` concatenated along dim 0, in rank order (``ccl.all_gather``)."""
    context, cfg, front = _run("all_gather", ctx, config)
    x = x.contiguous()
    return front(context, x.new_empty(_gathered_shape(x, context.world_size)), x, config=cfg)


def _gathered_shape(x, world_size: int) -> tuple:
    return (world_size * x.shape[0], *x.shape[1:]) if x.dim() else (world_size,)


@all_gather.register_fake
def _(ctx, x, config=""):
    return x.new_empty(_gathered_shape(x, _world(ctx, "all_gather")))


def _setup_gather(ctx, inputs, output):
    ctx.handle, ctx.shape = inputs[0], inputs[1].shape


def _all_gather_backward(ctx, grad):
    # every rank's copy of these rows has its own gradient (its consumers'): their sum is the input's
    return None, torch.ops.iris.reduce_scatter(ctx.handle, grad.contiguous()).reshape(ctx.shape), None


all_gather.register_autograd(_all_gather_backward, setup_context=_setup_gather)


# --- all_to_all ----------------------------------------------------------------------------------------

@torch.library.custom_op("iris::all_to_all", mutates_args=(), schema='(int ctx, Tensor x, str config="") -> Tensor')
def all_to_all(ctx: int, x: torch.Tensor, config: str = "") -> torch.Tensor:
    """Chunk ``j`` (along dim 0) of this rank's ``x`` to rank ``j``, chunk ``i`` of the result from
    rank ``i`` (``ccl.all_to_all``)."""
    context, cfg, front = _run("all_to_all", ctx, config)
    x = x.contiguous()
    return front(context, torch.empty_like(x), x, config=cfg)


@all_to_all.register_fake
def _(ctx, x, config=""):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _all_to_all_backward(ctx, grad):
    # a permutation of the chunks between ranks; its transpose is the same exchange again
    return None, torch.ops.iris.all_to_all(ctx.handle, grad.contiguous()), None


def _setup_handle(ctx, inputs, output):
    ctx.handle = inputs[0]


all_to_all.register_autograd(_all_to_all_backward, setup_context=_setup_handle)


# --- broadcast -----------------------------------------------------------------------------------------

@torch.library.custom_op("iris::broadcast", mutates_args=(),
                         schema='(int ctx, Tensor x, int src, str config="") -> Tensor')
def broadcast(ctx: int, x: torch.Tensor, src: int, config: str = "") -> torch.Tensor:
    """Rank ``src``'s ``x`` on every rank, as a new tensor (``ccl.broadcast``)."""
    context, cfg, front = _run("broadcast", ctx, config)
    return front(context, x.clone(memory_format=torch.contiguous_format), src, config=cfg)


@broadcast.register_fake
def _(ctx, x, src, config=""):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _setup_broadcast(ctx, inputs, output):
    ctx.handle, ctx.src = inputs[0], inputs[2]


def _broadcast_backward(ctx, grad):
    # every rank's copy is the source's tensor: the sum of their gradients is its gradient, the
    # other ranks' inputs have none (every rank takes part in the sum: it is a collective)
    grad = torch.ops.iris.all_reduce(ctx.handle, grad.contiguous())
    if context_of(ctx.handle, "iris::broadcast").rank != ctx.src:
        grad = torch.zeros_like(grad)
    return None, grad, None, None


broadcast.register_autograd(_broadcast_backward, setup_context=_setup_broadcast)


# --- barrier ----------------------------------------------------------------------------------------

@torch.library.custom_op("iris::barrier", mutates_args=(), schema="(int ctx) -> ()")
def barrier(ctx: int) -> None:
    """A device-side barrier on the current stream (``ccl.barrier``)."""
    from .. import ccl

    ccl.barrier(context_of(ctx, "iris::barrier"))


@barrier.register_fake
def _(ctx):
    return None


# It returns nothing and writes no argument: without this the compiler would drop it as dead code.
if hasattr(torch.fx.node, "has_side_effect"):
    torch.fx.node.has_side_effect(torch.ops.iris.barrier.default)
