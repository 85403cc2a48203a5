"""What a host collective costs the host: microseconds of Python per ``iris.collectives.ccl`` call.

    mpirun -n 2 python3 -m mpi4py benchmarks/ccl_host.py                 # any backend
    mpirun -n 2 python3 -m mpi4py benchmarks/ccl_host.py --calls 20000

An eager call's time is the larger of what the host spends to enqueue it and what the GPU spends
to run it; for small messages the host's part decides (a 4 KiB all-reduce runs in about 5 us on
an H200). For each collective, a 4 KiB fp32 call (as in ``benchmarks/ccl.py``, whose ``Case``
builds the tensors; the size is the larger buffer), on plain tensors and on the heap:

- ``dispatch``: the whole call with the kernel launch replaced by a no-op, i.e. what iris adds
  on top of a kernel launch (the plan key, the plan lookup, the arguments). Any backend.
- ``enqueue`` (GPU only): the real call; host seconds per call over ``--calls`` calls in a row,
  with no synchronisation (the GPU runs behind; its queue is drained between measurements), and
  the same for an empty Triton kernel through Triton's own launcher, which is the floor a Triton
  launch from Python has.

Each rank measures itself; the table shows the slowest rank's median of ``--rounds`` rounds.
Writes ``results/ccl_host_<W>ranks[_cpu].{json,md,png}``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import statistics
import time

import torch
import triton

import iris.runtime
from iris.collectives.ccl import _launch

HERE = os.path.dirname(os.path.abspath(__file__))
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast")


@triton.jit
def empty_kernel(x):
    """Does nothing: its launch is what any Triton launch from Python costs."""
    pass


def ccl_bench():
    """``benchmarks/ccl.py`` (its ``Case``: each collective's tensors and call, checked there; its
    ``Peer``: torch symm_mem or NCCL), loaded by path: that benchmark is a script, not a package
    module."""
    spec = importlib.util.spec_from_file_location("ccl_bench", os.path.join(HERE, "ccl.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def host_us(fn, calls: int, cuda: bool) -> float:
    """Host microseconds per call of ``fn`` over ``calls`` calls (the GPU queue drained first)."""
    fn()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    seconds = time.perf_counter() - t0
    if cuda:
        torch.cuda.synchronize()
    return seconds / calls * 1e6


class NoLaunch:
    """A launch that enqueues nothing, with the interface of the plans' launches (``_launch``)."""

    def __call__(self, *args):
        return None

    @staticmethod
    def fast(*args):
        return None


def run(args) -> dict:
    ctx = iris.runtime.iris(heap_size=1 << 24)
    cuda = ctx.device.type == "cuda"
    bench, rows = ccl_bench(), []
    Case = bench.Case
    for heap in (False, True):
        for name in COLLECTIVES:
            case = Case(ctx, name, 4096, torch.float32, heap=heap)
            fn = case.call()
            fn()  # builds the plan and compiles: not timed
            ctx.barrier()
            row = {"collective": name, "heap": heap}
            # dispatch: the plan's launcher swapped for a no-op (a new plan built through the real
            # launcher first, so that the resident grid and the compiled kernel are found as usual)
            real_launcher = _launch.launcher
            _launch.launcher = lambda *a, **k: (real_launcher(*a, **k), NoLaunch())[1]
            try:
                _launch.forget(ctx)
                fn()
                row["dispatch_us"] = [host_us(fn, args.calls, False) for _ in range(args.rounds)]
            finally:
                _launch.launcher = real_launcher
                _launch.forget(ctx)
            fn()  # a plan with the real launch again
            if cuda:
                # every rank enqueues the same number of calls, so their counters stay matched
                row["enqueue_us"] = [host_us(fn, min(args.calls, 2000), True) for _ in range(args.rounds)]
            ctx.barrier()
            del fn
            case.free()
            rows.append(row)
    floor = direct = None
    peer_rows = []
    if cuda:
        x = torch.zeros(1, device=ctx.device)
        run_empty = empty_kernel[(1,)]
        floor = [host_us(lambda: run_empty(x), min(args.calls, 2000), True) for _ in range(args.rounds)]
        # the same empty kernel through the launch path the plans use (integer arguments, the C entry)
        launch = _launch.DirectLaunch(empty_kernel, 1, {}, ctx.device, (x.data_ptr(),))
        launch(x)
        if launch.fast is not None:
            direct = [host_us(lambda: launch.fast(None, None), min(args.calls, 2000), True) for _ in range(args.rounds)]
        # what the peer's call costs the host (torch's C++ dispatch and launch), on the same data
        peer = bench.Peer(ctx, True)
        case = Case(ctx, "all_reduce", 4096, torch.float32)
        for label, fn in peer.calls(case).items():
            fn()
            ctx.barrier()
            peer_rows.append({"label": label, "enqueue_us": [host_us(fn, min(args.calls, 2000), True)
                                                             for _ in range(args.rounds)]})
        ctx.barrier()
    from mpi4py import MPI

    def slowest(values: list[float]) -> float:
        return ctx.comm.allreduce(statistics.median(values), op=MPI.MAX)

    for row in rows:
        row["dispatch_median_us"] = slowest(row["dispatch_us"])
        if "enqueue_us" in row:
            row["enqueue_median_us"] = slowest(row["enqueue_us"])
    for row in peer_rows:
        row["enqueue_median_us"] = slowest(row["enqueue_us"])
    result = {"world_size": ctx.world_size, "backend": ctx.device.type, "calls": args.calls, "rounds": args.rounds,
              "device": torch.cuda.get_device_name(ctx.device) if cuda else "cpu (interpreter)",
              "triton": triton.__version__, "torch": torch.__version__, "rows": rows, "peer_rows": peer_rows,
              "empty_triton_launch_us": slowest(floor) if floor else None,
              "empty_direct_launch_us": slowest(direct) if direct else None,
              "date": datetime.date.today().isoformat()}
    ctx.barrier()
    ctx.close()
    return result


def table(result: dict) -> str:
    lines = [f"host microseconds per ccl call, 4 KiB fp32 (the larger buffer), {result['world_size']} ranks, "
             f"{result['device']}, Triton {result['triton']} (median of {result['rounds']} rounds, slowest rank)", "",
             "| collective | tensors | dispatch (us, launch a no-op) | enqueue (us, real launch) |",
             "| --- | --- | --- | --- |"]
    for row in result["rows"]:
        enqueue = f"{row['enqueue_median_us']:.1f}" if "enqueue_median_us" in row else "- (GPU only)"
        lines.append(f"| {row['collective']} | {'heap' if row['heap'] else 'plain'} | {row['dispatch_median_us']:.2f} "
                     f"| {enqueue} |")
    if result["empty_triton_launch_us"] is not None:
        lines.append(f"| empty Triton kernel, Triton's launcher | - | - | {result['empty_triton_launch_us']:.1f} |")
    if result.get("empty_direct_launch_us") is not None:
        direct = result["empty_direct_launch_us"]
        lines.append(f"| empty Triton kernel, the plans' direct launch | - | - | {direct:.1f} |")
    for row in result.get("peer_rows", []):
        lines.append(f"| all_reduce, {row['label']} (the peer) | symmetric | - | {row['enqueue_median_us']:.1f} |")
    return "\n".join(lines)


def plot(result: dict, path: str) -> str | None:
    """Bars per collective: dispatch (and enqueue on the GPU), plain and heap tensors."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot"
    series = [("dispatch_median_us", False, "dispatch, plain"), ("dispatch_median_us", True, "dispatch, heap"),
              ("enqueue_median_us", False, "enqueue, plain"), ("enqueue_median_us", True, "enqueue, heap")]
    series = [s for s in series if any(s[0] in r for r in result["rows"])]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(series)
    for i, (key, heap, label) in enumerate(series):
        values = [next(r[key] for r in result["rows"] if r["collective"] == c and r["heap"] == heap)
                  for c in COLLECTIVES]
        ax.bar([j + i * width for j in range(len(COLLECTIVES))], values, width, label=label)
    if result["empty_triton_launch_us"] is not None:
        ax.axhline(result["empty_triton_launch_us"], color="k", linestyle="--", label="empty Triton launch")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(COLLECTIVES))], COLLECTIVES)
    ax.set_ylabel("host us per call")
    ax.set_title(f"ccl host cost, {result['world_size']} ranks, {result['device']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def main(argv=None) -> None:
    """Every rank measures; rank 0 prints the table and writes
    ``results/ccl_host_<W>ranks[_cpu].{json,md,png}``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=5000, help="calls per measurement")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    args = p.parse_args(argv)
    result = run(args)
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() != 0:
        return
    text = table(result)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"ccl_host_{result['world_size']}ranks"
                        + ("" if result["backend"] == "cuda" else f"_{result['backend']}"))
    why_no_plot = plot(result, stem + ".png")
    if why_no_plot:
        print(why_no_plot)
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(f"{text}\n\n`mpirun -n {result['world_size']} python3 -m mpi4py benchmarks/ccl_host.py "
                f"--calls {result['calls']} --rounds {result['rounds']}` ({result['date']})\n")
    print(f"wrote {stem}.json, .md and .png", flush=True)


if __name__ == "__main__":
    main()
