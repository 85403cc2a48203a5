"""``iris.collectives.DeviceContext``: the device context with the tile collectives bound to it.

It has every method of :class:`iris.device.DeviceContext` (``load``, ``store``, atomics, ...)
plus the nine collectives in the spec's bound form, ``ctx.all_reduce_one_shot(tile, src_view,
dst_view, locks)``, and this library's ``ctx.all_reduce_rmsnorm(...)``. Each bound method is the
free function of the same name with ``ctx`` first.

:class:`RuntimeRankContext` is the same context with the rank as a run-time value, for this
library's own kernels (``ccl``, the exchanges, the fused ops): a kernel's ranks then share one compiled kernel
instead of compiling one per rank (a 4-rank job compiled each kernel four times). User kernels
keep :class:`DeviceContext` and the spec's compile-time rank.
"""

# No "from __future__ import annotations": aggregates check fields against real annotation types.
import triton
import triton.language as tl

from iris.device import DEBUG, DeviceContextMethods, DeviceTracing, aggregate
from iris.device._context import context_fields, context_parts
from iris.device._debug import check_context
from iris.device._layout import HEAP_BASES_C

from . import _all_reduce as ar
from . import _all_reduce_norm as arn
from . import _gather as ga
from . import _reduce_scatter as rs
from . import _ring as ring


class CollectiveMethods:
    """The tile collectives as methods (needs the fields of a device context); each takes
    ``group=`` (an :class:`iris.device.DeviceGroup`) as its free function does."""

    @triton.jit
    def all_reduce_atomic(self, tile, dst_view, group=None):
        """Bound :func:`iris.collectives.all_reduce_atomic`."""
        ar.all_reduce_atomic(self, tile, dst_view, group)

    @triton.jit
    def all_reduce_spinlock(self, tile, dst_view, locks, group=None):
        """Bound :func:`iris.collectives.all_reduce_spinlock`."""
        ar.all_reduce_spinlock(self, tile, dst_view, locks, group)

    @triton.jit
    def all_reduce_one_shot(self, tile, src_view, dst_view, locks, group=None):
        """Bound :func:`iris.collectives.all_reduce_one_shot`."""
        ar.all_reduce_one_shot(self, tile, src_view, dst_view, locks, group)

    @triton.jit
    def all_reduce_ring(self, tile, src_view, dst_view, group=None):
        """Bound :func:`iris.collectives.all_reduce_ring`."""
        ring.all_reduce_ring(self, tile, src_view, dst_view, group)

    @triton.jit
    def all_reduce_two_shot(self, tile, src_view, dst_view, locks, group=None):
        """Bound :func:`iris.collectives.all_reduce_two_shot`."""
        ar.all_reduce_two_shot(self, tile, src_view, dst_view, locks, group)

    @triton.jit
    def all_reduce_rmsnorm(self, tile, src_view, dst_view, locks, weight, eps, residual_view=None,
                           residual_out_view=None, scale=None, ROW_SCALES: tl.constexpr = False,
                           TWO_SHOT: tl.constexpr = False):
        """Bound :func:`iris.collectives.all_reduce_rmsnorm` (not in the spec: this library's)."""
        arn.all_reduce_rmsnorm(self, tile, src_view, dst_view, locks, weight, eps, residual_view, residual_out_view,
                               scale, ROW_SCALES, TWO_SHOT)

    @triton.jit
    def all_gather(self, tile, dst_view, dim: tl.constexpr, group=None):
        """Bound :func:`iris.collectives.all_gather`."""
        ga.all_gather(self, tile, dst_view, dim, group)

    @triton.jit
    def gather(self, tile, src_view, source_rank, hint: tl.constexpr = None, group=None):
        """Bound :func:`iris.collectives.gather`; returns the loaded tile."""
        return ga.gather(self, tile, src_view, source_rank, hint, group)

    @triton.jit
    def all_to_all(self, tile, src_view, dst_view, N_per_rank: tl.constexpr, group=None):
        """Bound :func:`iris.collectives.all_to_all`."""
        ga.all_to_all(self, tile, src_view, dst_view, N_per_rank, group)

    @triton.jit
    def reduce_scatter(self, tile, src_view, dst_view, locks, group=None):
        """Bound :func:`iris.collectives.reduce_scatter`."""
        rs.reduce_scatter(self, tile, src_view, dst_view, locks, group)


@aggregate
class DeviceContext(DeviceContextMethods, CollectiveMethods):
    """The spec's device context with collectives: ``DeviceContext.initialize(context_tensor, rank,
    world_size, tracing=False)``.

    Same fields as :class:`iris.device.DeviceContext` (``rank``, ``world_size``, ``heap_bases``,
    ``tracing``) and every one of its methods, plus ``all_reduce_atomic``,
    ``all_reduce_spinlock``, ``all_reduce_one_shot``, ``all_reduce_ring``,
    ``all_reduce_two_shot``, ``all_gather``, ``gather``, ``all_to_all`` and ``reduce_scatter``
    (and ``all_reduce_rmsnorm``).
    """

    rank: tl.constexpr
    world_size: tl.constexpr
    heap_bases: tl.tensor
    tracing: DeviceTracing

    __init__ = triton.constexpr_function(context_fields)

    @staticmethod
    @triton.jit
    def initialize(context_tensor, rank: tl.constexpr, world_size: tl.constexpr, tracing: tl.constexpr = False):
        """Build the context from ``Iris.get_device_context()``'s tensor (as
        :meth:`iris.device.DeviceContext.initialize`; ``rank`` and ``world_size`` constexpr)."""
        heap_bases, recorder = context_parts(context_tensor, rank, world_size, tracing)
        return DeviceContext(rank, world_size, heap_bases, recorder)


def runtime_rank_fields(self, rank, world_size, heap_bases, tracing):
    """Field setter of :class:`RuntimeRankContext`: ``rank`` stays the run-time value it is."""
    self.rank = rank
    self.world_size = tl.constexpr(world_size)
    self.heap_bases = heap_bases
    self.tracing = tracing


@aggregate
class RuntimeRankContext(DeviceContextMethods, CollectiveMethods):
    """:class:`DeviceContext` with a run-time ``rank`` (a scalar int32 kernel argument, listed in
    the kernel's ``do_not_specialize``): internal, for the kernels of ``iris.collectives.ccl`` and
    ``iris.collectives.ops``, which every rank of a job then runs as one compiled kernel (compile
    time is what a GPU test suite spends most, and a constexpr rank multiplies it by the world
    size).

    The same fields and methods as :class:`DeviceContext`, and the tile collectives take it: where
    they branch on ``peer == ctx.rank`` the branch is taken at run time, loops over the ranks stay
    unrolled (``world_size`` is constexpr), and sums keep their rank order (0, 1, ..., W - 1), so
    results stay bit-identical on every rank. What a constexpr rank checks at compile time is
    checked in debug mode (``check_context``) instead. No tracing: the recorder is compiled out.
    """

    rank: tl.tensor
    world_size: tl.constexpr
    heap_bases: tl.tensor
    tracing: DeviceTracing

    __init__ = triton.constexpr_function(runtime_rank_fields)

    @staticmethod
    @triton.jit
    def initialize(context_tensor, rank, world_size: tl.constexpr):
        """Build the context from ``Iris.get_device_context()``'s tensor, ``rank`` a run-time int32
        (the kernel's argument), ``world_size`` constexpr. Per program; no memory access outside
        debug mode, which checks both against the tensor."""
        tl.static_assert(world_size > 0, "RuntimeRankContext.initialize: world_size must be a positive constexpr")
        if DEBUG:
            check_context(context_tensor, rank, world_size)
        heap_bases = context_tensor + HEAP_BASES_C
        return RuntimeRankContext(rank, world_size, heap_bases, DeviceTracing.initialize(heap_bases, -1, world_size,
                                                                                          False))
