"""The layout of the context tensor: one table, used by the runtime that writes it and the
device code that reads it.

``Iris.get_device_context()`` returns an int64 tensor::

    [cur_rank, num_ranks,                      # the spec's header
     heap_base_0, ..., heap_base_{N-1},        # the spec's heap bases
     trace_enabled, trace_max_events,          # the spec's trace info ...
     trace_counter_ptr, trace_buffer_ptr,
     heap_size,                                # ... then what Iris adds:
     watchdog_timeout_ns, watchdog_record_ptr, # the bound on waits (0: none), its report
     call_words_offset,                        # where the call agreement's words are (never 0),
     call_counter]                             # and the calls it counted

``heap_bases`` (what the free functions take) is the same tensor from index 2 on, so the
header sits just before it and the trailer just after the N bases.

A group's context tensor (``iris.runtime.Group.get_device_context()``) has the same layout for
the group (group rank and size, the members' heap bases in group order, the context's trailer
with the group's ``call_words_offset`` and a ``call_counter`` of its own) and one more part after
the trailer: the members' global ranks, in group order (``GROUP_RANKS``), which
``iris.device.DeviceGroup`` reads.
"""

from __future__ import annotations

import triton.language as tl

#: Index of the current rank in the context tensor.
CUR_RANK = 0
#: Index of the world size in the context tensor.
NUM_RANKS = 1
#: Index of heap_base_0 in the context tensor; ``heap_bases = context + HEAP_BASES``.
HEAP_BASES = 2

# Offsets counted from the end of the heap bases, i.e. ``heap_bases + num_ranks + X``.
#: 1 when the host enabled tracing, else 0.
TRACE_ENABLED = 0
#: Capacity of the event buffer, in events.
TRACE_MAX_EVENTS = 1
#: Address of the int64 counter that hands out event slots.
TRACE_COUNTER_PTR = 2
#: Address of the int64 event buffer, ``TRACE_EVENT_FIELDS`` words per event.
TRACE_BUFFER_PTR = 3
#: Heap size in bytes (every rank's heap has the same size).
HEAP_SIZE = 4
#: Longest a wait of iris.collectives may last, in ns; 0 when the watchdog is off.
WATCHDOG_NS = 5
#: Address of the watchdog's report (host-visible int64 words, layout in ``iris.device._watchdog``).
WATCHDOG_RECORD = 6
#: Byte offset, from every rank's heap base, of the call agreement's words
#: (``iris.device._calls``), never 0: a context's are in its signal pad (``heap_size +
#: CALL_WORDS_IN_PAD``, what ``iris.runtime`` writes); a group's context (``iris.runtime.Group``)
#: points it at words of its own on the heap, so that calls of overlapping groups never count or
#: compare in the same words. The device reads the words' address from it alone (one load).
CALL_WORDS_OFFSET = 7
#: The collective calls of this context (or group) that the device side of the call agreement
#: counted (``iris.device._calls``: one atomic add per call, 0 before the first). In the tensor
#: itself, whose address every kernel has: the count needs no load of an address first.
CALL_COUNTER = 8
#: Number of words after the heap bases.
TRAILER_WORDS = 9


#: A group's context tensor only: its members' global ranks start this many words after the end of
#: its heap bases, i.e. at ``heap_bases + group_size + GROUP_RANKS``, right after the trailer.
GROUP_RANKS = TRAILER_WORDS


def context_length(num_ranks: int) -> int:
    """Number of int64 words in the context tensor of a world of ``num_ranks``."""
    return HEAP_BASES + num_ranks + TRAILER_WORDS


#: Alignment, in bytes, that the runtime guarantees for every heap base. The device layer relies
#: on it to tell the compiler that translated pointers keep the alignment of local ones.
HEAP_BASE_ALIGNMENT = 256

#: The signal pad: ``SIGNAL_PAD_BYTES`` more bytes that the runtime maps (and zeroes) right after
#: every rank's heap, at ``heap_base + heap_size``: outside the heap, so no allocation reaches it,
#: and as reachable by peers as the heap. It holds the flags of device-side collectives that take
#: no flag array (``iris.collectives.all_reduce_ring``).
SIGNAL_PAD_BYTES = 1 << 20
#: Worlds up to this many ranks get the device side of the call agreement (``iris.device._calls``),
#: whose words sit in the pad: two int64 slots per rank.
CALL_CHECK_MAX_RANKS = 256
#: Bytes of the call agreement's words: ``2 x CALL_CHECK_MAX_RANKS`` int64 slots
#: (``[parity][rank]``). The call counter is the context tensor's ``CALL_COUNTER``.
CALL_WORDS_BYTES = 16 * CALL_CHECK_MAX_RANKS
#: The last bytes of the pad are reserved, and the ring's flags stay below them: first the call
#: agreement's words, then a 64-byte scratch area for the network path's masked-out lanes
#: (``iris.device._nvshmem``), then the watchdog's drain and claim words (16 bytes, at the very end).
PAD_RESERVED_BYTES = CALL_WORDS_BYTES + 80
#: Byte offset of the call agreement's words in the signal pad (the first reserved bytes): a
#: context's ``call_words_offset`` is ``heap_size + CALL_WORDS_IN_PAD``.
CALL_WORDS_IN_PAD = SIGNAL_PAD_BYTES - PAD_RESERVED_BYTES
#: Offsets inside the reserved bytes.
CALL_SLOTS_AT = 0
NETWORK_SCRATCH_AT = CALL_WORDS_BYTES
WATCHDOG_WORDS_AT = CALL_WORDS_BYTES + 64

#: The ring's flags of a group (``iris.collectives.all_reduce_ring(..., group=)``): ``FLAG_WORDS`` (4)
#: int32 words for each of ``GROUP_RING_MAX_TILES`` tile indices, in the group's own workspace
#: right before its call words, i.e. at ``heap_base + call_words_offset - GROUP_RING_BYTES`` on
#: every member (a context's ring flags are in the signal pad, which every group of a rank shares).
GROUP_RING_MAX_TILES = 1024
GROUP_RING_BYTES = 16 * GROUP_RING_MAX_TILES

# The same numbers as compile-time constants for @triton.jit code.
HEAP_BASES_C: tl.constexpr = tl.constexpr(HEAP_BASES)
#: Where the current rank's word sits counted from ``heap_bases`` (the header just before the bases):
#: device code that holds only ``heap_bases`` reads the calling rank as ``heap_bases[CUR_RANK_AT_C]``.
CUR_RANK_AT_C: tl.constexpr = tl.constexpr(CUR_RANK - HEAP_BASES)
TRACE_ENABLED_C: tl.constexpr = tl.constexpr(TRACE_ENABLED)
TRACE_MAX_EVENTS_C: tl.constexpr = tl.constexpr(TRACE_MAX_EVENTS)
TRACE_COUNTER_PTR_C: tl.constexpr = tl.constexpr(TRACE_COUNTER_PTR)
TRACE_BUFFER_PTR_C: tl.constexpr = tl.constexpr(TRACE_BUFFER_PTR)
HEAP_SIZE_C: tl.constexpr = tl.constexpr(HEAP_SIZE)
WATCHDOG_NS_C: tl.constexpr = tl.constexpr(WATCHDOG_NS)
WATCHDOG_RECORD_C: tl.constexpr = tl.constexpr(WATCHDOG_RECORD)
CALL_WORDS_OFFSET_C: tl.constexpr = tl.constexpr(CALL_WORDS_OFFSET)
CALL_COUNTER_C: tl.constexpr = tl.constexpr(CALL_COUNTER)
GROUP_RANKS_C: tl.constexpr = tl.constexpr(GROUP_RANKS)

# One trace event is TRACE_EVENT_FIELDS int64 words, in this order.
EVENT_ID = 0        #: TraceEvent id
EVENT_RANK = 1      #: rank that recorded the event
EVENT_TARGET = 2    #: target (peer) rank, -1 when none
EVENT_ADDRESS = 3   #: lowest active address of the access, 0 when none
EVENT_BYTES = 4     #: bytes moved by the access (active lanes x element size)
EVENT_PID = 5       #: program id (flattened)
EVENT_PID_M = 6     #: caller's tile row
EVENT_PID_N = 7     #: caller's tile column
EVENT_SM = 8        #: SM id on the GPU, program id under the interpreter
EVENT_START = 9     #: start time, ns
EVENT_END = 10      #: end time, ns; 0 until record_event_end
TRACE_EVENT_FIELDS = 12  # two words of padding keep events 32-byte aligned

# The event layout as compile-time constants for @triton.jit code.
EVENT_ID_C: tl.constexpr = tl.constexpr(EVENT_ID)
EVENT_RANK_C: tl.constexpr = tl.constexpr(EVENT_RANK)
EVENT_TARGET_C: tl.constexpr = tl.constexpr(EVENT_TARGET)
EVENT_ADDRESS_C: tl.constexpr = tl.constexpr(EVENT_ADDRESS)
EVENT_BYTES_C: tl.constexpr = tl.constexpr(EVENT_BYTES)
EVENT_PID_C: tl.constexpr = tl.constexpr(EVENT_PID)
EVENT_PID_M_C: tl.constexpr = tl.constexpr(EVENT_PID_M)
EVENT_PID_N_C: tl.constexpr = tl.constexpr(EVENT_PID_N)
EVENT_SM_C: tl.constexpr = tl.constexpr(EVENT_SM)
EVENT_START_C: tl.constexpr = tl.constexpr(EVENT_START)
EVENT_END_C: tl.constexpr = tl.constexpr(EVENT_END)
TRACE_EVENT_FIELDS_C: tl.constexpr = tl.constexpr(TRACE_EVENT_FIELDS)
