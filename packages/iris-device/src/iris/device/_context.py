"""``DeviceContext``: the bound form of every primitive, built from the context tensor.

The bound form knows the current rank and carries the heap bases, so ``ctx.load(ptr, peer)`` is
``iris.device.load(ptr, cur_rank, peer, heap_bases)``. The methods live in
:class:`DeviceContextMethods` so that other packages (``iris.collectives``) can build a context
that has all of them plus their own.
"""

# No "from __future__ import annotations": aggregates check fields against real annotation types.
import triton
import triton.language as tl

from . import _atomics as atomics
from . import _memory as memory
from ._debug import DEBUG, check_context
from ._layout import HEAP_BASES_C
from ._tracing import DeviceTracing, TraceEvent
from ._triton_compat import aggregate


class DeviceContextMethods:
    """Bound device primitives. Needs fields ``rank``, ``world_size``, ``heap_bases``, ``tracing``.

    Every method traces itself (one event per call, per program) when the context was
    initialised with ``tracing=True``, and compiles to the bare operation otherwise.
    """

    @triton.jit
    def load(self, pointer, from_rank, mask=None, other=None, cache_modifier: tl.constexpr = None,
             volatile: tl.constexpr = False, hint: tl.constexpr = None):
        """Load from ``from_rank``'s memory at ``pointer`` (an address of this rank).

        Same as :func:`iris.device.load` with ``to_rank`` = this rank. Per element of the block;
        a weak load. Example: ``x = ctx.load(buf + offs, from_rank=1, mask=offs < n)``.
        """
        handle = self.tracing.record_event_start(TraceEvent().load, from_rank, pointer, -1, -1, mask)
        result = memory.load(pointer, self.rank, from_rank, self.heap_bases, mask, other, cache_modifier, volatile,
                             hint)
        self.tracing.record_event_end(handle)
        return result

    @triton.jit
    def store(self, pointer, value, to_rank, mask=None, cache_modifier: tl.constexpr = None,
              hint: tl.constexpr = None):
        """Store ``value`` into ``to_rank``'s memory at ``pointer`` (an address of this rank).

        Same as :func:`iris.device.store` with ``from_rank`` = this rank. Per element; a weak
        store. Example: ``ctx.store(buf + offs, x, to_rank=1, mask=offs < n)``.
        """
        handle = self.tracing.record_event_start(TraceEvent().store, to_rank, pointer, -1, -1, mask)
        memory.store(pointer, value, self.rank, to_rank, self.heap_bases, mask, cache_modifier, hint)
        self.tracing.record_event_end(handle)

    @triton.jit
    def get(self, from_ptr, to_ptr, from_rank, mask=None, other=None, load_cache_modifier: tl.constexpr = None,
            store_cache_modifier: tl.constexpr = None, hint: tl.constexpr = None):
        """Copy ``from_rank``'s data at ``from_ptr`` into this rank's ``to_ptr``.

        Same as :func:`iris.device.get` with ``to_rank`` = this rank. Per element; weak load and
        store. Example: ``ctx.get(buf + offs, local + offs, from_rank=1, mask=m)``.
        """
        handle = self.tracing.record_event_start(TraceEvent().get, from_rank, from_ptr, -1, -1, mask)
        memory.get_from(from_ptr, to_ptr, from_rank, self.rank, self.heap_bases, mask, other, load_cache_modifier,
                        store_cache_modifier, hint)
        self.tracing.record_event_end(handle)

    @triton.jit
    def put(self, from_ptr, to_ptr, to_rank, mask=None, other=None, load_cache_modifier: tl.constexpr = None,
            store_cache_modifier: tl.constexpr = None, hint: tl.constexpr = None):
        """Copy this rank's data at ``from_ptr`` into ``to_rank``'s memory at ``to_ptr``.

        Same as :func:`iris.device.put`. Per element; weak load and store.
        Example: ``ctx.put(local + offs, buf + offs, to_rank=1, mask=m)``.
        """
        handle = self.tracing.record_event_start(TraceEvent().put, to_rank, to_ptr, -1, -1, mask)
        memory.put(from_ptr, to_ptr, self.rank, to_rank, self.heap_bases, mask, other, load_cache_modifier,
                   store_cache_modifier, hint)
        self.tracing.record_event_end(handle)

    @triton.jit
    def copy(self, src_ptr, dst_ptr, from_rank, to_rank, mask=None, other=None,
             load_cache_modifier: tl.constexpr = None, store_cache_modifier: tl.constexpr = None,
             hint: tl.constexpr = None):
        """Copy ``from_rank``'s data at ``src_ptr`` to ``to_rank``'s memory at ``dst_ptr``.

        Same as :func:`iris.device.copy` with ``cur_rank`` = this rank, which should be one of the
        two ends. Per element; weak load and store.
        Example: ``ctx.copy(src + offs, dst + offs, from_rank=peer, to_rank=ctx.rank, mask=m)``.
        """
        handle = self.tracing.record_event_start(TraceEvent().copy, to_rank, dst_ptr, -1, -1, mask)
        memory.copy(src_ptr, dst_ptr, from_rank, to_rank, self.rank, self.heap_bases, mask, other,
                    load_cache_modifier, store_cache_modifier, hint)
        self.tracing.record_event_end(handle)

    @triton.jit
    def atomic_add(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        """Bound :func:`iris.device.atomic_add`: add at ``to_rank``, return old values."""
        handle = self.tracing.record_event_start(TraceEvent().atomic_add, to_rank, pointer, -1, -1, mask)
        old = atomics.atomic_add(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)
        self.tracing.record_event_end(handle)
        return old

    @triton.jit
    def atomic_sub(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        """Bound :func:`iris.device.atomic_sub`: subtract at ``to_rank``, return old values."""
        handle = self.tracing.record_event_start(TraceEvent().atomic_sub, to_rank, pointer, -1, -1, mask)
        old = atomics.atomic_sub(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)
        self.tracing.record_event_end(handle)
        return old

    @triton.jit
    def atomic_cas(self, pointer, cmp, val, to_rank, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        """Bound :func:`iris.device.atomic_cas`: compare-and-swap at ``to_rank``, return old values."""
        handle = self.tracing.record_event_start(TraceEvent().atomic_cas, to_rank, pointer, -1, -1, None)
        old = atomics.atomic_cas(pointer, cmp, val, self.rank, to_rank, self.heap_bases, sem, scope, hint)
        self.tracing.record_event_end(handle)
        return old

    @triton.jit
    def atomic_xchg(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                    hint: tl.constexpr = None):
        """Bound :func:`iris.device.atomic_xchg`: exchange at ``to_rank``, return old values."""
        handle = self.tracing.record_event_start(TraceEvent().atomic_xchg, to_rank, pointer, -1, -1, mask)
        old = atomics.atomic_xchg(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)
        self.tracing.record_event_end(handle)
        return old

    @triton.jit
    def atomic_xor(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        """Bound :func:`iris.device.atomic_xor`: XOR at ``to_rank``, return old values."""
        handle = self.tracing.record_event_start(TraceEvent().atomic_xor, to_rank, pointer, -1, -1, mask)
        old = atomics.atomic_xor(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)
        self.tracing.record_event_end(handle)
        return old

    @triton.jit
    def atomic_and(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        """Bound :func:`iris.device.atomic_and`: AND at ``to_rank``, return old values."""
        handle = self.tracing.record_event_start(TraceEvent().atomic_and, to_rank, pointer, -1, -1, mask)
        old = atomics.atomic_and(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)
        self.tracing.record_event_end(handle)
        return old

    @triton.jit
    def atomic_or(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                  hint: tl.constexpr = None):
        """Bound :func:`iris.device.atomic_or`: OR at ``to_rank``, return old values."""
        handle = self.tracing.record_event_start(TraceEvent().atomic_or, to_rank, pointer, -1, -1, mask)
        old = atomics.atomic_or(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)
        self.tracing.record_event_end(handle)
        return old

    @triton.jit
    def atomic_min(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        """Bound :func:`iris.device.atomic_min`: minimum at ``to_rank``, return old values."""
        handle = self.tracing.record_event_start(TraceEvent().atomic_min, to_rank, pointer, -1, -1, mask)
        old = atomics.atomic_min(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)
        self.tracing.record_event_end(handle)
        return old

    @triton.jit
    def atomic_max(self, pointer, val, to_rank, mask=None, sem: tl.constexpr = None, scope: tl.constexpr = None,
                   hint: tl.constexpr = None):
        """Bound :func:`iris.device.atomic_max`: maximum at ``to_rank``, return old values."""
        handle = self.tracing.record_event_start(TraceEvent().atomic_max, to_rank, pointer, -1, -1, mask)
        old = atomics.atomic_max(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope, hint)
        self.tracing.record_event_end(handle)
        return old


def context_fields(self, rank, world_size, heap_bases, tracing):
    """Field setter shared by every DeviceContext aggregate (this one and iris.collectives')."""
    self.rank = tl.constexpr(rank)
    self.world_size = tl.constexpr(world_size)
    self.heap_bases = heap_bases
    self.tracing = tracing


@triton.jit
def context_parts(context_tensor, rank: tl.constexpr, world_size: tl.constexpr, tracing: tl.constexpr):
    """Heap bases and tracing recorder read from a context tensor (shared by every
    ``DeviceContext.initialize``)."""
    tl.static_assert(world_size > 0, "DeviceContext.initialize: world_size must be a positive constexpr")
    tl.static_assert(rank >= 0, "DeviceContext.initialize: rank must be a constexpr in [0, world_size)")
    tl.static_assert(rank < world_size, "DeviceContext.initialize: rank must be a constexpr in [0, world_size)")
    if DEBUG:
        check_context(context_tensor, rank, world_size)
    heap_bases = context_tensor + HEAP_BASES_C
    return heap_bases, DeviceTracing.initialize(heap_bases, rank, world_size, tracing)


@aggregate
class DeviceContext(DeviceContextMethods):
    """The spec's device context: ``ctx = DeviceContext.initialize(context_tensor, rank, world_size)``.

    Fields: ``rank`` and ``world_size`` (compile-time), ``heap_bases`` (pointer into the
    context tensor) and ``tracing`` (:class:`DeviceTracing`).
    """

    rank: tl.constexpr
    world_size: tl.constexpr
    heap_bases: tl.tensor
    tracing: DeviceTracing

    __init__ = triton.constexpr_function(context_fields)

    @staticmethod
    @triton.jit
    def initialize(context_tensor, rank: tl.constexpr, world_size: tl.constexpr, tracing: tl.constexpr = False):
        """Build the context from ``Iris.get_device_context()``'s tensor.

        ``rank`` and ``world_size`` must be constexpr kernel arguments; ``tracing=True`` compiles
        event recording in (the host must have called ``iris.tracing.enable()``).
        """
        heap_bases, recorder = context_parts(context_tensor, rank, world_size, tracing)
        return DeviceContext(rank, world_size, heap_bases, recorder)
