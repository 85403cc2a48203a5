"""Compiled or interpreted kernels: decided once, before any kernel is defined.

Triton fixes the mode when ``@triton.jit`` runs (``TRITON_INTERPRET``), so ``iris.device`` decides
first thing on import, with the same rule as ``iris.runtime``: ``TRITON_INTERPRET`` if set, else
``IRIS_BACKEND`` (``cpu`` -> interpreter, ``cuda`` or ``nvshmem`` -> compiled), else (``auto``) the interpreter
when the CUDA driver reports no GPU. Nobody has to set ``TRITON_INTERPRET`` by hand. This module
imports nothing from the package, so it can run before the package's kernels are defined.
"""

from __future__ import annotations

import ctypes
import os
import sys


def nvidia_gpu_visible() -> bool:
    """True when the CUDA driver loads and reports at least one device (no torch needed)."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return False
    return count.value > 0


def wants_interpreter() -> bool:
    """The rule above."""
    if "TRITON_INTERPRET" in os.environ:
        return os.environ["TRITON_INTERPRET"] not in ("", "0")
    backend = os.environ.get("IRIS_BACKEND", "auto")
    if backend in ("cpu", "cuda", "nvshmem"):
        return backend == "cpu"
    return not nvidia_gpu_visible()


def switch_interpreter_on() -> None:
    """Set ``TRITON_INTERPRET=1`` and convert Triton's own library kernels if they came first.

    ``triton.language`` defines part of its library (``tl.sum``, ``tl.zeros``, ``tl.cdiv`` ...) with
    ``@triton.jit``. When a program imported triton before the mode was chosen, those are
    compiled-mode functions, and interpreted kernels calling them fail ("Cannot call @triton.jit'd
    outside of the scope of a kernel"). Re-wrapping them makes the import order not matter.
    """
    os.environ["TRITON_INTERPRET"] = "1"
    if "triton.language" not in sys.modules:
        return
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    converted: dict[int, InterpretedFunction] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "triton.language" or name.startswith("triton.language.")):
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, JITFunction):
                if id(value) not in converted:
                    converted[id(value)] = InterpretedFunction(value.fn)
                setattr(module, attr, converted[id(value)])


def choose_mode_at_import() -> None:
    """Called first thing by ``import iris.device``."""
    if wants_interpreter():
        switch_interpreter_on()
