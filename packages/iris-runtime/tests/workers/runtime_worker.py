"""Multi-rank scenarios of iris-runtime: one launch per world size runs all of them.

    mpiexec -n 4 python -m mpi4py runtime_worker.py [scenario ...]
    python runtime_worker.py [scenario ...]          # a world of one

Every check compares against a value computed on the host, so a wrong offset, a wrong base or a
lost write fails. Rank 0 prints ``PASS <name>`` per scenario; lines starting with ``CHECK`` are
read by the pytest side (test_multirank.py).
"""

from __future__ import annotations

import ctypes
import gc
import itertools
import os
import sys
import time

import numpy as np
import torch
import triton
import triton.language as tl

import iris.runtime  # first: picks the backend and switches Triton's interpreter on for cpu
import iris.runtime.testing

# isort: split
import amd_iris_style

from iris.device import DeviceContext, load, put, store
from iris.device import _layout as layout
from iris.runtime import (
    HeapExhaustedError,
    IrisUsageError,
    NotOnHeapError,
    RankError,
    SymmetryError,
    UnsupportedDtypeError,
    logger,
)

BLOCK = 64  # elements per message: small, the interpreter runs every lane in Python


# --- kernels ---------------------------------------------------------------------------------------
@triton.jit
def store_to_every_peer(inbox, n, rank, heap_bases, world_size: tl.constexpr, BLOCK: tl.constexpr):
    """Free-function store: slot `rank` of every peer's inbox gets rank * 1000 + i."""
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    message = (rank * 1000 + offs).to(tl.float32)
    for peer in range(world_size):
        store(inbox + rank * n + offs, message, rank, peer, heap_bases, mask=mask)


@triton.jit
def put_to_every_peer(src, inbox, n, rank, heap_bases, world_size: tl.constexpr, BLOCK: tl.constexpr):
    """Free-function put: this rank's local `src` into slot `rank` of every peer's inbox."""
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    for peer in range(world_size):
        put(src + offs, inbox + rank * n + offs, rank, peer, heap_bases, mask=mask)


@triton.jit
def load_from_every_peer(src, out, n, rank, heap_bases, world_size: tl.constexpr, BLOCK: tl.constexpr):
    """Free-function load: every peer's `src` into row `peer` of the local `out`."""
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    for peer in range(world_size):
        values = load(src + offs, rank, peer, heap_bases, mask=mask, other=-7.0)
        tl.store(out + peer * n + offs, values, mask=mask)


@triton.jit
def context_store_to_every_peer(context, inbox, n, rank: tl.constexpr, world_size: tl.constexpr,
                                BLOCK: tl.constexpr):
    """Bound form through the context tensor: slot `rank` of every peer's inbox gets -(rank+1) * i."""
    ctx = DeviceContext.initialize(context, rank, world_size)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    ctx_values = (-(rank + 1) * offs).to(tl.int32)
    for peer in range(world_size):
        ctx.store(inbox + rank * n + offs, ctx_values, to_rank=peer, mask=mask)


# --- helpers ---------------------------------------------------------------------------------------
def expect_error(cls, call, *needles):
    """:func:`iris.runtime.testing.expect_error` with the class first (the order of these scenarios)."""
    return iris.runtime.testing.expect_error(call, cls, *needles)


def symmetric_offset(ctx, tensor, what):
    """The heap offset of ``tensor``, checked to be the same on every rank and 256-aligned."""
    assert ctx.is_symmetric(tensor), f"{what}: not on the heap"
    assert tensor.device.type == ctx.device.type, f"{what}: on {tensor.device}, heap on {ctx.device}"
    offsets = ctx.comm.allgather(ctx.offset_of(tensor))
    assert len(set(offsets)) == 1, f"{what}: heap offsets differ between ranks: {offsets}"
    assert offsets[0] % 256 == 0, f"{what}: offset {offsets[0]} is not 256-aligned"
    return offsets[0]


def same(tensor, reference, what):
    reference = reference.to(tensor.device)
    assert tensor.dtype == reference.dtype, f"{what}: dtype {tensor.dtype}, expected {reference.dtype}"
    assert tensor.shape == reference.shape, f"{what}: shape {tuple(tensor.shape)}, expected {tuple(reference.shape)}"
    assert torch.equal(tensor, reference), f"{what}: {tensor.cpu()} != {reference.cpu()}"


def job_files(ctx):
    """Names of the heap's shared-memory files (cpu backend), for the leftover checks."""
    return list(getattr(ctx._heap, "_paths", []))


def gen(ctx, seed):
    return torch.Generator(device=ctx.device).manual_seed(seed)


# --- scenarios -------------------------------------------------------------------------------------
def scenario_ranks(ctx):
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    assert ctx.rank == ctx.get_rank() == world.Get_rank()
    assert ctx.world_size == ctx.get_num_ranks() == world.Get_size()
    assert ctx.comm.allgather(ctx.rank) == list(range(ctx.world_size))
    # the per-call allgather of a few words (ctx.reach): every rank's row, in rank order
    words = ctx._boot.allgather_int64([ctx.rank, -1, 1 << 40])
    assert words.dtype == np.int64 and words.tolist() == [[q, -1, 1 << 40] for q in range(ctx.world_size)], words
    assert ctx.num_nodes == 1 and 0 <= ctx.local_rank < ctx.world_size
    expected = os.environ.get("IRIS_BACKEND", "auto")
    if expected == "auto":
        expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert ctx.backend == expected, (ctx.backend, expected)
    on_gpu = expected in ("cuda", "nvshmem")
    assert ctx.device.type == ("cuda" if on_gpu else "cpu"), ctx.device
    if on_gpu:
        assert ctx.device.index == ctx.local_rank % torch.cuda.device_count(), ctx.device
    assert f"rank={ctx.rank}" in repr(ctx) and f"world_size={ctx.world_size}" in repr(ctx)


@triton.jit
def fill_local(out, value, BLOCK: tl.constexpr):
    tl.store(out + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), value)


def scenario_resident_grid(ctx):
    from iris.runtime._residency import programs_per_sm

    # Every test rank runs on this node; on cuda local rank r uses GPU r % device_count, so a
    # GPU holds every device_count-th rank (all of them on a one-GPU machine).
    if ctx.backend == "cpu":
        assert ctx.ranks_on_device == ctx.world_size, (ctx.ranks_on_device, ctx.world_size)
    else:
        sharing = len(range(ctx.device.index, ctx.world_size, torch.cuda.device_count()))
        assert ctx.ranks_on_device == sharing, (ctx.ranks_on_device, sharing, torch.cuda.device_count())
    out = ctx.zeros(BLOCK, dtype=torch.float32)
    compiled = fill_local[(1,)](out, 3.0, BLOCK)
    assert out.tolist() == [3.0] * BLOCK
    if ctx.backend == "cpu":
        assert ctx.resident_grid(1000, compiled) == 1000  # the interpreter: any grid
    else:
        props = torch.cuda.get_device_properties(ctx.device)
        sms = props.multi_processor_count
        # one rank per GPU: every SM full; ranks sharing a GPU: one waiting program per SM in all
        # (IRIS_GPU_RANKS: the ranks of every job that share it, when jobs run side by side)
        sharers = max(ctx.ranks_on_device, int(os.environ.get("IRIS_GPU_RANKS") or 0))
        fits = programs_per_sm(compiled, ctx.device) * sms if sharers == 1 else sms // sharers
        grid = ctx.resident_grid(10**6, compiled)
        assert grid == fits, (grid, fits, ctx.ranks_on_device)
        assert ctx.comm.allgather(grid) == [grid] * ctx.world_size, "ranks got different grids"
        assert ctx.resident_grid(3, compiled) == 3
        expect_error(IrisUsageError, lambda: ctx.resident_grid(5, fill_local),
                     "resident_grid(): got JITFunction, not a compiled Triton kernel", "kernel[grid](...)")
    for bad in (0, -1, True, 2.0, "4"):
        expect_error(IrisUsageError, lambda: ctx.resident_grid(bad, compiled),
                     f"resident_grid(num_work={bad!r}): pass a positive int")
    ctx.free(out)


def scenario_heap_bases(ctx):
    n = ctx.world_size
    bases = ctx.get_heap_bases()
    assert bases.dtype == torch.int64 and tuple(bases.shape) == (n,), bases
    mine = bases.tolist()
    # Addresses are per process, so the lists differ; each rank's own entry is its heap's address.
    assert mine[ctx.rank] == ctx._buffer.data_ptr(), (mine, hex(ctx._buffer.data_ptr()))
    assert all(b % 256 == 0 for b in mine), [hex(b) for b in mine]
    ordered = sorted(mine)
    assert all(b - a >= ctx.heap_size for a, b in itertools.pairwise(ordered)), "heaps overlap in this process"
    everyone = ctx.comm.allgather(mine)
    assert len(everyone) == n and all(len(row) == n for row in everyone)
    own_bases = [row[r] for r, row in enumerate(everyone)]
    assert own_bases == ctx.comm.allgather(ctx._buffer.data_ptr())
    if ctx.backend == "cpu":
        # Host-addressable heaps: read each peer's heap through our mapping of it.
        marker = ctx.full((4,), 1000 + ctx.rank, dtype=torch.int64)
        offset = symmetric_offset(ctx, marker, "marker")
        ctx.barrier()
        for peer in range(n):
            seen = (ctypes.c_int64 * 4).from_address(mine[peer] + offset)
            assert list(seen) == [1000 + peer] * 4, (peer, list(seen))
        ctx.barrier()
        ctx.free(marker)


def scenario_heap_files_unlinked(ctx):
    files = job_files(ctx)
    if ctx.backend == "cpu":
        assert len(files) == ctx.world_size
        assert ctx.comm.allgather(files) == [files] * ctx.world_size, "ranks disagree on the job's file names"
        left = [p for p in files if os.path.exists(p)]
        assert not left, f"shared-memory files still exist after start-up: {left}"
    if ctx.rank == 0:
        print("CHECK heap-files " + " ".join(files), flush=True)


def scenario_device_context(ctx):
    n = ctx.world_size
    context = ctx.get_device_context()
    assert context.dtype == torch.int64 and context.device.type == ctx.device.type
    assert tuple(context.shape) == (layout.context_length(n),), context.shape
    words = context.tolist()
    assert words[layout.CUR_RANK] == ctx.rank and words[layout.NUM_RANKS] == n, words
    assert words[layout.HEAP_BASES:layout.HEAP_BASES + n] == ctx.get_heap_bases().tolist()
    trailer = layout.HEAP_BASES + n
    assert words[trailer + layout.HEAP_SIZE] == ctx.heap_size, (words, ctx.heap_size)
    assert words[trailer + layout.TRACE_ENABLED] == 0, "tracing is off until enabled"
    # heap_bases is a view of the context: the device layer finds num_ranks just before it.
    bases = ctx.get_heap_bases()
    assert bases.data_ptr() == context.data_ptr() + 8 * layout.HEAP_BASES


def scenario_kernels_write_every_peer(ctx):
    n, world, rank = BLOCK, ctx.world_size, ctx.rank
    offs = torch.arange(n, device=ctx.device)
    heap_bases = ctx.get_heap_bases()
    inbox = ctx.full((world * n,), -1.0, dtype=torch.float32)   # poisoned: a lost write shows
    inbox_put = ctx.full((world * n,), -1.0, dtype=torch.float32)
    inbox_ctx = ctx.full((world * n,), 12345, dtype=torch.int32)
    src = ctx.zeros(n, dtype=torch.float32)
    src.copy_(rank * 10.0 + offs + 0.5)
    for t, what in ((inbox, "inbox"), (inbox_put, "inbox_put"), (inbox_ctx, "inbox_ctx"), (src, "src")):
        symmetric_offset(ctx, t, what)
    ctx.barrier()  # every poison written before anyone writes into peers

    store_to_every_peer[(1,)](inbox, n, rank, heap_bases, world, BLOCK)
    put_to_every_peer[(1,)](src, inbox_put, n, rank, heap_bases, world, BLOCK)
    context_store_to_every_peer[(1,)](ctx.get_device_context(), inbox_ctx, n, rank, world, BLOCK)
    ctx.barrier()  # device work done here and on every peer

    for peer in range(world):
        rows = slice(peer * n, (peer + 1) * n)
        same(inbox[rows], (peer * 1000 + offs).to(torch.float32), f"store from rank {peer}")
        same(inbox_put[rows], (peer * 10.0 + offs + 0.5).to(torch.float32), f"put from rank {peer}")
        same(inbox_ctx[rows], (-(peer + 1) * offs).to(torch.int32), f"DeviceContext.store from rank {peer}")

    gathered = torch.full((world * n,), -1.0, dtype=torch.float32, device=ctx.device)  # local, not on the heap
    load_from_every_peer[(1,)](src, gathered, n, rank, heap_bases, world, BLOCK)
    ctx.barrier()
    for peer in range(world):
        same(gathered[peer * n:(peer + 1) * n], (peer * 10.0 + offs + 0.5).to(torch.float32), f"load from {peer}")
    for t in (inbox, inbox_put, inbox_ctx, src):
        ctx.free(t)


def scenario_factories(ctx):
    dev = ctx.device
    live = []

    def sym(t, what):
        symmetric_offset(ctx, t, what)
        live.append(t)
        return t

    # shapes: ints, a tuple, a list, torch.Size, 0-d and empty
    same(sym(ctx.zeros(2, 3), "zeros(2, 3)"), torch.zeros(2, 3), "zeros(2, 3)")
    same(sym(ctx.zeros((2, 3), dtype=torch.int32), "zeros tuple"), torch.zeros(2, 3, dtype=torch.int32), "zeros tuple")
    same(sym(ctx.ones([4], dtype=torch.float16), "ones list"), torch.ones(4, dtype=torch.float16), "ones list")
    same(sym(ctx.ones(torch.Size([2, 2]), dtype=torch.bfloat16), "ones Size"),
         torch.ones(2, 2, dtype=torch.bfloat16), "ones Size")
    same(sym(ctx.zeros(()), "zeros 0-d"), torch.zeros(()), "zeros 0-d")
    same(sym(ctx.zeros(0, dtype=torch.int64), "zeros empty"), torch.zeros(0, dtype=torch.int64), "zeros empty")
    e = sym(ctx.empty(3, 5, dtype=torch.float64), "empty")
    assert e.shape == (3, 5) and e.dtype == torch.float64 and e.is_contiguous()

    # full: dtype inferred from the value as torch does
    same(sym(ctx.full((3,), 7), "full int"), torch.full((3,), 7), "full int")
    same(sym(ctx.full((2, 2), 2.5), "full float"), torch.full((2, 2), 2.5), "full float")
    same(sym(ctx.full((2,), True), "full bool"), torch.full((2,), True), "full bool")
    same(sym(ctx.full((2,), -3, dtype=torch.int8), "full int8"), torch.full((2,), -3, dtype=torch.int8), "full int8")

    # arange / linspace
    same(sym(ctx.arange(5), "arange(5)"), torch.arange(5), "arange(5)")
    same(sym(ctx.arange(1, 10, 3), "arange(1,10,3)"), torch.arange(1, 10, 3), "arange(1, 10, 3)")
    same(sym(ctx.arange(0.0, 1.0, 0.25), "arange float"), torch.arange(0.0, 1.0, 0.25), "arange float")
    same(sym(ctx.arange(6, dtype=torch.int16), "arange int16"), torch.arange(6, dtype=torch.int16), "arange int16")
    same(sym(ctx.linspace(-1, 1, 9), "linspace"), torch.linspace(-1, 1, 9), "linspace")
    same(sym(ctx.linspace(0, 10, 5, dtype=torch.float64), "linspace f64"),
         torch.linspace(0, 10, 5, dtype=torch.float64), "linspace f64")

    # random factories: with a seeded generator they equal torch's own with the same seed
    same(sym(ctx.rand(3, 5, generator=gen(ctx, 11)), "rand"),
         torch.rand(3, 5, generator=gen(ctx, 11), device=dev), "rand(generator)")
    same(sym(ctx.randn(4, 4, generator=gen(ctx, 12), dtype=torch.float64), "randn"),
         torch.randn(4, 4, generator=gen(ctx, 12), device=dev, dtype=torch.float64), "randn(generator)")
    same(sym(ctx.randint(-5, 5, (6, 2), generator=gen(ctx, 13)), "randint"),
         torch.randint(-5, 5, (6, 2), generator=gen(ctx, 13), device=dev), "randint(generator)")
    same(sym(ctx.randint(9, (7,), generator=gen(ctx, 14), dtype=torch.int32), "randint(high, size)"),
         torch.randint(9, (7,), generator=gen(ctx, 14), device=dev, dtype=torch.int32), "randint(high, size)")
    ref = torch.empty(8, device=dev).uniform_(-2.0, 3.0, generator=gen(ctx, 15))
    same(sym(ctx.uniform(-2.0, 3.0, (8,), generator=gen(ctx, 15)), "uniform"), ref, "uniform(generator)")
    # unseeded: only the range can be checked
    r = sym(ctx.rand(64), "rand unseeded")
    assert r.dtype == torch.float32 and bool(((r >= 0) & (r < 1)).all())
    ri = sym(ctx.randint(3, 7, (64,)), "randint unseeded")
    assert ri.dtype == torch.int64 and bool(((ri >= 3) & (ri < 7)).all())
    assert bool(torch.isfinite(sym(ctx.randn(64), "randn unseeded")).all())

    # *_like: shape and dtype of the model, on the heap, whatever the model is on
    model = sym(ctx.arange(6, dtype=torch.float32).reshape(2, 3), "model")
    plain = torch.ones(3, 2, dtype=torch.float64)  # not on the heap
    same(sym(ctx.zeros_like(model), "zeros_like"), torch.zeros(2, 3), "zeros_like")
    same(sym(ctx.zeros_like(plain, dtype=torch.int16), "zeros_like dtype"),
         torch.zeros(3, 2, dtype=torch.int16), "zeros_like(dtype=)")
    same(sym(ctx.ones_like(plain), "ones_like"), torch.ones(3, 2, dtype=torch.float64), "ones_like")
    same(sym(ctx.full_like(model, 2.5), "full_like"), torch.full((2, 3), 2.5), "full_like")
    el = sym(ctx.empty_like(plain), "empty_like")
    assert el.shape == (3, 2) and el.dtype == torch.float64
    rl = sym(ctx.rand_like(model), "rand_like")
    assert rl.shape == (2, 3) and rl.dtype == torch.float32 and bool(((rl >= 0) & (rl < 1)).all())
    nl = sym(ctx.randn_like(plain), "randn_like")
    assert nl.shape == (3, 2) and nl.dtype == torch.float64 and bool(torch.isfinite(nl).all())
    int_model = sym(ctx.zeros(5, dtype=torch.int32), "int model")
    il = sym(ctx.randint_like(int_model, 3, 9), "randint_like")
    assert il.dtype == torch.int32 and il.shape == (5,) and bool(((il >= 3) & (il < 9)).all())
    il2 = sym(ctx.randint_like(int_model, 4), "randint_like(high)")
    assert bool(((il2 >= 0) & (il2 < 4)).all())

    # requires_grad is passed on
    assert sym(ctx.zeros(3, requires_grad=True), "zeros grad").requires_grad
    # device= naming the heap's device is accepted
    sym(ctx.zeros(2, device=ctx.device.type), "zeros device=")

    # as_symmetric copies (non-contiguous input too); is_symmetric tells heap from not
    source = torch.arange(12, dtype=torch.float32, device=dev).reshape(3, 4).t()
    copy = sym(ctx.as_symmetric(source), "as_symmetric")
    same(copy, source.contiguous(), "as_symmetric values")
    assert copy.is_contiguous() and copy.data_ptr() != source.data_ptr()
    assert ctx.is_symmetric(copy) and ctx.is_symmetric(copy[1:]) and ctx.is_symmetric(copy.t())
    assert not ctx.is_symmetric(source) and not ctx.is_symmetric(torch.zeros(3, device=dev))
    assert not ctx.is_symmetric([1, 2, 3])

    # every dtype the heap supports allocates, symmetric
    for dtype in iris.runtime.SUPPORTED_DTYPES:
        t = sym(ctx.zeros(3, dtype=dtype), f"zeros({dtype})")
        assert t.dtype == dtype and t.shape == (3,)

    # release everything: offsets stay symmetric and the heap is whole again
    before = ctx.heap_free_bytes
    for t in live:
        ctx.free(t)
    assert ctx.heap_free_bytes > before
    assert ctx.comm.allgather(ctx.heap_free_bytes) == [ctx.heap_free_bytes] * ctx.world_size


def scenario_amd_iris_style(ctx):
    """Kernels and host code written as AMD Iris's tests and docs write them (amd_iris_style.py):
    every RMA call and atomic, free and bound, the free get in both rank orders, through
    ``import iris.runtime.amd_iris as iris``; values checked on every rank."""
    amd_iris_style.run()


def scenario_free_reuse(ctx):
    with iris.runtime.iris(heap_size=1 << 20) as heap:
        total = heap.heap_free_bytes
        assert total == heap.heap_size
        f32 = torch.float32
        a, b, c = heap.zeros(100, dtype=f32), heap.zeros(1000, dtype=f32), heap.zeros(10, dtype=f32)
        oa, ob, oc = (symmetric_offset(heap, t, w) for t, w in ((a, "a"), (b, "b"), (c, "c")))
        assert (oa, ob, oc) == (0, 512, 512 + 4096), (oa, ob, oc)  # first fit, 256-byte rounding
        heap.free(b)
        d = heap.zeros(500, dtype=f32)               # 2000 B fits the 4096 B hole b left
        assert symmetric_offset(heap, d, "d") == ob
        e = heap.zeros(1000, dtype=f32)              # 4000 B no longer fits the 2048 B left there
        assert symmetric_offset(heap, e, "e") == oc + 256
        heap.free(a)
        heap.free(d)                                  # a + d + the rest of b's hole merge
        f = heap.zeros((512 + 4096) // 4, dtype=f32)  # exactly the merged hole
        assert symmetric_offset(heap, f, "f") == 0
        for t in (c, e, f):
            heap.free(t)
        assert heap.heap_free_bytes == total
        # the same sequence again gives the same offsets: reuse is deterministic
        g = heap.zeros(100, dtype=f32)
        assert symmetric_offset(heap, g, "g") == 0
        heap.free(g)
        del a, b, c, d, e, f, g


def scenario_broadcast(ctx):
    n, rank = ctx.world_size, ctx.rank
    for src in range(n):
        obj = {"from": src, "items": list(range(src + 3)), "text": "é"} if rank == src else None
        assert ctx.broadcast(obj, src=src) == {"from": src, "items": list(range(src + 3)), "text": "é"}
    assert ctx.broadcast("default root" if rank == 0 else None) == "default root"
    heap_t = ctx.arange(16, dtype=torch.float32)
    heap_t.mul_(rank + 1)
    for src in range(n):
        got = ctx.broadcast(heap_t[4:8] if rank == src else None, src=src)
        same(got, (src + 1) * torch.arange(4, 8, dtype=torch.float32), f"tensor from rank {src}")
        assert got.device.type == ctx.device.type
        # a compact copy: neither the whole heap shipped, nor an alias of the sender's heap
        assert got.untyped_storage().nbytes() == 16, got.untyped_storage().nbytes()
        assert not ctx.is_symmetric(got)
    ctx.free(heap_t)


def scenario_barrier(ctx):
    delay = 0.3
    if ctx.rank == 0:
        time.sleep(delay)
    start = time.monotonic()
    ctx.barrier()
    waited = time.monotonic() - start
    if ctx.rank != 0:
        assert waited >= delay * 0.5, f"rank {ctx.rank} left the barrier after {waited:.3f} s, before rank 0 came"


def scenario_logging(ctx):
    # The launch sets IRIS_LOG_LEVEL=INFO; the pytest side checks these lines carry [rank/N].
    logger.info("marker from rank %d", ctx.rank)
    iris.runtime.set_log_level("WARNING")
    logger.info("this line must not appear")
    logger.warning("warning from rank %d", ctx.rank)
    iris.runtime.set_log_level("INFO")
    expect_error(IrisUsageError, lambda: iris.runtime.set_log_level("LOUD"), "LOUD", "INFO")
    sys.stderr.flush()


def scenario_errors(ctx):
    n = ctx.world_size
    size = ctx.heap_size
    free = ctx.heap_free_bytes
    text = expect_error(HeapExhaustedError, lambda: ctx.zeros(size // 4 + 1, dtype=torch.float32),
                        f"zeros({size // 4 + 1}, dtype=float32)", "needs", "free of", "heap_size=", str(size))
    assert isinstance(HeapExhaustedError(text), MemoryError)
    assert ctx.heap_free_bytes == free, "a failed allocation must not take space"

    expect_error(UnsupportedDtypeError, lambda: ctx.zeros(4, dtype=torch.complex64), "complex64", "float32")
    expect_error(UnsupportedDtypeError, lambda: ctx.as_symmetric(torch.zeros(2, dtype=torch.complex64)), "complex64")
    expect_error(UnsupportedDtypeError, lambda: ctx.full((2,), 1 + 2j), "complex")

    plain = torch.zeros(4, device=ctx.device)
    expect_error(NotOnHeapError, lambda: ctx.require_symmetric(plain, "my_kernel_launch"), "my_kernel_launch",
                 "as_symmetric")
    expect_error(NotOnHeapError, lambda: ctx.free(plain), "free", "symmetric heap")
    expect_error(NotOnHeapError, lambda: ctx.offset_of(plain), "offset_of")
    t = ctx.zeros(8)
    expect_error(IrisUsageError, lambda: ctx.free(t[2:]), "view")
    ctx.free(t)
    expect_error(IrisUsageError, lambda: ctx.free(t), "freed twice")

    for bad in (n, -1, "0", 1.0, True):
        expect_error(RankError, lambda bad=bad: ctx.broadcast("x", src=bad), f"src={bad!r}", f"[0, {n})")
    ctx.barrier()  # a rejected broadcast sends nothing: the ranks are still in step
    assert ctx.broadcast(ctx.rank, src=n - 1) == n - 1


def scenario_verify_allocation_order(ctx):
    n = ctx.world_size
    checked = iris.runtime.iris(heap_size=1 << 20, verify=True)
    checked.zeros(16)                     # the same on every rank: fine
    checked.barrier()
    if ctx.rank == n - 1:
        odd = checked.ones(8, dtype=torch.int32)
    else:
        odd = checked.zeros(4)
    if n == 1:
        checked.barrier()                 # one rank cannot disagree with itself
    else:
        expect_error(SymmetryError, checked.barrier, "barrier(verify=True)", "rank 0", "zeros(4, dtype=float32)",
                     f"rank {n - 1}", "ones(8, dtype=int32)")
        # frees are checked too (each rank names what it freed), and a clean interval passes again
        checked.free(odd)
        expect_error(SymmetryError, checked.barrier, "free(zeros(4, dtype=float32)", "free(ones(8, dtype=int32)")
        checked.barrier()
    checked.close()
    del odd


def scenario_registered_tensors(ctx):
    # A tensor registered on every rank: every rank's copy lies at a different heap offset (cpu
    # backend) or anywhere on the device (cuda: a plain torch tensor, over CUDA IPC). Loads
    # through registration.bases read each peer's copy; the table has the context's layout.
    W, rank, dev = ctx.world_size, ctx.rank, ctx.device
    n = BLOCK
    pad = ctx.zeros(64 * (rank + 1), dtype=torch.float32)  # 256 B per rank: the offsets differ
    if dev.type == "cuda":
        mine = torch.empty(n, dtype=torch.float32, device=dev)
    else:
        mine = ctx.zeros(n, dtype=torch.float32)
    mine.copy_(rank * 100.0 + torch.arange(n, dtype=torch.float32, device=dev))
    before = ctx.registrations_generation
    with ctx.register(mine) as registration:
        assert ctx.registrations_generation == before + 1
        assert registration.nbytes == 4 * n and registration.addresses[rank] == mine.data_ptr()
        assert ctx.registration_of(mine) is registration and ctx.registration_of(mine[8:16]) is registration
        assert ctx.registration_of(pad) is None and ctx.registration_of(torch.zeros(n, device=dev)) is None
        assert ctx.comm.allgather(registration.serial) == [registration.serial] * W, "serials differ between ranks"
        assert ctx.quick_allgather is (ctx.bootstrap == "mpi")
        # ctx.reach agrees on it: the registered tensor, and a view at the same place on every rank
        reached = ctx.reach([mine, mine[8:16]])
        assert [r.ident for r in reached] == [("registered", (registration.serial, 0)),
                                              ("registered", (registration.serial, 32))], reached
        assert all(r.in_place and r.bases.data_ptr() == registration.bases.data_ptr() for r in reached)
        if W > 1:
            # views of it at another place, or of another size, on each rank: no table reaches them
            # (the registration's would give each peer this rank's offset: the wrong elements), so
            # every rank stages them
            moved, sized = mine[8 * rank:8 * rank + 8], mine[:8 * (rank + 1)]
            assert [r.ident for r in ctx.reach([moved, sized])] == [("staged",), ("staged",)], (
                "views at different offsets or of different sizes on different ranks must be staged")
        words = registration.table.cpu().tolist()
        assert words[layout.CUR_RANK] == rank and words[layout.NUM_RANKS] == W
        assert words[layout.HEAP_BASES:layout.HEAP_BASES + W] == registration.addresses
        assert words[layout.HEAP_BASES + W + layout.HEAP_SIZE] == 4 * n
        if dev.type != "cuda":
            offsets = ctx.comm.allgather(ctx.offset_of(mine))
            assert len(set(offsets)) == W, f"the test wants different offsets per rank: {offsets}"
        gathered = torch.full((W * n,), -1.0, dtype=torch.float32, device=dev)
        ctx.barrier()
        load_from_every_peer[(1,)](mine, gathered, n, rank, registration.bases, W, BLOCK)
        ctx.barrier()
        for peer in range(W):
            same(gathered[peer * n:(peer + 1) * n], peer * 100.0 + torch.arange(n, dtype=torch.float32),
                 f"load through the registration from rank {peer}")
    assert registration.closed and ctx.registration_of(mine) is None
    assert ctx.registrations_generation == before + 2
    registration.close()  # idempotent
    # errors name the call and the fix, on every rank alike
    expect_error(IrisUsageError, lambda: ctx.register(mine[1:]), "register()", f"rank {rank}'s tensor",
                 "256-byte boundary")
    expect_error(IrisUsageError, lambda: ctx.register(torch.zeros(4, 4, device=dev).t()), "contiguous")
    if W > 1:  # one rank's problem is every rank's error: no rank waits in the exchange
        expect_error(IrisUsageError, lambda: ctx.register(mine[1:] if rank == W - 1 else mine),
                     f"rank {W - 1}'s tensor starts at")
    odd = ctx.zeros(64 * (1 + rank % 2), dtype=torch.float32)  # the sizes differ between ranks
    if W > 1:
        expect_error(IrisUsageError, lambda: ctx.register(odd), "differ in size", "rank 1: 512 B", "same size")
    if dev.type != "cuda":
        expect_error(IrisUsageError, lambda: ctx.register(torch.zeros(n, device=dev)), "not on the symmetric heap",
                     "ctx.zeros()")
    ctx.barrier()
    for t in (odd, mine, pad) if dev.type != "cuda" else (odd, pad):
        ctx.free(t)


def scenario_close_and_reopen(ctx):
    n, rank = ctx.world_size, ctx.rank
    second = iris.runtime.iris(heap_size=1 << 20)
    files = job_files(second)
    job = os.path.basename(files[0]).rsplit("-", 1)[0] if files else None
    inbox = second.full((n * BLOCK,), -1.0, dtype=torch.float32)
    second.barrier()
    store_to_every_peer[(1,)](inbox, BLOCK, rank, second.get_heap_bases(), n, BLOCK)
    second.barrier()
    same(inbox.view(n, BLOCK)[:, 0], torch.arange(n, dtype=torch.float32) * 1000, "second heap")
    # each context has its own uid, which finds it while it is open
    assert isinstance(second.uid, int) and second.uid != ctx.uid, (ctx.uid, second.uid)
    assert iris.runtime.context_of_uid(second.uid) is second and iris.runtime.context_of_uid(ctx.uid) is ctx
    del inbox
    gc.collect()
    second.close()
    second.close()  # idempotent
    assert iris.runtime.context_of_uid(second.uid) is None  # closed
    assert iris.runtime.context_of_uid(10**9) is None and iris.runtime.context_of_uid("1") is None
    expect_error(IrisUsageError, lambda: second.zeros(1), "closed", "iris.runtime.iris()")
    if job is not None:
        assert not [p for p in files if os.path.exists(p)], files
        with open("/proc/self/maps") as maps:
            still = [line.strip() for line in maps if job in line]
        assert not still, f"closed heap still mapped: {still}"
    # MPI stays usable, and so does the first Iris
    assert ctx.comm.allreduce(rank) == n * (n - 1) // 2
    with iris.runtime.iris(heap_size=1 << 20) as third:
        assert third.uid > second.uid  # never reused
        x = third.full((4,), float(rank))
        symmetric_offset(third, x, "third heap")
        third.barrier()
        del x
    y = ctx.ones(4)
    symmetric_offset(ctx, y, "first heap after the others closed")
    ctx.free(y)


if __name__ == "__main__":
    iris.runtime.testing.run_scenarios(globals(), heap_size=1 << 22)
