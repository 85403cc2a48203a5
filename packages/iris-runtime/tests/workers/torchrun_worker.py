"""iris-runtime under torchrun: the ranks bootstrap through torch.distributed, not MPI.

    python -m torch.distributed.run --standalone --nproc-per-node 4 torchrun_worker.py [scenario ...]
    python -m torch.distributed.run ... torchrun_worker.py --own-group [scenario ...]

By default ``iris()`` (bootstrap ``auto``) makes the default process group itself from torchrun's
environment. ``--own-group`` makes it first, as a torch program does (gloo on the cpu backend,
nccl on cuda: the runtime must bring its own gloo group for host objects), then asks for
``bootstrap="torch"``. Most scenarios are runtime_worker.py's, which run under mpiexec too: the
same checks through either bootstrap. Rank 0 prints ``PASS <name>``; ``CHECK`` lines are read by
test_runtime_torchrun.py.
"""

from __future__ import annotations

import json
import os
import sys
import weakref

import numpy as np
import torch
import torch.distributed as dist

import iris.runtime  # first: picks the backend and switches Triton's interpreter on for cpu
import iris.runtime.testing
from iris.runtime import IrisBootstrapError, IrisUsageError, _bootstrap_torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runtime_worker import (
    BLOCK,
    expect_error,
    fill_local,
    scenario_barrier,
    scenario_broadcast,
    scenario_close_and_reopen,
    scenario_device_context,
    scenario_heap_bases,
    scenario_heap_files_unlinked,
    scenario_kernels_write_every_peer,
    scenario_verify_allocation_order,
)
from tracing_worker import check_known_events, run_known_ops

REUSED = (scenario_heap_bases, scenario_heap_files_unlinked, scenario_device_context,
          scenario_kernels_write_every_peer, scenario_broadcast, scenario_barrier, scenario_verify_allocation_order,
          scenario_close_and_reopen)


def scenario_ranks(ctx):
    n, rank = ctx.world_size, ctx.rank
    assert ctx.bootstrap == "torch", ctx.bootstrap
    assert dist.is_initialized()
    assert rank == dist.get_rank() == int(os.environ["RANK"]), (rank, os.environ["RANK"])
    assert n == dist.get_world_size() == int(os.environ["WORLD_SIZE"]), (n, os.environ["WORLD_SIZE"])
    assert ctx.local_rank == int(os.environ["LOCAL_RANK"]) and ctx.num_nodes == 1, (ctx.local_rank, ctx.num_nodes)
    assert ctx.process_group is dist.group.WORLD
    # gloo's allgather takes milliseconds: the host collectives do not agree on every call here,
    # though ctx.reach works (asked explicitly)
    assert ctx.quick_allgather is False
    words = ctx._boot.allgather_int64(np.array([rank, -1, 1 << 40], dtype=np.int64))
    assert words.dtype == np.int64 and words.tolist() == [[q, -1, 1 << 40] for q in range(n)], words
    x = ctx.zeros(64, dtype=torch.float32)
    assert [r.ident for r in ctx.reach([x])] == [("heap",)]
    ctx.free(x)
    if ctx.backend == "cpu":
        assert dist.get_backend() == "gloo", dist.get_backend()
    else:
        assert ctx.device.index == ctx.local_rank % torch.cuda.device_count(), ctx.device
    assert "mpi4py.MPI" not in sys.modules, "the torch bootstrap must not start MPI"
    # ctx.comm: mpi4py's lowercase object collectives, over the runtime's gloo group
    assert ctx.comm.allgather(rank) == list(range(n))
    gathered = ctx.comm.gather({"r": rank}, root=n - 1)
    assert gathered == ([{"r": r} for r in range(n)] if rank == n - 1 else None), gathered
    assert ctx.comm.bcast("from 0" if rank == 0 else None) == "from 0"
    assert ctx.comm.allreduce(rank) == n * (n - 1) // 2
    assert (ctx.comm.allreduce(rank, op="min"), ctx.comm.allreduce(rank, op="max")) == (0, n - 1)
    assert ctx.comm.allreduce([rank]) == list(range(n))  # like mpi4py: objects combine with +
    ctx.comm.barrier()
    expect_error(IrisUsageError, lambda: ctx.comm.allreduce(1, op="prod"), "allreduce(op='prod')", "'sum', 'min'")
    if rank == 0:
        print(f"CHECK ranks torch {dist.get_backend()} {n}", flush=True)


def scenario_resident_grid_agrees(ctx):
    # Every rank asks for a different amount of work; all get the smallest (the bootstrap's MIN).
    # On a GPU the grid depends on a compiled kernel (the H200 run without one failed here): any
    # kernel holds at least one program per SM, more than the 10 asked for.
    compiled = None
    if ctx.device.type == "cuda":
        out = ctx.zeros(BLOCK, dtype=torch.float32)
        compiled = fill_local[(1,)](out, 1.0, BLOCK)
    assert ctx.resident_grid(10 + ctx.rank, compiled) == 10
    assert ctx.comm.allgather(ctx.resident_grid(3 + (ctx.rank % 2), compiled)) == [3] * ctx.world_size


def scenario_groups(ctx):
    # Groups under the torch bootstrap: numbered in the list's order (torch's new_group would sort
    # them), host collectives and a barrier among the members, a group of one rank (None on the
    # others), the group's resident grid agreed among its members
    W, r = ctx.world_size, ctx.rank
    order = list(reversed(range(W)))
    g = ctx.new_group(order, workspace_size=1 << 16)
    assert g is not None and (g.rank, g.size, g.ranks) == (order.index(r), W, tuple(order)), g
    assert g.allgather(r) == order and g.comm.allgather(g.rank) == list(range(W))
    g.barrier()
    alone = ctx.new_group([W - 1], workspace_size=1 << 16)
    assert (alone is None) == (r != W - 1), alone
    if alone is not None:
        assert alone.allgather("x") == ["x"] and (alone.rank, alone.size) == (0, 1)
    compiled = None
    if ctx.device.type == "cuda":
        compiled = fill_local[(1,)](ctx.zeros(BLOCK, dtype=torch.float32), 1.0, BLOCK)
    assert g.resident_grid(10 + r, compiled) == 10
    ctx.barrier()
    if r == 0:
        print(f"CHECK groups torch {g.ranks}", flush=True)


def scenario_tracing_export(ctx):
    """tracing.export gathers every rank's events through the bootstrap into one file."""
    ctx.tracing.enable(max_events=1024)
    ctx.tracing.reset()
    data, flags = run_known_ops(ctx, trace=True)
    events, dropped = ctx.tracing.recorded()
    assert dropped == 0
    check_known_events(ctx, events, data, flags)
    out_dir = ctx.broadcast(__import__("tempfile").mkdtemp(prefix="iris-trace-") if ctx.rank == 0 else None)
    path = os.path.join(out_dir, "trace.json")
    assert ctx.tracing.export(path) == path
    if ctx.rank == 0:
        with open(path) as f:
            trace = json.load(f)
        names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
        assert names == {f"rank {r}" for r in range(ctx.world_size)}, names
        per_rank = [sum(1 for e in trace["traceEvents"] if e.get("ph") != "M" and e.get("pid") == r)
                    for r in range(ctx.world_size)]
        assert all(count >= len(events) for count in per_rank), (per_rank, len(events))
        os.unlink(path)
        os.rmdir(out_dir)
    ctx.tracing.disable()
    ctx.barrier()


def scenario_mpi_under_torchrun_fails(ctx):
    """bootstrap='mpi' under torchrun sees a world of one where torchrun started several: an error."""
    if ctx.world_size == 1:
        return  # a world of one is what torchrun started: nothing is wrong
    text = expect_error(IrisBootstrapError, lambda: iris.runtime.iris(heap_size=1 << 20, bootstrap="mpi"),
                        "iris.runtime.iris(bootstrap='mpi')", "torchrun started this process",
                        f"WORLD_SIZE={ctx.world_size}", "bootstrap='torch'")
    if ctx.rank == 0:
        print(f"CHECK mpi-error {text}", flush=True)


def own_group() -> None:
    """Make the default process group as a torch program does, before Iris exists."""
    from iris.runtime._backend import resolve_backend

    backend = "nccl" if resolve_backend(None) == "cuda" else "gloo"
    dist.init_process_group(backend=backend)
    if dist.get_rank() == 0:
        print(f"CHECK own-group {dist.get_backend()}", flush=True)


if __name__ == "__main__":
    argv = sys.argv[1:]
    options = {"heap_size": 1 << 22}
    if argv[:1] == ["--own-group"]:
        argv = argv[1:]
        own_group()
        options["bootstrap"] = "torch"
    iris.runtime.testing.run_scenarios(globals(), argv, **options)
    # (default group, the runtime's gloo group), kept for the next iris(): once torch has destroyed
    # the default group, the runtime's reference is the last one (the gloo group stays referenced
    # by the exception hook's bootstrap)
    made = _bootstrap_torch._private
    freed = weakref.ref(made[0]) if made is not None else None
    del made
    if options.get("bootstrap") and dist.is_initialized():
        dist.destroy_process_group()  # ours to destroy: torch warns at exit otherwise (nccl)
    # what the runtime's exit handler runs: the default group must be gone before interpreter
    # finalization, where destroying it aborted ranks under load
    _bootstrap_torch.forget_groups() if options.get("bootstrap") else _bootstrap_torch.destroy_groups()
    if freed is not None and int(os.environ.get("RANK", "0")) == 0:
        print(f"CHECK groups-freed {freed() is None}", flush=True)
