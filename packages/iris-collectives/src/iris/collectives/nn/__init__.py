"""iris.collectives.nn: tensor-parallel layers on the fused ops, for eager, compiled and trained models.

- :class:`ColumnParallelLinear`: ``torch.nn.Linear`` with its output features split over the ranks;
- :class:`RowParallelLinear`: with its input features split over the ranks;
- :class:`ExpertParallelMoE`: a mixture-of-experts MLP with its experts split over the ranks
  (router, ``moe_dispatch``, the local experts as batched GEMMs, ``moe_combine``).

Both take the Iris context first and ``sequence_parallel=`` (inputs and outputs split along
dim 0, communication inside ``all_gather_matmul`` / ``matmul_reduce_scatter``) or not (replicated,
``matmul_all_reduce``). They call the ``iris::`` torch operators, so
``torch.compile(model, fullgraph=True)`` compiles them with no graph break and autograd trains
them; gradients follow :mod:`iris.collectives.functional`'s convention, so each rank's parameter
gradients are its block of the single-device model's. See docs/tensor-parallel.md.

Example (a tensor-parallel MLP)::

    import torch, iris.runtime
    from iris.collectives.nn import ColumnParallelLinear, RowParallelLinear

    ctx = iris.runtime.iris()
    mlp = torch.nn.Sequential(ColumnParallelLinear(ctx, 64, 256), torch.nn.GELU(),
                              RowParallelLinear(ctx, 256, 64))
    y = torch.compile(mlp, fullgraph=True)(torch.randn(8, 64, device=ctx.device))
"""

from ._linear import ColumnParallelLinear, RowParallelLinear
from ._moe import ExpertParallelMoE

__all__ = ["ColumnParallelLinear", "ExpertParallelMoE", "RowParallelLinear"]
