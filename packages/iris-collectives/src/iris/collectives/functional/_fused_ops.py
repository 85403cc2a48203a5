"""The fused GEMM + communication ops as torch operators: ``iris::matmul_all_reduce``,
``matmul_reduce_scatter``, ``all_gather_matmul`` and ``matmul_all_gather``, each
``(int ctx, Tensor a, Tensor b, Tensor? bias=None, str config="", ScalarType? out_dtype=None) -> Tensor``,
with fake (shape) implementations and gradients built from the library's own ops.

Opaque ``custom_op`` nodes to the compiler, for the reasons given in :mod:`._collective_ops`.

Gradients (the convention of :mod:`iris.collectives.functional`; ``g`` is this rank's gradient of
the result, cast to the inputs' dtype first; ``b`` and ``bias`` are this rank's):

- ``matmul_all_reduce``, ``out = sum_p a_p @ b_p + bias``, replicated and consumed the same way on
  every rank: ``g`` is the whole gradient, the same on every rank, and passes the all-reduce as it
  is: ``da = g @ b^T``, ``db = a^T @ g``, ``dbias = g.sum(0)`` (the bias is added once: one value).
- ``all_gather_matmul``, ``out_r = A @ b_r + bias_r`` with ``A = cat_p a_p``: ``A``'s gradient is
  the sum over ranks of ``g_q @ b_q^T``, of which this rank's rows are ``a_r``'s:
  ``da = matmul_reduce_scatter(g, b^T)``; ``db = all_gather(a)^T @ g``; ``dbias = g.sum(0)``.
- ``matmul_reduce_scatter``, ``out_r = (sum_p a_p @ b_p)[rows of r] + bias_r``: the sum's gradient
  is every rank's ``g`` gathered, ``G``: ``da = G @ b^T``, ``db = a^T @ G``, ``dbias = g.sum(0)``.
  With both ``da`` and ``db`` wanted (training), ``G = all_gather(g)`` once and two GEMMs; with
  ``da`` alone (frozen weights), the fused ``all_gather_matmul(g, b^T)``.
- ``matmul_all_gather``, ``out = cat_p (a_p @ b_p + bias_p)``: this rank's product's gradient is
  the sum of every rank's gradient of its rows, ``g_r = reduce_scatter(g)``: ``da = g_r @ b^T``,
  ``db = a^T @ g_r``, ``dbias = g_r.sum(0)``.

A bias or weight that is one value on every rank but used by each rank's own rows (the bias of a
sequence-parallel row layer) needs its gradients summed over the ranks:
:func:`iris.collectives.functional.sum_gradients` does it, the layers of :mod:`iris.collectives.nn`
use it.

``iris::all_gather_matmul_gathered``, with the same arguments, returns ``(out, A)``: the gathered
rows too (strategy ``unfused`` with ``gathered=``), which its gradient keeps for ``db = A^T @ g``
(as torch's ``fused_all_gather_matmul`` does, at the cost of keeping ``A`` alive until the
backward); a gradient of ``A`` itself, if any, is reduce-scattered into ``da``. ``all_gather_matmul``
in a training step takes it where :func:`iris.collectives.ops._config.keeps_gathered` says so
(:func:`all_gather_matmul_step`); otherwise its gradient gathers ``A`` again for ``db``: the fused
strategies never hold the whole ``A``.
"""

from __future__ import annotations

import torch

from iris.runtime import IrisUsageError

from ..ops._config import Config, keeps_gathered
from ._handles import config_field, context_of, decode_config, world_size_of


def _run(name: str, handle: int, config: str):
    # The context and decoded config of one operator call, and the front door it runs through.
    from .. import ops  # at call time: the ops' front doors import this package when compiled

    return context_of(handle, f"iris::{name}"), decode_config(config, Config), getattr(ops, name)


def _world(handle: int, name: str) -> int:
    return context_of(handle, f"iris::{name}").world_size


def _out_shape(name: str, a, b, world_size: int) -> tuple:
    """The result's shape (see the table in docs/fused-ops.md)."""
    if a.dim() != 2 or b.dim() != 2:
        raise IrisUsageError(f"iris::{name}: a and b must be 2-D, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    rows, n = a.shape[0], b.shape[1]
    if name == "matmul_all_reduce":
        return rows, n
    if name == "matmul_reduce_scatter":
        if rows % world_size:
            raise IrisUsageError(f"iris::{name}: a has M={rows} rows, which {world_size} ranks cannot split evenly; "
                                 f"pad M to a multiple of {world_size}")
        return rows // world_size, n
    return world_size * rows, n  # the all-gathers


#: Every fused operator's schema (given, not inferred: see ``_collective_ops``).
SCHEMA = '(int ctx, Tensor a, Tensor b, Tensor? bias=None, str config="", ScalarType? out_dtype=None) -> Tensor'


def _register(name: str):
    """Define ``iris::<name>`` (its eager and fake implementations); returns the operator."""

    def impl(ctx: int, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, config: str = "",
             out_dtype: torch.dtype | None = None) -> torch.Tensor:
        context, cfg, front = _run(name, ctx, config)
        # The kernels read a through tensor descriptors only row-major, and b row-major or
        # column-major (the layers' weight.t() and the backward's b.t() are column-major: read in
        # place). Any other layout would take the pointer path (the compiled MLP of
        # benchmarks/fused_ops.py --mlp took 1.2x the time of its ops alone when weight.t() did):
        # a copy costs about 2 x the tensor's bytes of traffic, far less.
        shape = _out_shape(name, a, b, context.world_size)  # first: it checks that both are 2-D
        a = a if a.stride(1) == 1 else a.contiguous()
        b = b if 1 in b.stride() else b.contiguous()
        out = a.new_empty(shape, dtype=out_dtype or a.dtype)
        return front(context, out, a, b, None if bias is None else bias.contiguous(), config=cfg)

    impl.__name__ = name
    impl.__doc__ = f"``iris.collectives.ops.{name}`` into a new tensor of ``out_dtype`` (default: ``a``'s)."
    op = torch.library.custom_op(f"iris::{name}", impl, mutates_args=(), schema=SCHEMA)

    @op.register_fake
    def _(ctx, a, b, bias=None, config="", out_dtype=None):
        return a.new_empty(_out_shape(name, a, b, _world(ctx, name)), dtype=out_dtype or a.dtype)

    return op


matmul_all_reduce = _register("matmul_all_reduce")
matmul_reduce_scatter = _register("matmul_reduce_scatter")
all_gather_matmul = _register("all_gather_matmul")
matmul_all_gather = _register("matmul_all_gather")


@torch.library.custom_op("iris::all_gather_matmul_gathered", mutates_args=(),
                         schema='(int ctx, Tensor a, Tensor b, Tensor? bias=None, str config="", '
                                'ScalarType? out_dtype=None) -> (Tensor, Tensor)')
def all_gather_matmul_gathered(ctx: int, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
                               config: str = "", out_dtype: torch.dtype | None = None):
    """``(all_gather(a) @ b + bias, all_gather(a))``: ``iris.collectives.ops.all_gather_matmul`` with
    ``gathered=`` (strategy ``unfused``) into new tensors."""
    context, cfg, front = _run("all_gather_matmul", ctx, config)
    rows, n = _out_shape("all_gather_matmul", a, b, context.world_size)
    b = b if 1 in b.stride() else b.contiguous()
    out = a.new_empty((rows, n), dtype=out_dtype or a.dtype)
    gathered = a.new_empty((rows, a.shape[1]))
    front(context, out, a, b, None if bias is None else bias.contiguous(), config=cfg, gathered=gathered)
    return out, gathered


@all_gather_matmul_gathered.register_fake
def _(ctx, a, b, bias=None, config="", out_dtype=None):
    rows, n = _out_shape("all_gather_matmul", a, b, _world(ctx, "all_gather_matmul"))
    return a.new_empty((rows, n), dtype=out_dtype or a.dtype), a.new_empty((rows, a.shape[1]))


def _setup(ctx, inputs, output):
    handle, a, b, bias = inputs[:4]
    ctx.handle = handle
    ctx.save_for_backward(a, b)
    ctx.bias_dtype = None if bias is None else bias.dtype


def _needs(ctx) -> tuple:
    # Which of (ctx, a, b, bias) need a gradient. The dispatcher drops trailing arguments equal to
    # their defaults (bias=None, ...) before autograd sees them: pad.
    return (*ctx.needs_input_grad, False, False, False, False)[:4]


def _grads(ctx, da, db, dbias):
    # Gradients in the inputs' dtypes, None where none is needed.
    a, b = ctx.saved_tensors
    need = _needs(ctx)
    return (None, da.to(a.dtype) if need[1] else None, db.to(b.dtype) if need[2] else None,
            dbias.to(ctx.bias_dtype) if need[3] and ctx.bias_dtype is not None else None, None, None)


def _matmul_all_reduce_backward(ctx, grad):
    a, b = ctx.saved_tensors
    need = _needs(ctx)
    g = grad.to(a.dtype)
    da = g @ b.t() if need[1] else None
    db = a.t() @ g if need[2] else None
    dbias = g.sum(0) if need[3] else None
    return _grads(ctx, da, db, dbias)


def _all_gather_matmul_backward(ctx, grad):
    a, b = ctx.saved_tensors
    need = _needs(ctx)
    g = grad.to(a.dtype)
    da = torch.ops.iris.matmul_reduce_scatter(ctx.handle, g, b.t()) if need[1] else None
    db = torch.ops.iris.all_gather(ctx.handle, a.contiguous()).t() @ g if need[2] else None
    dbias = g.sum(0) if need[3] else None
    return _grads(ctx, da, db, dbias)


def _setup_gathered(ctx, inputs, output):
    handle, a, b, bias = inputs[:4]
    ctx.handle = handle
    ctx.save_for_backward(b, output[1])  # the gathered rows give db
    ctx.set_materialize_grads(False)  # the gathered rows' gradient: None, not zeros, when unused
    ctx.a_dtype, ctx.bias_dtype = a.dtype, None if bias is None else bias.dtype


def _all_gather_matmul_gathered_backward(ctx, grad, grad_gathered):
    b, gathered = ctx.saved_tensors
    need = _needs(ctx)
    g = grad.to(ctx.a_dtype)
    da = torch.ops.iris.matmul_reduce_scatter(ctx.handle, g, b.t()) if need[1] else None
    if need[1] and grad_gathered is not None:  # the caller used the gathered rows too
        da = da + torch.ops.iris.reduce_scatter(ctx.handle, grad_gathered.to(da.dtype).contiguous())
    db = gathered.t() @ g if need[2] else None
    dbias = g.sum(0) if need[3] else None
    return (None, None if da is None else da.to(ctx.a_dtype), None if db is None else db.to(b.dtype),
            dbias.to(ctx.bias_dtype) if need[3] and ctx.bias_dtype is not None else None, None, None)


def all_gather_matmul_step(handle: int, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, config: str,
                           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``iris::all_gather_matmul``'s result through the operator a training step wants: where ``b``
    needs a gradient and :func:`~iris.collectives.ops._config.keeps_gathered` says so for the call
    (by its config, device and shape), ``iris::all_gather_matmul_gathered``, whose gradient reuses
    the rows the forward gathered; else ``iris::all_gather_matmul``. Decided as the call is made (or
    traced: the compiler guards on grad mode and ``requires_grad``)."""
    if torch.is_grad_enabled() and b.requires_grad and a.dim() == 2 and b.dim() == 2:
        # string and int work only, which the compiler traces: no context looked up, no config decoded
        W = world_size_of(handle)
        if keeps_gathered(a.shape[0] * W, b.shape[1], a.shape[1], W, a.device.type, config_field(config, "variant")):
            return torch.ops.iris.all_gather_matmul_gathered(handle, a, b, bias, config, out_dtype)[0]
    return torch.ops.iris.all_gather_matmul(handle, a, b, bias, config, out_dtype)


def _matmul_reduce_scatter_backward(ctx, grad):
    a, b = ctx.saved_tensors
    need = _needs(ctx)
    g = grad.to(a.dtype).contiguous()
    if need[1] and need[2]:
        # Both products read every rank's g. The fused op would hide at most the one gather inside
        # it behind its GEMM, and db would pay a second one in full: gather once, multiply twice.
        gathered = torch.ops.iris.all_gather(ctx.handle, g)
        da, db = gathered @ b.t(), a.t() @ gathered
    else:
        da = torch.ops.iris.all_gather_matmul(ctx.handle, g, b.t()) if need[1] else None
        db = a.t() @ torch.ops.iris.all_gather(ctx.handle, g) if need[2] else None
    dbias = g.sum(0) if need[3] else None
    return _grads(ctx, da, db, dbias)


def _matmul_all_gather_backward(ctx, grad):
    a, b = ctx.saved_tensors
    need = _needs(ctx)
    g = torch.ops.iris.reduce_scatter(ctx.handle, grad.to(a.dtype).contiguous())
    da = g @ b.t() if need[1] else None
    db = a.t() @ g if need[2] else None
    dbias = g.sum(0) if need[3] else None
    return _grads(ctx, da, db, dbias)


matmul_all_reduce.register_autograd(_matmul_all_reduce_backward, setup_context=_setup)
all_gather_matmul.register_autograd(_all_gather_matmul_backward, setup_context=_setup)
all_gather_matmul_gathered.register_autograd(_all_gather_matmul_gathered_backward, setup_context=_setup_gathered)
matmul_reduce_scatter.register_autograd(_matmul_reduce_scatter_backward, setup_context=_setup)
matmul_all_gather.register_autograd(_matmul_all_gather_backward, setup_context=_setup)
