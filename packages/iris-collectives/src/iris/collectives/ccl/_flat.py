"""``FlatView``: a contiguous tensor of ``n`` elements seen as rows of ``C`` columns.

The host collectives flatten every tensor and cut it into tiles of ``BLOCK_M`` rows of
``BLOCK_N == C`` columns: tile ``t`` is the ``BLOCK_M * C`` elements from ``t * BLOCK_M * C`` on,
and the last one is ragged. ``FlatView`` has the interface the tile collectives take from a
:class:`~iris.collectives.TensorView` (``ptr``, ``M``, ``N``, ``frame``, ``num_tiles_n``,
``load``, ``store``), with the mask ``row * C + col < n``, so ``all_reduce_one_shot`` and the
others run on it unchanged.
"""

# No "from __future__ import annotations": aggregates check fields against real annotation types.
import triton
import triton.language as tl

from iris.device import aggregate

from .._views import _INDEX, INDEX_TYPE, _index


@aggregate
class FlatView:
    """``FlatView(ptr, n, M, C)``: ``n`` contiguous elements from ``ptr`` as ``M == ceil(n / C)``
    rows (computed by the caller: the constructor runs at compile time) of ``C`` (a compile-time
    power of two) columns. All methods per program."""

    ptr: tl.tensor
    n: _INDEX
    M: _INDEX
    N: tl.constexpr

    @triton.constexpr_function
    def __init__(self, ptr, n, M, C):
        self.ptr = ptr
        self.n = _index(n)
        self.M = _index(M)
        self.N = tl.constexpr(C)

    @triton.jit
    def num_tiles_n(self, BLOCK_N: tl.constexpr):
        """Tiles along the columns: ``cdiv(C, BLOCK_N)`` (1 for the tiles the host collectives use)."""
        return (self.N + BLOCK_N - 1) // BLOCK_N

    @triton.jit
    def frame(self, tile):
        """``(pointers, mask)`` of ``tile``, both ``[BLOCK_M, BLOCK_N]``: the mask keeps elements
        before ``n`` (and columns inside ``C``)."""
        rows = tile.pid_m * tile.BLOCK_M + tl.arange(0, tile.BLOCK_M).to(INDEX_TYPE)
        cols = tile.pid_n * tile.BLOCK_N + tl.arange(0, tile.BLOCK_N).to(INDEX_TYPE)
        offsets = rows[:, None] * self.N + cols[None, :]
        return self.ptr + offsets, (offsets < self.n) & (cols[None, :] < self.N)

    @triton.jit
    def load(self, tile, other=0):
        """Load ``tile`` from this rank's memory, ``other`` past ``n``. Per element, weak."""
        pointers, mask = self.frame(tile)
        return tl.load(pointers, mask=mask, other=other)

    @triton.jit
    def store(self, tile, data):
        """Store ``data`` at ``tile`` in this rank's memory, before ``n`` only. Per element, weak."""
        pointers, mask = self.frame(tile)
        tl.store(pointers, data, mask=mask)
