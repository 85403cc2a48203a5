"""torch's ``env://`` rendezvous under ``mpirun``: the variables that ``init_process_group`` reads,
from MPI.

``init_process_group(backend="iris")`` meets the other ranks through ``env://`` by default, which
reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``. torchrun sets them; an MPI
launcher does not. So when importing :mod:`iris.collectives.distributed` finds that an MPI
launcher started this process (and torchrun did not) and some of them are missing, it sets the
missing ones from MPI: the rank and size of ``MPI.COMM_WORLD``, ``LOCAL_RANK`` and
``LOCAL_WORLD_SIZE`` from the ranks that share this node, and a rendezvous address that rank 0
picks (its host, or 127.0.0.1 when all ranks share one node, and a free port) and broadcasts.
That makes the import collective under ``mpirun``: every rank imports it, as every rank runs the
same program. Variables that are set are left alone.
"""

from __future__ import annotations

import os
import socket
from collections.abc import MutableMapping

from iris.runtime import _launcher  # which launcher started this process (the runtime's one rule)

#: Set by :func:`fill_from_mpi` when it set the rendezvous from MPI (the backend then makes its
#: Iris context over MPI too, whose host collectives are quick).
FILLED_FROM_MPI = False


def needs_mpi(env: MutableMapping[str, str]) -> bool:
    """Whether an MPI launcher (not torchrun) started this process and ``env://`` lacks a variable."""
    return (_launcher.mpi_launched(env) and not _launcher.torchrun_launched(env)
            and not all(name in env for name in _launcher.ENV_INIT_VARS))


def fill_from_mpi(env: MutableMapping[str, str] | None = None) -> bool:
    """Set the missing ``env://`` variables from MPI (see the module doc); True when it did.
    Collective over ``MPI.COMM_WORLD`` when an MPI launcher started the process."""
    global FILLED_FROM_MPI
    env = os.environ if env is None else env
    if not needs_mpi(env):
        return False
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    node = world.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    local_rank, local_size = node.Get_rank(), node.Get_size()
    node.Free()
    one_node = world.allreduce(1 if local_rank == 0 else 0) == 1
    address = None
    if rank == 0:
        with socket.socket() as s:  # a free port now; torch's store binds it a moment later
            s.bind(("", 0))
            port = s.getsockname()[1]
        address = ("127.0.0.1" if one_node else socket.gethostname(), port)
    host, port = world.bcast(address, root=0)
    for name, value in (("RANK", rank), ("WORLD_SIZE", size), ("LOCAL_RANK", local_rank),
                        ("LOCAL_WORLD_SIZE", local_size), ("MASTER_ADDR", host), ("MASTER_PORT", port)):
        env.setdefault(name, str(value))
    FILLED_FROM_MPI = True
    return True
