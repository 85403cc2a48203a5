"""Faults in the middle of collectives: the job must end within seconds, say why, leave nothing.

    mpiexec -n 2 python -m mpi4py fault_worker.py skip   # the last rank skips one all-reduce
    mpiexec -n 2 python -m mpi4py fault_worker.py kill   # the last rank is SIGKILLed while the others wait
    mpiexec -n 2 python -m mpi4py fault_worker.py raise  # the last rank raises between two launches
    ... exhaust | double_free | foreign | bad_pointer      # the last rank misuses the heap (below)
    ... recv_without_send   # rank 0 receives from the last rank, which never sends (ccl.recv)
    ... message_size        # GPU: the last rank receives 12 elements where rank 0 sends 10
    ... mismatch_collective | mismatch_tiles | mismatch_shape | mismatch_grid
                        # IRIS_DEBUG=1: the last rank makes another call on the same lock array
    mpiexec -n 2 python -m mpi4py fault_worker.py matched  # IRIS_DEBUG=1: matched calls pass
    ... calls_skip_first | calls_skip_warm | calls_late | calls_hit | calls_hit_workspaces | calls_hit_unread
                        # the call agreement (iris.collectives.ccl): a rank skips the first or the
                        # second all-reduce, or comes late; ranks whose cached calls differ

Each scenario first runs one clean all-reduce (so the kernel is compiled and every rank is in
step), then the fault. Lines starting with ``CHECK`` are read by test_collectives_faults.py.
Run with a short ``IRIS_TIMEOUT_S`` (the test uses 3, and 15 on the GPU).
"""

from __future__ import annotations

import os
import signal
import time

import torch

import iris.collectives as ic  # first: picks the backend and switches Triton's interpreter on for cpu
import iris.runtime.testing
from iris.collectives import ccl

# isort: split
import triton
import triton.language as tl
from collective_kernels import ONE_SHOT, REDUCE_SCATTER, SPINLOCK, TWO_SHOT, all_reduce_kernel
from mpi4py import MPI

M = N = 16
BLOCK = 8


def launch(ctx, inp, dst, locks, variant=ONE_SHOT, m=M, n=N, block_m=BLOCK, block_n=BLOCK, grid=None) -> None:
    """One all-reduce kernel over the top-left ``m x n`` of the ``M x N`` tensors (one program per
    tile unless ``grid`` says how many: the kernel loops over its tiles)."""
    tiles = -(-m // block_m) * -(-n // block_n)
    all_reduce_kernel[(grid or tiles,)](ctx.get_device_context(), inp, inp, dst, locks, m, n, N, N, N, ctx.rank,
                                        ctx.world_size, variant, True, False, False, block_m, block_n)


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
        # in no host call meanwhile: only the kernels' waits can run out (the barrier below is a
        # host wait, which the watchdog bounds too, and would end the job as well)
        time.sleep(60)
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


def scenario_recv_without_send(ctx):
    """Rank 0 receives from the last rank, which never sends: the watchdog names the recv, the
    rank, the peer and the tag instead of a hang."""
    setup(ctx)
    ccl.init_p2p(ctx, tags=2, slots=2, chunk_bytes=1 << 16)
    last = ctx.world_size - 1
    if ctx.rank == 0:
        fault_at(f"rank 0 receives from rank {last}, which never sends")
        ccl.recv(ctx, torch.empty(100, device=ctx.device), last, tag=1)
    else:
        time.sleep(60)  # in no host call: only the recv's wait can run out (as in scenario_skip)
    ctx.barrier()
    print(f"CHECK rank {ctx.rank} went on past the barrier", flush=True)


def scenario_message_size(ctx):
    """The last rank receives 12 elements where rank 0 sends 10 (GPU: the watchdog reports it and
    ends the job, and the receive never returns, so its output is never printed; the cpu backend's
    IrisMessageSizeError is tested in ccl_worker.py p2p_errors)."""
    setup(ctx)
    ccl.init_p2p(ctx, tags=1, slots=2, chunk_bytes=1 << 16)
    last = ctx.world_size - 1
    # One matching message first: the send and recv kernels are compiled before the fault, whose
    # report must not wait on a compilation (on a loaded machine a cold one can outlast the limit).
    if ctx.rank == 0:
        ccl.send(ctx, torch.ones(12, device=ctx.device), last)
    elif ctx.rank == last:
        warm = torch.empty(12, device=ctx.device)
        ccl.recv(ctx, warm, 0)
        assert bool((warm == 1).all()), warm
    ctx.barrier()
    if ctx.rank == 0:
        ccl.send(ctx, torch.ones(10, device=ctx.device), last)
    elif ctx.rank == last:
        fault_at(f"rank {last} receives 12 elements where rank 0 sends 10")
        out = torch.empty(12, device=ctx.device)
        ccl.recv(ctx, out, 0)
        result(ctx, out)  # waits for the receive: it must not end
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
    """A remote store through a pointer that is not on the heap (a plain torch tensor): refused by
    default on the cpu backend; on the GPU with IRIS_DEBUG=1 (a device assert)."""
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


def mismatch(ctx, what: str, **call) -> None:
    """IRIS_DEBUG=1: every rank all-reduces with one-shot in 8 x 8 tiles on a grid of 2, but the last
    rank makes the call ``call`` changes (another collective, tiling, shape or grid) on the same
    lock array. The signatures in the lock records must end the job at once, naming both ranks."""
    inp, dst, locks = setup(ctx)
    last = ctx.world_size - 1
    mine = dict(grid=2)
    if ctx.rank == last:
        fault_at(f"rank {last} {what}")
        mine.update(call)
    launch(ctx, inp, dst, locks, **mine)
    ctx.barrier()
    print(f"CHECK rank {ctx.rank} went on past the barrier", flush=True)


def scenario_mismatch_collective(ctx):
    mismatch(ctx, "calls all_reduce_two_shot where the others call all_reduce_one_shot", variant=TWO_SHOT)


def scenario_mismatch_tiles(ctx):
    # the same number of tiles (4) and grid: only the tile shape differs
    mismatch(ctx, "tiles 16 x 4 where the others tile 8 x 8", block_m=16, block_n=4)


def scenario_mismatch_shape(ctx):
    mismatch(ctx, "all-reduces 16 x 8 where the others all-reduce 16 x 16", n=8)


def scenario_mismatch_grid(ctx):
    mismatch(ctx, "launches 4 programs where the others launch 2", grid=4)


def scenario_matched(ctx):
    """IRIS_DEBUG=1: every lock-using collective, back to back on one lock array each, with the grid
    (and, for the all-reduces, the shape) changing from call to call, the same on every rank: no
    mismatch, right sums. (reduce_scatter's owners follow the tile count, so its lock array keeps
    one shape.)"""
    inp = ctx.full((M, N), float(ctx.rank + 1), dtype=torch.float32)
    dst = ctx.zeros((M, N), dtype=torch.float32)
    want = ctx.world_size * (ctx.world_size + 1) / 2
    tiles = (M // BLOCK) * (N // BLOCK)
    for variant in (ONE_SHOT, TWO_SHOT, SPINLOCK, REDUCE_SCATTER):
        locks = ctx.zeros(ic.lock_words(M, N, BLOCK, BLOCK), dtype=torch.int32)
        for grid, m in ((tiles, M), (2, M), (1, M if variant == REDUCE_SCATTER else M // 2)):
            dst.zero_()
            ctx.barrier()  # the spinlock adds into every rank's dst: zeroed everywhere first
            launch(ctx, inp, dst, locks, variant=variant, m=m, grid=grid)
            ctx.barrier()
            got = dst.cpu()[:m].reshape(m // BLOCK, BLOCK, N // BLOCK, BLOCK).permute(0, 2, 1, 3)
            got = got.reshape(-1, BLOCK, BLOCK)
            mine = (ic.reduce_scatter_tiles(ctx.rank, got.shape[0], ctx.world_size) if variant == REDUCE_SCATTER
                    else range(got.shape[0]))
            for t in mine:
                assert torch.equal(got[t], torch.full((BLOCK, BLOCK), want)), (variant, grid, m, t, got[t])
    print(f"CHECK rank {ctx.rank} matched calls passed", flush=True)


def ccl_setup(ctx):
    """For the call agreement's cases: what setup() prints, without its raw kernel."""
    if ctx.rank == 0:
        print("CHECK heap-files " + " ".join(getattr(ctx._heap, "_paths", [])), flush=True)
        print(f"CHECK timeout {ctx.timeout_s:g}", flush=True)
    ctx.barrier()


def result(ctx, x) -> None:
    # What a program would print: a call that went wrong must never get here.
    print(f"CHECK result rank {ctx.rank}: {x[:4].tolist()}", flush=True)


def scenario_calls_skip_first(ctx):
    """The last rank skips the first all-reduce and goes on to close(): its peers wait in the
    call's host agreement, it waits in close()'s barrier."""
    from iris.collectives import ccl

    ccl_setup(ctx)
    last = ctx.world_size - 1
    x = torch.ones(1000, device=ctx.device)
    if ctx.rank == last:
        fault_at(f"rank {last} skips the first all_reduce")
    else:
        ccl.all_reduce(ctx, x, x)
        result(ctx, x)
    ctx.close()


def scenario_calls_skip_warm(ctx):
    """Every rank makes one all-reduce, then the last rank skips the second (a cached call, no
    host agreement): the others' kernels wait for it, and no rank may print a result."""
    from iris.collectives import ccl

    ccl_setup(ctx)
    last = ctx.world_size - 1
    x = torch.ones(1000, device=ctx.device)
    ccl.all_reduce(ctx, x, x)
    if ctx.rank == last:
        fault_at(f"rank {last} skips the second all_reduce")
    else:
        ccl.all_reduce(ctx, x, x)
        result(ctx, x)
    ctx.close()


def scenario_calls_late(ctx):
    """The last rank comes to the first all-reduce long after the time limit, in no host call
    meanwhile: the others' host agreement runs out, and its report names the missing rank."""
    from iris.collectives import ccl

    ccl_setup(ctx)
    last = ctx.world_size - 1
    x = torch.ones(1000, device=ctx.device)
    if ctx.rank == last:
        fault_at(f"rank {last} sleeps before its first all_reduce")
        time.sleep(60)
    ccl.all_reduce(ctx, x, x)
    result(ctx, x)


def scenario_group_calls_late(ctx):
    """calls_late on a group of the first and the last rank: the group's host agreement has the
    same deadline as the context's (the group's own board of host waits), and its report names the
    group and the missing member."""
    from iris.collectives import ccl

    ccl_setup(ctx)
    last = ctx.world_size - 1
    group = ctx.new_group(sorted({0, last}), workspace_size=1 << 20)
    x = torch.ones(1000, device=ctx.device)
    if group is not None:
        if ctx.rank == last:
            fault_at(f"rank {last} sleeps before its first all_reduce on the group")
            time.sleep(60)
        ccl.all_reduce(ctx, x, x, group=group)
        result(ctx, x)
    ctx.close()


def scenario_group_calls_skip_first(ctx):
    """calls_skip_first on a group: the last rank skips the group's first all-reduce and goes on to
    the group's barrier; the others wait in the call's host agreement of the group. The group's
    board sees two different calls: the job ends at once, naming both."""
    from iris.collectives import ccl

    ccl_setup(ctx)
    last = ctx.world_size - 1
    group = ctx.new_group(sorted({0, last}), workspace_size=1 << 20)
    x = torch.ones(1000, device=ctx.device)
    if group is not None:
        if ctx.rank == last:
            fault_at(f"rank {last} skips the first all_reduce on the group")
        else:
            ccl.all_reduce(ctx, x, x, group=group)
            result(ctx, x)
        group.barrier()
    ctx.close()


def _cached_calls(ctx, first, second):
    # Both calls on every rank (their plans cached), then rank 0 makes the first, the others the second.
    from iris.collectives import ccl

    ccl_setup(ctx)
    for t in (first, second):
        ccl.all_reduce(ctx, t, t)
    fault_at("rank 0 makes its first call, the others their second")
    mine = first if ctx.rank == 0 else second
    ccl.all_reduce(ctx, mine, mine)
    result(ctx, mine)


def scenario_calls_hit(ctx):
    """Cached calls that differ but share a workspace (1000 and 1024 elements): the kernels' own
    check (the device side of the call agreement) raises on every rank."""
    _cached_calls(ctx, torch.ones(1000, device=ctx.device), torch.ones(1024, device=ctx.device))


def scenario_calls_hit_workspaces(ctx):
    """Cached calls that differ in dtype (fp32 and fp64: different workspaces, so the kernels never
    meet): the watchdog sees the ranks' kernels in different calls and ends the job."""
    _cached_calls(ctx, torch.ones(1000, device=ctx.device),
                  torch.ones(1000, dtype=torch.float64, device=ctx.device))


def scenario_calls_hit_unread(ctx):
    """calls_hit_workspaces with the host unable to read the heap's words (as on the GPU, where a
    host copy sits in the driver while the main thread waits for a spinning kernel): the kernels'
    reports carry each rank's latest call, which the watchdog names."""
    ctx._watchdog.device_calls = lambda: None
    _cached_calls(ctx, torch.ones(1000, device=ctx.device),
                  torch.ones(1000, dtype=torch.float64, device=ctx.device))


if __name__ == "__main__":
    iris.runtime.testing.run_scenarios(globals(), heap_size=1 << 22)
