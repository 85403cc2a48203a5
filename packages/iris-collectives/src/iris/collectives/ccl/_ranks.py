"""The ranks a host call names (a peer, a root), as the context's global ranks.

A call names ranks as ranks of its group. Groups (some of the context's ranks, with their own
flags and workspaces) do not exist yet: every call's group is the whole context, so a call's rank
is the global rank. The point-to-point and rooted calls still map every rank they are given
through :func:`global_rank`, the one place that knows the call's group, and their kernels take
global ranks only: a group's rank list then needs threading through this function alone (and the
group's size through :func:`group_size`).
"""

from __future__ import annotations


def group_size(ctx) -> int:
    """Ranks of a call's group: today the whole context's."""
    return ctx.world_size


def global_rank(ctx, rank, call: str, what: str) -> int:
    """The global rank of ``rank``, a rank of the call's group, checked: an int in ``[0, group
    size)``, else :class:`iris.runtime.RankError` naming ``call``, the argument ``what`` and the
    valid range."""
    if rank.__class__ is not int or not 0 <= rank < group_size(ctx):
        ctx.check_rank(rank, f"{call}({what}=...)")
    return rank
