"""Host collectives benchmark: iris.collectives.ccl against NCCL, nccl-tests style.

    mpirun -n 2 python3 -m mpi4py benchmarks/ccl.py                  # one rank per GPU: NCCL is the peer
    mpirun --allow-run-as-root --oversubscribe -n 4 python3 -m mpi4py benchmarks/ccl.py   # 4 ranks, one GPU (MPS)
    mpirun -n 2 python3 -m mpi4py benchmarks/ccl.py --write-table    # tune, and rewrite ccl/_table.py
    mpirun -n 2 python3 -m mpi4py benchmarks/ccl.py --quick          # CPU backend, tiny sizes
    python3 benchmarks/ccl.py --merge a.json b.json --write-table    # join runs of one configuration

For each collective (all_reduce, reduce_scatter, all_gather, all_to_all, broadcast) and each size
(``--sizes``, 4 KiB to 1 GiB by default) it prints nccl-tests' columns: size, time per call (us),
algorithm bandwidth (size / time) and bus bandwidth (algbw times 2(W-1)/W for all-reduce, (W-1)/W
for reduce-scatter, all-gather and all-to-all, 1 for broadcast). As in nccl-tests, size is the
larger buffer of a call: the input of all_reduce, reduce_scatter, all_to_all and broadcast, the
output of all_gather. Every call is timed eager (``--iters`` calls back to back, CUDA events, the
slowest rank counts) and, on the GPU, captured in a CUDA graph (``--graph`` calls per graph, the
replay timed), side by side with the peer in the same run:

- one rank per GPU: NCCL through ``torch.distributed`` (nccl backend), eager and in a CUDA graph;
- several ranks on one GPU (NCCL refuses two ranks on one GPU): torch symmetric memory's
  ``one_shot_all_reduce`` / ``two_shot_all_reduce_`` for all_reduce (a gloo group and
  ``TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1``, as benchmarks/tile_collectives.py);
- on the cpu backend no peer (the column says why).

A plain peer-to-peer copy (a Triton kernel reading the next rank's heap through translated
pointers) gives the bandwidth baseline per size. Each ccl call is checked once (small integers,
exact results) before it is timed.

``--write-table`` also times every candidate variant and tiling (``CANDIDATES``) per size and
collective, and rewrites ``packages/iris-collectives/src/iris/collectives/ccl/_table.py``
(``--table-out`` elsewhere) with the fastest per size class, for this backend (rows of other
backends are kept).

Writes ``benchmarks/results/ccl_<W>ranks[_<G>gpu][_quick].json`` (``_<G>gpu`` when the W ranks
share G GPUs), a Markdown table and a plot next to it (when matplotlib is installed), and the
table with ``--write-table``: after every size, so that a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import functools
import json
import os
import pprint
import signal
import socket
import sys
import time

os.environ.setdefault("TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES", "1")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
if "--quick" in sys.argv:
    os.environ.setdefault("IRIS_BACKEND", "cpu")

import torch
import triton
import triton.language as tl

import iris.device
import iris.runtime  # first: picks the backend (and the interpreter on CPUs) before any kernel
from iris.collectives import ccl
from iris.collectives.ccl import _table

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
DEFAULT_SIZES = [4 * KiB * 4 ** i for i in range(9)] + [GiB]  # 4 KiB, 16 KiB, ..., 256 MiB, 1 GiB
QUICK_SIZES = [4 * KiB]
TABLE_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "packages",
                          "iris-collectives", "src", "iris", "collectives", "ccl", "_table.py")

#: What --write-table tries, per backend: (variant or None for the collective's one, block, width, warps).
CANDIDATES = {
    "cuda": [(v, b, 1024, w) for v in ("one_shot", "two_shot") for b, w in ((1024, 4), (4096, 4), (8192, 8),
                                                                           (16384, 8))],
    "cpu": [(v, 1024, 64, 4) for v in ("one_shot", "two_shot")],  # the interpreter: a smoke run
}


@triton.jit
def peer_copy_kernel(context, src, dst, n, rank: tl.constexpr, world_size: tl.constexpr, BLOCK: tl.constexpr):
    """dst = the next rank's src (both on the heap): the plain peer-to-peer read baseline."""
    ctx = iris.device.DeviceContext.initialize(context, rank, world_size)
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        data = ctx.load(src + offs, (rank + 1) % world_size, mask=mask)
        tl.store(dst + offs, data, mask=mask)


def parse_size(text: str) -> int:
    """'4K' -> 4096, '1M', '1G', or plain bytes."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": KiB, "M": MiB, "G": GiB}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * scale)


def human(n: int) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=lambda s: [parse_size(x) for x in s.split(",")], default=None,
                   help="bytes of the larger buffer per rank, e.g. 4K,1M,1G (default 4 KiB .. 1 GiB)")
    p.add_argument("--collectives", type=lambda s: s.split(","), default=list(COLLECTIVES), help=",".join(COLLECTIVES))
    p.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    p.add_argument("--quick", action="store_true", help="tiny sizes, one timed call (runs on the CPU backend)")
    p.add_argument("--iters", type=int, default=0, help="timed calls per point (default: fill --time-per-point)")
    p.add_argument("--time-per-point", type=float, default=0.05, help="seconds of calls per measurement")
    p.add_argument("--graph", type=int, default=20, metavar="CALLS", help="calls per CUDA graph (0: no graphs)")
    p.add_argument("--write-table", action="store_true", help="time every candidate and rewrite ccl/_table.py")
    p.add_argument("--table-out", default=TABLE_PATH, help="where --write-table writes the table")
    p.add_argument("--merge", nargs="+", metavar="JSON", default=None,
                   help="no timing: join these runs' JSON files (one configuration) into one result, written as "
                        "a run's would be (and the table, with --write-table)")
    p.add_argument("--verbose", action="store_true", help="print each config before it is timed (where a run stops)")
    p.add_argument("--peer-max-bytes", type=parse_size, default=None, metavar="SIZE",
                   help="time NCCL / torch symm_mem only up to this size (torch's symm_mem two-shot stalled at "
                        "16 MiB with 8 ranks on one H200: pass 1M there)")
    p.add_argument("--no-peer", action="store_true", help="skip NCCL / torch symm_mem")
    p.add_argument("--heap", action="store_true",
                   help="also time ccl on tensors allocated on the symmetric heap (column ccl_heap: no staging)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)
    if args.sizes is None:
        args.sizes = QUICK_SIZES if args.quick else DEFAULT_SIZES
    return args


def bus_factor(name: str, W: int) -> float:
    """nccl-tests' bus bandwidth factor."""
    return {"all_reduce": 2 * (W - 1) / W, "broadcast": 1.0}.get(name, (W - 1) / W)


# --- buffers and calls ---------------------------------------------------------------------------------

class Case:
    """The tensors of one collective at one size, and the ccl call on them (checked once)."""

    def __init__(self, ctx, name: str, size: int, dtype, heap: bool = False):
        W, r, dev = ctx.world_size, ctx.rank, ctx.device
        esize = torch.empty((), dtype=dtype).element_size()
        big = max(W, size // esize // W * W)  # elements of the larger buffer, a multiple of W
        small = big // W
        self.name, self.dtype, self.nbytes = name, dtype, big * esize
        pattern = (torch.arange(big, device=dev) % 7 + r).to(dtype)
        if name == "all_reduce":
            self.inp, self.out = pattern, torch.empty(big, dtype=dtype, device=dev)
        elif name == "reduce_scatter":
            self.inp, self.out = pattern, torch.empty(small, dtype=dtype, device=dev)
        elif name == "all_gather":
            self.inp, self.out = pattern[:small].clone(), torch.empty(big, dtype=dtype, device=dev)
        elif name == "all_to_all":
            self.inp, self.out = pattern, torch.empty(big, dtype=dtype, device=dev)
        else:
            self.inp = self.out = pattern
        self.heap = []
        if heap:  # the same tensors on the symmetric heap: read by the peers where they are, no staging
            inp = ctx.zeros(self.inp.shape, dtype=dtype).copy_(self.inp)
            out = inp if self.out is self.inp else ctx.zeros(self.out.shape, dtype=dtype)
            self.heap = [inp] if out is inp else [inp, out]
            self.inp, self.out = inp, out
        self.message = self.inp.numel() * esize  # what the selection table is keyed by
        self.ctx = ctx

    def free(self) -> None:
        """Give the heap tensors back (the heap holds one size at a time)."""
        for t in reversed(self.heap):
            self.ctx.free(t)
        self.heap = []

    def call(self, config=None):
        ctx = self.ctx
        if self.name == "broadcast":
            return lambda: ccl.broadcast(ctx, self.out, 0, config=config)
        fn = getattr(ccl, self.name)
        return lambda: fn(ctx, self.out, self.inp, config=config)

    def expected(self) -> torch.Tensor:
        """What ``out`` must hold, built on the rank's device: at 1 GiB a host-side reference (and
        the copy to it) took seconds per check, most of a --write-table run's time."""
        W, r, n = self.ctx.world_size, self.ctx.rank, self.inp.numel()
        arange = functools.partial(torch.arange, dtype=torch.int32, device=self.ctx.device)
        base = arange(n if self.name != "all_gather" else n * W) % 7
        if self.name == "all_reduce":
            return (base * W + W * (W - 1) // 2).to(self.dtype)
        if self.name == "reduce_scatter":
            m = n // W
            return (base * W + W * (W - 1) // 2)[r * m:(r + 1) * m].to(self.dtype)
        if self.name == "all_gather":
            return torch.cat([(arange(n) % 7 + p) for p in range(W)]).to(self.dtype)
        if self.name == "all_to_all":
            m = n // W
            return torch.cat([(arange(n) % 7 + p)[r * m:(r + 1) * m] for p in range(W)]).to(self.dtype)
        return (arange(n) % 7).to(self.dtype)  # broadcast from rank 0

    def check(self, config=None) -> bool:
        if self.name == "broadcast":
            self.out.copy_((torch.arange(self.out.numel(), device=self.out.device) % 7 + self.ctx.rank)
                           .to(self.dtype))
        self.call(config)()
        ok = torch.equal(self.out, self.expected())
        return self.ctx.comm.allreduce(int(not ok)) == 0


class Timer:
    """Seconds per call, the slowest rank's, every rank calling back to back."""

    def __init__(self, ctx, args):
        self.ctx, self.args = ctx, args
        self.cuda = ctx.device.type == "cuda"

    def _once(self, fn, iters: int) -> float:
        self.ctx.barrier()
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3 / iters
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            seconds = (time.perf_counter() - t0) / iters
        from mpi4py import MPI

        return self.ctx.comm.allreduce(seconds, op=MPI.MAX)

    def __call__(self, fn, per_call: int = 1) -> float:
        """``fn`` runs ``per_call`` calls (a graph replay); returns seconds per call."""
        fn()
        if self.args.quick:
            return self._once(fn, 1) / per_call
        iters = self.args.iters
        if not iters:
            once = self._once(fn, 2)
            iters = int(min(max(self.args.time_per_point / max(once, 1e-7), 5), 500))
            iters = self.ctx.comm.allreduce(iters, op=_max())
        return self._once(fn, iters) / per_call

    def graphed(self, fn, per_call: int) -> float | None:
        """Seconds per call of ``fn`` captured ``per_call`` times in one CUDA graph (None off the GPU)."""
        if not self.cuda or per_call < 1:
            return None
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(per_call):
                fn()
        return self(graph.replay, per_call)


def _max():
    from mpi4py import MPI

    return MPI.MAX


# --- the peer: NCCL, torch symm_mem, or none -----------------------------------------------------------

class Peer:
    """NCCL (one rank per GPU) or torch symm_mem (several ranks on one GPU), or why not."""

    def __init__(self, ctx, enabled: bool):
        self.ctx, self.kind, self.reason = ctx, None, None
        if not enabled:
            self.reason = "disabled with --no-peer"
        elif ctx.device.type != "cuda":
            self.reason = "no NCCL on the cpu backend: peer columns skipped"
        else:
            try:
                self._init()
            except Exception as exc:  # report and go on without the column
                self.reason = f"peer unavailable: {type(exc).__name__}: {exc}"
            reasons = [r for r in ctx.comm.allgather(self.reason) if r]
            if reasons:
                self.reason, self.kind = reasons[0], None

    def _init(self):
        import torch.distributed as dist

        self.dist = dist
        one_per_gpu = self.ctx.ranks_on_device == 1
        port = None
        if self.ctx.rank == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        port = self.ctx.comm.bcast(port, root=0)
        torch.cuda.set_device(self.ctx.device)
        dist.init_process_group("nccl" if one_per_gpu else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=self.ctx.rank, world_size=self.ctx.world_size,
                                device_id=self.ctx.device if one_per_gpu else None)
        if one_per_gpu:
            self.kind = "nccl"
        else:
            import torch.distributed._symmetric_memory as symm_mem

            self.symm_mem, self.kind = symm_mem, "symm_mem"
            self.group = dist.group.WORLD.group_name
            enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
            if enable is not None:
                try:
                    enable(self.group)
                except Exception:  # newer torch: nothing to enable
                    pass

    def calls(self, case: Case) -> dict:
        """name -> a call of the peer on ``case``'s tensors (empty when it has no such collective)."""
        if self.kind == "nccl":
            d = self.dist
            fns = {"all_reduce": lambda: d.all_reduce(case.out.copy_(case.inp)),
                   "reduce_scatter": lambda: d.reduce_scatter_tensor(case.out, case.inp),
                   "all_gather": lambda: d.all_gather_into_tensor(case.out, case.inp),
                   "all_to_all": lambda: d.all_to_all_single(case.out, case.inp),
                   "broadcast": lambda: d.broadcast(case.out, 0)}
            if case.name == "all_reduce":  # in place on its own buffer: no copy in the timing
                buf = case.inp.clone()
                fns["all_reduce"] = lambda: d.all_reduce(buf)
            return {"nccl": fns[case.name]}
        if self.kind == "symm_mem" and case.name == "all_reduce":
            buf = self.symm_mem.empty(case.inp.numel(), dtype=case.dtype, device=case.inp.device)
            self.symm_mem.rendezvous(buf, self.group)
            buf.copy_(case.inp)
            out = torch.empty_like(buf)
            ops = torch.ops.symm_mem
            return {"symm_mem_one_shot": lambda: ops.one_shot_all_reduce_out(buf, "sum", self.group, out),
                    "symm_mem_two_shot": lambda: ops.two_shot_all_reduce_(buf, "sum", self.group)}
        return {}


def peer_copy_seconds(ctx, timer, nbytes: int) -> float:
    """Seconds to read ``nbytes`` from the next rank's heap into this rank's (a Triton copy)."""
    n = max(1, nbytes // 4)
    src, dst = ctx.zeros(n, dtype=torch.float32), ctx.zeros(n, dtype=torch.float32)
    block = 1024 if ctx.device.type == "cpu" else 4096
    tiles = -(-n // block)
    grid = min(tiles, 132 * 4) if ctx.device.type == "cuda" else min(tiles, 4)
    context = ctx.get_device_context()
    seconds = timer(lambda: peer_copy_kernel[(grid,)](context, src, dst, n, ctx.rank, ctx.world_size, block,
                                                      num_warps=8))
    ctx.barrier()
    ctx.free(dst)
    ctx.free(src)
    return seconds


# --- the run --------------------------------------------------------------------------------------------

def candidates(backend: str, name: str):
    """Configs --write-table tries for ``name``."""
    seen = []
    for variant, block, width, warps in CANDIDATES.get(backend, CANDIDATES["cuda"]):
        if name != "all_reduce":
            variant = "pull"
        cfg = ccl.Config(variant=variant, block=block, width=width, num_warps=warps)
        if cfg not in seen:
            seen.append(cfg)
    return seen


def config_text(cfg) -> str:
    return f"{cfg.variant}/{cfg.block}x{cfg.num_warps}w"


def run(args, on_size=None) -> dict:
    """Times every size; ``on_size(result)`` (rank 0) gets the result so far after each size, so
    a run cut short by a time limit still leaves its measured sizes behind."""
    ctx = iris.runtime.iris(heap_size=max(1 << 26, 8 * max(args.sizes) + (1 << 26)))
    backend, W = ctx.device.type, ctx.world_size
    timer, peer = Timer(ctx, args), Peer(ctx, not args.no_peer)
    dtype = DTYPES[args.dtype]
    points = []
    notes = ["ccl's tensors are plain torch tensors, not on the symmetric heap: the in-kernel staging is in its "
             "times"]
    if args.heap:
        notes.append("ccl_heap: the same calls on tensors allocated on the heap (no staging)")
    if peer.reason:
        notes.append(peer.reason)
    result = {"world_size": W, "ranks_per_gpu": ctx.ranks_on_device, "backend": backend, "dtype": args.dtype,
              "points": points, "notes": notes,
              "device": torch.cuda.get_device_name(ctx.device) if backend != "cpu" else "cpu (interpreter)",
              "peer": peer.kind, "date": datetime.date.today().isoformat(), "sizes_done": []}
    for size in args.sizes:
        copy_s = peer_copy_seconds(ctx, timer, size)
        for name in args.collectives:
            case = Case(ctx, name, size, dtype)
            chosen = ccl.choose(name, case.message, str(dtype).removeprefix("torch."), W, backend,
                                ranks_per_gpu=ctx.ranks_on_device)
            point = {"collective": name, "bytes": case.nbytes, "message_bytes": case.message,
                     "dtype": args.dtype, "times_us": {}, "graph_us": {}, "correct": {},
                     "chosen": config_text(chosen), "p2p_copy_gbps": case.nbytes / copy_s / 1e9}
            configs = [("ccl", None)]
            if args.write_table:
                configs += [(config_text(c), c) for c in candidates(backend, name)]
            for label, cfg in configs:
                if args.verbose and ctx.rank == 0:
                    print(f"  {name} {human(case.nbytes)} {label}", flush=True)
                point["correct"][label] = case.check(cfg)
                fn = case.call(cfg)
                point["times_us"][label] = timer(fn) * 1e6
                graphed = timer.graphed(fn, args.graph)
                if graphed is not None:
                    point["graph_us"][label] = graphed * 1e6
                if cfg is not None:
                    # each candidate has workspaces of its own (staging as large as the message):
                    # free them before the next, or --write-table at 1 GiB exhausts the heap
                    del fn
                    ctx.barrier()
                    ccl.clear_workspaces(ctx)
            if args.heap:
                on_heap = Case(ctx, name, size, dtype, heap=True)
                point["correct"]["ccl_heap"] = on_heap.check()
                fn = on_heap.call()
                point["times_us"]["ccl_heap"] = timer(fn) * 1e6
                graphed = timer.graphed(fn, args.graph)
                if graphed is not None:
                    point["graph_us"]["ccl_heap"] = graphed * 1e6
                del fn
                ctx.barrier()
                on_heap.free()
            peer_calls = peer.calls(case)
            if peer_calls and args.peer_max_bytes is not None and case.nbytes > args.peer_max_bytes:
                peer_calls = {}
                skipped = f"{peer.kind} not timed above {human(args.peer_max_bytes)} (--peer-max-bytes)"
                if skipped not in notes:
                    notes.append(skipped)
            for label, fn in peer_calls.items():
                if args.verbose and ctx.rank == 0:
                    print(f"  {name} {human(case.nbytes)} {label}", flush=True)
                point["times_us"][label] = timer(fn) * 1e6
                point["correct"][label] = True  # the peer's results are its own business
                try:
                    graphed = timer.graphed(fn, args.graph)
                except Exception as exc:  # e.g. a peer that cannot be captured
                    graphed = None
                    notes.append(f"{label} in a CUDA graph failed: {type(exc).__name__}: {exc}")
                if graphed is not None:
                    point["graph_us"][label] = graphed * 1e6
            points.append(point)
            if ctx.rank == 0:
                print(f"{name:>14} {human(case.nbytes):>9} ccl {point['times_us']['ccl']:10.1f} us", flush=True)
            del case
            ctx.barrier()
            ccl.clear_workspaces(ctx)  # the heap holds one size at a time
        result["sizes_done"].append(size)
        if on_size is not None and ctx.rank == 0:
            on_size(result)
    ctx.close()
    return result


def best_rows(result: dict) -> list[dict]:
    """Table rows for this backend, world size and ranks per GPU: per collective, runs of sizes
    with the same fastest correct candidate become one row up to the run's largest message (the
    last row: any size). Each row says where it was measured (``measured``)."""
    where = f"{result['date']}, {result['device']}, {result['dtype']}"
    rows = []
    for name in dict.fromkeys(p["collective"] for p in result["points"]):
        points = sorted((p for p in result["points"] if p["collective"] == name), key=lambda p: p["message_bytes"])
        runs: list[list] = []
        for p in points:
            tried = {k: v for k, v in p["times_us"].items() if "/" in k and p["correct"].get(k)}
            if not tried:
                continue
            best = min(tried, key=tried.get)
            if runs and runs[-1][0] == best:
                runs[-1][1] = p["message_bytes"]
            else:
                runs.append([best, p["message_bytes"]])
        for i, (label, upto) in enumerate(runs):
            variant, rest = label.split("/")
            block, warps = rest.rstrip("w").split("x")
            width = next(c[2] for c in CANDIDATES.get(result["backend"], CANDIDATES["cuda"]) if c[1] == int(block))
            rows.append({"backend": result["backend"], "collective": name,
                         "max_bytes": None if i == len(runs) - 1 else upto, "dtype": "*",
                         "world_size": result["world_size"], "ranks_per_gpu": result["ranks_per_gpu"],
                         "config": {"variant": variant, "block": int(block), "width": width,
                                    "num_warps": int(warps)}, "measured": where})
    return rows


def write_table(path: str, backend: str, rows: list[dict], result: dict) -> None:
    """Rewrite the selection table with the measured ``rows`` in place of the earlier rows of the
    same backend, world size and ranks per GPU; every other row is kept, the rows for any world
    size (the reasoned fallbacks) after all measured ones, since the first matching row wins."""
    def same(r):
        return (r["backend"] == backend and r["world_size"] == result["world_size"]
                and r.get("ranks_per_gpu", 0) == result["ranks_per_gpu"])

    kept = [r for r in _table.TABLE if not same(r)]
    measured = [r for r in kept if r["world_size"] != 0]
    fallback = [r for r in kept if r["world_size"] == 0]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    doc = (f'"""The selection table of the host collectives: which variant and tiling each call gets.\n\n'
           f"Data, not code: a list of rows, the first matching row wins (so specific rows come first). A row\n"
           f"matches a call when its ``backend`` is the context's, ``collective`` is the call's or ``\"*\"``,\n"
           f"the per-rank message (``inp``'s bytes; ``tensor``'s for broadcast) is at most ``max_bytes``\n"
           f"(``None``: any size), ``dtype`` is the call's or ``\"*\"``, ``world_size`` is the call's or 0,\n"
           f"and ``ranks_per_gpu`` (ranks sharing one device, 1: one rank per GPU) is the context's or 0\n"
           f"(absent: 0). Its ``config`` fills the fields of :class:`~iris.collectives.ccl.Config` the caller\n"
           f"left ``None``.\n\n"
           f"Rows with a ``measured`` entry were written by ``benchmarks/ccl.py --write-table`` (one run per\n"
           f"world size and ranks per GPU: it replaces that run's rows and keeps the others; the last was\n"
           f"{result['world_size']} ranks, {result['ranks_per_gpu']} per GPU, {result['device']}, "
           f"on {result['date']}).\n"
           f"The rows for any world size (0) come last: the fallback reasoned from the tile collectives'\n"
           f"measurements, one-shot all-reduce up to 1 MiB and two-shot above, 4096-element tiles up to\n"
           f"1 MiB and 8192 above. Rerun the benchmark to measure another machine.\n"
           f'"""\n\n')
    with open(path, "w") as f:
        f.write(doc + "TABLE = " + pprint.pformat(rows + measured + fallback, width=116, sort_dicts=False) + "\n")


# --- output ---------------------------------------------------------------------------------------------

def table(result: dict) -> str:
    W = result["world_size"]
    lines = [f"{result['dtype']}, {W} ranks, {result['device']}; size = the larger buffer per rank; time in us "
             f"per call (* = wrong result); algbw = size / time, busbw = algbw x the nccl-tests factor, GB/s"]
    for name in dict.fromkeys(p["collective"] for p in result["points"]):
        points = [p for p in result["points"] if p["collective"] == name]
        columns = list(dict.fromkeys(k for p in points for k in p["times_us"]))
        graphs = list(dict.fromkeys(k for p in points for k in p["graph_us"]))
        lines += ["", f"{name} (ccl = the selection table's choice, shown as variant/block x warps)",
                  f"{'size':>9} " + " ".join(f"{c + ' us':>22}" for c in columns)
                  + " ".join(f"{'graph ' + c + ' us':>22}" for c in graphs)
                  + f" {'chosen':>20} {'algbw':>7} {'busbw':>7} {'p2p GB/s':>9}"]
        for p in points:
            t = p["times_us"]
            cells = " ".join(f"{t[c]:>21.1f}{'' if p['correct'].get(c) else '*'}" if c in t else f"{'-':>22}"
                             for c in columns)
            gcells = " ".join(f"{p['graph_us'][c]:>22.1f}" if c in p["graph_us"] else f"{'-':>22}" for c in graphs)
            algbw = p["bytes"] / (t["ccl"] * 1e-6) / 1e9
            lines.append(f"{human(p['bytes']):>9} {cells}{gcells} {p['chosen']:>20} {algbw:>7.3g} "
                         f"{algbw * bus_factor(name, W):>7.3g} {p['p2p_copy_gbps']:>9.3g}")
    for note in result["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def plot(result: dict, path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot"
    names = list(dict.fromkeys(p["collective"] for p in result["points"]))
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 4.2), squeeze=False)
    for ax, name in zip(axes[0], names):
        points = [p for p in result["points"] if p["collective"] == name]
        sizes = [p["bytes"] for p in points]
        for key in ("times_us", "graph_us"):
            for label in dict.fromkeys(k for p in points for k in p[key] if "/" not in k):
                style = "--" if label != "ccl" else "-"
                ax.plot(sizes, [p[key].get(label) for p in points], style, marker="o",
                        label=label + (" (graph)" if key == "graph_us" else ""))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes (larger buffer per rank)")
        ax.set_ylabel("us per call")
        ax.set_title(f"{name}, {result['world_size']} ranks")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def save(args, result: dict, final: bool) -> None:
    """Writes the table (with --write-table), the JSON, the Markdown and the plot of ``result``;
    after each size too (``final`` False), so a run cut short keeps what it measured."""
    if args.write_table:
        rows = best_rows(result)
        write_table(args.table_out, result["backend"], rows, result)
        result["table_rows"] = rows
    os.makedirs(args.out, exist_ok=True)
    W, shared = result["world_size"], result.get("ranks_per_gpu", 1)
    gpus = f"_{W // shared}gpu" if result["backend"] == "cuda" and shared > 1 else ""  # as fused_ops.py names them
    stem = os.path.join(args.out, f"ccl_{W}ranks{gpus}{'_quick' if args.quick else ''}")
    notes = list(result["notes"])
    if not final and args.sizes:
        notes.append(f"partial: sizes {', '.join(human(s) for s in result['sizes_done'])} of "
                     f"{', '.join(human(s) for s in args.sizes)} done")
    why_no_plot = plot(result, stem + ".png")
    if why_no_plot:
        notes.append(why_no_plot)
    with open(stem + ".json", "w") as f:
        json.dump(dict(result, notes=notes), f, indent=1)
    text = table(dict(result, notes=notes))
    with open(stem + ".md", "w") as f:
        f.write(f"Host collectives, {result['world_size']} ranks on {result['device']} (`benchmarks/ccl.py`):\n\n"
                f"```text\n{text}\n```\n")
    if final:
        print(text)
    print(f"wrote {stem}.json{' and ' + args.table_out if args.write_table else ''}"
          f"{'' if final else ' (partial)'}", flush=True)


def merge(paths: list[str]) -> dict:
    """One result from several runs' JSON files of the same world size, ranks per GPU and dtype
    (e.g. a run cut short and a rerun of its missing sizes): a later file's point for a collective
    and size replaces an earlier one; the notes of all are kept, the partial-run notes dropped."""
    runs = []
    for path in paths:
        with open(path) as f:
            runs.append(json.load(f))
    keys = {(r["world_size"], r.get("ranks_per_gpu", 0), r["backend"], r["dtype"]) for r in runs}
    if len(keys) != 1:
        raise SystemExit(f"ccl.py --merge: the files differ in (world size, ranks per GPU, backend, dtype): "
                         f"{sorted(keys)}; merge only runs of one configuration")
    points: dict = {}
    for r in runs:
        for p in r["points"]:
            points[(p["collective"], p["bytes"])] = p
    order = list(dict.fromkeys(p["collective"] for r in runs for p in r["points"]))
    merged = dict(runs[-1], points=sorted(points.values(), key=lambda p: (p["bytes"], order.index(p["collective"]))),
                  sizes_done=sorted({b for _, b in points}))
    merged["notes"] = list(dict.fromkeys(n for r in runs for n in r["notes"] if not n.startswith("partial: ")))
    merged["peer"] = next((r["peer"] for r in runs if r["peer"]), None)
    merged["merged_from"] = [os.path.basename(p) for p in paths]
    return merged


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.merge:
        save(args, merge(args.merge), final=True)
        return
    if hasattr(signal, "SIGUSR1"):  # tools/gpu-bench.sh sends it at its time limit: show where each rank is
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        result = run(args, on_size=lambda partial: save(args, partial, final=False))
    except BaseException:
        # Under mpirun the job's abort can outrun the rank's stderr: say what failed on stdout first
        # (a 1 GiB --write-table run on the H200 ended with MPI_ABORT and no message).
        import traceback

        print(f"ccl.py failed on this rank:\n{traceback.format_exc()}", flush=True)
        raise
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() == 0:
        save(args, result, final=True)


if __name__ == "__main__":
    main()
