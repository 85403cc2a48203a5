"""A traced multi-rank exchange and its trace: a Perfetto JSON file, a text summary and a timeline PNG.

    mpirun -n 4 python -m mpi4py examples/05_tracing.py                           # into a new temporary folder
    mpirun -n 4 python -m mpi4py examples/05_tracing.py --out docs/tracing        # the docs' example trace
    mpirun -n 4 python -m mpi4py examples/05_tracing.py --out docs/tracing --grid 16  # GPU, under MPS

Every program of every rank, per iteration (one kernel launch):

1. ``compute``: a user range around some arithmetic on its tile (local loads and stores, untraced);
2. ``put`` of the tile to every rank's inbox, then ``atomic_add`` on a flag at every rank
   (release, system scope): "tile p of rank r has arrived";
3. ``wait``: a user range around spinning on the flags of tile p from every rank (bounded);
4. ``compute``: a second range that ``load``\\s the tiles received and sums them.

The result is checked on the host. Writes ``example_trace.json`` (open it in
https://ui.perfetto.dev), ``example_summary.txt`` and ``example_timeline.png`` into ``--out``.
On one GPU run it under MPS (several ranks' kernels at once); without MPS the waits still end, later.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch
import triton
import triton.language as tl

import iris.runtime  # first: picks the backend and switches Triton's interpreter on for cpu
from iris.device import DeviceContext, TraceEvent
from iris.runtime import trace as trace_tools


# epoch is not specialised on: Triton compiles a separate kernel for an int equal to 1, so the
# warm-up (epoch 1) would not build the kernel the traced launches (epoch 2, 3, ...) use, and
# each rank would compile inside the traced region.
@triton.jit(do_not_specialize=["epoch"])
def exchange(context, src, work, inbox, flags, out, status, n, epoch, max_spins, rank: tl.constexpr,
             world_size: tl.constexpr, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    """One tile per program: compute, put to every rank, signal, wait for every rank, sum."""
    ctx = DeviceContext.initialize(context, rank, world_size, tracing=True)
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n

    span = ctx.tracing.record_event_start(TraceEvent().compute, -1, src + offs, pid, 0, mask=mask)
    x = tl.load(src + offs, mask=mask, other=0.0)
    y = x
    for _ in tl.static_range(ITERS):
        y = y * 0.5 + x
    tl.store(work + offs, y, mask=mask)
    ctx.tracing.record_event_end(span)

    for peer in tl.static_range(world_size):
        ctx.put(work + offs, inbox + rank * n + offs, to_rank=peer, mask=mask)
    for peer in tl.static_range(world_size):
        ctx.atomic_add(flags + rank * grid + pid, 1, to_rank=peer, sem="release", scope="sys")

    span = ctx.tracing.record_event_start(TraceEvent().wait, -1, flags + pid, pid, 0)
    timed_out = 0
    for peer in tl.static_range(world_size):
        seen = tl.atomic_add(flags + peer * grid + pid, 0, sem="acquire", scope="sys")
        spins = 0
        while (seen < epoch) & (spins < max_spins):
            seen = tl.atomic_add(flags + peer * grid + pid, 0, sem="acquire", scope="sys")
            spins += 1
        timed_out += (seen < epoch).to(tl.int32)
    ctx.tracing.record_event_end(span)
    tl.store(status + pid, timed_out)

    span = ctx.tracing.record_event_start(TraceEvent().compute, -1, inbox + offs, pid, 1, mask=mask)
    acc = tl.full([BLOCK], 0.0, tl.float32)
    for peer in tl.static_range(world_size):
        acc += ctx.load(inbox + peer * n + offs, from_rank=rank, mask=mask, other=0.0)
    tl.store(out + offs, acc, mask=mask)
    ctx.tracing.record_event_end(span)


def expected_tile(rank: int, n: int, iters: int, device) -> torch.Tensor:
    x = rank * 1000.0 + torch.arange(n, dtype=torch.float32, device=device)
    y = x.clone()
    for _ in range(iters):
        y = y * 0.5 + x
    return y


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None,
                        help="folder for the trace, summary and picture (default: a new temporary folder)")
    parser.add_argument("--grid", type=int, default=None, help="programs per rank (default: 4 on cpu, 16 on a GPU)")
    parser.add_argument("--block", type=int, default=None, help="elements per tile (default: 64 cpu, 4096 GPU)")
    parser.add_argument("--iters", type=int, default=2, help="traced launches")
    parser.add_argument("--max-spins", type=int, default=1 << 22, help="bound of each wait loop")
    args = parser.parse_args()

    with iris.runtime.iris(heap_size=1 << 26) as ctx:
        rank, world = ctx.rank, ctx.world_size
        on_gpu = ctx.device.type == "cuda"
        grid = args.grid or (16 if on_gpu else 4)
        block = args.block or (4096 if on_gpu else 64)
        n = grid * block
        arith = 8
        src = ctx.zeros(n, dtype=torch.float32)
        src.copy_(rank * 1000.0 + torch.arange(n, dtype=torch.float32, device=ctx.device))
        work = ctx.zeros(n, dtype=torch.float32)
        inbox = ctx.zeros(world * n, dtype=torch.float32)
        flags = ctx.zeros(world * grid, dtype=torch.int32)
        out = ctx.zeros(n, dtype=torch.float32)
        status = ctx.zeros(grid, dtype=torch.int32)
        context = ctx.get_device_context()

        def launch(epoch: int) -> None:
            exchange[(grid,)](context, src, work, inbox, flags, out, status, n, epoch, args.max_spins, rank, world,
                              block, arith)

        # Warm-up (compiles on a GPU) with the host side off: the kernel records nothing.
        ctx.tracing.enable(max_events=grid * (4 + 3 * world) * (args.iters + 1))
        ctx.tracing.disable()
        ctx.barrier()
        launch(1)
        ctx.barrier()
        ctx.tracing.enable(max_events=grid * (4 + 3 * world) * (args.iters + 1))
        ctx.tracing.reset()
        start = time.perf_counter()
        for i in range(args.iters):
            ctx.barrier()
            launch(i + 2)
        ctx.barrier()
        elapsed = time.perf_counter() - start

        want = sum(expected_tile(r, n, arith, ctx.device) for r in range(world))
        ok = torch.allclose(out, want) and int(status.sum()) == 0
        oks = ctx.comm.gather(ok, root=0)

        if rank == 0:
            args.out = args.out or tempfile.mkdtemp(prefix="iris-trace-")
            os.makedirs(args.out, exist_ok=True)
        args.out = ctx.broadcast(args.out if rank == 0 else None)
        path = ctx.tracing.export(os.path.join(args.out, "example_trace.json"))
        if rank == 0:
            trace = trace_tools.load_trace(path)
            summary = trace_tools.summarize(trace)
            header = (f"# tracing: {world} ranks, backend {ctx.backend}, grid {grid} x {block} float32, "
                      f"{args.iters} traced launches in {elapsed * 1e3:.1f} ms\n")
            with open(os.path.join(args.out, "example_summary.txt"), "w") as f:
                f.write(header + summary + "\n")
            print(header + summary)
            try:
                png = trace_tools.plot_timeline(
                    trace, os.path.join(args.out, "example_timeline.png"),
                    title=f"05_tracing: {world} ranks on {ctx.backend}, {args.iters} launches")
                print(f"wrote {path}, {png} and example_summary.txt; open the JSON in https://ui.perfetto.dev")
            except iris.runtime.IrisError as exc:
                print(f"wrote {path}; no picture: {exc}")
            print("results: " + ("correct on every rank" if all(oks) else f"WRONG on ranks "
                                 f"{[r for r, good in enumerate(oks) if not good]}"))
        all_ok = ctx.broadcast(all(oks) if rank == 0 else None)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
