"""Errors of iris.collectives: subclasses of the one :class:`iris.device.IrisError` hierarchy."""

from __future__ import annotations

from iris.device import IrisError, IrisUnsupportedError, IrisUsageError
from iris.runtime import IrisCallMismatchError  # the one class for calls that differ between ranks


class IrisWaitTimeoutError(IrisError, RuntimeError):
    """A wait loop of a collective ran past its debug time limit (``IRIS_DEBUG=1``).

    The message names the collective, this rank, the peer(s) it waited for, the flag (its lock
    word and tile) and the value seen against the value expected.
    """


def unwrapped(exc: BaseException) -> BaseException:
    """The :class:`IrisCallMismatchError` that a kernel raised under Triton's interpreter, which
    wraps what a kernel raises in nested ``InterpreterError`` reprs; else ``exc`` itself. Launches
    on the ``cpu`` backend re-raise it, so that a call mismatch their kernel found reads as one
    line naming both calls."""
    seen = exc
    while seen is not None:
        if isinstance(seen, IrisCallMismatchError):
            return seen
        seen = seen.__cause__
    return exc


class IrisMessageSizeError(IrisUsageError):
    """A point-to-point message arrived with another number of elements or dtype than the recv
    that took it expects (``iris.collectives.ccl.recv``).

    The message names the receiving rank, the sender, the tag and both sizes and dtypes. Raised
    under Triton's interpreter; on the GPU the watchdog reports it and ends the job.
    """


class IrisCapacityError(IrisUsageError):
    """A variable-size exchange (``ccl.all_to_all_v``, ``moe.dispatch``) received more rows than its
    output holds, or was told to send more rows than its input has.

    The message names the call, the rank, the rows and the room. Raised by the host call on the
    cpu backend once the call has run (every rank's part of it done, the rows that fit written);
    on the GPU the kernel reports it to the watchdog, which prints the same message and ends the
    job.
    """


__all__ = ["IrisCallMismatchError", "IrisCapacityError", "IrisMessageSizeError", "IrisUnsupportedError",
           "IrisUsageError", "IrisWaitTimeoutError"]
