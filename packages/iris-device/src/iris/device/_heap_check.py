"""The check every remote access makes under Triton's interpreter, by default: ranks in range and
addresses on the symmetric heap.

A remote access translates a pointer of this rank into a peer's address space by adding the
difference of the two heap bases (``iris.device._translate``). That is only right for a pointer
into the heap: a plain ``torch.zeros`` buffer translated to a peer lands on an unrelated address,
and the store there kills the process (SIGSEGV) or, worse, lands in memory that happens to be
mapped and corrupts it silently. Under Triton's interpreter (the cpu backend) every kernel
operation already runs on the host, so a range check costs host time only and little of it: one
call per translated block, a few numpy comparisons over the block's addresses, no per-element
Python (measured in docs/concepts.md, "Pointers off the heap"). It raises:

- :class:`IrisUsageError` for a rank outside ``[0, num_ranks)`` (the table would be read out of
  bounds);
- :class:`NotOnHeapError` for an unmasked address outside this rank's heap (and the signal pad
  after it), on an access to another rank. An access to this rank itself is not translated and
  may use any memory, as on the GPU.

The launch (``iris.device._interpreter.surface_iris_errors``) takes the error out of the
interpreter's wrapping and names the kernel argument the bad address lies in. ``IRIS_DEBUG=1``
checks more (this rank's own accesses too, and the same checks on the GPU): see
``iris.device._debug``, whose interpreter messages come from :func:`off_heap_message` too.
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import _layout
from ._errors import IrisUsageError, NotOnHeapError

# Words of the table (int64), counted from heap_bases (the context tensor's HEAP_BASES).
_NUM_RANKS_AT = _layout.NUM_RANKS - _layout.HEAP_BASES


def _word(address: int) -> int:
    return ctypes.c_int64.from_address(address).value


def _data(value):
    # An interpreter tensor's numpy data, or the value itself (a number, None).
    return getattr(getattr(value, "handle", None), "data", value)


def _scalar(value) -> int:
    data = _data(value)
    return int(data.item()) if hasattr(data, "item") else int(data)


def _call_name(call) -> str:
    return "an iris.device call" if call is None else call


def rank_message(call, rank, peer, num_ranks, debug: bool = False) -> str:
    """The message of a rank outside ``[0, num_ranks)``."""
    return (f"{'iris debug: ' if debug else ''}{_call_name(call)}: rank {rank}, peer {peer}: a rank is outside "
            f"[0, {num_ranks}); pass ranks in range (ctx.rank, ctx.world_size)")


#: The fix every message of an address outside the heap ends with.
FIX = ("another rank reaches only memory on the heap: allocate the tensor with ctx.zeros() (or another factory "
       "of the Iris context: ctx.empty(), ctx.full(), ...)")


def off_heap_message(call, rank, peer, count, offset, heap_size, tensor: str | None = None,
                     debug: bool = False) -> str:
    """The message of ``count`` addresses outside the heap, the lowest at heap ``offset``; or, where
    the launch found the kernel argument they lie in and it is not on the heap, of that tensor
    (``tensor`` describes it)."""
    head = f"{'iris debug: ' if debug else ''}{_call_name(call)}: rank {rank}, peer {peer}: "
    if tensor:
        return f"{head}{tensor} is not on the symmetric heap, and {FIX}"
    return (f"{head}{count} address(es) outside the symmetric heap, first at heap offset {offset} "
            f"(heap_size {heap_size}); {FIX}")


def off_heap_error(call, rank, peer, count, offset, heap_size, address: int, debug: bool = False) -> NotOnHeapError:
    """A :class:`NotOnHeapError` that keeps its facts (``address``: the lowest bad one, in this
    process) for the launch to name the kernel argument it lies in."""
    error = NotOnHeapError(off_heap_message(call, rank, peer, count, offset, heap_size, debug=debug))
    error.iris_off_heap = dict(call=call, rank=rank, peer=peer, count=count, offset=offset, heap_size=heap_size,
                               address=address, debug=debug)
    return error


def check_reach(pointer, from_rank, to_rank, heap_bases, mask, call) -> None:
    """Interpreter only (concrete values): fail unless both ranks are in ``[0, num_ranks)`` and,
    when ``to_rank`` is another rank, every unmasked address of ``pointer`` lies in ``from_rank``'s
    heap or the signal pad after it. ``to_rank`` may be a block of ranks, one per lane of the
    pointer block: then the lanes bound for another rank are checked. Per translated block: host
    code, a few numpy operations.
    Kernels reach it through ``iris.device._translate``'s constexpr function."""
    table = _scalar(heap_bases)
    num_ranks = _word(table + 8 * _NUM_RANKS_AT)
    rank = _scalar(from_rank)
    peers = np.asarray(_data(to_rank))
    if peers.size != 1:  # a block of peers, one per lane of the pointer block: each lane checked as one
        bad = peers[(peers < 0) | (peers >= num_ranks)]
        if not (0 <= rank < num_ranks) or bad.size:
            raise IrisUsageError(rank_message(call, rank, int(bad.flat[0]) if bad.size else 0, num_ranks))
        elsewhere = peers != rank
        if elsewhere.any():
            active = _data(mask)
            check_reach(pointer, from_rank, int(peers[elsewhere].flat[0]), heap_bases,
                        elsewhere if active is None else elsewhere & active, call)
        return
    peer = int(peers.item())
    if not (0 <= rank < num_ranks and 0 <= peer < num_ranks):
        raise IrisUsageError(rank_message(call, rank, peer, num_ranks))
    if rank == peer:
        return  # not translated: any memory of this rank is reachable
    base = _word(table + 8 * rank)
    span = _word(table + 8 * (num_ranks + _layout.HEAP_SIZE)) + _layout.SIGNAL_PAD_BYTES
    addresses = np.asarray(_data(pointer))
    if addresses.dtype != np.uint64:
        addresses = addresses.astype(np.uint64)
    # offsets from the base, unsigned: an address below the base wraps to a huge offset, so one
    # subtraction and one maximum check both ends (the usual case: every lane, masked or not, in)
    offsets = addresses - np.uint64(base)
    if int(offsets.max()) < span:
        return
    outside = offsets >= span
    active = _data(mask)
    if active is not None:
        outside = outside & active
    if outside.any():
        bad = np.broadcast_to(addresses, outside.shape)[outside]
        lowest = int(bad.min())
        raise off_heap_error(call, rank, peer, int(outside.sum()), lowest - base, span - _layout.SIGNAL_PAD_BYTES,
                             lowest)
