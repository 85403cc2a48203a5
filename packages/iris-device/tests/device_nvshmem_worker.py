"""The network path against the pointer path, on one node, in one process (nvshmem backend, GPU).

Run as ``mpirun -n N python device_nvshmem_worker.py [--bandwidth]`` with ``IRIS_BACKEND=nvshmem``
and ``IRIS_NVSHMEM_NETWORK=1``. Every peer here is mapped, so each kernel is launched twice: once
with the context's heap bases (translated pointers) and once with a copy of the context whose
other ranks' bases are 0, which sends every remote access through NVSHMEM's device functions. Both
must give the values computed on the host. ``--bandwidth`` also times a 64 MiB put both ways and
NVSHMEM's bulk ``putmem_signal_nbi_block``, and prints a table.
"""

from __future__ import annotations

import sys
import time

import torch

import iris.runtime

# isort: split
import triton
import triton.language as tl

import iris.device as device
from iris.device import _layout
from iris.device import nvshmem as nv

BLOCK = 128
N = 300  # three programs, the last one ragged
OTHER = -7
POISON = -3
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int64": torch.int64, "int8": torch.int8}


@triton.jit
def rma_kernel(src, load_dst, store_dst, get_dst, put_dst, copy_dst, heap_bases, cur, peer, n,
               BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = (offs < n) & (offs % 5 != 1)
    x = device.load(src + offs, cur, peer, heap_bases, mask=m, other=-7)
    tl.store(load_dst + offs, x, mask=offs < n)
    device.store(store_dst + offs, tl.load(src + offs, mask=m), cur, peer, heap_bases, mask=m)
    device.get(src + offs, get_dst + offs, peer, cur, heap_bases, mask=m)
    device.put(src + offs, put_dst + offs, cur, peer, heap_bases, mask=m)
    device.copy(src + offs, copy_dst + offs, peer, cur, cur, heap_bases, mask=m)  # pull into my copy_dst


@triton.jit
def amo_kernel(words32, words64, old_out, heap_bases, cur, peer):
    # Every rank does each atomic once on its peer's words; the olds land in old_out (local).
    o0 = device.atomic_add(words32 + 0, cur + 1, cur, peer, heap_bases, sem="relaxed", scope="sys")
    o1 = device.atomic_sub(words32 + 1, 3, cur, peer, heap_bases, sem="acq_rel", scope="sys")
    o2 = device.atomic_cas(words32 + 2, 0, cur + 10, cur, peer, heap_bases, sem="acq_rel", scope="sys")
    o3 = device.atomic_xchg(words32 + 3, cur + 20, cur, peer, heap_bases, sem="release", scope="sys")
    o4 = device.atomic_or(words32 + 4, 1 << cur, cur, peer, heap_bases, scope="sys")
    o5 = device.atomic_and(words32 + 5, ~(1 << cur), cur, peer, heap_bases, scope="sys")
    o6 = device.atomic_xor(words32 + 6, 0x100 << cur, cur, peer, heap_bases, scope="sys")
    o7 = device.atomic_add(words64 + 0, tl.cast(cur + 1, tl.int64) << 33, cur, peer, heap_bases, scope="sys")
    tl.store(old_out + 0, o0.to(tl.int64))
    tl.store(old_out + 1, o1.to(tl.int64))
    tl.store(old_out + 2, o2.to(tl.int64))
    tl.store(old_out + 3, o3.to(tl.int64))
    tl.store(old_out + 4, o4.to(tl.int64))
    tl.store(old_out + 5, o5.to(tl.int64))
    tl.store(old_out + 6, o6.to(tl.int64))
    tl.store(old_out + 7, o7)


@triton.jit
def message_kernel(data, flag, heap_bases, cur, peer, n, BLOCK: tl.constexpr):
    # Send a block and a release flag to the peer; then wait for the peer's flag here (acquire,
    # local) and check its data arrived before it: the count of wrong elements goes to data[n].
    offs = tl.arange(0, BLOCK)
    m = offs < n
    device.store(data + offs, (offs + cur * 1000).to(tl.float32), cur, peer, heap_bases, mask=m)
    device.atomic_add(flag, 1, cur, peer, heap_bases, sem="release", scope="sys")
    seen = tl.atomic_add(flag, 0, sem="acquire", scope="sys")
    while seen == 0:
        seen = tl.atomic_add(flag, 0, sem="acquire", scope="sys")
    src = (cur + tl.load(heap_bases - 1) - 1) % tl.load(heap_bases - 1)
    got = tl.load(data + offs, mask=m, other=0.0)
    bad = tl.sum(((got != (offs + src * 1000).to(tl.float32)) & m).to(tl.int32), axis=0)
    tl.store(data + n, bad.to(tl.float32))


@triton.jit
def store_bw_kernel(src, dst, heap_bases, cur, peer, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    device.store(dst + offs, tl.load(src + offs, mask=m), cur, peer, heap_bases, mask=m)


@triton.jit
def bulk_put_kernel(src, dst, signal, bytes_per_program, peer):
    start = tl.program_id(0).to(tl.int64) * bytes_per_program
    nv.putmem_signal_nbi_block(tl.cast(dst, tl.int64) + start, tl.cast(src, tl.int64) + start, bytes_per_program,
                               tl.cast(signal, tl.int64), 1, nv.SIGNAL_ADD, peer)


def network_bases(ctx) -> torch.Tensor:
    """A copy of the context whose other ranks' bases are 0; returns its heap-bases view."""
    context = ctx.get_device_context().clone()
    for r in range(ctx.world_size):
        if r != ctx.rank:
            context[_layout.HEAP_BASES + r] = 0
    return context[_layout.HEAP_BASES:]


def pattern(rank: int, dtype: torch.dtype) -> torch.Tensor:
    return ((rank * 37 + torch.arange(N)) % 120 - 50).to(dtype)  # exact in every dtype here


def check(what, got, want):
    got = got.cpu()
    want = want.to(got.dtype)
    if not torch.equal(got, want):
        bad = (got != want).nonzero().flatten().tolist()
        raise AssertionError(f"{what}: {len(bad)} wrong, first {bad[:6]}: got {got[bad[:6]].tolist()} "
                             f"want {want[bad[:6]].tolist()}")


def scenario_rma(ctx, paths):
    W, r = ctx.world_size, ctx.rank
    peer, prev = (r + 1) % W, (r - 1) % W
    offs = torch.arange(N)
    m = (offs % 5 != 1)
    for name, dtype in DTYPES.items():
        for path, bases in paths.items():
            src = ctx.zeros(N, dtype=dtype)
            outs = [ctx.full((N,), POISON, dtype=dtype) for _ in range(5)]
            src.copy_(pattern(r, dtype).to(ctx.device))
            ctx.barrier()
            rma_kernel[(triton.cdiv(N, BLOCK),)](src, *outs, bases, r, peer, N, BLOCK=BLOCK)
            ctx.barrier()
            load_dst, store_dst, get_dst, put_dst, copy_dst = outs
            from_peer = torch.where(m, pattern(peer, dtype), torch.tensor(OTHER, dtype=dtype))
            check(f"{path} load {name}", load_dst, from_peer)
            pulled = torch.where(m, pattern(peer, dtype), torch.tensor(POISON, dtype=dtype))
            check(f"{path} get {name}", get_dst, pulled)
            check(f"{path} copy {name}", copy_dst, pulled)
            from_prev = torch.where(m, pattern(prev, dtype), torch.tensor(POISON, dtype=dtype))
            check(f"{path} store {name}", store_dst, from_prev)
            check(f"{path} put {name}", put_dst, from_prev)
            ctx.barrier()
            for t in (src, *outs):
                ctx.free(t)
    return f"load/store/get/put/copy, {', '.join(DTYPES)}, masked and ragged, paths {list(paths)}"


def scenario_amo(ctx, paths):
    W, r = ctx.world_size, ctx.rank
    peer, prev = (r + 1) % W, (r - 1) % W
    for path, bases in paths.items():
        start32 = torch.tensor([5, 100, 0, 7, 0x10, -1, 0, 0], dtype=torch.int32)
        words32 = ctx.zeros(8, dtype=torch.int32)
        words64 = ctx.zeros(2, dtype=torch.int64)
        words32.copy_(start32.to(ctx.device))
        words64.fill_(1 << 40)
        old = ctx.full((8,), POISON, dtype=torch.int64)
        ctx.barrier()
        amo_kernel[(1,)](words32, words64, old, bases, r, peer)
        ctx.barrier()
        # Only prev touched my words, once each.
        want = start32.clone()
        want[0] += prev + 1
        want[1] -= 3
        want[2] = prev + 10
        want[3] = prev + 20
        want[4] |= 1 << prev
        want[5] &= ~(1 << prev)
        want[6] ^= 0x100 << prev
        check(f"{path} amo words32", words32, want)
        check(f"{path} amo words64", words64[:1], torch.tensor([(1 << 40) + ((prev + 1) << 33)]))
        check(f"{path} amo olds", old, torch.tensor([5, 100, 0, 7, 0x10, -1, 0, 1 << 40]))
        ctx.barrier()
        for t in (words32, words64, old):
            ctx.free(t)
    return f"atomic add/sub/cas/xchg/or/and/xor int32, add int64, olds, paths {list(paths)}"


def scenario_message(ctx, paths):
    if ctx.world_size < 2:
        return "message passing: needs 2 ranks (skipped)"
    r, peer = ctx.rank, (ctx.rank + 1) % ctx.world_size
    for path, bases in paths.items():
        for rep in range(20):
            data = ctx.zeros(BLOCK + 1, dtype=torch.float32)
            flag = ctx.zeros(1, dtype=torch.int32)
            ctx.barrier()
            message_kernel[(1,)](data, flag, bases, r, peer, BLOCK, BLOCK=BLOCK)
            ctx.barrier()
            assert int(data[BLOCK].item()) == 0, f"{path} message passing rep {rep}: {int(data[BLOCK].item())} " \
                                                 f"elements arrived after the release flag"
            ctx.free(data)
            ctx.free(flag)
    return f"store + release atomic, acquire poll: data before flag, 20 reps, paths {list(paths)}"


def time_it(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps


def bandwidth(ctx, paths):
    r, peer = ctx.rank, (ctx.rank + 1) % ctx.world_size
    nbytes = 64 << 20
    n = nbytes // 4
    src = ctx.zeros(n, dtype=torch.float32)
    src.copy_(torch.randn(n, device=ctx.device))
    dst = ctx.zeros(n, dtype=torch.float32)
    signal = ctx.zeros(1, dtype=torch.int64)
    rows = []
    for path, bases in paths.items():
        for block in (1024, 4096):
            ctx.barrier()
            dt = time_it(lambda: store_bw_kernel[(triton.cdiv(n, block),)](src, dst, bases, r, peer, n, BLOCK=block,
                                                                           num_warps=8))
            ctx.barrier()
            rows.append((f"iris.device.store, {path} path, BLOCK {block}", dt))
    programs = 256
    ctx.barrier()
    dt = time_it(lambda: bulk_put_kernel[(programs,)](src, dst, signal, nbytes // programs, peer, num_warps=8))
    ctx.barrier()
    rows.append((f"nvshmem putmem_signal_nbi_block, {programs} programs", dt))
    sums = ctx.comm.allgather(float(src.double().sum()))
    ok = abs(float(dst.double().sum()) - sums[(r - 1) % ctx.world_size]) < 1e-3 * n
    if r == 0:
        print(f"\n{ctx.world_size} ranks, 64 MiB fp32 to the next rank, all ranks at once (one GPU: MPS)")
        print(f"| {'kernel':<52} | {'us':>8} | {'GB/s':>7} |")
        print(f"| {'-' * 52} | {'-' * 8} | {'-' * 7} |")
        for what, dt in rows:
            print(f"| {what:<52} | {dt * 1e6:8.1f} | {nbytes / dt / 1e9:7.1f} |")
        print(f"data after the bulk put {'correct' if ok else 'WRONG'}")
    assert ok, "bulk put delivered wrong data"


def main() -> int:
    ctx = iris.runtime.iris(heap_size=1 << 28)
    assert ctx.backend == "nvshmem", ctx.backend
    assert nv.NVSHMEM, "run with IRIS_NVSHMEM_NETWORK=1 so the network path is compiled in"
    paths = {"pointer": ctx.get_heap_bases(), "network": network_bases(ctx)}
    for scenario in (scenario_rma, scenario_amo, scenario_message):
        t = time.perf_counter()
        what = scenario(ctx, paths)
        if ctx.rank == 0:
            print(f"PASS {scenario.__name__}: {what} ({time.perf_counter() - t:.1f} s)", flush=True)
    if "--bandwidth" in sys.argv:
        bandwidth(ctx, paths)
    ctx.barrier()
    ctx.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
