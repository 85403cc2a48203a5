"""What the benchmarks share: the peers' environment, their plots' matplotlib, a torch.distributed group over the
Iris ranks, and the timer. Import it before ``iris.runtime``."""

from __future__ import annotations

import os
import socket
import statistics
import sys
import time

NO_PLOT = "matplotlib is not installed: no plot"


KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def parse_size(text: str) -> int:
    """'4K' -> 4096, '1M', '1G' (a trailing 'B' or 'iB' is allowed), or plain bytes."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": KiB, "M": MiB, "G": GiB}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * scale)


def human(n: int) -> str:
    """Bytes as a table cell: '4 KiB', '1 MiB', or '<n> B' where no unit divides them."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def host_us(fn, calls: int, cuda: bool) -> float:
    """Host microseconds per call of ``fn`` over ``calls`` calls (the GPU queue drained first)."""
    import torch  # here: importing common must not import torch before the environment below is set

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

# Set on import, before any peer starts: torch's symmetric memory with ranks that share a GPU
# (MPS), NVLink multicast off (NCCL and torch), and --quick on the cpu backend.
for _name, _value in (("TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES", "1"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NCCL_NVLS_ENABLE", "0")) + ((("IRIS_BACKEND", "cpu"),) if "--quick" in sys.argv else ()):
    os.environ.setdefault(_name, _value)


def pyplot():
    """``matplotlib.pyplot`` drawing into files (the Agg backend), or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def torch_group(ctx, backend: str):
    """``torch.distributed`` with its default group over the ranks of ``ctx`` (an Iris context: ``rank``,
    ``world_size``, ``comm``, ``device``), through a TCP rendezvous on a local port that rank 0 picks;
    nothing when a group exists. ``backend``: ``"nccl"`` (bound to the context's GPU) or ``"gloo"``."""
    import torch.distributed as dist

    if not dist.is_initialized():
        port = None
        if ctx.rank == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        port = ctx.comm.bcast(port, root=0)
        kwargs = {"device_id": ctx.device} if backend == "nccl" else {}
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=ctx.rank,
                                world_size=ctx.world_size, **kwargs)
    return dist


def symm_mem_group(group=None):
    """``(torch.distributed._symmetric_memory, the name of group)`` (default: the default group),
    symmetric memory enabled for the group where this torch needs it."""
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    name = (group or dist.group.WORLD).group_name
    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
    if enable is not None:
        try:
            enable(name)
        except Exception:  # newer torch: nothing to enable
            pass
    return symm_mem, name


class Timer:
    """Seconds per call of ``fn``, the slowest rank's, every rank calling back to back: the median
    of ``repeats`` timed loops of about ``time_per_point / repeats`` seconds each (one call with
    ``quick``); :meth:`graphed` times ``per_call`` calls captured in one CUDA graph. The median of
    a few loops: one slow stretch inside a single loop (several ranks under MPS) once made an eager
    16 MiB call read 10x its graph time. ``barrier`` and ``slowest`` go through the context's
    communicator; a subclass may send them elsewhere."""

    def __init__(self, ctx, time_per_point: float, quick: bool = False, repeats: int = 3, max_iters: int = 500):
        self.ctx, self.time_per_point, self.quick = ctx, time_per_point, quick
        self.repeats, self.max_iters = repeats, max_iters
        self.cuda = ctx.device.type == "cuda"

    def barrier(self) -> None:
        """Every rank here before a timed loop starts."""
        self.ctx.barrier()

    def slowest(self, value: float) -> float:
        """The largest of every rank's ``value``."""
        from mpi4py import MPI

        return self.ctx.comm.allreduce(value, op=MPI.MAX)

    def _once(self, fn, iters: int) -> float:
        self.barrier()
        if self.cuda:
            import torch

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
        return self.slowest(seconds)

    def __call__(self, fn, per_call: int = 1) -> float:
        """``fn`` makes ``per_call`` calls (a graph replay); returns seconds per call."""
        fn()
        if self.quick:
            return self._once(fn, 1) / per_call
        once = self._once(fn, 2)
        iters = int(self.slowest(min(max(self.time_per_point / self.repeats / max(once, 1e-7), 5), self.max_iters)))
        return statistics.median(self._once(fn, iters) for _ in range(self.repeats)) / per_call

    def graphed(self, fn, per_call: int) -> float | None:
        """Seconds per call of ``fn`` captured ``per_call`` times in one CUDA graph (None off the GPU)."""
        if not self.cuda or per_call < 1:
            return None
        import torch

        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(per_call):
                fn()
        self.barrier()  # no rank replays while another still captures
        return self(graph.replay, per_call)


def log_axes(ax, xlabel: str, title: str) -> None:
    """A plot of microseconds per call against a size, both logarithmic (x in powers of two),
    with a grid, ``title`` and the legend."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("us per call")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6)


def agreed_reason(ctx, reason: str | None) -> str | None:
    """The first rank's reason among every rank's (None when no rank has one): a peer runs on every
    rank or on none."""
    reasons = [r for r in ctx.comm.allgather(reason) if r]
    return reasons[0] if reasons else None


class TorchPeer:
    """What a user would call instead, set up on every rank or on none: NCCL with one rank per GPU,
    torch's symmetric memory over a gloo group where ranks share a GPU (``kind``), or why not
    (``reason``). ``dist`` is the torch.distributed module once set up; ``symm_mem`` and ``group``
    for the shared-GPU case."""

    def __init__(self, ctx, enabled: bool):
        self.ctx, self.kind, self.reason = ctx, None, None
        if not enabled:
            self.reason = "peer disabled with --no-peer"
        elif ctx.device.type != "cuda":
            self.reason = "no NCCL or torch symm_mem on the cpu backend: peer columns skipped"
        else:
            try:
                self._init()
            except Exception as exc:  # report and go on without the column
                self.reason = f"peer unavailable: {type(exc).__name__}: {exc}"
            self.reason = agreed_reason(ctx, self.reason)
            if self.reason:
                self.kind = None

    def _init(self):
        import torch

        one_per_gpu = self.ctx.ranks_on_device == 1
        torch.cuda.set_device(self.ctx.device)
        self.dist = torch_group(self.ctx, "nccl" if one_per_gpu else "gloo")
        if one_per_gpu:
            self.kind = "nccl"
        else:
            (self.symm_mem, self.group), self.kind = symm_mem_group(), "torch symm_mem"
