"""Multi-rank scenarios of iris.collectives (run by test_collectives_multirank.py on 1..N ranks).

Every result is compared with a reference computed on the host from the inputs of every rank,
which each rank regenerates from seeds (no communication needed to know the answer). Outputs are
poisoned before a kernel runs, so a kernel that skips work fails. Float inputs are small multiples
of a power of two, so every fp32 sum of them is exact in any order: each result must equal, bit for
bit, torch's fp32 sum rounded once to the output dtype (round to nearest even, on every backend);
the all-reduces that compute each sum once (one-shot, two-shot, ring) must also agree bit for bit
across ranks.

``IRIS_TEST_REPEATS`` sets the number of back-to-back launches (default 100 on cuda, 20 on cpu).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

import torch
import triton

import iris.collectives as ic  # imports iris.runtime first, which picks the backend
import iris.runtime.testing
from iris.device import EVENT_IDS, EVENT_NAMES
from iris.device._layout import GROUP_RING_BYTES
from iris.runtime.trace import load_trace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import collective_kernels as K

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "int32": torch.int32}
# Float inputs: integers k with |k| < LIMIT, times SCALE. Each is exact in the dtype (as many
# significant bits as its mantissa holds), and a sum of up to 8 of them needs at most 3 more bits,
# which fp32 holds: every order of summation gives the same, exact fp32 sum, and narrowing that sum
# to fp16 or bf16 has to round (ties included), which is what these tests check.
EXACT_INPUTS = {torch.float32: (1 << 20, 2.0 ** -12), torch.float16: (1 << 11, 2.0 ** -8),
                torch.bfloat16: (1 << 8, 2.0 ** -4)}
POISON = {torch.float32: float("nan"), torch.float16: float("nan"), torch.bfloat16: float("nan"),
          torch.int32: -1234567}
ONCE = (K.ONE_SHOT, K.TWO_SHOT, K.RING)  # each sum computed once (or in one order): equal on every rank
LOCKING = (K.SPINLOCK, K.ONE_SHOT, K.TWO_SHOT, K.RING, K.REDUCE_SCATTER)


def repeats(ctx) -> int:
    return int(os.environ.get("IRIS_TEST_REPEATS", "100" if ctx.device.type == "cuda" else "20"))


def rank_input(rank: int, shape, dtype, seed: int) -> torch.Tensor:
    """Rank ``rank``'s input, the same wherever it is generated (CPU generator)."""
    g = torch.Generator().manual_seed(seed * 1009 + rank * 7919 + 17)
    if dtype.is_floating_point:
        limit, scale = EXACT_INPUTS[dtype]
        values = torch.randint(-limit + 1, limit, shape, generator=g, dtype=torch.int64).to(torch.float32) * scale
        exact = values.to(dtype)
        assert torch.equal(exact.to(torch.float32), values), "EXACT_INPUTS must be exact in the dtype"
        return exact
    return torch.randint(-1000, 1000, shape, generator=g, dtype=torch.int64).to(dtype)


def reference_sum(inputs, dtype) -> torch.Tensor:
    """The fp32 sum (exact for EXACT_INPUTS) rounded once to ``dtype`` by torch, to nearest even."""
    if dtype.is_floating_point:
        return sum(x.to(torch.float32) for x in inputs).to(dtype)
    return sum(x.to(torch.int64) for x in inputs).to(dtype)


def check(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Bit for bit (NaN poison included): an element one unit in the last place off fails."""
    actual = actual.cpu()
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[expected.element_size()]
    differ = actual.view(bits) != expected.view(bits)
    count = int(differ.sum())
    if count:
        where = differ.nonzero()[:5].tolist()
        pairs = [(actual[tuple(i)].item(), expected[tuple(i)].item()) for i in where]
        raise AssertionError(f"{what}: {count} of {actual.numel()} elements differ from the reference in their "
                             f"bits; first (got, expected) at {where}: {pairs}")


def same_on_every_rank(ctx, tensor: torch.Tensor, what: str) -> None:
    mine = tensor.cpu().view(torch.uint8 if tensor.element_size() == 1 else torch.int16
                             if tensor.element_size() == 2 else torch.int32)
    everyone = ctx.comm.allgather(mine)
    for r, theirs in enumerate(everyone):
        assert torch.equal(theirs, mine), f"{what}: rank {ctx.rank} and rank {r} differ in the bits of the result"


def dst_dtype_for(variant: int, dtype):
    """Atomic and spinlock variants accumulate 16-bit data in an fp32 destination."""
    if variant in (K.ATOMIC, K.SPINLOCK) and dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    return dtype


def launch_all_reduce(ctx, variant, inp, src, dst, locks, M, N, BM, BN, *, stage=True, bound=None, trace=False,
                      grid=2):
    K.all_reduce_kernel[(grid,)](
        ctx.get_device_context(), inp, src, dst, locks, M, N, inp.stride(0), src.stride(0), dst.stride(0),
        rank=ctx.rank, world_size=ctx.world_size, VARIANT=variant, BOUND=(variant % 2 == 0) if bound is None else bound,
        STAGE=stage, TRACE=trace, BLOCK_M=BM, BLOCK_N=BN)


def expected_result(ctx, variant, inputs, out_dtype, poison_value, M, N, BM, BN) -> torch.Tensor:
    expected = reference_sum(inputs, out_dtype)
    if variant == K.REDUCE_SCATTER:
        owned = set(ic.reduce_scatter_tiles(ctx.rank, ic.num_tiles(M, N, BM, BN), ctx.world_size))
        tiles_n = -(-N // BN)
        full = expected
        expected = torch.full((M, N), poison_value, dtype=out_dtype)
        for t in owned:
            pm, pn = divmod(t, tiles_n)
            rows, cols = slice(pm * BM, (pm + 1) * BM), slice(pn * BN, (pn + 1) * BN)
            expected[rows, cols] = full[rows, cols]
    return expected


def run_all_reduce(ctx, variant, dtype, M, N, BM, BN, seed, *, stage=True, grid=2):
    """One call of ``variant`` on fresh buffers; checks the result against the host reference."""
    W, dev = ctx.world_size, ctx.device
    inputs = [rank_input(r, (M, N), dtype, seed) for r in range(W)]
    out_dtype = dst_dtype_for(variant, dtype)
    src = ctx.zeros(M, N, dtype=dtype)
    if stage:
        inp = inputs[ctx.rank].to(dev)
    else:
        src.copy_(inputs[ctx.rank].to(dev))
        inp = src
    zero_dst = variant in (K.ATOMIC, K.SPINLOCK)
    poison_value = 0 if zero_dst else POISON[out_dtype]
    dst = ctx.full((M, N), poison_value, dtype=out_dtype)
    locks = ctx.zeros(ic.lock_words(M, N, BM, BN), dtype=torch.int32)
    ctx.barrier()  # every rank's dst poisoned (or zeroed) before anyone writes into it
    launch_all_reduce(ctx, variant, inp, src, dst, locks, M, N, BM, BN, stage=stage, grid=grid)
    if variant in (K.ATOMIC,):
        ctx.barrier()  # atomics: the sum is complete once every rank is done
    what = f"{K.VARIANT_NAMES[variant]} {tuple(inputs[0].shape)} {dtype} blocks {BM}x{BN} rank {ctx.rank}/{W}"
    check(dst, expected_result(ctx, variant, inputs, out_dtype, poison_value, M, N, BM, BN), what)
    if variant in ONCE:
        same_on_every_rank(ctx, dst, what)
    ctx.barrier()
    for t in (locks, dst, src):
        ctx.free(t)


# --- the all-reduce family ---------------------------------------------------------------------

def scenario_all_reduce_dtypes_and_ragged_shapes(ctx):
    """Every variant x fp32/fp16/bf16/int32, on a ragged shape and on a tensor smaller than a block.

    17 x 33 in 16 x 32 blocks has one tile of each kind (full, ragged rows, ragged columns, both):
    what a larger ragged shape adds is more of the same tiles, and under the interpreter every
    tile costs (130 x 257 is in scenario_all_reduce_130x257)."""
    seed = 1
    cases = [(variant, dtype) for variant in K.VARIANT_NAMES for dtype in DTYPES.values()]
    mine = iris.runtime.testing.spread(cases, ctx.world_size)
    for variant, dtype in cases:
        for M, N in ((17, 33), (5, 7)):
            if (variant, dtype) in mine:
                run_all_reduce(ctx, variant, dtype, M, N, 16, 32, seed)
            seed += 1


def scenario_all_reduce_130x257(ctx):
    """The full-size ragged case of the issue, every variant (64x64 blocks: 3 x 5 tiles)."""
    for variant in K.VARIANT_NAMES:
        run_all_reduce(ctx, variant, torch.float32, 130, 257, 64, 64, seed=100 + variant)
    run_all_reduce(ctx, K.TWO_SHOT, torch.bfloat16, 130, 257, 64, 64, seed=200)


def scenario_all_reduce_many_tiles_per_program(ctx):
    """Every variant with many tiles per program (grid 2), several times: the warps of a program
    drift apart over the persistent loop, which is what exposed the load-then-store counter race
    on the GPU (a late warp waited for the next call's flag value)."""
    # On the cpu backend 12 ragged tiles (6 per program): every program's loop goes round several
    # times, which is what the interpreter can show; the drift needs a GPU.
    M, N, BM, BN, R = (130, 257, 16, 32, 5) if ctx.device.type == "cuda" else (30, 40, 8, 16, 1)
    for variant in K.VARIANT_NAMES:
        for k in range(R):
            run_all_reduce(ctx, variant, torch.float32, M, N, BM, BN, seed=400 + 10 * variant + k)


def scenario_all_reduce_source_in_place(ctx):
    """One-shot, two-shot and reduce-scatter reading the input where it lies (no staging copy), and
    one program per tile (the ring's source off the heap: scenario_all_reduce_ring_source_off_heap)."""
    for variant in (K.ONE_SHOT, K.TWO_SHOT, K.REDUCE_SCATTER):
        run_all_reduce(ctx, variant, torch.float32, 20, 40, 8, 16, seed=300 + variant, stage=False)
    run_all_reduce(ctx, K.RING, torch.float16, 20, 40, 8, 16, seed=310, grid=15)
    run_all_reduce(ctx, K.TWO_SHOT, torch.int32, 20, 40, 8, 16, seed=311, grid=15)
    # two-shot with fewer rows per tile than ranks (3, 4): some ranks reduce no rows of a tile
    run_all_reduce(ctx, K.TWO_SHOT, torch.float32, 7, 40, 2, 16, seed=312, grid=3)


def scenario_back_to_back(ctx):
    """Each lock-using collective launched ``IRIS_TEST_REPEATS`` times in a row with new data, the
    same source, destination and locks, no barrier and no reset in between; one rank lags now and
    then so that others run ahead. Results are copied as soon as a launch returns (they must be
    complete then), and the source is poisoned right away (no peer may still read it); all are
    checked at the end."""
    W, dev, R = ctx.world_size, ctx.device, repeats(ctx)
    # 2 x 2 tiles on the GPU; on the cpu backend 1 x 2, one per program of the grid of 2 (what is
    # under test is the repeated launch on the same locks, and every interpreted tile costs)
    M, N, BM, BN = (20, 40, 16, 32) if ctx.device.type == "cuda" else (12, 40, 16, 32)
    for variant in LOCKING:
        dtype = torch.bfloat16 if variant == K.RING else torch.float32
        out_dtype = dst_dtype_for(variant, dtype)
        seeds = [1000 * variant + k for k in range(R)]
        local = torch.stack([rank_input(ctx.rank, (M, N), dtype, s) for s in seeds]).to(dev)
        src = ctx.zeros(M, N, dtype=dtype)
        if variant == K.SPINLOCK:
            dst = ctx.zeros(R, M, N, dtype=out_dtype)  # adds into zeroed memory: a fresh slice per call
        else:
            dst = ctx.full((M, N), POISON[out_dtype], dtype=out_dtype)
        locks = ctx.zeros(ic.lock_words(M, N, BM, BN), dtype=torch.int32)
        ctx.barrier()
        results = []
        for k in range(R):
            if k % W == ctx.rank and k % 3 == 0:
                time.sleep(0.005)  # fall behind the others
            out = dst[k] if variant == K.SPINLOCK else dst
            launch_all_reduce(ctx, variant, local[k], src, out, locks, M, N, BM, BN)
            results.append(out.clone())  # complete on this rank when the launch returns
            if variant in (K.ONE_SHOT, K.TWO_SHOT, K.REDUCE_SCATTER):
                src.fill_(POISON[dtype])  # no peer reads it any more: a late reader would sum NaNs
        for k in range(R):
            inputs = [rank_input(r, (M, N), dtype, seeds[k]) for r in range(W)]
            what = f"{K.VARIANT_NAMES[variant]} launch {k + 1}/{R} rank {ctx.rank}/{W}"
            poison = 0 if variant == K.SPINLOCK else POISON[out_dtype]
            check(results[k], expected_result(ctx, variant, inputs, out_dtype, poison, M, N, BM, BN), what)
        ctx.barrier()
        for t in (locks, dst, src):
            ctx.free(t)


def small_ints(shape, dtype, seed: int) -> torch.Tensor:
    """Integers in [-4, 4] as ``dtype`` (CPU generator): sums and sums of squares of a few of them are
    exact in fp32 in any order, so a norm of them must match torch's fp32 norm bit for bit."""
    return torch.randint(-4, 5, shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def run_all_reduce_rmsnorm(ctx, M, N, BM, dtype, seed, *, two_shot, range_form, bound, calls=2, grid=2):
    """The tile collective ``all_reduce_rmsnorm`` on heap buffers (two-shot writes every rank's
    outputs), ``calls`` launches back to back with new data, the residual updated in place, each
    result bit for bit against torch: the fp32 sum plus the residual rounded once, and
    ``rms_norm`` of the fp32 rows with fp32 weights rounded once."""
    W, dev, BN = ctx.world_size, ctx.device, triton.next_power_of_2(N)
    eps = 1e-5
    weight = torch.randn(N, generator=torch.Generator().manual_seed(seed)).to(dev)
    src, residual = ctx.zeros(M, N, dtype=dtype), ctx.zeros(M, N, dtype=dtype)
    dst = ctx.full((M, N), float("nan"), dtype=dtype)
    # the lock array, followed by as many words that no call may touch (an empty range of a grid
    # larger than the tiles once wrote its lock record there)
    words = ic.lock_words(M, N, BM, BN)
    lock_space = ctx.zeros(2 * words, dtype=torch.int32)
    locks = lock_space[:words]
    stream = small_ints((M, N), dtype, seed + 99)  # the residual, the same on every rank
    residual.copy_(stream.to(dev))
    ctx.barrier()
    what = (f"all_reduce_rmsnorm {'two' if two_shot else 'one'}-shot {'range' if range_form else 'tiles'} "
            f"{M}x{N} {dtype} rows {BM} rank {ctx.rank}/{W}")
    for k in range(calls):
        inputs = [small_ints((M, N), dtype, seed + 10 * k + r) for r in range(W)]
        src.copy_(inputs[ctx.rank].to(dev))  # no peer reads the last call's any more
        dst.fill_(float("nan"))  # peers write their shares into it only once this rank is in the call
        K.all_reduce_rmsnorm_kernel[(grid,)](ctx.get_device_context(), src, residual, weight, dst, residual, weight,
                                             locks, M, N, eps, rank=ctx.rank, world_size=W, TWO_SHOT=two_shot,
                                             RANGE=range_form, BOUND=bound, ROW_SCALES=False, BLOCK_M=BM,
                                             BLOCK_N=BN)
        h = sum(x.float() for x in inputs) + stream.float()
        check(dst, torch.nn.functional.rms_norm(h, (N,), weight.cpu(), eps).to(dtype), f"{what} call {k}: out")
        stream = h.to(dtype)
        check(residual, stream, f"{what} call {k}: residual")
        same_on_every_rank(ctx, dst, what)
    ctx.barrier()
    past = lock_space[words:].cpu()
    assert not past.any(), f"{what}, grid {grid}: words past the lock array changed: {past.tolist()}"
    for t in (lock_space, dst, residual, src):
        ctx.free(t)


def scenario_all_reduce_rmsnorm(ctx):
    """The tile collective all-reduce + residual + RMSNorm: one-shot and two-shot, per tile and per
    program range, bound and free, fp32/bf16/fp16, ragged rows and columns (two-shot with 3 ranks:
    ragged shares), two launches back to back with the residual in place; grids of more programs
    than tiles (empty ranges)."""
    rows = triton.next_power_of_2(ctx.world_size)  # two-shot: one row per rank and tile
    run_all_reduce_rmsnorm(ctx, 5, 24, 2, torch.float32, 1500, two_shot=False, range_form=False, bound=True)
    run_all_reduce_rmsnorm(ctx, 5, 40, 2, torch.bfloat16, 1600, two_shot=False, range_form=True, bound=False)
    run_all_reduce_rmsnorm(ctx, 6, 24, rows, torch.float16, 1700, two_shot=True, range_form=False, bound=False)
    run_all_reduce_rmsnorm(ctx, 7, 40, rows, torch.bfloat16, 1800, two_shot=True, range_form=True, bound=True)
    # more programs than tiles: the empty ranges do nothing (at 8 ranks the case above has one
    # tile for its two programs; an empty range once used a lock record past the array)
    run_all_reduce_rmsnorm(ctx, 3, 24, 4, torch.float32, 1900, two_shot=False, range_form=True, bound=True, grid=3)
    run_all_reduce_rmsnorm(ctx, 3, 24, rows, torch.float32, 1950, two_shot=True, range_form=True, bound=False, grid=3)


def scenario_tracing_records_one_event_per_tile(ctx):
    """With tracing, every collective call records one 'collective' event (id 36) per tile."""
    M, N, BM, BN = 20, 40, 16, 32
    tiles = ic.num_tiles(M, N, BM, BN)
    src = ctx.zeros(M, N, dtype=torch.float32)
    dst = ctx.zeros(M, N, dtype=torch.float32)
    locks = ctx.zeros(ic.lock_words(M, N, BM, BN), dtype=torch.int32)
    inp = rank_input(ctx.rank, (M, N), torch.float32, 7).to(ctx.device)
    ctx.tracing.enable(max_events=1000)
    ctx.tracing.reset()
    ctx.barrier()
    launch_all_reduce(ctx, K.ONE_SHOT, inp, src, dst, locks, M, N, BM, BN, trace=True)
    ctx.barrier()
    events, dropped = ctx.tracing.recorded()
    ctx.tracing.disable()
    assert dropped == 0
    ids = events[:, 0].tolist()
    assert ids == [36] * tiles, f"rank {ctx.rank}: expected {tiles} collective events, got ids {ids}"
    assert sorted((int(e[6]), int(e[7])) for e in events) == sorted(divmod(t, 2) for t in range(tiles))
    assert all(int(e[2]) == -1 and int(e[10]) >= int(e[9]) > 0 for e in events), events
    ctx.barrier()
    for t in (locks, dst, src):
        ctx.free(t)


# --- gather family -------------------------------------------------------------------------------

def scenario_all_gather(ctx):
    """Both dims, four dtypes, ragged local shapes and one smaller than a block; host barrier, then
    the whole gathered tensor."""
    W, dev = ctx.world_size, ctx.device
    cases = [(torch.float32, 9, 13), (torch.bfloat16, 9, 13), (torch.int32, 9, 13), (torch.float16, 3, 5)]
    for dim in (0, 1):
        for i, (dtype, ml, nl) in enumerate(cases):
            M, N = (W * ml, nl) if dim == 0 else (ml, W * nl)
            inputs = [rank_input(r, (ml, nl), dtype, 400 + 10 * dim + i) for r in range(W)]
            dst = ctx.full((M, N), POISON[dtype], dtype=dtype)
            ctx.barrier()
            inp = inputs[ctx.rank].to(dev)
            K.all_gather_kernel[(2,)](ctx.get_device_context(), inp, dst, dst, dst, ml, nl, M, N, inp.stride(0),
                                      dst.stride(0), dst.stride(0), rank=ctx.rank, world_size=W, DIM=dim,
                                      BOUND=bool(i % 2), BARRIER=False, BLOCK_M=8, BLOCK_N=8)
            ctx.barrier()
            check(dst, torch.cat(inputs, dim=dim), f"all_gather dim {dim} {dtype} rank {ctx.rank}")
            ctx.barrier()
            ctx.free(dst)


def scenario_all_gather_with_device_barrier(ctx):
    """all_gather followed by a device barrier per tile, launched repeatedly with the same barrier
    flags (epochs, no reset): after the barrier, each rank reads the tile's rows from every rank."""
    W, dev = ctx.world_size, ctx.device
    ml, nl, BM, BN = 10, 12, 8, 8
    M, N = W * ml, nl
    launches = 5
    tiles = ic.num_tiles(ml, nl, BM, BN)
    flags = ctx.zeros(ic.barrier_words(tiles), dtype=torch.int32)
    dst = ctx.full((launches, M, N), POISON[torch.float32], dtype=torch.float32)
    ctx.barrier()
    outs = []
    for k in range(launches):
        inp = rank_input(ctx.rank, (ml, nl), torch.float32, 500 + k).to(dev)
        out = torch.full((M, N), -1.0, device=dev)
        K.all_gather_kernel[(2,)](ctx.get_device_context(), inp, dst[k], flags, out, ml, nl, M, N, inp.stride(0),
                                  dst.stride(1), out.stride(0), rank=ctx.rank, world_size=W, DIM=0, BOUND=True,
                                  BARRIER=True, BLOCK_M=BM, BLOCK_N=BN)
        outs.append(out)
    for k in range(launches):
        expected = torch.cat([rank_input(r, (ml, nl), torch.float32, 500 + k) for r in range(W)])
        check(outs[k], expected, f"all_gather + device_barrier launch {k} rank {ctx.rank}")
    generations = flags.view(tiles, ic.BARRIER_WORDS)[:, 1].cpu()
    assert generations.tolist() == [launches] * tiles, generations
    ctx.barrier()
    ctx.free(dst)
    ctx.free(flags)


def scenario_gather(ctx):
    """Each rank loads every tile of the next rank's tensor; with and without a vector hint."""
    W, dev = ctx.world_size, ctx.device
    cases = [(torch.float32, 19, 23, 0), (torch.float16, 19, 23, 0), (torch.int32, 16, 64, 16),
             (torch.bfloat16, 16, 64, 16), (torch.float32, 3, 5, 0)]
    for i, (dtype, M, N, hint) in enumerate(cases):
        src = ctx.zeros(M, N, dtype=dtype)
        src.copy_(rank_input(ctx.rank, (M, N), dtype, 600 + i).to(dev))
        ctx.barrier()  # every rank's data is in place before anyone reads it
        source = (ctx.rank + 1) % W
        out = torch.full((M, N), POISON[dtype], dtype=dtype, device=dev)
        K.gather_kernel[(2,)](ctx.get_device_context(), src, out, M, N, src.stride(0), out.stride(0), rank=ctx.rank,
                              world_size=W, SOURCE=source, BOUND=bool(i % 2), HINT_N=hint, BLOCK_M=8, BLOCK_N=16)
        check(out, rank_input(source, (M, N), dtype, 600 + i), f"gather from {source} {dtype} rank {ctx.rank}")
        ctx.barrier()
        ctx.free(src)


def scenario_all_to_all(ctx):
    """Column blocks of N_per_rank = 13 (not a multiple of the 8-wide block), and of 5 (smaller than
    a block), between every pair."""
    W, dev = ctx.world_size, ctx.device
    for i, (dtype, M, npr) in enumerate(((torch.float32, 9, 13), (torch.int32, 9, 13), (torch.bfloat16, 9, 13),
                                         (torch.float16, 3, 5))):
        inputs = [rank_input(r, (M, W * npr), dtype, 700 + i) for r in range(W)]
        src = inputs[ctx.rank].to(dev)
        dst = ctx.full((M, W * npr), POISON[dtype], dtype=dtype)
        ctx.barrier()
        K.all_to_all_kernel[(2,)](ctx.get_device_context(), src, dst, M, src.stride(0), dst.stride(0), rank=ctx.rank,
                                  world_size=W, N_PER_RANK=npr, BOUND=bool(i % 2), BLOCK_M=8, BLOCK_N=8)
        ctx.barrier()
        expected = torch.cat([inputs[p][:, ctx.rank * npr:(ctx.rank + 1) * npr] for p in range(W)], dim=1)
        check(dst, expected, f"all_to_all {dtype} rank {ctx.rank}")
        ctx.barrier()
        ctx.free(dst)


# --- any strides ---------------------------------------------------------------------------------

#: Non-contiguous M x N views: (storage shape, the view of that storage). Each names the strides
#: (stride_m, stride_n) a TensorView of it gets.
LAYOUTS = {
    # columns 5 .. 5+N of a wider tensor: (N + 7, 1), first element 5 elements in
    "column slice": (lambda M, N: (M, N + 7), lambda s, M, N: s[:, 5:5 + N]),
    # the transpose of an N x M tensor: (1, M)
    "transposed": (lambda M, N: (N, M), lambda s, M, N: s.t()),
    # every other column of rows padded to 2N + 3: (2N + 3, 2)
    "padded rows, every other column": (lambda M, N: (M, 2 * N + 3), lambda s, M, N: s[:, 0:2 * N:2]),
}
_L = list(LAYOUTS)
# (source, destination): every layout is a source once and a destination once.
LAYOUT_PAIRS = tuple((_L[i], _L[(i + 1) % 3]) for i in range(3))


def strided(alloc, layout: str, M: int, N: int):
    """``(storage, view)``: an M x N view of ``layout`` inside a storage from ``alloc(shape)``."""
    shape_of, view_of = LAYOUTS[layout]
    storage = alloc(shape_of(M, N))
    view = view_of(storage, M, N)
    assert tuple(view.shape) == (M, N) and not view.is_contiguous(), (layout, view.shape, view.stride())
    return storage, view


def on_heap(ctx, fill, dtype):
    return lambda shape: ctx.full(shape, fill, dtype=dtype)


def off_heap(ctx, fill, dtype):
    return lambda shape: torch.full(shape, fill, dtype=dtype, device=ctx.device)


def in_storage(layout: str, values: torch.Tensor, fill) -> torch.Tensor:
    """The storage (CPU) a correct kernel leaves: ``values`` in the view, ``fill`` everywhere else."""
    storage, view = strided(lambda shape: torch.full(shape, fill, dtype=values.dtype), layout, *values.shape)
    view.copy_(values)
    return storage


def launch_strided_all_reduce(ctx, variant, inp, src, dst, locks, M, N, BM, BN, *, stage=False, trace=False, grid=2):
    K.strided_all_reduce_kernel[(grid,)](
        ctx.get_device_context(), inp, src, dst, locks, M, N, *inp.stride(), *src.stride(), *dst.stride(),
        rank=ctx.rank, world_size=ctx.world_size, VARIANT=variant, STAGE=stage, TRACE=trace, BLOCK_M=BM, BLOCK_N=BN)


def scenario_strided_views_all_reduce(ctx):
    """Every all-reduce and reduce_scatter on non-contiguous views (a column slice, a transpose, padded
    rows with every other column), each layout once as the source and once as the destination: the
    result must match the reference, and the storage around each view must keep its poison."""
    W, dev = ctx.world_size, ctx.device
    M, N, BM, BN = 9, 12, 8, 8  # 2 x 2 ragged tiles
    cases = [(variant, i) for variant in K.VARIANT_NAMES for i in range(len(LAYOUT_PAIRS))]
    for variant, i in iris.runtime.testing.spread(cases, W):
        src_layout, dst_layout = LAYOUT_PAIRS[i]
        dtype = torch.int32 if i == 1 else torch.float32
        seed = 900 + 10 * variant + i
        inputs = [rank_input(r, (M, N), dtype, seed) for r in range(W)]
        src_storage, src = strided(on_heap(ctx, POISON[dtype], dtype), src_layout, M, N)
        src.copy_(inputs[ctx.rank].to(dev))
        dst_storage, dst = strided(on_heap(ctx, POISON[dtype], dtype), dst_layout, M, N)
        poison = 0 if variant in (K.ATOMIC, K.SPINLOCK) else POISON[dtype]
        dst.fill_(poison)
        locks = ctx.zeros(ic.lock_words(M, N, BM, BN), dtype=torch.int32)
        ctx.barrier()
        launch_strided_all_reduce(ctx, variant, src, src, dst, locks, M, N, BM, BN)
        if variant == K.ATOMIC:
            ctx.barrier()
        what = (f"{K.VARIANT_NAMES[variant]} {dtype} src {src_layout} {tuple(src.stride())}, dst {dst_layout} "
                f"{tuple(dst.stride())}, rank {ctx.rank}/{W}")
        expected = expected_result(ctx, variant, inputs, dtype, poison, M, N, BM, BN)
        check(dst_storage, in_storage(dst_layout, expected, POISON[dtype]), what)
        check(src_storage, in_storage(src_layout, inputs[ctx.rank], POISON[dtype]), what + " (source)")
        ctx.barrier()
        for t in (locks, dst_storage, src_storage):
            ctx.free(t)


def scenario_strided_views_gather_family(ctx):
    """all_gather (both dims), gather and all_to_all between non-contiguous views, each layout once as
    the source and once as the destination; the storage around each view must keep its poison."""
    W, dev = ctx.world_size, ctx.device
    for i, (a, b) in enumerate(LAYOUT_PAIRS):
        dtype = torch.int32 if i == 1 else torch.float32
        fill = POISON[dtype]
        # all_gather: the local input (this rank's memory, layout a) into the gathered tensor (heap, b)
        ml, nl = 5, 6
        for dim in (0, 1):
            M, N = (W * ml, nl) if dim == 0 else (ml, W * nl)
            inputs = [rank_input(r, (ml, nl), dtype, 950 + 10 * i + dim) for r in range(W)]
            _, inp = strided(off_heap(ctx, fill, dtype), a, ml, nl)
            inp.copy_(inputs[ctx.rank].to(dev))
            dst_storage, dst = strided(on_heap(ctx, fill, dtype), b, M, N)
            ctx.barrier()
            K.strided_all_gather_kernel[(2,)](ctx.get_device_context(), inp, dst, ml, nl, M, N, *inp.stride(),
                                              *dst.stride(), rank=ctx.rank, world_size=W, DIM=dim, TRACE=False,
                                              BLOCK_M=4, BLOCK_N=4)
            ctx.barrier()
            check(dst_storage, in_storage(b, torch.cat(inputs, dim=dim), fill),
                  f"all_gather dim {dim} {dtype} from {a} into {b} {tuple(dst.stride())} rank {ctx.rank}")
            ctx.barrier()
            ctx.free(dst_storage)
        # gather: the next rank's tensor (heap, layout a) into this rank's memory (layout b)
        M, N = 9, 12
        src_storage, src = strided(on_heap(ctx, fill, dtype), a, M, N)
        src.copy_(rank_input(ctx.rank, (M, N), dtype, 980 + i).to(dev))
        out_storage, out = strided(off_heap(ctx, fill, dtype), b, M, N)
        source = (ctx.rank + 1) % W
        ctx.barrier()
        K.strided_gather_kernel[(2,)](ctx.get_device_context(), src, out, M, N, *src.stride(), *out.stride(),
                                      rank=ctx.rank, world_size=W, SOURCE=source, TRACE=False, BLOCK_M=8, BLOCK_N=8)
        check(out_storage, in_storage(b, rank_input(source, (M, N), dtype, 980 + i), fill),
              f"gather from rank {source}'s {a} {tuple(src.stride())} into {b} {tuple(out.stride())} rank {ctx.rank}")
        ctx.barrier()
        ctx.free(src_storage)
        # all_to_all: this rank's memory (layout a) into the heap (layout b)
        M, npr = 5, 6
        inputs = [rank_input(r, (M, W * npr), dtype, 990 + i) for r in range(W)]
        _, src = strided(off_heap(ctx, fill, dtype), a, M, W * npr)
        src.copy_(inputs[ctx.rank].to(dev))
        dst_storage, dst = strided(on_heap(ctx, fill, dtype), b, M, W * npr)
        ctx.barrier()
        K.strided_all_to_all_kernel[(2,)](ctx.get_device_context(), src, dst, M, *src.stride(), *dst.stride(),
                                          rank=ctx.rank, world_size=W, N_PER_RANK=npr, TRACE=False, BLOCK_M=4,
                                          BLOCK_N=4)
        ctx.barrier()
        expected = torch.cat([inputs[p][:, ctx.rank * npr:(ctx.rank + 1) * npr] for p in range(W)], dim=1)
        check(dst_storage, in_storage(b, expected, fill),
              f"all_to_all {dtype} from {a} {tuple(src.stride())} into {b} {tuple(dst.stride())} rank {ctx.rank}")
        ctx.barrier()
        ctx.free(dst_storage)


def scenario_tensor_view_helpers_any_strides(ctx):
    """TensorView's load/store (frame), offsets/pointers/mask, load(other=) and num_tiles_m/_n/
    num_tiles on the three non-contiguous layouts, in this rank's memory, against torch."""
    dev = ctx.device
    M, N, BM, BN, OTHER = 9, 12, 8, 8, -7
    tm, tn = -(-M // BM), -(-N // BN)
    rows = torch.arange(tm * BM).view(tm, 1, BM, 1)  # indexed [pid_m, pid_n, row, column]
    cols = torch.arange(tn * BN).view(1, tn, 1, BN)
    for i in range(3):
        a, b, c = _L[i], _L[(i + 1) % 3], _L[(i + 2) % 3]
        values = rank_input(ctx.rank, (M, N), torch.int32, 1000 + i)
        src_storage, src = strided(off_heap(ctx, -1, torch.int32), a, M, N)
        src.copy_(values.to(dev))
        dst_storage, dst = strided(off_heap(ctx, -1, torch.int32), b, M, N)
        dst2_storage, dst2 = strided(off_heap(ctx, -1, torch.int32), c, M, N)
        blocks = torch.full((tm * tn, BM, BN), -1, dtype=torch.int32, device=dev)
        offsets = torch.full((tm * tn, BM, BN), -1, dtype=torch.int64, device=dev)
        counts = torch.full((3,), -1, dtype=torch.int64, device=dev)
        K.view_helpers_kernel[(tm * tn,)](src, dst, dst2, blocks, offsets, counts, M, N, *src.stride(), *dst.stride(),
                                          *dst2.stride(), OTHER, BLOCK_M=BM, BLOCK_N=BN)
        what = f"TensorView on {a} {tuple(src.stride())}, to {b} and {c}"
        check(src_storage, in_storage(a, values, -1), what + ": source untouched")
        check(dst_storage, in_storage(b, values, -1), what + ": load/store")
        check(dst2_storage, in_storage(c, values, -1), what + ": offsets/pointers/mask")
        padded = torch.full((tm * BM, tn * BN), OTHER, dtype=torch.int32)
        padded[:M, :N] = values
        check(blocks, padded.view(tm, BM, tn, BN).permute(0, 2, 1, 3).reshape(tm * tn, BM, BN),
              what + ": load(other=)")
        expected_offsets = rows * src.stride(0) + cols * src.stride(1)
        check(offsets, expected_offsets.reshape(tm * tn, BM, BN), what + ": offsets of every lane")
        check(counts, torch.tensor([tm, tn, tm * tn]), what + ": num_tiles_m/_n/num_tiles")


def scenario_all_reduce_ring_source_off_heap(ctx):
    """The ring's ``src_view`` may be any memory of the rank: here memory off the symmetric heap (on
    the cpu backend a tensor of this process, which no peer can reach; on cuda one on the rank's GPU,
    outside the heap), contiguous fp32 and transposed bf16 (partials in two pieces)."""
    W, dev = ctx.world_size, ctx.device
    M, N, BM, BN = 10, 20, 8, 16  # 2 x 2 ragged tiles
    for i, (dtype, layout) in enumerate(((torch.float32, None), (torch.bfloat16, "transposed"))):
        inputs = [rank_input(r, (M, N), dtype, 1100 + i) for r in range(W)]
        if layout is None:
            src = inputs[ctx.rank].to(dev).clone()
        else:
            _, src = strided(off_heap(ctx, POISON[dtype], dtype), layout, M, N)
            src.copy_(inputs[ctx.rank].to(dev))
        assert not ctx.is_symmetric(src), "the source must lie off the heap"
        dst = ctx.full((M, N), POISON[dtype], dtype=dtype)
        unused_locks = ctx.zeros(1, dtype=torch.int32)
        ctx.barrier()
        launch_strided_all_reduce(ctx, K.RING, src, src, dst, unused_locks, M, N, BM, BN)
        what = f"all_reduce_ring from off-heap {layout or 'contiguous'} {dtype} rank {ctx.rank}/{W}"
        check(dst, reference_sum(inputs, dtype), what)
        check(src, inputs[ctx.rank], what + " (source untouched)")
        same_on_every_rank(ctx, dst, what)
        ctx.barrier()
        ctx.free(unused_locks)
        ctx.free(dst)


# --- device barrier ------------------------------------------------------------------------------

BARRIER_PROGRAMS, BARRIER_BLOCK = 2, 16


def barrier_value(launch: int, rank: int) -> int:
    """What ``rank`` writes before the barrier of ``launch`` (different for every launch and rank)."""
    return 1000 * (launch + 1) + 100 * rank


def run_barrier_exchange(ctx, *, explicit: bool, launches: int, lag_s: float, trace: bool = False):
    """``launches`` launches of barrier_exchange_kernel on one flag array: each rank writes its block,
    crosses the device barrier (``epoch=`` 1, 2, 3, ... when ``explicit``), then reads every rank's
    block. In launch ``k`` rank ``k % W`` starts at once and rank ``k % W + j`` ``j * lag_s`` later,
    so a barrier that lets a rank through before every rank has arrived hands it a late rank's
    previous value, every time. Returns the flag array's arrival counts (one per slot)."""
    W, dev = ctx.world_size, ctx.device
    P, B = BARRIER_PROGRAMS, BARRIER_BLOCK
    buf = ctx.full((P * B,), -1, dtype=torch.int32)
    flags = ctx.zeros(ic.barrier_words(P), dtype=torch.int32)
    kind = "epoch=k" if explicit else "own count"
    for k in range(launches):
        out = torch.full((W, P * B), -1, dtype=torch.int32, device=dev)
        ctx.barrier()  # every rank is done reading the previous launch's blocks
        time.sleep(((ctx.rank - k) % W) * lag_s)
        K.barrier_exchange_kernel[(P,)](ctx.get_device_context(), buf, flags, out, barrier_value(k, ctx.rank), k + 1,
                                        rank=ctx.rank, world_size=W, EXPLICIT=explicit, TRACE=trace, BLOCK=B)
        expected = torch.stack([barrier_value(k, q) + torch.arange(P * B, dtype=torch.int32) for q in range(W)])
        check(out, expected, f"device_barrier ({kind}) launch {k + 1}/{launches}: blocks read after the barrier "
                             f"on rank {ctx.rank}/{W} (rank {k % W} arrived first)")
    arrivals = flags.view(P, ic.BARRIER_WORDS)[:, 0].cpu().tolist()
    ctx.barrier()
    ctx.free(flags)
    ctx.free(buf)
    return arrivals


def scenario_device_barrier_explicit_epochs(ctx):
    """device_barrier(..., epoch=k) for k = 1, 2, 3 on one flag array, ranks arriving one after
    another: what every rank wrote before the barrier is what every rank reads after it."""
    launches = 3
    arrivals = run_barrier_exchange(ctx, explicit=True, launches=launches, lag_s=0.15)
    assert arrivals == [launches * ctx.world_size] * BARRIER_PROGRAMS, arrivals


def scenario_device_barrier_waits_for_late_ranks(ctx):
    """device_barrier with its own count, ranks arriving 0.15 s apart (a different rank first in each
    launch): no rank passes before the last one has written and arrived."""
    launches = 3
    arrivals = run_barrier_exchange(ctx, explicit=False, launches=launches, lag_s=0.15)
    assert arrivals == [launches * ctx.world_size] * BARRIER_PROGRAMS, arrivals


def scenario_put_with_signal_ring(ctx):
    """Messages between kernels: every rank puts 3 blocks into the next rank's inbox with
    put_with_signal (one counter), the next waits for each with wait_signal and reads it; twice,
    back to back, the counter never reset."""
    W, r, n, block, rounds = ctx.world_size, ctx.rank, 100, 128, 3
    inbox = ctx.zeros(rounds * block, dtype=torch.float32)
    flags = ctx.zeros(1, dtype=torch.int32)
    out = torch.zeros(rounds * block, device=ctx.device)
    ctx.barrier()
    prev = (r - 1) % W
    for launch in range(2):
        x = (torch.arange(rounds * block, dtype=torch.float32) + 1000 * r + 100 * launch).to(ctx.device)
        K.message_ring_kernel[(1,)](ctx.get_device_context(), x, inbox, flags, out, n, rounds, launch * rounds, r, W,
                                    block)
        ctx.barrier()  # the next launch overwrites the inboxes
        expected = torch.arange(rounds * block, dtype=torch.float32) + 1000 * prev + 100 * launch
        got = out.cpu().view(rounds, block)[:, :n]
        assert torch.equal(got, expected.view(rounds, block)[:, :n]), (launch, got[:, :4])
    assert int(flags.item()) == 2 * rounds
    for t in (inbox, flags):
        ctx.free(t)


# --- tracing -------------------------------------------------------------------------------------

COLLECTIVE_EVENT, BARRIER_EVENT = EVENT_IDS["collective"], EVENT_IDS["barrier"]


def scenario_tracing_every_collective(ctx):
    """Traced, every collective records its event kind once per call and tile on every rank (the
    all-reduces, reduce_scatter, all_gather, gather and all_to_all: 'collective', with the tile's
    coordinates, the peer for gather, -1 otherwise; device_barrier: 'barrier', once per program);
    tracing.export writes every rank's events under those names."""
    W, dev = ctx.world_size, ctx.device
    dtype = torch.float32
    M, N, BM, BN = 9, 12, 8, 8
    tiles = sorted(divmod(t, 2) for t in range(4))  # 2 x 2 tiles everywhere below
    ctx.tracing.enable(max_events=1000)
    ctx.tracing.reset()
    totals = {COLLECTIVE_EVENT: 0, BARRIER_EVENT: 0}

    def traced(name, launch, kind, coords, target=-1):
        before = len(ctx.tracing.recorded()[0])
        ctx.barrier()
        launch()
        ctx.barrier()
        events, dropped = ctx.tracing.recorded()
        assert dropped == 0, f"{name}: {dropped} events dropped"
        new = events[before:]
        what = f"traced {name} on rank {ctx.rank}/{W}"
        ids = new[:, 0].tolist()
        assert ids == [kind] * len(coords), f"{what}: expected {len(coords)} events of id {kind}, got ids {ids}"
        assert sorted((int(e[6]), int(e[7])) for e in new) == sorted(coords), f"{what}: tiles {new[:, 6:8].tolist()}"
        assert all(int(e[1]) == ctx.rank and int(e[2]) == target for e in new), f"{what}: ranks {new[:, 1:3].tolist()}"
        assert all(int(e[10]) >= int(e[9]) > 0 for e in new), f"{what}: events not closed: {new[:, 9:11].tolist()}"
        totals[kind] += len(new)

    for variant, name in K.VARIANT_NAMES.items():
        src = ctx.zeros(M, N, dtype=dtype)
        src.copy_(rank_input(ctx.rank, (M, N), dtype, 1200 + variant).to(dev))
        dst = ctx.zeros(M, N, dtype=dtype)
        locks = ctx.zeros(ic.lock_words(M, N, BM, BN), dtype=torch.int32)
        traced(name, lambda: launch_strided_all_reduce(ctx, variant, src, src, dst, locks, M, N, BM, BN, trace=True),
               COLLECTIVE_EVENT, tiles)
        for t in (locks, dst, src):
            ctx.free(t)

    ml, nl = 5, 6
    inp = rank_input(ctx.rank, (ml, nl), dtype, 1210).to(dev)
    gathered = ctx.zeros(W * ml, nl, dtype=dtype)
    traced("all_gather", lambda: K.strided_all_gather_kernel[(2,)](
        ctx.get_device_context(), inp, gathered, ml, nl, W * ml, nl, *inp.stride(), *gathered.stride(),
        rank=ctx.rank, world_size=W, DIM=0, TRACE=True, BLOCK_M=4, BLOCK_N=4), COLLECTIVE_EVENT, tiles)
    ctx.free(gathered)

    src = ctx.zeros(M, N, dtype=dtype)
    out = torch.zeros(M, N, dtype=dtype, device=dev)
    source = (ctx.rank + 1) % W
    traced("gather", lambda: K.strided_gather_kernel[(2,)](
        ctx.get_device_context(), src, out, M, N, *src.stride(), *out.stride(), rank=ctx.rank, world_size=W,
        SOURCE=source, TRACE=True, BLOCK_M=8, BLOCK_N=8), COLLECTIVE_EVENT, tiles, target=source)
    ctx.free(src)

    npr = 6
    a2a_src = rank_input(ctx.rank, (ml, W * npr), dtype, 1220).to(dev)
    a2a_dst = ctx.zeros(ml, W * npr, dtype=dtype)
    traced("all_to_all", lambda: K.strided_all_to_all_kernel[(2,)](
        ctx.get_device_context(), a2a_src, a2a_dst, ml, *a2a_src.stride(), *a2a_dst.stride(), rank=ctx.rank,
        world_size=W, N_PER_RANK=npr, TRACE=True, BLOCK_M=4, BLOCK_N=4), COLLECTIVE_EVENT, tiles)
    ctx.free(a2a_dst)

    traced("device_barrier", lambda: run_barrier_exchange(ctx, explicit=False, launches=1, lag_s=0, trace=True),
           BARRIER_EVENT, [(-1, -1)] * BARRIER_PROGRAMS)

    path = ctx.comm.bcast(os.path.join(tempfile.mkdtemp(prefix="iris-trace-"), "trace.json")
                          if ctx.rank == 0 else None, root=0)
    ctx.tracing.export(path)
    ctx.tracing.disable()
    ctx.tracing.reset()
    everyone = ctx.comm.gather(totals, root=0)
    if ctx.rank == 0:
        events = [e for e in load_trace(path)["traceEvents"] if e.get("ph") in ("X", "i")]
        shutil.rmtree(os.path.dirname(path))
        for r, counts in enumerate(everyone):
            for kind, count in counts.items():
                name = EVENT_NAMES[kind]
                exported = sum(1 for e in events if e["pid"] == r and e["name"] == name)
                assert exported == count, f"export: rank {r} has {exported} '{name}' events, recorded {count}"
        assert len(events) == sum(sum(c.values()) for c in everyone), f"export: {len(events)} events in all"


# --- on groups of ranks --------------------------------------------------------------------------

#: The layouts of 4 ranks under test: tensor-parallel pairs, data-parallel (strided) pairs, and a
#: group whose list is neither sorted nor contiguous (rank 1 is not a member).
GROUP_LAYOUTS = {"pairs": ([0, 1], [2, 3]), "strided pairs": ([0, 2], [1, 3]), "non-contiguous": ([3, 0, 2],)}
GROUP_WORLD = 4


def make_groups(ctx) -> dict:
    """Every group of GROUP_LAYOUTS (every rank makes every group, in the same order); returns this
    rank's group of each layout it belongs to."""
    mine = {}
    for name, lists in GROUP_LAYOUTS.items():
        for ranks in lists:
            group = ctx.new_group(ranks, workspace_size=1 << 16)
            if group is not None:
                mine[name] = group
    return mine


def launch_group_all_reduce(ctx, g, variant, inp, src, dst, locks, M, N, BM, BN, *, bound=False, grid=2):
    K.group_all_reduce_kernel[(grid,)](
        ctx.get_device_context(), ctx.device_group(g), inp, src, dst, locks, M, N, inp.stride(0), rank=ctx.rank,
        world_size=ctx.world_size, group_rank=g.rank, group_size=g.size, VARIANT=variant, BOUND=bound,
        BLOCK_M=BM, BLOCK_N=BN)


def group_inputs(g, shape, dtype, seed):
    """The members' inputs, in group order (each member's is its global rank's rank_input)."""
    return [rank_input(r, shape, dtype, seed) for r in g.ranks]


def run_group_all_reduce(ctx, g, name, variant, dtype, M, N, BM, BN, seed):
    """One all-reduce (or reduce-scatter) ``variant`` among ``g``'s members, checked bit for bit
    against torch's sum of the members' inputs (reduce-scatter: on the tiles this group rank owns)."""
    inputs = group_inputs(g, (M, N), dtype, seed)
    out_dtype = dst_dtype_for(variant, dtype)
    zero_dst = variant in (K.ATOMIC, K.SPINLOCK)
    poison = 0 if zero_dst else POISON[out_dtype]
    src, dst = g.zeros(M, N, dtype=dtype), g.zeros(M, N, dtype=out_dtype)
    dst.fill_(poison)
    locks = g.zeros(ic.lock_words(M, N, BM, BN), dtype=torch.int32)
    g.barrier()  # every member's dst poisoned (or zeroed) before anyone writes into it
    launch_group_all_reduce(ctx, g, variant, inputs[g.rank].to(ctx.device), src, dst, locks, M, N, BM, BN,
                            bound=bool(seed % 2))
    if variant == K.ATOMIC:
        g.barrier()  # the sum is complete once every member is done
    expected = reference_sum(inputs, out_dtype)
    if variant == K.REDUCE_SCATTER:
        owned = set(ic.reduce_scatter_tiles(g.rank, ic.num_tiles(M, N, BM, BN), g.size))
        full, expected = expected, torch.full((M, N), poison, dtype=out_dtype)
        for t in owned:
            pm, pn = divmod(t, -(-N // BN))
            expected[pm * BM:(pm + 1) * BM, pn * BN:(pn + 1) * BN] = full[pm * BM:(pm + 1) * BM, pn * BN:(pn + 1) * BN]
    check(dst, expected, f"{K.VARIANT_NAMES[variant]} on group {list(g.ranks)} ({name}) {dtype}, group rank {g.rank}")
    g.barrier()
    for t in (locks, dst, src):
        g.free(t)


def run_group_moves(ctx, g, name, seed):
    """all_gather (then a device barrier of the group per tile), gather (from the next group rank)
    and all_to_all among ``g``'s members, against the members' inputs in group order."""
    dev, G, M, N, B = ctx.device, g.size, 5, 6, 4
    for op in (K.ALL_GATHER, K.GATHER, K.ALL_TO_ALL):
        cols = G * N if op == K.ALL_TO_ALL else N
        inputs = group_inputs(g, (M, cols), torch.float32, seed + op)
        rows = G * M if op == K.ALL_GATHER else M
        src = g.zeros(M, cols, dtype=torch.float32)
        src.copy_(inputs[g.rank].to(dev))
        dst = g.zeros(rows, cols, dtype=torch.float32)
        dst.fill_(POISON[torch.float32])
        flags = g.zeros(ic.barrier_words(ic.num_tiles(M, N, B, B)), dtype=torch.int32)
        source = (g.rank + 1) % G
        g.barrier()  # sources in place, destinations poisoned
        K.group_move_kernel[(2,)](ctx.get_device_context(), ctx.device_group(g), src, dst, flags, M, rows, N,
                                  src.stride(0), dst.stride(0), source, rank=ctx.rank, world_size=ctx.world_size,
                                  group_rank=g.rank, group_size=G, OP=op, N_PER_RANK=N, BOUND=bool(op % 2),
                                  BLOCK_M=B, BLOCK_N=B)
        g.barrier()  # every member's pushes are in
        if op == K.ALL_GATHER:
            expected, what = torch.cat(inputs), "all_gather"
        elif op == K.GATHER:
            expected, what = inputs[source], f"gather from group rank {source}"
        else:
            expected = torch.cat([x[:, g.rank * N:(g.rank + 1) * N] for x in inputs], dim=1)
            what = "all_to_all"
        check(dst, expected, f"{what} on group {list(g.ranks)} ({name}), group rank {g.rank}")
        g.barrier()
        for t in (flags, dst, src):
            g.free(t)


def run_group_barrier(ctx, g, name, launches=2, lag_s=0.1):
    """device_barrier(group=) with members arriving ``lag_s`` apart (a different one first in each
    launch): after it, every member's block is what that member wrote for this launch; and
    DeviceGroup.global_rank maps every group rank to its global rank."""
    dev, P, B, G = ctx.device, BARRIER_PROGRAMS, BARRIER_BLOCK, g.size
    buf = g.zeros(P * B, dtype=torch.int32)
    flags = g.zeros(ic.barrier_words(P), dtype=torch.int32)
    for k in range(launches):
        out = torch.full((G, P * B), -1, dtype=torch.int32, device=dev)
        members = torch.full((G,), -1, dtype=torch.int64, device=dev)
        g.barrier()  # every member is done reading the previous launch's blocks
        time.sleep(((g.rank - k) % G) * lag_s)
        K.group_barrier_kernel[(P,)](ctx.get_device_context(), ctx.device_group(g), buf, flags, out, members,
                                     barrier_value(k, ctx.rank), rank=ctx.rank, world_size=ctx.world_size,
                                     group_rank=g.rank, group_size=G, BLOCK=B)
        expected = torch.stack([barrier_value(k, r) + torch.arange(P * B, dtype=torch.int32) for r in g.ranks])
        check(out, expected, f"device_barrier on group {list(g.ranks)} ({name}) launch {k + 1}, group rank {g.rank}")
        assert members.cpu().tolist() == list(g.ranks), (name, members.cpu().tolist(), g.ranks)
    arrivals = flags.view(P, ic.BARRIER_WORDS)[:, 0].cpu().tolist()
    assert arrivals == [launches * G] * P, (name, arrivals)  # the group's members only
    g.barrier()
    g.free(flags)
    g.free(buf)


def scenario_groups_tile_collectives(ctx):
    """4 ranks only (other world sizes pass at once): every tile collective and the device barrier
    inside a kernel on a group (``group=`` an iris.device.DeviceGroup), free and bound forms, on
    the pairs [0,1],[2,3], the strided pairs [0,2],[1,3] and [3,0,2] (rank 1 outside it), each
    against torch on the members' inputs in group order; groups of one layout run at the same time,
    and a rank's groups of different layouts overlap."""
    if ctx.world_size != GROUP_WORLD:
        return
    groups = make_groups(ctx)
    seed = 3000
    for name, g in groups.items():
        for variant in K.VARIANT_NAMES:
            run_group_all_reduce(ctx, g, name, variant, torch.float32, 9, 12, 8, 8, seed)
            seed += 1
        run_group_all_reduce(ctx, g, name, K.RING, torch.bfloat16, 9, 12, 8, 8, seed)
        run_group_all_reduce(ctx, g, name, K.TWO_SHOT, torch.bfloat16, 9, 12, 8, 8, seed + 1)
        seed += 2
        run_group_moves(ctx, g, name, seed)
        seed += 3
        run_group_barrier(ctx, g, name)
    ctx.barrier()  # rank 1 is in no non-contiguous group: the others must not free before it is done


def scenario_groups_back_to_back(ctx):
    """4 ranks only: a pair's collective, then at once the strided pair's on the pair's result (no
    barrier between, the same rank in both groups), four times with new data, a different rank
    late each time: one-shot, two-shot and the ring (whose flags on a group are the group's own,
    not the rank's signal pad). The result is the sum over all 4 ranks, exact."""
    if ctx.world_size != GROUP_WORLD:
        return
    groups = make_groups(ctx)
    tp, dp, dev = groups["pairs"], groups["strided pairs"], ctx.device
    M, N, BM, BN, R = 9, 12, 8, 8, GROUP_WORLD
    for variant in (K.ONE_SHOT, K.TWO_SHOT, K.RING):
        bufs = {g: (g.zeros(M, N, dtype=torch.float32), g.zeros(M, N, dtype=torch.float32),
                    g.zeros(ic.lock_words(M, N, BM, BN), dtype=torch.int32)) for g in (tp, dp)}
        ctx.barrier()
        results = []
        for k in range(R):
            x = rank_input(ctx.rank, (M, N), torch.float32, 3500 + 10 * variant + k).to(dev)
            if k == ctx.rank:
                time.sleep(0.3)  # fall behind: the others run ahead into the next group's call
            src, dst, locks = bufs[tp]
            launch_group_all_reduce(ctx, tp, variant, x, src, dst, locks, M, N, BM, BN)
            partial = dst.clone()
            src, dst, locks = bufs[dp]
            launch_group_all_reduce(ctx, dp, variant, partial, src, dst, locks, M, N, BM, BN, bound=True)
            results.append(dst.clone())
        for k in range(R):
            inputs = [rank_input(r, (M, N), torch.float32, 3500 + 10 * variant + k) for r in range(GROUP_WORLD)]
            what = f"{K.VARIANT_NAMES[variant]} on {list(tp.ranks)} then {list(dp.ranks)}, call {k + 1}"
            check(results[k], reference_sum(inputs, torch.float32), f"{what}, rank {ctx.rank}")
        if variant == K.RING:
            # the ring's flags on a group are in the group's own workspace (its signal pad is every
            # group's): the per-rank running totals of arrivals and credits of the tiles used
            tiles = ic.num_tiles(M, N, BM, BN)
            for g in (tp, dp):
                words = g._arena[g._words_at - GROUP_RING_BYTES:g._words_at].view(torch.int32).view(-1, 4)
                totals = words[:tiles, 2:].sum().item()
                assert totals > 0, f"rank {ctx.rank}: no ring flags counted in group {list(g.ranks)}'s workspace"
        ctx.barrier()
        for g in (tp, dp):
            for t in reversed(bufs[g]):
                g.free(t)


def scenario_groups_errors(ctx):
    """device_group refuses a non-member's None and a group of another context, naming the fix; a
    kernel given a group larger than the context, a group rank out of range, or the context as
    group= does not compile."""
    W = ctx.world_size
    expect_error(lambda: ctx.device_group(None), "iris.runtime.Iris.device_group()", "not a member",
                 "launch the group's kernel on its members only")
    other = object.__new__(iris.runtime.Group)
    other.ctx, other.ranks, other.rank, other.size = None, (0,), 0, 1
    expect_error(lambda: ctx.device_group(other), "iris.runtime.Iris.device_group()", "a group of another context")
    everyone = ctx.new_group(list(range(W)), workspace_size=1 << 16)
    M = N = 8
    buf = everyone.zeros(M, N, dtype=torch.float32)
    locks = everyone.zeros(ic.lock_words(M, N, 8, 8), dtype=torch.int32)
    expect_error(lambda: K.group_all_reduce_kernel[(1,)](
        ctx.get_device_context(), ctx.device_group(everyone), buf, buf, buf, locks, M, N, N, rank=ctx.rank,
        world_size=W, group_rank=everyone.rank, group_size=W + 1, VARIANT=K.ONE_SHOT, BOUND=False, BLOCK_M=8,
        BLOCK_N=8), "iris.collectives.all_reduce_one_shot", "more ranks than the context")
    expect_error(lambda: K.group_all_reduce_kernel[(1,)](
        ctx.get_device_context(), ctx.device_group(everyone), buf, buf, buf, locks, M, N, N, rank=ctx.rank,
        world_size=W, group_rank=W, group_size=W, VARIANT=K.ONE_SHOT, BOUND=False, BLOCK_M=8, BLOCK_N=8),
        "DeviceGroup.initialize", "rank must be a constexpr in [0, size)")
    expect_error(lambda: K.group_misuse_kernel[(1,)](ctx.get_device_context(), buf, rank=ctx.rank, world_size=W,
                                                     BLOCK=8), "iris.collectives.all_reduce_atomic",
                 "group= takes an iris.device.DeviceGroup")
    ctx.barrier()
    everyone.free(locks)
    everyone.free(buf)


# --- errors --------------------------------------------------------------------------------------

def expect_error(fn, *fragments):
    # Any exception: the interpreter and Triton's compiler wrap the library's errors.
    return iris.runtime.testing.expect_error(fn, Exception, *fragments)


def scenario_errors_name_the_fix(ctx):
    """Combinations that cannot give a correct answer are refused, naming the call and the fix."""
    dev = ctx.device
    M, N, BM, BN = 8, 8, 8, 8
    locks = ctx.zeros(ic.lock_words(M, N, BM, BN), dtype=torch.int32)
    half = ctx.zeros(M, N, dtype=torch.float16)
    inp = torch.ones(M, N, dtype=torch.float16, device=dev)
    expect_error(lambda: launch_all_reduce(ctx, K.ATOMIC, inp, half, half, locks, M, N, BM, BN),
                 "all_reduce_atomic", "fp32 dst_view")
    expect_error(lambda: launch_all_reduce(ctx, K.SPINLOCK, inp, half, half, locks, M, N, BM, BN),
                 "all_reduce_spinlock", "fp32 dst_view")
    small = ctx.zeros(M, N, dtype=torch.int8)
    expect_error(lambda: launch_all_reduce(ctx, K.ONE_SHOT, small, small, small, locks, M, N, BM, BN),
                 "all_reduce_one_shot", "int8")
    wide_locks = ctx.zeros(ic.lock_words(M, N, BM, BN), dtype=torch.int64)
    f32 = ctx.zeros(M, N, dtype=torch.float32)
    expect_error(lambda: launch_all_reduce(ctx, K.TWO_SHOT, f32, f32, f32, wide_locks, M, N, BM, BN),
                 "all_reduce_two_shot", "int32")
    if ctx.world_size > 1 and ctx.backend == "cpu":
        # More tiles than the signal pad has flags for: refused before any flag is touched. (On the
        # GPU the same check traps the kernel, which ends the process's CUDA context: not tested.)
        big = ctx.zeros(257, 256, dtype=torch.float32)
        expect_error(lambda: launch_all_reduce(ctx, K.RING, big, big, big, locks, 257, 256, 1, 1, grid=1),
                     "all_reduce_ring", str(ic.RING_MAX_TILES))
        ctx.free(big)
    for name in ("lock_words", "num_tiles"):
        expect_error(lambda name=name: getattr(ic, name)(0, 8, 8, 8), f"{name}(0, 8, 8, 8)", "positive int")
    ctx.barrier()
    for t in (f32, wide_locks, small, half, locks):
        ctx.free(t)


#: How much longer than IRIS_DEBUG_TIMEOUT_S a timed-out launch may take (starting the interpreted
#: kernel, raising through it, a loaded CI machine): 3 s gives the window 3 .. 15 s.
TIMEOUT_SLACK_S = 12.0


def scenario_debug_wait_times_out(ctx):
    """IRIS_DEBUG=1 only: rank 0 calls one-shot alone; its wait gives up after IRIS_DEBUG_TIMEOUT_S
    (no sooner, and at most TIMEOUT_SLACK_S later) with a message naming the call, the rank, the
    peers and the flag."""
    assert ic._sync.DEBUG, "run with IRIS_DEBUG=1"
    assert ctx.backend == "cpu", "on the GPU a timed-out wait is a device assert, which ends the CUDA context"
    # the environment, not the library's reading of it: a library that misreads it must fail here
    timeout_s = float(os.environ.get("IRIS_DEBUG_TIMEOUT_S", "60"))
    M, N, BM, BN = 8, 16, 8, 16
    locks = ctx.zeros(ic.lock_words(M, N, BM, BN), dtype=torch.int32)
    buf = ctx.zeros(M, N, dtype=torch.float32)
    if ctx.rank == 0:
        start = time.monotonic()
        expect_error(lambda: launch_all_reduce(ctx, K.ONE_SHOT, buf, buf, buf, locks, M, N, BM, BN, stage=False),
                     "IrisWaitTimeoutError", "iris.collectives.all_reduce_one_shot", "rank 0", "every peer",
                     "on flag", "ready", "tile/slot 0", f"expected >= {ctx.world_size - 1}")
        waited = time.monotonic() - start
        assert timeout_s <= waited <= timeout_s + TIMEOUT_SLACK_S, (
            f"the wait timed out after {waited:.1f} s; IRIS_DEBUG_TIMEOUT_S={timeout_s:g} allows "
            f"{timeout_s:g} .. {timeout_s + TIMEOUT_SLACK_S:g} s")
    ctx.barrier()
    ctx.free(buf)
    ctx.free(locks)


def scenario_debug_mode_collectives(ctx):
    """IRIS_DEBUG=1 only: each lock-using collective, checked flags and addresses, gives the sum."""
    assert ic._sync.DEBUG, "run with IRIS_DEBUG=1"
    for variant in LOCKING:
        run_all_reduce(ctx, variant, torch.float32, 12, 20, 8, 16, seed=800 + variant)
    for two_shot in (False, True):
        run_all_reduce_rmsnorm(ctx, 5, 24, 4, torch.float32, 900, two_shot=two_shot, range_form=True, bound=False)
    # the host op built on it, every strategy (buffered: its "done" wait is debug mode's alone)
    from iris.collectives import ops
    from iris.collectives.ops._norm_config import VARIANTS

    W, dev = ctx.world_size, ctx.device
    weight = torch.randn(24, generator=torch.Generator().manual_seed(5)).to(dev)
    for i, variant in enumerate(VARIANTS):
        parts = [small_ints((5, 24), torch.float32, 950 + 10 * i + r) for r in range(W)]
        out = torch.full((5, 24), float("nan"), device=dev)
        ops.all_reduce_residual_rmsnorm(ctx, out, None, parts[ctx.rank].to(dev), None, weight,
                                        config=ops.Config(variant=variant))
        check(out, torch.nn.functional.rms_norm(sum(parts), (24,), weight.cpu(), 1e-6), f"debug-mode {variant}")


DEBUG_ONLY = ("debug_wait_times_out", "debug_mode_collectives")

if __name__ == "__main__":
    names = sys.argv[1:] or [n[len("scenario_"):] for n in list(globals()) if n.startswith("scenario_")
                             and n[len("scenario_"):] not in DEBUG_ONLY]
    iris.runtime.testing.run_scenarios(globals(), names, heap_size=1 << 24)
