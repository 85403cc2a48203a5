"""CTA-wide votes: make a per-thread condition the same in every thread of a program.

Triton treats a scalar as one value per program, but a scalar computed from a per-thread source
(an acquire load that each thread issues, as the waits' polls do; the clock; a volatile read of a
word that another GPU writes) can differ between the threads for a moment. Control flow that
depends on it then diverges, and any CTA barrier inside the diverged region (Triton puts one
before a non-inlined call and around scalar atomics) is reached by some threads only: the
barrier pairs up the wrong threads, and the program can deadlock. A vote gives every thread the
same answer and is itself a CTA barrier (with ``bar.sync``'s memory ordering among the program's
threads), so code after it may rely on what every thread saw.

Under Triton's interpreter a program is one thread: the vote is the value itself.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._interpreter import INTERPRETER


@triton.jit
def cta_any(x):
    """1 (int32) in every thread when ``x != 0`` in any thread of the program, else 0.

    Granularity: per program; every thread of the program must call it at the same point (it is
    a ``bar.red.or`` on barrier 0). Memory semantics: those of a CTA barrier (``bar.sync``): the
    program's threads' earlier memory accesses are ordered before its later ones. No global
    memory access."""
    if INTERPRETER:
        return (x != 0).to(tl.int32)
    else:
        return tl.inline_asm_elementwise(
            "{ .reg .pred vote_in, vote_out; setp.ne.s32 vote_in, $1, 0; bar.red.or.pred vote_out, 0, vote_in; "
            "selp.s32 $0, 1, 0, vote_out; }", "=r,r", [x.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def cta_all(x):
    """1 (int32) in every thread when ``x != 0`` in every thread of the program, else 0.
    Granularity, memory semantics: as :func:`cta_any` (``bar.red.and``)."""
    if INTERPRETER:
        return (x != 0).to(tl.int32)
    else:
        return tl.inline_asm_elementwise(
            "{ .reg .pred vote_in, vote_out; setp.ne.s32 vote_in, $1, 0; bar.red.and.pred vote_out, 0, vote_in; "
            "selp.s32 $0, 1, 0, vote_out; }", "=r,r", [x.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
