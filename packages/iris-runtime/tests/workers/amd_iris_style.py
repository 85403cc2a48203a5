"""Kernels and host code written the way AMD Iris's tests and docs write them: module-qualified free
functions (``iris.get(ptr, local, cur_rank, peer, heap_bases, mask=mask)``, ``iris.copy(src, dst,
from_rank, to_rank, cur_rank, heap_bases, mask)``, ...), ``DeviceContext`` / ``TritonContext``
methods with keyword ranks, sem and scope as strings, and the host object's AMD Iris names
(``iris.iris(1 << 20)``, ``get_heap_bases``, ``zeros(..., out=)``, nested sizes, ``allocate``,
``get_device``, ...). Only the import lines differ from a file written for AMD Iris, as
docs/amd-iris.md says: ``import iris.runtime.amd_iris as iris`` for ``import iris``.

``run(dtypes)`` is the scenario ``amd_iris_style`` of runtime_worker.py (every world size).
"""

from __future__ import annotations

import iris.runtime.amd_iris as iris
from iris.runtime.amd_iris import DeviceContext, TritonContext

# isort: split
import torch
import triton
import triton.language as tl

BLOCK_SIZE = 16


# --- free functions ---------------------------------------------------------------------------------
@triton.jit
def free_rma_kernel(data, got, got_docs, loaded, put_box, store_box, pulled, pushed, local_copy,
                    cur_rank: tl.constexpr, num_ranks: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                    heap_bases: tl.tensor):
    pid = tl.program_id(0)
    block_start = pid * BLOCK_SIZE
    offsets = block_start + tl.arange(0, BLOCK_SIZE)
    mask = offsets < BLOCK_SIZE
    mine = cur_rank * BLOCK_SIZE
    for target_rank in range(num_ranks):
        theirs = target_rank * BLOCK_SIZE
        # AMD Iris's tests: the current rank first, then the rank read.
        iris.get(data + offsets, got + theirs + offsets, cur_rank, target_rank, heap_bases, mask=mask)
        # AMD Iris's docstring: from_rank (the rank read), then to_rank (the current rank).
        iris.get(data + offsets, got_docs + theirs + offsets, target_rank, cur_rank, heap_bases, mask=mask)
        values = iris.load(data + offsets, cur_rank, target_rank, heap_bases, mask=mask)
        tl.store(loaded + theirs + offsets, values, mask=mask)
        iris.put(data + offsets, put_box + mine + offsets, cur_rank, target_rank, heap_bases, mask=mask)
        iris.store(store_box + mine + offsets, tl.load(data + offsets, mask=mask), cur_rank, target_rank,
                   heap_bases, mask=mask)
        # copy as a get (this rank receives) and as a put (this rank sends)
        iris.copy(data + offsets, pulled + theirs + offsets, target_rank, cur_rank, cur_rank, heap_bases, mask)
        iris.copy(data + offsets, pushed + mine + offsets, cur_rank, target_rank, cur_rank, heap_bases, mask)
    iris.copy(data + offsets, local_copy + offsets, cur_rank, cur_rank, cur_rank, heap_bases, mask)


@triton.jit
def free_atomics_kernel(results, words, cur_rank: tl.constexpr, num_ranks: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                        heap_bases: tl.tensor, sem: tl.constexpr, scope: tl.constexpr):
    pid = tl.program_id(0)
    block_start = pid * BLOCK_SIZE
    offsets = block_start + tl.arange(0, BLOCK_SIZE)
    mask = offsets < BLOCK_SIZE
    acc = tl.full([BLOCK_SIZE], 1, dtype=results.type.element_ty)
    for target_rank in range(num_ranks):
        iris.atomic_add(results + offsets, acc, cur_rank, target_rank, heap_bases, mask=mask, sem=sem, scope=scope)
        iris.atomic_sub(words + 0, 1, cur_rank, target_rank, heap_bases, sem=sem, scope=scope)
        iris.atomic_max(words + 1, cur_rank + 1, cur_rank, target_rank, heap_bases, sem=sem, scope=scope)
        iris.atomic_min(words + 2, -cur_rank - 1, cur_rank, target_rank, heap_bases, sem=sem, scope=scope)
        iris.atomic_or(words + 3, 1 << cur_rank, cur_rank, target_rank, heap_bases, sem=sem, scope=scope)
        iris.atomic_and(words + 4, ~(1 << cur_rank), cur_rank, target_rank, heap_bases, sem=sem, scope=scope)
        iris.atomic_xor(words + 5, 1 << cur_rank, cur_rank, target_rank, heap_bases, sem=sem, scope=scope)
        iris.atomic_xchg(words + 8 + cur_rank, cur_rank + 1, cur_rank, target_rank, heap_bases, sem=sem,
                         scope=scope)
        iris.atomic_cas(words + 8 + num_ranks + cur_rank, 0, cur_rank + 1, cur_rank, target_rank, heap_bases,
                        sem=sem, scope=scope)


# --- DeviceContext / TritonContext ------------------------------------------------------------------
@triton.jit
def context_rma_kernel(context_tensor, data, got, loaded, put_box, store_box, pulled, pushed,
                       cur_rank: tl.constexpr, num_ranks: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    ctx = DeviceContext.initialize(context_tensor, cur_rank, num_ranks)
    pid = tl.program_id(0)
    block_start = pid * BLOCK_SIZE
    offsets = block_start + tl.arange(0, BLOCK_SIZE)
    mask = offsets < BLOCK_SIZE
    mine = cur_rank * BLOCK_SIZE
    for target_rank in range(num_ranks):
        theirs = target_rank * BLOCK_SIZE
        ctx.get(data + offsets, got + theirs + offsets, from_rank=target_rank, mask=mask)
        result = ctx.load(data + offsets, from_rank=target_rank, mask=mask)
        tl.store(loaded + theirs + offsets, result, mask=mask)
        ctx.put(data + offsets, put_box + mine + offsets, to_rank=target_rank, mask=mask)
        ctx.store(store_box + mine + offsets, tl.load(data + offsets, mask=mask), to_rank=target_rank, mask=mask)
        ctx.copy(data + offsets, pulled + theirs + offsets, target_rank, cur_rank, mask=mask)
        ctx.copy(data + offsets, pushed + mine + offsets, from_rank=cur_rank, to_rank=target_rank, mask=mask)


@triton.jit
def context_atomics_kernel(context_tensor, results, words, flag, cur_rank: tl.constexpr, num_ranks: tl.constexpr,
                           BLOCK_SIZE: tl.constexpr):
    ctx = TritonContext.initialize(context_tensor, cur_rank, num_ranks)
    pid = tl.program_id(0)
    partner = int((cur_rank + num_ranks // 2) % num_ranks)
    block_start = pid * BLOCK_SIZE
    offsets = block_start + tl.arange(0, BLOCK_SIZE)
    mask = offsets < BLOCK_SIZE
    acc = tl.full([BLOCK_SIZE], 1, dtype=results.type.element_ty)
    for target_rank in range(num_ranks):
        ctx.atomic_add(results + offsets, acc, to_rank=target_rank, mask=mask, sem="acq_rel", scope="sys")
        ctx.atomic_sub(words + 0, 1, to_rank=target_rank, sem="relaxed", scope="gpu")
        ctx.atomic_max(words + 1, cur_rank + 1, to_rank=target_rank, sem="acquire", scope="sys")
        ctx.atomic_min(words + 2, -cur_rank - 1, to_rank=target_rank, sem="release", scope="gpu")
        ctx.atomic_or(words + 3, 1 << cur_rank, to_rank=target_rank, scope="sys")
        ctx.atomic_and(words + 4, ~(1 << cur_rank), to_rank=target_rank, sem="acq_rel")
        ctx.atomic_xor(words + 5, 1 << cur_rank, to_rank=target_rank)
        ctx.atomic_xchg(words + 8 + cur_rank, cur_rank + 1, to_rank=target_rank, sem="release", scope="sys")
        ctx.atomic_cas(words + 8 + num_ranks + cur_rank, 0, cur_rank + 1, to_rank=target_rank, sem="acq_rel",
                       scope="sys")
    ctx.atomic_cas(flag + pid, 0, 1, to_rank=partner, sem="release", scope="sys")


# --- host side, as AMD Iris's tests write it --------------------------------------------------------
def check(results, expected, what):
    try:
        torch.testing.assert_close(results, expected, rtol=0, atol=0)
    except AssertionError as e:
        raise AssertionError(f"{what}: {e}") from e


def rma(shmem, dtype, bound):
    num_ranks = shmem.get_num_ranks()
    heap_bases = shmem.get_heap_bases()
    cur_rank = shmem.get_rank()
    device = shmem.get_device()

    data = shmem.arange(BLOCK_SIZE, dtype=dtype)
    data += 32 * cur_rank
    # A nested size, and out= filling a tensor allocated before, as AMD Iris's factories allow.
    boxes = [shmem.zeros(((num_ranks, BLOCK_SIZE),), dtype=dtype) for _ in range(6)]
    got_docs = shmem.zeros(num_ranks, BLOCK_SIZE, out=shmem.allocate(num_ranks * BLOCK_SIZE, dtype))
    local_copy = shmem.zeros_like(data)
    got, loaded, put_box, store_box, pulled, pushed = boxes

    shmem.barrier()
    grid = lambda meta: (1,)  # AMD Iris's tests write the grid so
    if bound:
        context_rma_kernel[grid](shmem.get_device_context(), data, got, loaded, put_box, store_box, pulled, pushed,
                                 cur_rank, num_ranks, BLOCK_SIZE)
    else:
        free_rma_kernel[grid](data, got, got_docs, loaded, put_box, store_box, pulled, pushed, local_copy, cur_rank,
                              num_ranks, BLOCK_SIZE, heap_bases)
    shmem.barrier()

    every = torch.stack([torch.arange(BLOCK_SIZE, dtype=dtype, device=device) + 32 * r for r in range(num_ranks)])
    form = "bound" if bound else "free"
    for name, result in zip(("get", "load", "put", "store", "copy (pull)", "copy (push)"), boxes):
        check(result, every, f"{form} {name} {dtype}")
    if not bound:
        check(got_docs, every, f"free get in the docstring's order {dtype}")
        check(local_copy, every[cur_rank], f"free local copy {dtype}")
    shmem.barrier()
    for t in (data, *boxes, got_docs, local_copy):
        shmem.deallocate(t)


def atomics(shmem, bound, sem=None, scope=None):
    num_ranks = shmem.get_num_ranks()
    heap_bases = shmem.get_heap_bases()
    cur_rank = shmem.get_rank()
    device = shmem.get_device()

    results = shmem.zeros(BLOCK_SIZE, dtype=torch.int32)
    words = shmem.zeros(8 + 2 * num_ranks, dtype=torch.int32)
    words[4] = -1  # and: every bit set, each rank clears its own
    flag = shmem.zeros(1, dtype=torch.int32)
    shmem.barrier()
    grid = lambda meta: (1,)
    if bound:
        context_atomics_kernel[grid](shmem.get_device_context(), results, words, flag, cur_rank, num_ranks,
                                     BLOCK_SIZE)
    else:
        free_atomics_kernel[grid](results, words, cur_rank, num_ranks, BLOCK_SIZE, heap_bases, sem, scope)
    shmem.barrier()

    form = "bound" if bound else f"free sem={sem} scope={scope}"
    check(results, torch.full((BLOCK_SIZE,), num_ranks, dtype=torch.int32, device=device), f"{form} atomic_add")
    everyone = (1 << num_ranks) - 1
    want = [-num_ranks, num_ranks, -num_ranks, everyone, ~everyone, everyone, 0, 0]
    want += [r + 1 for r in range(num_ranks)] * 2  # xchg slots, then cas slots: one per writer
    check(words, torch.tensor(want, dtype=torch.int32, device=device),
          f"{form} atomic_sub/max/min/or/and/xor/xchg/cas")
    if bound:
        check(flag, torch.ones(1, dtype=torch.int32, device=device), "bound atomic_cas on the partner's flag")
    shmem.barrier()
    for t in (results, words, flag):
        shmem.deallocate(t)


def run(dtypes=(torch.float32,)):
    shmem = iris.iris(1 << 20)
    try:
        assert isinstance(shmem, iris.Iris) and shmem.get_device() == shmem.device
        cu_count = shmem.get_cu_count()
        assert isinstance(cu_count, int) and cu_count >= 1, cu_count
        for dtype in dtypes:
            for bound in (False, True):
                rma(shmem, dtype, bound)
        atomics(shmem, bound=False, sem="acq_rel", scope="sys")
        atomics(shmem, bound=False)  # sem and scope left to their defaults
        atomics(shmem, bound=True)
        assert shmem.heap_free_bytes == shmem.heap_size, "deallocate gave every tensor back"
    finally:
        shmem.close()
