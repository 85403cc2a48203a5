"""The device side of ``ccl.send`` and ``ccl.recv``: a small message in chunks through the receiver's
inbox, a large one copied once where a heap or registered tensor allows it.

A *channel* is (sender, receiver, tag). For each, the mailboxes (``ccl.init_p2p``) hold, on the
receiver's heap, an inbox of ``slots`` slots of ``chunk`` elements, a record per slot and
program, and per program a *ready* counter that the sender signals; on the sender's heap, per
program, a *credit* counter that the receiver signals. Each side also keeps, per program, a
private count of the *units* (chunks, see below for large messages) it has moved on the channel.
A slot's record is ``RECORD`` int64 words: the message's header, the heap offset of the sender's
tensor's location (large messages, see below) and the units of the message the record starts (1 for a chunk). Every
counter only grows: nothing is reset between messages, and a CUDA graph of sends and receives
replays correctly.

Program ``p`` of both kernels moves tiles ``p, p + P, ...`` of every chunk (``P`` is the launch's
grid, the same on both ends: a function of the message's size and the mailboxes' settings). Its
``c``-th chunk on the channel, counted over every message, goes through slot ``c % slots``:

- the sender waits until its credit is at least ``c - slots + 1`` (the receiver has taken chunk
  ``c - slots`` out of that slot), stores its tiles and the message's header into the slot on
  the receiver (:func:`iris.collectives.put_with_signal`'s two steps: remote stores, then a
  release at system scope), and signals ready;
- the receiver waits until ready is at least ``c + 1`` (acquire at system scope), compares the
  header with its own (same number of elements, same dtype), copies its tiles out, and signals
  credit (release: its reads are done before the sender may overwrite the slot).

So a sender runs up to ``slots`` chunks ahead of its receiver and a message larger than the inbox
flows through it; either side may start first, from any stream; no host takes part. Each program
waits only for the program with the same id on the peer, never for one of its own launch.
Every wait is bounded by the watchdog and names the call, the peer and the tag.

A *large* message (more bytes than an inbox holds; both ends decide it from their own size, so
they agree when the sizes agree) counts ``units = 1 + chunks`` units and starts with a
rendezvous, whatever the tensors are:

- the receiver first *posts a request* in its record on the sender's heap (its header and its
  tensor's *location*: the heap offset in elements, ``NOWHERE`` (-1) when the peer cannot reach
  it, or, for a tensor registered with ``ctx.register``, ``-2 - (index << 40 | offset)``: the
  registration's place in ``ctx.registrations`` and the offset in elements into it) and raises the
  sender's *posted* word to ``c + 1`` (release);
- the sender *offers* the message as unit ``c``: the slot's record gets its header, its tensor's
  location and ``units``, then ready is signalled.

Then, the same choice on both ends from the two locations: the sender's tensor reachable: *pull*
(the sender signals every unit at once with its offer and does not read the request; the
receiver copies the tensor straight from the sender's heap or registered tensor, as
``ccl.broadcast`` reads, then credits every unit: the sender waits for that before it returns, its
tensor may change after); else the receiver's reachable: *push* (the sender waits for the request, stores the message
straight into the receiver's tensor and signals the remaining units; the receiver waits for them);
else the mailbox: the chunks follow the offer as units ``c + 1 ..``. One copy in the first two,
no slot and no credit per chunk, made by a kernel of its own after the rendezvous
(:func:`direct_copy_kernel`: it waits for nothing, so its grid is as large as a copy wants where
the waiting kernels' grid is bound by what stays resident beside the peer's), then a kernel
that signals the peer (:func:`direct_done_kernel`): the receiver's credit after a pull, the
sender's remaining units after a push. Headers that differ (a size or dtype mismatch) are refused by
both ends at the offer, with no copy: the receiver credits the sender's units (so a pulling
sender returns), a sender that waits for a request finds the mismatch in it and signals its
remaining units, and both counts end past the sender's message. A small receiver that finds a
large offer posts the request itself for that. Nothing here waits for the host: the protocol is
the same eager, on side streams and in a CUDA graph.

Each large call can run in steps (``first .. stop - 1`` of its units; ``post`` for the receiver's
request on its own): the cpu backend's ``batch_isend_irecv`` moves messages by turns that way.

``rank`` (this rank), like ``peer`` and ``tag``, is a run-time argument that is not specialised on:
every rank of a job runs the same compiled send and recv, for any peer and tag (a compile-time
rank compiled them once per rank: compile time is most of what a GPU test suite spends).
"""

# No "from __future__ import annotations": Triton resolves jit globals by name at compile time.
import triton
import triton.language as tl

from iris.device import DEBUG, INTERPRETER, atomic_max, get, put, store
from iris.device._debug import host_scalar
from iris.device._layout import HEAP_BASES_C
from iris.device._translate import _pointee_bytes
from iris.device._watchdog import WATCHDOG, mismatch_text, watchdog_report_size_mismatch, watchdog_reported

from .._errors import IrisMessageSizeError
from .._sync import advance, peer_flag, signal, wait_at_least

#: Names the waits report (entries of iris.device._watchdog.WAIT_CALLS and its TAGGED_CALLS).
SEND_CALL: tl.constexpr = tl.constexpr("iris.collectives.ccl.send")
RECV_CALL: tl.constexpr = tl.constexpr("iris.collectives.ccl.recv")
P2P_CALLS = (SEND_CALL.value, RECV_CALL.value)

#: int64 words of a slot's record and of a request: the header, where the tensor is (a *location*:
#: its heap offset in elements, ``NOWHERE`` when the peer cannot reach it, or a registered tensor's
#: place, :func:`registered_location`) and the units of the message the record starts.
RECORD_WORDS = 4
RECORD: tl.constexpr = tl.constexpr(RECORD_WORDS)
HEADER: tl.constexpr = tl.constexpr(0)
OFFSET: tl.constexpr = tl.constexpr(1)
UNITS: tl.constexpr = tl.constexpr(2)
#: Elements whose multiple a large message's heap offset usually is (a heap allocation's alignment
#: or more, in elements of 8 bytes at most): the direct copy then moves whole vectors.
VECTOR: tl.constexpr = tl.constexpr(16)
#: How a large message moves (a program's private mode word, for the calls of its later steps).
MAILBOX: tl.constexpr = tl.constexpr(0)
PULL: tl.constexpr = tl.constexpr(1)
PUSH: tl.constexpr = tl.constexpr(2)
REFUSED: tl.constexpr = tl.constexpr(3)
#: The location of a tensor the peer cannot reach (neither on the heap nor registered).
NOWHERE: tl.constexpr = tl.constexpr(-1)
#: A registered tensor's location is ``-2 - (index << REGISTERED_SHIFT | offset)``: the
#: registration's place in ``ctx.registrations`` (the same on every rank) and the tensor's offset
#: in elements from the registered tensor's start.
REGISTERED_SHIFT: tl.constexpr = tl.constexpr(40)
REGISTERED_MASK: tl.constexpr = tl.constexpr((1 << 40) - 1)


def registered_location(index: int, offset: int) -> int:
    """The location word of a tensor ``offset`` elements into registration ``index`` (host side)."""
    if not 0 <= offset < 1 << REGISTERED_SHIFT.value:
        raise ValueError(f"offset {offset} out of range")
    return -2 - ((index << REGISTERED_SHIFT.value) | offset)


@triton.jit
def _post(request, posted, header, offset, c, rank, peer, heap_bases):
    # The receiver's request for the large message at unit ``c``, in its record on the sender's heap,
    # then the sender's posted word raised to c + 1 (CTA barrier, release at system scope). Per program.
    store(request + HEADER, header, rank, peer, heap_bases)
    store(request + OFFSET, offset, rank, peer, heap_bases)
    tl.debug_barrier()
    if DEBUG:
        atomic_max(posted, c + 1, rank, peer, heap_bases, sem="release", scope="sys")
    else:
        tl.atomic_max(peer_flag(posted, rank, peer, heap_bases), c + 1, sem="release", scope="sys")


@triton.jit
def _send_chunk(inp, inbox, headers, ready, credit, n, header, k, c, chunk, slots, programs, peer, tag, rank,
                heap_bases, BLOCK: tl.constexpr):
    # Chunk ``k`` of ``inp`` as this program's unit ``c`` on the channel: its tiles into slot c % slots
    # once the slot's previous unit was credited, its record, then ready. Per program.
    p = tl.program_id(0)
    P = tl.num_programs(0)
    slot = c % slots
    if c >= slots:  # the slot's previous chunk must have been taken out
        wait_at_least(credit + p, c - slots + 1, SEND_CALL, "credit", rank, peer, tag, heap_bases)
    base = k * chunk
    m = tl.minimum(chunk, n - base)
    staged = inbox + slot * chunk
    for t in range(p, tl.cdiv(m, BLOCK), P):
        offsets = t * BLOCK + tl.arange(0, BLOCK)
        put(inp + base + offsets, staged + offsets, rank, peer, heap_bases, mask=offsets < m)
    record = headers + (slot * programs + p) * RECORD
    store(record + HEADER, header, rank, peer, heap_bases)
    store(record + UNITS, 1, rank, peer, heap_bases)
    signal(ready + p, rank, peer, heap_bases)  # CTA barrier, release at system scope


@triton.jit
def _take_chunk(out, inbox, ready, k, c, n, chunk, slots, peer, tag, rank, heap_bases, BLOCK: tl.constexpr):
    # Chunk ``k`` of a large message that moves through the mailbox, unit ``c``: wait, copy out (the
    # headers agreed at the offer), credit. Per program.
    p = tl.program_id(0)
    P = tl.num_programs(0)
    wait_at_least(ready + p, c + 1, RECV_CALL, "ready", rank, peer, tag, heap_bases)
    base = k * chunk
    m = tl.minimum(chunk, n - base)
    staged = inbox + (c % slots) * chunk
    for t in range(p, tl.cdiv(m, BLOCK), P):
        offsets = t * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < m
        tl.store(out + base + offsets, tl.load(staged + offsets, mask=mask), mask=mask)


@triton.jit(do_not_specialize=["first", "stop", "peer", "tag", "rank"])
def send_kernel(context, inp, inbox, headers, ready, credit, sent, n, header, chunk, slots, programs, first, stop,
                peer, tag, rank, BLOCK: tl.constexpr):
    """Send chunks ``first .. stop - 1`` of a small message ``inp`` (``n`` elements, ``chunk`` per
    chunk, at most an inbox's worth) to rank ``peer`` on the channel of ``tag``.

    ``inbox`` (``slots * chunk`` elements), ``headers`` (``slots * programs`` records of ``RECORD``
    int64: ``programs`` is the mailboxes' largest grid) and ``ready`` (int32 per program) are the
    receiver's, given as this rank's addresses of the same words; ``credit`` and ``sent`` (int32
    per program) are this rank's. ``header``: the message's (``iris.device._watchdog.message_header``).
    Tiles of ``BLOCK`` elements. Per program; see the module docstring for the protocol."""
    heap_bases = context + HEAP_BASES_C
    p = tl.program_id(0)
    c = advance(sent + p, stop - first)  # this program's units on the channel before these
    for k in range(first, stop):
        _send_chunk(inp, inbox, headers, ready, credit, n, header, k, c, chunk, slots, programs, peer, tag, rank,
                    heap_bases, BLOCK)
        c += 1


@triton.jit(do_not_specialize=["first", "stop", "peer", "tag", "rank"])
def recv_kernel(context, out, inbox, headers, ready, credit, received, requests, posted, n, header, chunk, slots,
                programs, first, stop, peer, tag, rank, BLOCK: tl.constexpr):
    """Receive chunks ``first .. stop - 1`` of a small message of ``n`` elements from rank ``peer``
    on the channel of ``tag`` into ``out``.

    ``inbox``, ``headers``, ``ready`` and ``received`` are this rank's (the channel from ``peer``);
    ``credit``, ``requests`` (a ``RECORD`` per program) and ``posted`` are the sender's, given as
    this rank's addresses of the same words. ``header``: what this call expects; a chunk whose
    header differs is not copied (an ``IrisMessageSizeError`` under the interpreter, a watchdog
    report that ends the job on the GPU), and is still credited, so the sender does not hang; a
    large message's offer is credited with all its units and answered with a request that refuses
    it (see the module docstring), and the rest of this call is skipped. Per program."""
    heap_bases = context + HEAP_BASES_C
    p = tl.program_id(0)
    P = tl.num_programs(0)
    c = advance(received + p, stop - first)
    end = c + stop - first
    going = tl.full([], 1, tl.int32)
    for k in range(first, stop):
        if going != 0:
            slot = c % slots
            wait_at_least(ready + p, c + 1, RECV_CALL, "ready", rank, peer, tag, heap_bases)
            record = headers + (slot * programs + p) * RECORD
            sent = tl.load(record + HEADER)  # after the acquire: the sender's record
            base = k * chunk
            m = tl.minimum(chunk, n - base)
            staged = inbox + slot * chunk
            if sent == header:
                for t in range(p, tl.cdiv(m, BLOCK), P):
                    offsets = t * BLOCK + tl.arange(0, BLOCK)
                    mask = offsets < m
                    tl.store(out + base + offsets, tl.load(staged + offsets, mask=mask), mask=mask)
            theirs = tl.maximum(tl.load(record + UNITS), 1)
            if sent != header:
                if theirs > 1:  # a large message's offer: refuse it as a large receiver would
                    _post(requests + p * RECORD, posted + p, header, -1, c, rank, peer, heap_bases)
                    going = tl.full([], 0, tl.int32)
                    tl.atomic_add(received + p, c + theirs - end, sem="relaxed", scope="gpu")
            signal(credit + p, rank, peer, heap_bases, amount=theirs)  # this program's reads of the slot are done
            if sent != header:
                _report_mismatch(heap_bases, rank, peer, tag, sent, header, p == P - 1)
            c += 1


@triton.jit
def _offer(headers, ready, credit, requests, posted, header, units, c, slots, programs, src_offset, peer, tag, rank,
           heap_bases):
    # Step 0 of a large send, unit ``c``: the offer, then (the tensor not on the heap) the request.
    # Returns the mode. Per program.
    p = tl.program_id(0)
    slot = c % slots
    if c >= slots:  # the slot's previous unit must have been taken
        wait_at_least(credit + p, c - slots + 1, SEND_CALL, "credit", rank, peer, tag, heap_bases)
    record = headers + (slot * programs + p) * RECORD
    store(record + HEADER, header, rank, peer, heap_bases)
    store(record + OFFSET, src_offset, rank, peer, heap_bases)
    store(record + UNITS, units, rank, peer, heap_bases)
    pull = src_offset != NOWHERE
    if pull:  # the receiver reads the tensor where it is: every unit at once
        signal(ready + p, rank, peer, heap_bases, amount=units)
    else:
        signal(ready + p, rank, peer, heap_bases)
        wait_at_least(posted + p, c + 1, SEND_CALL, "request", rank, peer, tag, heap_bases)
    request = requests + p * RECORD  # after the acquire: the receiver's request (unused when pulled)
    wanted = tl.load(request + HEADER)
    dst_offset = tl.load(request + OFFSET)
    how = tl.where(pull, PULL, tl.where(wanted != header, REFUSED, tl.where(dst_offset != NOWHERE, PUSH, MAILBOX)))
    if how == REFUSED:  # the message's other units, with no copy (a push: direct_copy_kernel, direct_done_kernel)
        signal(ready + p, rank, peer, heap_bases, amount=units - 1)
    return how


@triton.jit(do_not_specialize=["first", "stop", "src_offset", "peer", "tag", "rank"])
def send_large_kernel(context, inp, inbox, headers, ready, credit, sent, requests, posted, mode, n, header, units,
                      chunk, slots, programs, first, stop, src_offset, peer, tag, rank, BLOCK: tl.constexpr):
    """Steps ``first .. stop - 1`` of sending a large message ``inp`` (``n`` elements, ``units`` =
    1 + its chunks) to rank ``peer`` on the channel of ``tag``: the rendezvous of the module
    docstring, then the chunks through the mailbox; a push, and the wait for a pull's end, are
    :func:`direct_copy_kernel` and :func:`direct_done_kernel`, launched after this one.

    As :func:`send_kernel`, and: ``requests`` (a ``RECORD`` per program) and ``posted`` (int32 per
    program), this rank's, where the receiver posts; ``mode`` (int32 per program), this rank's
    private word for the mode; ``src_offset``: ``inp``'s location (its heap offset in elements,
    ``NOWHERE``, or a registered tensor's place). Per program."""
    heap_bases = context + HEAP_BASES_C
    p = tl.program_id(0)
    c0 = advance(sent + p, stop - first) - first  # this program's unit of the offer
    how = tl.load(mode + p)  # the mode step 0 chose (a call of later steps)
    if first == 0:
        how = _offer(headers, ready, credit, requests, posted, header, units, c0, slots, programs, src_offset, peer,
                     tag, rank, heap_bases)
        tl.store(mode + p, how)
    if how == MAILBOX:
        for k in range(tl.maximum(first, 1), stop):
            _send_chunk(inp, inbox, headers, ready, credit, n, header, k - 1, c0 + k, chunk, slots, programs, peer,
                        tag, rank, heap_bases, BLOCK)


@triton.jit(do_not_specialize=["first", "stop", "post", "dst_offset", "peer", "tag", "rank"])
def recv_large_kernel(context, out, inbox, headers, ready, credit, received, requests, posted, mode, n, header, units,
                      chunk, slots, programs, first, stop, post, dst_offset, peer, tag, rank, BLOCK: tl.constexpr):
    """Steps ``first .. stop - 1`` of receiving a large message of ``n`` elements (``units`` = 1 +
    its chunks) from rank ``peer`` on the channel of ``tag`` into ``out``; with ``post`` (nonzero)
    the request first (see the module docstring); a pull is :func:`direct_copy_kernel` and
    :func:`direct_done_kernel`, launched after this one.

    As :func:`recv_kernel`, and: ``mode`` (int32 per program), this rank's private word for the
    mode; ``dst_offset``: ``out``'s location (as ``src_offset`` of :func:`send_large_kernel`). A refused offer
    (headers that differ) is credited with the sender's units, this program's count moved past the
    sender's message, and reported as :func:`recv_kernel` does. Per program."""
    heap_bases = context + HEAP_BASES_C
    p = tl.program_id(0)
    P = tl.num_programs(0)
    c0 = advance(received + p, stop - first) - first  # this program's unit of the offer
    if post != 0:  # where the message goes, before this program waits for the offer
        _post(requests + p * RECORD, posted + p, header, dst_offset, c0, rank, peer, heap_bases)
    how = tl.load(mode + p)
    if (first == 0) & (stop > 0):
        wait_at_least(ready + p, c0 + 1, RECV_CALL, "ready", rank, peer, tag, heap_bases)
        record = headers + ((c0 % slots) * programs + p) * RECORD
        offered = tl.load(record + HEADER)  # after the acquire: the sender's offer
        src_offset = tl.load(record + OFFSET)
        how = tl.where(offered != header, REFUSED, tl.where(src_offset != NOWHERE, PULL,
                                                            tl.where(dst_offset != NOWHERE, PUSH, MAILBOX)))
        tl.store(mode + p, how)
        if how == MAILBOX:
            signal(credit + p, rank, peer, heap_bases)  # the offer's slot
        if how == REFUSED:
            theirs = tl.maximum(tl.load(record + UNITS), 1)
            signal(credit + p, rank, peer, heap_bases, amount=theirs)
            tl.atomic_add(received + p, theirs - stop, sem="relaxed", scope="gpu")  # past the sender's message
            _report_mismatch(heap_bases, rank, peer, tag, offered, header, p == P - 1)
    if how == MAILBOX:
        for k in range(tl.maximum(first, 1), stop):
            _take_chunk(out, inbox, ready, k - 1, c0 + k, n, chunk, slots, peer, tag, rank, heap_bases, BLOCK)
            signal(credit + p, rank, peer, heap_bases)


@triton.jit(do_not_specialize=["stop", "inbox_offset", "table_ranks", "peer", "rank"])
def direct_copy_kernel(context, t, inbox, headers, requests, counted, mode, registered, n, slots, programs, stop,
                       inbox_offset, table_ranks, peer, rank, SEND: tl.constexpr, DIRECT_BLOCK: tl.constexpr):
    """The single copy of a large message whose :func:`send_large_kernel` (``SEND``: a push, from
    ``t`` into the receiver's tensor) or :func:`recv_large_kernel` (a pull, from the sender's tensor
    into ``t``) has just run on this stream for its first unit (``stop``: the step's end); nothing
    where that chose another mode. It waits for nothing: its grid is as large as the copy wants,
    not bound by what is resident alongside the waiting kernels.

    ``t`` (``n`` elements), ``inbox``, ``headers``, ``requests``, ``counted`` and ``mode`` as given
    to that kernel, ``inbox_offset``: ``inbox``'s heap offset in elements (the other tensor's
    location is in the request, or in the offer's record, of program 0); ``registered``: the
    context's table of registered tensors (int64, ``table_ranks`` words per registration: every
    rank's tensor in this process's address space), read where that location is a registered
    tensor's. Tiles of ``DIRECT_BLOCK`` elements, a grid-stride loop. Granularity: per program;
    plain loads and stores (the waits of the kernel before ordered them: it acquired the peer's
    request or offer).
    """
    heap_bases = context + HEAP_BASES_C
    how = tl.load(mode)
    if SEND:  # the receiver's tensor: its heap offset in the request
        moving = how == PUSH
        offset_at = requests + OFFSET
    else:  # the sender's: in the offer's record, program 0's unit (its count moved past it)
        moving = how == PULL
        c0 = tl.load(counted) - stop
        offset_at = headers + ((c0 % slots) * programs) * RECORD + OFFSET
    if moving:
        where = tl.load(offset_at, volatile=True)
        if where >= 0:  # on the heap: the other tensor at its offset in this rank's heap, translated
            delta = where - inbox_offset  # from inbox
            if delta % VECTOR == 0:  # the usual case: said so, the copy moves vectors
                _direct(t, inbox + tl.multiple_of(delta, VECTOR), n, rank, peer, heap_bases, SEND, DIRECT_BLOCK)
            else:
                _direct(t, inbox + delta, n, rank, peer, heap_bases, SEND, DIRECT_BLOCK)
        else:  # registered: the peer's tensor where this process maps it, reached as it is
            code = -2 - where
            index = code >> REGISTERED_SHIFT
            offset = code & REGISTERED_MASK
            theirs = tl.load(registered + index * table_ranks + peer)  # the peer's registered tensor, here
            inbox_at = tl.load(heap_bases + rank) + inbox_offset * _pointee_bytes(inbox.dtype)
            delta = (theirs - inbox_at) // _pointee_bytes(inbox.dtype) + offset  # from inbox, in elements
            if delta % VECTOR == 0:
                _direct_mapped(t, inbox + tl.multiple_of(delta, VECTOR), n, SEND, DIRECT_BLOCK)
            else:
                _direct_mapped(t, inbox + delta, n, SEND, DIRECT_BLOCK)

@triton.jit
def _direct(t, there, n, rank, peer, heap_bases, SEND: tl.constexpr, DIRECT_BLOCK: tl.constexpr):
    # The copy between this rank's ``t`` and the peer's ``there`` (this rank's address of it), a
    # grid-stride loop over tiles: a put (``SEND``) or a get.
    for i in range(tl.program_id(0), tl.cdiv(n, DIRECT_BLOCK), tl.num_programs(0)):
        offsets = i * DIRECT_BLOCK + tl.arange(0, DIRECT_BLOCK)
        if SEND:
            put(t + offsets, there + offsets, rank, peer, heap_bases, mask=offsets < n)
        else:
            get(there + offsets, t + offsets, peer, rank, heap_bases, mask=offsets < n)

@triton.jit
def _direct_mapped(t, there, n, SEND: tl.constexpr, DIRECT_BLOCK: tl.constexpr):
    # The copy between this rank's ``t`` and ``there``, the peer's registered tensor as this process
    # maps it (no translation: the registration's table holds the mapped address).
    for i in range(tl.program_id(0), tl.cdiv(n, DIRECT_BLOCK), tl.num_programs(0)):
        offsets = i * DIRECT_BLOCK + tl.arange(0, DIRECT_BLOCK)
        mask = offsets < n
        if SEND:
            tl.store(there + offsets, tl.load(t + offsets, mask=mask), mask=mask)
        else:
            tl.store(t + offsets, tl.load(there + offsets, mask=mask), mask=mask)


@triton.jit(do_not_specialize=["units", "first", "stop", "peer", "tag", "rank"])
def direct_done_kernel(context, ready, credit, counted, mode, units, first, stop, peer, tag, rank, SEND: tl.constexpr):
    """After :func:`direct_copy_kernel` (or alone, for a later step of a large send), on the same
    stream, with the grid of the large kernel before it: program ``p`` and the peer's program ``p``.
    In the step that holds the rendezvous (``first == 0``), a push (``SEND``) signals the receiver's
    ``ready`` with the message's other units, and the receiver waits for them; after a pull or a
    push the receiver credits the sender (``credit``: its) with every unit (a pulled tensor is free
    again); in a pulled send's last step (``stop == units``), the sender waits for that credit
    before its tensor may change. ``ready``, ``credit``, ``counted`` and
    ``mode`` as given to the large kernel. Per program: a CTA barrier, then release at system scope
    for a signal (the copy kernel ended before this one began); acquire at system scope for the wait.
    A kernel of its own, not the large kernel's end: under the interpreter a launch's programs run
    one after another, and a program waiting there would hold back the next one's offer or request."""
    heap_bases = context + HEAP_BASES_C
    p = tl.program_id(0)
    how = tl.load(mode + p)
    rendezvous = (first == 0) & (stop > 0)
    if SEND:
        if (how == PUSH) & rendezvous:
            signal(ready + p, rank, peer, heap_bases, amount=units - 1)
        if (how == PULL) & (stop == units):  # the receiver has read the tensor: it may change once this returns
            c0 = tl.load(counted + p) - stop  # this program's unit of the offer
            wait_at_least(credit + p, c0 + units, SEND_CALL, "done", rank, peer, tag, heap_bases)
    else:
        if (how == PUSH) & rendezvous:  # the sender stores into out: wait for its other units
            c0 = tl.load(counted + p) - stop
            wait_at_least(ready + p, c0 + units, RECV_CALL, "ready", rank, peer, tag, heap_bases)
        if ((how == PULL) | (how == PUSH)) & rendezvous:
            signal(credit + p, rank, peer, heap_bases, amount=units)

@triton.constexpr_function
def _raise_mismatch(rank, peer, tag, sent, expected):
    raise IrisMessageSizeError(mismatch_text(RECV_CALL.value, host_scalar(rank), host_scalar(peer), host_scalar(tag),
                                             host_scalar(sent), host_scalar(expected)))


@triton.jit
def _report_mismatch(heap_bases, rank, peer, tag, sent, expected, last):
    # A message of another size or dtype: raise under the interpreter; on the GPU the watchdog's
    # report (the runtime prints it and ends the job), or a printed line where it is compiled out.
    # Not after a wait of this process gave up (its report says why; the header is stale then).
    # Under the interpreter only the launch's last program raises (``last``): the programs run in
    # turn, and every one before it has credited the sender by then.
    if INTERPRETER:
        if last:
            if watchdog_reported(heap_bases) == 0:
                _raise_mismatch(rank, peer, tag, sent, expected)
    else:
        if WATCHDOG:
            watchdog_report_size_mismatch(heap_bases, RECV_CALL, "message size", peer, tag, sent, expected)
        else:
            tl.device_print("iris: iris.collectives.ccl.recv: the message differs in size or dtype (headers: "
                            "element count * 16 + dtype): rank, peer, tag, sent, expected = ", rank, peer, tag, sent,
                            expected)
