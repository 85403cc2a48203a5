"""Soak: many back-to-back calls of every lock-using collective, with new data each call.

    mpirun -n 8 python -m mpi4py benchmarks/collectives_soak.py [--calls 10000] [--check-every 100]
    mpirun -n 2 python -m mpi4py benchmarks/collectives_soak.py --quick      # CPU backend

For each of one-shot, two-shot, ring and spinlock all-reduce and reduce-scatter: ``--calls`` calls
on one stream with no barrier and no lock reset between them. Before call ``i`` each rank fills its
input with ``(rank + 1) * (i % 13 + 1)`` (a stream-ordered fill, so the data changes every call;
spinlock also zeroes its destination, which its contract asks for); every ``--check-every`` calls
the host waits for the stream and compares the result with the exact sum. Prints calls per second
(fills included) and the mismatches (elements wrong, summed over the checks) per collective, and
writes ``collectives_soak_<N>ranks.{json,md}`` into ``--out``. Exits 1 on any mismatch. The
watchdog stays on (default ``IRIS_TIMEOUT_S``), so a hang ends the job with a report.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

import iris.collectives as ic  # first: picks the backend (and Triton's interpreter for cpu)
import iris.runtime

# isort: split
from mpi4py import MPI

# isort: split
import triton
import triton.language as tl

VARIANTS = {"one_shot": 0, "two_shot": 1, "ring": 2, "spinlock": 3, "reduce_scatter": 4}


@triton.jit
def soak_kernel(context, src, dst, locks, M, N, rank: tl.constexpr, world_size: tl.constexpr, VARIANT: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One call of collective ``VARIANT`` over ``src`` into ``dst`` (M x N, contiguous); persistent grid."""
    ctx = ic.DeviceContext.initialize(context, rank, world_size)
    src_view = ic.TensorView(src, M, N, N, 1)
    dst_view = ic.TensorView(dst, M, N, N, 1)
    tiles_n = dst_view.num_tiles_n(BLOCK_N)
    for t in range(tl.program_id(0), dst_view.num_tiles(BLOCK_M, BLOCK_N), tl.num_programs(0)):
        pid_m, pid_n = ic.tile_coords(t, tiles_n)
        view = ic.TileView(pid_m, pid_n, BLOCK_M, BLOCK_N)
        if VARIANT == 1:
            ctx.all_reduce_two_shot(view, src_view, dst_view, locks)
        elif VARIANT == 2:
            ctx.all_reduce_ring(view, src_view, dst_view)
        else:
            pointers, mask = src_view.frame(view)
            tile = ic.Tile(pid_m, pid_n, BLOCK_M, BLOCK_N, tl.load(pointers, mask=mask, other=0))
            if VARIANT == 0:
                ctx.all_reduce_one_shot(tile, src_view, dst_view, locks)
            elif VARIANT == 3:
                ctx.all_reduce_spinlock(tile, dst_view, locks)
            else:
                ctx.reduce_scatter(tile, src_view, dst_view, locks)


def owned_mask(ctx, M: int, N: int, bm: int, bn: int) -> torch.Tensor:
    """Where reduce_scatter leaves the sum on this rank (its tiles), as an M x N bool tensor."""
    tiles_n = -(-N // bn)
    mask = torch.zeros(M, N, dtype=torch.bool)
    for t in ic.reduce_scatter_tiles(ctx.rank, ic.num_tiles(M, N, bm, bn), ctx.world_size):
        r, c = divmod(t, tiles_n)
        mask[r * bm:(r + 1) * bm, c * bn:(c + 1) * bn] = True
    return mask


def diagnose(ctx, variant: str, call: int, locks: torch.Tensor, args) -> None:
    """``--diagnose``: once the watchdog stopped a wait (the kernels are drained then), print
    where every tile of this rank stands (its call count and flag counters) and keep them in
    ``<out>/soak_diag_rank<r>.pt``; then wait for the watchdog to end the job."""
    try:
        ctx.check_watchdog("soak")
    except iris.runtime.IrisTimeoutError:
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
        words = locks.view(-1, ic.LOCK_WORDS).cpu()
        epochs = words[:, 3]
        lag = (epochs < epochs.max()).nonzero().flatten().tolist()
        print(f"DIAG {variant} rank {ctx.rank}: host at call {call + 1}, tile call counts min {int(epochs.min())} "
              f"max {int(epochs.max())}, tiles behind: {lag[:16]}, their words (arrive, done, mutex, calls): "
              f"{words[lag[:4]].tolist()}", flush=True)
        torch.save(words, os.path.join(args.out, f"soak_diag_rank{ctx.rank}.pt"))
        time.sleep(60)


def soak(ctx, variant: str, args) -> dict:
    M, N, bm, bn = args.M, args.N, args.block_m, args.block_n
    src = ctx.zeros((M, N), dtype=torch.float32)
    dst = ctx.zeros((M, N), dtype=torch.float32)
    locks = ctx.zeros(ic.lock_words(M, N, bm, bn), dtype=torch.int32)
    check = owned_mask(ctx, M, N, bm, bn) if variant == "reduce_scatter" else torch.ones(M, N, dtype=torch.bool)
    tiles = ic.num_tiles(M, N, bm, bn)
    ctx.barrier()
    launch_args = (ctx.get_device_context(), src, dst, locks, M, N, ctx.rank, ctx.world_size, VARIANTS[variant], bm,
                   bn)
    # the grid every rank's launch keeps resident at once (programs wait for each other's)
    probe = soak_kernel.warmup(*launch_args, grid=(1,)) if ctx.device.type == "cuda" else None
    resident = ctx.resident_grid(tiles, probe)
    grid = (min(tiles, resident, args.grid or tiles),)
    if ctx.rank == 0:
        print(f"{variant}: {tiles} tiles, resident grid {resident}, launching {grid[0]} programs per rank", flush=True)
    ctx.barrier()
    mismatches = checks = 0
    start = time.perf_counter()
    for i in range(args.calls):
        src.fill_(float((ctx.rank + 1) * (i % 13 + 1)))
        if variant == "spinlock":
            dst.zero_()
        soak_kernel[grid](*launch_args)
        if args.diagnose:
            diagnose(ctx, variant, i, locks, args)
        if (i + 1) % args.check_every == 0 or i + 1 == args.calls:
            want = float((i % 13 + 1) * ctx.world_size * (ctx.world_size + 1) // 2)
            got = dst.cpu()
            mismatches += int((got[check] != want).sum())
            checks += 1
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    ctx.barrier()
    for t in (src, dst, locks):
        ctx.free(t)
    total = ctx.comm.allreduce(mismatches)
    slowest = ctx.comm.allreduce(seconds, op=MPI.MAX)
    return {"variant": variant, "calls": args.calls, "checks": checks, "mismatches": total, "seconds": slowest,
            "calls_per_s": args.calls / slowest, "grid": grid[0], "tiles": tiles}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=10000)
    p.add_argument("--check-every", type=int, default=100)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--M", type=int, default=256)
    p.add_argument("--N", type=int, default=1024)
    p.add_argument("--block-m", type=int, default=16)
    p.add_argument("--block-n", type=int, default=256)
    p.add_argument("--grid", type=int, default=0, help="at most this many programs per rank (0: the resident grid)")
    p.add_argument("--quick", action="store_true", help="a few calls of a small tensor (the CPU backend)")
    p.add_argument("--diagnose", action="store_true",
                   help="after each call, look whether the watchdog fired; if so print every tile's counters")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args()
    if args.quick:
        args.calls, args.check_every, args.M, args.N, args.block_m, args.block_n = 6, 3, 20, 24, 8, 16
    ctx = iris.runtime.iris(heap_size=1 << 26)
    rows = []
    for variant in args.variants.split(","):
        rows.append(soak(ctx, variant, args))
        if ctx.rank == 0:
            r = rows[-1]
            print(f"{variant}: {r['calls']} calls in {r['seconds']:.1f} s, {r['mismatches']} mismatches", flush=True)
    if ctx.rank == 0:
        device = torch.cuda.get_device_name() if ctx.device.type == "cuda" else "cpu"
        head = (f"soak, {ctx.world_size} ranks, {ctx.backend} ({device}), {args.M}x{args.N} fp32 "
                f"({args.M * args.N * 4 >> 10} KiB per rank), tiles {args.block_m}x{args.block_n}")
        lines = [head, "", "| collective | calls | checks | mismatches | calls/s | grid |",
                 "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {r['variant']} | {r['calls']} | {r['checks']} | {r['mismatches']} | {r['calls_per_s']:.0f} | "
                  f"{r['grid']} |" for r in rows]
        table = "\n".join(lines)
        print(table, flush=True)
        os.makedirs(args.out, exist_ok=True)
        stem = os.path.join(args.out, f"collectives_soak_{ctx.world_size}ranks{'_quick' if args.quick else ''}")
        with open(stem + ".json", "w") as f:
            json.dump({"world_size": ctx.world_size, "backend": ctx.backend, "rows": rows, "M": args.M, "N": args.N,
                       "block": [args.block_m, args.block_n]}, f, indent=1)
        with open(stem + ".md", "w") as f:
            f.write(table + "\n")
    bad = any(r["mismatches"] for r in rows)
    ctx.close()
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
