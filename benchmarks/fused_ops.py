"""Does fusing pay? GEMM + communication (``iris.collectives.ops``) against what users run today.

For each op and M (tokens), ms per call of the slowest rank, bf16 unless ``--dtype``: ``fused`` (the
``iris.collectives.ops`` call with the table's config; ``--variants`` times strategies beside it);
the best a user could call instead: ``torch_fused`` (``fused_all_gather_matmul`` /
``fused_matmul_reduce_scatter``), ``torch_unfused`` (cuBLAS + torch's symmetric-memory collective:
``two_shot_all_reduce_`` or ``one_shot_all_reduce``, ``_low_contention_all_gather`` /
``_reduce_scatter``), ``unfused`` (cuBLAS + NCCL) and ``unfused_ccl`` (cuBLAS + this library's
``ccl``); the GEMM alone (``gemm_cublas``: the floor; ``gemm_ours``: this library's GEMM core, full
grid) and the collectives alone;
``ideal`` = max(GEMM, fastest collective). Goal columns: ``alt/fused`` (best alternative over fused,
goal >= 1.15) and ``fused/gemm`` (goal <= 1.10). Ranks sharing a GPU (MPS): NCCL refuses them
(empty columns, a gloo group); torch's symmetric memory runs with
``TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1``. ``--shapes mlp``: the layers of a 70B-class
tensor-parallel MLP (hidden 8192, intermediate 28672 split over the W ranks); ``square``: N = K =
8192, K split over the ranks for the ops that reduce (``layer_shapes``). CUDA events around each of
``--reps`` back-to-back calls, the median; each result checked against cuBLAS + a collective.
Writes ``fused_ops_<W>ranks[_<G>gpu][_<tag>][_quick].{json,md,png}``.

    mpirun -n 4 python benchmarks/fused_ops.py --shapes square,mlp --m 4096,8192,16384
    mpirun -n 2 python benchmarks/fused_ops.py --ops matmul_all_reduce --variants one_shot,rotated
    mpirun -n 2 python benchmarks/fused_ops.py --quick          # CPU smoke test (tiny shapes)
    mpirun -n 2 python benchmarks/fused_ops.py --mlp            # the compiled MLP, trained (below)

``--mlp``: the sequence-parallel MLP of ``iris.collectives.nn``, compiled, forward and forward +
backward, against the same model with torch's async tensor parallelism, its fused ops and cuBLAS +
its symmetric-memory collectives (docs/performance.md); writes ``tp_mlp_<W>ranks[_<G>gpu]...``.
Keep NVLink multicast off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1; set here).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time

import torch
from common import NO_PLOT, pyplot, symm_mem_group, torch_group
from torch._inductor.utils import run_and_get_code

import iris.runtime
from iris.collectives import ccl, ops
from iris.collectives import functional as F
from iris.collectives.nn import ColumnParallelLinear, RowParallelLinear
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
    p.add_argument("--dtype", type=lambda s: s.split(","), default=["bf16"], help=f"some of {','.join(DTYPES)}")
    p.add_argument("--shapes", type=lambda s: s.split(","), default=["mlp"], help="mlp and/or square")
    p.add_argument("--b-layout", choices=("rows", "columns"), default="rows",
                   help="b as a row-major [K, N] matrix, or column-major (weight.t() of an [N, K] weight, "
                        "as the nn layers pass it; fp32 then skips its transposing copy)")
    p.add_argument("--variants", type=lambda s: s.split(","), default=[],
                   help="also time these Config(variant=...) where the op has them (iris.collectives.ops.VARIANTS); "
                        "NAME/input: with partial_dtype='input' (rotated/input)")
    p.add_argument("--fp32-matmul", choices=("tf32", "ieee"), default="tf32",
                   help="torch's fp32 matmul precision for the run (allow_tf32), which fp32 rows of every column "
                        "follow: the ops' default input_precision is torch's, and so are cuBLAS's and torch's ops")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--mlp", action="store_true", help="the compiled sequence-parallel MLP, forward and backward")
    p.add_argument("--no-torch-fused", action="store_true", help="skip torch's symm_mem fused ops")
    p.add_argument("--torch-two-shot-max-ranks", type=int, default=4, metavar="W",
                   help="with more ranks sharing a GPU, time torch's one-shot all-reduce alone: its two-shot "
                        "stalled with 8 ranks on one H200 (docs/performance.md)")
    p.add_argument("--quick", action="store_true", help="tiny shapes, 2 reps: a smoke test on the cpu backend")
    p.add_argument("--tag", default="", help="appended to the results' file names (a run beside the main one)")
    p.add_argument("--out", default=RESULTS, help="folder for the JSON, Markdown and PNG")
    args = p.parse_args(argv)
    if set(args.dtype) - set(DTYPES):
        p.error(f"--dtype {','.join(args.dtype)}: each must be one of {', '.join(DTYPES)}")
    if args.quick:
        args.m, args.hidden, args.intermediate, args.reps, args.warmup = [48], 64, 96, 2, 1
        args.dtype = ["fp32" if d == "bf16" else d for d in args.dtype]
    elif args.mlp and "--m" not in " ".join(argv or sys.argv):
        args.m = [4096, 16384]  # each M compiles every model twice (inference, training)
    return args


def layer_shapes(op: str, M: int, hidden: int, inter: int, W: int, square=False) -> tuple[tuple, tuple, tuple, float]:
    """(a, b, out) on one rank and its GEMM FLOPs, I = inter / W: all_gather_matmul [M/W, hidden] x [hidden, I]
    -> [M, I] (a column-parallel up projection); matmul_reduce_scatter / matmul_all_reduce [M, I] x [I, hidden]
    -> [M/W or M, hidden] (row-parallel down); matmul_all_gather [M/W, I] x [I, hidden] -> [M, hidden].
    ``square``: N = K = hidden, K split (I = hidden / W) for the reducing ops, whole for the gathering ones."""
    per = inter // W
    if square:
        gathering = op in ("all_gather_matmul", "matmul_all_gather")
        a, b = ((M // W, hidden), (hidden, hidden)) if gathering else ((M, hidden // W), (hidden // W, hidden))
        rows = {"matmul_reduce_scatter": M // W}.get(op, M)
        return a, b, (rows, hidden), 2.0 * a[0] * a[1] * hidden
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

    def _mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def __call__(self, fn) -> float:
        for _ in range(self.warmup):
            fn()
        self._sync()
        # back to back, a mark before and after each call and no wait between calls, as a model
        # enqueues its layers: the host's time per call hides behind the GPU's where shorter
        marks = []
        for _ in range(self.reps):
            start = self._mark()
            fn()
            marks.append((start, self._mark()))
        self._sync()
        seconds = statistics.median(a.elapsed_time(b) / 1e3 if self.cuda else b - a for a, b in marks)
        # the slowest rank's median is the layer's time
        return max(self.ctx.comm.allgather(seconds)) if self.ctx is not None else seconds


class Torch:
    """torch.distributed over the same ranks (nccl on GPUs, gloo on the cpu backend), and torch's
    symm_mem fused ops where they run."""

    def __init__(self, ctx, want_fused: bool, two_shot_max_ranks: int = 4):
        self.ctx = ctx
        self.one_per_gpu = getattr(ctx, "ranks_on_device", 1) == 1
        #: why torch's two-shot all-reduce is not timed, or None
        self.two_shot_reason = None
        if not self.one_per_gpu and ctx.world_size > two_shot_max_ranks:
            self.two_shot_reason = (f"torch's two_shot_all_reduce_ not timed with {ctx.world_size} ranks sharing a "
                                    f"GPU (it stalled there; --torch-two-shot-max-ranks {two_shot_max_ranks})")
        #: why the nccl columns are empty, or None (on the cpu backend gloo stands in: quick mode)
        self.nccl_reason = None
        if ctx.device.type == "cuda" and not self.one_per_gpu:
            self.nccl_reason = f"{ctx.ranks_on_device} ranks share each GPU: NCCL refuses that"
        self.dist = torch_group(ctx, "nccl" if ctx.device.type == "cuda" and self.one_per_gpu else "gloo")
        self.fused_reason = None
        if not want_fused:
            self.fused_reason = "disabled with --no-torch-fused"
        elif ctx.device.type != "cuda":
            self.fused_reason = "torch symm_mem fused ops need CUDA"
        else:
            try:
                self.group_name = symm_mem_group()[1]
                self.fused_ops = (torch.ops.symm_mem.fused_all_gather_matmul,  # raises where torch has none
                                  torch.ops.symm_mem.fused_matmul_reduce_scatter)
            except Exception as exc:  # report it in the table and go on without the column
                self.fused_reason = f"{type(exc).__name__}: {exc}"
        reasons = [r for r in ctx.comm.allgather(self.fused_reason) if r]
        self.fused_reason = reasons[0] if reasons else None

    def ccl_collective(self, op: str, out: torch.Tensor, local: torch.Tensor):
        """This library's host collective of ``op`` (``iris.collectives.ccl``), as :meth:`collective`."""
        {"matmul_all_reduce": ccl.all_reduce, "matmul_reduce_scatter": ccl.reduce_scatter}.get(op, ccl.all_gather)(
            self.ctx, out, local)

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

    def symm_unfused(self, op: str, a, b, out):
        """cuBLAS + torch's symmetric-memory collective for ``op`` (the best of one-shot and two-shot
        for the all-reduce), as a list of callables, each leaving the result in its last return;
        empty where torch's symmetric memory does not run."""
        if self.fused_reason is not None:
            return []
        symm, group = torch.ops.symm_mem, self.group_name
        if op == "matmul_all_reduce":  # the GEMM writes into a symmetric buffer, reduced in place
            import torch.distributed._symmetric_memory as symm_mem

            buf = symm_mem.empty(out.shape, dtype=out.dtype, device=out.device)
            symm_mem.rendezvous(buf, group)

            def two_shot():
                torch.matmul(a, b, out=buf)
                return symm.two_shot_all_reduce_(buf, "sum", group)

            def one_shot():
                torch.matmul(a, b, out=buf)
                return symm.one_shot_all_reduce_out(buf, "sum", group, out)

            return [one_shot] if self.two_shot_reason else [two_shot, one_shot]
        wait = torch.ops._c10d_functional.wait_tensor  # these run on torch's side stream
        if op == "all_gather_matmul":
            return [lambda: wait(symm._low_contention_all_gather(a, group)) @ b]
        if op == "matmul_reduce_scatter":
            return [lambda: wait(symm._low_contention_reduce_scatter(a @ b, "sum", group))]
        return [lambda: wait(symm._low_contention_all_gather(a @ b, group))]

    def runnable(self, fns: list, name: str, notes: dict) -> list:
        """The callables of ``fns`` that run on every rank: torch's symmetric-memory kernels refuse
        some dtypes (two_shot_all_reduce_ has no fp16). Each is called once; one that raises on any
        rank is dropped on all of them (the outcome is agreed over MPI, so no rank waits in a peer
        the others skipped), and ``notes[name]`` says why."""
        kept = []
        for fn in fns:
            try:
                fn()
                why = None
            except Exception as exc:  # a refused dtype raises before any rank communicates
                why = f"{getattr(fn, '__name__', name)}: {type(exc).__name__}: {exc}"[:200]
            reasons = [r for r in self.ctx.comm.allgather(why) if r]
            if reasons:
                notes[name] = "; ".join(filter(None, (notes.get(name), reasons[0])))
            else:
                kept.append(fn)
        return kept

    def fused(self, op: str, a, b):
        """torch's fused op for ``op`` (``a @ b`` gathered first or scattered after), or None where torch has none."""
        if self.fused_reason is None and op in OPS[:2]:
            return lambda: _TorchLayer.apply(a, b.t(), torch_ops(self.group_name, True), op == OPS[0])
        return None


def measure_op(ctx, tdist, timer, op: str, M: int, shapes: str, dtype_name: str, args) -> dict:
    W, dev, dtype = ctx.world_size, ctx.device, DTYPES[dtype_name]
    a_shape, b_shape, out_shape, flops = layer_shapes(op, M, args.hidden, args.intermediate, W, shapes == "square")
    # drawn on the device: on the CPU, the inputs of the large shapes took longer than the timing
    g = torch.Generator(device=dev).manual_seed(1000 * ctx.rank + M)
    a = (torch.randn(a_shape, generator=g, device=dev) / a_shape[1] ** 0.5).to(dtype)
    b = torch.randn(b_shape, generator=g, device=dev).to(dtype)
    if op in ("all_gather_matmul", "matmul_all_gather"):  # the same b on every rank
        b = torch.randn(b_shape, generator=torch.Generator(device=dev).manual_seed(M), device=dev).to(dtype)
    if args.b_layout == "columns":  # the same values, laid out as weight.t(); every column gets this b
        b = b.t().contiguous().t()
    out = torch.empty(out_shape, dtype=dtype, device=dev)
    gemm_out = torch.empty((a_shape[0], b_shape[1]), dtype=dtype, device=dev)
    fused_fn = getattr(ops, op)
    variants = {v: ops.Config(variant=v.partition("/")[0], partial_dtype=v.partition("/")[2] or None)
                for v in args.variants if v.partition("/")[0] in ops.VARIANTS[op]}

    def fused(config=None):
        return lambda: fused_fn(ctx, out, a, b, config=config)

    # (out, inp) -> None: the op's collective through torch.distributed (nccl) or ccl
    nccl = functools.partial(tdist.collective, op) if tdist.nccl_reason is None else None
    ours = functools.partial(tdist.ccl_collective, op)
    # the unfused pair: all_gather_matmul gathers, then multiplies; the others multiply, then communicate
    first = op == "all_gather_matmul"
    ref_out = torch.empty(out_shape, dtype=dtype, device=dev)
    gathered = torch.empty((M, a_shape[1]), dtype=dtype, device=dev) if first else None
    gemm_a, gemm_res = (gathered, ref_out) if first else (a, gemm_out)  # the GEMM's input and output
    coll_out, coll_in = (gathered, a) if first else (ref_out, gemm_out)  # the collective's

    def unfused_with(coll):
        def run():
            if first:
                coll(coll_out, coll_in)
            torch.matmul(gemm_a, b, out=gemm_res)
            if not first:
                coll(coll_out, coll_in)
        return run

    def maybe(fn):
        return timer(fn) if fn is not None else None

    times = {"fused": timer(fused())}
    times.update({f"fused[{v}]": timer(fused(cfg)) for v, cfg in variants.items()})
    times.update(unfused=maybe(unfused_with(nccl) if nccl else None), unfused_ccl=timer(unfused_with(ours)))
    # checked after timing: the fused result of each strategy against cuBLAS + NCCL (else + ccl)
    unfused_with(nccl or ours)()
    tolerance = 2e-2 if dtype != torch.float32 else 1e-2  # tf32 products, different summation orders
    errors = {}
    for name, cfg in [("fused", None), *variants.items()]:
        fused(cfg)()
        errors[name] = _rel_error(out, ref_out)
    peer_notes = {}
    symm = tdist.runnable(tdist.symm_unfused(op, a, b, out), "torch_unfused", peer_notes)
    times["torch_unfused"] = min((timer(fn) for fn in symm), default=None)
    if symm:  # torch's result checked too: a peer that computes something else is no peer
        errors["torch_unfused"] = _rel_error(symm[0](), ref_out)
    torch_fn = tdist.fused(op, a, b)
    torch_fn = (tdist.runnable([torch_fn], "torch_fused", peer_notes) or [None])[0] if torch_fn else None
    times["torch_fused"] = maybe(torch_fn)
    times["gemm_ours"] = timer(lambda: gemm_core(torch.empty_like(gemm_res), gemm_a, b))
    times["gemm_cublas"] = timer(lambda: torch.matmul(gemm_a, b, out=gemm_res))
    times["collective"] = maybe((lambda: nccl(coll_out, coll_in)) if nccl else None)
    times["ccl"] = timer(lambda: ours(coll_out, coll_in))
    times["ideal"] = max(times["gemm_cublas"], min(t for t in (times["collective"], times["ccl"]) if t is not None))
    times["best_alt"] = min(times[k] for k in ALTERNATIVES if times.get(k) is not None)
    # what the default call above ran (fp32 inputs: "unfused" while torch's GEMM runs in tf32)
    variant = ops.choose(op, M, b_shape[1], a_shape[1], W, dev.type, None, a.element_size()).variant
    return {"op": op, "shapes": shapes, "panel": f"{op} ({shapes}, {dtype_name})", "variant": variant, "M": M,
            "a": list(a_shape), "b": list(b_shape), "out": list(out_shape), "flops": flops, "dtype": dtype_name,
            "times_s": times, "rel_error": errors,
            "correct": all(e <= tolerance for e in errors.values()),
            "torch_fused_note": peer_notes.get("torch_fused") or (
                tdist.fused_reason if torch_fn is None and op in OPS[:2] else None),  # none for AR/MAG
            "torch_unfused_note": peer_notes.get("torch_unfused")}


#: What a user could call instead of a fused op (the table's ``alt`` is the fastest that ran).
ALTERNATIVES = ("torch_fused", "torch_unfused", "unfused", "unfused_ccl")
COLUMNS = (("fused", "fused"), ("torch_fused", "torch fused"), ("torch_unfused", "torch unf."),
           ("unfused", "cuBLAS+nccl"), ("unfused_ccl", "cuBLAS+ccl"), ("gemm_cublas", "GEMM alone"),
           ("gemm_ours", "our GEMM"), ("ideal", "ideal"))
HEADER = (f"{'op':<22} {'shape':<11} {'M':>6} {'strategy':<9} " + " ".join(f"{c:>11}" for _, c in COLUMNS)
          + f" {'alt/fused':>9} {'fused/GEMM':>10} check\n{'':<51}(ms per call; goals: alt/fused >= 1.15, "
          f"fused/GEMM <= 1.10)")


def row_text(r: dict) -> str:
    t = r["times_s"]
    cells = " ".join(f"{t[k] * 1e3:11.3f}" if t.get(k) is not None else f"{'-':>11}" for k, _ in COLUMNS)
    shape = f"{r.get('shapes', 'mlp')} {r['dtype']}"
    line = (f"{r['op']:<22} {shape:<11} {r['M']:>6} {r['variant']:<9} {cells} "
            f"{t['best_alt'] / t['fused']:9.2f} {t['fused'] / t['gemm_cublas']:10.2f} "
            f"{'ok' if r['correct'] else 'WRONG'}")
    others = [f"{k[6:-1]} {v * 1e3:.3f}" for k, v in t.items() if k.startswith("fused[")]
    return line + (f"\n{'':<51}strategies: " + ", ".join(others) if others else "")


def plot(result: dict, path: str, panel="panel", series=("fused", "torch_fused", "torch_unfused", "unfused_ccl",
                                                    "gemm_cublas"),
         title="iris.collectives.ops") -> str | None:
    """ms per call against M, one panel per ``panel`` value of the rows, one line per ``series``."""
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    names = list(dict.fromkeys(r[panel] for r in result["rows"]))
    cols = min(4, len(names))
    fig, axes = plt.subplots(-(-len(names) // cols), cols, figsize=(5.5 * cols, 4.2 * -(-len(names) // cols)),
                             squeeze=False)
    for ax, name in zip(axes.flat, names):
        rows = [r for r in result["rows"] if r[panel] == name]
        for key, style in zip(series, ("o-", "s--", "d--", "^:", "k-", "v-.")):
            points = [(r["M"], r["times_s"][key] * 1e3) for r in rows if r["times_s"].get(key)]
            if points:
                ax.plot(*zip(*points), style, label=key)
        ax.set(xscale="log", yscale="log", title=name, xlabel="M (tokens)", ylabel="ms per call")
        ax.legend()
    fig.suptitle(f"{title}, {result['world_size']} ranks, {result['device']}, {result['dtype']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write(result: dict, text: str, stem: str, title="Fused GEMM + communication", flag="") -> None:
    os.makedirs(os.path.dirname(stem), exist_ok=True)
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(f"{title}, {result['world_size']} ranks on {result['device']}, {time.strftime('%Y-%m-%d')} "
                f"(`benchmarks/fused_ops.py {' '.join(sys.argv[1:]) or flag}`):\n\n```text\n{text}\n```\n")


def run_layers(args) -> int:
    """Every op at every M, or with ``--mlp`` the MLP at every M; rank 0 prints and writes the results."""
    heap_size = 64 << 20 if args.quick else 8 << 30  # workspaces are freed after each op's shapes
    # fp32 rows compare like with like: the fused ops multiply fp32 at torch's precision
    # (Config.input_precision's default), and so do cuBLAS and torch's ops. tf32 by default, what
    # fp32 training runs in; --fp32-matmul ieee times torch's default, full precision
    torch.backends.cuda.matmul.allow_tf32 = args.fp32_matmul == "tf32"
    ctx = iris.runtime.iris(heap_size=heap_size)
    timer = Timer(ctx, args.reps, args.warmup)
    tdist = Torch(ctx, not args.no_torch_fused, args.torch_two_shot_max_ranks)
    device = torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else "cpu (interpreter)"
    rows = []
    points = [(op, shape, dt, M) for dt in args.dtype for shape in args.shapes for op in args.ops for M in args.m]
    for op, shape, dt, M in [("mlp", "mlp", args.dtype[0], M) for M in args.m] if args.mlp else points:
        if M % ctx.world_size:
            continue
        rows += (measure_mlp(ctx, tdist, timer, M, args) if args.mlp
                 else [measure_op(ctx, tdist, timer, op, M, shape, dt, args)])
        ops.clear_workspaces(ctx)  # collective, like the allocations it frees
        if ctx.rank == 0:
            print(mlp_text(rows[-2:]) if args.mlp else (HEADER + "\n") * (len(rows) == 1) + row_text(rows[-1]),
                  flush=True)
    shared = getattr(ctx, "ranks_on_device", 1)
    result = {"world_size": ctx.world_size, "device": device, "dtype": ",".join(args.dtype), "hidden": args.hidden,
              "intermediate": args.intermediate, "b_layout": args.b_layout, "quick": args.quick,
              "torch": torch.__version__,
              "torch_fused_note": tdist.fused_reason, "nccl_note": tdist.nccl_reason,
              "two_shot_note": tdist.two_shot_reason, "ranks_per_gpu": shared, "fp32_matmul": args.fp32_matmul,
              "rows": rows}
    if ctx.rank == 0:
        text = mlp_text(rows) if args.mlp else HEADER + "\n" + "\n".join(row_text(r) for r in rows)
        if tdist.fused_reason and not args.mlp:
            text += f"\ntorch fused ops: {tdist.fused_reason}"
        if tdist.nccl_reason and not args.mlp:
            text += f"\nnccl columns empty: {tdist.nccl_reason}"
        if tdist.two_shot_reason and not args.mlp:
            text += f"\ntorch unf. of matmul_all_reduce: {tdist.two_shot_reason}"
        # peers that refused a dtype, once per (op, dtype) rather than per row
        refused = {(r["op"], r["dtype"], col): r[key] for r in rows if not args.mlp
                   for col, key in (("torch fused", "torch_fused_note"), ("torch unf.", "torch_unfused_note"))
                   if r.get(key) and r[key] != tdist.fused_reason}
        text += "".join(f"\n{col} of {op} {dt}: {why}" for (op, dt, col), why in refused.items())
        gpus = f"_{ctx.world_size // shared}gpu" if ctx.device.type == "cuda" and shared > 1 else ""
        name = "tp_mlp" if args.mlp else "fused_ops"
        tag = "".join(f"_{t}" for t in (args.tag, "quick" * args.quick) if t)
        stem = os.path.join(args.out, f"{name}_{ctx.world_size}ranks{gpus}{tag}")
        mlp = ("mode", MLP_IMPLS, "sequence-parallel MLP, compiled") if args.mlp else ()
        write(result, text, stem, *(("Sequence-parallel MLP, compiled", "--mlp") if args.mlp else ()))
        note = plot(result, stem + ".png", *mlp)
        print(note or f"wrote {stem}.json, .md, .png", flush=True)
    ok = all(r["correct"] for r in rows)
    tdist.dist.destroy_process_group()
    ctx.close()
    return 0 if ok else 1


# --- --mlp: the compiled sequence-parallel MLP, forward and forward + backward -------------------

MLP_IMPLS = ("iris", "torch_async_tp", "torch_fused", "torch_unfused", "iris_unfused", "iris_regather")


class SequenceParallelMLP(torch.nn.Module):
    """``down(gelu(up(x, w1)), w2)``: ``up`` all-gathers this rank's rows and multiplies by its block
    of ``w1.T``, ``down`` multiplies by its block of ``w2.T`` and reduce-scatters."""

    def __init__(self, w1, w2, up, down):
        super().__init__()
        self.w1, self.w2, self.up, self.down = torch.nn.Parameter(w1.clone()), torch.nn.Parameter(w2.clone()), up, down

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x, self.w1), approximate="tanh"), self.w2)


def torch_ops(group: str, fused: bool):
    """``(all_gather_matmul, matmul_reduce_scatter)`` in torch: its fused symmetric-memory ops, or
    cuBLAS with its symmetric-memory all-gather / reduce-scatter; the first returns the gathered
    operand too, as torch's fused op does."""
    symm = torch.ops.symm_mem
    if fused:
        return (lambda a, b: symm.fused_all_gather_matmul(a.contiguous(), [b], 0, group),
                lambda a, b: symm.fused_matmul_reduce_scatter(a, b, "sum", 0, group))

    wait = torch.ops._c10d_functional.wait_tensor  # the low-contention ops run on a side stream

    def all_gather_matmul(a, b):
        gathered = wait(symm._low_contention_all_gather(a.contiguous(), group))
        return gathered, [gathered @ b]

    return all_gather_matmul, lambda a, b: wait(symm._low_contention_reduce_scatter((a @ b).contiguous(), "sum",
                                                                                    group))


class _TorchLayer(torch.autograd.Function):
    """``all_gather(a) @ w.T`` (``gather``) or ``reduce_scatter(a @ w.T)`` with ``ops = torch_ops(...)``;
    each one's backward is the other, and the gathered operand gives the weight's gradient."""

    @staticmethod
    def forward(ctx, a, w, ops, gather):
        ctx.ops, ctx.gather = ops, gather
        if not gather:
            ctx.save_for_backward(a, w)
            return ops[1](a, w.t())
        gathered, (y,) = ops[0](a, w.t())
        ctx.save_for_backward(gathered, w)
        return y

    @staticmethod
    def backward(ctx, g):
        a, w = ctx.saved_tensors
        if ctx.gather:
            return ctx.ops[1](g, w), g.t() @ a, None, None
        gathered, (da,) = ctx.ops[0](g, w)
        return da, gathered.t() @ a, None, None


def mlp_models(ctx, tdist, w1, w2) -> dict:
    """name -> (model, torch.compile options), or (None, why not): every implementation of the MLP."""
    options = dict(bias=False, sequence_parallel=True, dtype=w1.dtype)
    W, gelu = ctx.world_size, torch.nn.GELU(approximate="tanh")

    def layers(column_config=None):
        pair = (ColumnParallelLinear(ctx, w1.shape[1], w1.shape[0] * W, config=column_config, **options), gelu,
                RowParallelLinear(ctx, w2.shape[1] * W, w2.shape[0], **options))
        for layer, w in ((pair[0], w1), (pair[2], w2)):
            layer.weight.data.copy_(w)
        return torch.nn.Sequential(*pair)

    backend = {"backend": "inductor" if ctx.device.type == "cuda" else "aot_eager"}
    # iris_regather: the layers with the column layer's fused strategy named, so that its backward
    # gathers the input again (what the layers do where ops._config.KEEP_GATHERED says no)
    models = {"iris": (layers(), dict(backend, fullgraph=True)),
              "iris_regather": (layers(ops.Config(variant="pull")), dict(backend, fullgraph=True)),
              "iris_unfused": (SequenceParallelMLP(w1, w2, lambda x, w: F.all_gather(ctx, x) @ w.t(),
                                                   lambda h, w: F.reduce_scatter(ctx, h @ w.t())), backend)}
    if tdist.fused_reason is not None:
        return {**models, **{name: (None, tdist.fused_reason) for name in MLP_IMPLS[1:4]}}
    import torch.distributed._functional_collectives as funcol

    group = tdist.group_name
    models["torch_async_tp"] = (SequenceParallelMLP(
        w1, w2, lambda x, w: funcol.all_gather_tensor_autograd(x, 0, group) @ w.t(),
        lambda h, w: funcol.reduce_scatter_tensor_autograd(h @ w.t(), "sum", 0, group)),
        dict(backend, options={"_micro_pipeline_tp": True}))
    for name, fused in (("torch_fused", True), ("torch_unfused", False)):
        pair = torch_ops(group, fused)
        models[name] = (SequenceParallelMLP(w1, w2, lambda x, w, p=pair: _TorchLayer.apply(x, w, p, True),
                                            lambda h, w, p=pair: _TorchLayer.apply(h, w, p, False)), backend)
    return models


def measure_mlp(ctx, tdist, timer, M: int, args) -> list[dict]:
    """The forward and the forward + backward rows at ``M`` tokens, each implementation checked
    (its result and input gradient) against ``iris_unfused`` run eagerly."""
    W, dev, dtype = ctx.world_size, ctx.device, DTYPES[args.dtype[0]]
    g = torch.Generator(device=dev).manual_seed(2000 + ctx.rank)

    def randn(rows, cols, scale=1.0):
        return (torch.randn(rows, cols, generator=g, device=dev) * scale).to(dtype)

    x, grad = randn(M // W, args.hidden).requires_grad_(True), randn(M // W, args.hidden)
    inter = args.intermediate // W
    w1, w2 = randn(inter, args.hidden, args.hidden ** -0.5), randn(args.hidden, inter, inter ** -0.5)
    models = mlp_models(ctx, tdist, w1, w2)
    expected = models["iris_unfused"][0](x)
    expected.backward(grad)
    expected, expected_dx = expected.detach(), x.grad.clone()
    rows = [{"M": M, "mode": mode, "times_s": {}, "notes": {}, "rel_error": {}, "torch_fused_ops_compiled": None}
            for mode in ("fwd", "fwd+bwd")]
    for name in MLP_IMPLS:
        model, options = models[name]
        torch._dynamo.reset()  # a fresh cache for each model: they share code (SequenceParallelMLP)
        try:
            if model is None:
                raise RuntimeError(options)
            step = torch.compile(model, **options)
            x.grad = None
            code = run_and_get_code(lambda: step(x).backward(grad))[1]  # compiles the forward and the backward
            y = step(x)  # checked, then timed
            for row in rows:
                row["rel_error"][name] = max(_rel_error(y, expected), _rel_error(x.grad, expected_dx))
                if name == "torch_async_tp":  # did inductor's async-TP pass fuse? (torch's ops in its code)
                    row["torch_fused_ops_compiled"] = sum(c.count("symm_mem.fused_") for c in code)
            rows[0]["times_s"][name] = timer(torch.no_grad()(lambda: step(x)))
            rows[1]["times_s"][name] = timer(lambda: step(x).backward(grad))
        except Exception as exc:  # a peer that does not run here: its column is empty, the reason kept
            for row in rows:
                row["times_s"][name], row["notes"][name] = None, f"{type(exc).__name__}: {exc}"[:300]
    for row in rows:
        row["correct"] = all(e <= (2e-2 if dtype != torch.float32 else 1e-2) for e in row["rel_error"].values())
    return rows


def _rel_error(got, expected) -> float:
    return (got.float() - expected.float()).abs().max().item() / (expected.float().abs().max().item() or 1.0)


def mlp_text(rows: list[dict]) -> str:
    """ms per call of each implementation, and iris's time over the fastest torch column."""
    lines = [f"{'M':>6} {'mode':<8} " + " ".join(f"{n:>14}" for n in MLP_IMPLS) + f" {'iris/torch':>10} check"]
    for r in rows:
        t = r["times_s"]
        best = min((t[n] for n in MLP_IMPLS[1:4] if t[n]), default=None)
        cells = [f"{t[n] * 1e3:14.3f}" if t[n] else f"{'-':>14}" for n in MLP_IMPLS]
        ratio = f"{t['iris'] / best:10.2f}" if best and t["iris"] else f"{'-':>10}"
        lines.append(f"{r['M']:>6} {r['mode']:<8} {' '.join(cells)} {ratio} {'ok' if r['correct'] else 'WRONG'}")
    notes = {n: why for r in rows for n, why in r["notes"].items()}
    fused = [r["torch_fused_ops_compiled"] for r in rows]
    return "\n".join(lines + [f"{n}: {why}" for n, why in notes.items()]
                     + [f"(ms per call; torch's fused ops in torch_async_tp's compiled code: {fused})"])


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return run_layers(args)
    except BaseException:
        # Under mpirun the job's abort can outrun the rank's stderr: say what failed on stdout first.
        import traceback

        print(f"fused_ops.py failed on this rank:\n{traceback.format_exc()}", flush=True)
        raise


if __name__ == "__main__":
    sys.exit(main())
