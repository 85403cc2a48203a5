"""The routing of a dispatch, on the device: the order in which this rank sends its rows.

Every token ``t`` sends one row per entry ``k`` of its ``topk_idx[t]`` (``K`` of them) to the rank
that owns that expert. The rows go out sorted by expert (experts ``0 .. E - 1``: rank 0's local
experts first), and within an expert by ``t * K + k``, so the layout is the same on every run.
``torch.sort`` (stable) orders the ``T x K`` ids by expert; :func:`routing_kernel` turns the sorted
keys into counts and offsets per expert (binary searches), the inverse permutation (each
``(t, k)``'s place) and the order itself, into the handle's layout. An entry outside ``[0, E)``
(``-1``: no expert) sorts last and is sent nowhere.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: Ids per block of the inverse permutation's loop.
BLOCK = 1024


@triton.jit(do_not_specialize=["n", "steps"])
def routing_kernel(sorted_keys, order, layout, n, steps, NUM_EXPERTS: tl.constexpr, EXPERTS_P: tl.constexpr,
                   BLOCK: tl.constexpr):
    """``sorted_keys`` (``n`` expert ids, non-decreasing; ``NUM_EXPERTS`` for none) and ``order`` (the
    ids ``t * K + k`` in that order) into ``layout`` (see ``iris.collectives.moe._handle``): program 0
    the counts and offsets per expert (a binary search per expert, ``steps >= log2(n + 1)``
    halvings), every program a share of the slots and the order. Granularity: per program; plain
    loads and stores of this rank's memory."""
    p = tl.program_id(0)
    P = tl.num_programs(0)
    SLOTS: tl.constexpr = 4 * NUM_EXPERTS
    if p == 0:
        e = tl.arange(0, EXPERTS_P)
        first = _lower_bound(sorted_keys, n, e, steps)
        after = _lower_bound(sorted_keys, n, e + 1, steps)
        valid = e < NUM_EXPERTS
        tl.store(layout + e, (after - first).to(tl.int32), mask=valid)
        tl.store(layout + NUM_EXPERTS + e, first.to(tl.int32), mask=valid)
    for b in range(p, tl.cdiv(n, BLOCK), P):
        f = b * BLOCK + tl.arange(0, BLOCK)
        m = f < n
        ids = tl.load(order + f, mask=m, other=0).to(tl.int32)
        tl.store(layout + SLOTS + ids, f, mask=m)  # slots[order[f]] = f
        tl.store(layout + SLOTS + n + f, ids, mask=m)


@triton.jit
def _lower_bound(keys, n, value, steps):
    # The first index of keys ([n], non-decreasing) holding >= value, per lane of value.
    lo = tl.zeros(value.shape, tl.int32)
    hi = tl.zeros(value.shape, tl.int32) + n
    for _ in range(steps):
        active = lo < hi
        mid = (lo + hi) // 2
        below = active & (tl.load(keys + mid, mask=active, other=0) < value)
        lo = tl.where(below, mid + 1, lo)
        hi = tl.where(active & ~below, mid, hi)
    return lo


def route(topk_idx: torch.Tensor, num_experts: int, layout: torch.Tensor, programs: int) -> None:
    """Fill the send side of ``layout`` (counts, offsets, slots, order) for ``topk_idx`` (``[T, K]``
    int32 or int64): a masked fill and a stable sort (torch) and :func:`routing_kernel`; no host
    synchronisation."""
    flat = topk_idx.reshape(-1)
    n = flat.numel()
    keys = flat.masked_fill((flat < 0) | (flat >= num_experts), num_experts)
    sorted_keys, order = torch.sort(keys, stable=True)
    if n == 0:  # no tokens: nothing sent (the kernel still writes the zero counts)
        sorted_keys = order = layout
    routing_kernel[(programs,)](sorted_keys, order, layout, n, max(1, n.bit_length()), NUM_EXPERTS=num_experts,
                                EXPERTS_P=triton.next_power_of_2(num_experts), BLOCK=BLOCK)


__all__ = ["route", "routing_kernel"]
