"""One workspace cache per host context: lock arrays, staging buffers and grids, allocated once.

A fused op's kernel needs symmetric-heap memory besides the caller's tensors (lock records whose
counters only grow, staging buffers that peers read or write). Allocating them per call would
cost heap churn and a collective allocation each time, and would reset the counters the flags
rely on. So each (op, shapes, dtypes, world size, config) gets one :class:`Workspace`, created
on first use and kept on the context (a ``WeakKeyDictionary``: it goes when the context goes).

No per-call state lives here: the lock arrays' call counters (the ``EPOCH`` words, in device
memory) count calls, so back-to-back calls need no host barrier and replay correctly inside a
CUDA graph. Workspaces are created in the same order on every rank because every rank makes the
same op calls (which the ops require anyway), so heap offsets stay symmetric.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field

import torch

_CACHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ALLOCATOR_SET = False
_LOCK = threading.Lock()


@dataclass
class Workspace:
    """Buffers of one op and shape on one context: ``buffers`` by name, and the launch grid
    (programs per rank) of each compiled variant of the kernel once known (``grids``, keyed by
    its compile-time arguments: bias or not, descriptors or pointers)."""

    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    grids: dict[tuple, int] = field(default_factory=dict)


def workspace(ctx, key: tuple, make) -> Workspace:
    """The workspace for ``key`` on ``ctx``; on first use ``make(ctx)`` returns its buffers
    (a dict of heap tensors, zeroed where they hold flags)."""
    per_ctx = _CACHES.setdefault(ctx, {})
    ws = per_ctx.get(key)
    if ws is None:
        ws = per_ctx[key] = Workspace(buffers=make(ctx))
    return ws


def clear(ctx) -> None:
    """Free every workspace of ``ctx`` (collective: every rank must call it, in the same order
    as its other allocations, and only once no rank's kernel still uses them, e.g. after
    ``ctx.barrier()``). The next call of an op allocates again, with fresh counters."""
    for ws in _CACHES.pop(ctx, {}).values():
        for t in ws.buffers.values():
            ctx.free(t)


def ensure_allocator() -> None:
    """Give Triton an allocator for the scratch memory of device-side tensor descriptors, once.

    ``tl.make_tensor_descriptor`` in a kernel needs global scratch memory, which Triton asks the
    host allocator for at launch; torch's caching allocator on the current device serves it."""
    global _ALLOCATOR_SET
    with _LOCK:
        if _ALLOCATOR_SET:
            return
        import triton

        def alloc(size: int, alignment: int, stream):
            return torch.empty(size, dtype=torch.int8, device="cuda")

        triton.set_allocator(alloc)
        _ALLOCATOR_SET = True
