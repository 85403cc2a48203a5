"""``round_to``: a floating-point conversion that rounds to nearest even on every backend.

On the GPU ``x.to(tl.bfloat16)`` rounds an fp32 value to the nearest bf16, ties to even. Triton's
interpreter (3.6 to 3.9) truncates toward zero instead, with ``fp_downcast_rounding="rtne"`` too,
so a collective that sums in fp32 and rounds once returned about a third of its bf16 elements one
unit in the last place apart on the two backends. fp16 rounds correctly on both. ``round_to`` does
the bf16 rounding itself under the interpreter (on the fp32 bits) and is the plain conversion on
the GPU, where it costs nothing extra.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._interpreter import INTERPRETER


@triton.jit
def round_to(x, dtype: tl.constexpr):
    """``x`` converted to ``dtype``, rounded to nearest, ties to even, on every backend.

    Use it wherever an fp32 (or wider) result is narrowed to fp16 or bf16, e.g. an accumulator
    stored into a bf16 tensor: results are then bit-identical on the ``cpu`` and ``cuda`` backends.
    Other conversions are ``x.to(dtype)``. Granularity: per element of the block. No memory access.
    Example: ``tl.store(out + offs, iris.device.round_to(acc, out.dtype.element_ty))``.
    """
    if INTERPRETER and x.dtype == tl.float32 and dtype == tl.bfloat16:
        result = _bf16_nearest_even(x)
    else:
        result = x.to(dtype)
    return result


@triton.jit
def _bf16_nearest_even(x):
    # bf16 is the upper half of an fp32. Adding 0x7FFF plus the lowest kept bit before dropping the
    # lower half rounds to nearest with ties to even; it carries into the exponent where it must
    # (up to infinity). NaNs keep their sign and are made quiet.
    bits = x.to(tl.uint32, bitcast=True)
    lowest_kept = (bits >> 16) & 1
    rounded = (bits + 0x7FFF + lowest_kept) >> 16
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    upper = tl.where(is_nan, (bits >> 16) | 0x40, rounded)
    return upper.to(tl.uint16).to(tl.bfloat16, bitcast=True)
