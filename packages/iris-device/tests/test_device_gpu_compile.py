"""GPU-path checks that need no GPU: iris.device kernels compiled for an H200 (sm_90, PTX and ptxas)
in a child process with Triton's interpreter off. They catch what the interpreter never sees:
vectorization through translated pointers, atomics qualifiers, cache modifiers, compile-time
errors, and that debug checks cost nothing when off."""

from __future__ import annotations

import pytest
from device_test_tables import ATOMIC_DTYPES, ERROR_CASES, ERROR_EXPECT, SCOPES, SEMS
from iris_device_testlib import child_env, run_json_script

VECTOR_OPS = ("load", "store", "get", "put", "copy_pull", "copy_push", "atomic_add")
LOAD_QUALIFIER = {"None": "ld.global.v4.", ".ca": "ld.global.ca.v4.", ".cg": "ld.global.cg.v4.",
                  ".cv": "ld.volatile.global.v4."}
STORE_QUALIFIER = {"None": "st.global.v4.", ".wb": "st.global.wb.v4.", ".cg": "st.global.cg.v4.",
                   ".cs": "st.global.cs.v4.", ".wt": "st.global.wt.v4."}
EXPLICIT_PAIRS = sorted(f"{sem}/{scope}" for sem in SEMS if sem for scope in SCOPES if scope)


@pytest.fixture(scope="module")
def compiled():
    """Every section, compiled once (about half a minute on two cores; Triton's cache helps later)."""
    return run_json_script("device_compile_checks.py", env=child_env(interpret=False), timeout=900)


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
