"""CUDA-graph capture of every fused op and of ``all_reduce_residual_rmsnorm`` (run by
test_ops_multirank.py on the cuda backend only).

Each op (and each strategy) is called once eagerly (that compiles the kernel, allocates its cached
workspace and sizes its grid: collective steps that cannot run inside a capture), then captured
into a CUDA graph on one stream and replayed ``IRIS_TEST_REPLAYS`` times (default 20), with new
inputs copied into the captured tensors before each replay and no barrier between replays: the
lock records' call counters live in device memory, so each replay is a new call. Every replay's
result is checked bit for bit against the exact host reference (small-integer inputs, see
ops_worker.py).
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ops_worker as ow

import iris.runtime.testing
from iris.collectives import ops

BF16 = torch.bfloat16
CFG = ops.Config(block_m=64, block_n=64, block_k=32)


def replays() -> int:
    return int(os.environ.get("IRIS_TEST_REPLAYS", "20"))


def inputs(ctx, op: str, M, N, K, seed: int):
    """This rank's (a, b, bias) for ``op`` with seed ``seed`` (the layout of ops_worker's runners)."""
    r, W = ctx.rank, ctx.world_size
    if op in ("all_gather_matmul", "matmul_all_gather"):
        return (ow.ints((M // W, K), BF16, seed + 10 * r), ow.ints((K, N), BF16, seed + 1),
                ow.ints((N,), BF16, seed + 5))
    return ow.ints((M, K), BF16, seed + 10 * r), ow.ints((K, N), BF16, seed + 10 * r + 1), ow.ints((N,), BF16, seed + 5)


def reference(ctx, op: str, M, N, K, seed: int) -> torch.Tensor:
    W = ctx.world_size
    if op == "matmul_all_reduce":
        return ow.ref_matmul_all_reduce(W, M, N, K, BF16, BF16, seed, True)
    if op == "matmul_reduce_scatter":
        return ow.ref_matmul_reduce_scatter(W, ctx.rank, M, N, K, BF16, BF16, seed, True)
    return ow.ref_all_gather_matmul(W, M, N, K, BF16, BF16, seed, True)


def graph_case(ctx, op: str, config) -> None:
    W, dev = ctx.world_size, ctx.device
    M, N, K = W * 96, 136, 72  # ragged against 64 x 64 x 32 tiles
    out_rows = M // W if op == "matmul_reduce_scatter" else M
    a, b, bias = (t.to(dev) for t in inputs(ctx, op, M, N, K, 0))
    out = torch.full((out_rows, N), float("nan"), dtype=BF16, device=dev)
    fn = getattr(ops, op)
    fn(ctx, out, a, b, bias, config=config)  # eager: compile, workspace, grid
    ow.check(out, reference(ctx, op, M, N, K, 0), f"{op} {config.variant} eager")
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fn(ctx, out, a, b, bias, config=config)
    for i in range(1, replays() + 1):
        na, nb, nbias = inputs(ctx, op, M, N, K, 7000 + i)
        a.copy_(na)
        b.copy_(nb)
        bias.copy_(nbias)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ow.check(out, reference(ctx, op, M, N, K, 7000 + i), f"{op} {config.variant} replay {i}")


def rmsnorm_graph_case(ctx, variant: str, fp8: bool) -> None:
    """``all_reduce_residual_rmsnorm`` captured once, new partials and residuals copied in before
    each replay; out (bf16, or fp8 with row scales written) and the new residual checked bit for
    bit after each replay (small integers: exact sums of squares, see ops_worker.ref_rmsnorm)."""
    W, dev = ctx.world_size, ctx.device
    shape = (3 * W + 1, 200)
    _, _, weight = ow.ref_rmsnorm(1, shape, BF16, 0)
    partial, residual = ow.ints(shape, BF16, 10 * ctx.rank).to(dev), ow.ints(shape, BF16, 7).to(dev)
    weight, new = weight.to(dev), torch.empty(shape, dtype=BF16, device=dev)
    out = torch.empty(shape, dtype=torch.float8_e4m3fn if fp8 else BF16, device=dev)
    scales = torch.empty(shape[0], 1, device=dev) if fp8 else None
    cfg = ops.Config(variant=variant)

    def call():
        ops.all_reduce_residual_rmsnorm(ctx, out, new, partial, residual, weight, scale=scales, config=cfg)

    def check(i, seed):
        h = sum(ow.ints(shape, BF16, seed + 10 * r).float() for r in range(W)) + ow.ints(shape, BF16, seed + 7).float()
        y = torch.nn.functional.rms_norm(h, (shape[1],), weight.cpu(), 1e-6)
        if fp8:
            expected_scales = torch.clamp(y.abs().amax(-1, keepdim=True) / 448.0, min=1.0 / (448.0 * 512.0))
            ow.check(scales, expected_scales, f"rmsnorm {variant} fp8 replay {i}: scales")
            y = (y / expected_scales).clamp(-448, 448).to(torch.float8_e4m3fn)
        ow.check(out, y if fp8 else y.to(BF16), f"rmsnorm {variant} replay {i}: out")
        ow.check(new, h.to(BF16), f"rmsnorm {variant} replay {i}: residual_out")

    call()  # eager: compile, workspace, grid
    torch.cuda.synchronize()
    check(0, 0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        call()
    for i in range(1, replays() + 1):
        partial.copy_(ow.ints(shape, BF16, 100 * i + 10 * ctx.rank).to(dev))
        residual.copy_(ow.ints(shape, BF16, 100 * i + 7).to(dev))
        graph.replay()
        torch.cuda.synchronize()
        check(i, 100 * i)


def scenario_graph_replays(ctx):
    """Every op and strategy: capture once, replay with new data, each result exact."""
    if ctx.device.type != "cuda":
        raise SystemExit("ops_graph_worker.py needs the cuda backend (CUDA graphs)")
    cases = [(op, variant) for op, variants in ops.VARIANTS.items() for variant in variants]
    for op, variant in iris.runtime.testing.spread(cases, ctx.world_size):
        graph_case(ctx, op, ops.Config(**{**CFG.__dict__, "variant": variant}))
        if ctx.rank == 0:
            print(f"  {op} {variant}: {replays()} replays exact", flush=True)
    # every strategy, and fp8 with row scales where its outputs take the most paths (two-shot's copy-out)
    norm_cases = (("one_shot", False), ("one_shot_buffered", False), ("two_shot", False), ("two_shot", True))
    for variant, fp8 in iris.runtime.testing.spread(norm_cases, ctx.world_size):
        rmsnorm_graph_case(ctx, variant, fp8)
        if ctx.rank == 0:
            print(f"  all_reduce_residual_rmsnorm {variant}{' fp8' if fp8 else ''}: {replays()} replays exact",
                  flush=True)


if __name__ == "__main__":
    iris.runtime.testing.run_scenarios(globals(), heap_size=1 << 26)
