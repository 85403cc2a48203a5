"""``TileView``, ``Tile`` and ``TensorView``: where a program's tile sits in a 2-D tensor.

A tile is the ``BLOCK_M x BLOCK_N`` block at tile coordinates ``(pid_m, pid_n)``: rows
``pid_m * BLOCK_M + [0, BLOCK_M)`` and columns ``pid_n * BLOCK_N + [0, BLOCK_N)``. A
``TensorView`` is a pointer, a shape and strides (in elements). Tiles at the bottom and right
edges stick out of the tensor when ``M`` or ``N`` is not a multiple of the block; every access
goes through :meth:`TensorView.mask`, so ragged edges and blocks larger than the tensor just work.

Positions, sizes and strides may be run-time values (``tl.program_id``, kernel arguments) or
compile-time ones (literals, ``tl.constexpr`` arguments, and integer arguments equal to 1, which
Triton specialises); each field keeps what it was given.
"""

# No "from __future__ import annotations": aggregates check fields against real annotation types.
import triton
import triton.language as tl

from iris.device import INTERPRETER, aggregate

#: Annotation of a field that is a run-time scalar or a compile-time integer.
_INDEX = (tl.tensor, tl.constexpr)

#: Type of row and column indices: int32 on the GPU; int64 under the interpreter, where int32
#: arithmetic on blocks is checked for overflow element by element (int64 is not), which made
#: index math the largest cost of an interpreted collective. Same values either way.
INDEX_TYPE: tl.constexpr = tl.constexpr(tl.int64 if INTERPRETER else tl.int32)


@triton.constexpr_function
def _index(value):
    # A tensor stays a tensor; a Python int (a literal, or any value under the interpreter) becomes
    # a constexpr, which the aggregate can hold.
    return value if isinstance(value, tl.tensor) else tl.constexpr(value)


@triton.jit
def cdiv(a, b):
    """``ceil(a / b)`` for positive integers; scalars or blocks. No memory access.

    (The same as ``tl.cdiv``, which is a standard-library function that breaks under the
    interpreter when ``triton`` was imported before ``iris.runtime``.)
    """
    return (a + b - 1) // b


@triton.jit
def tile_id_of(pid_m, pid_n, num_tiles_n):
    """Row-major tile id of tile ``(pid_m, pid_n)`` in a grid ``num_tiles_n`` tiles wide."""
    return pid_m * num_tiles_n + pid_n


@triton.jit
def tile_coords(tile_id, num_tiles_n):
    """``(pid_m, pid_n)`` of the row-major ``tile_id`` in a grid ``num_tiles_n`` tiles wide."""
    return tile_id // num_tiles_n, tile_id % num_tiles_n


class _TilePosition:
    """Position helpers shared by :class:`TileView` and :class:`Tile`. All per program, no
    memory access."""

    @triton.jit
    def rows(self):
        """Row indices of the tile, ``[BLOCK_M]`` (some may lie past the tensor's last row)."""
        return self.pid_m * self.BLOCK_M + tl.arange(0, self.BLOCK_M).to(INDEX_TYPE)

    @triton.jit
    def cols(self):
        """Column indices of the tile, ``[BLOCK_N]`` (some may lie past the last column)."""
        return self.pid_n * self.BLOCK_N + tl.arange(0, self.BLOCK_N).to(INDEX_TYPE)

    @triton.jit
    def tile_id(self, num_tiles_n):
        """Row-major id of this tile in a grid ``num_tiles_n`` tiles wide."""
        return self.pid_m * num_tiles_n + self.pid_n


@aggregate
class TileView(_TilePosition):
    """A tile's position and block shape, without data: ``TileView(pid_m, pid_n, BLOCK_M, BLOCK_N)``.

    ``BLOCK_M`` and ``BLOCK_N`` are compile-time powers of two. Example::

        tile = TileView(tl.program_id(0), tl.program_id(1), BLOCK_M, BLOCK_N)
        x = src_view.load(tile)
    """

    pid_m: _INDEX
    pid_n: _INDEX
    BLOCK_M: tl.constexpr
    BLOCK_N: tl.constexpr

    @triton.constexpr_function
    def __init__(self, pid_m, pid_n, BLOCK_M, BLOCK_N):
        self.pid_m = _index(pid_m)
        self.pid_n = _index(pid_n)
        self.BLOCK_M = tl.constexpr(BLOCK_M)
        self.BLOCK_N = tl.constexpr(BLOCK_N)


@aggregate
class Tile(_TilePosition):
    """A tile's position, block shape and data: ``Tile(pid_m, pid_n, BLOCK_M, BLOCK_N, data)``.

    ``data`` is a ``[BLOCK_M, BLOCK_N]`` block in registers (what the program computed or
    loaded); lanes outside the tensor are ignored by every collective. Example::

        acc = ...                                   # the program's result, [BLOCK_M, BLOCK_N]
        tile = Tile(pid_m, pid_n, BLOCK_M, BLOCK_N, acc)
        iris.collectives.all_reduce_two_shot(ctx, tile, src_view, dst_view, locks)
    """

    pid_m: _INDEX
    pid_n: _INDEX
    BLOCK_M: tl.constexpr
    BLOCK_N: tl.constexpr
    data: tl.tensor

    @triton.constexpr_function
    def __init__(self, pid_m, pid_n, BLOCK_M, BLOCK_N, data):
        self.pid_m = _index(pid_m)
        self.pid_n = _index(pid_n)
        self.BLOCK_M = tl.constexpr(BLOCK_M)
        self.BLOCK_N = tl.constexpr(BLOCK_N)
        self.data = data

    @triton.jit
    def view(self):
        """The :class:`TileView` of this tile (same position and block, no data)."""
        return TileView(self.pid_m, self.pid_n, self.BLOCK_M, self.BLOCK_N)


@aggregate
class TileRange:
    """The tiles one program handles, for the range form of the collectives:
    ``TileRange(first, stop, step, num_tiles_n, BLOCK_M, BLOCK_N)`` is the row-major tile ids
    ``first, first + step, ...`` below ``stop`` of a tensor ``num_tiles_n`` tiles wide, each
    ``BLOCK_M x BLOCK_N`` (compile-time powers of two).

    Passed to a collective in place of a tile, it makes one synchronisation with the peers cover
    every tile of the range (one "ready" and one "done" per program and call instead of one per
    tile): what a persistent kernel wants when its data is all there before the call. The range
    may be empty (``first >= stop``: a grid of more programs than the tensor has tiles): the
    program then does nothing and synchronises with no peer, whose program of the same id is empty
    too. Its lock record is ``first``'s. Example, a persistent grid over a view::

        tiles = TileRange(tl.program_id(0), view.num_tiles(BLOCK_M, BLOCK_N), tl.num_programs(0),
                          view.num_tiles_n(BLOCK_N), BLOCK_M, BLOCK_N)
        ctx.all_reduce_two_shot(tiles, src_view, dst_view, locks)
    """

    first: _INDEX
    stop: _INDEX
    step: _INDEX
    num_tiles_n: _INDEX
    BLOCK_M: tl.constexpr
    BLOCK_N: tl.constexpr

    @triton.constexpr_function
    def __init__(self, first, stop, step, num_tiles_n, BLOCK_M, BLOCK_N):
        self.first = _index(first)
        self.stop = _index(stop)
        self.step = _index(step)
        self.num_tiles_n = _index(num_tiles_n)
        self.BLOCK_M = tl.constexpr(BLOCK_M)
        self.BLOCK_N = tl.constexpr(BLOCK_N)

    @triton.jit
    def tile(self, tile_id):
        """The :class:`TileView` of the range's tile ``tile_id`` (a row-major id). No memory access."""
        pid_m = tile_id // self.num_tiles_n
        # not "%": under the interpreter an int has no "%" with a constexpr
        return TileView(pid_m, tile_id - pid_m * self.num_tiles_n, self.BLOCK_M, self.BLOCK_N)


@triton.constexpr_function
def is_range(tile):
    """Whether ``tile`` is a :class:`TileRange` (at compile time): the collectives take a tile or a range."""
    return isinstance(tile, TileRange)


@triton.jit
def has_tiles(tile):
    """Whether a collective on ``tile`` has work: always for a tile; for a :class:`TileRange`,
    whether it holds a tile. An empty range (more programs than tiles) must skip the collective's
    protocol: its lock record, ``first``'s, lies past the lock array. Per program."""
    if is_range(tile):
        return tile.first < tile.stop
    else:
        return True


@aggregate
class TensorView:
    """A 2-D tensor in memory: ``TensorView(ptr, M, N, stride_m, stride_n=1)``.

    ``ptr`` points at element ``(0, 0)``; strides are in elements. For the collectives, ``ptr``
    is an address on this rank's symmetric heap (the same allocation on every rank); the
    helpers below work on any pointer. Example::

        view = TensorView(x_ptr, M, N, stride_xm, stride_xn)
        tile = TileView(pid_m, pid_n, BLOCK_M, BLOCK_N)
        x = view.load(tile)                       # masked, 0 outside the tensor
        view.store(tile, x * 2)
    """

    ptr: tl.tensor
    M: _INDEX
    N: _INDEX
    stride_m: _INDEX
    stride_n: _INDEX

    @triton.constexpr_function
    def __init__(self, ptr, M, N, stride_m, stride_n=1):
        self.ptr = ptr
        self.M = _index(M)
        self.N = _index(N)
        self.stride_m = _index(stride_m)
        self.stride_n = _index(stride_n)

    @triton.jit
    def num_tiles_m(self, BLOCK_M: tl.constexpr):
        """Tiles along the rows: ``cdiv(M, BLOCK_M)``."""
        return (self.M + BLOCK_M - 1) // BLOCK_M

    @triton.jit
    def num_tiles_n(self, BLOCK_N: tl.constexpr):
        """Tiles along the columns: ``cdiv(N, BLOCK_N)``."""
        return (self.N + BLOCK_N - 1) // BLOCK_N

    @triton.jit
    def num_tiles(self, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """Tiles covering the tensor: ``cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N)``."""
        return ((self.M + BLOCK_M - 1) // BLOCK_M) * ((self.N + BLOCK_N - 1) // BLOCK_N)

    @triton.jit
    def frame(self, tile):
        """``(pointers, mask)`` of ``tile``: pointers to its elements and which of them lie inside
        the tensor, both ``[BLOCK_M, BLOCK_N]``. One call for both (what every access needs)."""
        rows = tile.pid_m * tile.BLOCK_M + tl.arange(0, tile.BLOCK_M).to(INDEX_TYPE)
        cols = tile.pid_n * tile.BLOCK_N + tl.arange(0, tile.BLOCK_N).to(INDEX_TYPE)
        pointers = self.ptr + (rows[:, None] * self.stride_m + cols[None, :] * self.stride_n)
        mask = (rows[:, None] < self.M) & (cols[None, :] < self.N)
        return pointers, mask

    @triton.jit
    def offsets(self, tile):
        """Element offsets of ``tile`` from ``ptr``, ``[BLOCK_M, BLOCK_N]``."""
        rows = tile.pid_m * tile.BLOCK_M + tl.arange(0, tile.BLOCK_M).to(INDEX_TYPE)
        cols = tile.pid_n * tile.BLOCK_N + tl.arange(0, tile.BLOCK_N).to(INDEX_TYPE)
        return rows[:, None] * self.stride_m + cols[None, :] * self.stride_n

    @triton.jit
    def pointers(self, tile):
        """Pointers to ``tile``'s elements, ``[BLOCK_M, BLOCK_N]`` (mask them with :meth:`mask`)."""
        return self.ptr + self.offsets(tile)

    @triton.jit
    def mask(self, tile):
        """``[BLOCK_M, BLOCK_N]`` booleans: which of ``tile``'s elements lie inside the tensor."""
        rows = tile.pid_m * tile.BLOCK_M + tl.arange(0, tile.BLOCK_M).to(INDEX_TYPE)
        cols = tile.pid_n * tile.BLOCK_N + tl.arange(0, tile.BLOCK_N).to(INDEX_TYPE)
        return (rows[:, None] < self.M) & (cols[None, :] < self.N)

    @triton.jit
    def load(self, tile, other=0):
        """Load ``tile`` from this rank's memory, ``other`` outside the tensor. Per element, weak."""
        pointers, mask = self.frame(tile)
        return tl.load(pointers, mask=mask, other=other)

    @triton.jit
    def store(self, tile, data):
        """Store ``data`` (``[BLOCK_M, BLOCK_N]``) at ``tile`` in this rank's memory, inside the
        tensor only. Per element, weak."""
        pointers, mask = self.frame(tile)
        tl.store(pointers, data, mask=mask)
