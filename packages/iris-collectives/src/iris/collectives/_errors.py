"""Errors of iris.collectives: subclasses of the one :class:`iris.device.IrisError` hierarchy."""

from __future__ import annotations

from iris.device import IrisError, IrisUnsupportedError, IrisUsageError


class IrisWaitTimeoutError(IrisError, RuntimeError):
    """A wait loop of a collective ran past its debug time limit (``IRIS_DEBUG=1``).

    The message names the collective, this rank, the peer(s) it waited for, the flag (its lock
    word and tile) and the value seen against the value expected.
    """


__all__ = ["IrisUnsupportedError", "IrisUsageError", "IrisWaitTimeoutError"]
