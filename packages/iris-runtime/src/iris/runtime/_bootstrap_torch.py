"""The torch.distributed bootstrap: ranks from the default process group, host collectives over a
private gloo group.

The default group is the program's when it made one (any backend: gloo, nccl, or both); under
torchrun without one it is made here from ``env://``: ``gloo`` for the cpu backend, and for the
cuda backend torch's own default, ``cpu:gloo,cuda:nccl``, so the program can still run NCCL
collectives on its CUDA tensors (NCCL connects lazily, at the first of them: several ranks on one
GPU, which NCCL refuses, work as long as the program does not use it).

The runtime's collectives carry host objects (heap handles, pids, offsets), which an nccl group
cannot move, and must not interleave with the program's own traffic on the default group; so
they run on a gloo group of all ranks made once per default group (``new_group`` is collective;
later ``iris()`` calls reuse it).

Ending the job: :meth:`TorchBootstrap.abort` exits this process at once (``os._exit``, after
flushing). Under torchrun the elastic agent sees a worker fail and sends SIGTERM to the others
(measured on the CPU machine: within 0.05 s; the job's exit code is then torchrun's 1, not the
rank's); without torchrun, peers blocked in a gloo collective get "Connection closed by peer",
raise, and end the same way through the exception hook.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import operator
import os
import pickle
import socket
import sys

import numpy as np
import torch

from . import _launcher
from ._bootstrap import Bootstrap
from ._errors import IrisBootstrapError
from ._logging import logger

# (default group, the gloo group made from it), so repeated iris() calls make one gloo group.
_private: tuple | None = None


def _dist():
    if not torch.distributed.is_available():
        raise IrisBootstrapError(
            "iris.runtime.iris(bootstrap='torch'): this torch build has no torch.distributed "
            "(torch.distributed.is_available() is False); install a torch build with distributed support, "
            "or launch with mpirun and bootstrap='mpi'")
    return torch.distributed


def init_default_group(backend: str) -> None:
    """Make the default process group from torchrun's ``env://`` variables (``backend``: the
    Iris backend, which decides the torch backend; see the module doc) and destroy it at exit."""
    dist = _dist()
    if not all(name in os.environ for name in _launcher.ENV_INIT_VARS):
        raise _launcher.torch_env_missing(os.environ)
    torch_backend = "gloo" if backend == "cpu" else None  # None: torch's cpu:gloo,cuda:nccl
    dist.init_process_group(backend=torch_backend, init_method="env://")
    logger.debug("torch.distributed: initialised the default group (%s) from env://", dist.get_backend())
    atexit.register(destroy_groups)


def destroy_groups() -> None:
    """At exit, when the runtime made the default group: destroy every process group, then free
    the runtime's references to them (safe to call twice)."""
    dist = torch.distributed
    with contextlib.suppress(Exception):  # exiting: nothing to report to
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    forget_groups()


def forget_groups() -> None:
    """At exit: drop the runtime's references to the process groups and free what only they
    held, while the interpreter is whole. Once torch has destroyed the default group, the
    runtime's reference is its last, and a group left for interpreter finalization to free
    aborted a rank after a clean run under load ("terminate called without an active exception",
    SIGABRT: 7 of 60 runs of examples/00_hello_heap.py under torchrun on a busy 2-core machine,
    0 of 60 with the references dropped here). A group the program made stays the program's to
    destroy."""
    global _private
    _private = None
    gc.collect()


def private_group():
    """The gloo group of all ranks that the runtime talks on (made on first use; collective)."""
    global _private
    dist = _dist()
    default = dist.group.WORLD
    if _private is None or _private[0] is not default:
        if _private is None:
            atexit.register(forget_groups)  # once per group made; forgetting twice is harmless
        _private = (default, dist.new_group(backend="gloo"))
    return _private[1]


class TorchBootstrap(Bootstrap):
    """Host collectives over torch.distributed (gloo). ``comm`` is this object: its lowercase
    methods are mpi4py's object collectives, so ``ctx.comm.allgather(x)`` works under both."""

    name = "torch"
    abort_call = "os._exit"
    quick_allgather = False  # gloo over TCP: 2.6 ms for two ranks on a loaded 2-core machine

    def __init__(self, group):
        dist = _dist()
        self._group = group
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        hosts = self._find_node()
        # torchrun numbers the ranks of a host consecutively, so local_rank equals its LOCAL_RANK
        announced = os.environ.get("LOCAL_RANK")
        if announced is not None and announced != str(self.local_rank):
            logger.warning("LOCAL_RANK=%s but rank %d is local rank %d among the ranks on host %s; Iris uses %d",
                           announced, self.rank, self.local_rank, hosts[self.rank], self.local_rank)

    def _find_node(self) -> list:
        # Ranks of one host share a node, like MPI's COMM_TYPE_SHARED split. Returns every rank's host.
        hosts = self.allgather(socket.gethostname())
        self._node_ranks = [r for r, host in enumerate(hosts) if host == hosts[self.rank]]
        self.local_rank, self.local_size = self._node_ranks.index(self.rank), len(self._node_ranks)
        self.num_nodes = len(set(hosts))
        return hosts

    @classmethod
    def start(cls, backend: str = "cpu") -> TorchBootstrap:
        """Bootstrap over the default process group, making it from ``env://`` when the program
        has not (``backend``: the Iris backend, ``"cpu"`` or ``"cuda"``)."""
        dist = _dist()
        if not dist.is_initialized():
            init_default_group(backend)
        return cls(private_group())

    @property
    def comm(self):
        return self

    @property
    def process_group(self):
        return _dist().group.WORLD

    def allgather(self, obj) -> list:
        out = [None] * self.world_size
        _dist().all_gather_object(out, obj, group=self._group)
        return out

    def gather(self, obj, root: int = 0) -> list | None:
        out = [None] * self.world_size if self.rank == root else None
        _dist().gather_object(obj, out, dst=root, group=self._group)
        return out

    def bcast(self, obj, root: int = 0):
        box = [obj]
        _dist().broadcast_object_list(box, src=root, group=self._group)
        return box[0]

    def allreduce(self, value, op: str = "sum"):
        # Host values are few and small: reduce the gathered list here, in rank order on every
        # rank, so every rank gets the same result (also for floats).
        combine = {"sum": operator.add, "min": min, "max": max}[self.check_op(op)]
        return functools.reduce(combine, self.allgather(value))

    def barrier(self) -> None:
        _dist().barrier(group=self._group)

    def gather_int64(self, array: np.ndarray, root: int = 0) -> list[np.ndarray] | None:
        return self.gather(np.ascontiguousarray(array, dtype=np.int64).reshape(-1), root=root)

    def node_allgather(self, obj) -> list:
        everyone = self.allgather(obj)
        return [everyone[r] for r in self._node_ranks]

    def node_barrier(self) -> None:
        self.barrier()  # the whole job calls it, so a job-wide barrier is also one of the node

    def close(self) -> None:
        pass  # the gloo group stays for the next Iris of this process (new_group is collective)

    def abort(self, code: int):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def __repr__(self) -> str:
        return f"TorchBootstrap(rank={self.rank}, world_size={self.world_size}, gloo group)"


class GroupBootstrap(TorchBootstrap):
    """Host collectives over a gloo process group of some of the job's ranks that the program made
    by hand (``dist.ProcessGroupGloo(store, rank, size, timeout)``, which torch.distributed does
    not list: its object collectives cannot take it), e.g. the members of a group that torch made
    on them alone. Ranks are the group's; objects travel as pickled bytes through the group's
    own tensor collectives. Made by ``iris.runtime.iris(comm=group)``."""

    some_of_the_job = True  # its GPU is the one the process has in the job (Bootstrap.node_slot)

    def __init__(self, group):
        self._group = group
        self.rank, self.world_size = group.rank(), group.size()
        self._find_node()

    @property
    def process_group(self):
        return self._group

    def _allgather_bytes(self, data: bytes) -> list[bytes]:
        size = torch.tensor([len(data)], dtype=torch.int64)
        sizes = [torch.empty_like(size) for _ in range(self.world_size)]
        self._group.allgather([sizes], [size]).wait()
        longest = max(int(s) for s in sizes)
        mine = torch.zeros(longest, dtype=torch.uint8)
        mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)  # a pickle is never empty
        rows = [torch.empty(longest, dtype=torch.uint8) for _ in range(self.world_size)]
        self._group.allgather([rows], [mine]).wait()
        return [row[:int(n)].numpy().tobytes() for row, n in zip(rows, sizes)]

    def allgather(self, obj) -> list:
        return [pickle.loads(b) for b in self._allgather_bytes(pickle.dumps(obj))]

    def gather(self, obj, root: int = 0) -> list | None:
        # host objects are few and small: an allgather, kept on the root
        everyone = self.allgather(obj)
        return everyone if self.rank == root else None

    def bcast(self, obj, root: int = 0):
        return self.allgather(obj if self.rank == root else None)[root]

    def barrier(self) -> None:
        self._group.barrier().wait()

    def __repr__(self) -> str:
        return f"GroupBootstrap(rank={self.rank}, world_size={self.world_size}, gloo group of some ranks)"
