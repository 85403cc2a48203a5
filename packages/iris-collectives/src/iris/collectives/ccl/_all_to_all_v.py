"""``all_to_all_v``: an all-to-all whose split sizes only the device knows."""

from __future__ import annotations

import torch

from iris.device._watchdog import capacity_text
from iris.runtime import IrisUsageError, UnsupportedDtypeError

from .._agree import agree, rows_of
from .._compiling import is_compiling, traced
from .._errors import IrisCapacityError
from . import _checks, _launch, _ranks
from ._exchange import STAGE_SEGMENTS, Exchange, pull_constexprs, settings
from ._groups import on_group

CALL = "iris.collectives.ccl.all_to_all_v"
#: dtypes of split tensors.
SPLIT_DTYPES = (torch.int32, torch.int64)


def _fingerprint(t) -> tuple | None:
    if t is None:
        return None
    return t.data_ptr(), t.shape, t.dtype, t.is_contiguous()


def all_to_all_v(ctx, out: torch.Tensor, inp: torch.Tensor, in_splits: torch.Tensor, out_splits: torch.Tensor,
                 out_offsets: torch.Tensor | None = None, config=None, group=None) -> torch.Tensor:
    """Rows ``in_splits[0]`` first of ``inp`` to rank 0, the next ``in_splits[1]`` to rank 1, ...;
    every rank receives into ``out`` the rows each rank sent it, in rank order, and writes how many
    into ``out_splits`` (and where they start into ``out_offsets``); returns ``out``.

    Like ``torch.distributed.all_to_all_single`` with split sizes, or torch's symmetric-memory
    ``all_to_all_vdev``, with the splits on the device: ``in_splits`` is an int32 or int64 tensor
    of ``W`` counts (rows along dim 0) on the context's device, and the counts are exchanged by
    the kernel, so no call waits for the host, and a CUDA graph of it replays with the splits of
    each replay. ``inp`` and ``out`` have the same dtype and the same shape past dim 0; ``inp``'s
    rows are a capacity (``inp.shape[0]`` the same on every rank; ``in_splits`` add up to at most
    that), ``out.shape[0]`` is this rank's capacity (rows past the received ones are not written).
    ``out_splits`` and ``out_offsets`` (optional): ``W`` int32 or int64 each, written on the device.

    Rows that do not fit ``out``, or ``in_splits`` that add up to more than ``inp`` has (or hold a
    negative count): the call writes what fits and ``out_splits`` the counts that were sent; on the
    cpu backend the receiving (or sending) rank raises :class:`iris.collectives.IrisCapacityError`
    after the call; on the GPU the watchdog reports it and ends the job (a kernel cannot raise).
    Size ``out`` for the most rows a rank can receive.

    Collective; torch's current stream; no host synchronisation. ``config``: ``ccl.Config`` with
    ``block`` (row elements per column block), ``grid``, ``num_warps``. ``group``: an
    :class:`iris.runtime.Group` of the context to exchange among its members only (``W`` splits,
    in group rank order); None: every rank.
    """
    if group is not None:
        ctx = on_group(ctx, group, "iris.collectives.ccl.all_to_all_v")
    if is_compiling():
        return traced().all_to_all_v(ctx, out, inp, in_splits, out_splits, out_offsets, config=config)
    key = ("all_to_all_v", config, _fingerprint(out), _fingerprint(inp), _fingerprint(in_splits),
           _fingerprint(out_splits), _fingerprint(out_offsets))
    _launch.call(ctx, key, lambda: _plan(ctx, out, inp, in_splits, out_splits, out_offsets, config), out, inp,
                 in_splits, out_splits, out_offsets)
    return out


def _check_splits(ctx, name: str, t) -> None:
    W = _ranks.group_size(ctx)
    if not isinstance(t, torch.Tensor):
        raise IrisUsageError(f"{CALL}: {name} must be a torch.Tensor of {W} counts, got {type(t).__name__}")
    if t.dtype not in SPLIT_DTYPES or tuple(t.shape) != (W,) or t.device != ctx.device or not t.is_contiguous():
        raise UnsupportedDtypeError(f"{CALL}: {name} is a {t.dtype} tensor of shape {tuple(t.shape)} on {t.device}; "
                                    f"pass a contiguous int32 or int64 tensor of shape ({W},) (one count per rank) on "
                                    f"{ctx.device}")


def _row_elements(t: torch.Tensor) -> int:
    n = 1
    for d in t.shape[1:]:
        n *= d
    return n


def _plan(ctx, out, inp, in_splits, out_splits, out_offsets, config):
    """Check a call and build its launches; the plan is called with the call's tensors."""
    _checks.check_tensor(CALL, ctx, "inp", inp)
    _checks.check_tensor(CALL, ctx, "out", out)
    _checks.check_same_dtype(CALL, out, inp)
    _checks.check_disjoint(CALL, out, inp, same_allowed=False)
    if inp.dim() == 0 or out.dim() == 0 or out.shape[1:] != inp.shape[1:]:
        rest = "".join(f", {d}" for d in inp.shape[1:])
        raise IrisUsageError(f"{CALL}: out has shape {tuple(out.shape)} and inp {tuple(inp.shape)}; both need rows "
                             f"along dim 0 of the same shape (out of shape (capacity{rest}))")
    _check_splits(ctx, "in_splits", in_splits)
    _check_splits(ctx, "out_splits", out_splits)
    if out_offsets is not None:
        _check_splits(ctx, "out_offsets", out_offsets)
    row = _row_elements(inp)
    cfg = settings(ctx, config, row, CALL)
    # Agreed before the workspace (whose size follows inp) is allocated: inp's shape (a capacity the
    # same on every rank), out's rows past dim 0 (its own capacity may differ), the splits' dtypes.
    # The plans are per tensor address; a new address of a known signature exchanges nothing.
    agree(ctx, CALL, (("inp", inp),), out=rows_of(out, "capacity"), in_splits=rows_of(in_splits),
          out_splits=rows_of(out_splits), out_offsets=None if out_offsets is None else rows_of(out_offsets),
          config=config)
    ex = Exchange(ctx, "ccl.all_to_all_v", CALL, inp.dtype, row, inp.shape[0], 1, cfg)
    n, capacity = inp.shape[0], out.shape[0]
    publish_cx = ex.publish_constexprs(STAGE_SEGMENTS, prefix=True, check_rows=True)
    pull_cx = pull_constexprs(ex, topk=0, padded=False)
    interpreted = ctx.device.type != "cuda"

    def plan(out, inp, in_splits, out_splits, out_offsets):
        publish = ex.publish_args(inp, n, in_splits, in_splits, 1, 0)
        pull = (ex.context, out, ex.stage, n, ex.table, None, None, None, out_splits, out_offsets, None, None,
                capacity, 0, ex.locks)
        ex.run(publish, publish_cx, pull, pull_cx)
        if interpreted:  # the launches have run: what the GPU's kernels report, said here
            check_rows(ctx, CALL, in_splits, n, out_splits, capacity)

    return plan


def check_rows(ctx, call: str, in_splits, n: int, out_splits, capacity: int) -> None:
    """The cpu backend's side of the capacity reports (after the launches): raise
    :class:`IrisCapacityError` when this rank's ``in_splits`` ask for more rows than ``n`` (or
    hold a negative count), or its ``out_splits`` add up to more than ``capacity``."""
    if in_splits is not None:
        asked = [int(v) for v in in_splits.tolist()]
        if sum(asked) > n or min(asked) < 0:
            raise IrisCapacityError(capacity_text(call, ctx.rank, "inp rows", 0, sum(asked), n))
    rows = int(out_splits.sum())
    if rows > capacity:
        raise IrisCapacityError(capacity_text(call, ctx.rank, "out rows", 0, rows, capacity))
