"""Uids of contexts and groups: an int naming one in this process, for code that can pass only
integers (torch operators), and the lookup back to the live object."""

from __future__ import annotations

import itertools
import weakref

_UIDS = itertools.count(1)
_LIVE: dict[int, weakref.ref] = {}  # uid -> context or group, weakly


def new_uid(owner) -> int:
    """A new ``uid`` for ``owner`` (a context or a :class:`Group`), which :func:`context_of_uid`
    finds while ``owner`` lives. Contexts and groups share one counter: a uid names one of them."""
    uid = next(_UIDS)
    _LIVE[uid] = weakref.ref(owner, lambda _, uid=uid: _LIVE.pop(uid, None))
    return uid


def context_of_uid(uid: int):
    """The live context, or group of a live context, whose ``uid`` is ``uid`` in this process, or
    None (closed, collected, or never made here). For code that names a context by an integer,
    e.g. torch operators, whose arguments cannot be Python objects; a group stands in for its
    context in collective calls, so they name it the same way."""
    ref = _LIVE.get(uid) if isinstance(uid, int) else None
    ctx = ref() if ref is not None else None
    return None if ctx is None or ctx._closed else ctx
