"""The GEMM core every fused op is built on: persistent tile loop, grouped order, K loop, epilogue.

An op's kernel is a persistent grid: program ``p`` computes output tiles ``p, p + P, p + 2P, ...``
(``P`` programs, see :func:`iris.runtime.Iris.resident_grid`) and hands each tile to its
communication step as soon as it has it. Within the loop:

- :func:`grouped_tile` maps a linear tile index to ``(pid_m, pid_n)`` in groups of ``GROUP_M``
  rows of tiles, so that consecutive tiles share columns of B (L2 reuse);
- :func:`tile_product` computes one tile ``A[rows, :] @ B[:, cols]`` with ``tl.dot`` in fp32 (in fp64
  for fp64 inputs, see :func:`accumulator_of`),
  through :func:`dot_k` (pointers) or :func:`dot_k_tma` (tensor descriptors, GPU only), reading
  what :func:`gemm_operands` returned once before the loop;
- :func:`add_bias` adds a ``[N]`` bias in the accumulator's type, once; the op then rounds it once to
  the output dtype with :func:`iris.device.round_to` (Triton's interpreter truncates ``.to(bf16)``).

Everything here is per program and touches only memory given to it (local or translated
pointers); no flags, no memory-model semantics beyond weak loads.
"""

# No "from __future__ import annotations": Triton resolves jit globals by name at compile time.
import triton
import triton.language as tl

from iris.device import INTERPRETER

from .._views import INDEX_TYPE

#: ``USE_TMA`` of a kernel whose B is column-major (``b.stride(0) == 1``, as ``weight.t()`` is):
#: its descriptor is of B's transpose (``N x K``, row-major) and each box is transposed after the
#: load. 0 is the pointer path and 1 descriptors of a row-major B (``_launch`` names all three and
#: chooses among them in ``b_operand``).
TMA_B_COLUMNS: tl.constexpr = tl.constexpr(2)


@triton.constexpr_function
def accumulator_of(dtype):
    """The type a GEMM of ``dtype`` operands accumulates in: fp64 for fp64 (exact enough for
    ``torch.autograd.gradcheck``), fp32 for everything else (fp32, tf32, fp16, bf16)."""
    return tl.float64 if dtype == tl.float64 else tl.float32


@triton.constexpr_function
def dot_precision(precision, dtype):
    """``tl.dot``'s ``input_precision`` for ``dtype`` operands: the config's (``"tf32"`` or
    ``"ieee"``, which only fp32 operands feel), and ``"ieee"`` for fp64, which has no tf32 form."""
    return "ieee" if dtype == tl.float64 else precision


@triton.jit
def grouped_tile(tile_id, num_tiles_m, num_tiles_n, GROUP_M: tl.constexpr):
    """``(pid_m, pid_n)`` of linear tile ``tile_id`` in the grouped order: tiles are visited
    column by column inside bands of ``GROUP_M`` tile rows (the last band may be shorter).
    Per program, scalars, no memory access."""
    in_band = GROUP_M * num_tiles_n
    band = tile_id // in_band
    first_m = band * GROUP_M
    band_rows = tl.minimum(num_tiles_m - first_m, GROUP_M)
    pid_m = first_m + (tile_id % in_band) % band_rows
    pid_n = (tile_id % in_band) // band_rows
    return pid_m, pid_n


@triton.jit
def tile_rows(pid_m, BLOCK_M: tl.constexpr):
    """Row indices ``pid_m * BLOCK_M + [0, BLOCK_M)`` (``INDEX_TYPE``; some may lie past the end)."""
    return pid_m * BLOCK_M + tl.arange(0, BLOCK_M).to(INDEX_TYPE)


@triton.jit
def tile_cols(pid_n, BLOCK_N: tl.constexpr):
    """Column indices ``pid_n * BLOCK_N + [0, BLOCK_N)`` (``INDEX_TYPE``)."""
    return pid_n * BLOCK_N + tl.arange(0, BLOCK_N).to(INDEX_TYPE)


@triton.jit
def dot_k(acc, a_ptr, rows, row_mask, stride_am, stride_ak, b_ptr, cols, N, K, stride_bk, stride_bn,
          BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    """``acc + A[rows, :K] @ B[:K, cols]`` with pointer loads, accumulated in ``acc``'s type.

    ``rows`` (``[BLOCK_M]``, relative to ``a_ptr``) with ``row_mask`` says which rows exist; masked
    rows and columns, and the K tail, load as 0 and add exact zeros. ``a_ptr`` may be a translated
    pointer into a peer's heap. Per program; weak loads. ``PRECISION``: ``tl.dot``'s
    ``input_precision`` (``"tf32"`` or ``"ieee"``; it only matters for fp32 inputs).
    """
    tl.static_assert(BLOCK_K >= 16, "iris.collectives.ops: BLOCK_K must be >= 16 (tl.dot)")
    ks = tl.arange(0, BLOCK_K).to(INDEX_TYPE)
    a_rows = a_ptr + rows[:, None] * stride_am
    b_cols = b_ptr + cols[None, :] * stride_bn
    col_mask = cols < N
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        a = tl.load(a_rows + kk[None, :] * stride_ak, mask=row_mask[:, None] & (kk[None, :] < K), other=0)
        b = tl.load(b_cols + kk[:, None] * stride_bk, mask=(kk[:, None] < K) & col_mask[None, :], other=0)
        if INTERPRETER:
            # The interpreter's tl.dot gives garbage for bf16 operands (numpy has no bf16); widening
            # to the accumulator's type is exact and the products and sums are in it either way.
            a = a.to(acc.dtype)
            b = b.to(acc.dtype)
        acc = tl.dot(a, b, acc, input_precision=dot_precision(PRECISION, a.dtype), out_dtype=acc.dtype)
    return acc


@triton.jit
def dot_k_tma(acc, a_desc, row0, b_desc, col0, K, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
              WARP_SPECIALIZE: tl.constexpr = False, B_COLUMNS: tl.constexpr = False):
    """``acc + A[row0 : row0 + BLOCK_M, :K] @ B[:K, col0 : col0 + BLOCK_N]`` through tensor
    descriptors (TMA on sm_90; see :func:`make_descriptors`). Rows, columns and the K tail past
    the descriptors' shapes load as 0. Per program; weak loads.

    ``B_COLUMNS``: ``b_desc`` is of B's transpose (``N x K``); each ``BLOCK_N x BLOCK_K`` box is
    transposed in registers' view only (``tl.trans``), which the tensor cores read as a K-major
    operand. fp32 (tf32) MMAs read B only that way: a row-major fp32 B ran 5x slower than cuBLAS
    on an H200 (6.8 against 1.33 ms, 4096 x 8192 x 8192).

    ``WARP_SPECIALIZE``: ask Triton to split the loop into a producer warpgroup (the TMA loads)
    and consumer warpgroups (the MMAs), as cuBLAS's Hopper kernels do; with ``num_warps=4`` Triton
    3.6+ builds one producer and two consumers (12 warps). See ``Config.warp_specialize``."""
    for k0 in tl.range(0, K, BLOCK_K, warp_specialize=WARP_SPECIALIZE):
        a = a_desc.load([row0, k0])
        if B_COLUMNS:
            b = tl.trans(b_desc.load([col0, k0]))
        else:
            b = b_desc.load([k0, col0])
        if INTERPRETER:
            a = a.to(tl.float32)  # as in dot_k: the interpreter's bf16 tl.dot is wrong
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    return acc


@triton.jit
def row_major_descriptor(ptr, rows, cols, row_stride, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Tensor descriptor of a ``rows x cols`` row-major matrix at ``ptr`` (row stride
    ``row_stride`` elements, unit column stride) read in ``BLOCK_R x BLOCK_C`` boxes; boxes past
    the shape load as 0. Per program, no memory access but the descriptor's own. GPU only: the
    host must have called ``triton.set_allocator`` (see ``_workspace.ensure_allocator``), and the
    base and row stride must be multiples of 16 bytes (the host checks before asking for this
    path). ``ptr`` may be a translated pointer into a peer's heap."""
    return tl.make_tensor_descriptor(ptr, shape=[rows, cols], strides=[row_stride, 1], block_shape=[BLOCK_R, BLOCK_C])


@triton.jit
def b_descriptor(b_ptr, K, N, stride_bk, stride_bn, USE_TMA: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """Tensor descriptor of B (``K x N``): of B itself (row stride ``stride_bk``) read in
    ``BLOCK_K x BLOCK_N`` boxes, or when ``USE_TMA == TMA_B_COLUMNS`` of its transpose (``N x K``,
    row stride ``stride_bn``) in ``BLOCK_N x BLOCK_K`` boxes, for :func:`dot_k_tma` with
    ``B_COLUMNS``. Per program, no memory access but the descriptor's own."""
    if USE_TMA == TMA_B_COLUMNS:
        return row_major_descriptor(b_ptr, N, K, stride_bn, BLOCK_N, BLOCK_K)
    else:
        return row_major_descriptor(b_ptr, K, N, stride_bk, BLOCK_K, BLOCK_N)


@triton.jit
def make_descriptors(a_ptr, M, K, stride_am, b_ptr, N, stride_bk, stride_bn, USE_TMA: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Tensor descriptors of A (``M x K``, row stride ``stride_am``) and B (see
    :func:`b_descriptor`) with the GEMM's blocks (see :func:`row_major_descriptor`). Per program,
    built once before the tile loop."""
    return (row_major_descriptor(a_ptr, M, K, stride_am, BLOCK_M, BLOCK_K),
            b_descriptor(b_ptr, K, N, stride_bk, stride_bn, USE_TMA, BLOCK_N, BLOCK_K))


@triton.jit
def gemm_operands(a_ptr, M, K, stride_am, b_ptr, N, stride_bk, stride_bn, USE_TMA: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """What :func:`tile_product` reads A and B through: their tensor descriptors when ``USE_TMA``
    (1: B row-major, ``TMA_B_COLUMNS``: B column-major; see :func:`make_descriptors`), else the
    pointers themselves. Per program, once before the tile loop."""
    if USE_TMA:
        return make_descriptors(a_ptr, M, K, stride_am, b_ptr, N, stride_bk, stride_bn, USE_TMA, BLOCK_M, BLOCK_N,
                                BLOCK_K)
    else:
        return a_ptr, b_ptr


@triton.jit
def tile_product(a_op, b_op, row0, col0, rows, row_mask, cols, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                 USE_TMA: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, WARP_SPECIALIZE: tl.constexpr = False):
    """One output tile ``A[rows, :K] @ B[:K, cols]`` (fp32, fp64 for fp64 operands: the host sends
    those down the pointer path), through what :func:`gemm_operands`
    returned: :func:`dot_k_tma` from row ``row0`` and column ``col0`` (the first of ``rows`` and
    ``cols``) when ``USE_TMA`` (rows past the descriptor's shape load as 0; the caller masks its stores),
    else :func:`dot_k` with ``row_mask``. ``WARP_SPECIALIZE``: see :func:`dot_k_tma` (TMA path only).
    Per program; weak loads."""
    if USE_TMA:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        return dot_k_tma(acc, a_op, row0, b_op, col0, K, BLOCK_K, PRECISION, WARP_SPECIALIZE,
                         USE_TMA == TMA_B_COLUMNS)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=accumulator_of(a_op.dtype.element_ty))
        return dot_k(acc, a_op, rows, row_mask, stride_am, stride_ak, b_op, cols, N, K, stride_bk, stride_bn,
                     BLOCK_K, PRECISION)


@triton.jit
def add_bias(acc, bias_ptr, cols, N, HAS_BIAS: tl.constexpr):
    """``acc + bias[cols]`` (in ``acc``'s type, broadcast over rows) when ``HAS_BIAS``, else ``acc``.
    Per program; one weak load of ``BLOCK_N`` values."""
    if HAS_BIAS:
        bias = tl.load(bias_ptr + cols, mask=cols < N, other=0)
        acc = acc + bias.to(acc.dtype)[None, :]
    return acc


@triton.jit
def add_bias_if(acc, bias_ptr, cols, N, HAS_BIAS: tl.constexpr, here):
    """:func:`add_bias` where ``here`` (a run-time boolean scalar, as ``rank == 0`` with a run-time
    rank), else ``acc`` bit for bit, with no branch: elsewhere the bias's load is masked off and
    ``-0.0`` added, which leaves every value as it is (``x + -0.0 == x`` in round-to-nearest, for
    ``x = -0.0`` too). A branch around :func:`add_bias` held a second copy of the tile in
    registers (the rotated all-reduce at 128 x 256 spilled 1524 bytes, not 1132). Per program; one weak
    load of ``BLOCK_N`` values, masked off where not ``here``."""
    if HAS_BIAS:
        # (tl.where, not "(cols < N) & here": Triton's interpreter refuses some scalar & block masks)
        bias = tl.load(bias_ptr + cols, mask=tl.where(here, cols < N, False), other=-0.0)
        acc = acc + bias.to(acc.dtype)[None, :]
    return acc
