"""``Iris``: the host object of a run (rank info, the symmetric heap, tensors on it, the context
tensor kernels start from)."""

from __future__ import annotations

import atexit
import os
import weakref

import torch

from iris.device import _calls as device_calls
from iris.device import _layout as layout
from iris.device._watchdog import DEFAULT_TIMEOUT_S, timeout_from_env

from . import _backend, _group
from ._agreement import CallAgreement
from ._allocator import SymmetricAllocator, format_bytes
from ._bootstrap import add_abort_hook, remove_abort_hook
from ._bootstrap_start import start_bootstrap
from ._context import build_context
from ._errors import GroupError, IrisCallMismatchError, IrisUsageError, NotOnHeapError, RankError, SymmetryError
from ._factories import TensorFactories, check_dtype, dtype_name, nbytes_of
from ._host_waits import WatchedBootstrap
from ._logging import configure_logging, logger
from ._reach import Reach, RegistrationCache
from ._registration import Registration, close_among, close_cuda, peer_addresses
from ._residency import gpu_sharers, resident_grid
from ._spans import address, lies_within
from ._tracing import Tracing
from ._uids import new_uid
from ._watchdog import Watchdog, write_watchdog_info

DEFAULT_HEAP_SIZE = 1 << 30
def _env_flag(name: str) -> bool:
    return os.environ.get(name, "0") not in ("", "0")


class Iris(TensorFactories):
    """Host object for one rank. Build it with :func:`iris.runtime.iris`.

    Attributes: ``rank``, ``world_size``, ``local_rank``, ``num_nodes``, ``device``, ``backend``,
    ``heap_size``, ``ranks_on_device`` (ranks of this node that share this rank's device, this
    one included), ``tracing`` (:class:`Tracing`), ``bootstrap`` (``"mpi"`` or ``"torch"``: how
    the ranks found each other), ``comm`` (MPI: the mpi4py communicator; torch: an object with
    mpi4py's lowercase object collectives ``allgather``, ``gather``, ``bcast``, ``allreduce``
    (``op="sum"``, ``"min"`` or ``"max"``) and ``barrier``, over a gloo group), ``process_group``
    (torch: torch.distributed's default group; MPI: None), ``uid`` (an int naming this context in
    this process, never reused; :func:`context_of_uid` finds the context from it). Use it as a
    context manager, or call :meth:`close`, to release the heap.
    """

    def __init__(self, heap_size: int = DEFAULT_HEAP_SIZE, backend: str | None = None, *, comm=None,
                 bootstrap: str | None = None, verify: bool | None = None, log_level: int | str | None = None,
                 timeout_s: float | None = None):
        if not isinstance(heap_size, int) or heap_size <= 0:
            raise IrisUsageError(
                f"iris.runtime.iris(heap_size={heap_size!r}): pass a positive number of bytes, e.g. 1 << 30")
        if timeout_s is None:
            timeout_s = timeout_from_env()
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s >= 0:
            raise IrisUsageError(f"iris.runtime.iris(timeout_s={timeout_s!r}): pass a number of seconds >= 0 "
                                 f"(0 switches the watchdog off; the default is IRIS_TIMEOUT_S, else "
                                 f"{DEFAULT_TIMEOUT_S:g})")
        self.backend = _backend.resolve_backend(backend)
        _backend.check_interpreter_matches(self.backend)
        boot = start_bootstrap(bootstrap, comm, self.backend)
        self._boot = boot
        self.bootstrap = boot.name
        self.comm = boot.comm
        self.process_group = boot.process_group
        self.rank, self.world_size = boot.rank, boot.world_size
        self.local_rank, self.num_nodes = boot.local_rank, boot.num_nodes
        configure_logging(self.rank, self.world_size, log_level)
        self.verify = _env_flag("IRIS_VERIFY") if verify is None else bool(verify)
        # Round up so that the heap ends on an allocation boundary.
        self.heap_size = -(-heap_size // 4096) * 4096
        # The mapping is the heap plus the signal pad after it (iris.device._layout.SIGNAL_PAD_BYTES).
        if self.backend == "cuda":
            from ._heap_cuda import CudaIpcHeap

            self._heap = CudaIpcHeap(self.heap_size + layout.SIGNAL_PAD_BYTES, boot)
        elif self.backend == "nvshmem":
            from ._heap_nvshmem import NvshmemHeap

            self._heap = NvshmemHeap(self.heap_size + layout.SIGNAL_PAD_BYTES, boot)
            _backend.prepare_network_path(self._heap)
        else:
            from ._heap_cpu import SharedMemoryHeap

            self._heap = SharedMemoryHeap(self.heap_size + layout.SIGNAL_PAD_BYTES, boot)
        self.device = self._heap.device
        self.ranks_on_device = self._heap.ranks_on_device
        self._buffer = self._heap.local_buffer()
        self._base = self._heap.bases[self.rank]
        self._allocator = SymmetricAllocator(self.heap_size)
        # What kernels see: 0 for a peer reached over the network (nvshmem backend), else its base.
        self._context = build_context(self.rank, self.world_size, self._heap.device_bases, self.heap_size,
                                      self.device)
        self._watchdog = self._start_watchdog(float(timeout_s))
        # From here every host collective is watched: the watchdog bounds it (iris.runtime._host_waits)
        self._host_waits = self._watchdog.host_waits
        self._boot = WatchedBootstrap(boot, self._host_waits)
        self._calls = CallAgreement(self)
        # weakly: the watchdog outlives the context (an exit handler holds it), which must not keep
        # the context (and its process groups) alive
        calls = weakref.ref(self._calls)
        self._watchdog.describe_call = lambda fp: calls().describe(fp) if calls() is not None else None
        self._watchdog.mismatch_message = lambda *args: (calls().device_mismatch(*args) if calls() is not None
                                                         else None)
        if self.backend == "cpu":  # kernels run in this thread: a mismatch they find raises here
            device_calls.DESCRIBERS[self._watchdog.address] = weakref.WeakMethod(self._raise_call_mismatch)
        #: The groups of this context made on this rank (its members' Group objects), weakly:
        #: tracing's words reach their context tensors too.
        self._groups: weakref.WeakSet = weakref.WeakSet()
        self.tracing = Tracing(self)
        self._closed = False
        self._registrations: list[Registration] = []
        self._serials = 0  # registrations made, counted alike on every rank
        self._reach = RegistrationCache(self)
        #: Changes whenever a tensor is registered or unregistered with :meth:`register` (caches of
        #: launch plans compare it). Registrations made on the fly for collective calls
        #: (:meth:`reach`) leave it alone: a plan that uses one is keyed by its serial instead.
        self.registrations_generation = 0
        self.uid = new_uid(self)
        logger.info("%s heap of %s per rank on %s", self.backend, format_bytes(self.heap_size), self.device)

    def _start_watchdog(self, timeout_s: float) -> Watchdog:
        watchdog = Watchdog(self.rank, self.world_size, self.device, timeout_s, heap=self._heap,
                            heap_size=self.heap_size, boot=self._boot)
        add_abort_hook(watchdog.before_abort)
        atexit.register(watchdog.mark_exit)
        write_watchdog_info(self._context, self.world_size, watchdog.timeout_ns, watchdog.address)
        return watchdog

    def _raise_call_mismatch(self, rank: int, peer: int, call: int, mine: int, theirs: int):
        raise IrisCallMismatchError(self._calls.device_mismatch(rank, peer, call, mine, theirs))

    # --- the call agreement ------------------------------------------------------------------------
    def agree_call(self, signature, describe, call: str, always: bool = False) -> int:
        """The fingerprint of a collective call, agreed with every rank when its ``signature`` is new.

        For collective libraries (``iris.collectives`` calls it for every host collective and fused
        op): ``signature`` is a hashable value with no address in it (the call, its options, each
        tensor's shape, dtype and, where peers reach it in place, its heap offset), ``describe()``
        the call's text in the caller's terms, ``call`` the collective's name. A signature agreed
        before costs a dictionary lookup; a new one is exchanged with every rank (a host collective
        that the watchdog bounds), and if any rank's text differs, every rank raises
        :class:`IrisCallMismatchError` naming each rank's call. The fingerprint (a 31-bit int, the
        same on every rank for the same call) goes to the call's kernel, whose device-side check
        (``iris.device._calls``) compares calls that skip this agreement. 0 when the agreement is
        off (``IRIS_CHECK_CALLS=0``). ``always``: exchange even when the signature was agreed
        before (for a collective whose next step is another host exchange rather than a kernel
        that checks the call). See ``iris.runtime._agreement``."""
        if not device_calls.CHECK_CALLS.value:
            return 0
        return self._calls.agree(signature, describe, call, always)

    def host_call(self, label: str):
        """A context manager naming the host collectives made inside it (``label``: the call, as the
        watchdog's reports show it, e.g. "the plan of iris.collectives.ccl.all_reduce(...)")."""
        return self._host_waits.label(label)

    @property
    def timeout_s(self) -> float:
        """The watchdog's bound on a wait of iris.collectives, in seconds (0: unbounded)."""
        return self._watchdog.timeout_ns / 1e9

    def check_watchdog(self, call: str = "check_watchdog()") -> None:
        """Raise :class:`IrisTimeoutError` if the watchdog stopped a wait of this rank's kernels.
        The watchdog ends the job by itself; this is for code that must not go on meanwhile."""
        self._watchdog.check(call)

    # --- ranks -----------------------------------------------------------------------------------
    def get_rank(self) -> int:
        """This process's rank in ``[0, world_size)``."""
        return self.rank

    def get_num_ranks(self) -> int:
        """Number of ranks in the job."""
        return self.world_size

    def get_device(self) -> torch.device:
        """The device this rank's heap lives on (``self.device``; AMD Iris's name)."""
        return self.device

    def get_cu_count(self) -> int:
        """Multiprocessors of this rank's GPU (AMD Iris's name: a compute unit there, an SM here),
        e.g. for a persistent grid; on the cpu backend the CPU count (``os.cpu_count()``). With
        several ranks per GPU every rank gets the whole GPU's count: for kernels whose programs
        wait for other ranks' programs size the grid with :meth:`resident_grid` instead."""
        if self.device.type == "cuda":
            return torch.cuda.get_device_properties(self.device).multi_processor_count
        return os.cpu_count() or 1

    def check_rank(self, rank, call: str) -> int:
        """``rank`` if it is an int in ``[0, world_size)``, else :class:`RankError` naming ``call``."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise RankError(f"{call}: rank {rank!r} is outside [0, {self.world_size}); pass 0 .. {self.world_size - 1}")
        return rank

    def resident_grid(self, num_work: int, compiled=None) -> int:
        """Programs per rank for a launch whose programs wait for programs of other ranks.

        Such a program only finishes if the one it waits for runs at the same time, so no rank's
        programs may wait forever for SMs that other ranks' waiting programs hold. With one rank
        per GPU the result is the most programs of the compiled kernel ``compiled`` (what a launch
        or ``kernel.warmup(..., grid=(1,))`` returns) that fit on the GPU at once; with several
        ranks on one GPU it is one program per SM shared out among them (``SMs //
        ranks_on_device``), which makes a stall impossible whatever MPS does with the blocks of
        several processes (the argument is in ``iris.runtime._residency``; grids sized for full SMs
        stalled on an H200 with 8 ranks: docs/performance.md, "the residency rule"). Capped at ``num_work`` (e.g. the
        tile count): loop over the work in the kernel (a persistent grid). Launch such kernels of a
        rank on one stream: two of them waiting at once on different streams count twice.
        On the cpu backend the interpreter runs a launch's programs one after another, so any
        grid works as long as a program waits only for programs of other ranks: it returns
        ``num_work`` and ``compiled`` may be None.

        Example::

            compiled = exchange[(1,)](..., rounds=0)      # warm-up: builds the kernel
            grid = ctx.resident_grid(num_blocks, compiled)
            exchange[(grid,)](..., rounds=20)

        Collective: every rank calls it, and all get the same value (the smallest over the
        ranks: register counts can differ between ranks' compilations, and a program's peers must
        handle the same work as it does).
        """
        if isinstance(num_work, bool) or not isinstance(num_work, int) or num_work < 1:
            raise IrisUsageError(f"resident_grid(num_work={num_work!r}): pass a positive int, e.g. the tile count")
        mine = num_work if self.device.type != "cuda" else resident_grid(
            compiled, num_work, self.device, max(self.ranks_on_device, gpu_sharers()))
        with self._host_waits.label("iris.runtime.Iris.resident_grid()"):
            return self._boot.allreduce(mine, "min")

    def new_group(self, ranks, workspace_size: int = _group.DEFAULT_WORKSPACE_SIZE):
        """A group of this context's ranks: an :class:`iris.runtime.Group` on its members, None on
        the other ranks.

        Collective: every rank of the context calls it with the same list of global ranks (any
        subset, in any order: the order numbers the group's ranks, as ``MPI_Group_incl``; a
        sorted list numbers them as torch does). The group shares the context's heap; every rank
        of the context reserves ``workspace_size`` bytes of it (default 16 MiB) for the group's
        flags and staging buffers, so that they sit at the same offset on every member. Groups
        may overlap; their calls never share a flag. Pass the group as ``group=`` to the calls of
        ``iris.collectives.ccl``. Raises :class:`RankError` for a rank outside the context and
        :class:`GroupError` for a rank listed twice or lists that differ between ranks (on every
        rank). Under the MPI bootstrap the members' host communicator is an ``MPI_Comm_split``; under
        torch's, a gloo group of the members made from the default group's store."""
        self._check_open("new_group()")
        return _group.new_group(self, ranks, workspace_size)

    def device_group(self, group) -> torch.Tensor:
        """The context tensor of ``group`` (a group of this context, on one of its members) for a
        kernel: ``iris.device.DeviceGroup.initialize(tensor, group.rank, group.size)`` in the
        kernel, and the tile collectives of ``iris.collectives`` take the result as ``group=``.

        Raises :class:`GroupError` for a group of another context, and for ``None`` (what
        :meth:`new_group` returns on a rank that is not a member: such a rank must not launch the
        group's kernel)."""
        self._check_open("device_group()")
        call = "iris.runtime.Iris.device_group()"
        if group is None:
            raise GroupError(f"{call}: group=None: this rank ({self.rank}) is not a member of the group (new_group "
                             f"returned None here); launch the group's kernel on its members only")
        return _group.check_group(self, group, call).get_device_context()

    # --- heap and context ------------------------------------------------------------------------
    def get_heap_bases(self) -> torch.Tensor:
        """int64 tensor of every rank's heap base (in this process's address space).

        It is a view into the context tensor, which the device layer's debug checks rely on.
        """
        self._check_open("get_heap_bases()")
        return self._context[layout.HEAP_BASES:layout.HEAP_BASES + self.world_size]

    def get_device_context(self) -> torch.Tensor:
        """The context tensor for ``DeviceContext.initialize`` (layout in ``iris.device._layout``)."""
        self._check_open("get_device_context()")
        return self._context

    def _heap_tensor(self, shape, dtype, call):
        self._check_open(call)
        nbytes = nbytes_of(shape, dtype)
        offset = self._allocator.allocate(nbytes, call)
        raw = self._buffer[offset:offset + nbytes]
        return raw.view(dtype).view(shape)

    def is_symmetric(self, tensor: torch.Tensor) -> bool:
        """True when all of ``tensor``'s memory lies on this rank's heap."""
        if not isinstance(tensor, torch.Tensor) or tensor.device != self.device or tensor.layout != torch.strided:
            return False
        return lies_within(tensor, self._base, self.heap_size)

    def require_symmetric(self, tensor: torch.Tensor, call: str) -> torch.Tensor:
        """``tensor`` if it is on the heap, else :class:`NotOnHeapError` naming ``call``."""
        if not self.is_symmetric(tensor):
            where = f"{tensor.device}" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise NotOnHeapError(
                f"{call}: the tensor (on {where}) is not on this rank's symmetric heap, so peers cannot reach it; "
                f"allocate it with iris.zeros()/empty()/... or copy it with iris.as_symmetric(t)")
        return tensor

    def offset_of(self, tensor: torch.Tensor) -> int:
        """Byte offset of ``tensor``'s first element in the heap (the same on every rank)."""
        self.require_symmetric(tensor, "offset_of")
        return address(tensor) - self._base

    def as_symmetric(self, tensor: torch.Tensor) -> torch.Tensor:
        """A contiguous copy of ``tensor`` on the heap (collective in the sense of allocation order)."""
        call = f"as_symmetric({tuple(tensor.shape)}, dtype={dtype_name(tensor.dtype)})"
        check_dtype(tensor.dtype, call)
        out = self._heap_tensor(tuple(tensor.shape), tensor.dtype, call)
        return out.copy_(tensor)

    def free(self, tensor: torch.Tensor) -> None:
        """Give ``tensor``'s space back to the heap. Call it in the same order on every rank, and
        only when no kernel (here or on a peer) still uses the tensor."""
        self._release(tensor, "free")

    def _release(self, tensor: torch.Tensor, name: str) -> None:
        self.require_symmetric(tensor, f"{name}()")
        offset = self.offset_of(tensor)
        self._allocator.release(offset, f"{name}(tensor at heap offset {offset})")

    def allocate(self, num_elements: int, dtype: torch.dtype) -> torch.Tensor:
        """AMD Iris's name for ``empty(num_elements, dtype=dtype)``: a 1-D uninitialised heap tensor."""
        return self.empty(num_elements, dtype=dtype)

    def deallocate(self, tensor: torch.Tensor) -> None:
        """AMD Iris's name, here :meth:`free`: the space goes back to the heap (AMD Iris's
        ``deallocate`` keeps it), so the same rules hold: the same order on every rank, and only
        once no kernel uses the tensor."""
        self._release(tensor, "deallocate")

    # --- registered tensors ------------------------------------------------------------------------
    def register(self, tensor: torch.Tensor) -> Registration:
        """Let the peers reach ``tensor`` where it is, though it is not on the symmetric heap
        (collective: every rank passes its own tensor, of the same size on every rank).

        ``tensor``: contiguous, on this context's device, starting on a 256-byte boundary (a fresh
        ``torch.empty`` does). On the ``cuda`` backend any such tensor works: the allocation that
        holds it is shared over CUDA IPC. On the other backends only heap tensors (at any offset:
        they need not be at the same offset on every rank). Returns a :class:`Registration`, which
        keeps ``tensor`` alive until it is closed (:meth:`Registration.close`, collective; also
        a context manager, and :meth:`close` closes those still open). The host collectives
        (``iris.collectives.ccl``) read and write a registered tensor, or a view inside it, in
        place instead of staging it through the heap. Raises :class:`IrisUsageError` on every rank
        when a rank's tensor cannot be registered or the sizes differ.
        """
        call = "register()"
        self._check_open(call)
        with self._host_waits.label("iris.runtime.Iris.register()"):
            addresses, opened = peer_addresses(self, self._heap, tensor, call)
        try:
            registration = Registration(self, tensor, addresses, opened, serial=self._next_serial())
        except BaseException:
            close_cuda(opened)
            raise
        self._registrations.append(registration)
        self.registrations_generation += 1
        return registration

    def _next_serial(self) -> int:
        self._serials += 1
        return self._serials

    @property
    def quick_allgather(self) -> bool:
        """Whether a small host allgather costs microseconds (MPI) rather than milliseconds (gloo,
        under torchrun): whether :meth:`reach` may be asked on every call of a collective."""
        return self._boot.quick_allgather

    def reach(self, tensors) -> list[Reach]:
        """How the peers reach each of ``tensors`` in a collective call, the same answer on every
        rank: where every rank's tensor is at the same heap offset, or in the same registration,
        there; else, where every rank's tensor can be registered (on the ``cuda`` backend: plain
        tensors, over CUDA IPC), through a registration made now and cached for the calls that
        pass the same tensors again; else staged through the heap. Collective: every rank passes
        its tensors of the call, in the same order (one allgather per call; a registration takes
        milliseconds, once). Returns one :class:`Reach` per tensor; ``iris.collectives.ccl`` asks
        for it above a message size (``Config.register``). See ``iris.runtime._reach``."""
        self._check_open("reach()")
        with self._host_waits.label("iris.runtime.Iris.reach()"):
            return self._reach.reach(list(tensors))

    @property
    def registrations(self) -> tuple[Registration, ...]:
        """The open registrations of :meth:`register`, in the order they were made: the same
        order on every rank (registering and closing are collective), so a registration's place
        in it names the same registration on every rank."""
        return tuple(self._registrations)

    def registration_of(self, tensor: torch.Tensor) -> Registration | None:
        """The open :class:`Registration` whose tensor holds all of ``tensor``'s memory, or None."""
        for registration in self._registrations:
            if registration.contains(tensor):
                return registration
        return None

    def _close_registration(self, registration: Registration) -> None:
        close_among(self, registration)  # Registration.close()
        if registration in self._registrations:  # else one of the collectives' cache (_reach), which counts its own
            self._registrations.remove(registration)
            self.registrations_generation += 1

    @property
    def heap_free_bytes(self) -> int:
        """Bytes of the heap not allocated."""
        return self._allocator.free_bytes

    # --- synchronisation -------------------------------------------------------------------------
    def barrier(self, group=None) -> None:
        """Wait for this rank's device work, then for every rank (a host barrier of the bootstrap).

        With ``verify=True`` (or ``IRIS_VERIFY=1``) it also checks that every rank made the same
        allocation calls since the last barrier, and raises :class:`SymmetryError` otherwise.
        ``group``: a :class:`Group` of this context (:meth:`new_group`): wait for its members only
        (no allocation check: members alone may not allocate).
        """
        if group is not None:
            _group.check_group(self, group, "iris.runtime.Iris.barrier(group=...)").barrier()
            return
        self._heap.complete_remote_writes()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._watchdog.check("barrier()")
        with self._host_waits.label("iris.runtime.Iris.barrier()", synced=True):
            if self.verify:
                self._verify_symmetric_calls()
            self._boot.barrier()

    def _verify_symmetric_calls(self) -> None:
        logs = self._boot.allgather(self._allocator.take_log())
        reference = logs[0]
        for rank, log in enumerate(logs[1:], start=1):
            if log == reference:
                continue
            i = next((k for k, (a, b) in enumerate(zip(reference, log)) if a != b), min(len(reference), len(log)))
            mine = reference[i] if i < len(reference) else "no call"
            theirs = log[i] if i < len(log) else "no call"
            raise SymmetryError(
                f"barrier(verify=True): allocation call #{i} since the last barrier differs: rank 0 made "
                f"{mine!r}, rank {rank} made {theirs!r}; make the same allocations in the same order on every rank")

    def allgather(self, obj, call: str = "iris.runtime.Iris.allgather()") -> list:
        """Every rank's ``obj`` (picklable), in rank order. Collective, on the host: the watchdog
        bounds it like every host collective of the context, and its reports name ``call`` (the
        caller's name for what the ranks exchange)."""
        with self._host_waits.label(call):
            return self._boot.allgather(obj)

    def broadcast(self, obj, src: int = 0):
        """``obj`` from rank ``src`` on every rank. Tensors come back on this rank's device;
        anything else must be picklable."""
        self.check_rank(src, f"broadcast(src={src!r})")
        payload = None
        if self.rank == src:
            # A compact copy: pickling a view would ship its whole storage (for a heap tensor, the
            # whole heap), and the sender must not get back an alias of its own tensor.
            is_tensor = isinstance(obj, torch.Tensor)
            payload = ("tensor", obj.detach().to("cpu", copy=True)) if is_tensor else ("object", obj)
        with self._host_waits.label(f"iris.runtime.Iris.broadcast(src={src})"):
            kind, value = self._boot.bcast(payload, root=src)
        return value.to(self.device) if kind == "tensor" else value

    # --- lifetime --------------------------------------------------------------------------------
    def _check_open(self, call: str) -> None:
        if self._closed:
            raise IrisUsageError(f"{call}: this Iris was closed; create a new one with iris.runtime.iris()")

    def close(self) -> None:
        """Release the heap on every rank (collective). Peers' mappings are closed, shared-memory
        files are already gone, and MPI (or the torch process group) stays usable."""
        if self._closed:
            return
        self._watchdog.mark_exit()  # peers must not take this rank's end for a crash
        # The watchdog bounds the barriers below too (a rank that never comes to close() is
        # named), so its thread stops last; it stops touching the heap before the heap goes.
        with self._host_waits.label("iris.runtime.Iris.close()"):
            for registration in list(self._registrations):  # registered in the same order on every rank
                registration.close()
            self._reach.close()
            self.barrier()
            # the groups' registrations made on the fly: every rank's kernels are done (above),
            # each rank unmaps its groups' mappings, then every rank waits for every other before
            # the tensors may go (no barrier per group: the groups' order differs between ranks)
            for group in list(self._groups):
                group._unmap_registrations()
            self._boot.barrier()
            remove_abort_hook(self._watchdog.before_abort)
            device_calls.DESCRIBERS.pop(self._watchdog.address, None)
            self.tracing.close()
            self._buffer = None
            self._watchdog.detach_heap()
            self._heap.close()
            self._closed = True
            self._boot.barrier()
        self._watchdog.close()
        self._boot.close()

    def __enter__(self) -> Iris:
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()

    def __repr__(self) -> str:
        return (f"Iris(rank={self.rank}, world_size={self.world_size}, backend={self.backend!r}, "
                f"device={self.device}, heap_size={self.heap_size})")


def iris(heap_size: int = DEFAULT_HEAP_SIZE, backend: str | None = None, **options) -> Iris:
    """Start Iris on this rank: bootstrap, map every rank's heap, return the :class:`Iris`.

    ``backend``: ``"auto"`` (default, or ``IRIS_BACKEND``), ``"cuda"``, ``"nvshmem"`` (across
    nodes; needs nvshmem4py) or ``"cpu"``. Options:
    ``bootstrap`` (how the ranks find each other: ``"auto"``, the default, or ``IRIS_BOOTSTRAP``,
    uses torch.distributed when a default process group exists or torchrun started the process,
    MPI under an MPI launcher, else a world of one; ``"mpi"``; ``"torch"``), ``comm`` (an mpi4py
    communicator, for MPI; or a gloo process group of some of the ranks made by hand,
    ``dist.ProcessGroupGloo(store, rank, size, timeout)``, for torch: the context's ranks are the
    group's), ``verify`` (check allocation order at each barrier), ``log_level``,
    ``timeout_s`` (the watchdog's bound on every wait of iris.collectives and every host
    collective of the context, in seconds: default ``IRIS_TIMEOUT_S`` or 60; 0 switches it off).
    When a wait runs out, the ranks print what they waited for and the job ends (``MPI_Abort``;
    under torchrun, the rank exits and torchrun ends the others), before any rank can use what the
    call that gave up computed. A launcher that started several ranks which this process cannot reach
    (``WORLD_SIZE=4`` without torchrun's variables, ``mpirun -n 4`` with an mpi4py of another MPI,
    ``bootstrap="mpi"`` under torchrun) raises :class:`IrisBootstrapError`. Collective: every rank
    calls it.
    """
    return Iris(heap_size, backend, **options)
