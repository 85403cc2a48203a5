"""The ranks a host call names (a peer, a root), as the context's global ranks.

A call names ranks as ranks of its group. A call on a group (``group=``, an
:class:`iris.runtime.Group`) runs on the group in place of the context: its kernels read the
group's context tensor, whose ranks are group ranks and whose heap bases are the members', in
group order, so the ranks a call is given are already the ranks its kernels take. The
point-to-point and rooted calls map every rank they are given through :func:`global_rank`, the
one place that would translate them if a kernel ever took the context's ranks on a group.
"""

from __future__ import annotations


def group_size(ctx) -> int:
    """Ranks of a call's group (``ctx``: the context, or the group that stands in for it)."""
    return ctx.world_size


def global_rank(ctx, rank, call: str, what: str) -> int:
    """The global rank of ``rank``, a rank of the call's group, checked: an int in ``[0, group
    size)``, else :class:`iris.runtime.RankError` naming ``call``, the argument ``what`` and the
    valid range."""
    if rank.__class__ is not int or not 0 <= rank < group_size(ctx):
        ctx.check_rank(rank, f"{call}({what}=...)")
    return rank
