"""What a fused op costs the host: microseconds of Python per ``iris.collectives.ops`` call.

    mpirun -n 2 python3 -m mpi4py benchmarks/ops_host.py                 # any backend
    mpirun -n 2 python3 -m mpi4py benchmarks/ops_host.py --calls 5000

A GEMM of a few hundred microseconds hides the host's part of a call only while that part is
shorter; a model that waits for its layers sees both. For each op (and the GEMM core alone,
``ops._matmul.matmul``), at a small shape (per rank M = N = 256, K = 128, bf16 on a GPU; M = N = 64,
K = 32, fp32 on the cpu backend, whose interpreter runs the first, real call):

- ``dispatch``: the whole call with the kernel launch replaced by a no-op, i.e. what iris adds on
  top of Triton's launch (checks, the config choice, the workspace lookup, the arguments). The
  first call, which builds the workspace and compiles, is made for real and not timed. Any backend.
- ``enqueue`` (GPU only): the real call, host seconds per call over ``--calls`` calls in a row
  with no synchronisation (the queue is drained between measurements).

Each rank measures itself; the table shows the slowest rank's median of ``--rounds`` rounds.
Writes ``results/ops_host_<W>ranks[_cpu].{json,md,png}``.
"""

from __future__ import annotations

import datetime
import importlib.util
import os
import statistics

import torch
import triton

import iris.runtime
from iris.collectives import ops
from iris.collectives.ops import (
    _all_gather_matmul,
    _matmul,
    _matmul_all_gather,
    _matmul_all_reduce,
    _matmul_reduce_scatter,
)

HERE = os.path.dirname(os.path.abspath(__file__))


def _load_ccl_host():
    """``benchmarks/ccl_host.py`` (its timing and its command line), loaded by path: the
    benchmarks are scripts, not a package."""
    spec = importlib.util.spec_from_file_location("ccl_host_bench", os.path.join(HERE, "ccl_host.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CCL_HOST = _load_ccl_host()
SHAPES = {"cuda": (256, 256, 128), "cpu": (64, 64, 32)}
#: op -> (the module whose kernel names the launch goes through, those names)
KERNELS = {
    "matmul_all_reduce": (_matmul_all_reduce, ("_matmul_all_reduce_kernel",)),
    "matmul_reduce_scatter": (_matmul_reduce_scatter, ("_matmul_reduce_scatter_kernel",)),
    "all_gather_matmul": (_all_gather_matmul, ("_all_gather_matmul_kernel", "_arrival_kernel")),
    "matmul_all_gather": (_matmul_all_gather, ("_matmul_all_gather_kernel",)),
    "gemm core": (_matmul, ("_matmul_kernel",)),
}


class _NoLaunch:
    """Stands in for a kernel: ``kernel[grid](...)`` does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def calls(ctx, dtype) -> dict:
    """op -> a callable making one call of it, on this rank's tensors."""
    W, dev = ctx.world_size, ctx.device
    M, N, K = SHAPES["cuda" if dev.type == "cuda" else "cpu"]
    g = torch.Generator().manual_seed(ctx.rank)

    def t(*shape):
        return torch.randn(shape, generator=g).to(dtype).to(dev)

    a, b, shard = t(M, K), t(K, N), t(M // W, K)
    full, part = torch.empty(M, N, dtype=dtype, device=dev), torch.empty(M // W, N, dtype=dtype, device=dev)
    return {
        "matmul_all_reduce": lambda: ops.matmul_all_reduce(ctx, full, a, b),
        "matmul_reduce_scatter": lambda: ops.matmul_reduce_scatter(ctx, part, a, b),
        "all_gather_matmul": lambda: ops.all_gather_matmul(ctx, full, shard, b),
        "matmul_all_gather": lambda: ops.matmul_all_gather(ctx, full, shard, b),
        "gemm core": lambda: _matmul.matmul(full, a, b),
    }


def run(args) -> dict:
    ctx = iris.runtime.iris(heap_size=1 << 26)
    cuda = ctx.device.type == "cuda"
    rows = []
    for name, fn in calls(ctx, torch.bfloat16 if cuda else torch.float32).items():
        fn()  # workspace, grid, compilation: not timed
        ctx.barrier()
        module, names = KERNELS[name]
        real = {n: getattr(module, n) for n in names}
        try:
            for n in names:
                setattr(module, n, _NoLaunch())
            row = {"op": name, "dispatch_us": [CCL_HOST.host_us(fn, args.calls, False) for _ in range(args.rounds)]}
        finally:
            for n, kernel in real.items():
                setattr(module, n, kernel)
        if cuda:  # every rank makes the same number of calls, so the lock counters stay matched
            row["enqueue_us"] = [CCL_HOST.host_us(fn, min(args.calls, 2000), True) for _ in range(args.rounds)]
        ctx.barrier()
        rows.append(row)
    from mpi4py import MPI

    for row in rows:
        for key in ("dispatch", "enqueue"):
            if f"{key}_us" in row:
                row[f"{key}_median_us"] = ctx.comm.allreduce(statistics.median(row[f"{key}_us"]), op=MPI.MAX)
    result = {"world_size": ctx.world_size, "backend": ctx.device.type, "calls": args.calls, "rounds": args.rounds,
              "shape": list(SHAPES["cuda" if cuda else "cpu"]),
              "device": torch.cuda.get_device_name(ctx.device) if cuda else "cpu (interpreter)",
              "triton": triton.__version__, "torch": torch.__version__, "rows": rows,
              "date": datetime.date.today().isoformat()}
    ops.clear_workspaces(ctx)
    ctx.close()
    return result


def table(result: dict) -> str:
    M_, N_, K_ = result["shape"]
    lines = [f"host microseconds per iris.collectives.ops call, M = {M_}, N = {N_}, K = {K_} per rank, "
             f"{result['world_size']} ranks, {result['device']}, Triton {result['triton']} (median of "
             f"{result['rounds']} rounds, slowest rank)", "",
             "| op | dispatch (us, launch a no-op) | enqueue (us, real launch) |", "| --- | --- | --- |"]
    for row in result["rows"]:
        enqueue = f"{row['enqueue_median_us']:.1f}" if "enqueue_median_us" in row else "- (GPU only)"
        lines.append(f"| {row['op']} | {row['dispatch_median_us']:.1f} | {enqueue} |")
    return "\n".join(lines)


def plot(result: dict, path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot"
    names = [r["op"] for r in result["rows"]]
    series = [k for k in ("dispatch_median_us", "enqueue_median_us") if all(k in r for r in result["rows"])]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(series)
    for i, key in enumerate(series):
        ax.bar([j + i * width for j in range(len(names))], [r[key] for r in result["rows"]], width,
               label=key.split("_")[0])
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names, fontsize=8)
    ax.set_ylabel("host us per call")
    ax.set_title(f"iris.collectives.ops host cost, {result['world_size']} ranks, {result['device']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def main(argv=None) -> None:
    CCL_HOST.run_benchmark("ops_host", __doc__, run, table, plot, 2000, argv)


if __name__ == "__main__":
    main()
