"""The host side of the variable-size exchanges: one workspace and two launches per shape.

An :class:`Exchange` holds what :mod:`._exchange_kernels` needs besides the caller's tensors: lock
records, the table peers read, the heap buffer the rows are staged into (and for a MoE dispatch
the route and the weights), each at the same heap offset on every rank (a workspace of the
per-context cache, :mod:`iris.collectives._workspace`, created collectively on the first call of a
shape), and the grid of its two launches, the same on every rank. Calls pass their own tensors
to :meth:`Exchange.publish` and then :meth:`Exchange.pull` or :meth:`Exchange.combine`, enqueued
on torch's current stream; nothing on the host depends on a count, so a CUDA graph of the calls
replays them with the counts of each replay.

The staging buffer is sized by ``stage_rows``, which must be the same on every rank (the heap's
allocations are), so the calls ask for a row count that is: ``inp``'s rows for ``all_to_all_v``,
``max_tokens`` for a dispatch, the capacity for a combine.
"""

from __future__ import annotations

import torch
import triton

from iris.runtime import IrisUsageError

from .._sync import LOCK_WORDS
from . import _launch
from ._config import Config
from ._exchange_kernels import STAGE_ROWS, STAGE_SEGMENTS, combine_kernel, publish_kernel, pull_kernel

#: Launch options of the combine: its weighted sum rounds each product and each sum, as the cpu
#: backend and torch do (no fused multiply-add): the same bits on every backend.
COMBINE_OPTIONS = {"enable_fp_fusion": False}
#: Row elements per column block at most (``Config.block`` overrides), and elements per block of rows.
GPU_BLOCK, CPU_BLOCK = 8192, 64
GPU_BLOCK_ELEMENTS, CPU_BLOCK_ELEMENTS = 16384, 512


class Settings:
    """Launch settings of an exchange (from ``ccl.Config``: ``block``, ``grid``, ``num_warps``)."""

    def __init__(self, block: int, rows: int, num_warps: int, grid: int):
        self.block, self.rows, self.num_warps, self.grid = block, rows, num_warps, grid

    def key(self) -> tuple:
        return self.block, self.rows, self.num_warps, self.grid


def settings(ctx, config, row: int, call: str) -> Settings:
    """The settings of a call moving rows of ``row`` elements: ``config`` (a ``ccl.Config``; only
    ``block``, ``grid`` and ``num_warps`` apply, and ``variant`` may be ``"pull"``), else rules:
    a row in one block of columns up to 8192 elements on the GPU (64 on the cpu backend), blocks of
    rows of about 16 K elements, 8 warps, a grid of twice the SMs (two programs on the cpu
    backend), cut to what may wait at once (``ctx.resident_grid``)."""
    if config is not None and not isinstance(config, Config):
        raise IrisUsageError(f"{call}: config={config!r} must be an iris.collectives.ccl.Config or None")
    config = config or Config()
    if config.variant not in (None, "pull"):
        raise IrisUsageError(f"{call}: config.variant={config.variant!r} is not one of ('pull',)")
    cuda = ctx.device.type == "cuda"
    block = config.block or min(triton.next_power_of_2(row), GPU_BLOCK if cuda else CPU_BLOCK)
    if isinstance(block, bool) or not isinstance(block, int) or block < 1 or block & (block - 1):
        raise IrisUsageError(f"{call}: config.block={block!r} must be a power of two (row elements per column block)")
    for name in ("grid", "num_warps"):
        value = getattr(config, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise IrisUsageError(f"{call}: config.{name}={value!r} must be a positive int")
    rows = max(1, min(64, (GPU_BLOCK_ELEMENTS if cuda else CPU_BLOCK_ELEMENTS) // block))
    grid = config.grid or (2 * ctx.get_cu_count() if cuda else 2)
    return Settings(block, triton.next_power_of_2(rows) if rows & (rows - 1) else rows,
                    config.num_warps or (8 if cuda else 4), grid)


class Exchange:
    """One exchange's workspace and launches (see the module docstring).

    ``name``: the workspace's name; ``call``: the public call's name (errors, watchdog reports);
    ``dtype``, ``row``: the rows' dtype and elements; ``stage_rows``: the rows the staging buffer
    holds; ``groups``: groups per rank (local experts; 1 for ``all_to_all_v``); ``flat``: entries
    of the route and weight buffers (MoE dispatch; 0: none); ``weight_dtype`` theirs; ``kind``:
    ``"pull"`` or ``"combine"``, the second launch."""

    def __init__(self, ctx, name: str, call: str, dtype: torch.dtype, row: int, stage_rows: int, groups: int,
                 cfg: Settings, kind: str = "pull", flat: int = 0, weight_dtype: torch.dtype | None = None):
        self.ctx, self.call, self.kind, self.groups, self.row, self.cfg = ctx, call, kind, groups, row, cfg
        W = ctx.world_size
        key = (name, dtype, row, stage_rows, W, groups, kind, flat, weight_dtype, cfg.key())

        def make(ctx):
            buffers = {"locks": ctx.zeros((1 + 2 * cfg.grid) * LOCK_WORDS, dtype=torch.int32),
                       "table": ctx.zeros(2 * W * groups, dtype=torch.int32),
                       "stage": ctx.zeros(max(1, stage_rows) * row, dtype=dtype)}
            if flat:
                buffers["route"] = ctx.zeros(flat, dtype=torch.int32)
                buffers["weights"] = ctx.zeros(flat, dtype=weight_dtype)
            if kind == "combine":  # each program's copy of the peers' tables: this rank's memory
                buffers["scratch"] = torch.zeros(cfg.grid * W * groups, dtype=torch.int32, device=ctx.device)
            return buffers

        self.ws = _launch.workspace(ctx, key, make)
        b = self.ws.buffers
        self.locks, self.table, self.stage = b["locks"], b["table"], b["stage"]
        self.route, self.weights, self.scratch = b.get("route"), b.get("weights"), b.get("scratch")
        self.context = ctx.get_device_context()
        self._publish = self._second = None
        self.programs = self.ws.meta.get("programs")

    def _launches(self, publish_args, publish_constexprs, second_args, second_constexprs):
        """The two launches, built on the first call; the grid is agreed with the peers on the
        workspace's first call (collective: every rank makes it at the same point)."""
        kernel = pull_kernel if self.kind == "pull" else combine_kernel
        options = dict(num_warps=self.cfg.num_warps)
        first = dict(publish_constexprs, **options)
        second = dict(second_constexprs, **options)
        if self.kind == "combine":
            second.update(COMBINE_OPTIONS)
        if self.programs is None:
            if self.ctx.device.type == "cuda":
                rank = self.ctx.rank
                one = publish_kernel.warmup(*publish_args, 1, rank, grid=(1,), **first)
                two = kernel.warmup(*second_args, 1, rank, grid=(1,), **second)
                programs = min(self.ctx.resident_grid(self.cfg.grid, one), self.ctx.resident_grid(self.cfg.grid, two))
            else:
                programs = self.ctx.resident_grid(self.cfg.grid)
            self.programs = self.ws.meta["programs"] = programs
        return (_launch.TritonLaunch(publish_kernel, self.programs, first),
                _launch.TritonLaunch(kernel, self.programs, second))

    def publish_args(self, src, n_rows, counts, offsets, peer_stride, group_stride, route=None, weights=None,
                     n_flat=0) -> tuple:
        """The publish launch's run-time arguments (the grid comes last, from :meth:`run`)."""
        return (self.context, src, self.stage, n_rows, counts, offsets, peer_stride, group_stride, self.table, route,
                None if route is None else self.route, weights, None if weights is None else self.weights, n_flat,
                self.locks)

    def run(self, publish_args, publish_constexprs, second_args, second_constexprs) -> None:
        """Enqueue both launches on torch's current stream (each launch's arguments without the grid
        and this rank, the last run-time arguments of both kernels: the rank is one, not a
        compile-time constant, so that every rank runs the same compiled kernels)."""
        if self._publish is None:
            self._publish, self._second = self._launches(publish_args, publish_constexprs, second_args,
                                                         second_constexprs)
        self._publish(*publish_args, self.programs, self.ctx.rank)
        self._second(*second_args, self.programs, self.ctx.rank)

    def publish_constexprs(self, stage: int, prefix: bool, check_rows: bool = False) -> dict:
        """The publish launch's compile-time arguments."""
        return dict(world_size=self.ctx.world_size, GROUPS=self.groups, ROW=self.row,
                    BLOCK_R=self.cfg.rows, BLOCK=self.cfg.block, STAGE=stage, PREFIX=prefix, CHECK_ROWS=check_rows,
                    CALL=self.call)


def pull_constexprs(ex: Exchange, topk: int, padded: bool, write_layout: bool = True) -> dict:
    """The pull launch's compile-time arguments."""
    return dict(world_size=ex.ctx.world_size, GROUPS=ex.groups, TOPK=topk, ROW=ex.row,
                BLOCK_R=ex.cfg.rows, BLOCK=ex.cfg.block, PADDED=padded, WRITE_LAYOUT=write_layout, CALL=ex.call)


def combine_constexprs(ex: Exchange, topk: int, reduce: bool, padded: bool) -> dict:
    """The combine launch's compile-time arguments."""
    return dict(world_size=ex.ctx.world_size, GROUPS=ex.groups, TOPK=topk, ROW=ex.row,
                BLOCK=ex.cfg.block, REDUCE=reduce, PADDED=padded, CALL=ex.call)


__all__ = ["COMBINE_OPTIONS", "STAGE_ROWS", "STAGE_SEGMENTS", "Exchange", "Settings", "combine_constexprs",
           "pull_constexprs", "settings"]
