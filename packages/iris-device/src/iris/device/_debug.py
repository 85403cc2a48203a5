"""Opt-in in-kernel checks of ranks and translated addresses (``IRIS_DEBUG=1``).

Read once at import. When off, ``DEBUG`` is a false compile-time constant and every check is
removed from the kernel: it costs nothing. When on:

- on the GPU a failing check prints a line naming rank, peer and the bad value
  (``tl.device_print``) and stops the kernel (``tl.device_assert``). Triton compiles device
  asserts only in its debug mode, which it reads from ``TRITON_DEBUG`` once, when ``triton`` is
  imported; so this module switches ``triton.knobs.runtime.debug`` on itself (and sets the
  variable for child processes);
- under Triton's interpreter ``tl.device_assert`` never fires (the interpreter's options have
  debug off), so a failing check raises :class:`IrisUsageError` with the same facts instead.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from . import _layout
from ._errors import IrisUsageError
from ._interpreter import INTERPRETER
from ._layout import HEAP_BASES_C, HEAP_SIZE_C, NUM_RANKS


def debug_enabled() -> bool:
    """True when ``IRIS_DEBUG`` is set to something other than ``""`` or ``"0"``."""
    return os.environ.get("IRIS_DEBUG", "0") not in ("", "0")


if debug_enabled():
    os.environ.setdefault("TRITON_DEBUG", "1")
    triton.knobs.runtime.debug = True

#: Compile-time flag: in-kernel rank and address checks are compiled in.
DEBUG: tl.constexpr = tl.constexpr(debug_enabled())
_NUM_RANKS_BEFORE_BASES: tl.constexpr = tl.constexpr(HEAP_BASES_C.value - NUM_RANKS)
# The runtime maps a signal pad right after each heap, as reachable by peers as the heap itself.
_PAD_BYTES: tl.constexpr = tl.constexpr(_layout.SIGNAL_PAD_BYTES)


@triton.constexpr_function
def host_scalar(value):
    """Interpreter only: an interpreter tensor (or a plain number) as a Python scalar (its first
    element), for host-side error messages. A constexpr function because Triton refuses plain
    Python functions among a kernel's dependencies."""
    data = getattr(getattr(value, "handle", None), "data", value)
    return data.reshape(-1)[0].item() if hasattr(data, "reshape") else data


@triton.constexpr_function
def _call_name(call):
    return "an iris.device call" if call is None else call


@triton.constexpr_function
def _rank_message(call):
    return (f"iris debug: {_call_name(call)}: a rank is outside [0, num_ranks); the line printed above "
            f"names rank, peer and num_ranks; pass ranks in range")


@triton.constexpr_function
def _address_message(call):
    return (f"iris debug: {_call_name(call)}: a pointer is not inside the symmetric heap; the line printed "
            f"above names rank, peer and heap offset; allocate the tensor with ctx.zeros() (or another factory "
            f"of the Iris context)")


@triton.constexpr_function
def _print_prefix(call, what):
    return f"iris debug: {_call_name(call)}: {what} = "


@triton.constexpr_function
def _raise_rank_error(ok, call, rank, peer, num_ranks):
    # Interpreter only: the arguments are concrete there. ``peer`` (and ``ok``) may be a block of
    # ranks, one per lane: the first lane that fails is named.
    import numpy as np  # host code: in the body, out of the compiler's sight

    from ._heap_check import _data, rank_message

    lanes = np.asarray(_data(ok)).reshape(-1)
    if lanes.all():
        return
    first = int(np.argmin(lanes))
    peers = np.asarray(_data(peer)).reshape(-1)
    raise IrisUsageError(rank_message(call, host_scalar(rank), int(peers[first if peers.size > 1 else 0]),
                                      host_scalar(num_ranks), debug=True))


@triton.constexpr_function
def _raise_address_error(n_bad, call, rank, peer, offset, heap_size, base):
    # Interpreter only: the arguments are concrete there. The same error as the default check's
    # (iris.device._heap_check), so the launch names the kernel argument the address lies in.
    if host_scalar(n_bad):
        from ._heap_check import off_heap_error  # host code: in the body, out of the compiler's sight

        raise off_heap_error(call, host_scalar(rank), host_scalar(peer), host_scalar(n_bad), host_scalar(offset),
                             host_scalar(heap_size), host_scalar(base) + host_scalar(offset), debug=True)


@triton.jit
def check_ranks(from_rank, to_rank, heap_bases, call: tl.constexpr = None):
    """Fail unless both ranks lie in ``[0, num_ranks)``. Per call: scalar ranks, or a block of
    peers (``to_rank``), one per lane of a translated pointer block."""
    num_ranks = tl.load(heap_bases - _NUM_RANKS_BEFORE_BASES)
    ok = (from_rank >= 0) & (from_rank < num_ranks) & (to_rank >= 0) & (to_rank < num_ranks)
    if INTERPRETER:
        _raise_rank_error(ok, call, from_rank, to_rank, num_ranks)
    else:
        # every lane (a scalar is a block of one here): the branch needs one condition
        if tl.min(tl.ravel(ok.to(tl.int32) + tl.zeros([1], tl.int32)), axis=0) == 0:
            tl.device_print(_print_prefix(call, "rank, peer, num_ranks"), from_rank, to_rank, num_ranks)
        tl.device_assert(ok, _rank_message(call))


@triton.jit
def check_address(pointer, from_rank, to_rank, heap_bases, mask, call: tl.constexpr = None):
    """Fail if an (unmasked) address is outside ``from_rank``'s heap (and the signal pad after
    it). Per element of the block.

    ``pointer`` is in ``from_rank``'s address space, so in-heap there means in-heap on
    ``to_rank`` after translation.
    """
    num_ranks = tl.load(heap_bases - _NUM_RANKS_BEFORE_BASES)
    heap_size = tl.load(heap_bases + num_ranks + HEAP_SIZE_C)
    base = tl.load(heap_bases + from_rank)
    offset = tl.cast(pointer, tl.int64) - base
    outside = (offset < 0) | (offset >= heap_size + _PAD_BYTES)
    if mask is not None:
        outside = outside & mask
    # Broadcasting against a 1-element block makes scalars and blocks reduce alike.
    outside = outside | tl.zeros([1], dtype=tl.int1)
    n_bad = tl.sum(outside.to(tl.int32), axis=None)
    first = tl.min(tl.where(outside, offset, 0x7FFFFFFFFFFFFFFF), axis=None)
    if INTERPRETER:
        _raise_address_error(n_bad, call, from_rank, to_rank, first, heap_size, base)
    else:
        if n_bad > 0:
            tl.device_print(_print_prefix(call, "rank, peer, heap offset, heap_size"), from_rank, to_rank, first,
                            heap_size)
        tl.device_assert(n_bad == 0, _address_message(call))


@triton.constexpr_function
def _raise_context_error(ok, rank, world_size, stored_rank, stored_world):
    # Interpreter only: the arguments are concrete there.
    if not host_scalar(ok):
        raise IrisUsageError(
            f"iris debug: DeviceContext.initialize(rank={host_scalar(rank)}, "
            f"world_size={host_scalar(world_size)}) does not match the context tensor "
            f"(rank {host_scalar(stored_rank)}, world_size {host_scalar(stored_world)}); pass "
            f"iris.rank and iris.world_size of the Iris that made the tensor")


@triton.jit
def check_context(context_tensor, rank: tl.constexpr, world_size: tl.constexpr):
    """Fail unless the context tensor was written for ``rank`` of ``world_size``. Per call."""
    stored_rank = tl.load(context_tensor)
    stored_world = tl.load(context_tensor + 1)
    ok = (stored_rank == rank) & (stored_world == world_size)
    if INTERPRETER:
        _raise_context_error(ok, rank, world_size, stored_rank, stored_world)
    else:
        if not ok:
            tl.device_print("iris debug: DeviceContext.initialize: rank, world_size, tensor's rank, tensor's "
                            "world_size = ", rank, world_size, stored_rank, stored_world)
        tl.device_assert(ok, "iris debug: DeviceContext.initialize(rank, world_size) does not match the context "
                             "tensor; pass iris.rank and iris.world_size of the Iris that made the tensor")
