"""Writing the context tensor (layout: :mod:`iris.device._layout`)."""

from __future__ import annotations

import torch

from iris.device import _layout as layout


def build_context(rank: int, world_size: int, bases: list[int], heap_size: int, device: torch.device) -> torch.Tensor:
    """The int64 context tensor ``[rank, world, bases..., trace info (off), heap_size, watchdog
    (off), call_words_offset]``; the call words are the signal pad's (the device reads their
    offset without looking at ``heap_size``: never 0)."""
    words = [0] * layout.context_length(world_size)
    words[layout.CUR_RANK] = rank
    words[layout.NUM_RANKS] = world_size
    words[layout.HEAP_BASES:layout.HEAP_BASES + world_size] = bases
    trailer = layout.HEAP_BASES + world_size
    words[trailer + layout.HEAP_SIZE] = heap_size
    words[trailer + layout.CALL_WORDS_OFFSET] = heap_size + layout.CALL_WORDS_IN_PAD
    return torch.tensor(words, dtype=torch.int64, device=device)


def write_trace_info(context: torch.Tensor, world_size: int, enabled: bool, max_events: int, counter_ptr: int,
                     buffer_ptr: int) -> None:
    """Update the trace words of ``context`` in place (kernels launched afterwards see them)."""
    trailer = layout.HEAP_BASES + world_size
    values = torch.tensor([int(enabled), max_events, counter_ptr, buffer_ptr], dtype=torch.int64)
    start = trailer + layout.TRACE_ENABLED
    assert layout.TRACE_BUFFER_PTR - layout.TRACE_ENABLED == 3  # the four words are adjacent
    context[start:start + 4].copy_(values.to(context.device))
