"""``DeviceGroup``: a group of ranks inside a kernel (rank arithmetic, and what the tile
collectives of ``iris.collectives`` need to run among the group's members only).

A kernel gets the group as its context tensor (``iris.runtime.Group.get_device_context()``, or
``ctx.device_group(group)``, which checks the group first) and the group's rank and size as
constexprs::

    group = DeviceGroup.initialize(group_context, group_rank, group_size)
    peer = group.global_rank((group.rank + 1) % group.size)    # a global rank
    x = ctx.load(buf + offs, peer)                               # RMA keeps taking global ranks

How the group's ranks reach the kernel: a small device array of the members' global ranks, in
group order, inside the group's context tensor (after its trailer, see ``_layout``), next to the
members' heap bases in group order. An array takes any list of ranks (``[3, 0, 2]`` as well as
``[0, 2]``), where start/stride/size would take only strided ones, and it costs nothing to pass:
the group's context tensor already exists, is written once when the group is made, and its
words stay in cache. :meth:`DeviceGroup.global_rank` is the one translation from group rank to
global rank. The collectives themselves reach a member's memory through the group's heap-base
table, which is that translation composed with the context's table once on the host (the same
table a context of just those ranks would have), so a collective on a group runs the code of a
collective on a context of the group's size, with no extra load per peer.
"""

# No "from __future__ import annotations": aggregates check fields against real annotation types.
import triton
import triton.language as tl

from ._context import DeviceContext
from ._layout import GROUP_RANKS_C, HEAP_BASES_C
from ._triton_compat import aggregate


def _group_fields(self, rank, size, heap_bases, ranks):
    self.rank = tl.constexpr(rank)
    self.size = tl.constexpr(size)
    self.world_size = tl.constexpr(size)
    self.heap_bases = heap_bases
    self.ranks = ranks


@aggregate
class DeviceGroup:
    """A group of the context's ranks, as a kernel sees it:
    ``group = DeviceGroup.initialize(group_context, group_rank, group_size)``.

    Fields: ``rank`` (this rank's place in the group) and ``size`` (alias ``world_size``), both
    compile-time; ``heap_bases`` (the members' heap bases, in group order) and ``ranks`` (the
    members' global ranks, in group order), pointers into the group's context tensor.

    Pass it as ``group=`` to the tile collectives of ``iris.collectives`` and to
    ``device_barrier``: they then run among the members, in group ranks. The memory operations
    of :class:`DeviceContext` and the free functions keep taking global ranks: translate with
    :meth:`global_rank`.
    """

    rank: tl.constexpr
    size: tl.constexpr
    world_size: tl.constexpr
    heap_bases: tl.tensor
    ranks: tl.tensor

    __init__ = triton.constexpr_function(_group_fields)

    @staticmethod
    @triton.jit
    def initialize(group_context, rank: tl.constexpr, size: tl.constexpr):
        """Build the group from its context tensor (``iris.runtime.Group.get_device_context()``);
        ``rank`` and ``size`` must be constexpr kernel arguments (``group.rank``, ``group.size``
        on the host). Per program; no memory access."""
        tl.static_assert(size > 0, "DeviceGroup.initialize: size must be a positive constexpr (the host group's "
                                   "group.size)")
        tl.static_assert(rank >= 0, "DeviceGroup.initialize: rank must be a constexpr in [0, size) (the host "
                                    "group's group.rank, not the global rank)")
        tl.static_assert(rank < size, "DeviceGroup.initialize: rank must be a constexpr in [0, size) (the host "
                                      "group's group.rank, not the global rank)")
        heap_bases = group_context + HEAP_BASES_C
        return DeviceGroup(rank, size, heap_bases, heap_bases + size + GROUP_RANKS_C)

    @triton.jit
    def global_rank(self, group_rank):
        """The global rank (the context's) of the member ``group_rank`` (an int or a scalar
        tensor in ``[0, size)``): what :class:`DeviceContext` and the free functions take.

        Granularity: per program (a scalar), or per element of a block of group ranks. Memory
        semantics: a weak load of the group's context tensor, which never changes after the
        group is made; no scope."""
        return tl.load(self.ranks + group_rank)


@triton.constexpr_function
def _is_group(group):
    return isinstance(group, DeviceGroup)


@triton.jit
def on_group(ctx, group, call: tl.constexpr):
    """The device context that a collective runs on when it is called with ``group=``: the
    group's rank and size, the members' heap bases in group order (a member's memory is reached
    by its group rank) and the caller's tracing (events keep this rank's global rank). What
    ``iris.collectives`` uses internally; kernels keep the context of global ranks.

    Compile-time checks: ``group`` is a :class:`DeviceGroup` and has at most the context's
    ranks. Per program; no memory access."""
    tl.static_assert(_is_group(group), call + ": group= takes an iris.device.DeviceGroup (DeviceGroup.initialize("
                                              "group_context, group_rank, group_size)), or None for every rank")
    tl.static_assert(group.size <= ctx.world_size, call + ": the group has more ranks than the context; pass the "
                                                          "host group's size as the group's size")
    return DeviceContext(group.rank, group.size, group.heap_bases, ctx.tracing)
