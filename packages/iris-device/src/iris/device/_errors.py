"""The one exception hierarchy of Iris.

Every error that Iris raises on purpose is an :class:`IrisError`. The device layer owns the root
so that kernel authors who install only ``iris-device`` can catch it; ``iris-runtime`` and
``iris-collectives`` add their own subclasses. Messages follow one rule: name the call, the
values that were wrong and the fix.
"""

from __future__ import annotations


class IrisError(Exception):
    """Root of every error raised by Iris on purpose."""


class IrisUsageError(IrisError, ValueError):
    """A call was given an argument it cannot accept (a bad rank, option or dtype)."""


class NotOnHeapError(IrisUsageError):
    """Memory that must be on the symmetric heap is not: a tensor passed where the heap is needed
    (on the host), or a pointer outside the heap through which a kernel reaches another rank
    (under Triton's interpreter, checked on every remote access; see ``iris.device._heap_check``)."""


class IrisBackendError(IrisError, RuntimeError):
    """A backend cannot run what was asked of it (no GPU, interpreter mode mismatch, ...)."""


class IrisUnsupportedError(IrisError, TypeError):
    """The combination asked for does not exist on this backend (e.g. bf16 atomics on the CPU).

    Raised at compile or launch time, never replaced by a silently wrong answer.
    """
