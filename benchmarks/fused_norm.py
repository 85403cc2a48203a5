"""Does fusing pay at the end of a tensor-parallel layer? ``ops.all_reduce_residual_rmsnorm`` (all-reduce +
residual add + RMSNorm in one kernel) against the pairs a user would write instead.

    mpirun --allow-run-as-root --oversubscribe -n 4 python3 -m mpi4py benchmarks/fused_norm.py  # one GPU (MPS)
    mpirun -n 2 python3 -m mpi4py benchmarks/fused_norm.py --tokens 1,16,256 --hidden 8192
    mpirun -n 2 python3 -m mpi4py benchmarks/fused_norm.py --quick          # cpu backend, tiny shapes

For each shape (``--tokens`` decode rows and ``--prefill`` rows, times ``--hidden``; bf16 unless
``--dtype``), microseconds per call of the slowest rank, every rank calling back to back (the median
of three timed loops), eager and in a CUDA graph of ``--graph`` calls:

- ``fused``: ``ops.all_reduce_residual_rmsnorm`` on plain tensors (the table's strategy), the
  residual updated in place; ``fused_heap``: the same with ``partial`` on the symmetric heap (a GEMM
  that wrote its output there: read in place, no staging);
- the unfused pairs, each an all-reduce, then ``residual + sum`` and
  ``torch.nn.functional.rms_norm`` (eager, and ``_c``: the add and the norm under ``torch.compile``):
  ``ccl_norm`` (this library's ``ccl.all_reduce``), ``torch1_norm`` and ``torch2_norm`` (torch's
  symmetric-memory one-shot and two-shot all-reduce, on a symmetric buffer the GEMM would have
  written; where ranks share a GPU, a gloo group and ``TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1``);
- ``all_reduce``: the fastest all-reduce alone (``ccl`` or torch's), what the fused op adds to;
- ``floor``: every rank copying twice its message at once (the fused op reads ``partial`` and
  ``residual`` and writes ``out`` and ``residual_out``: at least that traffic);
- with ``--variants one_shot_buffered,two_shot``: ``fused_<variant>``, the fused op on plain tensors
  with that strategy forced (``ops.Config(variant=...)``), beside the table's choice, to decide
  the rule where the table's strategy loses (a variant the shape cannot take leaves its cell empty).

Ratios: ``fused/pair`` (the fused op over the fastest pair; the goal is <= 0.7 at decode sizes, where
launches dominate) and ``fused/AR`` (over the all-reduce alone; the goal is <= 1.05 at prefill size).
Every implementation's result is checked against the fused op's (bf16: the pairs round the sum and
the new residual before the norm, so they differ by a few ulps). Writes
``fused_norm_<W>ranks[_<G>gpu][_quick].{json,md,png}`` into ``--out``: by default
``benchmarks/results/`` on a GPU; on the cpu backend only where ``--out`` is given (its times show
that the code paths run, not performance).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch
from common import NO_PLOT, Timer, agreed_reason, pyplot, symm_mem_group, torch_group

import iris.runtime  # first: picks the backend (and the interpreter on CPUs) before any kernel
from iris.collectives import ccl, ops
from iris.collectives.ops._norm_config import VARIANTS, choose

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
EPS = 1e-6
#: Timed implementations, in the table's order (``_c``: the add and the norm compiled).
IMPLS = ("fused", "fused_heap", "ccl_norm", "ccl_norm_c", "torch1_norm", "torch1_norm_c", "torch2_norm",
         "torch2_norm_c")
PAIRS = IMPLS[2:]
ALL_REDUCES = ("ccl", "torch1", "torch2")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16, 64, 256],
                   help="decode rows (tokens per step)")
    p.add_argument("--prefill", type=lambda s: [int(x) for x in s.split(",") if x], default=[8192],
                   help="prefill rows, timed at the largest hidden size only (empty: none)")
    p.add_argument("--hidden", type=lambda s: [int(x) for x in s.split(",")], default=[4096, 8192])
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--time-per-point", type=float, default=0.05, help="seconds of calls per measurement")
    p.add_argument("--graph", type=int, default=20, metavar="CALLS", help="calls per CUDA graph (0: no graphs)")
    p.add_argument("--no-peer", action="store_true", help="skip torch's symmetric-memory all-reduces")
    p.add_argument("--torch-two-shot-max-ranks", type=int, default=4, metavar="W",
                   help="with more ranks sharing a GPU, torch's two-shot all-reduce is not timed: it stalled with 8 "
                        "ranks on one H200 (docs/performance.md), and its one-shot only up to "
                        "--torch-shared-one-shot-max-bytes")
    p.add_argument("--torch-shared-one-shot-max-bytes", type=int, default=16 << 10, metavar="BYTES",
                   help="with more ranks sharing a GPU than --torch-two-shot-max-ranks, torch's one-shot all-reduce "
                        "is timed only up to this message size: at 8 ranks on one H100 it ran at 16 KiB and spun "
                        "for ever at 256 KiB (docs/performance.md)")
    p.add_argument("--no-compile", action="store_true", help="skip the compiled norms")
    p.add_argument("--variants", type=lambda s: [v for v in s.split(",") if v], default=[], metavar="V,V",
                   help=f"also time the fused op with each of these strategies forced (of {', '.join(VARIANTS)})")
    p.add_argument("--quick", action="store_true", help="tiny shapes, one timed call (runs on the cpu backend)")
    p.add_argument("--out", default=None, help="folder for the JSON, Markdown and PNG (default: results/ on a GPU)")
    args = p.parse_args(argv)
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        p.error(f"--variants {','.join(unknown)}: not a strategy of the op ({', '.join(VARIANTS)})")
    if args.quick:
        args.tokens, args.prefill, args.hidden, args.graph = [3], [16], [64], 0
    return args


# --- timing --------------------------------------------------------------------------------------------

# --- the implementations ---------------------------------------------------------------------------------

def add_norm(s, residual, weight):
    """The unfused epilogue: the new residual and its RMSNorm (torch, in the activations' dtype)."""
    h = residual + s
    return torch.nn.functional.rms_norm(h, (h.shape[-1],), weight, EPS), h


class Peers:
    """torch's symmetric-memory all-reduces over the same ranks, or why not."""

    def __init__(self, ctx, enabled: bool, two_shot_max_ranks: int = 4, shared_one_shot_max_bytes: int = 16 << 10):
        self.reason = None
        #: the largest message torch's one-shot is timed at (None: any), and why
        self.one_shot_max_bytes, self.one_shot_reason = None, None
        #: why torch's two-shot is not timed, or None
        self.two_shot_reason = None
        if ctx.ranks_on_device > two_shot_max_ranks:
            self.two_shot_reason = (f"torch's two_shot_all_reduce_ not timed with {ctx.ranks_on_device} ranks "
                                    f"sharing a GPU (it stalled there; --torch-two-shot-max-ranks "
                                    f"{two_shot_max_ranks})")
            self.one_shot_max_bytes = shared_one_shot_max_bytes
            self.one_shot_reason = (f"torch's one_shot_all_reduce_out timed only up to {shared_one_shot_max_bytes} "
                                    f"bytes with {ctx.ranks_on_device} ranks sharing a GPU (it spun for ever at "
                                    f"256 KiB with 8; --torch-shared-one-shot-max-bytes)")
        if not enabled:
            self.reason = "disabled with --no-peer"
        elif ctx.device.type != "cuda":
            self.reason = "torch's symmetric memory needs CUDA: torch columns empty on the cpu backend"
        else:
            try:
                torch.cuda.set_device(ctx.device)
                torch_group(ctx, "nccl" if ctx.ranks_on_device == 1 else "gloo")
                self.symm_mem, self.group = symm_mem_group()
            except Exception as exc:  # report it and go on without the columns
                self.reason = f"{type(exc).__name__}: {exc}"[:300]
        self.reason = agreed_reason(ctx, self.reason)

    def all_reduces(self, partial):
        """name -> (a call that leaves the sum in the returned tensor); the partial copied into a
        symmetric buffer first, as the GEMM would have written it there."""
        if self.reason:
            return {}
        buf = self.symm_mem.empty(partial.shape, dtype=partial.dtype, device=partial.device)
        self.symm_mem.rendezvous(buf, self.group)
        buf.copy_(partial)
        out = torch.empty_like(partial)
        symm = torch.ops.symm_mem

        def one_shot():
            symm.one_shot_all_reduce_out(buf, "sum", self.group, out)
            return out

        def two_shot():
            symm.two_shot_all_reduce_(buf, "sum", self.group)
            return buf

        calls = {"torch1": (one_shot, lambda: buf.copy_(partial)), "torch2": (two_shot, lambda: buf.copy_(partial))}
        if self.two_shot_reason:
            del calls["torch2"]
        if self.one_shot_max_bytes is not None and partial.numel() * partial.element_size() > self.one_shot_max_bytes:
            del calls["torch1"]
        return calls


def measure(ctx, timer, peers, compiled_norm, M: int, H: int, args) -> dict:
    """One shape: every implementation checked once, then timed eagerly and in a graph."""
    W, dev, dtype = ctx.world_size, ctx.device, DTYPES[args.dtype]
    g = torch.Generator(device=dev).manual_seed(1000 * ctx.rank + M)
    partial = torch.randn(M, H, generator=g, device=dev).to(dtype)
    g0 = torch.Generator(device=dev).manual_seed(M)  # the residual and weight: the same on every rank
    residual0 = torch.randn(M, H, generator=g0, device=dev).to(dtype)
    weight = (1 + 0.1 * torch.randn(H, generator=g0, device=dev)).to(dtype)
    out, residual = torch.empty_like(partial), residual0.clone()
    heap_partial = ctx.zeros(M, H, dtype=dtype).copy_(partial)
    ctx.barrier()
    # the reference: the fused op once, on fresh tensors
    expected, expected_residual = torch.empty_like(partial), torch.empty_like(partial)
    ops.all_reduce_residual_rmsnorm(ctx, expected, expected_residual, partial, residual0, weight, EPS)
    calls, errors, notes = {}, {}, []

    def fused(p):
        return lambda: ops.all_reduce_residual_rmsnorm(ctx, out, residual, p, residual, weight, EPS)

    for name, p in (("fused", partial), ("fused_heap", heap_partial)):
        residual.copy_(residual0)
        fused(p)()
        errors[name] = max(rel_error(out, expected), rel_error(residual, expected_residual))
        calls[name] = fused(p)
    for variant in args.variants:  # the strategies forced, beside the table's choice
        name, config = f"fused_{variant}", ops.Config(variant=variant)

        def forced(config=config):
            return ops.all_reduce_residual_rmsnorm(ctx, out, residual, partial, residual, weight, EPS, config=config)

        residual.copy_(residual0)
        try:
            forced()
        except Exception as exc:  # a strategy this shape cannot take
            notes.append(f"{name} at {M}x{H}: {type(exc).__name__}: {exc}"[:300])
            continue
        errors[name] = max(rel_error(out, expected), rel_error(residual, expected_residual))
        calls[name] = forced
    s = torch.empty_like(partial)

    def ccl_all_reduce():
        return ccl.all_reduce(ctx, s, partial)

    all_reduces = {"ccl": (ccl_all_reduce, lambda: None)}
    all_reduces.update(peers.all_reduces(partial))
    norms = {"": add_norm}
    if compiled_norm is not None:
        norms["_c"] = compiled_norm
    for ar, (reduce, refresh) in all_reduces.items():
        for suffix, norm in norms.items():
            name = f"{ar}_norm{suffix}"
            refresh()
            try:
                y, h = norm(reduce(), residual0, weight)
            except Exception as exc:  # a peer that refuses this dtype or shape: its column stays empty
                notes.append(f"{name} at {M}x{H}: {type(exc).__name__}: {exc}"[:300])
                continue
            errors[name] = max(rel_error(y, expected), rel_error(h, expected_residual))
            calls[name] = lambda reduce=reduce, norm=norm: norm(reduce(), residual, weight)
    eager = {name: timer(fn) * 1e6 for name, fn in calls.items()}
    graph = {}
    for name, fn in calls.items():
        try:
            seconds = timer.graphed(fn, args.graph)
        except Exception as exc:  # e.g. a peer that cannot be captured: keep its eager time
            notes.append(f"{name} at {M}x{H} in a graph: {type(exc).__name__}: {exc}"[:300])
            seconds = None
        if seconds is not None:
            graph[name] = seconds * 1e6
    alone = {ar: timer(fn) * 1e6 for ar, (fn, _) in all_reduces.items()}
    alone_graph = {}
    for ar, (fn, _) in all_reduces.items():
        seconds = timer.graphed(fn, args.graph)
        if seconds is not None:
            alone_graph[ar] = seconds * 1e6
    src, dst = torch.empty(2 * M * H, dtype=dtype, device=dev), torch.empty(2 * M * H, dtype=dtype, device=dev)
    floor = timer(lambda: dst.copy_(src)) * 1e6
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    cfg = choose("", M, 1 << (H - 1).bit_length(), M * H * partial.element_size(), str(dtype).removeprefix("torch."),
                 W, dev.type, ctx.ranks_on_device, None)  # what "fused" ran
    ctx.barrier()
    ctx.free(heap_partial)
    ccl.clear_workspaces(ctx)  # the heap holds one shape at a time (the fused op's workspaces too)
    return {"tokens": M, "hidden": H, "bytes": M * H * partial.element_size(), "variant": cfg.variant,
            "block_m": cfg.block_m, "eager_us": eager, "graph_us": graph, "all_reduce_us": alone,
            "all_reduce_graph_us": alone_graph, "floor_us": floor, "rel_error": errors,
            "correct": all(e <= tolerance for e in errors.values()), "notes": notes}


def rel_error(got, expected) -> float:
    return (got.float() - expected.float()).abs().max().item() / (expected.float().abs().max().item() or 1.0)


# --- output -----------------------------------------------------------------------------------------------

def best(times: dict, names) -> float | None:
    values = [times[n] for n in names if times.get(n)]
    return min(values) if values else None


def impls(result: dict) -> tuple:
    """The table's columns: the implementations, then the forced strategies (``--variants``)."""
    return IMPLS + tuple(f"fused_{v}" for v in result.get("variants", ()))


def table(result: dict) -> str:
    names = impls(result)
    width = {n: max(13, len(n)) for n in names}
    cols = " ".join(f"{n:>{width[n]}}" for n in names)
    lines = [f"{result['world_size']} ranks ({result['ranks_per_gpu']} per GPU), {result['device']}, "
             f"{result['dtype']}, {result['date']}; us per call, slowest rank; pair = the fastest unfused pair; "
             f"AR = the fastest all-reduce alone; floor = every rank copying 2x its message at once"]
    for key, ar_key, title in (("eager_us", "all_reduce_us", "eager"), ("graph_us", "all_reduce_graph_us",
                                                                        f"in CUDA graphs of {result['graph']} calls")):
        rows = [r for r in result["rows"] if r[key]]
        if not rows:
            continue
        lines += ["", f"{title}:", f"{'tokens':>7} {'hidden':>6} {'strategy':<17} {cols} {'AR':>9} {'floor':>9} "
                                   f"{'fused/pair':>10} {'fused/AR':>8} check"]
        for r in rows:
            t = r[key]
            cells = " ".join(f"{t[n]:{width[n]}.1f}" if t.get(n) else f"{'-':>{width[n]}}" for n in names)
            pair, alone = best(t, PAIRS), best(r[ar_key], ALL_REDUCES)
            ratio = f"{t['fused'] / pair:10.2f}" if pair and t.get("fused") else f"{'-':>10}"
            over_ar = f"{t['fused'] / alone:8.2f}" if alone and t.get("fused") else f"{'-':>8}"
            alone_text = f"{alone:9.1f}" if alone else f"{'-':>9}"
            lines.append(f"{r['tokens']:>7} {r['hidden']:>6} {r['variant'] + '/' + str(r['block_m']):<17} {cells} "
                         f"{alone_text} {r['floor_us']:9.1f} {ratio} {over_ar} {'ok' if r['correct'] else 'WRONG'}")
    lines += [f"note: {n}" for n in result["notes"]]
    return "\n".join(lines)


def plot(result: dict, path: str) -> str | None:
    """us per call against tokens, one panel per hidden size, one line per implementation (eager)."""
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    hiddens = sorted({r["hidden"] for r in result["rows"]})
    fig, axes = plt.subplots(1, len(hiddens), figsize=(6 * len(hiddens), 4.5), squeeze=False)
    for ax, H in zip(axes[0], hiddens):
        rows = [r for r in result["rows"] if r["hidden"] == H]
        for name in (*impls(result), "all_reduce", "floor"):
            points = [(r["tokens"], best(r["all_reduce_us"], ALL_REDUCES) if name == "all_reduce" else
                       r["floor_us"] if name == "floor" else r["eager_us"].get(name)) for r in rows]
            points = [(m, t) for m, t in points if t]
            if points:
                ax.plot(*zip(*points), "k--" if name == "floor" else "o-", label=name, markersize=3)
        ax.set(xscale="log", yscale="log", xlabel="tokens (rows)", ylabel="us per call", title=f"hidden {H}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"all-reduce + residual + RMSNorm, {result['world_size']} ranks, {result['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def save(args, result: dict) -> None:
    text = table(result)
    print(text, flush=True)
    folder = args.out or (RESULTS if result["backend"] == "cuda" else None)
    if folder is None:
        print("cpu backend: no results written (pass --out to write them)", flush=True)
        return
    os.makedirs(folder, exist_ok=True)
    W, shared = result["world_size"], result["ranks_per_gpu"]
    gpus = f"_{W // shared}gpu" if result["backend"] == "cuda" and shared > 1 else ""
    stem = os.path.join(folder, f"fused_norm_{W}ranks{gpus}{'_quick' if args.quick else ''}")
    why_no_plot = plot(result, stem + ".png")
    with open(stem + ".json", "w") as f:
        json.dump(dict(result, notes=result["notes"] + ([why_no_plot] if why_no_plot else [])), f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(f"All-reduce + residual add + RMSNorm, {W} ranks on {result['device']} "
                f"(`{result['command']}`):\n\n```text\n{text}\n```\n")
    print(f"wrote {stem}.json, .md{'' if why_no_plot else ' and .png'}", flush=True)


def run(args) -> dict:
    dtype = DTYPES[args.dtype]
    shapes = [(M, H) for H in args.hidden for M in args.tokens] + [(M, max(args.hidden)) for M in args.prefill]
    biggest = max(M * H for M, H in shapes) * dtype.itemsize
    ctx = iris.runtime.iris(heap_size=6 * biggest + (256 << 20))
    timer = Timer(ctx, args.time_per_point, args.quick, max_iters=1000)
    peers = Peers(ctx, not args.no_peer, args.torch_two_shot_max_ranks, args.torch_shared_one_shot_max_bytes)
    compiled_norm, notes = None, []
    if not args.no_compile:
        compiled_norm = torch.compile(add_norm, backend="inductor" if ctx.device.type == "cuda" else "aot_eager")
    if peers.reason:
        notes.append(f"torch columns: {peers.reason}")
    elif peers.two_shot_reason:
        notes += [peers.two_shot_reason, peers.one_shot_reason]
    if ctx.device.type != "cuda":
        notes.append("cpu backend (Triton's interpreter): times show that the code paths run, not performance")
    result = {"world_size": ctx.world_size, "ranks_per_gpu": ctx.ranks_on_device, "backend": ctx.device.type,
              "device": torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else "cpu (interpreter)",
              "dtype": args.dtype, "graph": args.graph, "torch": torch.__version__, "variants": args.variants,
              "date": datetime.date.today().isoformat(), "rows": [], "notes": notes,
              "command": " ".join(["benchmarks/fused_norm.py", *sys.argv[1:]])}
    for M, H in shapes:
        row = measure(ctx, timer, peers, compiled_norm, M, H, args)
        notes += row.pop("notes")
        result["rows"].append(row)
        if ctx.rank == 0:
            print(f"{M:>6} x {H}: fused {row['eager_us']['fused']:.1f} us ({row['variant']}), "
                  f"{'ok' if row['correct'] else 'WRONG'}", flush=True)
    ctx.close()
    return result


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        result = run(args)
    except BaseException:
        # Under mpirun the job's abort can outrun the rank's stderr: say what failed on stdout first.
        import traceback

        print(f"fused_norm.py failed on this rank:\n{traceback.format_exc()}", flush=True)
        raise
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() == 0:
        save(args, result)
    return 0 if all(r["correct"] for r in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
