"""iris.device across ranks: one MPI launch per world size runs every scenario of
device_rank_worker.py (every primitive, bound and free, every peer, dtypes, masks, every atomic
with every sem and scope, contention with exact counts, message passing); one more small launch
with IRIS_DEBUG=1 for the in-kernel checks."""

from __future__ import annotations

import re

import pytest
from iris_device_testlib import TESTS, backend, rank_env

from iris.runtime.testing import run_ranks, world_sizes

WORKER = str(TESTS / "device_rank_worker.py")
SCENARIOS = ("rma_every_dtype", "rma_options", "atomics_every_sem_scope", "atomics_contention", "message_passing")
DEBUG_WORLD = 2


def assert_passed(proc, scenarios) -> None:
    for name in scenarios:
        assert f"PASS {name} " in proc.stdout, f"no PASS line for {name}\n{proc.stdout}\n{proc.stderr}"


@pytest.mark.multirank
@pytest.mark.parametrize("world_size", world_sizes())
def test_every_primitive_every_peer(world_size):
    proc = run_ranks(world_size, WORKER, *SCENARIOS, timeout=600, env=rank_env())
    assert_passed(proc, SCENARIOS)


@pytest.mark.multirank
@pytest.mark.gpu_fault
def test_debug_checks_across_ranks():
    env = rank_env(debug=True)
    if backend() == "cpu":
        # The interpreter raises IrisUsageError, which the scenarios catch and check: one launch.
        scenarios = ("debug_clean", "debug_bad_peer", "debug_bad_address")
        proc = run_ranks(DEBUG_WORLD, WORKER, *scenarios, timeout=600, env=env)
        assert_passed(proc, scenarios)
        assert proc.stdout.count("expected failure: iris debug:") == 2 * DEBUG_WORLD, proc.stdout
        return
    # On the GPU a device assert ends the process: one launch per failure, judged by its output
    # (the device_print line with the values, then the assert's message).
    assert_passed(run_ranks(DEBUG_WORLD, WORKER, "debug_clean", timeout=600, env=env), ["debug_clean"])
    proc = run_ranks(DEBUG_WORLD, WORKER, "debug_bad_peer", timeout=600, env=env, expect_failure=True)
    output = proc.stdout + proc.stderr
    for fragment in ("iris debug: iris.device.load: rank, peer, num_ranks =", " 77",
                     "iris debug: iris.device.load: a rank is outside [0, num_ranks)"):
        assert fragment in output, f"debug_bad_peer: {fragment!r} not in the output\n{output}"
    proc = run_ranks(DEBUG_WORLD, WORKER, "debug_bad_address", timeout=600, env=env, expect_failure=True)
    output = proc.stdout + proc.stderr
    offsets = re.findall(r"expecting a failure at heap offset (\d+)", output)
    assert offsets, output
    for fragment in ("iris debug: iris.device.atomic_add: rank, peer, heap offset, heap_size =",
                     "iris debug: iris.device.atomic_add: a pointer is not inside the symmetric heap"):
        assert fragment in output, f"debug_bad_address: {fragment!r} not in the output\n{output}"
    assert any(f" {offset}" in output.replace(f"heap offset {offset}", "") for offset in offsets), output
