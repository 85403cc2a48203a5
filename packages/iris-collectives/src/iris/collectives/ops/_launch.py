"""Launching an op's kernel: the persistent grid, the tensor-descriptor decision, Triton options.

Every op's kernel (those launched here, and ``all_reduce_residual_rmsnorm``'s, which ``ccl``'s
launcher runs) takes ``rank`` as its last run-time argument, after ``call_fp``, not specialised
on (``do_not_specialize``), and builds a :class:`~iris.collectives._context.RuntimeRankContext`,
as ``ccl``'s kernels do: the ranks of a job share one compiled kernel instead of compiling one each
(compiling is most of what a GPU test suite spends). ``world_size`` stays compile-time (loops over
the ranks unroll). Where a kernel tells this rank from a peer, the test is a run-time one, or a
compile-time one on the loop's step (``i == 0``: this rank); sums keep their rank order.
"""

from __future__ import annotations

import torch

from iris.device import INTERPRETER

from .._agree import host_calls
from .._errors import unwrapped
from .._workspace import Workspace, ensure_allocator
from . import _gemm

#: Tests only: let the interpreter take the tensor-descriptor path too (Triton 3.9's interpreter
#: emulates ``tl.make_tensor_descriptor``), so its index arithmetic is checked without a GPU.
INTERPRETER_TMA = False


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the fp32 (fp64 for fp64 inputs) partial products an op stages on the heap: the
    host side of ``_gemm.accumulator_of``."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def tma_ok(cfg, *matrices: torch.Tensor) -> bool:
    """Whether the kernel may load these matrices through tensor descriptors: asked for by the
    config (under the interpreter only by :data:`INTERPRETER_TMA`), the matrices on the GPU, with
    unit column stride and row strides and base addresses that are multiples of 16 bytes (what
    TMA requires); otherwise the kernel takes the pointer path."""
    if not (INTERPRETER_TMA if INTERPRETER else cfg.use_tma):
        return False
    for t in matrices:
        if t.dtype == torch.float64:  # fp64 takes the pointer path (its accumulator is fp64)
            return False
        if t.stride(1) != 1 or (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
            return False
        if not INTERPRETER and t.device.type != "cuda":
            return False
    if INTERPRETER:
        return True
    ensure_allocator()
    return True


#: ``USE_TMA`` values a kernel is compiled with; the column-major one is the kernels' own constant.
TMA_OFF, TMA_B_ROWS, TMA_B_COLUMNS = 0, 1, _gemm.TMA_B_COLUMNS.value


def b_operand(cfg, b: torch.Tensor, *others: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``(B as the kernel reads it, USE_TMA)`` for a GEMM of B (``K x N``) with ``others`` (A and
    any matrix also read through a descriptor; see :func:`tma_ok`).

    - ``TMA_B_ROWS``: B row-major, descriptors of B;
    - ``TMA_B_COLUMNS``: B column-major (``weight.t()``: ``b.stride(0) == 1``), descriptors of its
      transpose, no copy;
    - ``TMA_OFF``: the pointer path (any strides).

    fp32 under tf32 reads B column-major only: the tensor cores' tf32 instructions take a K-major
    B, and a row-major fp32 B made the GEMM 5x slower than cuBLAS on an H200 (6.8 against 1.33 ms
    for 4096 x 8192 x 8192; 1.45 ms column-major). A row-major fp32 B is transposed into a new
    column-major tensor first (0.38 ms for 8192 x 8192, far less than it saves); pass
    ``weight.t()`` of an ``N x K`` weight to skip it."""
    if tma_ok(cfg, *others, b):
        if b.dtype == torch.float32 and cfg.input_precision == "tf32":
            b = b.t().contiguous().t()
            return (b, TMA_B_COLUMNS) if tma_ok(cfg, *others, b.t()) else (b, TMA_OFF)
        return b, TMA_B_ROWS
    if tma_ok(cfg, *others, b.t()):
        return b, TMA_B_COLUMNS
    return b, TMA_OFF


def launch(ctx, ws: Workspace, kernel, num_tiles: int, cfg, args: tuple, constexprs: dict) -> None:
    """Run ``kernel`` on torch's current stream with a persistent grid of ``cfg.grid`` programs
    (or, by default, as many as are resident on this rank's share of the GPU, at most
    ``num_tiles``): its programs wait for programs of other ranks, so all of them must run at
    once. The grid is found once per workspace and compiled variant (``resident_grid`` is
    collective and compiles the kernel) and is the same on every rank, as long as every rank
    compiles the same variant (the same bias-or-not, which the op requires, and the same
    descriptor-or-pointer choice, which differs only for tensors misaligned on some ranks)."""
    options = dict(constexprs, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    variant = tuple(sorted(constexprs.items()))
    grid = ws.grids.get(variant)
    if grid is None:
        compiled = None
        if ctx.device.type == "cuda":
            compiled = kernel.warmup(*args, grid=(1,), **options)
        with host_calls(ctx, f"the grid of iris.collectives.ops {getattr(kernel, '__name__', 'kernel')}"):
            resident = ctx.resident_grid(num_tiles, compiled)
        grid = ws.grids[variant] = min(resident, cfg.grid) if cfg.grid else resident
    if not INTERPRETER:
        kernel[(grid,)](*args, **options)
        return
    try:
        kernel[(grid,)](*args, **options)
    except Exception as exc:
        error = unwrapped(exc)
        if error is exc:
            raise
        raise error from None  # the call mismatch the kernel found, not the interpreter's wrapping
