"""The device side of the host collectives: one persistent kernel per collective family.

Every kernel flattens its tensors into :class:`FlatView` tiles of ``BLOCK_M x BLOCK_N``
elements, and each program takes the tiles ``program_id, program_id + num_programs, ...`` (the
same mapping on every rank) as one :class:`~iris.collectives.TileRange`: the tile collectives'
range form synchronises once per program and call ("ready", then "done") instead of once per
tile. A host call has all its data in place when it starts, so nothing is gained by a finer
handshake, and each one costs a flag round trip between processes: per tile, that was most of a
large call's time.

A tensor that is not on the symmetric heap is staged inside the kernel, before the program's
"ready": the program copies the part of its tiles that peers read into the heap staging buffer
(two-shot: only the other ranks' shares; its own share is reduced from the caller's tensor).
Results that peers write land in a heap buffer and are copied out after "done" (two-shot: only
the other ranks' shares; its own share is stored into ``out`` directly). No separate copy kernel.

The flags are the tile collectives' (``iris.collectives._sync``: lock records whose ``EPOCH``
counts calls, counters that only grow), so back-to-back calls need no barrier and a CUDA graph
replays them correctly.

Every kernel takes ``call_fp``, the fingerprint of its agreed call (``iris.runtime.Iris.agree_call``),
and runs the device side of the call agreement around its work (``iris.device._calls``): program 0
publishes the call on entry and compares every peer's call after its waits. ``call_fp`` is not
specialised on (any value, one compiled kernel).

``rank`` is a run-time argument too, not specialised on (``do_not_specialize``), and the kernels
build a :class:`~iris.collectives._context.RuntimeRankContext`: every rank of a job runs one
compiled kernel instead of one per rank. Compiling is most of what a GPU test suite spends (a
4-rank job compiled each of these kernels four times), and a host call's first use on a rank
then finds its kernel compiled by a peer. ``world_size`` stays a compile-time constant (loops
over the ranks unroll). Where a kernel branches on a peer being this rank, the branch is taken at
run time; loops that skip this rank start at the next one instead.
"""

# No "from __future__ import annotations": Triton resolves jit globals by name at compile time.
import triton
import triton.language as tl

from iris.device import DEBUG, load
from iris.device._calls import call_begin, call_check, call_enter, call_peek, call_publish, call_unpeeked, call_verify

from .._all_reduce import all_reduce_one_shot_op, all_reduce_two_shot_op, own_share_rows, reduce_range_in_rank_order
from .._context import RuntimeRankContext
from .._sync import ARRIVE, DONE, device_barrier, enter_range, signal_and_wait_all
from .._views import INDEX_TYPE, TileRange
from ._flat import FlatView

#: ``MODE`` of :func:`pull_kernel`: all_gather, all_to_all, broadcast, gather (to ``root``),
#: scatter (from ``root``).
GATHER: tl.constexpr = tl.constexpr(0)
ALL_TO_ALL: tl.constexpr = tl.constexpr(1)
BROADCAST: tl.constexpr = tl.constexpr(2)
GATHER_TO_ROOT: tl.constexpr = tl.constexpr(3)
SCATTER: tl.constexpr = tl.constexpr(4)

#: The name the one-shot kernels' waits report (an entry of iris.device._watchdog.WAIT_CALLS).
ONE_SHOT_CALL: tl.constexpr = tl.constexpr("iris.collectives.all_reduce_one_shot")
#: Names the pull kernel's waits report (see iris.device._watchdog.WAIT_CALLS).
PULL_CALLS = ("iris.collectives.ccl.all_gather", "iris.collectives.ccl.all_to_all", "iris.collectives.ccl.broadcast",
              "iris.collectives.ccl.gather", "iris.collectives.ccl.scatter")
#: The name the reduce kernel's waits report.
REDUCE_CALL: tl.constexpr = tl.constexpr("iris.collectives.ccl.reduce")


@triton.constexpr_function
def _pull_call(MODE):
    return PULL_CALLS[MODE]


@triton.jit
def _program_tiles(n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # This program's tiles of a flat tensor of n elements, and its row count.
    rows = (n + BLOCK_N - 1) // BLOCK_N
    return TileRange(tl.program_id(0), (rows + BLOCK_M - 1) // BLOCK_M, tl.num_programs(0), 1, BLOCK_M, BLOCK_N), rows


@triton.jit
def _tile_offsets(t, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Element offsets of flat tile t, [BLOCK_M, BLOCK_N]. The kernels' own copies index the flat
    # tensors directly (no FlatView method calls: under the interpreter every nested jit call
    # costs milliseconds).
    within = tl.arange(0, BLOCK_M).to(INDEX_TYPE)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    return t * (BLOCK_M * BLOCK_N) + within


@triton.jit(do_not_specialize=["call_fp", "rank"])
def all_reduce_kernel(context, inp, src, dst, out, locks, src_bases, dst_bases, n, chunk, half, call_fp, rank,
                      world_size: tl.constexpr, OP: tl.constexpr, TWO_SHOT: tl.constexpr, STAGE_IN: tl.constexpr,
                      COPY_OUT: tl.constexpr, BUFFERED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``out = reduce(inp over ranks)``, ``n`` elements, through ``all_reduce_one_shot`` or
    ``all_reduce_two_shot`` on the program's range of tiles. ``src``: what peers read (``inp``
    itself when it is on the heap and not ``out``, else a heap staging buffer this kernel fills:
    ``STAGE_IN``). Two-shot writes into every rank's ``dst`` (``out`` on the heap, or a heap
    buffer whose peers' shares are copied to ``out`` after the call: ``COPY_OUT``). ``src_bases``
    and ``dst_bases`` translate ``src`` and ``dst`` to the peers: the heap's bases, or a
    registration's for a registered tensor (``iris.runtime.Registration``), read in place.

    The tensor is reduced in rounds of ``chunk`` elements (a multiple of the tile; ``n`` or more:
    one round), each a complete call of the collective on that part, whose staging buffers hold
    one round and are reused by the next: small enough, they stay in L2, and a tensor that is not
    on the heap costs little more memory traffic than one that is.

    ``BUFFERED`` (one-shot, ``STAGE_IN``): :func:`_buffered_one_shot_round`, whose staging buffer
    has two halves ``half`` elements apart."""
    ctx = RuntimeRankContext.initialize(context, rank, world_size)
    # The call check's entry (iris.device._calls): its loads now; the buffered round publishes the
    # fingerprint after its lock record's atomic and peeks at the peers' right after its wait, so
    # that neither round trip adds to the call. The tile ops' rounds publish at once and check last.
    pending = call_begin(ctx.heap_bases, rank, world_size)
    count, row, theirs = _call_started(ctx, pending, call_fp, BUFFERED)
    for base in range(0, n, chunk):
        # the heap buffers of this round: the staging buffers start over, the caller's tensors move on
        if STAGE_IN:
            round_src = src
        else:
            round_src = src + base
        if COPY_OUT:
            round_dst = dst
        else:
            round_dst = dst + base
        if BUFFERED:
            count, row, theirs = _buffered_one_shot_round(ctx, inp + base, src, out + base, locks,
                                                          tl.minimum(chunk, n - base), half, OP, pending, call_fp,
                                                          count, row, theirs, BLOCK_M, BLOCK_N)
        else:
            _all_reduce_round(ctx, inp + base, round_src, round_dst, out + base, locks, src_bases, dst_bases,
                              tl.minimum(chunk, n - base), OP, TWO_SHOT, STAGE_IN, COPY_OUT, BLOCK_M, BLOCK_N)
    _call_ended(ctx, call_fp, count, row, theirs, BUFFERED)


@triton.jit
def _call_started(ctx, pending, call_fp, DEFERRED: tl.constexpr):
    # The call's ticket (count, row) and the peers' words (not loaded yet). DEFERRED: the kernel's
    # own rounds publish the fingerprint (_publish_call) and peek (call_peek); else published now.
    count = tl.full([], 0, tl.int32)
    row = tl.full([], 0, tl.int64)
    if not DEFERRED:
        count, row = call_publish(ctx.heap_bases, pending, call_fp, ctx.rank, ctx.world_size)
    return count, row, call_unpeeked(ctx.world_size)


@triton.jit
def _publish_call(ctx, pending, call_fp, count, row):
    # Before a round's first signal: publish the fingerprint unless an earlier round has (program
    # 0's count is then the call's number; the other programs' stays 0 and publishes nothing).
    if count == 0:
        count, row = call_publish(ctx.heap_bases, pending, call_fp, ctx.rank, ctx.world_size)
    return count, row


@triton.jit
def _call_ended(ctx, call_fp, count, row, theirs, DEFERRED: tl.constexpr):
    # The call check's end: compare what a round peeked at (DEFERRED), else load and compare now.
    if DEFERRED:
        call_verify(ctx.heap_bases, call_fp, (count, row), theirs, ctx.rank, ctx.world_size)
    else:
        call_check(ctx.heap_bases, call_fp, (count, row), ctx.rank, ctx.world_size)


@triton.jit
def _buffered_one_shot_round(ctx, inp, src, out, locks, n, half, OP: tl.constexpr, pending, call_fp, count, row,
                             theirs, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # The one-shot all-reduce with one flag round trip: "ready" and no "done".
    #
    # The program stages its tiles into half (epoch % 2) of src, signals "ready", waits for every
    # peer's, and reduces. It does not wait until the peers have read its staging: the next write
    # to this half, two calls (or rounds) later, is safe without it. Peer q's program reads this
    # program's tiles of half h in call e, then, in program order or from a later kernel on its
    # stream, signals "ready" for call e + 1, which this program waits for in call e + 1, before it
    # writes half h again in call e + 2. That needs the same tiles in a program's range in every
    # call of the workspace (the host fixes the grid per workspace) and each rank's calls on one
    # stream, in order. The counters stay exact: a peer can be at most one call ahead (it waits
    # for this rank's "ready"), and one that is ahead has seen every other peer's "ready" of this
    # call, so the sum of the counters reaches epoch * (W - 1) only with every peer's.
    #
    # Debug mode keeps the "done" wait: the signatures in the lock record that peers compare
    # while they wait must hold until they have.
    tiles, rows = _program_tiles(n, BLOCK_M, BLOCK_N)
    o = FlatView(out, n, rows, BLOCK_N)
    slot, record, epoch, staged = _enter_buffered(tiles, o, locks, src, half, ONE_SHOT_CALL)
    for t in range(tiles.first, tiles.stop, tiles.step):
        offsets = _tile_offsets(t, BLOCK_M, BLOCK_N)
        mask = offsets < n
        tl.store(staged + offsets, tl.load(inp + offsets, mask=mask), mask=mask)
    return _buffered_reduce(ctx, tiles, FlatView(staged, n, rows, BLOCK_N), o, OP, FlatView(inp, n, rows, BLOCK_N),
                            slot, record, epoch, pending, call_fp, count, row, theirs)


@triton.jit
def _enter_buffered(tiles, view, locks, src, half, call: tl.constexpr):
    # Enter a buffered call on the program's range: its lock record's slot, the record, the call
    # count (epoch) and the half of the staging buffer src that the count's parity picks.
    slot, record, epoch = enter_range(tiles, view, locks, call)
    return slot, record, epoch, src + (epoch % 2) * half


@triton.jit
def _buffered_reduce(ctx, tiles, peers_read, out_view, OP: tl.constexpr, mine_view, slot, record, epoch, pending,
                     call_fp, count, row, theirs, src_bases=None):
    # The rest of a buffered one-shot call once this program has staged: the call's fingerprint,
    # "ready", a peek at the peers' fingerprints, the reduction, and in debug mode only the "done"
    # wait (see _buffered_one_shot_round). Returns the call check's (count, row, theirs).
    count, row = _publish_call(ctx, pending, call_fp, count, row)
    signal_and_wait_all(ctx, record, ARRIVE, epoch, ONE_SHOT_CALL, "ready", slot, record)
    theirs = call_peek((count, row), ctx.world_size)
    reduce_range_in_rank_order(ctx, tiles, peers_read, out_view, OP, mine_view, ONE_SHOT_CALL, src_bases)
    if DEBUG:
        signal_and_wait_all(ctx, record, DONE, epoch, ONE_SHOT_CALL, "done", slot)
    return count, row, theirs


@triton.jit
def _all_reduce_round(ctx, inp, src, dst, out, locks, src_bases, dst_bases, n, OP: tl.constexpr,
                      TWO_SHOT: tl.constexpr, STAGE_IN: tl.constexpr, COPY_OUT: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr):
    # One call's worth of all_reduce_kernel on n elements.
    tiles, rows = _program_tiles(n, BLOCK_M, BLOCK_N)
    if STAGE_IN:
        for t in range(tiles.first, tiles.stop, tiles.step):
            offsets = _tile_offsets(t, BLOCK_M, BLOCK_N)
            mask = offsets < n
            if TWO_SHOT:  # peers read only their own shares of this rank's tile
                mask = mask & (own_share_rows(t, BLOCK_M, ctx.rank, ctx.world_size) == 0)[:, None]
            tl.store(src + offsets, tl.load(inp + offsets, mask=mask), mask=mask)
    s = FlatView(src, n, rows, BLOCK_N)
    o = FlatView(out, n, rows, BLOCK_N)
    if TWO_SHOT:
        d = FlatView(dst, n, rows, BLOCK_N)
        if STAGE_IN:
            if COPY_OUT:
                all_reduce_two_shot_op(ctx, tiles, s, d, locks, OP, FlatView(inp, n, rows, BLOCK_N), o, src_bases,
                                       dst_bases)
            else:
                all_reduce_two_shot_op(ctx, tiles, s, d, locks, OP, FlatView(inp, n, rows, BLOCK_N), None, src_bases,
                                       dst_bases)
        elif COPY_OUT:
            all_reduce_two_shot_op(ctx, tiles, s, d, locks, OP, None, o, src_bases, dst_bases)
        else:
            all_reduce_two_shot_op(ctx, tiles, s, d, locks, OP, None, None, src_bases, dst_bases)
        if COPY_OUT:
            # "done" has returned: every peer's share of this program's tiles is in dst
            for t in range(tiles.first, tiles.stop, tiles.step):
                offsets = _tile_offsets(t, BLOCK_M, BLOCK_N)
                mask = (offsets < n) & (own_share_rows(t, BLOCK_M, ctx.rank, ctx.world_size) == 0)[:, None]
                tl.store(out + offsets, tl.load(dst + offsets, mask=mask), mask=mask)
    elif STAGE_IN:
        all_reduce_one_shot_op(ctx, tiles, s, o, locks, OP, FlatView(inp, n, rows, BLOCK_N), src_bases)
    else:
        all_reduce_one_shot_op(ctx, tiles, s, o, locks, OP, None, src_bases)


@triton.jit(do_not_specialize=["call_fp", "rank"])
def reduce_scatter_kernel(context, inp, src, out, locks, src_bases, m, src_stride, chunk, half, call_fp, rank,
                          world_size: tl.constexpr, OP: tl.constexpr, STAGE_IN: tl.constexpr, BUFFERED: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``out = reduce over ranks of chunk rank of inp`` (chunks of ``m`` elements). It is
    ``all_reduce_one_shot`` on the program's range of tiles of chunk ``rank``: every rank reads
    chunk ``rank`` of every peer's ``src`` (chunk ``j`` at ``src + j * src_stride``: ``inp``
    itself on the heap, else the staging buffer, whose chunks start at tile boundaries, and which
    holds only the chunks peers read; ``src_bases`` translates it) and its own chunk of ``inp``,
    and reduces them into ``out``.
    In rounds of ``chunk`` elements of each chunk, as :func:`all_reduce_kernel`. ``BUFFERED``
    (``STAGE_IN``): the one-shot with one flag round trip, as the all-reduce's (see
    :func:`_buffered_one_shot_round`), the staging buffer's halves ``half`` elements apart."""
    ctx = RuntimeRankContext.initialize(context, rank, world_size)
    pending = call_begin(ctx.heap_bases, rank, world_size)  # see all_reduce_kernel
    count, row, theirs = _call_started(ctx, pending, call_fp, BUFFERED)
    for base in range(0, m, chunk):
        if STAGE_IN:
            round_src = src
        else:
            round_src = src + base
        count, row, theirs = _reduce_scatter_round(ctx, inp + base, round_src, out + base, locks, src_bases, m,
                                                   tl.minimum(chunk, m - base), src_stride, half, OP, pending,
                                                   call_fp, count, row, theirs, STAGE_IN, BUFFERED, BLOCK_M, BLOCK_N)
    _call_ended(ctx, call_fp, count, row, theirs, BUFFERED)


@triton.jit
def _reduce_scatter_round(ctx, inp, src, out, locks, src_bases, m, n, src_stride, half, OP: tl.constexpr, pending,
                          call_fp, count, row, theirs, STAGE_IN: tl.constexpr, BUFFERED: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # One call's worth of reduce_scatter_kernel on n elements of each chunk (chunks m apart in inp).
    tiles, rows = _program_tiles(n, BLOCK_M, BLOCK_N)
    o = FlatView(out, n, rows, BLOCK_N)
    if BUFFERED:
        slot, record, epoch, src = _enter_buffered(tiles, o, locks, src, half, ONE_SHOT_CALL)
    if STAGE_IN:
        for t in range(tiles.first, tiles.stop, tiles.step):
            offsets = _tile_offsets(t, BLOCK_M, BLOCK_N)
            mask = offsets < n
            for i in tl.static_range(1, ctx.world_size):  # every chunk but this rank's (a run-time rank)
                j = (ctx.rank + i) % ctx.world_size
                tl.store(src + j * src_stride + offsets, tl.load(inp + j * m + offsets, mask=mask), mask=mask)
    peers_read = FlatView(src + ctx.rank * src_stride, n, rows, BLOCK_N)
    mine = FlatView(inp + ctx.rank * m, n, rows, BLOCK_N)
    if BUFFERED:
        count, row, theirs = _buffered_reduce(ctx, tiles, peers_read, o, OP, mine, slot, record, epoch, pending,
                                              call_fp, count, row, theirs, src_bases)
    else:
        all_reduce_one_shot_op(ctx, tiles, peers_read, o, locks, OP, mine, src_bases)
    return count, row, theirs


@triton.jit(do_not_specialize=["call_fp", "rank", "root"])
def reduce_kernel(context, inp, src, out, locks, src_bases, n, chunk, call_fp, rank, root, world_size: tl.constexpr,
                  OP: tl.constexpr, STAGE_IN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``out = reduce(inp over ranks)`` on rank ``root`` alone, ``n`` elements: the one-shot
    protocol of :func:`all_reduce_kernel` (every rank's "ready", then "done"), in which only the
    root reads and reduces, in rank order (so its result is bit-identical to an all-reduce's).
    ``src``: what the root reads of the other ranks (``inp`` on the heap, else a staging buffer
    this kernel fills; ``src_bases`` translates it). ``out`` is only written on the root (another
    rank passes any tensor of ``inp``'s dtype). ``root`` is a run-time argument: any rank may be
    the root, call after call. In rounds of ``chunk`` elements, as :func:`all_reduce_kernel`."""
    ctx = RuntimeRankContext.initialize(context, rank, world_size)
    call = call_enter(ctx.heap_bases, call_fp, rank, world_size)
    for base in range(0, n, chunk):
        if STAGE_IN:
            round_src = src
        else:
            round_src = src + base
        _reduce_round(ctx, inp + base, round_src, out + base, locks, src_bases, tl.minimum(chunk, n - base), root,
                      OP, STAGE_IN, BLOCK_M, BLOCK_N)
    call_check(ctx.heap_bases, call_fp, call, rank, world_size)


@triton.jit
def _reduce_round(ctx, inp, src, out, locks, src_bases, n, root, OP: tl.constexpr, STAGE_IN: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # One call's worth of reduce_kernel on n elements.
    tiles, rows = _program_tiles(n, BLOCK_M, BLOCK_N)
    o = FlatView(out, n, rows, BLOCK_N)
    if ctx.world_size > 1:
        slot, record, epoch = enter_range(tiles, o, locks, REDUCE_CALL)
        if STAGE_IN:
            if ctx.rank != root:  # the root reads its own part from inp
                for t in range(tiles.first, tiles.stop, tiles.step):
                    offsets = _tile_offsets(t, BLOCK_M, BLOCK_N)
                    mask = offsets < n
                    tl.store(src + offsets, tl.load(inp + offsets, mask=mask), mask=mask)
        # no peer can leave this call before this rank's "done": their signatures hold
        signal_and_wait_all(ctx, record, ARRIVE, epoch, REDUCE_CALL, "ready", slot, record)
    if ctx.rank == root:
        reduce_range_in_rank_order(ctx, tiles, FlatView(src, n, rows, BLOCK_N), o, OP,
                                   FlatView(inp, n, rows, BLOCK_N), REDUCE_CALL, src_bases)
    if ctx.world_size > 1:
        signal_and_wait_all(ctx, record, DONE, epoch, REDUCE_CALL, "done", slot)


@triton.jit
def _pull_tile(ctx, inp, src, out, src_bases, m, src_stride, offsets, mask, root, MODE: tl.constexpr):
    # Read this tile of what this rank needs from the peers' src (its own part from inp; src_bases
    # translates src) and store it into out (rank p's part m elements after rank p - 1's).
    if MODE == BROADCAST:
        if ctx.rank != root:
            tl.store(out + offsets, load(src + offsets, ctx.rank, root, src_bases, mask=mask), mask=mask)
    elif MODE == SCATTER:  # chunk rank of the root's inp (src: its staging, chunks src_stride apart)
        if ctx.rank == root:
            tl.store(out + offsets, tl.load(inp + ctx.rank * m + offsets, mask=mask), mask=mask)
        else:
            data = load(src + ctx.rank * src_stride + offsets, ctx.rank, root, src_bases, mask=mask)
            tl.store(out + offsets, data, mask=mask)
    elif MODE == GATHER_TO_ROOT:
        if ctx.rank == root:
            _pull_from_every_rank(ctx, inp + offsets, src + offsets, out + offsets, src_bases, m, mask)
    else:
        ptrs = src + offsets
        mine = inp + offsets
        if MODE == ALL_TO_ALL:
            ptrs = src + ctx.rank * src_stride + offsets
            mine = inp + ctx.rank * m + offsets
        _pull_from_every_rank(ctx, mine, ptrs, out + offsets, src_bases, m, mask)


@triton.jit
def _pull_from_every_rank(ctx, mine, ptrs, out, src_bases, m, mask):
    # Every rank's tile at ptrs (this rank's own at mine) into out, rank p's m elements after p - 1's.
    for i in tl.static_range(ctx.world_size):
        # starting with this rank, then the next: the ranks spread their reads over the peers
        p = (ctx.rank + i) % ctx.world_size
        if i == 0:  # this rank (a compile-time test: the rank is a run-time value)
            data = tl.load(mine, mask=mask)
        else:
            data = load(ptrs, ctx.rank, p, src_bases, mask=mask)
        tl.store(out + p * m, data, mask=mask)


@triton.jit(do_not_specialize=["call_fp", "rank", "root"])
def pull_kernel(context, inp, src, out, locks, src_bases, m, src_stride, chunk, half, call_fp, rank, root,
                world_size: tl.constexpr, MODE: tl.constexpr, STAGE_IN: tl.constexpr, BUFFERED: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """all_gather (``MODE`` GATHER), all_to_all, broadcast from ``root``, gather to ``root``
    (GATHER_TO_ROOT: only the root pulls) or scatter from ``root`` (SCATTER: every rank pulls its
    chunk of the root's ``inp``), ``m`` elements per chunk, by pulling from the peers' heap ``src``
    (``inp`` on the heap, else staged here: only what peers read; ``src_bases`` translates it: the
    heap's bases, or a registration's). ``out`` of a gather's non-root ranks, and ``inp`` of a
    scatter's, are never touched (the host passes the other tensor).

    Per program, over its range of tiles, the one-shot protocol of ``all_reduce_one_shot``:
    signal every peer "my src tiles are ready", wait for every peer's, read, signal "done
    reading yours", wait until every peer is done reading this rank's. So ``src`` may be
    overwritten by the next call at once, and ``out`` may be any tensor (only this rank writes
    it). In rounds of ``chunk`` elements of each chunk, as :func:`all_reduce_kernel`.

    ``BUFFERED`` (``STAGE_IN``): no "done" wait; the staging buffer's halves (``half`` elements
    apart) are used by turns, as in :func:`_buffered_one_shot_round`."""
    ctx = RuntimeRankContext.initialize(context, rank, world_size)
    # the call check's entry and end around the rounds' own protocol (see all_reduce_kernel)
    pending = call_begin(ctx.heap_bases, rank, world_size)
    count, row, theirs = _call_started(ctx, pending, call_fp, True)
    for base in range(0, m, chunk):
        if STAGE_IN:
            round_src = src
        else:
            round_src = src + base
        count, row, theirs = _pull_round(ctx, inp + base, round_src, out + base, locks, src_bases, m,
                                         tl.minimum(chunk, m - base), src_stride, half, root, pending, call_fp, count,
                                         row, theirs, MODE, STAGE_IN, BUFFERED, BLOCK_M, BLOCK_N)
    _call_ended(ctx, call_fp, count, row, theirs, True)


@triton.jit
def _pull_round(ctx, inp, src, out, locks, src_bases, m, n, src_stride, half, root, pending, call_fp, count, row,
                theirs, MODE: tl.constexpr, STAGE_IN: tl.constexpr, BUFFERED: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr):
    # One call's worth of pull_kernel on n elements of each chunk (chunks m apart in inp and out).
    call: tl.constexpr = _pull_call(MODE)
    tiles, rows = _program_tiles(n, BLOCK_M, BLOCK_N)
    if ctx.world_size > 1:
        if BUFFERED:
            slot, record, epoch, src = _enter_buffered(tiles, FlatView(out, n, rows, BLOCK_N), locks, src, half, call)
        else:
            slot, record, epoch = enter_range(tiles, FlatView(out, n, rows, BLOCK_N), locks, call)
    if STAGE_IN:
        # this program's tiles of every chunk peers will read, into the heap staging
        for t in range(tiles.first, tiles.stop, tiles.step):
            offsets = _tile_offsets(t, BLOCK_M, BLOCK_N)
            mask = offsets < n
            if MODE == ALL_TO_ALL:
                for i in tl.static_range(1, ctx.world_size):  # every chunk but this rank's
                    j = (ctx.rank + i) % ctx.world_size
                    tl.store(src + j * src_stride + offsets, tl.load(inp + j * m + offsets, mask=mask), mask=mask)
            elif MODE == BROADCAST:
                if ctx.rank == root:
                    tl.store(src + offsets, tl.load(inp + offsets, mask=mask), mask=mask)
            elif MODE == SCATTER:  # the root stages every chunk but its own
                if ctx.rank == root:
                    for i in tl.static_range(1, ctx.world_size):
                        j = (ctx.rank + i) % ctx.world_size
                        tl.store(src + j * src_stride + offsets, tl.load(inp + j * m + offsets, mask=mask),
                                 mask=mask)
            elif MODE == GATHER_TO_ROOT:
                if ctx.rank != root:  # the root reads its own part from inp
                    tl.store(src + offsets, tl.load(inp + offsets, mask=mask), mask=mask)
            else:
                tl.store(src + offsets, tl.load(inp + offsets, mask=mask), mask=mask)
    if ctx.world_size > 1:
        # the call's fingerprint before the first signal, a peek at the peers' after the first wait
        count, row = _publish_call(ctx, pending, call_fp, count, row)
        # no peer can leave this call before this rank's "done": their signatures hold
        signal_and_wait_all(ctx, record, ARRIVE, epoch, call, "ready", slot, record)
        theirs = call_peek((count, row), ctx.world_size)
    for t in range(tiles.first, tiles.stop, tiles.step):
        offsets = _tile_offsets(t, BLOCK_M, BLOCK_N)
        _pull_tile(ctx, inp, src, out, src_bases, m, src_stride, offsets, offsets < n, root, MODE)
    if ctx.world_size > 1:
        if DEBUG or not BUFFERED:
            signal_and_wait_all(ctx, record, DONE, epoch, call, "done", slot)
    return count, row, theirs


@triton.jit(do_not_specialize=["call_fp", "rank"])
def barrier_kernel(context, flags, call_fp, rank, world_size: tl.constexpr):
    """One program: :func:`iris.collectives.device_barrier` on ``flags`` (two int32 words)."""
    ctx = RuntimeRankContext.initialize(context, rank, world_size)
    call = call_enter(ctx.heap_bases, call_fp, rank, world_size)
    device_barrier(ctx, flags)
    call_check(ctx.heap_bases, call_fp, call, rank, world_size)
