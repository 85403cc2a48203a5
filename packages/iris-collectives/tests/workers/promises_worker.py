"""Promises that small-integer data and short runs cannot show (run by test_promises_multirank.py).

- **Rank order.** The fused ops (``iris.collectives.ops``) and the host collectives
  (``iris.collectives.ccl``) sum the ranks' values in rank order, so every rank gets the same bits.
  With three or more ranks, any other order (an owner that adds its own part first, say) gives
  other bits on random floats; on small integers every order gives the same exact sum.
- **One rounding.** They accumulate in fp32 and round once to the output dtype, to nearest even, on
  both backends (Triton's interpreter truncates an fp32 -> bf16 cast; ``iris.device.round_to``
  rounds).
- **device_barrier(epoch=).** The generation is the caller's ``epoch``, not a count of the barrier's
  own: a caller that keeps its own count in the slot's second word (``ops.matmul_all_gather`` does)
  passes epochs that differ from it.
- **The final wait of the one-shot and two-shot all-reduces.** When they return, no peer reads this
  rank's source tile any more: the caller may overwrite it at once, e.g. with the next call's data.

The data are random floats with full mantissas and exponents spread over several binades, so most
sums round and the order shows. Each result is compared bit for bit with a host reference that sums
in rank order in fp32 and rounds once with torch (to nearest even), and across ranks. A fused op's
GEMM cannot be reproduced bit for bit on the host (tensor cores, tf32 and the K loop's order differ
between backends), so each rank's ``a`` has one nonzero per row, a power of two (a random column,
sign and exponent): every element of ``a @ b`` is then one exact product, whatever the GEMM does,
and the rounding happens only where the promises are.

Every rank regenerates every rank's inputs from seeds, so references need no communication.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import sys

import torch
import triton
import triton.language as tl

import iris.collectives as ic  # imports iris.runtime first, which picks the backend
import iris.runtime.testing
from iris.collectives import ccl, ops
from iris.device import load
from iris.runtime.testing import spread

FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16
CCL_SMALL = dict(block=64, width=16)  # 4 x 16 elements per tile: a few dozen elements make several tiles


def generator(seed: int, rank: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1009 + rank * 7919 + 5)


def random_floats(shape, dtype, g: torch.Generator, spread: int = 8) -> torch.Tensor:
    """``randn * 2**k`` with ``k`` uniform in ``[-spread, spread]``, rounded to ``dtype`` by torch."""
    scale = torch.pow(2.0, torch.randint(-spread, spread + 1, shape, generator=g).to(FP32))
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def selection(rows: int, cols: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(a, col, value): ``a`` is ``rows x cols`` fp32 with one nonzero per row, ``value[i]`` at
    ``col[i]``, a power of two in [1/8, 8] with a random sign (exact in every input dtype, tf32 too).
    ``(a @ b)[i] == value[i] * b[col[i]]`` exactly."""
    col = torch.randint(0, cols, (rows,), generator=g)
    value = torch.pow(2.0, torch.randint(-3, 4, (rows,), generator=g).to(FP32))
    value = value * (torch.randint(0, 2, (rows,), generator=g) * 2 - 1).to(FP32)
    a = torch.zeros(rows, cols)
    a[torch.arange(rows), col] = value
    return a, col, value


def rank_order(parts: list[torch.Tensor], first=None) -> torch.Tensor:
    """``0 + parts[0] + parts[1] + ...`` in fp32, one addition at a time (torch rounds each to
    nearest even, as the kernels' fp32 additions do); ``first`` joins rank 0's part before the sum."""
    acc = torch.zeros_like(parts[0], dtype=FP32)
    for p, part in enumerate(parts):
        part = part.to(FP32)
        if p == 0 and first is not None:
            part = part + first
        acc = acc + part
    return acc


def check(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Bit for bit; the message shows the first elements that differ."""
    actual = actual.cpu().reshape(expected.shape)
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype}, expected {expected.dtype}"
    bits = {2: torch.int16, 4: torch.int32}[expected.element_size()]
    differ = actual.contiguous().view(bits) != expected.contiguous().view(bits)
    count = int(differ.sum())
    if count:
        where = differ.nonzero()[:4].tolist()
        pairs = [(actual[tuple(i)].item(), expected[tuple(i)].item()) for i in where]
        raise AssertionError(f"{what}: {count} of {actual.numel()} elements differ from the reference summed in "
                             f"rank order and rounded once to nearest even; first (got, expected) at {where}: {pairs}")


def same_on_every_rank(ctx, result: torch.Tensor, what: str) -> None:
    mine = result.cpu().contiguous().view({2: torch.int16, 4: torch.int32}[result.element_size()])
    for q, theirs in enumerate(ctx.comm.allgather(mine)):
        differ = int((theirs != mine).sum())
        assert not differ, f"{what}: {differ} elements of rank {ctx.rank}'s result differ in their bits from rank {q}'s"


# --- fused ops ---------------------------------------------------------------------------------------

#: (input dtype, output dtype, bias): fp32 sums of full mantissas (the order shows), 16-bit outputs
#: (the rounding shows), 16-bit inputs accumulated into fp32.
OP_CASES = [(FP32, FP32, True), (BF16, BF16, True), (FP16, FP16, False), (BF16, FP32, False)]


def op_config(dtype, variant=None) -> ops.Config:
    # fp32 inputs as IEEE products: tf32 would round b to 10 mantissa bits on the GPU
    return ops.Config(variant=variant, block_m=16, block_n=16, block_k=16, group_m=2,
                      input_precision="ieee" if dtype == FP32 else None)


def k_split_inputs(W: int, M: int, N: int, K: int, dtype, seed: int):
    """Every rank's (a, b) of an op whose K is split over the ranks, and its exact fp32 partial
    product ``a @ b``, plus a bias."""
    parts = []
    for q in range(W):
        g = generator(seed, q)
        a, col, value = selection(M, K, g)
        b = random_floats((K, N), dtype, g)
        parts.append((a.to(dtype), b, value[:, None] * b.to(FP32)[col]))
    return parts, random_floats((N,), dtype, generator(seed, 99))


def scenario_matmul_all_reduce(ctx):
    """Both strategies: every rank's result equals the partial products summed in rank order, the
    bias joining rank 0's (docs/fused-ops.md), rounded once; and the same bits on every rank."""
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    M, N, K = 24, 40, 16
    for variant, (i, (dtype, out_dtype, with_bias)) in spread(itertools.product(ops.VARIANTS["matmul_all_reduce"],
                                                                              enumerate(OP_CASES)), W):
        parts, bias = k_split_inputs(W, M, N, K, dtype, 100 + i)
        out = torch.full((M, N), float("nan"), dtype=out_dtype, device=dev)
        ops.matmul_all_reduce(ctx, out, parts[r][0].to(dev), parts[r][1].to(dev),
                              bias.to(dev) if with_bias else None, config=op_config(dtype, variant))
        expected = rank_order([p[2] for p in parts], bias.to(FP32) if with_bias else None).to(out_dtype)
        what = f"matmul_all_reduce {variant} {dtype}->{out_dtype} bias={with_bias} rank {r}/{W}"
        check(out, expected, what)
        same_on_every_rank(ctx, out, what)


def scenario_matmul_reduce_scatter(ctx):
    """The owner of each tile sums the partials in rank order (its own in its turn, not first),
    then adds the bias, and rounds once."""
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    m, N, K = 8, 40, 16
    for variant, (i, (dtype, out_dtype, with_bias)) in spread(itertools.product(ops.VARIANTS["matmul_reduce_scatter"],
                                                                              enumerate(OP_CASES)), W):
        parts, bias = k_split_inputs(W, W * m, N, K, dtype, 200 + i)
        out = torch.full((m, N), float("nan"), dtype=out_dtype, device=dev)
        ops.matmul_reduce_scatter(ctx, out, parts[r][0].to(dev), parts[r][1].to(dev),
                                  bias.to(dev) if with_bias else None, config=op_config(dtype, variant))
        total = rank_order([p[2] for p in parts])
        if with_bias:
            total = total + bias.to(FP32)
        check(out, total[r * m:(r + 1) * m].to(out_dtype),
              f"matmul_reduce_scatter {variant} {dtype}->{out_dtype} bias={with_bias} rank {r}/{W}")


def scenario_matmul_all_reduce_partials_in_input_dtype(ctx):
    """``Config(partial_dtype="input")``: rank 0's partial plus the bias (full mantissas) is
    rounded to the inputs' dtype, to nearest even, before the rank-order sum; the other partials
    are exact in that dtype here (a power of two times an element of ``b``). The same bits on every
    rank. One rank takes the kernel that hands nothing over: one rounding."""
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    M, N, K = 8 * W, 40, 16
    # both strategies that stage partials, named (which one a bare partial_dtype picks depends on
    # the backend: test_ops_config)
    for variant, (i, (dtype, out_dtype)) in itertools.product(("rotated", "unfused"),
                                                              enumerate([(BF16, BF16), (FP16, FP32)])):
        parts, bias = k_split_inputs(W, M, N, K, dtype, 300 + i)
        out = torch.full((M, N), float("nan"), dtype=out_dtype, device=dev)
        cfg = dataclasses.replace(op_config(dtype, variant), partial_dtype="input")
        ops.matmul_all_reduce(ctx, out, parts[r][0].to(dev), parts[r][1].to(dev), bias.to(dev), config=cfg)
        staged = [p[2] for p in parts]
        if W > 1:
            staged[0] = (staged[0] + bias.to(FP32)).to(dtype)
        expected = rank_order(staged, None if W > 1 else bias.to(FP32)).to(out_dtype)
        what = f"matmul_all_reduce {variant} partial_dtype=input {dtype}->{out_dtype} rank {r}/{W}"
        check(out, expected, what)
        same_on_every_rank(ctx, out, what)


def gather_op_case(ctx, op, variant, dtype, out_dtype, seed):
    """``op`` (all_gather_matmul or matmul_all_gather) on rank r's ``M / W`` rows: the product plus
    the bias, in fp32, rounded once (no sum over ranks)."""
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    m, N, K = 8, 40, 24
    shards = []
    for q in range(W):
        a, col, value = selection(m, K, generator(seed, q))
        shards.append((a.to(dtype), col, value))
    g = generator(seed, 99)
    b = random_floats((K, N), dtype, g)
    bias = random_floats((N,), dtype, g)
    out = torch.full((W * m, N), float("nan"), dtype=out_dtype, device=dev)
    op(ctx, out, shards[r][0].to(dev), b.to(dev), bias.to(dev), config=op_config(dtype, variant))
    expected = torch.cat([value[:, None] * b.to(FP32)[col] + bias.to(FP32) for _, col, value in shards])
    check(out, expected.to(out_dtype), f"{op.__name__} {variant} {dtype}->{out_dtype} rank {r}/{W}")


def scenario_gather_ops_round_once(ctx):
    """all_gather_matmul (pull, arrival) and matmul_all_gather: ``a @ b + bias`` in fp32, rounded
    once to nearest even."""
    for i, (dtype, out_dtype) in enumerate(((BF16, BF16), (FP16, FP16), (FP32, FP32))):
        for variant in ("pull", "arrival"):
            gather_op_case(ctx, ops.all_gather_matmul, variant, dtype, out_dtype, 300 + i)
        gather_op_case(ctx, ops.matmul_all_gather, None, dtype, out_dtype, 400 + i)


# --- host collectives ----------------------------------------------------------------------------------

def ccl_reference(op: str, parts: list[torch.Tensor]) -> torch.Tensor:
    """``op`` over the ranks' values in rank order, in fp32 (to be rounded once by the caller)."""
    if op == "prod":
        acc = parts[0].to(FP32)
        for part in parts[1:]:
            acc = acc * part.to(FP32)
        return acc
    total = rank_order(parts)
    return total / len(parts) if op == "avg" else total


def ccl_inputs(W: int, n: int, dtype, op: str, seed: int) -> list[torch.Tensor]:
    # prod: plain randn factors (no exponent spread), so that products of four stay in range
    return [random_floats((n,), dtype, generator(seed, q), spread=0 if op == "prod" else 8) for q in range(W)]


def scenario_ccl_all_reduce(ctx):
    """ccl.all_reduce, every variant, sum / avg / prod in fp32, fp16 and bf16 (several tiles, the
    last ragged): the ranks' values reduced in rank order in fp32, rounded once."""
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    cases = [(FP32, "sum"), (BF16, "sum"), (FP16, "sum"), (FP32, "avg"), (BF16, "avg"), (FP32, "prod"),
             (BF16, "prod")]
    for variant, (i, (dtype, op)) in spread(itertools.product(ccl.VARIANTS["all_reduce"], enumerate(cases)), W):
        parts = ccl_inputs(W, 150, dtype, op, 500 + i)
        out = torch.full((150,), float("nan"), dtype=dtype, device=dev)
        ccl.all_reduce(ctx, out, parts[r].to(dev), op=op, config=ccl.Config(variant=variant, **CCL_SMALL))
        what = f"ccl.all_reduce {variant} {op} {dtype} rank {r}/{W}"
        check(out, ccl_reference(op, parts).to(dtype), what)
        same_on_every_rank(ctx, out, what)


def scenario_ccl_reduce_scatter(ctx):
    """ccl.reduce_scatter, every variant: chunk r of every rank's values, summed in rank order,
    rounded once."""
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    m = 70
    for variant in ccl.VARIANTS["reduce_scatter"]:
        for i, (dtype, op) in enumerate(((FP32, "sum"), (BF16, "sum"), (FP16, "avg"))):
            parts = ccl_inputs(W, W * m, dtype, op, 600 + i)
            out = torch.full((m,), float("nan"), dtype=dtype, device=dev)
            ccl.reduce_scatter(ctx, out, parts[r].to(dev), op=op, config=ccl.Config(variant=variant, **CCL_SMALL))
            expected = ccl_reference(op, [p[r * m:(r + 1) * m] for p in parts]).to(dtype)
            check(out, expected, f"ccl.reduce_scatter {variant} {op} {dtype} rank {r}/{W}")


# --- device_barrier(epoch=) ------------------------------------------------------------------------------

@triton.jit
def barrier_caller_count_kernel(context, buf, flags, out, value, rank: tl.constexpr, world_size: tl.constexpr,
                                BLOCK: tl.constexpr):
    """Program ``p`` writes ``value + i`` into its ``BLOCK`` of this rank's ``buf``, counts this call
    in word 1 of its barrier slot (the caller's own count, as ops.matmul_all_gather keeps it) and
    crosses :func:`device_barrier` with ``epoch=`` that count; then copies its block of every rank's
    ``buf`` into ``out[q]``."""
    ctx = ic.DeviceContext.initialize(context, rank, world_size)
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(buf + offs, value + offs)
    slot = flags + ic.BARRIER_WORDS * pid
    # one thread adds, and every thread gets the old value
    epoch = tl.atomic_add(slot + 1, 1, sem="relaxed", scope="gpu") + 1
    ic.device_barrier(ctx, slot, epoch=epoch)
    width = tl.num_programs(0) * BLOCK
    for q in tl.static_range(world_size):
        tl.store(out + q * width + offs, load(buf + offs, rank, q, ctx.heap_bases))


def scenario_device_barrier_caller_epochs(ctx):
    """Epochs that are not the barrier's own count: word 1 of each slot holds the caller's count of
    its calls, advanced before the barrier, and the barrier must wait for the generation it is given
    (one that counted for itself would wait for a generation that never comes). Ranks arrive one
    after another, a different one first in each launch; what every rank wrote before the barrier
    is what every rank reads after it."""
    import time

    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    programs, block, launches = 2, 16, 3
    buf = ctx.full((programs * block,), -1, dtype=torch.int32)
    flags = ctx.zeros(ic.barrier_words(programs), dtype=torch.int32)
    for k in range(launches):
        out = torch.full((W, programs * block), -1, dtype=torch.int32, device=dev)
        ctx.barrier()  # every rank is done reading the previous launch's blocks
        time.sleep(((r - k) % W) * 0.1)
        value = 1000 * (k + 1)
        barrier_caller_count_kernel[(programs,)](ctx.get_device_context(), buf, flags, out, value + 100 * r,
                                                 rank=r, world_size=W, BLOCK=block)
        expected = torch.stack([value + 100 * q + torch.arange(programs * block, dtype=torch.int32) for q in range(W)])
        got = out.cpu()
        assert torch.equal(got, expected), (f"device_barrier(epoch=) launch {k + 1}: rank {r}/{W} read {got.tolist()} "
                                            f"after the barrier, expected {expected.tolist()}")
    words = flags.view(programs, ic.BARRIER_WORDS).cpu().tolist()
    assert words == [[launches * W, launches]] * programs, \
        f"rank {r}: slots (arrivals, caller's count) {words}, expected {[launches * W, launches]} each"
    ctx.barrier()
    ctx.free(flags)
    ctx.free(buf)


# --- back to back: the final wait of one-shot and two-shot ---------------------------------------------

@triton.jit
def _all_reduce(ctx, tiles, src_view, dst_view, locks, TWO_SHOT: tl.constexpr):
    # the collective under test, on a tile or a TileRange
    if TWO_SHOT:
        ic.all_reduce_two_shot(ctx, tiles, src_view, dst_view, locks)
    else:
        ic.all_reduce_one_shot(ctx, tiles, src_view, dst_view, locks)


@triton.jit
def repeated_all_reduce_kernel(context, data, src, dst, locks, M, N, CALLS, rank: tl.constexpr,
                               world_size: tl.constexpr, TWO_SHOT: tl.constexpr, RANGE: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``CALLS`` all-reduces back to back inside one kernel: call ``k`` stores ``data[k]``'s tiles
    into the symmetric ``src`` right after call ``k - 1`` returned (the collective's promise: no peer
    reads them any more) and sums them into ``dst[k]``. Per tile, or with ``RANGE`` once per call
    over the program's :class:`TileRange` (one "ready" and one "done" for all its tiles)."""
    ctx = ic.DeviceContext.initialize(context, rank, world_size)
    src_view = ic.TensorView(src, M, N, N, 1)
    num_tiles = src_view.num_tiles(BLOCK_M, BLOCK_N)
    tiles_n = src_view.num_tiles_n(BLOCK_N)
    if RANGE:
        tiles = ic.TileRange(tl.program_id(0), num_tiles, tl.num_programs(0), tiles_n, BLOCK_M, BLOCK_N)
        for k in range(CALLS):
            for t in range(tiles.first, tiles.stop, tiles.step):
                view = tiles.tile(t)
                src_view.store(view, ic.TensorView(data + k * M * N, M, N, N, 1).load(view))
            _all_reduce(ctx, tiles, src_view, ic.TensorView(dst + k * M * N, M, N, N, 1), locks, TWO_SHOT)
    else:
        for t in range(tl.program_id(0), num_tiles, tl.num_programs(0)):
            pid_m, pid_n = ic.tile_coords(t, tiles_n)
            view = ic.TileView(pid_m, pid_n, BLOCK_M, BLOCK_N)
            for k in range(CALLS):
                x = ic.TensorView(data + k * M * N, M, N, N, 1).load(view)
                src_view.store(view, x)
                _all_reduce(ctx, ic.Tile(pid_m, pid_n, BLOCK_M, BLOCK_N, x), src_view,
                            ic.TensorView(dst + k * M * N, M, N, N, 1), locks, TWO_SHOT)


def calls(ctx) -> int:
    return int(os.environ.get("IRIS_TEST_REPEATS", "50" if ctx.device.type == "cuda" else "32"))


def scenario_back_to_back_in_one_kernel(ctx):
    """One-shot and two-shot, per tile (one program per tile) and per range (one program, one
    range of both tiles), ``calls`` times in one kernel, the source overwritten with the next
    call's data as soon as a call returns. Without the wait for the peers' "done" a rank
    overwrites its source while a peer still reads it, and that peer's sum takes the next call's
    values: on the cpu backend at 3 and 4 ranks a dozen or more of each rank's calls lose that
    race on every run (at 2 ranks, where each rank reads one peer, a few calls in most runs)."""
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    M, N, BM, BN = 8, 32, 8, 16  # 2 tiles
    R = calls(ctx)

    def data(q: int, seed: int) -> torch.Tensor:
        g = generator(seed, q)
        return torch.randint(-1000, 1000, (R, M, N), generator=g).to(FP32)

    for i, (variant, form) in enumerate([(v, f) for v in ("one_shot", "two_shot") for f in ("tile", "range")]):
        seed = 700 + i
        src = ctx.zeros(M, N, dtype=FP32)
        if variant == "two_shot":  # peers write their shares into it: on the heap
            dst = ctx.full((R, M, N), float("nan"), dtype=FP32)
        else:
            dst = torch.full((R, M, N), float("nan"), dtype=FP32, device=dev)
        locks = ctx.zeros(ic.lock_words(M, N, BM, BN), dtype=torch.int32)
        ctx.barrier()
        grid = ic.num_tiles(M, N, BM, BN) if form == "tile" else 1
        repeated_all_reduce_kernel[(grid,)](
            ctx.get_device_context(), data(r, seed).to(dev), src, dst, locks, M, N, R, rank=r, world_size=W,
            TWO_SHOT=variant == "two_shot", RANGE=form == "range", BLOCK_M=BM, BLOCK_N=BN)
        expected = sum(data(q, seed) for q in range(W))  # integers: exact in any order
        wrong = (dst.cpu() != expected).flatten(1).any(1).nonzero().flatten().tolist()
        everyone = ctx.comm.allgather(wrong)
        assert not any(everyone), (
            f"all_reduce_{variant} per {form}, back to back in one kernel, {W} ranks: calls that summed data of "
            f"another call (a peer's source was overwritten while this rank read it), of {R} per rank: "
            + ", ".join(f"rank {q}: {calls}" for q, calls in enumerate(everyone)))
        ctx.barrier()
        for t in (locks, dst, src):
            if ctx.is_symmetric(t):
                ctx.free(t)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    iris.runtime.testing.run_scenarios(globals(), heap_size=1 << 24)
