"""A tensor-parallel transformer MLP block with the fused ops, checked against one device and timed.

The block is ``down(silu(x @ W_gate) * (x @ W_up))`` of a Llama-style model. The tokens arrive
sequence-parallel (rank r holds rows ``[r * M / W, (r + 1) * M / W)`` of ``x``), the intermediate
dimension is split over the ranks, and the result leaves sequence-parallel again:

1. ``iris.collectives.ops.all_gather_matmul``: every rank gathers all tokens and multiplies them by
   its columns of ``[W_gate | W_up]`` (one GEMM for both projections), the gather inside the GEMM;
2. SiLU-gating, on this rank's ``[M, I / W]`` block;
3. ``iris.collectives.ops.matmul_reduce_scatter``: this rank's block times its rows of ``W_down``,
   summed over the ranks, each rank keeping its own tokens.

Every rank draws the whole weights from one seed, so the check needs no communication: each rank
compares its rows with the same block run on one device (fp32 on the CPU, or the input dtype on the
GPU, against an fp64 reference). With ``--iters`` > 0 it times the block against the same block
built from torch's fused async-TP ops (``fused_all_gather_matmul``, ``fused_matmul_reduce_scatter``)
and from cuBLAS + torch's symmetric-memory collectives, where those run (CUDA: with ranks sharing
a GPU too, ``TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1`` is set here); each peer is checked too.

    mpirun -n 4 python examples/04_tp_mlp.py                      # small, any backend
    mpirun -n 4 python examples/04_tp_mlp.py --m 8192 --hidden 8192 --intermediate 28672 --dtype bf16 --iters 20
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES", "1")  # torch's peers with ranks sharing a GPU
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch

import iris.runtime
from iris.collectives import ops

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def full_weights(hidden: int, inter: int, seed: int):
    """``(W_gate, W_up, W_down)`` of the whole block, fp32 on the host, the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    w_gate = torch.randn(hidden, inter, generator=g) / hidden ** 0.5
    w_up = torch.randn(hidden, inter, generator=g) / hidden ** 0.5
    w_down = torch.randn(inter, hidden, generator=g) / inter ** 0.5
    return w_gate, w_up, w_down


def rank_weights(w_gate, w_up, w_down, rank: int, world: int, dtype, device):
    """This rank's ``[W_gate | W_up]`` columns (``[hidden, 2 I / W]``) and ``W_down`` rows (``[I / W, hidden]``)."""
    cols = slice(rank * w_gate.shape[1] // world, (rank + 1) * w_gate.shape[1] // world)
    gate_up = torch.cat([w_gate[:, cols], w_up[:, cols]], dim=1)
    return gate_up.to(device, dtype).contiguous(), w_down[cols].to(device, dtype).contiguous()


def gated(h: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``h = [gate | up]`` (each half ``I / W`` columns), in fp32, back to h's dtype."""
    gate, up = h.float().chunk(2, dim=1)
    return (torch.nn.functional.silu(gate) * up).to(h.dtype)


class IrisBlock:
    """The block with this library's fused ops; output buffers allocated once. ``config``: the
    down projection's ``ops.Config`` (None: the default, which sums the ranks' exact fp32 partial
    products and rounds once)."""

    def __init__(self, ctx, gate_up, down, M: int, config=None):
        self.ctx, self.gate_up, self.down, self.config = ctx, gate_up, down, config
        self.h = torch.empty(M, gate_up.shape[1], dtype=gate_up.dtype, device=gate_up.device)
        self.y = torch.empty(M // ctx.world_size, down.shape[1], dtype=down.dtype, device=down.device)

    def __call__(self, x_shard):
        ops.all_gather_matmul(self.ctx, self.h, x_shard, self.gate_up)
        return ops.matmul_reduce_scatter(self.ctx, self.y, gated(self.h), self.down, config=self.config)


def torch_blocks(ctx, gate_up, down) -> tuple[dict, str | None]:
    """name -> the block built from torch's ops, or ({}, why not)."""
    if ctx.device.type != "cuda":
        return {}, "torch's symmetric-memory ops need CUDA"
    try:
        import torch.distributed as dist

        if not dist.is_initialized():
            port = ctx.comm.bcast(29500 + os.getpid() % 2000 if ctx.rank == 0 else None, root=0)
            # gloo: NCCL refuses ranks that share a GPU, and symmetric memory needs only a store
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=ctx.rank,
                                    world_size=ctx.world_size)
        import torch.distributed._symmetric_memory  # defines the torch.ops.symm_mem ops

        group = dist.group.WORLD.group_name
        symm, wait = torch.ops.symm_mem, torch.ops._c10d_functional.wait_tensor
        # looked up here, so that a torch without them is reported rather than failing mid-run
        gather_mm, mm_scatter = symm.fused_all_gather_matmul, symm.fused_matmul_reduce_scatter
        gather, scatter = symm._low_contention_all_gather, symm._low_contention_reduce_scatter

        def fused(x):
            _, (h,) = gather_mm(x, [gate_up], 0, group)
            return mm_scatter(gated(h), down, "sum", 0, group)

        def unfused(x):  # cuBLAS + torch's symmetric-memory all-gather and reduce-scatter
            h = wait(gather(x, group)) @ gate_up
            return wait(scatter(gated(h) @ down, "sum", group))

        return {"torch fused ops": fused, "cuBLAS + torch symm_mem": unfused}, None
    except Exception as exc:  # reported, and the block is timed without them
        return {}, f"{type(exc).__name__}: {exc}"


def time_ms(ctx, fn, x, iters: int) -> float:
    """Median ms per call over ``iters`` back-to-back calls (CUDA events on a GPU), the slowest rank."""
    for _ in range(2):
        fn(x)
    cuda = ctx.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    ctx.barrier()
    times = []
    for _ in range(iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(x)
            end.record()
            times.append((start, end))
        else:
            t0 = time.perf_counter()
            fn(x)
            times.append(time.perf_counter() - t0)
    if cuda:
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) / 1e3 for s, e in times]
    return max(ctx.comm.allgather(statistics.median(times))) * 1e3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=int, default=96, help="tokens, a multiple of the ranks")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--intermediate", type=int, default=192, help="a multiple of the ranks")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default=None, help="default: bf16 on a GPU, fp32 on the CPU")
    parser.add_argument("--iters", type=int, default=0, help="timed calls per implementation (0: check only)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    M, H, inter = args.m, args.hidden, args.intermediate
    # the ops' workspaces live on the heap: the reduce-scatter's fp32 staging slots (under 2 M x H)
    # and the gather's copy of this rank's tokens
    heap = (1 << 26) + 3 * M * H * 4
    with iris.runtime.iris(heap_size=heap) as ctx:
        rank, W = ctx.rank, ctx.world_size
        if M % W or inter % W:
            raise SystemExit(f"--m {M} and --intermediate {inter} must be multiples of the {W} ranks")
        dtype = DTYPES[args.dtype or ("bf16" if ctx.device.type == "cuda" else "fp32")]
        weights = full_weights(H, inter, args.seed)
        x_full = torch.randn(M, H, generator=torch.Generator().manual_seed(args.seed + 1))
        rows = slice(rank * M // W, (rank + 1) * M // W)
        x_shard = x_full[rows].to(ctx.device, dtype).contiguous()
        gate_up, down = rank_weights(*weights, rank, W, dtype, ctx.device)

        # the same block on one device (this rank's), in fp64 from the same (rounded) inputs
        w_gate, w_up, w_down = (w.to(ctx.device, dtype).double() for w in weights)
        x64 = x_full.to(ctx.device, dtype).double()
        expected = ((torch.nn.functional.silu(x64 @ w_gate) * (x64 @ w_up)) @ w_down)[rows].cpu()
        del w_gate, w_up, w_down, x64
        tolerance = 1e-4 if dtype == torch.float32 and ctx.device.type == "cpu" else 3e-2

        def error(y):
            return ((y.double().cpu() - expected).abs().max() / expected.abs().max()).item()

        # the default sums exact fp32 partials; torch's fused reduce-scatter rounds each rank's
        # partial to the inputs' dtype first, which Config(partial_dtype="input") also does
        dtype_name = str(dtype).removeprefix("torch.")
        blocks = {"iris fused ops": IrisBlock(ctx, gate_up, down, M),
                  f"iris, partials in {dtype_name}": IrisBlock(ctx, gate_up, down, M,
                                                              ops.Config(partial_dtype="input"))}
        peers, why_not = torch_blocks(ctx, gate_up, down) if args.iters else ({}, "not timed (--iters 0)")
        blocks.update(peers)
        errors = {name: error(block(x_shard)) for name, block in blocks.items()}
        times = {name: time_ms(ctx, block, x_shard, args.iters) for name, block in blocks.items()} if args.iters else {}
        worst = {name: max(ctx.comm.allgather(e)) for name, e in errors.items()}
        ok = all(e <= tolerance for e in worst.values())
        if rank == 0:
            print(f"tensor-parallel MLP block: {W} ranks, backend {ctx.backend}, {M} tokens, hidden {H}, "
                  f"intermediate {inter} ({inter // W} per rank), {dtype_name}")
            for name in blocks:
                status = "correct" if worst[name] <= tolerance else "WRONG"
                timing = f"; {times[name]:9.3f} ms per block" if name in times else ""
                print(f"  {name:28s} {status:8s} max rel. error {worst[name]:.1e} (tol {tolerance:.0e}){timing}")
            theirs = [t for n, t in times.items() if not n.startswith("iris")]
            for name in (n for n in times if n.startswith("iris") and theirs):
                print(f"  {name} / fastest torch block: {times[name] / min(theirs):.2f}")
            if why_not:
                print(f"  torch's blocks: {why_not}")
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
