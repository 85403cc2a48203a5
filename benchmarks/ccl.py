"""Host collectives: how fast is ``iris.collectives.ccl`` here, next to what a user would call instead?

    mpirun -n 2 python3 -m mpi4py benchmarks/ccl.py                          # one rank per GPU
    mpirun --allow-run-as-root --oversubscribe -n 4 python3 -m mpi4py benchmarks/ccl.py   # 4 ranks on one GPU (MPS)
    mpirun -n 2 python3 -m mpi4py benchmarks/ccl.py --write-table            # tune, rewrite ccl/tables/<card>.json
    mpirun -n 2 python3 -m mpi4py benchmarks/ccl.py --quick                  # cpu backend, tiny sizes
    mpirun -n 2 python3 -m mpi4py benchmarks/ccl.py --host [--calls 20000]   # microseconds of Python per call
    mpirun -n 8 python3 -m mpi4py benchmarks/ccl.py --group-size 2           # groups of 2 vs contexts of 2

For each dtype (``--dtypes``), size (``--sizes``: the larger buffer per rank, as in nccl-tests) and
collective, in microseconds per call of the slowest rank (every rank calls back to back; the median
of three timed loops): ``ccl`` on
plain tensors (staged inside the kernel) and on heap tensors, eager and in a CUDA graph of
``--graph`` calls, and on plain tensors registered with ``ctx.register`` (read in place, over CUDA
IPC; on the cpu backend, registered heap tensors; eager in the table); the peer (NCCL one rank per
GPU; torch's symmetric-memory one-shot and two-shot all-reduce where ranks share a GPU: a gloo group
and ``TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1``); the floor (every rank copying ``size`` bytes at
once; reduce-scatter ``size + size / W``); the ratios ``ccl / torch``, ``ccl / floor``,
``plain / heap`` and ``registered / heap``. Every call is checked once before it is timed.
``--write-table`` times every candidate (``CANDIDATES``) too and rewrites the selection table of
the card it runs on, ``ccl/tables/<card>.json`` (``--table-out``: another JSON file), with the
fastest per size class, for this backend, world size and ranks per GPU. Writes
``results/ccl_<W>ranks[_<G>gpu][_quick].{json,md,png}`` after every size (a run cut short keeps
what it measured). docs/ccl.md says how to read them.

``--group-size G``: the collectives on the world split into groups of G consecutive ranks
(``ctx.new_group``) next to the same calls on contexts of those G ranks alone (a second context
over the split communicator), in one job, every group at once; the ratio group / context (eager
and in a CUDA graph) and the floor; 1 MiB and 256 MiB by default;
``results/ccl_groups_<W>ranks_g<G>[_quick].*``.

``--host``: the host's microseconds per call, 4 KiB fp32, plain and heap tensors: ``dispatch`` (the
launch replaced by a no-op: what iris adds; any backend) and, on the GPU, ``enqueue`` (``--calls``
real calls in a row), next to an empty Triton kernel (Triton's launcher, the plans' direct launch)
and the peer's call; the slowest rank's median of ``--rounds``; ``results/ccl_host_<W>ranks[_cpu].*``.

Every results file says whether the call agreement was on (``check_calls``: ``IRIS_CHECK_CALLS``,
read at import); ``benchmarks/call_check.py`` runs this script with it on and off and compares.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import signal
import statistics
import sys
import time

import torch
import triton
from common import NO_PLOT, KiB, MiB, Timer, TorchPeer, host_us, human, log_axes, parse_size, pyplot

import iris.runtime  # first: picks the backend (and the interpreter on CPUs) before any kernel
from iris.collectives import ccl
from iris.collectives.ccl import _launch, _table
from iris.device import _calls

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DEFAULT_SIZES = [4 * KiB, 64 * KiB, MiB, 16 * MiB, 256 * MiB]
QUICK_SIZES = [4 * KiB]
GROUP_SIZES = [MiB, 256 * MiB]
#: Sizes at and above which the floor and the goal ratios are shown (below, launches decide).
FLOOR_FROM = 16 * MiB

#: What --write-table tries, per backend and collective family: (variant, block, width, warps[, chunk]).
#: A chunk (elements per round, for tensors off the heap) keeps the staging buffers in L2.
CANDIDATES = {
    "cuda": {
        "all_reduce": [("one_shot", 1024, 1024, 4), ("one_shot", 4096, 1024, 4), ("one_shot", 16384, 1024, 8),
                       ("one_shot_buffered", 1024, 1024, 4), ("one_shot_buffered", 4096, 1024, 4),
                       ("two_shot", 4096, 1024, 4), ("two_shot", 16384, 1024, 8), ("two_shot", 32768, 1024, 16),
                       ("two_shot", 32768, 1024, 16, 1 << 20), ("two_shot", 32768, 1024, 16, 1 << 21),
                       ("two_shot", 32768, 1024, 16, 1 << 22)],
        "pull": [("pull", 1024, 1024, 4), ("pull", 4096, 1024, 4), ("pull", 16384, 1024, 8),
                 ("pull_buffered", 1024, 1024, 4), ("pull_buffered", 4096, 1024, 4),
                 ("pull", 32768, 1024, 16), ("pull", 32768, 1024, 16, 1 << 20), ("pull", 32768, 1024, 16, 1 << 21)],
    },
    "cpu": {"all_reduce": [("one_shot", 1024, 64, 4), ("one_shot_buffered", 1024, 64, 4),
                           ("two_shot", 1024, 64, 4, 2048)],
            "pull": [("pull", 1024, 64, 4), ("pull_buffered", 1024, 64, 4)]},
}


#: What --write-table tries for all_reduce on heap tensors (``Config.heap_chunk``: rounds of a call
#: read in place; None: one pass), with the size's fastest candidate on plain tensors, at and
#: above FLOOR_FROM on the GPU (at every size on the cpu backend and with --quick, where it only shows
#: the path works).
HEAP_CHUNKS = {"cuda": (None, 1 << 21, 1 << 22, 1 << 23), "cpu": (None, 1024)}




def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=lambda s: [parse_size(x) for x in s.split(",")], default=None,
                   help="bytes of the larger buffer per rank, e.g. 4K,1M,256M (default 4 KiB .. 256 MiB)")
    p.add_argument("--collectives", type=lambda s: s.split(","), default=list(COLLECTIVES), help=",".join(COLLECTIVES))
    p.add_argument("--dtypes", type=lambda s: s.split(","), default=["bf16", "fp32"], help=",".join(DTYPES))
    p.add_argument("--quick", action="store_true", help="tiny sizes, one timed call (runs on the CPU backend)")
    p.add_argument("--time-per-point", type=float, default=0.02, help="seconds of calls per measurement")
    p.add_argument("--graph", type=int, default=20, metavar="CALLS", help="calls per CUDA graph (0: no graphs)")
    p.add_argument("--write-table", action="store_true", help="time every candidate and rewrite ccl/tables/<card>.json")
    p.add_argument("--table-out", default=None, metavar="JSON",
                   help="where --write-table writes the table (default: the card's file in ccl/tables/)")
    p.add_argument("--verbose", action="store_true", help="print each config before it is timed (where a run stops)")
    p.add_argument("--peer-max-bytes", type=parse_size, default=None, metavar="SIZE",
                   help="time the peer only up to this size (default: every size, but 1M with 8 or more ranks on "
                        "one GPU, where torch's symm_mem two-shot stalled at 16 MiB on an H200 and never returned)")
    p.add_argument("--no-peer", action="store_true", help="skip NCCL / torch symm_mem")
    p.add_argument("--no-heap", action="store_true", help="skip the calls on heap tensors")
    p.add_argument("--heap-size", type=parse_size, default=None, metavar="SIZE",
                   help="bytes of heap per rank (default 8x the largest size + 64 MiB); with 8 ranks on one GPU a "
                        "256 MiB all-reduce of heap tensors was 2.5x slower than of registered ones: whether the "
                        "heap's size is why")
    p.add_argument("--group-size", type=int, default=0, metavar="G",
                   help="the collectives on groups of G ranks next to contexts of G ranks (ratio group/context)")
    p.add_argument("--host", action="store_true", help="the host's microseconds per call instead (see above)")
    p.add_argument("--calls", type=int, default=5000, help="with --host: calls per measurement")
    p.add_argument("--rounds", type=int, default=5, help="with --host: measurements, the median counts")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)
    if args.sizes is None:
        args.sizes = QUICK_SIZES if args.quick else GROUP_SIZES if args.group_size else DEFAULT_SIZES
    unknown = [d for d in args.dtypes if d not in DTYPES] + [c for c in args.collectives if c not in COLLECTIVES]
    if unknown:
        p.error(f"unknown dtypes/collectives {unknown}; dtypes: {tuple(DTYPES)}, collectives: {COLLECTIVES}")
    return args


def floor_bytes(name: str, nbytes: int, W: int) -> int:
    """Bytes each rank must read plus write (see the module doc), as a multiple of a copy's 2 x size."""
    return nbytes + nbytes // W if name == "reduce_scatter" else 2 * nbytes


# --- buffers and calls ---------------------------------------------------------------------------------

class Case:
    """The tensors of one collective at one size, and the ccl call on them (checked once)."""

    def __init__(self, ctx, name: str, size: int, dtype, heap: bool = False, registered: bool = False,
                 group=None):
        # on a group (ctx.new_group), the call's ranks are the group's
        W, r = (group.size, group.rank) if group is not None else (ctx.world_size, ctx.rank)
        dev = ctx.device
        self.W, self.r, self.group = W, r, group
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
        self.registrations = []
        if registered:  # plain tensors that the peers reach in place (ctx.register; the heap's on the cpu backend)
            if dev.type != "cuda":
                self.heap = [ctx.zeros(t.shape, dtype=dtype).copy_(t) for t in dict.fromkeys((self.inp, self.out))]
                self.inp, self.out = self.heap[0], self.heap[-1]
            self.registrations = [ctx.register(t) for t in dict.fromkeys((self.inp, self.out))]
        self.message = self.inp.numel() * esize  # what the selection table is keyed by
        self.ctx = ctx

    def free(self) -> None:
        """Unregister, and give the heap tensors back (the heap holds one size at a time). Collective."""
        for registration in self.registrations:
            registration.close()
        self.registrations = []
        for t in reversed(self.heap):
            self.ctx.free(t)
        self.heap = []

    def call(self, config=None):
        ctx, on = self.ctx, {} if self.group is None else {"group": self.group}
        if self.name == "broadcast":
            return lambda: ccl.broadcast(ctx, self.out, 0, config=config, **on)
        fn = getattr(ccl, self.name)
        return lambda: fn(ctx, self.out, self.inp, config=config, **on)

    def expected(self) -> torch.Tensor:
        """What ``out`` must hold, built on the rank's device."""
        W, r, n = self.W, self.r, self.inp.numel()

        def arange(k):
            return torch.arange(k, dtype=torch.int32, device=self.ctx.device)

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
            self.out.copy_((torch.arange(self.out.numel(), device=self.out.device) % 7 + self.r)
                           .to(self.dtype))
        self.call(config)()
        ok = torch.equal(self.out, self.expected())
        return self.ctx.comm.allreduce(int(not ok)) == 0


# --- the peer: NCCL, torch symm_mem, or none -----------------------------------------------------------

class Peer(TorchPeer):
    """NCCL (one rank per GPU) or torch symm_mem (several ranks on one GPU), or why not."""

    def calls(self, case: Case) -> dict:
        """label -> a call of the peer on ``case``'s data (empty when it has no such collective)."""
        if self.kind == "nccl":
            d = self.dist
            fns = {"reduce_scatter": lambda: d.reduce_scatter_tensor(case.out, case.inp),
                   "all_gather": lambda: d.all_gather_into_tensor(case.out, case.inp),
                   "all_to_all": lambda: d.all_to_all_single(case.out, case.inp),
                   "broadcast": lambda: d.broadcast(case.out, 0)}
            if case.name == "all_reduce":  # in place on its own buffer: no copy in the timing
                buf = case.inp.clone()
                fns["all_reduce"] = lambda: d.all_reduce(buf)
            return {"nccl": fns[case.name]}
        if self.kind == "torch symm_mem" and case.name == "all_reduce":
            buf = self.symm_mem.empty(case.inp.numel(), dtype=case.dtype, device=case.inp.device)
            self.symm_mem.rendezvous(buf, self.group)
            buf.copy_(case.inp)
            out = torch.empty_like(buf)
            ops = torch.ops.symm_mem
            return {"torch one_shot": lambda: ops.one_shot_all_reduce_out(buf, "sum", self.group, out),
                    "torch two_shot": lambda: ops.two_shot_all_reduce_(buf, "sum", self.group)}
        return {}


def copy_seconds(ctx, timer, nbytes: int) -> float:
    """Seconds for every rank to copy ``nbytes`` at once (``dst.copy_(src)``): the floor."""
    src = torch.ones(max(1, nbytes // 4), device=ctx.device)
    dst = torch.empty_like(src)
    return timer(lambda: dst.copy_(src))


# --- the run --------------------------------------------------------------------------------------------

def candidates(backend: str, name: str) -> list:
    """Configs --write-table tries for ``name``."""
    family = "all_reduce" if name == "all_reduce" else "pull"
    return [ccl.Config(variant=c[0], block=c[1], width=c[2], num_warps=c[3], chunk=c[4] if len(c) > 4 else None)
            for c in CANDIDATES.get(backend, CANDIDATES["cuda"])[family]]


def config_text(cfg) -> str:
    """``variant/blockxwidth/warps w[/chunk]``, e.g. ``two_shot/32768x1024/16w/2097152``."""
    return f"{cfg.variant}/{cfg.block}x{cfg.width}/{cfg.num_warps}w" + (f"/{cfg.chunk}" if cfg.chunk else "")


def parse_config_text(text: str) -> dict:
    """The ``Config`` fields of :func:`config_text`'s ``text``."""
    variant, tiling, warps, *chunk = text.split("/")
    block, width = tiling.split("x")
    fields = {"variant": variant, "block": int(block), "width": int(width), "num_warps": int(warps.rstrip("w"))}
    if chunk:
        fields["chunk"] = int(chunk[0])
    return fields


def fastest_candidate(point: dict) -> str | None:
    """The label of ``point``'s fastest correct candidate (in graphs where timed), or None."""
    times = point["graph_us"] or point["eager_us"]
    tried = {k: v for k, v in times.items() if "/" in k and point["correct"].get(k)}
    return min(tried, key=tried.get) if tried else None


#: How much faster rounds must be than one pass over heap tensors to be chosen: not for noise.
HEAP_ROUNDS_MARGIN = 0.97


def heap_rounds_of(point: dict) -> int:
    """The ``heap_chunk`` that ``point`` measured fastest on heap tensors (0: one pass), rounds
    only where they beat one pass by ``HEAP_ROUNDS_MARGIN``."""
    times = point.get("heap_rounds_us") or {}
    if "0" not in times:
        return 0
    best = min(times, key=times.get)
    return int(best) if times[best] < HEAP_ROUNDS_MARGIN * times["0"] else 0


def time_heap_rounds(ctx, timer, args, point: dict, on_heap, backend: str) -> None:
    """Times ``point``'s fastest candidate on heap tensors with each ``HEAP_CHUNKS`` value into
    ``point["heap_rounds_us"]`` (key: the rounds' elements, 0 for one pass; in a graph where timed)."""
    best = fastest_candidate(point)
    if best is None:
        return
    rounds = point["heap_rounds_us"] = {}
    elements = on_heap.inp.numel()
    for heap_chunk in HEAP_CHUNKS[backend]:
        if heap_chunk is not None and heap_chunk >= elements:
            continue  # one pass, timed as None
        cfg = ccl.Config(**parse_config_text(best), heap_chunk=heap_chunk)
        if not on_heap.check(cfg):
            continue
        fn = on_heap.call(cfg)
        graphed = timer.graphed(fn, args.graph)
        rounds[str(heap_chunk or 0)] = (graphed if graphed is not None else timer(fn)) * 1e6
        ctx.barrier()
        ccl.clear_workspaces(ctx)


def time_calls(timer, args, point: dict, label: str, fn) -> None:
    """Eager and graph time of ``fn`` into ``point`` under ``label``."""
    if args.verbose and timer.ctx.rank == 0:
        print(f"  {point['collective']} {point['dtype']} {human(point['bytes'])} {label}", flush=True)
    point["eager_us"][label] = timer(fn) * 1e6
    graphed = timer.graphed(fn, args.graph)
    if graphed is not None:
        point["graph_us"][label] = graphed * 1e6


def run(args, on_size=None) -> dict:
    """Times every size; ``on_size(result)`` (rank 0) gets the result so far after each size."""
    ctx = iris.runtime.iris(heap_size=args.heap_size or max(1 << 26, 8 * max(args.sizes) + (1 << 26)))
    backend, W = ctx.device.type, ctx.world_size
    timer, peer = Timer(ctx, args.time_per_point, args.quick), Peer(ctx, not args.no_peer)
    peer_max_bytes = args.peer_max_bytes
    if peer_max_bytes is None and ctx.ranks_on_device >= 8:
        peer_max_bytes = 1 << 20  # torch's two-shot waits forever from 16 MiB there: the run would end in its stall
    points, notes = [], []
    if peer.reason:
        notes.append(peer.reason)
    if backend != "cuda":
        notes.append("cpu backend (Triton's interpreter): times show the code path works, not performance")
    if args.write_table:
        notes.append("ccl: the configuration that the table written by this run chooses, timed as a candidate here")
    result = {"world_size": W, "ranks_per_gpu": ctx.ranks_on_device, "backend": backend, "dtypes": args.dtypes,
              "device": torch.cuda.get_device_name(ctx.device) if backend == "cuda" else "cpu (interpreter)",
              "capability": ("sm_{}{}".format(*torch.cuda.get_device_capability(ctx.device))
                             if backend == "cuda" else None),
              "peer": peer.kind, "graph_calls": args.graph, "heap_size": ctx.heap_size,
              "check_calls": bool(_calls.CHECK_CALLS.value),
              "date": datetime.date.today().isoformat(),
              "command": " ".join(["benchmarks/ccl.py", *sys.argv[1:]]), "points": points, "notes": notes,
              "sizes_done": []}
    for size in args.sizes:
        copy_us = copy_seconds(ctx, timer, size) * 1e6
        for dname in args.dtypes:
            dtype = DTYPES[dname]
            for name in args.collectives:
                case = Case(ctx, name, size, dtype)
                chosen = ccl.choose(name, case.message, str(dtype).removeprefix("torch."), W, backend,
                                    ranks_per_gpu=ctx.ranks_on_device)
                point = {"collective": name, "date": result["date"], "bytes": case.nbytes,
                         "message_bytes": case.message, "dtype": dname,
                         "eager_us": {}, "graph_us": {}, "correct": {}, "chosen": config_text(chosen),
                         "floor_us": copy_us * floor_bytes(name, case.nbytes, W) / (2 * case.nbytes)}
                configs = [("ccl", None)]
                if args.write_table:
                    configs += [(config_text(c), c) for c in candidates(backend, name)]
                for label, cfg in configs:
                    point["correct"][label] = case.check(cfg)
                    time_calls(timer, args, point, label, case.call(cfg))
                    if cfg is not None:
                        # each candidate has workspaces of its own (staging as large as the message)
                        ctx.barrier()
                        ccl.clear_workspaces(ctx)
                if not args.no_heap:
                    on_heap = Case(ctx, name, size, dtype, heap=True)
                    point["correct"]["heap"] = on_heap.check()
                    time_calls(timer, args, point, "heap", on_heap.call())
                    if args.write_table and name == "all_reduce" and (backend != "cuda" or args.quick
                                                                       or case.nbytes >= FLOOR_FROM):
                        time_heap_rounds(ctx, timer, args, point, on_heap, backend)
                    ctx.barrier()
                    on_heap.free()
                    try:  # every rank raises together (ctx.register exchanges its errors): keep the rest
                        registered = Case(ctx, name, size, dtype, registered=True)
                    except iris.runtime.IrisError as exc:
                        notes.append(f"registered at {human(case.nbytes)} {dname}: {exc}")
                    else:
                        point["correct"]["registered"] = registered.check()
                        time_calls(timer, args, point, "registered", registered.call())
                        ctx.barrier()
                        registered.free()
                peer_calls = peer.calls(case)
                if peer_calls and peer_max_bytes is not None and case.nbytes > peer_max_bytes:
                    peer_calls = {}
                    skipped = f"{peer.kind} not timed above {human(peer_max_bytes)} (--peer-max-bytes)"
                    if skipped not in notes:
                        notes.append(skipped)
                for label, fn in peer_calls.items():
                    try:
                        time_calls(timer, args, point, label, fn)
                    except Exception as exc:  # e.g. a peer that cannot be captured: keep its eager time
                        notes.append(f"{label} at {human(case.nbytes)} {dname}: {type(exc).__name__}: {exc}")
                points.append(point)
                if ctx.rank == 0:
                    print(f"{name:>14} {dname} {human(case.nbytes):>9} ccl {point['eager_us']['ccl']:10.1f} us "
                          f"(graph {point['graph_us'].get('ccl', float('nan')):.1f})", flush=True)
                del case
                ctx.barrier()
                ccl.clear_workspaces(ctx)  # the heap holds one size at a time
        result["sizes_done"].append(size)
        if on_size is not None and ctx.rank == 0:
            on_size(result)
    ctx.close()
    return result


# --- groups: a call on a group of G ranks next to the same call on a context of G ranks -------------------

def run_groups(args) -> dict:
    """``--group-size G``: the world as W / G groups of G consecutive ranks (``ctx.new_group``) and,
    in the same job, a second context of each G ranks alone (``iris.runtime.iris(comm=...)`` on the
    split communicator): every collective at every size on both, every group calling at once in
    both cases, so the ratio group / context is what a group adds. The floor is the copy floor of
    the group's message, as in the plain run."""
    from mpi4py import MPI

    started = time.monotonic()
    G = args.group_size
    heap = args.heap_size or max(1 << 26, 8 * max(args.sizes) + (1 << 26))
    W = MPI.COMM_WORLD.Get_size()
    if G < 2 or W % G:
        raise SystemExit(f"benchmarks/ccl.py --group-size {G}: a group size of at least 2 that divides the "
                         f"world of {W} ranks (e.g. --group-size 2 with 4 or 8 ranks)")
    # Each group's workspaces: what a context of G ranks may use of its heap for the same calls (a
    # staging buffer per operand of the largest size, and flags), out of the world context's heap,
    # which every rank reserves for every group; the tensors themselves are the same on both sides.
    workspace = 2 * max(args.sizes) + (1 << 24)
    ctx = iris.runtime.iris(heap_size=heap + (W // G) * workspace)
    backend = ctx.device.type
    index = ctx.rank // G
    groups = [ctx.new_group(list(range(g * G, (g + 1) * G)), workspace_size=workspace) for g in range(W // G)]
    group = groups[index]
    alone = iris.runtime.iris(heap_size=heap, comm=MPI.COMM_WORLD.Split(index, ctx.rank))
    timer = Timer(ctx, args.time_per_point, args.quick)
    points = []
    if ctx.rank == 0:  # as it goes (the table comes at the end): a run cut by a time limit still tells
        print(f"{W // G} groups of {G} and {W // G} contexts of {G} ready ({time.monotonic() - started:.1f} s)",
              flush=True)
    result = {"world_size": W, "group_size": G, "ranks_per_gpu": ctx.ranks_on_device, "backend": backend,
              "device": torch.cuda.get_device_name(ctx.device) if backend == "cuda" else "cpu (interpreter)",
              "date": datetime.date.today().isoformat(),
              "command": " ".join(["benchmarks/ccl.py", *sys.argv[1:]]), "points": points,
              "notes": [] if backend == "cuda" else
              ["cpu backend (Triton's interpreter): times show the code path works, not performance"]}
    for size in args.sizes:
        copy_us = copy_seconds(ctx, timer, size) * 1e6
        for dname in args.dtypes:
            for name in args.collectives:
                on_group = Case(ctx, name, size, DTYPES[dname], group=group)
                on_alone = Case(alone, name, size, DTYPES[dname])
                point = {"collective": name, "dtype": dname, "bytes": on_group.nbytes,
                         "correct": {"group": on_group.check(), "context": on_alone.check()},
                         "floor_us": copy_us * floor_bytes(name, on_group.nbytes, G) / (2 * on_group.nbytes)}
                point["group_us"] = timer(on_group.call()) * 1e6
                point["context_us"] = timer(on_alone.call()) * 1e6
                point["group_graph_us"] = _us(timer.graphed(on_group.call(), args.graph))
                point["context_graph_us"] = _us(timer.graphed(on_alone.call(), args.graph))
                points.append(point)
                if ctx.rank == 0:
                    graph = _div(point["group_graph_us"], point["context_graph_us"])
                    print(f"  {name} {dname} {human(point['bytes'])}: group {point['group_us']:.1f} us, context "
                          f"{point['context_us']:.1f} us ({point['group_us'] / point['context_us']:.3f}); graph "
                          f"{'-' if graph is None else f'{graph:.3f}'} ({time.monotonic() - started:.1f} s)",
                          flush=True)
                del on_group, on_alone
                ctx.barrier()
                # every call keeps its workspace: the group's arena, sized for one call of the
                # largest size, holds one collective's at a time (HeapExhaustedError otherwise)
                ccl.clear_workspaces(group)
                ccl.clear_workspaces(ctx)
                ccl.clear_workspaces(alone)
    alone.close()
    ctx.close()
    return result


def _us(seconds):
    return None if seconds is None else seconds * 1e6


def groups_table(result: dict) -> str:
    """One row per collective, dtype and size: group and context times (eager, graph), their ratio,
    the floor."""
    G, W = result["group_size"], result["world_size"]
    lines = [f"ccl on {W // G} groups of {G} ranks (ctx.new_group) vs {W // G} contexts of {G} ranks, "
             f"{W} ranks, {result['device']}, {result['date']}",
             f"{'collective':>14} {'dtype':>5} {'size':>9} {'group us':>10} {'context us':>10} {'ratio':>6} "
             f"{'graph grp':>10} {'graph ctx':>10} {'ratio':>6} {'floor us':>9} {'ok':>3}"]
    for p in result["points"]:
        def fmt(v):
            return f"{v:10.1f}" if v is not None else f"{'-':>10}"
        graph_ratio = _div(p["group_graph_us"], p["context_graph_us"])
        lines.append(f"{p['collective']:>14} {p['dtype']:>5} {human(p['bytes']):>9} {p['group_us']:10.1f} "
                     f"{p['context_us']:10.1f} {p['group_us'] / p['context_us']:6.3f} {fmt(p['group_graph_us'])} "
                     f"{fmt(p['context_graph_us'])} {'-' if graph_ratio is None else f'{graph_ratio:.3f}':>6} "
                     f"{p['floor_us']:9.1f} {'yes' if all(p['correct'].values()) else 'NO':>3}")
    lines += [f"note: {n}" for n in result["notes"]]
    return "\n".join(lines)


def groups_plot(result: dict, path: str) -> str | None:
    """Group / context time per size, one line per collective (eager)."""
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    fig, ax = plt.subplots(figsize=(7, 4))
    for name in dict.fromkeys(p["collective"] for p in result["points"]):
        for dname in dict.fromkeys(p["dtype"] for p in result["points"]):
            pts = [p for p in result["points"] if p["collective"] == name and p["dtype"] == dname]
            ax.plot([p["bytes"] for p in pts], [p["group_us"] / p["context_us"] for p in pts], marker="o",
                    label=f"{name} {dname}")
    ax.axhline(1.0, color="k", linestyle="--", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes per rank")
    ax.set_ylabel("group / context time")
    ax.set_title(f"ccl on groups of {result['group_size']}, {result['world_size']} ranks, {result['device']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def save_groups(args, result: dict) -> None:
    """Rank 0 prints the table and writes ``results/ccl_groups_<W>ranks_g<G>[_quick].{json,md,png}``."""
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"ccl_groups_{result['world_size']}ranks_g{result['group_size']}"
                        + ("_quick" if args.quick else ""))
    why_no_plot = groups_plot(result, stem + ".png")
    if why_no_plot:
        result = dict(result, notes=[*result["notes"], why_no_plot])
    text = groups_table(result)
    print(text)
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(f"```text\n{text}\n```\n\n`{result['command']}`\n")
    print(f"wrote {stem}.json, .md and .png", flush=True)


# --- the selection table ----------------------------------------------------------------------------------

def best_rows(result: dict) -> list[dict]:
    """Table rows for this backend, world size and ranks per GPU: per collective and dtype, runs of
    sizes with the same fastest correct candidate become one row up to the run's largest message
    (the last row: any size). fp32's rows serve every dtype without rows of its own (``"*"``);
    bf16's serve fp16 too (the same bytes per element)."""
    rows = []
    for dname in result["dtypes"]:
        dtypes = {"fp32": ["*"], "bf16": ["bfloat16", "float16"], "fp16": ["float16"]}[dname]
        for name in dict.fromkeys(p["collective"] for p in result["points"]):
            points = sorted((p for p in result["points"] if p["collective"] == name and p["dtype"] == dname),
                            key=lambda p: p["message_bytes"])
            runs: list[list] = []
            for p in points:
                best = fastest_candidate(p)
                if best is None:
                    continue
                best = (best, heap_rounds_of(p))  # and the heap tensors' rounds
                date = p.get("date", result["date"])  # points merged from an earlier run keep its date
                if runs and runs[-1][0] == best:
                    runs[-1][1], runs[-1][2] = p["message_bytes"], max(runs[-1][2], date)
                else:
                    runs.append([best, p["message_bytes"], date])
            for i, ((label, heap_chunk), upto, date) in enumerate(runs):
                config = parse_config_text(label)
                if heap_chunk:
                    config["heap_chunk"] = heap_chunk
                for dt in dtypes:
                    rows.append({"backend": result["backend"], "collective": name,
                                 "max_bytes": None if i == len(runs) - 1 else upto, "dtype": dt,
                                 "world_size": result["world_size"], "ranks_per_gpu": result["ranks_per_gpu"],
                                 "config": config, "measured": f"{date}, {result['device']}, {dname}"})
    # specific dtypes before "*": the first matching row wins
    return sorted(rows, key=lambda r: r["dtype"] == "*")


def table_path(args, result: dict) -> str:
    """Where --write-table writes: ``--table-out``, else the file of the card this run measured."""
    return args.table_out or os.path.join(_table.TABLES_DIR, _table.file_name(result["device"]))


def write_table(path: str, rows: list[dict], result: dict) -> None:
    """Rewrite the table file at ``path`` (JSON, see ``ccl/_table.py``; a new file if there is
    none) with the measured ``rows`` in place of its earlier rows of the same backend, world size,
    ranks per GPU, collective and dtype (a run of one dtype keeps the other's rows); every other
    row is kept. Rows of a specific dtype come before the ``"*"`` rows and rows for any world size
    after all measured ones, since the first matching row wins."""
    replaced = {(r["collective"], r["dtype"]) for r in rows}

    def same(r):
        return (r["backend"] == result["backend"] and r["world_size"] == result["world_size"]
                and r.get("ranks_per_gpu", 0) == result["ranks_per_gpu"] and (r["collective"], r["dtype"]) in replaced)

    earlier = _table.read(path) if os.path.exists(path) else {}
    kept = [r for r in earlier.get("rows", []) if not same(r)]
    measured = sorted(rows + [r for r in kept if r["world_size"] != 0], key=lambda r: r["dtype"] == "*")
    fallback = [r for r in kept if r["world_size"] == 0]
    _table.write(path, measured + fallback, device=earlier.get("device", result["device"]),
                 capability=earlier.get("capability", result.get("capability")))


# --- output ---------------------------------------------------------------------------------------------

def _peer(times: dict) -> float | None:
    values = [v for k, v in times.items() if k.startswith(("torch", "nccl"))]
    return min(values) if values else None


def _div(a, b):
    return a / b if a is not None and b else None


def table(result: dict) -> str:
    W, peer = result["world_size"], result["peer"] or "peer"
    lines = [f"{W} ranks, {result['device']} ({result['ranks_per_gpu']} per GPU), {result['date']}; size = the larger "
             f"buffer per rank; us per call, slowest rank (* = wrong result); graph = in a CUDA graph of "
             f"{result['graph_calls']} calls; peer = {peer}; floor = every rank moving its bytes once (a copy)"]
    head = (f"{'size':>9} {'ccl':>8} {'graph':>8} {'heap':>8} {'h.graph':>8} {'reg':>8} {'peer':>8} {'p.graph':>8}"
            f" {'floor':>8} {'ccl/peer':>8} {'graph/pg':>8} {'ccl/flr':>8} {'heap/flr':>8} {'pln/heap':>8}"
            f" {'reg/heap':>8}  chosen")
    for dname in result["dtypes"]:
        for name in dict.fromkeys(p["collective"] for p in result["points"]):
            points = [p for p in result["points"] if p["collective"] == name and p["dtype"] == dname]
            if not points:
                continue
            lines += ["", f"{name}, {dname}" + ("" if name == "all_reduce" or result["peer"] == "nccl" else
                                                 f" ({peer} has no op for it: compare with the floor)"), head]
            for p in points:
                e, g, ok, big = p["eager_us"], p["graph_us"], p["correct"], p["bytes"] >= FLOOR_FROM
                floor = p["floor_us"] if big else None
                times = [(e.get("ccl"), ok.get("ccl")), (g.get("ccl"), True), (e.get("heap"), ok.get("heap", True)),
                         (g.get("heap"), True), (e.get("registered"), ok.get("registered", True)), (_peer(e), True),
                         (_peer(g), True), (floor, True)]
                ratio = [_div(e.get("ccl"), _peer(e)), _div(g.get("ccl"), _peer(g)), _div(e.get("ccl"), floor),
                         _div(e.get("heap"), floor), _div(e.get("ccl"), e.get("heap")) if big else None,
                         _div(e.get("registered"), e.get("heap")) if big else None]
                lines.append(f"{human(p['bytes']):>9} "
                             + "".join(f"{'-':>8}" if v is None else f"{v:>7.1f}{' ' if good else '*'}"
                                       for v, good in times)
                             + "".join(f"{'-':>8}" if v is None else f"{v:>8.2f}" for v in ratio)
                             + f"  {p['chosen']}")
    lines += [f"note: {note}" for note in result["notes"]]
    return "\n".join(lines)


def plot(result: dict, path: str) -> str | None:
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    names = list(dict.fromkeys(p["collective"] for p in result["points"]))
    dnames = result["dtypes"]
    fig, axes = plt.subplots(len(dnames), len(names), figsize=(4.2 * len(names), 3.6 * len(dnames)), squeeze=False)
    for row, dname in enumerate(dnames):
        for ax, name in zip(axes[row], names):
            points = [p for p in result["points"] if p["collective"] == name and p["dtype"] == dname]
            sizes = [p["bytes"] for p in points]
            for key, style in (("eager_us", "-"), ("graph_us", ":")):
                for label in dict.fromkeys(k for p in points for k in p[key] if "/" not in k):
                    ax.plot(sizes, [p[key].get(label) for p in points], style, marker="o", markersize=3,
                            label=label + (" (graph)" if key == "graph_us" else ""))
            ax.plot(sizes, [p["floor_us"] for p in points], "k--", label="floor")
            log_axes(ax, "bytes per rank", f"{name}, {dname}, {result['world_size']} ranks")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def save(args, result: dict, final: bool) -> None:
    """Writes the table (with --write-table), the JSON, the Markdown and the plot of ``result``;
    after each size too (``final`` False), so a run cut short keeps what it measured."""
    os.makedirs(args.out, exist_ok=True)
    W, shared = result["world_size"], result.get("ranks_per_gpu", 1)
    gpus = f"_{W // shared}gpu" if result["backend"] == "cuda" and shared > 1 else ""
    stem = os.path.join(args.out, f"ccl_{W}ranks{gpus}{'_quick' if args.quick else ''}")
    measured = {p["collective"] for p in result["points"]}
    result = with_earlier_points(result, stem + ".json")
    if args.write_table:
        # the table of the collectives this run measured, from their points of every size: a run
        # of a few sizes keeps what an earlier run chose for the others
        rows = [r for r in best_rows(result) if r["collective"] in measured]
        write_table(table_path(args, result), rows, result)
        result = dict(result, table_rows=rows, points=[as_chosen(p, rows, result) for p in result["points"]])
    notes = list(result["notes"])
    if not final:
        notes.append(f"partial: sizes {', '.join(human(s) for s in result['sizes_done'])} of "
                     f"{', '.join(human(s) for s in args.sizes)} done")
    why_no_plot = plot(result, stem + ".png")
    if why_no_plot:
        notes.append(why_no_plot)
    with open(stem + ".json", "w") as f:
        json.dump(dict(result, notes=notes), f, indent=1)
    text = table(dict(result, notes=notes))
    with open(stem + ".md", "w") as f:
        f.write(f"Host collectives, {W} ranks on {result['device']} (`{result['command']}`):\n\n```text\n{text}\n```\n")
    if final:
        print(text)
    print(f"wrote {stem}.json{' and ' + table_path(args, result) if args.write_table else ''}"
          f"{'' if final else ' (partial)'}", flush=True)


def as_chosen(point: dict, rows: list[dict], result: dict) -> dict:
    """``point`` with its ``ccl`` times those of the candidate that the table written from this
    run chooses for it (the same configuration, measured in the same run): the results show the
    table a user gets. Points of no candidate are returned as they are."""
    dtype = str(DTYPES[point["dtype"]]).removeprefix("torch.")
    cfg = ccl.choose(point["collective"], point["message_bytes"], dtype, result["world_size"], result["backend"],
                     table=rows, ranks_per_gpu=result["ranks_per_gpu"])
    label = config_text(cfg)
    if label not in point["eager_us"]:
        return point
    times = {key: dict(point[key], ccl=point[key][label]) for key in ("eager_us", "graph_us") if label in point[key]}
    return dict(point, **times, correct=dict(point["correct"], ccl=point["correct"][label]), chosen=label)


def with_earlier_points(result: dict, path: str) -> dict:
    """``result`` plus the points of an earlier results file of the same configuration for the
    collectives, dtypes and sizes this run did not measure (``--collectives`` or ``--sizes``
    rerun a few and keep the rest of the file)."""
    try:
        with open(path) as f:
            earlier = json.load(f)
    except (OSError, ValueError):
        return result
    key = ("world_size", "ranks_per_gpu", "backend")
    if any(earlier.get(k) != result[k] for k in key):
        return result
    measured = {(p["collective"], p["dtype"], p["bytes"]) for p in result["points"]}
    kept = [dict(p, date=p.get("date", earlier.get("date")), device=p.get("device", earlier.get("device")))
            for p in earlier.get("points", []) if (p["collective"], p["dtype"], p["bytes"]) not in measured]
    if not kept:
        return result
    order = {name: i for i, name in enumerate(COLLECTIVES)}
    points = sorted(result["points"] + kept, key=lambda p: (order.get(p["collective"], 99), p["bytes"]))
    dtypes = list(dict.fromkeys([*result["dtypes"], *earlier.get("dtypes", [])]))
    return dict(result, points=points, dtypes=dtypes, notes=[*result["notes"], earlier_points_note(kept)])


def earlier_points_note(kept: list[dict]) -> str:
    """Which points came from which earlier run (date and device): one results file may hold
    points of several runs, and this run's device need not be theirs."""
    runs: dict = {}
    for p in kept:
        what = f"{p['collective']} {p['dtype']}"
        sizes = runs.setdefault((p.get("date"), p.get("device")), {}).setdefault(what, set())
        sizes.add(p["bytes"])
    parts = []
    for (date, device), collectives in runs.items():
        what = ", ".join(f"{name} {human(min(b))}" + (f"-{human(max(b))}" if len(b) > 1 else "")
                         for name, b in collectives.items())
        parts.append(f"{what} from the run of {date}{' on ' + device if device else ''}")
    return "points of earlier runs: " + "; ".join(parts)


# --- --host: the host's time per call ------------------------------------------------------------

@triton.jit
def empty_kernel(x):
    """Does nothing: its launch is what any Triton launch from Python costs."""
    pass



class NoLaunch:
    """A launch that enqueues nothing, with the interface of the plans' launches (``_launch``)."""

    fast = __call__ = staticmethod(lambda *args: None)


def run_host(args) -> dict:
    """Every rank times its own calls (see ``--host`` in the module docstring)."""
    ctx = iris.runtime.iris(heap_size=1 << 24)
    cuda = ctx.device.type == "cuda"
    rows = []
    # the last: an all-reduce whose call agrees with the peers on how its tensors are reached (one
    # host allgather per call), as calls of plain tensors from ccl.REGISTER_FROM bytes do
    cases = [(name, heap, None) for heap in (False, True) for name in COLLECTIVES]
    cases.append(("all_reduce", False, ccl.Config(register=True)))
    for name, heap, config in cases:
        case = Case(ctx, name, 4096, torch.float32, heap=heap)
        fn = case.call(config)
        fn()  # builds the plan and compiles: not timed
        ctx.barrier()
        row = {"collective": name, "heap": heap, "agreed": config is not None}
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
        peer = Peer(ctx, True)
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
              "check_calls": bool(_calls.CHECK_CALLS.value),
              "empty_triton_launch_us": slowest(floor) if floor else None,
              "empty_direct_launch_us": slowest(direct) if direct else None,
              "date": datetime.date.today().isoformat()}
    ctx.barrier()
    ctx.close()
    return result


def host_table(result: dict) -> str:
    lines = [f"host microseconds per ccl call, 4 KiB fp32 (the larger buffer), {result['world_size']} ranks, "
             f"{result['device']}, Triton {result['triton']} (median of {result['rounds']} rounds, slowest rank)", "",
             "| collective | tensors | dispatch (us, launch a no-op) | enqueue (us, real launch) |",
             "| --- | --- | --- | --- |"]
    for row in result["rows"]:
        enqueue = f"{row['enqueue_median_us']:.1f}" if "enqueue_median_us" in row else "- (GPU only)"
        tensors = "heap" if row["heap"] else "plain, agreed with the peers" if row.get("agreed") else "plain"
        lines.append(f"| {row['collective']} | {tensors} | {row['dispatch_median_us']:.2f} | {enqueue} |")
    if result["empty_triton_launch_us"] is not None:
        lines.append(f"| empty Triton kernel, Triton's launcher | - | - | {result['empty_triton_launch_us']:.1f} |")
    if result.get("empty_direct_launch_us") is not None:
        direct = result["empty_direct_launch_us"]
        lines.append(f"| empty Triton kernel, the plans' direct launch | - | - | {direct:.1f} |")
    for row in result.get("peer_rows", []):
        lines.append(f"| all_reduce, {row['label']} (the peer) | symmetric | - | {row['enqueue_median_us']:.1f} |")
    return "\n".join(lines)


def host_plot(result: dict, path: str) -> str | None:
    """Bars per collective: dispatch (and enqueue on the GPU), plain and heap tensors."""
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    series = [("dispatch_median_us", False, "dispatch, plain"), ("dispatch_median_us", True, "dispatch, heap"),
              ("enqueue_median_us", False, "enqueue, plain"), ("enqueue_median_us", True, "enqueue, heap")]
    series = [s for s in series if any(s[0] in r for r in result["rows"])]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(series)
    for i, (key, heap, label) in enumerate(series):
        values = [next(r[key] for r in result["rows"]
                       if r["collective"] == c and r["heap"] == heap and not r.get("agreed"))
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


def save_host(args, result: dict) -> None:
    """Rank 0 prints the table and writes ``results/ccl_host_<W>ranks[_cpu].{json,md,png}``."""
    text = host_table(result)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"ccl_host_{result['world_size']}ranks"
                        + ("" if result["backend"] == "cuda" else f"_{result['backend']}"))
    why_no_plot = host_plot(result, stem + ".png")
    if why_no_plot:
        print(why_no_plot)
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(f"{text}\n\n`mpirun -n {result['world_size']} python3 -m mpi4py benchmarks/ccl.py --host "
                f"--calls {result['calls']} --rounds {result['rounds']}` ({result['date']})\n")
    print(f"wrote {stem}.json, .md and .png", flush=True)


def main(argv=None) -> None:
    args = parse_args(argv)
    if hasattr(signal, "SIGUSR1"):  # tools/gpu-bench.sh sends it at its time limit: show where each rank is
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        if args.group_size:
            result = run_groups(args)
        elif args.host:
            result = run_host(args)
        else:
            result = run(args, on_size=lambda partial: save(args, partial, final=False))
    except BaseException:
        # Under mpirun the job's abort can outrun the rank's stderr: say what failed on stdout first.
        import traceback

        print(f"ccl.py failed on this rank:\n{traceback.format_exc()}", flush=True)
        raise
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() == 0:
        if args.group_size:
            save_groups(args, result)
        elif args.host:
            save_host(args, result)
        else:
            save(args, result, final=True)


if __name__ == "__main__":
    main()
