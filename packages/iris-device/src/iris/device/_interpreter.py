"""Whether kernels run through Triton's interpreter, and the aggregate fix it needs.

Triton decides at decoration time: with ``TRITON_INTERPRET=1`` set, ``@triton.jit`` returns an
``InterpretedFunction`` instead of a ``JITFunction``. ``iris.runtime`` sets the variable for the
CPU backend before it imports this package, so reading it once at import is enough.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.language.core import _aggregate


def interpreter_enabled() -> bool:
    """True when ``@triton.jit`` builds interpreted functions (``TRITON_INTERPRET=1``)."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


#: Compile-time flag, readable from ``@triton.jit`` code: kernels run in Triton's interpreter.
INTERPRETER: tl.constexpr = tl.constexpr(interpreter_enabled())


def aggregate(cls):
    """``triton.language.core._aggregate`` that also works under the interpreter.

    ``_aggregate`` copies only ``JITFunction`` methods onto the value class; interpreted methods
    are dropped, so ``Ctx.initialize`` would not exist. Here, in interpreter mode only, static
    methods are attached as they are and instance methods as plain functions that pass ``self``
    on (an ``InterpretedFunction`` is not a descriptor, so it would not bind by itself).
    """
    value_cls = _aggregate(cls)
    if not interpreter_enabled():
        return value_cls
    from triton.runtime.interpreter import InterpretedFunction

    members = {}
    for klass in reversed(cls.__mro__):  # inherited methods too, subclasses win
        members.update(vars(klass))
    for name, member in members.items():
        if isinstance(member, staticmethod) and isinstance(member.__func__, InterpretedFunction):
            setattr(value_cls, name, member.__func__)
        elif isinstance(member, InterpretedFunction):
            setattr(value_cls, name, _bind_forwarder(member))
    return value_cls


def _bind_forwarder(fn):
    def method(self, *args, **kwargs):
        return fn(self, *args, **kwargs)

    method.__name__ = fn.__name__
    method.__doc__ = fn.fn.__doc__
    method.__wrapped__ = fn.fn
    return method
