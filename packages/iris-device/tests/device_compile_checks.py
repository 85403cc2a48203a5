"""Compile iris.device kernels for an H200 (sm_90) without a GPU and report what the PTX shows.

Sets ``TRITON_INTERPRET=0`` for itself (``test_device_gpu_compile.py`` runs it). Prints one JSON
object as its last line; the tests judge it. Sections (``--only a,b`` picks some):

- ``vector``: load/store/get/put/copy/atomic_add through translated pointers (bound and free
  forms) against the same kernel on local pointers: vector width of the memory instructions;
- ``atomics``: every atomic x allowed dtype x sem x scope compiles, and which (sem, scope)
  qualifiers the ``atom`` instructions carry;
- ``exact``: one atomic per kernel (every atomic, sem, scope, bound and free form) and the exact
  ordered sequence of its memory-model instructions (CTA barriers, fences, atomics); ``triton``:
  the same for a bare ``tl.atomic_add``, which says what Triton adds on its own; ``docs``: the
  defaults the atomics' docstrings state;
- ``cache``: every cache modifier compiles, and which ld/st qualifiers it emits;
- ``errors``: compile-time errors (bad options, bad dtypes) and their messages;
- ``debug``: whether in-kernel checks are in the PTX (none without IRIS_DEBUG=1).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor

# Compiled kernels even on a machine without a GPU (iris.device would pick the interpreter there).
os.environ["TRITON_INTERPRET"] = "0"

import triton
import triton.language as tl
from device_test_kernels import (
    N_COMBOS,
    error_kernel,
    one_atomic,
    root_cause,
    scope_of,
    sem_of,
)
from device_test_tables import ATOMIC_DTYPES, ERROR_CASES, EXACT_OPS, FORMS, OPS, SCOPES, SEMS

import iris.device as device
from iris.device import DeviceContext
from iris.device.testing import compile_ptx, memory_order

TL_TYPES = {"int16": "i16", "uint16": "u16", "int32": "i32", "int64": "i64", "uint32": "u32", "uint64": "u64",
            "fp16": "fp16", "bf16": "bf16", "fp32": "fp32", "fp64": "fp64", "int8": "i8"}


def instructions(ptx: str) -> list[str]:
    return re.findall(r"(?<![\w.])(?:ld|st|atom|red)\.[\w.]+", ptx)  # not bar.red (a vote)


# ---------------------------------------------------------------------------------------------
# vector: translated vs local pointers


@triton.jit
def vector_kernel(context, heap_bases, x, y, n, peer, rank: tl.constexpr, world_size: tl.constexpr,
                  OP: tl.constexpr, MODE: tl.constexpr, BLOCK: tl.constexpr):
    ctx = DeviceContext.initialize(context, rank, world_size)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    if OP == "load":
        if MODE == "local":
            v = tl.load(x + offs, mask=m)
        elif MODE == "bound":
            v = ctx.load(x + offs, peer, mask=m)
        else:
            v = device.load(x + offs, rank, peer, heap_bases, mask=m)
        tl.store(y + offs, v, mask=m)
    elif OP == "store":
        v = tl.load(x + offs, mask=m)
        if MODE == "local":
            tl.store(y + offs, v, mask=m)
        elif MODE == "bound":
            ctx.store(y + offs, v, peer, mask=m)
        else:
            device.store(y + offs, v, rank, peer, heap_bases, mask=m)
    elif OP == "get":
        if MODE == "local":
            tl.store(y + offs, tl.load(x + offs, mask=m), mask=m)
        elif MODE == "bound":
            ctx.get(x + offs, y + offs, peer, mask=m)
        else:
            device.get(x + offs, y + offs, peer, rank, heap_bases, mask=m)
    elif OP == "put":
        if MODE == "local":
            tl.store(y + offs, tl.load(x + offs, mask=m), mask=m)
        elif MODE == "bound":
            ctx.put(x + offs, y + offs, peer, mask=m)
        else:
            device.put(x + offs, y + offs, rank, peer, heap_bases, mask=m)
    elif OP == "copy_pull":
        if MODE == "local":
            tl.store(y + offs, tl.load(x + offs, mask=m), mask=m)
        elif MODE == "bound":
            ctx.copy(x + offs, y + offs, peer, rank, mask=m)
        else:
            device.copy(x + offs, y + offs, peer, rank, rank, heap_bases, mask=m)
    elif OP == "copy_push":
        if MODE == "local":
            tl.store(y + offs, tl.load(x + offs, mask=m), mask=m)
        elif MODE == "bound":
            ctx.copy(x + offs, y + offs, rank, peer, mask=m)
        else:
            device.copy(x + offs, y + offs, rank, peer, rank, heap_bases, mask=m)
    else:
        tl.static_assert(OP == "atomic_add")
        v = tl.load(x + offs, mask=m)
        if MODE == "local":
            tl.atomic_add(y + offs, v, mask=m, sem="relaxed")
        elif MODE == "bound":
            ctx.atomic_add(y + offs, v, peer, mask=m, sem="relaxed")
        else:
            device.atomic_add(y + offs, v, rank, peer, heap_bases, mask=m, sem="relaxed")


def vector_case(op: str, dtype: str, mode: str) -> dict:
    t = TL_TYPES[dtype]
    ptx = compile_ptx(vector_kernel,
                      {"context": "*i64", "heap_bases": "*i64", "x": f"*{t}", "y": f"*{t}", "n": "i32", "peer": "i32"},
                      {"rank": 0, "world_size": 2, "OP": op, "MODE": mode, "BLOCK": 4096},
                      aligned=("context", "heap_bases", "x", "y", "n"))
    ins = instructions(ptx)
    data = [i for i in ins if not i.startswith(("ld.param", "ld.global.b64", "ld.global.nc.b64"))]
    return {
        "ld_v4": sum(1 for i in ins if i.startswith("ld.") and ".v4." in i),
        "st_v4": sum(1 for i in ins if i.startswith("st.") and ".v4." in i),
        "atomics": sorted(i for i in ins if i.startswith(("atom.", "red."))),
        "data": sorted(set(data)),
    }


def section_vector(pool) -> dict:
    cases = [(op, dt, mode) for op in ("load", "store", "get", "put", "copy_pull", "copy_push", "atomic_add")
             for dt in ("fp32", "bf16") for mode in ("local", "bound", "free")]
    results = list(pool.map(_vector_case_star, cases))
    return {f"{op}/{dt}/{mode}": res for (op, dt, mode), res in zip(cases, results)}


def _vector_case_star(args):
    return vector_case(*args)


# ---------------------------------------------------------------------------------------------
# atomics: op x dtype x sem x scope, bound and free


@triton.jit
def atomics_kernel(context, heap_bases, target, vals, olds, peer, rank: tl.constexpr, world_size: tl.constexpr,
                   OP: tl.constexpr, LANES: tl.constexpr):
    ctx = DeviceContext.initialize(context, rank, world_size)
    lanes = tl.arange(0, LANES)
    mask = lanes < LANES - 1
    val = tl.load(vals + lanes)
    cmp = tl.load(vals + LANES + lanes)
    for form in tl.static_range(2):
        for i in tl.static_range(N_COMBOS):
            at = (form * N_COMBOS + i) * LANES + lanes
            old = one_atomic(ctx, heap_bases, OP, form == 1, target + at, cmp, val, mask, peer, sem_of(i),
                              scope_of(i))
            tl.store(olds + at, old)


def atomic_case(op: str, dtype: str) -> dict:
    t = TL_TYPES[dtype]
    start = time.monotonic()
    try:
        ptx = compile_ptx(atomics_kernel,
                          {"context": "*i64", "heap_bases": "*i64", "target": f"*{t}", "vals": f"*{t}",
                           "olds": f"*{t}", "peer": "i32"},
                          {"rank": 0, "world_size": 2, "OP": op, "LANES": 4})
    except Exception as exc:  # reported, judged by the test
        return {"ok": False, "error": f"{type(exc).__name__}: {_root_message(exc)}"}
    pairs = set()
    for ins in instructions(ptx):
        if ins.startswith(("atom.", "red.")):
            parts = ins.split(".")
            sem = next((p for p in parts if p in ("relaxed", "acquire", "release", "acq_rel")), "none")
            scope = next((p for p in parts if p in ("cta", "gpu", "sys")), "none")
            pairs.add(f"{sem}/{scope}")
    # No barrier count here: with 40 atomics in one kernel Triton's own shared-memory barriers mix
    # with iris.device's; section ``exact`` checks every barrier on one atomic per kernel.
    return {"ok": True, "pairs": sorted(pairs), "seconds": round(time.monotonic() - start, 2)}


def _atomic_case_star(args):
    return atomic_case(*args)


def section_atomics(pool) -> dict:
    cases = [(op, dt) for op, dts in ATOMIC_DTYPES.items() for dt in dts]
    return {f"{op}/{dt}": res for (op, dt), res in zip(cases, pool.map(_atomic_case_star, cases))}


# ---------------------------------------------------------------------------------------------
# exact: one atomic per kernel, its memory-model instructions in order

#: One element per thread (4 warps of 32): Triton then needs no shared-memory broadcast of the old
#: values, whose barriers would sit between the atomic and the ones iris.device adds.
EXACT_LANES = 128


@triton.jit
def exact_kernel(context, heap_bases, target, vals, olds, peer, rank: tl.constexpr, world_size: tl.constexpr,
                 OP: tl.constexpr, FREE: tl.constexpr, SEM: tl.constexpr, SCOPE: tl.constexpr, LANES: tl.constexpr):
    """Exactly one atomic: ``OP`` with ``SEM``/``SCOPE`` at ``peer``, bound (``FREE`` false) or free."""
    ctx = DeviceContext.initialize(context, rank, world_size)
    lanes = tl.arange(0, LANES)
    mask = lanes < LANES - 1
    val = tl.load(vals + lanes)
    cmp = tl.load(vals + LANES + lanes)
    old = one_atomic(ctx, heap_bases, OP, FREE, target + lanes, cmp, val, mask, peer, SEM, SCOPE)
    tl.store(olds + lanes, old)


@triton.jit
def triton_atomic_kernel(target, vals, olds, SEM: tl.constexpr, SCOPE: tl.constexpr, LANES: tl.constexpr):
    """``exact_kernel``'s shape with Triton's own atomic: what Triton emits without iris.device."""
    lanes = tl.arange(0, LANES)
    old = tl.atomic_add(target + lanes, tl.load(vals + lanes), mask=lanes < LANES - 1, sem=SEM, scope=SCOPE)
    tl.store(olds + lanes, old)


def combo_key(sem, scope) -> str:
    return f"{sem}/{scope}"


def exact_case(op: str, dtype: str, form: str, sem, scope) -> list[str]:
    t = TL_TYPES[dtype]
    ptx = compile_ptx(exact_kernel,
                      {"context": "*i64", "heap_bases": "*i64", "target": f"*{t}", "vals": f"*{t}",
                       "olds": f"*{t}", "peer": "i32"},
                      {"rank": 0, "world_size": 2, "OP": op, "FREE": form == "free", "SEM": sem, "SCOPE": scope,
                       "LANES": EXACT_LANES})
    return memory_order(ptx)


def _exact_case_star(args):
    return exact_case(*args)


def section_exact(pool) -> dict:
    cases = [(op, dt, form, sem, scope) for op, dt in EXACT_OPS for form in FORMS
             for sem in SEMS for scope in SCOPES]
    results = pool.map(_exact_case_star, cases, chunksize=8)
    return {f"{op}/{dt}/{form}/{combo_key(sem, scope)}": seq for (op, dt, form, sem, scope), seq in zip(cases, results)}


def triton_case(sem, scope) -> list[str]:
    ptx = compile_ptx(triton_atomic_kernel, {"target": "*i32", "vals": "*i32", "olds": "*i32"},
                      {"SEM": sem, "SCOPE": scope, "LANES": EXACT_LANES})
    return memory_order(ptx)


def _triton_case_star(args):
    return triton_case(*args)


def section_triton(pool) -> dict:
    cases = [(sem, scope) for sem in SEMS for scope in SCOPES]
    out = {combo_key(*c): seq for c, seq in zip(cases, pool.map(_triton_case_star, cases))}
    out["version"] = triton.__version__
    return out


_DEFAULT_SEM = re.compile(r"``sem``.*?\(``None`` = ``\"(\w+)\"``\)", re.S)
_DEFAULT_SCOPE = re.compile(r"``scope``.*?\(``None`` = ``\"(\w+)\"``\)", re.S)


def section_docs(pool) -> dict:
    """The defaults each public atomic's docstring states (``None`` = ...), for the test to hold
    the PTX to."""
    out = {}
    for op in OPS:
        doc = getattr(device, f"atomic_{op}").__doc__ or ""
        sem = _DEFAULT_SEM.search(doc)
        scope = _DEFAULT_SCOPE.search(doc)
        out[op] = {"sem": sem.group(1) if sem else None, "scope": scope.group(1) if scope else None}
    return out


# ---------------------------------------------------------------------------------------------
# cache modifiers


@triton.jit
def cache_kernel(context, x, y, peer, rank: tl.constexpr, world_size: tl.constexpr, OP: tl.constexpr,
                 LCM: tl.constexpr, SCM: tl.constexpr, VOLATILE: tl.constexpr):
    ctx = DeviceContext.initialize(context, rank, world_size)
    offs = tl.arange(0, 1024)
    if OP == "load":
        tl.store(y + offs, ctx.load(x + offs, peer, cache_modifier=LCM, volatile=VOLATILE))
    elif OP == "store":
        ctx.store(y + offs, tl.load(x + offs), peer, cache_modifier=SCM)
    elif OP == "get":
        ctx.get(x + offs, y + offs, peer, load_cache_modifier=LCM, store_cache_modifier=SCM)
    elif OP == "put":
        ctx.put(x + offs, y + offs, peer, load_cache_modifier=LCM, store_cache_modifier=SCM)
    else:
        ctx.copy(x + offs, y + offs, peer, rank, load_cache_modifier=LCM, store_cache_modifier=SCM)


def cache_ptx(op, lcm=None, scm=None, volatile=False) -> str:
    return compile_ptx(cache_kernel, {"context": "*i64", "x": "*fp32", "y": "*fp32", "peer": "i32"},
                       {"rank": 0, "world_size": 2, "OP": op, "LCM": lcm, "SCM": scm, "VOLATILE": volatile},
                       aligned=("x", "y"))


def cache_case(op, lcm, scm, volatile) -> dict:
    ptx = cache_ptx(op, lcm, scm, volatile)
    ins = [i for i in instructions(ptx) if ".v4." in i]
    return {"loads": sorted({i for i in ins if i.startswith("ld.")}),
            "stores": sorted({i for i in ins if i.startswith("st.")})}


LOAD_MODS = (None, ".ca", ".cg", ".cv")
STORE_MODS = (None, ".wb", ".cg", ".cs", ".wt")


def _cache_case_star(args):
    return cache_case(*args)


def cache_key(op, lcm, scm, volatile) -> str:
    return f"{op}/{lcm}/{scm}/{volatile}"


def section_cache(pool) -> dict:
    cases = [("load", m, None, False) for m in LOAD_MODS] + [("load", m, None, True) for m in (None, ".cv")]
    cases += [("store", None, m, False) for m in STORE_MODS]
    cases += [(op, lm, sm, False) for op in ("get", "put", "copy") for lm, sm in zip(LOAD_MODS + (".cv",), STORE_MODS)]
    return {cache_key(*c): res for c, res in zip(cases, pool.map(_cache_case_star, cases))}


# ---------------------------------------------------------------------------------------------
# errors


def _root_message(exc: BaseException) -> str:
    return str(root_cause(exc))


def error_case(case: str) -> dict:
    try:
        compile_ptx(error_kernel, {"context": "*i64", "p_f32": "*fp32", "p_i32": "*i32", "p_f16": "*fp16",
                                   "p_bf16": "*bf16", "p_i8": "*i8"},
                    {"rank": 0, "world_size": 1, "CASE": case})
    except Exception as exc:
        root = root_cause(exc)
        return {"raised": True, "type": type(root).__name__,
                "iris_error": isinstance(root, device.IrisError), "message": str(root)}
    return {"raised": False}


def section_errors(pool) -> dict:
    return dict(zip(ERROR_CASES, pool.map(error_case, ERROR_CASES)))


# ---------------------------------------------------------------------------------------------
# debug checks: present only with IRIS_DEBUG=1


@triton.jit
def debug_kernel(context, heap_bases, x, y, n, peer, rank: tl.constexpr, world_size: tl.constexpr):
    ctx = DeviceContext.initialize(context, rank, world_size)
    offs = tl.arange(0, 1024)
    m = offs < n
    v = ctx.load(x + offs, peer, mask=m)
    ctx.store(y + offs, v, peer, mask=m)
    ctx.get(x + offs, y + offs, peer, mask=m)
    ctx.put(x + offs, y + offs, peer, mask=m)
    ctx.copy(x + offs, y + offs, peer, rank, mask=m)
    ctx.atomic_add(y, 1.0, peer)
    ctx.atomic_cas(y + 1, 0.0, 1.0, peer)
    device.store(y + offs, v, rank, peer, heap_bases, mask=m)


def _ptx_has_string(ptx: str, text: str) -> bool:
    # PTX spells string constants (assert messages, printf formats) as byte lists.
    return text in ptx or ", ".join(str(b) for b in text.encode()) in ptx


def section_debug(pool) -> dict:
    ptx = compile_ptx(debug_kernel, {"context": "*i64", "heap_bases": "*i64", "x": "*fp32", "y": "*fp32", "n": "i32",
                                     "peer": "i32"}, {"rank": 0, "world_size": 2}, aligned=("x", "y", "n"))
    ld_v4 = sum(1 for i in instructions(ptx) if i.startswith("ld.") and ".v4." in i)
    return {"iris_debug": bool(device.DEBUG.value), "triton_debug": bool(triton.knobs.runtime.debug),
            "vprintf": "vprintf" in ptx, "assertfail": "assertfail" in ptx,
            "message": _ptx_has_string(ptx, "iris debug"), "ld_v4": ld_v4}


SECTIONS = {"vector": section_vector, "atomics": section_atomics, "exact": section_exact, "triton": section_triton,
            "docs": section_docs, "cache": section_cache, "errors": section_errors, "debug": section_debug}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    parser.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1))
    args = parser.parse_args()
    out = {}
    timings = {}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for name in args.only.split(","):
            start = time.monotonic()
            out[name] = SECTIONS[name](pool)
            timings[name] = round(time.monotonic() - start, 1)
    out["seconds"] = timings
    print("section times (s):", timings, file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
