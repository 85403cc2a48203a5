"""The ``iris`` backend of torch.distributed: what a PyTorch program's collectives cost through it,
next to torch's own on the same GPU.

    mpirun --allow-run-as-root --oversubscribe -n 4 python3 -m mpi4py benchmarks/torch_backend.py  # 4 ranks, 1 GPU
    torchrun --standalone --nproc-per-node 4 benchmarks/torch_backend.py          # the same, under torchrun
    mpirun -n 2 python3 -m mpi4py benchmarks/torch_backend.py --quick              # cpu backend, tiny sizes

Three parts, each rank running the same calls back to back, times of the slowest rank:

- ``all_reduce``: ``dist.all_reduce(t)`` on the default group, ``backend="iris"`` (``iris``), next to
  ``ccl.all_reduce`` on the group's own context (``ccl``: what the adapter adds), torch's
  symmetric-memory one-shot and two-shot all-reduce (the best of them: ``peer``; GPU only, ranks
  sharing the GPU: a gloo group and ``TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1``), the same
  ``dist.all_reduce`` on a gloo group (``gloo``), and the floor (every rank copying its bytes at
  once), per size (``--sizes``) and dtype (``--dtypes``); on the GPU also in a CUDA graph of
  ``--graph`` calls. Every call is checked once.
- ``ddp``: one training step (forward, backward with DDP's bucket all-reduces, SGD) of an MLP
  (``--ddp-width``, ``--ddp-layers``, batch ``--ddp-batch``) under DistributedDataParallel over the
  iris backend and over gloo, and the same step with no DDP (no communication).
- ``host``: microseconds of Python per call, 4 KiB fp32, the kernel launch replaced by a no-op:
  ``ccl.all_reduce`` (``ccl``), the backend's ``allreduce`` and ``wait()`` as torch calls them
  (``backend``) and ``dist.all_reduce`` (``dist``: torch's front adds its own); the backend's
  overhead is ``backend - ccl`` (goal: 2 us or less). On the GPU also the real enqueue.

Writes ``results/torch_backend_<W>ranks[_<G>gpu][_quick].{json,md,png}`` (rank 0).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys

import common
import torch
import torch.distributed as dist
from common import NO_PLOT, KiB, MiB, host_us, human, log_axes, parse_size, pyplot, symm_mem_group

import iris.collectives.distributed as idist  # first: the backend (and the interpreter on CPUs), the rendezvous
from iris.collectives import ccl
from iris.collectives.ccl import _launch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DEFAULT_SIZES = [4 * KiB, 64 * KiB, MiB, 16 * MiB, 256 * MiB]
QUICK_SIZES = [4 * KiB]
REPEATS = 3  # timed loops per measurement; their median counts




def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=lambda s: [parse_size(x) for x in s.split(",")], default=None,
                   help="bytes per rank, e.g. 4K,1M,256M (default 4 KiB .. 256 MiB)")
    p.add_argument("--dtypes", type=lambda s: s.split(","), default=["bf16", "fp32"], help=",".join(DTYPES))
    p.add_argument("--quick", action="store_true", help="tiny sizes and model, one timed call (the cpu backend)")
    p.add_argument("--time-per-point", type=float, default=0.02, help="seconds of calls per measurement")
    p.add_argument("--graph", type=int, default=20, metavar="CALLS", help="calls per CUDA graph (0: no graphs)")
    p.add_argument("--no-gloo-from", type=parse_size, default=64 * MiB, metavar="SIZE",
                   help="time gloo only below this size (it takes tens of ms per call above)")
    p.add_argument("--ddp-width", type=int, default=None, help="MLP width (default 4096; 32 with --quick)")
    p.add_argument("--ddp-layers", type=int, default=4)
    p.add_argument("--ddp-batch", type=int, default=None, help="rows per rank (default 256; 8 with --quick)")
    p.add_argument("--calls", type=int, default=5000, help="host part: calls per measurement")
    p.add_argument("--rounds", type=int, default=5, help="host part: measurements, the median counts")
    p.add_argument("--parts", type=lambda s: s.split(","), default=["all_reduce", "ddp", "host"])
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)
    if args.sizes is None:
        args.sizes = QUICK_SIZES if args.quick else DEFAULT_SIZES
    if args.quick:
        args.calls, args.rounds = min(args.calls, 200), min(args.rounds, 2)
    args.ddp_width = args.ddp_width or (32 if args.quick else 4096)
    args.ddp_batch = args.ddp_batch or (8 if args.quick else 256)
    return args


# --- timing -----------------------------------------------------------------------------------------------

class Timer(common.Timer):
    """:class:`common.Timer` whose host barriers and maximum over ranks go through a gloo group."""

    def __init__(self, ctx, gloo, args):
        super().__init__(ctx, args.time_per_point, args.quick, repeats=REPEATS)
        self.gloo = gloo

    def slowest(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.gloo)
        return t.item()

    def sync(self) -> None:
        """This rank's device work done, then every rank here."""
        if self.cuda:
            torch.cuda.synchronize(self.ctx.device)
        dist.barrier(group=self.gloo)

    barrier = sync

    def graphed(self, fn, per_call: int) -> float | None:
        """Seconds per call of ``fn`` captured ``per_call`` times in one CUDA graph (None off the GPU)."""
        if not self.cuda or per_call < 1:
            return None
        stream = torch.cuda.Stream(self.ctx.device)
        stream.wait_stream(torch.cuda.current_stream(self.ctx.device))
        with torch.cuda.stream(stream):
            fn()  # the plans, on the capture's stream
        torch.cuda.synchronize(self.ctx.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(per_call):
                fn()
        self.sync()  # no rank replays while another still captures
        return self(graph.replay, per_call)


# --- all_reduce -------------------------------------------------------------------------------------------

def peers(ctx, gloo, size: int, dtype, notes: list) -> dict:
    """label -> an all_reduce of the peers on ``size`` bytes of ``dtype`` (in place on their own buffers)."""
    calls = {}
    if ctx.device.type == "cuda":
        try:
            symm_mem, name = symm_mem_group(gloo)
            buf = symm_mem.empty(size // torch.empty((), dtype=dtype).element_size(), dtype=dtype, device=ctx.device)
            symm_mem.rendezvous(buf, name)
            buf.fill_(1)
            out = torch.empty_like(buf)
            ops = torch.ops.symm_mem
            calls["torch one_shot"] = lambda: ops.one_shot_all_reduce_out(buf, "sum", name, out)
            calls["torch two_shot"] = lambda: ops.two_shot_all_reduce_(buf, "sum", name)
        except Exception as exc:  # report and go on without the column
            note = f"torch symm_mem unavailable: {type(exc).__name__}: {exc}"
            if note not in notes:
                notes.append(note)
    return calls


def check_all_reduce(ctx, fn, t: torch.Tensor, group=None) -> bool:
    """Run ``fn`` once on values whose sum is exact; whether every rank got the sum."""
    W = ctx.world_size
    t.copy_((torch.arange(t.numel(), device=t.device) % 5 + ctx.rank).to(t.dtype))
    fn()
    expected = (torch.arange(t.numel(), device=t.device) % 5 * W + W * (W - 1) // 2).to(t.dtype)
    bad = torch.tensor([0.0 if torch.equal(t, expected) else 1.0])
    dist.all_reduce(bad, group=group)
    return bad.item() == 0


def run_all_reduce(ctx, gloo, timer, args, result) -> None:
    W, dev = ctx.world_size, ctx.device
    for size in args.sizes:
        src = torch.ones(max(1, size // 4), device=dev)
        dst = torch.empty_like(src)
        floor_us = timer(lambda: dst.copy_(src)) * 1e6
        for dname in args.dtypes:
            dtype = DTYPES[dname]
            n = max(W, size // torch.empty((), dtype=dtype).element_size())
            t = torch.empty(n, dtype=dtype, device=dev)
            g = torch.empty(n, dtype=dtype, device=dev) if dev.type != "cuda" or size < args.no_gloo_from else None
            calls = {"iris": lambda: dist.all_reduce(t), "ccl": lambda: ccl.all_reduce(ctx, t, t)}
            if g is not None:
                calls["gloo"] = lambda: dist.all_reduce(g, group=gloo)
            point = {"bytes": size, "dtype": dname, "floor_us": floor_us, "us": {}, "graph_us": {}, "correct": {}}
            point["correct"]["iris"] = check_all_reduce(ctx, calls["iris"], t, gloo)
            point["correct"]["ccl"] = check_all_reduce(ctx, calls["ccl"], t, gloo)
            if g is not None:
                point["correct"]["gloo"] = check_all_reduce(ctx, calls["gloo"], g, gloo)
            calls.update(peers(ctx, gloo, size, dtype, result["notes"]))
            for label, fn in calls.items():
                point["us"][label] = timer(fn) * 1e6
                if label != "gloo":
                    try:
                        graphed = timer.graphed(fn, args.graph)
                    except Exception as exc:  # a peer that cannot be captured: keep its eager time
                        result["notes"].append(f"{label} at {human(size)} {dname} in a graph: {type(exc).__name__}")
                        graphed = None
                    if graphed is not None:
                        point["graph_us"][label] = graphed * 1e6
            result["points"].append(point)
            if ctx.rank == 0:
                times = ", ".join(f"{k} {v:.1f}" for k, v in point["us"].items())
                print(f"all_reduce {dname} {human(size):>5}: {times} us", flush=True)
            timer.sync()


# --- DDP --------------------------------------------------------------------------------------------------

def run_ddp(ctx, gloo, timer, args, result) -> None:
    dev = ctx.device
    dtype = torch.float32

    def model():
        torch.manual_seed(0)
        layers = []
        for _ in range(args.ddp_layers):
            layers += [torch.nn.Linear(args.ddp_width, args.ddp_width), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers[:-1]).to(dtype).to(dev)

    x = torch.randn(args.ddp_batch, args.ddp_width, dtype=dtype, device=dev)
    ids = [dev.index] if dev.type == "cuda" else None
    steps = {}
    for label, group in (("iris", dist.group.WORLD), ("gloo", gloo), ("no ddp", None)):
        net = model() if group is None else torch.nn.parallel.DistributedDataParallel(model(), device_ids=ids,
                                                                                       process_group=group)
        opt = torch.optim.SGD(net.parameters(), lr=1e-3)

        def step(net=net, opt=opt):
            opt.zero_grad(set_to_none=True)
            net(x).square().mean().backward()
            opt.step()

        steps[label] = timer(step) * 1e6
        if ctx.rank == 0:
            print(f"ddp step, {label}: {steps[label]:.1f} us", flush=True)
        del net, opt
        timer.sync()
    params = sum(p.numel() for p in model().parameters())
    result["ddp"] = {"step_us": steps, "params": params, "width": args.ddp_width, "layers": args.ddp_layers,
                     "batch": args.ddp_batch, "dtype": "fp32"}


# --- host -------------------------------------------------------------------------------------------------

class NoLaunch:
    """A launch that enqueues nothing, with the interface of the plans' launches (``_launch``)."""

    fast = __call__ = staticmethod(lambda *args: None)



def run_host(ctx, gloo, timer, args, result) -> None:
    cuda = ctx.device.type == "cuda"
    t = torch.ones(1024, device=ctx.device)
    pg = dist.group.WORLD
    options = dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp.SUM
    calls = {"ccl": lambda: ccl.all_reduce(ctx, t, t), "backend": lambda: pg.allreduce([t], options).wait(),
             "dist": lambda: dist.all_reduce(t)}
    for fn in calls.values():
        fn()  # plans and kernels: not timed
    timer.sync()
    rows = {label: {"dispatch": [], "enqueue": []} for label in calls}
    real_launcher = _launch.launcher
    _launch.launcher = lambda *a, **k: (real_launcher(*a, **k), NoLaunch())[1]
    try:
        _launch.forget(ctx)
        for fn in calls.values():
            fn()  # a plan whose launch is the no-op
        # the rounds of the three paths interleaved, so that a busy stretch of the host weighs on all
        for _ in range(args.rounds):
            for label, fn in calls.items():
                rows[label]["dispatch"].append(host_us(fn, args.calls, False))
    finally:
        _launch.launcher = real_launcher
        _launch.forget(ctx)
    timer.sync()
    if cuda:
        for fn in calls.values():
            fn()
        for _ in range(args.rounds):
            for label, fn in calls.items():
                timer.sync()  # every rank enqueues the same calls: their counters stay matched
                rows[label]["enqueue"].append(host_us(fn, min(args.calls, 2000), True))
        timer.sync()
    for label, row in rows.items():
        samples = {key: values for key, values in row.items() if values}
        rows[label] = {}
        for key, values in samples.items():
            rows[label][f"{key}_us"] = timer.slowest(statistics.median(values))
            rows[label][f"{key}_min_us"] = timer.slowest(min(values))
    result["host"] = {"rows": rows, "calls": args.calls, "rounds": args.rounds,
                      "overhead_us": rows["backend"]["dispatch_us"] - rows["ccl"]["dispatch_us"],
                      "overhead_min_us": rows["backend"]["dispatch_min_us"] - rows["ccl"]["dispatch_min_us"]}
    if ctx.rank == 0:
        print(f"host: {rows}", flush=True)


# --- results ----------------------------------------------------------------------------------------------

def _peer(times: dict):
    values = [v for k, v in times.items() if k.startswith("torch")]
    return min(values) if values else None


def _ratio(a, b) -> str:
    return f"{a / b:8.2f}" if a is not None and b else f"{'-':>8}"


def _us(v, ok=True) -> str:
    return f"{'-':>8}" if v is None else f"{v:>7.1f}{' ' if ok else '*'}"


def table(result: dict) -> str:
    lines = [f"{result['world_size']} ranks, {result['device']} ({result['ranks_per_gpu']} per GPU), {result['date']}; "
             f"us per call, slowest rank (* = wrong result); iris = dist.all_reduce through backend='iris', ccl = "
             f"ccl.all_reduce on its context, peer = torch symm_mem (best of one/two-shot), gloo = dist.all_reduce on "
             f"a gloo group, floor = every rank copying its bytes once; graph = in a CUDA graph of "
             f"{result['graph_calls']} calls"]
    head = (f"{'size':>6} {'iris':>8} {'ccl':>8} {'peer':>8} {'gloo':>8} {'floor':>8} {'g.iris':>8} {'g.peer':>8} "
            f"{'iris/ccl':>8} {'iris/pr':>8} {'iris/flr':>8} {'g.i/g.p':>8}")
    for dname in result["dtypes"]:
        points = [p for p in result["points"] if p["dtype"] == dname]
        if not points:
            continue
        lines += ["", f"all_reduce, {dname}", head]
        for p in points:
            us, g, ok = p["us"], p["graph_us"], p["correct"]
            lines.append(f"{human(p['bytes']):>6} " + _us(us.get("iris"), ok.get("iris", True))
                         + _us(us.get("ccl"), ok.get("ccl", True)) + _us(_peer(us))
                         + _us(us.get("gloo"), ok.get("gloo", True)) + _us(p["floor_us"]) + _us(g.get("iris"))
                         + _us(_peer(g)) + _ratio(us.get("iris"), us.get("ccl")) + _ratio(us.get("iris"), _peer(us))
                         + _ratio(us.get("iris"), p["floor_us"]) + _ratio(g.get("iris"), _peer(g)))
    if "ddp" in result:
        d = result["ddp"]
        lines += ["", f"DDP training step, MLP {d['layers']} x {d['width']} ({d['params']} parameters, fp32), batch "
                      f"{d['batch']} per rank: us per step",
                  "| iris | gloo | no DDP | iris/gloo | iris - no DDP |", "| --- | --- | --- | --- | --- |"]
        s = d["step_us"]
        lines.append(f"| {s['iris']:.1f} | {s['gloo']:.1f} | {s['no ddp']:.1f} | {s['iris'] / s['gloo']:.2f} | "
                     f"{s['iris'] - s['no ddp']:.1f} |")
    if "host" in result:
        h = result["host"]
        lines += ["", f"host us per all_reduce call, 4 KiB fp32 (median and best of {h['rounds']} interleaved rounds "
                      f"of {h['calls']} calls, slowest rank); dispatch = the launch replaced by a no-op",
                  "| path | dispatch | dispatch, best | enqueue (real launch) |", "| --- | --- | --- | --- |"]
        names = {"ccl": "ccl.all_reduce", "backend": "backend: pg.allreduce + wait()", "dist": "dist.all_reduce"}
        for key, row in h["rows"].items():
            enqueue = f"{row['enqueue_us']:.2f}" if "enqueue_us" in row else "- (GPU only)"
            lines.append(f"| {names[key]} | {row['dispatch_us']:.2f} | {row['dispatch_min_us']:.2f} | {enqueue} |")
        lines.append(f"backend overhead over ccl: {h['overhead_us']:.2f} us per call (median; best "
                     f"{h['overhead_min_us']:.2f}; goal <= 2 us)")
    lines += [f"note: {note}" for note in result["notes"]]
    return "\n".join(lines)


def plot(result: dict, path: str) -> str | None:
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    dnames = [d for d in result["dtypes"] if any(p["dtype"] == d for p in result["points"])]
    if not dnames:
        return "no all_reduce points: no plot"
    fig, axes = plt.subplots(1, len(dnames), figsize=(5 * len(dnames), 3.8), squeeze=False)
    for ax, dname in zip(axes[0], dnames):
        points = [p for p in result["points"] if p["dtype"] == dname]
        sizes = [p["bytes"] for p in points]
        for key, style in (("us", "-"), ("graph_us", ":")):
            for label in dict.fromkeys(k for p in points for k in p[key]):
                ax.plot(sizes, [p[key].get(label) for p in points], style, marker="o", markersize=3,
                        label=label + (" (graph)" if key == "graph_us" else ""))
        ax.plot(sizes, [p["floor_us"] for p in points], "k--", label="floor")
        log_axes(ax, "bytes per rank", f"dist.all_reduce, {dname}, {result['world_size']} ranks")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def save(args, result: dict) -> None:
    os.makedirs(args.out, exist_ok=True)
    W, shared = result["world_size"], result["ranks_per_gpu"]
    gpus = f"_{W // shared}gpu" if result["backend"] == "cuda" and shared > 1 else ""
    stem = os.path.join(args.out, f"torch_backend_{W}ranks{gpus}{'_quick' if args.quick else ''}")
    why_no_plot = plot(result, stem + ".png")
    if why_no_plot:
        result["notes"].append(why_no_plot)
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    text = table(result)
    with open(stem + ".md", "w") as f:
        f.write(f"The iris backend of torch.distributed, {W} ranks on {result['device']} (`{result['command']}`):\n\n"
                f"```text\n{text}\n```\n")
    print(text)
    print(f"wrote {stem}.json, .md and .png", flush=True)


def main(argv=None) -> None:
    args = parse_args(argv)
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dist.init_process_group(backend="iris", pg_options=idist.Options(heap_size=max(1 << 26, 4 * max(args.sizes))))
    ctx = idist.context_of()
    gloo = dist.new_group(backend="gloo")
    timer = Timer(ctx, gloo, args)
    cuda = ctx.device.type == "cuda"
    result = {"world_size": ctx.world_size, "ranks_per_gpu": ctx.ranks_on_device, "backend": ctx.device.type,
              "device": torch.cuda.get_device_name(ctx.device) if cuda else "cpu (interpreter)",
              "bootstrap": ctx.bootstrap, "torch": torch.__version__, "dtypes": args.dtypes, "graph_calls": args.graph,
              "date": datetime.date.today().isoformat(),
              "command": " ".join(["benchmarks/torch_backend.py", *sys.argv[1:]]),
              "points": [], "notes": []}
    if not cuda:
        result["notes"].append("cpu backend (Triton's interpreter): times show the code path works, not performance; "
                               "the host part's dispatch times hold on any backend")
    for part, run in (("all_reduce", run_all_reduce), ("ddp", run_ddp), ("host", run_host)):
        if part in args.parts:
            run(ctx, gloo, timer, args, result)
    timer.sync()
    dist.destroy_process_group()
    if ctx.rank == 0:
        save(args, result)


if __name__ == "__main__":
    main()
