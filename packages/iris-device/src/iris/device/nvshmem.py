"""NVSHMEM's device functions for ``@triton.jit`` code, on the ``nvshmem`` backend.

The element-wise primitives of :mod:`iris.device` already use these for peers on other nodes;
call them directly for what those do not offer: bulk copies of contiguous bytes with a signal
(``putmem_signal_nbi_block``), completion (``quiet``) and ordering (``fence``). Addresses are int64
symmetric addresses, this rank's own address of the heap location: ``tl.cast(ptr, tl.int64)``.
They exist only when the network path is compiled in (``NVSHMEM``; see
:func:`iris.device._nvshmem.network_path_selected`); the runtime links NVSHMEM's bitcode into the
kernels that call them.

Example (a program sends its tile's bytes to ``peer`` and raises the peer's signal by 1)::

    if iris.device.nvshmem.NVSHMEM:
        iris.device.nvshmem.putmem_signal_nbi_block(tl.cast(dst, tl.int64), tl.cast(src, tl.int64), nbytes,
                                                    tl.cast(signal, tl.int64), 1, SIGNAL_ADD, peer)
"""

from ._nvshmem import (
    NVSHMEM,
    amo,
    fence,
    g,
    getmem_block,
    my_pe,
    n_pes,
    network_path_selected,
    p,
    putmem_nbi_block,
    putmem_signal_nbi_block,
    quiet,
    signal_wait_until,
)

#: ``signal_op`` values of :func:`putmem_signal_nbi_block` (NVSHMEM_SIGNAL_SET / _ADD).
SIGNAL_SET = 0
SIGNAL_ADD = 5

__all__ = [
    "NVSHMEM",
    "SIGNAL_ADD",
    "SIGNAL_SET",
    "amo",
    "fence",
    "g",
    "getmem_block",
    "my_pe",
    "n_pes",
    "network_path_selected",
    "p",
    "putmem_nbi_block",
    "putmem_signal_nbi_block",
    "quiet",
    "signal_wait_until",
]
