"""iris-device's README documents the context tensor word by word (docs/own-heap.md includes that
section): every word at the index ``iris.device._layout`` gives it, and the sizes it states (words,
event and report words, alignment, the signal pad) are the layout's. A kernel author who builds the
tensor from the README gets what the device code reads."""

from __future__ import annotations

import os
import re

from iris.device import _layout as layout
from iris.device import _watchdog

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "packages", "iris-device", "README.md")
START, END = "<!-- context-tensor: start -->", "<!-- context-tensor: end -->"
ROW = re.compile(r"^\| `([^`]+)`[^|]*\| `(\w+)` \|", re.MULTILINE)

#: Trailer words, by the name the README gives them, and their offsets after the heap bases.
TRAILER = {
    "trace_enabled": layout.TRACE_ENABLED,
    "trace_max_events": layout.TRACE_MAX_EVENTS,
    "trace_counter_ptr": layout.TRACE_COUNTER_PTR,
    "trace_buffer_ptr": layout.TRACE_BUFFER_PTR,
    "heap_size": layout.HEAP_SIZE,
    "watchdog_timeout_ns": layout.WATCHDOG_NS,
    "watchdog_record_ptr": layout.WATCHDOG_RECORD,
    "call_words_offset": layout.CALL_WORDS_OFFSET,
    "call_counter": layout.CALL_COUNTER,
}


def section() -> str:
    with open(README, encoding="utf-8") as f:
        text = f.read()
    assert START in text and END in text, f"{README} lost its markers {START} / {END} (docs/own-heap.md includes it)"
    return text.split(START, 1)[1].split(END, 1)[0]


def test_every_word_is_where_the_layout_puts_it():
    documented = {word: index for index, word in ROW.findall(section())}
    expected = {"cur_rank": str(layout.CUR_RANK), "num_ranks": str(layout.NUM_RANKS),
                "heap_base_r": f"{layout.HEAP_BASES} + r"}
    expected.update({word: f"{layout.HEAP_BASES} + N + {offset}" for word, offset in TRAILER.items()})
    assert documented == expected, f"the README's table of the context tensor differs from iris.device._layout:\n" \
                                   f"  README: {documented}\n  layout: {expected}"
    assert len(TRAILER) == layout.TRAILER_WORDS, "a trailer word of iris.device._layout is missing from this test"


def test_the_stated_sizes_are_the_layouts():
    text = " ".join(section().split())
    facts = [
        f"`{layout.HEAP_BASES} + N + {layout.TRAILER_WORDS}` words",
        f"a multiple of {layout.HEAP_BASE_ALIGNMENT}",
        f"{layout.TRACE_EVENT_FIELDS} int64 words per event",
        f"{_watchdog.RECORD_WORDS} int64 words of host-visible memory",
        f"(`1 << {layout.SIGNAL_PAD_BYTES.bit_length() - 1}` bytes)",
        f"Its last {layout.PAD_RESERVED_BYTES} bytes are reserved",
        f"`heap_size + {layout.CALL_WORDS_IN_PAD}` for the words in the signal pad",
        f"report, heap_size + {layout.CALL_WORDS_IN_PAD}, 0]`",
    ]
    assert layout.SIGNAL_PAD_BYTES == 1 << 20 and "a *signal pad* of 1 MiB" in text, "the pad's size in MiB changed"
    missing = [fact for fact in facts if fact not in text]
    assert not missing, f"packages/iris-device/README.md no longer states: {missing}"
    assert layout.context_length(3) == layout.HEAP_BASES + 3 + layout.TRAILER_WORDS
