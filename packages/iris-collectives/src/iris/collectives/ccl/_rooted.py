"""``reduce``, ``gather`` and ``scatter`` from the host: collectives with a root.

Each is one kernel on torch's current stream, built like the others: ``reduce`` is the one-shot
all-reduce's protocol in which only the root reads and reduces (in rank order, so its result is
bit for bit the all-reduce's), ``gather`` and ``scatter`` are modes of the pull kernel (only the
root pulls every rank's part; every rank pulls its chunk of the root's tensor). The root is a
kernel argument, not a compile-time one: any rank may be the root, call after call, and a CUDA
graph replays the root it captured. Tensors only the root has (``reduce``'s and ``gather``'s
``out``, ``scatter``'s ``inp``) may be ``None`` on the other ranks.

The call agreement (``iris.collectives._agree``) compares what every rank passes alike: the root,
the op and config, and the tensors every rank has (``reduce``'s and ``gather``'s ``inp``,
``scatter``'s ``out``), with where the root reads them in place. The root's own tensor is checked
against those on the root alone (its shape follows from theirs), so it is no part of the
signature. Each root's plan carries its own agreed call, as broadcast's does.
"""

from __future__ import annotations

import torch

from iris.runtime import IrisUsageError

from .._agree import agree
from .._sync import LOCK_WORDS
from . import _checks, _launch, _ranks
from ._config import choose
from ._groups import on_group
from ._kernels import reduce_kernel
from ._move import _plan_pull


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def reduce(ctx, out: torch.Tensor | None, inp: torch.Tensor, dst: int, op: str = "sum",
           config=None, group=None) -> torch.Tensor | None:
    """``out = op(inp of every rank)`` on rank ``dst``, element by element; returns ``out``.

    Like ``torch.distributed.reduce`` (out of place): ``op`` is ``"sum"``, ``"avg"``, ``"max"``,
    ``"min"`` or ``"prod"``; dtypes and rounding as :func:`all_reduce` (fp16 and bf16 reduced in
    fp32, rounded once; in rank order, so ``dst`` gets bit for bit what an all-reduce gives).
    ``out`` has ``inp``'s shape and dtype on ``dst`` and may be ``inp``; other ranks' ``out`` is
    not touched and may be ``None``. Collective: every rank passes the same ``dst``, shapes,
    dtype, op and config. ``config``: block, width, grid, warps, rounds (variant ``one_shot``).
    ``group``: an :class:`iris.runtime.Group` of the context to reduce over its members only
    (``dst`` a group rank); None: every rank.
    """
    call = "iris.collectives.ccl.reduce"
    if group is not None:
        ctx = on_group(ctx, group, call)
    root = _ranks.global_rank(ctx, dst, call, "dst")
    if ctx.rank != root and out is None:
        out = inp  # never written: the kernel writes out on the root alone
    reach = _launch.agreed_reach(ctx, config, inp)  # the root reads the others' inp
    # the root in the key: each root's plan carries its own agreed call (still a run-time argument)
    key = _launch.call_key(("reduce", op, root), config, out, inp, reach)
    _launch.call(ctx, key, lambda: _plan_reduce(ctx, key, out, inp, root, op, config, reach), out, inp, root)
    return out if ctx.rank == root else None


def _plan_reduce(ctx, key, out, inp, root, op, config, reach=None):
    call = "iris.collectives.ccl.reduce"
    _checks.check_tensor(call, ctx, "inp", inp)
    code = _checks.check_op(call, op, inp.dtype)
    if ctx.rank == root:
        _checks.check_tensor(call, ctx, "out", out)
        _checks.check_same_dtype(call, out, inp)
        if out.shape != inp.shape:
            raise IrisUsageError(f"{call}: out has shape {tuple(out.shape)} but inp {tuple(inp.shape)}; pass an out "
                                 f"of inp's shape on the root (or out=inp, in place)")
        _checks.check_disjoint(call, out, inp, same_allowed=True)
    W, n = ctx.world_size, inp.numel()
    cfg = choose("reduce", n * inp.element_size(), _dtype_name(inp.dtype), W, ctx.device.type, config,
                 ranks_per_gpu=ctx.ranks_on_device)
    # a valid call: agree on it with every rank (the root reads the others' inp where it is)
    fp = agree(ctx, call, (("inp", inp),), placed=("inp",), reach=None if reach is None else {"inp": reach[0]},
               dst=root, op=op, config=config)
    in_place, in_bases = _launch.peer_reach(ctx, inp, reach[0] if reach else None)
    stage_in = W > 1 and not in_place
    block, width = cfg.block, cfg.width
    chunk = _launch.round_elements(cfg, n, stage_in)
    tiles = -(-chunk // block)
    cap = _launch.capacity(tiles)
    ws_key = ("ccl.reduce", inp.dtype, W, cfg.variant, block, width, cap, stage_in)

    def make(ctx):
        buffers = {"locks": ctx.zeros(cap * LOCK_WORDS, dtype=torch.int32)}
        if stage_in:
            buffers["stage"] = ctx.zeros(cap * block, dtype=inp.dtype)
        return buffers

    ws = _launch.workspace(ctx, ws_key, make)
    context, locks, stage = ctx.get_device_context(), ws.buffers["locks"], ws.buffers.get("stage")
    src = inp if stage is None else stage
    src_bases = ctx.get_heap_bases() if stage_in else in_bases
    constexprs = dict(world_size=W, OP=code, STAGE_IN=stage_in, BLOCK_M=block // width, BLOCK_N=width)
    rank = ctx.rank  # a run-time argument: one compiled kernel for every rank
    args = (context, inp, src, out, locks, src_bases, n, chunk, fp, rank, root)
    run = _launch.launcher(ctx, ws, reduce_kernel, tiles, cap, cfg, args, constexprs, root_last=True)

    def plan(out, inp, root):
        run(context, inp, src, out, locks, src_bases, n, chunk, fp, rank, root)
        _launch.promote(ctx, key, run)

    return plan


def gather(ctx, out: torch.Tensor | None, inp: torch.Tensor, dst: int, config=None,
           group=None) -> torch.Tensor | None:
    """``out`` on rank ``dst`` = every rank's ``inp`` concatenated along dim 0, in rank order;
    returns ``out``.

    Like ``torch.distributed.gather`` into one tensor: on ``dst``, ``out.numel() == W *
    inp.numel()`` and ``out.shape[0] == W * inp.shape[0]``, same dtype, no overlap; other ranks'
    ``out`` is not touched and may be ``None``. The root pulls each rank's ``inp`` from the heap
    (staged there inside the kernel when it is not on the heap). Collective: every rank passes the
    same ``dst``, shapes and dtype. ``group``: as for :func:`reduce` (``W`` the group's size).
    """
    call = "iris.collectives.ccl.gather"
    if group is not None:
        ctx = on_group(ctx, group, call)
    root = _ranks.global_rank(ctx, dst, call, "dst")
    if ctx.rank != root and out is None:
        out = inp  # never written
    reach = _launch.agreed_reach(ctx, config, inp)  # decided by inp alone: the same on every rank

    def make():
        _checks.check_tensor(call, ctx, "inp", inp)
        if ctx.rank == root:
            _checks.check_tensor(call, ctx, "out", out)
            _checks.check_same_dtype(call, out, inp)
            _checks.check_disjoint(call, out, inp, same_allowed=False)
            _checks.check_dim0(call, "out", out, "inp", inp, _ranks.group_size(ctx))
        return _plan_pull(ctx, key, "gather", out, inp, inp.numel(), config, reach, agreed=(("inp", inp),),
                          dst=root)

    key = _launch.call_key(("gather", root), config, out, inp, reach)
    _launch.call(ctx, key, make, out, inp, root)
    return out if ctx.rank == root else None


def scatter(ctx, out: torch.Tensor, inp: torch.Tensor | None, src: int, config=None, group=None) -> torch.Tensor:
    """Rank ``r``'s ``out`` = chunk ``r`` along dim 0 of rank ``src``'s ``inp``; returns ``out``.

    Like ``torch.distributed.scatter`` from one tensor: on ``src``, ``inp.numel() == W *
    out.numel()`` and ``inp.shape[0] == W * out.shape[0]``, same dtype, no overlap; other ranks'
    ``inp`` is not read and may be ``None``. The root stages its chunks on the heap inside the
    kernel (always: the other ranks cannot know where its ``inp`` lies) and every rank pulls its
    own. Collective: every rank passes the same ``src``, ``out`` shape and dtype. ``group``: as
    for :func:`reduce` (``src`` a group rank, ``W`` the group's size).
    """
    call = "iris.collectives.ccl.scatter"
    if group is not None:
        ctx = on_group(ctx, group, call)
    root = _ranks.global_rank(ctx, src, call, "src")
    if ctx.rank != root and inp is None:
        inp = out  # never read

    def make():
        _checks.check_tensor(call, ctx, "out", out)
        W = _ranks.group_size(ctx)
        if ctx.rank == root:
            _checks.check_tensor(call, ctx, "inp", inp)
            _checks.check_same_dtype(call, out, inp)
            _checks.check_disjoint(call, out, inp, same_allowed=False)
            _checks.check_dim0(call, "inp", inp, "out", out, W)
        # the table's row by the root's message, which every rank knows from its own out
        return _plan_pull(ctx, key, "scatter", out, inp, out.numel(), config, nbytes=W * out.numel() *
                          out.element_size(), stage=True, agreed=(("out", out),), src=root)

    key = _launch.call_key(("scatter", root), config, out, inp)
    _launch.call(ctx, key, make, out, inp, root)
    return out
