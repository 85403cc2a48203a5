"""Randomised stress of the tile all-reduces and reduce-scatter: many seeded cases, back to back.

    mpiexec -n 3 python -m mpi4py stress_worker.py [cases] [seed] [batch]

A seeded generator, the same on every rank, draws each case: the collective (atomic, spinlock,
one-shot, two-shot, ring, reduce-scatter), the dtype (fp32, fp16, bf16, int32 where the collective
takes it), the tile (2 to 16 rows, 4 to 32 columns), the shape (1 to 3 tiles each way, the last one
usually ragged: see :func:`draw`), whether the data is staged into the symmetric buffer inside the
kernel, and the grid (1 program up to one per tile). Cases run in batches of ``batch`` launches with
no barrier and no host synchronisation between them (different collectives, tilings and lock
arrays, back to back), then every result of the batch is checked bit for bit against torch's fp32
sum rounded once. Rank 0 prints ``STRESS cases=<n> seed=<s> ... ok`` at the end; any wrong element
fails with the case.

Cost: under Triton's interpreter a case costs about its tile count times the device-function calls
of one tile (each nested ``@triton.jit`` call re-patches ``triton.language``, a few ms), almost
independent of the tile's size; the launch itself is a few percent. So cases are kept to a few
tiles each, and what the stress is for (ragged edges, tiles smaller than the tensor and larger
than it, fewer tile rows than ranks, grids smaller than the tile count, mixed collectives back to
back) comes from the distribution rather than from size.
"""

from __future__ import annotations

import os
import random
import sys

import torch

import iris.collectives as ic  # imports iris.runtime first, which picks the backend
import iris.runtime.testing

# isort: split
from collective_kernels import ATOMIC, REDUCE_SCATTER, SPINLOCK, VARIANT_NAMES, all_reduce_kernel

NAMES = tuple(VARIANT_NAMES[v].removeprefix("all_reduce_") for v in range(6))
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "int32": torch.int32}
# Integers times a power of two: exact in the dtype, and every fp32 sum of up to 4 of them is exact.
EXACT = {torch.float32: (1 << 20, 2.0 ** -12), torch.float16: (1 << 10, 2.0 ** -8),
         torch.bfloat16: (1 << 7, 2.0 ** -4)}


def edge(rng: random.Random, block: int, max_tiles: int) -> int:
    """A length of 1 to ``max_tiles`` tiles of ``block``, one tile three times in five,
    whose last tile is ragged (shorter than the block) unless the draw lands on a multiple."""
    tiles = rng.choice((1, 1, 1, 2, max_tiles))
    return (tiles - 1) * block + rng.randint(1, block)


def draw(rng: random.Random, backend: str) -> dict:
    variant = rng.randrange(6)
    dtypes = ["fp32", "fp16", "bf16", "int32"]
    if variant in (ATOMIC, SPINLOCK) and backend == "cpu":
        dtypes = ["fp32", "int32"]  # the interpreter has no 16-bit float atomics
    dtype = rng.choice(dtypes)
    # a BM below or not a multiple of the world size leaves some ranks no rows of a two-shot tile
    BM, BN = rng.choice((2, 4, 8, 16)), rng.choice((4, 8, 16, 32))
    M, N = edge(rng, BM, 3), edge(rng, BN, 3)
    tiles = -(-M // BM) * -(-N // BN)
    return {"variant": variant, "dtype": dtype, "M": M, "N": N, "BM": BM, "BN": BN,
            "stage": variant not in (ATOMIC, SPINLOCK) and rng.random() < 0.5, "grid": rng.randint(1, tiles)}


def rank_input(rank: int, case: dict, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 100_003 + rank)
    dtype, shape = DTYPES[case["dtype"]], (case["M"], case["N"])
    if dtype == torch.int32:
        return torch.randint(-1000, 1000, shape, generator=g, dtype=torch.int32)
    limit, scale = EXACT[dtype]
    return (torch.randint(-limit + 1, limit, shape, generator=g).to(torch.float32) * scale).to(dtype)


def expected(ctx, case: dict, seed: int, out_dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(the reference, where it applies) for this rank."""
    total = sum(rank_input(r, case, seed).to(torch.float64) for r in range(ctx.world_size))
    reference = total.to(torch.float32).to(out_dtype) if out_dtype.is_floating_point else total.to(out_dtype)
    where = torch.ones(case["M"], case["N"], dtype=torch.bool)
    if case["variant"] == REDUCE_SCATTER:
        where[:] = False
        tiles_n = -(-case["N"] // case["BN"])
        for t in ic.reduce_scatter_tiles(ctx.rank, ic.num_tiles(case["M"], case["N"], case["BM"], case["BN"]),
                                         ctx.world_size):
            pm, pn = divmod(t, tiles_n)
            where[pm * case["BM"]:(pm + 1) * case["BM"], pn * case["BN"]:(pn + 1) * case["BN"]] = True
    return reference, where


def out_dtype_of(case: dict):
    dtype = DTYPES[case["dtype"]]
    # atomic and spinlock accumulate 16-bit floats in an fp32 destination (their contract)
    return torch.float32 if case["variant"] in (ATOMIC, SPINLOCK) and dtype in (torch.float16, torch.bfloat16) \
        else dtype


def run_batch(ctx, cases: list[tuple[int, dict]], seed: int) -> None:
    state = []
    for index, case in cases:
        M, N = case["M"], case["N"]
        inp = rank_input(ctx.rank, case, seed + index).to(ctx.device)
        src = ctx.zeros((M, N), dtype=inp.dtype)
        if not case["stage"]:
            src.copy_(inp)
        dst = ctx.zeros((M, N), dtype=out_dtype_of(case))
        locks = ctx.zeros(ic.lock_words(M, N, case["BM"], case["BN"]), dtype=torch.int32)
        state.append((index, case, inp if case["stage"] else src, src, dst, locks))
    ctx.barrier()  # every rank's buffers exist (and are zero) before any rank's kernels reach them
    for _index, case, inp, src, dst, locks in state:
        M, N = case["M"], case["N"]
        all_reduce_kernel[(case["grid"],)](ctx.get_device_context(), inp, src, dst, locks, M, N, N, N, N, ctx.rank,
                                           ctx.world_size, case["variant"], True, case["stage"], False, case["BM"],
                                           case["BN"])
    # all-reduce-atomic returns before the peers' adds land (its contract: the sum is complete once
    # every rank's call is), so wait for every rank; the others are complete when they return
    ctx.barrier()
    for index, case, _inp, _src, dst, _locks in state:
        reference, where = expected(ctx, case, seed + index, dst.dtype)
        got = dst.cpu()
        bad = int((got[where] != reference[where]).sum())
        if bad:
            raise AssertionError(f"case {index} {NAMES[case['variant']]} {case}: {bad} of {int(where.sum())} elements "
                                 f"wrong on rank {ctx.rank}")
    ctx.barrier()  # no rank frees a buffer a peer may still read
    for _index, _case, _inp, src, dst, locks in reversed(state):
        for t in (locks, dst, src):
            ctx.free(t)


def main() -> None:
    cases = int(sys.argv[1]) if len(sys.argv) > 1 else int(os.environ.get("IRIS_STRESS_CASES", "60"))
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else int(os.environ.get("IRIS_STRESS_SEED", "2026"))
    batch = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    ctx = iris.runtime.iris(heap_size=1 << 24)
    rng = random.Random(seed * 31 + ctx.world_size)
    drawn = [(i, draw(rng, ctx.backend)) for i in range(cases)]
    for start in range(0, cases, batch):
        run_batch(ctx, drawn[start:start + batch], seed)
    counts = {name: sum(1 for _, c in drawn if NAMES[c["variant"]] == name) for name in NAMES}
    if ctx.rank == 0:
        print(f"STRESS cases={cases} seed={seed} ranks={ctx.world_size} {counts} ok", flush=True)
    ctx.close()


if __name__ == "__main__":
    main()
