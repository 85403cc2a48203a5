"""The interface every heap backend implements.

A heap is one block of ``size`` bytes per rank, mapped into every rank's address space, with the
address of each rank's block (as seen by this process) in ``bases``. The allocator, the factories
and the context tensor only use this interface, so a scale-out backend (NVSHMEM, fabric
handles) can be added beside the two that exist.
"""

from __future__ import annotations

import abc

import torch

from iris.device._layout import HEAP_BASE_ALIGNMENT

from ._errors import IrisBackendError


class SymmetricHeap(abc.ABC):
    """One block per rank, every block reachable from every rank of the node."""

    #: Backend name, ``"cuda"``, ``"nvshmem"`` or ``"cpu"``.
    backend: str
    #: Bytes per rank.
    size: int
    #: Address of each rank's block in this process, indexed by rank.
    bases: list[int]
    #: Device the local block (and kernels) live on.
    device: torch.device
    #: Ranks of this node whose blocks (and kernels) are on ``device``, this one included.
    ranks_on_device: int

    @abc.abstractmethod
    def local_buffer(self) -> torch.Tensor:
        """This rank's block as a 1-D uint8 tensor of ``size`` bytes on ``device``."""

    @abc.abstractmethod
    def close(self) -> None:
        """Unmap peers' blocks and release this rank's block. Collective: every rank calls it."""

    @abc.abstractmethod
    def write_int32(self, address: int, value: int, timeout_s: float = 1.0) -> bool:
        """Store ``value`` into the int32 word at ``address`` (any rank's block or signal pad, as
        mapped in this process) from the host, without waiting for this rank's kernels, which may
        be spinning. Best effort: False if it could not be done within ``timeout_s``."""

    @abc.abstractmethod
    def read_int32(self, address: int, timeout_s: float = 1.0) -> int | None:
        """The int32 word at ``address``, read from the host like :meth:`write_int32`; None if it
        could not be read within ``timeout_s``."""

    @property
    def device_bases(self) -> list[int]:
        """The bases kernels see (the context tensor's): :attr:`bases`, except on backends with a
        network path, where a peer reached over the network has 0."""
        return self.bases

    def complete_remote_writes(self) -> None:
        """Make writes this rank's kernels sent to peers complete before a host barrier. Loads and
        stores through mapped pointers are complete when the kernels are: nothing to do, except
        on backends with a network path (nvshmem), which override this."""
        return None

    def check_alignment(self) -> None:
        """The device layer relies on aligned bases to vectorize translated accesses."""
        for rank, base in enumerate(self.bases):
            if base % HEAP_BASE_ALIGNMENT:
                raise IrisBackendError(
                    f"{self.backend} heap: rank {rank}'s heap base {base:#x} is not a multiple of "
                    f"{HEAP_BASE_ALIGNMENT} bytes; this is a bug in the {self.backend} backend, please report it"
                )
