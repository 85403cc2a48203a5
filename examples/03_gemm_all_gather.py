"""Fused GEMM + all-gather (a.k.a. all-scatter): output tiles are pushed to every rank as soon as
they are computed.

C = A @ B with the output split over the ranks. With ``--dim 1`` B is split by columns: rank r
holds B[:, N_r] and computes the column block C[:, N_r] = A @ B[:, N_r]. With ``--dim 0`` A is
split by rows: rank r holds A[M_r, :] and computes the row block C[M_r, :] = A[M_r, :] @ B. Each
program computes one tile of the rank's block at a time and immediately writes it into every
rank's copy of C, so when all ranks are done every rank has all of C, with no step after the
GEMM. Methods (``--method``, default all that apply):

- ``collective``: this file's kernel, pushing with the tile collective ``ctx.all_gather(tile,
  dst_view, dim)``; ``stores``: the same written out with one ``ctx.store`` per rank (C in fp32);
- for ``--dim 0`` also the library calls, C in the inputs' dtype (``--dtype bf16`` gives a bf16
  C, accumulated in fp32 and rounded once): ``op_matmul_all_gather`` is
  ``iris.collectives.ops.matmul_all_gather(ctx, c, a_rows, b)`` (the same push, as one call), and
  ``op_all_gather_matmul`` is ``iris.collectives.ops.all_gather_matmul(ctx, c, a_rows, b)``, which
  gathers the rows of A instead and computes all of C on every rank (W times the FLOPs, the
  better choice when A is much smaller than C).

Every rank's C is checked against torch's A @ B.

    mpirun -n 4 python examples/03_gemm_all_gather.py [--dim 0|1|both] [--method collective|stores|op_...|all]
    # GPU sizes, e.g.:  --m 8192 --n 8192 --k 8192 --block-m 128 --block-n 128 --block-k 64
"""

import argparse
import sys
import time

import torch
import triton
import triton.language as tl

# iris.runtime picks the backend; on a machine with no GPU it switches Triton's interpreter on,
# so import it before defining kernels.
import iris.runtime
from iris.collectives import DeviceContext, TensorView, Tile, ops

KERNEL_METHODS = ("collective", "stores")
#: The library ops (``--dim 0`` only: they gather rows).
OP_METHODS = ("op_matmul_all_gather", "op_all_gather_matmul")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@triton.jit
def gemm_all_gather(context, a, b, c, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                    rank: tl.constexpr, world_size: tl.constexpr, DIM: tl.constexpr, METHOD: tl.constexpr,
                    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Persistent GEMM over this rank's block of C, pushing each finished tile to every rank.

    ``a`` is this rank's A (M/W x K for DIM 0, else M x K), ``b`` its B (K x N, or K x N/W for
    DIM 1); ``c`` is the full M x N result on the symmetric heap, the same on every rank.
    """
    ctx = DeviceContext.initialize(context, rank, world_size)
    gathered = TensorView(c, M, N, stride_cm, stride_cn)
    if DIM == 0:
        local_m = M // world_size
        local_n = N
    else:
        local_m = M
        local_n = N // world_size
    tiles_n = tl.cdiv(local_n, BLOCK_N)
    num_tiles = tl.cdiv(local_m, BLOCK_M) * tiles_n
    for tile_id in range(tl.program_id(0), num_tiles, tl.num_programs(0)):
        pid_m = tile_id // tiles_n
        pid_n = tile_id % tiles_n
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        ks = tl.arange(0, BLOCK_K)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            a_tile = tl.load(a + rows[:, None] * stride_am + (k0 + ks)[None, :] * stride_ak,
                             mask=(rows[:, None] < local_m) & ((k0 + ks)[None, :] < K), other=0.0)
            b_tile = tl.load(b + (k0 + ks)[:, None] * stride_bk + cols[None, :] * stride_bn,
                             mask=((k0 + ks)[:, None] < K) & (cols[None, :] < local_n), other=0.0)
            acc = tl.dot(a_tile, b_tile, acc, input_precision=PRECISION)
        if METHOD == "collective":
            # The tile is positioned in this rank's block; all_gather puts it at this rank's slot
            # along DIM in every rank's C.
            ctx.all_gather(Tile(pid_m, pid_n, BLOCK_M, BLOCK_N, acc), gathered, DIM)
        else:
            tl.static_assert(METHOD == "stores", "METHOD must be 'collective' or 'stores'")
            mask = (rows[:, None] < local_m) & (cols[None, :] < local_n)
            if DIM == 0:
                rows = rows + rank * local_m
            else:
                cols = cols + rank * local_n
            ptrs = c + rows[:, None] * stride_cm + cols[None, :] * stride_cn
            for i in tl.static_range(world_size):
                # Start with the next rank, so that the ranks do not all write to rank 0 first.
                ctx.store(ptrs, acc, to_rank=(rank + i) % world_size, mask=mask)


def rate(flops_per_s: float) -> str:
    """``1.23 TFLOP/s`` or ``45.6 MFLOP/s``: the unit that fits."""
    for unit, scale in (("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6)):
        if flops_per_s >= scale:
            return f"{flops_per_s / scale:6.1f} {unit}"
    return f"{flops_per_s:6.0f} FLOP/s"


def check(c: torch.Tensor, reference: torch.Tensor) -> float:
    scale = reference.abs().max().item() or 1.0
    error = ((c.double() - reference).abs().max() / scale).item()
    return float("inf") if error != error else error  # NaN: some element was never written


def tolerance_of(precision: str | None, out_dtype: torch.dtype) -> float:
    if out_dtype != torch.float32:
        return 1e-2  # one rounding to 8 (bf16) or 11 (fp16) significant bits
    return 5e-3 if precision == "tf32" else 1e-4


def run_op(ctx, method: str, args, a_full, b_full, reference) -> dict:
    """A library op on this rank's rows of A: no staging, locks or grid to manage."""
    rank, world = ctx.rank, ctx.world_size
    rows = slice(rank * (args.m // world), (rank + 1) * (args.m // world))
    a_rows, b = a_full[rows, :].contiguous().to(ctx.device), b_full.to(ctx.device)
    precision = None if args.dtype != "fp32" else args.precision or ("tf32" if ctx.device.type == "cuda" else "ieee")
    c = torch.full((args.m, args.n), float("nan"), dtype=a_rows.dtype, device=ctx.device)
    config = ops.Config(block_m=args.block_m, block_n=args.block_n, block_k=args.block_k,
                        input_precision=precision or "tf32")
    op = ops.matmul_all_gather if method == "op_matmul_all_gather" else ops.all_gather_matmul
    times = []
    for it in range(args.warmup + args.iters):
        ctx.barrier()  # for the timing only: the op itself needs none
        start = time.perf_counter()
        op(ctx, c, a_rows, b, config=config)
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
        ctx.barrier()
        if it >= args.warmup:
            times.append(time.perf_counter() - start)
    tolerance = tolerance_of(precision, c.dtype)
    error = check(c, reference)
    return {"case": f"dim 0, {method}", "seconds": min(times), "error": error, "tolerance": tolerance,
            "ok": error <= tolerance, "programs": "auto", "precision": precision or f"{args.dtype} -> {args.dtype}"}


def run_case(ctx, dim: int, method: str, args, a_full, b_full, reference, c) -> dict:
    if method in OP_METHODS:
        return run_op(ctx, method, args, a_full, b_full, reference)
    rank, world = ctx.rank, ctx.world_size
    M, N = args.m, args.n
    if dim == 0:
        rows = slice(rank * (M // world), (rank + 1) * (M // world))
        a_mine, b_mine = a_full[rows, :], b_full
        local_m, local_n = M // world, N
    else:
        cols = slice(rank * (N // world), (rank + 1) * (N // world))
        a_mine, b_mine = a_full, b_full[:, cols]
        local_m, local_n = M, N // world
    a_mine = a_mine.contiguous().to(ctx.device)
    b_mine = b_mine.contiguous().to(ctx.device)
    tiles = -(-local_m // args.block_m) * -(-local_n // args.block_n)
    if args.dtype != "fp32":
        precision = None
    else:
        precision = args.precision or ("tf32" if ctx.device.type == "cuda" else "ieee")
    launch_args = (ctx.get_device_context(), a_mine, b_mine, c, M, N, args.k,
                   a_mine.stride(0), a_mine.stride(1), b_mine.stride(0), b_mine.stride(1), c.stride(0), c.stride(1),
                   rank, world, dim, method, precision, args.block_m, args.block_n, args.block_k)
    # A persistent grid: as many programs as the GPU runs at once with every rank's launch on it
    # (compiled, not launched, to learn how many fit); more would only queue behind the others.
    programs = args.programs or ctx.resident_grid(tiles, gemm_all_gather.warmup(*launch_args, grid=(1,)))
    times = []
    for it in range(args.warmup + args.iters):
        c.fill_(float("nan"))  # every element must be written by some rank
        ctx.barrier()
        start = time.perf_counter()
        gemm_all_gather[(programs,)](*launch_args)
        ctx.barrier()  # every rank has pushed all its tiles: C is complete everywhere
        if it >= args.warmup:
            times.append(time.perf_counter() - start)
    tolerance = tolerance_of(precision, c.dtype)
    error = check(c, reference)
    return {"case": f"dim {dim}, {method}", "seconds": min(times), "error": error, "tolerance": tolerance,
            "ok": error <= tolerance, "programs": programs, "precision": precision or f"{args.dtype} -> fp32"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", choices=("0", "1", "both"), default="both",
                        help="0: A split by rows, 1: B split by columns")
    parser.add_argument("--method", choices=(*KERNEL_METHODS, *OP_METHODS, "all"), default="all",
                        help="all: every method that applies to each --dim (the ops gather rows: --dim 0)")
    parser.add_argument("--m", type=int, default=128, help="rows of A and C")
    parser.add_argument("--n", type=int, default=128, help="columns of B and C")
    parser.add_argument("--k", type=int, default=64, help="inner dimension")
    parser.add_argument("--block-m", type=int, default=32)
    parser.add_argument("--block-n", type=int, default=32)
    parser.add_argument("--block-k", type=int, default=32)
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp32",
                        help="of A and B (and of C for the op_* methods; C is fp32 for the others)")
    parser.add_argument("--precision", choices=("tf32", "ieee"), default=None,
                        help="fp32 tl.dot precision (default: tf32 on a GPU, ieee on the CPU)")
    parser.add_argument("--programs", type=int, default=0, help="persistent grid size (default: auto)")
    parser.add_argument("--iters", type=int, default=1, help="timed runs per case (the best is reported)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed runs first (default: 1 on a GPU, else 0)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("block_m", "block_n", "block_k"):
        value = getattr(args, name)
        if value < 16 or value & (value - 1):
            parser.error(f"--{name.replace('_', '-')} must be a power of two >= 16 (tl.dot), got {value}")
    dims = (0, 1) if args.dim == "both" else (int(args.dim),)
    methods = (*KERNEL_METHODS, *OP_METHODS) if args.method == "all" else (args.method,)
    cases = [(d, m) for d in dims for m in methods if d == 0 or m not in OP_METHODS]
    if not cases:
        parser.error(f"--method {args.method} gathers rows: it needs --dim 0")

    M, N, K = args.m, args.n, args.k
    # C (fp32) and the ops' cached workspaces (a staging copy of C, or of the gathered A).
    with iris.runtime.iris(heap_size=max(1 << 26, 4 * M * N * 4 + 2 * M * K * 4 + (1 << 22))) as ctx:
        if args.warmup is None:
            args.warmup = 1 if ctx.device.type == "cuda" else 0
        rank, world = ctx.rank, ctx.world_size
        if args.dtype == "bf16" and ctx.backend == "cpu" and any(m in KERNEL_METHODS for _, m in cases):
            # Seen: bf16 tiles through Triton's interpreter give wrong products (numpy has no bf16);
            # the library ops widen them to fp32 there (exact), this file's kernel does not.
            raise SystemExit("--dtype bf16 on the cpu backend works with the op_* methods only; Triton's "
                             "interpreter does not compute bf16 tl.dot correctly: use fp32 or fp16 for the others")
        for dim in dims:
            extent, name = (M, "--m") if dim == 0 else (N, "--n")
            if extent % world:
                raise SystemExit(f"--dim {dim} splits {name} {extent} over {world} ranks: pick a multiple of {world}")
        gen = torch.Generator().manual_seed(args.seed)
        dtype = DTYPES[args.dtype]
        a_full = torch.rand(M, K, generator=gen).mul_(2).sub_(1).to(dtype)
        b_full = torch.rand(K, N, generator=gen).mul_(2).sub_(1).to(dtype)
        reference = a_full.to(ctx.device, torch.float64) @ b_full.to(ctx.device, torch.float64)
        c = ctx.zeros(M, N, dtype=torch.float32)
        ctx.barrier()

        results = [run_case(ctx, d, m, args, a_full, b_full, reference, c) for d, m in cases]
        everyone = ctx.comm.gather(results, root=0)
        ok = True
        if rank == 0:
            print(f"GEMM + all-gather: {world} ranks, backend {ctx.backend}, C[{M}x{N}] = A[{M}x{K}] @ B[{K}x{N}] "
                  f"({args.dtype}), tiles {args.block_m}x{args.block_n}x{args.block_k}; "
                  f"dim 0: A split by rows, dim 1: B split by columns")
            for i, res in enumerate(results):
                per_rank = [rep[i] for rep in everyone]
                slowest = max(r["seconds"] for r in per_rank)
                worst = max(r["error"] for r in per_rank)
                good = all(r["ok"] for r in per_rank)
                ok &= good
                bad = [r for r, rep in enumerate(per_rank) if not rep["ok"]]
                status = "correct" if good else f"WRONG on ranks {bad}"
                print(f"  {res['case']:28s} {status:10s} max rel. error {worst:.1e} (tol {res['tolerance']:.0e}, "
                      f"{res['precision']}); {slowest * 1e3:9.2f} ms, {rate(2.0 * M * N * K / slowest)} "
                      f"({res['programs']} programs per rank)")
        ok = ctx.broadcast(ok if rank == 0 else None)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
