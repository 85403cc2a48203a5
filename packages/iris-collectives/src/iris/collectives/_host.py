"""Host-side arithmetic for callers of the collectives: tile counts, lock array sizes, owners.

Plain Python (no torch): the same rules the device code applies, for sizing buffers and for
checking results.
"""

from __future__ import annotations

from ._errors import IrisUsageError
from ._sync import BARRIER_WORDS, LOCK_WORDS


def _positive(call: str, **values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise IrisUsageError(f"{call}: {name}={value!r} must be a positive int")


def num_tiles(M: int, N: int, BLOCK_M: int, BLOCK_N: int) -> int:
    """Tiles of ``BLOCK_M x BLOCK_N`` covering an ``M x N`` tensor (ragged edges count)."""
    _positive(f"num_tiles({M}, {N}, {BLOCK_M}, {BLOCK_N})", M=M, N=N, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    return -(-M // BLOCK_M) * -(-N // BLOCK_N)


def lock_words(M: int, N: int, BLOCK_M: int, BLOCK_N: int) -> int:
    """Length (int32 words) of the ``locks`` array of a lock-using collective over an ``M x N``
    tensor in ``BLOCK_M x BLOCK_N`` tiles: ``LOCK_WORDS`` per tile.

    Allocate it once, zeroed, on the symmetric heap, one array per collective and tiling:
    ``locks = iris.zeros(lock_words(M, N, BM, BN), dtype=torch.int32)``.
    """
    _positive(f"lock_words({M}, {N}, {BLOCK_M}, {BLOCK_N})", M=M, N=N, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    return num_tiles(M, N, BLOCK_M, BLOCK_N) * LOCK_WORDS


def barrier_words(slots: int) -> int:
    """Length (int32 words) of a :func:`device_barrier` flag array with ``slots`` slots."""
    _positive(f"barrier_words({slots})", slots=slots)
    return slots * BARRIER_WORDS


def two_shot_rows(tile_id: int, BLOCK_M: int, world_size: int, rank: int) -> range:
    """The rows (0 .. ``BLOCK_M - 1`` within the tile) of tile ``tile_id`` that ``rank`` reduces
    in ``all_reduce_two_shot``: share ``(rank + tile_id) % world_size`` of ``world_size``
    contiguous shares of ``ceil(BLOCK_M / world_size)`` rows (the rule the kernel follows)."""
    _positive(f"two_shot_rows({tile_id}, {BLOCK_M}, {world_size}, {rank})", BLOCK_M=BLOCK_M, world_size=world_size)
    if not 0 <= rank < world_size:
        raise IrisUsageError(f"two_shot_rows(..., world_size={world_size}, rank={rank}): rank must be in "
                             f"[0, {world_size})")
    per_share = -(-BLOCK_M // world_size)
    share = (rank + tile_id) % world_size
    return range(min(share * per_share, BLOCK_M), min((share + 1) * per_share, BLOCK_M))


def reduce_scatter_tiles(rank: int, num_tiles: int, world_size: int) -> range:
    """The row-major tile ids whose sum ``reduce_scatter`` leaves on ``rank``."""
    start = -(-rank * num_tiles // world_size)
    end = -(-(rank + 1) * num_tiles // world_size)
    return range(start, end)
