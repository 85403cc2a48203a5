"""``iris.collectives.DeviceContext``: the device context with the tile collectives bound to it.

It has every method of :class:`iris.device.DeviceContext` (``load``, ``store``, atomics, ...)
plus the nine collectives in the spec's bound form, ``ctx.all_reduce_one_shot(tile, src_view,
dst_view, locks)``, and this library's ``ctx.all_reduce_rmsnorm(...)``. Each bound method is the
free function of the same name with ``ctx`` first.
"""

# No "from __future__ import annotations": aggregates check fields against real annotation types.
import triton
import triton.language as tl

from iris.device import DeviceContextMethods, DeviceTracing, aggregate
from iris.device._context import context_fields, context_parts

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
