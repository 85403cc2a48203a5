"""iris.collectives.moe: expert parallelism, the token exchange of a mixture of experts.

The ``E`` experts are split evenly over the ``W`` ranks (rank ``r`` holds experts ``r * E / W`` to
``(r + 1) * E / W - 1``, its *local* experts); with ``group=`` (an :class:`iris.runtime.Group`),
over the group's members, ``r`` and ``W`` the group rank and size. Every rank routes its own tokens:

- :func:`dispatch` ``(ctx, x, topk_idx, topk_weights, num_experts)`` sends each token's row to the
  rank of each of its top-k experts and returns ``(expert_x, meta, handle)``: the rows this
  rank's local experts received, grouped by local expert (and within an expert by source rank,
  then token and slot), with ``meta.counts`` / ``meta.offsets`` per expert on the device, ready
  for a grouped GEMM (or, with ``expert_capacity``, a batched GEMM over ``[G, capacity, H]``);
- :func:`combine` ``(ctx, expert_y, handle)`` returns every expert row to its token and sums each
  token's ``K`` rows weighted by ``topk_weights``, in slot order, accumulated in fp32 (fp64 for
  fp64) and rounded once: the same bits on every run and backend.

Counts exist only on the device: the routing, the exchange of counts and the layout are
computed by kernels, nothing waits for the host, and a CUDA graph of a dispatch and a combine
replays with the routing of each replay. Tokens per rank may differ between ranks and calls (up
to ``max_tokens``, the same on every rank), and an expert may receive no rows. A ``topk_idx``
entry outside ``[0, E)`` (e.g. ``-1``) sends nothing. Rows that do not fit (``capacity``,
``expert_capacity``) are an error: on the cpu backend the rank raises
:class:`iris.collectives.IrisCapacityError` after the call, on the GPU the watchdog reports it and
ends the job. The default capacity holds every row that can arrive.

When ``x`` or ``topk_weights`` require gradients (or inside ``torch.compile``) the calls go through
the torch operators of :mod:`iris.collectives.functional` (``moe_dispatch``, ``moe_combine``), which
autograd differentiates: ``combine``'s backward is a dispatch of the gradient, ``dispatch``'s a
combine. :class:`iris.collectives.nn.ExpertParallelMoE` is a layer built on them.

Example::

    import torch, iris.runtime
    from iris.collectives import moe

    ctx = iris.runtime.iris()
    x = torch.randn(16, 64, device=ctx.device)
    weights, experts = torch.rand(16, 8 * ctx.world_size, device=ctx.device).topk(2)
    expert_x, meta, handle = moe.dispatch(ctx, x, experts, weights, num_experts=8 * ctx.world_size)
    y = moe.combine(ctx, expert_x * 2, handle)      # every token: 2 * x * (sum of its weights)
"""

from __future__ import annotations

import torch

from .._compiling import is_compiling
from ..ccl._config import Config
from ..ccl._groups import on_group
from ..functional._handles import encode_config
from ._dispatch import COMBINE, DISPATCH, check_routing, planned_combine, planned_dispatch, weight_dtype
from ._handle import ExpertMeta, MoEHandle


def _wants_autograd(*tensors) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def dispatch(ctx, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, num_experts: int, *,
             capacity: int | None = None, expert_capacity: int | None = None, max_tokens: int | None = None,
             config=None, group=None) -> tuple[torch.Tensor, ExpertMeta, MoEHandle]:
    """Send every token's row to the ranks of its top-k experts; returns ``(expert_x, meta, handle)``.

    - ``x``: ``[T, H]`` (fp32, bf16, fp16 or fp64), this rank's tokens (``T`` may be 0 and may
      differ between ranks and calls);
    - ``topk_idx``: ``[T, K]`` int32 or int64, global expert ids (outside ``[0, num_experts)``: none);
    - ``topk_weights``: ``[T, K]`` float, the weights :func:`combine` applies;
    - ``num_experts``: a multiple of the world size;
    - ``max_tokens``: the most tokens any rank dispatches, the same on every rank (default ``T``:
      then every rank must pass the same ``T``); it sizes the heap buffers;
    - ``capacity``: rows ``expert_x`` holds, packed expert after expert (default: world size x
      ``max_tokens`` x ``K``, every row that can arrive); ``meta.offsets`` says where each expert's
      rows are, rows past ``meta.offsets[-1]`` are not written;
    - ``expert_capacity`` instead: ``expert_x`` is ``[G, expert_capacity, H]`` (``G = num_experts /
      W`` local experts), each expert's unused rows zero: a batched GEMM (``torch.bmm``) runs the
      experts;
    - ``config``: a ``ccl.Config`` (``block``, ``grid``, ``num_warps``).

    - ``group``: an :class:`iris.runtime.Group` of ``ctx``: the experts are split over its members
      only (``W`` the group's size: ``num_experts`` a multiple of it, group rank ``g`` holds experts
      ``g * E / W`` ..), and the rows move among them; pass the same group to :func:`combine`.
      None: every rank of the context.

    ``meta``: :class:`ExpertMeta` (``counts``, ``offsets``, ``weights`` per row); ``handle``:
    :class:`MoEHandle`, for :func:`combine`. Collective: every rank calls it with the same
    ``num_experts``, ``K``, ``H``, dtype, ``max_tokens`` and capacity. Torch's current stream; no
    host synchronisation.
    """
    if is_compiling() or _wants_autograd(x, topk_weights):
        from ..functional import moe_dispatch

        return moe_dispatch(ctx, x, topk_idx, topk_weights, num_experts, capacity=capacity,
                            expert_capacity=expert_capacity, max_tokens=max_tokens, config=config, group=group)
    if group is not None:
        ctx = on_group(ctx, group, DISPATCH)
    check_routing(DISPATCH, ctx, x, topk_idx, topk_weights)
    x, topk_idx, topk_weights = x.contiguous(), topk_idx.contiguous(), topk_weights.contiguous()
    text = encode_config(config, Config, DISPATCH)
    plan = planned_dispatch(ctx, x, topk_idx, weight_dtype(topk_weights), num_experts, capacity, expert_capacity,
                            max_tokens, config, text)
    return plan(x, topk_idx, topk_weights)


def combine(ctx, expert_y: torch.Tensor, handle: MoEHandle, config=None, group=None) -> torch.Tensor:
    """Every row of ``expert_y`` back to its token, each token's rows summed weighted by its
    ``topk_weights``: ``y[t] = sum over k of topk_weights[t, k] * expert_y[row of (t, k)]``, ``[T,
    H']`` in ``expert_y``'s dtype.

    ``expert_y``: the experts' outputs in ``expert_x``'s layout (``[capacity, H']`` or ``[G,
    expert_capacity, H']``; ``H'`` may differ from ``H``); ``handle``: what :func:`dispatch`
    returned. The sum runs over ``k = 0, 1, ...`` in that order, in fp32 (fp64 for fp64 rows),
    one rounding at the end: the same bits on every run and on both backends (slots with no expert
    add nothing). Collective; torch's current stream; no host synchronisation. ``config``: as
    :func:`dispatch`'s, for this exchange. ``group``: the group the dispatch ran on (None: the
    context).
    """
    if is_compiling() or _wants_autograd(expert_y, getattr(handle, "topk_weights", None)):
        from ..functional import moe_combine

        return moe_combine(ctx, expert_y, handle, group=group)
    if group is not None:
        ctx = on_group(ctx, group, COMBINE)
    if not isinstance(handle, MoEHandle):
        from iris.runtime import IrisUsageError

        raise IrisUsageError(f"iris.collectives.moe.combine: handle={type(handle).__name__} is not the MoEHandle "
                             f"that moe.dispatch returned")
    plan = planned_combine(ctx, expert_y, handle.topk_idx, handle.num_experts, handle.capacity,
                           handle.expert_capacity, handle.max_tokens, True, True, config)
    return plan(expert_y, handle.topk_idx, handle.topk_weights, handle.layout)


__all__ = ["ExpertMeta", "MoEHandle", "combine", "dispatch"]
