"""``group=`` of the host collectives: a call on an :class:`iris.runtime.Group` runs on the group
in place of the context.

A group provides what a call reads from a context (its rank and size, its members' heap bases in
group order, a context tensor of its own, its own workspaces, call agreement and barrier: see
``iris.runtime._group``), so the call's plan, workspace cache and kernels are the context's,
keyed by the group: calls of different groups never share a plan, a workspace or a flag.

Under ``torch.compile`` the front doors hand the group, as the context, to the torch operators
(:mod:`iris.collectives.functional`), which name it by its handle (the group's ``uid`` and size).
"""

from __future__ import annotations

from iris.runtime._group import check_group


def on_group(ctx, group, call: str):
    """What ``call`` runs on: ``ctx`` when ``group`` is None, else ``group`` once it is checked
    to be a group of ``ctx``."""
    if group is None:
        return ctx
    return check_group(ctx, group, call)
