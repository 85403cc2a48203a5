"""Runtime errors: subclasses of the one :class:`iris.device.IrisError` hierarchy."""

from __future__ import annotations

from iris.device import IrisBackendError, IrisError, IrisUnsupportedError, IrisUsageError, NotOnHeapError


class HeapExhaustedError(IrisError, MemoryError):
    """An allocation does not fit in the free space of the symmetric heap."""


class UnsupportedDtypeError(IrisUnsupportedError):
    """A tensor dtype that Triton kernels cannot read or write (complex, quantized, ...)."""


class SymmetryError(IrisError, RuntimeError):
    """Ranks made different allocation calls, so offsets are no longer the same everywhere."""


class IrisTimeoutError(IrisError, RuntimeError):
    """The watchdog stopped a wait of this rank's kernels: a peer never arrived within ``IRIS_TIMEOUT_S``.

    The message names the rank, the collective, the flag and tile, the values and the peer(s).
    """


class IrisCallMismatchError(IrisUsageError):
    """The ranks made different collective calls: another collective, other shapes, dtypes, op,
    root or config, or a call that a rank skipped.

    Raised on every rank by the call agreement of the host collectives (``IRIS_CHECK_CALLS``), and
    by ``IRIS_DEBUG=1``'s lock-record signatures. The message names the call, each rank's call in
    the caller's shapes, and the fix.
    """


class RankError(IrisUsageError):
    """A rank number outside ``[0, world_size)``."""


class GroupError(IrisUsageError):
    """A group of ranks made or used wrongly: a duplicate rank, ranks listed differently on
    different ranks, a group of another context, or a call on a group by a rank outside it."""


class IrisBootstrapError(IrisBackendError):
    """The launcher that started this process and the bootstrap that was asked for (or found) do
    not agree: e.g. ``WORLD_SIZE=4`` set but no way to reach the other ranks, or ``mpi4py`` seeing
    one rank where ``mpirun`` started four. Raised instead of running as a silent world of one."""


__all__ = [
    "GroupError",
    "HeapExhaustedError",
    "IrisBackendError",
    "IrisBootstrapError",
    "IrisCallMismatchError",
    "IrisError",
    "IrisTimeoutError",
    "IrisUnsupportedError",
    "IrisUsageError",
    "NotOnHeapError",
    "RankError",
    "SymmetryError",
    "UnsupportedDtypeError",
]
