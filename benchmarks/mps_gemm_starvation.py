"""Can one rank's spinning programs starve another rank's cuBLAS GEMM on a shared GPU (MPS)?

    mpirun -n 2 python -m mpi4py benchmarks/mps_gemm_starvation.py [--grids 66,33,16] [--hold 2.0]

Rank 1 launches a kernel of ``G`` programs (8 warps each) that spin on the GPU's clock for
``--hold`` seconds, as a rank's collective spins while it waits for a peer, and record the SM each
runs on. A resident spinner keeps its SM from a GEMM block that needs the whole SM. Rank 0 then times a GEMM:
``torch.matmul`` (cuBLAS, whose Hopper kernels launch clusters of 2 blocks) and the iris GEMM core
(``ops.matmul``, plain blocks). A GEMM that takes about ``--hold`` seconds was starved: it could
not run until the spinners left. Rank 1's spinners' SMs are summarised per TPC (SM id // 2) and
per GPC-sized group. Prints a table; writes ``mps_gemm_starvation.{json,md}`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import triton
import triton.language as tl
from mpi4py import MPI

from iris.device._tracing import device_clock_ns, device_sm_id

HERE = os.path.dirname(os.path.abspath(__file__))


@triton.jit
def _hold(smids, hold_ns):
    start = device_clock_ns()
    tl.store(smids + tl.program_id(0), device_sm_id())
    while device_clock_ns() - start < hold_ns:
        pass


def gemm_seconds(fn, limit_s: float) -> float:
    """Wall seconds until ``fn``'s GPU work is done (polled), or ``limit_s`` if it is not by then."""
    done = torch.cuda.Event()
    t0 = time.perf_counter()
    fn()
    done.record()
    while not done.query():
        if time.perf_counter() - t0 > limit_s:
            done.synchronize()
            return limit_s
        time.sleep(1e-4)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grids", type=lambda s: [int(x) for x in s.split(",")], default=[66, 33, 16, 0])
    p.add_argument("--hold", type=float, default=2.0)
    p.add_argument("--m", type=int, default=4096)
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    torch.cuda.set_device(0)
    a = torch.randn(args.m, 14336, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(14336, 8192, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(args.m, 8192, device="cuda", dtype=torch.bfloat16)
    gemms = {"cublas": lambda: torch.matmul(a, b, out=out)}
    if rank == 0:
        from iris.collectives.ops._matmul import matmul

        gemms["iris_core"] = lambda: matmul(out, a, b)
    smids = torch.full((max(args.grids) or 1,), -1, device="cuda", dtype=torch.int64)
    for fn in gemms.values():  # compile and warm up, alone
        fn()
    _hold[(1,)](smids, 0, num_warps=8)
    torch.cuda.synchronize()
    alone = {name: gemm_seconds(fn, 10.0) for name, fn in gemms.items()}
    rows = []
    for grid in args.grids:
        for name, fn in gemms.items() if rank == 0 else [(n, None) for n in ("cublas", "iris_core")]:
            comm.Barrier()
            if rank == 1 and grid:
                smids.fill_(-1)
                _hold[(grid,)](smids, int(args.hold * 1e9), num_warps=8)
            comm.Barrier()
            time.sleep(0.05)  # rank 1's spinners are resident
            seconds = gemm_seconds(fn, 3 * args.hold + 5) if rank == 0 else None
            torch.cuda.synchronize()
            ids = smids[:grid].tolist() if rank == 1 and grid else []
            seconds, ids = comm.bcast(seconds, root=0), comm.bcast(ids, root=1)
            rows.append({"grid": grid, "gemm": name, "seconds": seconds, "alone_s": None,
                         "sms": len(set(ids)), "tpcs": len({i // 2 for i in ids})})
    if rank == 0:
        for r in rows:
            r["alone_s"] = alone[r["gemm"]]
            r["starved"] = r["seconds"] > 0.5 * args.hold
        lines = [f"rank 1 holds G programs for {args.hold} s; rank 0 times a {args.m} x 8192 x 14336 bf16 GEMM "
                 f"({torch.cuda.get_device_name()}, MPS)", "",
                 "| G (rank 1) | SMs / TPCs they hold | GEMM | seconds | alone (s) | starved |",
                 "| --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            lines.append(f"| {r['grid']} | {r['sms']} / {r['tpcs']} | {r['gemm']} | {r['seconds']:.4f} | "
                         f"{r['alone_s']:.4f} | {'yes' if r['starved'] else 'no'} |")
        text = "\n".join(lines)
        print(text, flush=True)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "mps_gemm_starvation.json"), "w") as f:
            json.dump({"hold_s": args.hold, "m": args.m, "rows": rows}, f, indent=1)
        with open(os.path.join(args.out, "mps_gemm_starvation.md"), "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
