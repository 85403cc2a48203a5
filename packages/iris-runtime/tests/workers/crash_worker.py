"""Ranks that fail on purpose: the job must end at once, say why, and leave no heap files.

    mpiexec -n 2 python -m mpi4py crash_worker.py midrun     # last rank raises, the others sit in barrier()
    mpiexec -n 2 python -m mpi4py crash_worker.py midrun_in_torch_group   # the same after init_process_group
    mpiexec -n 2 python -m mpi4py crash_worker.py startup    # last rank fails while the heap is being set up

Lines starting with ``CHECK`` are read by test_crash.py.
"""

from __future__ import annotations

import os
import sys
import time
import types

import iris.runtime  # first: picks the backend and switches Triton's interpreter on for cpu
import iris.runtime.testing
from iris.runtime import _heap_cpu


def scenario_midrun(ctx):
    files = list(getattr(ctx._heap, "_paths", []))
    if ctx.rank == 0:
        print("CHECK heap-files " + " ".join(files), flush=True)
    ctx.barrier()
    if ctx.rank == ctx.world_size - 1:
        time.sleep(0.2)  # let the others block in the barrier first
        print(f"CHECK raising-at {time.time():.3f}", flush=True)
        raise RuntimeError(f"rank {ctx.rank} fails on purpose in the middle of the run")
    ctx.barrier()  # never returns: the failing rank must take the job down
    raise AssertionError(f"rank {ctx.rank} left a barrier that a dead rank never entered")


def scenario_midrun_in_torch_group(ctx):
    # torch.distributed.init_process_group wraps sys.excepthook: it points sys.stderr at a buffer
    # while the hook it wrapped (ours) runs, and writes the buffer out after that hook returns, which
    # an abort never does. The message must get out all the same.
    import torch.distributed as dist

    port = ctx.comm.bcast(29500 + os.getpid() % 2000 if ctx.rank == 0 else None, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=ctx.rank,
                            world_size=ctx.world_size)
    scenario_midrun(ctx)


def fail_while_opening_a_peer_heap(rank: int) -> None:
    """Make ``rank`` raise (not an OSError) when it opens a peer's heap file: at that moment every
    rank has created its file and none has unlinked it yet, the worst time to die."""
    real_os = _heap_cpu.os

    def open_(path, flags, *args):
        if not flags & os.O_CREAT:
            print(f"CHECK injected {path}", flush=True)
            raise RuntimeError(f"injected start-up failure on rank {rank} opening {path}")
        return real_os.open(path, flags, *args)

    names = [name for name in dir(real_os) if not name.startswith("__")]
    proxy = types.SimpleNamespace(**{name: getattr(real_os, name) for name in names})
    proxy.open = open_
    _heap_cpu.os = proxy


def startup() -> None:
    from mpi4py import MPI

    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    if rank == size - 1:
        fail_while_opening_a_peer_heap(rank)
    iris.runtime.iris(heap_size=1 << 20)
    raise AssertionError(f"rank {rank}: start-up succeeded although rank {size - 1} failed in it")


if __name__ == "__main__":
    if sys.argv[1:] == ["startup"]:
        startup()
    else:
        iris.runtime.testing.run_scenarios(globals(), heap_size=1 << 20)
