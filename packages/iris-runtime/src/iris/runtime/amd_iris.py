"""AMD Iris's names, for code written for AMD's Iris: in such a file, ``import iris`` becomes

    import iris.runtime.amd_iris as iris

and ``from iris import DeviceContext`` becomes ``from iris.runtime.amd_iris import DeviceContext``.
Then ``iris.iris(heap_size)``, ``iris.load``, ``iris.get``, ``iris.atomic_cas``, ... and the host
object's methods (``get_heap_bases``, ``zeros(..., out=)``, ``get_cu_count``, ...) are this
project's own, under AMD Iris's names: nothing here is a second implementation.

``DeviceContext`` is iris.device's (memory operations and atomics). For the tile collectives as
methods of the context (``ctx.all_reduce_one_shot(...)``) import iris.collectives' instead.
docs/amd-iris.md lists what differs from AMD Iris and what it has that is not here.
"""

from iris.device import (
    DeviceContext,
    TraceEvent,
    atomic_add,
    atomic_and,
    atomic_cas,
    atomic_max,
    atomic_min,
    atomic_or,
    atomic_sub,
    atomic_xchg,
    atomic_xor,
    copy,
    get,
    load,
    put,
    store,
    translate,
)

from ._iris import Iris, iris

#: AMD Iris's newer name for the device context (``from iris.context import TritonContext``).
TritonContext = DeviceContext

__all__ = [
    "DeviceContext",
    "Iris",
    "TraceEvent",
    "TritonContext",
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
    "get",
    "iris",
    "load",
    "put",
    "store",
    "translate",
]
