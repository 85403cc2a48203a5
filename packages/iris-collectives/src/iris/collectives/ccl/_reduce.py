"""``all_reduce`` and ``reduce_scatter`` from the host."""

from __future__ import annotations

import torch

from iris.runtime import IrisUsageError

from .._agree import agree
from .._compiling import is_compiling, traced
from .._sync import LOCK_WORDS
from . import _checks, _launch
from ._config import choose
from ._groups import on_group
from ._kernels import all_reduce_kernel, reduce_scatter_kernel


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _tiles(n: int, block: int) -> int:
    return -(-n // block)


def all_reduce(ctx, out: torch.Tensor, inp: torch.Tensor, op: str = "sum", config=None, group=None) -> torch.Tensor:
    """``out = op(inp of every rank)`` on every rank, element by element; returns ``out``.

    ``op``: ``"sum"``, ``"avg"``, ``"max"``, ``"min"`` or ``"prod"``. ``out`` has ``inp``'s shape
    and dtype (fp32, fp64, fp16, bf16, int32, int64; avg needs a float dtype) and may be ``inp`` (in
    place). fp16 and bf16 are reduced in fp32 and rounded once (to nearest even); every rank
    reduces in rank order, so all ranks get bit-identical results. Any contiguous tensor on the
    context's device works: a tensor on the symmetric heap is read by the peers where it is (on
    every rank the same allocation), others are staged through a cached heap buffer inside the
    kernel. Collective: every rank calls it with the same shapes, dtypes, op and config.
    Enqueued on torch's current stream; back-to-back calls need no barrier, and a CUDA graph of
    it replays correctly. ``config``: a :class:`Config` forcing the variant (``one_shot``,
    ``two_shot``) or tiling; see docs/ccl.md. ``group``: an :class:`iris.runtime.Group` of the
    context (``ctx.new_group(ranks)``) to reduce over its members only (in group rank order);
    None: every rank.
    """
    if group is not None:
        ctx = on_group(ctx, group, "iris.collectives.ccl.all_reduce")
    if is_compiling():
        return traced().collective("all_reduce", ctx, out, inp, op, config=config)
    # peers read inp and (two-shot) write out: both reached in place when registered on the fly
    reach = _launch.agreed_reach(ctx, config, inp) if out is inp else _launch.agreed_reach(ctx, config, inp, out)
    key = _launch.call_key(("all_reduce", op), config, out, inp, reach)
    _launch.call(ctx, key, lambda: _plan_all_reduce(ctx, key, out, inp, op, config, reach), out, inp)
    return out


def _plan_all_reduce(ctx, key, out, inp, op, config, reach=None):
    call = "iris.collectives.ccl.all_reduce"
    _checks.check_tensor(call, ctx, "inp", inp)
    _checks.check_tensor(call, ctx, "out", out)
    _checks.check_same_dtype(call, out, inp)
    if out.shape != inp.shape:
        raise IrisUsageError(f"{call}: out has shape {tuple(out.shape)} but inp {tuple(inp.shape)}; pass "
                                     f"an out of inp's shape (or out=inp, in place)")
    code = _checks.check_op(call, op, inp.dtype)
    _checks.check_disjoint(call, out, inp, same_allowed=True)
    W, n = ctx.world_size, inp.numel()
    cfg = choose("all_reduce", n * inp.element_size(), _dtype_name(inp.dtype), W, ctx.device.type, config,
                 ranks_per_gpu=ctx.ranks_on_device)
    # a valid call: agree on it with every rank (peers read inp, and two-shot writes out)
    fp = agree(ctx, call, (("out", out), ("inp", inp)), placed=("out", "inp"),
               reach=None if reach is None else {"inp": reach[0], "out": reach[-1]}, op=op, config=config)
    two_shot = cfg.variant == "two_shot" and W > 1
    buffered = cfg.variant == "one_shot_buffered" and W > 1
    same = out.data_ptr() == inp.data_ptr()
    # whether the peers reach each tensor in place (on the heap or registered), and through which table
    reach = reach or (None, None)
    sym_in, in_bases = _launch.peer_reach(ctx, inp, reach[0])
    sym_out, out_bases = _launch.peer_reach(ctx, out, reach[-1])
    if W == 1:
        stage_in = copy_out = False  # nothing is read by a peer
    elif buffered:
        # Always staged, into the half of the staging buffer that the call's parity picks: the
        # kernel does not wait for the peers to finish reading (see _buffered_one_shot_round).
        stage_in, copy_out = True, False
    elif two_shot:
        # Peers read src and write their shares into dst, which must be on the heap. In place on
        # the heap (src is dst) is safe: a share's rows are read on every rank, and then
        # written on every rank, by its owner alone.
        stage_in, copy_out = not sym_in, not sym_out
    else:
        # One-shot writes the result into out while peers may still read src: in place on the
        # heap, src must be a staging copy.
        stage_in, copy_out = not sym_in or same, False
    block, width = cfg.block, cfg.width
    # rounds of `chunk` elements (whole tiles): staging buffers of one round, reused by the next;
    # for tensors read in place, rounds of `heap_chunk`
    chunk = _launch.round_elements(cfg, n, stage_in or copy_out)
    tiles = _tiles(chunk, block)
    cap = _launch.capacity(tiles)
    ws_key = ("ccl.all_reduce", inp.dtype, W, cfg.variant, block, width, cap, stage_in, copy_out)
    if buffered:
        ws_key += (code, *_launch.grid_key(cfg))  # the op: its own kernel, maybe its own resident grid
    half = cap * block if buffered else 0  # elements between the staging buffer's two halves

    def make(ctx):
        buffers = {"locks": ctx.zeros(cap * LOCK_WORDS, dtype=torch.int32)}
        if stage_in:
            buffers["stage"] = ctx.zeros((2 if buffered else 1) * cap * block, dtype=inp.dtype)
        if copy_out:
            buffers["result"] = ctx.zeros(cap * block, dtype=inp.dtype)
        return buffers

    ws = _launch.workspace(ctx, ws_key, make)
    context, locks = ctx.get_device_context(), ws.buffers["locks"]
    stage, result = ws.buffers.get("stage"), ws.buffers.get("result")
    constexprs = dict(world_size=W, OP=code, TWO_SHOT=two_shot, STAGE_IN=stage_in, COPY_OUT=copy_out,
                      BUFFERED=buffered, BLOCK_M=block // width, BLOCK_N=width)
    rank = ctx.rank  # a run-time argument: one compiled kernel for every rank
    heap = ctx.get_heap_bases()  # the staging and result buffers' table
    src_bases = heap if stage_in else in_bases
    dst_bases = heap if copy_out or not two_shot else out_bases
    args = (context, inp, inp if stage is None else stage, out if result is None else result, out, locks, src_bases,
            dst_bases, n, chunk, half, fp, rank)
    run = _launch.launcher(ctx, ws, all_reduce_kernel, cap if buffered else tiles, cap, cfg, args, constexprs)

    def plan(out, inp):
        run(context, inp, inp if stage is None else stage, out if result is None else result, out, locks, src_bases,
            dst_bases, n, chunk, half, fp, rank)
        _launch.promote(ctx, key, run)

    return plan


def reduce_scatter(ctx, out: torch.Tensor, inp: torch.Tensor, op: str = "sum", config=None,
                   group=None) -> torch.Tensor:
    """Rank ``r``'s ``out`` = ``op`` over every rank of chunk ``r`` of ``inp``; returns ``out``.

    Like ``torch.distributed.reduce_scatter_tensor``: ``inp`` holds ``W`` chunks of
    ``out.numel()`` elements (along dim 0: ``inp.shape[0] == W * out.shape[0]``). ``op``, dtypes,
    rounding, tensors, streams and graphs as for :func:`all_reduce`; ``out`` must not overlap
    ``inp``. Collective. ``group``: as for :func:`all_reduce` (``W`` and ``r`` are the group's).
    """
    if group is not None:
        ctx = on_group(ctx, group, "iris.collectives.ccl.reduce_scatter")
    if is_compiling():
        return traced().collective("reduce_scatter", ctx, out, inp, op, config=config)
    reach = _launch.agreed_reach(ctx, config, inp)  # peers read inp; out is this rank's alone
    key = _launch.call_key(("reduce_scatter", op), config, out, inp, reach)
    _launch.call(ctx, key, lambda: _plan_reduce_scatter(ctx, key, out, inp, op, config, reach), out, inp)
    return out


def _plan_reduce_scatter(ctx, key, out, inp, op, config, reach=None):
    call = "iris.collectives.ccl.reduce_scatter"
    _checks.check_tensor(call, ctx, "inp", inp)
    _checks.check_tensor(call, ctx, "out", out)
    _checks.check_same_dtype(call, out, inp)
    W = ctx.world_size
    _checks.check_dim0(call, "inp", inp, "out", out, W)
    code = _checks.check_op(call, op, inp.dtype)
    _checks.check_disjoint(call, out, inp, same_allowed=False)
    m = out.numel()
    cfg = choose("reduce_scatter", inp.numel() * inp.element_size(), _dtype_name(inp.dtype), W, ctx.device.type,
                 config, ranks_per_gpu=ctx.ranks_on_device)
    fp = agree(ctx, call, (("out", out), ("inp", inp)), placed=("inp",),
               reach=None if reach is None else {"inp": reach[0]}, op=op, config=config)
    block, width = cfg.block, cfg.width
    buffered = cfg.variant == "pull_buffered" and W > 1  # always staged, as all_reduce's one_shot_buffered
    in_place, in_bases = _launch.peer_reach(ctx, inp, reach[0] if reach else None)
    stage_in = W > 1 and (buffered or not in_place)
    chunk = _launch.round_elements(cfg, m, stage_in)  # elements per round
    tiles = _tiles(chunk, block)
    cap = _launch.capacity(tiles)
    ws_key = ("ccl.reduce_scatter", inp.dtype, W, cfg.variant, block, width, cap, stage_in)
    if buffered:
        ws_key += (code, *_launch.grid_key(cfg))
    half = W * cap * block if buffered else 0  # elements between the staging buffer's halves

    def make(ctx):
        buffers = {"locks": ctx.zeros(cap * LOCK_WORDS, dtype=torch.int32)}
        if stage_in:
            # chunk j at j * cap * block: every chunk starts at a tile boundary (aligned loads)
            buffers["stage"] = ctx.zeros((2 if buffered else 1) * W * cap * block, dtype=inp.dtype)
        return buffers

    ws = _launch.workspace(ctx, ws_key, make)
    context, locks, stage = ctx.get_device_context(), ws.buffers["locks"], ws.buffers.get("stage")
    stride = cap * block if stage_in else m
    constexprs = dict(world_size=W, OP=code, STAGE_IN=stage_in, BUFFERED=buffered, BLOCK_M=block // width,
                      BLOCK_N=width)
    rank = ctx.rank  # a run-time argument: one compiled kernel for every rank
    src_bases = ctx.get_heap_bases() if stage_in else in_bases
    args = (context, inp, inp if stage is None else stage, out, locks, src_bases, m, stride, chunk, half, fp, rank)
    run = _launch.launcher(ctx, ws, reduce_scatter_kernel, cap if buffered else tiles, cap, cfg, args, constexprs)

    def plan(out, inp):
        run(context, inp, inp if stage is None else stage, out, locks, src_bases, m, stride, chunk, half, fp, rank)
        _launch.promote(ctx, key, run)

    return plan
