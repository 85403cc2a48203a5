"""An expert-parallel mixture-of-experts block: tokens to their experts' ranks and back, counts on the device.

``--experts`` experts (a multiple of the ranks), ``E / W`` on each rank, each an MLP
``silu(x @ w1[e]) @ w2[e]``. Every rank holds its own tokens (a random number of them, up to
``--tokens``: ranks differ) and routes each to ``--top-k`` experts with random weights
(``--skew`` sends that fraction of the tokens to expert 0 first). One block:

1. ``moe.dispatch``: every token's row to the rank of each of its experts; the rows arrive
   grouped by local expert, ``[G, capacity, hidden]``, with the counts per expert on the device
   (no ``.item()``, no host round trip);
2. the local experts as two batched GEMMs (``torch.bmm``) over that layout (unused rows are zeros);
3. ``moe.combine``: every row back to its token, the top-k rows summed weighted, in slot order.

Every rank checks its tokens' outputs against the same block computed in one process (every
expert, the same weights from the seed), and with ``--iters N`` times dispatch, experts and
combine separately and the whole block (CUDA events on a GPU; the slowest rank's median).

    mpirun -n 8 python examples/07_moe.py [--tokens 64] [--hidden 64] [--ffn 128] [--experts 16] [--top-k 4]
        [--skew 0.25] [--capacity-factor 0] [--iters 0]
"""

import argparse
import math
import statistics
import sys
import time

import torch

import iris.runtime
from iris.collectives import moe

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def weights(experts: int, hidden: int, ffn: int, seed: int):
    """Every expert's ``(w1, w2)``, fp32 on the host: the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(experts, hidden, ffn, generator=g) / hidden ** 0.5, \
        torch.randn(experts, ffn, hidden, generator=g) / ffn ** 0.5


def tokens_of(rank: int, args):
    """Rank ``rank``'s tokens, top-k experts and weights (host, fp32): a random count of tokens,
    ``--skew`` of them with expert 0 first."""
    g = torch.Generator().manual_seed(args.seed * 1000 + rank)
    T = int(torch.randint(args.tokens // 2, args.tokens + 1, (1,), generator=g))
    x = torch.randn(T, args.hidden, generator=g)
    rows = []
    for _ in range(T):
        if float(torch.rand(1, generator=g)) < args.skew:
            rows.append(torch.cat([torch.zeros(1, dtype=torch.long),
                                   1 + torch.randperm(args.experts - 1, generator=g)[:args.top_k - 1]]))
        else:
            rows.append(torch.randperm(args.experts, generator=g)[:args.top_k])
    idx = torch.stack(rows) if rows else torch.zeros(0, args.top_k, dtype=torch.long)
    w = torch.softmax(torch.randn(T, args.top_k, generator=g), -1)
    return x, idx, w


def experts_forward(expert_x, w1, w2):
    """The local experts on their rows, ``[G, capacity, hidden]``: two batched GEMMs."""
    return torch.bmm(torch.nn.functional.silu(torch.bmm(expert_x, w1)), w2)


def moe_block(ctx, x, idx, w, w1, w2, args, capacity: int):
    """One expert-parallel block on this rank's tokens; returns its output."""
    expert_x, _, handle = moe.dispatch(ctx, x, idx, w, args.experts, max_tokens=args.tokens,
                                       expert_capacity=capacity)
    return moe.combine(ctx, experts_forward(expert_x, w1, w2), handle)


def one_process(x, idx, w, w1, w2):
    """The same block in one process, every expert here: each token's experts, summed in slot order."""
    acc = torch.zeros_like(x, dtype=torch.float32)
    for k in range(idx.shape[1]):
        e = idx[:, k]
        out = torch.bmm(torch.nn.functional.silu(torch.bmm(x[:, None, :], w1[e])), w2[e])[:, 0]
        acc = acc + w[:, k:k + 1] * out.float()
    return acc


def time_ms(ctx, fn, iters: int) -> float:
    """Median ms per call over ``iters`` calls (CUDA events on a GPU), the slowest rank."""
    fn()
    cuda = ctx.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    ctx.barrier()
    times = []
    for _ in range(iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            times.append((start, end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    if cuda:
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) / 1e3 for s, e in times]
    return max(ctx.comm.allgather(statistics.median(times))) * 1e3


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=24, help="most tokens per rank (each rank has a random count)")
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--ffn", type=int, default=48)
    p.add_argument("--experts", type=int, default=0, help="experts in all (default: 2 per rank)")
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--skew", type=float, default=0.25, help="fraction of tokens whose first expert is expert 0")
    p.add_argument("--capacity-factor", type=float, default=0.0,
                   help="rows per expert: this x the mean (ranks x tokens x top-k / experts); 0: every row that can "
                        "arrive (ranks x tokens). Rows past it are an error, so keep --skew low with it")
    p.add_argument("--dtype", choices=tuple(DTYPES), default=None, help="default: bf16 on a GPU, fp32 on the CPU")
    p.add_argument("--iters", type=int, default=0, help="timed calls (0: check only)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    with iris.runtime.iris(heap_size=1 << 28) as ctx:
        W, r, dev = ctx.world_size, ctx.rank, ctx.device
        args.experts = args.experts or 2 * W
        if args.experts % W or not 2 <= args.top_k <= args.experts:
            p.error("--experts must be a multiple of the ranks and --top-k in [2, experts]")
        dtype = DTYPES[args.dtype or ("bf16" if dev.type == "cuda" else "fp32")]
        G = args.experts // W
        w1_all, w2_all = weights(args.experts, args.hidden, args.ffn, seed=1234 + args.seed)
        w1, w2 = (t[r * G:(r + 1) * G].to(dev, dtype) for t in (w1_all, w2_all))
        x, idx, w = tokens_of(r, args)
        x_dev, idx_dev, w_dev = x.to(dev, dtype), idx.to(dev), w.to(dev)
        if args.capacity_factor:  # a factor over the mean: much less padding for the experts' GEMMs
            capacity = math.ceil(args.capacity_factor * W * args.tokens * args.top_k / args.experts)
        else:
            capacity = W * args.tokens  # every row that can arrive at one expert

        y = moe_block(ctx, x_dev, idx_dev, w_dev, w1, w2, args, capacity)
        # the reference on the block's own inputs (rounded to the dtype), in fp32
        expected = one_process(x_dev.float().cpu(), idx, w, w1_all.to(dtype).float(), w2_all.to(dtype).float())
        error = (y.float().cpu() - expected).abs().max().item() if y.numel() else 0.0
        scale = max(expected.abs().max().item(), 1.0) if expected.numel() else 1.0
        tolerance = (1e-5 if dtype == torch.float32 else 3e-2) * scale
        verdicts = ctx.comm.gather((error <= tolerance, error, x.shape[0]), root=0)

        timings, replay_ok = {}, True
        if args.iters:
            expert_x, _, handle = moe.dispatch(ctx, x_dev, idx_dev, w_dev, args.experts, max_tokens=args.tokens,
                                               expert_capacity=capacity)
            expert_y = experts_forward(expert_x, w1, w2)
            timings["dispatch"] = time_ms(ctx, lambda: moe.dispatch(ctx, x_dev, idx_dev, w_dev, args.experts,
                                                                    max_tokens=args.tokens,
                                                                    expert_capacity=capacity), args.iters)
            timings["experts (2 bmm)"] = time_ms(ctx, lambda: experts_forward(expert_x, w1, w2), args.iters)
            timings["combine"] = time_ms(ctx, lambda: moe.combine(ctx, expert_y, handle), args.iters)
            timings["whole block"] = time_ms(ctx, lambda: moe_block(ctx, x_dev, idx_dev, w_dev, w1, w2, args,
                                                                    capacity), args.iters)
            if dev.type == "cuda":  # the block captured once and replayed: no host work, no host sync
                graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream(dev)
                stream.wait_stream(torch.cuda.current_stream(dev))
                with torch.cuda.graph(graph, stream=stream):
                    replayed = moe_block(ctx, x_dev, idx_dev, w_dev, w1, w2, args, capacity)
                ctx.barrier()
                timings["block, CUDA graph"] = time_ms(ctx, graph.replay, args.iters)
                torch.cuda.synchronize()
                replay_ok = torch.equal(replayed, y)  # the same kernels, the same routing: the same bits
        replays = ctx.comm.gather(replay_ok, root=0)
        if r == 0:
            print(f"expert-parallel MoE: {W} ranks, {args.experts} experts ({G} per rank), top-{args.top_k}, "
                  f"hidden {args.hidden}, ffn {args.ffn}, {dtype}, tokens per rank "
                  f"{[t for _, _, t in verdicts]}, backend {ctx.backend}")
            bad = {q: e for q, (good, e, _) in enumerate(verdicts) if not good}
            state = "correct" if not bad else f"WRONG (rank: largest error) {bad}"
            print(f"  outputs of every rank  {state} (largest error {max(e for _, e, _ in verdicts):.2e}, "
                  f"one process as reference)")
            if "block, CUDA graph" in timings:
                print(f"  the block replayed in a CUDA graph  {'correct' if all(replays) else 'WRONG'} (the "
                      f"eager block's bits)")
            for what, ms in timings.items():
                print(f"  {what:<18} {ms:9.3f} ms")
        ok = ctx.broadcast(all(good for good, _, _ in verdicts) and all(replays) if r == 0 else None)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
