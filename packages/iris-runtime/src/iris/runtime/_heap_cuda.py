"""The cuda backend's heap: one ``cudaMalloc`` per rank, shared with the ranks of the node through
legacy CUDA IPC handles.

Each rank exports a handle for its allocation together with the heap's offset inside the
allocation the handle names (non-zero when the heap is carved out of a larger block), all-gathers
them (64 raw bytes each) through the bootstrap, MPI or torch.distributed, and opens every peer's
handle. Any number of ranks may share one GPU (device = local rank modulo device count); under
MPS their kernels run concurrently, without it they are time-sliced.
"""

from __future__ import annotations

import os
import threading
import time

import torch

from ._bootstrap import Bootstrap
from ._errors import IrisBackendError
from ._heap import SymmetricHeap
from ._logging import logger


def _cuda():
    try:
        from cuda.bindings import driver, runtime
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise IrisBackendError(
            "cuda backend: the cuda-bindings package is missing (needed for CUDA IPC); "
            "pip install 'iris-runtime[cuda]' or 'cuda-bindings>=12'"
        ) from exc
    return driver, runtime


def _check(result, call: str):
    """Unpack a cuda-bindings result tuple, raising on a non-success status."""
    status, *values = result
    if int(status) != 0:
        raise IrisBackendError(f"cuda backend: {call} failed with {status!r}")
    return values[0] if len(values) == 1 else tuple(values)


class _DeviceBlock:
    """Owns one cudaMalloc block; freed when the last tensor viewing it is gone (unless
    :meth:`borrowed`: memory someone else frees)."""

    def __init__(self, ptr: int, size: int, device: torch.device, owned: bool = True):
        self.ptr, self.size, self.owned = ptr, size, owned
        self.__cuda_array_interface__ = {
            "shape": (size,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
        }
        self._runtime = _cuda()[1]

    @classmethod
    def borrowed(cls, ptr: int, size: int, device: torch.device) -> _DeviceBlock:
        """A view of memory another allocator owns and frees (NVSHMEM's symmetric heap)."""
        return cls(ptr, size, device, owned=False)

    def __del__(self):
        if not self.owned:
            return
        try:
            self._runtime.cudaFree(self.ptr)
        except Exception:  # interpreter shutdown: the driver may be gone already
            pass


#: How long a rank waits for a GPU that MPS reports unavailable (``IRIS_DEVICE_WAIT_S``).
DEVICE_WAIT_S = 30.0
# What a new MPS client gets while the server drops the clients of a killed job (measured on the
# H200 machine): CUDA_ERROR_DEVICE_UNAVAILABLE ("busy or unavailable"), then for some seconds
# CUDA_ERROR_UNKNOWN or CUDA_ERROR_LAUNCH_FAILED.
_RETRY_STATUSES = (46, 999, 719)


def wait_for_device(driver, index: int) -> None:
    """Create (retain) device ``index``'s primary context, waiting while the GPU is unavailable.

    When a job whose ranks were spinning in kernels is killed, the MPS server needs some seconds
    to drop its dead clients; meanwhile a new client gets CUDA_ERROR_DEVICE_UNAVAILABLE ("busy or
    unavailable"). A job started right after one that failed would then fail too, for no reason of
    its own: instead, retry for up to ``IRIS_DEVICE_WAIT_S`` seconds (default 30) and say so. The
    context stays retained: torch uses the same primary context.
    """
    limit = float(os.environ.get("IRIS_DEVICE_WAIT_S", DEVICE_WAIT_S))
    _check(driver.cuInit(0), "cuInit(0)")
    device = _check(driver.cuDeviceGet(index), f"cuDeviceGet({index})")
    start = time.monotonic()
    warned = False
    while True:
        status, _ = driver.cuDevicePrimaryCtxRetain(device)
        waited = time.monotonic() - start
        if int(status) == 0:
            if warned:
                logger.warning("GPU %d is available after %.1f s", index, waited)
            return
        if int(status) not in _RETRY_STATUSES or waited > limit:
            raise IrisBackendError(
                f"cuda backend: cuDevicePrimaryCtxRetain(GPU {index}) failed with {status!r} after {waited:.0f} s; "
                f"if MPS is running, a job that ended badly may still hold it: wait, raise IRIS_DEVICE_WAIT_S, or "
                f"restart the daemon (echo quit | nvidia-cuda-mps-control; nvidia-cuda-mps-control -d)")
        if not warned:
            logger.warning("GPU %d is unavailable (%s; MPS may still be dropping the clients of a job that "
                           "ended); waiting up to %.0f s (IRIS_DEVICE_WAIT_S)", index, status, limit)
            warned = True
        time.sleep(0.5)


def bind_device(boot: Bootstrap) -> tuple[torch.device, int]:
    """Make this rank's GPU (local rank modulo the device count) current for torch and the CUDA
    runtime, waiting while MPS reports it unavailable. Returns it and how many local ranks share
    it, this one included. Local ranks are the job's (``boot.node_slot()``): for a context of
    some of the job's ranks, the GPU the process has in the job and every process sharing it."""
    driver, runtime = _cuda()
    count = torch.cuda.device_count()
    local_rank, local_size = boot.node_slot()
    index = local_rank % count
    device = torch.device("cuda", index)
    wait_for_device(driver, index)
    torch.cuda.set_device(device)
    _check(runtime.cudaSetDevice(index), f"cudaSetDevice({index})")
    return device, len(range(index, local_size, count))  # local ranks r with r % count == index


def _pinned_word() -> torch.Tensor:
    return torch.zeros(1, dtype=torch.int32, pin_memory=True)


class HostWordAccess:
    """``write_int32``/``read_int32`` for heaps in device memory mapped into this process (the
    heap's ``__init__`` calls :meth:`_prepare_word_copies` once its device is bound). Safe to call
    from several threads at once: the runtime's watchdog thread and the main thread
    (``Iris.barrier`` looking at a report) both read peers' call counters when a wait runs out."""

    #: One copy at a time through the pinned word: two threads filling and reading the same host
    #: word read each other's values (seen on an H200: a call counter read as the peer's, so the
    #: watchdog could not name the rank that skipped a collective). One lock for the process: these
    #: copies are rare and small.
    _word_lock = threading.Lock()

    def _prepare_word_copies(self) -> None:
        """Make the private stream and the pinned host word of the copies now, while no kernel of
        this rank can be waiting. Made on first use instead, by the watchdog thread once a kernel
        had timed out and still spun, the stream's creation waited for that kernel (seen on an
        H100): the watchdog never drained the peers nor reported, and the job hung, silent, until
        the launcher's limit."""
        _, runtime = _cuda()
        self._word_stream = _check(runtime.cudaStreamCreateWithFlags(runtime.cudaStreamNonBlocking),
                                   "cudaStreamCreateWithFlags")
        self._word_host = _pinned_word()

    #: Set while a copy is held up inside a CUDA call (see :meth:`_word_copy`): the event of that
    #: copy, which is set once the call returns. None while no copy is held up.
    _word_stuck: threading.Event | None = None

    def _word_copy(self, dst: int, src: int, kind, value: int, timeout_s: float) -> int | None:
        # One int32 through a pinned host word, copied on a private non-blocking stream (made with
        # the heap, kept), so it waits neither for this rank's kernels, which may be spinning, nor
        # for the legacy default stream; polled with a deadline, since after a device fault the
        # context may never answer. Returns the host word afterwards, None on failure.
        #
        # The CUDA calls themselves can block too: while the main thread waits in a synchronous
        # copy (``x.tolist()``, ``.item()``, ``.cpu()``) for a kernel that spins until the
        # watchdog acknowledges its report, cudaMemcpyAsync on this private stream did not return
        # (seen on an H200: a receive that found a message of another size reported it, and the
        # watchdog thread, draining the peers, sat in the copy, so the report was never printed
        # and the job hung). So the calls run in a thread of their own, and a copy that outlasts
        # ``timeout_s`` gives None; until it returns, every later copy gives None at once, and the
        # watchdog reports what it knows without the words it could not read.
        stuck = self._word_stuck
        if stuck is not None and not stuck.is_set():
            return None
        if not self._word_lock.acquire(timeout=timeout_s):
            return None
        done = threading.Event()
        result: list[int | None] = []

        def copy() -> None:
            try:
                result.append(self._word_copy_locked(dst, src, kind, value, timeout_s))
            finally:
                self._word_lock.release()
                done.set()

        threading.Thread(target=copy, name="iris-word-copy", daemon=True).start()
        if done.wait(timeout_s + 0.5):  # the copy's own deadline, and a moment for the thread
            return result[0] if result else None
        self._word_stuck = done
        return None

    def _word_copy_locked(self, dst: int, src: int, kind, value: int, timeout_s: float) -> int | None:
        _, runtime = _cuda()
        if getattr(self, "_word_stream", None) is None:
            return None  # never prepared (a heap that failed half-way through its creation)
        try:
            self._word_host.fill_(value)
            host = self._word_host.data_ptr()
            _check(runtime.cudaMemcpyAsync(dst or host, src or host, 4, kind, self._word_stream), "cudaMemcpyAsync")
            deadline = time.monotonic() + timeout_s
            while True:
                status = runtime.cudaStreamQuery(self._word_stream)[0]
                if int(status) == 0:
                    return int(self._word_host[0])
                if status != runtime.cudaError_t.cudaErrorNotReady or time.monotonic() > deadline:
                    return None
                time.sleep(0.001)
        except Exception:  # best effort: this runs while a job is failing
            return None

    def write_int32(self, address: int, value: int, timeout_s: float = 1.0) -> bool:
        _, runtime = _cuda()
        return self._word_copy(address, 0, runtime.cudaMemcpyKind.cudaMemcpyHostToDevice, value, timeout_s) is not None

    def read_int32(self, address: int, timeout_s: float = 1.0) -> int | None:
        _, runtime = _cuda()
        return self._word_copy(0, address, runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost, 0, timeout_s)


class CudaIpcHeap(HostWordAccess, SymmetricHeap):
    """GPU heap shared over legacy CUDA IPC among the ranks of one node."""

    backend = "cuda"

    def __init__(self, size: int, boot: Bootstrap):
        driver, runtime = _cuda()
        if boot.num_nodes > 1:
            raise IrisBackendError(
                f"cuda backend: the job spans {boot.num_nodes} nodes; CUDA IPC reaches the GPUs of one node; "
                f"use backend='nvshmem' (pip install 'iris-runtime[nvshmem]'), or run all ranks on one node"
            )
        self.device, self.ranks_on_device = bind_device(boot)
        self.size = size
        count = torch.cuda.device_count()
        sharing = boot.local_size > count
        if sharing:
            logger.info(
                "%d ranks share %d GPU(s): start the MPS daemon (nvidia-cuda-mps-control -d) so their kernels run "
                "concurrently; without it they are time-sliced", boot.local_size, count)

        ptr = int(_check(runtime.cudaMalloc(size), f"cudaMalloc({size})"))
        self._block = _DeviceBlock(ptr, size, self.device)
        _check(runtime.cudaMemset(ptr, 0, size), "cudaMemset(heap, 0)")
        handle = _check(runtime.cudaIpcGetMemHandle(ptr), "cudaIpcGetMemHandle(heap)")
        alloc_base, _ = _check(driver.cuMemGetAddressRange(ptr), "cuMemGetAddressRange(heap)")
        offset = ptr - int(alloc_base)
        _check(runtime.cudaDeviceSynchronize(), "cudaDeviceSynchronize")

        shared = boot.node_allgather((bytes(handle.reserved), offset, boot.rank))
        self.bases = [0] * boot.world_size
        self._opened: list[int] = []
        for handle_bytes, peer_offset, peer_rank in shared:
            if peer_rank == boot.rank:
                self.bases[peer_rank] = ptr
                continue
            peer_handle = runtime.cudaIpcMemHandle_t()
            peer_handle.reserved = handle_bytes
            mapped = int(_check(
                runtime.cudaIpcOpenMemHandle(peer_handle, runtime.cudaIpcMemLazyEnablePeerAccess),
                f"cudaIpcOpenMemHandle(rank {peer_rank}'s heap)"))
            self._opened.append(mapped)
            self.bases[peer_rank] = mapped + peer_offset
        self._boot = boot
        self._prepare_word_copies()  # for write_int32 / read_int32
        self._local = torch.as_tensor(self._block, device=self.device)
        self.check_alignment()
        logger.debug("cuda heap: %d B on %s, bases %s", size, self.device, [hex(b) for b in self.bases])

    def local_buffer(self) -> torch.Tensor:
        return self._local

    def close(self) -> None:
        _, runtime = _cuda()
        torch.cuda.synchronize(self.device)
        for mapped in self._opened:
            _check(runtime.cudaIpcCloseMemHandle(mapped), "cudaIpcCloseMemHandle")
        self._opened = []
        # Peers must have closed their handles to our block before it may be freed.
        self._boot.node_barrier()
        # The block itself is freed when the last tensor on it (ours or the caller's) is gone.
        self._local = None
        self._block = None
