"""Compile-time dtype rules of the collectives: what sums are accumulated in, and which
combinations are refused (with an error that names the call, the types and the fix).

fp16 and bf16 are accumulated in fp32 and rounded once, when the result is stored; fp32 in
fp32; fp64 in fp64; 32- and 64-bit integers in their own type (wrapping like the hardware).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._errors import IrisUnsupportedError

_FLOAT_ACC = {"fp16": "fp32", "bf16": "fp32", "fp32": "fp32", "fp64": "fp64"}
_INT_ACC = {"int32": "int32", "int64": "int64", "uint32": "uint32", "uint64": "uint64"}
_ATOMIC_DST = ("fp32", "fp64", "int32", "int64", "uint32", "uint64")
_TL_TYPES = {"fp32": tl.float32, "fp64": tl.float64, "int32": tl.int32, "int64": tl.int64, "uint32": tl.uint32,
             "uint64": tl.uint64}
_INT_OF_WIDTH = {16: tl.int16, 32: tl.int32, 64: tl.int64}


@triton.constexpr_function
def accumulator_type(call, dtype):
    """The type a sum of ``dtype`` values is accumulated in, or an error for types that cannot be
    summed (8-bit, bool)."""
    name = dtype.name
    if name not in _FLOAT_ACC and name not in _INT_ACC:
        raise IrisUnsupportedError(
            f"{call} on {name} data: the reducing collectives sum fp16, bf16, fp32, fp64, int32, int64, uint32 "
            f"and uint64; convert the tile (tile.data.to(tl.float32)) or the tensor to one of those")
    return _TL_TYPES[_FLOAT_ACC[name] if name in _FLOAT_ACC else _INT_ACC[name]]


@triton.constexpr_function
def atomic_destination_type(call, data_dtype, dst_dtype):
    """Element type of an atomically accumulated destination: a type NVIDIA GPUs (and the CPU
    backend) add atomically, and that does not round a 16-bit sum at every addition."""
    data, dst = data_dtype.name, dst_dtype.name
    if dst in ("fp16", "bf16"):
        raise IrisUnsupportedError(
            f"{call}(tile.data {data}, dst_view {dst}): atomics on a {dst} destination would round the sum at every "
            f"addition (fp16/bf16 sums are accumulated in fp32 and rounded once), and the CPU backend has no "
            f"{dst} atomics at all; pass an fp32 dst_view (convert it once when every rank is done), or use "
            f"all_reduce_one_shot / all_reduce_two_shot / all_reduce_ring, which take a {dst} destination")
    if dst not in _ATOMIC_DST:
        raise IrisUnsupportedError(
            f"{call}(dst_view {dst}): there is no atomic add for {dst}; use one of {', '.join(_ATOMIC_DST)}")
    if (data in _FLOAT_ACC) != (dst in _FLOAT_ACC) or data not in (*_FLOAT_ACC, *_INT_ACC):
        raise IrisUnsupportedError(
            f"{call}(tile.data {data}, dst_view {dst}): data and destination must both be floating point or both "
            f"integers; convert tile.data first")
    return dst_dtype


@triton.constexpr_function
def int_type_of_width(bits):
    """The signed integer type of ``bits`` bits (16, 32 or 64), to move raw bits."""
    return _INT_OF_WIDTH[bits]


@triton.constexpr_function
def pieces_per_partial(call, acc_dtype, dst_dtype):
    """How many ``dst_dtype``-sized pieces one ``acc_dtype`` partial sum is sent in (1 or 2)."""
    acc_bits, dst_bits = acc_dtype.primitive_bitwidth, dst_dtype.primitive_bitwidth
    if acc_bits not in (dst_bits, 2 * dst_bits) or dst_bits not in _INT_OF_WIDTH:
        raise IrisUnsupportedError(
            f"{call}: partial sums are accumulated in {acc_dtype.name}, which does not fit the {dst_dtype.name} "
            f"dst_view in one or two pieces; use a dst_view of 16, 32 or 64 bits matching the data")
    return acc_bits // dst_bits


@triton.constexpr_function
def check_lock_array(call, locks_dtype):
    """Refuse lock arrays that are not int32 (the counters' type)."""
    elem = locks_dtype.element_ty.name if hasattr(locks_dtype, "element_ty") else str(locks_dtype)
    if elem != "int32":
        raise IrisUnsupportedError(
            f"{call}: locks must point at int32 words (got {elem}); allocate them with "
            f"iris.zeros(iris.collectives.lock_words(M, N, BLOCK_M, BLOCK_N), dtype=torch.int32)")
    return 0
