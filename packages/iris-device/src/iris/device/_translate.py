"""Pointer translation: the one helper every remote operation goes through.

A heap allocation sits at the same offset in every rank's heap, so a pointer of rank A becomes
the matching pointer of rank B by adding ``heap_base[B] - heap_base[A]``. The runtime aligns
every heap base to ``HEAP_BASE_ALIGNMENT`` bytes, so that difference is a multiple of it; saying
so to the compiler keeps the alignment it already knows for the local pointer, and loads and
stores through translated pointers vectorize (``ld.global.v4``) like local ones, with no hint.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._debug import DEBUG, check_address, check_ranks
from ._interpreter import INTERPRETER
from ._layout import HEAP_BASE_ALIGNMENT


@triton.constexpr_function
def _pointee_bytes(pointer_ty):
    # int1 is stored in one byte.
    return max(pointer_ty.element_ty.primitive_bitwidth // 8, 1)


@triton.constexpr_function
def _delta_divisibility(pointer_ty):
    return max(HEAP_BASE_ALIGNMENT // max(pointer_ty.element_ty.primitive_bitwidth // 8, 1), 1)


@triton.constexpr_function
def _check_reach(pointer, from_rank, to_rank, heap_bases, mask, call):
    # Interpreter only (concrete values): iris.device._heap_check.check_reach. Host code, imported
    # in the body: Triton's compiler scans what a kernel references and refuses plain functions.
    from ._heap_check import check_reach

    check_reach(pointer, from_rank, to_rank, heap_bases, mask, call)


@triton.jit
def translate_masked(pointer, from_rank, to_rank, heap_bases, mask, hint: tl.constexpr = None,
                     call: tl.constexpr = None):
    """:func:`translate` with the mask of the access, so debug checks skip masked-out lanes.

    Every remote access of the package goes through here. ``call`` (a string) names the public
    function in error messages. Under Triton's interpreter the ranks and, for another rank, the
    unmasked addresses are checked by default (``iris.device._heap_check``: host code, cheap);
    ``IRIS_DEBUG=1`` checks more, on the GPU too.
    """
    if DEBUG:
        check_ranks(from_rank, to_rank, heap_bases, call)
        check_address(pointer, from_rank, to_rank, heap_bases, mask, call)
    elif INTERPRETER:
        _check_reach(pointer, from_rank, to_rank, heap_bases, mask, call)
    from_base = tl.load(heap_bases + from_rank)
    to_base = tl.load(heap_bases + to_rank)
    elem_bytes: tl.constexpr = _pointee_bytes(pointer.dtype)
    delta = (to_base - from_base) // elem_bytes
    delta = tl.multiple_of(delta, _delta_divisibility(pointer.dtype))
    translated = pointer + delta
    if hint is not None:
        translated = tl.max_contiguous(tl.multiple_of(translated, hint), hint)
    return translated


@triton.jit
def translate(pointer, from_rank, to_rank, heap_bases, hint: tl.constexpr = None):
    """Translate ``pointer`` from ``from_rank``'s address space into ``to_rank``'s.

    Granularity: per element of the pointer block (or one scalar pointer); no memory access but
    two loads of ``heap_bases`` (per program). ``to_rank`` is a rank, or a block of ranks that
    broadcasts with the pointer block (each lane translated to its own rank: a gather of
    ``heap_bases``, as when a tile's rows lie in different ranks' shards). Memory semantics and
    scope: none, it only computes addresses. ``pointer`` must point into the symmetric heap
    (checked under Triton's interpreter for another rank, and everywhere with ``IRIS_DEBUG=1``).
    ``hint`` (int or tuple, one entry per dimension) adds ``tl.multiple_of`` and
    ``tl.max_contiguous`` on the result; it is rarely needed, the alignment is kept anyway.

    Example::

        remote = iris.device.translate(buf + offs, cur_rank, peer, heap_bases)
        x = tl.load(remote)
    """
    return translate_masked(pointer, from_rank, to_rank, heap_bases, None, hint, "iris.device.translate")
