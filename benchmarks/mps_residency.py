"""Are W ranks' grids resident together on one GPU when ``resident_grid`` says they fit?

The tile collectives rely on it: a program that waits for the same tile's program on another rank
only finishes if that program runs at the same time. ``Iris.resident_grid`` sizes each rank's grid
so that, by the per-SM arithmetic (registers, warps, shared memory), every rank's launch fits on
the GPU at once. This probe checks that arithmetic where it matters, with several processes on one
GPU under MPS:

    mpirun -n 8 python -m mpi4py benchmarks/mps_residency.py [--warps 4,16] [--fill 1.0] [--trials 5]

Every program of every rank adds 1 to one counter on rank 0's heap, then polls it until all
``W x grid`` programs have arrived or ``--timeout`` seconds have passed, and records the count it
saw last. If every program saw the full count, all grids were resident together. It is measured
for each launch mode a benchmark uses: plain launches, programmatic dependent launches (PDL) of
two kernels back to back, and the same two kernels replayed from a CUDA graph. The ranks launch
at staggered times (rank x ``--stagger`` ms), as they do after host work of different lengths.
Writes ``mps_residency_<W>ranks.{json,md}`` and, where matplotlib is installed, a ``.png``
(``--plot results.json`` draws it later from the JSON, on any machine).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

import iris.runtime
from iris.device import DeviceContext, device_clock_ns


@triton.jit
def arrive_and_wait(context, counter, seen_out, payload, target, timeout_ns, rank: tl.constexpr,
                    world_size: tl.constexpr, PDL: tl.constexpr, PAYLOAD: tl.constexpr):
    """Count this program on rank 0's ``counter``; poll until ``target`` programs arrived (or the
    timeout); store the last count seen at ``seen_out[pid]``. ``PAYLOAD`` floats stay live in
    registers across the wait (as a collective's tile does), to give the program a collective's
    register footprint."""
    if PDL:
        gdc_wait()
    data = tl.load(payload + tl.arange(0, PAYLOAD))
    ctx = DeviceContext.initialize(context, rank, world_size)
    seen = ctx.atomic_add(counter, 1, 0, sem="release", scope="sys") + 1
    start = device_clock_ns()
    while (seen < target) & (device_clock_ns() - start < timeout_ns):
        seen = ctx.load(counter, 0, volatile=True)
    tl.store(seen_out + tl.program_id(0), seen)
    tl.store(payload + tl.arange(0, PAYLOAD), data + seen.to(tl.float32), mask=seen < 0)  # keeps data live
    if PDL:
        gdc_launch_dependents()


def trial(heap, mode: str, warps: int, fill: float, payload_floats: int, args) -> dict:
    """One trial: every rank launches (plain, PDL pair or graph of a PDL pair) and reports."""
    W, rank = heap.world_size, heap.rank
    counters = heap.zeros(2, dtype=torch.int32)
    seen = torch.zeros(4096, dtype=torch.int32, device=heap.device)
    pdl = mode != "plain"
    payload = torch.zeros(payload_floats, device=heap.device)
    probe = arrive_and_wait.warmup(heap.get_device_context(), counters, seen, payload, 1, 1, rank=rank,
                                   world_size=W, PDL=pdl, PAYLOAD=payload_floats, num_warps=warps, launch_pdl=pdl,
                                   grid=(1,))
    full = heap.resident_grid(4096, probe)
    grid = max(1, int(full * fill))
    target = W * grid
    timeout_ns = int(args.timeout * 1e9)

    def launch(counter, out):
        arrive_and_wait[(grid,)](heap.get_device_context(), counter, out, payload, target, timeout_ns, rank=rank,
                                 world_size=W, PDL=pdl, PAYLOAD=payload_floats, num_warps=warps, launch_pdl=pdl)

    kernels = 1 if mode == "plain" else 2
    seen2 = torch.zeros_like(seen)
    if mode == "graph":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
            launch(counters[0:1], seen)
            launch(counters[1:2], seen2)
    heap.barrier()
    time.sleep(rank * args.stagger / 1e3)
    t0 = time.perf_counter()
    if mode == "graph":
        graph.replay()
    else:
        launch(counters[0:1], seen)
        if kernels == 2:
            launch(counters[1:2], seen2)
    torch.cuda.synchronize(heap.device)
    seconds = time.perf_counter() - t0
    lows = [int(seen[:grid].min())] + ([int(seen2[:grid].min())] if kernels == 2 else [])
    lows = [min(v) for v in zip(*heap.comm.allgather(lows))]
    seconds = max(heap.comm.allgather(seconds))
    heap.barrier()
    heap.free(counters)
    per_sm = iris.runtime.programs_per_sm(probe, heap.device)
    return {"mode": mode, "warps": warps, "payload": payload_floats, "regs": probe.n_regs, "per_sm": per_sm,
            "grid": grid, "target": target, "least_seen": lows, "seconds": seconds,
            "all_resident": all(v >= target for v in lows)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--warps", type=lambda s: [int(x) for x in s.split(",")], default=[4, 16])
    p.add_argument("--fill", type=lambda s: [float(x) for x in s.split(",")], default=[1.0],
                   help="grid as a fraction of resident_grid's, comma-separated")
    p.add_argument("--modes", type=lambda s: s.split(","), default=["plain", "pdl", "graph"])
    p.add_argument("--payload", type=int, default=32,
                   help="floats per thread kept live across the wait (raises the registers per program)")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--timeout", type=float, default=2.0, help="seconds a program polls before it gives up")
    p.add_argument("--stagger", type=float, default=5.0, help="ms between the ranks' launches")
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--plot", metavar="JSON", help="only draw the plot of a results file written earlier")
    args = p.parse_args(argv)
    if args.plot:
        with open(args.plot) as f:
            plot(json.load(f), args.plot.removesuffix(".json") + ".png")
        return
    heap = iris.runtime.iris(heap_size=1 << 24)
    if args.payload & (args.payload - 1):
        sys.exit(f"--payload {args.payload}: pass a power of two (Triton blocks are powers of two)")
    if heap.device.type != "cuda":
        sys.exit("mps_residency.py measures GPU residency; it needs the cuda backend")
    rows = []
    for warps in args.warps:
        for fill in args.fill:
            for mode in args.modes:
                for _ in range(args.trials):
                    rows.append(trial(heap, mode, warps, fill, args.payload * 32 * warps, args))
    if heap.rank == 0:
        W = heap.world_size
        result = {"device": torch.cuda.get_device_name(heap.device), "world_size": W,
                  "ranks_on_device": heap.ranks_on_device, "timeout_s": args.timeout, "stagger_ms": args.stagger,
                  "triton": triton.__version__, "rows": rows}
        lines = [f"# Residency of {W} ranks' grids on {result['device']} ({heap.ranks_on_device} per GPU)", "",
                 "| warps | regs | per SM | mode | grid/rank | target | least seen (per kernel) | all resident | s |",
                 "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {r['warps']} | {r['regs']} | {r['per_sm']} | {r['mode']} | {r['grid']} | {r['target']} | "
                  f"{r['least_seen']} | {'yes' if r['all_resident'] else 'NO'} | {r['seconds']:.3f} |" for r in rows]
        text = "\n".join(lines) + "\n"
        print(text, flush=True)
        bad = sum(not r["all_resident"] for r in rows)
        print(f"SUMMARY {W} ranks: {len(rows) - bad} of {len(rows)} trials had every grid resident", flush=True)
        os.makedirs(args.out, exist_ok=True)
        stem = os.path.join(args.out, f"mps_residency_{W}ranks")
        with open(stem + ".json", "w") as f:
            json.dump(result, f, indent=1)
        with open(stem + ".md", "w") as f:
            f.write(text)
        plot(result, stem + ".png")
    heap.close()


def plot(result: dict, path: str) -> None:
    """Per trial, the least count any program saw as a fraction of all programs (1.0: every grid
    resident at once); skipped with a line where matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib not installed: no {path} (draw it later with --plot)")
        return
    rows = result["rows"]
    labels = [f"{r['warps']}w {r['regs']}r x{r['grid']} {r['mode']}" for r in rows]
    fig, ax = plt.subplots(figsize=(8, 0.28 * len(rows) + 1.4))
    ax.barh(range(len(rows)), [min(r["least_seen"]) / r["target"] for r in rows],
            color=["tab:blue" if r["all_resident"] else "tab:red" for r in rows])
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.05)
    ax.set_xlabel("least arrivals seen / programs of all ranks (1.0: all resident together)")
    ax.set_title(f"{result['world_size']} ranks' resident_grid() grids on one {result['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
