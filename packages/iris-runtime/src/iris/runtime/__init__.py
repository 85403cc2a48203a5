"""iris.runtime: a symmetric heap shared by every rank, with torch tensors on it; the ranks find
each other through MPI (``mpirun``) or torch.distributed (``torchrun``).

    import iris.runtime
    ctx = iris.runtime.iris(heap_size=1 << 30)   # collective
    x = ctx.zeros(1024, dtype=torch.float32)     # same heap offset on every rank
    kernel[grid](ctx.get_device_context(), x, rank=ctx.rank, world_size=ctx.world_size)

Importing this package picks the backend (``IRIS_BACKEND``: auto, cuda or cpu) and, for the cpu
backend, switches Triton's interpreter on before any kernel is defined.
"""

from ._backend import prepare_interpreter_at_import

# Before anything imports iris.device or the user defines kernels (see _backend).
DEFAULT_BACKEND = prepare_interpreter_at_import()

from ._compile_lock import install_from_env as _install_compile_lock
from ._kernel_manifest import install_recorder_from_env as _install_kernel_recorder

_install_compile_lock(DEFAULT_BACKEND)  # IRIS_COMPILE_LOCK=1: one compilation per kernel per machine
_install_kernel_recorder(DEFAULT_BACKEND)  # IRIS_KERNEL_RECORD=<folder>: a manifest of the kernels compiled

from ._allocator import SymmetricAllocator, format_bytes
from ._errors import (
    GroupError,
    HeapExhaustedError,
    IrisBackendError,
    IrisBootstrapError,
    IrisCallMismatchError,
    IrisError,
    IrisTimeoutError,
    IrisUnsupportedError,
    IrisUsageError,
    NotOnHeapError,
    RankError,
    SymmetryError,
    UnsupportedDtypeError,
)
from ._factories import SUPPORTED_DTYPES
from ._group import Group
from ._heap import SymmetricHeap
from ._iris import DEFAULT_HEAP_SIZE, Iris, iris
from ._logging import logger, set_log_level
from ._reach import Reach
from ._registration import Registration
from ._residency import programs_per_sm
from ._tracing import Tracing
from ._uids import context_of_uid
from ._version import __version__

__all__ = [
    "DEFAULT_BACKEND",
    "DEFAULT_HEAP_SIZE",
    "Group",
    "GroupError",
    "HeapExhaustedError",
    "Iris",
    "IrisBackendError",
    "IrisBootstrapError",
    "IrisCallMismatchError",
    "IrisError",
    "IrisTimeoutError",
    "IrisUnsupportedError",
    "IrisUsageError",
    "NotOnHeapError",
    "RankError",
    "Reach",
    "Registration",
    "SUPPORTED_DTYPES",
    "SymmetricAllocator",
    "SymmetricHeap",
    "SymmetryError",
    "Tracing",
    "UnsupportedDtypeError",
    "__version__",
    "context_of_uid",
    "format_bytes",
    "iris",
    "logger",
    "programs_per_sm",
    "set_log_level",
]
