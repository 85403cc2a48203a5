"""``all_reduce_residual_rmsnorm``: the end of a tensor-parallel layer in one kernel.

``residual_out = residual + all_reduce(partial)`` and ``out = rms_norm(residual_out) * weight``
(optionally quantised to fp8 for the next GEMM), each row reduced once over the ranks, in fp32,
and each output rounded once. One persistent kernel per call, built from the tile collective
:func:`iris.collectives.all_reduce_rmsnorm` (the all-reduce's flags and lock records, with the
norm as its epilogue), and from the host collectives' launch path (:mod:`..ccl._launch`): a call's
key finds a cached plan, whose launch enqueues on torch's current stream with no other host work.

Strategies (:mod:`._norm_config`): ``one_shot`` and ``one_shot_buffered`` (every rank reads every
rank's rows and normalises all of them) and ``two_shot`` (each rank reduces and normalises its
share of the rows and writes the results to every rank). Tensors on the symmetric heap, or
registered, are read (and two-shot's outputs written) where they are; others are staged through
cached heap buffers inside the kernel, as in ``ccl.all_reduce``.
"""

# No "from __future__ import annotations": Triton resolves jit globals by name at compile time.
import torch
import triton
import triton.language as tl

from iris.device import DEBUG
from iris.device._calls import call_begin, call_check, call_peek, call_publish, call_verify

from .._agree import agree
from .._all_reduce import own_share_rows
from .._all_reduce_norm import CALL as DEVICE_CALL
from .._all_reduce_norm import ROW_SCALES, all_reduce_rmsnorm_op, norm_tiles
from .._compiling import is_compiling, traced
from .._context import RuntimeRankContext
from .._sync import ARRIVE, DONE, LOCK_WORDS, enter_range, signal_and_wait_all
from .._views import INDEX_TYPE, TensorView, TileRange
from ..ccl import _launch
from ..ccl._groups import on_group
from ._norm_checks import check_call
from ._norm_config import choose

CALL = "iris.collectives.ops.all_reduce_residual_rmsnorm"


@triton.jit
def _stage(inp, src, tiles, M, N, TWO_SHOT: tl.constexpr, rank, world_size: tl.constexpr,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # This program's rows of inp that peers read, into the heap staging src (two-shot: only the
    # other ranks' shares; this rank's own share is reduced from inp).
    cols = tl.arange(0, BLOCK_N)
    for t in range(tiles.first, tiles.stop, tiles.step):
        rows = t * BLOCK_M + tl.arange(0, BLOCK_M).to(INDEX_TYPE)
        keep = rows < M
        if TWO_SHOT:
            keep = keep & (own_share_rows(t, BLOCK_M, rank, world_size) == 0)
        mask = keep[:, None] & (cols < N)[None, :]
        offsets = rows[:, None] * N + cols[None, :]
        tl.store(src + offsets, tl.load(inp + offsets, mask=mask), mask=mask)


@triton.jit
def _copy_out(tiles, out, out_dst, res_out, res_dst, scale, scale_dst, M, N, WRITE_RESIDUAL: tl.constexpr,
              QUANT: tl.constexpr, rank, world_size: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr):
    # After two-shot's "done": every peer's share of this program's tiles is in the heap result
    # buffers; copy those rows into the caller's outputs (this rank's share went there directly).
    cols = tl.arange(0, BLOCK_N)
    for t in range(tiles.first, tiles.stop, tiles.step):
        rows = t * BLOCK_M + tl.arange(0, BLOCK_M).to(INDEX_TYPE)
        keep = (rows < M) & (own_share_rows(t, BLOCK_M, rank, world_size) == 0)
        mask = keep[:, None] & (cols < N)[None, :]
        offsets = rows[:, None] * N + cols[None, :]
        tl.store(out + offsets, tl.load(out_dst + offsets, mask=mask), mask=mask)
        if WRITE_RESIDUAL:
            tl.store(res_out + offsets, tl.load(res_dst + offsets, mask=mask), mask=mask)
        if QUANT == ROW_SCALES:
            tl.store(scale + rows, tl.load(scale_dst + rows, mask=keep), mask=keep)


@triton.jit(do_not_specialize=["call_fp", "rank"])
def _all_reduce_rmsnorm_kernel(context, partial, src, residual, weight, out, out_dst, res_out, res_dst, scale,
                               scale_dst, locks, src_bases, out_bases, res_bases, scale_bases, M, N, eps, half,
                               call_fp, rank, world_size: tl.constexpr, TWO_SHOT: tl.constexpr,
                               BUFFERED: tl.constexpr, STAGE_IN: tl.constexpr, COPY_OUT: tl.constexpr,
                               HAS_RESIDUAL: tl.constexpr, WRITE_RESIDUAL: tl.constexpr, QUANT: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One call on ``M`` rows of ``N`` values, a persistent grid over tiles of ``BLOCK_M`` whole
    rows (``BLOCK_N >= N``). ``src``: what the peers read (``partial`` itself, or the heap staging
    this kernel fills: ``STAGE_IN``, always with ``BUFFERED``). ``out_dst``, ``res_dst``,
    ``scale_dst``: where the results go (the caller's ``out``, ``res_out`` and row scales, or with
    ``COPY_OUT`` heap buffers that two-shot's peers write into, copied out after "done").
    ``*_bases`` translate them to the peers. ``QUANT``: see ``_all_reduce_norm``; with
    ``TENSOR_SCALE``, ``scale`` is the scale read.

    ``BUFFERED`` (one-shot): the staging buffer has two halves ``half`` elements apart, used by
    turns (the call count's parity), and the call has one flag round trip: "ready", no "done"
    (debug mode keeps it). The next write to a half comes two calls later, after this rank has
    waited for every peer's "ready" of the call in between, which each peer signals after it has
    read this call's half (program order). That needs a tile in the same program in every call of
    the workspace: the host fixes the grid per workspace (the argument of ccl's buffered
    all-reduce).

    ``call_fp``: the fingerprint of the agreed call, checked against the peers' by program 0
    (``iris.device._calls``: published on entry, compared after the waits; the buffered strategy,
    whose protocol is this kernel's own, publishes after its lock record's atomic and staging and
    loads the peers' fingerprints right after its wait, so that the check adds no round trip)."""
    ctx = RuntimeRankContext.initialize(context, rank, world_size)
    pending = call_begin(ctx.heap_bases, rank, world_size)
    tiles = TileRange(tl.program_id(0), (M + BLOCK_M - 1) // BLOCK_M, tl.num_programs(0), 1, BLOCK_M, BLOCK_N)
    dst = TensorView(out_dst, M, N, N, 1)
    if HAS_RESIDUAL:
        residual_view = TensorView(residual, M, N, N, 1)
    else:
        residual_view = None
    if WRITE_RESIDUAL:
        res_view = TensorView(res_dst, M, N, N, 1)
    else:
        res_view = None
    if QUANT == ROW_SCALES:
        scales = scale_dst
    else:
        scales = scale
    if BUFFERED:
        slot, record, epoch = enter_range(tiles, dst, locks, DEVICE_CALL)
        src = src + (epoch % 2) * half
        _stage(partial, src, tiles, M, N, False, rank, world_size, BLOCK_M, BLOCK_N)
        entered = call_publish(ctx.heap_bases, pending, call_fp, rank, world_size)
        # no peer can leave this call before this rank's "ready": their signatures hold
        signal_and_wait_all(ctx, record, ARRIVE, epoch, DEVICE_CALL, "ready", slot, record)
        theirs = call_peek(entered, world_size)
        norm_tiles(ctx, tiles, TensorView(src, M, N, N, 1), dst, weight, eps, residual_view, res_view, scales, QUANT,
                   False, TensorView(partial, M, N, N, 1), None, None, None, src_bases)
        if DEBUG:  # the signatures peers compare while they wait must hold until they have
            signal_and_wait_all(ctx, record, DONE, epoch, DEVICE_CALL, "done", slot)
        call_verify(ctx.heap_bases, call_fp, entered, theirs, rank, world_size)
    else:
        entered = call_publish(ctx.heap_bases, pending, call_fp, rank, world_size)
        if STAGE_IN:
            _stage(partial, src, tiles, M, N, TWO_SHOT, rank, world_size, BLOCK_M, BLOCK_N)
            mine = TensorView(partial, M, N, N, 1)
        else:
            mine = None
        if COPY_OUT:
            local_out = TensorView(out, M, N, N, 1)
            local_scale = scale
            if WRITE_RESIDUAL:
                local_res = TensorView(res_out, M, N, N, 1)
            else:
                local_res = None
        else:
            local_out = None
            local_res = None
            local_scale = None
        all_reduce_rmsnorm_op(ctx, tiles, TensorView(src, M, N, N, 1), dst, locks, weight, eps, residual_view,
                              res_view, scales, QUANT, TWO_SHOT, mine, local_out, local_res, local_scale, src_bases,
                              out_bases, res_bases, scale_bases)
        if COPY_OUT:
            _copy_out(tiles, out, out_dst, res_out, res_dst, scale, scale_dst, M, N, WRITE_RESIDUAL, QUANT, rank,
                      world_size, BLOCK_M, BLOCK_N)
        call_check(ctx.heap_bases, call_fp, entered, rank, world_size)


def all_reduce_residual_rmsnorm(ctx, out: torch.Tensor, residual_out: torch.Tensor | None, partial: torch.Tensor,
                                residual: torch.Tensor | None, weight: torch.Tensor, eps: float = 1e-6,
                                scale: torch.Tensor | None = None, config=None, group=None) -> torch.Tensor:
    """``residual_out = residual + sum over ranks of partial``, ``out = rms_norm(residual_out) *
    weight``, in one kernel, on every rank; returns ``out``.

    ``partial``: this rank's ``[..., hidden]`` activations (its share of a row-parallel GEMM);
    ``residual``: the residual stream, the same on every rank (None: nothing added);
    ``residual_out``: where the new residual goes (None: not written; ``residual`` itself: in
    place); ``weight``: ``[hidden]``. ``partial``, ``residual``, ``residual_out`` and ``out`` have
    one shape and dtype (fp32, fp16 or bf16; ``weight`` any of them); contiguous.

    Each row is summed over the ranks in fp32, in rank order, the residual added in fp32, and the
    new residual and ``out`` each rounded once (to nearest even) from fp32: ``out`` is
    ``torch.nn.functional.rms_norm`` of the fp32 rows (not of the rounded residual), times
    ``weight``; every rank gets the same bits. ``eps``: the norm's epsilon (a float >= 0).

    fp8 (GPU only): an ``out`` of ``torch.float8_e4m3fn`` with ``scale``, float32: of shape ``()``
    or ``(1,)``, a per-tensor scale the call reads (``out = y / scale``); of shape
    ``partial.shape[:-1] + (1,)``, per-row scales the call writes, ``max(amax(|y|) / 448,
    1 / (448 * 512))`` for each row; the quotient saturated at +-448 and rounded to nearest even,
    so ``out.float() * scale`` approximates ``y``, the normalised row in fp32.

    Collective: every rank calls it with the same shapes, dtypes, eps and config; the ranks check
    that they do (the call agreement: else every rank raises ``IrisCallMismatchError``). Enqueued on
    torch's current stream; back-to-back calls need no barrier, and a CUDA graph of it replays
    correctly. ``config``: an :class:`~iris.collectives.ops.Config` forcing ``variant``
    (``one_shot``, ``one_shot_buffered``, ``two_shot``), ``block_m`` (rows per tile),
    ``num_warps`` or ``grid``; see docs/fused-ops.md. ``group``: an :class:`iris.runtime.Group` of
    the context to sum over its members only (in group rank order); None: every rank.
    """
    if group is not None:
        ctx = on_group(ctx, group, CALL)
    if is_compiling():
        return traced().all_reduce_residual_rmsnorm(ctx, out, residual_out, partial, residual, weight, eps, scale,
                                                    config)
    reach = _agreed_reach(ctx, config, out, residual_out, partial, scale)
    key = _key(config, eps, reach, out, residual_out, partial, residual, weight, scale)
    _launch.call(ctx, key, lambda: _plan(ctx, key, out, residual_out, partial, residual, weight, eps, scale, config,
                                         reach), out, residual_out, partial, residual, weight, scale)
    return out


def _agreed_reach(ctx, config, out, residual_out, partial, scale):
    # How the peers reach the tensors they read (partial) or write (two-shot's outputs), agreed with
    # them where the call asks for it (ccl's rule: plain tensors of >= ccl.REGISTER_FROM bytes on the
    # cuda backend under MPI, or config.register): a dict by name, or None.
    names = [n for n, t in (("partial", partial), ("out", out), ("residual_out", residual_out), ("scale", scale))
             if t is not None]
    tensors = [t for t in (partial, out, residual_out, scale) if t is not None]
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return None  # the checks of the plan say what is wrong
    reach = _launch.agreed_reach(ctx, config, *tensors)
    return None if reach is None else dict(zip(names, reach))


def _tensor_key(t):
    return None if t is None else (t.data_ptr(), t.shape, t.dtype, t.is_contiguous())


def _key(config, eps, reach, *tensors):
    # Everything a plan depends on (see ccl._launch.call_key): the call's tensors as passed, eps,
    # the config and the agreement; None when an argument is not a tensor (the checks report it).
    try:
        key = ("all_reduce_residual_rmsnorm", config, eps, tuple(_tensor_key(t) for t in tensors))
    except (AttributeError, TypeError):
        return None
    return key if reach is None else (*key, tuple((k, r.ident) for k, r in reach.items()))


def _plan(ctx, key, out, residual_out, partial, residual, weight, eps, scale, config, reach):
    quant = check_call(CALL, ctx, out, residual_out, partial, residual, weight, eps, scale)
    W, N = ctx.world_size, partial.shape[-1]
    M = partial.numel() // N
    width = triton.next_power_of_2(N)
    cfg = choose(CALL, M, width, partial.numel() * partial.element_size(), str(partial.dtype).removeprefix("torch."),
                 W, ctx.device.type, ctx.ranks_on_device, config)
    two_shot = cfg.variant == "two_shot" and W > 1
    buffered = cfg.variant == "one_shot_buffered" and W > 1
    write_residual, row_scales = residual_out is not None, quant == ROW_SCALES.value
    # a valid call: agree on it with every rank (the peers read partial where it is, and two-shot's
    # peers write the outputs where they are)
    written = ("out", "residual_out", "scale") if two_shot else ()
    fp = agree(ctx, CALL, (("out", out), ("residual_out", residual_out), ("partial", partial),
                           ("residual", residual), ("weight", weight), ("scale", scale)),
               placed=("partial", *written), reach=reach, eps=float(eps), config=config)
    reach = reach or {}
    sym_in, in_bases = _launch.peer_reach(ctx, partial, reach.get("partial"))
    # the outputs that two-shot's peers write: (in place?, bases) of each
    outputs = {"out": _launch.peer_reach(ctx, out, reach.get("out"))}
    if write_residual:
        outputs["residual_out"] = _launch.peer_reach(ctx, residual_out, reach.get("residual_out"))
    if row_scales:
        outputs["scale"] = _launch.peer_reach(ctx, scale, reach.get("scale"))
    if W == 1:
        stage_in = copy_out = False  # nothing is read or written by a peer
    elif buffered:
        stage_in, copy_out = True, False  # staged always, into the half the call's parity picks
    elif two_shot:
        # peers write their shares of every output: all of them in place, or all through the heap
        stage_in, copy_out = not sym_in, not all(in_place for in_place, _ in outputs.values())
    else:
        stage_in, copy_out = not sym_in, False  # one-shot writes this rank's outputs only
    block_m = cfg.block_m
    tiles = -(-M // block_m)
    cap = _launch.capacity(tiles)
    rows = cap * block_m
    ws_key = ("ops.all_reduce_residual_rmsnorm", partial.dtype, out.dtype, N, W, cfg.variant, block_m, cap, stage_in,
              copy_out, residual is not None, write_residual, quant)
    if buffered:
        ws_key += _launch.grid_key(cfg)  # its grid is fixed per workspace
    half = rows * N if buffered else 0  # elements between the staging buffer's two halves

    def make(ctx):
        buffers = {"locks": ctx.zeros(cap * LOCK_WORDS, dtype=torch.int32)}
        if stage_in:
            buffers["stage"] = ctx.zeros((2 if buffered else 1) * rows * N, dtype=partial.dtype)
        if copy_out:
            # fp8 as bytes: a zero fill of bytes needs nothing of torch's fp8 support
            buffers["out"] = ctx.zeros(rows * N * out.element_size(), dtype=torch.uint8).view(out.dtype)
            if write_residual:
                buffers["residual_out"] = ctx.zeros(rows * N, dtype=partial.dtype)
            if row_scales:
                buffers["scale"] = ctx.zeros(rows, dtype=torch.float32)
        return buffers

    ws = _launch.workspace(ctx, ws_key, make)
    context, locks, heap = ctx.get_device_context(), ws.buffers["locks"], ctx.get_heap_bases()
    stage, out_buf = ws.buffers.get("stage"), ws.buffers.get("out")
    res_buf, scale_buf = ws.buffers.get("residual_out"), ws.buffers.get("scale")
    src_bases = heap if stage_in else in_bases

    def bases(name):  # where two-shot's peers write output `name`
        return outputs[name][1] if two_shot and not copy_out and name in outputs else heap

    out_bases, res_bases, scale_bases = bases("out"), bases("residual_out"), bases("scale")

    rank = ctx.rank  # a run-time argument: one compiled kernel for every rank

    def arguments(out, residual_out, partial, residual, weight, scale):
        # the kernel's run-time arguments; a pointer the kernel does not use is a stand-in (partial)
        res_out = partial if residual_out is None else residual_out
        scale = partial if scale is None else scale
        return (context, partial, partial if stage is None else stage, partial if residual is None else residual,
                weight, out, out if out_buf is None else out_buf, res_out, res_out if res_buf is None else res_buf,
                scale, scale if scale_buf is None else scale_buf, locks, src_bases, out_bases, res_bases, scale_bases,
                M, N, float(eps), half, fp, rank)

    constexprs = dict(world_size=W, TWO_SHOT=two_shot, BUFFERED=buffered, STAGE_IN=stage_in,
                      COPY_OUT=copy_out, HAS_RESIDUAL=residual is not None, WRITE_RESIDUAL=write_residual,
                      QUANT=quant, BLOCK_M=block_m, BLOCK_N=width)
    args = arguments(out, residual_out, partial, residual, weight, scale)
    run = _launch.launcher(ctx, ws, _all_reduce_rmsnorm_kernel, cap if buffered else tiles, cap, cfg, args,
                           constexprs)

    def plan(*tensors):
        run(*arguments(*tensors))
        if run.fast is not None and key is not None:
            fast = run.fast  # ignores its arguments: the key fixes every address
            _launch.remember(ctx, key, lambda *_: fast(None, None))

    return plan

