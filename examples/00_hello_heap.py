"""Every rank writes a block into every peer's heap from one Triton kernel; every rank checks
what it received.

    mpirun -n 4 python examples/00_hello_heap.py [--n 4096]
    torchrun --nproc-per-node 4 examples/00_hello_heap.py [--n 4096]

The same program under either launcher: ``iris.runtime.iris()`` bootstraps from MPI under mpirun
and from torch.distributed under torchrun (``ctx.comm.gather`` works with both).
"""

import argparse
import sys
import time

import torch
import triton
import triton.language as tl

# iris.runtime picks the backend; on a machine with no GPU it switches Triton's interpreter on,
# so import it before defining kernels.
import iris.runtime
from iris.device import DeviceContext


@triton.jit
def write_to_every_peer(context, inbox, n, rank: tl.constexpr, world_size: tl.constexpr, BLOCK: tl.constexpr):
    """Program p writes block p of this rank's message into slot `rank` of every peer's inbox."""
    ctx = DeviceContext.initialize(context, rank, world_size)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    message = (rank * 1000 + offs).to(tl.float32)
    for peer in range(world_size):
        ctx.store(inbox + rank * n + offs, message, to_rank=peer, mask=mask)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096, help="elements each rank sends to each peer")
    args = parser.parse_args()

    with iris.runtime.iris(heap_size=1 << 26) as ctx:
        rank, world = ctx.rank, ctx.world_size
        inbox = ctx.full((world * args.n,), -1.0, dtype=torch.float32)
        ctx.barrier()
        block = 1024
        start = time.perf_counter()
        write_to_every_peer[(triton.cdiv(args.n, block),)](ctx.get_device_context(), inbox, args.n, rank, world, block)
        ctx.barrier()
        elapsed = time.perf_counter() - start
        offs = torch.arange(args.n, dtype=torch.float32, device=ctx.device)
        received = inbox.view(world, args.n)
        bad = [src for src in range(world) if not torch.equal(received[src], src * 1000 + offs)]
        report = ctx.comm.gather((rank, bad), root=0)
        if rank == 0:
            print(f"hello heap: {world} ranks, backend {ctx.backend}, bootstrap {ctx.bootstrap}, "
                  f"{args.n} float32 per message, "
                  f"{world * world} messages in {elapsed * 1e3:.1f} ms")
            for r, b in report:
                print(f"  rank {r}: " + ("received every peer's block" if not b else f"WRONG data from ranks {b}"))
        ok = ctx.broadcast(all(not b for _, b in report) if rank == 0 else None)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
