"""MPI bootstrap: who am I, how many are we, who shares my node, and one rule for failures.

Works under ``mpirun -n N`` and as plain ``python app.py`` (a world of one).
"""

from __future__ import annotations

import contextlib
import sys
import traceback
from dataclasses import dataclass

from mpi4py import MPI


@dataclass(frozen=True)
class Bootstrap:
    """The communicators and rank numbers a run needs."""

    comm: MPI.Comm
    rank: int
    world_size: int
    node_comm: MPI.Comm
    local_rank: int
    local_size: int
    num_nodes: int


def bootstrap(comm: MPI.Comm | None = None) -> Bootstrap:
    """Read rank and world size from ``comm`` (default ``MPI.COMM_WORLD``) and split it by node."""
    comm = MPI.COMM_WORLD if comm is None else comm
    rank, world_size = comm.Get_rank(), comm.Get_size()
    node_comm = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    local_rank, local_size = node_comm.Get_rank(), node_comm.Get_size()
    num_nodes = comm.allreduce(1 if local_rank == 0 else 0, op=MPI.SUM)
    if world_size > 1:
        install_abort_on_exception(comm)
    return Bootstrap(comm, rank, world_size, node_comm, local_rank, local_size, num_nodes)


_installed = False
#: Called (best effort, in order) by a failing rank before MPI_Abort; see add_abort_hook.
_abort_hooks: list = []


def add_abort_hook(hook) -> None:
    """Run ``hook()`` when this rank fails, before the job is aborted (e.g. to stop kernels that
    wait for this rank). Exceptions in hooks are ignored: the job ends regardless."""
    _abort_hooks.append(hook)


def remove_abort_hook(hook) -> None:
    with contextlib.suppress(ValueError):
        _abort_hooks.remove(hook)


def run_abort_hooks() -> None:
    for hook in list(_abort_hooks):
        try:
            hook()
        except Exception:  # the job is being aborted: nothing to report to
            pass


def install_abort_on_exception(comm: MPI.Comm) -> None:
    """Make an uncaught exception on any rank end the whole job.

    Without this, a rank that raises leaves its peers waiting forever in the next collective. The
    hook prints the traceback with the rank in front, then calls ``MPI_Abort``.
    """
    global _installed
    if _installed:
        return
    previous = sys.excepthook
    rank, size = comm.Get_rank(), comm.Get_size()

    def abort_job(exc_type, exc, tb):
        if issubclass(exc_type, KeyboardInterrupt):
            previous(exc_type, exc, tb)
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        sys.stderr.write("".join(f"[{rank}/{size}] {line}\n" for line in text.rstrip().splitlines()))
        sys.stderr.write(f"[{rank}/{size}] iris: rank {rank} failed; aborting all {size} ranks\n")
        sys.stderr.flush()
        sys.stdout.flush()
        run_abort_hooks()
        comm.Abort(1)

    sys.excepthook = abort_job
    _installed = True
