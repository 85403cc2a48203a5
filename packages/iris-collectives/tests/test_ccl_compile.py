"""GPU-path checks of iris.collectives.ccl that need no GPU: every kernel (every variant,
staged or not, every op, fp32/fp16/bf16/int32/int64; reduce-scatter; the pull kernel's
all-gather, all-to-all, broadcast, gather and scatter; reduce; the point-to-point send and recv;
the barrier; ops.all_reduce_residual_rmsnorm's kernel, which takes the same host path; all_to_all_v's
and the MoE dispatch's and combine's exchange kernels, and the MoE routing kernel) compiled
for an H200 (sm_90) in a child process with Triton's interpreter off. They catch what the
interpreter never sees: compile errors of the GPU paths, flags that are not acquired and released
at system scope, data paths without vector loads, fp8 outputs without the hardware's rounding
conversion, a combine whose sums would round differently from the cpu backend's (fused multiply-adds);
and that every one of these kernels takes the rank at run time, unspecialised (one compiled kernel
for every rank of a job)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "ccl_compile_check.py")


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


def test_every_ccl_kernel_takes_the_rank_at_run_time_unspecialised(report):
    # One compiled kernel for every rank of a job: the rank is neither a compile-time constant nor a
    # value Triton specialises on (rank 1 and rank 16 would otherwise get kernels of their own).
    ranks = report["rank_parameters"]
    assert set(ranks) == {"_kernels.all_reduce_kernel", "_kernels.reduce_scatter_kernel", "_kernels.reduce_kernel",
                          "_kernels.pull_kernel", "_kernels.barrier_kernel", "_p2p_kernels.send_kernel",
                          "_p2p_kernels.recv_kernel", "_p2p_kernels.send_large_kernel",
                          "_p2p_kernels.recv_large_kernel", "_p2p_kernels.direct_copy_kernel",
                          "_p2p_kernels.direct_done_kernel", "_exchange_kernels.publish_kernel",
                          "_exchange_kernels.pull_kernel", "_exchange_kernels.combine_kernel"}, ranks
    for kernel, how in ranks.items():
        assert how == {"constexpr": False, "specialised": False}, (kernel, how)


def test_every_ccl_kernel_compiles_for_sm90(compiled):
    failed = {k: r["error"] + "\n" + r.get("trace", "") for k, r in compiled.items() if not r["ok"]}
    assert not failed, "\n\n".join(f"{k}: {v}" for k, v in failed.items())
    assert {k.split("/")[0] for k in compiled} == {"all_reduce", "reduce_scatter", "all_gather", "all_to_all",
                                                   "broadcast", "reduce", "gather", "scatter", "send", "recv",
                                                   "send_large", "recv_large", "direct_copy", "direct_done", "barrier",
                                                   "all_reduce_rmsnorm",
                                                   "all_to_all_v", "moe_dispatch", "moe_combine", "moe_routing"}


def test_flags_are_acquired_and_released_at_system_scope(compiled):
    for key, r in compiled.items():
        if key == "moe_routing" or key.startswith("direct_copy/"):  # local: the routing of this rank's
            continue  # tokens; a copy that its stream orders between a large message's waits and signals
        assert r["acquire_sys_loads"] > 0 and r["release_sys"] > 0, (key, r)


def test_messages_signal_after_a_barrier_and_wait_with_acquire(compiled):
    # point to point: the sender's remote stores, then a CTA barrier and one release add at system
    # scope per chunk (signal); the receiver's acquire polls, then its copy, then its release; the
    # same for a large message's request, offer, direct copy and credits
    for key in ("send/fp32", "recv/fp32", "send_large/fp32", "recv_large/fp32", "direct_done/send/fp32",
                "direct_done/recv/fp32"):
        r = compiled[key]
        assert r["bar_sync"] > 0 and r["release_sys"] > 0 and r["acquire_sys_loads"] > 0, (key, r)


def test_the_call_check_adds_no_round_trip_to_the_kernels_with_their_own_protocol(compiled):
    # The call check (iris.device._calls): no kernel counts its calls with an atomic; the pull kernel
    # and the buffered one-shot rounds (ccl's and the fused all-reduce + RMSNorm's) load the peers'
    # fingerprints right after their first wait, before their reads of the peers' data, not after.
    for key, r in compiled.items():
        assert r["counter_atomics"] == 0, (key, r)
    pulled = ("all_gather", "all_to_all", "broadcast", "gather", "scatter")
    buffered = ("all_reduce", "all_reduce_rmsnorm")
    deferred = [k for k in compiled if k.split("/")[0] in pulled or k.startswith("reduce_scatter/pull_buffered")
                or (k.split("/")[0] in buffered and "/one_shot_buffered/" in k)]
    assert len(deferred) > 10, compiled.keys()
    for key in deferred:
        assert compiled[key]["peeks_before_its_reads"], (key, compiled[key])


def test_data_moves_in_vectors(compiled):
    for key, r in compiled.items():
        # the routing moves ids, gathered and scattered; the barrier and a large message's signal no data
        if key not in ("barrier", "moe_routing") and not key.startswith("direct_done/"):
            assert r["vector_loads"] > 0, (key, r)


def test_combine_rounds_each_product_and_sum(compiled):
    # moe.combine's weighted sum is product, then sum, each rounded, as on the cpu backend and in
    # torch (the same bits everywhere): launched without fp fusion, its PTX has no fma
    combines = [k for k in compiled if k.startswith("moe_combine/reduce/") or k.startswith("moe_combine/gather/")]
    assert len(combines) == 3, compiled.keys()
    for key in combines:
        assert compiled[key]["fma"] == 0, (key, compiled[key])


def test_fp8_outputs_round_to_nearest_even_and_saturate_in_hardware(compiled):
    # the rounding the host references use (torch's e4m3 conversion: to nearest even), on values the
    # kernel clamped to +-448: cvt.rn.satfinite, and no other conversion path
    norm = {k: r for k, r in compiled.items() if k.startswith("all_reduce_rmsnorm/")}
    assert norm, compiled.keys()
    for key, r in norm.items():
        assert (r["fp8_conversions"] > 0) == ("/fp8/" in key), (key, r)
