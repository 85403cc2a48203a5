"""Fused GEMM + all-reduce: every rank multiplies its K-shard and all-reduces the output tiles
inside the same kernel.

C = A @ B with the inner dimension split over the ranks: rank r holds A[:, K_r] and B[K_r, :]
(K_r its share of K) and computes the partial product A[:, K_r] @ B[K_r, :]. C is the sum of the
partial products. Each program computes one output tile at a time and, as soon as it has it,
sums the tile over the ranks without leaving the kernel. Every rank ends with all of C; it is
checked against the sum of the partial products computed by torch on the host.

Two ways to get it, chosen with ``--variant``:

- ``op_one_shot``, ``op_two_shot`` (the default): the library call
  ``iris.collectives.ops.matmul_all_reduce(ctx, c, a, b)`` with that strategy; C has the inputs'
  dtype (``--dtype bf16`` gives a bf16 C, accumulated in fp32 and rounded once);
- ``atomic``, ``spinlock``, ``one_shot``, ``two_shot``, ``ring``: the kernel written out below,
  a plain ``tl.dot`` loop handing each tile to that tile collective, C in fp32. Read it to see
  how a fused kernel is built from the tile collectives.

    mpirun -n 4 python examples/02_gemm_all_reduce.py [--variant op_two_shot|op_one_shot|atomic|...|all]
    # GPU sizes, e.g.:  --m 8192 --n 8192 --k-per-rank 4096 --dtype bf16 --block-m 128 --block-n 256 --block-k 64
"""

import argparse
import sys
import time

import torch
import triton
import triton.language as tl

# iris.runtime picks the backend; on a machine with no GPU it switches Triton's interpreter on,
# so import it before defining kernels.
import iris.collectives
import iris.runtime
from iris.collectives import DeviceContext, TensorView, Tile, ops

#: The library op's strategies (``iris.collectives.ops.matmul_all_reduce``), then this file's kernel.
OP_VARIANTS = ("op_one_shot", "op_two_shot")
KERNEL_VARIANTS = ("atomic", "spinlock", "one_shot", "two_shot", "ring")
VARIANTS = OP_VARIANTS + KERNEL_VARIANTS
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@triton.jit
def gemm_all_reduce(context, a, b, partial, c, locks, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                    stride_cm, stride_cn, rank: tl.constexpr, world_size: tl.constexpr, VARIANT: tl.constexpr,
                    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Persistent GEMM: program p computes tiles p, p + P, p + 2P ... of this rank's partial C
    (A is M x K, B is K x N: this rank's shards) and all-reduces each tile as soon as it has it.

    ``c`` (the result) and ``partial`` (this rank's partial product, read by peers) are M x N on
    the symmetric heap, with the same strides. Every rank runs the same grid and visits the tiles
    in the same order, so a program only ever waits for the same tile on other ranks.
    """
    ctx = DeviceContext.initialize(context, rank, world_size)
    dst = TensorView(c, M, N, stride_cm, stride_cn)
    src = TensorView(partial, M, N, stride_cm, stride_cn)
    tiles_n = tl.cdiv(N, BLOCK_N)
    num_tiles = tl.cdiv(M, BLOCK_M) * tiles_n
    for tile_id in range(tl.program_id(0), num_tiles, tl.num_programs(0)):
        pid_m = tile_id // tiles_n
        pid_n = tile_id % tiles_n
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        ks = tl.arange(0, BLOCK_K)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            a_tile = tl.load(a + rows[:, None] * stride_am + (k0 + ks)[None, :] * stride_ak,
                             mask=(rows[:, None] < M) & ((k0 + ks)[None, :] < K), other=0.0)
            b_tile = tl.load(b + (k0 + ks)[:, None] * stride_bk + cols[None, :] * stride_bn,
                             mask=((k0 + ks)[:, None] < K) & (cols[None, :] < N), other=0.0)
            acc = tl.dot(a_tile, b_tile, acc, input_precision=PRECISION)
        tile = Tile(pid_m, pid_n, BLOCK_M, BLOCK_N, acc)
        if VARIANT == "atomic":
            ctx.all_reduce_atomic(tile, dst)                    # c zeroed by the host
        elif VARIANT == "spinlock":
            ctx.all_reduce_spinlock(tile, dst, locks)           # c zeroed by the host
        else:
            # The reading variants take this rank's contribution from `partial`: publish the tile
            # there first. The barrier orders every thread's stores before the collective's
            # flags (and before the ring's own reload of the tile, done by other threads).
            src.store(tile, acc)
            tl.debug_barrier()
            if VARIANT == "one_shot":
                ctx.all_reduce_one_shot(tile, src, dst, locks)
            elif VARIANT == "two_shot":
                ctx.all_reduce_two_shot(tile, src, dst, locks)
            else:
                tl.static_assert(VARIANT == "ring", "VARIANT must be atomic, spinlock, one_shot, two_shot or ring")
                ctx.all_reduce_ring(tile, src, dst)


def rate(flops_per_s: float) -> str:
    """``1.23 TFLOP/s`` or ``45.6 MFLOP/s``: the unit that fits."""
    for unit, scale in (("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6)):
        if flops_per_s >= scale:
            return f"{flops_per_s / scale:6.1f} {unit}"
    return f"{flops_per_s:6.0f} FLOP/s"


def precision_of(ctx, args) -> str | None:
    if args.dtype != "fp32":
        return None  # 16-bit inputs: exact products, fp32 accumulation
    return args.precision or ("tf32" if ctx.device.type == "cuda" else "ieee")


def tolerance_of(precision: str | None, out_dtype: torch.dtype) -> float:
    if out_dtype != torch.float32:
        return 1e-2  # one rounding to 8 (bf16) or 11 (fp16) significant bits
    return 5e-3 if precision == "tf32" else 1e-4


def check(c: torch.Tensor, reference: torch.Tensor) -> float:
    scale = reference.abs().max().item() or 1.0
    error = ((c.double() - reference).abs().max() / scale).item()
    return float("inf") if error != error else error  # NaN: some element was never written


def run_op(ctx, variant: str, args, a_shard, b_shard, reference) -> dict:
    """The library op: no lock array, staging buffer or grid to manage; no barrier between calls."""
    precision = precision_of(ctx, args)
    c = torch.full((args.m, args.n), float("nan"), dtype=a_shard.dtype, device=ctx.device)
    config = ops.Config(variant=variant.removeprefix("op_"), block_m=args.block_m, block_n=args.block_n,
                        block_k=args.block_k, input_precision=precision or "tf32")
    times = []
    for it in range(args.warmup + args.iters):
        ctx.barrier()  # for the timing only: the op itself needs none
        start = time.perf_counter()
        ops.matmul_all_reduce(ctx, c, a_shard, b_shard, config=config)
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
        ctx.barrier()
        if it >= args.warmup:
            times.append(time.perf_counter() - start)
    tolerance = tolerance_of(precision, c.dtype)
    error = check(c, reference)
    return {"variant": variant, "seconds": min(times), "error": error, "tolerance": tolerance, "ok": error <= tolerance,
            "programs": "auto", "precision": precision or f"{args.dtype} -> {args.dtype}"}


def run_variant(ctx, variant: str, args, a_shard, b_shard, reference, bufs) -> dict:
    if variant in OP_VARIANTS:
        return run_op(ctx, variant, args, a_shard, b_shard, reference)
    partial, c, locks = bufs["partial"], bufs["c"], bufs[f"locks_{variant}"]
    M, N, K = args.m, args.n, args.k_per_rank
    num_tiles = iris.collectives.num_tiles(M, N, args.block_m, args.block_n)
    precision = precision_of(ctx, args)
    launch_args = (ctx.get_device_context(), a_shard, b_shard, partial, c, locks, M, N, K,
                   a_shard.stride(0), a_shard.stride(1), b_shard.stride(0), b_shard.stride(1), c.stride(0),
                   c.stride(1), ctx.rank, ctx.world_size, variant, precision, args.block_m, args.block_n,
                   args.block_k)
    # A program waits for the same tile's program on the other ranks: the persistent grid must be
    # resident on every rank at once. Compile (no launch) to learn how many programs fit.
    programs = args.programs or ctx.resident_grid(num_tiles, gemm_all_reduce.warmup(*launch_args, grid=(1,)))
    times = []
    for it in range(args.warmup + args.iters):
        # atomic and spinlock add into c: it must be zero on every rank before anyone adds. The
        # others overwrite it: poison it, so a tile the kernel missed shows up as NaN.
        c.fill_(0.0 if variant in ("atomic", "spinlock") else float("nan"))
        ctx.barrier()
        start = time.perf_counter()
        gemm_all_reduce[(programs,)](*launch_args)
        ctx.barrier()
        if it >= args.warmup:
            times.append(time.perf_counter() - start)
    tolerance = tolerance_of(precision, c.dtype)
    error = check(c, reference)
    return {"variant": variant, "seconds": min(times), "error": error, "tolerance": tolerance,
            "ok": error <= tolerance, "programs": programs, "precision": precision or f"{args.dtype} -> fp32"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=(*VARIANTS, "all"), default="op_two_shot")
    parser.add_argument("--m", type=int, default=128, help="rows of A and C")
    parser.add_argument("--n", type=int, default=128, help="columns of B and C")
    parser.add_argument("--k-per-rank", type=int, default=64, help="each rank's share of the inner dimension")
    parser.add_argument("--block-m", type=int, default=32)
    parser.add_argument("--block-n", type=int, default=32)
    parser.add_argument("--block-k", type=int, default=32)
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp32",
                        help="of A and B (and of C for the op_* variants; C is fp32 for the others)")
    parser.add_argument("--precision", choices=("tf32", "ieee"), default=None,
                        help="fp32 tl.dot precision (default: tf32 on a GPU, ieee on the CPU)")
    parser.add_argument("--programs", type=int, default=0, help="persistent grid size (default: auto)")
    parser.add_argument("--iters", type=int, default=1, help="timed runs per variant (the best is reported)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed runs first (default: 1 on a GPU, else 0)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("block_m", "block_n", "block_k"):
        value = getattr(args, name)
        if value < 16 or value & (value - 1):
            parser.error(f"--{name.replace('_', '-')} must be a power of two >= 16 (tl.dot), got {value}")
    variants = VARIANTS if args.variant == "all" else (args.variant,)

    M, N, Kr = args.m, args.n, args.k_per_rank
    # This file's partial and C, and each op strategy's cached workspace (an fp32 partial, and for
    # two-shot a heap copy of C), all M x N.
    heap = max(1 << 26, 8 * M * N * 4 + (1 << 22))
    with iris.runtime.iris(heap_size=heap) as ctx:
        if args.warmup is None:
            args.warmup = 1 if ctx.device.type == "cuda" else 0
        rank, world = ctx.rank, ctx.world_size
        if args.dtype == "bf16" and ctx.backend == "cpu" and set(variants) - set(OP_VARIANTS):
            # Seen: bf16 tiles through Triton's interpreter give wrong products (numpy has no bf16);
            # the library op widens them to fp32 there (exact), this file's kernel does not.
            raise SystemExit("--dtype bf16 on the cpu backend works with the op_* variants only; Triton's "
                             "interpreter does not compute bf16 tl.dot correctly: use fp32 or fp16 for the others")
        # The same full A and B on every rank (same seed); each rank keeps its K-shard.
        gen = torch.Generator().manual_seed(args.seed)
        dtype = DTYPES[args.dtype]
        a_full = torch.rand(M, Kr * world, generator=gen).mul_(2).sub_(1).to(dtype)
        b_full = torch.rand(Kr * world, N, generator=gen).mul_(2).sub_(1).to(dtype)
        shard = slice(rank * Kr, (rank + 1) * Kr)
        a_shard = a_full[:, shard].contiguous().to(ctx.device)
        b_shard = b_full[shard, :].contiguous().to(ctx.device)
        # Reference: the sum of every rank's partial product, in fp64 on this rank's device.
        a64, b64 = a_full.to(ctx.device, torch.float64), b_full.to(ctx.device, torch.float64)
        reference = sum(a64[:, r * Kr:(r + 1) * Kr] @ b64[r * Kr:(r + 1) * Kr, :] for r in range(world))
        del a64, b64

        bufs = {"partial": ctx.zeros(M, N, dtype=torch.float32), "c": ctx.zeros(M, N, dtype=torch.float32)}
        words = iris.collectives.lock_words(M, N, args.block_m, args.block_n)
        for v in [v for v in variants if v in KERNEL_VARIANTS]:  # one zeroed lock array each, never reset
            bufs[f"locks_{v}"] = ctx.zeros(words, dtype=torch.int32)
        ctx.barrier()

        results = [run_variant(ctx, v, args, a_shard, b_shard, reference, bufs) for v in variants]
        everyone = ctx.comm.gather(results, root=0)
        ok = True
        if rank == 0:
            flops = 2.0 * M * N * Kr * world
            print(f"GEMM + all-reduce: {world} ranks, backend {ctx.backend}, C[{M}x{N}] = A[{M}x{Kr * world}] @ "
                  f"B[{Kr * world}x{N}] ({args.dtype}, K split {Kr} per rank), tiles "
                  f"{args.block_m}x{args.block_n}x{args.block_k}")
            for i, v in enumerate(variants):
                per_rank = [rep[i] for rep in everyone]
                slowest = max(r["seconds"] for r in per_rank)
                worst = max(r["error"] for r in per_rank)
                good = all(r["ok"] for r in per_rank)
                ok &= good
                bad = [r for r, rep in enumerate(per_rank) if not rep["ok"]]
                status = "correct" if good else f"WRONG on ranks {bad}"
                print(f"  {v:11s} {status:10s} max rel. error {worst:.1e} (tol {per_rank[0]['tolerance']:.0e}, "
                      f"{per_rank[0]['precision']}); {slowest * 1e3:9.2f} ms, {rate(flops / slowest)} "
                      f"({per_rank[0]['programs']} programs per rank)")
        ok = ctx.broadcast(ok if rank == 0 else None)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
