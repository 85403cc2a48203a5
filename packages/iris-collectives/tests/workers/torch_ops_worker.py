"""Multi-rank scenarios of the torch operators (``iris.collectives.functional``), their gradients and
the tensor-parallel layers (``iris.collectives.nn``), run by test_torch_ops_multirank.py.

Every rank regenerates every rank's inputs from seeds, so references need no communication.

Gradients are checked with ``torch.autograd.gradcheck`` in fp64 on a *global* function of every
rank's inputs, which every rank evaluates identically: an input that is each rank's own is one
tensor ``[W, ...]`` of which rank ``r`` feeds block ``r`` to the operator (:class:`OwnBlock`, whose
backward gathers every rank's gradient of its block over MPI); an input that is one value on
every rank (a replicated bias) is fed as it is; a per-rank output is stacked over the ranks
(:class:`Stacked`, over MPI), a replicated one is returned as it is. gradcheck perturbs the same
element on every rank at the same step (same inputs, same control flow), so its finite
differences see the whole distributed function, and the analytical Jacobian is the operators'
backward on every rank: the two agree exactly when the backward is the derivative of the one
loss under the convention of ``iris.collectives.functional`` (exact adjoints; the all-reduces'
replicated results carry the same whole gradient on every rank).
"""

from __future__ import annotations

import math
import os
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import iris.runtime.testing
from iris.collectives import ccl, moe, ops
from iris.collectives import functional as F
from iris.collectives.functional import _handles
from iris.collectives.nn import ColumnParallelLinear, ExpertParallelMoE, RowParallelLinear
from iris.collectives.ops import _config as ops_config
from iris.runtime import IrisUsageError, UnsupportedDtypeError
from iris.runtime.testing import expect_error

F64 = torch.float64


def rand(shape, seed, dtype=F64, device="cpu"):
    """Normal values, the same wherever generated (CPU generator)."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=F64).to(dtype).to(device)


def ints(shape, seed, device="cpu"):
    """Small integers as fp32: every sum and product here is exact, so results compare exactly."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-3, 4, shape, generator=g).float().to(device)


def same(expected, actual, what, tol=0.0):
    actual, expected = actual.detach().cpu().to(expected.dtype), expected.detach().cpu()
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    error = (actual - expected).abs().max().item() if actual.numel() else 0.0
    assert error <= tol, f"{what}: max error {error:.3g} > {tol:.3g}"


# --- the global function gradcheck sees -----------------------------------------------------------

class OwnBlock(torch.autograd.Function):
    """Every rank's values ``[W, ...]`` -> this rank's block; backward: each rank's gradient of its
    block, gathered (MPI), so that every rank returns the gradient of the whole tensor."""

    @staticmethod
    def forward(ctx, everyone, comm, rank):
        ctx.comm = comm
        return everyone[rank].clone()

    @staticmethod
    def backward(ctx, grad):
        return torch.stack(ctx.comm.allgather(grad.detach().cpu())).to(grad.device), None, None


class Stacked(torch.autograd.Function):
    """This rank's result -> every rank's, stacked (MPI); backward: this rank's block."""

    @staticmethod
    def forward(ctx, mine, comm, rank):
        ctx.rank = rank
        return torch.stack(comm.allgather(mine.detach().cpu())).to(mine.device)

    @staticmethod
    def backward(ctx, grad):
        return grad[ctx.rank], None, None


def global_gradcheck(ctx, name, fn, inputs, output_kind, fast=False):
    """gradcheck of ``fn`` (this rank's operator call) as a function of every rank's inputs.

    ``inputs``: ``(kind, tensor)`` pairs; ``"own"``: ``[W, ...]``, every rank's value; ``"same"``: one
    value, every rank's. ``output_kind``: ``"own"`` (stacked over the ranks) or ``"same"``. ``fast``:
    gradcheck's fast mode (the Jacobian against random vectors, the same on every rank: a few
    evaluations instead of one per input element)."""
    comm, rank = ctx.comm, ctx.rank
    leaves = [t.detach().to(ctx.device).requires_grad_(True) for _, t in inputs]  # the ops' device

    def whole(*xs):
        mine = [OwnBlock.apply(x, comm, rank) if kind == "own" else x for (kind, _), x in zip(inputs, xs)]
        y = fn(*mine)
        return Stacked.apply(y, comm, rank) if output_kind == "own" else y

    torch.manual_seed(0)  # the same random choices on every rank
    assert torch.autograd.gradcheck(whole, leaves, eps=1e-6, atol=1e-9, rtol=1e-7, fast_mode=fast), name


# --- scenarios ---------------------------------------------------------------------------------------

def scenario_operators_match_front_doors(ctx):
    # every operator against its front door (exact: small integers) and fp64 against torch
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    h = F.handle_of(ctx)
    assert F.handle_of(ctx) == h and F.context_of(h, "test") is ctx
    # the world size is part of the handle, so that graphs compiled for other world sizes differ
    # (inductor's on-disk cache keys on the graph's constants)
    other_world = (h >> _handles.WORLD_BITS) << _handles.WORLD_BITS | (W + 1)
    expect_error(lambda: F.context_of(other_world, "test"), IrisUsageError, f"handle {other_world}",
                 "another process or job")
    x = ints((4 * W, 3), 10 + r, dev)
    for name, args in (("all_reduce", ()), ("reduce_scatter", ()), ("all_gather", ()), ("all_to_all", ())):
        result = getattr(F, name)(ctx, x, *args)
        expected = torch.empty_like(result)
        getattr(ccl, name)(ctx, expected, x)
        same(expected, result, f"functional.{name}")
    same(ints((4 * W, 3), 10 + W - 1), F.broadcast(ctx, x, W - 1), "functional.broadcast")
    same(sum(ints((4 * W, 3), 10 + p) for p in range(W)) / W, F.all_reduce(ctx, x, "avg"), "avg")
    torch.ops.iris.barrier(h)
    a, b, bias = ints((4 * W, 5), 20 + r, dev), ints((5, 6), 30 + r, dev), ints((6,), 40, dev)
    for name in ("matmul_all_reduce", "matmul_reduce_scatter", "all_gather_matmul", "matmul_all_gather"):
        result = getattr(F, name)(ctx, a, b, bias)
        expected = torch.empty_like(result)
        getattr(ops, name)(ctx, expected, a, b, bias)
        same(expected, result, f"functional.{name}")
    half = F.matmul_all_reduce(ctx, a, b, out_dtype=torch.float16)
    assert half.dtype == torch.float16
    # fp64 end to end: accumulated in fp64 (an fp32 accumulator would be ~1e-7 off)
    A = [rand((4 * W, 7), 50 + p) for p in range(W)]
    B = [rand((7, 6), 60 + p) for p in range(W)]
    total = sum(A[p] @ B[p] for p in range(W))
    same(total, F.matmul_all_reduce(ctx, A[r].to(dev), B[r].to(dev)), "fp64 matmul_all_reduce", 1e-13)
    same(total.chunk(W)[r], F.matmul_reduce_scatter(ctx, A[r].to(dev), B[r].to(dev)), "fp64 reduce-scatter", 1e-13)
    same(sum(A), F.all_reduce(ctx, A[r].to(dev)), "fp64 all_reduce", 1e-13)


def scenario_front_doors_compile_fullgraph(ctx):
    # the out= front doors inside torch.compile(fullgraph=True): one iris:: node each, no graph break
    # (all_reduce_residual_rmsnorm's too, updating the residual in place, and its functional form)
    W, r, dev = ctx.world_size, ctx.rank, ctx.device

    weight = rand((3,), 95, torch.float32, dev)

    def model(x, a, b):
        s = torch.empty_like(x)
        ccl.all_reduce(ctx, s, x)
        ccl.all_reduce(ctx, x, x, op="max")  # in place
        g = torch.empty(W * x.shape[0], *x.shape[1:], device=dev)
        ccl.all_gather(ctx, g, s)
        part = torch.empty(x.shape[0] // W, *x.shape[1:], device=dev)
        ccl.reduce_scatter(ctx, part, g[: x.shape[0]])
        t = torch.empty_like(x)
        ccl.all_to_all(ctx, t, s)
        ccl.broadcast(ctx, t, W - 1)
        ccl.barrier(ctx)
        y = torch.empty(a.shape[0], b.shape[1], device=dev)
        ops.matmul_all_reduce(ctx, y, a, b, config=ops.Config(variant="two_shot"))
        z = torch.empty(W * a.shape[0], b.shape[1], device=dev)
        ops.all_gather_matmul(ctx, z, a, b)
        z2, rows = torch.empty_like(z), torch.empty(W * a.shape[0], a.shape[1], device=dev)
        ops.all_gather_matmul(ctx, z2, a, b, gathered=rows)  # the gathered rows kept: strategy unfused
        # the residual stream updated in place by the front door, then the functional form
        stream, normed = s.clone(), torch.empty_like(s)
        ops.all_reduce_residual_rmsnorm(ctx, normed, stream, t, stream, weight, eps=1e-5)
        again, stream2 = F.all_reduce_residual_rmsnorm(ctx, normed * 2, stream, weight,
                                                       config=ops.Config(variant="two_shot"))
        return s * 2, x, g, part, t, y, z, z2, rows, stream, normed, again, stream2

    def inputs():
        return ints((2 * W, 3), 70 + r, dev), ints((2 * W, 4), 80 + r, dev), ints((4, 5), 90 + r, dev)

    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    for got, expected in zip(compiled(*inputs()), model(*inputs())):
        same(expected, got, "compiled front door")
    # the graph calls the operators with the handle as a constant, world size included: what
    # keeps inductor's on-disk cache from serving a graph compiled for another world size
    codes = []

    def capture(gm, example_inputs):
        codes.append(gm.code)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=capture, fullgraph=True)(*inputs())
    assert len(codes) == 1 and f"({F.handle_of(ctx)}, " in codes[0], codes
    assert codes[0].count("iris.all_reduce_residual_rmsnorm") == 2, codes
    assert codes[0].count("iris.all_gather_matmul_gathered") == 1, codes


def scenario_rmsnorm_operator(ctx):
    # iris::all_reduce_residual_rmsnorm: the functional form against the front door and torch (exact),
    # on the GPU under inductor and CUDA graphs, the fake implementation's fp8 shapes (compiled with
    # aot_eager: scenario_front_doors_compile_fullgraph)
    from torch._subclasses.fake_tensor import FakeTensorMode

    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    partial, residual = ints((3, 8), 300 + r, dev), ints((3, 8), 310, dev)
    weight = rand((8,), 320, torch.float32, dev)
    out_f, residual_f = F.all_reduce_residual_rmsnorm(ctx, partial, residual, weight)
    out, new = torch.empty_like(partial), torch.empty_like(partial)
    ops.all_reduce_residual_rmsnorm(ctx, out, new, partial, residual, weight)
    same(out, out_f, "functional.all_reduce_residual_rmsnorm: out")
    same(new, residual_f, "functional.all_reduce_residual_rmsnorm: residual_out")
    h = sum(ints((3, 8), 300 + p) for p in range(W)) + ints((3, 8), 310)
    same(torch.nn.functional.rms_norm(h, (8,), weight.cpu(), 1e-6), out, "all_reduce_residual_rmsnorm")

    if ctx.device.type == "cuda":
        # GPU only: inductor, plain and with CUDA graphs (mode="reduce-overhead"), against eager
        from torch._dynamo.utils import counters

        def block(x, residual, weight):
            y, stream = F.all_reduce_residual_rmsnorm(ctx, x, residual, weight)
            return F.all_reduce_residual_rmsnorm(ctx, y * 0.5, stream, weight)

        expected = block(partial, residual, weight)
        for mode in (None, "reduce-overhead"):
            torch._dynamo.reset()
            counters.clear()
            step = torch.compile(block, fullgraph=True, mode=mode)
            for _ in range(3):  # warm-up, recording, replay
                got = [t.clone() for t in step(partial, residual, weight)]
                torch.compiler.cudagraph_mark_step_begin()
            for g, e in zip(got, expected):
                same(e, g, f"all_reduce_residual_rmsnorm under inductor, mode={mode}")
            assert not counters["graph_break"], dict(counters["graph_break"])
    with FakeTensorMode():
        fake = torch.empty(5, 16)
        y, stream, scales = torch.ops.iris.all_reduce_residual_rmsnorm(F.handle_of(ctx), fake, None, torch.empty(16),
                                                                       1e-6, None, torch.float8_e4m3fn)
        assert (y.dtype, y.shape, stream.dtype, scales.shape) == (torch.float8_e4m3fn, (5, 16), torch.float32, (5, 1))


def scenario_p2p_compiles_fullgraph(ctx):
    # ccl.send / ccl.recv and functional.send / recv inside torch.compile(fullgraph=True): one
    # iris:: node each, kept in the order traced, the messages right; a recv whose result goes
    # unused still takes its message (a side effect), or the next call would get it
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    ccl.init_p2p(ctx, tags=2, slots=2, chunk_bytes=1 << 16)  # 4 MiB or less of the heap at 8 ranks
    if W == 1:
        return
    nxt, prev = (r + 1) % W, (r - 1) % W

    def exchange(send, recv):  # even ranks send first: no cycle of senders
        if r % 2 == 0:
            send()
            return recv()
        out = recv()
        send()
        return out

    def model(x):
        y = torch.empty_like(x)
        exchange(lambda: ccl.send(ctx, x * 2, nxt), lambda: ccl.recv(ctx, y, prev))
        z = exchange(lambda: F.send(ctx, y + 1, nxt, tag=1), lambda: F.recv(ctx, x.shape, x.dtype, prev, tag=1))
        exchange(lambda: F.send(ctx, x[0, :2] + 0, nxt), lambda: F.recv(ctx, (2,), x.dtype, prev))  # unused
        return y, z

    def x_of(rank):
        return ints((3, 4), 300 + rank, dev)

    codes = []

    def capture(gm, example_inputs):
        codes.append(gm.code)
        return gm.forward

    torch._dynamo.reset()
    for fn in (model, torch.compile(model, backend="aot_eager", fullgraph=True),
               torch.compile(model, backend=capture, fullgraph=True)):
        y, z = fn(x_of(r))
        same(2 * x_of(prev), y, "ccl.recv in a compiled model")
        same(2 * x_of((prev - 1) % W) + 1, z, "functional.recv in a compiled model")
    assert codes[0].count("iris.send") == 3 and codes[0].count("iris.recv") == 3, codes[0]
    # on groups: the pairs [1, 0], [3, 2], ... (group ranks the reverse of the global ones), peers
    # given as group ranks, through the group's own mailboxes, eager and compiled
    pairs = [[q + 1, q] for q in range(0, W - 1, 2)]
    g = None
    for ranks in pairs:  # every rank makes every group
        g = ctx.new_group(ranks, workspace_size=1 << 18) or g
    if g is None:
        return
    ccl.init_p2p(ctx, tags=2, slots=2, chunk_bytes=1 << 12, group=g)
    peer = 1 - g.rank
    partner = g.ranks[peer]

    def on_group(x):
        y = torch.empty_like(x)
        sends = (lambda: ccl.send(ctx, x * 3, peer, group=g), lambda: F.send(ctx, x - 1, peer, tag=1, group=g))
        recvs = (lambda: ccl.recv(ctx, y, peer, group=g), lambda: F.recv(ctx, x.shape, x.dtype, peer, tag=1, group=g))
        if g.rank == 0:
            for k in range(2):
                sends[k]()
            z = [recvs[0](), recvs[1]()][1]
        else:
            z = [recvs[0](), recvs[1]()][1]
            for k in range(2):
                sends[k]()
        return y, z

    codes.clear()
    torch._dynamo.reset()
    for fn in (on_group, torch.compile(on_group, backend="aot_eager", fullgraph=True),
               torch.compile(on_group, backend=capture, fullgraph=True)):
        y, z = fn(x_of(r))
        same(3 * x_of(partner), y, f"ccl.recv on group {g.ranks}")
        same(x_of(partner) - 1, z, f"functional.recv on group {g.ranks}")
    assert codes[0].count("iris.send") == 2 and codes[0].count("iris.recv") == 2, codes[0]


def scenario_gradcheck_collectives(ctx):
    W = ctx.world_size
    own = rand((W, 2 * W, 3), 100)
    global_gradcheck(ctx, "all_reduce", lambda x: F.all_reduce(ctx, x), [("own", own)], "same")
    global_gradcheck(ctx, "all_reduce avg", lambda x: F.all_reduce(ctx, x, "avg"), [("own", own)], "same")
    global_gradcheck(ctx, "reduce_scatter", lambda x: F.reduce_scatter(ctx, x), [("own", own)], "own")
    # the mean's gradient is the gathered gradient divided by the world size (W times too large without it)
    global_gradcheck(ctx, "reduce_scatter avg", lambda x: F.reduce_scatter(ctx, x, "avg"), [("own", own)], "own")
    global_gradcheck(ctx, "all_gather", lambda x: F.all_gather(ctx, x), [("own", own)], "own")
    global_gradcheck(ctx, "all_to_all", lambda x: F.all_to_all(ctx, x), [("own", own)], "own")
    global_gradcheck(ctx, "broadcast", lambda x: F.broadcast(ctx, x, W - 1), [("own", own)], "own")
    # one value on every rank, which each rank consumes its own way
    global_gradcheck(ctx, "sum_gradients", lambda x: F.sum_gradients(ctx, x) * (ctx.rank + 1),
                     [("same", rand((2, 3), 101))], "own")


def scenario_gradcheck_fused_ops(ctx):
    # K split (row-parallel): a [M, K/W], b [K/W, N]; M rows split (sequence-parallel): a [M/W, K]
    W, M, K, N = ctx.world_size, 2 * ctx.world_size, 3, 2
    a_k, b_k = rand((W, M, K), 110), rand((W, K, N), 111)
    a_m, b_m = rand((W, M // W, K), 112), rand((W, K, N), 113)
    bias_own, bias_one = rand((W, N), 115), rand((N,), 116)
    global_gradcheck(ctx, "matmul_all_reduce", lambda a, b, c: F.matmul_all_reduce(ctx, a, b, c),
                     [("own", a_k), ("own", b_k), ("same", bias_one)], "same")
    global_gradcheck(ctx, "matmul_reduce_scatter", lambda a, b, c: F.matmul_reduce_scatter(ctx, a, b, c),
                     [("own", a_k), ("own", b_k), ("own", bias_own)], "own")
    global_gradcheck(ctx, "all_gather_matmul", lambda a, b, c: F.all_gather_matmul(ctx, a, b, c),
                     [("own", a_m), ("own", b_m), ("own", bias_own)], "own")
    global_gradcheck(ctx, "matmul_all_gather", lambda a, b, c: F.matmul_all_gather(ctx, a, b, c),
                     [("own", a_m), ("own", b_m), ("own", bias_own)], "own")
    # the training step's form that keeps the gathered rows (strategy unfused), and its operator with
    # both results used (the gathered rows' gradient is reduce-scattered into a's)
    keep = ops.Config(variant="unfused")
    global_gradcheck(ctx, "all_gather_matmul keeping the gathered rows",
                     lambda a, b, c: F.all_gather_matmul(ctx, a, b, c, config=keep),
                     [("own", a_m), ("own", b_m), ("own", bias_own)], "own")
    h = F.handle_of(ctx)
    global_gradcheck(ctx, "all_gather_matmul_gathered, both results",
                     lambda a, b, c: torch.cat(torch.ops.iris.all_gather_matmul_gathered(h, a, b, c), 1),
                     [("own", a_m), ("own", b_m), ("own", bias_own)], "own")


class IrisCalls(TorchDispatchMode):
    """Records the names of the ``iris::`` operators called while it is active (below autograd: the
    backward's calls too)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "iris":
            self.names.append(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


def scenario_reduce_scatter_gradient_gathers_once(ctx):
    # matmul_reduce_scatter's backward needs every rank's g for da and for db: one all_gather then,
    # not the fused all_gather_matmul plus a second gather; the fused op where da alone is wanted.
    # Each way gives the same gradients (fp64; exact to rounding).
    W, M, K, N = ctx.world_size, 4 * ctx.world_size, 3, 5
    a0, b0, g = rand((M, K), 140 + ctx.rank), rand((K, N), 150 + ctx.rank), rand((M // W, N), 160 + ctx.rank)
    results = {}
    for wants in (("a", "b"), ("a",), ("b",)):
        a, b = (t.to(ctx.device).requires_grad_(name in wants) for name, t in (("a", a0), ("b", b0)))
        out = F.matmul_reduce_scatter(ctx, a, b)
        with IrisCalls() as calls:
            out.backward(g.to(ctx.device))
        expected = {("a", "b"): ["all_gather"], ("a",): ["all_gather_matmul"], ("b",): ["all_gather"]}[wants]
        assert calls.names == expected, f"backward wanting {wants}: called {calls.names}, expected {expected}"
        results[wants] = (a.grad, b.grad)
    same(results[("a",)][0], results[("a", "b")][0], "da, fused against gathered once", 1e-12)
    same(results[("b",)][1], results[("a", "b")][1], "db alone against both", 0.0)


def scenario_all_gather_matmul_keeps_its_rows(ctx):
    # In training (b needs a gradient) with strategy unfused, the forward keeps the rows it gathers and
    # the backward multiplies them (no second all_gather); with a fused strategy the backward gathers
    # again; without a gradient for b, or under no_grad, the plain operator. Same gradients (fp64).
    W, dev = ctx.world_size, ctx.device
    a0, b0, bias0 = rand((3, 4), 170 + ctx.rank), rand((4, 5), 171 + ctx.rank), rand((5,), 172 + ctx.rank)
    g = rand((3 * W, 5), 173 + ctx.rank).to(dev)
    grads = {}
    kept = (["all_gather_matmul_gathered"], ["matmul_reduce_scatter"])
    again = (["all_gather_matmul"], ["matmul_reduce_scatter", "all_gather"])
    # no strategy named: the table's choice for this device (the GPU's keeps the rows, the cpu's not)
    default = kept if ops_config.keeps_gathered(3 * W, 5, 4, W, dev.type, None) else again
    for variant, wants, (forward, backward) in (
            ("unfused", ("a", "b"), kept), ("unfused", ("b",), (kept[0], [])),
            ("unfused", ("a",), (["all_gather_matmul"], ["matmul_reduce_scatter"])),
            ("pull", ("a", "b"), again), (None, ("a", "b"), default)):
        a, b = (t.clone().to(dev).requires_grad_(name in wants) for name, t in (("a", a0), ("b", b0)))
        with IrisCalls() as calls:
            out = F.all_gather_matmul(ctx, a, b, bias0.to(dev), config=ops.Config(variant=variant))
        assert calls.names == forward, f"forward of {variant} wanting {wants}: {calls.names}, expected {forward}"
        with IrisCalls() as calls:
            out.backward(g)
        assert calls.names == backward, f"backward of {variant} wanting {wants}: {calls.names}, expected {backward}"
        grads[variant, wants] = (out.detach(), a.grad, b.grad)
    for key, (out, da, db) in grads.items():
        ref_out, ref_da, ref_db = grads["pull", ("a", "b")]
        same(ref_out, out, f"result of {key}", 1e-12)
        if da is not None:
            same(ref_da, da, f"a's gradient of {key}", 1e-12)
        if db is not None:
            same(ref_db, db, f"b's gradient of {key}", 1e-12)
    with torch.no_grad(), IrisCalls() as calls:
        F.all_gather_matmul(ctx, a0.to(dev), b0.clone().to(dev).requires_grad_(True),
                            config=ops.Config(variant="unfused"))
    assert calls.names == ["all_gather_matmul"], calls.names
    # the front door's gathered=: every rank's rows in rank order, refused with a fused strategy or a
    # buffer it cannot fill
    shards = [rand((3, 4), 170 + q) for q in range(W)]
    out, rows = torch.empty(3 * W, 5, dtype=F64, device=dev), torch.full((3 * W, 4), float("nan"), dtype=F64,
                                                                          device=dev)
    ops.all_gather_matmul(ctx, out, a0.to(dev), b0.to(dev), gathered=rows)
    same(torch.cat(shards), rows.cpu(), "gathered rows", 0.0)
    same(torch.cat(shards) @ b0, out.cpu(), "result beside the gathered rows", 1e-12)
    call = "iris.collectives.ops.all_gather_matmul"
    expect_error(lambda: ops.all_gather_matmul(ctx, out, a0.to(dev), b0.to(dev), gathered=rows,
                                               config=ops.Config(variant="pull")),
                 IrisUsageError, call, "gathered= needs strategy 'unfused'", "variant='pull'", "drop variant")
    expect_error(lambda: ops.all_gather_matmul(ctx, out, a0.to(dev), b0.to(dev), gathered=rows.float()),
                 IrisUsageError, call, "gathered is torch.float32", "a_shard's dtype")
    expect_error(lambda: ops.all_gather_matmul(ctx, out, a0.to(dev), b0.to(dev), gathered=rows[:-1]),
                 IrisUsageError, call, "gathered has shape", f"expected ({3 * W}, 4)")
    wide = torch.empty(3 * W, 8, dtype=F64, device=dev)[:, ::2]
    expect_error(lambda: ops.all_gather_matmul(ctx, out, a0.to(dev), b0.to(dev), gathered=wide),
                 IrisUsageError, call, "gathered must be a contiguous tensor", "(8, 2)")


def tp_mlp_step(ctx, sequence_parallel: bool, dtype, group=None, config=None, **compile_options):
    """One SGD step of a tensor-parallel MLP (compiled, ``fullgraph=True``; on ``group``'s ranks if
    given) and of the same MLP on one device: returns [(what, tensor-parallel value, single-device
    value)] to compare."""
    on = ctx if group is None else group
    W, r, dev = on.world_size, on.rank, ctx.device
    S, H, inter = 2 * W, 6, 4 * W  # tokens, hidden, intermediate
    torch.manual_seed(1)  # the same full model on every rank
    full = torch.nn.Sequential(torch.nn.Linear(H, inter), torch.nn.GELU(), torch.nn.Linear(inter, H)).to(dtype)
    x, target = rand((S, H), 120, dtype).requires_grad_(True), rand((S, H), 121, dtype)
    tp = torch.nn.Sequential(ColumnParallelLinear.from_linear(ctx, full[0], sequence_parallel=sequence_parallel,
                                                             group=group, config=config),
                             torch.nn.GELU(),
                             RowParallelLinear.from_linear(ctx, full[2], sequence_parallel=sequence_parallel,
                                                          group=group))
    rows = slice(r * S // W, (r + 1) * S // W) if sequence_parallel else slice(None)
    tp_x, tp_target = x.detach()[rows].to(dev).requires_grad_(True), target[rows].to(dev)
    step = torch.compile(tp, fullgraph=True, **compile_options)
    # the loss in fp32 at least, fp64 for an fp64 model: an fp32 loss summed in another order differs
    # by an ulp (1.2e-7, seen on the GPU), far above the fp64 comparison's 1e-12
    acc = torch.promote_types(dtype, torch.float32)
    optimizer = torch.optim.SGD(tp.parameters(), lr=0.5)

    def tp_loss():
        # the single-device loss is the mean over all S rows; with sequence parallelism each rank
        # holds S / W of them, and the ranks' losses add up to it
        return ((step(tp_x) - tp_target).to(acc) ** 2).sum() / target.numel()

    def total(loss):  # the loss of the whole model: one value, or the ranks' parts summed
        return sum(on.comm.allgather(loss.item())) if sequence_parallel else loss.item()

    loss = tp_loss()
    loss.backward()
    ref_loss = ((full(x) - target).to(acc) ** 2).mean()
    ref_loss.backward()
    block = slice(r * inter // W, (r + 1) * inter // W)
    # copies: under mode="reduce-overhead" the gradients live in CUDA graphs' memory, which the
    # next call of the model overwrites (torch raises on reading them afterwards)
    out = [(what, got.detach().clone() if isinstance(got, torch.Tensor) else got, expected)
           for what, got, expected in (
               ("loss", total(loss), ref_loss.item()), ("input grad", tp_x.grad, x.grad[rows]),
               ("column weight grad", tp[0].weight.grad, full[0].weight.grad[block]),
               ("column bias grad", tp[0].bias.grad, full[0].bias.grad[block]),
               ("row weight grad", tp[2].weight.grad, full[2].weight.grad[:, block]),
               ("row bias grad", tp[2].bias.grad, full[2].bias.grad))]
    optimizer.step()
    torch.optim.SGD(full.parameters(), lr=0.5).step()
    torch.compiler.cudagraph_mark_step_begin()  # a new training step (what CUDA graph trees expect)
    with torch.no_grad():
        out.append(("loss after the step", total(tp_loss()), ((full(x) - target).to(acc) ** 2).mean().item()))
    return out


def scenario_tp_mlp_trains_compiled(ctx):
    # compiled (aot_eager: Triton's interpreter cannot run inductor's kernels), fullgraph: no graph break
    from torch._dynamo.utils import counters

    # the last: the column layer keeping the rows it gathers (what a GPU's table picks in training)
    for sequence_parallel, config in ((False, None), (True, None), (True, ops.Config(variant="unfused"))):
        torch._dynamo.reset()
        counters.clear()
        for what, got, expected in tp_mlp_step(ctx, sequence_parallel, F64, config=config, backend="aot_eager"):
            got, expected = torch.as_tensor(got), torch.as_tensor(expected)
            same(expected, got, f"{what} (sequence_parallel={sequence_parallel}, config={config})", 1e-12)
        assert not counters["graph_break"], dict(counters["graph_break"])


def moe_reference(x, router, w1, w2, top_k: int):
    """The single-process MoE the layer splits: every expert here, every rank's tokens at once,
    each token's expert outputs summed weighted in slot order."""
    weights, idx = torch.softmax(x @ router.t(), -1).topk(top_k, -1)
    acc = torch.zeros_like(x)
    for k in range(top_k):
        e = idx[:, k]
        out = torch.bmm(torch.nn.functional.silu(torch.bmm(x[:, None, :], w1[e])), w2[e])[:, 0]
        acc = acc + weights[:, k:k + 1] * out
    return acc


def moe_step(ctx, group=None):
    """One compiled SGD step of an expert-parallel MoE layer (on ``group``: split over its members,
    ranks are group ranks) against the single-process MoE of the same weights, fp64: loss,
    gradients of the tokens, the router (summed over the ranks) and this rank's experts, and the
    loss after."""
    from torch._dynamo.utils import counters

    on = ctx if group is None else group
    W, r = on.world_size, on.rank
    H, F_, E, K = 6, 5, 2 * W, 2
    tokens = [(4, 1, 3, 2)[q % 4] for q in range(W)]
    router, w1, w2 = rand((E, H), 400), rand((E, H, F_), 401) / 2, rand((E, F_, H), 402) / 2
    xs = [rand((tokens[q], H), 410 + q) for q in range(W)]
    targets = [rand((tokens[q], H), 420 + q) for q in range(W)]
    n = sum(tokens) * H
    full = [t.clone().requires_grad_(True) for t in (router, w1, w2)]
    X = torch.cat(xs).requires_grad_(True)
    ref_loss = ((moe_reference(X, *full, K) - torch.cat(targets)) ** 2).sum() / n
    ref_loss.backward()
    layer = ExpertParallelMoE.from_dense(ctx, router.to(ctx.device), w1.to(ctx.device), w2.to(ctx.device), K,
                                         max_tokens=max(tokens), group=group)
    torch._dynamo.reset()
    counters.clear()
    step = torch.compile(layer, backend="aot_eager", fullgraph=True)
    x, target = xs[r].to(ctx.device).requires_grad_(True), targets[r].to(ctx.device)
    loss = ((step(x) - target) ** 2).sum() / n
    loss.backward()
    assert not counters["graph_break"], dict(counters["graph_break"])
    G, first = E // W, sum(tokens[:r])
    experts = slice(r * G, (r + 1) * G)
    what = "MoE" if group is None else f"MoE on group {list(group.ranks)}"
    same(torch.tensor(ref_loss.item()), torch.tensor(sum(on.allgather(loss.item()))), f"{what} loss", 1e-12)
    same(X.grad[first:first + tokens[r]], x.grad, f"{what} token gradients", 1e-12)
    same(full[0].grad, layer.router.grad, f"{what} router gradient (summed over the ranks)", 1e-12)
    same(full[1].grad[experts], layer.w1.grad, f"{what} w1 gradients", 1e-12)
    same(full[2].grad[experts], layer.w2.grad, f"{what} w2 gradients", 1e-12)
    with torch.no_grad():
        for p, ref in zip((layer.router, layer.w1, layer.w2), full):
            p -= 0.5 * p.grad
            ref -= 0.5 * ref.grad
        after = sum(on.allgather(((step(x) - target) ** 2).sum().item() / n))
        ref_after = ((moe_reference(X, *full, K) - torch.cat(targets)) ** 2).sum().item() / n
    same(torch.tensor(ref_after), torch.tensor(after), f"{what} loss after one step", 1e-12)


def scenario_moe_trains_compiled(ctx):
    # an expert-parallel MoE layer (different token counts per rank), compiled with fullgraph: one
    # SGD step as the single-process MoE takes it; a layer drawn from a seed
    W, r = ctx.world_size, ctx.rank
    H, F_, E, K = 6, 5, 2 * W, 2
    G = E // W
    moe_step(ctx)
    # built from a seed: one router on every rank (rank 0's), and each rank's experts the ones the
    # same seed draws in one process, expert after expert
    torch.manual_seed(5 + r)
    drawn = ExpertParallelMoE(ctx, H, F_, E, K, dtype=F64)
    routers = ctx.comm.allgather(drawn.router.detach().cpu())
    assert all(torch.equal(routers[0], other) for other in routers), "the router differs between ranks"
    if ctx.device.type == "cpu":  # the generator of the device draws
        torch.manual_seed(5 + r)
        torch.nn.init.kaiming_uniform_(torch.empty(E, H, dtype=F64), a=math.sqrt(5))
        a, b = 1 / math.sqrt(H), 1 / math.sqrt(F_)
        experts = [(torch.empty(H, F_, dtype=F64).uniform_(-a, a), torch.empty(F_, H, dtype=F64).uniform_(-b, b))
                   for _ in range(E)][r * G:(r + 1) * G]
        same(torch.stack([w1 for w1, _ in experts]), drawn.w1, "this rank's w1 as one process draws them")
        same(torch.stack([w2 for _, w2 in experts]), drawn.w2, "this rank's w2 as one process draws them")


def scenario_exchanges_compile_and_differentiate(ctx):
    # ccl.all_to_all_v and moe.dispatch / combine inside torch.compile(fullgraph=True) (one node each,
    # results as in eager mode); gradcheck in fp64 of all_to_all_v and of a dispatch, a nonlinear
    # expert and a combine, as functions of every rank's tokens and top-k weights
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    T, H, E, K = 3, 2, 2 * W, 2

    def splits(q):  # 0 .. 2 rows to each rank, of 2 W
        return torch.tensor([(q + j) % 3 for j in range(W)])

    def routing(q):
        return torch.tensor([[(q + t) % E, (q + t + 1 + t % 2) % E] for t in range(T)])

    def model(x, w):
        out = torch.zeros(W * 2 * W, H, device=dev)  # compiled, rows past the received ones become zeros
        got = torch.empty(W, dtype=torch.int64, device=dev)
        ccl.all_to_all_v(ctx, out, x, splits(r).to(dev), got)
        expert_x, meta, handle = moe.dispatch(ctx, x[:T], routing(r).to(dev), w, E)
        return out, got, meta.counts, moe.combine(ctx, torch.tanh(expert_x) * 3, handle)

    x, w = ints((2 * W, H), 430 + r, dev), ints((T, K), 431 + r, dev).abs()
    torch._dynamo.reset()
    codes = []

    def capture(gm, example_inputs):
        codes.append(gm.code)
        return gm.forward

    for fn in (torch.compile(model, backend="aot_eager", fullgraph=True), torch.compile(model, backend=capture,
                                                                                        fullgraph=True)):
        for got, expected in zip(fn(x, w), model(x, w)):
            same(expected.float(), got.float(), "compiled exchanges")
    assert codes[0].count("iris.all_to_all_v") == 1 and codes[0].count("iris.moe_dispatch") == 1 and \
        codes[0].count("iris.moe_combine") == 1, codes[0]
    xs = rand((W, 2 * W, H), 432)
    global_gradcheck(ctx, "all_to_all_v", lambda x: F.all_to_all_v(ctx, x, splits(r).to(dev))[0], [("own", xs)],
                     "own", fast=True)

    def moe_block(x, w):  # one program per launch: the interpreter's time is per program
        expert_x, _, handle = F.moe_dispatch(ctx, x, routing(r)[:2].to(dev), w, E, expert_capacity=2 * W,
                                             config=ccl.Config(grid=1))
        return F.moe_combine(ctx, torch.tanh(expert_x) * expert_x, handle)

    global_gradcheck(ctx, "moe dispatch and combine", moe_block,
                     [("own", rand((W, 2, H), 433)), ("own", rand((W, 2, K), 434))], "own", fast=True)
    # on groups: the pairs [1, 0], [3, 2], ..., compiled as in eager mode, one node each
    g = None
    for ranks in [[q + 1, q] for q in range(0, W - 1, 2)]:  # every rank makes every group
        g = ctx.new_group(ranks, workspace_size=1 << 20) or g
    if g is None:
        return
    Eg = 2 * g.size

    def on_group(x, w):
        idx = torch.tensor([[(g.rank + t) % Eg, (g.rank + t + 1) % Eg] for t in range(T)], device=dev)
        expert_x, meta, handle = moe.dispatch(ctx, x[:T], idx, w, Eg, group=g)
        return meta.counts, moe.combine(ctx, torch.tanh(expert_x) * 3, handle, group=g)

    codes.clear()
    torch._dynamo.reset()
    for fn in (torch.compile(on_group, backend="aot_eager", fullgraph=True),
               torch.compile(on_group, backend=capture, fullgraph=True)):
        for got, expected in zip(fn(x, w), on_group(x, w)):
            same(expected.float(), got.float(), f"compiled dispatch and combine on group {g.ranks}")
    assert codes[0].count("iris.moe_dispatch") == 1 and codes[0].count("iris.moe_combine") == 1, codes[0]
    counts = on_group(x, w)[0]  # every token to experts of its own group rank and the next: 3 rows each
    assert counts.tolist() == [sum(1 for q in range(2) for t in range(T) for e in ((q + t) % Eg, (q + t + 1) % Eg)
                                   if e == g.rank * 2 + j) for j in range(2)], counts


def scenario_layers_initialise_as_linear(ctx):
    # with one seed on every rank, a layer is its rank's block of the Linear that seed draws; the row
    # layer's bias is one value on every rank even when the ranks draw differently
    W, r = ctx.world_size, ctx.rank
    for cls, dim in ((ColumnParallelLinear, 0), (RowParallelLinear, 1)):
        torch.manual_seed(3)
        linear = torch.nn.Linear(4 * W, 2 * W, device=ctx.device)
        torch.manual_seed(3)
        layer = cls(ctx, 4 * W, 2 * W)
        same(linear.weight.chunk(W, dim)[r], layer.weight, f"{cls.__name__} weight")
        same(linear.bias.chunk(W)[r] if dim == 0 else linear.bias, layer.bias, f"{cls.__name__} bias")
    torch.manual_seed(4 + r)
    bias = RowParallelLinear(ctx, 2 * W, 3).bias.detach().cpu()
    for other in ctx.comm.allgather(bias):
        same(bias, other, "row bias across ranks")


def scenario_errors(ctx):
    W, dev = ctx.world_size, ctx.device
    x = ints((2 * W,), 130, dev)
    expect_error(lambda: torch.ops.iris.all_reduce(10**6, x), IrisUsageError, "iris::all_reduce", "no Iris context",
                 "handle 1000000")
    expect_error(lambda: F.all_reduce(ctx, x, config=ops.Config()), IrisUsageError,
                 "iris.collectives.functional.all_reduce", "iris.collectives.ccl._config.Config")
    expect_error(lambda: F.handle_of(object()), IrisUsageError, "is not an Iris context")
    leaf = x.clone().requires_grad_(True)
    expect_error(lambda: F.all_reduce(ctx, leaf, "max"), IrisUsageError, "op='max'", "'sum' or 'avg'")
    expect_error(lambda: F.reduce_scatter(ctx, ints((2 * W + 1,), 131, dev)), IrisUsageError, "iris::reduce_scatter",
                 f"multiple of {W} rows")
    expect_error(lambda: ColumnParallelLinear(ctx, 4, 2 * W + 1), IrisUsageError, "ColumnParallelLinear",
                 "out_features=")
    layer = RowParallelLinear(ctx, 2 * W, 3, sequence_parallel=True)
    expect_error(lambda: layer(torch.ones(2, 2, dtype=torch.float64, device=dev)), UnsupportedDtypeError,
                 "RowParallelLinear", "torch.float64")
    expect_error(lambda: layer(torch.ones(2, 5, device=dev)), IrisUsageError, "last dimension must be 2")
    if W > 1:
        expect_error(lambda: layer(torch.ones(W + 1, 2, device=dev)), IrisUsageError, "sequence_parallel",
                     f"multiple of {W}")


def scenario_calls_agree(ctx):
    # The operators run the front doors, eager and compiled, and so their call agreement: a rank
    # whose input has another length makes every rank raise IrisCallMismatchError naming both.
    W, r, dev = ctx.world_size, ctx.rank, ctx.device
    if W < 2:
        return
    others = "ranks " + ", ".join(map(str, range(1, W))) if W > 2 else "rank 1"

    def differ(fn, n, call):
        x = torch.ones(n if r else n + 4, device=dev)
        expect_error(lambda: fn(x), iris.runtime.IrisCallMismatchError, f"{call}: the ranks made different "
                     f"collective calls", f"rank 0 called {call}(", f"inp=float32[{n + 4}]", f"{others} called {call}(",
                     f"inp=float32[{n}]")

    ar, ag = "iris.collectives.ccl.all_reduce", "iris.collectives.ccl.all_gather"
    differ(lambda x: F.all_reduce(ctx, x), 16, ar)
    differ(lambda x: torch.compile(lambda y: F.all_reduce(ctx, y) * 2, backend="eager", fullgraph=True)(x), 20, ar)
    differ(lambda x: torch.compile(lambda y: F.all_gather(ctx, y + 1), backend="aot_eager", fullgraph=True)(x), 24,
           ag)
    f32 = dict(dtype=torch.float32, device=dev)
    k = 8 if r == 0 else 4
    expect_error(lambda: F.matmul_all_reduce(ctx, torch.ones(16, k, **f32), torch.ones(k, 16, **f32)),
                 iris.runtime.IrisCallMismatchError, "iris.collectives.ops.matmul_all_reduce: the ranks made "
                 "different collective calls", "a=float32[16, 8]", "a=float32[16, 4]")
    norm = "iris.collectives.ops.all_reduce_residual_rmsnorm"
    rows = 4 if r == 0 else 3
    expect_error(lambda: torch.compile(lambda p: F.all_reduce_residual_rmsnorm(ctx, p, None, torch.ones(8, **f32)),
                                       backend="aot_eager", fullgraph=True)(torch.ones(rows, 8, **f32)),
                 iris.runtime.IrisCallMismatchError, f"{norm}: the ranks made different collective calls",
                 "partial=float32[4, 8]", "partial=float32[3, 8]")
    x = torch.full((16,), float(r), device=dev)
    assert torch.equal(F.all_reduce(ctx, x).cpu(), torch.full((16,), float(W * (W - 1) // 2)))


# --- groups ------------------------------------------------------------------------------------------

_GROUPS: dict = {}


def groups_of(ctx) -> dict:
    """This rank's groups of ccl_worker's layouts, made once per context (every rank makes every
    group): at 4 ranks TP ``[0,1],[2,3]``, DP ``[0,2],[1,3]``, the non-contiguous ``[3,0,2]``; the
    same shapes cut down on fewer ranks. None where this rank is no member."""
    from ccl_worker import group_layouts, make_groups

    if ctx.uid not in _GROUPS:
        # a group's calls keep a workspace per call's shape in its arena, and every operator's
        # forward and backward here runs on each group: 256 KiB holds them up to 4 ranks, the
        # group of 7 of 8 ranks needs more (its workspaces grow with its size)
        workspace = 1 << 18 if ctx.world_size <= 4 else 1 << 20
        _GROUPS[ctx.uid] = {name: make_groups(ctx, lists, workspace)
                            for name, lists in group_layouts(ctx.world_size).items()}
    return _GROUPS[ctx.uid]


def grad_of(fn, x, upstream, dev):
    """``(fn(x), x's gradient)`` for the upstream gradient ``upstream`` (this rank's)."""
    leaf = x.to(dev).requires_grad_(True)
    y = fn(leaf)
    y.backward(upstream.to(dev))
    return y, leaf.grad


def check_collectives_on_group(ctx, g, name: str, seed: int) -> None:
    """One functional collective on group ``g``, forward and backward, against torch on every
    member's regenerated data (exact: small integers), in group rank order; the forward against
    the ccl front door on the group too."""
    R, G, i, dev = g.ranks, g.size, g.rank, ctx.device
    what = f"functional.{name} on group {list(R)}"

    def own(shape, s):  # every member's value, in group order
        return [ints(shape, s + p) for p in R]

    def chunk(t, j):
        return t.chunk(G)[j]

    if name in ("all_reduce", "all_reduce avg"):
        op = "avg" if name.endswith("avg") else "sum"
        X, U = own((2 * G, 3), seed), own((2 * G, 3), seed + 50)
        y, dx = grad_of(lambda x: F.all_reduce(ctx, x, op, group=g), X[i], U[i], dev)
        front = X[i].to(dev).clone()
        ccl.all_reduce(ctx, front, front, op=op, group=g)
        same(front, y, f"{what} against ccl")
        if op == "sum":
            same(sum(X), y, what)
        same(U[i] / G if op == "avg" else U[i], dx, f"{what}: gradient")
    elif name == "reduce_scatter":
        X, U = own((2 * G, 3), seed), own((2, 3), seed + 50)
        y, dx = grad_of(lambda x: F.reduce_scatter(ctx, x, group=g), X[i], U[i], dev)
        same(chunk(sum(X), i), y, what)
        same(torch.cat(U), dx, f"{what}: gradient (the group's gradients gathered)")
    elif name == "all_gather":
        X, U = own((2, 3), seed), own((2 * G, 3), seed + 50)
        y, dx = grad_of(lambda x: F.all_gather(ctx, x, group=g), X[i], U[i], dev)
        front = torch.empty(2 * G, 3, device=dev)
        ccl.all_gather(ctx, front, X[i].to(dev), group=g)
        same(front, y, f"{what} against ccl")
        same(torch.cat(X), y, what)
        same(chunk(sum(U), i), dx, f"{what}: gradient (the group's gradients reduce-scattered)")
    elif name == "all_to_all":
        X, U = own((2 * G, 3), seed), own((2 * G, 3), seed + 50)
        y, dx = grad_of(lambda x: F.all_to_all(ctx, x, group=g), X[i], U[i], dev)
        same(torch.cat([chunk(X[j], i) for j in range(G)]), y, what)
        same(torch.cat([chunk(U[j], i) for j in range(G)]), dx, f"{what}: gradient")
    elif name == "broadcast":
        X, U = own((2, 3), seed), own((2, 3), seed + 50)
        y, dx = grad_of(lambda x: F.broadcast(ctx, x, G - 1, group=g), X[i], U[i], dev)
        same(X[G - 1], y, what)
        same(sum(U) if i == G - 1 else torch.zeros(2, 3), dx, f"{what}: gradient")
    elif name == "sum_gradients":
        X, U = own((2, 3), seed), own((2, 3), seed + 50)
        y, dx = grad_of(lambda x: F.sum_gradients(ctx, x, group=g), X[i], U[i], dev)
        same(X[i], y, what)
        same(sum(U), dx, f"{what}: gradient (summed over the group)")
    elif name == "all_to_all_v":
        # one row to each member: row j of the result came from group rank j; its gradient goes back
        X, U = own((G, 3), seed), own((G * G, 3), seed + 50)
        splits = torch.ones(G, dtype=torch.int64, device=dev)
        leaf = X[i].to(dev).requires_grad_(True)
        y, out_splits, offsets = F.all_to_all_v(ctx, leaf, splits, group=g)
        y.backward(U[i].to(dev))
        expected = torch.zeros(G * G, 3)
        expected[:G] = torch.stack([X[j][i] for j in range(G)])
        same(expected, y, what)
        same(torch.ones(G, dtype=torch.int64), out_splits, f"{what}: splits")
        same(torch.arange(G), offsets, f"{what}: offsets")
        same(torch.stack([U[j][i] for j in range(G)]), leaf.grad, f"{what}: gradient")
    else:
        raise AssertionError(name)


def check_fused_on_group(ctx, g, name: str, seed: int) -> None:
    """One functional fused op on group ``g`` with a bias, forward and the three gradients, against
    torch on every member's regenerated data (exact), and the forward against the ops front door."""
    R, G, i, dev = g.ranks, g.size, g.rank, ctx.device
    what = f"functional.{name} on group {list(R)}"

    def own(shape, s):
        return [ints(shape, s + p) for p in R]

    rows = 2 * G if name in ("matmul_all_reduce", "matmul_reduce_scatter") else 2
    A, B, C = own((rows, 5), seed), own((5, 4), seed + 10), own((4,), seed + 20)
    if name == "matmul_all_reduce":  # its bias is added once: one value on every rank
        C = [C[0]] * G
    out_rows = {"matmul_all_reduce": rows, "matmul_reduce_scatter": 2}.get(name, 2 * G)
    U = own((out_rows, 4), seed + 30)
    a, b, c = (t.to(dev).requires_grad_(True) for t in (A[i], B[i], C[i]))
    y = getattr(F, name)(ctx, a, b, c, group=g)
    y.backward(U[i].to(dev))
    front = torch.empty_like(y)
    # given the leaves, which require grad, after the operator made the group's workspaces inside
    # the dispatcher (no-grad mode): the front door writes its staging buffers in grad mode
    getattr(ops, name)(ctx, front, a, b, c, group=g)
    same(front, y, f"{what} against ops")
    if name == "matmul_all_reduce":
        expected = sum(A[j] @ B[j] for j in range(G)) + C[i]
        gy = U[i]  # the replicated result's gradient passes the all-reduce as it is
        da, db, dc = gy @ B[i].t(), A[i].t() @ gy, gy.sum(0)
    elif name == "matmul_reduce_scatter":
        expected = sum(A[j] @ B[j] for j in range(G)).chunk(G)[i] + C[i]
        gathered = torch.cat(U)  # the group's gradients of their rows
        da, db, dc = gathered @ B[i].t(), A[i].t() @ gathered, U[i].sum(0)
    elif name == "all_gather_matmul":
        whole = torch.cat(A)
        expected = whole @ B[i] + C[i]
        da = sum(U[j] @ B[j].t() for j in range(G)).chunk(G)[i]
        db, dc = whole.t() @ U[i], U[i].sum(0)
    else:  # matmul_all_gather
        expected = torch.cat([A[j] @ B[j] + C[j] for j in range(G)])
        mine = sum(U).chunk(G)[i]  # every member's gradient of this rank's rows
        da, db, dc = mine @ B[i].t(), A[i].t() @ mine, mine.sum(0)
    same(expected, y, what)
    for got, want, which in ((a.grad, da, "a"), (b.grad, db, "b"), (c.grad, dc, "bias")):
        same(want, got, f"{what}: {which}'s gradient")


def scenario_operators_on_groups(ctx):
    # Every functional operator on TP and DP groups and a non-contiguous one, forward and backward
    # exact against torch on the members' data (and against the front doors on the group), the
    # groups of each operator called back to back; then compiled (fullgraph, aot_eager): operators
    # and front doors on two groups in one graph, each group's handle a constant of it; bad groups.
    groups = [g for g in groups_of(ctx).values() if g is not None]
    for g in groups:  # a group's handle: its own uid (never a context's) and its size
        h = F.handle_of(ctx, g)
        assert h != F.handle_of(ctx) and h & ((1 << _handles.WORLD_BITS) - 1) == g.size, (h, g)
        assert iris.runtime.context_of_uid(g.uid) is g and F.context_of(h, "test") is g, g
    names = ("all_reduce", "all_reduce avg", "reduce_scatter", "all_gather", "all_to_all", "broadcast",
             "sum_gradients", "all_to_all_v")
    for k, name in enumerate(names):
        for g in groups:
            check_collectives_on_group(ctx, g, name, 1000 + 100 * k)
    for k, name in enumerate(("matmul_all_reduce", "matmul_reduce_scatter", "all_gather_matmul",
                              "matmul_all_gather")):
        for g in groups:
            check_fused_on_group(ctx, g, name, 2000 + 100 * k)
    dev = ctx.device
    for g in groups:  # the inference op: the front door's bits on the group
        partial, weight = ints((3, 8), 3000 + ctx.rank, dev), rand((8,), 3001, torch.float32, dev)
        out, res = F.all_reduce_residual_rmsnorm(ctx, partial, None, weight, group=g)
        ref_out, ref_res = torch.empty_like(partial), torch.empty_like(partial)
        ops.all_reduce_residual_rmsnorm(ctx, ref_out, ref_res, partial, None, weight, group=g)
        same(ref_out, out, f"functional.all_reduce_residual_rmsnorm on group {list(g.ranks)}")
        same(ref_res, res, f"functional.all_reduce_residual_rmsnorm on group {list(g.ranks)}: residual_out")

    tp, dp = groups_of(ctx)["tp"], groups_of(ctx)["dp"]

    def model(x):
        y = F.all_gather(ctx, x, group=tp) * 2
        z = F.all_reduce(ctx, y, group=dp)
        s = torch.empty_like(z)
        ccl.all_reduce(ctx, s, z.detach(), group=tp)  # front doors on groups, compiled
        ccl.barrier(ctx, group=dp)
        return F.reduce_scatter(ctx, s, group=tp) + z.sum()

    x = rand((2, 3), 3100 + ctx.rank)
    expected, dx = grad_of(model, x, torch.ones(2, 3, dtype=F64), dev)
    torch._dynamo.reset()
    got, dx_compiled = grad_of(torch.compile(model, backend="aot_eager", fullgraph=True), x,
                               torch.ones(2, 3, dtype=F64), dev)
    same(expected, got, "compiled on groups")
    same(dx, dx_compiled, "compiled on groups: gradient")
    codes = []

    def capture(gm, example_inputs):
        codes.append(gm.code)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=capture, fullgraph=True)(x.to(dev))
    for g in (tp, dp):
        assert len(codes) == 1 and f"({F.handle_of(ctx, g)}, " in codes[0], codes
    assert f"iris.barrier({F.handle_of(ctx, dp)})" in codes[0], codes
    # errors: a group of another context, anything else as group=
    other = object.__new__(iris.runtime.Group)
    other.ctx, other.ranks, other.rank, other.size = None, (0,), 0, 1
    x = ints((2 * ctx.world_size,), 3200, dev)
    for call, fn in (("all_reduce", lambda: F.all_reduce(ctx, x, group=other)),
                     ("matmul_all_reduce", lambda: F.matmul_all_reduce(ctx, x[:, None], x[None], group=other)),
                     ("sum_gradients", lambda: F.sum_gradients(ctx, x, group=other))):
        expect_error(fn, iris.runtime.GroupError, f"iris.collectives.functional.{call}", "a group of another context")
    expect_error(lambda: F.all_gather(ctx, x, group=7), iris.runtime.GroupError, "iris.collectives.functional."
                 "all_gather", "group=7", "ctx.new_group(ranks)")
    for cls in (ColumnParallelLinear, RowParallelLinear):
        expect_error(lambda: cls(ctx, 4, 4, group=other), iris.runtime.GroupError,
                     f"iris.collectives.nn.{cls.__name__}", "a group of another context")
    tp = groups_of(ctx)["tp"]
    if tp.size > 1:
        expect_error(lambda: ColumnParallelLinear(ctx, 4, 2 * tp.size + 1, group=tp), IrisUsageError,
                     "ColumnParallelLinear", f"out_features={2 * tp.size + 1} is not a multiple of the size of the "
                     f"group {list(tp.ranks)}, {tp.size}")


def scenario_layers_on_groups(ctx):
    # The tensor-parallel layers and the expert-parallel MoE on a group: split by the group's size
    # and rank, every call on the group. A compiled MoE step and a compiled MLP on the TP group (both
    # layouts) and on the non-contiguous group train one step as the single-device model does
    # (exact in fp64); then TP x DP: each TP group a replica with data of its own, gradients
    # averaged over the DP group: the single-device model's gradients of the mean loss over the
    # replicas.
    from torch._dynamo.utils import counters

    groups = groups_of(ctx)
    tp, dp = groups["tp"], groups["dp"]
    for g in (tp, groups["odd"]):  # the expert-parallel MoE layer split over a group
        if g is not None:
            torch._dynamo.reset()
            moe_step(ctx, g)
    for g, layouts in ((tp, (False, True)), (groups["odd"], (True,))):
        if g is None:
            continue
        for sequence_parallel in layouts:
            torch._dynamo.reset()
            counters.clear()
            for what, got, expected in tp_mlp_step(ctx, sequence_parallel, F64, group=g, backend="aot_eager"):
                same(torch.as_tensor(expected), torch.as_tensor(got),
                     f"{what} (group {list(g.ranks)}, sequence_parallel={sequence_parallel})", 1e-12)
            assert not counters["graph_break"], dict(counters["graph_break"])
    if ctx.device.type == "cuda" and tp.size > 1:
        # GPU only: inductor with CUDA graphs (mode="reduce-overhead") on the TP group, bf16
        torch._dynamo.reset()
        counters.clear()
        for what, got, expected in tp_mlp_step(ctx, True, torch.bfloat16, group=tp, mode="reduce-overhead"):
            got, expected = torch.as_tensor(got).float(), torch.as_tensor(expected).float()
            scale = max(expected.abs().max().item(), 1e-3)
            same(expected, got, f"{what} (group {list(tp.ranks)}, inductor, reduce-overhead)", 3e-2 * scale)
        assert not counters["graph_break"], dict(counters["graph_break"])
    if ctx.world_size % 2:
        # TP x DP needs a full grid: at an odd world size the layouts cut down (3 ranks: TP [0,1], [2];
        # DP [0,2], [1]), so DP [0,2] would average the gradients of replicas split two ways and one way
        return
    T, t, D, d = tp.size, tp.rank, dp.size, dp.rank  # d: this rank's replica (its TP group's place)
    H, S, inter = 6, 4, 4 * T
    torch.manual_seed(5)
    full = torch.nn.Sequential(torch.nn.Linear(H, inter), torch.nn.GELU(), torch.nn.Linear(inter, H)).to(F64)
    layer = torch.nn.Sequential(ColumnParallelLinear.from_linear(ctx, full[0], group=tp), torch.nn.GELU(),
                                RowParallelLinear.from_linear(ctx, full[2], group=tp))
    assert (layer[0].rank, layer[0].world_size, layer[0].weight.shape[0]) == (t, T, inter // T), layer[0]
    xs, targets = [rand((S, H), 3300 + q) for q in range(D)], [rand((S, H), 3400 + q) for q in range(D)]
    loss = ((layer(xs[d].to(ctx.device)) - targets[d].to(ctx.device)) ** 2).mean()
    loss.backward()
    grads = [F.all_reduce(ctx, p.grad, "avg", group=dp) for p in layer.parameters()]
    (sum(((full(xs[q]) - targets[q]) ** 2).mean() for q in range(D)) / D).backward()
    expected = (full[0].weight.grad.chunk(T, 0)[t], full[0].bias.grad.chunk(T)[t],
                full[2].weight.grad.chunk(T, 1)[t], full[2].bias.grad)
    for what, got, want in zip(("column weight", "column bias", "row weight", "row bias"), grads, expected):
        same(want, got, f"TP x DP {what} gradient (TP {list(tp.ranks)}, DP {list(dp.ranks)})", 1e-12)


def scenario_gpu_inductor_and_cuda_graphs(ctx):
    # GPU only: inductor (default and reduce-overhead, i.e. CUDA graphs) trains the MLP with no graph
    # break; bf16 values against the single-device model, with bf16's tolerance. Each mode once and
    # each layout once, not every pair: each is a whole inductor compile of the step (forward and
    # backward) on every rank at once (both layouts also train under aot_eager, above)
    if ctx.device.type != "cuda":
        return
    from torch._dynamo.utils import counters

    for mode, sequence_parallel in ((None, False), ("reduce-overhead", True)):
        torch._dynamo.reset()
        counters.clear()
        results = tp_mlp_step(ctx, sequence_parallel, torch.bfloat16, mode=mode)
        for what, got, expected in results:
            got, expected = torch.as_tensor(got).float(), torch.as_tensor(expected).float()
            scale = max(expected.abs().max().item(), 1e-3)
            same(expected, got, f"{what} (sequence_parallel={sequence_parallel}, mode={mode})", 3e-2 * scale)
        assert not counters["graph_break"], dict(counters["graph_break"])


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    # 32 MiB: at 8 ranks each rank reserves 1 MiB for each of the 7 groups it takes part in or not
    iris.runtime.testing.run_scenarios(globals(), heap_size=1 << 25)
