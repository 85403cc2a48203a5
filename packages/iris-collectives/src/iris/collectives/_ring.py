"""Tile all-reduce around a ring of ranks, and the signal pad its flags live in.

The ring takes no lock array (the spec's signature has none), so its flags live in the signal
pad: ``iris.device._layout.SIGNAL_PAD_BYTES`` bytes that ``iris.runtime`` maps and zeroes right
after every rank's heap, at ``heap_base + heap_size``. The pad holds ``FLAG_WORDS`` (4) int32 words
per tile index, so one ring call covers up to :data:`RING_MAX_TILES` tiles.

Every group of a rank shares that rank's pad, so a ring on a group (``group=``) keeps its flags in
the group's own workspace instead (``GROUP_RING_BYTES`` before the group's call words, see
``iris.device._layout``): :data:`GROUP_RING_MAX_TILES` tiles per call.
"""

# No "from __future__ import annotations": Triton resolves jit globals by name at compile time.
import triton
import triton.language as tl

from iris.device import INTERPRETER, TraceEvent, round_to, store
from iris.device import _layout as layout
from iris.device._group import on_group

from ._dtypes import accumulator_type, int_type_of_width, pieces_per_partial
from ._errors import IrisUsageError
from ._sync import ARRIVE, DONE, FLAG_WORDS, advance, host_scalar, signal, wait_at_least

#: The most tiles one :func:`all_reduce_ring` call can use (its flags fill the signal pad).
RING_MAX_TILES = (layout.SIGNAL_PAD_BYTES - layout.PAD_RESERVED_BYTES) // (4 * FLAG_WORDS)
_RECORD_WORDS: tl.constexpr = tl.constexpr(FLAG_WORDS)
_RING_MAX_TILES: tl.constexpr = tl.constexpr(RING_MAX_TILES)
#: The most tiles one :func:`all_reduce_ring` call on a group can use (its flags fill the group's
#: ``GROUP_RING_BYTES``).
GROUP_RING_MAX_TILES = layout.GROUP_RING_MAX_TILES
_GROUP_RING_MAX_TILES: tl.constexpr = tl.constexpr(GROUP_RING_MAX_TILES)
_HEAP_SIZE: tl.constexpr = tl.constexpr(layout.HEAP_SIZE)
_CALL_WORDS_OFFSET: tl.constexpr = tl.constexpr(layout.CALL_WORDS_OFFSET)
_GROUP_RING_BYTES: tl.constexpr = tl.constexpr(layout.GROUP_RING_BYTES)
# The ring's words in a tile's record: ARRIVE (0, peers count arrivals into this rank's tile),
# CREDIT (1, the right neighbour counts its tile being free), and this rank's private running
# totals of the arrivals and credits it has consumed (2 and 3).
CREDIT: tl.constexpr = DONE
ARRIVED: tl.constexpr = tl.constexpr(2)
CREDITED: tl.constexpr = tl.constexpr(3)


@triton.constexpr_function
def _raise_capacity(num_tiles, on_group):
    tiles = host_scalar(num_tiles)
    limit, where = (GROUP_RING_MAX_TILES, "the group's ring area") if on_group else (RING_MAX_TILES, "the signal pad")
    if tiles > limit:
        raise IrisUsageError(
            f"iris.collectives.all_reduce_ring: dst_view has {tiles} tiles but {where} holds flags for "
            f"{limit}; use larger blocks (fewer tiles)")
    return 0


@triton.jit
def _check_capacity(num_tiles, ON_GROUP: tl.constexpr = False):
    # Too many tiles would write flags past the pad (or the group's ring area), into whatever
    # follows: fail loudly on every backend, not only in debug mode (one scalar comparison per
    # program).
    if INTERPRETER:
        _raise_capacity(num_tiles, ON_GROUP)
    else:
        if ON_GROUP:
            if num_tiles > _GROUP_RING_MAX_TILES:
                tl.device_print("iris.collectives.all_reduce_ring: more tiles than the group's ring area holds "
                                "flags for: tiles, limit = ", num_tiles, _GROUP_RING_MAX_TILES)
                tl.inline_asm_elementwise("trap;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
        else:
            if num_tiles > _RING_MAX_TILES:
                tl.device_print("iris.collectives.all_reduce_ring: more tiles than the signal pad holds flags for: "
                                "tiles, limit = ", num_tiles, _RING_MAX_TILES)
                tl.inline_asm_elementwise("trap;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _pad_record(ctx, t):
    # Tile t's flag record in this rank's signal pad, which sits at heap_base + heap_size. A peer's
    # record is at the same offset from the peer's heap base, so the heap translation reaches it;
    # signals go without iris.device's debug address check, as the pad lies outside the heap.
    base = tl.load(ctx.heap_bases + ctx.rank) + tl.load(ctx.heap_bases + ctx.world_size + _HEAP_SIZE)
    return tl.cast(base, tl.pointer_type(tl.int32)) + t * _RECORD_WORDS


@triton.jit
def _group_record(ctx, t):
    # Tile t's flag record of a ring on a group (ctx: the group's, see on_group): in the group's
    # workspace, GROUP_RING_BYTES before its call words, at the same offset on every member.
    words = tl.load(ctx.heap_bases + ctx.world_size + _CALL_WORDS_OFFSET)
    base = tl.load(ctx.heap_bases + ctx.rank) + words - _GROUP_RING_BYTES
    return tl.cast(base, tl.pointer_type(tl.int32)) + t * _RECORD_WORDS


@triton.jit
def _send_partial(ctx, acc, piece: tl.constexpr, pieces: tl.constexpr, dst_bits_ptrs, right: tl.constexpr, mask,
                  record, credit_target, t):
    # Wait until the right neighbour lets us overwrite its dst tile, write one piece of the fp32 (or
    # wider) partial sum's bits into it, and tell it.
    wait_at_least(record + CREDIT, credit_target, "iris.collectives.all_reduce_ring", "credit", ctx.rank, right, t,
                  ctx.heap_bases)
    width: tl.constexpr = dst_bits_ptrs.dtype.element_ty.primitive_bitwidth
    bits = acc.to(int_type_of_width(acc.dtype.primitive_bitwidth), bitcast=True)
    shift: tl.constexpr = width * (pieces - 1 - piece)
    part = (bits >> shift).to(dst_bits_ptrs.dtype.element_ty)
    store(dst_bits_ptrs, part, ctx.rank, right, ctx.heap_bases, mask=mask)
    signal(record + ARRIVE, ctx.rank, right, ctx.heap_bases, CHECKED=False)


@triton.jit
def all_reduce_ring(ctx, tile, src_view, dst_view, group=None):
    """All-reduce each tile by passing it around the ring of ranks, neighbour to neighbour.

    Tile ``t`` starts at rank ``s = t % world_size`` (so every rank starts some tiles). Reduce:
    rank ``s`` sends its ``src_view`` tile to rank ``s+1``, which adds its own and sends the partial
    sum on, ``world_size - 1`` steps, until rank ``s-1`` holds the full sum; it rounds it once into
    its ``dst_view`` and starts the second pass, which hands the result on around the ring in
    another ``world_size - 1`` steps. Data moves only between neighbours, into the receiver's
    ``dst_view`` tile (used as the mailbox); partial sums travel at accumulator precision (fp32
    for fp16/bf16, sent as two 16-bit pieces), so the result is rounded once and bit-identical on
    every rank.

    Flow control: a rank writes into its right neighbour's tile only after that neighbour has
    granted a credit for this call (it has entered the call, so it is done with the previous
    result) and, for a second piece, after it read the first. Flags are int32 counters in the
    signal pad, four words per tile index: arrivals and credits that peers add to, and
    this rank's running totals of those it has consumed. They only grow, so calls can follow each
    other with no reset and no barrier, whatever their shapes and types.

    Granularity: per program. ``tile``: a :class:`TileView` (or :class:`Tile`; its data is not
    used: this rank's contribution is read from ``src_view``, which may be any memory of this
    rank). ``dst_view``: on the symmetric heap. Memory semantics: flags released and acquired at
    system scope. At most :data:`RING_MAX_TILES` tiles per call; calls on the same tile index must
    be made in the same order on every rank, never concurrently by two programs of one launch.

    When it returns on a rank: this rank's ``dst_view`` tile holds the sum; this rank no longer
    reads or writes any peer's memory for this tile. A rank must be done reading its ``dst_view``
    when it calls again.

    ``group``: an :class:`iris.device.DeviceGroup` (None: every rank of ``ctx``): the ring runs
    through the group's members in group order, its flags in the group's own workspace (so rings
    of groups that share a rank never meet), at most :data:`GROUP_RING_MAX_TILES` tiles per call.
    """
    if group is not None:
        ctx = on_group(ctx, group, "iris.collectives.all_reduce_ring")
    call: tl.constexpr = "iris.collectives.all_reduce_ring"
    src_ty: tl.constexpr = src_view.ptr.dtype.element_ty
    dst_ty: tl.constexpr = dst_view.ptr.dtype.element_ty
    acc_ty: tl.constexpr = accumulator_type(call, src_ty)
    dst_ptrs, mask = dst_view.frame(tile)
    if ctx.tracing.enabled:
        handle = ctx.tracing.record_event_start(TraceEvent().collective, -1, dst_ptrs, tile.pid_m, tile.pid_n, mask)
    own = tl.load(src_view.frame(tile)[0], mask=mask, other=0).to(acc_ty)
    W: tl.constexpr = ctx.world_size
    if W == 1:
        tl.store(dst_ptrs, round_to(own, dst_ty), mask=mask)
    else:
        pieces: tl.constexpr = pieces_per_partial(call, acc_ty, dst_ty)
        bits_ty: tl.constexpr = int_type_of_width(dst_ty.primitive_bitwidth)
        acc_bits_ty: tl.constexpr = int_type_of_width(acc_ty.primitive_bitwidth)
        dst_bits = dst_ptrs.to(tl.pointer_type(bits_ty), bitcast=True)
        left: tl.constexpr = (ctx.rank + W - 1) % W
        right: tl.constexpr = (ctx.rank + 1) % W
        num_tiles = dst_view.num_tiles(tile.BLOCK_M, tile.BLOCK_N)
        t = tile.tile_id(dst_view.num_tiles_n(tile.BLOCK_N))
        if group is not None:
            _check_capacity(num_tiles, True)
            record = _group_record(ctx, t)
        else:
            _check_capacity(num_tiles)
            record = _pad_record(ctx, t)
        start = t % W
        pos = (ctx.rank - start + W) % W  # 0: starts the tile, W-1: completes the sum
        # Arrivals per call into this rank's tile: the partial's pieces (unless it starts) and the
        # result (unless it completes the sum). Credits per call from the right: the pieces (unless
        # this rank completes the sum; the start rank takes the result without credit). Both depend
        # on the call's types, and every ring call on tile index t shares these counters, so this
        # rank keeps running totals of what it has consumed (private words), not a call count.
        arrivals_now = tl.where(pos != 0, pieces, 0) + tl.where(pos != W - 1, 1, 0)
        credits_now = tl.where(pos != W - 1, pieces, 0)
        arrived = advance(record + ARRIVED, arrivals_now)
        credited = advance(record + CREDITED, credits_now)
        if pos != 0:
            # This rank's tile is free for this call (its caller is done with the last result).
            signal(record + CREDIT, ctx.rank, left, ctx.heap_bases, CHECKED=False)
            received = tl.full([tile.BLOCK_M, tile.BLOCK_N], 0, acc_bits_ty)
            for piece in tl.static_range(pieces):
                wait_at_least(record + ARRIVE, arrived + piece + 1, call, "partial", ctx.rank, left, t, ctx.heap_bases)
                part = tl.load(dst_bits, mask=mask, other=0).to(acc_bits_ty)
                if pieces > 1:
                    part = part & ((1 << dst_ty.primitive_bitwidth) - 1)
                received = received | (part << (dst_ty.primitive_bitwidth * (pieces - 1 - piece)))
                if piece + 1 < pieces:
                    signal(record + CREDIT, ctx.rank, left, ctx.heap_bases, CHECKED=False)
            acc = received.to(acc_ty, bitcast=True) + own
        else:
            acc = own
        if pos != W - 1:
            for piece in tl.static_range(pieces):
                _send_partial(ctx, acc, piece, pieces, dst_bits, right, mask, record, credited + piece + 1, t)
            result_arrival = arrived + tl.where(pos != 0, pieces, 0) + 1
            wait_at_least(record + ARRIVE, result_arrival, call, "result", ctx.rank, left, t, ctx.heap_bases)
            if pos != W - 2:
                result = tl.load(dst_ptrs, mask=mask)
                store(dst_ptrs, result, ctx.rank, right, ctx.heap_bases, mask=mask)
                signal(record + ARRIVE, ctx.rank, right, ctx.heap_bases, CHECKED=False)
        else:
            result = round_to(acc, dst_ty)
            tl.store(dst_ptrs, result, mask=mask)
            store(dst_ptrs, result, ctx.rank, right, ctx.heap_bases, mask=mask)
            signal(record + ARRIVE, ctx.rank, right, ctx.heap_bases, CHECKED=False)
    if ctx.tracing.enabled:
        ctx.tracing.record_event_end(handle)
