"""How a torch operator names an Iris context and a ``Config``: small integers and strings.

A torch operator's schema admits tensors, numbers, strings, dtypes and lists of them, not a Python
object such as :class:`iris.runtime.Iris`. So the operators take a context's *handle*, an integer
(``int ctx`` in their schemas) that packs the ``ctx.uid`` the runtime gives every context with the
context's world size, and look the context up with :func:`iris.runtime.context_of_uid`. An
integer rather than a string group name (torch's ``symm_mem`` ops take one): the ranks need not
agree on names, and in a compiled graph it is a constant like any other int, guarded by the
compiler, so one compiled model serves one context and a second context recompiles. The runtime
holds the contexts weakly; a handle whose context was closed or collected raises.

Why the world size is in the handle: the shapes of the gathering and scattering operators' results
depend on it, and inductor keeps compiled graphs on disk keyed by the graph's code, its constants
included. With the uid alone (1 in every job), a model compiled by a 2-rank job was taken from that
cache by a 4-rank job with the same per-rank shapes, and its size checks failed ("expected size
8==4"). Now the graphs of different world sizes differ in the handle they call the operators with.

A group (``group=``, an :class:`iris.runtime.Group`) is named the same way: its handle packs the
group's own ``uid`` (contexts and groups share one counter) with the group's size, and the
operator runs on the group where it would run on a context (a group stands in for its context in
every collective call, with its own ranks, size, flags and workspaces). Why not the group's rank
list as an ``int[]`` argument: two groups may have the same ranks and still their own flags and
workspaces (calls of both may be in flight at once), which a list could not tell apart; and the
operators' schemas, their backward formulas (which call the operators again with the saved
handle: a group's gradient communicates on the group) and the layers' stored handle stay as they
are. The size is in the handle for the reason the world size is: a gathered or scattered
result's shape depends on it. As for contexts, a compiled graph names one group; a handle is
only valid in the process that made it.

A ``Config`` (``ccl.Config`` or ``ops.Config``, frozen dataclasses) travels as a string of its
set fields (``"variant='two_shot';block=4096"``; ``""`` for none), decoded once per string.
"""

from __future__ import annotations

import ast
import dataclasses
import functools

from iris.runtime import IrisUsageError, context_of_uid
from iris.runtime._group import check_group

#: The handle's low bits hold the world size, the bits above them the uid.
WORLD_BITS = 24


def handle_of(ctx, group=None, call: str = "iris.collectives.functional") -> int:
    """The handle of ``ctx`` (an :class:`iris.runtime.Iris`): its ``uid`` and its world size in one
    int, ``uid << WORLD_BITS | world_size``; with ``group`` (an :class:`iris.runtime.Group` of
    ``ctx``), the group's: its ``uid`` and its size (a group of another context, or anything else,
    raises :class:`iris.runtime.GroupError` naming ``call``). Under ``torch.compile`` attribute reads and integer
    arithmetic, which the compiler turns into a guarded constant (a function of ``ctx`` run as a
    constant, ``assume_constant_result``, is refused by torch 2.11 for a non-constant argument);
    nothing is registered while tracing, so the operators' fake implementations find the context
    at once."""
    uid, world = getattr(ctx, "uid", None), getattr(ctx, "world_size", None)
    if not isinstance(uid, int) or not isinstance(world, int) or not hasattr(ctx, "get_device_context"):
        raise IrisUsageError(f"iris.collectives: ctx={ctx!r} is not an Iris context; pass the object that "
                             f"iris.runtime.iris() returned")
    if group is not None:
        group = check_group(ctx, group, call)
        uid, world = group.uid, group.size
    return uid << WORLD_BITS | world


def context_of(handle: int, call: str):
    """The context (or group) of ``handle``; raises :class:`IrisUsageError` naming ``call`` when there is none."""
    ok = isinstance(handle, int) and handle >= 0
    ctx = context_of_uid(handle >> WORLD_BITS) if ok else None
    if ctx is None or ctx.world_size != world_size_of(handle):
        raise IrisUsageError(f"{call}: no Iris context or group with handle {handle!r} is open in this process (it "
                             f"was closed or collected, or the handle comes from another process or job); build "
                             f"the model on an open context (iris.runtime.iris()), keep the groups it uses alive "
                             f"while it runs, and call the operator through iris.collectives.functional or the "
                             f"modules, which take the context (and group) itself")
    return ctx


def world_size_of(handle: int) -> int:
    """The world size (or group size) that ``handle`` holds in its low bits."""
    return handle & ((1 << WORLD_BITS) - 1)


def config_field(text: str, name: str) -> str | None:
    """Field ``name`` of a config string that :func:`encode_config` wrote, as text with its quotes
    stripped, or None where it is not set: string work alone, which the compiler traces
    (:func:`decode_config`'s ``ast.literal_eval`` it cannot)."""
    return next((item[len(name) + 1:].strip("'\"") for item in text.split(";") if item.startswith(name + "=")),
                None)


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
