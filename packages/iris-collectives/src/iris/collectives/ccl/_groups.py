"""``group=`` of the host collectives: a call on an :class:`iris.runtime.Group` runs on the group
in place of the context.

A group provides what a call reads from a context (its rank and size, its members' heap bases in
group order, a context tensor of its own, its own workspaces, call agreement and barrier: see
``iris.runtime._group``), so the call's plan, workspace cache and kernels are the context's,
keyed by the group: calls of different groups never share a plan, a workspace or a flag.
"""

from __future__ import annotations

from iris.runtime import Group, GroupError, IrisUnsupportedError

from .._compiling import is_compiling


def on_group(ctx, group, call: str):
    """What ``call`` runs on: ``ctx`` when ``group`` is None, else ``group`` once it is checked
    to be a group of ``ctx``."""
    if group is None:
        return ctx
    if not isinstance(group, Group):
        raise GroupError(f"{call}(group={group!r}): pass a group that ctx.new_group(ranks) returned (None: every "
                         f"rank)")
    if group.ctx is not ctx:
        raise GroupError(f"{call}: {group!r} is a group of another context; pass a group of this context (made by "
                         f"its new_group)")
    if is_compiling():
        raise IrisUnsupportedError(f"{call}(group=...) under torch.compile is not supported yet; call it outside "
                                   f"the compiled region")
    return group
