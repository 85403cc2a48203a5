"""Point to point: how fast are ``ccl.send`` / ``ccl.recv`` between two ranks, next to what a user would call instead?

    mpirun -n 2 python3 -m mpi4py benchmarks/p2p.py                          # two ranks (one GPU each, or sharing one)
    mpirun --allow-run-as-root --oversubscribe -n 2 python3 -m mpi4py benchmarks/p2p.py   # both on one GPU (MPS)
    mpirun -n 2 python3 -m mpi4py benchmarks/p2p.py --quick                  # cpu backend, tiny sizes

Rank 0 and rank 1 exchange messages (other ranks only keep step). Microseconds, the slowest rank's
(the median of three timed loops), fp32 tensors that are not on the heap (the user's case, column
``ccl``) and, beside them, tensors on the symmetric heap on both ends (column ``heap``: a message
larger than an inbox is then copied once, pulled from the sender's tensor; ``--no-heap`` skips it)
and, for messages larger than an inbox on the GPU, plain tensors registered on both ends (column
``reg``, ``ctx.register``: copied once too; ``--no-registered`` skips it):

- latency (``--latency-sizes``, default 4 B .. 1 MiB): a ping-pong, rank 0 sends and receives the
  answer, rank 1 receives and answers; half a round trip per message, eager and in a CUDA graph of
  ``--graph`` round trips. Beside it, an empty Triton kernel replayed in a graph (what a launch
  costs there; the goal: a message in a graph within 2x of it below 64 KiB);
- bandwidth (``--bandwidth-sizes``, default 1 MiB .. 1 GiB): rank 0 sends messages back to back,
  rank 1 receives them; time per message, eager and in a graph, and GB/s; the floor is one copy of
  the message on one rank (``dst.copy_(src)``, the other idle: what moving the bytes costs at
  least); the goal: within 1.2x of it from 64 MiB.

The peer does the same with what a user would call instead: NCCL's ``send``/``recv`` with one rank
per GPU; with ranks sharing a GPU (NCCL refuses that), torch's symmetric memory: a copy into the
peer's buffer (``get_buffer``) and ``put_signal``, ``wait_signal`` and a copy out on the receiver,
which answers with a signal of its own before the next message. ``ccl.broadcast`` of the same bytes
is the second column on every backend. Every message is checked once before it is timed.
Writes ``results/p2p_<W>ranks[_<G>gpu][_quick].{json,md,png}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch
import triton
from common import NO_PLOT, GiB, KiB, MiB, Timer, TorchPeer, human, parse_size, pyplot

import iris.runtime  # first: picks the backend (and the interpreter on CPUs) before any kernel
from iris.collectives import ccl

LATENCY_SIZES = [4, 64, KiB, 16 * KiB, 64 * KiB, 256 * KiB, MiB]
BANDWIDTH_SIZES = [MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, GiB]
QUICK = dict(latency=[4, 4 * KiB], bandwidth=[64 * KiB])




def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sizes = lambda s: [parse_size(x) for x in s.split(",")]
    p.add_argument("--latency-sizes", type=sizes, default=None, help="bytes per message, e.g. 4,1K,1M")
    p.add_argument("--bandwidth-sizes", type=sizes, default=None, help="bytes per message, e.g. 1M,64M,1G")
    p.add_argument("--quick", action="store_true", help="tiny sizes, one timed call (runs on the cpu backend)")
    p.add_argument("--time-per-point", type=float, default=0.05, help="seconds of calls per measurement")
    p.add_argument("--graph", type=int, default=20, metavar="CALLS", help="messages per CUDA graph (0: no graphs)")
    p.add_argument("--slots", type=int, default=None, help="ccl.init_p2p(slots=...)")
    p.add_argument("--chunk-bytes", type=parse_size, default=None, help="ccl.init_p2p(chunk_bytes=...)")
    p.add_argument("--grid", type=int, default=None, help="ccl.init_p2p(grid=...)")
    p.add_argument("--block-bytes", type=parse_size, default=None, help="ccl.init_p2p(block_bytes=...)")
    p.add_argument("--num-warps", type=int, default=None, help="ccl.init_p2p(num_warps=...)")
    p.add_argument("--no-peer", action="store_true", help="skip NCCL / torch symm_mem")
    p.add_argument("--no-heap", action="store_true", help="skip the heap-tensor column")
    p.add_argument("--no-registered", action="store_true",
                   help="skip the registered-tensor column (bandwidth; GPU only: the other backends register heap "
                        "tensors alone)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)
    if args.latency_sizes is None:
        args.latency_sizes = QUICK["latency"] if args.quick else LATENCY_SIZES
    if args.bandwidth_sizes is None:
        args.bandwidth_sizes = QUICK["bandwidth"] if args.quick else BANDWIDTH_SIZES
    if args.quick and args.chunk_bytes is None:
        args.chunk_bytes = 16 * KiB  # the quick bandwidth message flows through the inbox in chunks
    return args


@triton.jit
def empty_kernel(x):
    """Does nothing: its launch is what any Triton launch costs."""
    pass


# --- what each side calls ---------------------------------------------------------------------------------

class Pair:
    """The tensors of one size on ranks 0 and 1 and the calls on them: ``pingpong[label]`` (one
    round trip) and ``stream[label]`` (one message from rank 0 to rank 1), for ``ccl`` (plain
    tensors), ``heap`` (heap tensors, with ``heap``), the ``bcast`` column and the peer's; other
    ranks call nothing (``ccl.broadcast`` excepted: a collective). Call :meth:`close` on every rank
    (it frees the heap tensors, which every rank allocates alike)."""

    def __init__(self, ctx, nbytes: int, peer, heap: bool = True, registered: bool = False):
        self.ctx, self.nbytes = ctx, nbytes
        r, dev = ctx.rank, ctx.device
        n = max(1, nbytes // 4)
        self.x = (torch.arange(n, device=dev) % 251 + 1000 * r).float()
        self.y = torch.empty(n, device=dev)
        active = r < 2
        other = 1 - r
        nothing = lambda: None

        def pingpong(x, y):
            def run():
                if r == 0:
                    ccl.send(ctx, x, 1)
                    ccl.recv(ctx, y, 1)
                elif r == 1:
                    ccl.recv(ctx, y, 0)
                    ccl.send(ctx, x, 0)
            return run if active else nothing

        def stream(x, y):
            def run():
                if r == 0:
                    ccl.send(ctx, x, 1)
                elif r == 1:
                    ccl.recv(ctx, y, 0)
            return run if active else nothing

        self.b = self.x.clone()

        def bcast_pingpong():
            ccl.broadcast(ctx, self.b, 0)
            ccl.broadcast(ctx, self.b, 1)

        self.pingpong = {"ccl": pingpong(self.x, self.y), "bcast": bcast_pingpong}
        self.stream = {"ccl": stream(self.x, self.y), "bcast": lambda: ccl.broadcast(ctx, self.b, 0)}
        self.heap = None
        if heap:  # the same message between heap tensors (ctx.zeros: every rank alike)
            self.heap = (ctx.zeros(n), ctx.zeros(n))
            self.heap[0].copy_(self.x)
            self.pingpong["heap"] = pingpong(*self.heap)
            self.stream["heap"] = stream(*self.heap)
        self.reg, self.registrations = None, []
        if registered:  # plain tensors on both ends, registered (ctx.register: collective, every rank alike)
            self.reg = (torch.empty(n, device=dev), torch.empty(n, device=dev))
            self.reg[0].copy_(self.x)
            self.registrations = [ctx.register(t) for t in self.reg]
            self.stream["reg"] = stream(*self.reg)
        if peer.kind == "torch symm_mem":
            self.symm = peer.symmetric(self)  # collective: every rank of the group takes part
        if peer.kind is not None and active:
            self.pingpong.update(peer.pingpong(self, other))
            self.stream.update(peer.stream(self, other))
        elif peer.kind is not None:
            self.pingpong.update({peer.kind: nothing})
            self.stream.update({peer.kind: nothing})

    def check(self) -> bool:
        """One ping-pong with ccl (plain tensors, and heap tensors): each of ranks 0 and 1 got the
        other's tensor."""
        r, ok = self.ctx.rank, True
        expected = (torch.arange(self.y.numel(), device=self.y.device) % 251 + 1000 * (1 - r)).float()
        for label, y in (("ccl", self.y), ("heap", None if self.heap is None else self.heap[1])):
            if y is not None:
                y.fill_(-1)
                self.pingpong[label]()
                ok = ok and (r > 1 or torch.equal(y, expected))
        if self.reg is not None:  # one message from rank 0 to rank 1 between the registered tensors
            self.reg[1].fill_(-1)
            self.stream["reg"]()
            ok = ok and (r != 1 or torch.equal(self.reg[1], expected))
        return self.ctx.comm.allreduce(int(not ok)) == 0

    def close(self) -> None:
        """Close the registrations and free the heap tensors (every rank, in the same order)."""
        for registration in reversed(self.registrations):
            registration.close()
        self.registrations, self.reg = [], None
        if self.heap is not None:
            for t in reversed(self.heap):
                self.ctx.free(t)
            self.heap = None


class Peer(TorchPeer):
    """NCCL (one rank per GPU) or torch's symmetric memory (ranks sharing a GPU), or why not."""

    def symmetric(self, pair):
        """A symmetric buffer of the message's size and its handle (collective over the group):
        the peer's buffer to copy into (``get_buffer``), this rank's to copy out of, and the
        handle's signals (channel 0: a message is there, channel 1: the receiver's answer)."""
        buf = self.symm_mem.empty(pair.x.numel(), dtype=torch.float32, device=pair.x.device)
        handle = self.symm_mem.rendezvous(buf, self.group)
        return buf, handle

    def pingpong(self, pair, other: int) -> dict:
        r, x, y = self.ctx.rank, pair.x, pair.y
        if self.kind == "nccl":
            d = self.dist

            def nccl_pingpong():
                if r == 0:
                    d.send(x, 1)
                    d.recv(y, 1)
                else:
                    d.recv(y, 0)
                    d.send(x, 0)
            return {"nccl": nccl_pingpong}
        buf, handle = pair.symm
        theirs = handle.get_buffer(other, (x.numel(),), torch.float32)

        def put(dst):
            theirs.copy_(x)
            handle.put_signal(dst, 0)

        def take(src):
            handle.wait_signal(src, 0)
            y.copy_(buf)

        def symm_pingpong():
            if r == 0:
                put(1)
                take(1)
            else:
                take(0)
                put(0)
        return {"torch symm_mem": symm_pingpong}

    def stream(self, pair, other: int) -> dict:
        r, x, y = self.ctx.rank, pair.x, pair.y
        if self.kind == "nccl":
            d = self.dist
            return {"nccl": (lambda: d.send(x, 1)) if r == 0 else (lambda: d.recv(y, 0))}
        buf, handle = pair.symm
        theirs = handle.get_buffer(other, (x.numel(),), torch.float32)
        state = {"first": True}

        def send():  # the receiver's answer (channel 1) says its buffer may be written again
            if not state["first"]:
                handle.wait_signal(1, 1)
            state["first"] = False
            theirs.copy_(x)
            handle.put_signal(1, 0)

        def recv():
            handle.wait_signal(0, 0)
            y.copy_(buf)
            handle.put_signal(0, 1)
        return {"torch symm_mem": send if r == 0 else recv}


def copy_seconds(ctx, timer, nbytes: int) -> float:
    """Seconds for rank 0 alone to copy ``nbytes`` (``dst.copy_(src)``): the floor of a message."""
    src = torch.ones(max(1, nbytes // 4), device=ctx.device)
    dst = torch.empty_like(src)
    return timer(lambda: dst.copy_(src) if ctx.rank == 0 else None)


def empty_graph_seconds(ctx, timer, calls: int) -> float | None:
    """Seconds per empty Triton kernel replayed in a CUDA graph of ``calls`` launches."""
    x = torch.empty(1, device=ctx.device)
    return timer.graphed(lambda: empty_kernel[(1,)](x), calls)


def time_point(timer, args, point: dict, calls: dict, halve: bool) -> None:
    for label, fn in calls.items():
        scale = 0.5 if halve else 1.0  # a round trip is two messages
        try:
            point["eager_us"][label] = timer(fn) * 1e6 * scale
            graphed = timer.graphed(fn, args.graph)
            if graphed is not None:
                point["graph_us"][label] = graphed * 1e6 * scale
        except Exception as exc:  # a peer that cannot be captured keeps its eager time
            point.setdefault("notes", []).append(f"{label}: {type(exc).__name__}: {exc}")


def mailboxes(ctx, args):
    """``ccl.init_p2p`` with the settings the command line names (the library's defaults for the rest)."""
    named = {"slots": args.slots, "chunk_bytes": args.chunk_bytes, "grid": args.grid, "block_bytes": args.block_bytes,
             "num_warps": args.num_warps}
    return ccl.init_p2p(ctx, tags=1, **{k: v for k, v in named.items() if v is not None})


def run(args) -> dict:
    largest = max(args.latency_sizes + args.bandwidth_sizes)
    # the broadcast's workspace and, for the heap column, two heap tensors of the largest message
    ctx = iris.runtime.iris(heap_size=max(1 << 26, (2 if args.no_heap else 4) * largest + (1 << 26)))
    backend, W = ctx.device.type, ctx.world_size
    if W < 2:
        raise SystemExit("benchmarks/p2p.py needs at least 2 ranks (mpirun -n 2 ...)")
    settings = mailboxes(ctx, args)
    timer, peer = Timer(ctx, args.time_per_point, args.quick, max_iters=1000), Peer(ctx, not args.no_peer)
    notes = [peer.reason] if peer.reason else []
    # plain tensors registered on both ends: the single copy of a large message without the heap
    registered = backend == "cuda" and not args.no_registered
    inbox_bytes = settings.slots * settings.chunk_bytes
    if not registered:
        notes.append("reg column: " + ("--no-registered" if args.no_registered else
                                       "plain tensors are registered on the GPU only"))
    if backend != "cuda":
        notes.append("cpu backend (Triton's interpreter): times show the code path works, not performance")
    empty_us = empty_graph_seconds(ctx, timer, args.graph)
    result = {"world_size": W, "ranks_per_gpu": ctx.ranks_on_device, "backend": backend,
              "device": torch.cuda.get_device_name(ctx.device) if backend == "cuda" else "cpu (interpreter)",
              "peer": peer.kind, "graph_calls": args.graph, "date": datetime.date.today().isoformat(),
              "mailboxes": {k: getattr(settings, k) for k in ("slots", "chunk_bytes", "block_bytes", "grid",
                                                                        "num_warps")},
              "empty_graph_us": None if empty_us is None else empty_us * 1e6,
              "command": " ".join(["benchmarks/p2p.py", *sys.argv[1:]]), "latency": [], "bandwidth": [],
              "notes": notes}
    for kind, sizes in (("latency", args.latency_sizes), ("bandwidth", args.bandwidth_sizes)):
        for size in sizes:
            pair = Pair(ctx, size, peer, heap=not args.no_heap,
                        registered=registered and kind == "bandwidth" and size > inbox_bytes)
            point = {"bytes": size, "eager_us": {}, "graph_us": {}, "correct": pair.check()}
            if kind == "bandwidth":
                point["floor_us"] = copy_seconds(ctx, timer, size) * 1e6
            time_point(timer, args, point, pair.pingpong if kind == "latency" else pair.stream, kind == "latency")
            result[kind].append(point)
            if ctx.rank == 0:
                e, g, nan = point["eager_us"], point["graph_us"], float("nan")
                print(f"{kind:>9} {human(size):>9} ccl {e.get('ccl', nan):10.1f} us (graph {g.get('ccl', nan):.1f}), "
                      f"heap {e.get('heap', nan):.1f} us (graph {g.get('heap', nan):.1f})", flush=True)
            pair.close()
            del pair
            ctx.barrier()
            ccl.clear_workspaces(ctx)  # the broadcast's workspaces, one size at a time
            mailboxes(ctx, args)
    ctx.close()
    return result


def _div(a, b):
    return a / b if a is not None and b else None


def _cell(v, width=8, digits=1) -> str:
    return f"{'-':>{width}}" if v is None else f"{v:>{width}.{digits}f}"


def _timed(v, correct: bool) -> str:
    """A time with its check: ``*`` marks a wrong result."""
    return f"{'-':>7}" if v is None else f"{v:>7.1f}{' ' if correct else '*'}"


def table(result: dict) -> str:
    peer, empty = result["peer"] or "peer", result["empty_graph_us"]
    mb = result["mailboxes"]
    lines = [f"{result['world_size']} ranks, {result['device']} ({result['ranks_per_gpu']} per GPU), {result['date']};"
             f" us per message, slowest rank (* = wrong result); graph = in a CUDA graph of {result['graph_calls']} "
             f"messages; peer = {peer}; mailboxes: {mb['slots']} x {human(mb['chunk_bytes'])} chunks, tiles of "
             f"{human(mb['block_bytes'])}, grid {mb['grid']}, {mb.get('num_warps', 4)} warps", "",
             "latency: half a ping-pong round trip" + ("" if empty is None else f"; an empty kernel in a graph: "
                                                       f"{empty:.1f} us"),
             f"{'size':>9} {'ccl':>8} {'graph':>8} {'heap':>8} {'h.graph':>8} {'peer':>8} {'p.graph':>8}"
             f" {'bcast':>8} {'b.graph':>8} {'ccl/peer':>8} {'grph/pg':>8} {'grph/mty':>8} {'hgr/mty':>8}"]
    for p in result["latency"]:
        e, g = p["eager_us"], p["graph_us"]
        lines.append(f"{human(p['bytes']):>9} {_timed(e.get('ccl'), p['correct'])} "
                     + " ".join(_cell(v) for v in (g.get("ccl"), e.get("heap"), g.get("heap"), e.get(peer),
                                                   g.get(peer), e.get("bcast"), g.get("bcast")))
                     + " " + " ".join(_cell(v, digits=2) for v in (_div(e.get("ccl"), e.get(peer)),
                                                                   _div(g.get("ccl"), g.get(peer)),
                                                                   _div(g.get("ccl"), empty),
                                                                   _div(g.get("heap"), empty))))
    lines += ["", "bandwidth: messages back to back; floor = one copy of the message on one rank; heap = "
              "heap tensors on both ends (copied once from more than an inbox); reg = plain tensors registered on "
              "both ends (ctx.register: copied once too)",
              f"{'size':>9} {'ccl':>8} {'graph':>8} {'GB/s':>8} {'heap':>8} {'h.graph':>8} {'reg':>8} {'peer':>8}"
              f" {'bcast':>8} {'floor':>8} {'ccl/flr':>8} {'grph/flr':>8} {'heap/flr':>8} {'hgr/flr':>8} {'reg/flr':>8}"
              f" {'ccl/peer':>8}"]
    for p in result["bandwidth"]:
        e, g = p["eager_us"], p["graph_us"]
        gbps = _div(p["bytes"] / 1e3, e.get("ccl"))
        lines.append(f"{human(p['bytes']):>9} {_timed(e.get('ccl'), p['correct'])} "
                     + " ".join(_cell(v) for v in (g.get("ccl"), gbps, e.get("heap"), g.get("heap"), e.get("reg"),
                                                   e.get(peer), e.get("bcast"), p["floor_us"]))
                     + " " + " ".join(_cell(v, digits=2) for v in (_div(e.get("ccl"), p["floor_us"]),
                                                                   _div(g.get("ccl"), p["floor_us"]),
                                                                   _div(e.get("heap"), p["floor_us"]),
                                                                   _div(g.get("heap"), p["floor_us"]),
                                                                   _div(e.get("reg"), p["floor_us"]),
                                                                   _div(e.get("ccl"), e.get(peer)))))
    notes = list(result["notes"]) + [f"{human(p['bytes'])}: {n}" for k in ("latency", "bandwidth")
                                     for p in result[k] for n in p.get("notes", [])]
    lines += [f"note: {note}" for note in notes]
    return "\n".join(lines)


def plot(result: dict, path: str) -> str | None:
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, kind in zip(axes, ("latency", "bandwidth")):
        points = result[kind]
        sizes = [p["bytes"] for p in points]
        for key, style in (("eager_us", "-"), ("graph_us", ":")):
            for label in dict.fromkeys(k for p in points for k in p[key]):
                ax.plot(sizes, [p[key].get(label) for p in points], style, marker="o", markersize=3,
                        label=label + (" (graph)" if key == "graph_us" else ""))
        if kind == "bandwidth":
            ax.plot(sizes, [p["floor_us"] for p in points], "k--", label="floor (one copy)")
        elif result["empty_graph_us"] is not None:
            ax.axhline(result["empty_graph_us"], color="k", linestyle="--", label="empty kernel (graph)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes per message")
        ax.set_ylabel("us per message")
        ax.set_title(f"send/recv {kind}, {result['device']}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def save(args, result: dict) -> None:
    os.makedirs(args.out, exist_ok=True)
    W, shared = result["world_size"], result["ranks_per_gpu"]
    gpus = f"_{W // shared}gpu" if result["backend"] == "cuda" and shared > 1 else ""
    stem = os.path.join(args.out, f"p2p_{W}ranks{gpus}{'_quick' if args.quick else ''}")
    why_no_plot = plot(result, stem + ".png")
    if why_no_plot:
        result = dict(result, notes=[*result["notes"], why_no_plot])
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    text = table(result)
    with open(stem + ".md", "w") as f:
        f.write(f"Point to point, {W} ranks on {result['device']} (`{result['command']}`):\n\n```text\n{text}\n```\n")
    print(text)
    print(f"wrote {stem}.json, .md and .png", flush=True)


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        result = run(args)
    except BaseException:
        import traceback

        print(f"p2p.py failed on this rank:\n{traceback.format_exc()}", flush=True)
        raise
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() == 0:
        save(args, result)


if __name__ == "__main__":
    main()
