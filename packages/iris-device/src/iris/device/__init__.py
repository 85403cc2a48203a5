"""iris.device: remote loads, stores and atomics over a symmetric heap, for ``@triton.jit`` code.

Two forms of every primitive:

- free functions that name both ends and the heap:
  ``iris.device.load(pointer, to_rank, from_rank, heap_bases)``;
- the bound :class:`DeviceContext`, which knows the current rank and the heap:
  ``ctx = DeviceContext.initialize(context_tensor, rank, world_size); ctx.load(pointer, from_rank)``.

A group of ranks reaches a kernel as :class:`DeviceGroup` (its rank, size and
``global_rank(q)``), which the tile collectives of ``iris.collectives`` take as ``group=``; the
primitives here keep taking global ranks.

This package depends on Triton only (and numpy, for Triton's interpreter): importing it pulls in
neither torch, mpi4py nor the runtime.
Importing it chooses compiled or interpreted kernels (see ``iris.device._mode``).
"""

from ._mode import choose_mode_at_import

choose_mode_at_import()  # before any @triton.jit below (and the caller's) runs

from . import nvshmem
from ._atomics import (
    atomic_add,
    atomic_and,
    atomic_cas,
    atomic_max,
    atomic_min,
    atomic_or,
    atomic_sub,
    atomic_xchg,
    atomic_xor,
)
from ._context import DeviceContext, DeviceContextMethods
from ._debug import DEBUG, debug_enabled
from ._errors import IrisBackendError, IrisError, IrisUnsupportedError, IrisUsageError, NotOnHeapError
from ._group import DeviceGroup
from ._interpreter import (
    INTERPRETER,
    interpreter_enabled,
    patch_nested_calls_once,
    skip_overflow_checks_that_cannot_fire,
    surface_iris_errors,
)
from ._memory import copy, get, load, put, store
from ._rounding import round_to
from ._tracing import EVENT_IDS, EVENT_NAMES, DeviceTracing, TraceEvent, device_clock_ns, device_sm_id
from ._translate import translate
from ._triton_compat import aggregate
from ._version import __version__

if interpreter_enabled():
    patch_nested_calls_once()  # CPU time: see its docstring
    skip_overflow_checks_that_cannot_fire()  # CPU time: see its docstring
    surface_iris_errors()  # an IrisError raised in a kernel reaches the caller as itself

__all__ = [
    "DEBUG",
    "DeviceContext",
    "DeviceContextMethods",
    "DeviceGroup",
    "DeviceTracing",
    "EVENT_IDS",
    "EVENT_NAMES",
    "INTERPRETER",
    "IrisBackendError",
    "IrisError",
    "IrisUnsupportedError",
    "IrisUsageError",
    "NotOnHeapError",
    "TraceEvent",
    "__version__",
    "aggregate",
    "atomic_add",
    "atomic_and",
    "atomic_cas",
    "atomic_max",
    "atomic_min",
    "atomic_or",
    "atomic_sub",
    "atomic_xchg",
    "atomic_xor",
    "copy",
    "debug_enabled",
    "device_clock_ns",
    "device_sm_id",
    "get",
    "interpreter_enabled",
    "load",
    "nvshmem",
    "put",
    "round_to",
    "store",
    "translate",
]
