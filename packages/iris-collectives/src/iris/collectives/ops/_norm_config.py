"""How :func:`iris.collectives.ops.all_reduce_residual_rmsnorm` runs: its strategies and the rule
that picks one, which ``config=ops.Config(...)`` overrides field by field.

The op is an all-reduce with an epilogue: its communication is the host all-reduce's, whose
strategy for each message size, dtype, world size and ranks per GPU is measured and committed in
``ccl._table`` (a JSON file per card). So the rule is data, that table's, plus two facts about rows:

- ``variant``: the one the all-reduce's table picks for the same message (this rank's ``partial``
  in bytes): ``one_shot`` (every rank reads every rank's rows; the fewest steps),
  ``one_shot_buffered`` (the same through a staging buffer in two halves: one flag round trip per
  call instead of two) or ``two_shot`` (each rank reduces and normalises a share of the rows and
  writes them to every rank: the least traffic). Two-shot shares rows, so with fewer rows than
  ranks it takes ``one_shot_buffered`` instead. One rank: ``one_shot`` (no communication).
- ``block_m``: rows per tile. Two-shot: the world size rounded up to a power of two (one row per
  rank and tile: its share is a whole row; with a world size that is not a power of two the
  shares are ragged, masked). One-shot: one row on the GPU (as many programs as rows), 4 under the
  interpreter (which runs every program in turn: fewer, larger tiles).
- ``num_warps``: one warp per 1024 elements that a program reduces at once (its share of a tile),
  4 to 16.
- ``grid``: programs per rank, at most what is resident (``ctx.resident_grid``) and the tiles.

The other fields of :class:`~iris.collectives.ops.Config` belong to the GEMM ops; setting one here
is an error.
"""

from __future__ import annotations

import dataclasses

from iris.runtime import IrisUsageError

from .. import ccl
from ._config import Config

#: Strategies of the op (``Config.variant``).
VARIANTS = ("one_shot", "one_shot_buffered", "two_shot")
#: The fields of ``ops.Config`` the op takes; the others are the GEMM's.
FIELDS = ("variant", "block_m", "num_warps", "grid")


def _pow2(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0 and value & (value - 1) == 0


def _next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def choose(call: str, rows: int, width: int, nbytes: int, dtype: str, world_size: int, backend: str,
           ranks_per_gpu: int, config) -> Config:
    """The complete config of one call: ``config``'s fields where set, the rule's (module doc)
    elsewhere. ``rows`` and ``width``: the activations' rows and ``triton.next_power_of_2`` of their
    hidden size; ``nbytes``: this rank's ``partial`` in bytes; ``dtype``: its torch name without
    ``torch.``. Raises :class:`IrisUsageError` naming ``call`` for a bad config."""
    if config is not None and not isinstance(config, Config):
        raise IrisUsageError(f"{call}: config={config!r} must be an iris.collectives.ops.Config or None")
    given = {k: v for k, v in dataclasses.asdict(config or Config()).items() if v is not None}
    foreign = sorted(set(given) - set(FIELDS))
    if foreign:
        raise IrisUsageError(f"{call}: config sets {', '.join(f'{k}={given[k]!r}' for k in foreign)}, which apply to "
                             f"the GEMM ops only; this op takes {', '.join(FIELDS)}")
    variant = given.get("variant")
    if variant is None:
        if world_size == 1:
            variant = "one_shot"
        else:
            variant = ccl.choose("all_reduce", nbytes, dtype, world_size, backend, ranks_per_gpu=ranks_per_gpu).variant
            if variant == "two_shot" and rows < world_size:
                variant = "one_shot_buffered"
    if variant not in VARIANTS:
        raise IrisUsageError(f"{call}: config.variant={variant!r} is not one of {VARIANTS}")
    block_m = given.get("block_m")
    if block_m is None:
        block_m = _next_pow2(world_size) if variant == "two_shot" else 1 if backend == "cuda" else 4
    if not _pow2(block_m):
        raise IrisUsageError(f"{call}: config.block_m={block_m!r} must be a power of two (rows per tile)")
    num_warps = given.get("num_warps")
    if num_warps is None:
        share = max(1, block_m // world_size) if variant == "two_shot" else block_m
        num_warps = min(16, max(4, _next_pow2(max(1, share * width // 1024))))
    if not _pow2(num_warps):
        raise IrisUsageError(f"{call}: config.num_warps={num_warps!r} must be a power of two")
    grid = given.get("grid")
    if grid is not None and (isinstance(grid, bool) or not isinstance(grid, int) or grid < 1):
        raise IrisUsageError(f"{call}: config.grid={grid!r} must be a positive int or None")
    return Config(variant=variant, block_m=block_m, num_warps=num_warps, grid=grid)
