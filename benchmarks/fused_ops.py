"""Does fusing pay? GEMM + communication (``iris.collectives.ops``) against what users run today.

For each op and each M (tokens) of a tensor-parallel MLP layer of a 70B-class model (hidden 8192,
intermediate 28672 split over the W ranks, bf16), in one run:

- ``fused``: the ``iris.collectives.ops`` call (default config, or ``--variant``);
- ``unfused``: ``torch.matmul`` (cuBLAS) then the ``torch.distributed`` collective (nccl);
- ``unfused_ccl``: ``torch.matmul`` then this library's host collective (``iris.collectives.ccl``);
- ``torch_fused``: ``torch.ops.symm_mem.fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``
  where they exist (a symmetric-memory group over the same ranks), else the reason why not;
- ``gemm_ours`` / ``gemm_cublas``: the GEMM alone (this library's core, cuBLAS): the compute floor;
- ``collective`` / ``ccl``: the nccl / ccl collective alone: the communication floor;
- ``ideal``: max(gemm_cublas, the faster collective), what perfect overlap would reach.

When ranks share a GPU (under MPS), NCCL and torch's fused ops refuse to run: their columns are
empty, the torch group is gloo, speedups are against ``unfused_ccl``, and as the ranks share the
SMs such runs compare implementations, not overlap. Shapes per rank (I = intermediate / W):
all_gather_matmul [M/W, hidden] x [hidden, I] -> [M, I] (column-parallel up projection);
matmul_reduce_scatter and matmul_all_reduce [M, I] x [I, hidden] -> [M/W, hidden] and [M, hidden]
(row-parallel down projection); matmul_all_gather [M/W, I] x [I, hidden] -> [M, hidden].

Timing: CUDA events around each call, after warm-up, median over ``--reps`` back-to-back calls
queued without waiting (a call's host time counts only where it exceeds the GPU's); ranks line up
with a barrier before each series. Each fused result is checked against the unfused one. Prints a
table (ms, TFLOP/s per rank, speedup vs unfused, fused/ideal) and writes
``fused_ops_<W>ranks[_<G>gpu].{json,md,png}`` into ``--out`` (default ``benchmarks/results``).

    mpirun -n 2 python benchmarks/fused_ops.py                  # one rank per GPU (2 x H200)
    mpirun -n 2 python benchmarks/fused_ops.py --m 4096,8192 --ops matmul_all_reduce
    python benchmarks/fused_ops.py --gemm-only                  # one GPU: GEMM core vs torch.matmul
    mpirun -n 2 python benchmarks/fused_ops.py --quick          # CPU smoke test (tiny shapes)

Keep NVLink multicast off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1; set here).
Results: docs/performance.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import statistics
import sys
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch

import iris.runtime
from iris.collectives import ccl, ops
from iris.collectives.ops._matmul import matmul as gemm_core

OPS = ("all_gather_matmul", "matmul_reduce_scatter", "matmul_all_reduce", "matmul_all_gather")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", type=lambda s: s.split(","), default=list(OPS), help=",".join(OPS))
    p.add_argument("--m", type=lambda s: [int(x) for x in s.split(",")], default=[1024, 2048, 4096, 8192, 16384],
                   help="tokens (rows of the full activation)")
    p.add_argument("--hidden", type=int, default=8192)
    p.add_argument("--intermediate", type=int, default=28672, help="split over the ranks")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--variant", default=None,
                   help="force Config(variant=...) on the ops that have it (see iris.collectives.ops.VARIANTS)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--gemm-only", action="store_true",
                   help="one process: the GEMM core vs torch.matmul at the layers' per-rank shapes")
    p.add_argument("--world", type=int, default=2, help="with --gemm-only: the W the per-rank shapes assume")
    p.add_argument("--no-torch-fused", action="store_true", help="skip torch's symm_mem fused ops")
    p.add_argument("--quick", action="store_true", help="tiny shapes, 2 reps: a smoke test on the cpu backend")
    p.add_argument("--out", default=RESULTS, help="folder for the JSON, Markdown and PNG")
    args = p.parse_args(argv)
    if args.quick:
        args.m, args.hidden, args.intermediate, args.reps, args.warmup = [48], 64, 96, 2, 1
        args.dtype = "fp32" if args.dtype == "bf16" else args.dtype
    return args


def layer_shapes(op: str, M: int, hidden: int, inter: int, W: int) -> tuple[tuple, tuple, tuple, float]:
    """(a, b, out) shapes on one rank and the GEMM FLOPs per rank (see the module docstring)."""
    per = inter // W
    if op == "all_gather_matmul":
        return (M // W, hidden), (hidden, per), (M, per), 2.0 * M * hidden * per
    if op == "matmul_reduce_scatter":
        return (M, per), (per, hidden), (M // W, hidden), 2.0 * M * per * hidden
    if op == "matmul_all_reduce":
        return (M, per), (per, hidden), (M, hidden), 2.0 * M * per * hidden
    return (M // W, per), (per, hidden), (M, hidden), 2.0 * (M // W) * per * hidden


class Timer:
    """Median seconds of one call over ``reps`` back-to-back calls, after ``warmup`` calls:
    CUDA events on a GPU, the host clock on the cpu backend."""

    def __init__(self, ctx, reps: int, warmup: int):
        self.ctx, self.reps, self.warmup = ctx, reps, warmup
        self.cuda = torch.cuda.is_available() if ctx is None else ctx.device.type == "cuda"

    def _sync(self):
        if self.cuda:
            torch.cuda.synchronize()
        if self.ctx is not None:
            self.ctx.barrier()

    def __call__(self, fn) -> float:
        for _ in range(self.warmup):
            fn()
        self._sync()
        times = []
        if self.cuda:
            # back to back, an event pair around each call and no wait between calls, as a model
            # enqueues its layers: the host's time per call hides behind the GPU's where shorter
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(self.reps)]
            for start, end in events:
                start.record()
                fn()
                end.record()
            torch.cuda.synchronize()
            times = [start.elapsed_time(end) / 1e3 for start, end in events]
        else:
            for _ in range(self.reps):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        self._sync()
        seconds = statistics.median(times)
        if self.ctx is not None:  # the slowest rank's median is the layer's time
            seconds = self.ctx.comm.allreduce(seconds, op=_mpi_max())
        return seconds


def _mpi_max():
    from mpi4py import MPI

    return MPI.MAX


class Torch:
    """torch.distributed over the same ranks (nccl on GPUs, gloo on the cpu backend), and torch's
    symm_mem fused ops where they run."""

    def __init__(self, ctx, want_fused: bool):
        import torch.distributed as dist

        self.dist, self.ctx = dist, ctx
        self.one_per_gpu = getattr(ctx, "ranks_on_device", 1) == 1
        #: why the nccl columns are empty, or None (on the cpu backend gloo stands in: quick mode)
        self.nccl_reason = None
        if ctx.device.type == "cuda" and not self.one_per_gpu:
            self.nccl_reason = f"{ctx.ranks_on_device} ranks share each GPU: NCCL refuses that"
        if not dist.is_initialized():
            port = None
            if ctx.rank == 0:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    port = s.getsockname()[1]
            port = ctx.comm.bcast(port, root=0)
            backend = "nccl" if ctx.device.type == "cuda" and self.one_per_gpu else "gloo"
            kwargs = {"device_id": ctx.device} if backend == "nccl" else {}
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=ctx.rank,
                                    world_size=ctx.world_size, **kwargs)
        self.fused_reason = None
        if not want_fused:
            self.fused_reason = "disabled with --no-torch-fused"
        elif ctx.device.type != "cuda":
            self.fused_reason = "torch symm_mem fused ops need CUDA"
        elif not self.one_per_gpu:  # measured on an H200 with torch 2.11: the rendezvous raises
            self.fused_reason = ("torch symm_mem fused ops refuse ranks that share a GPU "
                                 "(CUDASymmetricMemoryAllocator::rendezvous: allocations from overlapping devices)")
        else:
            try:
                import torch.distributed._symmetric_memory as symm_mem

                self.group_name = dist.group.WORLD.group_name
                enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
                if enable is not None:
                    enable(self.group_name)
                self.fused_ops = (torch.ops.symm_mem.fused_all_gather_matmul,  # raises where torch has none
                                  torch.ops.symm_mem.fused_matmul_reduce_scatter)
            except Exception as exc:  # report it in the table and go on without the column
                self.fused_reason = f"{type(exc).__name__}: {exc}"
        reasons = [r for r in ctx.comm.allgather(self.fused_reason) if r]
        self.fused_reason = reasons[0] if reasons else None

    def ccl_collective(self, op: str, out: torch.Tensor, local: torch.Tensor):
        """This library's host collective of ``op`` (``iris.collectives.ccl``), same arguments as
        :meth:`collective`."""
        if op == "matmul_all_reduce":
            ccl.all_reduce(self.ctx, out, local)
        elif op == "matmul_reduce_scatter":
            ccl.reduce_scatter(self.ctx, out, local)
        else:
            ccl.all_gather(self.ctx, out, local)

    def collective(self, op: str, out: torch.Tensor, local: torch.Tensor):
        """The collective of ``op``: ``local`` is the GEMM's output, ``out`` the op's output."""
        d, W = self.dist, self.ctx.world_size
        if op == "matmul_all_reduce":
            out.copy_(local) if out is not local else None
            d.all_reduce(out)
        elif op == "matmul_reduce_scatter":
            if self.ctx.device.type == "cuda":
                d.reduce_scatter_tensor(out, local)
            else:  # gloo has no reduce_scatter: all-reduce and keep this rank's rows (quick mode only)
                d.all_reduce(local)
                out.copy_(local.chunk(W)[self.ctx.rank])
        else:  # the all-gathers
            if self.ctx.device.type == "cuda":
                d.all_gather_into_tensor(out, local)
            else:
                d.all_gather(list(out.chunk(W)), local)

    def fused(self, op: str, out, a, b):
        """torch's fused op for ``op``, or None where torch has none."""
        if self.fused_reason is not None:
            return None
        if op == "all_gather_matmul":
            return lambda: torch.ops.symm_mem.fused_all_gather_matmul(a, [b], 0, self.group_name)
        if op == "matmul_reduce_scatter":
            return lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", 0, self.group_name)
        return None


def measure_op(ctx, tdist, timer, op: str, M: int, args) -> dict:
    W, dev, dtype = ctx.world_size, ctx.device, DTYPES[args.dtype]
    a_shape, b_shape, out_shape, flops = layer_shapes(op, M, args.hidden, args.intermediate, W)
    # drawn on the device: on the CPU, the inputs of the large shapes took longer than the timing
    g = torch.Generator(device=dev).manual_seed(1000 * ctx.rank + M)
    a = (torch.randn(a_shape, generator=g, device=dev) / a_shape[1] ** 0.5).to(dtype)
    b = torch.randn(b_shape, generator=g, device=dev).to(dtype)
    if op == "all_gather_matmul":  # the same b on every rank
        b = torch.randn(b_shape, generator=torch.Generator(device=dev).manual_seed(M), device=dev).to(dtype)
    out = torch.empty(out_shape, dtype=dtype, device=dev)
    gemm_out = torch.empty((a_shape[0], b_shape[1]), dtype=dtype, device=dev)
    config = ops.Config(variant=args.variant) if args.variant in ops.VARIANTS[op] else None
    fused_fn = getattr(ops, op)

    def fused():
        fused_fn(ctx, out, a, b, config=config)

    # (out, inp) -> None: the op's collective through torch.distributed (nccl) or ccl
    nccl = functools.partial(tdist.collective, op) if tdist.nccl_reason is None else None
    ours = functools.partial(tdist.ccl_collective, op)
    if op == "all_gather_matmul":
        gathered = torch.empty((M, a_shape[1]), dtype=dtype, device=dev)
        ref_out = torch.empty(out_shape, dtype=dtype, device=dev)

        def unfused_with(coll):
            def run():
                coll(gathered, a)
                torch.matmul(gathered, b, out=ref_out)
            return run

        def collective_with(coll):
            return lambda: coll(gathered, a)

        def gemm_cublas():
            torch.matmul(gathered, b, out=ref_out)

        gemm_a, gemm_b, gemm_res = gathered, b, torch.empty_like(ref_out)
    else:
        ref_out = torch.empty(out_shape, dtype=dtype, device=dev)

        def unfused_with(coll):
            def run():
                torch.matmul(a, b, out=gemm_out)
                coll(ref_out, gemm_out)
            return run

        def collective_with(coll):
            return lambda: coll(ref_out, gemm_out)

        def gemm_cublas():
            torch.matmul(a, b, out=gemm_out)

        gemm_a, gemm_b, gemm_res = a, b, torch.empty_like(gemm_out)

    def gemm_ours():
        gemm_core(gemm_res, gemm_a, gemm_b)

    def maybe(fn):
        return timer(fn) if fn is not None else None

    times = {"fused": timer(fused), "unfused": maybe(unfused_with(nccl) if nccl else None),
             "unfused_ccl": timer(unfused_with(ours))}
    # checked after timing: both ran the same inputs many times; compare the last results (the
    # reference is cuBLAS + NCCL where NCCL runs, else cuBLAS + ccl)
    fused()
    unfused_with(nccl or ours)()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    scale = ref_out.float().abs().max().item() or 1.0
    error = (out.float() - ref_out.float()).abs().max().item() / scale
    tolerance = 2e-2 if dtype != torch.float32 else 1e-2  # tf32 products, different summation orders
    torch_fn = tdist.fused(op, out, a, b)
    times["torch_fused"] = maybe(torch_fn)
    times["gemm_ours"] = timer(gemm_ours)
    times["gemm_cublas"] = timer(gemm_cublas)
    times["collective"] = maybe(collective_with(nccl) if nccl else None)
    times["ccl"] = timer(collective_with(ours))
    times["ideal"] = max(times["gemm_cublas"], min(t for t in (times["collective"], times["ccl"]) if t is not None))
    variant = ops.choose(op, M, b_shape[1], a_shape[1], W, dev.type, config).variant
    return {"op": op, "variant": variant, "M": M, "a": list(a_shape), "b": list(b_shape), "out": list(out_shape),
            "flops": flops,
            "dtype": args.dtype, "times_s": times, "rel_error": error, "correct": error <= tolerance,
            "torch_fused_note": tdist.fused_reason if torch_fn is None and op in OPS[:2] else None}  # none for AR/MAG


def row_text(r: dict) -> str:
    t = r["times_s"]

    def ms(x):
        return f"{x * 1e3:9.3f}" if x is not None else f"{'-':>9}"

    tflops = r["flops"] / t["fused"] / 1e12
    baseline = t["unfused"] if t.get("unfused") is not None else t["unfused_ccl"]
    return (f"{r['op']:<22} {r['M']:>6} {ms(t['fused'])} {ms(t['unfused'])} {ms(t.get('unfused_ccl'))} "
            f"{ms(t['torch_fused'])} {ms(t['gemm_ours'])} {ms(t['gemm_cublas'])} {ms(t['collective'])} "
            f"{ms(t.get('ccl'))} {ms(t['ideal'])} {tflops:8.1f} {baseline / t['fused']:7.2f}x "
            f"{t['fused'] / t['ideal']:8.2f} {'ok' if r['correct'] else 'WRONG'}")


HEADER = (f"{'op':<22} {'M':>6} {'fused':>9} {'unfused':>9} {'unf_ccl':>9} {'torch':>9} {'gemm_our':>9} "
          f"{'cublas':>9} {'nccl':>9} {'ccl':>9} {'ideal':>9} {'TFLOP/s':>8} {'vs unf':>8} {'f/ideal':>8} check\n"
          f"{'':<22} {'':>6} {'(ms)':>9} {'nccl ms':>9} {'(ms)':>9} {'fused ms':>9} {'(ms)':>9} {'(ms)':>9} "
          f"{'alone ms':>9} {'alone ms':>9} {'(ms)':>9}")


def plot(result: dict, path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot"
    names = list(dict.fromkeys(r["op"] for r in result["rows"]))
    fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 4.2), squeeze=False)
    for ax, op in zip(axes[0], names):
        rows = [r for r in result["rows"] if r["op"] == op]
        ms = [r["M"] for r in rows]
        for key, style in (("fused", "o-"), ("unfused", "s--"), ("unfused_ccl", "d--"), ("torch_fused", "^:"),
                           ("ideal", "k-")):
            ys = [r["times_s"][key] for r in rows]
            if all(y is not None for y in ys):
                ax.plot(ms, [y * 1e3 for y in ys], style, label=key)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(op)
        ax.set_xlabel("M (tokens)")
        ax.set_ylabel("ms per call")
        ax.legend()
    fig.suptitle(f"iris.collectives.ops, {result['world_size']} ranks, {result['device']}, {result['dtype']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write(result: dict, text: str, stem: str) -> None:
    os.makedirs(os.path.dirname(stem), exist_ok=True)
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(f"Fused GEMM + communication, {result['world_size']} ranks on {result['device']} "
                f"(`benchmarks/fused_ops.py`):\n\n```text\n{text}\n```\n")


def run_layers(args) -> int:
    heap_size = 64 << 20 if args.quick else 8 << 30  # workspaces are freed after each op's shapes
    ctx = iris.runtime.iris(heap_size=heap_size)
    timer = Timer(ctx, args.reps, args.warmup)
    tdist = Torch(ctx, not args.no_torch_fused)
    device = torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else "cpu (interpreter)"
    rows = []
    for op in args.ops:
        for M in args.m:
            if M % ctx.world_size:
                continue
            rows.append(measure_op(ctx, tdist, timer, op, M, args))
            ops.clear_workspaces(ctx)  # collective, like the allocations it frees
            if ctx.rank == 0:
                print(row_text(rows[-1]) if len(rows) > 1 else HEADER + "\n" + row_text(rows[-1]), flush=True)
    result = {"world_size": ctx.world_size, "device": device, "dtype": args.dtype, "hidden": args.hidden,
              "intermediate": args.intermediate, "quick": args.quick, "torch": torch.__version__,
              "torch_fused_note": tdist.fused_reason, "nccl_note": tdist.nccl_reason,
              "ranks_per_gpu": getattr(ctx, "ranks_on_device", 1), "rows": rows}
    if ctx.rank == 0:
        text = HEADER + "\n" + "\n".join(row_text(r) for r in rows)
        if tdist.fused_reason:
            text += f"\ntorch fused ops: {tdist.fused_reason}"
        if tdist.nccl_reason:
            text += f"\nnccl columns empty: {tdist.nccl_reason}; 'vs unf' is against cuBLAS + ccl"
        shared = getattr(ctx, "ranks_on_device", 1)
        gpus = f"_{ctx.world_size // shared}gpu" if ctx.device.type == "cuda" and shared > 1 else ""
        stem = os.path.join(args.out, f"fused_ops_{ctx.world_size}ranks{gpus}{'_quick' if args.quick else ''}")
        write(result, text, stem)
        note = plot(result, stem + ".png")
        print(note or f"wrote {stem}.json, .md, .png", flush=True)
    ok = all(r["correct"] for r in rows)
    tdist.dist.destroy_process_group()
    ctx.close()
    return 0 if ok else 1


def run_gemm_only(args) -> int:
    """One process: the GEMM core against torch.matmul at every layer's per-rank GEMM."""
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = DTYPES[args.dtype]
    timer = Timer(None, args.reps, args.warmup)
    rows = []
    print(f"{'op':<22} {'M':>6} {'GEMM (M x N x K)':>22} {'ours ms':>9} {'torch ms':>9} {'ours TF/s':>10} "
          f"{'torch TF/s':>10} {'ours/torch':>10}")
    for op in args.ops:
        for M in args.m:
            a_shape, b_shape, _, flops = layer_shapes(op, M, args.hidden, args.intermediate, args.world)
            if op == "all_gather_matmul":
                a_shape = (M, a_shape[1])  # the GEMM runs on the gathered rows
            g = torch.Generator(device=dev).manual_seed(M)
            a = torch.randn(a_shape, generator=g, device=dev).to(dtype)
            b = torch.randn(b_shape, generator=g, device=dev).to(dtype)
            ours, ref = torch.empty(a_shape[0], b_shape[1], dtype=dtype, device=dev), torch.empty(
                a_shape[0], b_shape[1], dtype=dtype, device=dev)
            t_ours = timer(lambda: gemm_core(ours, a, b))
            t_torch = timer(lambda: torch.matmul(a, b, out=ref))
            flops = 2.0 * a_shape[0] * a_shape[1] * b_shape[1]
            error = (ours.float() - ref.float()).abs().max().item() / (ref.float().abs().max().item() or 1.0)
            row = {"op": op, "M": M, "shape": [a_shape[0], b_shape[1], a_shape[1]], "ours_s": t_ours,
                   "torch_s": t_torch, "rel_error": error, "correct": error <= 2e-2}
            rows.append(row)
            mnk = "x".join(str(x) for x in row["shape"])
            print(f"{op:<22} {M:>6} {mnk:>22} {t_ours * 1e3:9.3f} {t_torch * 1e3:9.3f} {flops / t_ours / 1e12:10.1f} "
                  f"{flops / t_torch / 1e12:10.1f} {t_torch / t_ours:10.2f}{'' if row['correct'] else ' WRONG'}",
                  flush=True)
    stem = os.path.join(args.out, f"fused_ops_gemm_only{'_quick' if args.quick else ''}")
    os.makedirs(args.out, exist_ok=True)
    device = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (interpreter)"
    with open(stem + ".json", "w") as f:
        json.dump({"device": device, "dtype": args.dtype, "world": args.world, "rows": rows}, f, indent=1)
    print(f"wrote {stem}.json")
    return 0 if all(r["correct"] for r in rows) else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.gemm_only:
        return run_gemm_only(args)
    try:
        return run_layers(args)
    except BaseException:
        # Under mpirun the job's abort can outrun the rank's stderr: say what failed on stdout first.
        import traceback

        print(f"fused_ops.py failed on this rank:\n{traceback.format_exc()}", flush=True)
        raise


if __name__ == "__main__":
    sys.exit(main())
