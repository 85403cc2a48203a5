"""Symmetric allocation: the same sequence of calls gives the same offsets on every rank.

A first-fit free list over ``[0, size)`` with neighbour merging. It is deterministic, so ranks
that allocate and free in the same order agree on every offset without talking to each other.
Each call is also logged as text, which :meth:`SymmetricAllocator.take_log` hands to the
optional cross-rank check (``verify=True``).
"""

from __future__ import annotations

import bisect

from iris.device._layout import HEAP_BASE_ALIGNMENT

from ._errors import HeapExhaustedError, IrisUsageError

#: Alignment of every allocation, in bytes: enough for 16-byte vector access and then some.
ALLOCATION_ALIGNMENT = HEAP_BASE_ALIGNMENT


def format_bytes(n: int) -> str:
    """``1.5 GiB``-style text for error messages."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


class SymmetricAllocator:
    """First-fit allocator over one heap of ``size`` bytes."""

    def __init__(self, size: int, alignment: int = ALLOCATION_ALIGNMENT):
        self.size = size
        self.alignment = alignment
        self._free: list[tuple[int, int]] = [(0, size)]  # sorted (offset, length)
        self._used: dict[int, tuple[int, str]] = {}  # offset -> (length, description)
        self._log: list[str] = []

    @property
    def free_bytes(self) -> int:
        return sum(length for _, length in self._free)

    @property
    def largest_free_block(self) -> int:
        return max((length for _, length in self._free), default=0)

    def allocate(self, nbytes: int, what: str) -> int:
        """Reserve ``nbytes`` (rounded up to the alignment) and return the offset."""
        length = max(-(-nbytes // self.alignment) * self.alignment, self.alignment)
        for i, (offset, free_len) in enumerate(self._free):
            if free_len >= length:
                if free_len == length:
                    del self._free[i]
                else:
                    self._free[i] = (offset + length, free_len - length)
                self._used[offset] = (length, what)
                self._log.append(f"{what} -> offset {offset}")
                return offset
        raise HeapExhaustedError(
            f"{what} needs {format_bytes(nbytes)} but the heap has {format_bytes(self.free_bytes)} free of "
            f"{format_bytes(self.size)} (largest free block {format_bytes(self.largest_free_block)}); "
            f"pass a larger heap_size= to iris.runtime.iris() (now {self.size}) or free() tensors you no longer need"
        )

    def release(self, offset: int, call: str) -> None:
        """Return the block at ``offset`` to the free list, merging with its neighbours."""
        if offset not in self._used:
            raise IrisUsageError(
                f"{call}: no live allocation starts at heap offset {offset} (freed twice, or a view into an "
                f"allocation); pass the tensor a factory returned, once"
            )
        length, what = self._used.pop(offset)
        self._log.append(f"free({what}) at offset {offset}")
        i = bisect.bisect_left(self._free, (offset, 0))
        self._free.insert(i, (offset, length))
        # merge with the next block, then with the previous one
        if i + 1 < len(self._free) and offset + length == self._free[i + 1][0]:
            self._free[i] = (offset, length + self._free[i + 1][1])
            del self._free[i + 1]
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == offset:
            self._free[i - 1] = (self._free[i - 1][0], self._free[i - 1][1] + self._free[i][1])
            del self._free[i]

    def allocation_at(self, offset: int) -> tuple[int, str] | None:
        """``(length, description)`` of the live allocation starting at ``offset``, if any."""
        return self._used.get(offset)

    def take_log(self) -> list[str]:
        """The calls made since the last ``take_log``, oldest first."""
        log, self._log = self._log, []
        return log
