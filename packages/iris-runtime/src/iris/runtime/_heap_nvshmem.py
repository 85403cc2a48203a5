"""The nvshmem backend's heap: one NVSHMEM symmetric allocation per rank (``nvshmem_malloc``).

NVSHMEM is started over the job's own bootstrap: rank 0 makes a unique id, the bootstrap
broadcasts it, and every rank initialises with its iris rank as PE number, so PE = rank. The heap
is a single symmetric allocation: its address here is the symmetric address NVSHMEM's device
functions take, at the same offset as on every PE.

Peers that NVSHMEM maps into this process (``nvshmem_ptr`` is not NULL: same node, NVLink or PCIe
peer access) get their mapped base, and every kernel, collective and example runs on them
unchanged, through translated pointers. Peers it cannot map (another node) keep base 0 in the
context tensor: the device layer reaches them through NVSHMEM's device API, compiled in when
``IRIS_BACKEND=nvshmem`` (``iris.device._nvshmem``). ``IRIS_NVSHMEM_FORCE_REMOTE=1`` gives every
other rank base 0 on purpose, so the network path can be tested on one node.
"""

from __future__ import annotations

import torch

from iris.device._nvshmem import force_remote_selected

from ._bootstrap import Bootstrap
from ._errors import IrisBackendError
from ._heap import SymmetricHeap
from ._heap_cuda import HostWordAccess, _check, _cuda, _DeviceBlock, bind_device
from ._logging import logger

FIX_INSTALL = "pip install 'iris-runtime[nvshmem]' (nvshmem4py-cu13 and NVIDIA's nvidia-nvshmem-cu13)"


def nvshmem_modules():
    """``(nvshmem.core, nvshmem.bindings, cuda.core.Device)``, or :class:`IrisBackendError` with
    the install command when nvshmem4py is missing."""
    try:
        import nvshmem.core as core
        from cuda.core import Device
        from nvshmem import bindings
    except ImportError as exc:
        raise IrisBackendError(
            f"iris.runtime.iris(backend='nvshmem'): nvshmem4py is not installed ({exc}); {FIX_INSTALL}, "
            f"or use backend='cuda' (CUDA IPC, one node)") from exc
    return core, bindings, Device


class NvshmemHeap(HostWordAccess, SymmetricHeap):
    """GPU heap in NVSHMEM's symmetric memory, across nodes."""

    backend = "nvshmem"

    def __init__(self, size: int, boot: Bootstrap):
        core, bindings, Device = nvshmem_modules()
        _, runtime = _cuda()
        self.device, self.ranks_on_device = bind_device(boot)
        self.size = size
        cuda_device = Device(self.device.index)
        cuda_device.set_current()

        uid = core.get_unique_id(empty=boot.rank != 0)
        uid = boot.bcast(uid, root=0)
        try:
            core.init(device=cuda_device, uid=uid, rank=boot.rank, nranks=boot.world_size, initializer_method="uid")
        except Exception as exc:
            raise IrisBackendError(
                f"nvshmem backend: nvshmem.core.init(rank={boot.rank}, nranks={boot.world_size}) failed: {exc}; "
                f"with several ranks on one GPU start MPS (nvidia-cuda-mps-control -d); NVSHMEM_DEBUG=INFO says more"
            ) from exc
        self._core, self._bindings = core, bindings
        pe, pes = int(bindings.my_pe()), int(bindings.n_pes())
        if (pe, pes) != (boot.rank, boot.world_size):
            raise IrisBackendError(f"nvshmem backend: NVSHMEM gave PE {pe} of {pes} to rank {boot.rank} of "
                                   f"{boot.world_size}; this is a bug in iris, please report it")

        ptr = int(bindings.malloc(size))  # collective
        if not ptr:
            raise IrisBackendError(
                f"nvshmem backend: nvshmem_malloc({size}) returned NULL; NVSHMEM's symmetric heap is too small: "
                f"raise NVSHMEM_SYMMETRIC_SIZE (e.g. NVSHMEM_SYMMETRIC_SIZE={2 * size}) or ask iris for a smaller heap")
        self._ptr = ptr
        _check(runtime.cudaMemset(ptr, 0, size), "cudaMemset(heap, 0)")
        _check(runtime.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
        #: Each rank's block as mapped here; 0 where NVSHMEM cannot map it (another node).
        self.bases = [int(bindings.ptr(ptr, peer)) for peer in range(boot.world_size)]
        self.bases[boot.rank] = ptr
        self._forced = force_remote_selected()
        self._boot = boot
        self._prepare_word_copies()
        self._block = _DeviceBlock.borrowed(ptr, size, self.device)
        self._local = torch.as_tensor(self._block, device=self.device)
        self.check_alignment()
        boot.barrier()  # every rank's heap is zeroed before any kernel touches a peer's
        unmapped = [peer for peer, b in enumerate(self.device_bases) if b == 0]
        logger.debug("nvshmem heap: %d B on %s, bases %s, over the network: %s", size, self.device,
                     [hex(b) for b in self.bases], unmapped or "none")

    @property
    def device_bases(self) -> list[int]:
        """What the context tensor carries: 0 for peers the device layer must reach over the
        network (unmapped, or every other rank with ``IRIS_NVSHMEM_FORCE_REMOTE=1``)."""
        rank = self._boot.rank
        return [b if peer == rank or not self._forced else 0 for peer, b in enumerate(self.bases)]

    @property
    def unmapped_peers(self) -> list[int]:
        """Ranks the device layer reaches through NVSHMEM's device API (base 0 in the context)."""
        return [peer for peer, b in enumerate(self.device_bases) if b == 0]

    def module_init(self, handle: int):
        """Initialise NVSHMEM's device state in a loaded CUDA module (``nvshmemx_cumodule_init``)."""
        return self._bindings.cumodule_init(handle)

    def complete_remote_writes(self) -> None:
        # Puts and AMOs the device layer sent over the network complete at a quiet, enqueued
        # after this rank's kernels on the current stream.
        if self.unmapped_peers:
            self._bindings.quiet_on_stream(torch.cuda.current_stream(self.device).cuda_stream)

    def local_buffer(self) -> torch.Tensor:
        return self._local

    def close(self) -> None:
        torch.cuda.synchronize(self.device)
        # nvshmem_free and nvshmem_finalize are collective; tensors on the heap are invalid after.
        self._boot.barrier()
        self._local = None
        self._block = None
        self._bindings.free(self._ptr)
        self._core.finalize()
