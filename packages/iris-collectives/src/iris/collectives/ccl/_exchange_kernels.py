"""The device side of the variable-size exchanges: ``ccl.all_to_all_v`` and the MoE dispatch and combine.

Counts live on the device only. An exchange is two launches on the same stream, so that no program
ever waits for another program of its own rank (the interpreter runs them in turn; a GPU need not
hold them all at once):

- :func:`publish_kernel`, on every rank: its *table* (per destination rank and group, how many
  rows it sends and where they start in its rows) and its rows (staged into a heap buffer:
  peers read them there), then "ready" to every peer;
- :func:`pull_kernel` (rows grouped on the receiver) or :func:`combine_kernel` (rows summed back
  per token), on every rank: waits until every peer's programs have published, reads the peers'
  tables, computes where each row goes, copies the rows, then "done reading" to every peer.

The flags are the tile collectives' (``iris.collectives._sync``): int32 counters that only grow,
in lock records of ``LOCK_WORDS`` words. Record 0 holds the two counters the peers add to:
``ARRIVE`` (each program of each peer's publish adds 1 per call) and ``DONE`` (each program of
each peer's pull adds 1 per call, once it has read what this rank published). Record ``1 + 2p``
holds the ``EPOCH`` (calls so far) of publish program ``p``, record ``2 + 2p`` that of pull program
``p``; both launches have the same grid ``P`` on every rank. So the ``e``-th pull waits for
``ARRIVE >= e * (W - 1) * P``; the ``e``-th publish first waits for ``DONE >= (e - 1) * (W - 1) * P``
(the peers have read the previous call's rows before they are overwritten); nothing waits at the
end of a call. The counts are exact: a peer cannot publish call ``e + 1`` before every pull of
call ``e`` on every rank has signalled, so no signal of a later call is counted early.

Tables: ``table[0, d, g]`` counts the rows this rank sends to rank ``d`` for group ``g`` (a local
expert of ``d``; one group for ``all_to_all_v``), ``table[1, d, g]`` where they start in the
staged rows. A receiver lays the rows out group by group, and within a group by source rank
(``PADDED``: group ``g`` starts at row ``g * expert_capacity``, its unused rows zeroed; else
right after group ``g - 1``). Rows that do not fit are not written: the receiver's host call says
so (the cpu backend raises), and on the GPU program 0 reports it to the watchdog, which ends the
job (see ``iris.device._watchdog.STATE_CAPACITY``).

``rank`` is a run-time argument of every kernel here, not specialised on (``do_not_specialize``),
after ``programs``: the ranks of a job share one compiled kernel instead of compiling one each
(compile time is most of what a GPU test suite spends). ``world_size`` stays compile-time.
"""

# No "from __future__ import annotations": Triton resolves jit globals by name at compile time.
import triton
import triton.language as tl

from iris.device import INTERPRETER, load, round_to
from iris.device._watchdog import WATCHDOG, watchdog_report_capacity

from .._context import RuntimeRankContext
from .._sync import ARRIVE, DONE, EPOCH, LOCK_WORDS_C, advance, signal_all, wait_at_least

#: Names the waits and reports of the exchanges carry (entries of iris.device._watchdog.WAIT_CALLS).
ALL_TO_ALL_V_CALL: tl.constexpr = tl.constexpr("iris.collectives.ccl.all_to_all_v")
DISPATCH_CALL: tl.constexpr = tl.constexpr("iris.collectives.moe.dispatch")
COMBINE_CALL: tl.constexpr = tl.constexpr("iris.collectives.moe.combine")
EXCHANGE_CALLS = (ALL_TO_ALL_V_CALL.value, DISPATCH_CALL.value, COMBINE_CALL.value)

#: ``STAGE`` of :func:`publish_kernel`: the rows ``[0, n_rows)`` of ``src`` (tokens, looked up through
#: the route), or only the rows of the table's segments.
STAGE_ROWS: tl.constexpr = tl.constexpr(0)
STAGE_SEGMENTS: tl.constexpr = tl.constexpr(1)


@triton.constexpr_function
def _pow2(n):
    return tl.constexpr(triton.next_power_of_2(n))


@triton.constexpr_function
def _accumulator(dtype):
    # fp64 rows sum in fp64, every other float in fp32
    return tl.float64 if dtype == tl.float64 else tl.float32


@triton.jit
def _records(locks, BASE: tl.constexpr):
    # This program's lock record among the launch's (BASE 1: publish, 2: pull) and its call count.
    record = locks + (BASE + 2 * tl.program_id(0)) * LOCK_WORDS_C
    return record, advance(record + EPOCH, 1) + 1


@triton.jit
def _gather(vec, index, lanes):
    # vec[index] for a small vector vec ([L]) and a block of indices ([R]): [R]. Lanes are ``lanes``.
    return tl.sum(tl.where(lanes[None, :] == index[:, None], vec[None, :], 0), axis=1)


@triton.jit
def _find(starts, value, valid):
    # For non-decreasing starts ([L]), the last lane whose start is <= value ([R] values): [R].
    return tl.sum(((starts[None, :] <= value[:, None]) & valid[None, :]).to(tl.int32), axis=1) - 1


@triton.jit(do_not_specialize=["n_rows", "n_flat", "programs", "rank"])
def publish_kernel(context, src, stage, n_rows, counts, offsets, peer_stride, group_stride, table, route, route_stage,
                   weights, weight_stage, n_flat, locks, programs, rank, world_size: tl.constexpr,
                   GROUPS: tl.constexpr, ROW: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK: tl.constexpr,
                   STAGE: tl.constexpr, PREFIX: tl.constexpr, CHECK_ROWS: tl.constexpr, CALL: tl.constexpr):
    """Publish this rank's side of an exchange: its table, its rows, then "ready" to every peer.

    ``counts[d * peer_stride + g * group_stride]``: rows for rank ``d``, group ``g`` (negative counts
    as 0); ``offsets`` (same indexing) where they start in ``src``, or with ``PREFIX`` the running
    sum of the counts (segments one after another in ``(d, g)`` order). ``src``: rows of ``ROW``
    elements; ``STAGE_ROWS`` stages rows ``[0, n_rows)`` into ``stage``, ``STAGE_SEGMENTS`` the
    segments' rows (those below ``n_rows``). With a ``route`` (MoE dispatch), the first ``n_flat``
    entries of ``route`` (the dispatch order: ``token * top_k + slot`` ids) go to ``route_stage`` (int32)
    and of ``weights`` (the top-k weights, flat) to ``weight_stage``. ``programs``: the grid of
    the exchange's launches (the same for both, on every rank). ``CHECK_ROWS``: on the GPU,
    program 0 reports counts that add up to more than ``n_rows`` (or a negative count) to the
    watchdog.

    Granularity: per program; program 0 writes the table, every program a share of the rows (blocks
    of ``BLOCK_R`` rows, ``BLOCK`` columns at a time). Memory semantics: before writing, an acquire
    wait (system scope) until every peer has read the previous call's rows; after, a CTA barrier and
    a release at system scope on every peer's ``ARRIVE`` counter (``signal_all``).
    """
    ctx = RuntimeRankContext.initialize(context, rank, world_size)
    p = tl.program_id(0)
    P = tl.num_programs(0)
    record, epoch = _records(locks, 1)
    if world_size > 1:
        if epoch > 1:  # the peers have read what this rank published last time
            wait_at_least(locks + DONE, (epoch - 1) * (world_size - 1) * programs, CALL, "done reading", rank, -1, p,
                          ctx.heap_bases, record + EPOCH)
    SEG: tl.constexpr = world_size * GROUPS
    lanes = tl.arange(0, _pow2(SEG))
    valid = lanes < SEG
    where = (lanes // GROUPS) * peer_stride + (lanes % GROUPS) * group_stride
    asked = tl.load(counts + where, mask=valid, other=0).to(tl.int32)
    cnt = tl.maximum(asked, 0)
    if PREFIX:
        off = tl.cumsum(cnt, 0) - cnt
    else:
        off = tl.load(offsets + where, mask=valid, other=0).to(tl.int32)
    if p == 0:
        tl.store(table + lanes, cnt, mask=valid)
        tl.store(table + SEG + lanes, off, mask=valid)
        if CHECK_ROWS:  # the rows asked for must be there (under the interpreter the host call checks)
            if not INTERPRETER:
                total = tl.sum(asked, 0)
                if (total > n_rows) | (tl.min(asked, 0) < 0):
                    _report_capacity(ctx.heap_bases, CALL, "inp rows", 0, total, n_rows)
    rows = tl.arange(0, BLOCK_R)
    if STAGE == STAGE_ROWS:
        for b in range(p, tl.cdiv(n_rows, BLOCK_R), P):
            r = b * BLOCK_R + rows
            _copy_rows(src, stage, r, r, r < n_rows, ROW, BLOCK)
    else:
        for s in range(SEG):  # segment s's block b goes to program (b + s) % P: small segments spread
            seg_cnt = tl.sum(tl.where(lanes == s, cnt, 0))
            seg_off = tl.sum(tl.where(lanes == s, off, 0))
            for b in range((p + P - s % P) % P, tl.cdiv(seg_cnt, BLOCK_R), P):
                r = seg_off + b * BLOCK_R + rows
                _copy_rows(src, stage, r, r, (b * BLOCK_R + rows < seg_cnt) & (r < n_rows), ROW, BLOCK)
    if route is not None:
        FLAT: tl.constexpr = BLOCK_R * BLOCK if BLOCK_R * BLOCK < 4096 else 4096
        for b in range(p, tl.cdiv(n_flat, FLAT), P):
            f = b * FLAT + tl.arange(0, FLAT)
            m = f < n_flat
            tl.store(route_stage + f, tl.load(route + f, mask=m).to(tl.int32), mask=m)
            if weights is not None:
                w = tl.load(weights + f, mask=m)
                tl.store(weight_stage + f, w.to(weight_stage.dtype.element_ty), mask=m)
    if world_size > 1:
        signal_all(locks + ARRIVE, rank, world_size, ctx.heap_bases)


@triton.jit
def _copy_rows(src, dst, src_rows, dst_rows, mask, ROW: tl.constexpr, BLOCK: tl.constexpr):
    # Rows src_rows of src into rows dst_rows of dst ([R] each, this rank's memory), where mask.
    a = src_rows.to(tl.int64)[:, None] * ROW
    z = dst_rows.to(tl.int64)[:, None] * ROW
    for h in range(0, ROW, BLOCK):
        cols = h + tl.arange(0, BLOCK)[None, :]
        m = mask[:, None] & (cols < ROW)
        tl.store(dst + z + cols, tl.load(src + a + cols, mask=m), mask=m)


@triton.jit
def _wait_for_publishers(ctx, locks, programs, CALL: tl.constexpr):
    # A pull's start: this program's call count, after every peer's publish of that call.
    record, epoch = _records(locks, 2)
    if ctx.world_size > 1:
        wait_at_least(locks + ARRIVE, epoch * (ctx.world_size - 1) * programs, CALL, "ready", ctx.rank, -1,
                      tl.program_id(0), ctx.heap_bases, record + EPOCH)


@triton.jit(do_not_specialize=["n_src_rows", "capacity", "expert_capacity", "programs", "rank"])
def pull_kernel(context, out, stage, n_src_rows, table, route_stage, weight_stage, row_weights, recv_counts,
                recv_offsets, group_counts, group_offsets, capacity, expert_capacity, locks, programs, rank,
                world_size: tl.constexpr, GROUPS: tl.constexpr, TOPK: tl.constexpr,
                ROW: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK: tl.constexpr, PADDED: tl.constexpr,
                WRITE_LAYOUT: tl.constexpr, CALL: tl.constexpr):
    """Receive this rank's rows of an exchange into ``out``, grouped by group, then by source rank.

    Reads every peer's table (what :func:`publish_kernel` wrote), lays out the rows (see the module
    docstring; ``capacity`` rows in all, or with ``PADDED`` ``expert_capacity`` rows per group) and
    copies them from the peers' ``stage``. With a ``route_stage`` (MoE dispatch) a sent row is
    token ``route // TOPK`` of the sender's staged tokens (``n_src_rows`` of them), and with
    ``row_weights`` its weight goes beside it (0 in padding rows). ``WRITE_LAYOUT``: program 0 writes
    ``recv_counts[g, s]`` (rows from rank ``s`` for group ``g``), ``recv_offsets[g, s]`` (where they
    start in ``out``), ``group_counts[g]`` and ``group_offsets[g]`` (``[GROUPS + 1]``: starts, then
    the end), each when not None, and reports rows that do not fit (GPU, watchdog).

    Granularity: per program: blocks of ``BLOCK_R`` rows of one source rank, program ``p`` taking
    blocks ``p, p + P, ...`` of all of them. Memory semantics: an acquire wait (system scope) for
    every peer's "ready", weak remote loads (``iris.device.load``), then a CTA barrier and a release
    at system scope on every peer's ``DONE`` counter.
    """
    ctx = RuntimeRankContext.initialize(context, rank, world_size)
    p = tl.program_id(0)
    P = tl.num_programs(0)
    _wait_for_publishers(ctx, locks, programs, CALL)
    SEG: tl.constexpr = world_size * GROUPS
    GP: tl.constexpr = _pow2(GROUPS)
    WP: tl.constexpr = _pow2(world_size)
    glanes = tl.arange(0, GP)
    wlanes = tl.arange(0, WP)
    gvalid = glanes < GROUPS
    wvalid = wlanes < world_size
    # every peer's counts and offsets for this rank: [group, source]
    cnt = tl.zeros([GP, WP], tl.int32)
    off = tl.zeros([GP, WP], tl.int32)
    for peer in tl.static_range(world_size):
        mine = table + rank * GROUPS + glanes
        peer_cnt = load(mine, rank, peer, ctx.heap_bases, mask=gvalid, other=0)
        peer_off = load(mine + SEG, rank, peer, ctx.heap_bases, mask=gvalid, other=0)
        cnt = tl.where(wlanes[None, :] == peer, peer_cnt[:, None], cnt)
        off = tl.where(wlanes[None, :] == peer, peer_off[:, None], off)
    per_group = tl.sum(cnt, axis=1)  # [GP]
    if PADDED:
        base = glanes * expert_capacity
    else:
        base = tl.cumsum(per_group, 0) - per_group
    start = base[:, None] + tl.cumsum(cnt, axis=1) - cnt  # where rows (g, s) start in out
    if WRITE_LAYOUT:
        if p == 0:
            _write_layout(recv_counts, recv_offsets, group_counts, group_offsets, cnt, start, per_group, base,
                          capacity, expert_capacity, ctx.heap_bases, GROUPS, world_size, PADDED, CALL)
    # blocks of rows per source: source q sends sum_g cnt[g, q] rows, in its order (group by group)
    from_q = tl.sum(cnt, axis=0)  # [WP]
    blocks = tl.cdiv(from_q, BLOCK_R)
    first_block = tl.cumsum(blocks, 0) - blocks
    rows = tl.arange(0, BLOCK_R)
    for b in range(p, tl.sum(blocks), P):
        # the source of block b: the last whose first block is <= b (one with no blocks shares its
        # first block with the next source, which then wins)
        q = tl.sum(((first_block <= b) & wvalid).to(tl.int32), 0) - 1
        r = (b - tl.sum(tl.where(wlanes == q, first_block, 0))) * BLOCK_R + rows  # within q's rows
        in_range = r < tl.sum(tl.where(wlanes == q, from_q, 0))
        q_cnt = tl.sum(tl.where(wlanes[None, :] == q, cnt, 0), axis=1)  # [GP]: q's rows per group
        q_off = tl.sum(tl.where(wlanes[None, :] == q, off, 0), axis=1)
        q_start = tl.sum(tl.where(wlanes[None, :] == q, start, 0), axis=1)
        q_first = tl.cumsum(q_cnt, 0) - q_cnt  # where group g begins among q's rows
        g = _find(q_first, r, gvalid)
        within = r - _gather(q_first, g, glanes)
        dest = _gather(q_start, g, glanes) + within
        sent = _gather(q_off, g, glanes) + within  # the row's place in q's staged order
        if PADDED:
            fits = dest - g * expert_capacity < expert_capacity
        else:
            fits = dest < capacity
        mask = in_range & fits
        if TOPK > 0:  # routed: the sender's row is a token, through its route
            flat = load(route_stage + sent, rank, q, ctx.heap_bases, mask=mask, other=0)
            token = flat // TOPK
            if row_weights is not None:
                w = load(weight_stage + flat, rank, q, ctx.heap_bases, mask=mask, other=0)
                tl.store(row_weights + dest, w, mask=mask)
        else:
            token = sent
        mask = mask & (token < n_src_rows)
        _pull_rows(stage, out, token, dest, mask, rank, q, ctx.heap_bases, ROW, BLOCK)
    if PADDED:
        # the unused rows of every group: zeros (a batched GEMM over them then adds nothing)
        for b in range(p, tl.cdiv(GROUPS * expert_capacity, BLOCK_R), P):
            padding = b * BLOCK_R + rows
            g = padding // expert_capacity
            pad = (padding < GROUPS * expert_capacity) & \
                (padding - g * expert_capacity >= _gather(per_group, g, glanes))
            _zero_rows(out, padding, pad, ROW, BLOCK_R, BLOCK)
            if row_weights is not None:
                tl.store(row_weights + padding, tl.zeros([BLOCK_R], row_weights.dtype.element_ty), mask=pad)
    if world_size > 1:
        signal_all(locks + DONE, rank, world_size, ctx.heap_bases)


@triton.jit
def _write_layout(recv_counts, recv_offsets, group_counts, group_offsets, cnt, start, per_group, base, capacity,
                  expert_capacity, heap_bases, GROUPS: tl.constexpr, world_size: tl.constexpr, PADDED: tl.constexpr,
                  CALL: tl.constexpr):
    # Program 0 of a pull: the layout it computed, and on the GPU the report of rows that do not fit
    # (under the interpreter the host call checks the layout after the launch and raises).
    glanes = tl.arange(0, _pow2(GROUPS))
    wlanes = tl.arange(0, _pow2(world_size))
    gvalid = glanes < GROUPS
    both = gvalid[:, None] & (wlanes < world_size)[None, :]
    where = glanes[:, None] * world_size + wlanes[None, :]
    if recv_counts is not None:
        tl.store(recv_counts + where, cnt.to(recv_counts.dtype.element_ty), mask=both)
    if recv_offsets is not None:
        tl.store(recv_offsets + where, start.to(recv_offsets.dtype.element_ty), mask=both)
    if group_counts is not None:
        tl.store(group_counts + glanes, per_group.to(group_counts.dtype.element_ty), mask=gvalid)
    if PADDED:
        end = GROUPS * expert_capacity
    else:
        end = tl.sum(per_group, 0)
    if group_offsets is not None:
        tl.store(group_offsets + glanes, base.to(group_offsets.dtype.element_ty), mask=gvalid)
        tl.store(group_offsets + GROUPS, end.to(group_offsets.dtype.element_ty))
    if not INTERPRETER:
        if PADDED:
            over = gvalid & (per_group > expert_capacity)
            if tl.sum(over.to(tl.int32), 0) > 0:
                g = tl.min(tl.where(over, glanes, GROUPS), 0)
                _report_capacity(heap_bases, CALL, "expert rows", g, tl.sum(tl.where(glanes == g, per_group, 0), 0),
                                 expert_capacity)
        elif end > capacity:
            _report_capacity(heap_bases, CALL, "out rows", 0, end, capacity)


@triton.jit
def _report_capacity(heap_bases, CALL: tl.constexpr, what: tl.constexpr, index, rows, room):
    # GPU only: the watchdog's report (the runtime prints it and ends the job), or a printed line
    # where the watchdog is compiled out (IRIS_TIMEOUT_S=0).
    if WATCHDOG:
        watchdog_report_capacity(heap_bases, CALL, what, index, rows, room)
    else:
        tl.device_print("iris: rows do not fit (see iris.device._watchdog.capacity_text): what index rows room = ",
                        index, rows, room)


@triton.jit
def _pull_rows(stage, out, src_rows, dst_rows, mask, rank, peer, heap_bases, ROW: tl.constexpr, BLOCK: tl.constexpr):
    # Rows src_rows of peer's stage into rows dst_rows of this rank's out ([R] each), where mask.
    a = src_rows.to(tl.int64)[:, None] * ROW
    z = dst_rows.to(tl.int64)[:, None] * ROW
    for h in range(0, ROW, BLOCK):
        cols = h + tl.arange(0, BLOCK)[None, :]
        m = mask[:, None] & (cols < ROW)
        tl.store(out + z + cols, load(stage + a + cols, rank, peer, heap_bases, mask=m), mask=m)


@triton.jit
def _zero_rows(out, rows, mask, ROW: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK: tl.constexpr):
    # Zeros into rows ([BLOCK_R]) of this rank's out, where mask.
    z = rows.to(tl.int64)[:, None] * ROW
    for h in range(0, ROW, BLOCK):
        cols = h + tl.arange(0, BLOCK)[None, :]
        m = mask[:, None] & (cols < ROW)
        tl.store(out + z + cols, tl.zeros([BLOCK_R, BLOCK], out.dtype.element_ty), mask=m)


@triton.jit(do_not_specialize=["n_tokens", "capacity", "expert_capacity", "programs", "rank"])
def combine_kernel(context, out, stage, table, topk_idx, weights, slots, send_offsets, scratch, n_tokens, capacity,
                   expert_capacity, locks, programs, rank, world_size: tl.constexpr,
                   GROUPS: tl.constexpr, TOPK: tl.constexpr, ROW: tl.constexpr, BLOCK: tl.constexpr,
                   REDUCE: tl.constexpr, PADDED: tl.constexpr, CALL: tl.constexpr):
    """Bring every token's ``TOPK`` rows back from the ranks that hold them (the reverse of a MoE
    dispatch) and, with ``REDUCE``, sum them: ``out[t] = sum over k = 0, 1, ... of weights[t, k] *
    row(t, k)`` (without ``weights``: the plain sum), accumulated in fp32 (fp64 for fp64 rows) in
    that order and rounded once (``round_to``: the same bits on every backend; launched without
    fused multiply-adds). Without ``REDUCE``: ``out[t, k] = row(t, k)``.

    ``topk_idx[t, k]``: the expert (global id; outside ``[0, world_size * GROUPS)``: none, which adds
    nothing, or a zero row); ``slots[t, k]``: the place of ``(t, k)`` in this rank's dispatch order;
    ``send_offsets[e]``: where expert ``e``'s rows start in it; the peers' tables (published by
    :func:`publish_kernel` from their dispatch layout) say where they keep this rank's rows of each
    local expert. A row that had no room there (``capacity``; ``PADDED``: ``expert_capacity`` per
    expert) counts as none. ``scratch``: ``programs * world_size * GROUPS`` int32 of this rank's
    memory (each program's copy of the peers' tables).

    Granularity: per program: tokens ``p, p + P, ...``, ``BLOCK`` columns at a time, the ``TOPK``
    rows of a token loaded side by side. Memory semantics: as :func:`pull_kernel`.
    """
    ctx = RuntimeRankContext.initialize(context, rank, world_size)
    p = tl.program_id(0)
    P = tl.num_programs(0)
    _wait_for_publishers(ctx, locks, programs, CALL)
    SEG: tl.constexpr = world_size * GROUPS
    glanes = tl.arange(0, _pow2(GROUPS))
    gvalid = glanes < GROUPS
    # where each peer keeps this rank's rows, per local expert: own[q * GROUPS + g] (a copy per
    # program, read back per row: the lookups then cost a local load, not a remote one)
    own = scratch + p * SEG
    for peer in tl.static_range(world_size):
        where = load(table + SEG + rank * GROUPS + glanes, rank, peer, ctx.heap_bases, mask=gvalid, other=0)
        tl.store(own + peer * GROUPS + glanes, where, mask=gvalid)
    tl.debug_barrier()
    ACC: tl.constexpr = _accumulator(stage.dtype.element_ty)
    for t in range(p, n_tokens, P):
        for h in range(0, ROW, BLOCK):
            cols = h + tl.arange(0, BLOCK)
            in_row = cols < ROW
            acc = tl.zeros([BLOCK], ACC)
            for k in tl.static_range(TOPK):
                e = tl.load(topk_idx + t * TOPK + k).to(tl.int32)
                used = (e >= 0) & (e < SEG)
                e = tl.where(used, e, 0)
                q = e // GROUPS
                pos = tl.load(own + e) + tl.load(slots + t * TOPK + k) - tl.load(send_offsets + e).to(tl.int32)
                if PADDED:
                    used = used & (pos - (e - q * GROUPS) * expert_capacity < expert_capacity)
                else:
                    used = used & (pos < capacity)
                # a block of the scalar condition (Triton 3.9's interpreter refuses a scalar bool & a block)
                take = (used.to(tl.int32) + cols * 0) != 0
                row = load(stage + pos.to(tl.int64) * ROW + cols, rank, q, ctx.heap_bases, mask=in_row & take, other=0)
                if REDUCE:
                    if weights is not None:
                        w = tl.load(weights + t * TOPK + k).to(ACC)
                        acc = acc + tl.where(take, w * row.to(ACC), 0)
                    else:
                        acc = acc + tl.where(take, row.to(ACC), 0)
                else:
                    tl.store(out + tl.cast(t * TOPK + k, tl.int64) * ROW + cols, row, mask=in_row)
            if REDUCE:
                tl.store(out + tl.cast(t, tl.int64) * ROW + cols, round_to(acc, out.dtype.element_ty), mask=in_row)
    if world_size > 1:
        signal_all(locks + DONE, rank, world_size, ctx.heap_bases)
