"""iris.collectives.ops: host-callable fused GEMM + communication.

Each op takes the host context first and the output second (the order of AMD Iris's
``iris.ops``), enqueues one persistent Triton kernel on torch's current stream, and overlaps the
communication of each output tile with the computation of the next:

- :func:`matmul_all_reduce` ``(ctx, out, a, b, bias=None, config=None)``: ``out = all_reduce(a @ b) + bias``;
- :func:`matmul_reduce_scatter`: ``out = reduce_scatter(a @ b, dim 0) + bias``;
- :func:`all_gather_matmul`: ``out = all_gather(a_shard, dim 0) @ b + bias``;
- :func:`matmul_all_gather`: ``out = all_gather(a @ b + bias, dim 0)``;
- :func:`all_reduce_residual_rmsnorm` ``(ctx, out, residual_out, partial, residual, weight, eps=1e-6,
  scale=None, config=None)``: ``residual_out = residual + all_reduce(partial)``, ``out =
  rms_norm(residual_out) * weight`` (optionally fp8), the end of a tensor-parallel layer.

Example::

    import torch, iris.runtime
    from iris.collectives import ops

    ctx = iris.runtime.iris()
    a = torch.randn(64, 32, device=ctx.device)          # this rank's K shard
    b = torch.randn(32, 48, device=ctx.device)
    out = torch.empty(64, 48, device=ctx.device)
    ops.matmul_all_reduce(ctx, out, a, b)               # out = sum over ranks of a @ b

``config=ops.Config(variant=..., block_m=..., ...)`` forces a strategy or tiling; see
docs/fused-ops.md. Inside ``torch.compile`` each call is a torch operator
(``torch.ops.iris.matmul_all_reduce`` ...; differentiable forms in :mod:`iris.collectives.functional`,
layers in :mod:`iris.collectives.nn`); in eager mode it launches its kernel directly.
"""

from .._workspace import clear as clear_workspaces
from ._all_gather_matmul import all_gather_matmul
from ._all_reduce_rmsnorm import all_reduce_residual_rmsnorm
from ._config import DEFAULTS, VARIANTS, Config, choose
from ._matmul_all_gather import matmul_all_gather
from ._matmul_all_reduce import matmul_all_reduce
from ._matmul_reduce_scatter import matmul_reduce_scatter

__all__ = [
    "DEFAULTS",
    "VARIANTS",
    "Config",
    "all_gather_matmul",
    "all_reduce_residual_rmsnorm",
    "choose",
    "clear_workspaces",
    "matmul_all_gather",
    "matmul_all_reduce",
    "matmul_reduce_scatter",
]
