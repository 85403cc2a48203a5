"""Multi-rank scenarios of iris.collectives.ops (run by test_ops_multirank.py on 1..N ranks).

Every rank regenerates every rank's inputs from seeds, so the reference needs no communication.
Inputs are small integers (|x| <= 4) in every dtype, so every product and sum is exact in fp32 in
any order: each result must equal, bit for bit, torch's fp32 result rounded once to the output
dtype. Outputs are poisoned (NaN) before each call, so an element the op skips fails.

``IRIS_TEST_REPEATS`` sets the number of back-to-back calls (default 50 on cuda, 6 on cpu: the
interpreter runs every program of every call in turn, and CI has two cores).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import sys

import torch

import iris.runtime.testing
from iris.collectives import ops
from iris.runtime import IrisUsageError, UnsupportedDtypeError
from iris.runtime.testing import expect_error, spread

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
SMALL = ops.Config(block_m=16, block_n=16, block_k=16, group_m=2)


def repeats(ctx) -> int:
    return int(os.environ.get("IRIS_TEST_REPEATS", "50" if ctx.device.type == "cuda" else "6"))


def ints(shape, dtype, seed: int) -> torch.Tensor:
    """Integers in [-4, 4] as ``dtype``, the same wherever generated (CPU generator)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-4, 5, shape, generator=g).to(dtype)


def check(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Bit for bit (NaN poison included)."""
    actual = actual.cpu()
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype}, expected {expected.dtype}"
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[expected.element_size()]
    differ = actual.contiguous().view(bits) != expected.contiguous().view(bits)
    count = int(differ.sum())
    if count:
        where = differ.nonzero()[:5].tolist()
        pairs = [(actual[tuple(i)].item(), expected[tuple(i)].item()) for i in where]
        raise AssertionError(f"{what}: {count} of {actual.numel()} elements differ; first (got, expected) at "
                             f"{where}: {pairs}")


def poisoned(shape, dtype, device) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


# --- references (host, fp32, exact for small integers) ----------------------------------------------

#: The layout the run_* helpers hand b to the ops in: row-major, or column-major (``weight.t()``'s
#: layout, read through descriptors of the transpose); scenario_tma_path runs both.
B_COLUMN_MAJOR = False


def b_layout(b: torch.Tensor) -> torch.Tensor:
    """``b`` in the layout of :data:`B_COLUMN_MAJOR` (same values)."""
    return b.t().contiguous().t() if B_COLUMN_MAJOR else b


def ref_matmul_all_reduce(W, M, N, K, dtype, out_dtype, seed, with_bias):
    total = sum(ints((M, K), dtype, seed + 10 * r).float() @ ints((K, N), dtype, seed + 10 * r + 1).float()
                for r in range(W))
    if with_bias:
        total = total + ints((N,), dtype, seed + 5).float()
    return total.to(out_dtype)


def run_matmul_all_reduce(ctx, M, N, K, dtype, out_dtype, seed, with_bias, config, out=None, group=None):
    dev, r = ctx.device, (ctx if group is None else group).rank
    a = ints((M, K), dtype, seed + 10 * r).to(dev)
    b = b_layout(ints((K, N), dtype, seed + 10 * r + 1).to(dev))
    bias = ints((N,), dtype, seed + 5).to(dev) if with_bias else None
    if out is None:
        out = poisoned((M, N), out_dtype, dev)
    else:
        out.fill_(float("nan"))
    ops.matmul_all_reduce(ctx, out, a, b, bias, config=config, group=group)
    return out


def ref_matmul_reduce_scatter(W, rank, M, N, K, dtype, out_dtype, seed, with_bias):
    full = ref_matmul_all_reduce(W, M, N, K, dtype, torch.float32, seed, with_bias)
    m = M // W
    return full[rank * m:(rank + 1) * m].to(out_dtype)


def run_matmul_reduce_scatter(ctx, M, N, K, dtype, out_dtype, seed, with_bias, config, group=None):
    dev, r, W = ctx.device, (ctx if group is None else group).rank, (ctx if group is None else group).world_size
    a = ints((M, K), dtype, seed + 10 * r).to(dev)
    b = b_layout(ints((K, N), dtype, seed + 10 * r + 1).to(dev))
    bias = ints((N,), dtype, seed + 5).to(dev) if with_bias else None
    out = poisoned((M // W, N), out_dtype, dev)
    ops.matmul_reduce_scatter(ctx, out, a, b, bias, config=config, group=group)
    return out


def ref_all_gather_matmul(W, M, N, K, dtype, out_dtype, seed, with_bias):
    a = torch.cat([ints((M // W, K), dtype, seed + 10 * r) for r in range(W)])
    total = a.float() @ ints((K, N), dtype, seed + 1).float()
    if with_bias:
        total = total + ints((N,), dtype, seed + 5).float()
    return total.to(out_dtype)


def run_gather_op(ctx, op, M, N, K, dtype, out_dtype, seed, with_bias, config, out=None, group=None):
    """all_gather_matmul or matmul_all_gather: rank r's [M / W, K] rows, one b for every rank
    (``group``: r and W the group's)."""
    dev, r, W = ctx.device, (ctx if group is None else group).rank, (ctx if group is None else group).world_size
    a = ints((M // W, K), dtype, seed + 10 * r).to(dev)
    b = b_layout(ints((K, N), dtype, seed + 1).to(dev))
    bias = ints((N,), dtype, seed + 5).to(dev) if with_bias else None
    if out is None:
        out = poisoned((M, N), out_dtype, dev)
    op(ctx, out, a, b, bias, config=config, group=group)
    return out


def four_ops(ctx, d, N, K, seed, with_bias, m_all_reduce, m_local_gather, cfg=None):
    """``(run, reference, name)`` of each op once, with ``cfg`` (default SMALL tiles), seeds ``seed`` to ``seed + 3``:
    matmul_all_reduce of ``m_all_reduce`` rows, the others of ``W * 16`` rows but all_gather_matmul
    (``W * m_local_gather``: a multiple of 16 per rank takes the descriptor path on a GPU)."""
    W, r = ctx.world_size, ctx.rank
    cfg = SMALL if cfg is None else cfg
    return [(lambda: run_matmul_all_reduce(ctx, m_all_reduce, N, K, d, d, seed, with_bias, cfg),
             lambda: ref_matmul_all_reduce(W, m_all_reduce, N, K, d, d, seed, with_bias), "matmul_all_reduce"),
            (lambda: run_matmul_reduce_scatter(ctx, W * 16, N, K, d, d, seed + 1, with_bias, cfg),
             lambda: ref_matmul_reduce_scatter(W, r, W * 16, N, K, d, d, seed + 1, with_bias),
             "matmul_reduce_scatter"),
            (lambda: run_gather_op(ctx, ops.all_gather_matmul, W * m_local_gather, N, K, d, d, seed + 2, with_bias,
                                   cfg),
             lambda: ref_all_gather_matmul(W, W * m_local_gather, N, K, d, d, seed + 2, with_bias),
             "all_gather_matmul"),
            (lambda: run_gather_op(ctx, ops.matmul_all_gather, W * 16, N, K, d, d, seed + 3, with_bias, cfg),
             lambda: ref_all_gather_matmul(W, W * 16, N, K, d, d, seed + 3, with_bias), "matmul_all_gather")]


# --- scenarios ----------------------------------------------------------------------------------------

def scenario_matmul_all_reduce(ctx):
    """Both strategies, fp32/fp16/bf16 in and out, ragged M, N, K, bias on and off."""
    W = ctx.world_size
    cases = [(40, 36, 20, "fp32", "fp32", True), (33, 50, 27, "fp16", "fp16", False),
             (21, 70, 45, "bf16", "bf16", True), (48, 32, 32, "bf16", "fp32", False)]
    for variant, (i, (M, N, K, dt, odt, with_bias)) in spread(itertools.product(("one_shot", "two_shot"),
                                                                              enumerate(cases)), W):
        cfg = ops.Config(variant=variant, block_m=16, block_n=16, block_k=16, group_m=2)
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
    """Both strategies: fp32/fp16/bf16, ragged rows per rank (M / W not a multiple of BLOCK_M), N
    and K ragged, bias on and off, then back-to-back calls with new data and no barrier."""
    W = ctx.world_size
    cases = [(W * 20, 36, 20, "fp32", "fp32", True), (W * 11, 50, 27, "fp16", "fp16", False),
             (W * 7, 70, 45, "bf16", "bf16", True), (W * 16, 32, 32, "bf16", "fp32", False)]
    configs = (SMALL, dataclasses.replace(SMALL, variant="rotated"))
    chosen = spread([(c.variant, i) for c in configs for i in range(len(cases))], W)
    for cfg in configs:
        for i, (M, N, K, dt, odt, with_bias) in enumerate(cases):
            if (cfg.variant, i) not in chosen:
                continue
            seed = 200 + i
            out = run_matmul_reduce_scatter(ctx, M, N, K, DTYPES[dt], DTYPES[odt], seed, with_bias, cfg)
            check(out, ref_matmul_reduce_scatter(W, ctx.rank, M, N, K, DTYPES[dt], DTYPES[odt], seed, with_bias),
                  f"matmul_reduce_scatter {cfg.variant} {M}x{N}x{K} {dt}->{odt} bias={with_bias}")
        M, N, K = W * 12, 40, 20
        results = [run_matmul_reduce_scatter(ctx, M, N, K, torch.bfloat16, torch.bfloat16, 2000 + i, True, cfg)
                   for i in range(repeats(ctx))]
        for i, got in enumerate(results):
            check(got, ref_matmul_reduce_scatter(W, ctx.rank, M, N, K, torch.bfloat16, torch.bfloat16, 2000 + i,
                                                 True), f"matmul_reduce_scatter {cfg.variant} call {i}")


def scenario_matmul_all_reduce_rotated(ctx):
    """Strategy ``rotated`` (M a multiple of W; chunks of M / W rows that straddle tiles), dtypes,
    bias on and off, a grid smaller than a chunk's tiles, then back-to-back calls with new data and
    no barrier (the double-buffered slots wrap around)."""
    W = ctx.world_size
    rotated = dataclasses.replace(SMALL, variant="rotated")
    cases = [(W * 20, 36, 20, "fp32", "fp32", True, rotated), (W * 11, 50, 27, "fp16", "fp16", False, rotated),
             (W * 7, 70, 45, "bf16", "bf16", True, dataclasses.replace(rotated, grid=2))]
    for i, (M, N, K, dt, odt, with_bias, cfg) in enumerate(cases):
        seed = 150 + i
        out = run_matmul_all_reduce(ctx, M, N, K, DTYPES[dt], DTYPES[odt], seed, with_bias, cfg)
        check(out, ref_matmul_all_reduce(W, M, N, K, DTYPES[dt], DTYPES[odt], seed, with_bias),
              f"matmul_all_reduce rotated {M}x{N}x{K} {dt}->{odt} bias={with_bias} grid={cfg.grid}")
    M, N, K = W * 12, 40, 20
    results = [run_matmul_all_reduce(ctx, M, N, K, torch.bfloat16, torch.bfloat16, 1500 + i, True, rotated).clone()
               for i in range(repeats(ctx))]
    for i, got in enumerate(results):
        check(got, ref_matmul_all_reduce(W, M, N, K, torch.bfloat16, torch.bfloat16, 1500 + i, True),
              f"matmul_all_reduce rotated call {i}")


def ref_partials_in_input_dtype(W, M, N, K, dtype, out_dtype, seed, with_bias, gather):
    """``Config(partial_dtype="input")``: each rank's fp32 partial (rank 0's with the all-reduce's
    bias) rounded to ``dtype``, then summed in fp32 in rank order (the reduce-scatter's bias
    after), rounded once; the all-reduce's full result or, without ``gather``, all of it (the
    caller slices). One rank: no partial is handed over, the exact result."""
    if W == 1:
        return ref_matmul_all_reduce(W, M, N, K, dtype, out_dtype, seed, with_bias)
    bias = ints((N,), dtype, seed + 5).float()
    parts = [ints((M, K), dtype, seed + 10 * r).float() @ ints((K, N), dtype, seed + 10 * r + 1).float()
             for r in range(W)]
    if with_bias and gather:
        parts[0] = parts[0] + bias
    total = torch.zeros(M, N)
    for part in parts:
        total = total + part.to(dtype).float()
    if with_bias and not gather:
        total = total + bias
    return total.to(out_dtype)


def scenario_partials_in_input_dtype(ctx):
    """``Config(variant="rotated", partial_dtype="input")``: bf16 partials over K = 200 (about 100
    in magnitude, some above 256) lose bits when rounded (the result differs from the fp32-staged
    one, which the scenario asserts of its own data), fp16 ones do not; both ops, bias on and off,
    an fp32 output, back-to-back calls; the all-reduce with M not a multiple of W stages fp32 there
    (one_shot takes over), while strategy ``unfused`` rounds the partials at any M."""
    W, r = ctx.world_size, ctx.rank
    cfg = dataclasses.replace(SMALL, variant="rotated", partial_dtype="input")
    cases = [(W * 7, 70, 200, "bf16", "bf16", True), (W * 9, 33, 200, "bf16", "fp32", False),
             (W * 11, 50, 27, "fp16", "fp16", True)]
    for i, (M, N, K, dt, odt, with_bias) in enumerate(cases):
        seed, m = 3000 + i, M // W
        dtype, out_dtype = DTYPES[dt], DTYPES[odt]
        if W > 1 and dt == "bf16":  # the data must tell the two dtypes apart, or the check proves nothing
            exact = ref_matmul_all_reduce(W, M, N, K, dtype, torch.float32, seed, with_bias)
            rounded = ref_partials_in_input_dtype(W, M, N, K, dtype, torch.float32, seed, with_bias, True)
            assert bool((exact != rounded).any()), f"case {i}: bf16 partials lose nothing on this data"
        out = run_matmul_all_reduce(ctx, M, N, K, dtype, out_dtype, seed, with_bias, cfg)
        check(out, ref_partials_in_input_dtype(W, M, N, K, dtype, out_dtype, seed, with_bias, True),
              f"matmul_all_reduce partial_dtype=input {M}x{N}x{K} {dt}->{odt} bias={with_bias}")
        out = run_matmul_reduce_scatter(ctx, M, N, K, dtype, out_dtype, seed, with_bias, cfg)
        full = ref_partials_in_input_dtype(W, M, N, K, dtype, torch.float32, seed, with_bias, False)
        check(out, full[r * m:(r + 1) * m].to(out_dtype),
              f"matmul_reduce_scatter partial_dtype=input {M}x{N}x{K} {dt}->{odt} bias={with_bias}")
    M, N, K = W * 12, 40, 200
    results = [run_matmul_reduce_scatter(ctx, M, N, K, torch.bfloat16, torch.bfloat16, 3100 + i, True, cfg)
               for i in range(repeats(ctx))]
    for i, got in enumerate(results):
        full = ref_partials_in_input_dtype(W, M, N, K, torch.bfloat16, torch.float32, 3100 + i, True, False)
        check(got, full[r * (M // W):(r + 1) * (M // W)].to(torch.bfloat16),
              f"matmul_reduce_scatter partial_dtype=input call {i}")
    if W > 1:  # one_shot takes over: fp32 partials, the exact result
        M = W * 7 + 1
        out = run_matmul_all_reduce(ctx, M, 30, 200, torch.bfloat16, torch.float32, 3200, True, cfg)
        check(out, ref_matmul_all_reduce(W, M, 30, 200, torch.bfloat16, torch.float32, 3200, True),
              f"matmul_all_reduce partial_dtype=input M={M} (not a multiple of {W})")
        out = run_matmul_all_reduce(ctx, M, 30, 200, torch.bfloat16, torch.float32, 3200, True,
                                    dataclasses.replace(cfg, variant="unfused"))
        check(out, ref_partials_in_input_dtype(W, M, 30, 200, torch.bfloat16, torch.float32, 3200, True, True),
              f"matmul_all_reduce unfused partial_dtype=input M={M} (not a multiple of {W})")


def gather_scenario(ctx, op, name, seed0, config=SMALL, only=None):
    W = ctx.world_size
    cases = [(W * 20, 36, 20, "fp32", "fp32", True), (W * 11, 50, 27, "fp16", "fp16", False),
             (W * 7, 70, 45, "bf16", "bf16", True), (W * 16, 32, 32, "bf16", "fp32", False)]
    cases = cases if only is None else [cases[i] for i in only]
    for i, (M, N, K, dt, odt, with_bias) in enumerate(cases):
        seed = seed0 + i
        out = run_gather_op(ctx, op, M, N, K, DTYPES[dt], DTYPES[odt], seed, with_bias, config)
        # matmul_all_gather's rows are each rank's (a_r @ b + bias): the same as gathering A first
        check(out, ref_all_gather_matmul(W, M, N, K, DTYPES[dt], DTYPES[odt], seed, with_bias),
              f"{name} {M}x{N}x{K} {dt}->{odt} bias={with_bias}")
    M, N, K = W * 12, 40, 20
    results = [run_gather_op(ctx, op, M, N, K, torch.bfloat16, torch.bfloat16, seed0 + 100 + i, True, config)
               for i in range(repeats(ctx))]
    for i, got in enumerate(results):
        check(got, ref_all_gather_matmul(W, M, N, K, torch.bfloat16, torch.bfloat16, seed0 + 100 + i, True),
              f"{name} call {i}")


def scenario_all_gather_matmul(ctx):
    """fp32/fp16/bf16, shards of M / W rows that straddle tiles, ragged N and K, bias on and
    off, then back-to-back calls with new data and no barrier."""
    gather_scenario(ctx, ops.all_gather_matmul, "all_gather_matmul", 300)


def scenario_all_gather_matmul_arrival(ctx):
    """The arrival-order strategy (own shard first, then peers as they arrive), on the ragged cases
    (fp16, bf16): with 7 or 11 rows per rank and 16-row tiles, tiles run into two or three ranks'
    shards."""
    cfg = ops.Config(variant="arrival", block_m=16, block_n=16, block_k=16, group_m=2)
    gather_scenario(ctx, ops.all_gather_matmul, "all_gather_matmul arrival", 600, cfg, only=(1, 2))
    # fewer programs than tiles: each program takes a share of every rank's tiles
    few = ops.Config(variant="arrival", block_m=16, block_n=16, block_k=16, grid=3)
    out = run_gather_op(ctx, ops.all_gather_matmul, ctx.world_size * 20, 40, 20, torch.float32, torch.float32, 650,
                        True, few)
    check(out, ref_all_gather_matmul(ctx.world_size, ctx.world_size * 20, 40, 20, torch.float32, torch.float32, 650,
                                     True), "all_gather_matmul arrival grid=3")


def scenario_matmul_all_gather(ctx):
    """As all_gather_matmul, for the push-and-gather of the product."""
    gather_scenario(ctx, ops.matmul_all_gather, "matmul_all_gather", 400)


def scenario_gather_ops_unfused(ctx):
    """Strategy ``unfused`` of both gather ops (torch's GEMM and ``ccl.all_gather``): the cases of
    the fused strategies, back-to-back calls, an ``out`` that is not contiguous (a transposed view,
    written through a cached buffer) in the inputs' dtype and in fp32, and an fp32 bias on bf16
    inputs, which must be added before the one rounding (as the fused strategy does, also checked)."""
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    cfg = dataclasses.replace(SMALL, variant="unfused")
    for op, name, seed in ((ops.all_gather_matmul, "all_gather_matmul", 700), (ops.matmul_all_gather,
                                                                                "matmul_all_gather", 800)):
        gather_scenario(ctx, op, f"{name} unfused", seed, cfg)
        for i, out_dtype in enumerate((torch.bfloat16, torch.bfloat16, torch.float32)):  # again: cached buffers
            out = poisoned((40, W * 9), out_dtype, dev).t()
            run_gather_op(ctx, op, W * 9, 40, 30, torch.bfloat16, out_dtype, seed + 50 + i, True, cfg, out)
            check(out, ref_all_gather_matmul(W, W * 9, 40, 30, torch.bfloat16, out_dtype, seed + 50 + i, True),
                  f"{name} unfused into a transposed {out_dtype} out, call {i}")
        # an fp32 bias with fractions that bf16 cannot hold: one rounding differs from two (the
        # data must show it, or the check proves nothing)
        M, N, K = W * 8, 48, 3
        a_all = [ints((M // W, K), torch.bfloat16, seed + 60 + q) for q in range(W)]
        b = ints((K, N), torch.bfloat16, seed + 70)
        g = torch.Generator().manual_seed(seed + 80)
        bias = (torch.randint(-4, 5, (N,), generator=g) + torch.randint(1, 1024, (N,), generator=g) / 1024).float()
        exact = torch.cat(a_all).float() @ b.float() + bias
        once = exact.to(torch.bfloat16)
        twice = (torch.cat(a_all).float() @ b.float() + bias.to(torch.bfloat16).float()).to(torch.bfloat16)
        assert bool((once != twice).any()), f"{name}: this bias rounds the same once or twice"
        for strategy in (SMALL, cfg):
            out = poisoned((M, N), torch.bfloat16, dev)
            op(ctx, out, a_all[r].to(dev), b.to(dev), bias.to(dev), config=strategy)
            check(out, once, f"{name} {strategy.variant or 'default'} with an fp32 bias on bf16 inputs")
    # the workspaces hold buffers in torch's memory too: clear_workspaces frees the heap's alone
    ctx.barrier()
    ops.clear_workspaces(ctx)
    out = run_gather_op(ctx, ops.all_gather_matmul, W * 9, 40, 30, torch.bfloat16, torch.bfloat16, 890, True, cfg)
    check(out, ref_all_gather_matmul(W, W * 9, 40, 30, torch.bfloat16, torch.bfloat16, 890, True),
          "all_gather_matmul unfused after clear_workspaces")


def scenario_tma_path(ctx):
    """The tensor-descriptor K loop: the GPU default, and under the interpreter, which emulates
    tl.make_tensor_descriptor (Triton 3.9), forced by ``_launch.INTERPRETER_TMA``. Same bits as
    the reference for the four ops; all_gather_matmul's descriptors of peers' shards (translated
    pointers) in both strategies. b row-major and column-major (descriptors of its transpose;
    fp32's row-major b is transposed by the host first). Strides are multiples of 16 bytes (the
    descriptors' rule); M, N and K are still ragged."""
    global B_COLUMN_MAJOR
    from iris.collectives import _workspace
    from iris.collectives.ops import _launch
    from iris.collectives.ops._config import VARIANTS

    if ctx.backend == "cpu":
        from triton.runtime.interpreter import InterpreterBuilder

        if not hasattr(InterpreterBuilder, "create_make_tensor_descriptor"):
            if ctx.rank == 0:
                print("note: this Triton's interpreter has no tensor descriptors; descriptor path not run", flush=True)
            return
    W = ctx.world_size
    _launch.INTERPRETER_TMA = True
    try:
        # all four at every world size: fp32's row-major b is transposed by the host, so a share of
        # them could miss a descriptor layout that the check below wants of every op
        for columns, dt in itertools.product((False, True), ("fp32", "bf16")):
            B_COLUMN_MAJOR, d, how = columns, DTYPES[dt], f"{dt} b {'column' if columns else 'row'}-major"
            out = run_matmul_all_reduce(ctx, 40, 40, 24, d, d, 500, True, SMALL)
            check(out, ref_matmul_all_reduce(W, 40, 40, 24, d, d, 500, True), f"tma matmul_all_reduce {how}")
            for variant in VARIANTS["matmul_reduce_scatter"]:
                cfg = dataclasses.replace(SMALL, variant=variant)
                out = run_matmul_reduce_scatter(ctx, W * 12, 40, 24, d, d, 501, True, cfg)
                check(out, ref_matmul_reduce_scatter(W, ctx.rank, W * 12, 40, 24, d, d, 501, True),
                      f"tma matmul_reduce_scatter {variant} {how}")
            out = run_gather_op(ctx, ops.matmul_all_gather, W * 12, 40, 24, d, d, 502, True, SMALL)
            check(out, ref_all_gather_matmul(W, W * 12, 40, 24, d, d, 502, True), f"tma matmul_all_gather {how}")
            # all_gather_matmul takes descriptors only when every tile lies in one shard: M / W = 32
            for variant in VARIANTS["all_gather_matmul"]:
                cfg = dataclasses.replace(SMALL, variant=variant)
                out = run_gather_op(ctx, ops.all_gather_matmul, W * 32, 40, 24, d, d, 503, True, cfg)
                check(out, ref_all_gather_matmul(W, W * 32, 40, 24, d, d, 503, True),
                      f"tma all_gather_matmul {variant} {how}")
        for op in ("all_gather_matmul", "matmul_reduce_scatter", "matmul_all_reduce", "matmul_all_gather"):
            took = {dict(variant)["USE_TMA"] for key, ws in _workspace._CACHES[ctx].items() if key[0] == op
                    for variant in ws.grids}
            assert {_launch.TMA_B_ROWS, _launch.TMA_B_COLUMNS} <= took, f"{op}: descriptor launches {took}"
    finally:
        _launch.INTERPRETER_TMA = False
        B_COLUMN_MAJOR = False


def scenario_calls_from_another_thread(ctx):
    """Each op called in a thread of its own after calls in the main thread, as autograd runs a
    backward: Triton keeps the allocator that tensor descriptors need per thread, and one set
    once per process left the second thread without one ("no allocator was set", the compiled
    MLP's backward on an H200). Shapes the descriptor path takes on a GPU; results as in the
    main thread."""
    import threading

    cases = four_ops(ctx, torch.bfloat16, 40, 24, 920, True, m_all_reduce=48, m_local_gather=32)
    for run, ref, name in cases:
        check(run(), ref(), f"{name} in the main thread")
        got = {}

        def in_thread(run=run):
            try:
                got["out"] = run()
                torch.cuda.synchronize(ctx.device) if ctx.device.type == "cuda" else None
            except Exception as exc:  # re-raised below, in the scenario's thread
                got["error"] = exc

        thread = threading.Thread(target=in_thread, name=f"iris-test-{name}")
        thread.start()
        thread.join()
        if "error" in got:
            raise AssertionError(f"{name} in a second thread raised {got['error']!r}") from got["error"]
        check(got["out"], ref(), f"{name} in a second thread")


def scenario_late_first_call(ctx):
    """Rank 0 reaches the first call of a shape 0.5 s late (as behind a long GEMM): the peers'
    kernels must not signal into its new flags before its zero fill, which would erase them and
    hang both sides (seen on an H200); workspace creation waits for every rank. Each op with flags,
    a fresh workspace each."""
    ctx.barrier()
    ops.clear_workspaces(ctx)
    cases = four_ops(ctx, torch.float32, 24, 16, 910, False, m_all_reduce=40, m_local_gather=16)
    for run, ref, name in cases:
        if ctx.rank == 0:
            iris.runtime.testing.busy_stream(ctx, 0.5)
        check(run(), ref(), f"late first call of {name}")


def scenario_workspace_cache(ctx):
    """One workspace per (op, shape, dtype, world, config), reused by later calls (no heap growth);
    clear_workspaces frees them, and the next call allocates fresh ones and is still right."""
    from iris.collectives import _workspace

    W, M, N, K = ctx.world_size, 24, 40, 20
    cfg = ops.Config(block_m=16, block_n=16, block_k=16)
    ops.clear_workspaces(ctx)
    run_matmul_all_reduce(ctx, M, N, K, torch.float32, torch.float32, 700, False, cfg)
    free = ctx.heap_free_bytes
    # the op's own workspace, and on the GPU (strategy unfused for fp32: FP32_INPUTS) ccl's too
    keys = list(_workspace._CACHES[ctx])
    for i in range(3):
        out = run_matmul_all_reduce(ctx, M, N, K, torch.float32, torch.float32, 701 + i, False, cfg)
        check(out, ref_matmul_all_reduce(W, M, N, K, torch.float32, torch.float32, 701 + i, False), f"cached call {i}")
    assert ctx.heap_free_bytes == free, "a later call with the same key allocated on the heap"
    assert list(_workspace._CACHES[ctx]) == keys, (keys, list(_workspace._CACHES[ctx]))
    assert [key[0] for key in keys].count("matmul_all_reduce") == 1, keys
    ctx.barrier()  # every rank is done with the buffers before any rank frees them
    ops.clear_workspaces(ctx)
    assert ctx.heap_free_bytes > free
    out = run_matmul_all_reduce(ctx, M, N, K, torch.float32, torch.float32, 710, False, cfg)
    check(out, ref_matmul_all_reduce(W, M, N, K, torch.float32, torch.float32, 710, False), "after clear_workspaces")


def scenario_fp32_inputs_follow_torchs_precision(ctx):
    """fp32 inputs multiply at torch's fp32 matmul precision of the moment (tf32 or full), and with
    no strategy named the four ops then run torch's GEMM and ccl on the GPU
    (``ops._config.FP32_INPUTS``; the interpreter keeps the fused strategies); a config that asks
    for the other precision runs the fused strategies, which give it. Exact every way (tf32 holds
    these small integers, and every sum is exact in fp32)."""
    from iris.collectives import _workspace

    W, names = ctx.world_size, ("matmul_all_reduce", "matmul_reduce_scatter", "all_gather_matmul",
                                "matmul_all_gather")
    matmul = torch.backends.cuda.matmul
    saved = matmul.allow_tf32
    try:
        for tf32 in (True, False):
            matmul.allow_tf32 = tf32
            torchs, other = ("tf32", "ieee") if tf32 else ("ieee", "tf32")
            for asked in (None, other):
                ctx.barrier()  # every rank is done with the buffers before any rank frees them
                ops.clear_workspaces(ctx)
                cfg = dataclasses.replace(SMALL, input_precision=asked)
                for run, reference, name in four_ops(ctx, torch.float32, 40, 24, 900 + 10 * tf32, True, W * 8, 16,
                                                     cfg):
                    check(run(), reference(), f"{name} fp32, torch's tf32 {'on' if tf32 else 'off'}, asked {asked}")
                ran = {key[0]: key[7] for key in _workspace._CACHES[ctx] if key[0] in names}
                assert sorted(ran) == sorted(names), ran
                unfused = asked is None and ctx.device.type == "cuda"
                assert all((c.variant == "unfused") == unfused for c in ran.values()), (tf32, asked, ran)
                assert all(c.input_precision == (asked or torchs) for c in ran.values()), (tf32, asked, ran)
    finally:
        matmul.allow_tf32 = saved
        ctx.barrier()
        ops.clear_workspaces(ctx)


def scenario_calls_agree(ctx):
    """The call agreement: a rank whose fused op has other shapes (each rank's call valid on its
    own) makes every rank raise IrisCallMismatchError naming each rank's call; the context goes on."""
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    if W < 2:
        return
    f32 = dict(dtype=torch.float32, device=dev)
    k = 8 if r == 0 else 4  # this rank's share of K: a (16 x k) @ b (k x 16)
    a, b, out = torch.ones(16, k, **f32), torch.ones(k, 16, **f32), torch.zeros(16, 16, **f32)
    others = "ranks " + ", ".join(map(str, range(1, W))) if W > 2 else "rank 1"
    for op in (ops.matmul_all_reduce, ops.all_gather_matmul):
        call = f"iris.collectives.ops.{op.__name__}"
        expect_error(lambda: op(ctx, out if op is ops.matmul_all_reduce else torch.zeros(16 * W, 16, **f32), a, b,
                                config=SMALL),
                     iris.runtime.IrisCallMismatchError, f"{call}: the ranks made different collective calls",
                     "rank 0 called", f"{others} called", "=float32[16, 8], b=float32[8, 16]",
                     "=float32[16, 4], b=float32[4, 16]", "Every rank must make the same collective calls")
    # the same shapes on every rank afterwards: right
    a, b = torch.ones(16, 4, **f32), torch.ones(4, 16, **f32)
    ops.matmul_all_reduce(ctx, out, a, b, config=SMALL)
    check(out, torch.full((16, 16), 4.0 * W), "matmul_all_reduce after the mismatch")
    # all_reduce_residual_rmsnorm, planned like a ccl call: a new call is agreed on the host...
    norm = "iris.collectives.ops.all_reduce_residual_rmsnorm"
    one = ops.Config(variant="one_shot", block_m=4, grid=1)  # one tile, one program (below)
    rows = {M: [torch.ones(M, 8, **f32) for _ in range(3)] for M in (3, 4)}  # out, partial, residual
    weight = torch.ones(8, **f32)

    def rmsnorm(M, eps=1e-6):
        out, partial, residual = rows[M]
        return ops.all_reduce_residual_rmsnorm(ctx, out, None, partial, residual, weight, eps, config=one)

    expect_error(lambda: rmsnorm(4 if r == 0 else 3), iris.runtime.IrisCallMismatchError,
                 f"{norm}: the ranks made different collective calls", f"{norm}(out=float32[4, 8], residual_out=None, "
                 "partial=float32[4, 8]", "partial=float32[3, 8]")
    expect_error(lambda: rmsnorm(3, 1e-5 if r == 0 else 1e-6), iris.runtime.IrisCallMismatchError, "eps=1e-05",
                 "eps=1e-06")
    # ... and a cached one by its kernel, whose check raises on every rank on the cpu backend (on the
    # GPU it ends the job: the fault test's calls_hit); calls of 3 and 4 rows share a workspace
    if dev.type != "cuda":
        for M in (3, 4):
            rmsnorm(M)
        expect_error(lambda: rmsnorm(4 if r == 0 else 3), iris.runtime.IrisCallMismatchError, "found by its kernel",
                     "partial=float32[4, 8]", "partial=float32[3, 8]")
    rmsnorm(3)
    h = torch.full((3, 8), 1.0 + W)  # the residual plus every rank's partial
    check(rows[3][0], torch.nn.functional.rms_norm(h, (8,), torch.ones(8), 1e-6),
          "all_reduce_residual_rmsnorm after the mismatches")


# --- all_reduce_residual_rmsnorm -------------------------------------------------------------------

def ref_rmsnorm(W, shape, dtype, seed, residual=True, weight_dtype=torch.float32, eps=1e-6):
    """``(out, residual_out, weight)``: the unfused sequence in fp32, each output rounded once: the
    rank-order sum of every rank's partial, plus the residual, and torch's ``rms_norm`` of those fp32
    rows with the weight in fp32. Small integers: every sum of squares is exact, so the op's must
    match bit for bit."""
    h = torch.zeros(shape)
    for r in range(W):
        h = h + ints(shape, dtype, seed + 10 * r).float()
    if residual:
        h = h + ints(shape, dtype, seed + 7).float()
    weight = torch.randn(shape[-1], generator=torch.Generator().manual_seed(seed + 8)).to(weight_dtype)
    out = torch.nn.functional.rms_norm(h, (shape[-1],), weight.float(), eps)
    return out.to(dtype), h.to(dtype), weight


def run_rmsnorm(ctx, shape, dtype, seed, config, residual=True, residual_out="new", weight_dtype=torch.float32,
                eps=1e-6, group=None):
    """One call on this rank's partial (seeded like :func:`ref_rmsnorm`); ``residual_out``: ``"new"``
    (a tensor of its own), ``"in_place"`` (the residual) or None. Returns (out, residual_out)."""
    dev = ctx.device
    partial = ints(shape, dtype, seed + 10 * (ctx if group is None else group).rank).to(dev)
    res = ints(shape, dtype, seed + 7).to(dev) if residual else None
    weight = ref_rmsnorm(1, shape, dtype, seed, residual, weight_dtype)[2].to(dev)
    new = {"new": poisoned(shape, dtype, dev), "in_place": res, None: None}[residual_out]
    out = poisoned(shape, dtype, dev)
    returned = ops.all_reduce_residual_rmsnorm(ctx, out, new, partial, res, weight, eps, config=config, group=group)
    assert returned is out
    return out, new


def scenario_all_reduce_residual_rmsnorm(ctx):
    """Every strategy, fp32/fp16/bf16, ragged rows (one row; fewer rows than ranks; rows not a
    multiple of the ranks; 3-D activations) and ragged hidden sizes, the residual new, in place or
    not written, no residual, a bf16 weight, a tile of several rows: each output bit for bit
    against the unfused sequence in fp32 rounded once, and the same bits on every rank."""
    W = ctx.world_size
    one, buffered, two = "one_shot", "one_shot_buffered", "two_shot"
    cases = [((1, 40), "bf16", {}, (one, buffered, two)), ((W + 1, 24), "fp16", {}, (buffered, two)),
             ((2 * W + 3, 100), "fp32", {}, (one, two)),
             ((2, 3, 36), "bf16", dict(residual_out="in_place"), (buffered, two)),
             ((5, 24), "fp16", dict(residual_out=None), (one, two)),
             ((3, 24), "bf16", dict(residual=False, weight_dtype=torch.bfloat16), (buffered, two))]
    for i, (shape, dt, extra, variants) in enumerate(cases):
        for variant in variants:
            seed = 4000 + 100 * i
            out, new = run_rmsnorm(ctx, shape, DTYPES[dt], seed, ops.Config(variant=variant), **extra)
            ref_out, ref_res, _ = ref_rmsnorm(W, shape, DTYPES[dt], seed, extra.get("residual", True),
                                              extra.get("weight_dtype", torch.float32))
            what = f"all_reduce_residual_rmsnorm {variant} {shape} {dt} {extra}"
            check(out, ref_out, f"{what}: out")
            if new is not None:
                check(new, ref_res, f"{what}: residual_out")
            for name, t in (("out", out), ("residual_out", new)):
                if t is not None:
                    bits = t.cpu().view(torch.int16 if t.element_size() == 2 else torch.int32)
                    assert all(torch.equal(x, bits) for x in ctx.comm.allgather(bits)), f"{what}: {name} differs"
    # sums that bf16 cannot hold (a residual of even integers up to 254 plus partials in quarters: ten
    # significant bits), so that rounding the new residual before the norm would change the output
    # (the data must show it, or the check proves nothing); twelve columns: their sums of squares
    # stay exact in fp32
    shape, dev = (8, 12), ctx.device
    quarters = [torch.randint(-5, 6, shape, generator=torch.Generator().manual_seed(4800 + p)) / 4 for p in range(W)]
    quarters.append(torch.randint(-127, 128, shape, generator=torch.Generator().manual_seed(4890)) * 2.0)
    h = sum(q.float() for q in quarters)
    weight = torch.randn(shape[1], generator=torch.Generator().manual_seed(4899))
    once = torch.nn.functional.rms_norm(h, shape[1:], weight, 1e-6).to(torch.bfloat16)
    twice = torch.nn.functional.rms_norm(h.to(torch.bfloat16).float(), shape[1:], weight, 1e-6).to(torch.bfloat16)
    assert bool((once != twice).any()), "these sums round the same once or twice"
    for variant in (one, two):
        out = poisoned(shape, torch.bfloat16, dev)
        ops.all_reduce_residual_rmsnorm(ctx, out, None, quarters[ctx.rank].to(torch.bfloat16).to(dev),
                                        quarters[W].to(torch.bfloat16).to(dev), weight.to(dev),
                                        config=ops.Config(variant=variant))
        check(out, once, f"{variant}: the norm of the fp32 sum, not of the rounded residual")
    # tiles of several rows (one-shot) and of more rows than the default (two-shot), a small grid
    for variant, block_m in (("one_shot", 4), ("two_shot", 8)):
        cfg = ops.Config(variant=variant, block_m=block_m, grid=2)
        out, new = run_rmsnorm(ctx, (13, 24), torch.bfloat16, 4900, cfg)
        ref_out, ref_res, _ = ref_rmsnorm(W, (13, 24), torch.bfloat16, 4900)
        check(out, ref_out, f"{variant} block_m={block_m}: out")
        check(new, ref_res, f"{variant} block_m={block_m}: residual_out")


def scenario_rmsnorm_back_to_back(ctx):
    """A residual stream through ``IRIS_TEST_REPEATS / 2`` layers (at least 3) per strategy: each
    call's residual_out is the residual, in place, the next call's partial new, the rows changing
    between calls (the calls share one workspace: one_shot_buffered's grid is fixed per workspace),
    no barrier in between; every output checked against the chained reference."""
    W, dev, calls = ctx.world_size, ctx.device, max(3, repeats(ctx) // 2)
    H = 40
    weight = torch.randn(H, generator=torch.Generator().manual_seed(5100)).to(dev)
    for v, variant in enumerate(("one_shot", "one_shot_buffered", "two_shot")):
        cfg = ops.Config(variant=variant)
        stream = ints((W + 5, H), torch.bfloat16, 5000 + v)  # the longest rows; each call takes a prefix
        residual = stream.clone().to(dev)  # (a copy on the cpu backend too)
        outs = []
        for k in range(calls):
            M = (W + 5, W + 2, 3)[k % 3]
            partial = ints((M, H), torch.bfloat16, 5200 + 100 * v + 10 * k + ctx.rank).to(dev)
            out = poisoned((M, H), torch.bfloat16, dev)
            ops.all_reduce_residual_rmsnorm(ctx, out, residual[:M], partial, residual[:M], weight, config=cfg)
            outs.append(out.clone())
        for k, got in enumerate(outs):
            M = (W + 5, W + 2, 3)[k % 3]
            h = stream[:M].float() + sum(ints((M, H), torch.bfloat16, 5200 + 100 * v + 10 * k + r).float()
                                         for r in range(W))
            check(got, torch.nn.functional.rms_norm(h, (H,), weight.cpu(), 1e-6).to(torch.bfloat16),
                  f"{variant} call {k}: out")
            stream[:M] = h.to(torch.bfloat16)
        check(residual, stream, f"{variant}: the residual after {calls} calls")


def scenario_rmsnorm_heap_tensors(ctx):
    """Tensors on the symmetric heap: the peers read partial where it is (no staging) and two-shot
    writes every rank's outputs in place (no result buffers), the residual in place too; then a
    mix (out on the heap, residual_out not), which goes through the heap buffers."""
    from iris.collectives import _workspace

    W, dev, H = ctx.world_size, ctx.device, 24
    M = 2 * W + 1
    weight = torch.randn(H, generator=torch.Generator().manual_seed(5300)).to(dev)
    ops.clear_workspaces(ctx)
    for variant in ("one_shot", "two_shot"):
        partial = ctx.zeros(M, H, dtype=torch.bfloat16).copy_(ints((M, H), torch.bfloat16, 5400 + ctx.rank).to(dev))
        residual = ctx.zeros(M, H, dtype=torch.bfloat16).copy_(ints((M, H), torch.bfloat16, 5407).to(dev))
        out = ctx.full((M, H), float("nan"), dtype=torch.bfloat16)
        ctx.barrier()  # every rank's out poisoned before a peer writes into it
        ops.all_reduce_residual_rmsnorm(ctx, out, residual, partial, residual, weight,
                                        config=ops.Config(variant=variant))
        h = sum(ints((M, H), torch.bfloat16, 5400 + r).float() for r in range(W)) + \
            ints((M, H), torch.bfloat16, 5407).float()
        check(out, torch.nn.functional.rms_norm(h, (H,), weight.cpu(), 1e-6).to(torch.bfloat16), f"heap {variant}")
        check(residual, h.to(torch.bfloat16), f"heap {variant}: residual in place")
        if variant == "two_shot":
            mixed = poisoned((M, H), torch.bfloat16, dev)
            residual.copy_(ints((M, H), torch.bfloat16, 5407).to(dev))
            out.fill_(float("nan"))
            ctx.barrier()
            ops.all_reduce_residual_rmsnorm(ctx, out, mixed, partial, residual, weight,
                                            config=ops.Config(variant=variant))
            check(out, torch.nn.functional.rms_norm(h, (H,), weight.cpu(), 1e-6).to(torch.bfloat16), "mixed: out")
            check(mixed, h.to(torch.bfloat16), "mixed: residual_out")
        ctx.barrier()
        for t in (out, residual, partial):
            ctx.free(t)
    keys = [k for k in _workspace._CACHES[ctx] if k[0] == "ops.all_reduce_residual_rmsnorm"]
    if W > 1:  # (stage_in, copy_out) of each workspace: in place, then the mixed call through the heap
        assert sorted(k[8:10] for k in keys) == [(False, False), (False, False), (False, True)], keys
    ctx.barrier()
    ops.clear_workspaces(ctx)


def scenario_rmsnorm_fp8(ctx):
    """fp8 (e4m3) output with per-row scales (written) and a per-tensor scale (read), every
    strategy: on the GPU bit for bit against torch's e4m3 conversion of the clamped quotient; on
    the cpu backend an UnsupportedDtypeError that says why (the interpreter's e4m3 conversion is
    wrong) and what to do."""
    W, dev, H = ctx.world_size, ctx.device, 40
    shape = (2 * W + 1, H)
    fp8 = torch.float8_e4m3fn
    _, ref_res, weight = ref_rmsnorm(W, shape, torch.bfloat16, 5500)
    partial = ints(shape, torch.bfloat16, 5500 + 10 * ctx.rank).to(dev)
    residual = ints(shape, torch.bfloat16, 5507).to(dev)
    y = torch.nn.functional.rms_norm(ref_res.float(), (H,), weight, 1e-6)  # the fp32 rows (h is exact in bf16)
    out = torch.zeros(shape, dtype=fp8, device=dev)
    if ctx.device.type != "cuda":
        expect_error(lambda: ops.all_reduce_residual_rmsnorm(ctx, out, None, partial, residual, weight.to(dev),
                                                             scale=torch.ones(1, device=dev)),
                     UnsupportedDtypeError, "iris.collectives.ops.all_reduce_residual_rmsnorm", "GPU only",
                     "interpreter", "subnormals", "pass an out of partial's dtype")
        return
    amax = y.abs().amax(-1, keepdim=True)
    row_scales = torch.clamp(amax / 448.0, min=1.0 / (448.0 * 512.0))
    expected_rows = (y / row_scales).clamp(-448, 448).to(fp8)
    tensor_scale = torch.tensor([0.004])
    expected_tensor = (y / tensor_scale).clamp(-448, 448).to(fp8)
    assert bool((expected_tensor.float().abs() == 448).any()), "the per-tensor case must saturate somewhere"
    for variant in ("one_shot", "one_shot_buffered", "two_shot"):
        cfg = ops.Config(variant=variant)
        scales = torch.full((shape[0], 1), float("nan"), device=dev)
        new = poisoned(shape, torch.bfloat16, dev)
        ops.all_reduce_residual_rmsnorm(ctx, out, new, partial, residual, weight.to(dev), scale=scales, config=cfg)
        check(scales, row_scales, f"fp8 {variant}: row scales")
        check(out, expected_rows, f"fp8 {variant}: rows")
        check(new, ref_res, f"fp8 {variant}: residual_out")
        ops.all_reduce_residual_rmsnorm(ctx, out, None, partial, residual, weight.to(dev),
                                        scale=tensor_scale.to(dev), config=cfg)
        check(out, expected_tensor, f"fp8 {variant}: per-tensor scale")


def scenario_rmsnorm_argument_errors(ctx):
    """Bad shapes, dtypes, eps, scales, overlapping tensors and configs: an IrisError naming the
    call, the values and the fix, before any allocation or launch."""
    dev = ctx.device
    call = "iris.collectives.ops.all_reduce_residual_rmsnorm"
    bf = dict(dtype=torch.bfloat16, device=dev)
    p, r, o, ro = (torch.zeros(4, 8, **bf) for _ in range(4))
    w = torch.ones(8, device=dev)

    def norm(out=o, residual_out=ro, partial=p, residual=r, weight=w, eps=1e-6, scale=None, config=None):
        return lambda: ops.all_reduce_residual_rmsnorm(ctx, out, residual_out, partial, residual, weight, eps,
                                                       scale=scale, config=config)

    expect_error(norm(residual=torch.zeros(4, 9, **bf)), IrisUsageError, call, "residual has shape (4, 9)",
                 "partial (4, 8)")
    expect_error(norm(out=torch.zeros(3, 8, **bf)), IrisUsageError, call, "out has shape (3, 8)")
    expect_error(norm(weight=torch.ones(9, device=dev)), IrisUsageError, call, "weight has shape (9,)", "(8,)")
    expect_error(norm(residual=torch.zeros(4, 8, device=dev)), UnsupportedDtypeError, call,
                 "residual is torch.float32 but partial is torch.bfloat16", "one dtype")
    expect_error(norm(out=torch.zeros(4, 8, device=dev)), UnsupportedDtypeError, call,
                 "out is torch.float32 but partial is torch.bfloat16", "float8_e4m3fn")
    expect_error(norm(partial=torch.zeros(4, 8, dtype=torch.int32, device=dev)), UnsupportedDtypeError, call,
                 "partial has dtype torch.int32", "torch.bfloat16")
    expect_error(norm(partial=torch.zeros(4, 16, **bf)[:, ::2]), IrisUsageError, call, "not contiguous")
    for eps in (-1e-6, float("nan"), "1e-6", True):
        expect_error(norm(eps=eps), IrisUsageError, call, f"eps={eps!r}", "finite float >= 0")
    expect_error(norm(scale=torch.ones(1, device=dev)), IrisUsageError, call, "scale= is for an fp8 out",
                 "drop scale")
    expect_error(norm(out=p), IrisUsageError, call, "partial and out overlap")
    expect_error(norm(residual_out=p), IrisUsageError, call, "partial and residual_out overlap")
    shifted = torch.zeros(5, 8, **bf)
    expect_error(norm(residual=shifted[:4], residual_out=shifted[1:]), IrisUsageError, call,
                 "residual and residual_out overlap", "residual_out=residual, in place")
    expect_error(norm(config=ops.Config(variant="rotated")), IrisUsageError, call, "config.variant='rotated'",
                 "one_shot_buffered")
    expect_error(norm(config=ops.Config(block_k=32)), IrisUsageError, call, "config sets block_k=32",
                 "GEMM ops only")
    expect_error(norm(config=ops.Config(block_m=3)), IrisUsageError, call, "config.block_m=3", "power of two")
    if dev.type == "cuda":
        fp8 = torch.zeros(4, 8, dtype=torch.float8_e4m3fn, device=dev)
        expect_error(norm(out=fp8), IrisUsageError, call, "an fp8 out needs scale=", "(4, 1)")
        expect_error(norm(out=fp8, scale=torch.ones(4, device=dev)), IrisUsageError, call, "scale has shape (4,)",
                     "(4, 1)")
        expect_error(norm(out=fp8, scale=torch.ones(1, dtype=torch.float64, device=dev)), UnsupportedDtypeError,
                     call, "scale has dtype torch.float64")


def scenario_argument_errors(ctx):
    """Bad shapes, dtypes, devices, M not divisible by the world size, bad configs: an IrisError
    whose message names the call, the argument, the values and the fix. Checked before any
    allocation or launch, so every rank raises alike."""
    W, dev = ctx.world_size, ctx.device
    f32 = dict(dtype=torch.float32, device=dev)
    a, b, out = torch.zeros(8, 4, **f32), torch.zeros(4, 6, **f32), torch.zeros(8, 6, **f32)
    ar = "iris.collectives.ops.matmul_all_reduce"
    expect_error(lambda: ops.matmul_all_reduce(ctx, out, a, torch.zeros(5, 6, **f32)), IrisUsageError, ar,
                 "a is (8, 4)", "b is (5, 6)", "a's columns (4) must equal b's rows (5)")
    expect_error(lambda: ops.matmul_all_reduce(ctx, torch.zeros(8, 7, **f32), a, b), IrisUsageError, ar,
                 "out has shape (8, 7), expected (8, 6)")
    expect_error(lambda: ops.matmul_all_reduce(ctx, out, a.to(torch.float16), b), UnsupportedDtypeError, ar,
                 "a is torch.float16 but b is torch.float32", "one dtype")
    expect_error(lambda: ops.matmul_all_reduce(ctx, out, a.to(torch.int32), b), UnsupportedDtypeError, ar,
                 "a has dtype torch.int32", "pass float32, float16, bfloat16 or float64")
    expect_error(lambda: ops.matmul_all_reduce(ctx, out, a[0], b), IrisUsageError, ar, "a must be 2-D",
                 "shape (4,)")
    expect_error(lambda: ops.matmul_all_reduce(ctx, out, a, b, torch.zeros(5, **f32)), IrisUsageError, ar,
                 "bias must be a 1-D tensor of N=6 values", "(5,)")
    # a strided bias (6 values, every other of 12): the kernels read the bias as contiguous
    strided = torch.arange(12, **f32)[::2]
    for op, call, op_out, op_a in ((ops.matmul_all_reduce, ar, out, a),
                                  (ops.matmul_reduce_scatter, "iris.collectives.ops.matmul_reduce_scatter",
                                   torch.zeros(4, 6, **f32), torch.zeros(W * 4, 4, **f32))):
        expect_error(lambda op=op, op_out=op_out, op_a=op_a: op(ctx, op_out, op_a, b, strided), IrisUsageError, call,
                     "bias must be contiguous (stride 1), got stride 2", "bias.contiguous()")
    expect_error(lambda: ops.matmul_all_reduce(ctx, out, a, b, config=ops.Config(variant="ring")), IrisUsageError,
                 ar, "config.variant='ring'", "one_shot", "two_shot")
    expect_error(lambda: ops.matmul_all_reduce(ctx, out, a, b, config=ops.Config(block_m=24)), IrisUsageError,
                 ar, "config.block_m=24", "power of two >= 16")
    expect_error(lambda: ops.matmul_all_reduce(ctx, out, a, b, config=ops.Config(warp_specialize=1)),
                 IrisUsageError, ar, "config.warp_specialize=1", "True or False")
    expect_error(lambda: ops.matmul_all_reduce(ctx, out, a, b, config={"block_m": 16}), IrisUsageError, ar,
                 "must be an iris.collectives.ops.Config")
    if dev.type == "cpu" and torch.cuda.is_available() is False:
        meta = torch.zeros(8, 4, dtype=torch.float32, device="meta")
        expect_error(lambda: ops.matmul_all_reduce(ctx, out, meta, b), IrisUsageError, ar, "a is on meta",
                     f"runs on {dev}", ".to(")
    else:
        expect_error(lambda: ops.matmul_all_reduce(ctx, out, a.cpu(), b), IrisUsageError, ar, "a is on cpu",
                     f"runs on {dev}", ".to(")
    rs = "iris.collectives.ops.matmul_reduce_scatter"
    if W > 1:
        odd = torch.zeros(W * 3 + 1, 4, **f32)
        expect_error(lambda: ops.matmul_reduce_scatter(ctx, torch.zeros(3, 6, **f32), odd, b), IrisUsageError, rs,
                     f"M={W * 3 + 1} rows", f"{W} ranks cannot split evenly", f"multiple of {W}")
    a_rs = torch.zeros(W * 4, 4, **f32)
    expect_error(lambda: ops.matmul_reduce_scatter(ctx, torch.zeros(5, 6, **f32), a_rs, b), IrisUsageError, rs,
                 "out has shape (5, 6), expected (4, 6)")
    ag = "iris.collectives.ops.all_gather_matmul"
    expect_error(lambda: ops.all_gather_matmul(ctx, torch.zeros(8 * W + 1, 6, **f32), a, b), IrisUsageError, ag,
                 f"out has shape ({8 * W + 1}, 6), expected ({8 * W}, 6)")
    mg = "iris.collectives.ops.matmul_all_gather"
    expect_error(lambda: ops.matmul_all_gather(ctx, out, a, b, torch.zeros(6, dtype=torch.int64, device=dev)),
                 UnsupportedDtypeError, mg, "bias has dtype torch.int64")


def scenario_groups(ctx):
    # The five fused ops on TP and DP groups and a non-contiguous one (ccl_worker's layouts), calls
    # of different groups back to back; inputs seeded by group rank, so each result is exactly the
    # same op's on a context of the group's ranks (the references', with W the group's size)
    from ccl_worker import group_layouts, make_groups

    groups = [make_groups(ctx, lists) for lists in group_layouts(ctx.world_size).values()]
    d, cfg = torch.float32, SMALL
    for g in groups:
        if g is None:
            continue
        G, gr = g.size, g.rank
        seed = 900 + 10 * G
        check(run_matmul_all_reduce(ctx, 20, 24, 16, d, d, seed, True, cfg, group=g),
              ref_matmul_all_reduce(G, 20, 24, 16, d, d, seed, True), f"group {g.ranks} matmul_all_reduce")
        check(run_matmul_reduce_scatter(ctx, G * 16, 24, 16, d, d, seed + 1, False, cfg, group=g),
              ref_matmul_reduce_scatter(G, gr, G * 16, 24, 16, d, d, seed + 1, False),
              f"group {g.ranks} matmul_reduce_scatter")
        for op in (ops.all_gather_matmul, ops.matmul_all_gather):
            check(run_gather_op(ctx, op, G * 16, 24, 16, d, d, seed + 2, True, cfg, group=g),
                  ref_all_gather_matmul(G, G * 16, 24, 16, d, d, seed + 2, True), f"group {g.ranks} {op.__name__}")
        for variant in ("one_shot_buffered", "two_shot"):
            out, new = run_rmsnorm(ctx, (G + 1, 24), torch.bfloat16, seed + 3, ops.Config(variant=variant), group=g)
            ref_out, ref_res, _ = ref_rmsnorm(G, (G + 1, 24), torch.bfloat16, seed + 3)
            check(out, ref_out, f"group {g.ranks} all_reduce_residual_rmsnorm {variant}: out")
            check(new, ref_res, f"group {g.ranks} all_reduce_residual_rmsnorm {variant}: residual_out")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    iris.runtime.testing.run_scenarios(globals(), heap_size=1 << 24)
