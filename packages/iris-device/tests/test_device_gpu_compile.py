"""GPU-path checks that need no GPU: iris.device kernels compiled for an H200 (sm_90, PTX and ptxas)
in a child process with Triton's interpreter off. They catch what the interpreter never sees:
vectorization through translated pointers, atomics qualifiers and the exact memory-model
instructions of every atomic (barriers, semantics, scope, order), cache modifiers, compile-time
errors, and that debug checks cost nothing when off."""

from __future__ import annotations

import pytest
from device_test_tables import ATOMIC_DTYPES, ERROR_CASES, ERROR_EXPECT, EXACT_OPS, FORMS, OPS, SCOPES, SEMS
from iris_device_testlib import child_env, run_json_script

VECTOR_OPS = ("load", "store", "get", "put", "copy_pull", "copy_push", "atomic_add")
LOAD_QUALIFIER = {"None": "ld.global.v4.", ".ca": "ld.global.ca.v4.", ".cg": "ld.global.cg.v4.",
                  ".cv": "ld.volatile.global.v4."}
STORE_QUALIFIER = {"None": "st.global.v4.", ".wb": "st.global.wb.v4.", ".cg": "st.global.cg.v4.",
                   ".cs": "st.global.cs.v4.", ".wt": "st.global.wt.v4."}
EXPLICIT_PAIRS = sorted(f"{sem}/{scope}" for sem in SEMS if sem for scope in SCOPES if scope)

#: The spec's defaults (device-context spec, atomic_*: "If not provided, the function defaults to
#: using 'acq_rel' semantics"; scope: "'gpu' (default)").
SPEC_DEFAULT_SEM = "acq_rel"
SPEC_DEFAULT_SCOPE = "gpu"
BAR = "bar.sync"
#: The PTX operation of each (op, dtype) of the exact section: sub adds the negated value,
#: min and max of int32 are signed, the bitwise ops, exch and cas work on bits.
PTX_OP = {("add", "int32"): "add.u32", ("add", "fp32"): "add.f32", ("sub", "int32"): "add.u32",
          ("xchg", "int32"): "exch.b32", ("and", "int32"): "and.b32", ("or", "int32"): "or.b32",
          ("xor", "int32"): "xor.b32", ("min", "int32"): "min.s32", ("max", "int32"): "max.s32",
          ("cas", "int32"): "cas.b32"}


@pytest.fixture(scope="module")
def compiled():
    """The sections but the exact ones, compiled once (a few minutes on two cores from cold, seconds
    from Triton's cache)."""
    return run_json_script("device_compile_checks.py", "--only", "vector,atomics,cache,errors,debug",
                           env=child_env(interpret=False), timeout=900)


@pytest.fixture(scope="module")
def exact():
    """One kernel per atomic x sem x scope x form (400) and their memory-order instructions, the
    bare-Triton baseline and the docstrings' defaults: about a minute on two cores from cold."""
    return run_json_script("device_compile_checks.py", "--only", "exact,triton,docs", env=child_env(interpret=False),
                           timeout=900)


@pytest.fixture(scope="module")
def compiled_debug():
    return run_json_script("device_compile_checks.py", "--only", "debug", env=child_env(interpret=False, debug=True),
                           timeout=300)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("op", VECTOR_OPS)
def test_translated_pointers_vectorize_like_local(compiled, op, dtype):
    local = compiled["vector"][f"{op}/{dtype}/local"]
    for mode in ("bound", "free"):
        remote = compiled["vector"][f"{op}/{dtype}/{mode}"]
        assert remote["data"] == local["data"], f"{op} {dtype} {mode}: {remote['data']} vs local {local['data']}"
        assert (remote["ld_v4"], remote["st_v4"]) == (local["ld_v4"], local["st_v4"])
        assert remote["atomics"] == local["atomics"]
    assert local["ld_v4"] > 0, local
    if op == "atomic_add":
        assert any(".v4." in a or ".v8." in a for a in local["atomics"]), local["atomics"]
    else:
        assert local["st_v4"] > 0, local


@pytest.mark.parametrize("case", [f"{op}/{dt}" for op, dts in ATOMIC_DTYPES.items() for dt in dts])
def test_every_atomic_sem_scope_dtype_compiles(compiled, case):
    result = compiled["atomics"][case]
    assert result["ok"], result.get("error")
    # None/None maps to acq_rel/gpu; every explicit pair must reach the instruction.
    assert result["pairs"] == EXPLICIT_PAIRS, result["pairs"]


def releases(sem) -> bool:
    return sem in ("release", "acq_rel")


def acquires(sem) -> bool:
    return sem in ("acquire", "acq_rel")


def triton_orders_program(exact) -> bool:
    """Whether this Triton brackets an ordering atomic with CTA barriers on its own.

    Triton 3.9 does (a barrier before a releasing atomic, one after an acquiring one, whatever the
    scope); Triton 3.6 emits the bare atom. iris.device adds its own barriers either way (3.6 needs
    them), so on 3.9 they come in pairs. Read from a bare ``tl.atomic_add`` (section ``triton``)
    rather than from the version number; an unknown third form fails here, loudly, instead of in
    every case below."""
    bare = exact["triton"]["release/sys"]
    known = {(): False, (BAR,): True}
    before = tuple(bare[:-1])
    assert bare[-1:] == ["atom.release.sys.add.u32"] and before in known, (
        f"Triton {exact['triton']['version']} lowers a bare release atomic to {bare}: a form these checks do not "
        f"know (Triton 3.6: the atom alone; 3.9: a CTA barrier, then the atom)")
    return known[before]


def expected_order(ptx_op: str, sem, scope, triton_own: bool, iris_own: bool = True) -> list[str]:
    """The exact memory-model instructions of one atomic (one element per thread).

    ``None`` means the spec's defaults (acq_rel, gpu), and the semantics and scope reach the atom
    unchanged. iris.device's atomics act for the whole program (their docstring: "a releasing
    atomic orders every earlier access of the program's threads before it, an acquiring one every
    later access after it"). On the GPU a program is many threads and each element's atomic is
    issued by one of them, so that takes a CTA barrier before a releasing atomic (the other
    threads' earlier accesses then happen before it) and one after an acquiring atomic (the other
    threads' later accesses happen after it): release = [bar, atom], acquire = [atom, bar],
    acq_rel = both, relaxed = the atom alone. Triton's own barriers (``triton_own``) sit between
    iris.device's and the atom.
    """
    sem = sem or SPEC_DEFAULT_SEM
    scope = scope or SPEC_DEFAULT_SCOPE
    before = [BAR] * (iris_own * releases(sem) + triton_own * releases(sem))
    after = [BAR] * (triton_own * acquires(sem) + iris_own * acquires(sem))
    return [*before, f"atom.{sem}.{scope}.{ptx_op}", *after]


def test_atomic_docstrings_state_the_spec_defaults(exact):
    # The docstrings say "(None = "acq_rel")" and "(None = "gpu")": the spec's defaults, which the
    # exact checks below hold the PTX to.
    want = {"sem": SPEC_DEFAULT_SEM, "scope": SPEC_DEFAULT_SCOPE}
    assert exact["docs"] == {op: want for op in OPS}, exact["docs"]


def test_bare_triton_atomics_are_lowered_as_known(exact):
    # What Triton itself emits for tl.atomic_add(sem, scope) in the exact kernels' shape: the
    # baseline that iris.device's barriers are added to.
    triton_own = triton_orders_program(exact)
    wrong = {}
    for sem in SEMS:
        for scope in SCOPES:
            got = exact["triton"][f"{sem}/{scope}"]
            want = expected_order("add.u32", sem, scope, triton_own, iris_own=False)
            if got != want:
                wrong[f"{sem}/{scope}"] = (got, want)
    assert not wrong, "\n".join(f"{k}: got {g}, want {w}" for k, (g, w) in wrong.items())


@pytest.mark.parametrize("op_dtype", [f"{op}/{dt}" for op, dt in EXACT_OPS])
def test_each_atomic_has_exactly_its_memory_order(exact, op_dtype):
    # One atomic per kernel, every sem x scope, bound and free: the exact ordered CTA barriers,
    # fences and atomics (semantics, scope, operation), not the set over a kernel. Catches a
    # default that is not acq_rel/gpu, a sem or scope that reaches the PTX changed, and a lost
    # (or extra) program-wide barrier.
    op, dtype = op_dtype.split("/")
    triton_own = triton_orders_program(exact)
    wrong = {}
    for form in FORMS:
        for sem in SEMS:
            for scope in SCOPES:
                key = f"{op_dtype}/{form}/{sem}/{scope}"
                want = expected_order(PTX_OP[op, dtype], sem, scope, triton_own)
                got = exact["exact"][key]
                if got != want:
                    wrong[key] = (got, want)
    assert not wrong, f"{len(wrong)} of {len(FORMS) * len(SEMS) * len(SCOPES)} cases differ:\n" + "\n".join(
        f"{k}: got {g}, want {w}" for k, (g, w) in wrong.items())


def test_exact_section_covers_every_atomic(exact):
    assert {op for op, _ in EXACT_OPS} == set(OPS)
    assert len(exact["exact"]) == len(EXACT_OPS) * len(FORMS) * len(SEMS) * len(SCOPES)


def test_cache_modifiers_reach_the_ptx(compiled):
    cache = compiled["cache"]
    for key, result in cache.items():
        op, lcm, scm, volatile = key.split("/")
        if op != "store":
            want = LOAD_QUALIFIER["None" if volatile == "False" and lcm == "None" else lcm]
            if volatile == "True":
                want = LOAD_QUALIFIER[".cv"]
            assert [q for q in result["loads"] if q.startswith(want)], (key, result)
            assert len(result["loads"]) == 1, (key, result)
        if op != "load":
            want = STORE_QUALIFIER[scm]
            assert [q for q in result["stores"] if q.startswith(want)], (key, result)
            assert len(result["stores"]) == 1, (key, result)
    assert {k.split("/")[1] for k in cache if k.startswith("load/")} == {"None", ".ca", ".cg", ".cv"}
    assert {k.split("/")[2] for k in cache if k.startswith("store/")} == {"None", ".wb", ".cg", ".cs", ".wt"}


@pytest.mark.parametrize("case", ERROR_CASES)
def test_compile_time_errors_name_the_fix(compiled, case):
    result = compiled["errors"][case]
    assert result["raised"], f"{case} compiled without an error"
    kind, fragments = ERROR_EXPECT[case]
    assert result["type"] == kind and result["iris_error"], result
    for fragment in fragments:
        assert fragment in result["message"], (fragment, result["message"])


def test_debug_off_costs_nothing(compiled):
    debug = compiled["debug"]
    assert not debug["iris_debug"] and not debug["triton_debug"]
    assert not (debug["vprintf"] or debug["assertfail"] or debug["message"]), debug
    assert debug["ld_v4"] > 0


def test_debug_on_compiles_the_checks(compiled_debug):
    debug = compiled_debug["debug"]
    # IRIS_DEBUG=1 must switch Triton's own debug mode on, or device asserts compile to nothing.
    assert debug["iris_debug"] and debug["triton_debug"], debug
    assert debug["vprintf"] and debug["assertfail"] and debug["message"], debug
