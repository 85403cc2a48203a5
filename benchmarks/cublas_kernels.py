"""Which kernels ``torch.matmul`` (cuBLAS) runs for the fused ops' layer GEMMs, and their grids.

    python benchmarks/cublas_kernels.py [--m 1024,4096,16384] [--world 2]

Why it matters: when ranks share a GPU (MPS), a rank's iris kernel spins while it waits for the
peers, holding SMs. A kernel of another rank whose blocks wait for each other (a stream-K or
serial split-K GEMM, whose blocks hand partial sums to one another) then needs SMs that the
spinning programs hold. This lists each GEMM's kernel names (from torch's profiler) and whether
cuBLAS was allowed a workspace (``CUBLAS_WORKSPACE_CONFIG``), so a stall can be matched to the
kernel that ran. Prints a table; writes ``cublas_kernels.{json,md}`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def layer_gemms(M: int, W: int, hidden: int = 8192, intermediate: int = 28672):
    """(op, (m, k), (k, n)) of each fused op's per-rank GEMM (as in fused_ops.py)."""
    per = intermediate // W
    return [("all_gather_matmul", (M, hidden), (hidden, per)), ("matmul_reduce_scatter", (M, per), (per, hidden)),
            ("matmul_all_reduce", (M, per), (per, hidden)), ("matmul_all_gather", (M // W, hidden), (hidden, per))]


def kernels_of(fn) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--m", type=lambda s: [int(x) for x in s.split(",")], default=[1024, 4096, 16384])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    args = p.parse_args()
    rows = []
    seen = set()
    for M in args.m:
        for op, (m, k), (k2, n) in layer_gemms(M, args.world):
            if (m, k, n) in seen:
                continue
            seen.add((m, k, n))
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(k2, n, device="cuda", dtype=torch.bfloat16)
            names = kernels_of(lambda: torch.matmul(a, b))
            rows.append({"op": op, "m": m, "n": n, "k": k, "kernels": names})
            print(f"{op:<22} {m:>6} x {n:>6} x {k:>6}  {' | '.join(names)}", flush=True)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"), "rows": rows}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cublas_kernels.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "cublas_kernels.md"), "w") as f:
        f.write(f"cuBLAS kernels of the layer GEMMs, {result['device']}, torch {result['torch']} "
                f"(`python benchmarks/cublas_kernels.py`):\n\n| op | M x N x K | kernels |\n| --- | --- | --- |\n")
        for r in rows:
            f.write(f"| {r['op']} | {r['m']} x {r['n']} x {r['k']} | {'<br>'.join(r['kernels'])} |\n")


if __name__ == "__main__":
    main()
