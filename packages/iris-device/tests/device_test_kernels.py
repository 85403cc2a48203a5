"""Kernels and tables shared by the iris-device checking scripts and the multi-rank worker.

Importing this defines kernels in the mode of the importing process (compiled or interpreted): a
worker imports ``iris.runtime`` first so that the cpu backend's interpreter is on.
"""

from __future__ import annotations

import triton
import triton.language as tl
from device_test_tables import COMBOS, OPS, SCOPES, SEMS

import iris.device as device
from iris.device import DeviceContext

N_COMBOS: tl.constexpr = tl.constexpr(COMBOS)
N_OPS: tl.constexpr = tl.constexpr(len(OPS))


@triton.constexpr_function
def sem_of(i):
    """The ``sem`` of combination ``i`` (of ``COMBOS``)."""
    return SEMS[i // len(SCOPES)]


@triton.constexpr_function
def scope_of(i):
    """The ``scope`` of combination ``i`` (of ``COMBOS``)."""
    return SCOPES[i % len(SCOPES)]


@triton.constexpr_function
def op_name(i):
    return OPS[i]


@triton.constexpr_function
def op_enabled(i, opset):
    """Whether atomic ``OPS[i]`` is in ``opset`` (comma-separated names)."""
    return OPS[i] in opset.split(",")


@triton.jit
def one_atomic(ctx, heap_bases, OP: tl.constexpr, FREE: tl.constexpr, ptr, cmp, val, mask, peer,
               SEM: tl.constexpr, SCOPE: tl.constexpr):
    """``OP`` at ``peer`` through the bound method (``FREE`` false) or the free function."""
    if FREE:
        if OP == "add":
            old = device.atomic_add(ptr, val, ctx.rank, peer, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
        elif OP == "sub":
            old = device.atomic_sub(ptr, val, ctx.rank, peer, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
        elif OP == "xchg":
            old = device.atomic_xchg(ptr, val, ctx.rank, peer, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
        elif OP == "and":
            old = device.atomic_and(ptr, val, ctx.rank, peer, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
        elif OP == "or":
            old = device.atomic_or(ptr, val, ctx.rank, peer, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
        elif OP == "xor":
            old = device.atomic_xor(ptr, val, ctx.rank, peer, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
        elif OP == "min":
            old = device.atomic_min(ptr, val, ctx.rank, peer, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
        elif OP == "max":
            old = device.atomic_max(ptr, val, ctx.rank, peer, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
        else:
            tl.static_assert(OP == "cas", "unknown atomic")
            old = device.atomic_cas(ptr, cmp, val, ctx.rank, peer, heap_bases, sem=SEM, scope=SCOPE)
    else:
        if OP == "add":
            old = ctx.atomic_add(ptr, val, peer, mask=mask, sem=SEM, scope=SCOPE)
        elif OP == "sub":
            old = ctx.atomic_sub(ptr, val, peer, mask=mask, sem=SEM, scope=SCOPE)
        elif OP == "xchg":
            old = ctx.atomic_xchg(ptr, val, peer, mask=mask, sem=SEM, scope=SCOPE)
        elif OP == "and":
            old = ctx.atomic_and(ptr, val, peer, mask=mask, sem=SEM, scope=SCOPE)
        elif OP == "or":
            old = ctx.atomic_or(ptr, val, peer, mask=mask, sem=SEM, scope=SCOPE)
        elif OP == "xor":
            old = ctx.atomic_xor(ptr, val, peer, mask=mask, sem=SEM, scope=SCOPE)
        elif OP == "min":
            old = ctx.atomic_min(ptr, val, peer, mask=mask, sem=SEM, scope=SCOPE)
        elif OP == "max":
            old = ctx.atomic_max(ptr, val, peer, mask=mask, sem=SEM, scope=SCOPE)
        else:
            tl.static_assert(OP == "cas", "unknown atomic")
            old = ctx.atomic_cas(ptr, cmp, val, peer, sem=SEM, scope=SCOPE)
    return old


@triton.constexpr_function
def matrix_peer(rank, world_size, combo):
    """The peer that (sem, scope) combination ``combo`` targets: every peer gets some."""
    return (rank + combo) % world_size


@triton.constexpr_function
def matrix_free(combo):
    """Whether ``combo`` goes through the free function (else the bound method): both forms meet
    every sem and every scope."""
    return (combo + combo // len(SCOPES)) % 2 == 1


@triton.jit
def atomic_matrix_kernel(context, heap_bases, target, olds, vals, cmps, rank: tl.constexpr,
                         world_size: tl.constexpr, OPSET: tl.constexpr, LANES: tl.constexpr):
    """Every atomic of ``OPSET`` x every (sem, scope), spread over peers and both forms.

    This rank owns region ``rank`` of each peer's ``target`` (no contention): slot
    ``[op][combo]`` of ``LANES`` elements, the last masked off (except for cas, which takes no
    mask). Combination ``combo`` goes to peer ``matrix_peer(rank, world_size, combo)`` in the form
    ``matrix_free(combo)``; old values go to the local ``olds[op][combo]``. ``vals[op]`` and
    ``cmps`` hold the operands.
    """
    ctx = DeviceContext.initialize(context, rank, world_size)
    region: tl.constexpr = N_OPS * N_COMBOS * LANES
    lanes = tl.arange(0, LANES)
    mask = lanes < LANES - 1
    cmp = tl.load(cmps + lanes)
    for o in tl.static_range(N_OPS):
        if op_enabled(o, OPSET):
            val = tl.load(vals + o * LANES + lanes)
            for c in tl.static_range(N_COMBOS):
                at = (o * N_COMBOS + c) * LANES + lanes
                old = one_atomic(ctx, heap_bases, op_name(o), matrix_free(c), target + rank * region + at, cmp, val,
                                 mask, matrix_peer(rank, world_size, c), sem_of(c), scope_of(c))
                tl.store(olds + at, old)


@triton.jit
def error_kernel(context, p_f32, p_i32, p_f16, p_bf16, p_i8, rank: tl.constexpr, world_size: tl.constexpr,
                 CASE: tl.constexpr):
    """One misuse per ``CASE``; each must fail at compile (or interpretation) time."""
    ctx = DeviceContext.initialize(context, rank, world_size)
    if CASE == "bad_sem":
        ctx.atomic_add(p_i32, 1, 0, sem="acq-rel")
    elif CASE == "bad_scope":
        ctx.atomic_xchg(p_i32, 1, 0, scope="system")
    elif CASE == "bad_cas_sem":
        ctx.atomic_cas(p_i32, 0, 1, 0, sem="seq_cst")
    elif CASE == "bad_load_modifier":
        tl.store(p_f32, ctx.load(p_f32, 0, cache_modifier=".cs"))
    elif CASE == "bad_store_modifier":
        ctx.store(p_f32, 1.0, 0, cache_modifier=".ca")
    elif CASE == "cg_volatile":
        tl.store(p_f32, ctx.load(p_f32, 0, cache_modifier=".cg", volatile=True))
    elif CASE == "ca_volatile":
        tl.store(p_f32, device.load(p_f32, 0, 0, ctx.heap_bases, cache_modifier=".ca", volatile=True))
    elif CASE == "get_bad_load_modifier":
        ctx.get(p_f32, p_f32 + 1, 0, load_cache_modifier=".wt")
    elif CASE == "put_bad_store_modifier":
        ctx.put(p_f32, p_f32 + 1, 0, store_cache_modifier=".cv")
    elif CASE == "copy_bad_load_modifier":
        ctx.copy(p_f32, p_f32 + 1, 0, 0, load_cache_modifier="cg")
    elif CASE == "free_get_bad_store_modifier":
        device.get(p_f32, p_f32 + 1, 0, 0, ctx.heap_bases, store_cache_modifier=".ca")
    elif CASE == "xor_fp32":
        ctx.atomic_xor(p_f32, 1.0, 0)
    elif CASE == "and_fp16":
        ctx.atomic_and(p_f16, 1.0, 0)
    elif CASE == "xchg_fp16":
        ctx.atomic_xchg(p_f16, 1.0, 0)
    elif CASE == "max_bf16":
        ctx.atomic_max(p_bf16, 1.0, 0)
    elif CASE == "add_int8":
        ctx.atomic_add(p_i8, 1, 0)
    else:
        tl.static_assert(CASE == "free_or_fp32", "unknown case")
        device.atomic_or(p_f32, 1.0, 0, 0, ctx.heap_bases)


def root_cause(exc: BaseException) -> BaseException:
    """The innermost exception of a chain (Triton wraps the one a constexpr function raised)."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        nxt = exc.__cause__ or exc.__context__
        if nxt is None:
            break
        exc = nxt
    return exc
