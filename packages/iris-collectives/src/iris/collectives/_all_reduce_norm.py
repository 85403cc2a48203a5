"""Tile all-reduce followed by a row-norm epilogue: all-reduce, residual add, RMSNorm, fp8.

The end of a tensor-parallel transformer layer: every rank holds a partial activation (its share
of a row-parallel GEMM), the sum over the ranks is added to the residual stream, and the new
residual is RMS-normalised for the next layer's GEMM, maybe quantised to fp8 for it. Here that is
one step on a tile of whole rows: the one-shot or two-shot all-reduce protocol of
:mod:`iris.collectives._all_reduce` (the same lock records, flags and epochs), with the residual
add, the norm and the rounding applied to the fp32 sum before it is stored.

- :func:`rms_norm_rows`: the epilogue's arithmetic, on a block of rows in registers;
- :func:`all_reduce_rmsnorm`: the tile collective (one-shot or two-shot, a tile or a range);
- :func:`all_reduce_rmsnorm_op`: its body with the host op's extras (a staged source, outputs
  written through heap buffers, registered tensors), for ``iris.collectives.ops``.

Rounding: the sum over the ranks is taken in fp32 in rank order (bit-identical on every rank),
the residual is added in fp32, and the new residual and the output are each rounded once from
fp32, to nearest even. The norm is the fp32 arithmetic of ``torch.nn.functional.rms_norm`` on
fp32 rows: ``x * (1 / sqrt(sum(x * x) / N + eps)) * weight``, each step correctly rounded.
"""

# No "from __future__ import annotations": Triton resolves jit globals by name at compile time.
import triton
import triton.language as tl

from iris.device import round_to, store

from ._all_reduce import _sum_in_rank_order, own_share_rows
from ._dtypes import check_lock_array
from ._errors import IrisUnsupportedError
from ._sync import ARRIVE, DONE, enter_range, enter_tile, signal_and_wait_all
from ._views import Tile, TileView, has_tiles, is_range

#: ``QUANT`` of :func:`all_reduce_rmsnorm_op`: no quantisation (the output in its own float type),
#: fp8 with one scale per row that the call computes and writes, fp8 with one scale it reads.
NO_SCALE: tl.constexpr = tl.constexpr(0)
ROW_SCALES: tl.constexpr = tl.constexpr(1)
TENSOR_SCALE: tl.constexpr = tl.constexpr(2)
#: The largest finite e4m3 value, and the smallest per-row scale (an all-zero row would divide by 0).
FP8_MAX: tl.constexpr = tl.constexpr(448.0)
FP8_MIN_SCALE: tl.constexpr = tl.constexpr(1.0 / (448.0 * 512.0))

CALL: tl.constexpr = tl.constexpr("iris.collectives.all_reduce_rmsnorm")


@triton.constexpr_function
def quant_mode(call, dtype, row_scales):
    """``QUANT`` for an output of ``dtype``: fp8 (e4m3) is quantised with row scales or one scale;
    other float types are not; anything else is refused."""
    name = dtype.name
    if name == "fp8e4nv":
        return 1 if row_scales else 2
    if name not in ("fp32", "fp16", "bf16"):
        raise IrisUnsupportedError(f"{call}: dst_view holds {name}; the output must be fp32, fp16, bf16 or fp8 "
                                   f"e4m3 (torch.float8_e4m3fn)")
    return 0


@triton.constexpr_function
def _check_data(call, dtype):
    # The sums are fp32: fp32 data, and fp16 and bf16 widened.
    if dtype.name not in ("fp32", "fp16", "bf16"):
        raise IrisUnsupportedError(f"{call} on {dtype.name} data: it reduces and normalises fp32, fp16 and bf16; "
                                   f"convert the tensor (e.g. .to(torch.float32))")
    return 0


@triton.constexpr_function
def _needs_scale(call):
    raise IrisUnsupportedError(f"{call}: an fp8 dst_view needs scale= (the per-tensor scale to divide by, or with "
                               f"ROW_SCALES=True where each row's scale is written)")


@triton.jit
def rms_norm_rows(x, weight, cols, N, eps):
    """``x`` RMS-normalised row by row and scaled by ``weight``, in fp32:
    ``x * (1 / sqrt(sum(x * x) / N + eps)) * weight[cols]``.

    ``x``: an fp32 ``[BLOCK_M, BLOCK_N]`` block whose columns ``cols`` (``[BLOCK_N]``) are a whole
    row of ``N`` values (columns at or past ``N`` are ignored and give undefined results);
    ``weight``: a pointer to the ``N`` weights (any float type). The division and the square root
    are correctly rounded, so the result equals ``torch.nn.functional.rms_norm`` of the fp32 rows
    (same operations, same order) wherever the sums of squares agree (exactly, e.g. for small
    integers; else to the rounding of a reordered sum). Granularity: per program; loads
    ``weight`` (weak), no other memory access.
    """
    inside = cols < N
    squares = tl.where(inside[None, :], x * x, 0.0)
    mean = tl.math.div_rn(tl.sum(squares, axis=1), tl.zeros([x.shape[0]], tl.float32) + N)
    rstd = tl.math.div_rn(tl.full([x.shape[0]], 1.0, tl.float32), tl.sqrt_rn(mean + eps))
    w = tl.load(weight + cols, mask=inside, other=0).to(tl.float32)
    return (x * rstd[:, None]) * w[None, :]


@triton.jit
def _to_fp8(x, dtype: tl.constexpr):
    # Saturated to e4m3's range, then rounded to nearest even (on sm_90: cvt.rn.satfinite).
    return tl.minimum(tl.maximum(x, -FP8_MAX), FP8_MAX).to(dtype)


@triton.jit
def _normalise(acc, residual_ptrs, mask, weight, cols, N, eps, scale, out_ty: tl.constexpr, QUANT: tl.constexpr):
    # The epilogue on the fp32 sum of a block of rows: the residual added (when given), the norm,
    # the output rounded to out_ty or quantised. Returns (new residual in fp32, output, the rows'
    # scales: [BLOCK_M] fp32, meaningful with ROW_SCALES only).
    if residual_ptrs is not None:
        acc = acc + tl.load(residual_ptrs, mask=mask, other=0).to(tl.float32)
    y = rms_norm_rows(acc, weight, cols, N, eps)
    if QUANT == ROW_SCALES:
        amax = tl.max(tl.where(mask, tl.abs(y), 0.0), axis=1)
        scales = tl.maximum(tl.math.div_rn(amax, tl.full(amax.shape, FP8_MAX, tl.float32)), FP8_MIN_SCALE)
        out = _to_fp8(tl.math.div_rn(y, tl.zeros(y.shape, tl.float32) + scales[:, None]), out_ty)
    elif QUANT == TENSOR_SCALE:
        scales = tl.zeros([acc.shape[0]], tl.float32)
        out = _to_fp8(tl.math.div_rn(y, tl.zeros(y.shape, tl.float32) + tl.load(scale).to(tl.float32)), out_ty)
    else:
        scales = tl.zeros([acc.shape[0]], tl.float32)
        out = round_to(y, out_ty)
    return acc, out, scales


@triton.jit
def _store_everywhere(ctx, ptrs, value, mask, bases, local_ptrs=None):
    # value into ptrs on every rank, the next rank first (the ranks' stores spread over the
    # destinations), this rank's into local_ptrs when given (its own copy of the output); bases
    # translates ptrs (None: the heap's). Weak stores; the caller's "done" signal releases them.
    targets = ctx.heap_bases if bases is None else bases
    for i in tl.static_range(ctx.world_size):
        target = (ctx.rank + i + 1) % ctx.world_size
        # this rank comes last (i == W - 1): a compile-time test where the rank is a run-time value
        # (the fused ops' RuntimeRankContext)
        if i == ctx.world_size - 1 and local_ptrs is not None:
            tl.store(local_ptrs, value, mask=mask)
        else:
            store(ptrs, value, ctx.rank, target, targets, mask=mask)


@triton.jit
def _norm_tile(ctx, view, t, src_view, dst_view, weight, eps, residual_view, residual_out_view, scale,
               QUANT: tl.constexpr, TWO_SHOT: tl.constexpr, mine_view, local_out, local_res, local_scale, src_bases,
               out_bases, res_bases, scale_bases):
    # Tile t (row-major id; view its position) after "ready": this rank's rows of it (two-shot:
    # its share; one-shot: all) reduced over the ranks, through the epilogue, and stored (two-shot:
    # into every rank's outputs; one-shot: into this rank's).
    shares: tl.constexpr = TWO_SHOT and ctx.world_size > 1
    if shares and view.BLOCK_M % ctx.world_size == 0:
        # equal shares: the share is a tile of BLOCK_M / W rows (every thread has some of it)
        part = TileView(view.pid_m * ctx.world_size + (ctx.rank + t) % ctx.world_size, view.pid_n,
                        view.BLOCK_M // ctx.world_size, view.BLOCK_N)
        rows = part.rows()
        row_ok = rows < src_view.M
    else:
        part = view
        rows = part.rows()
        row_ok = rows < src_view.M
        if shares:  # ragged shares: the whole tile, masked down to this rank's rows
            row_ok = row_ok & own_share_rows(t, view.BLOCK_M, ctx.rank, ctx.world_size)
    cols = part.cols()
    mask = row_ok[:, None] & (cols < src_view.N)[None, :]
    src_ptrs = src_view.frame(part)[0]
    if mine_view is None:
        mine = tl.load(src_ptrs, mask=mask, other=0)
    else:
        mine = tl.load(mine_view.frame(part)[0], mask=mask, other=0)
    acc = _sum_in_rank_order(ctx, Tile(part.pid_m, part.pid_n, part.BLOCK_M, part.BLOCK_N, mine), src_ptrs, mask,
                             tl.float32, None, src_bases)
    if residual_view is None:
        residual_ptrs = None
    else:
        residual_ptrs = residual_view.frame(part)[0]  # the same on every rank: read locally
    out_ty: tl.constexpr = dst_view.ptr.dtype.element_ty
    h, out, scales = _normalise(acc, residual_ptrs, mask, weight, cols, src_view.N, eps, scale, out_ty, QUANT)
    if shares:
        if residual_out_view is not None:
            res_local = None if local_res is None else local_res.frame(part)[0]
            _store_everywhere(ctx, residual_out_view.frame(part)[0],
                              round_to(h, residual_out_view.ptr.dtype.element_ty), mask, res_bases, res_local)
        out_local = None if local_out is None else local_out.frame(part)[0]
        _store_everywhere(ctx, dst_view.frame(part)[0], out, mask, out_bases, out_local)
        if QUANT == ROW_SCALES:
            scale_local = None if local_scale is None else local_scale + rows
            _store_everywhere(ctx, scale + rows, scales, row_ok, scale_bases, scale_local)
    else:
        if residual_out_view is not None:
            tl.store(residual_out_view.frame(part)[0], round_to(h, residual_out_view.ptr.dtype.element_ty), mask=mask)
        tl.store(dst_view.frame(part)[0], out, mask=mask)
        if QUANT == ROW_SCALES:
            tl.store(scale + rows, scales, mask=row_ok)


@triton.jit
def norm_tiles(ctx, tile, src_view, dst_view, weight, eps, residual_view, residual_out_view, scale,
               QUANT: tl.constexpr, TWO_SHOT: tl.constexpr, mine_view=None, local_out=None, local_res=None,
               local_scale=None, src_bases=None, out_bases=None, res_bases=None, scale_bases=None):
    """The reduction and epilogue of :func:`all_reduce_rmsnorm_op` on every tile of ``tile`` (a
    tile or a :class:`~iris.collectives.TileRange`), with no flags: the caller has acquired every
    peer's ``src_view`` rows ("ready") and keeps them from being overwritten until this returns.
    Per program; weak loads and stores (two-shot: stores to every rank, released by the caller's
    "done")."""
    if is_range(tile):
        for t in range(tile.first, tile.stop, tile.step):
            _norm_tile(ctx, tile.tile(t), t, src_view, dst_view, weight, eps, residual_view, residual_out_view, scale,
                       QUANT, TWO_SHOT, mine_view, local_out, local_res, local_scale, src_bases, out_bases, res_bases,
                       scale_bases)
    else:
        _norm_tile(ctx, tile, tile.tile_id(dst_view.num_tiles_n(tile.BLOCK_N)), src_view, dst_view, weight, eps,
                   residual_view, residual_out_view, scale, QUANT, TWO_SHOT, mine_view, local_out, local_res,
                   local_scale, src_bases, out_bases, res_bases, scale_bases)


@triton.jit
def all_reduce_rmsnorm(ctx, tile, src_view, dst_view, locks, weight, eps, residual_view=None, residual_out_view=None,
                       scale=None, ROW_SCALES: tl.constexpr = False, TWO_SHOT: tl.constexpr = False):
    """All-reduce the tile's rows over every rank, add the residual, RMS-normalise each row.

    Per row ``i`` of the tile: ``h = sum over ranks p of src_view[i] of p`` (fp32, rank order)
    ``+ residual_view[i]`` (when given); ``residual_out_view[i] = h`` (when given, rounded once);
    ``dst_view[i] = h * (1 / sqrt(mean(h * h) + eps)) * weight`` (:func:`rms_norm_rows`),
    rounded once to ``dst_view``'s type, or, for an fp8 e4m3 ``dst_view``, quantised with
    ``scale``: with ``ROW_SCALES`` each row's scale ``max(amax(|y|) / 448, 1 / (448 * 512))`` is
    written to ``scale[i]`` and the row stored as ``y / scale[i]``; without, ``y / scale[0]``
    (a per-tensor scale the caller gives); both saturate at +-448 and round to nearest even.
    ``out.float() * scale`` is the dequantised value.

    The tile must hold whole rows: ``pid_n`` 0 and ``BLOCK_N >= N`` (the views' columns; pass
    ``BLOCK_N = triton.next_power_of_2(N)``). ``src_view``, ``dst_view``, ``residual_view`` and
    ``residual_out_view`` are ``M x N`` views (:class:`~iris.collectives.TensorView`);
    ``weight`` points at ``N`` weights; ``eps`` is a float. This rank's values are read from
    ``src_view`` (``tile.data``, if any, is not read). ``tile`` may be a :class:`Tile`, a
    :class:`TileView` or a :class:`TileRange` (one handshake for the program's tiles).

    ``TWO_SHOT=False`` (one-shot): the protocol of :func:`all_reduce_one_shot`: signal "ready",
    wait for every peer's, read every rank's rows, reduce and normalise them locally, store into
    this rank's outputs, then "done". ``TWO_SHOT=True``: the protocol of
    :func:`all_reduce_two_shot`: each rank reduces and normalises its share of the tile's rows
    (:func:`two_shot_rows`) and stores the results into every rank's ``dst_view``,
    ``residual_out_view`` and row scales, which must then be on the symmetric heap (the same
    allocation on every rank); each row is computed once, so every rank holds the same bits.

    Granularity: per program. Memory semantics: flags released and acquired at system scope.
    ``locks``: int32, ``LOCK_WORDS`` per tile (:func:`lock_words` of ``M x N`` in the tile's
    blocks), symmetric, zeroed once at allocation, used by this collective alone with this
    tiling (and one form: tiles or ranges). Preconditions: this rank's ``src_view`` (symmetric
    heap) holds its data for the tile before the call. ``residual_view`` is read locally (it is
    the same on every rank); ``residual_out_view`` may be ``residual_view`` (in place). fp16,
    bf16 and fp32 data.

    When it returns on a rank: this rank's outputs hold the tile's results, and no peer reads this
    rank's ``src_view`` rows any more: back-to-back calls need neither a barrier nor a lock reset.
    """
    QUANT: tl.constexpr = quant_mode(CALL, dst_view.ptr.dtype.element_ty, ROW_SCALES)
    if QUANT != NO_SCALE:
        if scale is None:
            _needs_scale(CALL)
    all_reduce_rmsnorm_op(ctx, tile, src_view, dst_view, locks, weight, eps, residual_view, residual_out_view, scale,
                          QUANT, TWO_SHOT)


@triton.jit
def all_reduce_rmsnorm_op(ctx, tile, src_view, dst_view, locks, weight, eps, residual_view, residual_out_view, scale,
                          QUANT: tl.constexpr, TWO_SHOT: tl.constexpr, mine_view=None, local_out=None, local_res=None,
                          local_scale=None, src_bases=None, out_bases=None, res_bases=None, scale_bases=None):
    """:func:`all_reduce_rmsnorm`'s body, with ``QUANT`` (:data:`NO_SCALE`, :data:`ROW_SCALES`,
    :data:`TENSOR_SCALE`) and the host op's extras: ``mine_view``, this rank's own copy of
    ``src_view``'s data (the caller's tensor that ``src_view`` stages for the peers), where its
    own term is read; ``local_out``, ``local_res``, ``local_scale`` (two-shot), this rank's own
    copies of the outputs that ``dst_view``, ``residual_out_view`` and ``scale`` stand in for on
    the heap, where its own share is stored; ``src_bases``, ``out_bases``, ``res_bases``,
    ``scale_bases``, the tables that translate the views to the peers (a registration's bases;
    None: the heap's). Per program; the protocol and semantics of :func:`all_reduce_rmsnorm`."""
    check_lock_array(CALL, locks.dtype)
    _check_data(CALL, src_view.ptr.dtype.element_ty)
    if has_tiles(tile):  # an empty range (more programs than tiles): nothing to do, nobody to meet
        if ctx.world_size > 1:
            if is_range(tile):
                slot, record, epoch = enter_range(tile, dst_view, locks, CALL)
            else:
                slot, record, epoch = enter_tile(tile, dst_view, locks, CALL)
            # no peer can leave this call before this rank's "done": their signatures hold
            signal_and_wait_all(ctx, record, ARRIVE, epoch, CALL, "ready", slot, record)
        norm_tiles(ctx, tile, src_view, dst_view, weight, eps, residual_view, residual_out_view, scale, QUANT,
                   TWO_SHOT, mine_view, local_out, local_res, local_scale, src_bases, out_bases, res_bases, scale_bases)
        if ctx.world_size > 1:
            signal_and_wait_all(ctx, record, DONE, epoch, CALL, "done", slot)
