"""How fast is a tile all-reduce? Every iris.collectives all-reduce variant against PyTorch's
symmetric-memory all-reduces (the peer) and the bytes-moved floor.

    mpirun -n 4 python3 -m mpi4py benchmarks/tile_collectives.py                # GPU(s), under MPS when shared
    mpirun -n 4 python3 -m mpi4py benchmarks/tile_collectives.py --graph 20     # launches replayed from CUDA graphs
    mpirun -n 2 python3 -m mpi4py benchmarks/tile_collectives.py --quick        # CPU backend, tiny

Each variant is one kernel over an M x N tensor (rows of ``--row-bytes``, tiles of a few rows, a
persistent grid: ``ctx.resident_grid``, balanced over the tiles) whose programs load their tile and
call the collective on it; times are per call, the slowest rank's, every rank launching back to
back. The variants in ``--tune`` are measured at every tile shape of ``--shapes`` and the fastest
counts; ``--calls-per-launch`` and ``--graph`` take the launch out of the time; on Hopper the
launches are programmatic dependent launches (``--no-pdl``: plain ones), and after the first they go
straight to the compiled kernel (``Launch``). The time of an empty kernel is printed too. Peer:
``torch.ops.symm_mem``'s one-shot and two-shot all-reduce (a gloo group,
``TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1``; not with ``--graph``). Floor, ranks on one GPU:
``2 * W * S`` bytes at the copy bandwidth torch reaches (measured at the start); one rank per GPU
the links bound the time instead. Writes
``tile_collectives_<W>ranks[_<G>gpus][_x<K>][_graph<N>][_quick].{json,md,png}`` into ``--out``.
Results and what they say: docs/performance.md.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl
from common import NO_PLOT, KiB, MiB, human, parse_size, pyplot, symm_mem_group, torch_group
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

import iris.collectives as ic  # imports iris.runtime first: the backend is chosen before any kernel
import iris.device._watchdog
import iris.runtime

VARIANTS = ("one_shot", "two_shot", "ring", "spinlock", "atomic")
VARIANT_IDS = {"atomic": 0, "spinlock": 1, "one_shot": 2, "two_shot": 3, "ring": 4}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
DEFAULT_SIZES = [64 * KiB, 256 * KiB, MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB]
QUICK_SIZES = [4 * KiB, 16 * KiB]


@triton.jit
def all_reduce_bench(context, src, dst, locks, M, N, stride_src, stride_dst, rank: tl.constexpr,
                     world_size: tl.constexpr, VARIANT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     CALLS: tl.constexpr = 1, PDL: tl.constexpr = False):
    """``CALLS`` all-reduces of ``src`` into ``dst`` (M x N), one after another, with the variant
    ``VARIANT``; persistent grid. ``PDL``: launched as a programmatic dependent launch (Hopper):
    wait for the previous launch on the stream to finish before touching memory, and let the next
    one start once every program of this one is past its last tile."""
    if PDL:
        gdc_wait()
    ctx = ic.DeviceContext.initialize(context, rank, world_size)
    src_view = ic.TensorView(src, M, N, stride_src, 1)
    dst_view = ic.TensorView(dst, M, N, stride_dst, 1)
    tiles_n = src_view.num_tiles_n(BLOCK_N)
    # this program's tiles in one call (the grid is at most the tile count, so at least one)
    per_call = tl.cdiv(src_view.num_tiles(BLOCK_M, BLOCK_N) - tl.program_id(0), tl.num_programs(0))
    for i in range(CALLS * per_call):  # the same tiles in every call, calls one after another
        t = tl.program_id(0) + (i % per_call) * tl.num_programs(0)
        pid_m, pid_n = ic.tile_coords(t, tiles_n)
        view = ic.TileView(pid_m, pid_n, BLOCK_M, BLOCK_N)
        # ring and two-shot read this rank's input from src_view themselves (no tile.data)
        if VARIANT == 4:
            ctx.all_reduce_ring(view, src_view, dst_view)
        elif VARIANT == 3:
            ctx.all_reduce_two_shot(view, src_view, dst_view, locks)
        else:
            pointers, mask = src_view.frame(view)
            tile = ic.Tile(pid_m, pid_n, BLOCK_M, BLOCK_N, tl.load(pointers, mask=mask, other=0))
            if VARIANT == 0:
                ctx.all_reduce_atomic(tile, dst_view)
            elif VARIANT == 1:
                ctx.all_reduce_spinlock(tile, dst_view, locks)
            else:
                ctx.all_reduce_one_shot(tile, src_view, dst_view, locks)
    if PDL:
        gdc_launch_dependents()


@triton.jit
def empty_kernel(x):
    """Does nothing: timing its launches gives what a launch costs before any work."""
    pass


class Launch:
    """A kernel launch with fixed arguments, cheap to repeat.

    The first call goes through Triton (binding, specialisation, cache lookup: tens of microseconds
    of host time per launch, longer than a small all-reduce takes on the GPU); later calls launch
    the compiled kernel directly with the same arguments on the same stream. Falls back to the
    normal launch when the compiled kernel does not have the expected interface.
    """

    def __init__(self, fn, grid, args, kwargs):
        self.fn, self.grid, self.args, self.kwargs = fn, grid, args, kwargs
        self.kernel = None
        self.direct = None

    def compile(self):
        """Compile without launching; returns the compiled kernel."""
        if self.kernel is None:
            self.kernel = self.fn.warmup(*self.args, grid=self.grid, **self.kwargs)
            if hasattr(self.kernel, "result"):
                self.kernel = self.kernel.result()
        return self.kernel

    def __call__(self):
        if self.direct is not None:
            return self.direct()
        self.kernel = self.fn[self.grid](*self.args, **self.kwargs)
        self.direct = self._direct()
        return None

    def graphed(self, count: int):
        """Capture ``count`` of these launches, one after another, in one CUDA graph; returns its
        replay. Launched from the graph, the kernels skip the host's launch path and go to the GPU
        together (captured through Triton's launcher: the direct launch holds the stream it
        found at its first call, not the capture stream)."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
            for _ in range(count):
                self.fn[self.grid](*self.args, **self.kwargs)
        return graph.replay

    def _direct(self):
        try:
            from triton import knobs
            from triton.runtime import driver

            # every parameter in order: positional, then keywords, then defaults of the rest
            params = self.fn.params
            values = list(self.args) + [self.kwargs[p.name] if p.name in self.kwargs else p.default
                                        for p in params[len(self.args):]]
            if any(v is inspect.Parameter.empty for v in values):
                return None
            kernel = self.kernel
            device = driver.active.get_current_device()
            stream = driver.active.get_current_stream(device)
            g = tuple(self.grid) + (1,) * (3 - len(self.grid))
            hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
            if any(h is not None and getattr(h, "calls", True) for h in hooks):
                return None  # registered hooks (profilers) want the metadata the normal path computes
            run, function, packed = kernel.run, kernel.function, kernel.packed_metadata

            def launch():
                run(g[0], g[1], g[2], stream, function, packed, None, None, None, *values)

            return launch
        except Exception:  # another Triton version: keep the normal launch
            return None


def balanced_grid(tiles: int, most: int) -> int:
    """The fewest programs (at most ``most``) that cover ``tiles`` tiles in as few rounds as
    ``most`` programs do: every program then loops over the same number of tiles, give or take one
    in the last round."""
    rounds = -(-tiles // most)
    return -(-tiles // rounds)


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """'8x4,32x8' -> [(8, 4), (32, 8)] (rows per tile, warps)."""
    shapes = []
    for item in text.split(","):
        rows, _, warps = item.strip().partition("x")
        if not (rows.isdigit() and warps.isdigit()) or int(warps) not in (1, 2, 4, 8, 16, 32):
            raise argparse.ArgumentTypeError(f"tile shape {item!r}: write ROWSxWARPS, e.g. 8x4 (warps 1-32, a power "
                                             f"of two)")
        shapes.append((int(rows), int(warps)))
    return shapes


def shape_name(shape: tuple[int, int]) -> str:
    """(8, 4) -> '8x4', as --shapes spells it."""
    return f"{shape[0]}x{shape[1]}"




def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=lambda s: [parse_size(x) for x in s.split(",")],
                   help="bytes per rank, comma-separated (64K,1M,...); default 64 KiB .. 256 MiB")
    p.add_argument("--variants", type=lambda s: s.split(","), default=list(VARIANTS), help=",".join(VARIANTS))
    p.add_argument("--dtypes", type=lambda s: s.split(","), default=list(DTYPES), help="fp32,bf16")
    p.add_argument("--quick", action="store_true", help="tiny sizes, few iterations (runs on the CPU backend)")
    p.add_argument("--row-bytes", type=int, default=4096, help="bytes per row (fp32 and bf16 rows hold the same bytes)")
    p.add_argument("--shapes", type=parse_shapes, default=parse_shapes("8x4,16x4,32x8,64x8,64x16"),
                   help="tile shapes ROWSxWARPS; the variants in --tune try each, the others take the first")
    p.add_argument("--tune", type=lambda s: s.split(",") if s else [], default=["two_shot"],
                   help="variants measured at every shape of --shapes (default two_shot; '' for none)")
    p.add_argument("--pdl", action=argparse.BooleanOptionalAction, default=True,
                   help="GPU: programmatic dependent launches (Hopper; default); --no-pdl: plain launches")
    p.add_argument("--calls-per-launch", type=int, default=1,
                   help="all-reduces per kernel launch, one after another (times are per all-reduce)")
    p.add_argument("--graph", type=int, default=0, metavar="LAUNCHES",
                   help="GPU: time replays of a CUDA graph of this many launches; 0 (default): host launches")
    p.add_argument("--programs", type=int, default=None,
                   help="programs per rank (default: from resident_grid; every rank's programs must fit at once)")
    p.add_argument("--grid", choices=("balanced", "resident"), default="balanced",
                   help="default --programs: all that stay resident, or the fewest that take as many rounds "
                        "over the tiles (balanced)")
    p.add_argument("--time-per-point", type=float, default=0.05, help="seconds of calls per measurement")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    p.add_argument("--no-torch", action="store_true", help="skip the torch symm_mem peer")
    p.add_argument("--torch-max-ranks", type=int, default=4,
                   help="measure torch's all-reduces only up to this many ranks (more ranks on one GPU hung)")
    p.add_argument("--hang-seconds", type=float, default=60.0,
                   help="end the job when a checked or timed call has not finished after this long (GPU)")
    args = p.parse_args(argv)
    if args.sizes is None:
        args.sizes = QUICK_SIZES if args.quick else DEFAULT_SIZES
    if args.calls_per_launch < 1:
        p.error(f"--calls-per-launch {args.calls_per_launch}: pass 1 or more")
    if args.graph < 0 or args.graph == 1:
        p.error(f"--graph {args.graph}: pass the launches per CUDA graph (2 or more), or 0 for none")
    unknown = [v for v in args.tune + args.variants if v not in VARIANTS] + [d for d in args.dtypes if d not in DTYPES]
    if unknown:
        p.error(f"unknown variants/dtypes {unknown}; variants: {VARIANTS}, dtypes: {tuple(DTYPES)}")
    return args


class Timer:
    """Seconds per call of ``fn``, the slowest rank's, with every rank calling back to back."""

    def __init__(self, heap, hang_seconds: float = 60.0):
        self.heap = heap
        self.cuda = heap.device.type == "cuda"
        self.hang_seconds = hang_seconds
        self.host_seconds = 0.0

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.heap.device)

    def finish_or_exit(self, what: str, seconds: float) -> None:
        """Wait for this rank's queued GPU work, at most ``seconds``; on a hang, say which call
        hung and end the job (a kernel whose peers never arrive spins forever; a hung benchmark
        that prints nothing helps no one)."""
        if not self.cuda:
            return
        done = torch.cuda.Event()
        done.record()
        deadline = time.monotonic() + seconds
        while not done.query():
            if time.monotonic() > deadline:
                print(f"rank {self.heap.rank}: {what} did not finish within {seconds:.0f} s with "
                      f"{self.heap.world_size} ranks on one GPU; ending the job (rerun without it, e.g. "
                      f"--no-torch or --variants, or with fewer ranks)", file=sys.stderr, flush=True)
                os._exit(3)
            time.sleep(0.001)

    def __call__(self, fn, iters: int, what: str = "a timed call") -> float:
        self.heap.barrier()
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            self.host_seconds = (time.perf_counter() - t0) / iters  # launch cost on the host
            end.record()
            self.finish_or_exit(f"{what}, timed {iters} times", self.hang_seconds)
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3 / iters
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            seconds = (time.perf_counter() - t0) / iters
        return self.heap.comm.allreduce(seconds, op=max_op())

    def calibrated(self, fn, budget: float, quick: bool, what: str = "a timed call") -> tuple[float, int]:
        """Warm up, pick an iteration count that fills ``budget`` seconds, measure."""
        fn()
        if quick:
            return self(fn, 1, what), 1
        once = self(fn, 2, what)
        iters = int(min(max(budget / max(once, 1e-7), 5), 500))
        iters = self.heap.comm.allreduce(iters, op=max_op())  # the same count on every rank
        return self(fn, iters, what), iters


def empty_launch_seconds(heap, timer, args) -> float:
    """Seconds per launch of a kernel that does nothing, every rank launching back to back at once:
    the part of every time in the table that no single-launch all-reduce avoids (with several
    ranks on one GPU under MPS it grows with the ranks)."""
    call = Launch(empty_kernel, (1,), (torch.zeros(1, device=heap.device),), {})
    launches = graph_launches(args, heap)
    if launches > 1:
        call()  # compiled before the capture
        timer.sync()
        call = call.graphed(launches)
    seconds, _ = timer.calibrated(call, args.time_per_point, args.quick, "an empty kernel")
    return seconds / launches


def graph_launches(args, heap) -> int:
    """Launches per timed call: ``--graph``'s count on the GPU, else 1."""
    return args.graph if args.graph > 0 and heap.device.type == "cuda" else 1


def max_op():
    from mpi4py import MPI

    return MPI.MAX


def copy_bandwidth(heap, quick: bool) -> float:
    """Read + write bytes per second of torch's device copy, measured on rank 0 alone."""
    nbytes = (8 * MiB) if quick else (1 << 30)
    result = 0.0
    heap.barrier()
    if heap.rank == 0:
        a = torch.empty(nbytes, dtype=torch.uint8, device=heap.device)
        b = torch.empty_like(a)
        b.copy_(a)
        iters = 3 if quick else 20
        if heap.device.type == "cuda":
            torch.cuda.synchronize(heap.device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                b.copy_(a)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3 / iters
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                b.copy_(a)
            seconds = (time.perf_counter() - t0) / iters
        result = 2 * nbytes / seconds
        del a, b
    return heap.comm.bcast(result, root=0)


class TorchPeer:
    """torch.ops.symm_mem one-shot and two-shot all-reduce on the same GPU, or why not."""

    def __init__(self, heap, enabled: bool):
        self.heap = heap
        self.reason = None
        self.group_name = None
        if not enabled:
            self.reason = "disabled with --no-torch"
        elif heap.device.type != "cuda":
            self.reason = "torch symm_mem needs CUDA (this run is on the cpu backend): column skipped"
        else:
            try:
                self._init()
            except Exception as exc:  # report and go on without the column
                self.reason = f"torch symm_mem unavailable: {type(exc).__name__}: {exc}"
            reasons = [r for r in heap.comm.allgather(self.reason) if r]
            if reasons:  # every rank goes on without the column if any rank failed
                self.reason, self.group_name = reasons[0], None

    def _init(self):
        torch.cuda.set_device(self.heap.device)
        self.dist = torch_group(self.heap, "gloo")
        self.symm_mem, self.group_name = symm_mem_group()

    def buffers(self, numel: int, dtype):
        buf = self.symm_mem.empty(numel, dtype=dtype, device=self.heap.device)
        self.symm_mem.rendezvous(buf, self.group_name)
        return buf, torch.empty_like(buf)

    def one_shot(self, buf, out):
        torch.ops.symm_mem.one_shot_all_reduce_out(buf, "sum", self.group_name, out)

    def two_shot(self, buf, out):
        torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", self.group_name)


def measure_torch(peer, timer, heap, point, numel, dtype, args):
    """Time torch's one-shot and two-shot all-reduce on symmetric buffers of ``numel`` elements."""
    rank, world, dev = heap.rank, heap.world_size, heap.device
    buf, out = peer.buffers(numel, dtype)
    for op_name, op in (("torch_one_shot", peer.one_shot), ("torch_two_shot", peer.two_shot)):
        buf.copy_(input_pattern(numel, rank, dtype, dev))
        timer.sync()
        heap.comm.Barrier()
        op(buf, out)
        timer.finish_or_exit(f"{op_name} ({human(numel * buf.element_size())} {dtype})", args.hang_seconds)
        got = out if op_name == "torch_one_shot" else buf
        ok = bool(torch.equal(got, expected_sum(numel, world, dtype, dev)))
        point["correct"][op_name] = heap.comm.allreduce(int(not ok)) == 0

        def call(op=op):
            op(buf, out)

        seconds, iters = timer.calibrated(call, args.time_per_point, args.quick,
                                          f"{op_name} ({human(numel * buf.element_size())} {dtype})")
        point["times_us"][op_name] = seconds * 1e6
        point.setdefault("host_us", {})[op_name] = timer.host_seconds * 1e6
        point["iters"][op_name] = iters
    timer.sync()
    heap.comm.Barrier()  # the buffers go when this function returns, on every rank


def input_pattern(numel: int, rank: int, dtype, device) -> torch.Tensor:
    """Small integers, exact in bf16 after summing up to 8 ranks."""
    return ((torch.arange(numel, device=device) % 13) + rank).to(dtype)


def expected_sum(numel: int, world: int, dtype, device) -> torch.Tensor:
    return ((torch.arange(numel, device=device) % 13) * world + world * (world - 1) // 2).to(dtype)


def measure_variant(heap, timer, args, variant: str, src, block_m: int, block_n: int, warps: int, what: str) -> dict:
    """One variant at one tile shape: a checked launch on a zeroed destination, then the timing.
    Returns microseconds per call, whether the result was right, and how it was launched."""
    W, rank, dev, cuda = heap.world_size, heap.rank, heap.device, heap.device.type == "cuda"
    M, N = src.shape
    tiles = ic.num_tiles(M, N, block_m, block_n)
    # atomic and spinlock add into the destination (fp32 for bf16 data), zeroed first; each of
    # the launch's calls adds the sum once more
    adds = variant in ("atomic", "spinlock")
    out_dtype = torch.float32 if adds and src.dtype == torch.bfloat16 else src.dtype
    dst = heap.zeros(M, N, dtype=out_dtype)
    # one lock array per collective and tiling (its counters belong to that collective)
    locks = heap.zeros(ic.lock_words(M, N, block_m, block_n), dtype=torch.int32)
    launch_args = (heap.get_device_context(), src, dst, locks, M, N, src.stride(0), dst.stride(0))
    launch_kwargs = dict(rank=rank, world_size=W, VARIANT=VARIANT_IDS[variant], BLOCK_M=block_m, BLOCK_N=block_n,
                         CALLS=args.calls_per_launch, num_warps=warps)
    if args.pdl and cuda:
        launch_kwargs.update(PDL=True, launch_pdl=True)
    out = {}
    programs = args.programs
    if cuda:
        probe = Launch(all_reduce_bench, (1,), launch_args, launch_kwargs).compile()
        per_sm = iris.runtime.programs_per_sm(probe, dev)  # first: it loads the kernel, which sets n_regs
        out["kernel"] = {"regs": probe.n_regs, "spills": probe.n_spills, "shared": probe.metadata.shared,
                         "resident_per_sm": per_sm}
    if programs is None:
        # GPU: what stays resident with every rank on this GPU running it (collective); the
        # interpreter runs programs one after another: one is enough
        programs = heap.resident_grid(tiles, probe) if cuda else 1
        if args.grid == "balanced":
            programs = balanced_grid(tiles, programs)
    grid = (min(tiles, programs),)
    call = Launch(all_reduce_bench, grid, launch_args, launch_kwargs)
    heap.barrier()
    call()  # one checked launch on a zeroed destination
    timer.finish_or_exit(what, args.hang_seconds)
    heap.barrier()
    want = expected_sum(M * N, W, out_dtype, dev).view(M, N) * (args.calls_per_launch if adds else 1)
    ok = heap.comm.allreduce(int(not torch.equal(dst, want))) == 0  # on every rank
    # The timed launches add into the destination without zeroing it in between (atomic,
    # spinlock): the values are not checked there and the work is the same.
    launches = graph_launches(args, heap)
    if launches > 1:
        timed = call.graphed(launches)
        heap.barrier()  # no rank times its replays while another still captures
    else:
        timed = call
    seconds, iters = timer.calibrated(timed, args.time_per_point, args.quick, f"{what} {block_m}x{warps}" +
                                      (f" in CUDA graphs of {launches} launches" if launches > 1 else ""))
    out.update(us=seconds * 1e6 / args.calls_per_launch / launches, correct=ok, iters=iters, grid=grid[0],
               launch="direct" if call.direct is not None else "triton", host_us=timer.host_seconds * 1e6)
    heap.barrier()
    heap.free(locks)
    heap.free(dst)
    return out


def run(args) -> dict:
    max_bytes = max(args.sizes)
    heap_size = 3 * max_bytes + 64 * MiB
    heap = iris.runtime.iris(heap_size=heap_size)
    W, rank, dev = heap.world_size, heap.rank, heap.device
    cuda = dev.type == "cuda"
    timer = Timer(heap, args.hang_seconds)
    notes = []
    bandwidth = copy_bandwidth(heap, args.quick)
    empty_us = empty_launch_seconds(heap, timer, args) * 1e6
    gpus = len(set(heap.comm.allgather(dev.index))) if cuda else 0

    def result_of(rows):
        return {
            "world_size": W, "backend": heap.backend, "gpus": gpus,
            "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
            "copy_bandwidth_GBps": bandwidth / 1e9, "programs_per_rank": args.programs or args.grid,
            "shapes": [shape_name(shape) for shape in args.shapes], "tuned": args.tune,
            "calls_per_launch": args.calls_per_launch, "graph_launches": graph_launches(args, heap),
            "empty_launch_us": empty_us, "pdl": bool(args.pdl and cuda),
            # whether the kernels had the watchdog's bounded waits compiled in (IRIS_TIMEOUT_S at import)
            "watchdog_compiled_in": bool(iris.device._watchdog.WATCHDOG.value),
            "floor": "2 * world_size * bytes_per_rank / copy bandwidth (every input read once, every output "
                     "written once, all ranks on one GPU)",
            "notes": notes, "points": rows,
        }

    if graph_launches(args, heap) > 1 and not args.no_torch:
        args.no_torch = True
        notes.append(f"{args.graph} launches per CUDA graph (--graph); torch symm_mem is not captured (compare "
                     f"with the table without --graph)")
    peer = TorchPeer(heap, enabled=not args.no_torch and W <= args.torch_max_ranks)
    if not args.no_torch and W > args.torch_max_ranks:
        peer.reason = (f"torch symm_mem skipped at {W} ranks (--torch-max-ranks {args.torch_max_ranks}): with 8 ranks "
                       f"on one H200 its first call never finished in our runs")
    if peer.reason:
        notes.append(peer.reason)
    if not cuda:
        notes.append("cpu backend (Triton's interpreter): times show the code path works, not performance")
    elif heap.ranks_on_device < W:
        notes.append(f"{heap.ranks_on_device} of the {W} ranks per GPU: the floor assumes every rank on one GPU "
                     f"(HBM-bound); with ranks on several GPUs the links between them bound it, not this floor")
    rows = []
    for dname in args.dtypes:
        dtype = DTYPES[dname]
        esize = torch.empty((), dtype=dtype).element_size()
        block_n = 64 if args.quick else args.row_bytes // esize
        for nbytes in args.sizes:
            numel = max(nbytes // esize // block_n, 1) * block_n
            M, N = numel // block_n, block_n
            src = heap.zeros(M, N, dtype=dtype)
            src.copy_(input_pattern(numel, rank, dtype, dev).view(M, N))
            floor = 2 * W * numel * esize / bandwidth
            point = {"dtype": dname, "bytes_per_rank": numel * esize, "M": M, "N": N, "block": {}, "shape": {},
                     "grid": {}, "floor_us": floor * 1e6, "times_us": {}, "correct": {}, "iters": {}}
            for variant in args.variants:
                tried = {shape: measure_variant(heap, timer, args, variant, src, shape[0], block_n, shape[1],
                                                f"{variant} ({human(numel * esize)} {dname})")
                         for shape in (args.shapes if variant in args.tune else args.shapes[:1])}
                # the fastest shape with a right result (or the first shape when none was right)
                right = [k for k, r in tried.items() if r["correct"]] or list(tried)[:1]
                shape = min(right, key=lambda k: tried[k]["us"])
                best = tried[shape]
                point["times_us"][variant] = best["us"]
                point["correct"][variant] = best["correct"]
                point["iters"][variant] = best["iters"]
                point["grid"][variant] = best["grid"]
                point["shape"][variant] = shape_name(shape)
                point["block"][variant] = [shape[0], block_n]
                point.setdefault("launch", {})[variant] = best["launch"]
                point.setdefault("host_us", {})[variant] = best["host_us"]
                if "kernel" in best:
                    point.setdefault("kernel", {})[variant] = best["kernel"]
                if len(tried) > 1:
                    point.setdefault("shapes_us", {})[variant] = {shape_name(k): r["us"] if r["correct"] else None
                                                                  for k, r in tried.items()}
            if peer.group_name is not None:
                try:
                    measure_torch(peer, timer, heap, point, numel, dtype, args)
                except Exception as exc:  # keep the iris numbers; say why the column is empty
                    notes.append(f"torch symm_mem failed at {human(numel * esize)} {dname}: "
                                 f"{type(exc).__name__}: {exc}")
            rows.append(point)
            if cuda and "triton" in point["launch"].values() and not any("Triton's launcher" in n for n in notes):
                notes.append("some launches went through Triton's launcher (the direct launch did not fit this "
                             "Triton): tens of microseconds of host time each, so small sizes are host-bound")
            heap.barrier()
            heap.free(src)
    heap.close()
    return result_of(rows)


def result_stem(args, result: dict) -> str:
    """Path of the results without extension: tile_collectives_<W>ranks[_<G>gpus][_x<calls per
    launch>][_graph<launches per graph>][_quick] (``_<G>gpus`` when the ranks used several GPUs)."""
    gpus = f"_{result['gpus']}gpus" if result.get("gpus", 0) > 1 else ""
    calls = f"_x{args.calls_per_launch}" if args.calls_per_launch > 1 else ""
    calls += f"_graph{result['graph_launches']}" if result.get("graph_launches", 1) > 1 else ""
    quick = "_quick" if args.quick else ""
    return os.path.join(args.out, f"tile_collectives_{result['world_size']}ranks{gpus}{calls}{quick}")


def write_json(result: dict, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


def devices(result: dict) -> str:
    """``NVIDIA H200``, or ``2 x NVIDIA H200`` when the ranks used several GPUs."""
    return f"{result['gpus']} x {result['device']}" if result.get("gpus", 0) > 1 else result["device"]


def table(result: dict) -> str:
    lines = []
    for dname in sorted({p["dtype"] for p in result["points"]}):
        points = [p for p in result["points"] if p["dtype"] == dname]
        columns = list(dict.fromkeys(k for p in points for k in p["times_us"]))
        header = f"{'bytes/rank':>10} " + " ".join(f"{c:>15}" for c in columns) + f" {'floor':>9} {'best':>19} " \
            f"{'best/floor':>10} {'best/torch':>10}"
        calls = result.get("calls_per_launch", 1)
        per = f"per all-reduce, {calls} in each launch" if calls > 1 else "per call"
        if result.get("pdl"):
            per += " (programmatic dependent launches)"
        if result.get("graph_launches", 1) > 1:
            per += f", {result['graph_launches']} launches per CUDA graph"
        lines += [f"{dname}, {result['world_size']} ranks, {devices(result)}, times in us {per} "
                  f"(* = wrong result; best: variant and tile shape ROWSxWARPS)", header]
        for p in points:
            times = p["times_us"]
            ours = {k: v for k, v in times.items() if not k.startswith("torch") and p["correct"].get(k)}
            theirs = [v for k, v in times.items() if k.startswith("torch") and p["correct"].get(k)]
            best = min(ours, key=ours.get) if ours else None
            cells = " ".join(f"{times[c]:>14.1f}{'' if p['correct'].get(c) else '*'}" if c in times else f"{'-':>15}"
                             for c in columns)
            ratio_floor = f"{ours[best] / p['floor_us']:>10.2f}" if best else f"{'-':>10}"
            ratio_torch = f"{ours[best] / min(theirs):>10.2f}" if best and theirs else f"{'-':>10}"
            best_text = f"{best} {p['shape'][best]}" if best else "-"
            lines.append(f"{human(p['bytes_per_rank']):>10} {cells} {p['floor_us']:>9.1f} {best_text:>19} "
                         f"{ratio_floor} {ratio_torch}")
        lines.append("")
    if result.get("empty_launch_us") is not None:
        lines.append(f"note: a kernel that does nothing, launched back to back by all {result['world_size']} ranks at "
                     f"once, takes {result['empty_launch_us']:.1f} us per launch")
    for note in result["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def plot(result: dict, path: str) -> str | None:
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    dtypes = sorted({p["dtype"] for p in result["points"]})
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6.5 * len(dtypes), 4.8), squeeze=False)
    for ax, dname in zip(axes[0], dtypes):
        points = [p for p in result["points"] if p["dtype"] == dname]
        sizes = [p["bytes_per_rank"] for p in points]
        for name in dict.fromkeys(k for p in points for k in p["times_us"]):
            ys = [p["times_us"].get(name) for p in points]
            style = "--" if name.startswith("torch") else "-"
            ax.plot(sizes, ys, style, marker="o", label=name)
        ax.plot(sizes, [p["floor_us"] for p in points], ":", color="black", label="floor (2WS / copy BW)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes per rank")
        ax.set_ylabel("us per all-reduce")
        ax.set_title(f"{dname}, {result['world_size']} ranks, {devices(result)}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def main(argv=None) -> None:
    args = parse_args(argv)
    result = run(args)
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() != 0:
        return
    os.makedirs(args.out, exist_ok=True)
    stem = result_stem(args, result)
    why_no_plot = plot(result, stem + ".png")
    if why_no_plot:
        result["notes"].append(why_no_plot)
    write_json(result, stem + ".json")
    text = table(result)
    with open(stem + ".md", "w") as f:  # the docs show it as the results table
        f.write(f"Tile all-reduce, {result['world_size']} ranks on {devices(result)} "
                f"(`benchmarks/tile_collectives.py`):\n\n```text\n{text}\n```\n")
    print(text)
    print(f"wrote {stem}.json" + ("" if why_no_plot else f" and {stem}.png"), flush=True)


if __name__ == "__main__":
    main()
