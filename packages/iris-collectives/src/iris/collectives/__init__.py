"""iris.collectives: tiles, tensor views and tile-level collectives for ``@triton.jit`` kernels.

The collectives run inside your kernel, on the tile a program holds, and fuse with the compute
around it. Two forms of each:

- free functions taking the device context first:
  ``iris.collectives.all_reduce_two_shot(ctx, tile, src_view, dst_view, locks)``, usable with
  :class:`iris.device.DeviceContext` or this package's :class:`DeviceContext`;
- the spec's bound form on ``from iris.collectives import DeviceContext``:
  ``ctx.all_reduce_two_shot(tile, src_view, dst_view, locks)``.

Host-callable fused GEMM + communication built on them live in :mod:`iris.collectives.ops`
(``matmul_all_reduce``, ``matmul_reduce_scatter``, ``all_gather_matmul``, ``matmul_all_gather``,
and ``all_reduce_residual_rmsnorm``, built on :func:`all_reduce_rmsnorm`;
``from iris.collectives import ops``): host context first, output second, one persistent kernel
per call on torch's current stream.

Host-callable collectives on whole tensors live in :mod:`iris.collectives.ccl` (``all_reduce``,
``reduce_scatter``, ``all_gather``, ``all_to_all``, ``all_to_all_v``, ``broadcast``, ``reduce``, ``gather``,
``scatter``, ``barrier``, and point to point ``send``, ``recv``, ``isend``, ``irecv``, ``batch_isend_irecv``;
``from iris.collectives import ccl``), built on the same tile collectives and flags.

Expert parallelism, the token exchange of a mixture of experts with its counts on the device
(``dispatch``, ``combine``), lives in :mod:`iris.collectives.moe`, on the kernels of
``ccl.all_to_all_v``.

Every tile collective and :func:`device_barrier` take ``group=``, an :class:`iris.device.DeviceGroup`
(re-exported here), to run among a group's members (``ctx.new_group(ranks)`` on the host).

Point-to-point messages inside a kernel: :func:`put_with_signal` on the sender, :func:`wait_signal`
on the receiver.

Example::

    import iris.runtime                       # first: picks the backend (and the interpreter on CPUs)
    import iris.collectives as ic

    @triton.jit
    def kernel(context, x, y, locks, M, N, sxm, sym, rank: tl.constexpr, world_size: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        ctx = ic.DeviceContext.initialize(context, rank, world_size)
        src, dst = ic.TensorView(x, M, N, sxm, 1), ic.TensorView(y, M, N, sym, 1)
        view = ic.TileView(tl.program_id(0), tl.program_id(1), BLOCK_M, BLOCK_N)
        tile = ic.Tile(view.pid_m, view.pid_n, BLOCK_M, BLOCK_N, src.load(view))
        ctx.all_reduce_two_shot(tile, src, dst, locks)
"""

# The runtime decides the backend, and for the cpu backend switches Triton's interpreter on, before
# any kernel below is defined: importing this package first must work as well.
import iris.runtime  # noqa: F401
from iris.device import DeviceGroup

# The torch operators (iris.collectives.functional, which imports ccl and ops; about 70 ms): the
# front doors of ccl and ops hand their calls to them while torch.compile traces, and find them
# through _compiling, so they need not import functional themselves (no import circle).
from . import functional  # noqa: F401
from ._all_reduce import all_reduce_atomic, all_reduce_one_shot, all_reduce_spinlock, all_reduce_two_shot
from ._all_reduce_norm import all_reduce_rmsnorm, rms_norm_rows
from ._context import CollectiveMethods, DeviceContext
from ._errors import IrisCallMismatchError, IrisCapacityError, IrisMessageSizeError, IrisWaitTimeoutError
from ._gather import all_gather, all_to_all, gather
from ._host import barrier_words, lock_words, num_tiles, reduce_scatter_tiles, two_shot_rows
from ._reduce_scatter import reduce_scatter, reduce_scatter_owner
from ._ring import GROUP_RING_MAX_TILES, RING_MAX_TILES, all_reduce_ring
from ._signals import put_with_signal, wait_signal
from ._sync import BARRIER_WORDS, LOCK_WORDS, device_barrier, signal, wait_at_least
from ._version import __version__
from ._views import TensorView, Tile, TileRange, TileView, cdiv, tile_coords, tile_id_of

__all__ = [
    "BARRIER_WORDS",
    "GROUP_RING_MAX_TILES",
    "LOCK_WORDS",
    "RING_MAX_TILES",
    "CollectiveMethods",
    "DeviceContext",
    "DeviceGroup",
    "IrisCallMismatchError",
    "IrisCapacityError",
    "IrisMessageSizeError",
    "IrisWaitTimeoutError",
    "TensorView",
    "Tile",
    "TileRange",
    "TileView",
    "__version__",
    "all_gather",
    "all_reduce_atomic",
    "all_reduce_one_shot",
    "all_reduce_rmsnorm",
    "all_reduce_ring",
    "all_reduce_spinlock",
    "all_reduce_two_shot",
    "all_to_all",
    "barrier_words",
    "cdiv",
    "device_barrier",
    "gather",
    "lock_words",
    "num_tiles",
    "put_with_signal",
    "reduce_scatter",
    "reduce_scatter_owner",
    "reduce_scatter_tiles",
    "rms_norm_rows",
    "signal",
    "tile_coords",
    "tile_id_of",
    "two_shot_rows",
    "wait_at_least",
    "wait_signal",
]
