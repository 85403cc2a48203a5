"""Debug mode (``IRIS_DEBUG=1``): every rank's call on a lock array must be the same call.

A lock array belongs to one collective and one tiling, and every rank must call it for the same
tensor shape with the same grid. A rank that does not (another collective, other ``M x N``, other
tiles, another grid) makes its peers wait for flags that never come, or pass waits that count
another protocol's signals and compute garbage. In debug mode each rank therefore publishes, in
its own lock record of the tile, the *signature* of its call, and compares the peers' with its own
where the protocol says they must have arrived. A mismatch fails at once and names both ranks and
what differs.

The record grows by these words in debug mode only (``_sync.LOCK_WORDS``; production records and
kernels are unchanged):

- ``SIGNED``: the call number (the ``EPOCH`` count, 1 for the first call on the tile) whose
  signature the next words hold; written last, with a release at system scope;
- the collective (an index of ``iris.device._watchdog.WAIT_CALLS``), ``M``, ``N``, ``BLOCK_M``,
  ``BLOCK_N`` and the grid (``num_programs`` along axes 0, 1 and 2).

A peer whose ``SIGNED`` word is below this rank's call number has not arrived: not a mismatch
(yet). One above it has moved on: nothing to compare. Equal call numbers on the same tile must carry
equal signatures. The collectives compare at points where no peer can finish the call without a
signal this rank has not sent yet, so a peer's words cannot change while they are read.
"""

# No "from __future__ import annotations": Triton resolves jit globals by name at compile time.
import triton
import triton.language as tl

from iris.device import INTERPRETER
from iris.device._debug import host_scalar
from iris.device._layout import HEAP_BASES_C, NUM_RANKS
from iris.device._watchdog import WAIT_CALLS, _call_index  # the index the watchdog reports use

from ._errors import IrisCallMismatchError

#: Word of a lock record where the signature starts (after the four flag words).
SIGNED: tl.constexpr = tl.constexpr(4)
#: Words of a signature: SIGNED, collective, M, N, BLOCK_M, BLOCK_N, grid (3 words).
SIGNATURE_WORDS = 9
#: Polls of a waiting program between two comparisons (a comparison reads every peer's record).
CHECK_POLLS: tl.constexpr = tl.constexpr(16)
# Bits of the "what differs" mask, in the order the message names them.
_DIFFERS = ("collective", "M x N", "tile shape", "grid")
_NUM_RANKS_BEFORE_BASES: tl.constexpr = tl.constexpr(HEAP_BASES_C.value - NUM_RANKS)


@triton.jit
def publish_signature(record, epoch, call: tl.constexpr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Debug mode only: publish this rank's signature of call ``epoch`` on the tile whose lock record
    is ``record`` (this rank's memory). Call it before the call's first signal.

    Granularity: per program. Memory semantics: the signature's words are plain stores, then a CTA
    barrier and a release exchange of ``SIGNED`` at system scope: a peer that acquires ``SIGNED``
    (or any flag this program releases later) sees the words of this call."""
    sig = record + SIGNED
    tl.store(sig + 1, tl.full([], _call_index(call), tl.int32))
    tl.store(sig + 2, tl.full([], 0, tl.int32) + M)
    tl.store(sig + 3, tl.full([], 0, tl.int32) + N)
    tl.store(sig + 4, tl.full([], BLOCK_M, tl.int32))
    tl.store(sig + 5, tl.full([], BLOCK_N, tl.int32))
    tl.store(sig + 6, tl.num_programs(0))
    tl.store(sig + 7, tl.num_programs(1))
    tl.store(sig + 8, tl.num_programs(2))
    tl.debug_barrier()
    tl.atomic_xchg(sig, epoch, sem="release", scope="sys")


@triton.jit
def _load_signature(sig):
    # The signature's fields after SIGNED: (collective, M, N, BLOCK_M, BLOCK_N, grid 0, 1, 2).
    return (tl.load(sig + 1, volatile=True), tl.load(sig + 2, volatile=True), tl.load(sig + 3, volatile=True),
            tl.load(sig + 4, volatile=True), tl.load(sig + 5, volatile=True), tl.load(sig + 6, volatile=True),
            tl.load(sig + 7, volatile=True), tl.load(sig + 8, volatile=True))


@triton.jit
def _differences(a, b):
    # Bit i set: item i of _DIFFERS differs between signatures a and b.
    collective = tl.where(a[0] != b[0], 1, 0)
    shape = tl.where((a[1] != b[1]) | (a[2] != b[2]), 2, 0)
    tiles = tl.where((a[3] != b[3]) | (a[4] != b[4]), 4, 0)
    grid = tl.where((a[5] != b[5]) | (a[6] != b[6]) | (a[7] != b[7]), 8, 0)
    return collective | shape | tiles | grid


@triton.jit
def _acquire(word):
    # The int32 at ``word`` (a peer's), read with acquire at system scope (one thread's atomic; the
    # result reaches every thread of the program).
    return tl.atomic_add(word, 0, sem="acquire", scope="sys")


@triton.constexpr_function
def _describe(sig):
    values = [host_scalar(v) for v in sig]
    name = WAIT_CALLS[values[0]] if 0 <= values[0] < len(WAIT_CALLS) else f"collective #{values[0]}"
    return (f"{name.removeprefix('iris.collectives.')} of {values[1]} x {values[2]} in {values[3]} x {values[4]} "
            f"tiles, grid ({values[5]}, {values[6]}, {values[7]})")


@triton.constexpr_function
def _raise_mismatch(differs, call, rank, peer, index, epoch, mine, theirs):
    # Interpreter only: the arguments are concrete there.
    bits = host_scalar(differs)
    if not bits:
        return 0
    what = ", ".join(name for i, name in enumerate(_DIFFERS) if bits >> i & 1)
    raise IrisCallMismatchError(
        f"iris debug: {call}: rank {host_scalar(rank)} and rank {host_scalar(peer)} made different calls on the "
        f"same lock array (tile {host_scalar(index)}, call {host_scalar(epoch)} on it): rank {host_scalar(rank)} "
        f"called {_describe(mine)}, rank {host_scalar(peer)} called {_describe(theirs)}; they differ in {what}. "
        f"Every rank must make the same collective call with the same shapes, tiles and grid on a lock array "
        f"(one lock array per collective and tiling)")


@triton.constexpr_function
def _mismatch_message(call):
    return (f"iris debug: {call}: two ranks made different calls on the same lock array; the line printed above "
            f"names both ranks and both calls (collective ids index iris.device._watchdog.WAIT_CALLS). Every rank "
            f"must make the same collective call with the same shapes, tiles and grid on a lock array")


@triton.jit
def _report(differs, call: tl.constexpr, rank, peer, index, epoch, mine, theirs):
    # Fail the kernel when ``differs`` is not 0: an IrisCallMismatchError under the interpreter, a
    # printed line and a device assert on the GPU (see iris.device._debug).
    if INTERPRETER:
        _raise_mismatch(differs, call, rank, peer, index, epoch, mine, theirs)
    else:
        if differs != 0:
            tl.device_print("iris debug: calls differ on a lock array: rank, peer, tile, call; rank's and peer's "
                            "collective, M, N, BLOCK_M, BLOCK_N, grid = ", rank, peer, index, epoch,
                            mine[0], mine[1], mine[2], mine[3], mine[4], mine[5], mine[6], mine[7],
                            theirs[0], theirs[1], theirs[2], theirs[3], theirs[4], theirs[5], theirs[6], theirs[7])
        tl.device_assert(differs == 0, _mismatch_message(call))


@triton.jit
def check_signatures(record, rank, peer, heap_bases, call: tl.constexpr, index):
    """Debug mode only: fail if a peer made a different call than this rank on the tile whose lock
    record is ``record`` (this rank's memory, its signature published by :func:`publish_signature`).

    Compares with ``peer``, or with every other rank when ``peer`` is -1; a peer that has not
    arrived at this call yet (or has moved on) is skipped. The failure names the call, both ranks,
    the tile, the call number and both signatures. Granularity: per program. Memory semantics: each
    peer's ``SIGNED`` word is acquired at system scope before its signature is read."""
    sig = record + SIGNED
    epoch = tl.atomic_add(sig, 0, sem="relaxed", scope="gpu")
    mine = _load_signature(sig)
    num_ranks = tl.load(heap_bases - _NUM_RANKS_BEFORE_BASES)
    local = tl.load(heap_bases + rank)
    for p in range(num_ranks):
        if (p != rank) & ((peer < 0) | (p == peer)):
            theirs_sig = sig + (tl.load(heap_bases + p) - local) // 4
            if _acquire(theirs_sig) == epoch:
                theirs = _load_signature(theirs_sig)
                _report(_differences(mine, theirs), call, rank, p, index, epoch, mine, theirs)
