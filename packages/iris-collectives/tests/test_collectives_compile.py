"""GPU-path checks that need no GPU: every collective's test kernel compiled for an H200 (sm_90) in
a child process with Triton's interpreter off, with and without IRIS_DEBUG=1. They catch what the
interpreter never sees: compile errors of the GPU paths, flags that are not released and acquired
at system scope, data paths that lost their vector loads, debug code left in a normal build."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "collectives_compile_check.py")
LOCKING = ("all_reduce_spinlock", "all_reduce_one_shot", "all_reduce_two_shot", "all_reduce_ring", "reduce_scatter")


def compile_all(debug: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "IRIS_DEBUG", "TRITON_DEBUG")}
    env["IRIS_BACKEND"] = "cuda"  # compile for the GPU; nothing is launched
    if debug:
        env["IRIS_DEBUG"] = "1"
    proc = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, timeout=900, env=env, cwd=HERE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def compiled():
    return compile_all(debug=False)


@pytest.fixture(scope="module")
def compiled_debug():
    return compile_all(debug=True)


def test_every_collective_compiles_for_sm90(compiled):
    assert not compiled["debug"]
    failed = {k: r["error"] + "\n" + r.get("trace", "") for k, r in compiled["results"].items() if not r["ok"]}
    assert not failed, "\n\n".join(f"{k}: {v}" for k, v in failed.items())
    names = {k.split("/")[0] for k in compiled["results"]}
    assert names == {*LOCKING, "all_reduce_atomic", "all_gather", "gather", "all_to_all"}


def test_flags_are_released_and_acquired_at_system_scope(compiled):
    for key, r in compiled["results"].items():
        name = key.split("/")[0]
        if name in LOCKING or name == "all_gather":  # all_gather's kernel adds a device barrier
            # released by a release atomic, or by one system-scope fence before relaxed adds
            assert r["release_sys"] + r["release_fences_sys"] > 0 and r["acquire_sys_loads"] > 0, (key, r)
        if name == "all_reduce_atomic":
            continue  # its atomics carry data (relaxed on purpose), not flags
        for atom in r["atomics"]:
            qualifiers = atom.split(".", 1)[1]  # the same for atom. and red. (no old value)
            if "u64" in qualifiers or qualifiers == "global.gpu.relaxed.add.u32":
                continue  # the trace buffer's slot counter; this rank's private call counters
            if qualifiers == "global.sys.relaxed.add.u32":
                assert r["release_fences_sys"] > 0, (key, "relaxed signal without a release fence", r)
                continue
            assert ".sys." in atom and ("release" in atom or "acquire" in atom), (key, atom)


def test_private_counters_are_updated_by_one_atomic(compiled):
    # A counter read by a scalar tl.load (every thread) and written by a scalar tl.store (one
    # thread) lets a late warp read the new value and wait for the next call's target forever: the
    # GPU hang of 0.1.0 with several tiles per program. Counters go through one atomic instead.
    for key, r in compiled["results"].items():
        if key.split("/")[0] in LOCKING:
            # the detector sees the one-thread predicate (the counters' and flags' atomics use it)
            assert r["single_thread_atomics"] > 0, (key, r)
        if "/trace/" in key:
            continue  # the trace buffer's end-time store is a single-thread store by design
        assert r["single_thread_stores"] == 0, (key, r)


def test_waits_poll_with_acquire_loads_in_every_thread(compiled):
    # One L2 round trip per poll and no thread-0 acquire + broadcast: every thread polls with
    # ld.acquire.sys (unpredicated), and no relaxed volatile poll is left.
    for key, r in compiled["results"].items():
        if key.split("/")[0] in LOCKING or key.startswith("all_gather"):
            assert r["acquire_polls_all_threads"] > 0 and r["volatile_loads"] == 0, (key, r)


def test_data_paths_use_vector_loads(compiled):
    for key, r in compiled["results"].items():
        assert r["ld_v4"] > 0 and r["st_v4"] > 0, (key, r)


def test_atomic_variant_adds_with_system_scope_vector_atomics(compiled):
    r = compiled["results"]["all_reduce_atomic/fp32/bound/plain/4/1"]
    assert any(a.split(".", 1)[1].startswith("global.sys.relaxed.add") and "f32" in a for a in r["atomics"]), \
        r["atomics"]


def test_tracing_compiles_in_only_when_asked(compiled):
    for key, r in compiled["results"].items():
        traced = any("u64" in a for a in r["atomics"])
        assert traced == ("/trace/" in key), (key, r["atomics"])


def test_debug_checks_cost_nothing_when_off(compiled, compiled_debug):
    assert compiled_debug["debug"]
    failed = {k: r["error"] for k, r in compiled_debug["results"].items() if not r["ok"]}
    assert not failed, failed
    for key, r in compiled_debug["results"].items():
        plain = compiled["results"][key]
        if key.split("/")[0] in LOCKING:
            assert r["prints"] > plain["prints"], (key, r["prints"], plain["prints"])
    # without debug, only the ring's signal-pad capacity check prints (and traps)
    for key, r in compiled["results"].items():
        ring = key.startswith("all_reduce_ring")
        assert (r["prints"] > 0) == ring and (r["traps"] > 0) == ring, (key, r)
