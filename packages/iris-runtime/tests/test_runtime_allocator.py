"""The symmetric allocator alone: alignment, first fit, merging, deterministic reuse, exhaustion."""

from __future__ import annotations

import itertools
import random

import pytest

from iris.runtime import HeapExhaustedError, IrisError, IrisUsageError, SymmetricAllocator, format_bytes
from iris.runtime._allocator import ALLOCATION_ALIGNMENT


def test_alignment_is_256_and_every_offset_is_aligned():
    assert ALLOCATION_ALIGNMENT == 256
    alloc = SymmetricAllocator(1 << 16)
    offsets = [alloc.allocate(n, f"t{n}") for n in (1, 255, 256, 257, 0, 1000, 16)]
    assert offsets == [0, 256, 512, 768, 1280, 1536, 2560]
    assert all(o % 256 == 0 for o in offsets)
    assert alloc.free_bytes == (1 << 16) - 2816


def test_first_fit_takes_the_lowest_hole_that_fits():
    alloc = SymmetricAllocator(1 << 14)
    a, b, c, d = (alloc.allocate(n, name) for n, name in ((256, "a"), (1024, "b"), (256, "c"), (512, "d")))
    assert (a, b, c, d) == (0, 256, 1280, 1536)
    alloc.release(b, "free(b)")
    alloc.release(d, "free(d)")
    assert alloc.allocate(512, "e") == b            # lowest hole that fits, not the best fit at d
    assert alloc.allocate(512, "f") == b + 512      # the rest of b's hole
    assert alloc.allocate(768, "g") == d            # too big for anything below d


def test_release_merges_with_both_neighbours():
    alloc = SymmetricAllocator(4096)
    blocks = [alloc.allocate(256, f"b{i}") for i in range(16)]
    assert alloc.free_bytes == 0 and alloc.largest_free_block == 0
    for i in (1, 3, 2):                                # 2 joins the holes at 1 and 3
        alloc.release(blocks[i], f"free(b{i})")
    assert alloc.largest_free_block == 768
    assert alloc.allocate(768, "big") == blocks[1]
    for i in (0, 4, *range(5, 16)):
        alloc.release(blocks[i], f"free(b{i})")
    alloc.release(blocks[1], "free(big)")
    assert alloc.free_bytes == alloc.largest_free_block == 4096
    assert alloc.allocate(4096, "whole") == 0


def test_same_calls_give_same_offsets_deterministic_reuse():
    def run(seed):
        rng = random.Random(seed)
        alloc, live, trace = SymmetricAllocator(1 << 20), [], []
        for step in range(300):
            if live and rng.random() < 0.4:
                offset = live.pop(rng.randrange(len(live)))
                alloc.release(offset, "free")
            else:
                offset = alloc.allocate(rng.randrange(1, 5000), f"step{step}")
                live.append(offset)
                trace.append(offset)
        return trace, alloc.free_bytes

    assert run(7) == run(7)
    # a block freed and asked for again comes back at the same place
    alloc = SymmetricAllocator(1 << 12)
    first = [alloc.allocate(300, "x"), alloc.allocate(300, "y")]
    alloc.release(first[0], "free(x)")
    assert alloc.allocate(300, "x again") == first[0]


def test_no_overlap_under_churn():
    rng = random.Random(3)
    alloc, live = SymmetricAllocator(1 << 16), {}
    for step in range(500):
        if live and rng.random() < 0.5:
            offset = rng.choice(sorted(live))
            alloc.release(offset, "free")
            del live[offset]
        else:
            n = rng.randrange(1, 3000)
            try:
                offset = alloc.allocate(n, f"s{step}")
            except HeapExhaustedError:
                continue
            live[offset] = n
    spans = sorted(live.items())
    for (o1, n1), (o2, _) in itertools.pairwise(spans):
        assert o1 + n1 <= o2
    assert spans[-1][0] + spans[-1][1] <= 1 << 16 if spans else True
    used = sum(-(-n // 256) * 256 for n in live.values())
    assert alloc.free_bytes == (1 << 16) - used


def test_exhaustion_message_names_requested_free_total_and_fix():
    alloc = SymmetricAllocator(1 << 20)
    alloc.allocate(600 << 10, "zeros(153600, dtype=float32)")
    with pytest.raises(HeapExhaustedError) as info:
        alloc.allocate(512 << 10, "zeros(131072, dtype=float32)")
    text = str(info.value)
    for needle in ("zeros(131072, dtype=float32)", "needs 512.0 KiB", "424.0 KiB free", "of 1.0 MiB",
                   "heap_size=", "iris.runtime.iris()", str(1 << 20), "free()"):
        assert needle in text, (needle, text)
    assert isinstance(info.value, IrisError) and isinstance(info.value, MemoryError)
    assert alloc.free_bytes == 424 << 10, "a failed allocation must not change the heap"


def test_exhaustion_reports_fragmentation():
    alloc = SymmetricAllocator(4096)
    blocks = [alloc.allocate(256, str(i)) for i in range(16)]
    for b in blocks[::2]:
        alloc.release(b, "free")
    with pytest.raises(HeapExhaustedError, match=r"2.0 KiB free of 4.0 KiB \(largest free block 256 B\)"):
        alloc.allocate(512, "empty(512, dtype=uint8)")


def test_release_of_unknown_offset_names_the_call():
    alloc = SymmetricAllocator(4096)
    offset = alloc.allocate(100, "t")
    with pytest.raises(IrisUsageError, match=r"my_free\(\): no live allocation starts at heap offset 128"):
        alloc.release(128, "my_free()")
    alloc.release(offset, "free")
    with pytest.raises(IrisUsageError, match="freed twice"):
        alloc.release(offset, "free")


def test_log_records_calls_for_verify():
    alloc = SymmetricAllocator(4096)
    offset = alloc.allocate(10, "zeros(10, dtype=uint8)")
    alloc.release(offset, "free")
    assert alloc.take_log() == ["zeros(10, dtype=uint8) -> offset 0", "free(zeros(10, dtype=uint8)) at offset 0"]
    assert alloc.take_log() == []
    assert alloc.allocation_at(0) is None


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"),
    (1 << 20, "1.0 MiB"), (3 << 29, "1.5 GiB"), (1 << 40, "1024.0 GiB"),
])
def test_format_bytes(n, text):
    assert format_bytes(n) == text
