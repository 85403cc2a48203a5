"""Expert parallelism: how fast are ``moe.dispatch`` and ``moe.combine``, next to what a user would call instead?

    mpirun --allow-run-as-root --oversubscribe -n 8 python3 -m mpi4py benchmarks/moe.py   # 8 ranks on one GPU (MPS)
    mpirun -n 2 python3 -m mpi4py benchmarks/moe.py --quick                               # cpu backend, tiny sizes

DeepSeek-V3-like shapes by default: hidden 7168, top-8 of 256 experts (split evenly over the
ranks), bf16, ``--tokens`` per rank 128 (decode) and 4096 (training); every token routed to 8
distinct experts drawn uniformly. For each token count, microseconds per call of the slowest rank
(the median of three timed loops, every rank calling back to back):

- ``iris``: ``moe.dispatch`` (packed layout, ``capacity`` = ``--capacity-factor`` x tokens x top-k
  rows) and ``moe.combine`` (the experts' rows summed back, weighted), eager and in a CUDA graph
  of ``--graph`` calls; each checked once (the counts per expert against the routing gathered on
  the host; the combine of the dispatched rows against torch's weighted sum, bit for bit);
- ``peer``: the same exchange by what a user has: ``torch.distributed.all_to_all_single`` with
  split sizes (NCCL, one rank per GPU; the counts go through the host, so no CUDA graph); where
  ranks share a GPU (NCCL refuses), ``ccl.all_to_all`` (equal splits; torch's ``all_to_all_vdev``
  first with ``--nvshmem``, where its NVSHMEM backend runs: NVSHMEM ends the processes of ranks
  that share a GPU) of buffers padded to ``--peer-factor`` x the mean rows per rank
  pair. The peer's receiver does not group rows by expert (``iris`` does): in its favour. On the
  cpu backend (``--quick``) the peer is gloo's ``all_to_all_single``;
- ``floor``: every rank copying the bytes it sends (``tokens x top-k x hidden`` elements) at once,
  at the GPU's copy bandwidth; ``launch``: a CUDA graph of as many empty kernels as the call
  launches (the decode case's floor).

Ratios: ``iris/peer``, ``graph/floor``, ``graph/launch``. On a GPU writes
``results/moe_<W>ranks[_<G>gpu].{json,md,png}``; the cpu backend's run only prints its table
(its times show that the code path works, not performance).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys

import torch
import triton
from common import NO_PLOT, Timer, log_axes, pyplot, symm_mem_group, torch_group

import iris.runtime  # first: picks the backend (and the interpreter on CPUs) before any kernel
from iris.collectives import ccl, moe

QUICK = dict(tokens=[4, 8], hidden=64, topk=2, experts_per_rank=2)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ints = lambda s: [int(x) for x in s.split(",")]
    p.add_argument("--tokens", type=ints, default=None, help="tokens per rank, e.g. 128,4096 (default)")
    p.add_argument("--hidden", type=int, default=None, help="default 7168")
    p.add_argument("--topk", type=int, default=None, help="default 8")
    p.add_argument("--experts", type=int, default=None, help="experts in all (default 256)")
    p.add_argument("--capacity-factor", type=float, default=1.25, help="iris capacity: this x tokens x top-k rows")
    p.add_argument("--peer-factor", type=float, default=1.5, help="padded peer: this x the mean rows per rank pair")
    p.add_argument("--quick", action="store_true", help="tiny sizes, one timed call (runs on the cpu backend)")
    p.add_argument("--time-per-point", type=float, default=0.05, help="seconds of calls per measurement")
    p.add_argument("--graph", type=int, default=10, metavar="CALLS", help="calls per CUDA graph (0: no graphs)")
    p.add_argument("--no-peer", action="store_true", help="skip the torch peer")
    p.add_argument("--nvshmem", action="store_true",
                   help="ranks sharing a GPU: try torch's all_to_all_vdev (NVSHMEM) first; off by default, as "
                        "NVSHMEM ends every process where ranks share a GPU ('limited MPG')")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)
    if args.quick:
        args.tokens = args.tokens or QUICK["tokens"]
        args.hidden = args.hidden or QUICK["hidden"]
        args.topk = args.topk or QUICK["topk"]
    args.tokens = args.tokens or [128, 4096]
    args.hidden, args.topk = args.hidden or 7168, args.topk or 8
    return args


@triton.jit
def empty_kernel(x):
    """Does nothing: its launch is what any launch costs."""
    pass


def kernels_launched(ctx, fn) -> int | None:
    """CUDA kernels one call of ``fn`` launches (torch's profiler; None off the GPU)."""
    if ctx.device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()) or None


def launch_floor(ctx, timer, kernels: int | None) -> float | None:
    """Seconds of a CUDA graph of ``kernels`` empty kernels."""
    if not kernels or not timer.cuda:
        return None
    x = torch.empty(1, device=ctx.device)

    def launches():
        for _ in range(kernels):
            empty_kernel[(1,)](x)
    return timer.graphed(launches, 1)


def copy_seconds(ctx, timer, nbytes: int) -> float:
    """Seconds for every rank to copy ``nbytes`` at once (``dst.copy_(src)``): the floor."""
    src = torch.ones(max(1, nbytes // 2), dtype=torch.bfloat16, device=ctx.device)
    dst = torch.empty_like(src)
    return timer(lambda: dst.copy_(src))


# --- the inputs and iris's calls ----------------------------------------------------------------------

class Case:
    """One token count: every rank's routing (uniform, distinct experts), its tokens and weights."""

    def __init__(self, ctx, args, tokens: int, experts: int, dtype):
        r, dev = ctx.rank, ctx.device
        self.ctx, self.T, self.H, self.K, self.E = ctx, tokens, args.hidden, args.topk, experts
        g = torch.Generator().manual_seed(args.seed * 1000 + r)
        self.idx = torch.rand(tokens, experts, generator=g).topk(args.topk, -1).indices.to(dev)
        self.w = torch.softmax(torch.randn(tokens, args.topk, generator=g), -1).to(dev)
        self.x = torch.randn(tokens, args.hidden, generator=g).to(dev, dtype)
        self.capacity = max(8, math.ceil(args.capacity_factor * tokens * args.topk / 8) * 8)
        self.routing = torch.stack(ctx.comm.allgather(self.idx.cpu()))  # [W, T, K]: for the checks

    def dispatch(self):
        return moe.dispatch(self.ctx, self.x, self.idx, self.w, self.E, capacity=self.capacity)

    def check(self) -> bool:
        """One dispatch and combine: the counts per local expert, and the combine of the dispatched rows
        (the identity as experts) against torch's weighted sum in slot order, bit for bit."""
        expert_x, meta, handle = self.dispatch()
        G, r = self.E // self.ctx.world_size, self.ctx.rank
        expected = torch.bincount(self.routing.flatten(), minlength=self.E)[r * G:(r + 1) * G]
        y = moe.combine(self.ctx, expert_x, handle)
        acc = torch.zeros(self.T, self.H, device=self.x.device)
        for k in range(self.K):
            acc = acc + self.w[:, k:k + 1] * self.x.float()
        ok = torch.equal(meta.counts.cpu().long(), expected) and torch.equal(y, acc.to(y.dtype))
        return self.ctx.comm.allreduce(int(not ok)) == 0


# --- the peer ------------------------------------------------------------------------------------------

class Peer:
    """The exchange without this library: all_to_all_single (NCCL; gloo on the cpu backend), torch's
    all_to_all_vdev (NVSHMEM), or ccl.all_to_all of padded buffers, whichever runs first, or why not."""

    def __init__(self, ctx, args):
        self.ctx, self.args, self.kind, self.reason = ctx, args, None, None
        if args.no_peer:
            self.reason = "peer disabled with --no-peer"
            return
        try:
            if ctx.device.type != "cuda":
                self.dist, self.kind = torch_group(ctx, "gloo"), "gloo all_to_all_single"
            elif ctx.ranks_on_device == 1:
                torch.cuda.set_device(ctx.device)
                self.dist, self.kind = torch_group(ctx, "nccl"), "nccl all_to_all_single"
            else:
                torch.cuda.set_device(ctx.device)
                self.dist = torch_group(ctx, "gloo")
                self.kind = self._nvshmem() or "ccl.all_to_all, padded"
        except Exception as exc:  # report and go on without the column
            self.reason = f"peer unavailable: {type(exc).__name__}: {exc}"
        reasons = [r for r in ctx.comm.allgather(self.reason) if r]
        kinds = set(ctx.comm.allgather(self.kind))
        if reasons or len(kinds) > 1:
            self.reason, self.kind = (reasons or [f"the ranks' peers differ: {kinds}"])[0], None

    def _nvshmem(self) -> str | None:
        """``"torch all_to_all_vdev"`` when torch's NVSHMEM backend starts here (tried on every rank)."""
        if not self.args.nvshmem:
            # not an exception to catch: NVSHMEM 3.x aborts the process ("Called NVSHMEM API not
            # supported with limited MPG (Multiple Processes Per GPU) runs", H200, 2026-12-07)
            self.note = "torch all_to_all_vdev not tried: its NVSHMEM ends the job where ranks share a GPU (--nvshmem)"
            return None
        try:
            import torch.distributed._symmetric_memory as symm_mem

            symm_mem.set_backend("NVSHMEM")  # before the group's first symmetric allocation
            self.symm_mem, self.group = symm_mem_group()
            probe = self.symm_mem.empty(8, device=self.ctx.device)
            self.symm_mem.rendezvous(probe, self.group)
            ok = True
        except Exception as exc:
            self.note = f"torch all_to_all_vdev unavailable ({type(exc).__name__}: {str(exc)[:120]})"
            ok = False
        return "torch all_to_all_vdev" if all(self.ctx.comm.allgather(ok)) else None

    def calls(self, case: Case) -> dict:
        """``({"dispatch": fn, "combine": fn}, whether a graph can hold them, state)`` of the peer on
        ``case``; after a dispatch and a combine, ``state["y"]`` holds the combine's result."""
        ctx, W, dev = self.ctx, self.ctx.world_size, case.x.device
        G = case.E // W
        dest = (case.idx // G).reshape(-1)  # the rank of each (token, slot)
        order = torch.sort(dest, stable=True).indices
        rows = case.x[order // case.K]
        weights = case.w.reshape(-1)[order].float()
        tokens = order // case.K
        send = torch.zeros(W, dtype=torch.int64, device=dev).index_add_(0, dest, torch.ones_like(dest))
        state = {}

        def weighted_sum(back):
            y = torch.zeros(case.T, case.H, dtype=torch.float32, device=dev)
            return y.index_add_(0, tokens, back.float() * weights[:, None]).to(case.x.dtype)

        if self.kind.endswith("all_to_all_single"):
            d = self.dist

            def dispatch():
                recv = torch.empty_like(send)
                d.all_to_all_single(recv, send)
                state["in"], state["out"] = send.tolist(), recv.tolist()  # the host waits for the counts here
                state["rows"] = out = rows.new_empty(sum(state["out"]), case.H)
                d.all_to_all_single(out, rows, state["out"], state["in"])

            def combine():
                back = rows.new_empty(rows.shape)
                d.all_to_all_single(back, state["rows"], state["in"], state["out"])
                state["y"] = weighted_sum(back)
            return {"dispatch": dispatch, "combine": combine}, False, state
        if self.kind == "torch all_to_all_vdev":
            sm, name = self.symm_mem, self.group
            cap = case.capacity
            inp, out = sm.empty(rows.shape[0], case.H, dtype=case.x.dtype, device=dev), \
                sm.empty(cap, case.H, dtype=case.x.dtype, device=dev)
            back = sm.empty(rows.shape[0], case.H, dtype=case.x.dtype, device=dev)
            splits = sm.empty(W, dtype=torch.int64, device=dev)
            there, here = sm.empty(2, W, dtype=torch.int64, device=dev), sm.empty(2, W, dtype=torch.int64, device=dev)
            back_splits = sm.empty(W, dtype=torch.int64, device=dev)
            for t in (inp, out, back, splits, there, here, back_splits):
                sm.rendezvous(t, name)
            inp.copy_(rows)
            splits.copy_(send)

            def dispatch():
                torch.ops.symm_mem.all_to_all_vdev(inp, out, splits, there, name)

            def combine():
                back_splits.copy_(there[0])
                torch.ops.symm_mem.all_to_all_vdev(out, back, back_splits, here, name)
                state["y"] = weighted_sum(back)
            return {"dispatch": dispatch, "combine": combine}, True, state
        # ccl.all_to_all of padded buffers: chunk j (slot rows) to rank j, whatever it holds
        chunk = max(1, math.ceil(self.args.peer_factor * case.T * case.K / W))
        place = torch.arange(rows.shape[0], device=dev) - (torch.cumsum(send, 0) - send)[dest[order]]
        kept = place < chunk  # rows past a pair's chunk are dropped (timing only)
        slot = (dest[order] * chunk + place.clamp(max=chunk - 1))
        padded, received = rows.new_zeros(W * chunk, case.H), rows.new_empty(W * chunk, case.H)
        returned = rows.new_empty(W * chunk, case.H)

        def dispatch():
            padded.index_copy_(0, slot[kept], rows[kept])
            ccl.all_to_all(ctx, received, padded)

        def combine():
            ccl.all_to_all(ctx, returned, received)
            state["y"] = weighted_sum(returned[slot] * kept[:, None])
        return {"dispatch": dispatch, "combine": combine}, True, state


# --- the run --------------------------------------------------------------------------------------------

def measure(ctx, args, timer, peer, case: Case) -> dict:
    """One token count: iris and the peer, eager and in graphs, the floors, the checks."""
    point = {"tokens": case.T, "correct": case.check(), "eager_us": {}, "graph_us": {}, "floor_us": None,
             "launch_us": {}, "peer_correct": None, "notes": []}
    point["floor_us"] = copy_seconds(ctx, timer, case.T * case.K * case.H * 2) * 1e6
    expert_x, _, handle = case.dispatch()
    y = moe.combine(ctx, expert_x, handle)
    iris_calls = {"dispatch": case.dispatch, "combine": lambda: moe.combine(ctx, expert_x, handle)}
    peer_calls, peer_graphs, state = peer.calls(case) if peer.kind else ({}, False, {})
    if peer_calls:
        try:  # the peer's experts are the identity too: its weighted sums are iris's, summed in another order
            peer_calls["dispatch"]()
            peer_calls["combine"]()
            close = torch.allclose(state["y"].float(), y.float(), rtol=2e-2, atol=2e-2)
            point["peer_correct"] = ctx.comm.allreduce(int(not close)) == 0
        except Exception as exc:
            point["notes"].append(f"peer check: {type(exc).__name__}: {str(exc)[:200]}")
    for op in ("dispatch", "combine"):
        fn = iris_calls[op]
        point["eager_us"][f"iris {op}"] = timer(fn) * 1e6
        graphed = timer.graphed(fn, args.graph)
        if graphed is not None:
            point["graph_us"][f"iris {op}"] = graphed * 1e6
        floor = launch_floor(ctx, timer, kernels_launched(ctx, fn))
        if floor is not None:
            point["launch_us"][op] = floor * 1e6
        if op in peer_calls:
            try:
                point["eager_us"][f"peer {op}"] = timer(peer_calls[op]) * 1e6
                if peer_graphs:
                    graphed = timer.graphed(peer_calls[op], args.graph)
                    if graphed is not None:
                        point["graph_us"][f"peer {op}"] = graphed * 1e6
            except Exception as exc:  # a peer that fails keeps the row going
                point["notes"].append(f"peer {op}: {type(exc).__name__}: {str(exc)[:200]}")
    return point


def run(args) -> dict:
    from mpi4py import MPI

    largest, W = max(args.tokens), MPI.COMM_WORLD.Get_size()
    row_bytes = 2 * args.hidden
    capacity = math.ceil(args.capacity_factor * largest * args.topk) + 8  # iris: expert rows, and the combine's stage
    padded = W * math.ceil(args.peer_factor * largest * args.topk / W)  # the padded peer's buffers (ccl stages them)
    heap = 2 * (capacity + padded) * row_bytes + largest * (row_bytes + 16 * args.topk) + (64 << 20)
    ctx = iris.runtime.iris(heap_size=heap)
    backend = ctx.device.type
    experts = args.experts or (QUICK["experts_per_rank"] * W if args.quick else 256)
    if experts % W:
        raise SystemExit(f"benchmarks/moe.py: --experts {experts} is not a multiple of {W} ranks")
    timer, peer = Timer(ctx, args.time_per_point, args.quick), Peer(ctx, args)
    dtype = torch.bfloat16
    notes = [n for n in (peer.reason, getattr(peer, "note", None)) if n]
    if backend != "cuda":
        notes.append("cpu backend (Triton's interpreter): times show the code path works, not performance")
    result = {"world_size": W, "ranks_per_gpu": ctx.ranks_on_device, "backend": backend,
              "device": torch.cuda.get_device_name(ctx.device) if backend == "cuda" else "cpu (interpreter)",
              "peer": peer.kind, "graph_calls": args.graph, "date": datetime.date.today().isoformat(),
              "hidden": args.hidden, "topk": args.topk, "experts": experts, "dtype": "bf16",
              "capacity_factor": args.capacity_factor, "command": " ".join(["benchmarks/moe.py", *sys.argv[1:]]),
              "points": [], "notes": notes}
    for tokens in args.tokens:
        point = measure(ctx, args, timer, peer, Case(ctx, args, tokens, experts, dtype))
        result["points"].append(point)
        if ctx.rank == 0:
            print(f"tokens {tokens:>6}: iris dispatch {point['eager_us']['iris dispatch']:10.1f} us, combine "
                  f"{point['eager_us']['iris combine']:10.1f} us ({'correct' if point['correct'] else 'WRONG'})",
                  flush=True)
        ctx.barrier()
        ccl.clear_workspaces(ctx)  # one size's heap buffers at a time
    ctx.close()
    return result


def _div(a, b):
    return a / b if a is not None and b else None


def _cell(v, width=9, digits=1) -> str:
    return f"{'-':>{width}}" if v is None else f"{v:>{width}.{digits}f}"


def table(result: dict) -> str:
    r = result
    lines = [f"{r['world_size']} ranks, {r['device']} ({r['ranks_per_gpu']} per GPU), {r['date']}; hidden "
             f"{r['hidden']}, top-{r['topk']} of {r['experts']} experts, {r['dtype']}; us per call, slowest rank; "
             f"graph = in a CUDA graph of {r['graph_calls']} calls; peer = {r['peer']}; floor = every rank copying "
             f"what it sends at once; launch = a CUDA graph of as many empty kernels as the call launches", "",
             f"{'tokens':>7} {'op':>9} {'iris':>9} {'graph':>9} {'peer':>9} {'p.graph':>9} {'floor':>9} {'launch':>9}"
             f" {'iris/peer':>9} {'grph/flr':>9} {'grph/lch':>9}"]
    for p in result["points"]:
        e, g = p["eager_us"], p["graph_us"]
        for op in ("dispatch", "combine"):
            iris_e, iris_g = e.get(f"iris {op}"), g.get(f"iris {op}")
            launch = p["launch_us"].get(op)
            mark = "" if p["correct"] and p["peer_correct"] is not False else "*"
            lines.append(f"{p['tokens']:>7} {op + mark:>9} " + " ".join(_cell(v) for v in (
                iris_e, iris_g, e.get(f"peer {op}"), g.get(f"peer {op}"), p["floor_us"], launch)) + " "
                + " ".join(_cell(v, digits=2) for v in (_div(iris_e, e.get(f"peer {op}")), _div(iris_g, p["floor_us"]),
                                                       _div(iris_g, launch))))
    notes = list(result["notes"]) + [f"{p['tokens']} tokens: {n}" for p in result["points"] for n in p["notes"]]
    lines += [f"note: {note}" for note in notes] + ["(* = a wrong result)"] * (not all(p["correct"]
                                                                                        for p in result["points"]))
    return "\n".join(lines)


def plot(result: dict, path: str) -> str | None:
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    tokens = [p["tokens"] for p in result["points"]]
    for ax, op in zip(axes, ("dispatch", "combine")):
        for key, style in (("eager_us", "-"), ("graph_us", ":")):
            for who in ("iris", "peer"):
                values = [p[key].get(f"{who} {op}") for p in result["points"]]
                if any(v is not None for v in values):
                    ax.plot(tokens, values, style, marker="o", markersize=3,
                            label=f"{who}{' (graph)' if key == 'graph_us' else ''}")
        ax.plot(tokens, [p["floor_us"] for p in result["points"]], "k--", label="floor (copy)")
        log_axes(ax, "tokens per rank", f"moe {op}, {result['world_size']} ranks, {result['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def save(args, result: dict) -> None:
    text = table(result)
    print(text)
    if result["backend"] != "cuda":
        print("cpu backend: no results files (times of the interpreter)", flush=True)
        return
    os.makedirs(args.out, exist_ok=True)
    W, shared = result["world_size"], result["ranks_per_gpu"]
    gpus = f"_{W // shared}gpu" if shared > 1 else ""
    stem = os.path.join(args.out, f"moe_{W}ranks{gpus}")
    why_no_plot = plot(result, stem + ".png")
    if why_no_plot:
        result = dict(result, notes=[*result["notes"], why_no_plot])
        text = table(result)
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(f"MoE dispatch and combine, {W} ranks on {result['device']} (`{result['command']}`):\n\n"
                f"```text\n{text}\n```\n")
    print(f"wrote {stem}.json, .md and .png", flush=True)


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        result = run(args)
    except BaseException:
        import traceback

        print(f"moe.py failed on this rank:\n{traceback.format_exc()}", flush=True)
        raise
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() == 0:
        save(args, result)


if __name__ == "__main__":
    main()
