"""Message passing between ranks with the bound device context: data, then a flag.

Every rank is a producer for its right neighbour and a consumer for its left one. A message is
cut into blocks, each with its own flag. In each round the producer writes every block into the
consumer's inbox and raises the block's flag with ``atomic_cas(flag, round - 1, round,
sem="release", scope="sys")``; the consumer spins on each flag with ``sem="acquire", scope="sys"``
until it reads ``round``, checks the block, and acknowledges (release) so that the producer may
overwrite the inbox in the next round. Sequence numbers make the flags reusable: nothing is reset
between rounds.

Program ``p`` of a rank handles blocks ``p, p + P, p + 2P, ...`` (``P`` programs per rank, the same
on every rank) and only ever waits for program ``p`` of its two neighbours, which publishes before
it waits. That works under Triton's interpreter (programs of a launch run one after another) and
on a GPU as long as every rank's programs are resident at once: ``P`` comes from
``ctx.resident_grid``, which knows how many programs of the compiled kernel fit on the GPU with
every rank sharing it.

Two ways to move a block are shown: ``ctx.store`` of registers (``--method store``) and
``ctx.put`` from a local staging buffer (``--method put``); the default runs both.

    mpirun -n 4 python examples/01_message_passing.py [--method store|put|both] [--n 4096]
        [--block 1024] [--rounds 4] [--programs P]
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
def wait_for(ctx, flag, value, max_spins):
    """Spin until ``flag`` (in this rank's heap) holds ``value``; acquire at system scope.

    One scalar atomic per try, per program. The acquire pairs with the peer's release, so
    everything the peer wrote before raising the flag is visible after this returns. Returns
    False when ``max_spins`` tries were not enough (the host then reports a timeout instead of
    hanging forever).
    """
    seen = ctx.atomic_cas(flag, value, value, to_rank=ctx.rank, sem="acquire", scope="sys")
    spins = 0
    while (seen != value) & (spins < max_spins):
        seen = ctx.atomic_cas(flag, value, value, to_rank=ctx.rank, sem="acquire", scope="sys")
        spins += 1
    return seen == value


@triton.jit
def message(producer, round_no, offs):
    """The values producer ``producer`` sends in round ``round_no``: unique per element."""
    return (producer * 1_000_000 + round_no * 10_000 + offs % 10_000).to(tl.float32)


@triton.jit
def send_block(ctx, inbox, staging, ready, ack, block, n, r, max_spins, rank, consumer, USE_PUT: tl.constexpr,
               BLOCK: tl.constexpr):
    """Producer side of one block in round ``r``; returns the count of what went wrong (a timed-out
    wait counts as the whole block, an unexpected flag value as 1)."""
    bad = 0
    offs = block * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    # The consumer has finished reading round r - 1 of this block once it acked it.
    if r > 1:
        if not wait_for(ctx, ack + block, r - 1, max_spins):
            bad += BLOCK  # timed out: count the whole block as wrong
    values = message(rank, r, offs)
    if USE_PUT:
        tl.store(staging + offs, values, mask=mask)
        ctx.put(staging + offs, inbox + offs, to_rank=consumer, mask=mask)
    else:
        ctx.store(inbox + offs, values, to_rank=consumer, mask=mask)
    # The block was stored by every thread of the program, the flag is raised by one: a CTA
    # barrier first, so that the release below covers the other threads' stores too.
    tl.debug_barrier()
    # Release at system scope: the block above is visible to the consumer's process (and GPU)
    # before it can see the new flag value. scope="gpu" would not order it for a peer.
    old = ctx.atomic_cas(ready + block, r - 1, r, to_rank=consumer, sem="release", scope="sys")
    return bad + tl.where(old == r - 1, 0, 1)


@triton.jit
def receive_block(ctx, inbox, ready, ack, block, n, r, max_spins, producer, BLOCK: tl.constexpr):
    """Consumer side of one block in round ``r``: wait, check, acknowledge; returns the errors."""
    bad = 0
    offs = block * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if wait_for(ctx, ready + block, r, max_spins):
        got = tl.load(inbox + offs, mask=mask, other=0.0)
        bad += tl.sum(tl.where(mask & (got != message(producer, r, offs)), 1, 0))
    else:
        bad += BLOCK
    tl.debug_barrier()  # every thread has read the block before the producer may overwrite it
    ctx.atomic_cas(ack + block, r - 1, r, to_rank=producer, sem="release", scope="sys")
    return bad


# rounds is not specialised on: Triton compiles a separate kernel for an int that is 1 or a
# multiple of 16, and the warm-up launch (rounds=0) must build the kernel the timed one uses.
@triton.jit(do_not_specialize=["rounds"])
def exchange(context, inbox, staging, ready, ack, errors, n, rounds, max_spins, rank: tl.constexpr,
             world_size: tl.constexpr, USE_PUT: tl.constexpr, BLOCK: tl.constexpr):
    """A persistent grid: program ``p`` sends, then receives, blocks ``p, p + P, ...`` per round.

    ``ready[b]`` lives in the consumer's heap (raised by its producer); ``ack[b]`` lives in the
    producer's heap (raised by its consumer). A program sends all its blocks before it waits for
    any incoming one, and waits only on the program with the same id on another rank, so it never
    waits on a program of its own launch (those may run one after another).
    """
    ctx = DeviceContext.initialize(context, rank, world_size)
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    consumer = (rank + 1) % world_size
    producer = (rank + world_size - 1) % world_size
    num_blocks = tl.cdiv(n, BLOCK)
    bad = 0
    for r in range(1, rounds + 1):
        for block in range(pid, num_blocks, programs):
            bad += send_block(ctx, inbox, staging, ready, ack, block, n, r, max_spins, rank, consumer, USE_PUT,
                              BLOCK)
        for block in range(pid, num_blocks, programs):
            bad += receive_block(ctx, inbox, ready, ack, block, n, r, max_spins, producer, BLOCK)
    tl.atomic_add(errors, bad, sem="relaxed")


def run(ctx, method: str, n: int, block: int, rounds: int, max_spins: int, programs: int) -> dict:
    """Allocate, run one exchange of ``rounds`` rounds, check on the host.

    Returns ``ok``, ``seconds``, ``bad`` (wrong elements or flags) and ``programs`` per rank.
    """
    num_blocks = triton.cdiv(n, block)
    inbox = ctx.full((n,), -1.0, dtype=torch.float32)
    staging = ctx.zeros((n,), dtype=torch.float32)
    ready = ctx.zeros((num_blocks,), dtype=torch.int32)
    ack = ctx.zeros((num_blocks,), dtype=torch.int32)
    errors = ctx.zeros((1,), dtype=torch.int32)
    args = (ctx.get_device_context(), inbox, staging, ready, ack, errors, n, rounds, max_spins, ctx.rank,
            ctx.world_size, method == "put", block)
    # Compile first (a launch with no rounds): each rank compiles its own kernel (the rank is a
    # compile-time constant), and the fastest rank would otherwise wait for the slowest one's
    # compiler inside the timed run, long enough to exhaust --max-spins on a GPU. The compiled
    # kernel also tells how many programs fit on the GPU at once with every rank running it.
    compiled = exchange[(1,)](*args[:7], 0, *args[8:])
    grid = min(programs, num_blocks) if programs else ctx.resident_grid(num_blocks, compiled)
    ctx.barrier()  # every rank's flags are zero before anyone raises one, and every kernel is built
    start = time.perf_counter()
    exchange[(grid,)](*args)
    ctx.barrier()
    elapsed = time.perf_counter() - start
    bad = int(errors.item())
    # Host check of the last round (the kernel checked every round).
    producer = (ctx.rank - 1) % ctx.world_size
    offs = torch.arange(n, device=ctx.device)
    expected = (producer * 1_000_000 + rounds * 10_000 + offs % 10_000).to(torch.float32)
    bad += int((inbox != expected).sum())
    bad += int((ready != rounds).sum()) + int((ack != rounds).sum())
    for t in (inbox, staging, ready, ack, errors):
        ctx.free(t)
    return {"ok": bad == 0, "seconds": elapsed, "bad": bad, "programs": grid}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", choices=("store", "put", "both"), default="both")
    parser.add_argument("--n", type=int, default=4096, help="float32 elements per message (GPU: e.g. 1<<22)")
    parser.add_argument("--block", type=int, default=1024, help="elements per program (a power of two)")
    parser.add_argument("--rounds", type=int, default=4, help="messages per producer")
    parser.add_argument("--max-spins", type=int, default=1 << 22, help="tries before a wait gives up")
    parser.add_argument("--programs", type=int, default=0,
                        help="programs per rank (default: as many as stay resident with every rank on the GPU)")
    args = parser.parse_args(argv)
    if args.block & (args.block - 1) or args.n <= 0 or args.rounds <= 0 or args.programs < 0:
        parser.error("--block must be a power of two, --n and --rounds positive, --programs >= 0")

    methods = ("store", "put") if args.method == "both" else (args.method,)
    with iris.runtime.iris(heap_size=max(1 << 24, 4 * args.n * 4)) as ctx:
        results = {m: run(ctx, m, args.n, args.block, args.rounds, args.max_spins, args.programs) for m in methods}
        reports = ctx.comm.gather(results, root=0)
        ok = True
        if ctx.rank == 0:
            print(f"message passing: {ctx.world_size} ranks, backend {ctx.backend}, {args.n} float32 per message "
                  f"({triton.cdiv(args.n, args.block)} blocks of {args.block}), {args.rounds} rounds, "
                  f"flags release/acquire at scope sys")
            for m in methods:
                slowest = max(rep[m]["seconds"] for rep in reports)
                wrong = {r: rep[m]["bad"] for r, rep in enumerate(reports) if not rep[m]["ok"]}
                ok &= not wrong
                status = "all blocks correct" if not wrong else f"WRONG elements/flags per rank: {wrong}"
                mb = args.n * 4 * args.rounds / 1e6
                print(f"  {m:5s}: {status}; {args.rounds} rounds in {slowest * 1e3:.1f} ms "
                      f"({mb / slowest:.1f} MB/s per rank, {reports[0][m]['programs']} programs per rank)")
        ok = ctx.broadcast(ok if ctx.rank == 0 else None)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
