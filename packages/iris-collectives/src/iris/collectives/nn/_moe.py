"""``ExpertParallelMoE``: a mixture-of-experts MLP whose experts are split over the ranks.

Every rank holds the router (the same on every rank) and ``E / W`` of the ``E`` experts (rank
``r``: experts ``r * E / W`` on), each ``act(x @ w1[e]) @ w2[e]``. A forward on this rank's tokens
``x`` (``[T, hidden]``, ``T`` may differ between ranks):

1. ``softmax(x @ router^T)``, its ``top_k`` largest probabilities as the weights (optionally
   renormalised to sum to 1) and their experts;
2. ``iris::moe_dispatch``: every token's row to each of its experts' ranks, ``[G, capacity,
   hidden]`` per rank (``G`` local experts, unused rows zero);
3. the local experts as two batched GEMMs (``torch.bmm``) over that layout;
4. ``iris::moe_combine``: every row back to its token, summed weighted by the top-k weights.

Autograd runs it backward (each exchange's gradient is the other exchange, see
:mod:`iris.collectives.functional`); the router, one value on every rank used by each rank on its
own tokens, gets its gradient summed over the ranks (``sum_gradients``), so every rank's
parameters get the gradients of the single-process model that holds every expert and sees every
rank's tokens. ``torch.compile(fullgraph=True)`` compiles it with no graph break.
"""

from __future__ import annotations

import math

import torch

from iris.runtime import IrisUsageError, UnsupportedDtypeError
from iris.runtime._group import check_group

from ..ccl._config import Config
from ..functional._handles import encode_config, handle_of
from ..functional._sum_gradients import SumGradients

ACTIVATIONS = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu, "relu": torch.nn.functional.relu}


class ExpertParallelMoE(torch.nn.Module):
    """A top-``top_k`` mixture of ``num_experts`` MLP experts (``hidden -> ffn_hidden -> hidden``),
    ``num_experts / W`` of them on each rank; ``forward(x)`` takes this rank's tokens ``[..., hidden]``
    and returns their outputs, same shape.

    - ``activation``: ``"silu"`` (default), ``"gelu"`` or ``"relu"``, the same function of
      ``torch.nn.functional``; ``normalize``: divide the top-k weights by their sum;
    - ``max_tokens``: the most tokens a rank passes in one call, the same on every rank (default:
      each call's own count, which every rank must then share); ``expert_capacity``: rows per local
      expert (default ``W x max_tokens``: every row that can arrive; with many experts mostly
      padding, which the batched GEMMs still multiply: for balanced routing pass a small factor over
      the mean, ``W x max_tokens x top_k / num_experts``); rows past it are an error
      (:class:`iris.collectives.IrisCapacityError` on the cpu backend, the watchdog on the GPU);
    - ``dtype``: the parameters' (fp32, bf16, fp16; fp64 for checks); ``config``: a ``ccl.Config``;
    - ``group``: an :class:`iris.runtime.Group` of ``ctx`` (the expert-parallel group): the experts
      are split over its members (``W`` its size, this rank's experts its group rank's), the
      router is broadcast from its group rank 0 and its gradient summed over the group, and every
      call runs on the group. None: every rank of the context.

    Parameters: ``router`` ``[num_experts, hidden]``; ``w1`` ``[G, hidden, ffn_hidden]``, ``w2`` ``[G,
    ffn_hidden, hidden]``: this rank's experts. :meth:`reset_parameters` draws every expert in
    turn from torch's generator (with the same seed on every rank, rank ``r`` holds experts ``r G
    ...`` of the model that seed gives in one process) and broadcasts rank 0's router;
    :meth:`from_dense` takes them from the full tensors instead.
    """

    def __init__(self, ctx, hidden: int, ffn_hidden: int, num_experts: int, top_k: int, *, activation: str = "silu",
                 normalize: bool = False, max_tokens: int | None = None, expert_capacity: int | None = None,
                 dtype=None, config=None, group=None):
        super().__init__()
        call = "iris.collectives.nn.ExpertParallelMoE"
        on = ctx if group is None else check_group(ctx, group, call)
        W = on.world_size
        if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1 or num_experts % W:
            size = f"the world size {W}" if group is None else f"the size {W} of the group {list(on.ranks)}"
            raise IrisUsageError(f"{call}: num_experts={num_experts!r} must be a positive multiple of {size}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= num_experts:
            raise IrisUsageError(f"{call}: top_k={top_k!r} must be an int in [1, num_experts={num_experts}]")
        if activation not in ACTIVATIONS:
            raise IrisUsageError(f"{call}: activation={activation!r} is not one of {tuple(ACTIVATIONS)}")
        # the handle of the context or of the group (rank and world_size are the group's then)
        self.call, self.handle = call, handle_of(ctx, group, call)
        self.rank, self.world_size = on.rank, W
        self.hidden, self.ffn_hidden, self.num_experts, self.top_k = hidden, ffn_hidden, num_experts, top_k
        self.local_experts = num_experts // W
        self.activation, self.normalize = activation, bool(normalize)
        self.max_tokens, self.expert_capacity = max_tokens, expert_capacity
        self.config = encode_config(config, Config, call)
        factory = {"device": ctx.device, "dtype": dtype}
        G = self.local_experts
        self.router = torch.nn.Parameter(torch.empty(num_experts, hidden, **factory))
        self.w1 = torch.nn.Parameter(torch.empty(G, hidden, ffn_hidden, **factory))
        self.w2 = torch.nn.Parameter(torch.empty(G, ffn_hidden, hidden, **factory))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The router as ``torch.nn.Linear(hidden, num_experts, bias=False)`` initialises its weight
        (rank 0's draw, broadcast), then every expert's ``w1`` and ``w2`` in turn, uniform in
        ``+-1/sqrt(fan_in)``; each rank keeps its own experts' draws."""
        with torch.no_grad():
            torch.nn.init.kaiming_uniform_(self.router, a=math.sqrt(5))
            self.router.copy_(torch.ops.iris.broadcast(self.handle, self.router.detach(), 0))
            first = self.rank * self.local_experts
            for e in range(self.num_experts):
                w1 = torch.empty_like(self.w1[0]).uniform_(-1 / math.sqrt(self.hidden), 1 / math.sqrt(self.hidden))
                w2 = torch.empty_like(self.w2[0]).uniform_(-1 / math.sqrt(self.ffn_hidden),
                                                           1 / math.sqrt(self.ffn_hidden))
                if first <= e < first + self.local_experts:
                    self.w1[e - first].copy_(w1)
                    self.w2[e - first].copy_(w2)

    @classmethod
    def from_dense(cls, ctx, router: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, top_k: int,
                   **options) -> ExpertParallelMoE:
        """The layer whose router is ``router`` (``[E, hidden]``) and whose rank holds its block of the
        full ``w1`` (``[E, hidden, ffn_hidden]``) and ``w2`` (``[E, ffn_hidden, hidden]``), the same
        tensors on every rank; ``options`` as the constructor's (with ``group=``, the block of this
        rank's group rank)."""
        layer = cls(ctx, router.shape[1], w1.shape[2], router.shape[0], top_k, dtype=router.dtype, **options)
        first = layer.rank * layer.local_experts
        with torch.no_grad():
            layer.router.copy_(router)
            layer.w1.copy_(w1[first:first + layer.local_experts])
            layer.w2.copy_(w2[first:first + layer.local_experts])
        return layer

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(topk_weights, topk_idx)`` of this rank's tokens ``x`` (``[T, hidden]``)."""
        router = SumGradients.apply(self.router, self.handle)  # one value, each rank's tokens: summed gradients
        probs = torch.softmax(x @ router.t(), dim=-1)
        weights, idx = probs.topk(self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(-1, keepdim=True)
        return weights, idx

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 1 or x.shape[-1] != self.hidden:
            raise IrisUsageError(f"{self.call}: the input has shape {tuple(x.shape)}; its last dimension must be "
                                 f"hidden={self.hidden}")
        if x.dtype != self.router.dtype:
            raise UnsupportedDtypeError(f"{self.call}: the input is {x.dtype} but the parameters are "
                                        f"{self.router.dtype}; pass x.to({self.router.dtype})")
        tokens = x.reshape(-1, self.hidden)
        T = tokens.shape[0]
        max_tokens = self.max_tokens or max(T, 1)
        capacity = self.expert_capacity or self.world_size * max_tokens
        weights, idx = self.route(tokens)
        sizes = (self.num_experts, 0, capacity, max_tokens)
        expert_x, _, _, row_weights, layout = torch.ops.iris.moe_dispatch(self.handle, tokens, idx, weights, *sizes,
                                                                          self.config)
        act = ACTIVATIONS[self.activation]
        expert_y = torch.bmm(act(torch.bmm(expert_x, self.w1)), self.w2)
        y = torch.ops.iris.moe_combine(self.handle, expert_y, idx, weights, row_weights, layout, *sizes, self.config)
        return y.reshape(x.shape)

    def extra_repr(self) -> str:
        return (f"hidden={self.hidden}, ffn_hidden={self.ffn_hidden}, num_experts={self.num_experts}, "
                f"top_k={self.top_k}, local_experts={self.local_experts}, activation={self.activation!r}, "
                f"rank={self.rank}, world_size={self.world_size}")
