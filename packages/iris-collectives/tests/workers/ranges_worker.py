"""Multi-rank scenarios of the tile collectives' range form (``TileRange``), run by
test_collectives_ranges.py on 1..N ranks.

A persistent kernel passes each program's tiles as one ``TileRange`` to ``all_reduce_one_shot`` or
``all_reduce_two_shot`` (bound or free form): one "ready" and one "done" per program and call.
Inputs are random floats (not exact in any order of summation), so each result must equal, bit for
bit, the reference summed in rank order in fp32 and rounded once to the dtype (to nearest even),
and be the same on every rank. Grids of one program (every tile in one range), of a few programs,
and of one program per tile; tensors with several tiles per row and ragged edges; back-to-back
calls with a lagging rank and the source poisoned as soon as a call returns.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import triton
import triton.language as tl

import iris.collectives as ic  # imports iris.runtime first, which picks the backend
import iris.runtime.testing

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
VARIANTS = ("one_shot", "two_shot")


@triton.jit
def range_all_reduce_kernel(context, src, dst, locks, M, N, stride_src, stride_dst, rank: tl.constexpr,
                            world_size: tl.constexpr, TWO_SHOT: tl.constexpr, BOUND: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """All-reduce ``src`` (M x N, on the heap, filled before the launch) into ``dst``: each program
    passes its tiles ``program_id, program_id + num_programs, ...`` as one range."""
    ctx = ic.DeviceContext.initialize(context, rank, world_size)
    src_view = ic.TensorView(src, M, N, stride_src, 1)
    dst_view = ic.TensorView(dst, M, N, stride_dst, 1)
    tiles = ic.TileRange(tl.program_id(0), dst_view.num_tiles(BLOCK_M, BLOCK_N), tl.num_programs(0),
                         dst_view.num_tiles_n(BLOCK_N), BLOCK_M, BLOCK_N)
    if TWO_SHOT:
        if BOUND:
            ctx.all_reduce_two_shot(tiles, src_view, dst_view, locks)
        else:
            ic.all_reduce_two_shot(ctx, tiles, src_view, dst_view, locks)
    else:
        if BOUND:
            ctx.all_reduce_one_shot(tiles, src_view, dst_view, locks)
        else:
            ic.all_reduce_one_shot(ctx, tiles, src_view, dst_view, locks)


def rank_input(rank: int, shape, dtype, seed: int) -> torch.Tensor:
    """Rank ``rank``'s random input (the same wherever generated): values of mixed magnitude, so
    that sums in different orders differ in their last bits."""
    g = torch.Generator().manual_seed(seed * 1009 + rank * 7919 + 23)
    scale = torch.exp2(torch.randint(-6, 7, shape, generator=g).to(torch.float32))
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def reference(inputs: list[torch.Tensor], dtype) -> torch.Tensor:
    """Summed in rank order in fp32 (from 0), rounded once to ``dtype`` by torch (nearest even)."""
    acc = torch.zeros(inputs[0].shape, dtype=torch.float32)
    for x in inputs:
        acc = acc + x.to(torch.float32)
    return acc.to(dtype)


def check(ctx, actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Bit for bit against the reference, and the same bits on every rank."""
    bits = {2: torch.int16, 4: torch.int32}[expected.element_size()]
    got = actual.cpu().view(bits)
    differ = got != expected.view(bits)
    count = int(differ.sum())
    if count:
        pairs = [(actual.cpu()[tuple(i)].item(), expected[tuple(i)].item()) for i in differ.nonzero()[:4].tolist()]
        raise AssertionError(f"{what}: {count} of {expected.numel()} elements differ from the rank-order reference; "
                             f"first (got, expected): {pairs}")
    for r, theirs in enumerate(ctx.comm.allgather(got)):
        assert torch.equal(theirs, got), f"{what}: rank {ctx.rank} and rank {r} differ in the bits of the result"


def launch(ctx, two_shot: bool, src, dst, locks, M, N, BM, BN, grid: int, bound: bool) -> None:
    range_all_reduce_kernel[(grid,)](ctx.get_device_context(), src, dst, locks, M, N, src.stride(0), dst.stride(0),
                                     rank=ctx.rank, world_size=ctx.world_size, TWO_SHOT=two_shot, BOUND=bound,
                                     BLOCK_M=BM, BLOCK_N=BN)


def scenario_range_all_reduce_random_floats(ctx):
    # every variant and dtype; several tiles per row, ragged edges; one program for every tile, a
    # few programs, one program per tile; BLOCK_M not a multiple of 3 ranks (ragged shares)
    M, N, BM, BN = 21, 40, 8, 16  # 3 x 3 tiles
    tiles = ic.num_tiles(M, N, BM, BN)
    case = 0
    chosen = iris.runtime.testing.spread([(v, d) for v in VARIANTS for d in DTYPES], ctx.world_size)
    for variant in VARIANTS:
        for dtype in DTYPES:
            for grid in (1, 2, tiles):
                case += 1
                if (variant, dtype) not in chosen:
                    continue
                inputs = [rank_input(r, (M, N), dtype, case) for r in range(ctx.world_size)]
                src = ctx.zeros(M, N, dtype=dtype)
                src.copy_(inputs[ctx.rank].to(ctx.device))
                dst = ctx.full((M, N), float("nan"), dtype=dtype)
                locks = ctx.zeros(ic.lock_words(M, N, BM, BN), dtype=torch.int32)
                ctx.barrier()
                launch(ctx, variant == "two_shot", src, dst, locks, M, N, BM, BN, grid, bound=case % 2 == 0)
                check(ctx, dst, reference(inputs, dtype), f"{variant} {dtype} grid {grid}")
                ctx.barrier()
                for t in (locks, dst, src):
                    ctx.free(t)


def scenario_range_more_programs_than_tiles(ctx):
    # a grid of more programs than tiles: the empty ranges do nothing and touch no lock record (the
    # range's record is its first tile's, past the lock array for an empty one: it was written,
    # a heap word someone else owns), and the result is exact, two calls back to back
    M, N, BM, BN = 6, 16, 8, 16  # one tile, ragged
    for variant in VARIANTS:
        for bound in (False, True):
            words = ic.lock_words(M, N, BM, BN)
            lock_space = ctx.zeros(2 * words, dtype=torch.int32)
            src, dst = ctx.zeros(M, N), ctx.full((M, N), float("nan"))
            ctx.barrier()
            for k in range(2):
                inputs = [rank_input(r, (M, N), torch.float32, 900 + k) for r in range(ctx.world_size)]
                src.copy_(inputs[ctx.rank].to(ctx.device))
                ctx.barrier()  # no peer reads the last call's source any more
                launch(ctx, variant == "two_shot", src, dst, lock_space[:words], M, N, BM, BN, 4, bound)
                check(ctx, dst, reference(inputs, torch.float32), f"{variant} bound={bound} grid 4 of 1 tile call {k}")
            ctx.barrier()
            past = lock_space[words:].cpu()
            assert not past.any(), f"{variant} bound={bound}: words past the lock array changed: {past.tolist()}"
            for t in (lock_space, dst, src):
                ctx.free(t)


def scenario_range_back_to_back(ctx):
    # 20 calls per variant with new data on the same buffers and locks, no barrier between them; a
    # rank falls behind now and then; the source is poisoned as soon as a call returns (no peer may
    # read it any more) and the result copied (complete when the call returns)
    W, dev = ctx.world_size, ctx.device
    M, N, BM, BN, R = 16, 32, 8, 16, 20
    for variant in VARIANTS:
        seeds = [500 * (variant == "two_shot") + k for k in range(R)]
        local = torch.stack([rank_input(ctx.rank, (M, N), torch.float32, s) for s in seeds]).to(dev)
        src = ctx.zeros(M, N)
        dst = ctx.zeros(M, N)
        locks = ctx.zeros(ic.lock_words(M, N, BM, BN), dtype=torch.int32)
        ctx.barrier()
        results = []
        for k in range(R):
            if k % W == ctx.rank and k % 3 == 0:
                time.sleep(0.005)
            src.copy_(local[k])
            launch(ctx, variant == "two_shot", src, dst, locks, M, N, BM, BN, grid=2, bound=True)
            results.append(dst.clone())
            src.fill_(float("nan"))  # a late reader would sum NaNs
        for k in range(R):
            inputs = [rank_input(r, (M, N), torch.float32, seeds[k]) for r in range(W)]
            check(ctx, results[k], reference(inputs, torch.float32), f"{variant} call {k + 1}/{R}")
        ctx.barrier()
        for t in (locks, dst, src):
            ctx.free(t)


def scenario_range_two_shot_in_place(ctx):
    # two-shot with the source as destination (on the heap): each share is read, then written, by
    # its owner alone
    M, N, BM, BN = 16, 48, 4, 16
    inputs = [rank_input(r, (M, N), torch.bfloat16, 77) for r in range(ctx.world_size)]
    buf = ctx.zeros(M, N, dtype=torch.bfloat16)
    buf.copy_(inputs[ctx.rank].to(ctx.device))
    locks = ctx.zeros(ic.lock_words(M, N, BM, BN), dtype=torch.int32)
    ctx.barrier()
    launch(ctx, True, buf, buf, locks, M, N, BM, BN, grid=3, bound=False)
    check(ctx, buf, reference(inputs, torch.bfloat16), "two_shot in place")
    ctx.barrier()
    ctx.free(locks)
    ctx.free(buf)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    iris.runtime.testing.run_scenarios(globals(), heap_size=1 << 24)
