"""Cross-backend parity: fp16/bf16 collective results, bit for bit, against bits made on the GPU.

Two ranks run a fixed set of collectives on seeded random inputs (``torch.randn``: sums that are
not exact, so the order of summation and the single rounding both show) and compare every result
with ``parity_reference.pt`` next to this file, which holds the result bits that the same cases
gave on an H200 (cuda backend). The cpu backend must reproduce them exactly.

    mpiexec -n 2 python -m mpi4py parity_worker.py              # compare (any backend)
    IRIS_PARITY_WRITE=out.pt mpiexec -n 2 python -m mpi4py parity_worker.py   # write (on the GPU)
"""

from __future__ import annotations

import os
import sys

import torch

import iris.collectives as ic
import iris.runtime.testing

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import collective_kernels as K
from collectives_worker import launch_all_reduce

REFERENCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "parity_reference.pt")
# (variant, dtype, M, N, BLOCK_M, BLOCK_N): the collectives that round an fp32 sum to 16 bits
CASES = [(variant, dtype, 24, 96, 8, 32) for variant in (K.ONE_SHOT, K.TWO_SHOT, K.RING, K.REDUCE_SCATTER)
         for dtype in (torch.bfloat16, torch.float16)]


def case_name(variant, dtype, M, N, BM, BN) -> str:
    return f"{K.VARIANT_NAMES[variant]}/{str(dtype).removeprefix('torch.')}/{M}x{N}/{BM}x{BN}"


def run_case(ctx, variant, dtype, M, N, BM, BN) -> torch.Tensor:
    """This rank's result bits (int16) of one call on seeded inputs."""
    g = torch.Generator().manual_seed(4242 + 31 * variant + 7 * ctx.rank + (dtype == torch.float16))
    inp = (torch.randn(M, N, generator=g) * 3).to(dtype).to(ctx.device)
    src = ctx.zeros(M, N, dtype=dtype)
    dst = ctx.zeros(M, N, dtype=dtype)
    locks = ctx.zeros(ic.lock_words(M, N, BM, BN), dtype=torch.int32)
    ctx.barrier()
    launch_all_reduce(ctx, variant, inp, src, dst, locks, M, N, BM, BN)
    ctx.barrier()
    bits = dst.cpu().view(torch.int16).clone()
    for t in (locks, dst, src):
        ctx.free(t)
    return bits


def scenario_parity_with_gpu_bits(ctx):
    assert ctx.world_size == 2, "the reference bits were made with 2 ranks"
    results = {case_name(*case): run_case(ctx, *case) for case in CASES}
    gathered = ctx.comm.gather(results, root=0)
    if ctx.rank != 0:
        return
    mine = {f"rank{r}/{name}": bits for r, res in enumerate(gathered) for name, bits in res.items()}
    write = os.environ.get("IRIS_PARITY_WRITE")
    if write:
        torch.save({"backend": ctx.backend, "device": str(torch.cuda.get_device_name(ctx.device))
                    if ctx.device.type == "cuda" else "cpu", "results": mine}, write)
        print(f"wrote {len(mine)} results to {write}")
        return
    reference = torch.load(REFERENCE)
    assert set(reference["results"]) == set(mine), sorted(set(reference["results"]) ^ set(mine))
    differ = {k: int((mine[k] != reference["results"][k]).sum()) for k in mine}
    bad = {k: v for k, v in differ.items() if v}
    assert not bad, (f"{ctx.backend} backend: elements whose bits differ from the {reference['device']} "
                     f"({reference['backend']}) reference: {bad}")
    print(f"{len(mine)} results bit-identical to the {reference['device']} reference")


if __name__ == "__main__":
    iris.runtime.testing.run_scenarios(globals())
