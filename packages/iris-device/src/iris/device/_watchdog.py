"""The watchdog's device side: production waits that end, and say why.

A wait for a peer's flag spins until the peer arrives. If the peer never comes (it skipped the
call, launched another grid, died), the spin would never end and the job would hang in silence.
So every wait of iris.collectives is bounded, in production too, by the timeout that the runtime
writes into the context tensor (``IRIS_TIMEOUT_S``, default 60 s; see ``iris.runtime.iris``).

How, at a small cost (measured on an H200, 2026-12-02 and -03: docs/performance.md, "What the
watchdog costs"):

- a wait that finds its flag already set never reaches this code, and its code is what it is with
  the watchdog compiled out: every thread polls on its own, and the check is a small branch of
  that thread's poll loop, with no CTA barrier and no call (see :func:`watchdog_thread_check`);
- a wait that spins counts its polls and looks at the clock and the *drain* word every
  ``CHECK_POLLS`` polls only;
- when the time is up, or the drain word is raised, the thread stops waiting; the first thread
  of the process that stops writes one short report (rank, call, flag, tile, peer, values, the
  address of its call counter) into host-visible memory whose address is in the context tensor
  (:func:`watchdog_thread_stop`). The device side ends there, on purpose small: code inlined at
  every wait costs time even where it never runs (measured on an H200, docs/performance.md);
- the runtime's watchdog thread watches the report from the host (plain reads of pinned memory,
  no CUDA call, so it works while kernels spin or a graph is being captured). After a timeout it
  raises every rank's drain word, so that every rank's waits stop and report what they waited
  for, compares the ranks' call counters for the tile (who never came), prints the report and
  ends the job with ``MPI_Abort``.
  The runtime raises the drain words too when a rank fails, so that no kernel is left spinning
  when the job is aborted.

A wait that gave up does not return until the host has acknowledged the report (the ``ack``
word of the record, which the host thread writes once it has printed the reports, silenced this
rank's stdout and taken the interpreter lock for good, right before it ends the job): a kernel
that gave up never ends while its process can still use what it computed, so no rank prints a
result that looks valid, and no kernel is left spinning when the job is aborted (which leaves MPS
refusing new clients for a while). Under the interpreter (the ``cpu`` backend) the wait sleeps
until then instead of spinning.
``IRIS_TIMEOUT_S=0`` (read at import, like ``IRIS_DEBUG``) compiles all of this out.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from . import _layout
from ._interpreter import INTERPRETER
from ._layout import (
    CALL_CHECK_MAX_RANKS,
    CALL_SLOTS_AT,
    CALL_WORDS_OFFSET_C,
    CUR_RANK_AT_C,
    HEAP_SIZE_C,
    WATCHDOG_NS_C,
    WATCHDOG_RECORD_C,
)
from ._tracing import device_clock_ns
from ._vote import cta_any

#: The watchdog's time limit when ``IRIS_TIMEOUT_S`` is unset, in seconds: long enough for a first
#: call's compilation and heap allocation on a loaded machine, short enough that a job that hangs
#: ends while someone still watches it (see docs/concepts.md, "Deadlines").
DEFAULT_TIMEOUT_S = 60.0


def timeout_from_env(default: float = DEFAULT_TIMEOUT_S) -> float:
    """``IRIS_TIMEOUT_S`` in seconds (``default`` when unset); 0 switches the watchdog off."""
    text = os.environ.get("IRIS_TIMEOUT_S", "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0:
        from ._errors import IrisUsageError

        raise IrisUsageError(f"IRIS_TIMEOUT_S={text!r}: set a number of seconds >= 0 (0 switches the watchdog off)")
    return value


#: Compile-time switch: bounded waits are compiled in unless ``IRIS_TIMEOUT_S=0`` at import.
WATCHDOG: tl.constexpr = tl.constexpr(timeout_from_env() > 0)

#: Polls between two looks at the clock. A poll is an acquire load at system scope (about a
#: microsecond on the GPU), so the clock is read about once a millisecond; under the interpreter
#: a poll costs far more.
CHECK_POLLS: tl.constexpr = tl.constexpr(4 if INTERPRETER else 1024)

#: The report: int64 words in host-visible memory (``WATCHDOG_RECORD`` in the context tensor), in
#: this order. ``state`` is written last: 0 (nothing) or one of the STATE_ values; ``call``
#: and ``flag`` index WAIT_CALLS and WAIT_FLAGS; ``peer`` is -1 when the wait was for several;
#: ``calls`` is the address (in the reporting process) of that rank's int32 call counter for the
#: tile, which every rank keeps at the same heap offset (0 when the wait has none): the host
#: compares the ranks' counters to name the ranks that never made the call. A call mismatch
#: (``STATE_CALL_MISMATCH``, see ``iris.device._calls``) has ``peer`` the rank whose call differs,
#: ``index`` the call's number, ``seen`` the peer's fingerprint and ``target`` this rank's.
#: ``ack`` is the host's: 1 once it lets the stopped waits go (see the module docstring).
#: ``latest`` (a stopped wait's report only): this rank's latest collective call as its kernels
#: published it for the call agreement (``(n << 32) | fingerprint``, ``iris.device._calls``; 0
#: where there is none), read by the kernel, so that the host names the call without reading the
#: heap: a host copy of a heap word can sit in the driver while the main thread waits for the very
#: kernel that spins here.
RECORD_FIELDS = ("state", "call", "flag", "rank", "peer", "index", "seen", "target", "waited_ns", "calls", "ack",
                 "latest")
RECORD_WORDS = len(RECORD_FIELDS)
STATE_TIMED_OUT = 1  #: this rank's wait ran out of time
STATE_DRAINED = 2    #: this rank stopped waiting because another wait (maybe a peer's) ran out of time
STATE_FAILED = 3     #: this rank stopped waiting because a rank failed (see the runtime's message)
STATE_CALLS_DIFFER = 4  #: this rank stopped waiting because a rank found that the ranks' calls differ
STATE_CALL_MISMATCH = 5  #: this rank found that a peer made another collective call than it (iris.device._calls)
#: A point-to-point message arrived with another size or dtype than its receive expects (no wait
#: ran out: the receiver saw it at once; ``seen`` and ``target`` hold both messages' headers, see
#: :func:`message_header`). The runtime ends the job as after a timeout.
STATE_SIZE_MISMATCH = 6
#: A call received more rows than its output holds (or was told to send more rows than its input
#: has): no wait ran out, the kernel saw it at once and wrote only what fits; ``seen`` holds the
#: rows, ``target`` the room, ``flag`` names what overflowed (``out rows``, ``expert rows``: then
#: ``index`` is the local expert; ``inp rows``). The runtime ends the job as after a timeout.
STATE_CAPACITY = 7
#: Values of the drain word (the state a draining wait reports is ``1 + value``).
DRAIN_TIMED_OUT = 1  #: a wait ran out of time somewhere (or a host-side wait did)
DRAIN_FAILED = 2     #: a rank failed: it raised, or its process is gone
DRAIN_CALLS_DIFFER = 3  #: a rank found that the ranks made different collective calls
_STATE: tl.constexpr = tl.constexpr(0)
_CALL: tl.constexpr = tl.constexpr(1)
_FLAG: tl.constexpr = tl.constexpr(2)
_RANK: tl.constexpr = tl.constexpr(3)
_PEER: tl.constexpr = tl.constexpr(4)
_INDEX: tl.constexpr = tl.constexpr(5)
_SEEN: tl.constexpr = tl.constexpr(6)
_TARGET: tl.constexpr = tl.constexpr(7)
_WAITED: tl.constexpr = tl.constexpr(8)
_CALLS: tl.constexpr = tl.constexpr(9)
_ACK: tl.constexpr = tl.constexpr(10)
ACK_INDEX = _ACK.value
_LATEST: tl.constexpr = tl.constexpr(11)
_CALL_SLOTS_C: tl.constexpr = tl.constexpr(CALL_SLOTS_AT)
_CALL_CHECK_MAX_C: tl.constexpr = tl.constexpr(CALL_CHECK_MAX_RANKS)
_TIMED_OUT: tl.constexpr = tl.constexpr(STATE_TIMED_OUT)
_CALL_MISMATCH: tl.constexpr = tl.constexpr(STATE_CALL_MISMATCH)
_SIZE_MISMATCH: tl.constexpr = tl.constexpr(STATE_SIZE_MISMATCH)
_CAPACITY: tl.constexpr = tl.constexpr(STATE_CAPACITY)
# Where the header words sit relative to heap_bases (context + HEAP_BASES).
_NUM_RANKS_AT: tl.constexpr = tl.constexpr(_layout.NUM_RANKS - _layout.HEAP_BASES)

#: Byte offset in the signal pad of the drain word (int32; raised once, never lowered; by the host)
#: and of the claim word after it (the first thread of the process that reports takes it).
DRAIN_OFFSET = _layout.SIGNAL_PAD_BYTES - _layout.PAD_RESERVED_BYTES + _layout.WATCHDOG_WORDS_AT
DRAIN_OFFSET_C: tl.constexpr = tl.constexpr(DRAIN_OFFSET)

#: Names a report can carry; a name that is not here is reported as the first one.
WAIT_CALLS = ("an iris wait", "iris.collectives.wait_at_least", "iris.collectives.all_reduce_one_shot",
              "iris.collectives.all_reduce_two_shot", "iris.collectives.all_reduce_spinlock",
              "iris.collectives.all_reduce_ring", "iris.collectives.reduce_scatter",
              "iris.collectives.device_barrier", "iris.collectives.all_gather", "iris.collectives.gather",
              "iris.collectives.all_to_all", "iris.collectives.all_reduce_atomic",
              "iris.collectives.ops.matmul_reduce_scatter", "iris.collectives.ops.all_gather_matmul",
              "iris.collectives.ccl.all_gather", "iris.collectives.ccl.all_to_all", "iris.collectives.ccl.broadcast",
              "iris.collectives.ccl.send", "iris.collectives.ccl.recv", "iris.collectives.ccl.reduce",
              "iris.collectives.ccl.gather", "iris.collectives.ccl.scatter", "iris.collectives.wait_signal",
              "iris.collectives.all_reduce_rmsnorm", "iris.collectives.ccl.all_to_all_v",
              "iris.collectives.moe.dispatch", "iris.collectives.moe.combine")
WAIT_FLAGS = ("flag", "arrivals", "ready", "done", "entered", "mutex", "credit", "partial", "result",
              "done reading", "signal", "message size", "out rows", "expert rows", "inp rows", "request")
#: Calls whose report's ``index`` is a message tag (point to point), not a tile or slot.
TAGGED_CALLS = ("iris.collectives.ccl.send", "iris.collectives.ccl.recv")

#: Element types of point-to-point messages, as their headers number them (:func:`message_header`).
MESSAGE_DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64")
#: Bits of a message header below the element count: the dtype's index in MESSAGE_DTYPES.
MESSAGE_DTYPE_BITS = 4


def message_header(numel: int, dtype: str) -> int:
    """The int64 header a point-to-point message carries: ``numel`` elements of ``dtype`` (a name of
    MESSAGE_DTYPES). The receiver compares it with its own before it takes the data."""
    return numel << MESSAGE_DTYPE_BITS | MESSAGE_DTYPES.index(dtype)


@triton.constexpr_function  # a constexpr function: kernels reach it through mismatch_text (Triton refuses plain ones)
def describe_header(header: int) -> str:
    """``"12 x float32"``: what a :func:`message_header` says."""
    code = header & ((1 << MESSAGE_DTYPE_BITS) - 1)
    dtype = MESSAGE_DTYPES[code] if code < len(MESSAGE_DTYPES) else f"dtype #{code}"
    return f"{header >> MESSAGE_DTYPE_BITS} x {dtype}"


@triton.constexpr_function  # raised from a kernel under the interpreter, printed by the runtime on the GPU
def mismatch_text(call: str, rank: int, peer: int, tag: int, sent: int, expected: int) -> str:
    """The message of a point-to-point size mismatch (``sent`` and ``expected``: the two headers),
    the same on every backend."""
    return (f"{call}: rank {rank} received a message from rank {peer} with tag {tag} of "
            f"{describe_header(sent)}, but this call expects {describe_header(expected)}; the send and its "
            f"recv must pass tensors of the same number of elements and dtype (or the calls of this peer "
            f"and tag are not paired in the same order on both ranks)")


def capacity_text(call: str, rank: int, what: str, index: int, rows: int, room: int) -> str:
    """The message of rows that do not fit (``what``: ``"out rows"``, ``"expert rows"`` or ``"inp
    rows"``, see :data:`STATE_CAPACITY`), the same on every backend: the runtime prints it on the GPU,
    the host collectives raise it on the cpu backend (``iris.collectives.IrisCapacityError``)."""
    if what == "expert rows":
        return (f"{call}: rank {rank} receives {rows} rows for its local expert {index} but expert_capacity is "
                f"{room}; pass a larger expert_capacity (rows per local expert, the same on every rank; at most "
                f"world_size x max_tokens rows can arrive), or route fewer tokens to one expert. The rows that did "
                f"not fit were not written")
    if what == "inp rows":
        return (f"{call}: rank {rank}'s in_splits add up to {rows} rows (or hold a negative count) but inp has "
                f"{room} rows; pass in_splits whose entries are >= 0 and add up to at most inp.shape[0]")
    return (f"{call}: rank {rank} receives {rows} rows but its output holds {room}; pass a larger output "
            f"(capacity: rows, the most any rank can receive) or send fewer rows. The rows that did not fit were "
            f"not written")


@triton.constexpr_function
def _call_index(call):
    # A loop, not tuple.index: Triton refuses bound methods of globals in what a kernel references.
    for i, name in enumerate(WAIT_CALLS):
        if name == call:
            return i
    return 0


@triton.constexpr_function
def _flag_index(what):
    for i, name in enumerate(WAIT_FLAGS):
        if name == what:
            return i
    return 0


@triton.jit
def _int64(value):
    # Scalars reach the report as int64 whether they are constants or int32/int64 tensors.
    return tl.full([], 0, tl.int64) + value


# Memory operations and the clock of the thread that runs them, and of no other. The check below
# runs in threads that poll on their own (some may have left the wait already): Triton's scalar
# atomics and stores would run in thread 0 only, with CTA barriers around them, which threads
# outside the check never reach. Inline PTX on the GPU, each block tagged with WATCHDOG_PTX_TAG (a
# PTX comment) so that compile checks can tell the check's instructions from the protocol's; the
# interpreter's program is one thread, so Triton's own operations there.

#: The comment that opens every inline-PTX block of the watchdog's check.
WATCHDOG_PTX_TAG = "// iris watchdog check"


@triton.jit
def _now():
    # %globaltimer in ns (see iris.device.device_clock_ns)
    if INTERPRETER:
        return device_clock_ns()
    else:
        return tl.inline_asm_elementwise("// iris watchdog check\n\tmov.u64 $0, %globaltimer;", "=l", [],
                                         dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _peek(word):
    # The int32 at ``word`` (relaxed, system scope: a word that other processes write).
    if INTERPRETER:
        return tl.load(word, volatile=True)
    else:
        return tl.inline_asm_elementwise("// iris watchdog check\n\tld.relaxed.sys.global.b32 $0, [$1];", "=r,l",
                                         [word], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _claim(word):
    # 0 -> 1 on the int32 at ``word``; returns the old value (relaxed, GPU scope: one process's claim).
    if INTERPRETER:
        return tl.atomic_cas(word, 0, 1, sem="relaxed", scope="gpu")
    else:
        return tl.inline_asm_elementwise("// iris watchdog check\n\tatom.relaxed.gpu.global.cas.b32 $0, [$1], 0, 1;",
                                         "=r,l", [word], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _put(word, value):
    # Store the int64 ``value`` at ``word`` (host-visible memory of the report).
    if INTERPRETER:
        tl.store(word, _int64(value))
    else:
        tl.inline_asm_elementwise("// iris watchdog check\n\tst.global.b64 [$1], $2;\n\tmov.u32 $0, 0;", "=r,l,l",
                                  [word, _int64(value)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _fence_sys():
    # The report's fields must reach the host before its state word: one system-scope fence.
    if not INTERPRETER:
        tl.inline_asm_elementwise("// iris watchdog check\n\tfence.acq_rel.sys;\n\tmov.u32 $0, 0;", "=r", [],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _report(trailer, drain, state, call_id, flag_id, rank, peer, index, seen, target, waited, calls, heap_bases=None):
    # The first thread of this process to stop writes the report; the rest only stop. With
    # ``heap_bases`` (a stopped wait), also this rank's latest published call.
    if _claim(drain + 1) == 0:
        record = tl.cast(tl.load(trailer + WATCHDOG_RECORD_C), tl.pointer_type(tl.int64))
        if heap_bases is not None:
            _put(record + _LATEST, _latest_call(heap_bases, trailer, rank))
        _put(record + _CALL, call_id)
        _put(record + _FLAG, flag_id)
        _put(record + _RANK, rank)
        _put(record + _PEER, peer)
        _put(record + _INDEX, index)
        _put(record + _SEEN, seen)
        _put(record + _TARGET, target)
        _put(record + _WAITED, waited)
        _put(record + _CALLS, calls)
        _fence_sys()
        _put(record + _STATE, state)


@triton.jit
def _latest_call(heap_bases, trailer, me):
    # The larger of this rank's two slots in its own call words (the newer call: the count is the
    # high half), 0 where the world has no call words (more ranks than CALL_CHECK_MAX_RANKS).
    num_ranks = tl.load(heap_bases + _NUM_RANKS_AT)
    slot = tl.load(heap_bases + me) + tl.load(trailer + CALL_WORDS_OFFSET_C) + _CALL_SLOTS_C + 8 * me
    first = tl.cast(slot, tl.pointer_type(tl.int64))
    # plain loads (a wait's only volatile or acquire loads are its polls, which the compile tests
    # count): this program never read these words before, so they come from L2, where the
    # publishing program's stores are
    words = num_ranks <= _CALL_CHECK_MAX_C  # else the slots would lie past the pad's reserved words
    return tl.maximum(tl.load(first, mask=words, other=0), tl.load(first + num_ranks, mask=words, other=0))


@triton.jit
def _peek64(word):
    # The int64 at ``word`` (relaxed, system scope: the host writes it).
    return tl.inline_asm_elementwise("// iris watchdog check\n\tld.relaxed.sys.global.b64 $0, [$1];", "=l,l",
                                     [word], dtype=tl.int64, is_pure=False, pack=1)


@triton.constexpr_function
def _sleep_until_ack(record):
    # Interpreter only: the wait runs in the main thread; sleep (the watchdog thread runs meanwhile)
    # until the host acknowledges, which it does right before it ends the job while holding the
    # interpreter lock, so the raise below is for a host that could not end it.
    import ctypes
    import time

    from ._debug import host_scalar
    from ._errors import IrisBackendError

    ack = ctypes.c_int64.from_address(host_scalar(record) + 8 * ACK_INDEX)
    while ack.value == 0:
        time.sleep(0.01)
    raise IrisBackendError("iris watchdog: a wait of this rank stopped (its report is above) and the job did not end; "
                           "nothing this kernel computed is valid")


@triton.jit
def _await_ack(trailer):
    # After a stop: hold the calling thread, so that its kernel does not end, until the host's
    # watchdog thread acknowledges (see the module docstring). Per thread, no barrier.
    if INTERPRETER:
        _sleep_until_ack(tl.load(trailer + WATCHDOG_RECORD_C))
    else:
        ack = tl.cast(tl.load(trailer + WATCHDOG_RECORD_C), tl.pointer_type(tl.int64)) + _ACK
        seen = _peek64(ack)
        while seen == 0:
            seen = _peek64(ack)


@triton.jit
def _drain_word(heap_bases, me, trailer):
    # This rank's drain word (int32, in its signal pad after the heap).
    address = tl.load(heap_bases + me) + tl.load(trailer + HEAP_SIZE_C) + DRAIN_OFFSET_C
    return tl.cast(address, tl.pointer_type(tl.int32))


@triton.jit
def watchdog_thread_check(heap_bases, start):
    """Look at the clock and the drain word during a wait, in the calling thread alone; returns
    ``(start, stop)``.

    ``start`` is the wait's start time in this thread (int64; 0 before its first look, which sets
    it). ``stop`` (int32) is 1 when the wait must end: it has lasted longer than the context's
    timeout (``IRIS_TIMEOUT_S``), or this rank's drain word is raised (a wait of some rank ran out
    of time, or a rank failed). A thread that gets ``stop`` leaves its wait and calls
    :func:`watchdog_thread_stop`.

    Granularity: per thread. No CTA barrier, no Triton atomic, no store: threads that poll on their
    own may call it at different times, or some not at all (a wait loop calls it every
    ``CHECK_POLLS`` polls; every other thread sees its flag, the clock or the drain word soon
    after). Memory semantics: one relaxed system-scope load of the drain word. Scope: the waits of
    one job.
    """
    me = tl.load(heap_bases + CUR_RANK_AT_C)
    trailer = heap_bases + tl.load(heap_bases + _NUM_RANKS_AT)
    limit = tl.load(trailer + WATCHDOG_NS_C)
    now = _now()
    start = tl.where(start == 0, now, start)
    reason = _peek(_drain_word(heap_bases, me, trailer))
    stop = (limit > 0) & ((reason != 0) | (now - start > limit))
    return start, stop.to(tl.int32)


@triton.jit
def watchdog_thread_stop(heap_bases, start, call_id, flag_id, peer, index, seen, target, calls):
    """Report a wait that :func:`watchdog_thread_check` stopped.

    ``start``: the wait's start time; ``call_id`` and ``flag_id`` index WAIT_CALLS and WAIT_FLAGS,
    ``peer`` (-1: several), ``index`` (tile or slot), ``seen`` and ``target`` go into the report
    (int64 scalars); so does ``calls``, the address (int64) of this rank's call counter for the tile
    (which every rank keeps at the same heap offset), or 0. The first thread of the process that
    stops writes the report (a claim word beside the drain word); every thread that stops then
    waits until the host acknowledges (the record's ``ack`` word), so that the kernel does not end
    before the job does. The rest is the host's, whose
    watchdog thread reads the report: it compares the call counters (who never made the call), and
    after a timeout raises every rank's drain word, so that every rank's waits stop and report too;
    then it prints the report and ends the job. The device side is kept this small on purpose: a
    larger report inlined at each wait made a two-shot all-reduce of 256 MiB 13 % slower on an H200
    (docs/performance.md).

    Granularity: per thread, no CTA barrier (see :func:`watchdog_thread_check`). Memory semantics:
    the report's words are fenced at system scope before its state word. Scope: this process.
    """
    me = tl.load(heap_bases + CUR_RANK_AT_C)
    trailer = heap_bases + tl.load(heap_bases + _NUM_RANKS_AT)
    drain = _drain_word(heap_bases, me, trailer)
    reason = _peek(drain)
    state = tl.where(reason != 0, 1 + reason, _TIMED_OUT)
    _report(trailer, drain, state, call_id, flag_id, me, peer, index, seen, target, _now() - start, calls,
            heap_bases)
    _await_ack(trailer)


@triton.jit
def watchdog_check(heap_bases, start, call_id, flag_id, peer, index, seen, target, calls):
    """:func:`watchdog_thread_check`, :func:`watchdog_thread_stop` in the threads that stop, then a
    vote: ``stop`` is 1 in every thread of the program when it is 1 in any. Returns ``(start,
    stop)``; the arguments are :func:`watchdog_thread_stop`'s. Granularity: per program: every
    thread of the program must make the call at the same point (the vote is a CTA barrier), for
    waits whose loop condition is the same in every thread (a scalar atomic's result) or that vote
    on it. Memory semantics: as those two, and the vote's CTA barrier."""
    start, stop = watchdog_thread_check(heap_bases, start)
    if stop != 0:
        watchdog_thread_stop(heap_bases, start, call_id, flag_id, peer, index, seen, target, calls)
    return start, cta_any(stop)


@triton.jit
def watchdog_arguments(call: tl.constexpr, what: tl.constexpr, peer, index, seen, target, calls):
    """The arguments of :func:`watchdog_thread_stop` from ``call`` and ``what`` (names in WAIT_CALLS and
    WAIT_FLAGS), ``peer``, ``index``, ``seen``, ``target`` and ``calls`` (this rank's int32 call
    counter for the tile, or None), each an int64 scalar: one shape of the check for all waits."""
    if calls is None:
        address = tl.full([], 0, tl.int64)
    else:
        address = calls.to(tl.int64)
    return (_int64(_call_index(call)), _int64(_flag_index(what)), _int64(peer), _int64(index), _int64(seen),
            _int64(target), address)


@triton.jit
def watchdog_thread_tick(heap_bases, polls, start):
    """Count one poll of a wait in the calling thread; every ``CHECK_POLLS`` polls,
    :func:`watchdog_thread_check`. Returns ``(polls, start, stop)``. Start a wait with ``polls = 0``
    and ``start = 0`` (int64), loop while the flag is short of its target and ``stop == 0``, and
    after the loop call :func:`watchdog_thread_stop` in the threads whose ``stop`` is 1 (then the
    CTA barrier that any acquire-polling wait needs). Granularity: per thread, no barrier: for waits
    in which every thread polls on its own (``wait_at_least``)."""
    polls += 1
    stop = 0
    if polls % CHECK_POLLS == 0:
        start, stop = watchdog_thread_check(heap_bases, start)
    return polls, start, stop


@triton.jit
def watchdog_look(heap_bases, start, call: tl.constexpr, what: tl.constexpr, peer, index, seen, target, calls=None):
    """One look at the clock and the drain word for a wait (see :func:`watchdog_check`); returns
    ``(start, stop)``. Start a wait with ``start = 0`` (int64). ``calls``: this rank's int32 call
    counter for the tile, or None. Per program: every thread of the program must make the same
    call (its vote is a CTA barrier), so a wait whose threads poll on their own must first agree
    that it goes on, e.g. with :func:`iris.device._vote.cta_all`, or use
    :func:`watchdog_thread_tick` instead."""
    args = watchdog_arguments(call, what, peer, index, seen, target, calls)
    return watchdog_check(heap_bases, start, args[0], args[1], args[2], args[3], args[4], args[5], args[6])


@triton.jit
def watchdog_tick(heap_bases, polls, start, call: tl.constexpr, what: tl.constexpr, peer, index, seen, target,
                  calls=None):
    """Count one poll of a wait; every ``CHECK_POLLS`` polls, :func:`watchdog_look`. Returns
    ``(polls, start, stop)``. Start a wait with ``polls = 0``, ``start = 0`` (int64) and loop while
    the flag is short of its target and ``stop == 0``. For waits whose loop condition is the same
    in every thread (a scalar atomic's result, or the interpreter's single thread); see
    :func:`watchdog_look`."""
    polls += 1
    stop = 0
    if polls % CHECK_POLLS == 0:
        start, stop = watchdog_look(heap_bases, start, call, what, peer, index, seen, target, calls)
    return polls, start, stop


@triton.jit
def watchdog_report_call_mismatch(heap_bases, peer, index, theirs, mine):
    """Report that ``peer`` made another collective call than this rank (call ``index`` of the
    context; ``theirs`` and ``mine`` the calls' fingerprints, see ``iris.device._calls``), and hold
    the calling threads until the host acknowledges: the host's watchdog thread names both calls
    and ends the job (state ``STATE_CALL_MISMATCH``). Nothing happens while the watchdog is off (its
    limit 0: no thread would read the report). Granularity: per thread, no barrier (every thread
    of the program that calls it, which is every thread that reaches it). Memory semantics: as
    :func:`watchdog_thread_stop`. Scope: this process."""
    me = tl.load(heap_bases + CUR_RANK_AT_C)
    trailer = heap_bases + tl.load(heap_bases + _NUM_RANKS_AT)
    if tl.load(trailer + WATCHDOG_NS_C) > 0:
        drain = _drain_word(heap_bases, me, trailer)
        zero = tl.full([], 0, tl.int64)
        _report(trailer, drain, tl.full([], _CALL_MISMATCH, tl.int64), zero, zero, me, peer, index, theirs, mine,
                zero, zero)
        _await_ack(trailer)


@triton.jit
def watchdog_report_size_mismatch(heap_bases, call: tl.constexpr, what: tl.constexpr, peer, index, seen, target):
    """Report a point-to-point size mismatch now (state STATE_SIZE_MISMATCH), with no wait: the runtime's
    watchdog thread prints it (:func:`mismatch_text`, ``seen`` and ``target`` being the two message
    headers, ``index`` the tag) and ends the job, as after a timeout. Only where the watchdog is
    compiled in (``WATCHDOG``); a caller prints something itself otherwise. Like a stopped wait,
    the calling threads are then held until the host acknowledges (while the context's watchdog
    runs), so that the receive, whose output holds no message, never returns.

    Granularity: per thread, no CTA barrier: the first thread of the process that calls it writes
    the report (the claim word of :func:`watchdog_thread_stop`), the others only wait for the
    acknowledgement. Memory semantics: the report's words are fenced at system scope before its
    state word."""
    me = tl.load(heap_bases + CUR_RANK_AT_C)
    trailer = heap_bases + tl.load(heap_bases + _NUM_RANKS_AT)
    args = watchdog_arguments(call, what, peer, index, seen, target, None)
    _report(trailer, _drain_word(heap_bases, me, trailer), _SIZE_MISMATCH, args[0], args[1], me, args[2], args[3],
            args[4], args[5], 0, args[6])
    if tl.load(trailer + WATCHDOG_NS_C) > 0:
        _await_ack(trailer)


@triton.jit
def watchdog_report_capacity(heap_bases, call: tl.constexpr, what: tl.constexpr, index, rows, room):
    """Report rows that do not fit now (state STATE_CAPACITY), with no wait: the runtime's watchdog
    thread prints it (:func:`capacity_text`; ``what`` a name of WAIT_FLAGS: ``"out rows"``,
    ``"expert rows"`` (``index``: the local expert) or ``"inp rows"``) and ends the job, as after a
    timeout. Only where the watchdog is compiled in (``WATCHDOG``); a caller prints something
    itself otherwise. Like a stopped wait, the calling threads are then held until the host
    acknowledges (while the context's watchdog runs), so that the call, whose output lacks the rows
    that did not fit, never returns. Granularity and memory semantics: as
    :func:`watchdog_report_size_mismatch`."""
    me = tl.load(heap_bases + CUR_RANK_AT_C)
    trailer = heap_bases + tl.load(heap_bases + _NUM_RANKS_AT)
    args = watchdog_arguments(call, what, -1, index, rows, room, None)
    _report(trailer, _drain_word(heap_bases, me, trailer), _CAPACITY, args[0], args[1], me, args[2], args[3],
            args[4], args[5], 0, args[6])
    if tl.load(trailer + WATCHDOG_NS_C) > 0:
        _await_ack(trailer)


@triton.jit
def watchdog_reported(heap_bases):
    """1 when a wait of this process has already stopped and written its report (the claim word
    beside the drain word is taken), else 0: the job is ending, and what a kernel finds after a
    wait that gave up (a flag short of its target, stale data) must not be reported as another
    fault. Granularity: per thread. Memory semantics: one relaxed system-scope load."""
    me = tl.load(heap_bases + CUR_RANK_AT_C)
    trailer = heap_bases + tl.load(heap_bases + _NUM_RANKS_AT)
    return _peek(_drain_word(heap_bases, me, trailer) + 1)
