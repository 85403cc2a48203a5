"""Tune the fused ops' GEMM core: every candidate tiling against ``torch.matmul``, per shape.

One GPU, one process. For each GEMM shape of the tensor-parallel layers that ``fused_ops.py``
measures (hidden 8192, intermediate 28672 split over ``--world`` ranks, bf16) and each candidate
:class:`iris.collectives.ops.Config` (tile, warps, stages) and persistent grid (one or two
programs per SM), the median time of ``--reps`` back-to-back calls (CUDA events, after warm-up)
of the core alone (``iris.collectives.ops._matmul.matmul``), next to cuBLAS in the same run.
Prints the table and the best candidate per shape, and writes ``results/gemm_tune.json`` and
``.md``: what the GPU rows of ``ops._config.DEFAULTS`` are chosen from.

    python benchmarks/gemm_tune.py                       # the default candidates and shapes
    python benchmarks/gemm_tune.py --m 2048,8192 --reps 20
    python benchmarks/gemm_tune.py --candidates ws        # warp-specialised K loops (gemm_tune_ws.*)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch

import iris.runtime  # noqa: F401  (picks the backend before any kernel is defined)
from iris.collectives import ops
from iris.collectives.ops._matmul import matmul as gemm_core

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

#: (block_m, block_n, block_k, num_warps, num_stages): the usual Hopper bf16 tilings of Triton GEMMs
#: (a first sweep of 8 tilings at these shapes left these four as the best), each tried with and
#: without a flattened persistent loop and a tensor-descriptor store.
TILES = [
    (128, 128, 64, 8, 4),
    (128, 256, 64, 8, 3),
    (128, 256, 64, 8, 4),
    (256, 128, 64, 8, 4),
]
#: Candidates: (block_m, block_n, block_k, num_warps, num_stages, flatten, tma_store, warp_specialize).
PLAIN = [(*tile, flatten, tma_store, False) for tile in TILES for flatten in (False, True)
         for tma_store in (False, True)]
#: Warp-specialised K loops (Config.warp_specialize: 4 warps per consumer group, so 12 warps in
#: all; the core then stores through a descriptor, so 4 stages of 128 x 256 do not fit), against
#: the best plain tiling of the earlier sweeps.
WARP_SPECIALIZED = [(128, 256, 64, 8, 4, False, False, False)] + [
    (bm, bn, 64, 4, stages, False, True, True) for bm, bn, stages in ((128, 256, 3), (256, 128, 3), (128, 128, 4))]
CANDIDATES = {"plain": PLAIN, "ws": WARP_SPECIALIZED, "all": PLAIN + WARP_SPECIALIZED[1:]}


def shapes(ms: list[int], hidden: int, inter: int, world: int) -> list[tuple[str, int, int, int]]:
    """(name, M, N, K) of each distinct per-rank GEMM of the layers in ``fused_ops.py``."""
    per = inter // world
    out = []
    for M in ms:
        out.append((f"up (all_gather_matmul) M={M}", M, per, hidden))
        out.append((f"down (reduce_scatter/all_reduce) M={M}", M, hidden, per))
    out.append(("first table 8192 x 8192, K 4096", 8192, 8192, 4096))
    return out


def timed(fn, reps: int, warmup: int, queued: bool = False) -> float:
    """Median GPU seconds of one call over ``reps`` calls, an event pair around each. By default
    each call is waited for before the next, so its host time counts too (how this script's
    committed results were measured); ``queued``: the calls are enqueued back to back with no
    wait, as a model enqueues its layers, so the host's time hides wherever the GPU's is longer."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        start.record()
        fn()
        end.record()
        if not queued:
            end.synchronize()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) / 1e3 for start, end in events)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=lambda s: [int(x) for x in s.split(",")], default=[2048, 8192])
    p.add_argument("--hidden", type=int, default=8192)
    p.add_argument("--intermediate", type=int, default=28672)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--candidates", choices=tuple(CANDIDATES), default="all",
                   help="plain: tilings, flattened loop, descriptor store; ws: warp-specialised K loops")
    p.add_argument("--out", default=RESULTS)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("gemm_tune.py needs a GPU (it tunes for one)")
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    rows = []
    print(f"{'shape':<42} {'tile (m n k w s flat tstore ws)':<30} {'grid':>5} {'ours ms':>8} {'torch ms':>8} "
          f"{'ours/torch':>10}")
    for name, M, N, K in shapes(args.m, args.hidden, args.intermediate, args.world):
        g = torch.Generator().manual_seed(M + N)
        a = torch.randn(M, K, generator=g).to(torch.bfloat16).to(dev)
        b = torch.randn(K, N, generator=g).to(torch.bfloat16).to(dev)
        ours, ref = torch.empty(M, N, dtype=torch.bfloat16, device=dev), torch.empty(M, N, dtype=torch.bfloat16,
                                                                                       device=dev)
        t_torch = timed(lambda: torch.matmul(a, b, out=ref), args.reps, args.warmup)
        flops = 2.0 * M * N * K
        for bm, bn, bk, w, s, flat, tstore, ws in CANDIDATES[args.candidates]:
            cfg = ops.Config(block_m=bm, block_n=bn, block_k=bk, num_warps=w, num_stages=s, group_m=8, use_tma=True,
                             flatten=flat, warp_specialize=ws)
            tiles = -(-M // bm) * -(-N // bn)
            for per_sm in (1, 2):
                programs = min(tiles, per_sm * sms)
                try:
                    t = timed(lambda: gemm_core(ours, a, b, config=cfg, programs=programs, tma_store=tstore),
                              args.reps, args.warmup)
                except Exception as exc:  # out of shared memory and the like: record, go on
                    print(f"{name:<42} {bm} {bn} {bk} {w} {s} {flat} {tstore} {ws}: {type(exc).__name__}: "
                          f"{str(exc)[:200]}")
                    continue
                err = (ours.float() - ref.float()).abs().max().item() / (ref.float().abs().max().item() or 1.0)
                row = dict(shape=name, M=M, N=N, K=K, block_m=bm, block_n=bn, block_k=bk, num_warps=w, num_stages=s,
                           flatten=flat, tma_store=tstore, warp_specialize=ws, grid=programs, ours_s=t, torch_s=t_torch,
                           ratio=t_torch / t, tflops=flops / t / 1e12,
                           torch_tflops=flops / t_torch / 1e12, correct=err <= 2e-2)
                rows.append(row)
                tile = f"{bm} {bn} {bk} {w} {s} {int(flat)} {int(tstore)} {int(ws)}"
                print(f"{name:<42} {tile:<30} {programs:>5} {t * 1e3:8.3f} {t_torch * 1e3:8.3f} "
                      f"{row['ratio']:10.3f}{'' if row['correct'] else ' WRONG'}", flush=True)
    lines = ["| shape | best tile (m n k warps stages flatten tma-store warp-specialised) | grid | ours TFLOP/s "
             "| cuBLAS TFLOP/s | ours / cuBLAS |",
             "| --- | --- | --- | --- | --- | --- |"]
    print("\nbest per shape:")
    for name in dict.fromkeys(r["shape"] for r in rows):
        best = max((r for r in rows if r["shape"] == name and r["correct"]), key=lambda r: r["ratio"])
        tile = (f"{best['block_m']} {best['block_n']} {best['block_k']} {best['num_warps']} {best['num_stages']} "
                f"{int(best['flatten'])} {int(best['tma_store'])} {int(best.get('warp_specialize', False))}")
        line = (f"| {name} | {tile} | {best['grid']} | {best['tflops']:.0f} | {best['torch_tflops']:.0f} | "
                f"{best['ratio']:.2f} |")
        lines.append(line)
        print(line)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, "gemm_tune" if args.candidates == "all" else f"gemm_tune_{args.candidates}")
    with open(stem + ".json", "w") as f:
        json.dump({"device": torch.cuda.get_device_name(dev), "rows": rows}, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(f"GEMM core tuning on {torch.cuda.get_device_name(dev)}, bf16 (`python benchmarks/gemm_tune.py "
                f"--candidates {args.candidates}`)\n\n")
        f.write("\n".join(lines) + "\n")
    print(f"wrote {stem}.json and .md")
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
