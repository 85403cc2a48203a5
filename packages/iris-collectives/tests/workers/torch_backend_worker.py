"""Scenarios of the ``iris`` torch.distributed backend, run by test_torch_backend.py under torchrun and
under mpirun: ``worker.py BACKEND scenario ...`` initialises the default group with ``BACKEND``
(``iris`` or ``cuda:iris,cpu:gloo``), runs each scenario, then destroys the group.

The scenarios are a faithful subset of what torch documents for its collectives (and tests in
its own distributed test suite): results of every op and dtype, in-place and list forms, the two
layouts of ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` (concatenated and stacked), empty
and 0-dim tensors, ``async_op=True`` works (``wait``, ``is_completed``, ``get_future``), object
collectives, ``new_group``, and the errors: calls the backend cannot make raise an
``IrisUnsupportedError`` naming what is missing, never a wrong answer or a hang. Every value is a
small integer (or a sum of powers of two), so every result compares exactly.
"""

from __future__ import annotations

import faulthandler
import sys
import time

import torch
import torch.distributed as dist

import iris.collectives.distributed as idist
import iris.runtime
from iris.runtime import IrisUnsupportedError, IrisUsageError, UnsupportedDtypeError
from iris.runtime.testing import expect_error

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
DTYPES = (*FLOATS, torch.int32, torch.int64)


def pattern(shape, rank: int, dtype, device, seed: int = 0) -> torch.Tensor:
    """Rank ``rank``'s values: small integers, the same wherever they are made."""
    n = 1
    for s in shape:
        n *= s
    values = (torch.arange(n) * (seed + 3) + 5 * rank + seed) % 7 - 2
    return values.reshape(shape).to(dtype).to(device)


def same(actual, expected, what):
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype}, expected {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    assert torch.equal(actual.cpu(), expected.cpu()), f"{what}: {actual.cpu()} != {expected.cpu()}"


def reduce_all(op, tensors):
    stack = torch.stack([t.double() for t in tensors])
    if op == dist.ReduceOp.SUM:
        return stack.sum(0)
    if op == dist.ReduceOp.AVG:
        return stack.mean(0)
    if op == dist.ReduceOp.MAX:
        return stack.max(0).values
    if op == dist.ReduceOp.MIN:
        return stack.min(0).values
    return stack.prod(0)


# --- the group ------------------------------------------------------------------------------------------

#: the backend string this job passed to init_process_group
ASKED_BACKEND = "iris"


def scenario_ranks(ctx):
    W, r = dist.get_world_size(), dist.get_rank()
    assert (r, W) == (ctx.rank, ctx.world_size), (r, W, ctx)
    # "iris" for one backend on every device; torch 2.11 names the devices' backends when they differ
    assert dist.get_backend() in ("iris", ASKED_BACKEND), (dist.get_backend(), ASKED_BACKEND)
    assert isinstance(dist.group.WORLD, idist.IrisProcessGroup), dist.group.WORLD
    assert dist.group.WORLD.name() == "iris"
    assert idist.context_of() is ctx
    if r == 0:
        print(f"CHECK backend-config {dist.get_backend_config()}", flush=True)
        print(f"CHECK heap-size {ctx.heap_size} bootstrap {ctx.bootstrap}", flush=True)


# --- all_reduce -----------------------------------------------------------------------------------------

def scenario_all_reduce_ops(ctx):
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    ops = (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT)
    cases = [(dtype, op) for dtype in DTYPES for op in ops if op != dist.ReduceOp.AVG or dtype.is_floating_point]
    for dtype, op in iris.runtime.testing.spread(cases, W):
        for shape in ((37,), (3, 5), ()):
            t = pattern(shape, r, dtype, dev, seed=2)
            out = dist.all_reduce(t, op=op)
            assert out is None  # sync: nothing returned, the result in place
            expected = reduce_all(op, [pattern(shape, p, dtype, "cpu", seed=2) for p in range(W)]).to(dtype)
            same(t, expected, f"all_reduce {op} {dtype} {shape}")
    # integers: the mean would truncate; ccl refuses on every rank alike
    expect_error(lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32, device=dev), op=dist.ReduceOp.AVG),
                 IrisUsageError, "op='avg'", "float dtype")


def scenario_all_reduce_edges(ctx):
    dev, W = ctx.device, ctx.world_size
    empty = torch.empty(0, device=dev)
    dist.all_reduce(empty)  # torch allows empty tensors: nothing to do
    assert empty.numel() == 0
    # a view into a larger tensor, contiguous: only its elements change
    big = torch.zeros(10, device=dev)
    dist.all_reduce(big[2:5].fill_(1.0))
    same(big.cpu(), torch.tensor([0, 0, W, W, W, 0, 0, 0, 0, 0], dtype=torch.float32), "view")
    matrix = torch.ones(4, 4, device=dev)
    expect_error(lambda: dist.all_reduce(matrix[:, 1]), IrisUsageError, "is not contiguous")
    expect_error(lambda: dist.all_reduce(torch.ones(3, dtype=torch.uint8, device=dev)), UnsupportedDtypeError,
                 "torch.uint8")
    expect_error(lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32, device=dev), op=dist.ReduceOp.BAND),
                 IrisUnsupportedError, "BAND", "gloo")
    if hasattr(dist, "_make_nccl_premul_sum"):
        premul = dist._make_nccl_premul_sum(2.0)
        expect_error(lambda: dist.all_reduce(torch.ones(3, device=dev), op=premul), IrisUnsupportedError, "PREMUL_SUM")
    # back to back, no barrier, new values each time
    x = torch.empty(1000, device=dev)
    for step in range(4):
        x.fill_(step + ctx.rank)
        dist.all_reduce(x)
        assert torch.all(x == W * step + W * (W - 1) // 2), (step, x)
    # a coalesced all_reduce: one ccl call per tensor
    if hasattr(dist, "all_reduce_coalesced"):
        ts = [torch.full((5,), float(ctx.rank + 1), device=dev), torch.full((2, 3), 2.0, device=dev)]
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecated in torch, still documented
            dist.all_reduce_coalesced(ts)
        same(ts[0], torch.full((5,), float(W * (W + 1) // 2)), "coalesced 0")
        same(ts[1], torch.full((2, 3), 2.0 * W), "coalesced 1")


# --- gathers --------------------------------------------------------------------------------------------

def scenario_all_gather(ctx):
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool, torch.int8):
        for shape in ((3,), (2, 5), (), (7,)):  # 7 uint8/bool/int8: bytes that are not whole words
            t = pattern(shape, r, torch.int64, dev, seed=1).to(dtype)
            outs = [torch.full(shape, 9, device=dev).to(dtype) for _ in range(W)]
            dist.all_gather(outs, t)
            for p in range(W):
                same(outs[p], pattern(shape, p, torch.int64, "cpu", seed=1).to(dtype), f"all_gather {dtype} {p}")
    # the tensor form: every rank's input concatenated along dim 0, or stacked
    inp = pattern((3, 4), r, torch.float32, dev)
    everyone = [pattern((3, 4), p, torch.float32, "cpu") for p in range(W)]
    cat = torch.empty(3 * W, 4, device=dev)
    dist.all_gather_into_tensor(cat, inp)
    same(cat, torch.cat(everyone), "all_gather_into_tensor, concatenated")
    stacked = torch.empty(W, 3, 4, device=dev)
    work = dist.all_gather_into_tensor(stacked, inp, async_op=True)
    assert work.wait() is True
    same(stacked, torch.stack(everyone), "all_gather_into_tensor, stacked")
    expect_error(lambda: dist.all_gather_into_tensor(torch.empty(3 * W + 1, 4, device=dev), inp), IrisUsageError,
                 "output has", f"with {W} ranks")
    odd = torch.tensor([r + 1, 2 * r + 1, 3], dtype=torch.uint8, device=dev)  # 3 bytes: padded words
    gathered = torch.empty(3 * W, dtype=torch.uint8, device=dev)
    dist.all_gather_into_tensor(gathered, odd)
    same(gathered, torch.tensor([v for p in range(W) for v in (p + 1, 2 * p + 1, 3)], dtype=torch.uint8),
         "uint8 padded")


def objects_travel(ctx) -> bool:
    """Whether torch's object collectives can run: they move CPU tensors, which on the GPU need
    a cpu:gloo backend beside iris."""
    return ctx.device.type != "cuda" or "cpu:gloo" in str(dist.get_backend_config())


def scenario_object_collectives(ctx):
    # pickled objects travel as uint8 tensors of any length (on the cpu backend, the iris backend's
    # own CPU tensors; on the GPU, with cpu:gloo, through gloo)
    W, r = ctx.world_size, ctx.rank
    if not objects_travel(ctx):
        if ctx.rank == 0:
            print("SKIP object_collectives: CPU tensors need backend='cuda:iris,cpu:gloo' when the context is on a GPU")
        return
    objects = [None] * W
    dist.all_gather_object(objects, {"rank": r, "name": "x" * (r + 3)})
    assert objects == [{"rank": p, "name": "x" * (p + 3)} for p in range(W)], objects
    box = [("from", r, list(range(r + 2)))]
    dist.broadcast_object_list(box, src=W - 1)
    assert box == [("from", W - 1, list(range(W + 1)))], box


# --- reduce_scatter -------------------------------------------------------------------------------------

def scenario_reduce_scatter(ctx):
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    for dtype in (torch.float32, torch.bfloat16, torch.int32):
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT):
            inp = pattern((W * 3, 2), r, dtype, dev, seed=4)
            full = reduce_all(op, [pattern((W * 3, 2), p, dtype, "cpu", seed=4) for p in range(W)]).to(dtype)
            out = torch.empty(3, 2, dtype=dtype, device=dev)
            dist.reduce_scatter_tensor(out, inp, op=op)
            same(out, full[3 * r:3 * (r + 1)], f"reduce_scatter_tensor {dtype} {op}")
            stacked = torch.empty(3, 2, dtype=dtype, device=dev)
            dist.reduce_scatter_tensor(stacked, inp.view(W, 3, 2), op=op)  # the stacked layout
            same(stacked, full[3 * r:3 * (r + 1)], f"reduce_scatter_tensor stacked {dtype} {op}")
            parts = [pattern((4,), r + 10 * p, dtype, dev, seed=5) for p in range(W)]
            one = torch.empty(4, dtype=dtype, device=dev)
            dist.reduce_scatter(one, parts, op=op)
            expected = reduce_all(op, [pattern((4,), q + 10 * r, dtype, "cpu", seed=5) for q in range(W)]).to(dtype)
            same(one, expected, f"reduce_scatter list {dtype} {op}")
    avg = torch.empty(2, device=dev)
    dist.reduce_scatter_tensor(avg, torch.arange(2 * W, dtype=torch.float32, device=dev) + r, op=dist.ReduceOp.AVG)
    same(avg, torch.arange(2 * r, 2 * r + 2, dtype=torch.float32) + (W - 1) / 2, "reduce_scatter_tensor avg")
    expect_error(lambda: dist.reduce_scatter_tensor(torch.empty(3, device=dev), torch.empty(3 * W + 1, device=dev)),
                 IrisUsageError, "input has")


# --- broadcast ------------------------------------------------------------------------------------------

def scenario_broadcast(ctx):
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    for src in range(W):
        for dtype in (torch.float32, torch.float16, torch.int64, torch.uint8, torch.bool):
            for shape in ((5,), (2, 3), ()):
                t = pattern(shape, r, torch.int64, dev, seed=src).to(dtype)
                dist.broadcast(t, src=src)
                same(t, pattern(shape, src, torch.int64, "cpu", seed=src).to(dtype), f"broadcast {src} {dtype}")
    t = torch.full((4,), float(r), device=dev)
    work = dist.broadcast(t, src=0, async_op=True)
    work.wait()
    same(t, torch.zeros(4), "async broadcast")


# --- all_to_all -----------------------------------------------------------------------------------------

def scenario_all_to_all(ctx):
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    for dtype in (torch.float32, torch.int64, torch.uint8):
        inp = (torch.arange(W * 2 * 3) + 100 * r).view(W * 2, 3).to(dtype).to(dev)
        out = torch.empty_like(inp)
        dist.all_to_all_single(out, inp)
        expected = torch.cat([(torch.arange(W * 2 * 3) + 100 * p).view(W * 2, 3)[2 * r:2 * r + 2] for p in range(W)])
        same(out, expected.to(dtype), f"all_to_all_single {dtype}")
        out.zero_()
        dist.all_to_all_single(out, inp, output_split_sizes=[2] * W, input_split_sizes=[2] * W)  # equal, explicit
        same(out, expected.to(dtype), f"all_to_all_single explicit splits {dtype}")
    ins = [torch.full((3,), float(10 * r + p), device=dev) for p in range(W)]
    outs = [torch.empty(3, device=dev) for _ in range(W)]
    dist.all_to_all(outs, ins)
    for p in range(W):
        same(outs[p], torch.full((3,), float(10 * p + r)), f"all_to_all list from {p}")
    # uneven splits (ccl.all_to_all_v): rank p sends 1 + (p + q) % 3 rows of 2 values to rank q,
    # so the ranks' inputs and outputs have different numbers of rows; dtypes ccl moves and bytes
    # that make whole words (uint8 rows of 4), a rank that sends nothing, and every rank at once
    def sent(p, q):
        return 0 if p == W - 1 and W > 2 else 1 + (p + q) % 3

    def rows_from(p, q, dtype, width):  # what rank p sends rank q
        n = sent(p, q)
        start = sum(sent(p, k) for k in range(q))
        return ((torch.arange(start * width, (start + n) * width) + 50 * p) % 97).view(n, width).to(dtype)

    for dtype, width in ((torch.float32, 2), (torch.bfloat16, 2), (torch.int64, 2), (torch.uint8, 4)):
        sends = [sent(r, q) for q in range(W)]
        receives = [sent(p, r) for p in range(W)]
        inp = torch.cat([rows_from(r, q, dtype, width) for q in range(W)]).to(dev)
        out = torch.full((sum(receives), width), 7, dtype=dtype, device=dev)
        dist.all_to_all_single(out, inp, receives, sends)
        same(out, torch.cat([rows_from(p, r, dtype, width) for p in range(W)]), f"all_to_all_single uneven {dtype}")
    if W > 1:
        # only the last rank sends (and keeps) 5 rows to itself: the other ranks' own splits look
        # equal, and they must take the uneven path too, not wait in all_to_all for the last rank
        splits = [2] * W if r < W - 1 else [2] * (W - 1) + [5]
        inp = (torch.arange(sum(splits)) + 100 * r).float().to(dev)
        out = torch.empty(2 * (W - 1) + splits[r], device=dev)
        dist.all_to_all_single(out, inp, [2] * (W - 1) + [splits[r]], splits)
        expected = [torch.arange(2 * r, 2 * r + (5 if p == r == W - 1 else 2)).float() + 100 * p for p in range(W)]
        same(out, torch.cat(expected), "all_to_all_single, uneven on the last rank alone")
        # a rank whose splits do not add up raises, and so does every other (no rank waits for it)
        splits = [2] * W if r < W - 1 else [2] * (W - 1) + [5]
        inp = torch.zeros(2 * W, device=dev)
        expect_error(lambda: dist.all_to_all_single(torch.empty_like(inp), inp, splits, splits), IrisUsageError,
                     "input_split_sizes=", f"rank {W - 1}" if r < W - 1 else "this rank")
        odd = torch.zeros(3, 3, dtype=torch.uint8, device=dev)  # rows of 3 bytes: not whole words
        three = [3] + [0] * (W - 1)  # uneven: all to rank 0
        expect_error(lambda: dist.all_to_all_single(torch.empty(3, 3, dtype=torch.uint8, device=dev), odd, three,
                                                    three), UnsupportedDtypeError, "rows of 3 bytes")
        sizes = [3] * W if r < W - 1 else [3] * (W - 1) + [4]
        expect_error(lambda: dist.all_to_all([torch.empty(n, device=dev) for n in sizes],
                                             [torch.empty(n, device=dev) for n in sizes]), IrisUnsupportedError,
                     "all_to_all_v")
    expect_error(lambda: dist.all_to_all_single(torch.empty(2 * W + 1, device=dev), torch.empty(2 * W + 1, device=dev)),
                 IrisUsageError, "not a multiple")


# --- barrier and works ----------------------------------------------------------------------------------

def scenario_barrier(ctx):
    # a rank that arrives late holds the others in dist.barrier() (the host waits)
    start = time.monotonic()
    if ctx.rank == 0:
        time.sleep(0.5)
    dist.barrier()
    waited = time.monotonic() - start
    assert waited >= 0.45, f"rank {ctx.rank} left the barrier after {waited:.2f} s, before rank 0 arrived"
    work = dist.barrier(async_op=True)
    assert work.wait() is True


def scenario_async_works(ctx):
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    xs = [torch.full((64,), float(r + k), device=dev) for k in range(3)]
    works = [dist.all_reduce(x, async_op=True) for x in xs]
    for k, (x, work) in enumerate(zip(xs, works)):
        assert isinstance(work, dist.Work), type(work)
        assert work.wait() is True
        if ctx.device.type != "cuda":
            assert work.is_completed()
        future = work.get_future()
        value = future.wait()
        assert isinstance(value, list) and value[0] is x, value
        same(x, torch.full((64,), float(W * (W - 1) // 2 + W * k)), f"async {k}")
        chained = future.then(lambda f: f.value()[0] * 2).wait()
        same(chained, torch.full((64,), float(2 * (W * (W - 1) // 2 + W * k))), f"then {k}")


def scenario_stream_order(ctx):
    """GPU: a call made on a side stream and waited for on the current one orders it (wait() makes
    the current stream wait for the call's); the side stream is kept busy so a missing order shows."""
    if ctx.device.type != "cuda":
        if ctx.rank == 0:
            print("SKIP stream_order: CUDA streams (GPU only)")
        return
    from iris.runtime.testing import busy_stream

    W, dev = ctx.world_size, ctx.device
    x = torch.full((1 << 16,), float(ctx.rank), device=dev)
    dist.all_reduce(x)  # plans built, kernels compiled
    torch.cuda.synchronize(dev)
    side = torch.cuda.Stream(dev)
    for step in range(3):
        x.fill_(float(ctx.rank + step))
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            busy_stream(ctx, 0.2)
            work = dist.all_reduce(x, async_op=True)
        work.wait()  # the current stream waits for the side stream's all_reduce, the host does not
        y = x.clone()
        same(y, torch.full_like(x, float(W * (W - 1) // 2 + W * step)).cpu(), f"stream order {step}")
        x.record_stream(side)


def scenario_cuda_graph(ctx):
    """GPU: dist.all_reduce captured in a CUDA graph after a first call, replayed with new data."""
    if ctx.device.type != "cuda":
        if ctx.rank == 0:
            print("SKIP cuda_graph: CUDA graphs (GPU only)")
        return
    W, dev = ctx.world_size, ctx.device
    x = torch.zeros(4096, device=dev)
    out = torch.empty(2 * 4096 * W, device=dev)
    graph_stream = torch.cuda.Stream(dev)
    graph_stream.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(graph_stream):
        dist.all_reduce(x)  # the first calls build the plans, on the stream the capture uses
        dist.all_gather_into_tensor(out[:4096 * W], x)
    torch.cuda.synchronize(dev)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=graph_stream):
        dist.all_reduce(x)
        dist.all_gather_into_tensor(out[:4096 * W], x)
    dist.barrier()  # no rank replays while another still captures
    for step in range(5):
        x.fill_(float(ctx.rank + step))
        graph.replay()
        total = float(W * (W - 1) // 2 + W * step)
        same(x, torch.full((4096,), total), f"graph all_reduce {step}")
        same(out[:4096 * W], torch.full((4096 * W,), total), f"graph all_gather {step}")
    torch.cuda.synchronize(dev)


# --- groups and configurations --------------------------------------------------------------------------

def scenario_new_group(ctx):
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    group = dist.new_group(backend="iris")  # all ranks: the same context
    assert isinstance(group, idist.IrisProcessGroup) and idist.context_of(group) is ctx
    t = torch.full((8,), float(r), device=dev)
    dist.all_reduce(t, group=group, op=dist.ReduceOp.MAX)
    same(t, torch.full((8,), float(W - 1)), "new_group all ranks")
    if W > 1:
        # some of the ranks: torch makes the group on them alone (the others get NON_GROUP_MEMBER)
        alone = dist.new_group(ranks=[0], backend="iris")
        if r == 0:
            t = torch.full((4,), 3.0, device=dev)
            dist.all_reduce(t, group=alone)
            same(t, torch.full((4,), 3.0, device=dev), "new_group of rank 0 alone")
            assert idist.context_of(alone).world_size == 1
        else:
            assert alone == dist.GroupMember.NON_GROUP_MEMBER
    expect_error(lambda: dist.new_group(backend="iris", pg_options=object()), IrisUsageError, "pg_options must be")
    # ccl calls on the context of the group interleave with the group's calls
    from iris.collectives import ccl

    # the library's own groups of the backend's context (ctx.new_group: every rank), under either
    # launcher: numbered in the list's order
    order = list(reversed(range(W)))
    mine = ctx.new_group(order, workspace_size=1 << 18)
    x = torch.arange(64, dtype=torch.float32, device=dev) + 100 * mine.rank
    gathered = torch.empty(64 * W, device=dev)
    ccl.all_gather(ctx, gathered, x, group=mine)
    same(gathered, torch.cat([torch.arange(64, dtype=torch.float32) + 100 * k for k in range(W)]).to(dev),
         "ccl.all_gather on ctx.new_group")

    y = torch.full((16,), 1.0, device=dev)
    ccl.all_reduce(ctx, y, y)
    dist.all_reduce(y)
    same(y, torch.full((16,), float(W * W)), "ccl and dist interleaved")


def scenario_cpu_gloo(ctx):
    """A group made with "cuda:iris,cpu:gloo": CUDA tensors go to iris; CPU tensors to gloo (which,
    unlike iris, does bitwise reductions); on the cpu backend every tensor is a CPU tensor."""
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    group = dist.new_group(backend="cuda:iris,cpu:gloo")
    assert isinstance(group, idist.IrisProcessGroup)
    cpu = torch.full((3,), 1 << r, dtype=torch.int32)
    dist.all_reduce(cpu, op=dist.ReduceOp.BOR, group=group)
    same(cpu, torch.full((3,), (1 << W) - 1, dtype=torch.int32), "cpu tensor through gloo")
    objects = [None] * W
    dist.all_gather_object(objects, r, group=group)
    assert objects == list(range(W)), objects
    if dev.type == "cuda":
        t = torch.full((3,), float(r), device=dev)
        dist.all_reduce(t, group=group)
        same(t, torch.full((3,), float(W * (W - 1) // 2)), "cuda tensor through iris")
        plain = dist.new_group(backend="iris")  # no cpu:gloo: a CPU tensor raises, saying how to configure one
        expect_error(lambda: dist.all_reduce(torch.ones(3), group=plain), IrisUsageError, "cuda:iris,cpu:gloo")


def scenario_rooted(ctx):
    # dist.reduce (in place on the root; the others' tensors untouched), dist.gather into the
    # root's list, dist.scatter from the root's list: every dtype, two roots, bytes that are not
    # whole words (uint8), and the errors of a bad list
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    for i, dtype in enumerate(DTYPES):
        root = (W - 1) if i % 2 else 0
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
            t = pattern((3, 5), r, dtype, dev, seed=30 + i)
            before = t.clone()
            dist.reduce(t, dst=root, op=op)
            expected = reduce_all(op, [pattern((3, 5), p, dtype, "cpu", seed=30 + i) for p in range(W)]).to(dtype)
            same(t, expected if r == root else before, f"reduce {dtype} {op} to {root}")
        x = pattern((2, 3), r, dtype, dev, seed=40 + i)
        parts = [torch.full((2, 3), -9, dtype=dtype, device=dev) for _ in range(W)] if r == root else None
        dist.gather(x, parts, dst=root)
        if r == root:
            for p in range(W):
                same(parts[p], pattern((2, 3), p, dtype, "cpu", seed=40 + i), f"gather {dtype} part {p}")
        y = torch.full((4,), -9, dtype=dtype, device=dev)
        chunks = [pattern((4,), 10 + p, dtype, dev, seed=50 + i) for p in range(W)] if r == root else None
        dist.scatter(y, chunks, src=root)
        same(y, pattern((4,), 10 + r, dtype, "cpu", seed=50 + i), f"scatter {dtype} from {root}")
    odd = torch.tensor([r + 1, 2 * r + 1, 3], dtype=torch.uint8, device=dev)  # 3 bytes: not whole words
    parts = [torch.zeros(3, dtype=torch.uint8, device=dev) for _ in range(W)] if r == 0 else None
    dist.gather(odd, parts, dst=0)
    if r == 0:
        for p in range(W):
            same(parts[p], torch.tensor([p + 1, 2 * p + 1, 3], dtype=torch.uint8), f"gather uint8 part {p}")
    mine = torch.zeros(3, dtype=torch.uint8, device=dev)
    dist.scatter(mine, [torch.full((3,), p + 7, dtype=torch.uint8, device=dev) for p in range(W)] if r == 0 else None,
                 src=0)
    same(mine, torch.full((3,), r + 7, dtype=torch.uint8), "scatter uint8")
    # the object forms, which torch runs through gather and scatter of byte tensors (CPU tensors)
    if objects_travel(ctx):
        objects = [None] * W if r == 1 % W else None
        dist.gather_object({"rank": r, "name": "y" * (r + 2)}, objects, dst=1 % W)
        if r == 1 % W:
            assert objects == [{"rank": p, "name": "y" * (p + 2)} for p in range(W)], objects
        received = [None]
        dist.scatter_object_list(received, [("part", p, "z" * p) for p in range(W)] if r == 0 else None, src=0)
        assert received == [("part", r, "z" * r)], received
    if r == 0:  # a list of the wrong length raises on the root, before any rank's call starts
        expect_error(lambda: dist.group.WORLD.gather([[torch.empty(4, device=dev)] * (W + 1)],
                                                     [torch.ones(4, device=dev)], dist.GatherOptions()),
                     IrisUsageError, "torch.distributed.gather(backend='iris')", f"pass {W} tensors")


def scenario_point_to_point(ctx):
    # dist.send / recv / isend / irecv: before the group's mailboxes exist they raise saying how to
    # make them; then a ring both ways (even ranks send first), isend/irecv pairs, a tag outside the
    # mailboxes' range, a receive from any source
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    if W < 2:
        return
    nxt, prev = (r + 1) % W, (r - 1) % W
    t = torch.ones(4, device=dev)
    for call in (lambda: dist.send(t, nxt), lambda: dist.recv(t, prev)):
        expect_error(call, IrisUnsupportedError, "no point-to-point mailboxes",
                     "ccl.init_p2p(iris.collectives.distributed.context_of(group))")
    from iris.collectives import ccl

    ccl.init_p2p(idist.context_of(), tags=2, slots=2, chunk_bytes=1 << 12)
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        out = torch.full((3000,), -1, dtype=dtype, device=dev)  # more than the 8 KiB inbox for fp32 and int64
        message = pattern((3000,), r, dtype, dev, seed=60)
        if r % 2 == 0:
            dist.send(message, nxt)
            dist.recv(out, prev)
        else:
            dist.recv(out, prev)
            dist.send(message, nxt)
        same(out, pattern((3000,), prev, dtype, "cpu", seed=60), f"ring {dtype}")
    got = torch.zeros(8, device=dev)
    works = ([dist.isend(torch.full((8,), float(r), device=dev), nxt, tag=1), dist.irecv(got, prev, tag=1)]
             if r % 2 == 0 else
             [dist.irecv(got, prev, tag=1), dist.isend(torch.full((8,), float(r), device=dev), nxt, tag=1)])
    for work in works:
        work.wait()  # on the GPU: the current stream waits for it, the host does not
        if ctx.device.type == "cuda":
            torch.cuda.current_stream(dev).synchronize()
        assert work.is_completed()
    same(got, torch.full((8,), float(prev)), "isend/irecv on tag 1")
    # torch's batch_isend_irecv: ring shifts in which every rank sends first, and every rank
    # receives first, of messages in one inbox and of 8 inboxes' worth (on the cpu backend the
    # backend keeps a batch's operations and runs them by turns at the first wait: sent one by one,
    # each send of a large message would wait for a receive its peer has not made)
    for n, order in ((500, "send first"), (16000, "send first"), (16000, "receive first")):
        ring = torch.zeros(n, device=dev)
        ops = [dist.P2POp(dist.isend, torch.full((n,), float(r), device=dev), nxt),
               dist.P2POp(dist.irecv, ring, prev)]
        for work in dist.batch_isend_irecv(ops if order == "send first" else ops[::-1]):
            work.wait()
        same(ring, torch.full((n,), float(prev)), f"batch_isend_irecv ring of {n}, {order}")
    # a batch nobody has waited for yet runs before the group's next call
    ring = torch.zeros(16000, device=dev)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((16000,), float(r), device=dev), prev),
                                    dist.P2POp(dist.irecv, ring, nxt)])
    total = torch.ones(4, device=dev)
    dist.all_reduce(total)
    same(total, torch.full((4,), float(W)), "all_reduce after an unwaited batch")
    for work in works:
        work.wait()
    same(ring, torch.full((16000,), float(nxt)), "batch_isend_irecv ring, waited after an all_reduce")
    # a send outside a batch goes after an unwaited batch's send to the same peer and tag, as made
    first, second = torch.zeros(100, device=dev), torch.zeros(100, device=dev)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((100,), float(r), device=dev), nxt)])
    dist.send(torch.full((100,), float(100 + r), device=dev), nxt)  # in the inbox: needs no receive yet
    dist.recv(first, prev)
    dist.recv(second, prev)
    for work in works:
        work.wait()
    same(first, torch.full((100,), float(prev)), "the batch's message first")
    same(second, torch.full((100,), float(100 + prev)), "the later send's message second")
    expect_error(lambda: dist.send(t, nxt, tag=5), IrisUsageError, "tag=5", "tags 0 .. 1")
    expect_error(lambda: dist.recv(t), IrisUnsupportedError, "any source")


def scenario_calls_agree(ctx):
    """The backend runs ccl's calls, and so their call agreement: a rank whose call differs makes
    every rank raise iris's IrisCallMismatchError through torch's API, naming each rank's call;
    the group goes on."""
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    if W < 2:
        return
    # sizes that no scenario before used: every rank's call is new, so every rank agrees on the host
    # (a call that one rank made before runs its cached plan and waits in the kernel for the others,
    # which wait in the agreement: the watchdog ends that job)
    x = torch.ones(1001 if r == 0 else 1025, device=dev)
    expect_error(lambda: dist.all_reduce(x), iris.runtime.IrisCallMismatchError,
                 "iris.collectives.ccl.all_reduce: the ranks made different collective calls", "float32[1001]",
                 "float32[1025]", "Every rank must make the same collective calls")
    t = torch.ones(13, device=dev)
    expect_error(lambda: dist.broadcast(t, src=1 if r == 0 else 0), iris.runtime.IrisCallMismatchError,
                 "iris.collectives.ccl.broadcast", "src=1", "src=0")
    y = torch.full((8,), float(r), device=dev)
    dist.all_reduce(y)
    same(y, torch.full((8,), float(W * (W - 1) // 2)), "all_reduce after the mismatches")


# --- DistributedDataParallel ----------------------------------------------------------------------------

def _train(model, group, inputs, targets, steps: int, device):
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, process_group=group, device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=1e-4)  # tiny buckets: several all-reduces per step
    opt = torch.optim.SGD(ddp.parameters(), lr=2.0 ** -5)
    for step in range(steps):
        opt.zero_grad()
        loss = ((ddp(inputs[step]) - targets[step]) ** 2).sum()
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def scenario_ddp(ctx):
    """DDP over the iris backend against DDP over gloo, same model, data and seed: bit-identical
    parameters. DDP divides each gradient by the world size before its bucket is summed; values
    that are sums of few powers of two keep every quotient and sum exact (W a power of two), so
    no order of summation can tell the two apart. On the GPU the forward and backward run in cuBLAS,
    whose gradients carry more bits than such sums keep exact: there the two orders of summation
    (iris's rank order, gloo's ring) may differ in the last bit, and the parameters are compared
    to a relative 1e-6."""
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    gloo = dist.new_group(backend="gloo")
    exact = W & (W - 1) == 0 and dev.type != "cuda"
    for dtype in (torch.float32, torch.float64):
        results = []
        for group in (dist.group.WORLD, gloo):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
            with torch.no_grad():
                for k, p in enumerate(model.parameters()):  # powers of two and their small sums
                    p.copy_(torch.round(torch.randn(p.shape) * 4) / 8 + k / 16)
            model = model.to(dtype).to(dev)
            inputs = [pattern((4, 6), r, dtype, dev, seed=s) / 4 for s in range(3)]
            targets = [pattern((4, 3), r + 1, dtype, dev, seed=s) / 2 for s in range(3)]
            results.append(_train(model, group, inputs, targets, 3, dev))
        for k, (a, b) in enumerate(zip(*results)):
            if exact:
                assert torch.equal(a.cpu(), b.cpu()), f"DDP {dtype} parameter {k}: iris {a} != gloo {b}"
            else:
                assert torch.allclose(a.cpu(), b.cpu(), rtol=1e-6, atol=1e-7), f"DDP {dtype} parameter {k}"
        first = torch.cat([p.reshape(-1).cpu() for p in results[0]])
        assert not torch.equal(first, torch.zeros_like(first))
        everyone = [None] * W
        dist.all_gather_object(everyone, first.tolist(), group=gloo)
        assert all(row == everyone[0] for row in everyone), "DDP parameters differ between ranks"
    if r == 0:
        print(f"CHECK ddp {'bit-identical' if exact else 'close'} to gloo", flush=True)


def scenario_sub_groups(ctx):
    """Groups of some of the ranks, as a tensor x data parallel program makes them: every rank
    calls new_group for every group in the same order (torch's rule), each rank runs collectives
    on its two groups and on the default group, interleaved; point to point inside a group (ranks
    named as torch names them, by their default-group rank); DDP over the data-parallel group
    against DDP over a gloo group of the same ranks; destroying a group closes its context.
    ``tp`` ranks per tensor-parallel group: 2 from 4 ranks, else 1 (groups of one rank)."""
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    from iris.collectives import ccl

    tp = 2 if W >= 4 and W % 2 == 0 else 1
    tp_lists = [list(range(start, start + tp)) for start in range(0, W, tp)]
    dp_lists = [list(range(first, W, tp)) for first in range(tp)]
    heap = 8 << 20
    tp_groups = [dist.new_group(ranks, backend="iris", pg_options=idist.Options(heap_size=heap))
                 for ranks in tp_lists]
    dp_groups = [dist.new_group(ranks, backend="iris") for ranks in dp_lists]
    gloo_dp = [dist.new_group(ranks, backend="gloo") for ranks in dp_lists]
    my_tp, my_dp = tp_lists[r // tp], dp_lists[r % tp]
    tp_group, dp_group, dp_gloo = tp_groups[r // tp], dp_groups[r % tp], gloo_dp[r % tp]
    for k, group in enumerate(tp_groups):  # non-members hold no group
        assert (group == dist.GroupMember.NON_GROUP_MEMBER) == (k != r // tp)
    for group, members in ((tp_group, my_tp), (dp_group, my_dp)):
        if len(members) == W:
            assert idist.context_of(group) is ctx, "a group of all ranks shares the default group's context"
            continue
        own = idist.context_of(group)
        assert (own.rank, own.world_size) == (members.index(r), len(members)), (own, members)
        assert own is not ctx and own.device == dev
    if tp < W:
        assert idist.context_of(tp_group).heap_size == heap  # the group's Options
    for step in range(2):  # twice: the cached plans of every group
        t = torch.full((1000,), float(r + step), device=dev)
        dist.all_reduce(t, group=tp_group)
        same(t, torch.full((1000,), float(sum(m + step for m in my_tp)), device=dev), f"tp all_reduce {step}")
        gathered = torch.empty(len(my_dp) * 6, device=dev)
        dist.all_gather_into_tensor(gathered, pattern((6,), r, torch.float32, dev, seed=step), group=dp_group)
        same(gathered, torch.cat([pattern((6,), m, torch.float32, dev, seed=step) for m in my_dp]),
             f"dp all_gather {step}")
        whole = torch.full((8,), 1.0, device=dev)
        dist.all_reduce(whole)  # the default group between the groups' calls
        same(whole, torch.full((8,), float(W), device=dev), f"world all_reduce {step}")
        x = pattern((len(my_dp) * 4,), r, torch.float32, dev, seed=step)
        out = torch.empty(4, device=dev)
        dist.reduce_scatter_tensor(out, x, group=dp_group)
        part = my_dp.index(r)
        expected = sum(pattern((len(my_dp) * 4,), m, torch.float32, dev, seed=step) for m in my_dp)
        same(out, expected[part * 4:(part + 1) * 4], f"dp reduce_scatter {step}")
        b = torch.full((5,), float(r), device=dev)
        dist.broadcast(b, src=my_tp[-1], group=tp_group)  # src: a default-group rank, as torch takes it
        same(b, torch.full((5,), float(my_tp[-1]), device=dev), f"tp broadcast {step}")
    if len(my_dp) > 1:
        # point to point on the group's context: torch turns the default-group ranks into group ranks
        ccl.init_p2p(idist.context_of(dp_group))
        after, before = my_dp[(my_dp.index(r) + 1) % len(my_dp)], my_dp[my_dp.index(r) - 1]
        got = torch.empty(300, device=dev)
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((300,), float(r), device=dev), after,
                                                   dp_group),
                                        dist.P2POp(dist.irecv, got, before, dp_group)])
        for work in works:
            work.wait()
        same(got, torch.full((300,), float(before), device=dev), "dp ring exchange")
    # DDP over the data-parallel group: the same parameters as over gloo's group of those ranks
    results = []
    for group in (dp_group, dp_gloo):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
        with torch.no_grad():
            for k, p in enumerate(model.parameters()):
                p.copy_(torch.round(torch.randn(p.shape) * 4) / 8 + k / 16)
        model = model.to(dev)
        inputs = [pattern((4, 6), r, torch.float32, dev, seed=s) / 4 for s in range(2)]
        targets = [pattern((4, 3), r + 1, torch.float32, dev, seed=s) / 2 for s in range(2)]
        results.append(_train(model, group, inputs, targets, 2, dev))
    exact = len(my_dp) & (len(my_dp) - 1) == 0 and dev.type != "cuda"
    for k, (a, b) in enumerate(zip(*results)):
        if exact:
            assert torch.equal(a.cpu(), b.cpu()), f"DDP over the dp group, parameter {k}: iris {a} != gloo {b}"
        else:
            assert torch.allclose(a.cpu(), b.cpu(), rtol=1e-6, atol=1e-7), f"DDP over the dp group, parameter {k}"
    # destroying a group closes its own context (collective over its members), and the default
    # group's context stays open
    owned = [idist.context_of(g) for g, members in ((tp_group, my_tp), (dp_group, my_dp)) if len(members) < W]
    for groups in (tp_groups, dp_groups):
        for group in groups:
            if group != dist.GroupMember.NON_GROUP_MEMBER:
                dist.destroy_process_group(group)
    assert all(c._closed for c in owned) and not ctx._closed
    if r == 0:
        print(f"CHECK sub-groups tp {tp} dp {len(my_dp)} ddp {'bit-identical' if exact else 'close'}", flush=True)


# --- the run --------------------------------------------------------------------------------------------

def main(argv) -> None:
    # a rank still here after 500 s prints every thread's stack and exits (the test's bound is 600 s)
    faulthandler.dump_traceback_later(500, exit=True)
    global ASKED_BACKEND
    backend, names = argv[0], argv[1:]
    ASKED_BACKEND = backend
    scenarios = {n[len("scenario_"):]: f for n, f in globals().items() if n.startswith("scenario_")}
    unknown = [n for n in names if n not in scenarios]
    if unknown:
        raise SystemExit(f"unknown scenario(s) {unknown}; known: {sorted(scenarios)}")
    dist.init_process_group(backend=backend)
    ctx = idist.context_of()  # made now (collective), as the first call would
    for name in names or list(scenarios):
        start = time.monotonic()
        try:
            scenarios[name](ctx)
        except BaseException as exc:
            raise RuntimeError(f"scenario {name!r} failed on rank {ctx.rank}/{ctx.world_size}: {exc}") from exc
        dist.barrier()
        if ctx.rank == 0:
            print(f"PASS {name} ({time.monotonic() - start:.2f} s, {ctx.world_size} ranks, {ctx.backend}, "
                  f"{ctx.bootstrap})", flush=True)
    dist.destroy_process_group()
    if ctx.rank == 0:
        print(f"CHECK context-closed {ctx._closed}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
