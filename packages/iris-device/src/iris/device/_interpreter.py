"""Whether kernels run through Triton's interpreter.

Triton decides at decoration time: with ``TRITON_INTERPRET=1`` set, ``@triton.jit`` returns an
``InterpretedFunction`` instead of a ``JITFunction``. ``iris.runtime`` sets the variable for the
CPU backend before it imports this package, so reading it once at import is enough.
"""

from __future__ import annotations

import triton
import triton.language as tl


def interpreter_enabled() -> bool:
    """True when ``@triton.jit`` builds interpreted functions (``TRITON_INTERPRET=1``)."""
    return bool(triton.knobs.runtime.interpret)


#: Compile-time flag, readable from ``@triton.jit`` code: kernels run in Triton's interpreter.
INTERPRETER: tl.constexpr = tl.constexpr(interpreter_enabled())
