"""Compile every collective's test kernel for an H200 (sm_90) without a GPU; report what the PTX shows.

Run with ``TRITON_INTERPRET`` unset and ``IRIS_BACKEND=cuda`` (``test_collectives_compile.py`` does
it). Prints one JSON object as its last line: per case, whether it compiled, the error if not, and
counts of instructions the tests judge (vector loads and stores, system-scope release and acquire
atomics, traps, device prints).
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
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
PTR = {"fp32": "*fp32", "fp16": "*fp16", "bf16": "*bf16", "int32": "*i32"}


def compile_ptx(fn, signature: dict, constexprs: dict, aligned=()) -> str:
    sig = dict(signature)
    sig.update({k: "constexpr" for k in constexprs})
    names = list(sig)
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    options = {"debug": bool(triton.knobs.runtime.debug)}
    return triton.compile(src, target=TARGET, options=options).asm["ptx"]


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
    one = one_thread_predicates(ptx)
    return sum(1 for p in re.findall(rf"@(%p\d+) {op}\.global", ptx) if p in one)


def summary(ptx: str) -> dict:
    # ``red`` is an atomic whose old value is unused; Triton 3.9 emits it where 3.6 emits ``atom``
    # (same qualifiers, same ordering), so both count as atomics everywhere below.
    atoms = re.findall(r"\b(atom|red)\.([\w.]+)", ptx)
    return {
        "ld_v4": len(re.findall(r"ld\.global(\.\w+)*\.v4\.", ptx)),
        "st_v4": len(re.findall(r"st\.global(\.\w+)*\.v4\.", ptx)),
        "release_sys": sum(1 for _, q in atoms if "sys" in q and "release" in q),
        "acquire_sys_loads": len(re.findall(r"ld\.global\.sys\.acquire|ld\.acquire\.sys", ptx)),
        "atomics": sorted({f"{a}.{q}" for a, q in atoms}),
        "traps": ptx.count("trap;"),
        "prints": ptx.count("vprintf"),
        "bar_sync": ptx.count("bar.sync"),
        "single_thread_stores": single_thread_ops(ptx, "st"),
        "single_thread_atomics": single_thread_ops(ptx, "(?:atom|red)"),
        "acquire_polls_all_threads": len(re.findall(r"^\s*ld\.acquire\.sys\.global\.b32", ptx, re.M)),
        "volatile_loads": ptx.count("ld.volatile"),
        "release_fences_sys": ptx.count("fence.acq_rel.sys"),
        "relaxed_sys_atomics": len(re.findall(r"(?:atom|red)\.global\.sys\.relaxed\.add\.u32", ptx)),
    }


def all_reduce_case(variant: int, dtype: str, bound: bool, trace: bool, world: int, rank: int) -> str:
    dst = PTR["fp32"] if variant in (K.ATOMIC, K.SPINLOCK) and dtype in ("fp16", "bf16") else PTR[dtype]
    sig = {"context": "*i64", "inp": PTR[dtype], "src": PTR[dtype], "dst": dst, "locks": "*i32", "M": "i32",
           "N": "i32", "stride_in": "i32", "stride_src": "i32", "stride_dst": "i32"}
    const = {"rank": rank, "world_size": world, "VARIANT": variant, "BOUND": bound, "STAGE": True, "TRACE": trace,
             "BLOCK_M": 32, "BLOCK_N": 64}
    return compile_ptx(K.all_reduce_kernel, sig, const,
                       aligned=("inp", "src", "dst", "locks", "N", "stride_in", "stride_src", "stride_dst"))


def gather_family_case(kind: str, dtype: str, world: int, rank: int) -> str:
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


def run_case(case: str) -> dict:
    parts = case.split("/")
    try:
        if parts[0] in K.VARIANT_NAMES.values():
            variant = next(v for v, n in K.VARIANT_NAMES.items() if n == parts[0])
            ptx = all_reduce_case(variant, parts[1], parts[2] == "bound", parts[3] == "trace", int(parts[4]),
                                  int(parts[5]))
        else:
            ptx = gather_family_case(parts[0], parts[1], int(parts[2]), int(parts[3]))
        return {"ok": True, **summary(ptx)}
    except Exception as exc:  # reported to the test, which shows it
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-3000:]}


def cases(debug: bool) -> list[str]:
    out = []
    for name in K.VARIANT_NAMES.values():
        for dtype in ("fp32", "bf16") if not debug else ("fp32",):
            out.append(f"{name}/{dtype}/bound/plain/4/1")
        if not debug:
            out.append(f"{name}/fp16/free/trace/3/2")
            out.append(f"{name}/int32/free/plain/2/0")
    for kind in ("all_gather", "gather", "all_to_all"):
        out.append(f"{kind}/fp32/4/1")
        if not debug:
            out.append(f"{kind}/bf16/3/0")
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    args = parser.parse_args()
    debug = bool(triton.knobs.runtime.debug)
    todo = cases(debug)
    with ProcessPoolExecutor(args.jobs) as pool:
        results = dict(zip(todo, pool.map(run_case, todo)))
    print(json.dumps({"debug": debug, "results": results}))


if __name__ == "__main__":
    main()
