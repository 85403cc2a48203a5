"""What torch.distributed passes, in the terms of :mod:`iris.collectives.ccl`: reductions by name,
and tensors that ccl moves though their dtype is not one it reduces.

The collectives that only move data (gather, broadcast, all-to-all) do not look at the values, so
any dtype works: a tensor whose bytes split into 4-byte words is moved as an int32 view of itself,
and any other (an odd number of ``uint8`` bytes, as ``all_gather_object`` sends) is moved
through an int32 buffer padded to whole words. Reductions take ccl's dtypes only.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from iris.runtime import IrisUnsupportedError, UnsupportedDtypeError

from ..ccl._checks import DTYPES

#: ccl's name of each of torch's reductions that it has.
OP_NAMES = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg", dist.ReduceOp.MAX: "max", dist.ReduceOp.MIN: "min",
        dist.ReduceOp.PRODUCT: "prod"}


def op_name(call: str, reduce_op) -> str:
    """ccl's name of ``reduce_op`` (a ``ReduceOp`` of the options torch passes, or its type)."""
    kind = getattr(reduce_op, "op", reduce_op)
    name = OP_NAMES.get(kind)
    if name is None:
        raise IrisUnsupportedError(
            f"{call}: op={kind} is not one of the reductions of the iris backend (SUM, AVG, MAX, MIN, PRODUCT); "
            f"bitwise ops and PREMUL_SUM are not in iris.collectives.ccl: run this call on a gloo or nccl group "
            f"(dist.new_group(backend='gloo')), or scale the tensor first and use SUM")
    return name


def check_reducible(call: str, t: torch.Tensor) -> None:
    """``t``'s dtype is one ccl reduces."""
    if t.dtype not in DTYPES:
        raise UnsupportedDtypeError(
            f"{call}: the iris backend reduces {', '.join(str(d) for d in DTYPES)}, not {t.dtype}; convert the "
            f"tensor (t.float(), t.int()), or run this call on a gloo group (dist.new_group(backend='gloo'))")


def flat(t: torch.Tensor) -> torch.Tensor:
    """``t`` as one dimension, a view (``t`` is contiguous)."""
    return t.view(-1) if t.dim() != 1 else t


def words(t: torch.Tensor) -> torch.Tensor | None:
    """``t`` (contiguous) as a tensor of a dtype ccl moves, sharing its memory: itself, or its
    bytes as int32 words; None when its bytes do not split into aligned words."""
    if t.dtype in DTYPES:
        return flat(t)
    nbytes = t.numel() * t.element_size()
    if nbytes % 4 or (t.storage_offset() * t.element_size()) % 4:
        return None
    return flat(t).view(torch.uint8).view(torch.int32)


def padded(t: torch.Tensor, words_per_rank: int | None = None) -> torch.Tensor:
    """A new int32 buffer holding ``t``'s bytes, zero-padded to whole words (to
    ``words_per_rank`` words when given)."""
    nbytes = t.numel() * t.element_size()
    n = words_per_rank if words_per_rank is not None else -(-nbytes // 4)
    buffer = torch.zeros(n, dtype=torch.int32, device=t.device)
    buffer.view(torch.uint8)[:nbytes].copy_(flat(t).view(torch.uint8))
    return buffer


def unpad(buffer: torch.Tensor, t: torch.Tensor) -> None:
    """Copy ``t``'s bytes back from ``buffer`` (from :func:`padded`) into ``t``."""
    nbytes = t.numel() * t.element_size()
    flat(t).view(torch.uint8).copy_(buffer.view(torch.uint8)[:nbytes])
