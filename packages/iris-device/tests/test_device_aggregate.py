"""``iris.device.aggregate`` on the installed Triton: a user aggregate that inherits ``@triton.jit``
methods from a plain mixin (as ``DeviceContext`` does from ``DeviceContextMethods``) compiles for
sm_90 and runs under the interpreter, methods of the class win over the mixin's, and an aggregate
used as a base is refused with the fix. Triton 3.8 and 3.9 refuse plain bases in their own
``_aggregate``; these tests run in every nox session, so on the lowest and newest tested Triton."""

from __future__ import annotations

import pytest
from iris_device_testlib import child_env, run_python

SCRIPT = """
import sys
import triton
import triton.language as tl
import iris.device
from iris.device import aggregate


class Scaled:
    # a plain mixin: its jit methods call methods the aggregate overrides

    @triton.jit
    def factor(self):
        return 1000  # overridden below: a result with 1000 in it means the mixin won

    @triton.jit
    def apply(self, x):
        return x * self.factor() + self.offset


def _fields(self, scale, offset):
    self.scale = tl.constexpr(scale)
    self.offset = offset


@aggregate
class Affine(Scaled):
    scale: tl.constexpr
    offset: tl.tensor

    __init__ = triton.constexpr_function(_fields)

    @triton.jit
    def factor(self):
        return self.scale

    @staticmethod
    @triton.jit
    def initialize(scale: tl.constexpr, offset):
        return Affine(scale, offset)


@triton.jit
def affine_kernel(x, y, offset, SCALE: tl.constexpr, BLOCK: tl.constexpr):
    f = Affine.initialize(SCALE, tl.load(offset))
    offs = tl.arange(0, BLOCK)
    tl.store(y + offs, f.apply(tl.load(x + offs)))


try:
    @aggregate
    class Nested(Affine):
        extra: tl.constexpr
    refused = "no"
except TypeError as exc:
    refused = str(exc)
assert "already an aggregate" in refused and "plain mixin" in refused, refused

if iris.device.INTERPRETER.value:
    import torch
    x = torch.arange(8, dtype=torch.float32)
    y = torch.empty_like(x)
    affine_kernel[(1,)](x, y, torch.tensor([5.0]), SCALE=3, BLOCK=8)
    assert y.tolist() == [3.0 * i + 5.0 for i in range(8)], y.tolist()
    print("ran", y.tolist())
else:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    src = ASTSource(fn=affine_kernel, signature={"x": "*fp32", "y": "*fp32", "offset": "*fp32", "SCALE": "constexpr",
                    "BLOCK": "constexpr"}, constexprs={"SCALE": 3, "BLOCK": 8})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    assert "3.0" in ptx or "0f40400000" in ptx, "the subclass's factor (3) is not in the PTX"
    assert "1000" not in ptx and "0f447A0000" not in ptx, "the mixin's factor (1000) reached the PTX"
    print("compiled", len(ptx))
"""


@pytest.mark.parametrize("mode", ["compiled", "interpreted"])
def test_aggregate_with_plain_mixin(mode, tmp_path):
    script = tmp_path / "user_aggregate.py"  # @triton.jit needs its source in a file
    script.write_text(SCRIPT)
    proc = run_python([str(script)], env=child_env(interpret=mode == "interpreted"), timeout=300)
    assert proc.stdout.split()[0] == ("ran" if mode == "interpreted" else "compiled"), proc.stdout
