"""GPU-path checks of iris.collectives.ops that need no GPU: every op's kernel compiled for an H200
(sm_90) in a child process with Triton's interpreter off, bf16 and fp32 (tf32), with tensor
descriptors and with pointer loads, fp64 (pointer loads), and fp32 in full precision (one
kernel). They catch what the interpreter never sees: compile errors of the GPU paths, a
descriptor path that lost its TMA loads, a GEMM that lost its wgmma (or, in full precision, one
that uses the tensor cores), and flags that are not acquired and released at system scope; and that
every op's kernel takes the rank at run time, unspecialised (one compiled kernel for every rank of
a job)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "ops_compile_check.py")
OPS = {"matmul_all_reduce", "matmul_all_reduce_two_shot", "matmul_all_reduce_rotated", "matmul_reduce_scatter",
       "matmul_reduce_scatter_rotated", "matmul_reduce_scatter_rotated_input", "matmul_all_gather", "all_gather_matmul",
       "all_gather_matmul_arrival"}
CORE = {"matmul_core", "matmul_core_ws"}  # the GEMM core alone, plain and warp-specialised


@pytest.fixture(scope="module")
def report() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "IRIS_DEBUG", "TRITON_DEBUG")}
    env.update(IRIS_BACKEND="cuda", TRITON_DEFAULT_FP_FUSION="1")  # compile for the GPU; nothing is launched
    proc = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, timeout=900, env=env, cwd=HERE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def compiled(report) -> dict:
    return report["results"]


def test_every_op_kernel_takes_the_rank_at_run_time_unspecialised(report):
    # One compiled kernel for every rank of a job, as ccl's (test_ccl_compile): the rank is neither
    # a compile-time constant nor a value Triton specialises on.
    ranks = report["rank_parameters"]
    assert set(ranks) == {"_matmul_all_reduce._matmul_all_reduce_kernel",
                          "_matmul_reduce_scatter._matmul_reduce_scatter_kernel", "_rotated.rotated_kernel",
                          "_matmul_all_gather._matmul_all_gather_kernel",
                          "_all_gather_matmul._all_gather_matmul_kernel", "_all_gather_matmul._arrival_kernel",
                          "_all_reduce_rmsnorm._all_reduce_rmsnorm_kernel"}, ranks
    for kernel, how in ranks.items():
        assert how == {"constexpr": False, "specialised": False}, (kernel, how)


def test_every_op_compiles_for_sm90(compiled):
    failed = {k: r["error"] + "\n" + r.get("trace", "") for k, r in compiled.items() if not r["ok"]}
    assert not failed, "\n\n".join(f"{k}: {v}" for k, v in failed.items())
    assert {k.split("/")[0] for k in compiled} == OPS | CORE
    # fp32 reads B column-major only (the layout its tf32 MMAs take), bf16 both ways
    assert "matmul_all_reduce/fp32/tma_columns" in compiled and "matmul_all_reduce/fp32/tma" not in compiled
    assert {"matmul_all_reduce/bf16/tma_columns", "all_gather_matmul/bf16/tma_columns"} <= set(compiled)


def test_descriptor_path_uses_tma_and_wgmma(compiled):
    for key, r in compiled.items():
        if "/fp64/" in key:  # fp64: pointer loads, and mma.sync (wgmma has no fp64 form)
            assert r["mma"] > 0 and r["tma_loads"] == 0, (key, r)
            continue
        if "/fp32_ieee/" in key:  # full precision: FMA units only, no tf32 tensor-core instruction
            assert r["wgmma"] == 0 and r["mma"] == 0, (key, r)
            assert (r["tma_loads"] > 0) == key.rsplit("/", 1)[1].startswith("tma"), (key, r)
            continue
        assert r["wgmma"] > 0, (key, r)  # Hopper tensor cores, not mma.sync
        if key.rsplit("/", 1)[1].startswith("tma"):  # "tma" and "tma_columns" (B's transpose)
            assert r["tma_loads"] > 0 and r["tensormaps"] > 0, (key, r)
        else:
            assert r["tma_loads"] == 0, (key, r)


def test_flags_are_acquired_and_released_at_system_scope(compiled):
    for key, r in compiled.items():
        if key.split("/")[0] in OPS:
            assert r["acquire_sys_loads"] > 0 and r["release_sys"] > 0, (key, r)


def test_default_tiles_fit_in_shared_memory(report):
    # What a launch without config compiles (the table's tiles, warps and stages per dtype) must fit
    # one program's shared memory on an H100 or H200; fp64 at fp32's K block needed 288 KiB and
    # failed at launch (OutOfResources) in the torch operators' fp64 gradient checks.
    compiled, limit = report["results"], report["shared_limit"]
    defaults = {k: r for k, r in compiled.items() if k.endswith("_defaults")}
    assert {k.split("/")[1] for k in defaults} >= {"bf16", "fp64"} and len(defaults) >= 10, sorted(defaults)
    # (the fixed tiles of the other cases are a config a caller may pass: fp64 at 128 x 128 x 64 takes
    # 256 KiB, and Triton's OutOfResources names it at launch)
    for key, r in defaults.items():
        assert r["shared"] <= limit, (key, r["shared"], limit)


def test_warp_specialised_core_has_a_producer_and_two_consumer_warpgroups(compiled):
    # Config(warp_specialize=True, num_warps=4): Triton's Hopper warp specialisation splits the K
    # loop into a TMA producer warpgroup and two MMA consumer warpgroups (12 warps), re-balancing
    # registers between them with setmaxnreg. A Triton that silently declines leaves 4 warps.
    ws, plain = compiled["matmul_core_ws/bf16/tma"], compiled["matmul_core/bf16/tma"]
    assert ws["threads"] == 3 * 128 and ws["setmaxnreg"] > 0, ws
    assert ws["tma_stores"] > 0, ws  # the specialised core's tile leaves through a descriptor store
    assert plain["threads"] == 256 and plain["setmaxnreg"] == 0, plain
    for key in compiled:
        if key.split("/")[0] in OPS:  # the fused ops never ask for it
            assert compiled[key]["setmaxnreg"] == 0, (key, compiled[key])
