"""iris.collectives.functional: the host collectives and fused ops as torch operators, for
``torch.compile`` and autograd.

Each function returns a new tensor (no ``out``) and calls a torch operator (``torch.ops.iris.*``,
registered with ``torch.library``): inside ``torch.compile(model, fullgraph=True)`` it is one node
of the graph, not a graph break, and CUDA graphs (``mode="reduce-overhead"``) replay it; autograd
differentiates it. The front doors ``ccl.all_reduce(ctx, out, inp)`` and ``ops.matmul_all_reduce(ctx,
out, a, b)`` call the same operators while they are being compiled, and launch their kernels
directly otherwise (the operator's dispatch costs more host time than their whole call).

- :func:`all_reduce`, :func:`reduce_scatter`, :func:`all_gather`, :func:`all_to_all`,
  :func:`broadcast`: as in :mod:`iris.collectives.ccl`, ``x`` in, the result out;
- :func:`all_to_all_v` ``(ctx, x, in_splits, capacity=None)``: ``(out, out_splits, out_offsets)``,
  split sizes on the device; gradient: the rows' gradients sent back the way they came;
- :func:`moe_dispatch` and :func:`moe_combine`: expert parallelism (as :mod:`iris.collectives.moe`),
  differentiable: ``combine``'s gradient is a dispatch of ``y``'s gradient (and, for the weights,
  the rows' dot products brought back), ``dispatch``'s a combine of the rows' gradients;
- :func:`send` and :func:`recv` (point to point, no gradient): ``recv(ctx, shape, dtype, src)``
  returns a new tensor;
- :func:`matmul_all_reduce`, :func:`matmul_reduce_scatter`, :func:`all_gather_matmul`,
  :func:`matmul_all_gather`: as in :mod:`iris.collectives.ops`, ``(ctx, a, b, bias=None,
  config=None, out_dtype=None)``, the result in ``out_dtype`` (default ``a``'s);
- :func:`all_reduce_residual_rmsnorm`: ``(out, residual_out)`` of the op of that name (an inference
  op: no gradient).

Gradients: each rank's tensors are its own variables, a rank's gradient of a result is its own
part, and an input's gradient sums the parts of every rank's results that used it: the exact
adjoint of the forward. ``all_gather``'s gradient is a ``reduce_scatter``, ``reduce_scatter``'s an
``all_gather``, ``all_gather_matmul``'s (for its input) a ``matmul_reduce_scatter`` and
``matmul_reduce_scatter``'s an ``all_gather_matmul``; ``broadcast`` sums onto its source. One
exception, tensor parallelism's convention (Megatron-LM's): the all-reduces (``all_reduce``,
``matmul_all_reduce``) make a replicated result that every rank then consumes the same way, so
every rank holds the whole gradient, the same, and it passes back as it is, with no
communication; ``matmul_all_reduce``'s bias, added once, is one value with that gradient's sums.
A tensor that is the same on every rank and that each rank consumes its own way (the input of a
column-parallel layer, a bias added to each rank's own rows) gets its gradients summed over the
ranks with :func:`sum_gradients`; the layers of :mod:`iris.collectives.nn` do that. Only
``op="sum"`` and ``"avg"`` reductions are differentiable. Every rank must ask for the same
gradients (a backward may communicate).

Groups: every function above but ``moe_dispatch``, ``moe_combine``, ``send`` and ``recv``, and
:func:`sum_gradients`, takes ``group=`` (an :class:`iris.runtime.Group` of ``ctx``, from
``ctx.new_group(ranks)``; None: every rank), and then runs on the group's members only, with
the group's rank and size (a ``src`` is a group rank), in autograd and under ``torch.compile``
alike: results and gradients are those of the same call on a context of just those ranks (the
backward of a call on a group communicates on the same group: ``all_gather``'s is a
``reduce_scatter`` over the group). A group of another context raises
:class:`iris.runtime.GroupError`; a rank outside a group holds no ``Group`` (``new_group`` gave it
None), and ``group=None`` there means every rank.

The operators take the context, or the group, as a small integer handle (see :func:`handle_of`)
and a config as a string: torch operators take no Python objects.
"""

from __future__ import annotations

import torch

from iris.runtime import IrisUsageError

from ..ccl._config import Config as _CclConfig
from ..ops._config import Config as _OpsConfig

# registers the operators, and the front doors' compiled form (_front)
from . import _collective_ops, _front, _fused_ops, _moe_ops, _norm_ops, _p2p_ops  # noqa: F401
from ._collective_ops import DIFFERENTIABLE_OPS
from ._handles import context_of, encode_config, handle_of
from ._sum_gradients import sum_gradients


def _handle(ctx, group, name: str) -> int:
    # the operators' handle of the context, or of the group that the call runs on
    return handle_of(ctx, group, f"iris.collectives.functional.{name}")


def _ccl_config(config, name: str) -> str:
    return encode_config(config, _CclConfig, f"iris.collectives.functional.{name}")


def _ops_config(config, name: str) -> str:
    return encode_config(config, _OpsConfig, f"iris.collectives.functional.{name}")


def all_reduce(ctx, x: torch.Tensor, op: str = "sum", config=None, group=None) -> torch.Tensor:
    """``op`` (``"sum"``, ``"avg"``, ``"max"``, ``"min"``, ``"prod"``) over every rank's ``x``, as a new
    tensor. Gradient (sum, avg): the output's, passed back as it is (divided by the world size for avg).
    ``group``: see the module's docstring."""
    return torch.ops.iris.all_reduce(_handle(ctx, group, "all_reduce"), x, op, _ccl_config(config, "all_reduce"))


def reduce_scatter(ctx, x: torch.Tensor, op: str = "sum", config=None, group=None) -> torch.Tensor:
    """Chunk ``rank`` along dim 0 of ``op`` over every rank's ``x`` (``x.shape[0]`` a multiple of the
    world size). Gradient: every rank's gradient, all-gathered."""
    return torch.ops.iris.reduce_scatter(_handle(ctx, group, "reduce_scatter"), x, op,
                                         _ccl_config(config, "reduce_scatter"))


def all_gather(ctx, x: torch.Tensor, config=None, group=None) -> torch.Tensor:
    """Every rank's ``x`` concatenated along dim 0, in rank order. Gradient: every rank's gradient,
    reduce-scattered (summed over the ranks, this rank's rows)."""
    return torch.ops.iris.all_gather(_handle(ctx, group, "all_gather"), x, _ccl_config(config, "all_gather"))


def all_to_all(ctx, x: torch.Tensor, config=None, group=None) -> torch.Tensor:
    """Chunk ``j`` along dim 0 of ``x`` to rank ``j``; chunk ``i`` of the result came from rank ``i``.
    Gradient: the same exchange of the output's gradient."""
    return torch.ops.iris.all_to_all(_handle(ctx, group, "all_to_all"), x, _ccl_config(config, "all_to_all"))


def broadcast(ctx, x: torch.Tensor, src: int, config=None, group=None) -> torch.Tensor:
    """Rank ``src``'s ``x`` on every rank, as a new tensor. Gradient: every rank's, summed, on rank
    ``src``; zero elsewhere. On a group, ``src`` is a group rank."""
    return torch.ops.iris.broadcast(_handle(ctx, group, "broadcast"), x, src, _ccl_config(config, "broadcast"))


def all_to_all_v(ctx, x: torch.Tensor, in_splits: torch.Tensor, capacity: int | None = None, config=None,
                 group=None):
    """``(out, out_splits, out_offsets)``: :func:`iris.collectives.ccl.all_to_all_v` of ``x`` (rows along
    dim 0, ``in_splits[j]`` of them to rank ``j``, in order) into a new ``out`` of ``capacity`` rows
    (default: world size x ``x``'s rows, all that can arrive; zeros past the received rows), and
    the received counts and their offsets (int64, on the device). Gradient: ``out``'s gradient
    sent back the way the rows came (zeros for the rows of ``x`` that were not sent)."""
    handle = _handle(ctx, group, "all_to_all_v")
    if capacity is None:
        capacity = (ctx if group is None else group).world_size * x.shape[0]
    return torch.ops.iris.all_to_all_v(handle, x, in_splits, capacity, _ccl_config(config, "all_to_all_v"))


def moe_dispatch(ctx, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, num_experts: int, *,
                 capacity: int | None = None, expert_capacity: int | None = None, max_tokens: int | None = None,
                 config=None, group=None):
    """:func:`iris.collectives.moe.dispatch` as the torch operator ``iris::moe_dispatch``:
    ``(expert_x, ExpertMeta, MoEHandle)``, differentiable in ``x`` and ``topk_weights``. ``group``:
    the experts on the group's members (see ``moe.dispatch``); pass it to :func:`moe_combine` too."""
    from ..moe import _dispatch as d
    from ..moe._handle import ExpertMeta, MoEHandle

    handle_id = _handle(ctx, group, "moe_dispatch")  # checks the group
    on = ctx if group is None else group
    if not isinstance(x, torch.Tensor) or not isinstance(topk_idx, torch.Tensor) or x.dim() != 2 or \
            topk_idx.dim() != 2:
        d.check_routing(d.DISPATCH, on, x, topk_idx, topk_weights)  # says what is wrong
    s = d.Sizes(on, d.DISPATCH, x.shape[0], x.shape[1], topk_idx.shape[1], num_experts, capacity, expert_capacity,
                max_tokens)
    text = _ccl_config(config, "moe_dispatch")
    expert_x, counts, offsets, row_weights, layout = torch.ops.iris.moe_dispatch(
        handle_id, x, topk_idx, topk_weights, num_experts, s.capacity, s.expert_capacity, s.max_tokens, text)
    handle = MoEHandle(layout, topk_idx, topk_weights, row_weights, num_experts, s.capacity, s.expert_capacity,
                       s.max_tokens, text)
    return expert_x, ExpertMeta(counts, offsets, row_weights), handle


def moe_combine(ctx, expert_y: torch.Tensor, handle, group=None) -> torch.Tensor:
    """:func:`iris.collectives.moe.combine` as the torch operator ``iris::moe_combine``: ``y``,
    differentiable in ``expert_y`` and the dispatch's ``topk_weights``. ``group``: the one
    :func:`moe_dispatch` ran on."""
    from ..moe._handle import MoEHandle

    if not isinstance(handle, MoEHandle):
        raise IrisUsageError(f"iris.collectives.functional.moe_combine: handle={type(handle).__name__} is not the "
                             f"MoEHandle that moe_dispatch returned")
    return torch.ops.iris.moe_combine(_handle(ctx, group, "moe_combine"), expert_y, handle.topk_idx,
                                      handle.topk_weights,
                                      handle.row_weights, handle.layout, handle.num_experts, handle.capacity,
                                      handle.expert_capacity, handle.max_tokens, handle.config)


def send(ctx, x: torch.Tensor, dst: int, tag: int = 0, group=None) -> None:
    """``x`` to rank ``dst`` (see :func:`iris.collectives.ccl.send`), as the operator ``iris::send``:
    one node inside ``torch.compile``, kept as a side effect. No gradient. ``group``: through the
    group's mailboxes, ``dst`` a group rank (``ccl.send``'s ``group=``)."""
    torch.ops.iris.send(_handle(ctx, group, "send"), x, dst, tag)


def recv(ctx, shape, dtype: torch.dtype, src: int, tag: int = 0, group=None) -> torch.Tensor:
    """A new tensor of ``shape`` and ``dtype`` on the context's device holding what rank ``src``
    sends with ``tag`` (see :func:`iris.collectives.ccl.recv`), as the operator ``iris::recv``.
    ``group``: as for :func:`send` (``src`` a group rank)."""
    return torch.ops.iris.recv(_handle(ctx, group, "recv"), list(shape), dtype, src, tag)


def matmul_all_reduce(ctx, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, config=None,
                      out_dtype: torch.dtype | None = None, group=None) -> torch.Tensor:
    """``sum over ranks of a @ b, + bias`` (``a`` ``[M, K/W]``, ``b`` ``[K/W, N]``; the bias the same on
    every rank), replicated: its gradient passes the all-reduce as it is; see
    :func:`iris.collectives.ops.matmul_all_reduce`."""
    return torch.ops.iris.matmul_all_reduce(_handle(ctx, group, "matmul_all_reduce"), a, b, bias,
                                            _ops_config(config, "matmul_all_reduce"), out_dtype)


def matmul_reduce_scatter(ctx, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, config=None,
                          out_dtype: torch.dtype | None = None, group=None) -> torch.Tensor:
    """This rank's ``M / W`` rows of ``sum over ranks of a @ b``, ``+ bias``; ``a``'s gradient is an
    ``all_gather_matmul``; see :func:`iris.collectives.ops.matmul_reduce_scatter`."""
    return torch.ops.iris.matmul_reduce_scatter(_handle(ctx, group, "matmul_reduce_scatter"), a, b, bias,
                                                _ops_config(config, "matmul_reduce_scatter"), out_dtype)


def all_gather_matmul(ctx, a_shard: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, config=None,
                      out_dtype: torch.dtype | None = None, group=None) -> torch.Tensor:
    """``all_gather(a_shard, dim 0) @ b + bias`` with this rank's ``b`` and ``bias`` (a column block);
    ``a_shard``'s gradient is a ``matmul_reduce_scatter``; see
    :func:`iris.collectives.ops.all_gather_matmul`. Where ``b`` needs a gradient, the forward keeps
    the rows it gathered for it when the measured table says that is faster on this device (strategy
    ``unfused``; a ``config`` naming another strategy keeps the fused kernel, and the backward then
    gathers ``a_shard`` again)."""
    return _fused_ops.all_gather_matmul_step(_handle(ctx, group, "all_gather_matmul"), a_shard, b, bias,
                                             _ops_config(config, "all_gather_matmul"), out_dtype)


def matmul_all_gather(ctx, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, config=None,
                      out_dtype: torch.dtype | None = None, group=None) -> torch.Tensor:
    """``all_gather(a @ b + bias, dim 0)``; its gradient is reduce-scattered, then local GEMMs; see
    :func:`iris.collectives.ops.matmul_all_gather`."""
    return torch.ops.iris.matmul_all_gather(_handle(ctx, group, "matmul_all_gather"), a, b, bias,
                                            _ops_config(config, "matmul_all_gather"), out_dtype)


def all_reduce_residual_rmsnorm(ctx, partial: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                                eps: float = 1e-6, scale: torch.Tensor | None = None,
                                out_dtype: torch.dtype | None = None, config=None, group=None):
    """``(out, residual_out)``: ``residual_out = residual + sum over ranks of partial`` and ``out =
    rms_norm(residual_out) * weight`` in ``out_dtype`` (default ``partial``'s), as new tensors; see
    :func:`iris.collectives.ops.all_reduce_residual_rmsnorm`. ``out_dtype=torch.float8_e4m3fn``
    quantises: with ``scale`` (per-tensor, read), or without it per row, and then the result is
    ``(out, residual_out, row_scales)``. No gradient (inference)."""
    out, residual_out, row_scales = torch.ops.iris.all_reduce_residual_rmsnorm(
        _handle(ctx, group, "all_reduce_residual_rmsnorm"), partial, residual, weight, eps, scale, out_dtype,
        _ops_config(config, "all_reduce_residual_rmsnorm"))
    return (out, residual_out, row_scales) if row_scales.numel() else (out, residual_out)


__all__ = [
    "DIFFERENTIABLE_OPS",
    "all_gather",
    "all_gather_matmul",
    "all_reduce",
    "all_reduce_residual_rmsnorm",
    "all_to_all",
    "all_to_all_v",
    "broadcast",
    "context_of",
    "handle_of",
    "matmul_all_gather",
    "matmul_all_reduce",
    "matmul_reduce_scatter",
    "moe_combine",
    "moe_dispatch",
    "recv",
    "reduce_scatter",
    "send",
    "sum_gradients",
]
