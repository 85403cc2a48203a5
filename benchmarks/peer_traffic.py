"""Memory traffic through peer mappings with every rank on one GPU: does it keep up with local?

    mpirun --allow-run-as-root --oversubscribe -n 8 python3 -m mpi4py benchmarks/peer_traffic.py
    mpirun -n 2 python3 -m mpi4py benchmarks/peer_traffic.py --quick      # CPU backend, tiny

Every rank copies S bytes at the same time, one 16 KiB tile per step of a persistent grid, in
five ways: ``local`` reads and writes its own heap; ``read`` reads tile t from rank
(rank + t) % W through the translated pointers of ``iris.device.load`` and writes it locally;
``write`` reads locally and stores tile t into rank (rank + t) % W's heap. So ``read`` and
``write`` touch every rank's heap through every process's peer mappings; ``share`` moves data
exactly as a two-shot all-reduce does (this rank's slice of tile t read from every rank, summed,
written to every rank), with no flags at all; ``owner`` moves the same bytes in whole tiles
(rank t % W reduces tile t: reads it from every rank, writes the sum to every rank), the layout
to try if ``share`` is slow. GB/s counts the bytes read plus written by all ranks
(2 x W x S per call). Written to find out whether the all-reduces' slowdown at 8 ranks and
>= 128 MiB per rank (``benchmarks/NOTES.md``) is in the collectives or in the memory traffic.

Writes ``benchmarks/results/peer_traffic_<W>ranks.json``, ``.md`` and ``.png`` (GB/s per mode
against the size; no plot without matplotlib) (``_quick`` with ``--quick``) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

if "--quick" in sys.argv:
    os.environ.setdefault("IRIS_BACKEND", "cpu")

import torch
import triton
import triton.language as tl
from mpi4py import MPI

import iris.device
import iris.runtime

MODES = {"local": 0, "read": 1, "write": 2, "share": 3, "owner": 4}
MiB = 1 << 20


@triton.jit
def spread_copy(heap_bases, src, dst, num_tiles, rank: tl.constexpr, world_size: tl.constexpr, MODE: tl.constexpr,
                BLOCK: tl.constexpr, SPAN: tl.constexpr):
    """Copy ``src`` to ``dst`` tile by tile; tile t goes through rank (rank + t) % world_size's heap
    (MODE 1: read there, MODE 2: write there) or stays local (MODE 0). MODE 3 moves data as a
    two-shot all-reduce does, without its flags: this rank's share (a 1/world_size slice, at
    most ``SPAN`` elements) of tile t is read from every rank, summed and written to every rank.
    MODE 4 moves the same bytes with whole tiles: rank t % world_size reduces tile t (reads it from
    every rank, writes the sum to every rank). Persistent grid."""
    if MODE == 4:  # this rank's tiles only: t % world_size == rank
        for t in range(tl.program_id(0) * world_size + rank, num_tiles, tl.num_programs(0) * world_size):
            _reduce_tile(heap_bases, src, dst, t, rank, world_size, BLOCK)
    else:
        for t in range(tl.program_id(0), num_tiles, tl.num_programs(0)):
            if MODE == 3:
                _reduce_share(heap_bases, src, dst, t, rank, world_size, BLOCK, SPAN)
            else:
                _copy_tile(heap_bases, src, dst, t, rank, world_size, MODE, BLOCK)


@triton.jit
def _reduce_tile(heap_bases, src, dst, t, rank: tl.constexpr, world_size: tl.constexpr, BLOCK: tl.constexpr):
    offs = t * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for p in tl.static_range(world_size):
        acc += iris.device.load(src + offs, rank, p, heap_bases)
    for k in tl.static_range(world_size):
        iris.device.store(dst + offs, acc, rank, (rank + k + 1) % world_size, heap_bases)


@triton.jit
def _reduce_share(heap_bases, src, dst, t, rank: tl.constexpr, world_size: tl.constexpr, BLOCK: tl.constexpr,
                  SPAN: tl.constexpr):
    LENGTH: tl.constexpr = (BLOCK + world_size - 1) // world_size
    i = tl.arange(0, SPAN)
    mask = (i < LENGTH) & (rank * LENGTH + i < BLOCK)
    offs = t * BLOCK + rank * LENGTH + i
    acc = tl.zeros([SPAN], tl.float32)
    for p in tl.static_range(world_size):
        acc += iris.device.load(src + offs, rank, p, heap_bases, mask=mask, other=0)
    for k in tl.static_range(world_size):
        iris.device.store(dst + offs, acc, rank, (rank + k + 1) % world_size, heap_bases, mask=mask)


@triton.jit
def _copy_tile(heap_bases, src, dst, t, rank: tl.constexpr, world_size: tl.constexpr, MODE: tl.constexpr,
               BLOCK: tl.constexpr):
    offs = t * BLOCK + tl.arange(0, BLOCK)
    peer = (rank + t) % world_size
    if MODE == 1:
        values = iris.device.load(src + offs, rank, peer, heap_bases)
    else:
        values = tl.load(src + offs)
    if MODE == 2:
        iris.device.store(dst + offs, values, rank, peer, heap_bases)
    else:
        tl.store(dst + offs, values)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default=None, help="MiB per rank, comma-separated (default 64,128,256)")
    p.add_argument("--quick", action="store_true", help="tiny sizes on the CPU backend")
    p.add_argument("--programs-per-sm", type=int, default=8, help="programs per SM, shared by all ranks")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)
    default = "1" if args.quick else "64,128,256"
    args.sizes = [int(float(s) * MiB) if not args.quick else int(float(s) * 64 * 1024)
                  for s in (args.sizes or default).split(",")]
    return args


def measure(heap, args, mode: str, size: int) -> tuple[float, bool]:
    """Seconds per call (the slowest rank's, every rank copying ``size`` bytes at once) and
    whether every rank's first copy was right."""
    block = 4096 if not args.quick else 1024
    numel = size // 4 // block * block
    src = heap.full((numel,), float(heap.rank + 1), dtype=torch.float32)
    dst = heap.zeros(numel, dtype=torch.float32)
    cuda = heap.device.type == "cuda"
    if cuda:
        sms = torch.cuda.get_device_properties(heap.device).multi_processor_count
        grid = max(sms * args.programs_per_sm // heap.ranks_on_device, 1)
    else:
        grid = 2
    tiles = numel // block
    heap.barrier()  # every rank's src filled and dst zeroed before any peer reads or writes them

    def call():
        spread_copy[(min(grid, tiles),)](heap.get_heap_bases(), src, dst, tiles, heap.rank, heap.world_size,
                                         MODES[mode], block, triton.next_power_of_2(-(-block // heap.world_size)),
                                         num_warps=8)

    call()
    heap.barrier()
    # tile t came from rank (rank + t) % W (read), or was written by the rank q with
    # (q + t) % W == rank (write); every value is its source rank + 1
    t = torch.arange(numel, device=src.device) // block
    if mode in ("share", "owner"):  # every element is the sum over ranks of rank + 1
        want = torch.full_like(dst, sum(r + 1 for r in range(heap.world_size)))
    else:
        source = {"local": torch.full_like(t, heap.rank), "read": (heap.rank + t) % heap.world_size,
                  "write": (heap.rank - t) % heap.world_size}[mode]
        want = (source + 1).to(dst.dtype)
    correct = heap.comm.allreduce(int(not torch.equal(dst, want))) == 0
    if cuda:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        heap.barrier()
        start.record()
        for _ in range(args.iters):
            call()
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3 / args.iters
    else:
        heap.barrier()
        t0 = time.perf_counter()
        call()
        seconds = time.perf_counter() - t0
    heap.barrier()
    seconds = heap.comm.allreduce(seconds, op=MPI.MAX)
    heap.free(dst)
    heap.free(src)
    return seconds, correct


def plot(rows: list[dict], title: str, path: str) -> bool:
    """GB/s of every mode against the bytes per rank; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    sizes = [r["bytes_per_rank"] / MiB for r in rows]
    for mode in (m for m in MODES if all(m in r for r in rows)):  # older results lack some modes
        ax.plot(sizes, [r[mode]["GBps"] for r in rows], marker="o", label=mode)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("MiB per rank")
    ax.set_ylabel("GB/s, all ranks (read + written)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv=None) -> None:
    args = parse_args(argv)
    heap = iris.runtime.iris(heap_size=2 * max(args.sizes) + 64 * MiB)
    W = heap.world_size
    rows = []
    for size in args.sizes:
        row = {"bytes_per_rank": size}
        for mode in MODES:
            seconds, correct = measure(heap, args, mode, size)
            row[mode] = {"us": seconds * 1e6, "GBps": 2 * W * size / seconds / 1e9, "correct": correct}
        rows.append(row)
    device = torch.cuda.get_device_name(heap.device) if heap.device.type == "cuda" else "cpu"
    heap.close()
    if heap.rank != 0:
        return
    header = f"{'S/rank':>10} " + " ".join(f"{m + ' us':>12} {m + ' GB/s':>12}" for m in MODES)
    header += " " + " ".join(f"{m + '/local':>11}" for m in MODES if m != "local")
    lines = [f"{W} ranks on one {device}: every rank copies S bytes at once; GB/s = bytes read + written by all "
             f"ranks (* = wrong result)", header]
    for r in rows:
        size = f"{r['bytes_per_rank'] / MiB:g} MiB"
        cells = " ".join(f"{r[m]['us']:>12.1f} {r[m]['GBps']:>11.1f}{'' if r[m]['correct'] else '*'}"
                         for m in MODES)
        ratio = {m: r[m]["GBps"] / r["local"]["GBps"] for m in MODES}
        lines.append(f"{size:>10} {cells} " + " ".join(f"{ratio[m]:>11.2f}" for m in MODES if m != "local"))
    text = "\n".join(lines)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"peer_traffic_{W}ranks{'_quick' if args.quick else ''}")
    with open(stem + ".json", "w") as f:
        json.dump({"world_size": W, "device": device, "rows": rows}, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(f"Peer-mapped traffic, {W} ranks (`benchmarks/peer_traffic.py`):\n\n```text\n{text}\n```\n")
    plotted = plot(rows, f"peer-mapped traffic, {W} ranks on one {device}", stem + ".png")
    print(f"wrote {stem}.json, {stem}.md" + (f" and {stem}.png" if plotted else " (no matplotlib: no plot)"),
          flush=True)


if __name__ == "__main__":
    main()
