"""Registered tensors: tensors that peers reach where they are, though not on the symmetric heap.

A tensor on the heap is reached by translation: the same offset in every rank's heap. Any other
tensor of this rank's device can be *registered* (:meth:`Iris.register`, collective): every rank
passes its own tensor of the same size, and each learns where every peer's tensor lies in its own
address space. On the ``cuda`` backend a tensor outside the heap is shared over CUDA IPC: the
allocation that holds it (a segment of torch's caching allocator) is exported once and opened by
the peers, as the heap itself is. A heap tensor may be registered too, which serves tensors that
lie at different heap offsets on different ranks.

A registration has its own context table, laid out as the device context (``iris.device._layout``)
with the tensors' addresses in place of the heap bases and the tensor's size in place of the heap
size, so device code translates into it as into the heap (and debug mode checks addresses against
it) by passing ``registration.bases`` where it would pass the heap bases.

The registration keeps the tensor alive (its memory cannot be freed and reused while peers may
map it) until :meth:`Registration.close`, which is collective too.
"""

from __future__ import annotations

import torch

from iris.device import _layout as layout

from ._errors import IrisUsageError
from ._spans import lies_within

#: Every registered tensor starts on this boundary on every rank, so that translated pointers keep
#: the alignment the device layer promises the compiler (``iris.device._layout.HEAP_BASE_ALIGNMENT``).
ALIGNMENT = layout.HEAP_BASE_ALIGNMENT


class Registration:
    """One registered tensor (see the module docstring). Build it with :meth:`Iris.register`.

    Attributes: ``tensor`` (this rank's), ``serial`` (the same on every rank), ``nbytes``,
    ``addresses`` (every rank's tensor in this process's address space, by rank), ``table`` (the
    int64 context table on the device) and ``bases`` (its view at the addresses: what device code
    takes in place of ``heap_bases``).
    Use it as a context manager, or call :meth:`close` on every rank.
    """

    def __init__(self, ctx, tensor: torch.Tensor, addresses: list[int], opened: list[int], serial: int,
                 keep: bool = True):
        self._ctx = ctx
        #: the same number on every rank: registrations are made collectively, in the same order
        self.serial = serial
        # a registration made on the fly for a collective call (keep False) does not hold the tensor
        self.tensor = tensor if keep else None
        self.device = tensor.device
        self.nbytes = tensor.numel() * tensor.element_size()
        self.addresses = addresses
        self._opened = opened
        self.table = ctx.get_device_context().clone()
        W = ctx.world_size
        self.table[layout.HEAP_BASES:layout.HEAP_BASES + W] = torch.tensor(addresses, dtype=torch.int64)
        self.table[layout.HEAP_BASES + W + layout.HEAP_SIZE] = self.nbytes
        self.bases = self.table[layout.HEAP_BASES:layout.HEAP_BASES + W]
        self.closed = False

    def contains(self, tensor: torch.Tensor) -> bool:
        """True when all of ``tensor``'s memory lies in this rank's registered tensor."""
        if self.closed or not isinstance(tensor, torch.Tensor) or tensor.device != self.device:
            return False
        return lies_within(tensor, self.addresses[self._ctx.rank], self.nbytes)

    def close(self) -> None:
        """Unregister on every rank (collective): wait for this rank's device work and for every
        rank, unmap the peers' tensors, wait again (no peer maps this rank's tensor any more), and
        let the tensor go."""
        if self.closed:
            return
        self._ctx._close_registration(self)

    def __enter__(self) -> Registration:
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"Registration({self.nbytes} B at {self.addresses[self._ctx.rank]:#x}, {state})"


def _problem(ctx, tensor) -> str | None:
    # Why this rank's tensor cannot be registered, or None.
    where = f"rank {ctx.rank}'s tensor"
    if not isinstance(tensor, torch.Tensor):
        return f"{where} is a {type(tensor).__name__}, not a torch.Tensor"
    if tensor.device != ctx.device:
        return f"{where} is on {tensor.device}, this context's device is {ctx.device}; register a tensor of it"
    if not tensor.is_contiguous() or tensor.numel() == 0:
        return (f"{where} (shape {tuple(tensor.shape)}, strides {tuple(tensor.stride())}) must be contiguous and not "
                f"empty; register the tensor it is a view of")
    if ctx.backend != "cuda" and not ctx.is_symmetric(tensor):
        return (f"{where} is not on the symmetric heap, and the {ctx.backend} backend shares only the heap; "
                f"allocate it with ctx.zeros()/empty()/...")
    if tensor.data_ptr() % ALIGNMENT:
        return (f"{where} starts at {tensor.data_ptr():#x}, not on a {ALIGNMENT}-byte boundary; register a tensor "
                f"whose storage it starts (a fresh torch.empty) and pass views of it to the collectives")
    return None


def peer_addresses(ctx, heap, tensor: torch.Tensor, call: str) -> tuple[list[int], list[int]]:
    """Every rank's ``tensor`` in this process's address space, and the peer allocations this
    rank opened for it (CUDA IPC mappings to close later). Collective: one allgather, then
    :class:`IrisUsageError` on every rank alike when a rank's tensor cannot be registered (named,
    with the reason and the fix) or the ranks' tensors differ in size."""
    mine = {"rank": ctx.rank, "nbytes": 0, "heap_offset": None, "ipc": None, "error": _problem(ctx, tensor)}
    if mine["error"] is None:
        ptr = tensor.data_ptr()
        mine["nbytes"] = tensor.numel() * tensor.element_size()
        if ctx.is_symmetric(tensor):
            mine["heap_offset"] = ptr - heap.bases[ctx.rank]
        else:
            try:
                mine["ipc"] = _export_cuda(ptr)
            except Exception as exc:  # reported on every rank below
                mine["error"] = (f"rank {ctx.rank} could not export its tensor over CUDA IPC ({exc}); memory of "
                                 f"torch's expandable segments or of its cudaMallocAsync backend "
                                 f"(PYTORCH_CUDA_ALLOC_CONF) cannot be: use the default allocator, or allocate the "
                                 f"tensor on the heap")
    shared = ctx._boot.allgather(mine)
    errors = [entry["error"] for entry in shared if entry["error"]]
    if errors:
        raise IrisUsageError(f"{call}: {'; '.join(errors)}")
    ptr = tensor.data_ptr()
    sizes = {entry["nbytes"] for entry in shared}
    if len(sizes) > 1:
        listed = ", ".join(f"rank {entry['rank']}: {entry['nbytes']} B" for entry in shared)
        raise IrisUsageError(f"{call}: the ranks' tensors differ in size ({listed}); every rank registers its "
                             f"tensor of the same size")
    addresses, opened = [0] * ctx.world_size, []
    try:
        for entry in shared:
            q = entry["rank"]
            if q == ctx.rank:
                addresses[q] = ptr
            elif entry["heap_offset"] is not None:
                if not heap.device_bases[q]:
                    raise IrisUsageError(f"{call}: rank {q} is reached over the network, where only symmetric heap "
                                         f"tensors can be read; allocate the tensor on the heap on every rank")
                addresses[q] = heap.bases[q] + entry["heap_offset"]
            else:
                mapped = _open_cuda(entry["ipc"][0], q)
                opened.append(mapped)
                addresses[q] = mapped + entry["ipc"][1]
    except BaseException:
        close_cuda(opened)
        raise
    return addresses, opened


def _export_cuda(ptr: int) -> tuple[bytes, int]:
    # The IPC handle of the allocation holding ptr, and ptr's offset in it.
    from ._heap_cuda import _check, _cuda

    driver, runtime = _cuda()
    base, _ = _check(driver.cuMemGetAddressRange(ptr), "cuMemGetAddressRange")
    handle = _check(runtime.cudaIpcGetMemHandle(int(base)), "cudaIpcGetMemHandle")
    return bytes(handle.reserved), ptr - int(base)


def _open_cuda(handle_bytes: bytes, peer: int) -> int:
    # Map a peer's allocation. Opening a handle this process has open already returns the same
    # address and counts one more reference, so registrations in one peer segment each close theirs.
    from ._heap_cuda import _check, _cuda

    _, runtime = _cuda()
    handle = runtime.cudaIpcMemHandle_t()
    handle.reserved = handle_bytes
    return int(_check(runtime.cudaIpcOpenMemHandle(handle, runtime.cudaIpcMemLazyEnablePeerAccess),
                      f"cudaIpcOpenMemHandle(rank {peer}'s registered tensor)"))


def close_among(owner, registration: Registration) -> None:
    """Close ``registration`` on every rank of ``owner`` (the context or group that made it;
    collective): every rank's kernels that may map the tensors are done before the mappings go,
    and every peer has unmapped this rank's tensor before it may be freed."""
    with owner._host_waits.label("iris.runtime.Registration.close()"):
        owner.barrier()
        close_cuda(registration._opened)
        owner._boot.barrier()
    registration.closed = True
    registration.tensor = None


def close_cuda(opened: list[int]) -> None:
    """Close the CUDA IPC mappings ``opened`` (addresses :func:`peer_addresses` returned)."""
    if not opened:
        return
    from ._heap_cuda import _check, _cuda

    _, runtime = _cuda()
    for mapped in opened:
        _check(runtime.cudaIpcCloseMemHandle(mapped), "cudaIpcCloseMemHandle")
    opened.clear()
