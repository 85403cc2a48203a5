"""``all_gather_matmul``: ``out = all_gather(a_shard, dim 0) @ b + bias``.

Two strategies share the staging and the GEMM; ``arrival`` is described at its kernel. Strategy
``pull``: each rank stages its ``[M / W, K]`` shard on the symmetric heap (a copy on the
stream, before the kernel), then every program computes output tiles of the full ``[M, N]``
result, loading the rows of A straight from the rank that holds them (through translated
pointers, ``iris.device.translate``), starting with the tiles of this rank's own shard (which it
reads from ``a_shard`` itself, with no wait). Two :func:`iris.collectives.device_barrier` per
program and call bound the peers' reads: at entry (every rank's shard is staged for this call) and
at exit (no peer reads this rank's staging any more, so the next call may overwrite it). A tile
whose rows straddle two shards (``M / W`` not a multiple of ``BLOCK_M``) accumulates each shard's
rows separately; the other rows add exact zeros.

On the GPU, when ``M / W`` is a multiple of ``BLOCK_M`` (every tile in one shard), both
strategies load A and B through tensor descriptors (TMA), as the GEMM core does: a descriptor of
the tile's shard, local or a peer's staging through a translated pointer. Otherwise, and under the
interpreter, they take the pointer path above.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from iris.device import round_to, translate
from iris.device._calls import call_check, call_enter
from iris.runtime import IrisUsageError

from .. import _host
from .._agree import agree_fused
from .._compiling import is_compiling, traced
from .._context import RuntimeRankContext
from .._sync import BARRIER_WORDS_C, device_barrier, next_epoch, pause, signal_all, wait_at_least
from .._workspace import workspace
from ..ccl._groups import on_group
from ._checks import check_inputs, check_matrix
from ._config import choose
from ._gemm import (
    TMA_B_COLUMNS,
    accumulator_of,
    add_bias,
    b_descriptor,
    dot_k,
    dot_k_tma,
    grouped_tile,
    row_major_descriptor,
    tile_cols,
    tile_rows,
)
from ._launch import TMA_OFF, b_operand, launch
from ._unfused import unfused_gather

CALL = "iris.collectives.ops.all_gather_matmul"
CALL_C: tl.constexpr = tl.constexpr(CALL)
#: Polls of every waiting peer's flag before ``_next_arrived`` falls back to a bounded wait.
SPIN_POLLS: tl.constexpr = tl.constexpr(64)


@triton.jit
def _dot_tile(ctx, acc, a_shard, staged, row0, rows, M_LOCAL, stride_am, stride_ak, K, b, cols, N, stride_bk, stride_bn,
              BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, WAIT: tl.constexpr = False, flags=None, epoch=0,
              ready=0):
    """``acc + A[rows] @ B`` with A's rows read from the shards they lie in, in one K loop: each
    row through its owner's staging (this rank's too, where the host copied ``a_shard`` before the
    launch), a translated pointer per row, weak loads; rows past the last shard add exact zeros.
    The caller acquired the peers' shards (entry barrier), or, with ``WAIT``, this function waits
    for each peer ``p`` whose shard the tile touches, unless bit ``p`` of ``ready`` is set, until
    its ``ENTER`` count at ``flags + p`` reaches ``epoch`` (acquire, system scope). One rank reads
    ``a_shard`` (no staging copy). Per program.

    One K loop whatever the world size or the raggedness: a loop per rank, unrolled, made an
    8-rank kernel's compilation take minutes, and loops under run-time branches lost the software
    pipeline of the K loop or held one per branch in shared memory."""
    if ctx.world_size == 1:
        acc = dot_k(acc, a_shard, rows, rows < M_LOCAL, stride_am, stride_ak, b, cols, N, K, stride_bk, stride_bn,
                    BLOCK_K, PRECISION)
    else:
        holds = rows < M_LOCAL * ctx.world_size
        owner = tl.where(holds, rows // M_LOCAL, ctx.rank)
        local = tl.where(holds, rows - owner * M_LOCAL, 0)
        if WAIT:
            last = tl.minimum((row0 + rows.shape[0] - 1) // M_LOCAL, ctx.world_size - 1)
            for p in range(row0 // M_LOCAL, last + 1):
                if (p != ctx.rank) & (((ready >> p) & 1) == 0):
                    wait_at_least(flags + p, epoch, CALL_C, "entered", ctx.rank, p, -1, ctx.heap_bases)
        # each row's staging, translated to its owner (a block of peers: one translation, and the
        # K loop's software pipeline stays, which a select between translated pointers lost)
        shard_of_row = translate(staged + tl.zeros_like(owner), ctx.rank, owner, ctx.heap_bases)
        acc = dot_k(acc, shard_of_row[:, None], local, holds, K, 1, b, cols, N, K, stride_bk, stride_bn, BLOCK_K,
                    PRECISION)
    return acc


@triton.jit
def _shard_descriptor(ctx, p, a_shard, staged, M_LOCAL, stride_am, K, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """Tensor descriptor of rank ``p``'s ``M_LOCAL x K`` shard: ``a_shard`` itself for this rank,
    else the peer's staging through a translated pointer (TMA reads peer memory as it reads local
    memory: over NVLink, or the same GPU under MPS). The caller has acquired the peer's shard.
    Per program, no memory access but the descriptor's own."""
    if p == ctx.rank:
        base = a_shard
        row_stride = stride_am
    else:
        base = translate(staged, ctx.rank, p, ctx.heap_bases)
        row_stride = K
    return row_major_descriptor(base, M_LOCAL, K, row_stride, BLOCK_M, BLOCK_K)


@triton.jit(do_not_specialize=["call_fp", "rank"])
def _all_gather_matmul_kernel(context, a_shard, staged, b, bias, out, flags, M, N, K, M_LOCAL, stride_am, stride_ak,
                              stride_bk, stride_bn, stride_om, stride_on, call_fp, rank, world_size: tl.constexpr,
                              HAS_BIAS: tl.constexpr, USE_TMA: tl.constexpr, PRECISION: tl.constexpr,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                              GROUP_M: tl.constexpr):
    """Persistent: program ``p`` computes tiles ``p, p + P, ...`` of ``out`` (grouped order,
    rotated so that each rank starts with the rows of its own shard). ``staged``: this rank's
    shard on the heap, ``M_LOCAL x K`` contiguous. ``flags``: two barrier slots per program.
    ``USE_TMA`` (the host asks only when ``M_LOCAL`` is a multiple of ``BLOCK_M``, so that every
    tile lies in one shard): A and B through tensor descriptors, one of the tile's shard per
    tile."""
    ctx = RuntimeRankContext.initialize(context, rank, world_size)
    entered = call_enter(ctx.heap_bases, call_fp, rank, world_size)
    pid = tl.program_id(0)
    entry = flags + (2 * pid) * BARRIER_WORDS_C
    if world_size > 1:
        device_barrier(ctx, entry)
    tiles_m = (M + BLOCK_M - 1) // BLOCK_M
    tiles_n = (N + BLOCK_N - 1) // BLOCK_N
    own_first = (rank * M_LOCAL) // BLOCK_M
    if USE_TMA:
        b_desc = b_descriptor(b, K, N, stride_bk, stride_bn, USE_TMA, BLOCK_N, BLOCK_K)
    for t in range(pid, tiles_m * tiles_n, tl.num_programs(0)):
        pid_m, pid_n = grouped_tile(t, tiles_m, tiles_n, GROUP_M)
        pid_m = (pid_m + own_first) % tiles_m
        rows = tile_rows(pid_m, BLOCK_M)
        cols = tile_cols(pid_n, BLOCK_N)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=accumulator_of(a_shard.dtype.element_ty))
        if USE_TMA:
            p = (pid_m * BLOCK_M) // M_LOCAL
            a_desc = _shard_descriptor(ctx, p, a_shard, staged, M_LOCAL, stride_am, K, BLOCK_M, BLOCK_K)
            acc = dot_k_tma(acc, a_desc, pid_m * BLOCK_M - p * M_LOCAL, b_desc, pid_n * BLOCK_N, K, BLOCK_K,
                            PRECISION, B_COLUMNS=USE_TMA == TMA_B_COLUMNS)
        else:
            acc = _dot_tile(ctx, acc, a_shard, staged, pid_m * BLOCK_M, rows, M_LOCAL, stride_am, stride_ak, K, b, cols,
                            N, stride_bk, stride_bn, BLOCK_K, PRECISION)
        acc = add_bias(acc, bias, cols, N, HAS_BIAS)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        tl.store(out + rows[:, None] * stride_om + cols[None, :] * stride_on, round_to(acc, out.dtype.element_ty),
                 mask=mask)
    if world_size > 1:
        device_barrier(ctx, entry + BARRIER_WORDS_C)
    call_check(ctx.heap_bases, call_fp, entered, rank, world_size)


@triton.jit
def _next_arrived(flags, epoch, done, rank, world_size: tl.constexpr):
    """The next peer whose shard to consume: the first (from ``rank + 1`` on) not yet in the bit
    mask ``done`` whose ``ENTER`` count at ``flags + peer`` has reached ``epoch``. Polls (one
    acquire atomic at system scope per peer and round, the same value in every thread) up to
    ``SPIN_POLLS`` rounds, then returns the first peer not done anyway, for the caller's bounded
    :func:`wait_at_least`. Per program, scalars."""
    # The peers' numbers are plain names, not ``x: tl.constexpr = ...``: the loops unroll, and
    # Triton's compiler refuses a second constexpr assignment to the same name (the interpreter
    # does not, and two ranks unroll once: only four ranks on the GPU showed it).
    choice = -1
    first = -1
    for i in tl.static_range(1, world_size):
        peer = (rank + i) % world_size
        if (first < 0) & (((done >> peer) & 1) == 0):
            first = peer
    polls = 0
    while (choice < 0) & (polls < SPIN_POLLS):
        for i in tl.static_range(1, world_size):
            q = (rank + i) % world_size
            if (choice < 0) & (((done >> q) & 1) == 0):
                # An atomic, not poll(): Triton runs it in one thread and hands every thread the
                # same value, so the whole program picks the same peer (per-thread acquire loads
                # could see the flag at different times and split the program between peers).
                if tl.atomic_add(flags + q, 0, sem="acquire", scope="sys") >= epoch:
                    choice = q
        if choice < 0:
            pause(polls)
        polls += 1
    return tl.where(choice < 0, first, choice)


@triton.jit
def _rows_of_rank(p, M_LOCAL, BLOCK_M: tl.constexpr):
    """The tile rows ``[start, end)`` whose first row lies in rank ``p``'s shard."""
    return (p * M_LOCAL + BLOCK_M - 1) // BLOCK_M, ((p + 1) * M_LOCAL + BLOCK_M - 1) // BLOCK_M


@triton.jit(do_not_specialize=["call_fp", "rank"])
def _arrival_kernel(context, a_shard, staged, b, bias, out, flags, M, N, K, M_LOCAL, stride_am, stride_ak, stride_bk,
                    stride_bn, stride_om, stride_on, call_fp, rank, world_size: tl.constexpr,
                    HAS_BIAS: tl.constexpr, USE_TMA: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """Strategy ``arrival``: consume the shards in the order they arrive, own shard first.

    ``flags`` (int32, on the heap, zeroed once): words ``[0, W)`` count each rank's entries into
    the op (``ENTER``: its shard is staged), word ``W`` counts peers' programs done reading this
    rank's shard (``DONE``), words ``W + 1 + pid`` are each program's call counter. Program 0
    announces this rank's shard to every peer. Every program computes its share of the tiles
    whose rows start in its own shard, then, peer by peer as their ``ENTER`` arrives, its share of
    theirs; a tile whose rows run into a further shard also waits for that one. At the end every
    program tells every peer it is done reading; the last program waits until every peer's
    programs are, so that the kernel's end means no peer reads this rank's staging any more (the
    next call's copy may overwrite it). Each program publishes before it waits for anything, so
    the interpreter, which runs programs in turn, cannot deadlock. ``USE_TMA``: as in the pull
    kernel (every tile in one shard), one descriptor of A per shard."""
    ctx = RuntimeRankContext.initialize(context, rank, world_size)
    entered = call_enter(ctx.heap_bases, call_fp, rank, world_size)
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    tiles_n = (N + BLOCK_N - 1) // BLOCK_N
    epoch = next_epoch(flags + world_size + 1 + pid)
    if world_size > 1:
        if pid == 0:
            signal_all(flags + rank, rank, world_size, ctx.heap_bases)
    if USE_TMA:
        b_desc = b_descriptor(b, K, N, stride_bk, stride_bn, USE_TMA, BLOCK_N, BLOCK_K)
    done = rank * 0  # a bit per rank whose shard this program has consumed (an int32 the loop carries)
    # A run-time loop (one body, whatever the world size), as in _dot_tile
    for phase in range(world_size):
        if phase == 0:
            p = rank
        else:
            p = _next_arrived(flags, epoch, done, rank, world_size)
            wait_at_least(flags + p, epoch, CALL_C, "entered", rank, p, -1, ctx.heap_bases)
        done = done | (1 << p)
        start, end = _rows_of_rank(p, M_LOCAL, BLOCK_M)
        if USE_TMA:
            a_desc = _shard_descriptor(ctx, p, a_shard, staged, M_LOCAL, stride_am, K, BLOCK_M, BLOCK_K)
        for j in range(pid, (end - start) * tiles_n, programs):
            pid_m, pid_n = grouped_tile(j, end - start, tiles_n, GROUP_M)
            pid_m = pid_m + start
            rows = tile_rows(pid_m, BLOCK_M)
            cols = tile_cols(pid_n, BLOCK_N)
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=accumulator_of(a_shard.dtype.element_ty))
            if USE_TMA:
                acc = dot_k_tma(acc, a_desc, pid_m * BLOCK_M - p * M_LOCAL, b_desc, pid_n * BLOCK_N, K, BLOCK_K,
                                PRECISION, B_COLUMNS=USE_TMA == TMA_B_COLUMNS)
            else:
                acc = _dot_tile(ctx, acc, a_shard, staged, pid_m * BLOCK_M, rows, M_LOCAL, stride_am, stride_ak, K, b,
                                cols, N, stride_bk, stride_bn, BLOCK_K, PRECISION, True, flags, epoch, done)
            acc = add_bias(acc, bias, cols, N, HAS_BIAS)
            mask = (rows[:, None] < M) & (cols[None, :] < N)
            tl.store(out + rows[:, None] * stride_om + cols[None, :] * stride_on,
                     round_to(acc, out.dtype.element_ty), mask=mask)
    if world_size > 1:
        signal_all(flags + world_size, rank, world_size, ctx.heap_bases)
        if pid == programs - 1:
            wait_at_least(flags + world_size, epoch * (world_size - 1) * programs, CALL_C, "done reading", rank, -1,
                          -1, ctx.heap_bases)
    call_check(ctx.heap_bases, call_fp, entered, rank, world_size)


def _keeping(cfg, config, gathered: torch.Tensor, a_shard: torch.Tensor, shape: tuple, ctx):
    """``cfg`` with strategy ``unfused``, the one that gathers A whole, after checking ``gathered``;
    refused where the caller named another strategy."""
    check_matrix(CALL, "gathered", gathered, shape)
    if gathered.dtype != a_shard.dtype:
        raise IrisUsageError(f"{CALL}: gathered is {gathered.dtype} but a_shard is {a_shard.dtype}; pass gathered "
                             f"in a_shard's dtype")
    if not gathered.is_contiguous() or gathered.device != ctx.device:
        raise IrisUsageError(f"{CALL}: gathered must be a contiguous tensor on {ctx.device}, got strides "
                             f"{tuple(gathered.stride())} on {gathered.device}; pass torch.empty({shape[0]}, "
                             f"{shape[1]}, dtype={a_shard.dtype}, device={str(ctx.device)!r})")
    named = getattr(config, "variant", None)
    if named not in (None, "unfused"):
        raise IrisUsageError(f"{CALL}: gathered= needs strategy 'unfused' (the fused strategies never hold the "
                             f"whole A), but config.variant={named!r}; drop variant, or drop gathered and gather "
                             f"A yourself")
    return dataclasses.replace(cfg, variant="unfused")


def all_gather_matmul(ctx, out: torch.Tensor, a_shard: torch.Tensor, b: torch.Tensor,
                      bias: torch.Tensor | None = None, config=None, group=None,
                      gathered: torch.Tensor | None = None) -> torch.Tensor:
    """``out = all_gather(a_shard, dim 0) @ b + bias`` on every rank; returns ``out``.

    ``a_shard`` is this rank's ``[M / W, K]`` block of rows of A (rank order), ``b`` ``[K, N]``
    (the same on every rank, or each rank's own column block: only this rank's ``b`` is read),
    ``out`` ``[M, N]``, ``bias`` an optional ``[N]``. fp32 accumulation, one rounding to
    ``out.dtype``. The shard is copied to a cached heap buffer each call (peers read it there).
    Collective; enqueued on torch's current stream; no barrier between calls.
    ``group``: an :class:`iris.runtime.Group` of the context to run among its members only (``W``
    and ranks are the group's); None: every rank.
    ``gathered``: a contiguous ``[M, K]`` tensor of ``a_shard``'s dtype on the context's device that
    receives ``all_gather(a_shard)`` too (what a weight's gradient multiplies, kept from the
    forward as torch's ``fused_all_gather_matmul`` keeps it). Only strategy ``unfused`` holds the
    whole A, so it copies it into ``gathered`` (a local copy, no communication); a call that passes
    ``gathered`` and names no strategy gets it, and one that names a fused strategy is refused.
    """
    if group is not None:
        ctx = on_group(ctx, group, CALL)
    if is_compiling():
        if gathered is not None:
            return traced().fused_gathered(ctx, out, gathered, a_shard, b, bias, config=config)
        return traced().fused("all_gather_matmul", ctx, out, a_shard, b, bias, config=config)
    check_inputs(CALL, ctx, out, a_shard, b, bias)
    m_local, N, K = a_shard.shape[0], b.shape[1], a_shard.shape[1]
    M = m_local * ctx.world_size
    check_matrix(CALL, "out", out, (M, N))
    cfg = choose("all_gather_matmul", M, N, K, ctx.world_size, ctx.device.type, config, a_shard.element_size())
    if gathered is not None:
        cfg = _keeping(cfg, config, gathered, a_shard, (M, K), ctx)
    fp = agree_fused(ctx, CALL, (M, N, K, a_shard.dtype, out.dtype, bias is not None and bias.dtype, cfg),
                     (("out", out), ("a_shard", a_shard), ("b", b), ("bias", bias)), config=config, chosen=cfg)
    if cfg.variant == "unfused":
        unfused_gather(ctx, ("all_gather_matmul", M, N, K, a_shard.dtype, out.dtype, ctx.world_size, cfg), out,
                       a_shard, b, bias, gather_first=True, gathered=gathered)
        return out
    # Bias or not is in the key (every rank passes the same): the arrival strategy's counters
    # assume the same grid on every call of a workspace, and each compiled variant has its own.
    key = ("all_gather_matmul", M, N, K, a_shard.dtype, out.dtype, ctx.world_size, cfg, bias is not None)
    num_tiles = _host.num_tiles(M, N, cfg.block_m, cfg.block_n)

    arrival = cfg.variant == "arrival"

    def make(ctx):
        # pull: two barrier slots per program; arrival: ENTER per rank, DONE, a counter per program
        # (the grid is at most one program per tile either way)
        words = ctx.world_size + 1 + num_tiles if arrival else _host.barrier_words(2 * num_tiles)
        return {"staged": ctx.zeros(m_local, K, dtype=a_shard.dtype), "flags": ctx.zeros(words, dtype=torch.int32)}

    ws = workspace(ctx, key, make)
    staged = ws.buffers["staged"]
    if ctx.world_size > 1:
        staged.copy_(a_shard)  # stream-ordered before the kernel; the last call's readers are done
    # Descriptors only when every tile lies in one shard (a tile across two would need two
    # descriptors and a row offset below zero in one of them).
    b, use_tma = b_operand(cfg, b, a_shard, staged)
    use_tma = use_tma if m_local % cfg.block_m == 0 else TMA_OFF
    args = (ctx.get_device_context(), a_shard, staged, b, bias if bias is not None else b, out, ws.buffers["flags"],
            M, N, K, m_local, a_shard.stride(0), a_shard.stride(1), b.stride(0), b.stride(1), out.stride(0),
            out.stride(1), fp, ctx.rank)
    constexprs = dict(world_size=ctx.world_size, HAS_BIAS=bias is not None, USE_TMA=use_tma,
                      PRECISION=cfg.input_precision, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                      GROUP_M=cfg.group_m)
    launch(ctx, ws, _arrival_kernel if arrival else _all_gather_matmul_kernel, num_tiles, cfg, args, constexprs)
    return out
