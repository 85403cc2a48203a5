"""Groups of ranks: a subset of a context's ranks that makes collective calls of its own.

A :class:`Group` is a view of its context: the same symmetric heap, its own numbering (the order
of the list given to :meth:`Iris.new_group`, as ``MPI_Group_incl``), and what a collective call
needs of a context, for the group alone:

- a context tensor of its own (``iris.device._layout``): the group rank and size, the members'
  heap bases in group order, the context's trailer words, and ``call_words_offset`` pointing at
  the group's own call-agreement words; then the members' global ranks in group order. Kernels
  written for a context (rank arithmetic over ``DeviceContext.initialize(context, rank,
  world_size)``, translation through ``heap_bases``) therefore run unchanged on a group, with
  group ranks; a kernel that keeps the context's global ranks takes the group as
  ``iris.device.DeviceGroup.initialize(group_context, group.rank, group.size)`` and passes it as
  ``group=`` to the tile collectives;
- an arena: heap memory that every rank of the context allocates when the group is made (the
  heap's offsets stay the same on every rank only while every rank makes the same allocations),
  from which the group's members carve the group's workspaces (flags, staging buffers) in the
  same order, so that they sit at the same offset on every member and no two groups share a
  flag, however their members overlap;
- a host communicator of its members, for its agreement on calls, its barrier and the
  allgathers that plans make: an MPI communicator (``MPI_Comm_split``) under the MPI bootstrap,
  a gloo group of the members (made from the default group's store) under torch's.

``iris.collectives`` takes a group where it takes a context (``group=``).
"""

from __future__ import annotations

import socket
import uuid

import torch

from iris.device import _layout as layout

from ._agreement import CallAgreement
from ._errors import GroupError, HeapExhaustedError, RankError
from ._host_waits import HostWaits, NodeBoard, WatchedBootstrap
from ._reach import RegistrationCache
from ._registration import close_among
from ._uids import new_uid

#: Bytes of heap each group reserves for its workspaces unless ``workspace_size=`` says otherwise.
DEFAULT_WORKSPACE_SIZE = 16 << 20
#: Alignment of the buffers carved from an arena (the heap's own allocation alignment).
_ALIGN = layout.HEAP_BASE_ALIGNMENT


def check_ranks(ctx, ranks, call: str) -> tuple[int, ...]:
    """``ranks`` as a tuple of ints, checked on this rank: each in ``[0, ctx.world_size)``,
    none twice, at least one."""
    try:
        ranks = tuple(ranks)
    except TypeError:
        raise GroupError(f"{call}: ranks={ranks!r} is not a list of ranks; pass the global ranks of the group, "
                         f"e.g. [0, 1]") from None
    if not ranks:
        raise GroupError(f"{call}: the list of ranks is empty; pass at least one rank of [0, {ctx.world_size})")
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < ctx.world_size:
            raise RankError(f"{call}: rank {r!r} is not a rank of the context, whose ranks are [0, "
                            f"{ctx.world_size}); pass ranks 0 .. {ctx.world_size - 1}")
    seen = set()
    for r in ranks:
        if r in seen:
            raise GroupError(f"{call}: rank {r} is listed twice in {list(ranks)}; list each rank of the group once")
        seen.add(r)
    return ranks


def check_same_everywhere(ctx, ranks: tuple, lists: list, call: str) -> None:
    """Raise :class:`GroupError` on every rank when the ranks of the context passed different
    lists (``lists``: every rank's, from one allgather)."""
    differ = [r for r, other in enumerate(lists) if other != lists[0]]
    if differ:
        shown = "; ".join(f"rank {r}: {other!r}" for r, other in enumerate(lists))
        raise GroupError(f"{call}: the ranks passed different lists ({shown}); every rank of the context must pass "
                         f"the same list, in the same order (the order numbers the group's ranks)")


def check_group(ctx, group, call: str):
    """``group`` if it is a :class:`Group` of ``ctx``, else :class:`GroupError` naming ``call``."""
    if not isinstance(group, Group):
        raise GroupError(f"{call}: group={group!r} is not a group; pass one that ctx.new_group(ranks) returned "
                         f"(None: every rank)")
    if group.ctx is not ctx:
        raise GroupError(f"{call}: {group!r} is a group of another context; pass a group of this context (made by "
                         f"its new_group)")
    return group


class Group:
    """A group of a context's ranks (see the module docstring), made by :meth:`Iris.new_group`.

    Attributes: ``ctx`` (the context), ``ranks`` (the members' global ranks, in group order),
    ``rank`` (this rank's place in ``ranks``), ``size`` and its alias ``world_size``, ``device``,
    ``uid`` (an int naming the group in this process, as a context's ``uid``).
    Pass it as ``group=`` to the calls of ``iris.collectives.ccl``: inside the call, ranks and
    sizes are the group's. Only members hold one (a non-member gets None)."""

    def __init__(self, ctx, ranks: tuple, boot, arena: torch.Tensor, ranks_on_device: int):
        self.ctx, self.ranks = ctx, ranks
        self.rank, self.size = ranks.index(ctx.rank), len(ranks)
        self.world_size = self.size
        self.device, self.backend, self.heap_size = ctx.device, ctx.backend, ctx.heap_size
        #: Members that share this rank's device (this one included): what sizes resident grids.
        self.ranks_on_device = ranks_on_device
        #: The members' host communicator: an mpi4py communicator (MPI bootstrap), or under the
        #: torch bootstrap an object with its lowercase object collectives over a gloo group.
        self.comm = boot.comm
        # The group's host collectives are not noted on the context's board of host waits
        # (iris.runtime._host_waits): the board numbers every rank's host collectives in one
        # sequence and ends the job when two ranks sit in different kinds of collective with the
        # same number, which members and non-members of a group legitimately do. The group has a
        # board of its own, of its members on this node, which the context's watchdog thread
        # reads as it reads the context's: a group's host waits have the same deadline, "still
        # waiting" line and mismatch report, among its members.
        watchdog = ctx._watchdog
        if ctx._host_waits is not None and watchdog is not None:
            board = NodeBoard(boot)
            node = boot.node_allgather((ctx.rank, boot.local_rank))
            self._host_waits = HostWaits(board, ctx.rank, self.size, [tuple(p) for p in node],
                                         scope=f"group {list(ranks)}")
            watchdog.watch_host_waits(self._host_waits)
            boot = WatchedBootstrap(boot, self._host_waits)
        else:
            self._host_waits = ctx._host_waits
        self._boot = boot
        self._calls = CallAgreement(self)
        # The arena's last bytes hold the group's call words (``call_words_offset``: not the
        # context's, which are in the signal pad), the bytes before them the flags of the ring
        # all-reduce on the group (``GROUP_RING_BYTES``, never reset: running totals); the rest
        # is carved into workspaces from the front.
        self._arena = arena
        self._words_at = arena.numel() - layout.CALL_WORDS_BYTES
        self._free_end = self._words_at - layout.GROUP_RING_BYTES
        self._next, self._live = 0, 0
        self._context = self._build_context()
        # Registrations made on the fly among the members (reach): the context's heap seen in
        # group order, this rank's heap base, and serials of the group's own
        self._heap = _GroupHeap(ctx._heap, ranks)
        self._base = ctx._base
        self._registrations: list = []  # none made with ctx.register: those are the context's
        self._serials = 0
        self._reach_cache: RegistrationCache | None = None
        #: An int naming this group in this process (never reused; ``context_of_uid`` finds it),
        #: from the contexts' counter: torch operators name a group by it as they name a context.
        self.uid = new_uid(self)

    @property
    def _closed(self) -> bool:
        # a group lives as long as its context is open
        return self.ctx._closed

    # --- what a collective call reads from a context -----------------------------------------
    def _build_context(self) -> torch.Tensor:
        words = self.ctx.get_device_context().detach().to("cpu")
        W = self.ctx.world_size
        trailer = words[layout.HEAP_BASES + W:]
        bases = words[layout.HEAP_BASES:layout.HEAP_BASES + W][list(self.ranks)]
        header = torch.tensor([self.rank, self.size], dtype=torch.int64)
        members = torch.tensor(self.ranks, dtype=torch.int64)  # layout.GROUP_RANKS: DeviceGroup.global_rank
        context = torch.cat([header, bases, trailer.clone(), members])
        context[layout.HEAP_BASES + self.size + layout.CALL_WORDS_OFFSET] = self.ctx.offset_of(self._arena) + \
            self._words_at
        context[layout.HEAP_BASES + self.size + layout.CALL_COUNTER] = 0  # the group's calls, from its first
        return context.to(self.device)

    def get_device_context(self) -> torch.Tensor:
        """The group's context tensor (``DeviceContext.initialize(context, group.rank, group.size)``
        or ``iris.device.DeviceGroup.initialize(context, group.rank, group.size)``): the group
        rank and size, the members' heap bases in group order, the context's trailer (its
        watchdog words; its tracing words, which ``ctx.tracing`` keeps up to date) and the
        group's call words, then the members' global ranks in group order."""
        return self._context

    def get_heap_bases(self) -> torch.Tensor:
        """The members' heap bases, in group order (a view into :meth:`get_device_context`)."""
        return self._context[layout.HEAP_BASES:layout.HEAP_BASES + self.size]

    def get_rank(self) -> int:
        """This rank's rank in the group."""
        return self.rank

    def get_num_ranks(self) -> int:
        """Members of the group."""
        return self.size

    def global_rank(self, group_rank: int) -> int:
        """The context's rank of the member ``group_rank``."""
        return self.ranks[self.check_rank(group_rank, "Group.global_rank()")]

    def check_rank(self, rank, call: str) -> int:
        """``rank`` if it is a group rank (an int in ``[0, size)``), else :class:`RankError`."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.size:
            raise RankError(f"{call}: rank {rank!r} is outside the group's ranks [0, {self.size}) (group ranks, "
                            f"the place in {list(self.ranks)}); pass 0 .. {self.size - 1}")
        return rank

    def get_cu_count(self) -> int:
        """:meth:`Iris.get_cu_count` (the device's: a group shares it)."""
        return self.ctx.get_cu_count()

    def agree_call(self, signature, describe, call: str, always: bool = False) -> int:
        """:meth:`Iris.agree_call` among the members (the group's own agreements)."""
        from iris.device import _calls as device_calls

        if not device_calls.CHECK_CALLS.value:
            return 0
        return self._calls.agree(signature, describe, call, always)

    def host_call(self, label: str):
        """:meth:`Iris.host_call`."""
        return self._host_waits.label(label)

    def resident_grid(self, num_work: int, compiled=None) -> int:
        """:meth:`Iris.resident_grid` agreed among the members (collective over the group)."""
        from ._residency import gpu_sharers, resident_grid

        mine = num_work if self.device.type != "cuda" else resident_grid(
            compiled, num_work, self.device, max(self.ctx.ranks_on_device, gpu_sharers()))
        with self._host_waits.label("iris.runtime.Group.resident_grid()"):
            return self._boot.allreduce(mine, "min")

    def barrier(self) -> None:
        """Wait for this rank's device work, then for every member (a host barrier of the group)."""
        ctx = self.ctx
        ctx._heap.complete_remote_writes()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        ctx._watchdog.check("Group.barrier()")
        with self._host_waits.label("iris.runtime.Group.barrier()", synced=True):
            self._boot.barrier()

    def allgather(self, obj, call: str = "iris.runtime.Group.allgather()") -> list:
        """Every member's ``obj`` (picklable), in group order (a host collective of the group)."""
        with self._host_waits.label(call):
            return self._boot.allgather(obj)

    # --- heap: the context's, with the group's workspaces carved from its arena -----------------
    def zeros(self, *size, dtype=None) -> torch.Tensor:
        """Zeros from the group's arena (for workspaces: every member makes the same calls in the
        same order, so each buffer sits at the same heap offset on every member)."""
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
        dtype = dtype or torch.float32
        n = 1
        for d in shape:
            n *= d
        nbytes = n * torch.empty((), dtype=dtype).element_size()
        start = -(-self._next // _ALIGN) * _ALIGN
        if start + nbytes > self._free_end:
            raise HeapExhaustedError(
                f"iris.runtime.Group{list(self.ranks)}: a workspace of {nbytes} bytes does not fit in the group's "
                f"{self._free_end - start} free bytes of {self._free_end}; pass a larger workspace_size= to "
                f"ctx.new_group()")
        self._next, self._live = start + nbytes, self._live + 1
        raw = self._arena[start:start + nbytes]
        # detached: no autograd view of the arena. A view made in no-grad mode (inside a torch
        # operator of iris.collectives.functional) refuses in-place writes in grad mode, which an
        # eager call given a tensor that requires grad makes into its staging buffer.
        return raw.view(dtype).view(shape).detach().zero_()

    def free(self, tensor: torch.Tensor) -> None:
        """Give a workspace buffer back to the arena: once every one is back, the arena starts over
        (members free alike, in the same calls, as for the context's heap)."""
        self._live -= 1
        if self._live <= 0:
            self._next, self._live = 0, 0

    def is_symmetric(self, tensor) -> bool:
        """:meth:`Iris.is_symmetric` (the context's heap)."""
        return self.ctx.is_symmetric(tensor)

    def offset_of(self, tensor: torch.Tensor) -> int:
        """:meth:`Iris.offset_of` (the context's heap)."""
        return self.ctx.offset_of(tensor)

    # Registrations made with ctx.register are the context's, translated in its rank order: a group
    # call does not read them in place (it stages them, or registers them among its members on the
    # fly through reach, as it does plain tensors).
    @property
    def quick_allgather(self) -> bool:
        """Whether the members' host allgather costs microseconds (MPI), as :attr:`Iris.quick_allgather`."""
        return self._boot.quick_allgather

    @property
    def registrations_generation(self) -> int:
        return self.ctx.registrations_generation

    @property
    def registrations(self) -> tuple:
        """None made with ``ctx.register`` (those are the context's): a group reaches the heap in
        place, and other tensors through :meth:`reach`'s registrations among its members or staged."""
        return ()

    def registration_of(self, tensor):
        """None (see :attr:`registrations`)."""
        return None

    def reach(self, tensors):
        """:meth:`Iris.reach` among the members (collective over the group): plain tensors (on the
        cpu backend, heap tensors at different offsets) registered on the fly among the members
        and cached, in a cache of the group's own, translated in group order."""
        if self._reach_cache is None:
            self._reach_cache = RegistrationCache(self)
        with self._host_waits.label("iris.runtime.Group.reach()"):
            return self._reach_cache.reach(list(tensors))

    def _next_serial(self) -> int:
        self._serials += 1
        return self._serials

    def _close_registration(self, registration) -> None:
        close_among(self, registration)  # a cached registration evicted: among the members

    def _unmap_registrations(self) -> None:
        """The context closes: unmap the members' tensors this group registered, with no barrier of
        the group's (the context's close brackets every group's with barriers of every rank, so no
        order among groups is needed)."""
        if self._reach_cache is not None:
            self._reach_cache.unmap()
            self._reach_cache = None

    def __repr__(self) -> str:
        return f"Group(ranks={list(self.ranks)}, rank={self.rank}, size={self.size})"


class _GroupHeap:
    """The context's heap as a group's registrations see it: the members' bases in group order."""

    def __init__(self, heap, ranks):
        self.bases = [heap.bases[q] for q in ranks]
        self.device_bases = [heap.device_bases[q] for q in ranks]


def new_group(ctx, ranks, workspace_size: int = DEFAULT_WORKSPACE_SIZE):
    """See :meth:`Iris.new_group`."""
    call = f"iris.runtime.Iris.new_group({ranks!r})"
    smallest = 2 * layout.CALL_WORDS_BYTES + layout.GROUP_RING_BYTES  # call words, ring flags, some room
    if isinstance(workspace_size, bool) or not isinstance(workspace_size, int) or workspace_size < smallest:
        raise GroupError(f"{call}: workspace_size={workspace_size!r}; pass a number of bytes of at least "
                         f"{smallest} (default {DEFAULT_WORKSPACE_SIZE})")
    try:
        given = list(ranks)
    except TypeError:
        given = repr(ranks)
    # One allgather, before any check: every rank then checks every rank's list, so a bad list
    # raises the same error on every rank instead of leaving the others waiting.
    # rank 0's token names the group's gloo group in the store under the torch bootstrap
    token = uuid.uuid4().hex[:16] if ctx.rank == 0 else None
    rows = ctx.allgather((given, socket.gethostname(), str(ctx.device), token), call)
    check_same_everywhere(ctx, ranks, [row[0] for row in rows], call)
    ranks = check_ranks(ctx, ranks, call)
    # Every rank of the context allocates the arena, members or not: the heap gives the same
    # offsets on every rank only while every rank makes the same allocations, so an arena that
    # only members allocated would move every later allocation of the members against the others.
    workspace_size = -(-workspace_size // _ALIGN) * _ALIGN
    try:
        arena = ctx.zeros(workspace_size // 4, dtype=torch.int32).view(torch.uint8)
    except HeapExhaustedError as exc:  # every rank alike: the same allocations came before
        raise HeapExhaustedError(f"{call}: the group's workspace_size={workspace_size} bytes does not fit in the "
                                 f"heap's {ctx.heap_free_bytes} free bytes (every rank of the context reserves it); "
                                 f"pass a smaller workspace_size= (the default is {DEFAULT_WORKSPACE_SIZE}) or a "
                                 f"larger heap_size= to iris.runtime.iris()") from exc
    member = ctx.rank in ranks
    if ctx.bootstrap == "mpi":
        boot = _mpi_members(ctx, ranks, member)
    else:
        boot = _gloo_members(ctx, ranks, rows[0][3]) if member else None
    # a peer's kernel may signal into a member's call words as soon as it runs: every rank's zero
    # fill of the arena is done first
    ctx.barrier()
    if not member:
        return None
    sharing = sum(1 for r in ranks if rows[r][1:3] == rows[ctx.rank][1:3])
    group = Group(ctx, ranks, boot, arena, sharing)
    ctx._groups.add(group)  # tracing enabled later reaches the group's context tensor too
    return group


def _mpi_members(ctx, ranks: tuple, member: bool):
    """The members' bootstrap under MPI: ``MPI_Comm_split`` of the context's communicator (every
    rank of the context calls it; None on a non-member)."""
    from ._bootstrap_mpi import MpiBootstrap, _mpi

    MPI = _mpi()
    comm = ctx.comm.Split(0 if member else MPI.UNDEFINED, ranks.index(ctx.rank) if member else 0)
    if not member:
        return None
    return MpiBootstrap(comm, comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank()))


def _gloo_members(ctx, ranks: tuple, token: str):
    """The members' bootstrap under torch.distributed: a gloo group of the members alone, numbered
    in the group's order (torch's ``new_group`` would sort the ranks), made from the default
    group's store under a name that rank 0 drew for this group."""
    import datetime

    import torch.distributed as dist

    from ._bootstrap_torch import GroupBootstrap

    store = dist.PrefixStore(f"iris-group/{token}/", dist.distributed_c10d._get_default_store())
    limit = datetime.timedelta(seconds=ctx.timeout_s or 1800)
    return GroupBootstrap(dist.ProcessGroupGloo(store, ranks.index(ctx.rank), len(ranks), limit))
