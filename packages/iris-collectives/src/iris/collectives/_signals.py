"""Messages between kernels: put a block with a signal, wait for the signal.

The pair a kernel author needs for point-to-point traffic (a pipeline stage handing a tile to the
next, a producer feeding a consumer): :func:`put_with_signal` copies a block of this rank's memory
into a peer's heap and then adds 1 to a counter on that peer; :func:`wait_signal` waits on this
rank until its counter reaches a value. The counter only grows, so the ``k``-th message waits for
``k`` and nothing is reset between messages (the flags of the collectives work the same way, see
:mod:`iris.collectives._sync`); the wait is bounded by the watchdog, which names the rank, the
peer and the counter when the signal never comes. The host-side ``ccl.send`` / ``ccl.recv`` are
built from the same two steps.
"""

# No "from __future__ import annotations": Triton resolves jit globals by name at compile time.
import triton
import triton.language as tl

from iris.device import put
from iris.device._layout import CUR_RANK_AT_C

from ._sync import signal, wait_at_least

#: The name :func:`wait_signal`'s waits report (an entry of iris.device._watchdog.WAIT_CALLS).
CALL = "iris.collectives.wait_signal"
CALL_C: tl.constexpr = tl.constexpr(CALL)


@triton.jit
def put_with_signal(from_ptr, to_ptr, flag, from_rank, to_rank, heap_bases, mask=None, hint: tl.constexpr = None):
    """Copy this rank's block at ``from_ptr`` into ``to_rank``'s ``to_ptr``, then add 1 to the
    int32 counter ``flag`` on ``to_rank``.

    ``from_ptr`` is local (any memory of this process); ``to_ptr`` and ``flag`` are addresses of
    this rank's heap, translated to ``to_rank``'s (the same allocation on every rank, as with
    :func:`iris.device.put`). ``from_rank`` is the current rank. ``hint`` adds alignment facts on
    the translated pointer (see :func:`iris.device.put`).

    Granularity: the copy per element of the block, the signal once per program (call it with the
    same ``flag`` in every thread). Memory semantics: weak loads and remote stores, then a CTA
    barrier and a release add at system scope (:func:`signal`): a peer that sees the counter reach
    the value with :func:`wait_signal` (acquire, system scope) sees every element of the block, and
    of every block the program stored before. Scope: system (peers on other GPUs included).

    Example (producer rank ``r`` sends its ``k``-th tile to rank ``r + 1``; the consumer waits)::

        ic.put_with_signal(x + offs, inbox + offs, flags + slot, r, r + 1, heap_bases, mask=offs < n)
        # ... on rank r + 1:
        ic.wait_signal(flags + slot, k, heap_bases, peer=r, index=slot)
        tile = tl.load(inbox + offs, mask=offs < n)
    """
    put(from_ptr, to_ptr, from_rank, to_rank, heap_bases, mask=mask, hint=hint)
    signal(flag, from_rank, to_rank, heap_bases)


@triton.jit
def wait_signal(flag, value, heap_bases, peer=-1, index=-1):
    """Wait until the int32 counter at ``flag`` (this rank's memory) is at least ``value``: the
    ``value``-th signal of :func:`put_with_signal` (or :func:`signal`) has arrived.

    ``peer`` (the sender, -1 when several signal the counter) and ``index`` (a slot or tag of your
    choosing) only name the wait in the watchdog's report. Bounded by the watchdog
    (``IRIS_TIMEOUT_S``): a signal that never comes ends the job with a report that names this rank,
    the peer, the counter's value and the value waited for, instead of a hang.

    Granularity: per program. Memory semantics: acquire at system scope, then a CTA barrier: every
    thread of the program sees what the signalling peers stored before their signal.

    Example::

        ic.wait_signal(flags + slot, k, ctx.heap_bases, peer=producer, index=slot)
    """
    rank = tl.load(heap_bases + CUR_RANK_AT_C)
    wait_at_least(flag, value, CALL_C, "signal", rank, peer, index, heap_bases)
