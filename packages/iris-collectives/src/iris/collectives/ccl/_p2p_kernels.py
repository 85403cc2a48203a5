"""The device side of ``ccl.send`` and ``ccl.recv``: a message in chunks through the receiver's inbox.

A *channel* is (sender, receiver, tag). For each, the mailboxes (``ccl.init_p2p``) hold, on the
receiver's heap, an inbox of ``slots`` slots of ``chunk`` elements, one int64 header per slot and
program, and per program a *ready* counter that the sender signals; on the sender's heap, per
program, a *credit* counter that the receiver signals. Each side also keeps, per program, a
private count of the chunks it has moved on the channel. Every counter only grows: nothing is
reset between messages, and a CUDA graph of sends and receives replays correctly.

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

``rank`` (this rank), like ``peer`` and ``tag``, is a run-time argument that is not specialised on:
every rank of a job runs the same compiled send and recv, for any peer and tag (a compile-time
rank compiled them once per rank: compile time is most of what a GPU test suite spends).
"""

# No "from __future__ import annotations": Triton resolves jit globals by name at compile time.
import triton
import triton.language as tl

from iris.device import INTERPRETER, put, store
from iris.device._debug import host_scalar
from iris.device._layout import HEAP_BASES_C
from iris.device._watchdog import WATCHDOG, mismatch_text, watchdog_report_size_mismatch, watchdog_reported

from .._errors import IrisMessageSizeError
from .._sync import advance, signal, wait_at_least

#: Names the waits report (entries of iris.device._watchdog.WAIT_CALLS and its TAGGED_CALLS).
SEND_CALL: tl.constexpr = tl.constexpr("iris.collectives.ccl.send")
RECV_CALL: tl.constexpr = tl.constexpr("iris.collectives.ccl.recv")
P2P_CALLS = (SEND_CALL.value, RECV_CALL.value)


@triton.jit(do_not_specialize=["first", "stop", "peer", "tag", "rank"])
def send_kernel(context, inp, inbox, headers, ready, credit, sent, n, header, chunk, slots, programs, first, stop,
                peer, tag, rank, BLOCK: tl.constexpr):
    """Send chunks ``first .. stop - 1`` of ``inp`` (``n`` elements, ``chunk`` per chunk) to rank
    ``peer`` on the channel of ``tag``.

    ``inbox`` (``slots * chunk`` elements), ``headers`` (``slots * programs`` int64: ``programs`` is
    the mailboxes' largest grid) and ``ready`` (int32 per program) are the receiver's, given as
    this rank's addresses of the same words; ``credit`` and ``sent`` (int32 per program) are this
    rank's. ``header``: the message's (``iris.device._watchdog.message_header``). Tiles of ``BLOCK``
    elements. Per program; see the module docstring for the protocol."""
    heap_bases = context + HEAP_BASES_C
    p = tl.program_id(0)
    P = tl.num_programs(0)
    c = advance(sent + p, stop - first)  # this program's chunks on the channel before these
    for k in range(first, stop):
        slot = c % slots
        if c >= slots:  # the slot's previous chunk must have been taken out
            wait_at_least(credit + p, c - slots + 1, SEND_CALL, "credit", rank, peer, tag, heap_bases)
        base = k * chunk
        m = tl.minimum(chunk, n - base)
        staged = inbox + slot * chunk
        for t in range(p, tl.cdiv(m, BLOCK), P):
            offsets = t * BLOCK + tl.arange(0, BLOCK)
            put(inp + base + offsets, staged + offsets, rank, peer, heap_bases, mask=offsets < m)
        store(headers + slot * programs + p, header, rank, peer, heap_bases)
        signal(ready + p, rank, peer, heap_bases)  # CTA barrier, release at system scope
        c += 1


@triton.jit(do_not_specialize=["first", "stop", "peer", "tag", "rank"])
def recv_kernel(context, out, inbox, headers, ready, credit, received, n, header, chunk, slots, programs, first, stop,
                peer, tag, rank, BLOCK: tl.constexpr):
    """Receive chunks ``first .. stop - 1`` of a message of ``n`` elements from rank ``peer`` on the
    channel of ``tag`` into ``out``.

    ``inbox``, ``headers``, ``ready`` and ``received`` are this rank's (the channel from ``peer``);
    ``credit`` is the sender's, given as this rank's address of the same word. ``header``: what
    this call expects; a chunk whose header differs is not copied (an ``IrisMessageSizeError``
    under the interpreter, a watchdog report that ends the job on the GPU), and is still credited,
    so the sender does not hang. Per program; see the module docstring for the protocol."""
    heap_bases = context + HEAP_BASES_C
    p = tl.program_id(0)
    P = tl.num_programs(0)
    c = advance(received + p, stop - first)
    for k in range(first, stop):
        slot = c % slots
        wait_at_least(ready + p, c + 1, RECV_CALL, "ready", rank, peer, tag, heap_bases)
        sent = tl.load(headers + slot * programs + p)  # after the acquire: the sender's header
        base = k * chunk
        m = tl.minimum(chunk, n - base)
        staged = inbox + slot * chunk
        if sent == header:
            for t in range(p, tl.cdiv(m, BLOCK), P):
                offsets = t * BLOCK + tl.arange(0, BLOCK)
                mask = offsets < m
                tl.store(out + base + offsets, tl.load(staged + offsets, mask=mask), mask=mask)
        signal(credit + p, rank, peer, heap_bases)  # this program's reads of the slot are done
        if sent != header:
            _report_mismatch(heap_bases, rank, peer, tag, sent, header)
        c += 1


@triton.constexpr_function
def _raise_mismatch(rank, peer, tag, sent, expected):
    raise IrisMessageSizeError(mismatch_text(RECV_CALL.value, host_scalar(rank), host_scalar(peer), host_scalar(tag),
                                             host_scalar(sent), host_scalar(expected)))


@triton.jit
def _report_mismatch(heap_bases, rank, peer, tag, sent, expected):
    # A message of another size or dtype: raise under the interpreter; on the GPU the watchdog's
    # report (the runtime prints it and ends the job), or a printed line where it is compiled out.
    # Not after a wait of this process gave up (its report says why; the header is stale then).
    if INTERPRETER:
        if watchdog_reported(heap_bases) == 0:
            _raise_mismatch(rank, peer, tag, sent, expected)
    else:
        if WATCHDOG:
            watchdog_report_size_mismatch(heap_bases, RECV_CALL, "message size", peer, tag, sent, expected)
        else:
            tl.device_print("iris: iris.collectives.ccl.recv: the message differs in size or dtype (headers: "
                            "element count * 16 + dtype): rank, peer, tag, sent, expected = ", rank, peer, tag, sent,
                            expected)
