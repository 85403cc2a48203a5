"""Faults in the middle of collectives: the job must end within seconds, say why, leave nothing.

    mpiexec -n 2 python -m mpi4py fault_worker.py skip   # the last rank skips one all-reduce
    mpiexec -n 2 python -m mpi4py fault_worker.py kill   # the last rank is SIGKILLed while the others wait
    mpiexec -n 2 python -m mpi4py fault_worker.py raise  # the last rank raises between two launches

Each scenario first runs one clean all-reduce (so the kernel is compiled and every rank is in
step), then the fault. Lines starting with ``CHECK`` are read by test_collectives_faults.py.
Run with a short ``IRIS_TIMEOUT_S`` (the test uses 3).
"""

from __future__ import annotations

import os
import signal
import time

import torch

import iris.collectives as ic  # first: picks the backend and switches Triton's interpreter on for cpu
import iris.runtime.testing

# isort: split
from collective_kernels import ONE_SHOT, all_reduce_kernel

M = N = 16
BLOCK = 8


def launch(ctx, inp, dst, locks) -> None:
    tiles = (M // BLOCK) * (N // BLOCK)
    all_reduce_kernel[(tiles,)](ctx.get_device_context(), inp, inp, dst, locks, M, N, N, N, N, ctx.rank,
                                ctx.world_size, ONE_SHOT, True, False, False, BLOCK, BLOCK)


def setup(ctx):
    inp = ctx.full((M, N), float(ctx.rank + 1), dtype=torch.float32)
    dst = ctx.zeros((M, N), dtype=torch.float32)
    locks = ctx.zeros(ic.LOCK_WORDS * (M // BLOCK) * (N // BLOCK), dtype=torch.int32)
    ctx.barrier()
    launch(ctx, inp, dst, locks)  # a clean call: compiled, in step
    ctx.barrier()
    want = ctx.world_size * (ctx.world_size + 1) / 2
    assert torch.equal(dst.cpu(), torch.full((M, N), want)), "the clean all-reduce is wrong"
    if ctx.rank == 0:
        files = list(getattr(ctx._heap, "_paths", []))
        print("CHECK heap-files " + " ".join(files), flush=True)
        print(f"CHECK timeout {ctx.timeout_s:g}", flush=True)
    ctx.barrier()
    return inp, dst, locks


def fault_at(what: str) -> None:
    print(f"CHECK fault-at {time.time():.3f} {what}", flush=True)


def scenario_skip(ctx):
    inp, dst, locks = setup(ctx)
    last = ctx.world_size - 1
    if ctx.rank == last:
        fault_at(f"rank {last} skips the second all-reduce")
    else:
        launch(ctx, inp, dst, locks)  # waits for the last rank, which never comes
    ctx.barrier()
    print(f"CHECK rank {ctx.rank} went on past the barrier", flush=True)


def scenario_kill(ctx):
    inp, dst, locks = setup(ctx)
    last = ctx.world_size - 1
    if ctx.rank == last:
        time.sleep(0.5)  # let the others start waiting
        fault_at(f"rank {last} kills itself")
        os.kill(os.getpid(), signal.SIGKILL)
    launch(ctx, inp, dst, locks)
    ctx.barrier()
    print(f"CHECK rank {ctx.rank} went on past the barrier", flush=True)


def scenario_raise(ctx):
    inp, dst, locks = setup(ctx)
    last = ctx.world_size - 1
    if ctx.rank == last:
        fault_at(f"rank {last} raises")
        raise RuntimeError(f"rank {last} fails on purpose between two launches")
    launch(ctx, inp, dst, locks)
    ctx.barrier()
    print(f"CHECK rank {ctx.rank} went on past the barrier", flush=True)


if __name__ == "__main__":
    iris.runtime.testing.run_scenarios(globals(), heap_size=1 << 22)
