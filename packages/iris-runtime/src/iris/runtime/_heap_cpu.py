"""The cpu backend's heap: one shared-memory file per rank, mapped by every rank of the node.

Files are created ``0600`` with ``O_EXCL`` under a name unique to the job, and unlinked as soon
as every rank has mapped every file, so a crash after start-up leaves nothing in ``/dev/shm``.
The kernels reach peers' memory through those mappings (Triton's interpreter dereferences raw
addresses). ``multiprocessing.shared_memory`` is not used: its resource tracker unlinks segments
that peers still need.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import uuid

import torch

from ._bootstrap import Bootstrap
from ._errors import IrisBackendError
from ._heap import SymmetricHeap

SHM_DIR = "/dev/shm"
FILE_PREFIX = "iris-heap-"


def _address(mapping: mmap.mmap) -> int:
    # from_buffer exports the buffer; dropping the view at once lets the map be closed later.
    view = ctypes.c_char.from_buffer(mapping)
    try:
        return ctypes.addressof(view)
    finally:
        del view


class SharedMemoryHeap(SymmetricHeap):
    """Shared-memory heap for the cpu backend (all ranks on one machine)."""

    backend = "cpu"

    def __init__(self, size: int, boot: Bootstrap):
        if boot.num_nodes > 1:
            raise IrisBackendError(
                f"cpu backend: the job spans {boot.num_nodes} nodes, but shared memory reaches one machine; "
                f"run all ranks on one node or use backend='cuda'"
            )
        self.size = size
        self.device = torch.device("cpu")
        self.ranks_on_device = boot.local_size
        # allgather, not bcast: it returns only once every rank is here, so no file exists before
        # all ranks reached the heap's set-up (a rank failing earlier leaves nothing behind).
        job = boot.allgather(uuid.uuid4().hex[:16] if boot.rank == 0 else None)[0]
        self._paths = [os.path.join(SHM_DIR, f"{FILE_PREFIX}{job}-{r}") for r in range(boot.world_size)]
        self._maps: list[mmap.mmap | None] = [None] * boot.world_size
        finished = False
        try:
            errors = self._create_and_map(boot)
            finished = True
        finally:
            if not finished:
                # Leaving abnormally (KeyboardInterrupt, ...): the job is about to be aborted, and the
                # peers' processes will be killed before they unlink their files; remove them all.
                for path in self._paths:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
        if errors:
            self.close()
            raise IrisBackendError(
                f"cpu backend: could not create the {size} B shared-memory heap in {SHM_DIR} "
                f"({'; '.join(errors)}); free space in {SHM_DIR} or pass a smaller heap_size= to iris.runtime.iris()"
            )
        self.bases = [_address(m) for m in self._maps]
        self._local = torch.frombuffer(self._maps[boot.rank], dtype=torch.uint8)
        self.check_alignment()

    def _create_and_map(self, boot: Bootstrap) -> list[str]:
        """Create this rank's file, map every rank's file, unlink our own. Returns the failures of
        all ranks (empty when every rank succeeded); every rank returns the same list.

        Any exception is reported to the peers through the allgathers instead of escaping, so
        every rank reaches the unlink and no file outlives a failed start-up.
        """
        own_path = self._paths[boot.rank]
        created = False
        error = None
        try:
            try:
                fd = os.open(own_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                created = True
                try:
                    os.ftruncate(fd, self.size)
                    self._maps[boot.rank] = self._map(fd)
                finally:
                    os.close(fd)
            except Exception as exc:
                error = f"rank {boot.rank}: {type(exc).__name__}: {exc}"
            errors = [e for e in boot.allgather(error) if e]
            if not errors:
                try:
                    for r, path in enumerate(self._paths):
                        if r != boot.rank:
                            fd = os.open(path, os.O_RDWR)
                            try:
                                self._maps[r] = self._map(fd)
                            finally:
                                os.close(fd)
                except Exception as exc:
                    error = f"rank {boot.rank}: {type(exc).__name__}: {exc}"
                errors = [e for e in boot.allgather(error) if e]
        finally:
            # Everyone has mapped everything (or failed): the name is no longer needed.
            if created:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(own_path)
        return errors

    def _map(self, fd: int) -> mmap.mmap:
        return mmap.mmap(fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def local_buffer(self) -> torch.Tensor:
        return self._local

    # Every block is mapped into this process: the host reaches the words directly.
    def write_int32(self, address: int, value: int, timeout_s: float = 1.0) -> bool:
        ctypes.c_int32.from_address(address).value = value
        return True

    def read_int32(self, address: int, timeout_s: float = 1.0) -> int | None:
        return ctypes.c_int32.from_address(address).value

    def close(self) -> None:
        self._local = None  # drop our export of the own map first, so it can be closed
        for r, mapping in enumerate(self._maps):
            if mapping is None:
                continue
            try:
                mapping.close()
            except BufferError:
                # This rank's own map still backs tensors the caller holds; it is unmapped when the
                # last of them is freed (the file is already unlinked, so nothing is left behind).
                pass
            self._maps[r] = None
