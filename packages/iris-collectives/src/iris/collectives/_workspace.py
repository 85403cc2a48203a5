"""One workspace cache per host context: lock arrays, staging buffers and grids, allocated once.

A fused op's kernel, and a host collective's (``ccl``), needs symmetric-heap memory besides the
caller's tensors (lock records whose counters only grow, staging buffers that peers read or
write). Allocating them per call would
cost heap churn and a collective allocation each time, and would reset the counters the flags
rely on. So each (op, shapes, dtypes, world size, config) gets one :class:`Workspace`, created
on first use and kept on the context (a ``WeakKeyDictionary``: it goes when the context goes).

No per-call state lives here: the lock arrays' call counters (the ``EPOCH`` words, in device
memory) count calls, so back-to-back calls need no host barrier and replay correctly inside a
CUDA graph. Workspaces are created in the same order on every rank because every rank makes the
same op calls (which the ops require anyway), so heap offsets stay symmetric.

Creating one is collective and waits for every rank (:meth:`Iris.barrier`): a peer signals into
this rank's new flags as soon as its kernel runs, and this rank's zero fill is a kernel on its
stream, queued behind whatever it enqueued before. Without the barrier a rank that runs ahead can
signal before a slower rank's fill, which then erases the signal, and both wait for ever (seen on
an H200: 2 ranks sharing the GPU, the first call after a long GEMM). So the first call of each
shape synchronises once; later calls do not.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field

import torch

from iris.runtime import IrisUsageError

from ._agree import host_calls

_CACHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: Counts :func:`clear` calls: what was derived from a freed workspace (the host collectives'
#: launch plans) is stale once it moves.
generation = 0
_SET_IN_THREAD = threading.local()  # where Triton's own record cannot be read
try:  # Triton's per-thread allocator and its "none set" type (private; 3.6-3.9)
    from triton.runtime._allocation import NullAllocator as _NullAllocator
    from triton.runtime._allocation import _allocator as _triton_allocator

    _TRITON_ALLOCATOR = (_triton_allocator, _NullAllocator)
except ImportError:
    _TRITON_ALLOCATOR = None


@dataclass
class Workspace:
    """Buffers of one op and shape on one context: ``buffers`` by name, the launch grid
    (programs per rank) of each compiled variant of the kernel once known (``grids``, keyed by
    its compile-time arguments: bias or not, descriptors or pointers), and ``meta``: what the op
    settled when it made the buffers (the point-to-point mailboxes' settings)."""

    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    grids: dict[tuple, int] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)


def workspace(ctx, key: tuple, make) -> Workspace:
    """The workspace for ``key`` on ``ctx``; on first use ``make(ctx)`` returns its buffers
    (a dict of tensors: heap tensors, zeroed where they hold flags, and maybe buffers no peer reads,
    in torch's memory), and every rank waits until every
    rank's buffers are ready (collective, see the module docstring). A first use while a CUDA
    graph is being captured raises :class:`iris.runtime.IrisUsageError`: call once before the
    capture."""
    per_ctx = _CACHES.setdefault(ctx, {})
    ws = per_ctx.get(key)
    if ws is None:
        if ctx.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise IrisUsageError(f"iris.collectives {key[0]}: the first call with these shapes, dtypes and config "
                                 f"allocates its workspace and waits for every rank, which cannot happen while a "
                                 f"CUDA graph is being captured; make one call before the capture (a warm-up), "
                                 f"with the same settings (for fp32 inputs of the fused ops, torch's tf32 setting "
                                 f"too: it picks the strategy)")
        buffers = make(ctx)
        if ctx.world_size > 1:
            # every rank's zero fill is done before any rank's kernel signals into it
            with host_calls(ctx, f"a new workspace of iris.collectives {key[0]}"):
                ctx.barrier()
        ws = per_ctx[key] = Workspace(buffers=buffers)
    return ws


def lookup(ctx, key: tuple) -> Workspace | None:
    """The workspace for ``key`` on ``ctx`` if one exists (no allocation)."""
    return _CACHES.get(ctx, {}).get(key)


def drop(ctx, key: tuple) -> None:
    """Free the workspace for ``key`` on ``ctx``, if any (collective, as :func:`clear`: every rank,
    once no kernel uses it). Launch plans derived from it go too."""
    global generation
    ws = _CACHES.get(ctx, {}).pop(key, None)
    if ws is None:
        return
    generation += 1
    for t in ws.buffers.values():
        if ctx.is_symmetric(t):
            ctx.free(t)


def clear(ctx) -> None:
    """Free every workspace of ``ctx`` (collective: every rank must call it, in the same order
    as its other allocations, and only once no rank's kernel still uses them, e.g. after
    ``ctx.barrier()``). The next call of an op allocates again, with fresh counters."""
    global generation
    generation += 1
    for ws in _CACHES.pop(ctx, {}).values():
        for t in ws.buffers.values():
            if ctx.is_symmetric(t):  # a workspace may also hold this rank's own buffers (torch's memory)
                ctx.free(t)


def _torch_scratch(size: int, alignment: int, stream):
    """Triton's allocator: scratch memory from torch's caching allocator on the current device."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _thread_has_allocator() -> bool:
    """Whether Triton has an allocator in this thread: Triton keeps it in a ``ContextVar``, so a
    new thread (autograd's backward thread, a user's worker) starts without one. Read from
    Triton's own variable where it has one (3.6-3.9), else per thread from our own record."""
    if _TRITON_ALLOCATOR is None:  # another Triton layout: trust what this thread did
        return getattr(_SET_IN_THREAD, "done", False)
    variable, null = _TRITON_ALLOCATOR
    return not isinstance(variable.get(), null)


def ensure_allocator() -> None:
    """Give Triton an allocator for the scratch memory of device-side tensor descriptors, in the
    calling thread, where it has none (one the user set is kept).

    ``tl.make_tensor_descriptor`` in a kernel needs global scratch memory, which Triton asks the
    host allocator for at launch; torch's caching allocator on the current device serves it.
    Triton's allocator is per thread: set once per process, the backward of a compiled model
    (autograd's own thread) failed with "no allocator was set" on an H200."""
    if _thread_has_allocator():
        return
    import triton

    triton.set_allocator(_torch_scratch)
    _SET_IN_THREAD.done = True
