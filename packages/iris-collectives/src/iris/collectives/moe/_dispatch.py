"""The MoE dispatch and combine on the device, called directly (no autograd): plans and launches.

A dispatch is the routing (:mod:`._routing`) and one exchange (:class:`iris.collectives.ccl._exchange.Exchange`):
every rank publishes its tokens, its dispatch order and its weights, and pulls the rows routed to
its local experts, grouped by expert and within an expert by source rank, then by token and slot.
A combine is the exchange the other way: every rank publishes the rows its experts produced
(staged in its heap) and its layout, and each rank pulls its tokens' rows back and sums them in
slot order (:func:`iris.collectives.ccl._exchange_kernels.combine_kernel`). The plans are cached
per shape (tokens, hidden size, experts, capacity), not per address: activations are new tensors
every step.
"""

from __future__ import annotations

import torch

from iris.device._watchdog import capacity_text
from iris.runtime import Group, IrisUsageError, UnsupportedDtypeError

from .._agree import agree, rows_of
from .._errors import IrisCapacityError
from ..ccl import _launch, _ranks
from ..ccl._exchange import STAGE_ROWS, STAGE_SEGMENTS, Exchange, combine_constexprs, pull_constexprs, settings
from ..ccl._exchange_kernels import COMBINE_CALL, DISPATCH_CALL
from ._handle import ExpertMeta, MoEHandle, layout_parts, layout_size
from ._routing import route

DISPATCH = DISPATCH_CALL.value
COMBINE = COMBINE_CALL.value
#: Row dtypes of a dispatch and a combine.
FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
INDEX_DTYPES = (torch.int32, torch.int64)


class Sizes:
    """A dispatch's sizes, checked: ``tokens``, ``hidden``, ``topk``, ``experts``, ``groups`` (local
    experts), ``max_tokens``, and the layout: ``capacity`` (packed rows; 0 when padded) or
    ``expert_capacity`` (rows per local expert; 0 when packed); ``rows`` in all."""

    def __init__(self, ctx, call: str, tokens: int, hidden: int, topk: int, num_experts, capacity, expert_capacity,
                 max_tokens):
        W = _ranks.group_size(ctx)
        if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1 or num_experts % W:
            size = f"group's size {W} (the experts are split evenly over the group's members, {ctx!r})" \
                if isinstance(ctx, Group) else f"world size {W} (the experts are split evenly over the ranks)"
            raise IrisUsageError(f"{call}: num_experts={num_experts!r} must be a positive multiple of the {size}")
        if max_tokens is None:
            max_tokens = max(tokens, 1)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < max(tokens, 1):
            raise IrisUsageError(f"{call}: max_tokens={max_tokens!r} but this rank has {tokens} tokens; pass the most "
                                 f"tokens any rank dispatches (the same on every rank: it sizes the heap buffers)")
        if capacity is not None and expert_capacity is not None:
            raise IrisUsageError(f"{call}: pass capacity (rows in all, packed by expert) or expert_capacity (rows per "
                                 f"local expert, padded), not both")
        for name, value in (("capacity", capacity), ("expert_capacity", expert_capacity)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise IrisUsageError(f"{call}: {name}={value!r} must be a positive int")
        self.tokens, self.hidden, self.topk, self.experts = tokens, hidden, topk, num_experts
        self.groups, self.max_tokens = num_experts // W, max_tokens
        if expert_capacity is not None:
            self.capacity, self.expert_capacity, self.rows = 0, expert_capacity, self.groups * expert_capacity
        else:
            # every row that can arrive: each rank's tokens, each with its topk rows here
            self.capacity = W * max_tokens * topk if capacity is None else capacity
            self.expert_capacity, self.rows = 0, self.capacity

    @property
    def padded(self) -> bool:
        return self.expert_capacity > 0

    def expert_shape(self, row: int) -> tuple:
        """The shape of ``expert_x`` (or ``expert_y``) with rows of ``row`` elements."""
        return (self.groups, self.expert_capacity, row) if self.padded else (self.capacity, row)


def _check(call: str, ctx, name: str, t, dtypes, dim: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise IrisUsageError(f"{call}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise UnsupportedDtypeError(f"{call}: {name} has dtype {t.dtype}; pass one of "
                                    f"{', '.join(str(d) for d in dtypes)}")
    if t.dim() != dim:
        raise IrisUsageError(f"{call}: {name} has shape {tuple(t.shape)}; pass a {dim}-D tensor")
    if t.device != ctx.device:
        raise IrisUsageError(f"{call}: {name} is on {t.device} but the Iris context runs on {ctx.device}; move it "
                             f"with .to({str(ctx.device)!r})")


def check_routing(call: str, ctx, x, topk_idx, topk_weights) -> None:
    """``x`` ``[T, H]`` float, ``topk_idx`` ``[T, K]`` int32/int64, ``topk_weights`` ``[T, K]`` float."""
    _check(call, ctx, "x", x, FLOATS, 2)
    _check(call, ctx, "topk_idx", topk_idx, INDEX_DTYPES, 2)
    _check(call, ctx, "topk_weights", topk_weights, FLOATS, 2)
    if topk_idx.shape[0] != x.shape[0] or topk_weights.shape != topk_idx.shape or topk_idx.shape[1] < 1:
        raise IrisUsageError(f"{call}: x has shape {tuple(x.shape)}, topk_idx {tuple(topk_idx.shape)} and "
                             f"topk_weights {tuple(topk_weights.shape)}; pass [T, H], [T, K] and [T, K] (K >= 1)")
    if x.shape[1] < 1:
        raise IrisUsageError(f"{call}: x has shape {tuple(x.shape)}; its rows need at least one element")


def _placeholder(t: torch.Tensor, stand_in: torch.Tensor) -> torch.Tensor:
    # A kernel argument for a tensor with no elements (a rank with no tokens): never read or
    # written, but a launch wants an address.
    return t if t.numel() else stand_in


def weight_dtype(topk_weights: torch.Tensor) -> torch.dtype:
    """The dtype of a dispatch's row weights: fp64 for fp64 ``topk_weights``, else fp32."""
    return torch.float64 if topk_weights.dtype == torch.float64 else torch.float32


def dispatch_plan(ctx, x, topk_idx, wdtype, num_experts, capacity, expert_capacity, max_tokens, config,
                  config_text: str = ""):
    """The plan of a dispatch of this shape (``x``, ``topk_idx``: tensors of the call, checked with
    :func:`check_routing`; ``wdtype``: the row weights' dtype, fp32 or fp64). Called as
    ``plan(x, topk_idx, topk_weights)``, it returns ``(expert_x, ExpertMeta, MoEHandle)``;
    ``plan.redispatch(x, layout)`` sends the rows of another ``x`` along a dispatch's layout (the
    backward of a combine)."""
    T, H = x.shape
    K = topk_idx.shape[1]
    s = Sizes(ctx, DISPATCH, T, H, K, num_experts, capacity, expert_capacity, max_tokens)
    cfg = settings(ctx, config, H, DISPATCH)
    # Agreed before the heap buffers (sized by these) are allocated; the tokens (T) may differ
    # between ranks and calls where max_tokens is given, so a new T of a known signature exchanges
    # nothing.
    agree(ctx, DISPATCH, (), x=rows_of(x, "T"), topk_idx=rows_of(topk_idx, "T"), weights=wdtype,
          num_experts=num_experts, max_tokens=s.max_tokens, capacity=capacity, expert_capacity=expert_capacity,
          config=config)
    ex = Exchange(ctx, "moe.dispatch", DISPATCH, x.dtype, H, s.max_tokens, s.groups, cfg, flat=s.max_tokens * K,
                  weight_dtype=wdtype)
    publish_cx = ex.publish_constexprs(STAGE_ROWS, prefix=False)
    pull_cx = pull_constexprs(ex, topk=K, padded=s.padded)
    again_cx = pull_constexprs(ex, topk=K, padded=s.padded, write_layout=False)
    E, G, dev, interpreted = s.experts, s.groups, ctx.device, ctx.device.type != "cuda"
    routing_programs = ex.cfg.grid if interpreted else max(1, min(ex.cfg.grid, -(-T * K // 1024)))

    def exchange(x, layout, parts, expert_x, counts, offsets, row_weights, topk_weights, cx):
        stand_in = ex.stage
        publish = ex.publish_args(_placeholder(x, stand_in), T, parts["send_counts"], parts["send_offsets"], G, 1,
                                  route=_placeholder(parts["order"], layout),
                                  weights=None if topk_weights is None else _placeholder(topk_weights, ex.weights),
                                  n_flat=T * K)
        pull = (ex.context, expert_x, ex.stage, s.max_tokens, ex.table, ex.route, ex.weights, row_weights,
                parts["recv_counts"], parts["recv_offsets"], counts, offsets, s.capacity, s.expert_capacity, ex.locks)
        ex.run(publish, publish_cx, pull, cx)

    def plan(x, topk_idx, topk_weights):
        layout = torch.empty(layout_size(E, T, K), dtype=torch.int32, device=dev)
        parts = layout_parts(layout, E, T, K)
        route(topk_idx, E, layout, routing_programs)
        expert_x = torch.empty(s.expert_shape(H), dtype=x.dtype, device=dev)
        counts = torch.empty(G, dtype=torch.int32, device=dev)
        offsets = torch.empty(G + 1, dtype=torch.int32, device=dev)
        row_weights = torch.empty(s.rows, dtype=wdtype, device=dev)
        exchange(x, layout, parts, expert_x, counts, offsets, row_weights, topk_weights, pull_cx)
        if interpreted:
            check_expert_rows(ctx, DISPATCH, counts, s)
        handle = MoEHandle(layout, topk_idx, topk_weights, row_weights, E, s.capacity, s.expert_capacity,
                           s.max_tokens, config_text)
        return expert_x, ExpertMeta(counts, offsets, row_weights), handle

    def redispatch(x, layout):
        expert_x = torch.empty(s.expert_shape(H), dtype=x.dtype, device=dev)
        exchange(x, layout, layout_parts(layout, E, T, K), expert_x, None, None, None, None, again_cx)
        return expert_x

    plan.redispatch = redispatch
    return plan


def check_expert_rows(ctx, call: str, counts: torch.Tensor, s: Sizes) -> None:
    """The cpu backend's side of the capacity report (after the launches): raise
    :class:`IrisCapacityError` when this rank's local experts received more rows than fit."""
    per_expert = [int(c) for c in counts.tolist()]
    if s.padded:
        for g, rows in enumerate(per_expert):
            if rows > s.expert_capacity:
                raise IrisCapacityError(capacity_text(call, ctx.rank, "expert rows", g, rows, s.expert_capacity))
    elif sum(per_expert) > s.capacity:
        raise IrisCapacityError(capacity_text(call, ctx.rank, "out rows", 0, sum(per_expert), s.capacity))


def planned_dispatch(ctx, x, topk_idx, wdtype, num_experts, capacity=None, expert_capacity=None, max_tokens=None,
                     config=None, config_text: str = ""):
    """The cached plan of a dispatch of this shape (built on the first call; the arguments checked
    with :func:`check_routing` before)."""
    key = ("moe.dispatch", tuple(x.shape), x.dtype, tuple(topk_idx.shape), wdtype, num_experts, capacity,
           expert_capacity, max_tokens, config)
    return _launch.plan_for(ctx, key, lambda: dispatch_plan(ctx, x, topk_idx, wdtype, num_experts, capacity,
                                                            expert_capacity, max_tokens, config, config_text))


def combine_plan(ctx, expert_y, topk_idx, num_experts, capacity, expert_capacity, max_tokens, weighted: bool,
                 reduce: bool, config):
    """The plan of a combine of this shape (a dispatch's sizes: ``topk_idx`` ``[T, K]``, the experts,
    the capacities); called as ``plan(expert_y, topk_idx, topk_weights, layout)``. ``reduce``: the
    weighted (``weighted``; else ``topk_weights`` may be None) or plain sum per token, ``[T, H]``;
    else every row back, ``[T, K, H]``."""
    call = COMBINE
    T, K = topk_idx.shape
    s = Sizes(ctx, call, T, 1, K, num_experts, capacity or None, expert_capacity or None, max_tokens)
    if not isinstance(expert_y, torch.Tensor) or expert_y.dtype not in FLOATS:
        raise UnsupportedDtypeError(f"{call}: expert_y must be a float tensor (float32, bfloat16, float16, float64), "
                                    f"got {getattr(expert_y, 'dtype', type(expert_y).__name__)}")
    want = (s.groups, s.expert_capacity) if s.padded else (s.capacity,)
    if tuple(expert_y.shape[:-1]) != want or expert_y.device != ctx.device:
        raise IrisUsageError(f"{call}: expert_y has shape {tuple(expert_y.shape)} on {expert_y.device}; pass the "
                             f"experts' rows in expert_x's layout, shape ({', '.join(map(str, want))}, H) on "
                             f"{ctx.device}")
    row = expert_y.shape[-1]
    cfg = settings(ctx, config, row, call)
    agree(ctx, call, (("expert_y", expert_y),), topk_idx=rows_of(topk_idx, "T"), num_experts=num_experts,
          max_tokens=s.max_tokens, capacity=capacity, expert_capacity=expert_capacity, weighted=weighted,
          reduce=reduce, config=config)
    ex = Exchange(ctx, "moe.combine", call, expert_y.dtype, row, s.rows, s.groups, cfg, kind="combine")
    publish_cx = ex.publish_constexprs(STAGE_SEGMENTS, prefix=False)
    combine_cx = combine_constexprs(ex, topk=K, reduce=reduce, padded=s.padded)
    E, W, dev = s.experts, _ranks.group_size(ctx), ctx.device
    shape = (T, row) if reduce else (T, K, row)

    def plan(expert_y, topk_idx, topk_weights, layout):
        parts = layout_parts(layout, E, T, K)
        y = torch.empty(shape, dtype=expert_y.dtype, device=dev)
        stand_in = ex.scratch
        # the layout's receive tables are [G, W]: rank d's rows of group g at g * W + d
        publish = ex.publish_args(expert_y.contiguous(), s.rows, parts["recv_counts"], parts["recv_offsets"], 1, W)
        weights = topk_weights.contiguous() if weighted else None
        combine = (ex.context, _placeholder(y, ex.stage), ex.stage, ex.table,
                   _placeholder(topk_idx.contiguous(), stand_in),
                   None if weights is None else _placeholder(weights, ex.stage),
                   _placeholder(parts["slots"], stand_in), parts["send_offsets"], ex.scratch, T, s.capacity,
                   s.expert_capacity, ex.locks)
        ex.run(publish, publish_cx, combine, combine_cx)
        return y

    return plan


def planned_combine(ctx, expert_y, topk_idx, num_experts, capacity, expert_capacity, max_tokens, weighted=True,
                    reduce=True, config=None):
    """The cached plan of a combine of this shape (see :func:`combine_plan`)."""
    try:
        key = ("moe.combine", tuple(expert_y.shape), expert_y.dtype, tuple(topk_idx.shape), num_experts, capacity,
               expert_capacity, max_tokens, weighted, reduce, config)
    except AttributeError:
        key = None
    return _launch.plan_for(ctx, key, lambda: combine_plan(ctx, expert_y, topk_idx, num_experts, capacity,
                                                           expert_capacity, max_tokens, weighted, reduce, config))
