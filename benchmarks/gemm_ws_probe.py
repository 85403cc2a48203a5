"""Which form of Triton's Hopper warp specialisation gives right GEMM results, and how fast.

On an H200 with Triton 3.6, ``Config(warp_specialize=True)`` in the GEMM core (a persistent
kernel, device-side tensor descriptors, ``tl.range(..., warp_specialize=True)`` on the K loop)
gave wrong results at every tiling (``gemm_tune.py --candidates ws``). This script separates the
suspects, one kernel each, same tiles, checked against ``torch.matmul`` and timed next to it:

- ``persistent_inner_dev``: the core's form (control);
- ``persistent_inner_host``: the same with host-side descriptors (``TensorDescriptor`` arguments);
- ``tile_inner_dev`` / ``tile_inner_host``: one output tile per program (no tile loop);
- ``persistent_outer_host``: the tile loop itself specialised and flattened (Triton's persistent
  tutorial form), host descriptors;
- ``plain_core``: the core as it ships (8 warps, not specialised), for reference.

One GPU, one process::

    python benchmarks/gemm_ws_probe.py [--reps 10]
    python benchmarks/gemm_ws_probe.py --layers [--rounds 3]

Prints a table and writes ``results/gemm_ws_probe.{json,md}``. ``--layers`` times the core
(its default, plain 8 warps, and specialised), next to ``persistent_inner_dev``, at every layer GEMM
of ``fused_ops.py``, interleaved over rounds (``results/gemm_ws_layers.{json,md}``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import gemm_tune  # this folder: the probe runs as a script beside it
import torch
import triton
import triton.language as tl

import iris.runtime  # noqa: F401  (picks the backend before any kernel is defined)
from iris.collectives.ops._gemm import grouped_tile, make_descriptors
from iris.collectives.ops._matmul import matmul as gemm_core
from iris.collectives.ops._workspace import ensure_allocator

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
SHAPES = [(8192, 8192, 14336), (2048, 14336, 8192), (8192, 8192, 4096)]


@triton.jit
def _k_loop(acc, a_desc, b_desc, row0, col0, K, BLOCK_K: tl.constexpr, WS: tl.constexpr):
    for k0 in tl.range(0, K, BLOCK_K, warp_specialize=WS):
        acc = tl.dot(a_desc.load([row0, k0]), b_desc.load([k0, col0]), acc)
    return acc


@triton.jit
def _device_descriptors(a, b, c, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """In-kernel descriptors of contiguous A, B (the core's ``make_descriptors``) and C."""
    a_desc, b_desc = make_descriptors(a, M, K, K, b, N, N, BLOCK_M, BLOCK_N, BLOCK_K)
    c_desc = tl.make_tensor_descriptor(c, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N])
    return a_desc, b_desc, c_desc


@triton.jit
def _persistent_inner(a_desc, b_desc, c_desc, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr):
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    for t in range(tl.program_id(0), tiles_m * tiles_n, tl.num_programs(0)):
        pid_m, pid_n = grouped_tile(t, tiles_m, tiles_n, 8)
        acc = _k_loop(tl.zeros([BLOCK_M, BLOCK_N], tl.float32), a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N,
                      K, BLOCK_K, True)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(tl.bfloat16))


@triton.jit
def _persistent_inner_dev(a, b, c, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    a_desc, b_desc, c_desc = _device_descriptors(a, b, c, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K)
    _persistent_inner(a_desc, b_desc, c_desc, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def _tile_inner(a_desc, b_desc, c_desc, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr):
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), 8)
    acc = _k_loop(tl.zeros([BLOCK_M, BLOCK_N], tl.float32), a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, K,
                  BLOCK_K, True)
    c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(tl.bfloat16))


@triton.jit
def _tile_inner_dev(a, b, c, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    a_desc, b_desc, c_desc = _device_descriptors(a, b, c, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K)
    _tile_inner(a_desc, b_desc, c_desc, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def _persistent_outer(a_desc, b_desc, c_desc, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr):
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    for t in tl.range(tl.program_id(0), tiles_m * tiles_n, tl.num_programs(0), flatten=True, warp_specialize=True):
        pid_m, pid_n = grouped_tile(t, tiles_m, tiles_n, 8)
        acc = _k_loop(tl.zeros([BLOCK_M, BLOCK_N], tl.float32), a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N,
                      K, BLOCK_K, False)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(tl.bfloat16))


def host_descriptors(a, b, c, bm, bn, bk):
    from triton.tools.tensor_descriptor import TensorDescriptor

    return (TensorDescriptor.from_tensor(a, [bm, bk]), TensorDescriptor.from_tensor(b, [bk, bn]),
            TensorDescriptor.from_tensor(c, [bm, bn]))


def launchers(a, b, c, tile, sms):
    """name -> a callable that runs that kernel form once."""
    bm, bn, bk, warps, stages = tile
    M, K = a.shape
    N = b.shape[1]
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    kw = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages)
    da, db, dc = host_descriptors(a, b, c, bm, bn, bk)
    persistent = min(tiles, sms)
    return {
        "persistent_inner_dev": lambda: _persistent_inner_dev[(persistent,)](a, b, c, M, N, K, **kw),
        "persistent_inner_host": lambda: _persistent_inner[(persistent,)](da, db, dc, M, N, K, **kw),
        "tile_inner_dev": lambda: _tile_inner_dev[(tiles,)](a, b, c, M, N, K, **kw),
        "tile_inner_host": lambda: _tile_inner[(tiles,)](da, db, dc, M, N, K, **kw),
        "persistent_outer_host": lambda: _persistent_outer[(persistent,)](da, db, dc, M, N, K, **kw),
        "plain_core": lambda: gemm_core(c, a, b),
    }


def layer_shapes(hidden: int = 8192, inter: int = 28672, world: int = 2) -> list[tuple[int, int, int]]:
    """The distinct per-rank GEMMs (M x N x K) of ``fused_ops.py``'s layers at M 1024 ... 16384."""
    per = inter // world
    shapes = []
    for M in (1024, 2048, 4096, 8192, 16384):
        shapes += [(M, per, hidden), (M, hidden, per)]
    return [(512, hidden, per)] + shapes  # matmul_all_gather's smallest (M / W rows); the rest repeat


def layer_forms(a, b, c, sms):
    """The core, plain (its default) and specialised (128 x 256 x 64, 4 warps per group, 3 stages),
    next to this script's specialised kernel."""
    from iris.collectives import ops

    M, K = a.shape
    N = b.shape[1]
    plain = ops.Config(block_m=128, block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=4,
                       warp_specialize=False)
    ws = ops.Config(block_m=128, block_n=256, block_k=64, group_m=8, num_warps=4, num_stages=3, warp_specialize=True)
    tiles = triton.cdiv(M, 128) * triton.cdiv(N, 256)
    kw = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=4, num_stages=3)
    return {
        "core_plain_8w": lambda: gemm_core(c, a, b, config=plain),
        "core_ws": lambda: gemm_core(c, a, b, config=ws),
        "probe_persistent_inner_dev": lambda: _persistent_inner_dev[(min(tiles, sms),)](a, b, c, M, N, K, **kw),
    }


def timed(fn, reps: int, queued: bool = True) -> float:
    """``gemm_tune.timed`` after 3 warm-up calls, queued unless asked otherwise."""
    return gemm_tune.timed(fn, reps, 3, queued=queued)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--out", default=RESULTS)
    p.add_argument("--layers", action="store_true",
                   help="the core (plain and specialised) and this script's kernel at every layer GEMM of "
                        "fused_ops.py, interleaved, --rounds times (results/gemm_ws_layers.*)")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    if args.layers:
        return run_layers(args)
    ensure_allocator()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tiles = [(128, 256, 64, 4, 3), (128, 256, 64, 4, 4), (128, 128, 64, 4, 4)]
    rows = []
    print(f"{'M x N x K':<20} {'tile (m n k warps stages)':<26} {'form':<22} {'ms':>8} {'cuBLAS ms':>9} "
          f"{'ratio':>6} {'rel err':>8} result", flush=True)
    for M, N, K in SHAPES:
        g = torch.Generator().manual_seed(M + N + K)
        a = torch.randn(M, K, generator=g).to(torch.bfloat16).cuda()
        b = (torch.randn(K, N, generator=g) / K ** 0.5).to(torch.bfloat16).cuda()
        ref = torch.matmul(a, b)
        t_ref = timed(lambda: torch.matmul(a, b, out=ref), args.reps)
        for tile in tiles:
            c = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
            for name, fn in launchers(a, b, c, tile, sms).items():
                if name == "plain_core" and tile != tiles[0]:
                    continue
                row = {"shape": [M, N, K], "tile": list(tile), "form": name, "cublas_s": t_ref}
                try:
                    c.fill_(float("nan"))
                    fn()
                    torch.cuda.synchronize()
                    err = ((c.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                    row.update(rel_error=err, correct=bool(err <= 2e-2), seconds=timed(fn, args.reps))
                except Exception as exc:  # a form Triton cannot compile: say so and go on
                    row.update(rel_error=None, correct=False, seconds=None, error=f"{type(exc).__name__}: {exc}"[:200])
                rows.append(row)
                ms = f"{row['seconds'] * 1e3:8.3f}" if row["seconds"] else f"{'-':>8}"
                ratio = f"{t_ref / row['seconds']:6.2f}" if row["seconds"] else f"{'-':>6}"
                err = f"{row['rel_error']:8.1e}" if row["rel_error"] is not None else f"{'-':>8}"
                verdict = "ok" if row["correct"] else ("WRONG" if row.get("error") is None else row["error"][:60])
                print(f"{f'{M}x{N}x{K}':<20} {' '.join(map(str, tile)):<26} {name:<22} {ms} {t_ref * 1e3:9.3f} {ratio} "
                      f"{err} {verdict}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, "gemm_ws_probe")
    meta = {"device": torch.cuda.get_device_name(0), "triton": triton.__version__, "torch": torch.__version__}
    with open(stem + ".json", "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(f"Warp-specialisation forms on {meta['device']}, Triton {meta['triton']}, bf16 "
                f"(`python benchmarks/gemm_ws_probe.py`); ratio = cuBLAS time / ours\n\n"
                "| M x N x K | tile | form | ms | cuBLAS ms | ratio | rel err | result |\n"
                "| --- | --- | --- | --- | --- | --- | --- | --- |\n")
        for r in rows:
            s = r["seconds"]
            f.write(f"| {'x'.join(map(str, r['shape']))} | {' '.join(map(str, r['tile']))} | {r['form']} | "
                    f"{s * 1e3:.3f} | {r['cublas_s'] * 1e3:.3f} | {r['cublas_s'] / s:.2f} | {r['rel_error']:.1e} | "
                    f"{'ok' if r['correct'] else 'WRONG'} |\n" if s else
                    f"| {'x'.join(map(str, r['shape']))} | {' '.join(map(str, r['tile']))} | {r['form']} | - | "
                    f"{r['cublas_s'] * 1e3:.3f} | - | - | {r.get('error', 'WRONG')} |\n")
    print(f"wrote {stem}.json and .md")
    return 0


def run_layers(args) -> int:
    """Each form and cuBLAS in turn, ``--rounds`` times per shape, so that drift hits all alike;
    the median per form."""
    ensure_allocator()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    print(f"{'M x N x K':<20} {'cuBLAS ms':>9}  cuBLAS time / ours per form (median of rounds)", flush=True)
    for M, N, K in layer_shapes():
        g = torch.Generator().manual_seed(M + N + K)
        a = torch.randn(M, K, generator=g).to(torch.bfloat16).cuda()
        b = (torch.randn(K, N, generator=g) / K ** 0.5).to(torch.bfloat16).cuda()
        ref = torch.matmul(a, b)
        c = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
        forms = layer_forms(a, b, c, sms)
        times = {name: [] for name in ["cublas", *forms]}
        errors = {}
        for name, fn in forms.items():
            c.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            errors[name] = ((c.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
        synced = {name: [] for name in times}
        for _ in range(args.rounds):
            for name, fn in [("cublas", lambda: torch.matmul(a, b, out=ref)), *forms.items()]:
                times[name].append(timed(fn, args.reps))
                synced[name].append(timed(fn, args.reps, queued=False))
        med = {name: statistics.median(ts) for name, ts in times.items()}
        med_synced = {name: statistics.median(ts) for name, ts in synced.items()}
        row = {"shape": [M, N, K], "median_s": med, "median_synced_s": med_synced, "times_s": times,
               "rel_error": errors}
        rows.append(row)
        ratios = "  ".join(f"{name} {med['cublas'] / med[name]:.3f} "
                           f"(synced {med_synced['cublas'] / med_synced[name]:.3f})"
                           f"{'' if errors[name] <= 2e-2 else ' WRONG'}" for name in forms)
        print(f"{f'{M}x{N}x{K}':<20} {med['cublas'] * 1e3:9.3f}  {ratios}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, "gemm_ws_layers")
    meta = {"device": torch.cuda.get_device_name(0), "triton": triton.__version__, "torch": torch.__version__,
            "rounds": args.rounds, "reps": args.reps}
    with open(stem + ".json", "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)
    names = [n for n in rows[0]["median_s"] if n != "cublas"]
    with open(stem + ".md", "w") as f:
        f.write(f"GEMM core forms at the layers' GEMMs, {meta['device']}, Triton {meta['triton']}, bf16, median of "
                f"{args.rounds} interleaved rounds of {args.reps} calls (`python benchmarks/gemm_ws_probe.py "
                f"--layers`); cuBLAS time / ours, calls queued back to back (in brackets: each call waited "
                f"for, so its host time counts)\n\n| M x N x K | cuBLAS ms | " + " | ".join(names) + " |\n"
                "| --- | --- | " + " | ".join("---" for _ in names) + " |\n")
        for r in rows:
            med = r["median_s"]
            syn = r["median_synced_s"]
            f.write(f"| {'x'.join(map(str, r['shape']))} | {med['cublas'] * 1e3:.3f} | " + " | ".join(
                f"{med['cublas'] / med[n]:.2f} ({syn['cublas'] / syn[n]:.2f})"
                f"{'' if r['rel_error'][n] <= 2e-2 else ' WRONG'}" for n in names) + " |\n")
    print(f"wrote {stem}.json and .md")
    return 0 if all(e <= 2e-2 for r in rows for e in r["rel_error"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
