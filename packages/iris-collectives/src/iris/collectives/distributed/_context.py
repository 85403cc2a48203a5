"""The Iris context behind the ``iris`` backend's process groups: made on first use, or adopted.

A process group of the backend runs its collectives on one :class:`iris.runtime.Iris` context,
which it finds in this order: the ``context`` of its :class:`Options` (a context the program
made, adopted as it is and never closed by the backend); the context an earlier group of the
backend made and that is still open, with the same world (``new_group()`` of all ranks shares
it); else a new one, made when the group's first call comes (see :func:`make_context`), with the
heap size of its :class:`Options`, else ``IRIS_DIST_HEAP_SIZE``, else the runtime's default.

Why on first use: torch makes the group inside ``init_process_group``, before the default group
exists, and the runtime's torch.distributed bootstrap adopts the default group (and makes its own
gloo group from it). Every rank's first call on a group is the same collective, so the first call
is collective like the making of a context. ``iris.collectives.distributed.context_of(group)``
makes it at once, e.g. before capturing CUDA graphs.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re

import torch
import torch.distributed as dist

import iris.runtime
from iris.runtime import IrisBootstrapError, IrisUsageError

from . import _rendezvous

#: The environment variable with the heap size of a context the backend makes.
HEAP_SIZE_ENV = "IRIS_DIST_HEAP_SIZE"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


@dataclasses.dataclass(frozen=True)
class Options:
    """What ``init_process_group(backend="iris", pg_options=Options(...))`` (or ``new_group``) may
    set: ``context``, an open :class:`iris.runtime.Iris` of the same ranks to run on (the program
    keeps it and closes it); ``heap_size``, bytes per rank of the heap of a context the backend
    makes (default: ``IRIS_DIST_HEAP_SIZE``, else ``iris.runtime.DEFAULT_HEAP_SIZE``)."""

    context: object = None
    heap_size: int | None = None


def parse_size(text: str, name: str = HEAP_SIZE_ENV) -> int:
    """Bytes of ``text``: an integer, or one with a binary unit (``512M``, ``2G``, ``1.5G``)."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not match or float(match.group(1)) <= 0:
        raise IrisUsageError(f"{name}={text!r}: give a positive number of bytes, e.g. 1073741824, 512M or 2G")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def heap_size_of(options: Options | None) -> int:
    """The heap size a context made for ``options`` gets."""
    if options is not None and options.heap_size is not None:
        size = options.heap_size
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise IrisUsageError(f"iris.collectives.distributed.Options(heap_size={size!r}): pass a positive number "
                                 f"of bytes, e.g. 1 << 30")
        return size
    text = os.environ.get(HEAP_SIZE_ENV)
    return parse_size(text) if text else iris.runtime.DEFAULT_HEAP_SIZE


def check_options(options) -> Options | None:
    """``options`` (``pg_options`` of ``init_process_group`` or ``new_group``) if it is None or an
    :class:`Options`."""
    if options is None or isinstance(options, Options):
        return options
    raise IrisUsageError(f"init_process_group(backend='iris', pg_options={options!r}): pg_options must be an "
                         f"iris.collectives.distributed.Options(context=..., heap_size=...) or None")


# The context the backend made last (None, or an open Iris), shared by the groups of its world.
_made: list = [None]


def bootstrap_choice() -> str | None:
    """How a context the backend makes finds the ranks: over MPI when an MPI launcher started the
    job (its host allgather is quick, so large plain tensors can be registered on the fly), else
    through torch.distributed (the default group); ``IRIS_BOOTSTRAP``, when set, decides."""
    if os.environ.get("IRIS_BOOTSTRAP"):
        return None
    return _launched_by()


def _launched_by() -> str:
    if _rendezvous.FILLED_FROM_MPI or (_rendezvous._launcher.mpi_launched(os.environ)
                                       and not _rendezvous._launcher.torchrun_launched(os.environ)):
        return "mpi"
    return "torch"


def make_context(options: Options | None, rank: int, size: int, call: str, members: tuple | None = None,
                 store=None, timeout=None):
    """The context of a group of ranks ``rank`` of ``size`` (see the module doc); returns
    ``(context, made_here)``. Collective when it makes one. ``members``: the default group's
    ranks of a group of some of the ranks (None for a group of all), whose context is made over
    them alone (:func:`make_member_context`; ``store`` and ``timeout`` are the group's)."""
    if options is not None and options.context is not None:
        ctx, made = options.context, False
    elif members is not None:
        _refuse_capture(call)
        ctx, made = make_member_context(options, members, rank, store, timeout, call), True
    else:
        ctx = _made[0]
        if ctx is not None and (getattr(ctx, "_closed", True) or ctx.world_size != size):
            ctx = None
        made = ctx is None
        if made:
            _refuse_capture(call)
            ctx = iris.runtime.iris(heap_size=heap_size_of(options), bootstrap=bootstrap_choice())
            _made[0] = ctx
    if not hasattr(ctx, "get_device_context") or getattr(ctx, "_closed", False):
        raise IrisUsageError(f"{call}: Options(context={ctx!r}) is not an open Iris context; pass the object that "
                             f"iris.runtime.iris() returned, before closing it")
    if (ctx.rank, ctx.world_size) != (rank, size):
        raise IrisBootstrapError(
            f"{call}: the process group is rank {rank} of {size} but its Iris context is rank {ctx.rank} of "
            f"{ctx.world_size}; the group and the context must number the same ranks alike: launch with "
            f"torchrun or mpirun and let the backend make the context, or pass a context of the same ranks "
            f"(Options(context=...))")
    return ctx, made


def _refuse_capture(call: str) -> None:
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise IrisUsageError(
            f"{call}: the iris backend's first call on a group makes its Iris context (a heap, shared "
            f"with the peers), which cannot happen while a CUDA graph is captured; make one call (or "
            f"iris.collectives.distributed.context_of(group)) before the capture")


def make_member_context(options: Options | None, members: tuple, rank: int, store, timeout, call: str):
    """A new context over ``members`` alone (the default group's ranks of a group of some of the
    ranks, in group order; this process is ``members[rank]``), collective over the members only.

    Why a context of its own and not a group of the default group's context
    (:meth:`iris.runtime.Iris.new_group`): torch calls the backend only on the ranks of a new
    group, while a group of a context is made by every rank of the context (each reserves the
    group's workspace, so that the heap stays symmetric). So each group of some of the ranks gets
    a heap of its own, as each NCCL group gets a communicator of its own; its size is the group's
    ``Options(heap_size=...)``, else ``IRIS_DIST_HEAP_SIZE``, else the runtime's default.

    Under MPI the members' communicator is made with ``MPI_Comm_create_group`` (collective over
    the members alone) from their ``MPI.COMM_WORLD`` ranks, which they exchange through the
    group's store (torch's ranks need not be MPI's). Under torchrun the context's host
    collectives run on a gloo group of the members made from the same store."""
    heap_size = heap_size_of(options)
    if store is None:
        raise IrisUsageError(f"{call}: this group of ranks {list(members)} has no store to meet its members through")
    choice = os.environ.get("IRIS_BOOTSTRAP") or "auto"
    mpi = (_launched_by() if choice == "auto" else choice) == "mpi"
    if mpi:
        from mpi4py import MPI

        world = MPI.COMM_WORLD
    # every member here, or an error naming who is not, before anything that waits without a limit
    mpi_ranks = meet(store, members, rank, str(world.Get_rank()) if mpi else "", call)
    if mpi:
        group = world.Get_group().Incl([int(r) for r in mpi_ranks])
        comm = world.Create_group(group)
        group.Free()
        return iris.runtime.iris(heap_size=heap_size, comm=comm, bootstrap="mpi")
    host = dist.ProcessGroupGloo(dist.PrefixStore("iris-host/", store), rank, len(members),
                                 timeout or dist.constants.default_pg_timeout)
    return iris.runtime.iris(heap_size=heap_size, comm=host, bootstrap="torch")


def meet(store, members: tuple, rank: int, value: str, call: str) -> list[str]:
    """Every member's ``value``, in group order, through the group's ``store``: the members'
    first step together. Waits at most the watchdog's limit (``IRIS_TIMEOUT_S``, 0: no limit),
    then raises :class:`IrisBootstrapError` naming the members that did not come (a rank that
    skipped the group's first call)."""
    from iris.device._watchdog import timeout_from_env

    store.set(f"iris-member/{rank}", value)
    keys = [f"iris-member/{r}" for r in range(len(members))]
    limit = timeout_from_env()
    if limit:
        try:
            store.wait(keys, datetime.timedelta(seconds=limit))
        except Exception as exc:  # torch's store raises its own error types on a timeout
            missing = [members[r] for r, key in enumerate(keys) if not store.check([key])]
            raise IrisBootstrapError(
                f"{call}: waited {limit:g} s (IRIS_TIMEOUT_S) for the group of ranks {list(members)} to make its first "
                f"call together; rank(s) {missing} (default-group ranks) did not come ({type(exc).__name__}): every "
                f"member must make the same calls on the group, in the same order") from exc
    return [store.get(key).decode() for key in keys]


def forget(ctx) -> None:
    """``ctx`` (closed, or about to be) is no longer shared with later groups."""
    if _made[0] is ctx:
        _made[0] = None
