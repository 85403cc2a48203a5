"""``iris.device`` imports, and kernels using it can be defined, with neither torch, mpi4py nor
iris.runtime importable (a kernel author's ``pip install iris-device``)."""

from __future__ import annotations

import pytest
from iris_device_testlib import child_env, run_python

BLOCKED = ("torch", "mpi4py", "iris.runtime")

SCRIPT = """
import sys
for name in {blocked!r}:
    sys.modules[name] = None  # any import of it raises ImportError
import triton
import triton.language as tl
import iris.device
from iris.device import DeviceContext

@triton.jit
def kernel(context, x, rank: tl.constexpr, world_size: tl.constexpr):
    ctx = DeviceContext.initialize(context, rank, world_size)
    ctx.store(x, ctx.load(x, 0) + 1, 0)

assert iris.device.__version__
leaked = sorted(n for n in sys.modules if n.split(".")[0] in ("torch", "mpi4py") and sys.modules[n] is not None)
leaked += [n for n in sys.modules if n.startswith("iris.runtime") and sys.modules[n] is not None]
assert not leaked, leaked
print("ok", iris.device.INTERPRETER.value)
"""


@pytest.mark.parametrize("mode", ["compiled", "interpreted"])
def test_import_without_torch_mpi4py_runtime(mode, tmp_path):
    env = child_env(interpret=mode == "interpreted")
    script = tmp_path / "kernel_author.py"  # @triton.jit needs its source in a file
    script.write_text(SCRIPT.format(blocked=BLOCKED))
    proc = run_python([str(script)], env=env, timeout=120)
    assert proc.stdout.split() == ["ok", str(mode == "interpreted")]
