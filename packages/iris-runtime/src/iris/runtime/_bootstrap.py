"""The bootstrap: who am I, how many are we, who shares my node, host collectives, and one rule
for failures.

Everything the runtime says to the other ranks on the host (heap handle exchange, barriers,
broadcasts, the watchdog's end of the job, tracing's gather) goes through one :class:`Bootstrap`.
Two implementations, one module each: MPI (``_bootstrap_mpi``, under ``mpirun`` and for a plain
``python app.py``, a world of one) and torch.distributed (``_bootstrap_torch``, under
``torchrun`` or with a process group the program made). :mod:`._launcher` decides which, and
:mod:`._bootstrap_start` starts it (a module of its own, so that the two implementations import
this one and nothing imports them back).
"""

from __future__ import annotations

import abc
import contextlib
import os
import sys
import traceback
from typing import NoReturn

import numpy as np

from . import _launcher

#: Names of the reductions :meth:`Bootstrap.allreduce` takes.
REDUCTIONS = ("sum", "min", "max")


class Bootstrap(abc.ABC):
    """How the ranks of one job find each other and talk on the host.

    The object collectives have the names and meaning of mpi4py's lowercase methods (``allgather``,
    ``gather``, ``bcast``, ``allreduce``, ``barrier``), with the reduction named by a string. Every
    method is collective over the job, except :meth:`abort`.
    """

    #: ``"mpi"`` or ``"torch"``.
    name: str
    #: What :meth:`abort` calls, for messages (``"MPI_Abort"``, ``"os._exit"``).
    abort_call: str
    #: Whether a small allgather costs microseconds (MPI within a node: shared memory), so that a
    #: host collective may make one on every call (``Iris.reach``); gloo's costs milliseconds.
    quick_allgather: bool
    rank: int
    world_size: int
    #: This rank's index among the ranks of its node, and how many there are.
    local_rank: int
    local_size: int
    num_nodes: int

    #: Whether the ranks are some of the job's (a context of some of them): their own local ranks
    #: then see only each other, so the GPU is chosen by the job's place on the node (:meth:`node_slot`).
    some_of_the_job = False

    def node_slot(self) -> tuple[int, int]:
        """This rank's (local rank, local size) among all of the job's processes on its node,
        which decides its GPU (local rank modulo the device count) and how many processes share
        it: the bootstrap's own, or for ranks that are some of the job's the launcher's
        (:func:`._launcher.node_slot`) where it announced one."""
        if self.some_of_the_job:
            slot = _launcher.node_slot(os.environ)
            if slot is not None:
                return slot
        return self.local_rank, self.local_size

    @property
    @abc.abstractmethod
    def comm(self):
        """What ``Iris.comm`` shows users: mpi4py's communicator, or an object with its lowercase
        object collectives."""

    @property
    def process_group(self):
        """torch.distributed's default process group, or None (MPI)."""
        return None

    @abc.abstractmethod
    def allgather(self, obj) -> list:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""

    @abc.abstractmethod
    def gather(self, obj, root: int = 0) -> list | None:
        """Every rank's ``obj`` in rank order on ``root``; None elsewhere."""

    @abc.abstractmethod
    def bcast(self, obj, root: int = 0):
        """``root``'s ``obj`` on every rank."""

    @abc.abstractmethod
    def allreduce(self, value, op: str = "sum"):
        """``value`` reduced over the ranks with ``op`` (``"sum"``, ``"min"`` or ``"max"``)."""

    @abc.abstractmethod
    def barrier(self) -> None:
        """Return once every rank has called it."""

    @abc.abstractmethod
    def gather_int64(self, array: np.ndarray, root: int = 0) -> list[np.ndarray] | None:
        """Every rank's 1-D int64 ``array`` (sizes may differ) on ``root``, None elsewhere: the
        bulk path (tracing's events), without pickling where the transport allows."""

    def allgather_int64(self, array: np.ndarray) -> np.ndarray:
        """Every rank's 1-D int64 ``array`` (the same length on every rank) as the rows of one
        ``(world_size, len)`` array, on every rank: the per-call path (a collective's agreement on
        its tensors), without pickling where the transport allows (MPI: 2.3 us for two ranks on a
        2-core machine, against 5.9 for a pickled allgather of the same few words)."""
        rows = self.allgather(np.ascontiguousarray(array, dtype=np.int64).reshape(-1))
        return np.stack(rows)

    @abc.abstractmethod
    def node_allgather(self, obj) -> list:
        """The ``obj`` of every rank of this node, in local rank order (collective over the job)."""

    @abc.abstractmethod
    def node_barrier(self) -> None:
        """Return once every rank of this node has called it (collective over the job)."""

    @abc.abstractmethod
    def abort(self, code: int) -> NoReturn:
        """End the whole job with exit code ``code``, from any thread, without waiting for peers."""

    def end_job(self, code: int) -> NoReturn:
        """:meth:`abort`, for a caller that has already given the launcher time to forward what it
        printed (the watchdog's thread, which must not release the interpreter lock meanwhile)."""
        self.abort(code)

    @abc.abstractmethod
    def close(self) -> None:
        """Release what this bootstrap made for one ``Iris`` (collective)."""

    def check_op(self, op) -> str:
        """``op`` if it names a reduction, else :class:`IrisUsageError` naming the fix."""
        if op not in REDUCTIONS:
            from ._errors import IrisUsageError

            raise IrisUsageError(
                f"allreduce(op={op!r}): the {self.name} bootstrap reduces with one of {REDUCTIONS}; pass the name "
                f"(mpi4py's MPI.SUM/MIN/MAX objects only work on an mpi4py communicator)")
        return op


_installed = False
#: Called (best effort, in order) by a failing rank before the job is aborted; see add_abort_hook.
_abort_hooks: list = []


def add_abort_hook(hook) -> None:
    """Run ``hook()`` when this rank fails, before the job is aborted (e.g. to stop kernels that
    wait for this rank). Exceptions in hooks are ignored: the job ends regardless."""
    _abort_hooks.append(hook)


def remove_abort_hook(hook) -> None:
    """Undo :func:`add_abort_hook` (nothing happens if ``hook`` is not registered)."""
    with contextlib.suppress(ValueError):
        _abort_hooks.remove(hook)


def run_abort_hooks() -> None:
    """Call every abort hook, ignoring their failures."""
    for hook in list(_abort_hooks):
        try:
            hook()
        except Exception:  # the job is being aborted: nothing to report to
            pass


def install_abort_on_exception(boot: Bootstrap) -> None:
    """Make an uncaught exception on any rank end the whole job.

    Without this, a rank that raises leaves its peers waiting forever in the next collective. The
    hook prints the traceback with the rank in front, runs the abort hooks, then ends the job
    through ``boot.abort`` (``MPI_Abort``, or for torch this process's exit, which ends the job).
    """
    global _installed
    if _installed:
        return
    previous = sys.excepthook
    rank, size = boot.rank, boot.world_size

    def abort_job(exc_type, exc, tb):
        if issubclass(exc_type, KeyboardInterrupt):
            previous(exc_type, exc, tb)
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        text = "".join(f"[{rank}/{size}] {line}\n" for line in text.rstrip().splitlines())
        text += f"[{rank}/{size}] iris: rank {rank} failed; aborting all {size} ranks\n"
        # The process's own stderr too: torch.distributed.init_process_group wraps this hook and
        # points sys.stderr at a buffer it writes out only after the hook returns, which the abort
        # below never does (the message was lost).
        sys.stderr.write(text)
        sys.stderr.flush()
        if sys.__stderr__ is not None and sys.__stderr__ is not sys.stderr:
            sys.__stderr__.write(text)
            sys.__stderr__.flush()
        sys.stdout.flush()
        run_abort_hooks()
        boot.abort(1)

    sys.excepthook = abort_job
    _installed = True
