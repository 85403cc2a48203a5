"""``all_gather``, ``all_to_all``, ``broadcast`` and ``barrier`` from the host."""

from __future__ import annotations

import torch

from iris.runtime import IrisUsageError

from .._agree import agree
from .._compiling import is_compiling, traced
from .._sync import BARRIER_WORDS, LOCK_WORDS
from . import _checks, _launch
from ._config import choose
from ._groups import on_group
from ._kernels import ALL_TO_ALL, BROADCAST, GATHER, GATHER_TO_ROOT, SCATTER, barrier_kernel, pull_kernel

_MODES = {"all_gather": GATHER.value, "all_to_all": ALL_TO_ALL.value, "broadcast": BROADCAST.value,
          "gather": GATHER_TO_ROOT.value, "scatter": SCATTER.value}


def _plan_pull(ctx, key, name: str, out, inp, m: int, config, reach=None, nbytes=None, stage=False, agreed=None,
               **options):
    """The plan of a pull collective moving chunks of ``m`` elements (checks done by the caller),
    agreed with every rank once its config is checked (``options``: the call's own, e.g. ``src``).
    ``nbytes``: the message that picks the table's row (default ``inp``'s bytes), the same on
    every rank; ``stage``: stage ``inp`` whether or not the peers could read it in place (scatter,
    whose non-root ranks cannot know where the root's ``inp`` lies). ``agreed``: the ``(name,
    tensor)`` pairs whose shapes every rank passes alike (default ``out`` and ``inp``, or
    broadcast's ``tensor``), the last of them the one the peers read in place."""
    W = ctx.world_size
    nbytes = inp.numel() * inp.element_size() if nbytes is None else nbytes
    cfg = choose(name, nbytes, str(inp.dtype).removeprefix("torch."), W, ctx.device.type, config,
                 ranks_per_gpu=ctx.ranks_on_device)
    if agreed is None:
        agreed = (("tensor", inp),) if name == "broadcast" else (("out", out), ("inp", inp))
    peers_read = () if stage else (agreed[-1][0],)
    fp = agree(ctx, f"iris.collectives.ccl.{name}", agreed, placed=peers_read,
               reach=None if reach is None or stage else {agreed[-1][0]: reach[0]}, **options, config=config)
    block, width = cfg.block, cfg.width
    # pull_buffered always stages, into the half of the staging buffer that the call's parity
    # picks, and skips the wait for the peers' reads (see the kernel's _buffered_one_shot_round)
    buffered = cfg.variant == "pull_buffered" and W > 1
    in_place, in_bases = _launch.peer_reach(ctx, inp, reach[0] if reach else None)
    stage_in = W > 1 and (buffered or stage or not in_place)
    chunk = _launch.round_elements(cfg, m, stage_in)  # elements per round
    tiles = -(-chunk // block)
    cap = _launch.capacity(tiles)
    chunks = W if name in ("all_to_all", "scatter") else 1
    ws_key = (f"ccl.{name}", inp.dtype, W, cfg.variant, block, width, cap, stage_in)
    if buffered:
        ws_key += _launch.grid_key(cfg)
    half = chunks * cap * block if buffered else 0  # elements between the staging buffer's halves

    def make(ctx):
        buffers = {"locks": ctx.zeros(cap * LOCK_WORDS, dtype=torch.int32)}
        if stage_in:
            buffers["stage"] = ctx.zeros((2 if buffered else 1) * chunks * cap * block, dtype=inp.dtype)
        return buffers

    ws = _launch.workspace(ctx, ws_key, make)
    context, locks, stage = ctx.get_device_context(), ws.buffers["locks"], ws.buffers.get("stage")
    stride = cap * block if stage_in else m
    constexprs = dict(world_size=W, MODE=_MODES[name], STAGE_IN=stage_in, BUFFERED=buffered, BLOCK_M=block // width,
                      BLOCK_N=width)
    rank = ctx.rank  # a run-time argument: one compiled kernel for every rank
    src_bases = ctx.get_heap_bases() if stage_in else in_bases
    args = (context, inp, inp if stage is None else stage, out, locks, src_bases, m, stride, chunk, half, fp, rank, 0)
    # root is each call's own (broadcast): the last argument of the fast launch
    run = _launch.launcher(ctx, ws, pull_kernel, cap if buffered else tiles, cap, cfg, args, constexprs,
                           root_last=True)

    def plan(out, inp, root=0):
        run(context, inp, inp if stage is None else stage, out, locks, src_bases, m, stride, chunk, half, fp, rank,
            root)
        _launch.promote(ctx, key, run)

    return plan


def _checked(ctx, call, out, inp):
    _checks.check_tensor(call, ctx, "inp", inp)
    _checks.check_tensor(call, ctx, "out", out)
    _checks.check_same_dtype(call, out, inp)
    _checks.check_disjoint(call, out, inp, same_allowed=False)


def all_gather(ctx, out: torch.Tensor, inp: torch.Tensor, config=None, group=None) -> torch.Tensor:
    """``out`` = every rank's ``inp`` concatenated along dim 0, in rank order; returns ``out``.

    Like ``torch.distributed.all_gather_into_tensor``: ``out.numel() == W * inp.numel()`` and
    ``out.shape[0] == W * inp.shape[0]``; same dtype, no overlap. Every rank pulls each peer's
    ``inp`` from the heap (staged there inside the kernel when ``inp`` is not on the heap), so
    ``out`` may be any tensor. Collective; torch's current stream; no barrier between calls.
    ``group``: an :class:`iris.runtime.Group` of the context to gather over its members only, in
    group rank order (``W`` is the group's size); None: every rank.
    """
    if group is not None:
        ctx = on_group(ctx, group, "iris.collectives.ccl.all_gather")
    if is_compiling():
        return traced().collective("all_gather", ctx, out, inp, config=config)

    def make():
        call = "iris.collectives.ccl.all_gather"
        _checked(ctx, call, out, inp)
        _checks.check_dim0(call, "out", out, "inp", inp, ctx.world_size)
        return _plan_pull(ctx, key, "all_gather", out, inp, inp.numel(), config, reach)

    # peers read inp; out is this rank's alone, but its size is the message's (W times inp's)
    reach = _launch.agreed_reach(ctx, config, inp, message=out)
    key = _launch.call_key("all_gather", config, out, inp, reach)
    _launch.call(ctx, key, make, out, inp, 0)
    return out


def all_to_all(ctx, out: torch.Tensor, inp: torch.Tensor, config=None, group=None) -> torch.Tensor:
    """Chunk ``j`` of rank ``i``'s ``inp`` lands in chunk ``i`` of rank ``j``'s ``out``; returns ``out``.

    Like ``torch.distributed.all_to_all_single`` with equal splits: ``inp`` is ``W`` equal chunks
    along dim 0 (``inp.shape[0]`` a multiple of ``W``), ``out`` has ``inp``'s shape and dtype and
    does not overlap it. Every rank pulls its chunk from each peer's heap copy. Collective.
    ``group``: an :class:`iris.runtime.Group` of the context to exchange among its members only
    (``W`` chunks, ``W`` the group's size, in group rank order); None: every rank.
    """
    if group is not None:
        ctx = on_group(ctx, group, "iris.collectives.ccl.all_to_all")
    if is_compiling():
        return traced().collective("all_to_all", ctx, out, inp, config=config)

    def make():
        call, W = "iris.collectives.ccl.all_to_all", ctx.world_size
        _checked(ctx, call, out, inp)
        if inp.dim() == 0 or inp.shape[0] % W:
            rows = inp.shape[0] if inp.dim() else "no"
            raise IrisUsageError(f"{call}: inp has shape {tuple(inp.shape)} ({rows} rows), which {W} ranks cannot "
                                 f"split into equal chunks along dim 0; pass a multiple of {W} rows")
        if out.shape != inp.shape:
            raise IrisUsageError(f"{call}: out has shape {tuple(out.shape)} but inp {tuple(inp.shape)}; pass an out "
                                 f"of inp's shape")
        return _plan_pull(ctx, key, "all_to_all", out, inp, inp.numel() // W, config, reach)

    reach = _launch.agreed_reach(ctx, config, inp)
    key = _launch.call_key("all_to_all", config, out, inp, reach)
    _launch.call(ctx, key, make, out, inp, 0)
    return out


def broadcast(ctx, tensor: torch.Tensor, src: int, config=None, group=None) -> torch.Tensor:
    """Rank ``src``'s ``tensor`` into ``tensor`` on every rank, in place; returns ``tensor``.

    Like ``torch.distributed.broadcast``. Every rank pulls from ``src``'s heap copy (the tensor
    itself when it is on the heap, else a staging buffer filled inside the kernel). ``src`` is a
    kernel argument, not a compile-time one: any rank may be the source, call after call, and a
    CUDA graph replays the ``src`` it captured. Collective: every rank passes the same ``src``.
    ``group``: an :class:`iris.runtime.Group` of the context to broadcast among its members only;
    ``src`` is then a group rank. None: every rank.
    """
    if group is not None:
        ctx = on_group(ctx, group, "iris.collectives.ccl.broadcast")
    if src.__class__ is not int or not 0 <= src < ctx.world_size:
        ctx.check_rank(src, "iris.collectives.ccl.broadcast(src=...)")
    if is_compiling():
        return traced().broadcast(ctx, tensor, src, config=config)
    if ctx.world_size == 1:
        _checks.check_tensor("iris.collectives.ccl.broadcast", ctx, "tensor", tensor)
        return tensor
    def make():
        call = "iris.collectives.ccl.broadcast"
        _checks.check_tensor(call, ctx, "tensor", tensor)
        return _plan_pull(ctx, key, "broadcast", tensor, tensor, tensor.numel(), config, reach, src=src)

    reach = _launch.agreed_reach(ctx, config, tensor)  # the peers read src's tensor
    # src in the key: each source's plan carries its own agreed call (the kernel still takes src
    # as a run-time argument, so no source compiles anything)
    key = _launch.call_key(("broadcast", src), config, tensor, tensor, reach)
    _launch.call(ctx, key, make, tensor, tensor, src)
    return tensor


def barrier(ctx, group=None) -> None:
    """A device-side barrier on torch's current stream: work enqueued after it on any rank runs
    after the work every rank enqueued before it. One program per rank signals every rank and waits
    for all (``iris.collectives.device_barrier`` on a cached flag pair whose counters only grow);
    the host does not wait. Collective. ``group``: an :class:`iris.runtime.Group` of the context
    to synchronise its members only (None: every rank)."""
    if group is not None:
        ctx = on_group(ctx, group, "iris.collectives.ccl.barrier")
    if is_compiling():
        return traced().barrier(ctx)
    plan = _launch.lookup(ctx, "barrier")
    if plan is None:
        fp = agree(ctx, "iris.collectives.ccl.barrier", ())
        ws = _launch.workspace(ctx, ("ccl.barrier",),
                               lambda ctx: {"flags": ctx.zeros(BARRIER_WORDS, dtype=torch.int32)})
        context, flags = ctx.get_device_context(), ws.buffers["flags"]
        run = barrier_kernel[(1,)]
        rank, W = ctx.rank, ctx.world_size

        def plan():
            run(context, flags, fp, rank, world_size=W)

        _launch.remember(ctx, "barrier", plan)
    plan()
