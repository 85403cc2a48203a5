"""Device-side event tracing: ``TraceEvent`` ids and the ``DeviceTracing`` recorder.

Enabled per kernel at compile time (``DeviceContext.initialize(..., tracing=True)``); with
``tracing=False`` every recording call is removed from the kernel. The host side
(``Iris.tracing``) owns the buffers and turns them into a timeline.
"""

# No "from __future__ import annotations": aggregates check fields against real annotation types.
import triton
import triton.language as tl

from ._interpreter import INTERPRETER
from ._layout import (
    EVENT_ADDRESS_C,
    EVENT_BYTES_C,
    EVENT_END_C,
    EVENT_ID_C,
    EVENT_PID_C,
    EVENT_PID_M_C,
    EVENT_PID_N_C,
    EVENT_RANK_C,
    EVENT_SM_C,
    EVENT_START_C,
    EVENT_TARGET_C,
    TRACE_BUFFER_PTR_C,
    TRACE_COUNTER_PTR_C,
    TRACE_ENABLED_C,
    TRACE_EVENT_FIELDS_C,
    TRACE_MAX_EVENTS_C,
)
from ._translate import _pointee_bytes
from ._triton_compat import aggregate

#: Event names by id, for the host side (export, summary). Ids are stable across releases.
EVENT_NAMES = {
    1: "load", 2: "store", 3: "get", 4: "put", 5: "copy",
    6: "atomic_add", 7: "atomic_sub", 8: "atomic_cas", 9: "atomic_xchg", 10: "atomic_xor",
    11: "atomic_and", 12: "atomic_or", 13: "atomic_min", 14: "atomic_max",
    32: "data_movement", 33: "compute", 34: "wait", 35: "barrier", 36: "collective",
    64: "user_0", 65: "user_1", 66: "user_2", 67: "user_3",
}
EVENT_IDS = {name: event_id for event_id, name in EVENT_NAMES.items()}


@aggregate
class TraceEvent:
    """Ids of traceable events, as compile-time constants: ``TraceEvent().put``.

    One id per device operation (``load`` ... ``atomic_max``) and ranges for user-defined spans:
    ``data_movement``, ``compute``, ``wait``, ``barrier``, ``collective`` and ``user_0`` ..
    ``user_3``.
    """

    load: tl.constexpr
    store: tl.constexpr
    get: tl.constexpr
    put: tl.constexpr
    copy: tl.constexpr
    atomic_add: tl.constexpr
    atomic_sub: tl.constexpr
    atomic_cas: tl.constexpr
    atomic_xchg: tl.constexpr
    atomic_xor: tl.constexpr
    atomic_and: tl.constexpr
    atomic_or: tl.constexpr
    atomic_min: tl.constexpr
    atomic_max: tl.constexpr
    data_movement: tl.constexpr
    compute: tl.constexpr
    wait: tl.constexpr
    barrier: tl.constexpr
    collective: tl.constexpr
    user_0: tl.constexpr
    user_1: tl.constexpr
    user_2: tl.constexpr
    user_3: tl.constexpr

    # Written out (no loop): Triton reads the body of a constexpr function when it hashes kernels.
    # tests check these against EVENT_IDS.
    @triton.constexpr_function
    def __init__(self):
        self.load = tl.constexpr(1)
        self.store = tl.constexpr(2)
        self.get = tl.constexpr(3)
        self.put = tl.constexpr(4)
        self.copy = tl.constexpr(5)
        self.atomic_add = tl.constexpr(6)
        self.atomic_sub = tl.constexpr(7)
        self.atomic_cas = tl.constexpr(8)
        self.atomic_xchg = tl.constexpr(9)
        self.atomic_xor = tl.constexpr(10)
        self.atomic_and = tl.constexpr(11)
        self.atomic_or = tl.constexpr(12)
        self.atomic_min = tl.constexpr(13)
        self.atomic_max = tl.constexpr(14)
        self.data_movement = tl.constexpr(32)
        self.compute = tl.constexpr(33)
        self.wait = tl.constexpr(34)
        self.barrier = tl.constexpr(35)
        self.collective = tl.constexpr(36)
        self.user_0 = tl.constexpr(64)
        self.user_1 = tl.constexpr(65)
        self.user_2 = tl.constexpr(66)
        self.user_3 = tl.constexpr(67)


@triton.constexpr_function
def _host_clock_ns():
    # Interpreter substitute for %globaltimer: the host's monotonic clock (CLOCK_MONOTONIC on
    # Linux), one clock for every process of a machine, so the ranks of a CPU run line up without
    # correction. A constexpr function is re-run on every call under the interpreter. The import is
    # local because Triton refuses kernels whose dependencies name plain Python functions such as
    # time.monotonic_ns.
    import time

    return time.monotonic_ns()


@triton.jit
def device_clock_ns():
    """Current time in ns, as an int64 scalar (per program; every thread reads it).

    On the GPU: ``%globaltimer``, the GPU's global nanosecond timer (one clock per GPU; how often
    it ticks depends on the GPU and driver and can be as coarse as a microsecond, so short events
    may last 0). Under the interpreter: the host's monotonic clock, one clock per machine. No
    memory access.
    """
    if INTERPRETER:
        return tl.full([], _host_clock_ns(), tl.int64)
    else:
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                         is_pure=False, pack=1)


@triton.jit
def device_sm_id():
    """The SM running this program (``%smid``) on the GPU; the flattened program id under the
    interpreter, which has no SMs. An int64 scalar, per program. No memory access."""
    if INTERPRETER:
        return _flat_program_id().to(tl.int64)
    else:
        return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False,
                                         pack=1).to(tl.int64)


@triton.jit
def _flat_program_id():
    return (tl.program_id(2) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(0) + tl.program_id(0)


@triton.jit
def _access_summary(address, mask):
    # Lowest active address and bytes touched, for a scalar pointer or a block of pointers. With no
    # mask the byte count is a compile-time constant, so only the address needs a reduction.
    # Builtins only (tl.full, tl.reduce with Triton's own combine functions, not tl.zeros/tl.min/
    # tl.sum): those standard-library helpers break under the interpreter when triton was imported
    # before iris.runtime switched it on, and the interpreter runs these two combiners with numpy.
    elem_bytes: tl.constexpr = _pointee_bytes(address.dtype)
    addr = tl.cast(address, tl.int64) | tl.full([1], 0, tl.int64)
    if mask is None:
        lowest = tl.reduce(addr, None, tl.standard._elementwise_min)
        nbytes = tl.full([], addr.numel * elem_bytes, tl.int64)
    else:
        active = mask | tl.full(addr.shape, 0, tl.int1)
        lowest = tl.reduce(tl.where(active, addr, 0x7FFFFFFFFFFFFFFF), None, tl.standard._elementwise_min)
        count = tl.reduce(active.to(tl.int64), None, tl.standard._sum_combine)
        lowest = tl.where(count > 0, lowest, 0)
        nbytes = count * elem_bytes
    return lowest, nbytes


# One event record is written as a single masked vector store of this many int64 lanes (the next
# power of two above TRACE_EVENT_FIELDS; lanes past the record are masked off). One store
# instruction instead of eleven scalar stores that one thread would issue one after another.
_RECORD_LANES: tl.constexpr = tl.constexpr(triton.next_power_of_2(TRACE_EVENT_FIELDS_C.value))


@triton.jit
def _put(record, lane, field: tl.constexpr, value):
    return tl.where(lane == field, value, record)


@aggregate
class DeviceTracing:
    """Records events into this rank's trace buffer (``ctx.tracing``).

    Compiled in only for contexts initialised with ``tracing=True``; otherwise every method is
    empty, returns the constant ``-1`` and leaves no instruction in the kernel. With tracing
    compiled in, nothing is recorded (and the slot counter is not touched) until the host calls
    ``iris.tracing.enable()``. Slots come from an atomic counter; an event past ``max_events`` is
    counted (the counter keeps growing, the host reports the excess as dropped) but never written.

    What a duration means: the time between the two clock reads of one program. On the GPU that
    is mostly the time to issue the operation: a store is not waited for, and a load's data may
    arrive after the end is read (the GPU waits where the value is first used). A user range
    that ends after the values are used times the whole phase.
    """

    enabled: tl.constexpr
    rank: tl.constexpr
    max_events: tl.tensor
    counter: tl.tensor
    buffer: tl.tensor

    @triton.constexpr_function
    def __init__(self, enabled, rank, max_events, counter, buffer):
        self.enabled = tl.constexpr(enabled)
        self.rank = tl.constexpr(rank)
        self.max_events = max_events
        self.counter = counter
        self.buffer = buffer

    @staticmethod
    @triton.jit
    def initialize(heap_bases, rank: tl.constexpr, world_size: tl.constexpr, tracing: tl.constexpr):
        """Read the trace info that follows the heap bases in the context tensor.

        Per program: four scalar loads with ``tracing=True``, none otherwise. A host that has not
        enabled tracing leaves capacity 0, so recording calls neither claim slots nor write.
        """
        trailer = heap_bases + world_size
        if tracing:
            max_events = tl.load(trailer + TRACE_MAX_EVENTS_C) * tl.load(trailer + TRACE_ENABLED_C)
            counter = tl.cast(tl.load(trailer + TRACE_COUNTER_PTR_C), tl.pointer_type(tl.int64))
            buffer = tl.cast(tl.load(trailer + TRACE_BUFFER_PTR_C), tl.pointer_type(tl.int64))
        else:
            max_events = tl.full([], 0, tl.int64)
            counter = heap_bases
            buffer = heap_bases
        return DeviceTracing(tracing, rank, max_events, counter, buffer)

    @triton.jit
    def record_event_start(self, event_id: tl.constexpr, target_rank, address, pid_m, pid_n, mask=None):
        """Open an event and return its handle (an int64 slot), or -1 when tracing is off or full.

        ``event_id``: a :class:`TraceEvent` field. ``target_rank``: the peer involved (-1 for
        none). ``address``: a pointer or block of pointers; the lowest active one is recorded, and
        the bytes of the active lanes. ``pid_m``/``pid_n``: the caller's tile coordinates (-1 for
        none). ``mask``: the access mask, if any.

        Granularity: once per program. Memory semantics: one relaxed atomic on the slot counter
        (scope gpu) claims the slot; the record is one plain vector store that the host reads after
        the kernel. The start time is read last, just before the traced operation.
        """
        handle = tl.full([], -1, tl.int64)
        if self.enabled:
            if self.max_events > 0:
                slot = tl.atomic_add(self.counter, 1, sem="relaxed").to(tl.int64)
                if slot < self.max_events:
                    lowest, nbytes = _access_summary(address, mask)
                    lane = tl.arange(0, _RECORD_LANES)
                    record = tl.full([_RECORD_LANES], 0, tl.int64)
                    record = _put(record, lane, EVENT_ID_C, event_id)
                    record = _put(record, lane, EVENT_RANK_C, self.rank)
                    record = _put(record, lane, EVENT_TARGET_C, tl.cast(target_rank, tl.int64))
                    record = _put(record, lane, EVENT_ADDRESS_C, lowest)
                    record = _put(record, lane, EVENT_BYTES_C, nbytes)
                    record = _put(record, lane, EVENT_PID_C, _flat_program_id().to(tl.int64))
                    record = _put(record, lane, EVENT_PID_M_C, tl.cast(pid_m, tl.int64))
                    record = _put(record, lane, EVENT_PID_N_C, tl.cast(pid_n, tl.int64))
                    record = _put(record, lane, EVENT_SM_C, device_sm_id())
                    # EVENT_END stays 0 ("not closed") until record_event_end.
                    record = _put(record, lane, EVENT_START_C, device_clock_ns())
                    tl.store(self.buffer + slot * TRACE_EVENT_FIELDS_C + lane, record,
                             mask=lane < TRACE_EVENT_FIELDS_C)
                    handle = slot
        return handle

    @triton.jit
    def record_event_end(self, handle):
        """Close the event ``handle`` returned by :meth:`record_event_start` (``-1`` is ignored).

        Granularity: once per program. Memory semantics: one plain scalar store of the end time.
        """
        if self.enabled:
            if handle >= 0:
                tl.store(self.buffer + handle * TRACE_EVENT_FIELDS_C + EVENT_END_C, device_clock_ns())

    @triton.jit
    def record_event(self, event_id: tl.constexpr, target_rank, address, pid_m, pid_n, mask=None):
        """Record an instant event (a point in time: its end stays 0 and export shows it as an
        instant). Same arguments, granularity and semantics as :meth:`record_event_start`;
        returns the handle."""
        return self.record_event_start(event_id, target_rank, address, pid_m, pid_n, mask)
