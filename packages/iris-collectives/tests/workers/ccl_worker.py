"""Multi-rank scenarios of iris.collectives.ccl (run by test_ccl_multirank.py on 1..N ranks).

Every rank regenerates every rank's inputs from seeds, so references need no communication.
Inputs are small integers, so every sum, max, min and product is exact in fp32 in any order (and
in fp16/bf16 once rounded: the products of at most 4 ranks' values in [-2, 2] are small powers
of two times small integers): each result must equal, bit for bit, torch's fp32 (or int64)
result rounded once to the dtype. Outputs are poisoned before each call, so a skipped element
fails.

Tiles are tiny (``SMALL``: 64 elements in rows of 16) so that a few dozen elements make several
tiles with a ragged tail; Triton's interpreter runs every program of every call in turn, and CI
has two cores.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import torch

import iris.device
import iris.runtime.testing
from iris.collectives import IrisCapacityError, IrisMessageSizeError, _workspace, ccl, moe
from iris.collectives._sync import ARRIVE, DONE, EPOCH, LOCK_WORDS
from iris.runtime import IrisUsageError, RankError, UnsupportedDtypeError
from iris.runtime.testing import expect_error, spread

SMALL = ccl.Config(block=64, width=16)
TWO_SHOT = ccl.Config(variant="two_shot", block=64, width=16)
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64)
OPS = ("sum", "avg", "max", "min", "prod")


def data(n: int, dtype: torch.dtype, seed: int, low: int = -4, high: int = 5) -> torch.Tensor:
    """Integers in [low, high) as ``dtype``, the same wherever generated (CPU generator)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, (n,), generator=g).to(dtype)


def reference(op: str, parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """``op`` over ``parts`` in fp32 (int64 for integers), rounded once to ``dtype``."""
    wide = torch.stack([p.to(torch.float32 if dtype.is_floating_point else torch.int64) for p in parts])
    result = {"sum": lambda: wide.sum(0), "avg": lambda: wide.sum(0) / len(parts), "max": lambda: wide.amax(0),
              "min": lambda: wide.amin(0), "prod": lambda: wide.prod(0)}[op]()
    return result.to(dtype)


def check(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Bit for bit (element by element, any shapes of the same size)."""
    actual, expected = actual.cpu().reshape(-1), expected.reshape(-1)
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype}, expected {expected.dtype}"
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[expected.element_size()]
    differ = actual.contiguous().view(bits) != expected.contiguous().view(bits)
    count = int(differ.sum())
    if count:
        where = differ.nonzero().flatten()[:5].tolist()
        pairs = [(actual[i].item(), expected[i].item()) for i in where]
        raise AssertionError(f"{what}: {count} of {actual.numel()} elements differ; first (got, expected) at "
                             f"{where}: {pairs}")


def poison(t: torch.Tensor) -> torch.Tensor:
    return t.fill_(float("nan") if t.dtype.is_floating_point else -12345)


def place(ctx, t: torch.Tensor, heap: bool) -> torch.Tensor:
    """``t`` on the context's device, on the symmetric heap or not."""
    return ctx.as_symmetric(t.to(ctx.device)) if heap else t.to(ctx.device).clone()


# --- one call of each collective, checked ----------------------------------------------------------

def run_all_reduce(ctx, n, dtype, op, seed, config=SMALL, heap_in=False, heap_out=False, in_place=False):
    W, r = ctx.world_size, ctx.rank
    low, high = (-2, 3) if op == "prod" else (-4, 5)
    inp = place(ctx, data(n, dtype, seed + r, low, high), heap_in)
    out = inp if in_place else poison(place(ctx, torch.empty(n, dtype=dtype), heap_out))
    ccl.all_reduce(ctx, out, inp, op=op, config=config)
    expected = reference(op, [data(n, dtype, seed + q, low, high) for q in range(W)], dtype)
    what = (f"all_reduce(n={n}, {dtype}, {op}, {config.variant}, heap_in={heap_in}, heap_out={heap_out}, "
            f"in_place={in_place})")
    check(out, expected, what)


def run_reduce_scatter(ctx, m, dtype, op, seed, heap_in=False, config=SMALL):
    W, r = ctx.world_size, ctx.rank
    low, high = (-2, 3) if op == "prod" else (-4, 5)
    inp = place(ctx, data(W * m, dtype, seed + r, low, high), heap_in)
    out = poison(torch.empty(m, dtype=dtype, device=ctx.device))
    ccl.reduce_scatter(ctx, out, inp, op=op, config=config)
    full = reference(op, [data(W * m, dtype, seed + q, low, high) for q in range(W)], dtype)
    check(out, full[r * m:(r + 1) * m], f"reduce_scatter(m={m}, {dtype}, {op}, heap_in={heap_in})")


def run_all_gather(ctx, m, dtype, seed, heap_in=False, rows=None, config=SMALL):
    W, r = ctx.world_size, ctx.rank
    shape = (m,) if rows is None else (rows, m // rows)
    inp = place(ctx, data(m, dtype, seed + r).reshape(shape), heap_in)
    out = poison(torch.empty((W * shape[0], *shape[1:]), dtype=dtype, device=ctx.device))
    ccl.all_gather(ctx, out, inp, config=config)
    expected = torch.cat([data(m, dtype, seed + q) for q in range(W)])
    check(out, expected, f"all_gather(shape={shape}, {dtype}, heap_in={heap_in})")


def run_all_to_all(ctx, m, dtype, seed, heap_in=False, config=SMALL):
    W, r = ctx.world_size, ctx.rank
    inp = place(ctx, data(W * m, dtype, seed + r), heap_in)
    out = poison(torch.empty(W * m, dtype=dtype, device=ctx.device))
    ccl.all_to_all(ctx, out, inp, config=config)
    expected = torch.cat([data(W * m, dtype, seed + q)[r * m:(r + 1) * m] for q in range(W)])
    check(out, expected, f"all_to_all(m={m}, {dtype}, heap_in={heap_in})")


def run_broadcast(ctx, n, dtype, seed, src, heap=False, config=SMALL):
    t = place(ctx, data(n, dtype, seed + ctx.rank), heap)
    ccl.broadcast(ctx, t, src, config=config)
    check(t, data(n, dtype, seed + src), f"broadcast(n={n}, {dtype}, src={src}, heap={heap})")


# --- scenarios ---------------------------------------------------------------------------------------

def scenario_all_reduce_ops_and_dtypes(ctx):
    # every op x dtype once, 37 elements (3 tiles, the last ragged), alternating variant and placement
    # (in pairs, so that either half of the cases that spread() gives a world size has both variants)
    cases = [(dtype, op) for dtype in DTYPES for op in OPS if op != "avg" or dtype.is_floating_point]
    mine = spread(cases, ctx.world_size)
    for i, (dtype, op) in enumerate(cases):
        if (dtype, op) not in mine:
            continue
        config = TWO_SHOT if i // 2 % 2 else SMALL
        run_all_reduce(ctx, 37 if i % 3 else 150, dtype, op, 100 * i, config, heap_in=i % 4 == 1,
                       heap_out=i % 4 == 2, in_place=i % 5 == 3)


def scenario_all_reduce_sizes_and_placement(ctx):
    # 1 element .. several tiles; both variants; heap and not; in place and not
    cases = [(1, False, False, False), (16, True, False, False), (63, False, True, False), (64, True, True, False),
             (65, False, False, True), (200, True, True, True)]
    for i, (n, heap_in, heap_out, in_place) in enumerate(cases):
        for config in (SMALL, TWO_SHOT):
            run_all_reduce(ctx, n, torch.float32, "sum", 1000 + 10 * i, config, heap_in=heap_in,
                           heap_out=heap_out or (in_place and heap_in), in_place=in_place)
    # the table's default tiling (one tile here) and a forced grid of 1 program looping over tiles
    run_all_reduce(ctx, 300, torch.bfloat16, "sum", 2000, ccl.Config())
    run_all_reduce(ctx, 130, torch.float16, "avg", 2100, ccl.Config(block=32, width=8, grid=1))


def scenario_reduce_scatter(ctx):
    cases = [(dtype, op) for dtype in (torch.float32, torch.bfloat16, torch.int64) for op in OPS
             if op != "avg" or dtype.is_floating_point]
    mine = spread(cases, ctx.world_size)
    for i, (dtype, op) in enumerate(cases):
        if (dtype, op) in mine:
            run_reduce_scatter(ctx, (1, 37, 70)[i % 3], dtype, op, 3000 + 100 * i, heap_in=i // 2 % 2 == 1)
    run_reduce_scatter(ctx, 5, torch.float16, "sum", 3900, config=ccl.Config())


def scenario_all_gather(ctx):
    for i, dtype in enumerate(DTYPES):
        run_all_gather(ctx, (1, 37, 70, 64, 5)[i], dtype, 4000 + 100 * i, heap_in=i % 2 == 1)
    run_all_gather(ctx, 24, torch.float32, 4600, rows=6)  # 2-D: rows concatenated along dim 0


def scenario_all_to_all(ctx):
    for i, dtype in enumerate(DTYPES):
        run_all_to_all(ctx, (1, 37, 70, 64, 5)[i], dtype, 5000 + 100 * i, heap_in=i % 2 == 0)


def scenario_broadcast(ctx):
    for src in range(ctx.world_size):
        run_broadcast(ctx, (1, 37, 70, 5)[src % 4], DTYPES[src % len(DTYPES)], 6000 + 100 * src, src,
                      heap=src % 2 == 1)


def scenario_in_rounds(ctx):
    # config.chunk: tensors off the heap moved in rounds of 2 tiles through staging buffers of one
    # round (4 rounds, the last ragged); in place, out of place, and with one side on the heap;
    # then config.heap_chunk: rounds of tensors on the heap
    for i, variant in enumerate(("one_shot", "two_shot")):
        config = ccl.Config(variant=variant, block=64, width=16, chunk=128)
        for j, (heap_in, heap_out, in_place) in enumerate(((False, False, False), (False, False, True),
                                                           (True, False, False), (False, True, False))):
            run_all_reduce(ctx, 450, torch.bfloat16 if j % 2 else torch.float32, "sum", 9000 + 10 * i + j, config,
                           heap_in=heap_in, heap_out=heap_out, in_place=in_place)
    pull = ccl.Config(block=64, width=16, chunk=128)  # of each rank's part
    run_reduce_scatter(ctx, 450, torch.float32, "sum", 9100, config=pull)
    run_reduce_scatter(ctx, 450, torch.bfloat16, "max", 9101, heap_in=True, config=pull)
    run_all_gather(ctx, 450, torch.float32, 9102, config=pull)
    run_all_gather(ctx, 300, torch.float16, 9103, rows=10, config=pull)
    run_all_to_all(ctx, 450, torch.int32, 9104, config=pull)
    run_all_to_all(ctx, 450, torch.float32, 9105, heap_in=True, config=pull)
    run_broadcast(ctx, 450, torch.bfloat16, 9106, ctx.world_size - 1, config=pull)
    # config.heap_chunk: the same rounds for tensors the peers read in place, on the heap
    for i, variant in enumerate(("one_shot", "two_shot")):
        in_place = ccl.Config(variant=variant, block=64, width=16, heap_chunk=128)
        run_all_reduce(ctx, 450, torch.float32, "sum", 9200 + i, in_place, heap_in=True, heap_out=True)
    run_all_reduce(ctx, 450, torch.bfloat16, "max", 9202, ccl.Config(variant="two_shot", block=64, width=16,
                                                                        heap_chunk=128), heap_in=True, in_place=True)
    pull_in_place = ccl.Config(block=64, width=16, heap_chunk=128)
    run_reduce_scatter(ctx, 450, torch.float32, "sum", 9203, heap_in=True, config=pull_in_place)
    run_all_gather(ctx, 450, torch.float32, 9204, heap_in=True, config=pull_in_place)
    run_all_to_all(ctx, 450, torch.int32, 9205, heap_in=True, config=pull_in_place)
    run_broadcast(ctx, 450, torch.float32, 9206, 0, heap=True, config=pull_in_place)
    rounds_of_2 = ("ccl.all_reduce", torch.float32, ctx.world_size, "two_shot", 64, 16, 2, False, False)
    assert rounds_of_2 in _workspace._CACHES[ctx], "heap_chunk=128 made no workspace of one 2-tile round"


def scenario_back_to_back(ctx):
    # 100 calls with new data and no barrier between them: one tile each, the flags' counters only
    # grow; the staging buffer is overwritten by the next call while peers may still be in this one
    W, r = ctx.world_size, ctx.rank
    inp = torch.empty(5, dtype=torch.float32, device=ctx.device)
    out = torch.empty(5, dtype=torch.float32, device=ctx.device)
    for k in range(100):
        inp.copy_(torch.arange(5, dtype=torch.float32) + 7 * k + r)
        ccl.all_reduce(ctx, out, inp)
        expected = W * (torch.arange(5, dtype=torch.float32) + 7 * k) + W * (W - 1) // 2
        check(out, expected, f"back-to-back all_reduce call {k}")


def scenario_buffered_one_shot(ctx):
    # variant one_shot_buffered: one flag round trip per call, the staging buffer's halves used by
    # turns. Every op and placement; back to back with new data and no barrier, alternating two
    # sizes of one size class (the same workspace: the grid is fixed per workspace), with one
    # rank made late so that the others run ahead into the next call; rounds through staging.
    W, r = ctx.world_size, ctx.rank
    # lock records of this scenario's calls alone: on the GPU the table picks one_shot_buffered for
    # small messages, so the earlier scenarios' calls would share these workspaces
    ctx.barrier()
    ccl.clear_workspaces(ctx)
    buffered = ccl.Config(variant="one_shot_buffered", block=64, width=16)
    for i, (dtype, op) in enumerate(((torch.float32, "sum"), (torch.bfloat16, "avg"), (torch.float16, "max"),
                                     (torch.int32, "min"), (torch.int64, "prod"))):
        run_all_reduce(ctx, (37, 150, 1, 64, 200)[i], dtype, op, 9500 + 10 * i, buffered, heap_in=i == 1,
                       heap_out=i == 2, in_place=i >= 3)
    x = ctx.zeros(250)  # in place on the heap, as a gradient bucket would be
    for k in range(24):
        n = (130, 250)[k % 2]  # 3 and 4 tiles: one workspace of 4
        if k % 8 == 3 and r == k // 8 % W:
            iris.runtime.testing.busy_stream(ctx, 0.2)
        x[:n].copy_(torch.arange(n, dtype=torch.float32) + 5 * k + r)
        ccl.all_reduce(ctx, x[:n], x[:n], config=buffered)
        expected = W * (torch.arange(n, dtype=torch.float32) + 5 * k) + W * (W - 1) // 2
        check(x[:n], expected, f"buffered one-shot, back to back, call {k}")
    run_all_reduce(ctx, 450, torch.float32, "sum", 9600, ccl.Config(variant="one_shot_buffered", block=64,
                                                                      width=16, chunk=128))
    # the protocol itself: every program's lock record counted W - 1 "ready" per call and no "done"
    if W > 1 and not iris.device.DEBUG.value:
        spaces = [ws for key, ws in _workspace._CACHES[ctx].items()
                  if key[:7] == ("ccl.all_reduce", torch.float32, W, "one_shot_buffered", 64, 16, 4)]
        assert len(spaces) == 1, [key for key in _workspace._CACHES[ctx]]
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        records = spaces[0].buffers["locks"].cpu().view(-1, LOCK_WORDS)
        used = records[records[:, EPOCH.value] > 0]  # .value: the kernels' compile-time word indices
        assert len(used) > 0 and (used[:, EPOCH.value] == 24).all(), records
        assert (used[:, ARRIVE.value] == 24 * (W - 1)).all() and (used[:, DONE.value] == 0).all(), \
            f"buffered one-shot: not one round trip per call (ready, done counts): {used[:, :2].tolist()}"
        # the halves by turns: call 24 (k = 23, 250 elements) staged in half 0, call 23 in half 1
        stage = spaces[0].buffers["stage"].cpu()
        arange = torch.arange(250, dtype=torch.float32)
        check(stage[:250], arange + 5 * 23 + r, "buffered one-shot: half 0 holds the last call")
        check(stage[256:256 + 130], arange[:130] + 5 * 22 + r, "buffered one-shot: half 1 the one before")


def scenario_buffered_pull(ctx):
    # variant pull_buffered of reduce_scatter, all_gather, all_to_all and broadcast: every
    # collective, heap and not; back to back in one mixed sequence (a different root each time,
    # one rank made late); in rounds; then the lock records: "ready" counted, no "done"
    W, r = ctx.world_size, ctx.rank
    ctx.barrier()  # lock records of this scenario's calls alone (see buffered_one_shot)
    ccl.clear_workspaces(ctx)
    pull = ccl.Config(variant="pull_buffered", block=64, width=16)
    run_reduce_scatter(ctx, 37, torch.float32, "sum", 9700, config=pull)
    run_reduce_scatter(ctx, 70, torch.bfloat16, "max", 9701, heap_in=True, config=pull)
    run_all_gather(ctx, 37, torch.float16, 9702, config=pull)
    run_all_gather(ctx, 24, torch.int64, 9703, heap_in=True, rows=6, config=pull)
    run_all_to_all(ctx, 5, torch.int32, 9704, config=pull)
    run_all_to_all(ctx, 64, torch.float32, 9705, heap_in=True, config=pull)
    run_broadcast(ctx, 100, torch.bfloat16, 9706, W - 1, config=pull)
    run_broadcast(ctx, 37, torch.float32, 9707, 0, heap=True, config=pull)
    x = torch.empty(150, device=ctx.device)  # 3 tiles: a workspace of 4
    g = torch.empty(W * 150, device=ctx.device)
    for k in range(12):
        if k % 4 == 1 and r == k // 4 % W:
            iris.runtime.testing.busy_stream(ctx, 0.2)
        x.copy_(torch.arange(150, dtype=torch.float32) + 3 * k + 1000 * r)
        ccl.all_gather(ctx, g, x, config=pull)
        check(g, torch.cat([torch.arange(150, dtype=torch.float32) + 3 * k + 1000 * q for q in range(W)]),
              f"buffered all_gather, back to back, call {k}")
        ccl.broadcast(ctx, x, k % W, config=pull)
        check(x, torch.arange(150, dtype=torch.float32) + 3 * k + 1000 * (k % W), f"buffered broadcast, call {k}")
    rounds = ccl.Config(variant="pull_buffered", block=64, width=16, chunk=128)
    run_reduce_scatter(ctx, 450, torch.float32, "sum", 9800, config=rounds)
    run_all_to_all(ctx, 450, torch.float32, 9801, config=rounds)
    if W > 1 and not iris.device.DEBUG.value:
        spaces = [ws for key, ws in _workspace._CACHES[ctx].items()
                  if key[:8] == ("ccl.all_gather", torch.float32, W, "pull_buffered", 64, 16, 4, True)]
        assert len(spaces) == 1, [key for key in _workspace._CACHES[ctx]]
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        records = spaces[0].buffers["locks"].cpu().view(-1, LOCK_WORDS)
        used = records[records[:, EPOCH.value] > 0]
        assert len(used) > 0 and (used[:, EPOCH.value] == 12).all(), records
        assert (used[:, ARRIVE.value] == 12 * (W - 1)).all() and (used[:, DONE.value] == 0).all(), records


def moves_read_in_place(ctx, inp, big, n: int, m: int, config, seed: int, what: str) -> None:
    # reduce_scatter and all_to_all of big (W * m bf16), all_gather and broadcast of inp (n fp32):
    # right, and no workspace of a ccl call but the in-place one-shot all-reduce's stages (the
    # peers read the tensors where they are)
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    # the variant that reads in place: the buffered ones always stage (a call ends before its peers
    # have read its input), and the GPU's table picks them for messages this small
    config = dataclasses.replace(config, variant="pull")
    big.copy_(data(W * m, torch.bfloat16, seed + r))
    part = poison(torch.empty(m, dtype=torch.bfloat16, device=dev))
    ccl.reduce_scatter(ctx, part, big, config=config)
    full = reference("sum", [data(W * m, torch.bfloat16, seed + q) for q in range(W)], torch.bfloat16)
    check(part, full[r * m:(r + 1) * m], f"{what} reduce_scatter")
    gathered = poison(torch.empty(W * n, dtype=torch.float32, device=dev))
    inp.copy_(data(n, torch.float32, seed + 10 + r))
    ccl.all_gather(ctx, gathered, inp, config=config)
    check(gathered, torch.cat([data(n, torch.float32, seed + 10 + q) for q in range(W)]), f"{what} all_gather")
    swapped = poison(torch.empty(W * m, dtype=torch.bfloat16, device=dev))
    ccl.all_to_all(ctx, swapped, big, config=config)
    check(swapped, torch.cat([data(W * m, torch.bfloat16, seed + q)[r * m:(r + 1) * m] for q in range(W)]),
          f"{what} all_to_all")
    inp.copy_(data(n, torch.float32, seed + 20 + r))
    ccl.broadcast(ctx, inp, W - 1, config=config)
    check(inp, data(n, torch.float32, seed + 20 + W - 1), f"{what} broadcast")
    # only the one-shot in place stages (peers may still read the input while it is overwritten)
    staged = [key for key in _workspace._CACHES.get(ctx, {})
              if str(key[0]).startswith("ccl.") and True in key[7:9] and key[:4] != ("ccl.all_reduce", torch.float32,
                                                                                       W, "one_shot")]
    assert W == 1 or not staged, f"{what} tensors were staged: {staged}"


def rank_shifted(ctx, slabs, n, dtype, shift=None):
    """A plain tensor of ``n`` elements that translation alone would get wrong: on the GPU a torch
    tensor; on the cpu backend ``n`` elements 256 B x ``shift`` (default: the rank) into a heap slab
    of the same size on every rank (appended to ``slabs``, for the caller to free), so that the
    tensors' heap offsets differ and what is allocated after them stays symmetric."""
    if ctx.device.type == "cuda":
        return torch.empty(n, dtype=dtype, device=ctx.device)
    shift = ctx.rank if shift is None else shift
    per_256 = 256 // torch.tensor([], dtype=dtype).element_size()
    slabs.append(ctx.zeros(n + per_256 * ctx.world_size, dtype=dtype))
    return slabs[-1][per_256 * shift:per_256 * shift + n]


def scenario_registered_tensors(ctx):
    # Tensors registered with ctx.register are read and written where they are, with no staging:
    # on the cpu backend heap tensors at a different offset on each rank (which translation
    # alone would get wrong), on the GPU plain torch tensors shared over CUDA IPC. Every
    # collective, in place and not, a view inside a registered tensor; no workspace stages.
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    ctx.barrier()
    ccl.clear_workspaces(ctx)

    slabs = []

    def tensor(n, dtype):
        return rank_shifted(ctx, slabs, n, dtype)

    n, m = 150, 37
    inp, out, big = tensor(n, torch.float32), tensor(n, torch.float32), tensor(W * m, torch.bfloat16)
    registrations = [ctx.register(t) for t in (inp, out, big)]
    # the variants that read in place (the GPU's table picks one_shot_buffered, which always stages)
    configs = (ccl.Config(variant="one_shot", block=64, width=16), TWO_SHOT,
               ccl.Config(variant="two_shot", block=64, width=16, chunk=64))
    for i, config in enumerate(configs):
        for in_place in (False, True):
            inp.copy_(data(n, torch.float32, 9900 + 10 * i + r))
            target = inp if in_place else poison(out)
            ccl.all_reduce(ctx, target, inp, config=config)
            check(target, reference("sum", [data(n, torch.float32, 9900 + 10 * i + q) for q in range(W)],
                                    torch.float32), f"registered all_reduce, {config.variant}, in_place={in_place}")
    view = out[64:64 + 40]  # a view inside a registered tensor, at the same place on every rank
    view.copy_(data(40, torch.float32, 9950 + r))
    ccl.all_reduce(ctx, view, view, op="max", config=TWO_SHOT)
    check(view, reference("max", [data(40, torch.float32, 9950 + q) for q in range(W)], torch.float32),
          "registered view, in place")
    moves_read_in_place(ctx, inp, big, n, m, SMALL, 9960, "registered")
    # a registered input with a plain output: the two-shot writes the peers' shares through the heap
    plain = poison(torch.empty(n, dtype=torch.float32, device=dev))
    inp.copy_(data(n, torch.float32, 9940 + r))
    ccl.all_reduce(ctx, plain, inp, config=TWO_SHOT)
    check(plain, reference("sum", [data(n, torch.float32, 9940 + q) for q in range(W)], torch.float32),
          "registered input, plain output")
    for registration in registrations:
        registration.close()
    if dev.type == "cuda":  # unregistered, a plain tensor is staged again, and correct
        inp.copy_(data(n, torch.float32, 9990 + r))
        ccl.all_reduce(ctx, out, inp, config=TWO_SHOT)
        check(out, reference("sum", [data(n, torch.float32, 9990 + q) for q in range(W)], torch.float32),
              "after close, staged")
    ctx.barrier()
    for slab in reversed(slabs):
        ctx.free(slab)


def scenario_all_gather_registers_by_its_message(ctx):
    # The default rule registers plain tensors on the fly from ccl.REGISTER_FROM message bytes, on
    # the GPU. all_gather's message is its output, W times the input that the peers read: a 16 MiB
    # all_gather registers its 16/W MiB input instead of staging it (an extra pass that cost
    # 1.5x the call at 2 ranks). A small one registers nothing; off the GPU, nothing does.
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    ctx.barrier()
    ccl.clear_workspaces(ctx)
    cache = ctx._reach
    big = dev.type == "cuda"
    for size in ((ccl.REGISTER_FROM, 1 << 20) if big else (4096,)):
        per_rank = -(-size // 4 // W)  # fp32 elements: W * per_rank * 4 >= size
        inp = data(per_rank, torch.float32, 9000 + r).to(dev)
        out = poison(torch.empty(W * per_rank, dtype=torch.float32, device=dev))
        before = len(cache)
        ccl.all_gather(ctx, out, inp)
        check(out, torch.cat([data(per_rank, torch.float32, 9000 + q) for q in range(W)]),
              f"all_gather of {W * per_rank * 4} bytes, plain tensors")
        registers = big and W > 1 and size >= ccl.REGISTER_FROM
        assert len(cache) == before + registers, (
            f"all_gather of a {W * per_rank * 4}-byte message ({per_rank * 4} bytes of input): "
            f"{len(cache) - before} registrations, expected {int(registers)}")
    ctx.barrier()


def scenario_agreed_reach(ctx):
    # Config(register=True) (and, on the GPU, any call from REGISTER_FROM bytes): the ranks agree
    # on how each tensor is reached and register plain tensors on the fly, cached. On the cpu
    # backend the tensors that translation alone would get wrong are heap tensors at a different
    # offset on each rank; on the GPU, plain torch tensors (CUDA IPC). Every collective; a second
    # call with the same tensors registers nothing; a rank whose tensor cannot be registered makes
    # every rank stage; the cache closes its least recently used registration past its capacity.
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    ctx.barrier()
    ccl.clear_workspaces(ctx)
    cache, slabs = ctx._reach, []
    reg = ccl.Config(variant="one_shot", block=64, width=16, register=True)  # read in place (not buffered)
    reg_two_shot = ccl.Config(variant="two_shot", block=64, width=16, register=True)

    def tensor(n, dtype, shift=r):
        return rank_shifted(ctx, slabs, n, dtype, shift)

    n, m = 150, 37
    inp, out, big = tensor(n, torch.float32), tensor(n, torch.float32), tensor(W * m, torch.bfloat16)
    start = len(cache)
    # what registrations on the fly (and their eviction) leave alone: the context's launch plans,
    # which compare ctx.registrations_generation (a plan that uses one is keyed by its serial)
    explicit_generation = ctx.registrations_generation
    for i, config in enumerate((reg, reg_two_shot)):
        for in_place in (False, True):
            for again in range(2):
                inp.copy_(data(n, torch.float32, 8800 + 10 * i + again + r))
                target = inp if in_place else poison(out)
                ccl.all_reduce(ctx, target, inp, config=config)
                check(target, reference("sum", [data(n, torch.float32, 8800 + 10 * i + again + q) for q in range(W)],
                                        torch.float32), f"agreed all_reduce, {config.variant}, in_place={in_place}")
    if W > 1:
        assert len(cache) == start + 2, f"inp and out registered once each: {len(cache) - start} registrations"
        generation = cache.generation
        ccl.all_reduce(ctx, out, inp, config=reg_two_shot)
        assert cache.generation == generation, "the same tensors again must find their registrations"
    moves_read_in_place(ctx, inp, big, n, m, reg, 8860, "agreed")

    # one rank's tensor cannot be registered (not on a 256-byte boundary): every rank stages, and
    # the result is right; so is a rank whose tensor is plain on the cpu backend, beside heap tensors
    odd = tensor(n + 8, torch.float32)[(1 if r == 0 else 0):][:n]
    odd.copy_(data(n, torch.float32, 8890 + r))
    before = len(cache)
    ccl.all_reduce(ctx, out, odd, config=reg_two_shot)
    check(out, reference("sum", [data(n, torch.float32, 8890 + q) for q in range(W)], torch.float32),
          "agreed all_reduce, one rank's input unaligned")
    if dev.type != "cuda":
        mixed = inp if r == 0 else torch.empty(n, dtype=torch.float32)
        mixed.copy_(data(n, torch.float32, 8895 + r))
        ccl.all_reduce(ctx, out, mixed, config=reg_two_shot)
        check(out, reference("sum", [data(n, torch.float32, 8895 + q) for q in range(W)], torch.float32),
              "agreed all_reduce, a plain tensor on one rank, heap tensors on the others")
    assert W == 1 or len(cache) == before, "a tensor that cannot be registered must not be"

    # heap tensors at the same offset on every rank: the heap's translation, no registration
    if dev.type != "cuda":
        same = tensor(n, torch.float32, shift=0)
        same.copy_(data(n, torch.float32, 8896 + r))
        assert [x.ident for x in ctx.reach([same])] == [("heap",)]
        ccl.all_reduce(ctx, same, same, config=reg_two_shot)
        check(same, reference("sum", [data(n, torch.float32, 8896 + q) for q in range(W)], torch.float32),
              "agreed all_reduce, same heap offsets")
        assert len(cache) == before, "heap tensors at one offset need no registration"

    if W > 1:  # the least recently used goes past the capacity, the same one on every rank
        capacity, cache.capacity = cache.capacity, 2
        a, b, c = (tensor(64, torch.float32) for _ in range(3))
        serial = {}
        for name, t in (("a", a), ("b", b), ("a", a), ("c", c)):
            t.copy_(data(64, torch.float32, 8897 + r))
            ccl.all_reduce(ctx, t, t, config=reg_two_shot)
            check(t, reference("sum", [data(64, torch.float32, 8897 + q) for q in range(W)], torch.float32),
                  f"agreed all_reduce in place, tensor {name}")
            serial[name] = ctx.reach([t])[0].ident
        assert len(cache) == 2, f"capacity 2, {len(cache)} cached"
        assert ctx.reach([a])[0].ident == serial["a"], "a was used more recently than b: it stays"
        assert ctx.reach([b])[0].ident != serial["b"], "b was the least recently used: closed, registered anew"
        cache.capacity = capacity
        assert ctx.registrations_generation == explicit_generation, "registrations on the fly dropped the plans"
        # what a rank remembers of a tensor (its status, per storage) goes with any change of the
        # registrations: registered explicitly, a tensor is found in that registration; closed
        # again, in the cached one
        explicit = ctx.register(a)
        assert ctx.reach([a])[0].ident == ("registered", (explicit.serial, 0)), (ctx.reach([a]), explicit.serial)
        explicit.close()
        assert ctx.reach([a])[0].ident == serial["a"], "the cached registration again, once the explicit one closed"
        expect_error(lambda: ccl.all_reduce(ctx, out, inp, config=ccl.Config(register="yes")), IrisUsageError,
                     "config.register='yes'", "True, False or None")
    ctx.barrier()
    cache.close()
    assert len(cache) == 0
    for slab in reversed(slabs):
        ctx.free(slab)


def scenario_late_first_call(ctx):
    # The first call of a shape creates its workspace (flags zeroed on the stream). Rank 0 comes
    # 0.5 s late, as behind a long GEMM: the others' kernels must not signal into its flags before
    # its zero fill (which would erase the signals and hang both sides); workspace creation waits
    # for every rank. Fresh workspaces for each collective with flags.
    ctx.barrier()
    ccl.clear_workspaces(ctx)
    cases = [lambda: run_all_reduce(ctx, 333, torch.float32, "sum", 900),
             lambda: run_all_reduce(ctx, 333, torch.float32, "sum", 901, TWO_SHOT),
             lambda: run_reduce_scatter(ctx, 77, torch.float32, "sum", 902),
             lambda: run_all_gather(ctx, 77, torch.float32, 903)]
    for case in cases:
        if ctx.rank == 0:
            iris.runtime.testing.busy_stream(ctx, 0.5)
        case()


def scenario_mixed_sequence(ctx):
    # different collectives (and a device barrier) back to back, no host barrier between them
    for k in range(3):
        run_all_reduce(ctx, 20, torch.float32, "sum", 7000 + k, TWO_SHOT, heap_in=True, heap_out=True,
                       in_place=True)
        run_all_gather(ctx, 9, torch.bfloat16, 7100 + k)
        ccl.barrier(ctx)
        run_reduce_scatter(ctx, 11, torch.float32, "max", 7200 + k)
        run_all_to_all(ctx, 3, torch.int32, 7300 + k)
        run_broadcast(ctx, 7, torch.float16, 7400 + k, k % ctx.world_size)
        run_all_reduce(ctx, 20, torch.float32, "min", 7500 + k, SMALL)


def scenario_argument_errors(ctx):
    W, dev = ctx.world_size, ctx.device
    f32 = dict(dtype=torch.float32, device=dev)
    x = torch.zeros(8, **f32)
    ar = "iris.collectives.ccl.all_reduce"
    expect_error(lambda: ccl.all_reduce(ctx, x, x, op="mean"), IrisUsageError, ar, "op='mean'", "'avg'")
    ints = torch.zeros(8, dtype=torch.int32, device=dev)
    expect_error(lambda: ccl.all_reduce(ctx, ints, ints, op="avg"), IrisUsageError, ar, "torch.int32",
                 "float dtype", "op='sum'")
    expect_error(lambda: ccl.all_reduce(ctx, torch.zeros(9, **f32), x), IrisUsageError, ar, "out has shape (9,)",
                 "inp (8,)")
    expect_error(lambda: ccl.all_reduce(ctx, x, x.to(torch.float16)), UnsupportedDtypeError, ar,
                 "out is torch.float32 but inp is torch.float16")
    u8 = torch.zeros(8, dtype=torch.uint8, device=dev)
    expect_error(lambda: ccl.all_reduce(ctx, u8, u8), UnsupportedDtypeError, ar, "torch.uint8", "torch.float32")
    strided = torch.zeros(8, 2, **f32)[:, 0]
    expect_error(lambda: ccl.all_reduce(ctx, strided, strided), IrisUsageError, ar, "not contiguous",
                 ".contiguous()")
    expect_error(lambda: ccl.all_reduce(ctx, x, [1, 2]), IrisUsageError, ar, "inp must be a torch.Tensor")
    expect_error(lambda: ccl.all_reduce(ctx, torch.zeros(0, **f32), torch.zeros(0, **f32)), IrisUsageError, ar,
                 "empty")
    big = torch.zeros(16, **f32)
    expect_error(lambda: ccl.all_reduce(ctx, big[4:12], big[0:8]), IrisUsageError, ar, "overlap", "out=inp")
    expect_error(lambda: ccl.all_reduce(ctx, x, x, config=ccl.Config(block=48)), IrisUsageError, ar,
                 "config.block=48", "power of two")
    expect_error(lambda: ccl.all_reduce(ctx, x, x, config=ccl.Config(block=64, width=16, chunk=96)), IrisUsageError, ar,
                 "config.chunk=96", "multiple of config.block=64")
    expect_error(lambda: ccl.all_reduce(ctx, x, x, config=ccl.Config(block=64, width=16, heap_chunk=100)),
                 IrisUsageError, ar, "config.heap_chunk=100", "multiple of config.block=64")
    expect_error(lambda: ccl.all_reduce(ctx, x, x, config=ccl.Config(variant="ring")), IrisUsageError, ar,
                 "config.variant='ring'", "one_shot")
    expect_error(lambda: ccl.all_reduce(ctx, x, x, config={"block": 64}), IrisUsageError, ar,
                 "must be an iris.collectives.ccl.Config")
    meta = torch.zeros(8, dtype=torch.float32, device="meta")
    expect_error(lambda: ccl.all_reduce(ctx, meta, meta), IrisUsageError, ar, "inp is on meta", f"runs on {dev}")
    # a cached plan is never run for a non-contiguous view of the same memory and shape: the key
    # holds each tensor's contiguity, so the view misses and its checks refuse it
    square, result = torch.zeros(4, 4, **f32), torch.zeros(4, 4, **f32)
    ccl.all_reduce(ctx, result, square)
    expect_error(lambda: ccl.all_reduce(ctx, result, square.t()), IrisUsageError, ar, "inp (shape (4, 4), "
                 "strides (1, 4)) is not contiguous")
    ccl.all_reduce(ctx, result, square)
    expect_error(lambda: ccl.all_reduce(ctx, result.t(), square), IrisUsageError, ar, "out (shape (4, 4), "
                 "strides (1, 4)) is not contiguous")
    ag = "iris.collectives.ccl.all_gather"
    expect_error(lambda: ccl.all_gather(ctx, torch.zeros(8 * W + 1, **f32), x), IrisUsageError, ag,
                 f"out has shape ({8 * W + 1},)", f"({8 * W},)")
    rs = "iris.collectives.ccl.reduce_scatter"
    expect_error(lambda: ccl.reduce_scatter(ctx, torch.zeros(3, **f32), torch.zeros(3 * W + 1, **f32)),
                 IrisUsageError, rs, "inp has shape", f"{W} x out's elements")
    if W > 1:
        # the right number of elements in the wrong rows: filled in flat order it would hold the
        # ranks' rows side by side, not one under the other
        rows = torch.zeros(4, 2, **f32)
        expect_error(lambda: ccl.all_gather(ctx, torch.zeros(4, 2 * W, **f32), rows), IrisUsageError, ag,
                     f"out has shape (4, {2 * W})", f"{W} x its rows along dim 0", f"({4 * W}, 2)")
        expect_error(lambda: ccl.reduce_scatter(ctx, torch.zeros(4, 2, **f32), torch.zeros(4, 2 * W, **f32)),
                     IrisUsageError, rs, f"inp has shape (4, {2 * W})", f"({4 * W}, 2)")
        a2a = "iris.collectives.ccl.all_to_all"
        odd = torch.zeros(W + 1, **f32)
        expect_error(lambda: ccl.all_to_all(ctx, odd.clone(), odd), IrisUsageError, a2a, f"({W + 1},)",
                     f"multiple of {W}")
        # an out shorter than inp would be written past its end
        expect_error(lambda: ccl.all_to_all(ctx, torch.zeros(W, **f32), torch.zeros(2 * W, **f32)), IrisUsageError,
                     a2a, f"out has shape ({W},) but inp ({2 * W},)", "an out of inp's shape")
    expect_error(lambda: ccl.broadcast(ctx, x, W), RankError, "broadcast", f"rank {W} is outside")
    expect_error(lambda: ccl.broadcast(ctx, x, -1), RankError, "broadcast", f"rank -1 is outside [0, {W})")


# --- point to point ---------------------------------------------------------------------------------------

#: Mailboxes small enough that the scenarios' messages take several tiles, programs and chunks: an
#: inbox of 2 chunks of 1 KiB (256 fp32), tiles of 128 B.
P2P = dict(tags=4, slots=2, chunk_bytes=1024, block_bytes=128)


def message(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """What a rank sends (small integers, exact in every dtype), the same wherever generated."""
    return data(n, dtype, seed, -100, 100)


def scenario_p2p_ring(ctx):
    # Every rank sends to the next and receives from the one before, every dtype, 1 element to
    # several chunks (a message 4x the inbox flows through it: the sender waits for the receiver's
    # credits), plain tensors and heap tensors on either side; back to back with no barrier.
    ccl.init_p2p(ctx, **P2P)
    W, r = ctx.world_size, ctx.rank
    if W == 1:
        return
    nxt, prev = (r + 1) % W, (r - 1) % W
    cases = [(1, torch.float32), (37, torch.bfloat16), (300, torch.float16), (2048, torch.float32),
             (129, torch.int32), (520, torch.int64), (70, torch.float64)]
    for i, (n, dtype) in enumerate(cases):
        heap_send, heap_recv = i % 3 == 1, i % 3 == 2
        out = poison(place(ctx, torch.empty(n, dtype=dtype), heap_recv))
        x = place(ctx, message(n, dtype, 100 * i + r), heap_send)
        # even ranks send first, odd ranks receive first: no cycle of senders waiting for credits
        if r % 2 == 0:
            ccl.send(ctx, x, nxt)
            ccl.recv(ctx, out, prev)
        else:
            ccl.recv(ctx, out, prev)
            ccl.send(ctx, x, nxt)
        check(out, message(n, dtype, 100 * i + prev), f"ring recv of {n} x {dtype}, heap {heap_send}/{heap_recv}")
    # non-blocking, 2-D tensors (only the element count matters), back to back on one channel with
    # sizes alternating (the counters pair chunks across messages)
    for k in range(6):
        n = (5, 700)[k % 2]
        out = poison(torch.empty(n // 5, 5, device=ctx.device))
        x = message(n, torch.float32, 900 + k + r).reshape(n // 5, 5).to(ctx.device)
        if r % 2 == 0:  # on the cpu backend each call runs at once: the same order as above
            works = [ccl.isend(ctx, x, nxt, tag=1), ccl.irecv(ctx, out, prev, tag=1)]
        else:
            works = [ccl.irecv(ctx, out, prev, tag=1), ccl.isend(ctx, x, nxt, tag=1)]
        for work in works:
            work.wait()
        check(out.flatten(), message(n, torch.float32, 900 + k + prev), f"back-to-back message {k} ({n})")


def scenario_p2p_order_and_tags(ctx):
    # Between ranks 0 and 1 (the others only pass): the receive posted first and the send late,
    # and the other way round (a message larger than the inbox waits for the receiver); several
    # tags in flight, received in the reverse order; non-blocking forms; an exchange of messages
    # larger than the inbox in both directions at once (batch_isend_irecv, the two ranks listing
    # their operations in different orders).
    ccl.init_p2p(ctx, **P2P)
    r = ctx.rank
    if ctx.world_size == 1 or r > 1:
        return
    peer = 1 - r
    # three small messages back to back, the receiver late: the inbox holds two, so the third send
    # waits for the first one's credit before it writes that slot again
    if r == 0:
        for j in range(3):
            ccl.send(ctx, message(200, torch.float32, 90 + j).to(ctx.device), 1, tag=2)
    else:
        iris.runtime.testing.busy_stream(ctx, 0.3)
        for j in range(3):
            out = poison(torch.empty(200, device=ctx.device))
            ccl.recv(ctx, out, 0, tag=2)
            check(out, message(200, torch.float32, 90 + j), f"message {j} of three back to back past the inbox")
    for late, n in ((0, 40), (1, 40), (1, 1500)):
        if r == late:
            iris.runtime.testing.busy_stream(ctx, 0.3)
        if r == 0:
            ccl.send(ctx, message(n, torch.float32, 50 + late).to(ctx.device), 1, tag=2)
        else:
            out = poison(torch.empty(n, device=ctx.device))
            ccl.recv(ctx, out, 0, tag=2)
            check(out, message(n, torch.float32, 50 + late), f"late rank {late}, {n} elements")
    tags = range(P2P["tags"])
    if r == 0:  # every tag's message sits in its inbox until rank 1 asks for it
        for tag in tags:
            ccl.send(ctx, message(30 + tag, torch.bfloat16, 70 + tag).to(ctx.device), 1, tag=tag)
    else:
        for tag in reversed(tags):
            out = poison(torch.empty(30 + tag, dtype=torch.bfloat16, device=ctx.device))
            work = ccl.irecv(ctx, out, 0, tag=tag)
            assert work.wait() and (ctx.device.type == "cuda" or work.is_completed())
            check(out, message(30 + tag, torch.bfloat16, 70 + tag), f"tag {tag}, received last-first")
    if ctx.device.type == "cuda":  # the send on a stream of the user's, its recv on the current stream
        stream = torch.cuda.Stream(ctx.device)
        out = poison(torch.empty(500, device=ctx.device))
        x = message(500, torch.float32, 60).to(ctx.device)
        if r == 0:
            iris.runtime.testing.busy_stream(ctx, 0.1)  # the current stream busy: the side stream is not
            with torch.cuda.stream(stream):
                ccl.send(ctx, x, 1, tag=3)
        else:
            ccl.recv(ctx, out, 0, tag=3)
            check(out, message(500, torch.float32, 60), "a send on another stream")
        torch.cuda.synchronize(ctx.device)
    n = 1300  # 5 chunks of fp32 each way: the exchange needs both directions to progress together
    mine = message(n, torch.float32, 80 + r).to(ctx.device)
    theirs = poison(torch.empty(n, device=ctx.device))
    ops = [ccl.P2POp(ccl.isend, mine, peer), ccl.P2POp(ccl.irecv, theirs, peer)]
    works = ccl.batch_isend_irecv(ctx, ops if r == 0 else ops[::-1])
    for work in works:
        work.wait()
    check(theirs, message(n, torch.float32, 80 + peer), "batch exchange larger than the inbox")


def scenario_p2p_errors(ctx):
    # Argument errors name the call, the values and the fix; a message of another size than its
    # receive fails on the receiver (on the cpu backend an exception: on the GPU the watchdog ends
    # the job, see docs/ccl.md) and the channel still works afterwards.
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    x = torch.zeros(8, device=dev)
    ctx.barrier()
    ccl.clear_workspaces(ctx)
    expect_error(lambda: ccl.send(ctx, x, (r + 1) % W), IrisUsageError, "iris.collectives.ccl.send",
                 "no point-to-point mailboxes", "init_p2p(ctx)")
    init = "iris.collectives.ccl.init_p2p"
    expect_error(lambda: ccl.init_p2p(ctx, tags=0), IrisUsageError, init, "tags=0", "positive")
    expect_error(lambda: ccl.init_p2p(ctx, chunk_bytes=1000), IrisUsageError, init, "chunk_bytes=1000",
                 "power of two")
    expect_error(lambda: ccl.init_p2p(ctx, chunk_bytes=256, block_bytes=512), IrisUsageError, init,
                 "block_bytes=512", "chunk_bytes=256")
    if W > 1:  # every rank raises, naming the odd one (the call agreement: init_p2p is collective)
        expect_error(lambda: ccl.init_p2p(ctx, **dict(P2P, tags=2 + (r == W - 1))), iris.runtime.IrisCallMismatchError,
                     init, f"rank {W - 1} called {init}(tags=3, slots=2", "Every rank must make the same collective")
    settings = ccl.init_p2p(ctx, **P2P)
    # per channel: the inbox, 2 slot records and a request of 4 int64 per program, 8 int32 counters per program
    assert settings.heap_bytes(W) == (W - 1) * 4 * (2 * 1024 + 32 * 3 * settings.grid + 32 * settings.grid)
    send, recv = "iris.collectives.ccl.send", "iris.collectives.ccl.recv"
    expect_error(lambda: ccl.send(ctx, x, r), IrisUsageError, send, f"dst={r} is this rank", "another rank")
    expect_error(lambda: ccl.recv(ctx, x, W), RankError, recv, f"rank {W} is outside", f"0 .. {W - 1}")
    expect_error(lambda: ccl.send(ctx, x, -1), RankError, f"{send}(dst=...)", "rank -1")
    if W > 1:
        peer = (r + 1) % W
        expect_error(lambda: ccl.send(ctx, x, peer, tag=4), IrisUsageError, send, "tag=4", "0 .. 3",
                     "init_p2p(ctx, tags=...)")
        expect_error(lambda: ccl.recv(ctx, torch.zeros(8, 2, device=dev)[:, 0], peer), IrisUsageError, recv,
                     "not contiguous", ".contiguous()")
        expect_error(lambda: ccl.send(ctx, torch.zeros(8, dtype=torch.uint8, device=dev), peer),
                     UnsupportedDtypeError, send, "torch.uint8")
        expect_error(lambda: ccl.batch_isend_irecv(ctx, [ccl.P2POp("put", x, peer)]), IrisUsageError,
                     "batch_isend_irecv", "ops[0]", "ccl.isend or ccl.irecv")
        expect_error(lambda: ccl.batch_isend_irecv(ctx, []), IrisUsageError, "batch_isend_irecv", "non-empty")
    if W > 1 and r <= 1 and ctx.device.type != "cuda":
        # 10 sent, 12 expected (one chunk, one program on both ends): the receiver says so, and
        # credits the chunk, so the next message of the channel arrives intact
        if r == 0:
            ccl.send(ctx, message(10, torch.float32, 60).to(dev), 1, tag=3)
            ccl.send(ctx, message(12, torch.float32, 61).to(dev), 1, tag=3)
        else:
            out = poison(torch.empty(12, device=dev))
            expect_error(lambda: ccl.recv(ctx, out, 0, tag=3), IrisMessageSizeError, recv,
                         "rank 1 received a message from rank 0 with tag 3 of 10 x float32",
                         "expects 12 x float32", "same number of elements and dtype")
            ccl.recv(ctx, out, 0, tag=3)
            check(out, message(12, torch.float32, 61), "the channel after a mismatch")


def scenario_p2p_registered(ctx):
    # Large messages to or from registered tensors (ctx.register) are copied once where they are,
    # the registration's table giving the peer's address: plain tensors on the GPU, heap tensors
    # elsewhere (the only ones the other backends register; a registered heap tensor takes this
    # path too, before the heap's). Views at different offsets on the two ranks (each rank's view
    # is its own place in the registration), in two registrations (the second's place in
    # ctx.registrations is 1 until the first is closed, then 0: the table and the plans follow);
    # pulled (registered sender), pushed (registered receiver) and both; the receive late and the
    # send late; an exchange in both directions at once in a batch; a size mismatch against a
    # registered receiver (refused, the channel goes on).
    ccl.init_p2p(ctx, **P2P)
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    n, size = 1500, 4096  # 6000 B of fp32: 6 chunks, more than the inbox; two of them fit apart

    def registrable():
        return torch.zeros(size, device=dev) if ctx.backend == "cuda" else ctx.zeros(size)

    first, second = ctx.register(registrable()), ctx.register(registrable())
    assert ctx.registrations == (first, second) and ctx.registration_of(second.tensor[5:9]) is second
    if W > 1 and r <= 1:
        peer = 1 - r
        at = {0: 100, 1: 300}  # each rank's view starts elsewhere in its registered tensor
        for k, registration in enumerate((second, first)):
            for i, (reg_send, reg_recv) in enumerate([(True, False), (False, True), (True, True)]):
                late = i % 2
                seed = 6000 + 100 * k + 10 * i
                if r == late:
                    iris.runtime.testing.busy_stream(ctx, 0.2)
                view = registration.tensor[at[r]:at[r] + n]
                if r == 0:
                    x = view if reg_send else torch.empty(n, device=dev)
                    x.copy_(message(n, torch.float32, seed).to(dev))
                    ccl.send(ctx, x, 1, tag=1)
                    x.fill_(-7)  # the send has returned: the tensor is the sender's again
                else:
                    out = poison(view if reg_recv else torch.empty(n, device=dev))
                    ccl.recv(ctx, out, 0, tag=1)
                    check(out, message(n, torch.float32, seed), f"registration {1 - k}: registered sender {reg_send}, "
                                                                f"registered receiver {reg_recv}, late rank {late}")
        # both directions at once, registered on both ends, the two ranks listing their ops in other orders
        mine, theirs = second.tensor[:n], poison(second.tensor[size - n:])
        mine.copy_(message(n, torch.float32, 6500 + r).to(dev))
        ops = [ccl.P2POp(ccl.isend, mine, peer, tag=2), ccl.P2POp(ccl.irecv, theirs, peer, tag=2)]
        for work in ccl.batch_isend_irecv(ctx, ops if r == 0 else ops[::-1]):
            work.wait()
        check(theirs, message(n, torch.float32, 6500 + peer), "registered exchange in both directions")
        # a size mismatch against a registered receiver (cpu backend: on the GPU the watchdog's
        # report ends the job): refused with no copy, the channel goes on
        if ctx.device.type != "cuda":
            if r == 0:
                ccl.send(ctx, message(n + 4, torch.float32, 6600).to(dev), 1, tag=3)
                ccl.send(ctx, message(n, torch.float32, 6601).to(dev), 1, tag=3)
            else:
                target = second.tensor[:n]
                target.fill_(5)
                expect_error(lambda: ccl.recv(ctx, target, 0, tag=3), IrisMessageSizeError,
                             f"of {n + 4} x float32", f"expects {n} x float32")
                assert bool((target == 5).all()), "a refused message was copied into the registered tensor"
                ccl.recv(ctx, target, 0, tag=3)
                check(target, message(n, torch.float32, 6601), "a registered receiver after a refused message")
    ctx.barrier()
    first.close()
    assert ctx.registrations == (second,)
    if W > 1 and r <= 1:  # the second registration is now the table's first row
        if r == 0:
            second.tensor[7:7 + n].copy_(message(n, torch.float32, 6700).to(dev))
            ccl.send(ctx, second.tensor[7:7 + n], 1, tag=0)
        else:
            out = poison(second.tensor[11:11 + n])
            ccl.recv(ctx, out, 0, tag=0)
            check(out, message(n, torch.float32, 6700), "after the first registration closed")
    ctx.barrier()
    second.close()


def scenario_p2p_single_copy(ctx):
    # Large messages (more than an inbox: 2 KiB here) with a heap tensor on one side or both are
    # copied once: pulled from the sender's heap tensor, or pushed into the receiver's. Between ranks
    # 0 and 1 (the others only allocate alike): each way of placing the tensors, with the receive
    # posted first and the send late and the other way round, back to back on one channel with
    # small messages between (the counters pair units across protocols); several tags in flight
    # and an exchange in both directions at once (batches); a heap tensor sent twice in a row
    # (the sender waits for the pull before it returns, so it may change the tensor at once);
    # size mismatches between heap and plain tensors (both ways, and a large message against a
    # small receive and the other way round): the receiver raises, the sender returns, and the
    # channel goes on.
    ccl.init_p2p(ctx, **P2P)
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    n = 1500  # 6000 B of fp32: 6 chunks, more than the inbox
    # heap tensors allocated alike on every rank (the heap's allocations stay in step)
    heap_x = ctx.zeros(n)
    heap_y = ctx.zeros(n)
    heap_b = ctx.zeros(700, dtype=torch.bfloat16)
    heap_z = ctx.zeros(900, dtype=torch.int64)
    heap_outs = {1: ctx.zeros(700, dtype=torch.bfloat16), 3: ctx.zeros(900, dtype=torch.int64)}
    if W == 1 or r > 1:
        return
    peer = 1 - r
    ways = [(True, False), (False, True), (True, True), (False, False)]  # (sender on the heap, receiver on the heap)
    for i, (heap_send, heap_recv) in enumerate(ways):
        for late in (0, 1):
            seed = 4000 + 10 * i + late
            if r == late:
                iris.runtime.testing.busy_stream(ctx, 0.2)
            if r == 0:
                x = heap_x if heap_send else torch.empty(n, device=dev)
                x.copy_(message(n, torch.float32, seed).to(dev))
                ccl.send(ctx, x, 1, tag=1)
                x.fill_(-7)  # the send has returned: the tensor is the sender's again
                ccl.send(ctx, message(9, torch.float32, seed + 500).to(dev), 1, tag=1)  # small, between
            else:
                out = poison(heap_y if heap_recv else torch.empty(n, device=dev))
                ccl.recv(ctx, out, 0, tag=1)
                check(out, message(n, torch.float32, seed), f"send on heap {heap_send}, recv on heap {heap_recv}, "
                                                            f"late rank {late}")
                small = poison(torch.empty(9, device=dev))
                ccl.recv(ctx, small, 0, tag=1)
                check(small, message(9, torch.float32, seed + 500), "a small message after a large one")
    # several tags in flight, received in another order: a batch on each rank (a large send waits
    # for its receive, so one at a time each would wait for ever)
    tensors = {0: (heap_x, n, torch.float32), 1: (heap_b, 700, torch.bfloat16), 2: (None, 1000, torch.float32),
               3: (heap_z, 900, torch.int64)}
    if r == 0:
        ops = []
        for tag, (t, m, dtype) in tensors.items():
            t = torch.empty(m, dtype=dtype, device=dev) if t is None else t
            t.copy_(message(m, dtype, 4100 + tag).to(dev))
            ops.append(ccl.P2POp(ccl.isend, t, 1, tag=tag))
    else:
        outs = {tag: poison(heap_outs.get(tag, torch.empty(m, dtype=dtype, device=dev)))
                for tag, (_, m, dtype) in tensors.items()}
        ops = [ccl.P2POp(ccl.irecv, outs[tag], 0, tag=tag) for tag in (2, 0, 3, 1)]
    for work in ccl.batch_isend_irecv(ctx, ops):
        work.wait()
    if r == 1:
        for tag, (_, m, dtype) in tensors.items():
            check(outs[tag], message(m, dtype, 4100 + tag), f"tag {tag} of a batch, received in another order")
    # both directions at once, each way of placing the tensors, the two ranks listing their ops in
    # different orders
    for i, (heap_send, heap_recv) in enumerate(ways):
        mine = heap_x if heap_send else torch.empty(n, device=dev)
        mine.copy_(message(n, torch.float32, 4200 + 10 * i + r).to(dev))
        theirs = poison(heap_y if heap_recv else torch.empty(n, device=dev))
        ops = [ccl.P2POp(ccl.isend, mine, peer, tag=2), ccl.P2POp(ccl.irecv, theirs, peer, tag=2)]
        for work in ccl.batch_isend_irecv(ctx, ops if r == 0 else ops[::-1]):
            work.wait()
        check(theirs, message(n, torch.float32, 4200 + 10 * i + peer), f"exchange, heap {heap_send}/{heap_recv}")
    if ctx.device.type == "cuda":
        return  # on the GPU a size mismatch ends the job (the watchdog's report; fault_worker.py message_size)
    recv = "iris.collectives.ccl.recv"
    # (sender's elements, on its heap; receiver's elements, on its heap): large against large both
    # ways, a large offer against a small receive (1200 B: two chunks, the same grid) and a small
    # message (one chunk, the same grid) against a large receive
    for sent, heap_send, wanted, heap_recv in ((n, True, n - 100, False), (n - 100, False, n, True),
                                               (n, True, 300, False), (n, False, 300, False),
                                               (100, False, n, True)):
        if r == 0:
            x = heap_x[:sent] if heap_send else torch.empty(sent, device=dev)
            x.copy_(message(sent, torch.float32, 4300).to(dev))
            ccl.send(ctx, x, 1, tag=3)
            ccl.send(ctx, message(n, torch.float32, 4301).to(dev), 1, tag=3)
        else:
            out = poison(heap_y[:wanted] if heap_recv else torch.empty(wanted, device=dev))
            expect_error(lambda: ccl.recv(ctx, out, 0, tag=3), IrisMessageSizeError, recv,
                         f"rank 1 received a message from rank 0 with tag 3 of {sent} x float32",
                         f"expects {wanted} x float32")
            after = poison(torch.empty(n, device=dev))
            ccl.recv(ctx, after, 0, tag=3)
            check(after, message(n, torch.float32, 4301), f"the channel after {sent} sent, {wanted} expected")


def scenario_rooted_collectives(ctx):
    # reduce, gather and scatter at every root: every op, several dtypes, heap and plain tensors,
    # in rounds through the staging buffer; results exact (reduce in rank order: the all-reduce's
    # bits); the other ranks' out (reduce, gather) and inp (scatter) may be None and are untouched
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    for root in range(W):
        for i, (dtype, op) in enumerate(((torch.float32, "sum"), (torch.bfloat16, "avg"), (torch.int32, "max"),
                                         (torch.float16, "min"), (torch.int64, "prod"))):
            n = (37, 150, 5, 64, 20)[i]
            low, high = (-2, 3) if op == "prod" else (-4, 5)
            seed = 10_000 + 100 * root + 10 * i
            inp = place(ctx, data(n, dtype, seed + r, low, high), heap=i == 1)
            out = poison(torch.empty(n, dtype=dtype, device=dev)) if r == root or i % 2 else None
            before = None if out is None else out.clone()
            result = ccl.reduce(ctx, out, inp, root, op=op, config=SMALL)
            if r == root:
                assert result is out
                check(out, reference(op, [data(n, dtype, seed + q, low, high) for q in range(W)], dtype),
                      f"reduce to {root}, {dtype}, {op}")
            else:
                assert result is None and (out is None or torch.equal(out.view(-1).view(torch.uint8),
                                                                      before.view(-1).view(torch.uint8)))
        m = 45
        inp = place(ctx, data(m, torch.bfloat16, 11_000 + root + r).reshape(9, 5), heap=root % 2 == 1)
        out = poison(torch.empty(9 * W, 5, dtype=torch.bfloat16, device=dev)) if r == root else None
        assert ccl.gather(ctx, out, inp, root, config=SMALL) is out
        if r == root:
            check(out, torch.cat([data(m, torch.bfloat16, 11_000 + root + q) for q in range(W)]), f"gather to {root}")
        full = data(W * m, torch.float32, 12_000 + root).reshape(3 * W, 15)
        part = poison(torch.empty(3, 15, device=dev))
        assert ccl.scatter(ctx, part, full.to(dev) if r == root else None, root, config=SMALL) is part
        check(part, full[3 * r:3 * r + 3], f"scatter from {root}")
    # rounds: chunk of 2 tiles, tensors off the heap
    rounds = ccl.Config(block=64, width=16, chunk=128)
    inp = data(450, torch.float32, 13_000 + r).to(dev)
    out = poison(torch.empty(450, device=dev))
    ccl.reduce(ctx, out, inp, W - 1, config=rounds)
    if r == W - 1:
        check(out, reference("sum", [data(450, torch.float32, 13_000 + q) for q in range(W)], torch.float32),
              "reduce in rounds")
    gathered = poison(torch.empty(450 * W, device=dev))
    ccl.gather(ctx, gathered, inp, 0, config=rounds)
    if r == 0:
        check(gathered, torch.cat([data(450, torch.float32, 13_000 + q) for q in range(W)]), "gather in rounds")
    ccl.scatter(ctx, out, gathered if r == 0 else None, 0, config=rounds)
    check(out, data(450, torch.float32, 13_000 + r), "scatter in rounds")
    # errors name the call, the values and the fix
    x = torch.zeros(8, device=dev)
    expect_error(lambda: ccl.reduce(ctx, x, x, W), RankError, "iris.collectives.ccl.reduce(dst=...)",
                 f"rank {W} is outside")
    expect_error(lambda: ccl.reduce(ctx, torch.zeros(9, device=dev), x, r), IrisUsageError, "ccl.reduce",
                 "out has shape (9,)", "on the root")
    expect_error(lambda: ccl.gather(ctx, torch.zeros(8 * W + 1, device=dev), x, r), IrisUsageError, "ccl.gather",
                 f"out has shape ({8 * W + 1},)")
    expect_error(lambda: ccl.scatter(ctx, x, torch.zeros(8 * W + 2, device=dev), r), IrisUsageError, "ccl.scatter",
                 "inp has shape", f"{W} x out's elements")
    expect_error(lambda: ccl.scatter(ctx, x, None, -1), RankError, "ccl.scatter(src=...)", "rank -1")


# --- variable-size all-to-all and MoE dispatch / combine ----------------------------------------------

#: Small blocks for the exchanges: rows of 16 elements cut into blocks of 8 columns, 2 programs.
SMALL_V = ccl.Config(block=8, grid=2)


def splits_of(q: int, W: int, seed: int, high: int = 5) -> torch.Tensor:
    """Rank q's in_splits in a call of seed ``seed`` (CPU): 0 .. high - 1 rows to each rank."""
    return torch.randint(0, high, (W,), generator=torch.Generator().manual_seed(70_000 + 100 * seed + q))


def run_all_to_all_v(ctx, rows: int, row_shape: tuple, dtype, seed: int, heap_in=False, split_dtype=torch.int64,
                     with_offsets=True, silent=(), config=SMALL_V):
    """One all_to_all_v of random splits (ranks in ``silent`` send nothing), checked exactly."""
    W, r, dev = ctx.world_size, ctx.rank, ctx.device

    def splits(q):  # at most rows in all
        return torch.zeros(W, dtype=torch.int64) if q in silent else splits_of(q, W, seed, rows // W + 1)

    def rows_of(q):
        n = rows * max(1, int(torch.tensor(row_shape).prod()))
        return data(n, dtype, seed * 10 + q).reshape(rows, *row_shape)

    inp = place(ctx, rows_of(r), heap_in)
    capacity = W * rows
    out = poison(torch.empty(capacity, *row_shape, dtype=dtype, device=dev))
    before = out.clone()
    out_splits = torch.full((W,), -1, dtype=split_dtype, device=dev)
    out_offsets = torch.full((W,), -1, dtype=split_dtype, device=dev) if with_offsets else None
    assert ccl.all_to_all_v(ctx, out, inp, splits(r).to(split_dtype).to(dev), out_splits, out_offsets,
                            config=config) is out
    got = [int(splits(q)[r]) for q in range(W)]
    parts = [rows_of(q)[int(splits(q)[:r].sum()):int(splits(q)[:r].sum()) + got[q]] for q in range(W)]
    expected = torch.cat(parts)
    what = f"all_to_all_v(rows={rows}, {row_shape}, {dtype}, seed {seed}, heap_in={heap_in})"
    assert out_splits.tolist() == got, f"{what}: out_splits {out_splits.tolist()}, expected {got}"
    if with_offsets:
        assert out_offsets.tolist() == [sum(got[:q]) for q in range(W)], f"{what}: out_offsets {out_offsets.tolist()}"
    check(out[:len(expected)], expected, what)
    check(out[len(expected):], before[len(expected):].cpu(), f"{what}: rows past the received ones")


def scenario_all_to_all_v(ctx):
    # split sizes on the device: random (zeros among them), dtypes, rows of one element and of
    # 2-D blocks (several column blocks), heap and plain inputs, int32 and int64 splits, a rank
    # that sends nothing; back to back with new splits in the same tensors (one plan); rows that do
    # not fit raise on the receiving rank alone (and the next call works); errors name the fix
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    cases = [(7, (), torch.float32), (6, (3, 7), torch.bfloat16), (9, (16,), torch.int64), (5, (20,), torch.float16)]
    for i, (rows, shape, dtype) in enumerate(cases):
        run_all_to_all_v(ctx, rows, shape, dtype, 10 + i, heap_in=i % 2 == 1,
                         split_dtype=(torch.int32, torch.int64)[i % 2], with_offsets=i != 2,
                         silent=(W - 1,) if i == 3 else ())
    run_all_to_all_v(ctx, 6, (16,), torch.float32, 20, config=ccl.Config())  # the default blocks and grid
    # back to back: the same tensors, new splits and rows each call, no barrier in between; up to 2
    # rows to each rank, so inp holds 2 x W rows (8 rows sent up to 16 at 8 ranks: rows that are not
    # there, which the GPU reports and ends the job for)
    R = 2 * W
    inp = torch.empty(R, 4, device=dev)
    out = torch.empty(R * W, 4, device=dev)
    send = torch.empty(W, dtype=torch.int64, device=dev)
    got = torch.empty(W, dtype=torch.int64, device=dev)
    for k in range(12):
        inp.copy_(data(4 * R, torch.float32, 300 + 10 * k + r).reshape(R, 4))
        send.copy_(splits_of(r, W, 300 + k, high=3))
        ccl.all_to_all_v(ctx, out, inp, send, got, config=SMALL_V)
        counts = [int(splits_of(q, W, 300 + k, high=3)[r]) for q in range(W)]
        starts = [int(splits_of(q, W, 300 + k, high=3)[:r].sum()) for q in range(W)]
        rows_of_q = [data(4 * R, torch.float32, 300 + 10 * k + q).reshape(R, 4) for q in range(W)]
        expected = torch.cat([rows_of_q[q][starts[q]:starts[q] + counts[q]] for q in range(W)])
        assert got.tolist() == counts, (k, got.tolist(), counts)
        check(out[:len(expected)], expected, f"back-to-back all_to_all_v call {k}")
    call = "iris.collectives.ccl.all_to_all_v"
    # Rows that do not fit: the cpu backend raises after the call; on the GPU the watchdog ends the
    # job (test_exchange_capacity_is_reported, alone: a job ended with kernels in flight can fault
    # every job sharing the GPU under MPS).
    x = torch.ones(2 * W, 3, device=dev)
    two = torch.full((W,), 2, dtype=torch.int64, device=dev)
    splits = torch.empty(W, dtype=torch.int64, device=dev)
    if ctx.device.type != "cuda":
        # rank 0 gets 2 rows from every rank into an out of 2 rows (the others have room)
        small = 2 if r == 0 else 2 * W
        attempt = lambda: ccl.all_to_all_v(ctx, torch.zeros(small, 3, device=dev), x, two, splits, config=SMALL_V)
        if r == 0 and W > 1:
            expect_error(attempt, IrisCapacityError, call, f"rank 0 receives {2 * W} rows but its output holds 2",
                         "larger output")
        else:
            attempt()
        run_all_to_all_v(ctx, 7, (), torch.float32, 30)  # the exchange goes on
        # the last rank asks for one row more than its inp has
        asked = torch.zeros(W, dtype=torch.int64, device=dev)
        asked[r] = 2 * W + (r == W - 1)
        attempt = lambda: ccl.all_to_all_v(ctx, torch.zeros(2 * W + 1, 3, device=dev), x, asked, splits, config=SMALL_V)
        if r == W - 1:
            expect_error(attempt, IrisCapacityError, call, f"rank {r}'s in_splits add up to {2 * W + 1} rows",
                         f"inp has {2 * W} rows")
        else:
            attempt()
        run_all_to_all_v(ctx, 7, (), torch.float32, 31)
    wrong = torch.zeros(W + 1, dtype=torch.int64, device=dev)
    expect_error(lambda: ccl.all_to_all_v(ctx, torch.zeros(8, device=dev), torch.zeros(4, device=dev), wrong, splits),
                 UnsupportedDtypeError, call, "in_splits", f"shape ({W},)")
    expect_error(lambda: ccl.all_to_all_v(ctx, torch.zeros(8, device=dev), torch.zeros(4, device=dev),
                                          two.float(), splits), UnsupportedDtypeError, call, "int32 or int64")
    expect_error(lambda: ccl.all_to_all_v(ctx, torch.zeros(8, 2, device=dev), torch.zeros(4, 3, device=dev), two,
                                          splits), IrisUsageError, call, "same shape", "(capacity, 3)")


def moe_inputs(q: int, seed: int, T: int, H: int, E: int, K: int, dtype, pattern: str):
    """Rank q's tokens ``[T, H]``, top-k experts ``[T, K]`` and weights (CPU): ``random`` (K distinct
    experts per token), ``skewed`` (every token's first expert is expert 0), ``masked`` (the last
    slot of every other token is -1: no expert)."""
    g = torch.Generator().manual_seed(80_000 + 1000 * seed + q)
    x = torch.randint(-8, 9, (T, H), generator=g).to(dtype) / 4
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]) if T else torch.zeros(0, K).long()
    if pattern == "skewed" and T:
        idx = torch.stack([torch.cat([torch.zeros(1).long(), 1 + torch.randperm(E - 1, generator=g)[:K - 1]])
                           for _ in range(T)])
    if pattern == "masked" and T:
        idx[::2, -1] = -1
    weights = torch.rand(T, K, generator=g)
    return x, idx, weights


def moe_expected(r: int, W: int, seed: int, tokens: list, H: int, G: int, K: int, dtype, pattern: str):
    """Rank r's rows and weights per local expert, in the documented order (source rank, then
    token and slot), from every rank's inputs."""
    per_expert = []
    for g in range(G):
        rows, weights = [], []
        for q in range(W):
            x, idx, w = moe_inputs(q, seed, tokens[q], H, W * G, K, dtype, pattern)
            for t in range(tokens[q]):
                for k in range(K):
                    if idx[t, k] == r * G + g:
                        rows.append(x[t])
                        weights.append(float(w[t, k]))
        per_expert.append((rows, weights))
    return per_expert


def expert_function(rows: torch.Tensor) -> torch.Tensor:
    """What the 'experts' compute in these checks: exact in every dtype here."""
    return rows * 2 + 1


def run_moe(ctx, seed: int, tokens: list, H: int, G: int, K: int, dtype, pattern: str, padded: bool, group=None,
            grad: bool = False):
    """A dispatch and a combine, checked exactly against the single-process reference: rows,
    counts, offsets, row weights, padding zeros, and the weighted sums in slot order. On
    ``group``, ranks (inputs, experts, ``tokens``) are group ranks: the reference is that of a
    context of the group's size. ``grad``: through autograd (the torch operators), and ``x``'s
    gradient checked too."""
    W, r, dev = (ctx.world_size, ctx.rank, ctx.device) if group is None else (group.size, group.rank, ctx.device)
    E = W * G
    x, idx, w = moe_inputs(r, seed, tokens[r], H, E, K, dtype, pattern)
    mt = max(tokens)
    options = dict(expert_capacity=W * mt) if padded else {}
    xd = x.to(dev).requires_grad_(grad)
    expert_x, meta, handle = moe.dispatch(ctx, xd, idx.to(dev), w.to(dev), E, max_tokens=mt,
                                          config=SMALL_V, group=group, **options)
    what = f"group {list(group.ranks)}: " if group is not None else ""
    what += f"moe(seed {seed}, tokens {tokens}, {dtype}, {pattern}, padded={padded})"
    per_expert = moe_expected(r, W, seed, tokens, H, G, K, dtype, pattern)
    counts = [len(rows) for rows, _ in per_expert]
    assert meta.counts.tolist() == counts, f"{what}: counts {meta.counts.tolist()}, expected {counts}"
    if padded:
        assert expert_x.shape == (G, W * mt, H)
        assert meta.offsets.tolist() == [g * W * mt for g in range(G + 1)], meta.offsets
        for g, (rows, weights) in enumerate(per_expert):
            if rows:
                check(expert_x[g, :len(rows)], torch.stack(rows), f"{what}: expert {g}'s rows")
            check(expert_x[g, len(rows):], torch.zeros(W * mt - len(rows), H, dtype=dtype), f"{what}: padding")
            wrow = meta.weights.reshape(G, -1)[g]
            check(wrow, torch.tensor(weights + [0.0] * (W * mt - len(rows))), f"{what}: row weights of {g}")
    else:
        assert meta.offsets.tolist() == [sum(counts[:g]) for g in range(G + 1)], meta.offsets
        rows = [row for rows, _ in per_expert for row in rows]
        if rows:
            check(expert_x[:len(rows)], torch.stack(rows), f"{what}: rows")
            check(meta.weights[:len(rows)], torch.tensor([v for _, ws in per_expert for v in ws]), f"{what}: weights")
    y = moe.combine(ctx, expert_function(expert_x), handle, config=SMALL_V, group=group)
    acc, slope = torch.zeros(tokens[r], H), torch.zeros(tokens[r], 1)
    for k in range(K):  # the documented order, in fp32, one rounding
        used = ((idx[:, k] >= 0) & (idx[:, k] < E)).float()[:, None]
        acc = acc + used * w[:, k:k + 1] * expert_function(x).float()
        slope = slope + used * w[:, k:k + 1] * 2
    check(y.detach(), acc.to(dtype), f"{what}: combine")
    if grad:  # d y / d x: each token's weights of its experts, times the experts' slope 2
        y.sum().backward()
        check(xd.grad, slope.expand(tokens[r], H).to(dtype), f"{what}: x's gradient")


def scenario_moe_dispatch_combine(ctx):
    # dispatch grouped by local expert, combine summed in slot order: exact against one process,
    # packed and padded, fp32 and bf16; tokens per rank differ (some ranks have none), one token in
    # all, every token to one expert, slots with no expert; rows past an expert's capacity raise on
    # its rank alone, and the exchange goes on; errors name the fix
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    varied = [(3, 0, 5, 1)[q % 4] for q in range(W)]
    one = [1] + [0] * (W - 1)
    cases = [(1, varied, torch.float32, "random", False), (2, varied, torch.bfloat16, "masked", True),
             (3, one, torch.float32, "random", True), (4, [4] * W, torch.bfloat16, "skewed", False),
             (5, varied, torch.float32, "skewed", True)]
    for seed, tokens, dtype, pattern, padded in cases:
        run_moe(ctx, seed, tokens, 12, 2, 2, dtype, pattern, padded)
    run_moe(ctx, 8, varied, 12, 3, 3, torch.float32, "random", False)  # three slots: their order shows in the sums
    # every token to experts 0 and 1 (rank 0's): W * 3 rows each there, room for 2 per expert.
    # The cpu backend raises after the call; on the GPU the watchdog ends the job (as all_to_all_v's
    # capacity errors: test_exchange_capacity_is_reported, alone, since a job ended with kernels in
    # flight can fault every job sharing the GPU under MPS).
    E, call = 2 * W, "iris.collectives.moe.dispatch"
    x, _, w = moe_inputs(r, 6, 3, 4, E, 2, torch.float32, "random")
    idx = torch.tensor([[0, 1]] * 3)
    if ctx.device.type != "cuda":
        attempt = lambda: moe.dispatch(ctx, x.to(dev), idx.to(dev), w.to(dev), E, expert_capacity=2, config=SMALL_V)
        if r == 0:
            expect_error(attempt, IrisCapacityError, call, f"rank 0 receives {3 * W} rows for its local expert 0 "
                         f"but expert_capacity is 2")
        else:
            attempt()
        run_moe(ctx, 7, [2] * W, 12, 2, 2, torch.float32, "random", False)  # the exchange goes on
    x, idx, w = x.to(dev), idx.to(dev), w.to(dev)
    odd = E + 1 if W > 1 else 0
    expect_error(lambda: moe.dispatch(ctx, x, idx, w, odd), IrisUsageError, call, f"num_experts={odd}",
                 f"multiple of the world size {W}")
    expect_error(lambda: moe.dispatch(ctx, x, idx, w, E, max_tokens=2), IrisUsageError, call, "max_tokens=2",
                 "3 tokens")
    expect_error(lambda: moe.dispatch(ctx, x, idx, w, E, capacity=8, expert_capacity=4), IrisUsageError, call,
                 "not both")
    expect_error(lambda: moe.dispatch(ctx, x, idx[:, :1], w, E), IrisUsageError, call, "[T, K]")
    expect_error(lambda: moe.dispatch(ctx, x, idx.float(), w, E), UnsupportedDtypeError, call, "topk_idx")
    _, _, handle = moe.dispatch(ctx, x, idx, w, E, config=SMALL_V)
    expect_error(lambda: moe.combine(ctx, torch.zeros(5, 4, device=dev), handle), IrisUsageError,
                 "iris.collectives.moe.combine", "expert_y has shape (5, 4)", f"({W * 3 * 2}, H)")
    moe.combine(ctx, torch.zeros(W * 3 * 2, 4, device=dev), handle, config=SMALL_V)  # the pair completes


def scenario_moe_groups(ctx):
    # dispatch and combine on groups (the experts over the members, group ranks): TP pairs, DP
    # pairs and [3,0,2], back to back with no barrier between groups, each exact against a context
    # of the group's size; through autograd too; num_experts must divide by the group's size
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    groups = {name: make_groups(ctx, lists) for name, lists in group_layouts(W).items()}
    for k, (pattern, padded, dtype) in enumerate((("random", False, torch.float32), ("masked", True, torch.bfloat16))):
        for name in ("tp", "dp", "odd"):
            g = groups[name]
            if g is not None:
                tokens = [(3, 0, 5, 1)[q % 4] for q in range(g.size)]
                run_moe(ctx, 20 + 10 * k + len(name), tokens, 12, 2, 2, dtype, pattern, padded, group=g)
    for name in ("odd", "dp", "tp"):
        g = groups[name]
        if g is not None:
            run_moe(ctx, 40 + len(name), [2] * g.size, 8, 2, 2, torch.float32, "skewed", False, group=g, grad=True)
    g = groups["odd"]
    if g is not None and g.size > 1:
        x, idx, w = (t.to(dev) for t in moe_inputs(r, 6, 3, 4, 2 * g.size, 2, torch.float32, "random"))
        expect_error(lambda: moe.dispatch(ctx, x, idx, w, 2 * g.size + 1, group=g), IrisUsageError,
                     "iris.collectives.moe.dispatch", f"num_experts={2 * g.size + 1}",
                     f"multiple of the group's size {g.size}")
    other = object.__new__(iris.runtime.Group)
    other.ctx, other.ranks, other.rank, other.size = None, (0,), 0, 1
    x = torch.zeros(2, 4, device=dev)
    expect_error(lambda: moe.dispatch(ctx, x, torch.zeros(2, 1, dtype=torch.int64, device=dev), x[:, :1], 2,
                                      group=other), iris.runtime.GroupError, "iris.collectives.moe.dispatch",
                 "a group of another context")


def scenario_calls_agree(ctx):
    # The call agreement: a rank whose call differs (first call of its signature) makes every rank
    # raise IrisCallMismatchError naming each rank's call in the caller's shapes; the context stays
    # usable, and a matched call afterwards is right. Rank 0 is the odd one out.
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    if W < 2:
        return
    odd = r == 0
    others = "ranks " + ", ".join(map(str, range(1, W))) if W > 2 else "rank 1"
    ar = "iris.collectives.ccl.all_reduce"

    def differ(call, *texts):
        error = expect_error(call, iris.runtime.IrisCallMismatchError, "the ranks made different collective calls",
                             "rank 0 called", f"{others} called", *texts, "Every rank must make the same collective "
                             "calls", "IRIS_CHECK_CALLS=0")
        assert error.count("called") == 2, error  # one entry per distinct call

    def ones(n, dtype=torch.float32):
        return torch.ones(n, dtype=dtype, device=dev)

    x, y = ones(1000 if odd else 1024), ones(1024)
    differ(lambda: ccl.all_reduce(ctx, x, x, config=SMALL), ar, "out=float32[1000], inp=out (in place)",
           "out=float32[1024], inp=out (in place)")
    z = ones(1000 if odd else 100000)  # which no shared workspace would hide: a hang until the watchdog
    differ(lambda: ccl.all_reduce(ctx, z, z), "float32[1000]", "float32[100000]")
    w = ones(1024, torch.float32 if odd else torch.float64)
    differ(lambda: ccl.all_reduce(ctx, w, w, config=SMALL), "float32[1024]", "float64[1024]")
    v = ones(1024)
    differ(lambda: ccl.all_reduce(ctx, v, v, op="max" if odd else "sum", config=SMALL), "op='max'", "op='sum'")
    differ(lambda: ccl.all_reduce(ctx, ones(1024) if odd else v, v, config=SMALL), "inp=float32[1024], op",
           "inp=out (in place)")
    differ(lambda: ccl.all_gather(ctx, ones(W * (8 if odd else 16)), ones(8 if odd else 16), config=SMALL),
           "iris.collectives.ccl.all_gather", f"out=float32[{W * 8}], inp=float32[8]")
    differ(lambda: ccl.broadcast(ctx, ones(64), 1 if odd else 0, config=SMALL), "src=1", "src=0")
    # the collectives with a root: the root is part of the call, and so are the tensors every rank
    # passes (the root's own out, or scatter's inp, is checked against them on the root alone)
    differ(lambda: ccl.reduce(ctx, ones(64), ones(64), 1 if odd else 0, config=SMALL),
           "iris.collectives.ccl.reduce(inp=float32[64], dst=1, op='sum'", "dst=0")
    differ(lambda: ccl.reduce(ctx, ones(64), ones(64), 0, op="max" if odd else "min", config=SMALL), "op='max'",
           "op='min'")
    differ(lambda: ccl.gather(ctx, ones(W * (8 if odd else 16)) if r == 0 else None, ones(8 if odd else 16), 0,
                              config=SMALL), "iris.collectives.ccl.gather(inp=float32[8], dst=0", "inp=float32[16]")
    differ(lambda: ccl.scatter(ctx, ones(8), ones(8 * W), 1 if odd else 0, config=SMALL),
           "iris.collectives.ccl.scatter(out=float32[8], src=1", "src=0")
    # init_p2p is collective and agreed; a send or recv is not (two ranks take part: the receiver
    # compares the message's header instead, see p2p_errors), so it makes no host exchange
    differ(lambda: ccl.init_p2p(ctx, **dict(P2P, slots=3 if odd else 2)), "iris.collectives.ccl.init_p2p(tags=4, "
           "slots=3", "slots=2")
    ccl.init_p2p(ctx, **P2P)
    agreed = ctx._calls.count
    if r <= 1:  # ranks 0 and 1 alone: the others make no call
        ccl.send(ctx, ones(8), 1 - r) if r == 0 else ccl.recv(ctx, torch.empty(8, device=dev), 0)
        ccl.send(ctx, ones(5), 1 - r) if r == 1 else ccl.recv(ctx, torch.empty(5, device=dev), 1)
    assert ctx._calls.count == agreed, "a point-to-point call made a host agreement"
    # cached calls whose roots differ share a workspace and meet in the kernel, whose check (the
    # device side of the agreement) raises on every rank; on the GPU it ends the job (the fault
    # test's calls_hit), so the cpu backend only. One program: no other program of the kernel is
    # left waiting when program 0 raises.
    if dev.type != "cuda":
        one = ccl.Config(block=64, width=16, grid=1)
        inp, out = ones(64), torch.empty(64, device=dev)
        for root in (0, 1):
            ccl.reduce(ctx, out, inp, root, config=one)
        expect_error(lambda: ccl.reduce(ctx, out, inp, 0 if odd else 1, config=one),
                     iris.runtime.IrisCallMismatchError, "found by its kernel", "dst=0", "dst=1")
        ccl.reduce(ctx, out, inp, 1, config=one)
        if r == 1:
            check(out, torch.full((64,), float(W)), "reduce after its kernel found the mismatch")
    # the exchanges agree on what sizes their heap buffers; a rank's own rows (its tokens, its
    # output's capacity) may differ between ranks and calls and make no new agreement
    a2av, counts = "iris.collectives.ccl.all_to_all_v", torch.zeros(W, dtype=torch.int64, device=dev)

    def exchange(width, out_rows=8, in_rows=4):
        got = torch.empty(W, dtype=torch.int64, device=dev)
        ccl.all_to_all_v(ctx, torch.empty(out_rows, width, device=dev), torch.zeros(in_rows, width, device=dev),
                         counts, got, config=SMALL_V)

    differ(lambda: exchange(8 if odd else 16), a2av, "inp=float32[4, 8], out=float32[capacity, 8]",
           "inp=float32[4, 16], out=float32[capacity, 16]")
    exchange(16)
    agreed = ctx._calls.count
    for out_rows in (6 + r, 9 + 2 * r):  # this rank's own capacity, a new tensor each time
        exchange(16, out_rows)
    assert ctx._calls.count == agreed, "an all_to_all_v with a known signature made a host agreement"
    E = 2 * W

    def dispatch(hidden, tokens=3):
        x = torch.zeros(tokens, hidden, device=dev)
        idx = torch.arange(2 * tokens, device=dev).reshape(tokens, 2) % E
        return moe.dispatch(ctx, x, idx, torch.ones(tokens, 2, device=dev), E, max_tokens=4, config=SMALL_V)

    differ(lambda: dispatch(8 if odd else 16), "iris.collectives.moe.dispatch(x=float32[T, 8]", "x=float32[T, 16]")
    expert_x, _, handle = dispatch(16)
    agreed = ctx._calls.count
    dispatch(16, tokens=1 + r % 4)  # tokens of this rank's own (up to max_tokens)
    assert ctx._calls.count == agreed, "a dispatch of other tokens with a known signature made a host agreement"
    differ(lambda: moe.combine(ctx, torch.zeros(expert_x.shape[0], 8 if odd else 16, device=dev), handle,
                               config=SMALL_V), "iris.collectives.moe.combine(expert_y=float32[", ", 8]", ", 16]")
    moe.combine(ctx, torch.zeros(expert_x.shape[0], 16, device=dev), handle, config=SMALL_V)
    # heap tensors the peers read in place must be at the same offset on every rank
    slabs = [ctx.zeros(64) for _ in range(2)]
    differ(lambda: ccl.all_reduce(ctx, ones(64), slabs[0 if odd else 1], config=SMALL), "on the heap at offset")
    # the agreed signatures are capped; past the cap the oldest go on every rank at once, and the
    # plans built on them too: a rank whose plan was cached and a rank with a new tensor agree again
    from iris.runtime import _agreement

    first = ones(64)
    ccl.all_reduce(ctx, first, first, config=SMALL)  # agreed, and its plan cached
    capacity, _agreement.CAPACITY = _agreement.CAPACITY, 2
    try:
        for n in (128, 192, 256):  # an agreement past the cap keeps the newest one
            ccl.all_reduce(ctx, ones(n), ones(n), config=SMALL)
        assert len(ctx._calls) <= 2 and not any("[64], inp=out" in t for t in ctx._calls._texts.values())
        again = first if odd else ones(64)  # rank 0: the tensor of a plan that was cached
        again.fill_(1.0)
        ccl.all_reduce(ctx, again, again, config=SMALL)
        check(again, torch.full((64,), float(W)), "all_reduce after the oldest signatures went")
    finally:
        _agreement.CAPACITY = capacity
    # the context goes on: matched calls after the mismatches are right
    y.fill_(float(r))
    ccl.all_reduce(ctx, y, y, config=SMALL)
    check(y, torch.full(y.shape, float(W * (W - 1) // 2)), "all_reduce after the mismatches")


def scenario_workspace_cache(ctx):
    # a second call of a key reuses the plan and the workspace; clear_workspaces frees them and the
    # next call starts fresh counters (every rank clears at the same point, after a barrier)
    before = ctx.heap_free_bytes
    run_all_reduce(ctx, 33, torch.float32, "sum", 8000)
    used = before - ctx.heap_free_bytes
    run_all_reduce(ctx, 40, torch.float32, "sum", 8001)  # same capacity class: the same workspace
    assert before - ctx.heap_free_bytes == used, (used, before - ctx.heap_free_bytes)
    ctx.barrier()
    ccl.clear_workspaces(ctx)
    run_all_reduce(ctx, 33, torch.float32, "sum", 8002)


def scenario_debug_mismatch(ctx):
    # IRIS_DEBUG=1 only (test_ccl_debug_reports_mismatch): ranks passing different sizes of one size
    # class share the lock records, and the signatures there report the mismatch on both ranks
    if not iris.device.DEBUG.value or ctx.world_size < 2:
        raise SystemExit("scenario debug_mismatch needs IRIS_DEBUG=1 and 2 ranks (test_ccl_debug_reports_mismatch)")
    # IRIS_CHECK_CALLS=0: no call agreement, on the host (the call below is new: it would be
    # exchanged and refused) or on the device (nothing counted or published: the context's call
    # counter and the pad's call slots stay 0)
    from iris.device import _calls
    from iris.device import _layout as layout

    assert not _calls.CHECK_CALLS.value and ctx.agree_call(("x",), lambda: "x", "x") == 0
    n = 100 if ctx.rank == 0 else 120  # 2 tiles of 64 on both: the same workspace
    x = torch.ones(n, device=ctx.device)
    expect_error(lambda: ccl.all_reduce(ctx, x, x, config=SMALL), Exception, "made different calls on the same lock",
                 "7 x 16", "8 x 16")
    assert ctx._watchdog.device_calls() is None
    W = ctx.world_size
    assert int(ctx.get_device_context()[layout.HEAP_BASES + W + layout.CALL_COUNTER]) == 0, \
        "a kernel counted its call with the check off"
    slots = ctx._heap.bases[ctx.rank] + ctx.heap_size + _calls.SLOTS_OFFSET
    assert all(ctx._heap.read_int32(slots + 4 * k) == 0 for k in range(4 * W)), "a kernel published its call"


def scenario_cuda_graph(ctx):
    # GPU only: a mixed sequence captured once in a CUDA graph, replayed 20 times with new data in
    # the captured inputs; every replay is checked (the flags' counters are in device memory)
    if ctx.device.type != "cuda":
        raise SystemExit("scenario cuda_graph needs the cuda backend (test_ccl_cuda_graph_replays runs it there)")
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    n = 3000
    x = torch.empty(n, device=dev)
    y = ctx.zeros(n)
    g = torch.empty(W * n, device=dev)
    b = torch.empty(n, dtype=torch.bfloat16, device=dev)
    z = torch.empty(n, device=dev)
    h = torch.empty(W * n, device=dev)
    u = torch.empty(n, device=dev)  # plain tensors registered on the fly in the warm-up
    p, q = torch.empty(n, device=dev), torch.empty(n, device=dev)  # received point to point
    ccl.init_p2p(ctx, tags=2, slots=2, chunk_bytes=1 << 16)  # 4 MiB or less of the heap at 8 ranks
    big = 1 << 16  # 256 KiB of fp32, more than an inbox: copied once, pulled from and pushed into the heap
    big_x, big_p = ctx.zeros(big), ctx.zeros(big)
    big_y, big_q = torch.empty(big, device=dev), torch.empty(big, device=dev)
    nxt, prev = (r + 1) % W, (r - 1) % W
    stream = torch.cuda.Stream(dev)

    def sequence():
        ccl.all_reduce(ctx, y, x)
        ccl.all_gather(ctx, g, y)
        ccl.barrier(ctx)
        ccl.broadcast(ctx, b, W - 1)
        # two calls per replay, one on each half of the staging buffer, the second in place
        ccl.all_reduce(ctx, z, x, config=ccl.Config(variant="one_shot_buffered"))
        ccl.all_reduce(ctx, z, z, config=ccl.Config(variant="one_shot_buffered"))
        ccl.all_gather(ctx, h, x, config=ccl.Config(variant="pull_buffered"))
        ccl.all_reduce(ctx, u, x, config=ccl.Config(variant="two_shot", register=True))
        if W > 1:  # a ring on the stream, then one through the side streams, joined back with wait()
            if r % 2 == 0:
                ccl.send(ctx, x, nxt)
                ccl.recv(ctx, p, prev)
            else:
                ccl.recv(ctx, p, prev)
                ccl.send(ctx, x, nxt)
            for work in (ccl.isend(ctx, x, nxt, tag=1), ccl.irecv(ctx, q, prev, tag=1)):
                work.wait()
            # large messages wait for their receiver: ordered as docs/ccl.md says for GPUs whose
            # hardware queues the side streams may share (many MPS clients, as in the GPU suite)
            calls = [(ccl.isend, big_x, nxt, 0), (ccl.isend, big_y, nxt, 1),  # pulled, pushed
                     (ccl.irecv, big_q, prev, 0), (ccl.irecv, big_p, prev, 1)]
            first = 2 * (r % 2)  # odd ranks: the receives first
            for work in [call(ctx, t, peer, tag=tag) for call, t, peer, tag in calls[first:] + calls[:first]]:
                work.wait()

    def fill(k):
        x.copy_(torch.arange(n, device=dev, dtype=torch.float32) + k + r)
        b.fill_(float(k + r))
        big_x.copy_(torch.arange(big, device=dev, dtype=torch.float32) + k + r)
        big_y.copy_(torch.arange(big, device=dev, dtype=torch.float32) - k - r)

    fill(0)
    with torch.cuda.stream(stream):
        sequence()  # warm-up: plans, workspaces and grids exist before capture
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    registered = len(ctx._reach)
    with torch.cuda.graph(graph, stream=stream):
        sequence()
    assert W == 1 or registered == len(ctx._reach) >= 2, "the capture found the warm-up's registrations"
    for k in range(1, 21):
        fill(k)
        graph.replay()
        torch.cuda.synchronize(dev)
        expected = W * (torch.arange(n, dtype=torch.float32) + k) + W * (W - 1) // 2
        check(y, expected, f"graph replay {k}: all_reduce")
        check(g, expected.repeat(W), f"graph replay {k}: all_gather")
        check(b, torch.full((n,), float(k + W - 1)).to(torch.bfloat16), f"graph replay {k}: broadcast")
        check(z, W * expected, f"graph replay {k}: one_shot_buffered all_reduce, twice")
        check(h, torch.cat([torch.arange(n, dtype=torch.float32) + k + q for q in range(W)]),
              f"graph replay {k}: pull_buffered all_gather")
        check(u, expected, f"graph replay {k}: all_reduce of tensors registered on the fly")
        if W > 1:
            sent = torch.arange(n, dtype=torch.float32) + k + prev
            check(p, sent, f"graph replay {k}: recv")
            check(q, sent, f"graph replay {k}: irecv")
            check(big_q, torch.arange(big, dtype=torch.float32) + k + prev, f"graph replay {k}: pulled from the heap")
            check(big_p, torch.arange(big, dtype=torch.float32) - k - prev, f"graph replay {k}: pushed into the heap")


def scenario_exchanges_in_cuda_graph(ctx):
    # GPU only: all_to_all_v, a MoE dispatch and its combine captured once in a CUDA graph, replayed
    # 10 times with new splits, tokens and routing written into the captured inputs: the counts
    # never reach the host, and every replay is checked exactly
    if ctx.device.type != "cuda":
        raise SystemExit("scenario exchanges_in_cuda_graph needs the cuda backend (test_exchanges_in_cuda_graph)")
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    T, H, G, K, rows = 24, 64, 2, 2, 3 * W
    E = W * G
    x, w = torch.empty(T, H, device=dev), torch.empty(T, K, device=dev)
    idx = torch.empty(T, K, dtype=torch.int64, device=dev)
    inp, send = torch.empty(rows, 16, device=dev), torch.empty(W, dtype=torch.int64, device=dev)
    out, got = torch.empty(W * rows, 16, device=dev), torch.empty(W, dtype=torch.int64, device=dev)
    result = {}

    def fill(k):
        tokens, experts, weights = moe_inputs(r, 500 + k, T, H, E, K, torch.float32, "random")
        x.copy_(tokens)
        idx.copy_(experts)
        w.copy_(weights)
        inp.copy_(data(rows * 16, torch.float32, 600 + 10 * k + r).reshape(rows, 16))
        send.copy_(splits_of(r, W, 600 + k, high=4))

    def sequence():
        ccl.all_to_all_v(ctx, out, inp, send, got)
        expert_x, meta, handle = moe.dispatch(ctx, x, idx, w, E)
        result["counts"], result["y"] = meta.counts, moe.combine(ctx, expert_function(expert_x), handle)

    stream = torch.cuda.Stream(dev)
    fill(0)
    with torch.cuda.stream(stream):
        sequence()  # warm-up: plans, workspaces, kernels
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        sequence()
    ctx.barrier()
    for k in range(1, 11):
        fill(k)
        graph.replay()
        torch.cuda.synchronize(dev)
        counts = [int(splits_of(q, W, 600 + k, high=4)[r]) for q in range(W)]
        starts = [int(splits_of(q, W, 600 + k, high=4)[:r].sum()) for q in range(W)]
        expected = torch.cat([data(rows * 16, torch.float32, 600 + 10 * k + q).reshape(rows, 16)[s:s + c]
                              for q, s, c in zip(range(W), starts, counts)])
        assert got.tolist() == counts, (k, got.tolist(), counts)
        check(out[:len(expected)], expected, f"graph replay {k}: all_to_all_v")
        tokens, _, weights = moe_inputs(r, 500 + k, T, H, E, K, torch.float32, "random")
        per_expert = moe_expected(r, W, 500 + k, [T] * W, H, G, K, torch.float32, "random")
        assert result["counts"].tolist() == [len(sent) for sent, _ in per_expert], f"graph replay {k}: counts"
        acc = torch.zeros(T, H)
        for j in range(K):
            acc = acc + weights[:, j:j + 1] * expert_function(tokens)
        check(result["y"], acc, f"graph replay {k}: dispatch and combine")
        ctx.barrier()  # no rank refills its inputs while a peer's replay may still read them


def group_layouts(W: int) -> dict:
    """The groups of the ``groups`` scenario: at 4 ranks TP ``[0,1],[2,3]``, DP ``[0,2],[1,3]`` and
    the non-contiguous ``[3,0,2]``; the same shapes cut down on fewer ranks."""
    tp = [list(range(i, min(i + 2, W))) for i in range(0, W, 2)]
    dp = [list(range(j, W, 2)) for j in range(min(2, W))]
    odd = [3, 0, 2] if W == 4 else list(reversed(range(W)))[:max(1, W - 1)]
    return {"tp": tp, "dp": dp, "odd": [odd]}


def make_groups(ctx, lists: list, workspace_size: int = 1 << 18) -> object:
    """``ctx.new_group`` for each list (every rank makes every group); this rank's group, checked."""
    mine = None
    for ranks in lists:
        g = ctx.new_group(ranks, workspace_size=workspace_size)
        if ctx.rank in ranks:
            assert isinstance(g, iris.runtime.Group), (ranks, g)
            assert (g.ranks, g.rank, g.size, g.world_size) == (tuple(ranks), ranks.index(ctx.rank), len(ranks),
                                                               len(ranks)), g
            assert g.ctx is ctx and int(g.get_device_context()[0]) == g.rank, g
            mine = g
        else:
            assert g is None, (ranks, g)
    return mine


def run_group_calls(ctx, g, seed: int, dtype) -> None:
    """all_reduce (two ops), reduce_scatter, all_gather, broadcast, all_to_all, reduce, gather and
    scatter on group ``g``, each checked exactly against the same call on a context of just
    ``g.ranks`` (group rank order; roots are group ranks)."""
    G, gr, members = g.size, g.rank, g.ranks
    n, m = 37, 19
    x = data(n, dtype, seed + ctx.rank).to(ctx.device)
    out = poison(torch.empty(n, dtype=dtype, device=ctx.device))
    ccl.all_reduce(ctx, out, x, config=SMALL, group=g)
    check(out, reference("sum", [data(n, dtype, seed + q) for q in members], dtype), f"group {members} all_reduce")
    y = ctx.as_symmetric(data(n, dtype, seed + 1 + ctx.rank))  # on the heap, in place, two-shot
    ccl.all_reduce(ctx, y, y, op="max", config=TWO_SHOT, group=g)
    check(y, reference("max", [data(n, dtype, seed + 1 + q) for q in members], dtype),
          f"group {members} all_reduce max")
    ctx.free(y)
    z = data(G * m, dtype, seed + 2 + ctx.rank).to(ctx.device)
    part = poison(torch.empty(m, dtype=dtype, device=ctx.device))
    ccl.reduce_scatter(ctx, part, z, config=SMALL, group=g)
    full = reference("sum", [data(G * m, dtype, seed + 2 + q) for q in members], dtype)
    check(part, full[gr * m:(gr + 1) * m], f"group {members} reduce_scatter")
    gathered = poison(torch.empty(G * m, dtype=dtype, device=ctx.device))
    ccl.all_gather(ctx, gathered, data(m, dtype, seed + 3 + ctx.rank).to(ctx.device), config=SMALL, group=g)
    check(gathered, torch.cat([data(m, dtype, seed + 3 + q) for q in members]), f"group {members} all_gather")
    src = G - 1  # a group rank: global rank members[-1]
    t = data(n, dtype, seed + 4 + ctx.rank).to(ctx.device)
    ccl.broadcast(ctx, t, src, config=SMALL, group=g)
    check(t, data(n, dtype, seed + 4 + members[src]), f"group {members} broadcast(src={src})")
    a = data(G * m, dtype, seed + 5 + ctx.rank).to(ctx.device)
    swapped = poison(torch.empty(G * m, dtype=dtype, device=ctx.device))
    ccl.all_to_all(ctx, swapped, a, config=SMALL, group=g)
    check(swapped, torch.cat([data(G * m, dtype, seed + 5 + q)[gr * m:(gr + 1) * m] for q in members]),
          f"group {members} all_to_all")
    root = G // 2  # a group rank
    mine = poison(torch.empty(n, dtype=dtype, device=ctx.device))
    got = ccl.reduce(ctx, mine, data(n, dtype, seed + 6 + ctx.rank).to(ctx.device), root, config=SMALL, group=g)
    if gr == root:
        check(got, reference("sum", [data(n, dtype, seed + 6 + q) for q in members], dtype),
              f"group {members} reduce(dst={root})")
    else:
        assert got is None and bool(torch.isnan(mine).all()) if dtype.is_floating_point else got is None
    rows = poison(torch.empty(G * m, dtype=dtype, device=ctx.device))
    got = ccl.gather(ctx, rows, data(m, dtype, seed + 7 + ctx.rank).to(ctx.device), root, config=SMALL, group=g)
    if gr == root:
        check(got, torch.cat([data(m, dtype, seed + 7 + q) for q in members]), f"group {members} gather(dst={root})")
    piece = poison(torch.empty(m, dtype=dtype, device=ctx.device))
    ccl.scatter(ctx, piece, data(G * m, dtype, seed + 8 + ctx.rank).to(ctx.device), root, config=SMALL, group=g)
    check(piece, data(G * m, dtype, seed + 8 + members[root])[gr * m:(gr + 1) * m],
          f"group {members} scatter(src={root})")
    sends = [[(i + j) % 2 + 1 for j in range(G)] for i in range(G)]  # group rank i's rows to group rank j
    sent = data(2 * G * 3, dtype, seed + 9 + ctx.rank).reshape(2 * G, 3).to(ctx.device)
    got_rows = poison(torch.empty(2 * G, 3, dtype=dtype, device=ctx.device))
    counts = torch.full((G,), -1, dtype=torch.int64, device=ctx.device)
    ccl.all_to_all_v(ctx, got_rows, sent, torch.tensor(sends[gr], device=ctx.device), counts, config=SMALL_V,
                     group=g)
    assert counts.tolist() == [sends[i][gr] for i in range(G)], (members, counts.tolist())
    expected = torch.cat([data(2 * G * 3, dtype, seed + 9 + q).reshape(2 * G, 3)[sum(sends[i][:gr]):
                                                                                sum(sends[i][:gr + 1])]
                          for i, q in enumerate(members)])
    check(got_rows[:len(expected)], expected, f"group {members} all_to_all_v")


def scenario_group_agreed_reach(ctx):
    # Config(register=True) on groups (on the GPU also any call from REGISTER_FROM bytes, which is
    # what makes a group read large plain tensors in place as its context does): the members agree
    # on how each tensor is reached and register their tensors among themselves on the fly, in a
    # cache of the group's own, translated in group order. On the cpu backend the tensors are heap
    # tensors at a different offset on each member (translation alone would get them wrong); on the
    # GPU plain torch tensors. TP, DP and non-contiguous groups, each collective exact against the
    # members' data in group order; the same tensors again register nothing; every rank allocates
    # alike (the heap stays symmetric) and the members call.
    W, dev = ctx.world_size, ctx.device
    groups = {name: make_groups(ctx, lists) for name, lists in group_layouts(W).items()}
    slabs = []
    n, m = 150, 37
    one_shot = ccl.Config(variant="one_shot", block=64, width=16, register=True)
    two_shot = ccl.Config(variant="two_shot", block=64, width=16, register=True)
    pull = ccl.Config(variant="pull", block=64, width=16, register=True)
    for k, g in enumerate(groups.values()):
        shift = 0 if g is None else g.rank
        inp = rank_shifted(ctx, slabs, n, torch.float32, shift)
        out = rank_shifted(ctx, slabs, n, torch.float32, shift)
        big = rank_shifted(ctx, slabs, W * m, torch.bfloat16, shift)
        if g is None or g.size == 1:
            continue
        G, members, seed = g.size, g.ranks, 9000 + 100 * k
        big = big[:G * m]
        what = f"group {list(members)}, registered on the fly"
        for i, config in enumerate((one_shot, two_shot)):
            for again in range(2):
                inp.copy_(data(n, torch.float32, seed + 10 * i + again + ctx.rank))
                target = poison(out)
                ccl.all_reduce(ctx, target, inp, config=config, group=g)
                check(target, reference("sum", [data(n, torch.float32, seed + 10 * i + again + q) for q in members],
                                        torch.float32), f"{what}: all_reduce {config.variant}")
        cache = g._reach_cache
        assert cache is not None and len(cache) == 2, f"{what}: inp and out registered once each, not {cache}"
        generation = cache.generation
        ccl.all_reduce(ctx, out, inp, config=two_shot, group=g)
        assert cache.generation == generation, f"{what}: the same tensors again must find their registrations"
        big.copy_(data(G * m, torch.bfloat16, seed + 50 + ctx.rank))
        part = poison(torch.empty(m, dtype=torch.bfloat16, device=dev))
        ccl.reduce_scatter(ctx, part, big, config=pull, group=g)
        full = reference("sum", [data(G * m, torch.bfloat16, seed + 50 + q) for q in members], torch.bfloat16)
        check(part, full[g.rank * m:(g.rank + 1) * m], f"{what}: reduce_scatter")
        gathered = poison(torch.empty(G * n, dtype=torch.float32, device=dev))
        inp.copy_(data(n, torch.float32, seed + 60 + ctx.rank))
        ccl.all_gather(ctx, gathered, inp, config=pull, group=g)
        check(gathered, torch.cat([data(n, torch.float32, seed + 60 + q) for q in members]), f"{what}: all_gather")
        swapped = poison(torch.empty(G * m, dtype=torch.bfloat16, device=dev))
        ccl.all_to_all(ctx, swapped, big, config=pull, group=g)
        check(swapped, torch.cat([data(G * m, torch.bfloat16, seed + 50 + q)[g.rank * m:(g.rank + 1) * m]
                                  for q in members]), f"{what}: all_to_all")
        inp.copy_(data(n, torch.float32, seed + 70 + ctx.rank))
        ccl.broadcast(ctx, inp, G - 1, config=pull, group=g)
        check(inp, data(n, torch.float32, seed + 70 + members[G - 1]), f"{what}: broadcast")
        assert len(cache) == 3, f"{what}: big registered once more, not {len(cache) - 2} more"
    ctx.barrier()
    for g in groups.values():
        if g is not None:
            ccl.clear_workspaces(g)
    ccl.clear_workspaces(ctx)
    for slab in reversed(slabs):
        ctx.free(slab)


def scenario_groups(ctx):
    # TP and DP groups and a non-contiguous one, their calls interleaved back to back (no barrier
    # between groups), each result exact; then the context's own call still right
    from iris.device import _calls
    from iris.device import _layout as layout

    W = ctx.world_size
    layouts = group_layouts(W)
    groups = {name: make_groups(ctx, lists) for name, lists in layouts.items()}
    base = ctx._heap.bases[ctx.rank]

    def counted(on) -> int:  # the calls the device counted in the context tensor of a context or group
        return int(on.get_device_context()[layout.HEAP_BASES + on.world_size + layout.CALL_COUNTER])

    def pad_slots() -> list:  # the context's call slots, in this rank's signal pad
        slots = base + ctx.heap_size + _calls.SLOTS_OFFSET
        return [ctx._heap.read_int32(slots + 4 * k) for k in range(4 * W)]

    before, slots_before = counted(ctx), pad_slots()
    for k, dtype in enumerate((torch.float32, torch.bfloat16)):
        for name in ("tp", "dp", "odd"):
            if groups[name] is not None:
                run_group_calls(ctx, groups[name], 7000 + 100 * k + 10 * len(name), dtype)
        for name in ("odd", "dp", "tp"):  # the other order too: group calls counted differently per rank
            if groups[name] is not None:
                ccl.barrier(ctx, group=groups[name])
                run_group_calls(ctx, groups[name], 7500 + 100 * k, dtype)
    # Each group counts its calls in its own context tensor (2 x 19: the 9 kernels per
    # run_group_calls that carry the device check, all_to_all_v's do not, and a barrier), the same
    # count on every member, and publishes them in call words of its own, never in the context's:
    # overlapping groups whose members call in different orders compare only their own calls
    # (sharing the words, a peer's call of another group could be compared as this one's).
    assert counted(ctx) == before, (counted(ctx), before)
    assert pad_slots() == slots_before, "a group's call was published in the context's call words"
    for name, g in groups.items():
        if g is not None and g.size > 1 and _calls.CHECK_CALLS.value:
            counts = g.allgather(counted(g))
            assert counts == [2 * 19] * g.size, (name, g, counts)
    # Members of different groups sit in different kinds of host collective at once, for longer
    # than the context's board of host waits allows ranks of one context (iris.runtime._host_waits):
    # a group's host collectives are its own, never a mismatch of the context's
    if W == 4:
        import time

        ctx.barrier()
        if ctx.rank in (1, 3):
            time.sleep(2.0)
        tp = groups["tp"]
        if ctx.rank < 2:
            tp.barrier()
        else:
            assert tp.allgather(ctx.rank) == [2, 3]
    # tracing switched on after the groups were made reaches their context tensors (the trace words)
    ctx.tracing.enable(max_events=16)
    for g in groups.values():
        if g is not None:
            at, ctx_at = (layout.HEAP_BASES + size + layout.TRACE_ENABLED for size in (g.size, W))
            mine, theirs = g.get_device_context()[at:at + 4], ctx.get_device_context()[ctx_at:ctx_at + 4]
            assert mine.tolist() == theirs.tolist() and int(mine[0]) == 1, (g, mine, theirs)
    ctx.tracing.disable()
    # a group's workspaces freed (its arena starts over) and made again: calls still right
    for name in ("tp", "dp", "odd"):
        g = groups[name]
        if g is not None:
            ctx.barrier(group=g)
            ccl.clear_workspaces(g)
            x = data(40, torch.float32, 7700 + ctx.rank).to(ctx.device)
            ccl.all_reduce(ctx, x, x, config=SMALL, group=g)
            check(x, reference("sum", [data(40, torch.float32, 7700 + q) for q in g.ranks], torch.float32),
                  f"group {g.ranks} all_reduce after clear_workspaces")
    run_all_reduce(ctx, 37, torch.float32, "sum", 7900)


def scenario_group_errors(ctx):
    W, r = ctx.world_size, ctx.rank
    call = "iris.runtime.Iris.new_group"
    expect_error(lambda: ctx.new_group([0, W]), RankError, call, f"rank {W} is not a rank of the context",
                 f"0 .. {W - 1}")
    expect_error(lambda: ctx.new_group([0, 0]), iris.runtime.GroupError, call, "rank 0 is listed twice")
    if W > 1:
        expect_error(lambda: ctx.new_group([r]), iris.runtime.GroupError, call, "the ranks passed different lists",
                     "rank 1: [1]", "same order")
        expect_error(lambda: ctx.new_group([1, 0] if r == 0 else [0, 1]), iris.runtime.GroupError, call,
                     "different lists")
    too_big = ctx.heap_size + 4096
    expect_error(lambda: ctx.new_group([0], workspace_size=too_big), iris.runtime.HeapExhaustedError, call,
                 f"workspace_size={too_big} bytes does not fit", "pass a smaller workspace_size=")
    g = ctx.new_group(list(range(W)), workspace_size=1 << 18)
    x = torch.zeros(8, device=ctx.device)
    ar = "iris.collectives.ccl.all_reduce"
    expect_error(lambda: ccl.all_reduce(ctx, x, x, group=42), iris.runtime.GroupError, ar, "group=42",
                 "ctx.new_group(ranks)")
    other = object.__new__(iris.runtime.Group)
    other.ctx, other.ranks, other.rank, other.size = None, (0,), 0, 1
    expect_error(lambda: ccl.all_gather(ctx, x, x, group=other), iris.runtime.GroupError,
                 "iris.collectives.ccl.all_gather", "a group of another context")
    expect_error(lambda: ctx.barrier(group=other), iris.runtime.GroupError, "iris.runtime.Iris.barrier(group=...)",
                 "another context")
    expect_error(lambda: ccl.broadcast(ctx, x, W, group=g), RankError, "broadcast", f"rank {W} is outside the "
                 f"group's ranks [0, {W})")
    ccl.broadcast(ctx, x, W - 1, group=g)  # the group of every rank still works after the errors


def scenario_p2p_groups(ctx):
    # send/recv on groups: peers are group ranks, each group has mailboxes of its own. Rings on the
    # TP pairs, DP pairs and [3,0,2], all with tag 0, sent back to back before any is received and
    # received in the other order (a pair of ranks in two groups, e.g. 0 -> 2 in [0,2] and [3,0,2],
    # has a message of each waiting at once): every group's result is its own message, and equals
    # the same exchange made on the context with the ranks translated (there one tag per group:
    # the context's channel of a pair is one queue). Then non-blocking calls, a
    # batch larger than the inbox, the torch operators, and the errors.
    from iris.collectives import functional

    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    groups = {name: make_groups(ctx, lists) for name, lists in group_layouts(W).items()}
    rings = {name: g for name, g in groups.items() if g is not None and g.size > 1}
    send, init = "iris.collectives.ccl.send", "iris.collectives.ccl.init_p2p"
    x = torch.zeros(8, device=dev)
    for g in rings.values():  # before the group's init_p2p: no mailboxes, even where the context has some
        expect_error(lambda: ccl.send(ctx, x, (g.rank + 1) % g.size, group=g), IrisUsageError, send,
                     "no point-to-point mailboxes of its own", "init_p2p(ctx, group=group)")
    for g in groups.values():
        if g is not None:  # too large for the arena: named, and the arena is left as it was
            expect_error(lambda: ccl.init_p2p(ctx, **dict(P2P, chunk_bytes=1 << 20), group=g),
                         iris.runtime.HeapExhaustedError, init, "the group's mailboxes need",
                         "larger workspace_size=")
    ccl.init_p2p(ctx, **P2P)
    for name in ("tp", "dp", "odd"):
        if groups[name] is not None:
            settings = ccl.init_p2p(ctx, **P2P, group=groups[name])
            assert ccl.p2p_settings(groups[name]) == settings, (name, settings)
    n = 200  # under an inbox: every send returns before its receive

    def sent(seed: int, q: int) -> torch.Tensor:  # what global rank q sends on the ring of seed
        return message(n, torch.float32, seed + q)

    seeds = {"tp": 3100, "dp": 3200, "odd": 3300}
    # the context's tag of each layout: fixed by its name, so that every rank agrees (a rank's rings
    # are not every rank's: at 3 ranks rank 0 is in the TP and DP rings, rank 2 in the DP and odd ones)
    tags = {"tp": 0, "dp": 1, "odd": 2}
    for rnd in range(2):
        for name, g in rings.items():  # each group's send, then the context's
            tag = tags[name]
            nxt = (g.rank + 1) % g.size
            ccl.send(ctx, sent(seeds[name] + rnd, r).to(dev), nxt, group=g)
            ccl.send(ctx, sent(seeds[name] + 50 + rnd, r).to(dev), g.ranks[nxt], tag=tag)
        got = {}
        for name, g in reversed(list(rings.items())):  # received in the other order
            tag = tags[name]
            prev = (g.rank - 1) % g.size
            on_group = poison(torch.empty(n, device=dev))
            on_ctx = poison(torch.empty(n, device=dev))
            assert ccl.recv(ctx, on_group, prev, group=g) is on_group
            got[name] = (on_group, ccl.recv(ctx, on_ctx, g.ranks[prev], tag=tag))
        for name, g in rings.items():
            q = g.ranks[(g.rank - 1) % g.size]
            on_group, on_ctx = got[name]
            check(on_group, sent(seeds[name] + rnd, q), f"round {rnd}: recv on group {g.ranks} from {q}")
            check(on_ctx, sent(seeds[name] + 50 + rnd, q), f"round {rnd}: recv on the context from {q}")
    # non-blocking on a group, and the torch operators (eager) on a group
    for g in rings.values():
        nxt, prev = (g.rank + 1) % g.size, (g.rank - 1) % g.size
        out = poison(torch.empty(n, device=dev))
        works = [ccl.isend(ctx, sent(3400, r).to(dev), nxt, tag=1, group=g),
                 ccl.irecv(ctx, out, prev, tag=1, group=g)]
        for work in works:
            work.wait()
        check(out, sent(3400, g.ranks[prev]), f"isend/irecv on group {g.ranks}")
        functional.send(ctx, sent(3500, r).to(dev), nxt, tag=2, group=g)
        got = functional.recv(ctx, (n,), torch.float32, prev, tag=2, group=g)
        check(got, sent(3500, g.ranks[prev]), f"functional.recv on group {g.ranks}")
    # a batch on a pair larger than the inbox each way, the ops of two groups in one batch. Each
    # pair's ops go in where this rank is in that pair (at 3 ranks rank 0 is in a TP pair and a DP
    # pair, rank 1 in the TP pair only, rank 2 in the DP pair only): what one rank lists, its peer lists.
    m, pairs = 1300, []
    for name, seed in (("tp", 3600), ("dp", 3700)):
        g = rings.get(name)
        if g is not None and g.size == 2:
            peer = 1 - g.rank
            pairs.append((g, seed, peer,
                          ccl.P2POp(ccl.isend, message(m, torch.float32, seed + r).to(dev), peer, group=g),
                          ccl.P2POp(ccl.irecv, poison(torch.empty(m, device=dev)), peer, group=g)))
    if pairs:
        # each pair's group rank 0 lists its send first, the other its receive (a cycle of ranks
        # that all receive first would wait for ever on the cpu backend, see docs/ccl.md)
        listed = [op for g, _, _, snd, rcv in pairs for op in ((snd, rcv) if g.rank == 0 else (rcv, snd))]
        for work in ccl.batch_isend_irecv(ctx, listed):
            work.wait()
        for g, seed, peer, _, rcv in pairs:
            check(rcv.tensor, message(m, torch.float32, seed + g.ranks[peer]), f"batch on group {g.ranks}")
    # large messages on each ring, copied once: a heap tensor sent (the receiver pulls it) and one
    # received (the sender pushes into it), in a batch (heap tensors allocated alike on every rank)
    big = 900  # 3600 B of fp32: more than an inbox
    heap_send, heap_recv = ctx.zeros(big), ctx.zeros(big)
    for g in rings.values():
        nxt, prev = (g.rank + 1) % g.size, (g.rank - 1) % g.size
        for k, (src_heap, dst_heap) in enumerate(((True, False), (False, True))):
            x = heap_send if src_heap else torch.empty(big, device=dev)
            x.copy_(message(big, torch.float32, 3800 + k + r).to(dev))
            out = poison(heap_recv if dst_heap else torch.empty(big, device=dev))
            for work in ccl.batch_isend_irecv(ctx, [ccl.P2POp(ccl.isend, x, nxt, tag=3, group=g),
                                                    ccl.P2POp(ccl.irecv, out, prev, tag=3, group=g)]):
                work.wait()
            check(out, message(big, torch.float32, 3800 + k + g.ranks[prev]),
                  f"a large message on group {g.ranks}, heap {src_heap}/{dst_heap}")
    # errors: a peer outside the group (group ranks), this rank, a group of another context
    for g in rings.values():
        expect_error(lambda: ccl.send(ctx, x, g.size, group=g), RankError, f"{send}(dst=...)",
                     f"rank {g.size} is outside the group's ranks [0, {g.size})", f"0 .. {g.size - 1}")
        expect_error(lambda: ccl.recv(ctx, x, g.rank, group=g), IrisUsageError, "iris.collectives.ccl.recv",
                     f"src={g.rank} is this rank")
    other = object.__new__(iris.runtime.Group)
    other.ctx, other.ranks, other.rank, other.size = None, (0,), 0, 1
    for call, fn in (("send", lambda: ccl.send(ctx, x, 0, group=other)),
                     ("irecv", lambda: ccl.irecv(ctx, x, 0, group=other)),
                     ("init_p2p", lambda: ccl.init_p2p(ctx, group=other)),
                     ("batch_isend_irecv(ops[0])",
                      lambda: ccl.batch_isend_irecv(ctx, [ccl.P2POp(ccl.isend, x, 0, group=other)]))):
        expect_error(fn, iris.runtime.GroupError, f"iris.collectives.ccl.{call}", "a group of another context")


def scenario_capacity_report(ctx):
    # GPU only (test_exchange_capacity_is_reported): rank 0 receives more rows than its output
    # holds; the kernel reports it and the watchdog ends the job with the message
    if ctx.device.type != "cuda" or ctx.world_size < 2:
        raise SystemExit("scenario capacity_report needs the cuda backend and 2 ranks")
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    splits = torch.empty(W, dtype=torch.int64, device=dev)
    out = torch.zeros(2 if r == 0 else 2 * W, 3, device=dev)
    two = torch.full((W,), 2, dtype=torch.int64, device=dev)
    ccl.all_to_all_v(ctx, out, torch.ones(2 * W, 3, device=dev), two, splits)
    torch.cuda.synchronize(dev)
    import time

    time.sleep(5)  # the watchdog's thread ends the job meanwhile
    ctx.barrier()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    iris.runtime.testing.run_scenarios(globals(), heap_size=1 << 24)
