"""Multi-rank scenarios of iris.collectives.ops (run by test_ops_multirank.py on 1..N ranks).

Every rank regenerates every rank's inputs from seeds, so the reference needs no communication.
Inputs are small integers (|x| <= 4) in every dtype, so every product and sum is exact in fp32 in
any order: each result must equal, bit for bit, torch's fp32 result rounded once to the output
dtype. Outputs are poisoned (NaN) before each call, so an element the op skips fails.

``IRIS_TEST_REPEATS`` sets the number of back-to-back calls (default 50 on cuda, 8 on cpu: the
interpreter runs every program of every call in turn).
"""

from __future__ import annotations

import os
import sys

import torch

import iris.runtime.testing
from iris.collectives import ops
from iris.runtime import IrisUsageError, UnsupportedDtypeError

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
SMALL = ops.Config(block_m=16, block_n=16, block_k=16, group_m=2)


def repeats(ctx) -> int:
    return int(os.environ.get("IRIS_TEST_REPEATS", "50" if ctx.backend == "cuda" else "8"))


def ints(shape, dtype, seed: int) -> torch.Tensor:
    """Integers in [-4, 4] as ``dtype``, the same wherever generated (CPU generator)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-4, 5, shape, generator=g).to(dtype)


def check(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Bit for bit (NaN poison included)."""
    actual = actual.cpu()
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype}, expected {expected.dtype}"
    bits = {2: torch.int16, 4: torch.int32}[expected.element_size()]
    differ = actual.contiguous().view(bits) != expected.contiguous().view(bits)
    count = int(differ.sum())
    if count:
        where = differ.nonzero()[:5].tolist()
        pairs = [(actual[tuple(i)].item(), expected[tuple(i)].item()) for i in where]
        raise AssertionError(f"{what}: {count} of {actual.numel()} elements differ; first (got, expected) at "
                             f"{where}: {pairs}")


def poisoned(shape, dtype, device) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def expect_error(fn, kind, *fragments) -> None:
    try:
        fn()
    except kind as exc:
        text = str(exc)
        missing = [f for f in fragments if f not in text]
        assert not missing, f"error message {text!r} lacks {missing}"
        return
    raise AssertionError(f"expected {kind.__name__} with {fragments}")


# --- references (host, fp32, exact for small integers) ----------------------------------------------

def ref_matmul_all_reduce(W, M, N, K, dtype, out_dtype, seed, with_bias):
    total = sum(ints((M, K), dtype, seed + 10 * r).float() @ ints((K, N), dtype, seed + 10 * r + 1).float()
                for r in range(W))
    if with_bias:
        total = total + ints((N,), dtype, seed + 5).float()
    return total.to(out_dtype)


def run_matmul_all_reduce(ctx, M, N, K, dtype, out_dtype, seed, with_bias, config, out=None):
    dev, r = ctx.device, ctx.rank
    a = ints((M, K), dtype, seed + 10 * r).to(dev)
    b = ints((K, N), dtype, seed + 10 * r + 1).to(dev)
    bias = ints((N,), dtype, seed + 5).to(dev) if with_bias else None
    if out is None:
        out = poisoned((M, N), out_dtype, dev)
    else:
        out.fill_(float("nan"))
    ops.matmul_all_reduce(ctx, out, a, b, bias, config=config)
    return out


def ref_matmul_reduce_scatter(W, rank, M, N, K, dtype, out_dtype, seed, with_bias):
    full = ref_matmul_all_reduce(W, M, N, K, dtype, torch.float32, seed, with_bias)
    m = M // W
    return full[rank * m:(rank + 1) * m].to(out_dtype)


def run_matmul_reduce_scatter(ctx, M, N, K, dtype, out_dtype, seed, with_bias, config):
    dev, r = ctx.device, ctx.rank
    a = ints((M, K), dtype, seed + 10 * r).to(dev)
    b = ints((K, N), dtype, seed + 10 * r + 1).to(dev)
    bias = ints((N,), dtype, seed + 5).to(dev) if with_bias else None
    out = poisoned((M // ctx.world_size, N), out_dtype, dev)
    ops.matmul_reduce_scatter(ctx, out, a, b, bias, config=config)
    return out


def ref_all_gather_matmul(W, M, N, K, dtype, out_dtype, seed, with_bias):
    a = torch.cat([ints((M // W, K), dtype, seed + 10 * r) for r in range(W)])
    total = a.float() @ ints((K, N), dtype, seed + 1).float()
    if with_bias:
        total = total + ints((N,), dtype, seed + 5).float()
    return total.to(out_dtype)


def run_gather_op(ctx, op, M, N, K, dtype, out_dtype, seed, with_bias, config, out=None):
    """all_gather_matmul or matmul_all_gather: rank r's [M / W, K] rows, one b for every rank."""
    dev, r = ctx.device, ctx.rank
    a = ints((M // ctx.world_size, K), dtype, seed + 10 * r).to(dev)
    b = ints((K, N), dtype, seed + 1).to(dev)
    bias = ints((N,), dtype, seed + 5).to(dev) if with_bias else None
    if out is None:
        out = poisoned((M, N), out_dtype, dev)
    op(ctx, out, a, b, bias, config=config)
    return out


# --- scenarios ----------------------------------------------------------------------------------------

def scenario_matmul_all_reduce(ctx):
    """Both strategies, fp32/fp16/bf16 in and out, ragged M, N, K, bias on and off."""
    W = ctx.world_size
    cases = [(40, 36, 20, "fp32", "fp32", True), (33, 50, 27, "fp16", "fp16", False),
             (21, 70, 45, "bf16", "bf16", True), (48, 32, 32, "bf16", "fp32", False)]
    for variant in ("one_shot", "two_shot"):
        cfg = ops.Config(variant=variant, block_m=16, block_n=16, block_k=16, group_m=2)
        for i, (M, N, K, dt, odt, with_bias) in enumerate(cases):
            seed = 100 + i
            out = run_matmul_all_reduce(ctx, M, N, K, DTYPES[dt], DTYPES[odt], seed, with_bias, cfg)
            check(out, ref_matmul_all_reduce(W, M, N, K, DTYPES[dt], DTYPES[odt], seed, with_bias),
                  f"matmul_all_reduce {variant} {M}x{N}x{K} {dt}->{odt} bias={with_bias}")


def scenario_matmul_all_reduce_back_to_back(ctx):
    """Many calls with new data, no barrier between them, for both strategies (out on the heap
    for two-shot: written in place)."""
    W, M, N, K = ctx.world_size, 24, 40, 20
    for variant in ("one_shot", "two_shot"):
        cfg = ops.Config(variant=variant, block_m=16, block_n=16, block_k=16)
        out = ctx.zeros(M, N, dtype=torch.bfloat16) if variant == "two_shot" else None
        results = []
        for i in range(repeats(ctx)):
            got = run_matmul_all_reduce(ctx, M, N, K, torch.bfloat16, torch.bfloat16, 1000 + i, True, cfg, out)
            results.append(got.clone())
        for i, got in enumerate(results):
            check(got, ref_matmul_all_reduce(W, M, N, K, torch.bfloat16, torch.bfloat16, 1000 + i, True),
                  f"matmul_all_reduce {variant} call {i}")
        if out is not None:
            ctx.barrier()  # peers may still write into this rank's out while it is freed
            ctx.free(out)


def scenario_matmul_reduce_scatter(ctx):
    """fp32/fp16/bf16, ragged rows per rank (M / W not a multiple of BLOCK_M), N and K ragged,
    bias on and off, then back-to-back calls with new data and no barrier."""
    W = ctx.world_size
    cases = [(W * 20, 36, 20, "fp32", "fp32", True), (W * 11, 50, 27, "fp16", "fp16", False),
             (W * 7, 70, 45, "bf16", "bf16", True), (W * 16, 32, 32, "bf16", "fp32", False)]
    for i, (M, N, K, dt, odt, with_bias) in enumerate(cases):
        seed = 200 + i
        out = run_matmul_reduce_scatter(ctx, M, N, K, DTYPES[dt], DTYPES[odt], seed, with_bias, SMALL)
        check(out, ref_matmul_reduce_scatter(W, ctx.rank, M, N, K, DTYPES[dt], DTYPES[odt], seed, with_bias),
              f"matmul_reduce_scatter {M}x{N}x{K} {dt}->{odt} bias={with_bias}")
    M, N, K = W * 12, 40, 20
    results = [run_matmul_reduce_scatter(ctx, M, N, K, torch.bfloat16, torch.bfloat16, 2000 + i, True, SMALL)
               for i in range(repeats(ctx))]
    for i, got in enumerate(results):
        check(got, ref_matmul_reduce_scatter(W, ctx.rank, M, N, K, torch.bfloat16, torch.bfloat16, 2000 + i, True),
              f"matmul_reduce_scatter call {i}")


def gather_scenario(ctx, op, name, seed0):
    W = ctx.world_size
    cases = [(W * 20, 36, 20, "fp32", "fp32", True), (W * 11, 50, 27, "fp16", "fp16", False),
             (W * 7, 70, 45, "bf16", "bf16", True), (W * 16, 32, 32, "bf16", "fp32", False)]
    for i, (M, N, K, dt, odt, with_bias) in enumerate(cases):
        seed = seed0 + i
        out = run_gather_op(ctx, op, M, N, K, DTYPES[dt], DTYPES[odt], seed, with_bias, SMALL)
        # matmul_all_gather's rows are each rank's (a_r @ b + bias): the same as gathering A first
        check(out, ref_all_gather_matmul(W, M, N, K, DTYPES[dt], DTYPES[odt], seed, with_bias),
              f"{name} {M}x{N}x{K} {dt}->{odt} bias={with_bias}")
    M, N, K = W * 12, 40, 20
    results = [run_gather_op(ctx, op, M, N, K, torch.bfloat16, torch.bfloat16, seed0 + 100 + i, True, SMALL)
               for i in range(repeats(ctx))]
    for i, got in enumerate(results):
        check(got, ref_all_gather_matmul(W, M, N, K, torch.bfloat16, torch.bfloat16, seed0 + 100 + i, True),
              f"{name} call {i}")


def scenario_all_gather_matmul(ctx):
    """fp32/fp16/bf16, shards of M / W rows that straddle tiles, ragged N and K, bias on and
    off, then back-to-back calls with new data and no barrier."""
    gather_scenario(ctx, ops.all_gather_matmul, "all_gather_matmul", 300)


def scenario_matmul_all_gather(ctx):
    """As all_gather_matmul, for the push-and-gather of the product."""
    gather_scenario(ctx, ops.matmul_all_gather, "matmul_all_gather", 400)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    iris.runtime.testing.run_scenarios(globals(), heap_size=1 << 24)
