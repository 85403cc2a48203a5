"""How fast are remote loads and stores? iris.device's memory operations on a peer's heap, against
the same kernel on local memory and torch's own copy (the peer).

    mpirun -n 2 python -m mpi4py benchmarks/rma_bandwidth.py            # GPU (2 ranks, one GPU, under MPS)
    mpiexec -n 2 python -m mpi4py benchmarks/rma_bandwidth.py --quick   # CPU smoke test (interpreter, tiny)

Rank 0 measures while rank 1 waits in a barrier. For ``load``, ``store``, ``get``, ``put``, ``copy``
and ``atomic_add`` (relaxed), each size and dtype: remote (the op through ``DeviceContext`` on rank
1's heap), local (the same kernel with plain ``tl.load``/``tl.store``/``tl.atomic_add`` on this
rank's buffers, same block, warps and grid) and torch (``dst.copy_(src)``, ``dst.add_(src)`` for
``atomic_add``). GB/s count bytes read plus written (2 x size, 3 x size for ``atomic_add``). Times
are medians of ``triton.testing.do_bench`` (L2 flushed before every sample; calls shorter than
``MIN_SAMPLE_MS`` timed in batches); remote and local alternate over ``ROUNDS`` rounds, the best
counts, and ``spread`` is the largest gap between rounds of one kernel (a smaller remote/local
difference is noise). The block size and warps are chosen per op and dtype on the local kernel.
Targets, judged under the table: remote >= 97% of local at >= 64 MiB (the floor: local memory),
local >= 90% of torch's copy.

Writes ``rma_bandwidth.{json,md,png}`` (``rma_bandwidth_cpu.*`` on the cpu backend) into
``benchmarks/results`` (``--out`` stem). Without matplotlib only JSON and Markdown are written;
``--replot results.json`` draws the plot anywhere. Results: docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

import torch

import iris.runtime  # first: picks the backend and, for cpu, switches Triton's interpreter on

# isort: split
import triton
import triton.language as tl
from common import NO_PLOT, pyplot

from iris.device import DeviceContext

OPS = ("load", "store", "get", "put", "copy", "atomic_add")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
MiB = 1 << 20
DEFAULT_SIZES_MIB = (1, 4, 16, 64, 256, 1024)
# (bytes per program, warps): tried on the local kernel, the fastest one is kept.
GPU_CONFIGS = ((16384, 4), (32768, 8), (65536, 16))
CPU_CONFIGS = ((4096, 4),)
GOAL_MIN_BYTES = 64 * MiB
GOAL_REMOTE_VS_LOCAL = 97.0
GOAL_LOCAL_VS_TORCH = 90.0


@triton.jit
def rma_kernel(context, src, dst, n, peer, rank: tl.constexpr, world_size: tl.constexpr, OP: tl.constexpr,
               REMOTE: tl.constexpr, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    """One BLOCK per program. REMOTE: the op through the device context to ``peer``; else the
    same data movement with plain loads and stores on this rank's buffers."""
    ctx = DeviceContext.initialize(context, rank, world_size)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        mask = None
    else:
        mask = offs < n
    if not REMOTE:
        if OP == "atomic_add":
            tl.atomic_add(dst + offs, tl.load(src + offs, mask=mask), mask=mask, sem="relaxed")
        else:
            tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)
    elif OP == "load":
        tl.store(dst + offs, ctx.load(src + offs, peer, mask=mask), mask=mask)
    elif OP == "store":
        ctx.store(dst + offs, tl.load(src + offs, mask=mask), peer, mask=mask)
    elif OP == "get":
        ctx.get(src + offs, dst + offs, peer, mask=mask)
    elif OP == "put":
        ctx.put(src + offs, dst + offs, peer, mask=mask)
    elif OP == "copy":
        ctx.copy(src + offs, dst + offs, peer, rank, mask=mask)
    else:
        tl.static_assert(OP == "atomic_add", "unknown op")
        ctx.atomic_add(dst + offs, tl.load(src + offs, mask=mask), peer, mask=mask, sem="relaxed")


class Bench:
    """Buffers on the heap and the launches of one rank."""

    def __init__(self, ctx, max_bytes: int, verify_bytes: int):
        self.ctx = ctx
        self.peer = (ctx.rank + 1) % ctx.world_size
        self.src = ctx.zeros(max_bytes, dtype=torch.uint8)
        self.dst = ctx.zeros(max_bytes, dtype=torch.uint8)
        # Small buffers for the correctness check: every rank's vsrc holds its own pattern.
        self.verify_bytes = verify_bytes
        self.vsrc = {}
        for name, dtype in DTYPES.items():
            n = verify_bytes // dtype.itemsize
            self.vsrc[name] = ctx.zeros(n, dtype=dtype)
            self.vsrc[name].copy_(pattern(ctx.rank, n, dtype).to(ctx.device))
        self.vdst = ctx.zeros(verify_bytes, dtype=torch.uint8)
        self.vback = ctx.zeros(verify_bytes, dtype=torch.uint8)

    def views(self, nbytes: int, dtype: torch.dtype):
        n = nbytes // dtype.itemsize
        return self.src[:nbytes].view(dtype), self.dst[:nbytes].view(dtype), n

    def launcher(self, op: str, remote: bool, src, dst, n: int, config):
        block_bytes, warps = config
        block = max(block_bytes // src.element_size(), 16)
        grid = (triton.cdiv(n, block),)
        args = (self.ctx.get_device_context(), src, dst, n, self.peer, self.ctx.rank, self.ctx.world_size, op, remote,
                block, n % block == 0)

        def launch():
            rma_kernel[grid](*args, num_warps=warps)

        return launch


def pattern(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    # Small integers: exact in bf16 too.
    return ((torch.arange(n) % 61) + 64 * rank).to(dtype)


def verify(bench: Bench, dtype_name: str, config) -> None:
    """Each op on a small size, checked against known values (the peer's vsrc holds its pattern).
    ``store``/``put``/``atomic_add`` results are read back with ``load``, which is checked first."""
    dtype = DTYPES[dtype_name]
    src = bench.vsrc[dtype_name]
    dst, back = bench.vdst.view(dtype), bench.vback.view(dtype)
    n = src.numel()
    mine, theirs = pattern(bench.ctx.rank, n, dtype), pattern(bench.peer, n, dtype)
    sync = torch.cuda.synchronize if bench.ctx.device.type == "cuda" else (lambda: None)

    def expect(what, got, want):
        if not torch.equal(got.cpu(), want):
            raise AssertionError(f"rma_bandwidth: {what} ({dtype}) gave wrong data; the numbers would be meaningless")

    for op in ("load", "get", "copy"):
        dst.zero_()
        bench.launcher(op, True, src, dst, n, config)()
        sync()
        expect(op, dst, theirs)
    for op in ("store", "put"):
        dst.zero_()  # this rank's dst: the op writes the peer's
        bench.launcher(op, True, src, dst, n, config)()
        back.zero_()
        bench.launcher("load", True, dst, back, n, config)()
        sync()
        expect(op, back, mine)
    if bench.ctx.device.type == "cuda" or dtype != torch.bfloat16:
        # The peer's dst holds `mine` since the put above: adding `mine` doubles it.
        bench.launcher("atomic_add", True, src, dst, n, config)()
        back.zero_()
        bench.launcher("load", True, dst, back, n, config)()
        sync()
        expect("atomic_add", back, (mine.float() * 2).to(dtype))


#: Rounds of (remote, local) timings per row on the GPU; the best of each counts.
ROUNDS = 3


#: Shortest GPU time one timed sample may take. CUDA events resolve about half a microsecond, so
#: a 38 us call (64 MiB) timed alone is only known to ~2 %: short calls are timed in batches.
MIN_SAMPLE_MS = 1.0


def time_ms(fn, device: torch.device, quick: bool) -> float:
    if device.type == "cuda":
        from triton.testing import do_bench

        warmup, rep = (10, 30) if quick else (25, 100)
        once = do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
        batch = 1 if quick else max(1, math.ceil(MIN_SAMPLE_MS / max(once, 1e-4)))
        if batch == 1:
            return once

        def batched():
            for _ in range(batch):
                fn()

        # do_bench flushes L2 before each sample; inside a batch the calls run back to back, the
        # same for remote and local (the same memory of the same GPU).
        return do_bench(batched, warmup=warmup, rep=max(rep, 20 * MIN_SAMPLE_MS), return_mode="median") / batch
    fn()  # interpreter: no caches to warm, a few runs are plenty
    times = []
    for _ in range(2 if quick else 5):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9


def measure(bench: Bench, ops, dtypes, sizes, configs, quick: bool) -> tuple[list[dict], dict]:
    device = bench.ctx.device
    rows, chosen = [], {}
    for dtype_name in dtypes:
        dtype = DTYPES[dtype_name]
        verify(bench, dtype_name, configs[0])
        for op in ops:
            if op == "atomic_add" and dtype == torch.bfloat16 and device.type != "cuda":
                print(f"  (atomic_add {dtype_name}: not available under Triton's interpreter, skipped)", flush=True)
                continue
            tune_bytes = max(sizes)
            src, dst, n = bench.views(tune_bytes, dtype)
            if len(configs) > 1:
                timed = {c: time_ms(bench.launcher(op, False, src, dst, n, c), device, True) for c in configs}
                config = min(timed, key=timed.get)
            else:
                config = configs[0]
            chosen[f"{op}/{dtype_name}"] = {"block_bytes": config[0], "num_warps": config[1]}
            for nbytes in sizes:
                src, dst, n = bench.views(nbytes, dtype)
                moved = (3 if op == "atomic_add" else 2) * nbytes
                # Remote and local alternate over ROUNDS rounds (order swapped each round), so that
                # neither always runs first; the best round counts, and the spread between rounds
                # says how far apart two timings of the same kernel are.
                runs = {True: [], False: []}
                for i in range(1 if quick else ROUNDS):
                    for is_remote in ((True, False) if i % 2 == 0 else (False, True)):
                        runs[is_remote].append(time_ms(bench.launcher(op, is_remote, src, dst, n, config), device,
                                                       quick))
                remote, local = min(runs[True]), min(runs[False])
                if op == "atomic_add":
                    torch_ms = time_ms(lambda dst=dst, src=src: dst.add_(src), device, quick)
                else:
                    torch_ms = time_ms(lambda dst=dst, src=src: dst.copy_(src), device, quick)
                row = {"op": op, "dtype": dtype_name, "bytes": nbytes, "moved_bytes": moved,
                       "remote_ms": remote, "local_ms": local, "torch_ms": torch_ms,
                       "remote_gbps": gbps(moved, remote), "local_gbps": gbps(moved, local),
                       "torch_gbps": gbps(moved, torch_ms), "remote_ms_runs": runs[True],
                       "local_ms_runs": runs[False],
                       "spread_pct": 100.0 * max(max(v) / min(v) - 1.0 for v in runs.values())}
                row["remote_vs_local_pct"] = 100.0 * row["remote_gbps"] / row["local_gbps"]
                row["local_vs_torch_pct"] = 100.0 * row["local_gbps"] / row["torch_gbps"]
                rows.append(row)
                print(format_row(row), flush=True)
    return rows, chosen


def size_label(nbytes: int) -> str:
    if nbytes >= 1 << 30:
        return f"{nbytes / (1 << 30):g} GiB"
    if nbytes >= MiB:
        return f"{nbytes / MiB:g} MiB"
    return f"{nbytes / 1024:g} KiB"


HEADER = (f"{'op':<11}{'dtype':<6}{'size':>9}{'remote GB/s':>13}{'local GB/s':>12}{'torch GB/s':>12}"
          f"{'remote/local':>14}{'local/torch':>13}{'spread':>8}")


def rate(value: float) -> str:
    # GPU numbers in the thousands, interpreter ones far below 1.
    return f"{value:.1f}" if value >= 100 else f"{value:.3g}"


def format_row(row: dict) -> str:
    return (f"{row['op']:<11}{row['dtype']:<6}{size_label(row['bytes']):>9}{rate(row['remote_gbps']):>13}"
            f"{rate(row['local_gbps']):>12}{rate(row['torch_gbps']):>12}{row['remote_vs_local_pct']:>13.1f}%"
            f"{row['local_vs_torch_pct']:>12.1f}%{row.get('spread_pct', float('nan')):>7.1f}%")


def goals(rows: list[dict]) -> dict:
    """The targets at >= 64 MiB: the worst remote/local and (copies only: torch's ``add_`` is not
    judged) local/torch row, and whether each target is met."""
    result = {"min_bytes": GOAL_MIN_BYTES, "remote_vs_local_goal_pct": GOAL_REMOTE_VS_LOCAL,
              "local_vs_torch_goal_pct": GOAL_LOCAL_VS_TORCH}
    big = [r for r in rows if r["bytes"] >= GOAL_MIN_BYTES]
    for key, goal, sel in (("remote_vs_local", GOAL_REMOTE_VS_LOCAL, big),
                           ("local_vs_torch", GOAL_LOCAL_VS_TORCH, [r for r in big if r["op"] != "atomic_add"])):
        if sel:
            worst = min(sel, key=lambda r: r[f"{key}_pct"])
            result[f"{key}_min_pct"] = worst[f"{key}_pct"]
            result[f"{key}_worst"] = f"{worst['op']} {worst['dtype']} {size_label(worst['bytes'])}"
            result[f"{key}_met"] = worst[f"{key}_pct"] >= goal
    return result


def plot(rows: list[dict], path: str, title: str) -> bool:
    plt = pyplot()
    if plt is None:
        print(NO_PLOT, flush=True)
        return False
    ops = [op for op in OPS if any(r["op"] == op for r in rows)]
    cols = 3
    fig, axes = plt.subplots((len(ops) + cols - 1) // cols, cols, figsize=(15, 4.5 * ((len(ops) + cols - 1) // cols)),
                             squeeze=False)
    colors = {"fp32": "tab:blue", "bf16": "tab:orange"}
    for ax, op in zip(axes.flat, ops):
        for dtype_name in DTYPES:
            sel = sorted((r for r in rows if r["op"] == op and r["dtype"] == dtype_name), key=lambda r: r["bytes"])
            if not sel:
                continue
            x = [r["bytes"] / MiB for r in sel]
            for key, style, label in (("remote_gbps", "-o", "remote"), ("local_gbps", "--s", "local"),
                                      ("torch_gbps", ":^", "torch add_" if op == "atomic_add" else "torch copy_")):
                ax.plot(x, [r[key] for r in sel], style, color=colors[dtype_name], label=f"{label} {dtype_name}")
        ax.set_xscale("log", base=2)
        ax.set_title(op)
        ax.set_xlabel("size (MiB)")
        ax.set_ylabel("GB/s (read + written)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(ops):]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", help="comma-separated sizes in MiB (fractions allowed), default 1,4,16,64,256,1024")
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of " + ",".join(OPS))
    parser.add_argument("--dtypes", default="fp32,bf16", help="comma-separated subset of fp32,bf16")
    parser.add_argument("--quick", action="store_true", help="a few small sizes, short timing, one configuration")
    parser.add_argument("--config", help="force one configuration: BYTES_PER_PROGRAM:WARPS, e.g. 32768:8")
    parser.add_argument("--out", help="output path without extension (default benchmarks/results/rma_bandwidth)")
    parser.add_argument("--replot", metavar="JSON", help="only redraw the plot of a results file (no MPI, no GPU): "
                        "for machines without matplotlib, plot elsewhere from the JSON")
    args = parser.parse_args(argv)
    for op in args.ops.split(","):
        if op not in OPS:
            parser.error(f"--ops: unknown op {op!r}; choose from {', '.join(OPS)}")
    for dt in args.dtypes.split(","):
        if dt not in DTYPES:
            parser.error(f"--dtypes: unknown dtype {dt!r}; choose from {', '.join(DTYPES)}")
    return args


def goal_lines(summary: dict) -> list[str]:
    """The verdicts printed under the table (none when no size reached 64 MiB)."""
    return [f"goal {what} >= {summary[f'{key}_goal_pct']:g}% at >= 64 MiB: worst {summary[f'{key}_min_pct']:.1f}% "
            f"({summary[f'{key}_worst']}) -> {'met' if summary[f'{key}_met'] else 'NOT met'}"
            for key, what in (("remote_vs_local", "remote of local"), ("local_vs_torch", "local of torch copy_"))
            if f"{key}_min_pct" in summary]


def write_table(rows: list[dict], summary: dict, title: str, path: str) -> None:
    """The printed table as a Markdown file (a text block under a title), for the docs."""
    body = "\n".join([HEADER, *map(format_row, rows), *goal_lines(summary)])
    with open(path, "w") as f:
        f.write(f"{title} (`benchmarks/rma_bandwidth.py`):\n\n```text\n{body}\n```\n")


def replot(path: str) -> None:
    with open(path) as f:
        results = json.load(f)
    meta = results["meta"]
    stem = os.path.splitext(path)[0]
    title = f"iris.device RMA bandwidth, {meta['device']}, {meta['world_size']} ranks ({meta['backend']})"
    write_table(results["rows"], results["goals"], title, stem + ".md")
    print(f"wrote {stem}.md")
    if plot(results["rows"], stem + ".png", title):
        print(f"wrote {stem}.png")


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.replot:
        replot(args.replot)
        return
    on_gpu = iris.runtime.DEFAULT_BACKEND not in ("cpu", "auto")
    if args.sizes:
        sizes = [int(float(s) * MiB) for s in args.sizes.split(",")]
    elif args.quick:
        sizes = [1 * MiB, 16 * MiB] if on_gpu else [16 * 1024, 64 * 1024]
    else:
        sizes = [s * MiB for s in DEFAULT_SIZES_MIB]
    if args.config:
        block_bytes, warps = (int(v) for v in args.config.split(":"))
        configs = ((block_bytes, warps),)
    else:
        configs = (GPU_CONFIGS[1:2] if args.quick else GPU_CONFIGS) if on_gpu else CPU_CONFIGS
    heap = 2 * max(sizes) + 16 * MiB
    ctx = iris.runtime.iris(heap_size=heap)
    backend = ctx.backend
    on_gpu = backend != "cpu"
    if ctx.world_size < 2 and ctx.rank == 0:
        print("note: one rank, so 'remote' is this rank's own heap through translated pointers; run 2 ranks "
              "(mpirun -n 2 python -m mpi4py benchmarks/rma_bandwidth.py) for a real peer", flush=True)
    bench = Bench(ctx, max(sizes), 64 * 1024 if on_gpu else 8 * 1024)
    ctx.barrier()  # every rank's patterns are in place
    rows, chosen = [], {}
    if ctx.rank == 0:
        device_name = torch.cuda.get_device_name(ctx.device) if on_gpu else f"cpu ({platform.processor() or 'host'})"
        print(f"rma_bandwidth: {ctx.world_size} ranks, backend {backend}, {device_name}, rank 0 measures "
              f"(peer {bench.peer})", flush=True)
        print(HEADER, flush=True)
        try:
            rows, chosen = measure(bench, args.ops.split(","), args.dtypes.split(","), sizes, configs, args.quick)
        except BaseException:
            ctx.comm.Abort(1)  # the peer waits in a barrier; do not leave it there
            raise
    ctx.barrier()  # the peer idles here while rank 0 measures
    if ctx.rank == 0:
        summary = goals(rows)
        for line in goal_lines(summary):
            print(line)
        default_out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                   "rma_bandwidth" if on_gpu else "rma_bandwidth_cpu")
        out = args.out or default_out
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        meta = {"backend": backend, "device": device_name, "world_size": ctx.world_size, "peer": bench.peer,
                "torch": torch.__version__, "triton": triton.__version__, "python": sys.version.split()[0],
                "quick": args.quick, "configs_tried": [list(c) for c in configs], "configs_chosen": chosen,
                "timing": "triton.testing.do_bench median, L2 flushed" if on_gpu else "median of host timings",
                "bytes": "read + written: 2 x size (3 x size for atomic_add)",
                "mps": bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY"))}
        with open(out + ".json", "w") as f:
            json.dump({"meta": meta, "goals": summary, "rows": rows}, f, indent=1)
        title = f"iris.device RMA bandwidth, {device_name}, {ctx.world_size} ranks ({backend})"
        write_table(rows, summary, title, out + ".md")
        plotted = plot(rows, out + ".png", title)
        print(f"wrote {out}.json, {out}.md" + (f" and {out}.png" if plotted else ""), flush=True)
    ctx.close()


if __name__ == "__main__":
    main()
