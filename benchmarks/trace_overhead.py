"""What does device tracing cost? One copy kernel through ``ctx.load``/``ctx.store``, three builds.

    python benchmarks/trace_overhead.py                          # GPU: 256 MiB float32 copy, 1 rank
    mpirun -n 2 python -m mpi4py benchmarks/trace_overhead.py    # each rank copies into the next one's heap
    python benchmarks/trace_overhead.py --quick                  # CPU smoke test (Triton's interpreter, tiny)

Variants of the same kernel (each program copies one BLOCK: a load from this rank, a store to the
next rank): ``off`` (``tracing=False``, compiled out: its PTX never mentions tracing, which
packages/iris-runtime/tests/test_tracing.py checks), ``idle`` (``tracing=True``, disabled on the
host: a few loads and a branch per event) and ``on`` (enabled: 2 events per program, each a slot
claim, a record store and two clock reads). The floor is torch's ``dst.copy_(src)`` of the same
bytes. Prints the median time of each, its bandwidth and the change against ``off``; writes
``trace_overhead[_cpu][_quick].{json,md,png}`` into ``--out``. Results: docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import iris.runtime  # first: picks the backend and switches Triton's interpreter on for cpu

# isort: split
import triton
import triton.language as tl
from common import NO_PLOT, pyplot

from iris.device import DeviceContext

EVENTS_PER_PROGRAM = 2


@triton.jit
def copy_kernel(context, src, dst, n, rank: tl.constexpr, world_size: tl.constexpr, BLOCK: tl.constexpr,
                TRACE: tl.constexpr):
    """dst (at the next rank) = src (here), one BLOCK per program, through the device context."""
    ctx = DeviceContext.initialize(context, rank, world_size, tracing=TRACE)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    values = ctx.load(src + offs, from_rank=rank, mask=mask)
    ctx.store(dst + offs, values, to_rank=(rank + 1) % world_size, mask=mask)


def median_seconds(fn, reps: int, on_gpu: bool, before=lambda: None) -> float:
    """Median seconds of ``fn`` over ``reps`` calls after one warm-up (CUDA events on a GPU, the
    host clock on the CPU); ``before()`` runs ahead of each call, untimed."""
    import time

    import torch

    before()
    fn()
    times = []
    for _ in range(reps):
        before()
        if on_gpu:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) / 1e3)
        else:
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def table(result: dict) -> str:
    """The results as Markdown: one row per variant, the change against ``off``, the PTX check."""
    base = result["us"]["off"]
    lines = [f"trace_overhead: {result['world_size']} rank(s), backend {result['backend']}, {result['device']}, "
             f"{result['mib']:.3g} MiB per launch, BLOCK {result['block']}, {result['programs']} programs, "
             f"{EVENTS_PER_PROGRAM} events per program ({result['events_per_launch']} per launch), median of "
             f"{result['reps']}", "",
             "| variant | time (us) | GB/s (read+write) | change vs off |", "| --- | ---: | ---: | ---: |"]
    for name, t in result["us"].items():
        lines.append(f"| {name} | {t:.1f} | {result['GBps'][name]:.1f} | {100 * (t / base - 1):+.1f}% |")
    return "\n".join(lines)


def plot(result: dict, path: str) -> str:
    """A bar per variant (us); returns what was written."""
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    names = list(result["us"])
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.bar(names, [result["us"][k] for k in names], color=["C0", "C1", "C3", "0.6"][:len(names)])
    ax.set_ylabel("us per launch (median)")
    ax.set_title(f"tracing cost, {result['mib']:.3g} MiB copy, {result['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"wrote {path}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, few repetitions (CPU smoke test)")
    parser.add_argument("--mib", type=int, default=256, help="MiB copied per launch")
    parser.add_argument("--block", type=int, default=4096, help="elements per program")
    parser.add_argument("--reps", type=int, default=50, help="timed launches per variant")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"),
                        help="folder for the JSON, Markdown table and plot (rank 0)")
    args = parser.parse_args()

    import torch

    if args.quick:
        args.mib, args.block, args.reps = 0, 64, 2
    n = max(args.mib << 18, 4 * args.block)  # float32 elements
    with iris.runtime.iris(heap_size=2 * n * 4 + (64 << 20)) as ctx:
        rank, world = ctx.rank, ctx.world_size
        src = ctx.zeros(n, dtype=torch.float32)
        src.copy_(torch.arange(n, dtype=torch.float32, device=ctx.device) + rank)
        dst = ctx.zeros(n, dtype=torch.float32)
        grid = (triton.cdiv(n, args.block),)
        events = grid[0] * EVENTS_PER_PROGRAM
        context = ctx.get_device_context()
        on_gpu = ctx.device.type == "cuda"

        def measure(trace: bool, enabled: bool) -> float:
            if enabled:
                ctx.tracing.enable(max_events=events)
            elif ctx.tracing.buffer is not None:
                ctx.tracing.disable()
            ctx.barrier()
            # a fresh trace buffer before each launch, so that every event is written (not timed)
            seconds = median_seconds(lambda: copy_kernel[grid](context, src, dst, n, rank, world, args.block, trace),
                                     args.reps, on_gpu, ctx.tracing.reset if trace else (lambda: None))
            ctx.barrier()
            return seconds

        results = {
            "off": measure(trace=False, enabled=True),
            "idle": measure(trace=True, enabled=False),
            "on": measure(trace=True, enabled=True),
        }
        recorded, dropped = ctx.tracing.recorded()
        assert recorded.shape[0] == events and dropped == 0, (recorded.shape, dropped)
        prev = (rank - 1) % world
        assert torch.equal(dst, torch.arange(n, dtype=torch.float32, device=ctx.device) + prev), "copy is wrong"
        results["torch copy_"] = median_seconds(lambda: dst.copy_(src), args.reps, on_gpu)  # the floor
        all_results = ctx.comm.gather(results, root=0)

        if rank == 0:
            nbytes = 2 * n * 4  # read + write
            us = {name: sorted(r[name] for r in all_results)[world // 2] * 1e6 for name in results}  # median of ranks
            device = torch.cuda.get_device_name(ctx.device) if on_gpu else "cpu"
            result = {"world_size": world, "backend": ctx.backend, "device": device, "mib": n * 4 / 2**20,
                      "block": args.block, "programs": grid[0], "events_per_launch": events, "reps": args.reps,
                      "us": us, "GBps": {k: nbytes / v / 1e3 for k, v in us.items()}}
            text = table(result)
            print(text)
            stem = os.path.join(args.out, "trace_overhead" + ("" if on_gpu else "_cpu") + ("_quick" if args.quick
                                                                                            else ""))
            os.makedirs(args.out, exist_ok=True)
            with open(stem + ".json", "w") as f:
                json.dump(result, f, indent=1)
            with open(stem + ".md", "w") as f:
                f.write(text + "\n")
            print(plot(result, stem + ".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
