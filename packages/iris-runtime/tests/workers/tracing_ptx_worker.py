"""Compile kernels for an H200 (sm_90) without a GPU and check what tracing leaves in the PTX.

    TRITON_INTERPRET=0 python tracing_ptx_worker.py   # compiled mode; needs no GPU

Checks, printed as ``CHECK ...`` lines and asserted here:

- a kernel that records events (``tracing=True``) compiles, reads ``%globaltimer`` and
  ``%smid``, claims slots with an atomic add and writes each record with one store;
- the same kernel with ``tracing=False`` has the same PTX (modulo the kernel's name) as a kernel
  that never mentions tracing, and as one written with the free functions: compiled out means no
  instruction left.

Imports iris.device only, never iris.runtime (which would switch Triton's interpreter on).
"""

from __future__ import annotations

import os
import re
import sys

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    raise SystemExit("tracing_ptx_worker.py: unset TRITON_INTERPRET; this script compiles for sm_90")
os.environ["IRIS_DEBUG"] = "0"  # debug checks would differ between the variants; they are not what is compared

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import iris.device
from iris.device import DeviceContext, TraceEvent

TARGET = GPUTarget("cuda", 90, 32)


@triton.jit
def copy_traced(context, src, dst, n, rank: tl.constexpr, world_size: tl.constexpr, BLOCK: tl.constexpr,
                TRACE: tl.constexpr):
    ctx = DeviceContext.initialize(context, rank, world_size, tracing=TRACE)
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    span = ctx.tracing.record_event_start(TraceEvent().compute, -1, src + offs, pid, 0, mask=mask)
    peer = (rank + 1) % world_size
    values = ctx.load(src + offs, from_rank=peer, mask=mask)
    ctx.store(dst + offs, values * 2.0, to_rank=peer, mask=mask)
    ctx.atomic_add(dst, 1.0, to_rank=peer, sem="release", scope="sys")
    ctx.tracing.record_event_end(span)
    ctx.tracing.record_event(TraceEvent().wait, peer, dst, pid, 0)


@triton.jit
def copy_plain(context, src, dst, n, rank: tl.constexpr, world_size: tl.constexpr, BLOCK: tl.constexpr,
               TRACE: tl.constexpr):
    ctx = DeviceContext.initialize(context, rank, world_size)
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    peer = (rank + 1) % world_size
    values = ctx.load(src + offs, from_rank=peer, mask=mask)
    ctx.store(dst + offs, values * 2.0, to_rank=peer, mask=mask)
    ctx.atomic_add(dst, 1.0, to_rank=peer, sem="release", scope="sys")


@triton.jit
def copy_free(context, src, dst, n, rank: tl.constexpr, world_size: tl.constexpr, BLOCK: tl.constexpr,
              TRACE: tl.constexpr):
    heap_bases = context + 2
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    peer = (rank + 1) % world_size
    values = iris.device.load(src + offs, rank, peer, heap_bases, mask=mask)
    iris.device.store(dst + offs, values * 2.0, rank, peer, heap_bases, mask=mask)
    iris.device.atomic_add(dst, 1.0, rank, peer, heap_bases, sem="release", scope="sys")


def ptx_of(kernel, trace: bool) -> str:
    """PTX of ``kernel`` for sm_90 with 16-byte aligned pointers, as a launch would specialise it."""
    signature = {"context": "*i64", "src": "*fp32", "dst": "*fp32", "n": "i32", "rank": "constexpr",
                 "world_size": "constexpr", "BLOCK": "constexpr", "TRACE": "constexpr"}
    constexprs = {"rank": 0, "world_size": 2, "BLOCK": 1024, "TRACE": trace}
    aligned = {(i,): [["tt.divisibility", 16]] for i in range(3)}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=aligned)
    return triton.compile(source, target=TARGET).asm["ptx"]


def normalised(ptx: str, name: str) -> str:
    """``ptx`` without debug information and with the kernel's name replaced, so that two kernels
    with the same instructions compare equal."""
    ptx = ptx.split("\n\t.section\t.debug", 1)[0]  # DWARF sections: file names and line tables
    keep = []
    for line in ptx.splitlines():
        stripped = line.strip()
        debug_label = re.fullmatch(r"\$L__(tmp|func_begin|func_end)\d+:", stripped)
        if stripped.startswith((".loc", ".file", "//")) or debug_label:
            continue
        keep.append(line.rstrip())
    return re.sub(rf"\b{name}\b", "KERNEL", "\n".join(keep)).replace(f"{name}_param", "KERNEL_param")


def first_difference(a: str, b: str) -> str:
    for i, (x, y) in enumerate(zip(a.splitlines(), b.splitlines())):
        if x != y:
            return f"line {i}: {x!r} != {y!r}"
    return f"lengths {len(a.splitlines())} != {len(b.splitlines())}"


def main() -> int:
    traced = ptx_of(copy_traced, True)
    assert "%globaltimer" in traced and "%smid" in traced, "traced PTX reads neither %globaltimer nor %smid"
    claims = re.findall(r"atom\.global\.gpu\.relaxed\.add\.u64", traced)
    # 5 events: the range, load, store, atomic_add and the instant; the record is one st.global.b64
    # per thread (one vector store), the end time one more per closed event.
    assert len(claims) == 5, f"expected 5 slot claims, found {len(claims)}"
    print(f"CHECK traced: {len(traced)} chars of PTX, {traced.count('%globaltimer')} clock reads, "
          f"{len(claims)} slot claims", flush=True)

    off = normalised(ptx_of(copy_traced, False), "copy_traced")
    plain = normalised(ptx_of(copy_plain, False), "copy_plain")
    free = normalised(ptx_of(copy_free, False), "copy_free")
    assert "globaltimer" not in off and "smid" not in off, "tracing=False left clock reads in the PTX"
    assert off == plain, "tracing=False PTX differs from a kernel without tracing: " + first_difference(off, plain)
    assert off == free, "tracing=False PTX differs from the free-function kernel: " + first_difference(off, free)
    print(f"CHECK compiled-out: tracing=False PTX == untraced PTX == free-function PTX ({len(off)} chars)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
