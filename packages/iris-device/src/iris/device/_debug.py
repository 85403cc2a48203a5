"""Opt-in in-kernel checks of ranks and translated addresses (``IRIS_DEBUG=1``).

Read once at import. When off, ``DEBUG`` is a false compile-time constant and every check is
removed from the kernel: it costs nothing. When on, Triton's device asserts are switched on too
(``TRITON_DEBUG=1``), since without them ``tl.device_assert`` compiles to nothing on the GPU.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from ._layout import HEAP_SIZE_C, HEAP_BASES_C, NUM_RANKS


def debug_enabled() -> bool:
    """True when ``IRIS_DEBUG`` is set to something other than ``""`` or ``"0"``."""
    return os.environ.get("IRIS_DEBUG", "0") not in ("", "0")


if debug_enabled():
    os.environ.setdefault("TRITON_DEBUG", "1")

#: Compile-time flag: in-kernel rank and address checks are compiled in.
DEBUG: tl.constexpr = tl.constexpr(debug_enabled())
_NUM_RANKS_BEFORE_BASES: tl.constexpr = tl.constexpr(HEAP_BASES_C.value - NUM_RANKS)


@triton.jit
def check_ranks(from_rank, to_rank, heap_bases):
    """Fail unless both ranks lie in ``[0, num_ranks)``. Per call (scalar ranks)."""
    num_ranks = tl.load(heap_bases - _NUM_RANKS_BEFORE_BASES)
    ok = (from_rank >= 0) & (from_rank < num_ranks) & (to_rank >= 0) & (to_rank < num_ranks)
    if not ok:
        tl.device_print("iris debug: rank out of range: rank, peer, num_ranks =", from_rank, to_rank, num_ranks)
    tl.device_assert(ok, "iris debug: a rank passed to an iris.device call is outside [0, num_ranks); "
                     "the line printed above names rank, peer and num_ranks; pass ranks in range")


@triton.jit
def check_address(pointer, from_rank, to_rank, heap_bases, mask):
    """Fail if an (unmasked) address is outside ``from_rank``'s heap. Per element of the block.

    ``pointer`` is in ``from_rank``'s address space, so in-heap there means in-heap on
    ``to_rank`` after translation.
    """
    num_ranks = tl.load(heap_bases - _NUM_RANKS_BEFORE_BASES)
    heap_size = tl.load(heap_bases + num_ranks + HEAP_SIZE_C)
    base = tl.load(heap_bases + from_rank)
    offset = tl.cast(pointer, tl.int64) - base
    outside = (offset < 0) | (offset >= heap_size)
    if mask is not None:
        outside = outside & mask
    # Broadcasting against a 1-element block makes scalars and blocks reduce alike.
    outside = outside | tl.zeros([1], dtype=tl.int1)
    n_bad = tl.sum(outside.to(tl.int32), axis=None)
    if n_bad > 0:
        first = tl.min(tl.where(outside, offset, 0x7FFFFFFFFFFFFFFF), axis=None)
        tl.device_print("iris debug: address outside the heap: rank, peer, heap offset, heap_size =",
                        from_rank, to_rank, first, heap_size)
    tl.device_assert(n_bad == 0, "iris debug: a pointer passed to an iris.device call is not inside the "
                     "symmetric heap; the line printed above names rank, peer and offset; allocate "
                     "the buffer with the iris.runtime factories")
