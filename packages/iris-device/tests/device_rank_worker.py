"""Multi-rank scenarios for iris.device: every primitive, bound and free, to every peer.

Launched by ``test_device_multirank.py`` as ``mpiexec -n N python -m mpi4py device_rank_worker.py
<scenario>...``; runs on the cpu backend (Triton's interpreter, shared memory) and on cuda. Each
scenario fills inputs on the host, poisons outputs, runs a kernel on every rank at once and checks
against values computed on the host.
"""

from __future__ import annotations

import torch

import iris.runtime  # first: picks the backend and, for cpu, switches Triton's interpreter on
import iris.runtime.testing

# isort: split
import triton
import triton.language as tl
from device_test_kernels import atomic_matrix_kernel, root_cause
from device_test_tables import COMBOS, OPS, SCOPES, SEMS

import iris.device as device
from iris.device import DeviceContext

BLOCK = 64
N_ACTIVE = 45
POISON = -3
OTHER = -7
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "int32": torch.int32,
          "int64": torch.int64}


def lane_mask() -> torch.Tensor:
    offs = torch.arange(BLOCK)
    return (offs < N_ACTIVE) & (offs % 5 != 1)


def pattern(rank: int, dtype: torch.dtype) -> torch.Tensor:
    # rank * 64 + i < 256: exact in every dtype, bf16 included.
    return (rank * BLOCK + torch.arange(BLOCK)).to(dtype)


def check_equal(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    got = got.cpu()
    want = want.to(got.dtype).expand(got.shape)
    if not torch.equal(got, want):
        flat_got, flat_want = got.flatten(), want.flatten()
        bad = (flat_got != flat_want).nonzero().flatten().tolist()
        raise AssertionError(f"{what}: {len(bad)} wrong element(s) of {got.numel()}, first at flat index {bad[:8]}: "
                             f"got {flat_got[bad[:8]].tolist()} want {flat_want[bad[:8]].tolist()}")


def is_cpu(ctx) -> bool:
    return ctx.backend == "cpu"


# ---------------------------------------------------------------------------------------------
# load / store / get / put / copy / translate


@triton.jit
def rma_kernel(context, heap_bases, src, out_load, out_get, out_get2, out_pull, out_translate, in_store, in_put,
               in_push, n, other, rank: tl.constexpr, world_size: tl.constexpr, BLOCK: tl.constexpr,
               FREE: tl.constexpr, LCM: tl.constexpr, SCM: tl.constexpr, VOLATILE: tl.constexpr, HINT: tl.constexpr):
    ctx = DeviceContext.initialize(context, rank, world_size)
    tl.static_assert(ctx.rank == rank)
    tl.static_assert(ctx.world_size == world_size)
    offs = tl.arange(0, BLOCK)
    mask = (offs < n) & (offs % 5 != 1)
    mine = rank * BLOCK + offs
    for peer in range(world_size):
        theirs = peer * BLOCK + offs
        if FREE:
            x = device.load(src + offs, rank, peer, heap_bases, mask=mask, other=other, cache_modifier=LCM,
                            volatile=VOLATILE, hint=HINT)
            device.store(in_store + mine, tl.load(src + offs), rank, peer, heap_bases, mask=mask,
                         cache_modifier=SCM, hint=HINT)
            device.get(src + offs, out_get + theirs, peer, rank, heap_bases, mask=mask, other=other,
                       load_cache_modifier=LCM, store_cache_modifier=SCM, hint=HINT)
            # AMD Iris's tests' order (the current rank first): the same get, from the same peer.
            device.get(src + offs, out_get2 + theirs, rank, peer, heap_bases, mask=mask, other=other,
                       load_cache_modifier=LCM, store_cache_modifier=SCM, hint=HINT)
            device.put(src + offs, in_put + mine, rank, peer, heap_bases, mask=mask, other=other,
                       load_cache_modifier=LCM, store_cache_modifier=SCM, hint=HINT)
            device.copy(src + offs, out_pull + theirs, peer, rank, rank, heap_bases, mask=mask, other=other,
                        load_cache_modifier=LCM, store_cache_modifier=SCM, hint=HINT)
            device.copy(src + offs, in_push + mine, rank, peer, rank, heap_bases, mask=mask, other=other,
                        load_cache_modifier=LCM, store_cache_modifier=SCM, hint=HINT)
        else:
            x = ctx.load(src + offs, peer, mask=mask, other=other, cache_modifier=LCM, volatile=VOLATILE, hint=HINT)
            ctx.store(in_store + mine, tl.load(src + offs), peer, mask=mask, cache_modifier=SCM, hint=HINT)
            ctx.get(src + offs, out_get + theirs, peer, mask=mask, other=other, load_cache_modifier=LCM,
                    store_cache_modifier=SCM, hint=HINT)
            ctx.get(src + offs, out_get2 + theirs, from_rank=peer, mask=mask, other=other, load_cache_modifier=LCM,
                    store_cache_modifier=SCM, hint=HINT)
            ctx.put(src + offs, in_put + mine, peer, mask=mask, other=other, load_cache_modifier=LCM,
                    store_cache_modifier=SCM, hint=HINT)
            ctx.copy(src + offs, out_pull + theirs, peer, rank, mask=mask, other=other, load_cache_modifier=LCM,
                     store_cache_modifier=SCM, hint=HINT)
            ctx.copy(src + offs, in_push + mine, rank, peer, mask=mask, other=other, load_cache_modifier=LCM,
                     store_cache_modifier=SCM, hint=HINT)
        # Unmasked: the masked-out lanes must hold `other`.
        tl.store(out_load + theirs, x)
        remote = device.translate(src + offs, rank, peer, heap_bases, hint=HINT)
        tl.store(out_translate + theirs, tl.load(remote, mask=mask, other=other))


def run_rma(ctx, dtype_name: str, free: bool, lcm=None, scm=None, volatile=False, hint=None) -> None:
    dtype = DTYPES[dtype_name]
    world, rank = ctx.world_size, ctx.rank
    src = ctx.zeros(BLOCK, dtype=dtype)
    src.copy_(pattern(rank, dtype).to(ctx.device))
    names = ("load", "get", "get2", "pull", "translate", "store", "put", "push")
    bufs = {name: ctx.full((world, BLOCK), POISON, dtype=dtype) for name in names}
    ctx.barrier()  # every rank's src is written, every output poisoned
    other = float(OTHER) if dtype.is_floating_point else OTHER
    rma_kernel[(1,)](ctx.get_device_context(), ctx.get_heap_bases(), src, bufs["load"], bufs["get"], bufs["get2"],
                     bufs["pull"], bufs["translate"], bufs["store"], bufs["put"], bufs["push"], N_ACTIVE, other, rank,
                     world, BLOCK, free, lcm, scm, volatile, hint)
    ctx.barrier()  # every rank's writes into my inboxes are done
    mask = lane_mask()
    label = f"{dtype_name} {'free' if free else 'bound'} lcm={lcm} scm={scm} volatile={volatile} hint={hint}"
    for peer in range(world):
        data = pattern(peer, dtype)
        check_equal(f"load from {peer} ({label})", bufs["load"][peer], torch.where(mask, data, OTHER))
        check_equal(f"translate to {peer} ({label})", bufs["translate"][peer], torch.where(mask, data, OTHER))
        for name in ("get", "get2", "pull"):
            check_equal(f"{name} from {peer} ({label})", bufs[name][peer], torch.where(mask, data, POISON))
        # Written into my heap by rank `peer`, from its src.
        for name in ("store", "put", "push"):
            check_equal(f"{name} by {peer} ({label})", bufs[name][peer], torch.where(mask, data, POISON))
    ctx.barrier()
    for t in (src, *bufs.values()):
        ctx.free(t)


def scenario_rma_every_dtype(ctx):
    """load/store/get/put/copy/translate, bound and free, every peer incl. self, 5 dtypes, masks, other;
    the free get in both rank orders (the spec's and AMD Iris's tests')."""
    for name in DTYPES:
        for free in (False, True):
            run_rma(ctx, name, free)


def scenario_rma_options(ctx):
    """The same with cache modifiers, volatile and a hint (no effect on values, all must be accepted)."""
    run_rma(ctx, "fp32", False, lcm=".ca", scm=".cs", hint=16)
    run_rma(ctx, "fp32", True, lcm=".cg", scm=".wt", hint=16)
    run_rma(ctx, "fp32", False, lcm=".cv", scm=".wb", volatile=True)
    run_rma(ctx, "bf16", True, lcm=".cv", scm=".cg", volatile=True, hint=8)


# ---------------------------------------------------------------------------------------------
# atomics: every op x sem x scope x form, exact old values and results (no contention)

LANES = 4
REGION = len(OPS) * COMBOS * LANES
INIT = [5, -3, 12, 7]
VALS = {"add": [2, 6, -1, 3], "sub": [2, -6, 1, 3], "xchg": [9, 8, -2, 11], "and": [6, -1, 10, 2],
        "or": [3, 8, 1, -8], "xor": [6, 5, -1, 7], "min": [2, 6, 13, 7], "max": [2, 6, 13, -9], "cas": [40, 41, 42, 43]}
CMPS = [5, -2, 12, 8]  # lanes 0 and 2 match INIT
FLOAT_INIT = [5.5, -3.25, 12.0, 7.0]
FLOAT_VALS = {"add": [2.5, 6.0, -1.25, 3.0], "sub": [2.5, -6.0, 1.0, 3.0], "xchg": [9.5, 8.0, -2.0, 11.0],
              "min": [2.0, 6.0, 13.0, 7.0], "max": [2.0, 6.0, 13.0, -9.0], "cas": [40.0, 41.0, 42.0, 43.0]}
FLOAT_CMPS = [5.5, -2.0, 12.0, 8.0]


def atomic_opsets(ctx) -> dict[str, str]:
    """dtype -> atomics tested on it, on this backend."""
    sets = {"int32": ",".join(OPS), "int64": ",".join(OPS), "fp32": "add,sub,xchg,min,max,cas"}
    if is_cpu(ctx):
        sets["fp16"] = "cas"  # the interpreter refuses fp16 add and every bf16 atomic (test_device_errors)
    else:
        sets["fp16"] = sets["bf16"] = "add,sub,cas"
    return sets


def expected_final(op: str, init, val, cmp):
    if op == "add":
        return init + val
    if op == "sub":
        return init - val
    if op == "xchg":
        return val.clone()
    if op == "and":
        return init & val
    if op == "or":
        return init | val
    if op == "xor":
        return init ^ val
    if op == "min":
        return torch.minimum(init, val)
    if op == "max":
        return torch.maximum(init, val)
    return torch.where(init == cmp, val, init)


def run_atomic_matrix(ctx, dtype_name: str, opset: str) -> None:
    dtype = DTYPES[dtype_name]
    world, rank = ctx.world_size, ctx.rank
    floating = dtype.is_floating_point
    init = torch.tensor(FLOAT_INIT if floating else INIT, dtype=dtype)
    vals = torch.zeros(len(OPS), LANES, dtype=dtype)
    for i, op in enumerate(OPS):
        if op in opset.split(","):
            vals[i] = torch.tensor((FLOAT_VALS if floating else VALS)[op], dtype=dtype)
    cmps = torch.tensor(FLOAT_CMPS if floating else CMPS, dtype=dtype)
    target = ctx.zeros(world, REGION, dtype=dtype)
    target.copy_(init.repeat(world, REGION // LANES).to(ctx.device))
    olds = ctx.full((REGION,), POISON, dtype=dtype)
    vals_d, cmps_d = ctx.as_symmetric(vals), ctx.as_symmetric(cmps)
    ctx.barrier()
    atomic_matrix_kernel[(1,)](ctx.get_device_context(), ctx.get_heap_bases(), target, olds, vals_d, cmps_d,
                               rank, world, opset, LANES)
    ctx.barrier()
    target_h = target.cpu().view(world, len(OPS), COMBOS, LANES)
    olds_h = olds.cpu().view(len(OPS), COMBOS, LANES)
    active = torch.tensor([True] * (LANES - 1) + [False])
    for i, op in enumerate(OPS):
        if op not in opset.split(","):
            continue
        lanes = torch.ones(LANES, dtype=torch.bool) if op == "cas" else active
        final = torch.where(lanes, expected_final(op, init, vals[i], cmps), init)
        for combo in range(COMBOS):
            what = f"{dtype_name} atomic_{op} sem={SEMS[combo // len(SCOPES)]} scope={SCOPES[combo % len(SCOPES)]}"
            # What every rank did to my heap: slot (source, op, combo) is touched iff I am its peer.
            for source in range(world):
                touched = (source + combo) % world == rank
                check_equal(f"{what} by rank {source}: result", target_h[source, i, combo],
                            final if touched else init)
            check_equal(f"{what} on rank {(rank + combo) % world}: old values", olds_h[i, combo][lanes], init[lanes])
    ctx.barrier()
    for t in (target, olds, vals_d, cmps_d):
        ctx.free(t)


def scenario_atomics_every_sem_scope(ctx):
    """Every atomic x every (sem, scope) x dtype, spread over bound/free and every peer: old values and
    results."""
    for dtype_name, opset in atomic_opsets(ctx).items():
        run_atomic_matrix(ctx, dtype_name, opset)


# ---------------------------------------------------------------------------------------------
# contention: all ranks at once on every peer's counters, exact counts


@triton.jit
def add_contention_kernel(context, heap_bases, counters, olds, K: tl.constexpr, rank: tl.constexpr,
                          world_size: tl.constexpr, LANES: tl.constexpr):
    """K x (every peer) atomic_add(1) per program; old values to olds[pid, k, peer, lane]."""
    ctx = DeviceContext.initialize(context, rank, world_size)
    pid = tl.program_id(0)
    lanes = tl.arange(0, LANES)
    for k in range(K):
        for peer in range(world_size):
            if k % 2 == 0:
                old = ctx.atomic_add(counters + lanes, 1, peer, sem="relaxed", scope="sys")
            else:
                old = device.atomic_add(counters + lanes, 1, rank, peer, heap_bases, scope="sys")
            tl.store(olds + ((pid * K + k) * world_size + peer) * LANES + lanes, old)


@triton.jit
def mixed_contention_kernel(context, heap_bases, counters, olds, K: tl.constexpr, rank: tl.constexpr,
                            world_size: tl.constexpr):
    """int64 counters 0..7 (sub, xchg, or, and, xor, max, min, cas), one scalar op each per (k, peer).

    Writer ``u = (k * world_size + rank) * programs + pid`` is unique; olds[pid, k, peer, op].
    """
    ctx = DeviceContext.initialize(context, rank, world_size)
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for k in range(K):
        u = ((k * world_size + rank) * programs + pid).to(tl.int64)
        bit = tl.full([], 1, tl.int64) << u
        for peer in range(world_size):
            row = olds + ((pid * K + k) * world_size + peer) * 8
            tl.store(row + 0, ctx.atomic_sub(counters + 0, 1, peer, scope="sys"))
            tl.store(row + 1, device.atomic_xchg(counters + 1, u + 1, rank, peer, heap_bases, scope="sys"))
            tl.store(row + 2, ctx.atomic_or(counters + 2, bit, peer, sem="release", scope="sys"))
            tl.store(row + 3, device.atomic_and(counters + 3, ~bit, rank, peer, heap_bases, sem="acquire",
                                                scope="sys"))
            tl.store(row + 4, ctx.atomic_xor(counters + 4, bit, peer, sem="relaxed", scope="sys"))
            tl.store(row + 5, ctx.atomic_max(counters + 5, u, peer, scope="sys"))
            tl.store(row + 6, device.atomic_min(counters + 6, -u, rank, peer, heap_bases, scope="sys"))
            # Increment by compare-and-swap: retry until our guess was the value.
            guess = tl.full([], 0, tl.int64)
            seen = ctx.atomic_cas(counters + 7, guess, guess + 1, peer, sem="acq_rel", scope="sys")
            while seen != guess:
                guess = seen
                seen = ctx.atomic_cas(counters + 7, guess, guess + 1, peer, sem="acq_rel", scope="sys")
            tl.store(row + 7, seen)


def gather_olds(ctx, olds: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's ``olds`` (floats as float64: numpy has no bfloat16; integers kept exact)."""
    host = olds.cpu()
    if host.is_floating_point():
        host = host.double()
    return [torch.from_numpy(a) for a in ctx.comm.allgather(host.numpy())]


def run_add_contention(ctx, dtype_name: str, k: int, programs: int = 2) -> None:
    dtype = DTYPES[dtype_name]
    world, rank = ctx.world_size, ctx.rank
    counters = ctx.zeros(LANES, dtype=dtype)
    olds = ctx.full((programs, k, world, LANES), POISON, dtype=dtype)
    ctx.barrier()
    add_contention_kernel[(programs,)](ctx.get_device_context(), ctx.get_heap_bases(), counters, olds, k, rank,
                                       world, LANES)
    ctx.barrier()
    total = programs * k * world
    check_equal(f"{dtype_name} atomic_add(1) x {total} from all ranks: count", counters, torch.full((LANES,), total))
    everyone = gather_olds(ctx, olds)
    mine = torch.cat([o[:, :, rank].reshape(-1, LANES) for o in everyone]).to(torch.float64)
    # Every old value 0 .. total-1 seen exactly once per counter: atomic, and the right olds.
    check_equal(f"{dtype_name} atomic_add old values", mine.sort(dim=0).values,
                torch.arange(total, dtype=torch.float64)[:, None].expand(total, LANES))
    ctx.barrier()
    ctx.free(counters)
    ctx.free(olds)


def popcount(x: torch.Tensor) -> torch.Tensor:
    return torch.tensor([bin(int(v) & ((1 << 64) - 1)).count("1") for v in x.flatten()])


def scenario_atomics_contention(ctx):
    """All ranks hit every peer's counters at once: exact totals, and old values that prove atomicity."""
    k_add = 8 if is_cpu(ctx) else 32  # bf16 counts stay exact: 2 programs x 32 x 4 ranks = 256
    for name in ("int32", "int64", "fp32") + (() if is_cpu(ctx) else ("fp16", "bf16")):
        run_add_contention(ctx, name, k_add)

    world, rank, programs = ctx.world_size, ctx.rank, 2
    k = 7  # world * programs * k <= 56 distinct bits of an int64
    total = world * programs * k
    all_bits = (1 << total) - 1
    counters = ctx.zeros(8, dtype=torch.int64)
    counters.copy_(torch.tensor([total, 0, 0, all_bits, 0, -1, 1, 0], dtype=torch.int64).to(ctx.device))
    olds = ctx.full((programs, k, world, 8), POISON, dtype=torch.int64)
    ctx.barrier()
    mixed_contention_kernel[(programs,)](ctx.get_device_context(), ctx.get_heap_bases(), counters, olds, k, rank,
                                         world)
    ctx.barrier()
    final = counters.cpu()
    want = torch.tensor([0, -1, all_bits, 0, all_bits, total - 1, -(total - 1), total])
    finals_ok = [i for i in range(8) if i != 1 and final[i] != want[i]]
    assert not finals_ok, f"final counters {final.tolist()} want {want.tolist()} (index 1 checked below)"
    mine = torch.cat([o[:, :, rank].reshape(-1, 8) for o in gather_olds(ctx, olds)])
    assert mine.shape[0] == total
    seq = torch.arange(total)
    check_equal("atomic_sub old values", mine[:, 0].sort().values, seq + 1)
    # xchg: the old values and the final value are the initial 0 and every written token once.
    check_equal("atomic_xchg old values + final", torch.cat([mine[:, 1], final[1:2]]).sort().values,
                torch.arange(total + 1))
    check_equal("atomic_or old values: one new bit each", popcount(mine[:, 2]).sort().values, seq)
    check_equal("atomic_and old values: one bit cleared each", popcount(mine[:, 3]).sort().values, seq + 1)
    check_equal("atomic_xor old values: one bit toggled each", popcount(mine[:, 4]).sort().values, seq)
    assert bool(((mine[:, 5] >= -1) & (mine[:, 5] < total)).all()), f"atomic_max olds {mine[:, 5].tolist()}"
    assert bool(((mine[:, 6] <= 1) & (mine[:, 6] > -total)).all()), f"atomic_min olds {mine[:, 6].tolist()}"
    assert int((mine[:, 5] == -1).sum()) >= 1 and int((mine[:, 6] == 1).sum()) >= 1
    check_equal("atomic_cas increments: successful guesses", mine[:, 7].sort().values, seq)
    ctx.barrier()
    ctx.free(counters)
    ctx.free(olds)


# ---------------------------------------------------------------------------------------------
# message passing: the spec's producer/consumer pattern, many rounds, flags never reset


@triton.jit
def wait_at_least(ctx, flag, target, WAIT: tl.constexpr):
    """Spin on this rank's ``flag`` until it reaches ``target``, then acquire."""
    if WAIT == "cas":
        # A CAS that never swaps (flags are >= 0) reads the flag with acquire semantics.
        seen = ctx.atomic_cas(flag, -1, -1, ctx.rank, sem="acquire", scope="sys")
        while seen < target:
            seen = ctx.atomic_cas(flag, -1, -1, ctx.rank, sem="acquire", scope="sys")
    else:
        seen = ctx.load(flag, ctx.rank, volatile=True)
        while seen < target:
            seen = ctx.load(flag, ctx.rank, cache_modifier=".cv")
        # A relaxed poll orders nothing: acquire once it has seen the value.
        seen = ctx.atomic_cas(flag, -1, -1, ctx.rank, sem="acquire", scope="sys")
    return seen


@triton.jit
def ring_kernel(context, heap_bases, inbox, stage, flags, acks, errors, start, rounds, rank: tl.constexpr,
                world_size: tl.constexpr, BLOCK: tl.constexpr, PUBLISH: tl.constexpr, WAIT: tl.constexpr,
                DATA: tl.constexpr):
    """Ring: each rank produces into the next rank's inbox and consumes from the previous rank.

    Per program ``pid`` (its own inbox, flag and ack: the spec's ``flag + pid``): wait until the
    next rank acked round k-1, write the block, publish ``flag = k`` with release/sys, wait for
    my own flag to reach k (acquire), check the block, ack the previous rank. Sequence numbers
    carry across launches; nothing is ever reset.
    """
    ctx = DeviceContext.initialize(context, rank, world_size)
    nxt: tl.constexpr = (rank + 1) % world_size
    prv: tl.constexpr = (rank + world_size - 1) % world_size
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    box = inbox + pid * BLOCK + offs
    flag = flags + pid
    ack = acks + pid
    bad = tl.full([], 0, tl.int32)
    for i in range(rounds):
        k = start + i + 1
        wait_at_least(ctx, ack, k - 1, WAIT)
        data = (rank * 100000 + pid * 1000 + k + offs).to(tl.float32)
        if DATA == "store":
            ctx.store(box, data, nxt)
        elif DATA == "put":
            tl.store(stage + pid * BLOCK + offs, data)
            ctx.put(stage + pid * BLOCK + offs, box, nxt)
        else:
            device.store(box, data, rank, nxt, heap_bases)
        if PUBLISH == "cas":
            old = ctx.atomic_cas(flag, k - 1, k, nxt, sem="release", scope="sys")
        else:
            old = device.atomic_xchg(flag, k, rank, nxt, heap_bases, sem="release", scope="sys")
        bad += (old != k - 1).to(tl.int32) * 1000
        wait_at_least(ctx, flag, k, WAIT)
        got = ctx.load(box, rank)
        want = (prv * 100000 + pid * 1000 + k + offs).to(tl.float32)
        bad += tl.sum((got != want).to(tl.int32), axis=0)
        ctx.atomic_xchg(ack, k, prv, sem="release", scope="sys")
    tl.store(errors + pid, bad)


def scenario_message_passing(ctx):
    """Producer/consumer flags over 50 + 2 x 20 rounds (10 + 2 x 5 on the cpu backend) with
    sequence numbers, never reset, 2 programs.

    The interpreter orders every access, so on the cpu backend what the rounds show is the
    protocol (numbers carried across launches, acks, data per round), which a few rounds per
    launch show as well as many; each interpreted round waits on every neighbour."""
    programs = 2
    rounds_per_launch = (10, 5, 5) if is_cpu(ctx) else (50, 20, 20)
    inbox = ctx.zeros(programs * BLOCK, dtype=torch.float32)
    stage = ctx.zeros(programs * BLOCK, dtype=torch.float32)
    flags = ctx.zeros(programs, dtype=torch.int32)
    acks = ctx.zeros(programs, dtype=torch.int32)
    errors = ctx.full((programs,), -1, dtype=torch.int32)
    ctx.barrier()
    start = 0
    for (publish, wait, data), rounds in zip((("cas", "cas", "store"), ("xchg", "load", "put"),
                                              ("cas", "load", "free_store")), rounds_per_launch):
        ring_kernel[(programs,)](ctx.get_device_context(), ctx.get_heap_bases(), inbox, stage, flags, acks, errors,
                                 start, rounds, ctx.rank, ctx.world_size, BLOCK, publish, wait, data)
        ctx.barrier()
        label = f"ring publish={publish} wait={wait} data={data} rounds {start + 1}..{start + rounds}"
        check_equal(f"{label}: wrong blocks (x1) or flags (x1000)", errors, torch.zeros(programs, dtype=torch.int32))
        start += rounds
        check_equal(f"{label}: flags", flags, torch.full((programs,), start, dtype=torch.int32))
        check_equal(f"{label}: acks", acks, torch.full((programs,), start, dtype=torch.int32))
        errors.fill_(-1)
        ctx.barrier()
    for t in (inbox, stage, flags, acks, errors):
        ctx.free(t)


# ---------------------------------------------------------------------------------------------
# IRIS_DEBUG=1: bad ranks and addresses fail with rank, peer and offset


@triton.jit
def debug_kernel(context, x, shift, peer, rank: tl.constexpr, world_size: tl.constexpr, OP: tl.constexpr):
    ctx = DeviceContext.initialize(context, rank, world_size)
    offs = tl.arange(0, 16)
    if OP == "load":
        tl.store(x + offs, ctx.load(x + shift + offs, peer))
    else:
        ctx.atomic_add(x + shift + offs, 1.0, peer)


DEBUG_BAD_PEER = 77


def expect_debug_failure(ctx, launch, fragments) -> None:
    """On cpu: the launch raises IrisUsageError naming ``fragments``. On cuda the device assert ends
    the process (the test checks its output), so a return here is a failure."""
    try:
        launch()
        if not is_cpu(ctx):
            torch.cuda.synchronize()
    except Exception as exc:
        if not is_cpu(ctx):
            raise
        root = root_cause(exc)
        assert isinstance(root, device.IrisUsageError), repr(root)
        for fragment in fragments:
            assert fragment in str(root), (fragment, str(root))
        print(f"rank {ctx.rank}: expected failure: {root}", flush=True)
        return
    raise AssertionError(f"rank {ctx.rank}: no debug failure for {fragments}")


def scenario_debug_bad_peer(ctx):
    """IRIS_DEBUG=1: a peer outside [0, world_size) stops the kernel, naming rank and peer."""
    assert device.DEBUG.value, "run with IRIS_DEBUG=1"
    x = ctx.zeros(64, dtype=torch.float32)
    ctx.barrier()
    expect_debug_failure(ctx, lambda: debug_kernel[(1,)](ctx.get_device_context(), x, 0, DEBUG_BAD_PEER, ctx.rank,
                                                         ctx.world_size, "load"),
                         [f"iris.device.load: rank {ctx.rank}, peer {DEBUG_BAD_PEER}",
                          f"outside [0, {ctx.world_size})"])


def scenario_debug_bad_address(ctx):
    """IRIS_DEBUG=1: an address outside the heap stops the kernel, naming rank, peer and offset."""
    assert device.DEBUG.value, "run with IRIS_DEBUG=1"
    x = ctx.zeros(64, dtype=torch.float32)
    peer = (ctx.rank + 1) % ctx.world_size
    shift = 1 << 40  # elements: far past the heap and its signal pad
    offset = ctx.offset_of(x) + shift * 4
    print(f"rank {ctx.rank}: expecting a failure at heap offset {offset}", flush=True)
    ctx.barrier()
    expect_debug_failure(ctx, lambda: debug_kernel[(1,)](ctx.get_device_context(), x, shift, peer, ctx.rank,
                                                         ctx.world_size, "atomic_add"),
                         [f"iris.device.atomic_add: rank {ctx.rank}, peer {peer}",
                          f"first at heap offset {offset} "])


def scenario_debug_clean(ctx):
    """IRIS_DEBUG=1: correct programs pass the checks (no false alarms)."""
    assert device.DEBUG.value, "run with IRIS_DEBUG=1"
    run_rma(ctx, "fp32", False)
    run_rma(ctx, "int64", True)
    run_atomic_matrix(ctx, "int32", "add,cas")
    run_add_contention(ctx, "int32", 4)


if __name__ == "__main__":
    iris.runtime.testing.run_scenarios(globals())
