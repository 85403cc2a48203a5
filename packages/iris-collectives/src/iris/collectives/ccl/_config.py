"""``Config``: what a caller of a host collective may force, and :func:`choose`, which fills in
the rest from the selection table (:mod:`iris.collectives.ccl._table`)."""

from __future__ import annotations

import dataclasses

from iris.runtime import IrisUsageError

from . import _table

#: Variants each collective accepts (``Config.variant``); the first is the default where the
#: table names none.
VARIANTS = {
    "all_reduce": ("one_shot", "two_shot", "one_shot_buffered"),
    "reduce_scatter": ("pull", "pull_buffered"),
    "all_gather": ("pull", "pull_buffered"),
    "all_to_all": ("pull", "pull_buffered"),
    "broadcast": ("pull", "pull_buffered"),
    "reduce": ("one_shot",),
    "gather": ("pull",),
    "scatter": ("pull",),
}


#: Message bytes from which a call registers plain tensors unless ``Config.register`` says
#: otherwise (the ``cuda`` backend only). The agreement costs host time on every call (16.4 us on
#: the host of one H200 with 2 ranks, against 2.3 without; 11.9 against 2.1 on a 2-core machine;
#: `benchmarks/ccl.py --host`), which back-to-back calls hide only behind a kernel that takes
#: longer: a 16 MiB all-reduce takes 25-55 us on one H200 at 2-4 ranks registered, and staging
#: costs it 1.5-2x that (benchmarks/results/ccl_*ranks_1gpu.md, columns ccl and reg); a 1 MiB
#: one, 8-14 us.
REGISTER_FROM = 16 << 20


@dataclasses.dataclass(frozen=True)
class Config:
    """Launch settings of a host collective; every field left ``None`` comes from the table.

    - ``variant``: the algorithm (see :data:`VARIANTS`): ``one_shot`` (every rank reads every
      rank's tile and reduces), ``two_shot`` (each rank reduces a share of each tile and writes
      it to every rank) or ``one_shot_buffered`` (one-shot from a staging buffer with two halves
      used by turns, which saves the wait for the peers to finish reading: one flag round trip
      per call instead of two) for ``all_reduce``; ``pull`` (each rank reads what it needs from
      the peers' heap) or ``pull_buffered`` (the same, through a staging buffer in two halves:
      one round trip) for the others; ``reduce`` has ``one_shot`` only, ``gather`` and ``scatter``
      ``pull`` only (point to point takes its settings from ``init_p2p``, not from a Config).
    - ``block``: elements per tile (a power of two); ``width``: columns per tile row (a power of
      two dividing ``block``; ``block // width`` rows per tile).
    - ``grid``: programs per rank (a persistent grid), at most the tiles and what is resident.
    - ``num_warps``: Triton's launch option.
    - ``chunk``: elements per round (a multiple of ``block``; of each rank's part for
      reduce_scatter, all_gather and all_to_all) when the call stages through the heap (a tensor
      not on the heap): the call runs in rounds whose staging buffers are reused, small enough to
      stay in L2. ``None``: one round.
    - ``heap_chunk``: the same for a call whose tensors the peers read in place (on the heap, or
      registered): rounds that keep the memory a call touches at once small, which with many
      ranks on one GPU can beat one pass over everything. ``None``: one round.
    - ``register``: whether the call registers plain tensors (not on the heap) on the fly, so that
      the peers read them where they are instead of staging them through the heap: ``True``
      always, ``False`` never, ``None`` on the ``cuda`` backend for messages of at least
      :data:`REGISTER_FROM` bytes, under MPI (under torchrun gloo's allgather takes milliseconds,
      more than staging costs: there only ``True`` registers). Each such call agrees with the
      peers on how every tensor is reached (one allgather of a few bytes on the host); the first
      call with a tensor registers it (CUDA IPC, milliseconds) and later calls with the same
      tensor find it cached (``ctx.reach``).
    """

    variant: str | None = None
    block: int | None = None
    width: int | None = None
    grid: int | None = None
    num_warps: int | None = None
    chunk: int | None = None
    heap_chunk: int | None = None
    register: bool | None = None


def _pow2(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0 and value & (value - 1) == 0


def _row_matches(row: dict, backend: str, collective: str, nbytes: int, dtype: str, world_size: int,
                 ranks_per_gpu: int) -> bool:
    return (row["backend"] == backend and row["collective"] in ("*", collective)
            and (row["max_bytes"] is None or nbytes <= row["max_bytes"]) and row["dtype"] in ("*", dtype)
            and row["world_size"] in (0, world_size) and row.get("ranks_per_gpu", 0) in (0, ranks_per_gpu))


def choose(collective: str, nbytes: int, dtype: str, world_size: int, backend: str,
           config: Config | None = None, table: list | None = None, ranks_per_gpu: int = 1) -> Config:
    """The complete :class:`Config` of one call: ``config``'s fields where set, else the first
    matching row of ``table`` (default: the selection table of ``backend``, :func:`table_source`), else the defaults.

    ``nbytes``: the per-rank message in bytes; ``dtype``: its torch name without ``torch.``
    (``"float32"``); ``ranks_per_gpu``: ranks sharing this rank's device (the context's
    ``ranks_on_device``; 1 is one rank per GPU), since what is fastest on ranks that share the SMs
    (under MPS) is not what is fastest over NVLink. Raises :class:`iris.runtime.IrisUsageError`
    naming the call for an unknown variant or a bad tiling."""
    where = f"iris.collectives.ccl.{collective}"
    if config is not None and not isinstance(config, Config):
        raise IrisUsageError(f"{where}: config={config!r} must be an iris.collectives.ccl.Config or None")
    fields = {"variant": None, "block": 1024, "width": 64, "grid": None, "num_warps": 4, "chunk": None,
              "heap_chunk": None, "register": None}
    for row in _table.rows(backend) if table is None else table:
        if _row_matches(row, backend, collective, nbytes, dtype, world_size, ranks_per_gpu):
            fields.update({k: v for k, v in row["config"].items() if v is not None})
            break
    if config is not None:
        fields.update({k: v for k, v in dataclasses.asdict(config).items() if v is not None})
    if fields["variant"] is None:
        fields["variant"] = VARIANTS[collective][0]
    chosen = Config(**fields)
    if chosen.variant not in VARIANTS[collective]:
        raise IrisUsageError(f"{where}: config.variant={chosen.variant!r} is not one of {VARIANTS[collective]}")
    if not _pow2(chosen.block):
        raise IrisUsageError(f"{where}: config.block={chosen.block!r} must be a power of two (elements per tile)")
    if not _pow2(chosen.width) or chosen.width > chosen.block:
        raise IrisUsageError(f"{where}: config.width={chosen.width!r} must be a power of two <= config.block="
                             f"{chosen.block} (columns per tile row)")
    for name in ("grid", "num_warps", "chunk", "heap_chunk"):
        value = getattr(chosen, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise IrisUsageError(f"{where}: config.{name}={value!r} must be a positive int")
    if chosen.register not in (None, True, False):
        raise IrisUsageError(f"{where}: config.register={chosen.register!r} must be True, False or None (automatic)")
    for name in ("chunk", "heap_chunk"):
        value = getattr(chosen, name)
        if value is not None and value % chosen.block:
            raise IrisUsageError(f"{where}: config.{name}={value} must be a multiple of config.block={chosen.block} "
                                 f"(whole tiles per round)")
    return chosen
