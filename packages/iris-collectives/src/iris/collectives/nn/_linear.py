"""``ColumnParallelLinear`` and ``RowParallelLinear``: ``torch.nn.Linear`` split over the ranks.

A tensor-parallel MLP is ``RowParallelLinear(act(ColumnParallelLinear(x)))``: the first layer's
output features and the second's input features are split over the ``W`` ranks, so the
activation between them stays on its rank and the pair communicates once forward and once
backward. Without sequence parallelism the input and output are replicated (every rank holds
all rows): the column layer is a local GEMM whose input gradient is summed over the ranks, and
the row layer's product is summed by ``matmul_all_reduce``. With ``sequence_parallel=True``, the
input and output are split along dim 0 (rank ``r`` holds rows ``r * S / W`` to ``(r + 1) * S / W``):
the column layer all-gathers its input inside ``all_gather_matmul``, the row layer reduce-scatters
its product inside ``matmul_reduce_scatter``, and their gradients are the same two ops swapped.

With ``group=`` (an :class:`iris.runtime.Group` of the context, e.g. the tensor-parallel group
of a TP x DP layout) everything above is the group's: the features are split over its ``size``
ranks, this rank's block is its group rank's, and every call (forward and backward) runs on the
group. The layers hold the group's handle, as they hold the context's: keep the group alive
while the model runs.

Weights are stored as ``torch.nn.Linear`` stores them (``[out, in]``, this rank's block), so
``from_linear`` takes a rank's block of a full layer, and a state dict maps block for block.
"""

from __future__ import annotations

import math

import torch

from iris.runtime import IrisUsageError, UnsupportedDtypeError
from iris.runtime._group import Group, check_group

from ..functional._fused_ops import all_gather_matmul_step
from ..functional._handles import encode_config, handle_of
from ..functional._sum_gradients import SumGradients
from ..ops._config import Config


def _ranks_of(ctx, group, call: str):
    """What the layer splits over: ``ctx``, or ``group`` once checked to be a group of ``ctx``."""
    if group is None:
        return ctx
    return check_group(ctx, group, call)


def _split(call: str, name: str, features: int, on) -> int:
    """``features`` split over the ranks of ``on`` (the context or the group)."""
    world_size = on.world_size
    if features % world_size:
        size = "the world size" if not isinstance(on, Group) else f"the size of the group {list(on.ranks)}"
        raise IrisUsageError(f"{call}: {name}={features} is not a multiple of {size}, {world_size}; pick "
                             f"{name} divisible by it (e.g. {-(-features // world_size) * world_size})")
    return features // world_size


class _ParallelLinear(torch.nn.Module):
    """What the two layers share: the handle, the split, the parameters' creation and checks."""

    def __init__(self, ctx, in_features: int, out_features: int, bias: bool, sequence_parallel: bool,
                 weight_shape: tuple, bias_features: int, dtype, config, group):
        super().__init__()
        self.call = f"iris.collectives.nn.{type(self).__name__}"
        # The handle of the context, or of the group the layer is split over: an int, what the
        # operators take, a constant to the compiler, and no reference to the context (a deep copy
        # or a pickle of the model does not copy the heap). rank and world_size are the group's.
        self.handle = handle_of(ctx, group, self.call)
        on = ctx if group is None else group
        self.rank, self.world_size = on.rank, on.world_size
        self.in_features, self.out_features = in_features, out_features
        self.sequence_parallel = bool(sequence_parallel)
        self.config = encode_config(config, Config, self.call)
        factory = {"device": ctx.device, "dtype": dtype}
        self.weight = torch.nn.Parameter(torch.empty(weight_shape, **factory))
        self.bias = torch.nn.Parameter(torch.empty(bias_features, **factory)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """This rank's block of the whole layer as ``torch.nn.Linear`` initialises it (the same draws:
        with the same seed on every rank, the layer is the block of the ``Linear`` that seed gives on
        the context's device). The whole weight is drawn on every rank, once, then dropped."""
        full = torch.empty(self.out_features, self.in_features, device=self.weight.device, dtype=self.weight.dtype)
        torch.nn.init.kaiming_uniform_(full, a=math.sqrt(5))
        with torch.no_grad():
            self.weight.copy_(self._block(full))
            if self.bias is not None:
                bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
                self.bias.copy_(self._bias_block(torch.empty_like(full[:, 0]).uniform_(-bound, bound)))

    def _check(self, x: torch.Tensor, features: int) -> None:
        if x.dim() < 1 or x.shape[-1] != features:
            raise IrisUsageError(f"{self.call}: the input has shape {tuple(x.shape)}; its last dimension must be "
                                 f"{features} (this rank's in_features)")
        if x.dtype != self.weight.dtype:
            raise UnsupportedDtypeError(f"{self.call}: the input is {x.dtype} but the weight is {self.weight.dtype}; "
                                        f"pass x.to({self.weight.dtype}) or build the layer with dtype={x.dtype}")

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"sequence_parallel={self.sequence_parallel}, rank={self.rank}, world_size={self.world_size}")


class ColumnParallelLinear(_ParallelLinear):
    """``y = x @ weight^T + bias`` with the output features split over the ranks: this rank holds
    rows ``[r * out / W, (r + 1) * out / W)`` of the full ``[out, in]`` weight and of the bias, and
    returns those columns of ``y``.

    - ``sequence_parallel=False``: ``x`` is replicated, ``[..., in]``; ``y`` is ``[..., out / W]``.
      A local GEMM; ``x``'s gradient is summed over the ranks (:func:`~iris.collectives.functional.sum_gradients`).
    - ``sequence_parallel=True``: ``x`` is this rank's rows along dim 0, ``[S / W, ..., in]``; ``y``
      is ``[S, ..., out / W]``, through ``all_gather_matmul`` (backward: ``matmul_reduce_scatter``;
      in training the forward keeps the gathered rows for the weight's gradient where that was
      measured faster: :func:`iris.collectives.functional.all_gather_matmul`).

    ``out_features`` must be a multiple of the world size. ``dtype``: fp32, fp16, bf16 (fp64 for
    checks); the input must have the weight's dtype. ``config``: an ``ops.Config`` for the fused op.
    ``group``: an :class:`iris.runtime.Group` of ``ctx`` to split over (its size and rank stand
    for the world size and rank above; every call runs on it); None: every rank.
    Parameters are created on the context's device, this rank's block of ``torch.nn.Linear``'s
    initialisation of the full layer (:meth:`reset_parameters`); :meth:`from_linear` copies a full
    layer's block instead.
    """

    def __init__(self, ctx, in_features: int, out_features: int, bias: bool = True, *, sequence_parallel: bool = False,
                 dtype=None, config=None, group=None):
        call = "iris.collectives.nn.ColumnParallelLinear"
        local = _split(call, "out_features", out_features, _ranks_of(ctx, group, call))
        super().__init__(ctx, in_features, out_features, bias, sequence_parallel, (local, in_features), local,
                         dtype, config, group)

    def _block(self, weight: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a full ``[out, in]`` weight."""
        return weight.chunk(self.world_size, 0)[self.rank]

    _bias_block = _block

    @classmethod
    def from_linear(cls, ctx, linear: torch.nn.Linear, *, sequence_parallel: bool = False,
                    config=None, group=None) -> ColumnParallelLinear:
        """This rank's block of ``linear`` (the same full layer on every rank), on the context's device."""
        layer = cls(ctx, linear.in_features, linear.out_features, linear.bias is not None,
                    sequence_parallel=sequence_parallel, dtype=linear.weight.dtype, config=config, group=group)
        with torch.no_grad():
            layer.weight.copy_(layer._block(linear.weight))
            if linear.bias is not None:
                layer.bias.copy_(layer._bias_block(linear.bias))
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check(x, self.in_features)
        if not self.sequence_parallel:
            return torch.nn.functional.linear(SumGradients.apply(x, self.handle), self.weight, self.bias)
        y = all_gather_matmul_step(self.handle, x.reshape(-1, self.in_features), self.weight.t(), self.bias,
                                   self.config)
        return y.reshape(self.world_size * x.shape[0], *x.shape[1:-1], self.weight.shape[0])


class RowParallelLinear(_ParallelLinear):
    """``y = x @ weight^T + bias`` with the input features split over the ranks: this rank holds
    columns ``[r * in / W, (r + 1) * in / W)`` of the full ``[out, in]`` weight and takes those
    features of ``x`` (as a :class:`ColumnParallelLinear` returns them); the bias is the whole
    ``[out]``, the same on every rank (rank 0's, broadcast when the layer is built).

    - ``sequence_parallel=False``: ``x`` is ``[..., in / W]``, ``y`` ``[..., out]``, replicated,
      through ``matmul_all_reduce`` (backward: local GEMMs, the gradient passes the all-reduce as it is).
    - ``sequence_parallel=True``: ``x`` is ``[S, ..., in / W]``, ``y`` this rank's rows along dim 0,
      ``[S / W, ..., out]``, through ``matmul_reduce_scatter`` (backward: ``all_gather_matmul``); the
      bias's gradient sums every rank's rows (:func:`~iris.collectives.functional.sum_gradients`).

    ``in_features`` (and ``S`` with sequence parallelism) must be multiples of the world size.
    ``dtype``, ``config``, ``group``: as for :class:`ColumnParallelLinear`.
    """

    def __init__(self, ctx, in_features: int, out_features: int, bias: bool = True, *, sequence_parallel: bool = False,
                 dtype=None, config=None, group=None):
        call = "iris.collectives.nn.RowParallelLinear"
        local = _split(call, "in_features", in_features, _ranks_of(ctx, group, call))
        super().__init__(ctx, in_features, out_features, bias, sequence_parallel, (out_features, local),
                         out_features, dtype, config, group)

    def _block(self, weight: torch.Tensor) -> torch.Tensor:
        """This rank's columns of a full ``[out, in]`` weight."""
        return weight.chunk(self.world_size, 1)[self.rank]

    def _bias_block(self, bias: torch.Tensor) -> torch.Tensor:
        # the whole bias, one value on every rank: rank 0's draw (ranks seeded differently draw differently)
        return torch.ops.iris.broadcast(self.handle, bias, 0)

    @classmethod
    def from_linear(cls, ctx, linear: torch.nn.Linear, *, sequence_parallel: bool = False,
                    config=None, group=None) -> RowParallelLinear:
        """This rank's block of ``linear`` (the same full layer on every rank), on the context's device."""
        layer = cls(ctx, linear.in_features, linear.out_features, linear.bias is not None,
                    sequence_parallel=sequence_parallel, dtype=linear.weight.dtype, config=config, group=group)
        with torch.no_grad():
            layer.weight.copy_(layer._block(linear.weight))
            if linear.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = self.weight.shape[1]
        self._check(x, local)
        rows = x.reshape(-1, local)
        if not self.sequence_parallel:
            y = torch.ops.iris.matmul_all_reduce(self.handle, rows, self.weight.t(), self.bias, self.config)
            return y.reshape(*x.shape[:-1], self.out_features)
        if x.shape[0] % self.world_size:
            raise IrisUsageError(f"{self.call}: sequence_parallel splits dim 0 of the input over {self.world_size} "
                                 f"ranks, but it has {x.shape[0]} rows (shape {tuple(x.shape)}); pad it to a "
                                 f"multiple of {self.world_size}")
        # the bias is one value that each rank adds to its own rows: its gradient sums the ranks'
        bias = None if self.bias is None else SumGradients.apply(self.bias, self.handle)
        y = torch.ops.iris.matmul_reduce_scatter(self.handle, rows, self.weight.t(), bias, self.config)
        return y.reshape(x.shape[0] // self.world_size, *x.shape[1:-1], self.out_features)
