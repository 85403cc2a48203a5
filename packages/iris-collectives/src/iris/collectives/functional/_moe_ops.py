"""Expert parallelism and the variable-size all-to-all as torch operators, with their gradients.

- ``iris::all_to_all_v(ctx, x, in_splits, capacity)`` -> ``(out, out_splits, out_offsets)``; its
  gradient sends the output's gradient back the way the rows came (the received counts as the
  splits), into zeros for rows that were not sent;
- ``iris::moe_dispatch(ctx, x, topk_idx, topk_weights, num_experts, capacity, expert_capacity,
  max_tokens)`` -> ``(expert_x, counts, offsets, row_weights, layout)``: the rows to the experts;
  gradient: ``x``'s is the sum of each token's rows' gradients, brought back (``moe_combine``
  without weights); ``topk_weights``' is ``row_weights``' gradient brought back (``moe_gather``);
- ``iris::moe_combine(ctx, expert_y, topk_idx, topk_weights?, row_weights?, layout, ...)`` -> ``y``:
  every token's rows back, summed in slot order (weighted by ``topk_weights`` when given);
  gradient: ``expert_y``'s is ``y``'s gradient dispatched along the same layout
  (``moe_redispatch``) and weighted by ``row_weights``; ``topk_weights``' is the dot product of
  that dispatched gradient with ``expert_y``, row by row, brought back (``moe_gather``);
- ``iris::moe_redispatch`` (the rows of another ``x`` along a dispatch's layout; gradient: the
  plain ``moe_combine``) and ``iris::moe_gather`` (every row back unsummed, ``[T, K, row]``; no
  gradient).

Each is a ``torch.library.custom_op`` with a fake implementation (every shape is known from the
arguments: the capacities are arguments, never counts), so ``torch.compile(fullgraph=True)``
traces a MoE layer's forward and backward with one node per exchange and no host synchronisation.
A handle is the ``layout`` tensor (see ``iris.collectives.moe._handle``) plus the sizes, as ints.
"""

from __future__ import annotations

import torch

from iris.runtime import IrisUsageError

from ..ccl._config import Config
from ._handles import context_of, decode_config

_SIZES = "int num_experts, int capacity, int expert_capacity, int max_tokens"


def _moe():
    from ..moe import _dispatch  # at call time: the moe package imports this one

    return _dispatch


def _world(handle: int, name: str) -> int:
    return context_of(handle, f"iris::{name}").world_size


def _expert_shape(world: int, num_experts: int, capacity: int, expert_capacity: int, row) -> tuple:
    groups = num_experts // world
    return (groups, expert_capacity, row) if expert_capacity else (capacity, row)


def _sizes(handle: int, name: str, num_experts: int, capacity: int, expert_capacity: int) -> tuple:
    return _world(handle, name), num_experts, capacity, expert_capacity


# --- all_to_all_v -------------------------------------------------------------------------------------

@torch.library.custom_op("iris::all_to_all_v", mutates_args=(),
                         schema='(int ctx, Tensor x, Tensor in_splits, int capacity, str config="") '
                                '-> (Tensor, Tensor, Tensor)')
def all_to_all_v(ctx: int, x: torch.Tensor, in_splits: torch.Tensor, capacity: int, config: str = ""):
    """``ccl.all_to_all_v`` into new tensors: ``out`` (``capacity`` rows, zeros past the received
    ones), ``out_splits`` and ``out_offsets`` (int64)."""
    from .. import ccl

    context = context_of(ctx, "iris::all_to_all_v")
    x = x.contiguous()
    out = x.new_zeros((capacity, *x.shape[1:]))
    splits = torch.empty(context.world_size, dtype=torch.int64, device=x.device)
    offsets = torch.empty_like(splits)
    ccl.all_to_all_v(context, out, x, in_splits.contiguous(), splits, offsets, config=decode_config(config, Config))
    return out, splits, offsets


@all_to_all_v.register_fake
def _(ctx, x, in_splits, capacity, config=""):
    world = _world(ctx, "all_to_all_v")
    splits = x.new_empty(world, dtype=torch.int64)
    return x.new_empty((capacity, *x.shape[1:])), splits, torch.empty_like(splits)


def _setup_all_to_all_v(ctx, inputs, output):
    ctx.handle, ctx.rows, ctx.config = inputs[0], inputs[1].shape[0], inputs[4]
    ctx.save_for_backward(output[1])


def _all_to_all_v_backward(ctx, grad, grad_splits, grad_offsets):
    (received,) = ctx.saved_tensors
    back = torch.ops.iris.all_to_all_v(ctx.handle, grad.contiguous(), received, ctx.rows, ctx.config)[0]
    return None, back, None, None, None


all_to_all_v.register_autograd(_all_to_all_v_backward, setup_context=_setup_all_to_all_v)


# --- moe_dispatch ----------------------------------------------------------------------------------

@torch.library.custom_op("iris::moe_dispatch", mutates_args=(),
                         schema=f'(int ctx, Tensor x, Tensor topk_idx, Tensor topk_weights, {_SIZES}, '
                                f'str config="") -> (Tensor, Tensor, Tensor, Tensor, Tensor)')
def moe_dispatch(ctx: int, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, num_experts: int,
                 capacity: int, expert_capacity: int, max_tokens: int, config: str = ""):
    """``moe.dispatch``: ``(expert_x, counts, offsets, row_weights, layout)`` (``capacity`` 0 with an
    ``expert_capacity``, and the other way round)."""
    d = _moe()
    context = context_of(ctx, "iris::moe_dispatch")
    x, topk_idx, topk_weights = x.contiguous(), topk_idx.contiguous(), topk_weights.contiguous()
    d.check_routing(d.DISPATCH, context, x, topk_idx, topk_weights)
    plan = d.planned_dispatch(context, x, topk_idx, d.weight_dtype(topk_weights), num_experts, capacity or None,
                              expert_capacity or None, max_tokens, decode_config(config, Config), config)
    expert_x, meta, handle = plan(x, topk_idx, topk_weights)
    return expert_x, meta.counts, meta.offsets, meta.weights, handle.layout


@moe_dispatch.register_fake
def _(ctx, x, topk_idx, topk_weights, num_experts, capacity, expert_capacity, max_tokens, config=""):
    world = _world(ctx, "moe_dispatch")
    groups = num_experts // world
    shape = _expert_shape(world, num_experts, capacity, expert_capacity, x.shape[1])
    rows = groups * expert_capacity if expert_capacity else capacity
    wdtype = torch.float64 if topk_weights.dtype == torch.float64 else torch.float32
    layout = 4 * num_experts + 2 * x.shape[0] * topk_idx.shape[1]
    return (x.new_empty(shape), x.new_empty(groups, dtype=torch.int32), x.new_empty(groups + 1, dtype=torch.int32),
            x.new_empty(rows, dtype=wdtype), x.new_empty(layout, dtype=torch.int32))


def _setup_dispatch(ctx, inputs, output):
    ctx.handle, _, _, topk_weights, *ctx.sizes, ctx.config = inputs
    ctx.weights_dtype, ctx.rows_shape = topk_weights.dtype, output[0].shape[:-1]
    ctx.save_for_backward(inputs[2], output[4])


def _dispatch_backward(ctx, grad_x_rows, grad_counts, grad_offsets, grad_row_weights, grad_layout):
    topk_idx, layout = ctx.saved_tensors
    h, sizes, config = ctx.handle, ctx.sizes, ctx.config
    grad_x = grad_weights = None
    if ctx.needs_input_grad[1] and grad_x_rows is not None:
        # every token's rows went to its experts: its gradient is theirs summed, brought back
        grad_x = torch.ops.iris.moe_combine(h, grad_x_rows.contiguous(), topk_idx, None, None, layout, *sizes, config)
    if ctx.needs_input_grad[3] and grad_row_weights is not None:
        rows = grad_row_weights.reshape(*ctx.rows_shape, 1).contiguous()
        back = torch.ops.iris.moe_gather(h, rows, topk_idx, layout, *sizes, config)
        grad_weights = back.reshape(topk_idx.shape).to(ctx.weights_dtype)
    return None, grad_x, None, grad_weights, None, None, None, None, None


moe_dispatch.register_autograd(_dispatch_backward, setup_context=_setup_dispatch)


# --- moe_combine ------------------------------------------------------------------------------------

@torch.library.custom_op("iris::moe_combine", mutates_args=(),
                         schema=f'(int ctx, Tensor expert_y, Tensor topk_idx, Tensor? topk_weights, '
                                f'Tensor? row_weights, Tensor layout, {_SIZES}, str config="") -> Tensor')
def moe_combine(ctx: int, expert_y: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor | None,
                row_weights: torch.Tensor | None, layout: torch.Tensor, num_experts: int, capacity: int,
                expert_capacity: int, max_tokens: int, config: str = "") -> torch.Tensor:
    """``moe.combine``: ``[T, row]``, every token's rows summed in slot order, weighted by
    ``topk_weights`` when given (``row_weights``, the same weights by row, only for the gradient)."""
    context = context_of(ctx, "iris::moe_combine")
    weighted = topk_weights is not None
    plan = _moe().planned_combine(context, expert_y, topk_idx, num_experts, capacity, expert_capacity, max_tokens,
                                  weighted, True, decode_config(config, Config))
    return plan(expert_y.contiguous(), topk_idx.contiguous(), topk_weights, layout)


@moe_combine.register_fake
def _(ctx, expert_y, topk_idx, topk_weights, row_weights, layout, num_experts, capacity, expert_capacity,
      max_tokens, config=""):
    return expert_y.new_empty((topk_idx.shape[0], expert_y.shape[-1]))


def _setup_combine(ctx, inputs, output):
    ctx.handle, expert_y, topk_idx, topk_weights, row_weights, layout, *ctx.sizes, ctx.config = inputs
    ctx.weighted = topk_weights is not None
    ctx.weights_dtype = None if topk_weights is None else topk_weights.dtype
    wants_weights = ctx.weighted and ctx.needs_input_grad[3]
    ctx.save_for_backward(topk_idx, layout, row_weights, expert_y if wants_weights else None)


def _combine_backward(ctx, grad_y):
    topk_idx, layout, row_weights, expert_y = ctx.saved_tensors
    h, sizes, config = ctx.handle, ctx.sizes, ctx.config
    dtype = torch.float64 if row_weights is not None and row_weights.dtype == torch.float64 else torch.float32
    # y's gradient, every token's row sent to each of its experts, along the forward's layout
    rows = torch.ops.iris.moe_redispatch(h, grad_y.contiguous(), topk_idx, layout, *sizes, dtype, config)
    grad_expert_y = grad_weights = None
    if ctx.needs_input_grad[1]:
        if ctx.weighted:
            if row_weights is None:
                raise IrisUsageError("iris::moe_combine: the gradient of a weighted combine needs row_weights (the "
                                     "row_weights output of iris::moe_dispatch)")
            grad_expert_y = (rows * row_weights.reshape(*rows.shape[:-1], 1)).to(rows.dtype)
        else:
            grad_expert_y = rows
    if ctx.weighted and ctx.needs_input_grad[3]:
        acc = torch.float64 if expert_y.dtype == torch.float64 else torch.float32
        dots = (rows.to(acc) * expert_y.to(acc)).sum(-1, keepdim=True)
        back = torch.ops.iris.moe_gather(h, dots.contiguous(), topk_idx, layout, *sizes, config)
        grad_weights = back.reshape(topk_idx.shape).to(ctx.weights_dtype)
    return (None, grad_expert_y, None, grad_weights, None, None, None, None, None, None, None)


moe_combine.register_autograd(_combine_backward, setup_context=_setup_combine)


# --- moe_redispatch and moe_gather ---------------------------------------------------------------------

@torch.library.custom_op("iris::moe_redispatch", mutates_args=(),
                         schema=f'(int ctx, Tensor x, Tensor topk_idx, Tensor layout, {_SIZES}, '
                                f'ScalarType weights_dtype, str config="") -> Tensor')
def moe_redispatch(ctx: int, x: torch.Tensor, topk_idx: torch.Tensor, layout: torch.Tensor, num_experts: int,
                   capacity: int, expert_capacity: int, max_tokens: int, weights_dtype: torch.dtype,
                   config: str = "") -> torch.Tensor:
    """The rows of ``x`` (``[T, H]``) to the experts along a dispatch's ``layout``, in its
    ``expert_x`` layout (``weights_dtype``: the dispatch's row weights', so that both share their
    heap buffers)."""
    d = _moe()
    context = context_of(ctx, "iris::moe_redispatch")
    x = x.contiguous()
    plan = d.planned_dispatch(context, x, topk_idx, weights_dtype, num_experts, capacity or None,
                              expert_capacity or None, max_tokens, decode_config(config, Config), config)
    return plan.redispatch(x, layout)


@moe_redispatch.register_fake
def _(ctx, x, topk_idx, layout, num_experts, capacity, expert_capacity, max_tokens, weights_dtype, config=""):
    world = _world(ctx, "moe_redispatch")
    return x.new_empty(_expert_shape(world, num_experts, capacity, expert_capacity, x.shape[1]))


def _setup_redispatch(ctx, inputs, output):
    ctx.handle, _, topk_idx, layout, *sizes, _, ctx.config = inputs
    ctx.sizes = sizes
    ctx.save_for_backward(topk_idx, layout)


def _redispatch_backward(ctx, grad):
    topk_idx, layout = ctx.saved_tensors
    back = torch.ops.iris.moe_combine(ctx.handle, grad.contiguous(), topk_idx, None, None, layout, *ctx.sizes,
                                      ctx.config)
    return None, back, None, None, None, None, None, None, None, None


moe_redispatch.register_autograd(_redispatch_backward, setup_context=_setup_redispatch)


@torch.library.custom_op("iris::moe_gather", mutates_args=(),
                         schema=f'(int ctx, Tensor expert_y, Tensor topk_idx, Tensor layout, {_SIZES}, '
                                f'str config="") -> Tensor')
def moe_gather(ctx: int, expert_y: torch.Tensor, topk_idx: torch.Tensor, layout: torch.Tensor, num_experts: int,
               capacity: int, expert_capacity: int, max_tokens: int, config: str = "") -> torch.Tensor:
    """Every token's rows back from the experts, unsummed: ``[T, K, row]`` (zeros for no expert)."""
    context = context_of(ctx, "iris::moe_gather")
    plan = _moe().planned_combine(context, expert_y, topk_idx, num_experts, capacity, expert_capacity, max_tokens,
                                  False, False, decode_config(config, Config))
    return plan(expert_y.contiguous(), topk_idx.contiguous(), None, layout)


@moe_gather.register_fake
def _(ctx, expert_y, topk_idx, layout, num_experts, capacity, expert_capacity, max_tokens, config=""):
    return expert_y.new_empty((*topk_idx.shape, expert_y.shape[-1]))
