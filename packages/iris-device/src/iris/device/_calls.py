"""The device side of the call agreement: the ranks' collective calls, counted and compared where
their kernels meet.

Every rank must make the same collective calls, in the same order, with the same shapes, dtypes
and options. The host agrees on a call when its signature is new (``iris.runtime``'s call
agreement, one exchange among the ranks); a call whose launch plan is cached launches with no
host exchange, and this is its check. Each collective kernel gets the *fingerprint* of its call
(31 bits of a hash of the call's signature, the same on every rank for the same call; a run-time
argument, so that new calls compile nothing), and its program 0:

- on entry (:func:`call_enter`), before its first signal, counts the call (this rank's ``n``-th
  collective call of the context: the context tensor's ``call_counter``, in device memory, so that
  CUDA graph replays count too; a group's context tensor counts the group's calls) and stores
  ``(n, fingerprint)`` into slot ``[n % 2][rank]`` of every rank's call words (the signal pad's,
  or a group's own): remote stores that the call's first signal publishes (its release orders
  them), no round trip;
- after its waits (:func:`call_check`), which imply that every peer's program 0 has entered the
  call too, reads slots ``[n % 2]`` of its own pad (one load of ``W`` words, local memory) and
  compares: a peer whose slot holds call ``n`` with another fingerprint made another call. A peer
  cannot be two calls ahead (each call waits for every rank), so two slots per rank keep the words
  of the call being compared while a peer already enters the next one.

A rank that finds a mismatch ends the job: on the GPU program 0 writes a report into the
watchdog's host record (``STATE_CALL_MISMATCH``) and waits there until the host has printed both calls
and is ending the job, so the wrong result is never used; under the interpreter (the ``cpu``
backend) it raises ``IrisCallMismatchError`` at once, through the describer the runtime registers
for the context (:data:`DESCRIBERS`), which names both calls. Only a word of a rank whose
fingerprint is equal is never read wrongly: the check cannot report a mismatch where there is
none, and it finds every mismatch where program 0 waits for every peer's program 0 (every host
collective of ``iris.collectives`` does; ``matmul_reduce_scatter``'s owner strategy on rank 0
only, whose report names both calls as well).

Compiled in unless ``IRIS_CHECK_CALLS=0`` (read at import, like ``IRIS_DEBUG``), for worlds of 2
to ``CALL_CHECK_MAX_RANKS`` ranks, and only with the watchdog on the GPU (the report is the
watchdog's). Peers reached only over the network (the ``nvshmem`` backend's other nodes) are not
compared.

Cost, on program 0's path alone: on entry, one round trip of plain loads (every address is in the
context tensor, so the counter, the call words' offset and the heap bases go out at once:
``world_size`` is the context's ``num_ranks``, and the runtime always writes the offset, never 0;
no atomic, so no CTA barrier), then one store of the count and one store instruction to the ``W``
ranks; at its end, one load of ``W`` int64 words (one transaction up to 8 ranks) at the address
:func:`call_enter` returned with the count (the call's *ticket*: nothing to look up) and a
comparison. Kernels whose protocol is their own (``ccl``'s pull and buffered one-shot rounds, the
buffered strategy of ``ops.all_reduce_residual_rmsnorm``) hide
both round trips: :func:`call_begin` issues the entry's loads first thing and
:func:`call_publish` uses them just before the first signal, after the lock record's atomic and
the staging; :func:`call_peek` loads the slots right after the first wait for every peer and
:func:`call_verify` compares at the end, after the reads of the peers' data.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from ._interpreter import INTERPRETER
from ._layout import (
    CALL_CHECK_MAX_RANKS,
    CALL_COUNTER_C,
    CALL_SLOTS_AT,
    CALL_WORDS_IN_PAD,
    CALL_WORDS_OFFSET_C,
    WATCHDOG_RECORD_C,
)
from ._watchdog import WATCHDOG, watchdog_report_call_mismatch


def calls_check_from_env() -> bool:
    """``IRIS_CHECK_CALLS``: the call agreement is on unless it is ``0`` (or empty)."""
    return os.environ.get("IRIS_CHECK_CALLS", "1").strip() not in ("0", "")


#: Compile-time switch (``IRIS_CHECK_CALLS``, read at import): the call agreement is on.
CHECK_CALLS: tl.constexpr = tl.constexpr(calls_check_from_env())

#: Byte offset, from a rank's heap base plus the heap size, of a context's call slots.
SLOTS_OFFSET = CALL_WORDS_IN_PAD + CALL_SLOTS_AT
_SLOTS_C: tl.constexpr = tl.constexpr(CALL_SLOTS_AT)

#: The fingerprints are 31-bit (a non-negative int32 kernel argument) and never 0 (an empty slot).
FINGERPRINT_MASK = 0x7FFFFFFF
_MASK: tl.constexpr = tl.constexpr(FINGERPRINT_MASK)

#: Interpreter only: the watchdog record's address of a context -> a weak reference to
#: ``describe(rank, peer, call, mine, theirs)``, which raises the context's
#: ``IrisCallMismatchError`` (registered by ``iris.runtime``, which knows the calls behind the
#: fingerprints).
DESCRIBERS: dict = {}


def fingerprint(text: str) -> int:
    """The fingerprint of a call's signature text: 31 bits of its CRC-32, never 0 (the same in
    every process, unlike ``hash``)."""
    import zlib

    return (zlib.crc32(text.encode()) & FINGERPRINT_MASK) or 1


@triton.constexpr_function
def checked(world_size):
    """Whether a kernel for ``world_size`` ranks carries the check (compile time)."""
    return bool(CHECK_CALLS.value) and 1 < world_size <= CALL_CHECK_MAX_RANKS


@triton.constexpr_function
def _pow2(n):
    return 1 << (n - 1).bit_length()


@triton.jit
def _first_program():
    return (tl.program_id(0) == 0) & (tl.program_id(1) == 0) & (tl.program_id(2) == 0)


@triton.jit
def call_begin(heap_bases, rank: tl.constexpr, world_size: tl.constexpr):
    """The first half of :func:`call_enter`: issue the loads the call's entry needs and return
    them, *pending*, for :func:`call_publish`, which uses them. A kernel calls it first thing and
    :func:`call_publish` just before its first signal, so that the loads' round trip overlaps the
    kernel's own first memory operations (a lock record's atomic, the staging of its input)
    instead of preceding them. Returns ``(count, words, bases, own)``: this rank's count of the
    context's calls before this one, the call words' offset, every rank's heap base and this
    rank's (zeros where the check is compiled out or in programs other than the first).

    Granularity: program 0 only (the others return zeros at once). Memory semantics: plain loads
    of the context tensor (its call counter, the call words' offset and the heap bases), all at
    once: every address is the context tensor's, no load waits for another, and nothing waits for
    them here (no atomic, hence no CTA barrier)."""
    q = tl.arange(0, _pow2(world_size))
    count = tl.full([], 0, tl.int32)
    words = tl.full([], 0, tl.int64)
    bases = tl.zeros(q.shape, tl.int64)
    own = tl.full([], 0, tl.int64)
    if checked(world_size):
        if _first_program():
            # The trailer sits at heap_bases + world_size (world_size is the context's num_ranks):
            # the call words' offset (which the runtime always writes: never 0, no heap_size to add)
            # and the counter. Only program 0 counts, and kernel boundaries order a rank's calls of
            # a context (one stream): a plain load and, in call_publish, a plain store count them.
            trailer = heap_bases + world_size
            count = tl.load(trailer + CALL_COUNTER_C).to(tl.int32)
            words = tl.load(trailer + CALL_WORDS_OFFSET_C)
            bases = tl.load(heap_bases + q, mask=q < world_size, other=0)
            # this rank's base once more, as a scalar: picking it out of `bases` would be a
            # reduction across the program's threads (a CTA barrier) in call_publish
            own = tl.load(heap_bases + rank)
    return count, words, bases, own


@triton.jit
def call_publish(heap_bases, pending, fingerprint, rank: tl.constexpr, world_size: tl.constexpr):
    """The second half of :func:`call_enter`: count this rank's call and publish its fingerprint to
    every rank, from what :func:`call_begin` loaded (``pending``); returns the call's *ticket* for
    :func:`call_check` (see :func:`call_enter`). Call it once per call, in every program, before
    the kernel's first signal (whose release publishes the stores).

    Granularity: program 0 only. Memory semantics: a plain store of the new count into the context
    tensor's call counter and a weak store of ``(n << 32) | fingerprint`` into slot ``[n % 2][rank]``
    of every rank's call words reachable by pointer (one masked store instruction)."""
    count = tl.full([], 0, tl.int32)
    row = tl.full([], 0, tl.int64)
    if checked(world_size):
        if _first_program():
            count = pending[0] + 1
            words = pending[1]
            bases = pending[2]
            q = tl.arange(0, _pow2(world_size))
            tl.store(heap_bases + world_size + CALL_COUNTER_C, count.to(tl.int64))
            word = (count.to(tl.int64) << 32) | fingerprint.to(tl.int64)
            parity = _SLOTS_C + (count % 2).to(tl.int64) * (8 * world_size)
            # base 0: a peer on another node (nvshmem), not reachable by pointer
            reachable = (q < world_size) & (bases != 0)
            tl.store(tl.cast(bases + words + parity + 8 * rank, tl.pointer_type(tl.int64)),
                     tl.full(q.shape, 0, tl.int64) + word, mask=reachable)
            row = pending[3] + words + parity
    return count, row


@triton.jit
def call_enter(heap_bases, fingerprint, rank: tl.constexpr, world_size: tl.constexpr):
    """Count this rank's collective call and publish its fingerprint to every rank; returns the
    call's *ticket* for :func:`call_check`: ``(n, row)``, the call's number (1 for the first call
    of the context) and the address of slots ``[n % 2]`` in this rank's call words (``(0, 0)``
    where the check is compiled out or in programs other than the first). Call it on entry of a
    collective kernel, in every program, before the kernel's first signal; ``world_size`` must be
    the context's ``num_ranks`` (what ``DeviceContext.initialize`` checks in debug mode). It is
    :func:`call_begin` followed at once by :func:`call_publish`: a kernel that can put its own
    memory operations between the two should.

    Granularity: program 0 only (the others return at once). Memory semantics: plain loads of the
    context tensor's call counter, the call words' offset and every rank's heap base, all at once;
    then a plain store of the new count and a weak store of ``(n << 32) | fingerprint`` into slot
    ``[n % 2][rank]`` of every rank's call words reachable by pointer; the kernel's next release
    (its first signal) publishes them."""
    return call_publish(heap_bases, call_begin(heap_bases, rank, world_size), fingerprint, rank, world_size)


@triton.constexpr_function
def _raise_mismatch(record, rank, peer, call, mine, theirs):
    # Interpreter only: the context's describer raises IrisCallMismatchError naming both calls.
    from . import _calls
    from ._debug import host_scalar
    from ._errors import IrisUsageError

    values = [host_scalar(v) for v in (record, rank, peer, call, mine, theirs)]
    describe = _calls.DESCRIBERS.get(values[0])  # through the module: Triton refuses a global's methods
    if describe is not None and describe() is not None:
        describe()(*values[1:])
    raise IrisUsageError(f"iris: rank {values[1]} and rank {values[2]} made different collective calls (call "
                         f"{values[3]} of the context; fingerprints {values[4]:#x} and {values[5]:#x}); every rank "
                         f"must make the same calls in the same order")


@triton.jit
def call_peek(call, world_size: tl.constexpr):
    """Load what every rank published for this rank's call ``call`` (the ticket of
    :func:`call_publish`): this rank's own slots ``[n % 2]``, one load of ``W`` words, for
    :func:`call_verify`. Call it in program 0 after a wait for every peer's program 0 of this call
    (their stores reached this rank before their signals that the wait acquired); issued right
    after that wait, its round trip overlaps the kernel's reads of the peers' data instead of
    following them. Returns the ``W`` words (zeros where the check is compiled out or in other
    programs).

    Granularity: program 0 only. Memory semantics: one volatile load, after the wait's acquire."""
    q = tl.arange(0, _pow2(world_size))
    theirs = tl.zeros(q.shape, tl.int64)
    if checked(world_size):
        if _first_program():
            slots = tl.cast(call[1], tl.pointer_type(tl.int64))
            theirs = tl.load(slots + q, mask=q < world_size, other=0, volatile=True)
    return theirs


@triton.jit
def call_unpeeked(world_size: tl.constexpr):
    """What :func:`call_peek` returns before it has run (zeros): the initial value of the words a
    kernel carries from its first wait to :func:`call_verify`."""
    return tl.zeros([_pow2(world_size)], tl.int64)


@triton.jit
def call_verify(heap_bases, fingerprint, call, theirs, rank: tl.constexpr, world_size: tl.constexpr):
    """Compare this rank's call (``call``: its ticket) with every peer's call of the same number in
    ``theirs`` (what :func:`call_peek` loaded), and end the job when a peer's fingerprint differs
    (see the module docstring). Call it at the end of the kernel, in every program.

    Granularity: program 0 only. Memory semantics: none but the report's (a mismatch). Scope: the
    job."""
    if checked(world_size):
        if _first_program():
            count = call[0]
            q = tl.arange(0, _pow2(world_size))
            differs = ((theirs >> 32) == count.to(tl.int64)) & ((theirs & _MASK) != fingerprint)
            peer = tl.min(tl.where(differs & (q < world_size), q, world_size))
            if peer < world_size:
                other = tl.sum(tl.where(q == peer, theirs & _MASK, 0))
                if INTERPRETER:
                    record = tl.load(heap_bases + world_size + WATCHDOG_RECORD_C)
                    _raise_mismatch(record, rank, peer, count, fingerprint, other)
                else:
                    if WATCHDOG:
                        watchdog_report_call_mismatch(heap_bases, peer, count, other, fingerprint)


@triton.jit
def call_check(heap_bases, fingerprint, call, rank: tl.constexpr, world_size: tl.constexpr):
    """Compare this rank's call (``call``: the ticket :func:`call_enter` returned) with every
    peer's call of the same number, and end the job when a peer's fingerprint differs (see the
    module docstring). Call it in every program after the kernel's waits for every peer (program
    0's). It is :func:`call_peek` followed at once by :func:`call_verify`: a kernel that can issue
    the load right after its first wait for every peer, and compare at its end, should.

    Granularity: program 0 only. Memory semantics: one volatile load of this rank's own slots
    ``[n % 2]`` at the ticket's address (no address to look up), which the peers' stores reached
    before their signals that this program acquired. Scope: the job."""
    call_verify(heap_bases, fingerprint, call, call_peek(call, world_size), rank, world_size)
