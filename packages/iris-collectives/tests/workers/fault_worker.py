"""Faults in the middle of collectives: the job must end within seconds, say why, leave nothing.

    mpiexec -n 2 python -m mpi4py fault_worker.py skip   # the last rank skips one all-reduce
    mpiexec -n 2 python -m mpi4py fault_worker.py kill   # the last rank is SIGKILLed while the others wait
    mpiexec -n 2 python -m mpi4py fault_worker.py raise  # the last rank raises between two launches
    ... exhaust | double_free | foreign | bad_pointer      # the last rank misuses the heap (below)

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
import triton
import triton.language as tl
from collective_kernels import ONE_SHOT, all_reduce_kernel
from mpi4py import MPI

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


def iris_error_name(exc: BaseException) -> str:
    """The class name of the IrisError ``exc`` is or wraps (in its chain or, for Triton's
    interpreter errors, its message), else of ``exc`` itself."""
    seen = exc
    while seen is not None:
        if isinstance(seen, iris.runtime.IrisError):
            return type(seen).__name__
        seen = seen.__cause__ or seen.__context__
    for name in ("IrisUsageError", "NotOnHeapError", "HeapExhaustedError"):
        if name in str(exc):
            return name
    return type(exc).__name__


def misuse(ctx, what: str, act) -> None:
    """The last rank does ``act`` (which must raise an IrisError) while the others wait in an
    all-reduce for it: its error must end the whole job."""
    inp, dst, locks = setup(ctx)
    last = ctx.world_size - 1
    if ctx.rank == last:
        fault_at(f"rank {last}: {what}")
        try:
            act()
        except Exception as exc:
            # Triton's interpreter wraps what a kernel raises: name the IrisError inside, if any
            print(f"CHECK raised {iris_error_name(exc)}", flush=True)
            raise
        raise AssertionError(f"{what}: no IrisError")
    launch(ctx, inp, dst, locks)
    ctx.barrier()
    print(f"CHECK rank {ctx.rank} went on past the barrier", flush=True)


def scenario_exhaust(ctx):
    misuse(ctx, "allocates more than the heap", lambda: ctx.zeros(ctx.heap_size // 4 + 1, dtype=torch.float32))


def scenario_double_free(ctx):
    def act():
        t = ctx.zeros(16, dtype=torch.float32)
        ctx.free(t)
        ctx.free(t)
    misuse(ctx, "frees a tensor twice", act)


def scenario_foreign(ctx):
    def act():
        other = iris.runtime.iris(heap_size=1 << 20, comm=MPI.COMM_SELF, timeout_s=0)
        ctx.free(other.zeros(16, dtype=torch.float32))
    misuse(ctx, "frees a tensor of another context", act)


@triton.jit
def remote_store_kernel(context, target, peer, rank: tl.constexpr, world_size: tl.constexpr):
    ctx = ic.DeviceContext.initialize(context, rank, world_size)
    offs = tl.arange(0, 16)
    ctx.store(target + offs, tl.zeros([16], tl.float32), peer)


def scenario_bad_pointer(ctx):
    """IRIS_DEBUG=1: a remote store through a pointer that is not on the heap."""
    def act():
        off_heap = torch.zeros(16, dtype=torch.float32, device=ctx.device)
        remote_store_kernel[(1,)](ctx.get_device_context(), off_heap, 0, ctx.rank, ctx.world_size)
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
    if ctx.device.type == "cuda" and ctx.rank == ctx.world_size - 1:
        # a device assert ends this process's CUDA context: no IrisError reaches Python here
        setup(ctx)
        fault_at(f"rank {ctx.rank}: stores through a pointer off the heap")
        act()
        raise AssertionError("the debug check did not stop the kernel")
    misuse(ctx, "stores through a pointer off the heap", act)


if __name__ == "__main__":
    iris.runtime.testing.run_scenarios(globals(), heap_size=1 << 22)
