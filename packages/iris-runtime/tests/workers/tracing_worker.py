"""Multi-rank scenarios of device tracing: one launch per world size runs all of them.

    mpiexec -n 4 python -m mpi4py tracing_worker.py [scenario ...]

Every rank runs a kernel whose operations are known in advance (per program: one user ``compute``
range around 3 stores to every rank and 2 atomic adds, then one ``wait`` instant) and checks the
events it recorded against that list: ids, target ranks, bytes, addresses, program ids, nesting.
``export`` writes ``trace_w<world>.json`` into ``$IRIS_TRACE_TEST_DIR`` for test_tracing.py to
validate; lines starting with ``CHECK`` are read there.
"""

from __future__ import annotations

import collections
import importlib.util
import os
import shutil
import sys

import torch
import triton
import triton.language as tl

import iris.runtime  # first: picks the backend and switches Triton's interpreter on for cpu
import iris.runtime.testing
from iris.device import EVENT_IDS, DeviceContext, TraceEvent
from iris.device import _layout as layout
from iris.runtime import trace as trace_cli

N = 100       # elements per message: not a multiple of BLOCK, so the last program is partly masked
BLOCK = 64
GRID = 2
PID_N = 7     # the pid_n the kernel passes to its own events, to find it again
STORES_PER_PEER = 3


@triton.jit
def known_ops(context, data, flags, n, rank: tl.constexpr, world_size: tl.constexpr, BLOCK: tl.constexpr,
              TRACE: tl.constexpr):
    """Per program: a compute range around 3 stores to every rank and 2 atomic adds, then an instant."""
    ctx = DeviceContext.initialize(context, rank, world_size, tracing=TRACE)
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    span = ctx.tracing.record_event_start(TraceEvent().compute, -1, data + offs, pid, 7, mask=mask)
    values = (rank * 1000 + offs).to(tl.float32)
    for peer in tl.static_range(world_size):
        for rep in tl.static_range(3):
            ctx.store(data + (rep * world_size + rank) * n + offs, values + rep, to_rank=peer, mask=mask)
    ctx.atomic_add(flags + rank, 1, to_rank=(rank + 1) % world_size)
    ctx.atomic_add(flags + rank, 1, to_rank=(rank + world_size - 1) % world_size)
    ctx.tracing.record_event_end(span)
    ctx.tracing.record_event(TraceEvent().wait, rank, flags + rank, pid, 7)


def events_per_program(world: int) -> int:
    return 1 + STORES_PER_PEER * world + 2 + 1


def run_known_ops(ctx, trace: bool):
    """Poison, run ``known_ops`` on every rank, check the data moved; return (data, flags)."""
    world = ctx.world_size
    data = ctx.full((STORES_PER_PEER * world * N,), -1.0, dtype=torch.float32)
    flags = ctx.zeros((world,), dtype=torch.int32)
    ctx.barrier()
    known_ops[(GRID,)](ctx.get_device_context(), data, flags, N, ctx.rank, world, BLOCK, trace)
    ctx.barrier()
    offs = torch.arange(N, dtype=torch.float32, device=ctx.device)
    for rep in range(STORES_PER_PEER):
        for src in range(world):
            got = data[(rep * world + src) * N:(rep * world + src + 1) * N]
            assert torch.equal(got, src * 1000 + offs + rep), f"rank {ctx.rank}: wrong data from rank {src} rep {rep}"
    expect = [GRID * ((s + 1) % world == ctx.rank) + GRID * ((s + world - 1) % world == ctx.rank) for s in range(world)]
    assert flags.cpu().tolist() == expect, f"rank {ctx.rank}: flags {flags.cpu().tolist()} != {expect}"
    return data, flags


def check_known_events(ctx, events: torch.Tensor, data: torch.Tensor, flags: torch.Tensor) -> None:
    """``events`` (from tracing.recorded()) are exactly the events ``known_ops`` records."""
    rank, world = ctx.rank, ctx.world_size
    rows = events.tolist()
    assert len(rows) == GRID * events_per_program(world), f"rank {rank}: {len(rows)} events"
    f = layout
    for p in range(GRID):
        mine = [r for r in rows if r[f.EVENT_PID] == p]
        active = min(BLOCK, N - p * BLOCK)
        by_id = collections.defaultdict(list)
        for r in mine:
            assert r[f.EVENT_RANK] == rank, f"rank {rank}: event says rank {r[f.EVENT_RANK]}"
            assert r[f.EVENT_START] > 0 and r[f.EVENT_SM] >= 0, r
            if ctx.backend == "cpu":
                assert r[f.EVENT_SM] == p, f"interpreter SM id should be the program id: {r}"
            by_id[r[f.EVENT_ID]].append(r)
        assert sorted(by_id) == sorted(EVENT_IDS[n] for n in ("compute", "store", "atomic_add", "wait")), by_id.keys()

        (compute,) = by_id[EVENT_IDS["compute"]]
        assert compute[f.EVENT_TARGET] == -1 and compute[f.EVENT_BYTES] == active * 4, compute
        assert compute[f.EVENT_ADDRESS] == data.data_ptr() + p * BLOCK * 4, compute
        assert (compute[f.EVENT_PID_M], compute[f.EVENT_PID_N]) == (p, PID_N), compute
        assert compute[f.EVENT_END] >= compute[f.EVENT_START], compute

        stores = by_id[EVENT_IDS["store"]]
        assert collections.Counter(r[f.EVENT_TARGET] for r in stores) == {q: STORES_PER_PEER for q in range(world)}
        expect_addr = collections.Counter(
            data.data_ptr() + ((rep * world + rank) * N + p * BLOCK) * 4
            for rep in range(STORES_PER_PEER) for _ in range(world))
        assert collections.Counter(r[f.EVENT_ADDRESS] for r in stores) == expect_addr, stores
        assert all(r[f.EVENT_BYTES] == active * 4 for r in stores), stores
        assert all((r[f.EVENT_PID_M], r[f.EVENT_PID_N]) == (-1, -1) for r in stores), stores

        atomics = by_id[EVENT_IDS["atomic_add"]]
        assert sorted(r[f.EVENT_TARGET] for r in atomics) == sorted([(rank + 1) % world, (rank + world - 1) % world])
        assert all(r[f.EVENT_BYTES] == 4 and r[f.EVENT_ADDRESS] == flags.data_ptr() + rank * 4 for r in atomics)

        (wait,) = by_id[EVENT_IDS["wait"]]
        assert wait[f.EVENT_END] == 0 and wait[f.EVENT_TARGET] == rank and wait[f.EVENT_BYTES] == 4, wait

        # The operations sit inside the compute range and each one is closed.
        for r in stores + atomics:
            assert compute[f.EVENT_START] <= r[f.EVENT_START] <= r[f.EVENT_END] <= compute[f.EVENT_END], (compute, r)
        assert wait[f.EVENT_START] >= compute[f.EVENT_END], (compute, wait)


def scenario_not_enabled(ctx):
    """A traced kernel on a host that never enabled tracing runs and records nothing."""
    assert ctx.tracing.counter is None
    run_known_ops(ctx, trace=True)
    events, dropped = ctx.tracing.recorded()
    assert events.shape == (0, layout.TRACE_EVENT_FIELDS) and dropped == 0


def scenario_known_events(ctx):
    ctx.tracing.enable(max_events=1024)
    ctx.tracing.reset()
    data, flags = run_known_ops(ctx, trace=True)
    events, dropped = ctx.tracing.recorded()
    assert dropped == 0, dropped
    check_known_events(ctx, events, data, flags)
    if ctx.rank == 0:
        print(f"CHECK known-events {len(events)} per rank", flush=True)


def scenario_compiled_out(ctx):
    """tracing=False kernels record nothing even with tracing enabled on the host."""
    ctx.tracing.enable(max_events=1024)
    ctx.tracing.reset()
    run_known_ops(ctx, trace=False)
    assert int(ctx.tracing.counter.item()) == 0
    assert ctx.tracing.recorded()[0].shape[0] == 0
    assert int(ctx.tracing.buffer.abs().sum()) == 0


def scenario_host_disabled(ctx):
    """After disable(), traced kernels claim no slot; enable() again and they record."""
    ctx.tracing.enable(max_events=1024)
    ctx.tracing.reset()
    ctx.tracing.disable()
    run_known_ops(ctx, trace=True)
    assert int(ctx.tracing.counter.item()) == 0 and int(ctx.tracing.buffer.abs().sum()) == 0
    ctx.tracing.enable(max_events=1024)  # same size: the buffer is kept, recording resumes
    data, flags = run_known_ops(ctx, trace=True)
    events, dropped = ctx.tracing.recorded()
    assert dropped == 0
    check_known_events(ctx, events, data, flags)


def scenario_dropped(ctx):
    """Past max_events the counter keeps counting and nothing is written out of bounds."""
    capacity = 5
    ctx.tracing.enable(max_events=capacity)
    ctx.tracing.reset()
    # Publish a buffer with guard rows behind the capacity, to see any write past it.
    guard = torch.full((capacity + 40, layout.TRACE_EVENT_FIELDS), -7, dtype=torch.int64, device=ctx.device)
    guard[:capacity] = 0
    ctx.tracing.buffer = guard[:capacity]
    ctx.tracing._publish()
    per_launch = GRID * events_per_program(ctx.world_size)
    for launch in (1, 2):
        run_known_ops(ctx, trace=True)
        events, dropped = ctx.tracing.recorded()
        assert events.shape == (capacity, layout.TRACE_EVENT_FIELDS), events.shape
        assert dropped == launch * per_launch - capacity, (launch, dropped)
        assert int(ctx.tracing.counter.item()) == launch * per_launch
        assert bool((events[:, layout.EVENT_ID] > 0).all()), events
        assert bool((guard[capacity:] == -7).all()), f"rank {ctx.rank}: an event was written past max_events"
    ctx.tracing.reset()
    assert ctx.tracing.recorded()[1] == 0
    ctx.tracing.enable(max_events=1024)  # a new size: a fresh buffer replaces the guarded one
    if ctx.rank == 0:
        print(f"CHECK dropped {per_launch * 2 - capacity} of {per_launch * 2}", flush=True)


def scenario_export(ctx):
    """Every rank exports; rank 0 keeps only 10 events (the rest are dropped)."""
    world = ctx.world_size
    ctx.tracing.enable(max_events=10 if ctx.rank == 0 else 1024)
    ctx.tracing.reset()
    data, flags = run_known_ops(ctx, trace=True)
    events, _ = ctx.tracing.recorded()
    if ctx.rank != 0:
        check_known_events(ctx, events, data, flags)
    out_dir = os.environ.get("IRIS_TRACE_TEST_DIR") or ctx.broadcast(
        __import__("tempfile").mkdtemp(prefix="iris-trace-") if ctx.rank == 0 else None)
    path = os.path.join(out_dir, f"trace_w{world}.json")
    assert ctx.tracing.export(path) == path
    assert os.path.exists(path)
    if ctx.rank == 0:
        info = {"data": data.data_ptr(), "flags": flags.data_ptr()}
        print(f"CHECK exported {path} {info}", flush=True)
        png = os.path.join(out_dir, f"timeline_w{world}.png")
        assert trace_cli.main(["summary", path]) == 0
        if importlib.util.find_spec("matplotlib") is None:  # the optional 'trace' extra (the GPU image lacks it)
            assert trace_cli.main(["plot", path, "--png", png]) == 2 and not os.path.exists(png)
            print("CHECK plot skipped: matplotlib is not installed", flush=True)
        else:
            assert trace_cli.main(["plot", path, "--png", png]) == 0
            with open(png, "rb") as f:
                assert f.read(8) == b"\x89PNG\r\n\x1a\n", "plot did not write a PNG"
    ctx.barrier()
    if ctx.rank == 0 and not os.environ.get("IRIS_TRACE_TEST_DIR"):  # a folder of our own: leave nothing
        shutil.rmtree(out_dir)


if __name__ == "__main__":
    if not sys.argv[1:]:
        sys.argv += ["not_enabled", "known_events", "compiled_out", "host_disabled", "dropped", "export"]
    iris.runtime.testing.run_scenarios(globals())
