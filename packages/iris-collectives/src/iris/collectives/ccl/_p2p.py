"""Point to point from the host: ``send``, ``recv``, ``isend``, ``irecv``, ``batch_isend_irecv``.

A small message moves in chunks through the receiver's *inbox* for the (sender, tag) pair, on the
symmetric heap; a large one (more than an inbox holds) is copied once, straight between the two
tensors, when the peer can reach either where it is: on the heap, or in a tensor registered with
``ctx.register`` (a plain tensor on the GPU; the protocol is in :mod:`._p2p_kernels`). The inboxes
and their counters are the context's *mailboxes*, which :func:`init_p2p` allocates on every rank
at once: a point-to-point call involves two ranks only, so it cannot allocate symmetric memory
itself (every rank's heap must see the same allocations in the same order).

Streams: ``send`` and ``recv`` are enqueued on torch's current stream and return at once, like
every host call of this library; later work on that stream runs after the message has moved.
``isend`` and ``irecv`` run on a stream of their own for the peer, tag and direction (after what
the current stream holds at the call), so a send and a receive, or messages of several tags,
progress side by side; they return a :class:`Work` whose ``wait()`` orders the current stream
after the message (the host does not wait), as ``torch.distributed``'s ``Work.wait()`` does with
NCCL. Calls of one peer, tag and direction pair up with the peer's in the order they are made.

Nothing is kept per call on the host: a call's plan (its launch, keyed by tensor, peer and tag)
is cached, the counters that pair the chunks are in device memory, so a CUDA graph of sends and
receives replays correctly (make each call once before capturing it).

The call agreement: ``init_p2p`` is collective, and agreed like every collective call (its
settings), on every call rather than when new: its next step is another host exchange, where a
rank whose agreement was cached would meet one that agrees on a new call. A send or receive is
not agreed: only its two ranks take part, so an agreement among every rank would make the others
wait for calls that are not theirs, and one between the two would cost a host round trip per new
call and take away the either-order, any-stream property. Their check is the message's: every
chunk carries the header of its send (element count and dtype), which the receiving kernel
compares with its own on every call, cached or replayed in a graph (:class:`IrisMessageSizeError`,
or on the GPU the watchdog's report). A send or receive whose peer or tag does not match waits
for a message that never comes, and the watchdog names the call, the peer and the tag. Nor do
they count among the context's collective calls whose fingerprints the collectives' kernels
compare (``iris.device._calls``): the ranks that make no point-to-point call would count
differently.

Groups (``group=``, an :class:`iris.runtime.Group`): a group has mailboxes of its own, carved from
its arena by ``init_p2p(ctx, group=group)`` (collective over the members), so a message on one
group can never pair with a receive on another group or on the context, whatever the tags. The
calls then run on the group in place of the context (``_groups.on_group``): peers are group ranks,
the kernels read the group's context tensor (its heap bases in group order), and side streams,
plans and mailboxes are the group's.
"""

from __future__ import annotations

import dataclasses
import weakref

import torch

from iris.device import IrisError
from iris.device._watchdog import MESSAGE_DTYPES, message_header
from iris.runtime import Group, HeapExhaustedError, IrisUsageError
from iris.runtime._residency import gpu_sharers

from .. import _workspace
from .._agree import agree
from .._compiling import is_compiling, traced
from . import _checks, _launch, _ranks
from ._config import Config
from ._groups import on_group
from ._p2p_kernels import (
    NOWHERE,
    RECORD_WORDS,
    direct_copy_kernel,
    direct_done_kernel,
    recv_kernel,
    recv_large_kernel,
    registered_location,
    send_kernel,
    send_large_kernel,
)

#: The mailboxes' key in the context's workspace cache.
MAILBOXES = ("ccl.p2p",)
#: int32 counter arrays per channel (each one word per program): the receiver's "ready" (signalled
#: by the sender) and its count of units taken, the sender's "credit" (signalled by the receiver)
#: and its count of units sent, the sender's "posted" (raised by the receiver's requests for large
#: messages), and each side's private mode of the large message in flight (the last word is spare).
READY, RECEIVED, CREDIT, SENT, POSTED, SEND_MODE, RECV_MODE = 0, 1, 2, 3, 4, 5, 6
COUNTERS = 8
#: A large message's direct copy (``direct_copy_kernel``) moves a mailbox tile per step of a
#: program, with at most this many programs per SM on the GPU: it waits for nothing, so it may fill
#: the GPU as a plain copy does (a 16 KiB tile takes under 64 registers a thread at 4 warps: 8
#: programs fit an SM).
DIRECT_PROGRAMS_PER_SM = 8


@dataclasses.dataclass(frozen=True)
class P2PSettings:
    """The mailboxes' settings (:func:`init_p2p`), the same on every rank.

    - ``tags``: channels per peer and direction (tags ``0 .. tags - 1``);
    - ``slots``, ``chunk_bytes``: each channel's inbox holds ``slots`` chunks of ``chunk_bytes``;
      a larger message flows through it, the sender at most ``slots`` chunks ahead;
    - ``block_bytes``: the tile a program moves at a time (divides ``chunk_bytes``);
    - ``grid``: most programs of a send or a receive (fewer for a message of fewer tiles);
    - ``num_warps``: Triton's launch option.
    """

    tags: int
    slots: int
    chunk_bytes: int
    block_bytes: int
    grid: int
    num_warps: int

    def heap_bytes(self, world_size: int) -> int:
        """Bytes of heap the mailboxes take on each rank."""
        channels = (world_size - 1) * self.tags
        records = 8 * RECORD_WORDS * (self.slots + 1) * self.grid  # the slots' records and the requests
        return channels * (self.slots * self.chunk_bytes + records + 4 * COUNTERS * self.grid)


#: Defaults per backend. On the GPU a channel's inbox of 4 x 1 MiB stays in L2 while the receiver
#: takes the chunks out; the cpu backend's are small (Triton's interpreter copies slowly).
DEFAULTS = {"cuda": dict(slots=4, chunk_bytes=1 << 20, block_bytes=16 << 10),
            "cpu": dict(slots=2, chunk_bytes=64 << 10, block_bytes=4 << 10)}
#: Largest dtype of a message, in bytes: chunks and tiles hold whole elements of every dtype.
_WIDEST = 8


def _default_grid(ctx) -> int:
    # On the GPU, one send and one receive of every rank sharing the device waiting at once hold
    # at most one program per SM (the residency rule of iris.runtime.Iris.resident_grid); the
    # interpreter runs programs one after another.
    # On a group, every rank of the context on the device counts, not only the members: the other
    # ranks may be sending on groups of their own at the same time. And so do the ranks of other
    # jobs on the GPU that IRIS_GPU_RANKS counts, as in resident_grid (a test suite's jobs side
    # by side): their waiting kernels hold SMs too.
    if ctx.device.type != "cuda":
        return 2
    sharing = ctx.ctx.ranks_on_device if isinstance(ctx, Group) else ctx.ranks_on_device
    return max(1, ctx.get_cu_count() // (2 * max(1, sharing, gpu_sharers())))


def _positive(call: str, name: str, value, power_of_two=False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (power_of_two and value & (value - 1)):
        kind = "a power of two" if power_of_two else "a positive int"
        raise IrisUsageError(f"{call}: {name}={value!r} must be {kind}")
    return value


def init_p2p(ctx, tags: int = 4, slots: int | None = None, chunk_bytes: int | None = None,
             block_bytes: int | None = None, grid: int | None = None, num_warps: int = 4,
             group=None) -> P2PSettings:
    """Allocate the context's point-to-point mailboxes; returns their settings. Collective: every
    rank calls it, with the same arguments, before its first ``send``/``recv`` (as
    ``torch.distributed`` needs ``init_process_group``).

    Each rank's heap gets, per peer and tag, an inbox of ``slots`` chunks of ``chunk_bytes``
    (``slots`` and ``chunk_bytes`` default to 4 x 1 MiB on the GPU, 2 x 64 KiB on the cpu backend;
    ``chunk_bytes`` a power of two, at least 16) and a few counters: ``(W - 1) * tags * slots *
    chunk_bytes`` bytes in all (:meth:`P2PSettings.heap_bytes`; 16 MiB with 2 ranks on the GPU).
    A message larger than an inbox flows through it in chunks. ``block_bytes`` (default 16 KiB,
    4 KiB on the cpu backend; a power of two dividing ``chunk_bytes``): what one program moves at a
    time. ``grid``: most programs per send or receive (default: the device's SMs shared out among
    a send and a receive of every rank on it, or of the ``IRIS_GPU_RANKS`` ranks of every job
    sharing it where that is more; the ranks agree on the smallest). More sends and receives in
    flight at once per rank (``isend``/``irecv`` on several tags or peers) each hold that many
    programs while they wait for their peers: pass a smaller ``grid`` for those.

    Calling it again frees the mailboxes and allocates new ones (every rank, once no message is in
    flight), with fresh counters; so does ``ccl.clear_workspaces`` followed by ``init_p2p``.

    ``group``: an :class:`iris.runtime.Group` of ``ctx`` (``ctx.new_group``): the group's own
    mailboxes, for the ``send``/``recv`` calls given ``group=`` (``W`` the group's size), carved
    from the group's workspace arena; collective over the group's members only. A group's
    messages never meet another group's or the context's. The arena must hold
    ``heap_bytes(group.size)`` besides the group's other workspaces (``workspace_size=`` of
    ``new_group``; the GPU defaults need more than its default 16 MiB, so pass a larger one or
    smaller ``slots``/``chunk_bytes``/``tags``)."""
    call = "iris.collectives.ccl.init_p2p"
    if group is not None:
        ctx = on_group(ctx, group, call)
    defaults = DEFAULTS["cuda" if ctx.device.type == "cuda" else "cpu"]
    tags = _positive(call, "tags", tags)
    slots = _positive(call, "slots", defaults["slots"] if slots is None else slots)
    chunk_bytes = _positive(call, "chunk_bytes", defaults["chunk_bytes"] if chunk_bytes is None else chunk_bytes,
                            power_of_two=True)
    block_bytes = _positive(call, "block_bytes",
                            min(defaults["block_bytes"], chunk_bytes) if block_bytes is None else block_bytes,
                            power_of_two=True)
    if block_bytes < _WIDEST * 2 or block_bytes > chunk_bytes:
        raise IrisUsageError(f"{call}: block_bytes={block_bytes} must be at least {2 * _WIDEST} and at most "
                             f"chunk_bytes={chunk_bytes}")
    grid = _positive(call, "grid", _default_grid(ctx) if grid is None else grid)
    num_warps = _positive(call, "num_warps", num_warps, power_of_two=True)
    mine = P2PSettings(tags, slots, chunk_bytes, block_bytes, grid, num_warps)
    # the call agreement on the settings the ranks must share (not the grid: each rank's default),
    # on every call: what follows is another host exchange, where a rank whose agreement was cached
    # would meet a rank that agrees on something new
    agree(ctx, call, (), always=True, **{k: v for k, v in dataclasses.asdict(mine).items() if k != "grid"})
    everyone = [P2PSettings(*values) for values in ctx.allgather(dataclasses.astuple(mine), f"{call}()")]
    for rank, theirs in enumerate(everyone):  # the grid may differ (each rank's default): the smallest counts
        if dataclasses.replace(theirs, grid=0) != dataclasses.replace(everyone[0], grid=0):
            raise IrisUsageError(f"{call}: rank 0 passed {_describe(everyone[0])} but rank {rank} "
                                 f"{_describe(theirs)}; pass the same settings on every rank")
    settings = dataclasses.replace(mine, grid=min(t.grid for t in everyone))  # both ends launch the same grid
    if _workspace.lookup(ctx, MAILBOXES) is not None:
        ctx.barrier()  # no rank's message is still moving through the old mailboxes
        _workspace.drop(ctx, MAILBOXES)
    W = ctx.world_size
    channels = max(1, (W - 1) * tags)

    def make(ctx):
        made = {}
        try:
            made["inbox"] = ctx.zeros(channels * slots * chunk_bytes, dtype=torch.uint8)
            made["headers"] = ctx.zeros(channels * slots * settings.grid * RECORD_WORDS, dtype=torch.int64)
            made["requests"] = ctx.zeros(channels * settings.grid * RECORD_WORDS, dtype=torch.int64)
            made["counters"] = ctx.zeros(channels * COUNTERS * settings.grid, dtype=torch.int32)
        except HeapExhaustedError as exc:
            if group is None:
                raise
            for t in made.values():  # every member alike: the arena is left as it was
                ctx.free(t)
            raise HeapExhaustedError(
                f"{call}(group={ctx!r}): the group's mailboxes need {settings.heap_bytes(W)} bytes "
                f"({_describe(settings)}, grid={settings.grid}), more than its workspace arena has free; pass "
                f"a larger workspace_size= to ctx.new_group(), or fewer tags, slots or chunk_bytes") from exc
        return made

    ws = _workspace.workspace(ctx, MAILBOXES, make)  # waits for every rank's zero fill
    ws.meta["settings"] = settings
    return settings


def p2p_settings(ctx) -> P2PSettings | None:
    """The settings of ``ctx``'s point-to-point mailboxes (:func:`init_p2p`), or None while it has
    none. Local: no rank waits."""
    ws = _workspace.lookup(ctx, MAILBOXES)
    return None if ws is None else ws.meta["settings"]


def _describe(settings: P2PSettings) -> str:
    return ", ".join(f"{f.name}={getattr(settings, f.name)}" for f in dataclasses.fields(P2PSettings)
                     if f.name != "grid")


def _mailboxes(ctx, call: str):
    ws = _workspace.lookup(ctx, MAILBOXES)
    if ws is None and isinstance(ctx, Group):
        raise IrisUsageError(f"{call}: {ctx!r} has no point-to-point mailboxes of its own; call "
                             f"iris.collectives.ccl.init_p2p(ctx, group=group) once on every member of the group "
                             f"first (collective over the group: it carves them from the group's arena)")
    if ws is None:
        raise IrisUsageError(f"{call}: this context has no point-to-point mailboxes; call "
                             f"iris.collectives.ccl.init_p2p(ctx) once on every rank first (collective: it "
                             f"allocates them on the heap), and again after ccl.clear_workspaces(ctx)")
    return ws, ws.meta["settings"]


#: Registrations a large message can use in place (the first of ``ctx.registrations``; a tensor in a
#: later one moves through the inbox).
REGISTERED_TABLE_ROWS = 64
# context -> (registrations generation, its table): every registered tensor of the context, every
# rank's address of it in this process, for the direct copy of a large message (direct_copy_kernel)
_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _registered_table(ctx) -> torch.Tensor:
    """The context's table of registered tensors on its device: row ``i`` holds every rank's address
    (in this process) of the tensor of ``ctx.registrations[i]``, zeros where none. Rebuilt when a
    registration is made or closed (plans are then made again too: ``_launch`` keys them by the
    registrations' generation), never while a kernel may read it: closing one waits for the
    device."""
    generation = ctx.registrations_generation
    kept = _TABLES.get(ctx)
    if kept is not None and kept[0] == generation:
        return kept[1]
    rows = torch.zeros(REGISTERED_TABLE_ROWS, ctx.world_size, dtype=torch.int64)
    for i, registration in enumerate(ctx.registrations[:REGISTERED_TABLE_ROWS]):
        rows[i] = torch.tensor(registration.addresses, dtype=torch.int64)
    table = rows.to(ctx.device)
    _TABLES[ctx] = (generation, table)
    return table


def location(ctx, tensor) -> int:
    """Where the peer reaches ``tensor`` for a large message's single copy (the record's location
    word, :mod:`._p2p_kernels`): in one of the first ``REGISTERED_TABLE_ROWS`` registrations (first:
    a registered heap tensor need not be at the same offset on every rank), else its heap offset in
    elements, else ``NOWHERE``."""
    esize = tensor.element_size()
    registration = ctx.registration_of(tensor)
    if registration is not None:
        index = ctx.registrations.index(registration)
        if index < REGISTERED_TABLE_ROWS:
            return registered_location(index, (tensor.data_ptr() - registration.addresses[ctx.rank]) // esize)
    if ctx.is_symmetric(tensor):
        return ctx.offset_of(tensor) // esize
    return NOWHERE.value


def peer_index(rank: int, owner: int) -> int:
    """Where ``rank``'s channels sit among those of ``owner`` (its peers in rank order, itself left out)."""
    return rank - (rank > owner)


def _channel(ws, s: P2PSettings, index: int, tag: int, dtype: torch.dtype):
    """The inbox (as ``dtype``), slot records, request records and counter arrays of channel
    ``(index, tag)`` of ``ws``'s layout: per channel ``slots * chunk_bytes`` of inbox, ``slots *
    grid`` records and ``grid`` requests of ``RECORD_WORDS`` int64, ``COUNTERS * grid`` counters."""
    c = index * s.tags + tag
    span = s.slots * s.chunk_bytes
    inbox = ws.buffers["inbox"][c * span:(c + 1) * span].view(dtype)
    records = s.slots * s.grid * RECORD_WORDS
    headers = ws.buffers["headers"][c * records:(c + 1) * records]
    requests = ws.buffers["requests"][c * s.grid * RECORD_WORDS:(c + 1) * s.grid * RECORD_WORDS]
    counters = ws.buffers["counters"][c * COUNTERS * s.grid:(c + 1) * COUNTERS * s.grid].view(COUNTERS, s.grid)
    return inbox, headers, requests, counters


# --- one call's plan ---------------------------------------------------------------------------------

def _plan(ctx, key, direction: str, tensor, peer_arg, tag):
    """The launch of a send or recv of ``tensor`` with peer ``peer_arg`` (a rank of the call's
    group) and ``tag``, checked; called as ``plan(tensor)`` (the whole message) or ``plan(tensor,
    first, stop)`` (chunks ``first .. stop - 1``)."""
    call = f"iris.collectives.ccl.{direction}"
    what = "dst" if direction == "send" else "src"
    ws, s = _mailboxes(ctx, call)
    _checks.check_tensor(call, ctx, "tensor", tensor)
    peer = _ranks.global_rank(ctx, peer_arg, call, what)
    if peer == ctx.rank:
        raise IrisUsageError(f"{call}: {what}={peer_arg} is this rank; a message needs another rank (copy the "
                             f"tensor locally instead)")
    if isinstance(tag, bool) or not isinstance(tag, int) or not 0 <= tag < s.tags:
        raise IrisUsageError(f"{call}: tag={tag!r} is not one of the {s.tags} tags the mailboxes have (0 .. "
                             f"{s.tags - 1}); pass one of them, or more tags to ccl.init_p2p(ctx, tags=...)")
    esize, n = tensor.element_size(), tensor.numel()
    chunk, block = s.chunk_bytes // esize, s.block_bytes // esize
    chunks = -(-n // chunk)
    grid = min(s.grid, -(-min(chunk, n) // block))  # a function of the message: the same on both ends
    header = message_header(n, str(tensor.dtype).removeprefix("torch."))
    # large: more than an inbox holds, decided by each end from its own size (the same when the
    # sizes agree; when they do not, the headers differ and the offer is refused)
    large = n * esize > s.slots * s.chunk_bytes
    units = chunks + 1 if large else chunks  # a large message's offer, then its chunks
    me, dtype = ctx.rank, tensor.dtype
    if direction == "send":
        # the receiver's inbox, records and ready (this rank's addresses of them); this rank's credit,
        # count, requests, posted word and mode
        inbox, headers, _, receiver = _channel(ws, s, peer_index(me, peer), tag, dtype)
        _, _, requests, mine = _channel(ws, s, peer_index(peer, me), tag, dtype)
        ready, credit, counted, kernel = receiver[READY], mine[CREDIT], mine[SENT], send_kernel
        posted, mode = mine[POSTED], mine[SEND_MODE]
    else:
        # this rank's inbox, records, ready, count and mode; the sender's credit, requests and posted word
        inbox, headers, _, mine = _channel(ws, s, peer_index(peer, me), tag, dtype)
        _, _, requests, sender = _channel(ws, s, peer_index(me, peer), tag, dtype)
        ready, credit, counted, kernel = mine[READY], sender[CREDIT], mine[RECEIVED], recv_kernel
        posted, mode = sender[POSTED], mine[RECV_MODE]
    context = ctx.get_device_context()
    constexprs = dict(BLOCK=block)
    if large:
        # where the peer reaches this rank's tensor (heap offsets in elements: tensors and the inbox
        # are aligned to their dtype), and the registered tensors the peer's location may name
        offset = location(ctx, tensor)
        inbox_offset = ctx.offset_of(inbox) // esize
        registered = _registered_table(ctx)
        kernel = send_large_kernel if direction == "send" else recv_large_kernel
        most = ctx.get_cu_count() * DIRECT_PROGRAMS_PER_SM if ctx.device.type == "cuda" else s.grid
        copy_grid = max(1, min(-(-n // block), most))

    def args(t, first, stop, post=1):
        if not large:
            extra = () if direction == "send" else (requests, posted)
            return (context, t, inbox, headers, ready, credit, counted, *extra, n, header, chunk, s.slots, s.grid,
                    first, stop, peer, tag, me)
        head = (context, t, inbox, headers, ready, credit, counted, requests, posted, mode, n, header, units, chunk,
                s.slots, s.grid, first, stop)
        return (*head, offset, peer, tag, me) if direction == "send" else (*head, post, offset, peer, tag, me)

    cfg = Config(num_warps=s.num_warps)
    run = _launch.launcher(ctx, ws, kernel, grid, grid, cfg, args(tensor, 0, units), constexprs, fixed_grid=grid)
    # a large message's single copy, then its signal to the peer (both no-ops where it moves otherwise)
    copy_run = done_run = None
    if large:
        def copy_args(t, stop):
            return (context, t, inbox, headers, requests, counted, mode, registered, n, s.slots, s.grid, stop,
                    inbox_offset, ctx.world_size, peer, me)

        def done_args(t, first, stop):
            return (context, ready, credit, counted, mode, units, first, stop, peer, tag, me)

        send_side = dict(SEND=direction == "send")
        copy_run = _launch.launcher(ctx, ws, direct_copy_kernel, copy_grid, copy_grid, cfg, copy_args(tensor, units),
                                    dict(send_side, DIRECT_BLOCK=block), fixed_grid=copy_grid)
        done_run = _launch.launcher(ctx, ws, direct_done_kernel, grid, grid, cfg, done_args(tensor, 0, units),
                                    send_side, fixed_grid=grid)

    def launch(t, first, stop, post=1):
        try:
            run(*args(t, first, stop, post))
            if large and first == 0 and stop > 0:  # the step that holds the rendezvous: the copy
                copy_run(*copy_args(t, stop))
            if large and ((first == 0 and stop > 0) or stop == units):  # and its signal; a pull's last wait
                done_run(*done_args(t, first, stop))
        except Exception as exc:
            _raise_iris_error_within(exc)
            raise

    steps = (run, copy_run, done_run) if large else (run,)

    def plan(t, first=0, stop=units):
        if first == 0 and stop == units and all(step.fast is not None for step in steps):
            for step in steps:  # the whole message: every argument fixed by the key
                step.fast(t, t)
            return
        # a large receive's steps of a batch (cpu backend) post no request: plan.post did, before them
        launch(t, first, stop, 1 if first == 0 and stop == units else 0)

    def post(t):
        """A large receive's request alone (its steps follow with ``plan(t, first, stop)``)."""
        launch(t, 0, 0, 1)

    plan.chunks, plan.slots, plan.post = units, s.slots, post if large and direction == "recv" else None
    return plan


def _raise_iris_error_within(exc: BaseException) -> None:
    # Triton's interpreter wraps what a kernel raises (a size mismatch) in its own errors: raise
    # the library's error itself, which callers can catch by its class.
    cause = exc
    while cause is not None and not isinstance(cause, IrisError):
        cause = cause.__cause__
    if cause is not None and cause is not exc:
        raise cause.with_traceback(None) from None


def _planned(ctx, direction: str, tensor, peer, tag):
    key = _launch.call_key((direction, peer, tag), None, tensor, tensor)
    plan = _launch.lookup(ctx, key) if key is not None else None
    if plan is None:
        plan = _launch.plan_for(ctx, key, lambda: _plan(ctx, key, direction, tensor, peer, tag))
    return plan


# --- streams -------------------------------------------------------------------------------------------

class _Streams:
    """A context's side streams for non-blocking calls, one per (direction, peer, tag), and the
    event of the last non-blocking call of each (with whether it was made while capturing a CUDA
    graph), which a blocking call of the same channel orders its stream after."""

    def __init__(self):
        self.streams: dict[tuple, torch.cuda.Stream] = {}
        self.pending: dict[tuple, tuple] = {}


_STREAMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class Work:
    """A non-blocking point-to-point call in flight (``torch.distributed``'s ``Work``, for streams).

    ``wait()`` makes torch's current stream wait for the message (the host does not wait; inside a
    CUDA graph capture, it joins the side stream back); ``is_completed()`` asks without waiting.
    On the cpu backend every call has completed when it returns."""

    def __init__(self, event=None, device=None):
        self._event, self._device = event, device

    def wait(self, timeout=None) -> bool:
        """Order torch's current stream after the message; returns True. ``timeout`` is accepted
        for ``torch.distributed``'s signature and ignored (the watchdog bounds every wait)."""
        if self._event is not None:
            torch.cuda.current_stream(self._device).wait_event(self._event)
        return True

    def is_completed(self) -> bool:
        """Whether the message has moved (its kernel has finished)."""
        return self._event is None or self._event.query()


def _order_after_pending(ctx, channel: tuple) -> None:
    # A blocking call after a non-blocking one of the same channel: the current stream waits for it.
    streams = _STREAMS.get(ctx)
    if streams is None or channel not in streams.pending:
        return
    event, captured = streams.pending[channel]
    capturing = torch.cuda.is_current_stream_capturing()
    if captured == capturing:  # an event of another capture (or of none) cannot be waited for here
        torch.cuda.current_stream(ctx.device).wait_event(event)
        del streams.pending[channel]


def _blocking(ctx, direction: str, tensor, peer, tag) -> None:
    plan = _planned(ctx, direction, tensor, peer, tag)
    if ctx.device.type == "cuda":
        _order_after_pending(ctx, (direction, peer, tag))
    plan(tensor)


def _start(ctx, direction: str, tensor, peer, tag, plan=None) -> Work:
    plan = plan or _planned(ctx, direction, tensor, peer, tag)
    return _start_all([(ctx, (direction, peer, tag), tensor, plan)])[0]


def _start_all(items) -> list[Work]:
    # ``items``: (ctx, channel, tensor, plan), each on the side stream of its channel, in three
    # passes: every side stream waits for the current stream, then every kernel is launched, then
    # every completion event is recorded. Streams share the GPU's hardware work queues (fewer per
    # process under MPS, whose clients share one pool): in a shared queue, a wait or an event
    # record behind a send that spins for its receiver holds back what follows it, the receive
    # of the same batch among them. With no such command between them, a batch's kernels start
    # side by side.
    if items[0][0].device.type != "cuda":
        for _, _, tensor, plan in items:
            plan(tensor)  # the interpreter runs the kernel now
        return [Work() for _ in items]
    device = items[0][0].device
    sides = []  # per item: its context's streams and its side stream
    for ctx, channel, _, _ in items:
        streams = _STREAMS.get(ctx)
        if streams is None:
            streams = _STREAMS[ctx] = _Streams()
        if channel not in streams.streams:
            streams.streams[channel] = torch.cuda.Stream(ctx.device)
        sides.append((streams, streams.streams[channel]))
    produced = torch.cuda.Event()
    produced.record(torch.cuda.current_stream(device))  # the tensors' producers, once for the batch
    for _, side in sides:
        side.wait_event(produced)
    for (_, side), (_, _, tensor, plan) in zip(sides, items):
        with torch.cuda.stream(side):
            plan(tensor)
    capturing = torch.cuda.is_current_stream_capturing()
    works = []
    for (streams, side), (_, channel, tensor, _) in zip(sides, items):
        if not capturing:
            tensor.record_stream(side)  # the caching allocator keeps it until the side stream is past it
        event = torch.cuda.Event()
        event.record(side)
        streams.pending[channel] = (event, capturing)
        works.append(Work(event, device))
    return works


# --- the calls -----------------------------------------------------------------------------------------

def send(ctx, tensor: torch.Tensor, dst: int, tag: int = 0, group=None) -> None:
    """Send ``tensor`` to rank ``dst``, where a ``recv`` with this rank as ``src`` and the same
    ``tag`` takes it; enqueued on torch's current stream.

    ``tensor``: contiguous, on the context's device, fp32, fp64, fp16, bf16, int32 or int64, any
    size (a message larger than an inbox waits for its receiver: the sender's kernel meets the
    receiver's, then the message is copied once, straight from ``tensor`` or into the receiver's,
    where either is on the symmetric heap, else it flows through the inbox in chunks). It need not
    be on the heap. The receiver's tensor must have as many
    elements and the same dtype, else the receiver fails with :class:`IrisMessageSizeError` (the
    watchdog's report on the GPU). The send and its recv may be called in either order, from any
    stream; sends of one ``dst`` and ``tag`` pair up with that rank's recvs in the order made.
    ``tag``: ``0 .. tags - 1`` of :func:`init_p2p`. Not collective: only ``dst`` takes part.

    ``group``: an :class:`iris.runtime.Group` of ``ctx`` whose mailboxes ``init_p2p(ctx,
    group=group)`` made: the message goes through the group's mailboxes, and ``dst`` is a *group*
    rank (its place in ``group.ranks``), as rank and size mean the group's in every call on a
    group (``torch.distributed.send`` takes global ranks with a group instead). A send on a group
    pairs only with a ``recv`` on the same group, whatever the tags. None: the context.
    """
    if group is not None:
        ctx = on_group(ctx, group, "iris.collectives.ccl.send")
    if is_compiling():
        return traced().send(ctx, tensor, dst, tag)
    _blocking(ctx, "send", tensor, dst, tag)


def recv(ctx, tensor: torch.Tensor, src: int, tag: int = 0, group=None) -> torch.Tensor:
    """Receive into ``tensor`` the message that rank ``src`` sends with ``tag``; returns ``tensor``.
    Enqueued on torch's current stream: work enqueued after it sees the data. See :func:`send`;
    ``tensor`` need not be on the heap. ``group``: as for :func:`send` (``src`` a group rank)."""
    if group is not None:
        ctx = on_group(ctx, group, "iris.collectives.ccl.recv")
    if is_compiling():
        return traced().recv(ctx, tensor, src, tag)
    _blocking(ctx, "recv", tensor, src, tag)
    return tensor


def isend(ctx, tensor: torch.Tensor, dst: int, tag: int = 0, group=None) -> Work:
    """:func:`send` on a stream of its own for ``(dst, tag)`` (after the work the current stream
    holds now), so that it can progress beside a receive or other tags; returns a :class:`Work`
    whose ``wait()`` orders the current stream after it. Keep ``tensor`` unchanged until then.
    ``group``: as for :func:`send` (``dst`` a group rank; the group's own side streams)."""
    if group is not None:
        ctx = on_group(ctx, group, "iris.collectives.ccl.isend")
    return _start(ctx, "send", tensor, dst, tag)


def irecv(ctx, tensor: torch.Tensor, src: int, tag: int = 0, group=None) -> Work:
    """:func:`recv` on a stream of its own for ``(src, tag)``; returns a :class:`Work` whose
    ``wait()`` orders the current stream after the data has arrived in ``tensor``. ``group``: as
    for :func:`send` (``src`` a group rank)."""
    if group is not None:
        ctx = on_group(ctx, group, "iris.collectives.ccl.irecv")
    return _start(ctx, "recv", tensor, src, tag)


@dataclasses.dataclass(frozen=True)
class P2POp:
    """One operation of :func:`batch_isend_irecv`: ``op`` is ``ccl.isend`` or ``ccl.irecv`` (or
    ``ccl.send`` / ``ccl.recv``, or the strings ``"send"`` / ``"recv"``), like
    ``torch.distributed.P2POp(op, tensor, peer, tag=tag, group=group)``. ``group``: as for
    :func:`send` (``peer`` is then a group rank); the operations of one batch may be on different
    groups."""

    op: object
    tensor: torch.Tensor
    peer: int
    tag: int = 0
    group: object = None


def _direction(op) -> str | None:
    if op in (isend, send, "send", "isend"):
        return "send"
    if op in (irecv, recv, "recv", "irecv"):
        return "recv"
    return None


def batch_isend_irecv(ctx, ops) -> list[Work]:
    """Start every send and receive of ``ops`` (a list of :class:`P2POp`) so that they progress
    together; returns their :class:`Work` handles in order (``torch.distributed``'s
    ``batch_isend_irecv``). Use it for exchanges in which every rank sends and receives messages
    larger than an inbox (a ring shift, a pipeline's 1F1B steady state): on the GPU each runs on
    its stream (as :func:`isend` / :func:`irecv`); on the cpu backend, where calls run one after
    another, the batch moves every message an inbox at a time, by turns. Every operation is
    checked before any starts. Operations of one peer, tag and direction run in list order."""
    call = "iris.collectives.ccl.batch_isend_irecv"
    if not isinstance(ops, (list, tuple)) or not ops:
        raise IrisUsageError(f"{call}: ops={ops!r} must be a non-empty list of iris.collectives.ccl.P2POp")
    planned = []
    for i, item in enumerate(ops):
        direction = _direction(getattr(item, "op", None)) if isinstance(item, P2POp) else None
        if direction is None:
            raise IrisUsageError(f"{call}: ops[{i}]={item!r} is not a P2POp(op, tensor, peer, tag) whose op is "
                                 f"ccl.isend or ccl.irecv")
        on = ctx if item.group is None else on_group(ctx, item.group, f"{call}(ops[{i}])")
        planned.append((direction, item, _planned(on, direction, item.tensor, item.peer, item.tag), on))
    if ctx.device.type == "cuda":
        return _start_all([(on, (d, op.peer, op.tag), op.tensor, plan) for d, op, plan, on in planned])
    _interleave(planned)
    return [Work() for _ in planned]


def _interleave(planned) -> None:
    # The cpu backend: each channel's operations in list order, every channel moving up to an
    # inbox's worth of units per turn; in a turn, first the requests of the large receives that
    # start, then the sends, then the receives. A send of a turn only waits for credits that the
    # peer gave in its previous turns, for requests it posted at the start of this turn, and (a
    # pulled large message's last step) for the pull it made in an earlier turn; a receive waits
    # for what the peer sends in this turn. Every wait is for a step the peer makes before the
    # waiting one, so two ranks exchanging messages of any size in batches never wait on each
    # other. Both ends of a message take the same turns: the units follow from the size alone.
    queues: dict[tuple, list] = {}
    for direction, op, plan, on in planned:  # a channel: the group (or context), direction, peer and tag
        queues.setdefault((id(on), direction, op.peer, op.tag), []).append([plan, op.tensor, 0])
    while queues:
        for queue in queues.values():
            plan, tensor, first = queue[0]
            if plan.post is not None and first == 0:
                plan.post(tensor)
        for direction in ("send", "recv"):
            for channel in [c for c in queues if c[1] == direction]:
                head = queues[channel][0]
                plan, tensor, first = head
                stop = min(first + plan.slots, plan.chunks)
                plan(tensor, first, stop)
                head[2] = stop
                if stop == plan.chunks:
                    queues[channel].pop(0)
                    if not queues[channel]:
                        del queues[channel]


__all__ = ["MESSAGE_DTYPES", "P2POp", "P2PSettings", "Work", "batch_isend_irecv", "init_p2p", "irecv", "isend",
           "recv", "send"]
