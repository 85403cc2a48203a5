"""iris.device's one-patch-per-launch fast path for Triton's interpreter
(``iris.device._interpreter.patch_nested_calls_once``): kernels that call device functions of
their own module and Triton's library (``tl.sum``, ``tl.cdiv``: functions that see
``triton.language.core``) give the same results, the launch still restores ``triton.language``
afterwards, and nested calls no longer re-patch it."""

from __future__ import annotations

from iris_device_testlib import child_env, run_python

CHILD = r'''
import numpy as np
import triton
import triton.language as tl

import iris.device
from iris.device import _interpreter
from triton.runtime import interpreter as ti

assert iris.device.interpreter_enabled()
assert _interpreter.patch_nested_calls_once(), "this Triton's interpreter is not the one the fast path knows"
assert ti._patch_lang._iris_once

@triton.jit
def twice(x):
    return x * 2

@triton.jit
def plus_sum(x):
    return twice(x) + tl.sum(x, axis=0)

@triton.jit
def kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(src + offs, mask=mask, other=0)
    tl.store(dst + offs, plus_sum(x) + tl.cdiv(n, BLOCK), mask=mask)

# Triton's _patch_lang calls _patch_builtin (by its global name) 4 times for a function that sees
# triton.language and 3 for one that sees triton.language.core: count them
calls = []
patch_builtin = ti._patch_builtin
def counting(pkg, *args):
    calls.append(getattr(pkg, "__name__", "?"))
    return patch_builtin(pkg, *args)
ti._patch_builtin = counting

import torch
src = torch.arange(10, dtype=torch.int32)
dst = torch.zeros(10, dtype=torch.int32)
load_before = tl.load
for _ in range(3):
    kernel[(3,)](src, dst, 10, BLOCK=4)
want = []
for p in range(3):
    block = [v for v in range(p * 4, p * 4 + 4) if v < 10]
    want += [2 * v + sum(block) + 3 for v in block]
assert dst.tolist() == want, (dst.tolist(), want)
assert tl.load is load_before, "the launch did not restore triton.language"
print("PATCHES", len(calls))
'''


def test_nested_calls_are_right_and_patch_once_per_launch():
    proc = run_python(["-c", CHILD], env=child_env(interpret=True))
    patches = int(next(ln for ln in proc.stdout.splitlines() if ln.startswith("PATCHES ")).split()[1])
    # at most once per launch for each set of language modules a function sees (the kernel:
    # triton.language, 4; Triton's library: triton.language.core and with it triton.language, 3 to
    # 6): 27 for 3 launches with Triton 3.9. Patching again on every nested call made it 189.
    assert patches <= 3 * 10, f"{patches} _patch_builtin calls for 3 launches: nested calls patch again"



OVERFLOW_CHILD = r"""
import sys
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter as ti

if sys.argv[1] == "iris":
    import iris.device  # noqa: F401  (skips the checks that cannot fire)
    assert ti.interpreter_builder.options.sanitize_overflow is False
else:
    assert ti.interpreter_builder.options.sanitize_overflow is True  # Triton's default

@triton.jit
def scaled(dst, x, y):
    tl.store(dst, x * 4)  # int32: 2**30 * 4 overflows
    tl.store(dst + 1, x * y + y)
    v = tl.full([2], 2**30, tl.int32)
    tl.store(dst + 2 + tl.arange(0, 2), v * 4 - 1)

dst = torch.zeros(4, dtype=torch.int32)
scaled[(1,)](dst, 2**30, 4)
print("RESULT", dst.tolist())
"""


def test_the_interpreter_skips_overflow_checks_that_cannot_fire():
    # Triton's interpreter computed an overflow check for every int32 operation and threw it away
    # (its device_assert is off); iris.device stops that work. The results are the same with and
    # without it: the int32 arithmetic wraps, as on the GPU, and nothing raises.
    env = child_env(interpret=True)
    plain = run_python(["-c", OVERFLOW_CHILD, "triton"], env=env).stdout
    fast = run_python(["-c", OVERFLOW_CHILD, "iris"], env=env).stdout
    assert "RESULT [0, 4, -1, -1]" in plain, plain
    assert fast == plain, (fast, plain)
