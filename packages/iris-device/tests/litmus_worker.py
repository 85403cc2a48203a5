"""Memory-ordering litmus tests between ranks 0 and 1: the orderings iris.device promises, measured.

Launched by ``test_device_litmus.py`` as ``mpiexec -n 2 python -m mpi4py litmus_worker.py
<scenario>...``. Each scenario runs many iterations of one pattern with weak (plain) data accesses
and iris atomics as the only ordering, counts the outcomes the PTX memory model forbids, and prints
``LITMUS <pattern> <variant> iterations=<n> violations=<v>``. The ``ordered`` variant uses the
documented semantics and must see 0 violations. The ``relaxed`` variant drops them (relaxed
atomics, so no CTA barriers and no fences either): its count shows whether the hardware could
expose a missing ordering at all, so a 0 for ``ordered`` means something. It is reported, never
asserted: the memory model allows a relaxed run to look ordered.

Patterns (one instance per program and lane, ``PROGRAMS`` programs at once):

- ``mp`` (message passing): rank 0 stores a block into rank 1's inbox, then sets a flag on rank 1;
  rank 1 waits for the flag, loads the block and counts stale elements, then acknowledges with a
  release so that rank 0 may overwrite the block. Ordered: release publish, acquire wait.
- ``sb`` (store buffering): rank r stores 1 into its word X_r, performs an atomic add on a word Z
  shared by both (on rank 0), then loads the other rank's word. The two adds are ordered in Z's
  coherence order, so with ``acq_rel`` at least one rank must see the other's store: both loads
  returning 0 is forbidden.
"""

from __future__ import annotations

import os

import torch

import iris.runtime  # first: picks the backend and, for cpu, switches Triton's interpreter on
import iris.runtime.testing

# isort: split
import triton
import triton.language as tl
from mpi4py import MPI

from iris.device import DeviceContext

ON_CPU = iris.runtime.DEFAULT_BACKEND == "cpu"
# The interpreter runs a few thousand atomics a second; the GPU runs millions.
PROGRAMS = 2 if ON_CPU else 16
BLOCK = 32 if ON_CPU else 256
MP_ITERS = int(os.environ.get("IRIS_LITMUS_MP_ITERS", 40 if ON_CPU else 20000))
SB_ITERS = int(os.environ.get("IRIS_LITMUS_SB_ITERS", 20 if ON_CPU else 4000))


@triton.jit
def wait_local(flag, target):
    # Acquire poll of this rank's own word (every variant waits this way for the acknowledgement,
    # so only the ordering under test differs between variants).
    seen = tl.atomic_add(flag, 0, sem="acquire", scope="sys")
    while seen < target:
        seen = tl.atomic_add(flag, 0, sem="acquire", scope="sys")


@triton.jit
def mp_kernel(context, inbox, flags, acks, bad, iters, rank: tl.constexpr, world_size: tl.constexpr,
              BLOCK: tl.constexpr, ORDERED: tl.constexpr):
    ctx = DeviceContext.initialize(context, rank, world_size)
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    errors = 0
    for i in range(1, iters + 1):
        if rank == 0:
            wait_local(acks + pid, i - 1)  # rank 1 has read round i - 1: the block may be overwritten
            ctx.store(inbox + offs, tl.zeros([BLOCK], tl.int32) + i, 1)  # weak stores, remote
            if ORDERED:
                ctx.atomic_xchg(flags + pid, i, 1, sem="release", scope="sys")
            else:
                ctx.atomic_xchg(flags + pid, i, 1, sem="relaxed", scope="sys")
        elif rank == 1:
            if ORDERED:
                seen = ctx.atomic_add(flags + pid, 0, 1, sem="acquire", scope="sys")
                while seen < i:
                    seen = ctx.atomic_add(flags + pid, 0, 1, sem="acquire", scope="sys")
            else:
                seen = ctx.atomic_add(flags + pid, 0, 1, sem="relaxed", scope="sys")
                while seen < i:
                    seen = ctx.atomic_add(flags + pid, 0, 1, sem="relaxed", scope="sys")
            values = tl.load(inbox + offs)  # weak loads, local
            errors += tl.sum((values != i).to(tl.int32))
            ctx.atomic_xchg(acks + pid, i, 0, sem="release", scope="sys")
    if rank == 1:
        tl.store(bad + pid, errors)


@triton.jit
def sb_kernel(context, xs, ys, shared, start, seen_out, iters, rank: tl.constexpr, world_size: tl.constexpr,
              PROGRAMS: tl.constexpr, BLOCK: tl.constexpr, ORDERED: tl.constexpr):
    # xs, ys, shared and start live on rank 0 (rank 1 reaches them through ctx); seen_out is local.
    ctx = DeviceContext.initialize(context, rank, world_size)
    pid = tl.program_id(0)
    lanes = tl.arange(0, BLOCK)
    for i in range(iters):
        # A loose start line, so that both ranks run iteration i at about the same time.
        ctx.atomic_add(start + pid, 1, 0, sem="relaxed", scope="sys")
        arrived = ctx.atomic_add(start + pid, 0, 0, sem="relaxed", scope="sys")
        while arrived < 2 * (i + 1):
            arrived = ctx.atomic_add(start + pid, 0, 0, sem="relaxed", scope="sys")
        at = (i * PROGRAMS + pid) * BLOCK + lanes
        ones = tl.zeros([BLOCK], tl.int32) + 1
        if rank == 0:
            ctx.store(xs + at, ones, 0)
        else:
            ctx.store(ys + at, ones, 0)
        if ORDERED:
            ctx.atomic_add(shared + pid, 1, 0, sem="acq_rel", scope="sys")
        else:
            ctx.atomic_add(shared + pid, 1, 0, sem="relaxed", scope="sys")
        if rank == 0:
            other = ctx.load(ys + at, 0)
        else:
            other = ctx.load(xs + at, 0)
        tl.store(seen_out + at, other)


def report(pattern: str, variant: str, iterations: int, violations: int) -> None:
    print(f"LITMUS {pattern} {variant} iterations={iterations} violations={violations}", flush=True)


def require_two_ranks(ctx) -> None:
    assert ctx.world_size >= 2, f"the litmus tests need 2 ranks, got {ctx.world_size}"


def scenario_message_passing(ctx):
    """``mp``: weak block, then flag; acquire the flag, read the block. Ordered: 0 stale elements."""
    require_two_ranks(ctx)
    for variant, ordered in (("ordered", True), ("relaxed", False)):
        inbox = ctx.zeros(PROGRAMS * BLOCK, dtype=torch.int32)
        flags = ctx.zeros(PROGRAMS, dtype=torch.int32)
        acks = ctx.zeros(PROGRAMS, dtype=torch.int32)
        bad = ctx.full((PROGRAMS,), -1, dtype=torch.int32)
        ctx.barrier()
        if ctx.rank < 2:
            mp_kernel[(PROGRAMS,)](ctx.get_device_context(), inbox, flags, acks, bad, MP_ITERS, ctx.rank,
                                   ctx.world_size, BLOCK, ordered)
        ctx.barrier()
        if ctx.rank == 1:
            assert int(flags.min()) == MP_ITERS and int(bad.min()) >= 0, (flags.tolist(), bad.tolist())
        violations = MPI.COMM_WORLD.bcast(int(bad.sum()) if ctx.rank == 1 else None, root=1)
        if ctx.rank == 0:
            report("mp", variant, MP_ITERS * PROGRAMS * BLOCK, violations)
        if ordered:
            assert violations == 0, f"message passing: {violations} stale element(s) read after an acquired flag"
        for t in (inbox, flags, acks, bad):
            ctx.free(t)


def scenario_store_buffering(ctx):
    """``sb``: store mine, atomic add on a shared word, load theirs. ``acq_rel``: never both 0."""
    require_two_ranks(ctx)
    n = SB_ITERS * PROGRAMS * BLOCK
    for variant, ordered in (("ordered", True), ("relaxed", False)):
        xs = ctx.zeros(n, dtype=torch.int32)
        ys = ctx.zeros(n, dtype=torch.int32)
        shared = ctx.zeros(PROGRAMS, dtype=torch.int32)
        start = ctx.zeros(PROGRAMS, dtype=torch.int32)
        seen = ctx.full((n,), -1, dtype=torch.int32)
        ctx.barrier()
        if ctx.rank < 2:
            sb_kernel[(PROGRAMS,)](ctx.get_device_context(), xs, ys, shared, start, seen, SB_ITERS, ctx.rank,
                                   ctx.world_size, PROGRAMS, BLOCK, ordered)
        ctx.barrier()
        mine = seen.cpu()
        theirs = MPI.COMM_WORLD.bcast(mine if ctx.rank == 1 else None, root=1)
        if ctx.rank == 0:
            assert int(mine.min()) >= 0 and int(theirs.min()) >= 0, "a load of the store-buffering test did not run"
            violations = int(((mine == 0) & (theirs == 0)).sum())
            report("sb", variant, n, violations)
            if ordered:
                assert violations == 0, f"store buffering: {violations} lane(s) where neither rank saw the other"
        for t in (xs, ys, shared, start, seen):
            ctx.free(t)


if __name__ == "__main__":
    iris.runtime.testing.run_scenarios(globals(), heap_size=1 << 28)
