"""Compile every collective's test kernel for an H200 (sm_90) without a GPU; report what the PTX shows.

Run with ``TRITON_INTERPRET`` unset and ``IRIS_BACKEND=cuda`` (``test_collectives_compile.py`` does
it). Prints one JSON object as its last line: per case, whether it compiled, the error if not, and
counts of instructions the tests judge (vector loads and stores, system-scope release and acquire
atomics, traps, device prints).

With ``--order``: instead, purpose-built kernels with one flag operation (signal, wait, barrier,
lock, ...) or one collective call each, and the exact ordered memory-model instructions of each
(CTA barriers, fences, atomics, acquire loads; see :func:`memory_order`), plus what Triton emits
for a bare release atomic (its own barriers differ between versions).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import traceback
from concurrent.futures import ProcessPoolExecutor

assert not os.environ.get("TRITON_INTERPRET"), "run with TRITON_INTERPRET unset"
os.environ.setdefault("IRIS_BACKEND", "cuda")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers"))

import collective_kernels as K  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import iris.collectives as ic  # noqa: E402
from iris.collectives import _all_reduce as AR  # noqa: E402
from iris.collectives import _sync as S  # noqa: E402
from iris.device._watchdog import WATCHDOG_PTX_TAG  # noqa: E402
from iris.device.testing import compile_ptx, memory_order  # noqa: E402

PTR = {"fp32": "*fp32", "fp16": "*fp16", "bf16": "*bf16", "int32": "*i32", "fp8": "*fp8e4nv"}


def one_thread_predicates(ptx: str) -> set:
    """Predicates true in thread 0 of the program (or of a warp) only: Triton guards a scalar store
    or atomic with ``setp.eq %p, (%tid.x & mask), 0`` or ``setp.eq %p, (%tid.x & 31) | (%tid.x >> 5), 0``,
    possibly and-ed with other predicates."""
    tids = set(re.findall(r"mov\.u32\s+(%r\d+), %tid\.x;", ptx))
    masked = {dst for dst, src in re.findall(r"and\.b32\s+(%r\d+), (%r\d+), \d+;", ptx) if src in tids}
    # Triton 3.9 tests lane | warp == 0: (tid & 31) | (tid >> 5), zero in thread 0 alone
    shifted = {dst for dst, src in re.findall(r"shr\.u32\s+(%r\d+), (%r\d+), \d+;", ptx) if src in tids}
    lane_or_warp = {dst for dst, a, b in re.findall(r"or\.b32\s+(%r\d+), (%r\d+), (%r\d+);", ptx)
                    if {a, b} & masked and {a, b} & shifted}
    zero_in_one = masked | tids | lane_or_warp
    one = {p for p, r in re.findall(r"setp\.eq\.[bsu]32\s+(%p\d+), (%r\d+), 0;", ptx) if r in zero_in_one}
    conjunctions = re.findall(r"and\.pred\s+(%p\d+), (%p\d+), (%p\d+);", ptx)
    grown = True
    while grown:  # a conjunction with a one-thread predicate holds in that thread at most
        new = {p for p, a, b in conjunctions if p not in one and (a in one or b in one)}
        one |= new
        grown = bool(new)
    return one


def single_thread_ops(ptx: str, op: str) -> int:
    """Global ``op`` instructions (``st``, or ``atom|red`` for atomics) that run in thread 0 only. A scalar
    ``tl.store`` compiles to one of these while the matching scalar ``tl.load`` runs in every
    thread: a load-then-store counter update races between warps (a warp that loads after the
    store sees the new value)."""
    total = 0
    for body in function_bodies(ptx):  # register names are per function
        one = one_thread_predicates(body)
        total += sum(1 for p in re.findall(rf"@(%p\d+) {op}\.global", body) if p in one)
    return total


def function_bodies(ptx: str) -> list[str]:
    """The PTX of each function defined in ``ptx`` (the kernel and its out-of-line callees), each
    from its header to the next header; prototypes (``.func ... ;``) go with the text before."""
    starts = [m.start() for m in re.finditer(r"^(?:\.visible\s+)?\.(?:entry|func)\b[^;]*?\{", ptx, re.M | re.S)]
    return [ptx[a:b] for a, b in zip(starts, starts[1:] + [len(ptx)])] or [ptx]


#: An inline-PTX block of the watchdog's check (tagged with iris.device._watchdog.WATCHDOG_PTX_TAG).
WATCHDOG_BLOCK = re.compile(r"^\s*// begin inline asm\n\s*" + re.escape(WATCHDOG_PTX_TAG) + r"\n.*?// end inline asm\n",
                            re.M | re.S)


def calls_to_functions(ptx: str) -> int:
    """Calls of out-of-line functions in ``ptx``, not counting the device print's ``vprintf`` and
    the device assert's ``__assertfail`` (the ring's capacity check has both)."""
    callees = re.findall(r"^\s*call(?:\.uni)?\s[^;]*?([\w$]+),\s*\(", ptx, re.M)
    return sum(1 for name in callees if name not in ("vprintf", "__assertfail"))


def without_watchdog(ptx: str) -> tuple[str, int]:
    """``ptx`` without the inline-PTX blocks of the watchdog's check (``iris.device._watchdog``: the
    clock, the drain word, the report's claim, stores and fence, the drain atomics: the slow path of
    a wait, reached every CHECK_POLLS polls), and how many blocks there were. The tests below are
    about the protocol the collectives run every call."""
    blocks = WATCHDOG_BLOCK.findall(ptx)
    return WATCHDOG_BLOCK.sub("", ptx), len(blocks)


def summary(ptx: str) -> dict:
    # No barrier count: in these kernels Triton's own barriers (layout conversions, shared-memory
    # hand-overs) mix with the protocol's, differently per Triton version; --order checks every
    # barrier exactly on kernels with one operation each.
    # ``red`` is an atomic whose old value is unused; Triton 3.9 emits it where 3.6 emits ``atom``
    # (same qualifiers, same ordering), so both count as atomics everywhere below.
    calls = calls_to_functions(ptx)
    ptx, watchdog_blocks = without_watchdog(ptx)
    atoms = re.findall(r"(?<![\w.])(atom|red)\.([\w.]+)", ptx)  # not bar.red (a vote)
    return {
        "watchdog_blocks": watchdog_blocks,
        "calls": calls,
        "globaltimer_reads": ptx.count("%globaltimer"),
        "ld_v4": len(re.findall(r"ld\.global(\.\w+)*\.v4\.", ptx)),
        "st_v4": len(re.findall(r"st\.global(\.\w+)*\.v4\.", ptx)),
        "release_sys": sum(1 for _, q in atoms if "sys" in q and "release" in q),
        "acquire_sys_loads": len(re.findall(r"ld\.global\.sys\.acquire|ld\.acquire\.sys", ptx)),
        "atomics": sorted({f"{a}.{q}" for a, q in atoms}),
        "traps": ptx.count("trap;"),
        "prints": ptx.count("vprintf"),
        "single_thread_stores": single_thread_ops(ptx, "st"),
        "single_thread_atomics": single_thread_ops(ptx, "(?:atom|red)"),
        "acquire_polls_all_threads": len(re.findall(r"^\s*ld\.acquire\.sys\.global\.b32", ptx, re.M)),
        "volatile_loads": ptx.count("ld.volatile"),
        "release_fences_sys": ptx.count("fence.acq_rel.sys"),
        "relaxed_sys_atomics": len(re.findall(r"(?:atom|red)\.global\.sys\.relaxed\.add\.u32", ptx)),
    }


def all_reduce_case(variant: int, dtype: str, bound: bool, trace: bool, world: int, rank: int,
                    group: bool = False) -> str:
    dst = PTR["fp32"] if variant in (K.ATOMIC, K.SPINLOCK) and dtype in ("fp16", "bf16") else PTR[dtype]
    if group:  # on a group of world - 1 ranks, whose rank 0 this rank is (group=)
        sig = {"context": "*i64", "group_context": "*i64", "inp": PTR[dtype], "src": PTR[dtype], "dst": dst,
               "locks": "*i32", "M": "i32", "N": "i32", "stride": "i32"}
        const = {"rank": rank, "world_size": world, "group_rank": 0, "group_size": world - 1, "VARIANT": variant,
                 "BOUND": False, "BLOCK_M": 32, "BLOCK_N": 64}
        return compile_ptx(K.group_all_reduce_kernel, sig, const,
                           aligned=("inp", "src", "dst", "locks", "N", "stride"))
    sig = {"context": "*i64", "inp": PTR[dtype], "src": PTR[dtype], "dst": dst, "locks": "*i32", "M": "i32",
           "N": "i32", "stride_in": "i32", "stride_src": "i32", "stride_dst": "i32"}
    const = {"rank": rank, "world_size": world, "VARIANT": variant, "BOUND": bound, "STAGE": True, "TRACE": trace,
             "BLOCK_M": 32, "BLOCK_N": 64}
    return compile_ptx(K.all_reduce_kernel, sig, const,
                       aligned=("inp", "src", "dst", "locks", "N", "stride_in", "stride_src", "stride_dst"))


def gather_family_case(kind: str, dtype: str, world: int, rank: int, group: bool = False) -> str:
    if group:  # on a group of 2 of the world's ranks, whose rank 1 this rank is (group=)
        op = {"all_gather": K.ALL_GATHER, "gather": K.GATHER, "all_to_all": K.ALL_TO_ALL}[kind]
        sig = {"context": "*i64", "group_context": "*i64", "src": PTR[dtype], "dst": PTR[dtype], "flags": "*i32",
               "M": "i32", "M_dst": "i32", "N": "i32", "stride_src": "i32", "stride_dst": "i32", "source": "i32"}
        const = {"rank": rank, "world_size": world, "group_rank": 1, "group_size": 2, "OP": op, "N_PER_RANK": 64,
                 "BOUND": True, "BLOCK_M": 32, "BLOCK_N": 64}
        aligned = ("src", "dst", "M", "M_dst", "N", "stride_src", "stride_dst")
        return compile_ptx(K.group_move_kernel, sig, const, aligned=aligned)
    if kind == "all_gather":
        sig = {"context": "*i64", "inp": PTR[dtype], "dst": PTR[dtype], "flags": "*i32", "out": PTR[dtype],
               "M_local": "i32", "N_local": "i32", "M": "i32", "N": "i32", "stride_in": "i32", "stride_dst": "i32",
               "stride_out": "i32"}
        const = {"rank": rank, "world_size": world, "DIM": 0, "BOUND": True, "BARRIER": True, "BLOCK_M": 32,
                 "BLOCK_N": 64}
        aligned = ("inp", "dst", "out", "M_local", "N_local", "M", "N", "stride_in", "stride_dst", "stride_out")
        return compile_ptx(K.all_gather_kernel, sig, const, aligned=aligned)
    if kind == "gather":
        sig = {"context": "*i64", "src": PTR[dtype], "out": PTR[dtype], "M": "i32", "N": "i32", "stride_src": "i32",
               "stride_out": "i32"}
        const = {"rank": rank, "world_size": world, "SOURCE": (rank + 1) % world, "BOUND": False, "HINT_N": 16,
                 "BLOCK_M": 32, "BLOCK_N": 64}
        return compile_ptx(K.gather_kernel, sig, const, aligned=("src", "out", "N", "stride_src", "stride_out"))
    sig = {"context": "*i64", "src": PTR[dtype], "dst": PTR[dtype], "M": "i32", "stride_src": "i32",
           "stride_dst": "i32"}
    const = {"rank": rank, "world_size": world, "N_PER_RANK": 64, "BOUND": True, "BLOCK_M": 32, "BLOCK_N": 64}
    return compile_ptx(K.all_to_all_kernel, sig, const, aligned=("src", "dst", "M", "stride_src", "stride_dst"))


def rmsnorm_case(dtype: str, protocol: str, form: str, world: int, rank: int) -> str:
    """The tile collective ``all_reduce_rmsnorm`` (``protocol`` "one" or "two"-shot, per tile or per
    range): bf16 data, its output in ``dtype`` (fp8: with row scales), whole rows of 1024."""
    sig = {"context": "*i64", "src": "*bf16", "residual": "*bf16", "weight": "*fp32", "dst": PTR[dtype],
           "res_out": "*bf16", "scale": "*fp32", "locks": "*i32", "M": "i32", "N": "i32", "eps": "fp32"}
    const = {"rank": rank, "world_size": world, "TWO_SHOT": protocol == "two", "RANGE": form == "range",
             "BOUND": form == "range", "ROW_SCALES": dtype == "fp8", "BLOCK_M": 4, "BLOCK_N": 1024}
    return compile_ptx(K.all_reduce_rmsnorm_kernel, sig, const,
                       aligned=("src", "residual", "weight", "dst", "res_out", "locks", "N"))


def run_case(case: str) -> dict:
    parts = case.split("/")
    try:
        if parts[0] == "all_reduce_rmsnorm":
            ptx = rmsnorm_case(parts[1], parts[2], parts[3], int(parts[4]), int(parts[5]))
        elif parts[0] in K.VARIANT_NAMES.values():
            variant = next(v for v, n in K.VARIANT_NAMES.items() if n == parts[0])
            ptx = all_reduce_case(variant, parts[1], parts[2] == "bound", parts[3] == "trace", int(parts[4]),
                                  int(parts[5]), group=parts[2] == "group")
        else:
            ptx = gather_family_case(parts[0], parts[1], int(parts[2]), int(parts[3]), group=parts[4:] == ["group"])
        return {"ok": True, **summary(ptx)}
    except Exception as exc:  # reported to the test, which shows it
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-3000:]}


def cases(debug: bool) -> list[str]:
    out = []
    for name in K.VARIANT_NAMES.values():
        for dtype in ("fp32", "bf16") if not debug else ("fp32",):
            out.append(f"{name}/{dtype}/bound/plain/4/1")
        out.append(f"{name}/fp32/group/plain/4/1")  # group= (a DeviceGroup of 3 of the 4 ranks)
        if not debug:
            out.append(f"{name}/fp16/free/trace/3/2")
            out.append(f"{name}/int32/free/plain/2/0")
    for kind in ("all_gather", "gather", "all_to_all"):
        out.append(f"{kind}/fp32/4/1")
        out.append(f"{kind}/fp32/4/2/group")
        if not debug:
            out.append(f"{kind}/bf16/3/0")
    out.append("all_reduce_rmsnorm/bf16/one/tiles/4/1")
    if not debug:
        out.append("all_reduce_rmsnorm/fp8/two/range/3/2")
    return out


# ---------------------------------------------------------------------------------------------
# --order: one flag operation or one collective call per kernel, its memory-model instructions

ORDER_WORLD = 4
ORDER_RANK = 1
#: The flag operations of iris.collectives._sync (and the spinlock's lock and unlock).
ORDER_SYNC = ("signal", "signal_all", "wait_at_least", "device_barrier", "device_barrier_epoch", "next_epoch",
              "lock", "unlock")
#: The collectives, one call on one 32 x 64 tile; the ring in bf16 too (its fp32 partial sum then
#: travels as two 16-bit pieces, with a credit in between).
ORDER_COLLECTIVES = ("all_reduce_atomic/fp32", "all_reduce_spinlock/fp32", "all_reduce_one_shot/fp32",
                     "all_reduce_two_shot/fp32", "all_reduce_ring/fp32", "all_reduce_ring/bf16",
                     "reduce_scatter/fp32", "all_gather/fp32", "gather/fp32", "all_to_all/fp32")


@triton.jit
def sync_kernel(context, flags, rank: tl.constexpr, world_size: tl.constexpr, OP: tl.constexpr):
    """Exactly one flag operation, ``OP``, on ``flags`` (towards the next rank where it has a peer)."""
    ctx = ic.DeviceContext.initialize(context, rank, world_size)
    peer: tl.constexpr = (rank + 1) % world_size
    if OP == "signal":
        ic.signal(flags, ctx.rank, peer, ctx.heap_bases)
    elif OP == "signal_all":
        S.signal_all(flags, ctx.rank, ctx.world_size, ctx.heap_bases)
    elif OP == "wait_at_least":
        ic.wait_at_least(flags, 3)
    elif OP == "bounded_wait":
        ic.wait_at_least(flags, 3, heap_bases=ctx.heap_bases)
    elif OP == "device_barrier":
        ic.device_barrier(ctx, flags)
    elif OP == "device_barrier_epoch":
        ic.device_barrier(ctx, flags, 5)
    elif OP == "next_epoch":
        tl.store(flags + 8, S.next_epoch(flags + 4))
    elif OP == "lock":
        # the last argument: the call counter the watchdog reports (compiled out with IRIS_TIMEOUT_S=0)
        AR._lock(flags, ctx.rank, peer, ctx.heap_bases, 0, flags + S.EPOCH)
    else:
        tl.static_assert(OP == "unlock")
        AR._unlock(flags, ctx.rank, peer, ctx.heap_bases)


@triton.jit
def collective_kernel(context, src, dst, locks, M, N, stride, rank: tl.constexpr, world_size: tl.constexpr,
                      OP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Exactly one collective call, ``OP``, on this program's tile (no loop over tiles)."""
    ctx = ic.DeviceContext.initialize(context, rank, world_size)
    src_view = ic.TensorView(src, M, N, stride, 1)
    dst_view = ic.TensorView(dst, M, N, stride, 1)
    view = ic.TileView(tl.program_id(0), tl.program_id(1), BLOCK_M, BLOCK_N)
    tile = ic.Tile(view.pid_m, view.pid_n, BLOCK_M, BLOCK_N, src_view.load(view))
    if OP == "all_reduce_atomic":
        ic.all_reduce_atomic(ctx, tile, dst_view)
    elif OP == "all_reduce_spinlock":
        ic.all_reduce_spinlock(ctx, tile, dst_view, locks)
    elif OP == "all_reduce_one_shot":
        ic.all_reduce_one_shot(ctx, tile, src_view, dst_view, locks)
    elif OP == "all_reduce_two_shot":
        ic.all_reduce_two_shot(ctx, tile, src_view, dst_view, locks)
    elif OP == "all_reduce_ring":
        ic.all_reduce_ring(ctx, view, src_view, dst_view)
    elif OP == "reduce_scatter":
        ic.reduce_scatter(ctx, tile, src_view, dst_view, locks)
    elif OP == "all_gather":
        ic.all_gather(ctx, tile, dst_view, 0)
    elif OP == "gather":
        tl.store(dst + view.rows()[:, None] * stride + view.cols()[None, :], ic.gather(ctx, view, src_view, 0))
    else:
        tl.static_assert(OP == "all_to_all")
        ic.all_to_all(ctx, view, src_view, dst_view, BLOCK_N)


@triton.jit
def bare_release_kernel(flag):
    """A scalar release add with Triton alone, as ``signal`` makes it: what Triton adds by itself."""
    tl.atomic_add(flag, 1, sem="release", scope="sys")


def order_case(case: str) -> dict:
    name, _, dtype = case.partition("/")
    const = {"rank": ORDER_RANK, "world_size": ORDER_WORLD, "OP": name}
    try:
        if case == "bare_release":
            ptx = compile_ptx(bare_release_kernel, {"flag": "*i32"}, {})
        elif name == "bounded_wait":
            # a watchdog-bounded wait: the order of the protocol with the check's blocks taken out
            ptx = compile_ptx(sync_kernel, {"context": "*i64", "flags": "*i32"}, const)
            protocol, blocks = without_watchdog(ptx)
            return {"ok": True, "order": memory_order(protocol), "watchdog_blocks": blocks,
                    "calls": calls_to_functions(ptx),
                    "check_order": memory_order(ptx)}
        elif name in ORDER_SYNC:
            ptx = compile_ptx(sync_kernel, {"context": "*i64", "flags": "*i32"}, const)
        else:
            sig = {"context": "*i64", "src": PTR[dtype], "dst": PTR[dtype], "locks": "*i32", "M": "i32", "N": "i32",
                   "stride": "i32"}
            if name == "all_reduce_spinlock":
                sig["dst"] = PTR["fp32"]
            ptx = compile_ptx(collective_kernel, sig, {**const, "BLOCK_M": 32, "BLOCK_N": 64},
                              aligned=("src", "dst", "locks", "N", "stride"))
        return {"ok": True, "order": memory_order(ptx)}
    except Exception as exc:  # reported to the test, which shows it
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-3000:]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    parser.add_argument("--order", action="store_true", help="the exact memory-order kernels only")
    parser.add_argument("--only", default="", help="with --order: these cases only (comma-separated)")
    args = parser.parse_args()
    debug = bool(triton.knobs.runtime.debug)
    todo = ["bare_release", *ORDER_SYNC, *ORDER_COLLECTIVES] if args.order else cases(debug)
    if args.only:
        todo = args.only.split(",")
    with ProcessPoolExecutor(args.jobs) as pool:
        results = dict(zip(todo, pool.map(order_case if args.order else run_case, todo)))
    print(json.dumps({"debug": debug, "triton": triton.__version__, "results": results}))


if __name__ == "__main__":
    main()
