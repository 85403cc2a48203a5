"""How a torch operator names an Iris context and a ``Config``: small integers and strings.

A torch operator's schema admits tensors, numbers, strings, dtypes and lists of them, not a Python
object such as :class:`iris.runtime.Iris`. So each context gets a small integer, its *handle*,
the first time any of the ``iris::`` operators is called for it, and the operators take that
integer (``int ctx`` in their schemas) and look the context up here. An integer rather than a
string group name (torch's ``symm_mem`` ops take one): the ranks need not agree on names, and in
a compiled graph it is a constant like any other int, guarded by the compiler, so one compiled
model serves one context and a second context recompiles. The registry holds the contexts weakly;
a handle whose context was closed or collected raises.

A ``Config`` (``ccl.Config`` or ``ops.Config``, frozen dataclasses) travels as a string of its
set fields (``"variant='two_shot';block=4096"``; ``""`` for none), decoded once per string.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import itertools
import weakref

import torch

from iris.runtime import IrisUsageError

_HANDLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # context -> handle
_CONTEXTS: dict[int, weakref.ref] = {}  # handle -> context
_NEXT = itertools.count(1)


# Under torch.compile this runs for real while the compiler traces (its result becomes a constant
# of the graph, guarded on ``ctx``): traced like other code, a first registration would be a side
# effect the compiler defers to after tracing, and the operators' fake implementations, which run
# during tracing, would not find the handle.
@torch.compiler.assume_constant_result
def handle_of(ctx) -> int:
    """The handle of ``ctx`` (an :class:`iris.runtime.Iris`), given it on first use."""
    try:
        handle = _HANDLES.get(ctx)
    except TypeError:  # no weak reference to it: not a context (_register says so)
        handle = None
    if handle is None:
        handle = _register(ctx)
    return handle


def _register(ctx) -> int:
    if not hasattr(ctx, "get_device_context") or not hasattr(ctx, "world_size"):
        raise IrisUsageError(f"iris.collectives: ctx={ctx!r} is not an Iris context; pass the object that "
                             f"iris.runtime.iris() returned")
    handle = next(_NEXT)
    _HANDLES[ctx] = handle
    _CONTEXTS[handle] = weakref.ref(ctx, lambda _, h=handle: _CONTEXTS.pop(h, None))
    return handle


def context_of(handle: int, call: str):
    """The context of ``handle``; raises :class:`IrisUsageError` naming ``call`` when there is none."""
    ref = _CONTEXTS.get(handle)
    ctx = ref() if ref is not None else None
    if ctx is None:
        raise IrisUsageError(f"{call}: no Iris context has handle {handle!r} in this process (it was collected, "
                             f"or the handle comes from another process); call the operator through "
                             f"iris.collectives.functional or the modules, which take the context itself")
    if getattr(ctx, "_closed", False):
        raise IrisUsageError(f"{call}: the Iris context of handle {handle} was closed; build the model on an open "
                             f"context (iris.runtime.iris())")
    return ctx


def encode_config(config, kind: type, call: str) -> str:
    """``config`` (an instance of ``kind`` or None) as the string an operator takes."""
    if config is None:
        return ""
    if not isinstance(config, kind):
        raise IrisUsageError(f"{call}: config={config!r} must be an {kind.__module__}.{kind.__qualname__} or None")
    return ";".join(f"{f.name}={getattr(config, f.name)!r}" for f in dataclasses.fields(config)
                    if getattr(config, f.name) is not None)


@functools.lru_cache(maxsize=256)
def decode_config(text: str, kind: type):
    """The ``kind`` instance that :func:`encode_config` wrote as ``text`` (None for ``""``)."""
    if not text:
        return None
    fields = {}
    for item in text.split(";"):
        name, _, value = item.partition("=")
        fields[name] = ast.literal_eval(value)
    return kind(**fields)
