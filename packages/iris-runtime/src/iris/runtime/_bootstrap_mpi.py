"""The MPI bootstrap: mpi4py's ``COMM_WORLD`` (or a communicator the caller passes), split by node.

Works under ``mpirun -n N`` and as plain ``python app.py`` (MPI's singleton start: a world of
one). ``mpi4py.MPI`` is imported here only, so a torchrun job never starts MPI.
"""

from __future__ import annotations

import os
import time

import numpy as np

from . import _launcher
from ._bootstrap import Bootstrap
from ._errors import IrisBootstrapError


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError as exc:  # pragma: no cover - mpi4py is a dependency
        raise IrisBootstrapError(
            f"iris.runtime.iris(bootstrap='mpi'): mpi4py cannot be imported ({exc}); pip install mpi4py "
            f"(and an MPI, e.g. pip install mpich), or launch with torchrun and bootstrap='torch'") from exc
    return MPI


# Seconds between the abort hook's message and MPI_Abort (see MpiBootstrap.abort).
ABORT_GRACE_S = 0.25


class MpiBootstrap(Bootstrap):
    """Host collectives over an mpi4py communicator; ``comm`` is that communicator."""

    name = "mpi"
    abort_call = "MPI_Abort"
    quick_allgather = True

    def __init__(self, comm, node_comm):
        self._comm, self._node_comm = comm, node_comm
        self.rank, self.world_size = comm.Get_rank(), comm.Get_size()
        self.local_rank, self.local_size = node_comm.Get_rank(), node_comm.Get_size()
        self.num_nodes = comm.allreduce(1 if self.local_rank == 0 else 0)

    @classmethod
    def start(cls, comm=None) -> MpiBootstrap:
        """Bootstrap over ``comm`` (default ``MPI.COMM_WORLD``, checked against what the launcher
        announced: a world of one under ``mpirun -n 4`` is an :class:`IrisBootstrapError`)."""
        MPI = _mpi()
        if comm is None:
            comm = MPI.COMM_WORLD
            library = " ".join(MPI.Get_library_version().split("\n")[0].split()) if comm.Get_size() == 1 else ""
            _launcher.check_mpi_world(comm.Get_size(), os.environ, library)
        node_comm = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
        boot = cls(comm, node_comm)
        boot.some_of_the_job = comm.Get_size() < MPI.COMM_WORLD.Get_size()
        return boot

    @property
    def comm(self):
        return self._comm

    def allgather(self, obj) -> list:
        return self._comm.allgather(obj)

    def gather(self, obj, root: int = 0) -> list | None:
        return self._comm.gather(obj, root=root)

    def bcast(self, obj, root: int = 0):
        return self._comm.bcast(obj, root=root)

    def allreduce(self, value, op: str = "sum"):
        MPI = _mpi()
        ops = {"sum": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX}
        return self._comm.allreduce(value, op=ops[self.check_op(op)])

    def barrier(self) -> None:
        self._comm.Barrier()

    def gather_int64(self, array: np.ndarray, root: int = 0) -> list[np.ndarray] | None:
        # One Gatherv of the raw words: no pickling, no 2 GiB limit of a pickled message.
        array = np.ascontiguousarray(array, dtype=np.int64).reshape(-1)
        counts = self._comm.gather(array.size, root=root)
        if self.rank != root:
            self._comm.Gatherv(array, None, root=root)
            return None
        gathered = np.empty(sum(counts), dtype=np.int64)
        self._comm.Gatherv(array, [gathered, counts], root=root)
        return np.split(gathered, np.cumsum(counts)[:-1])

    def allgather_int64(self, array: np.ndarray) -> np.ndarray:
        array = np.ascontiguousarray(array, dtype=np.int64).reshape(-1)
        out = np.empty((self.world_size, array.size), dtype=np.int64)
        self._comm.Allgather(array, out)
        return out

    def node_allgather(self, obj) -> list:
        return self._node_comm.allgather(obj)

    def node_barrier(self) -> None:
        self._node_comm.Barrier()

    def abort(self, code: int):
        # MPI_Abort ends the launcher at once, and MPICH's mpiexec can go before it has forwarded
        # what this rank just wrote to stderr: with two ranks aborting together, both messages were
        # lost in 6 of 80 jobs. A moment's wait lets the launcher pass them on (none lost in 120).
        time.sleep(ABORT_GRACE_S)
        self._comm.Abort(code)

    def end_job(self, code: int):
        self._comm.Abort(code)  # no sleep first: it would let the main thread run (see Bootstrap.end_job)

    def close(self) -> None:
        # Each Iris splits off a node communicator; free it, or repeated iris() calls exhaust MPI's ids.
        self._node_comm.Free()
