"""The examples' kernels compile for an H100/H200 (sm_90) on a machine with no GPU, and their
cross-rank flags are system-scoped release/acquire operations in the PTX.

The CPU runs of tests/test_examples_run.py go through Triton's interpreter, which never compiles
a kernel: this catches what only the GPU compiler rejects. The compiling happens in a child
process with the interpreter off (tests/workers/compile_example_kernels.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "workers", "compile_example_kernels.py")


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict[str, int]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["IRIS_BACKEND"] = "cuda"
    proc = subprocess.run([sys.executable, WORKER], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    kernels = {}
    for line in proc.stdout.splitlines():
        match = re.match(r"OK (\S+(?: \S+)*?) ((?:\S+=\S+ ?)+)$", line)
        if match:
            kernels[match.group(1)] = {k: v for k, v in (kv.split("=") for kv in match.group(2).split())}
    return kernels


def count(facts: dict, key: str) -> int:
    return int(facts[key])


def test_every_kernel_compiled(compiled):
    expected = (["00_hello_heap.write_to_every_peer"]
                + [f"01_message_passing.exchange[USE_PUT={p}]" for p in (False, True)]
                + [f"02_gemm_all_reduce.gemm_all_reduce[{v}]"
                   for v in ("atomic", "spinlock", "one_shot", "two_shot", "ring")]
                + [f"03_gemm_all_gather.gemm_all_gather[dim={d}, {m}]"
                   for d in (0, 1) for m in ("collective", "stores")])
    assert sorted(compiled) == sorted(expected)


def test_message_passing_flags_are_system_scope(compiled):
    for use_put in (False, True):
        facts = compiled[f"01_message_passing.exchange[USE_PUT={use_put}]"]
        assert count(facts, "sys.release") >= 2 and count(facts, "sys.acquire") >= 2, facts
        # the untimed warm-up launch (rounds=0) compiles the kernel the timed launch runs
        assert facts["warmup_builds_it"] == "True", facts


@pytest.mark.parametrize("variant", ["spinlock", "one_shot", "two_shot", "ring"])
def test_gemm_all_reduce_flags_are_system_scope(compiled, variant):
    facts = compiled[f"02_gemm_all_reduce.gemm_all_reduce[{variant}]"]
    # released by release atomics, or by a system-scope fence followed by relaxed system-scope adds
    released = count(facts, "sys.release") >= 1 or (count(facts, "sys.fence") >= 1 and count(facts, "sys.relaxed") >= 1)
    assert released and count(facts, "sys.acquire") >= 1, facts
    assert facts["wgmma"] == "True", facts  # the GEMM uses Hopper's tensor-core instructions


def test_gemm_all_reduce_atomic_adds_at_system_scope(compiled):
    facts = compiled["02_gemm_all_reduce.gemm_all_reduce[atomic]"]
    assert count(facts, "sys.relaxed") >= 1, facts
