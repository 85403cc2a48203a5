"""Compile the network path for an H200 (sm_90) without a GPU, linked with NVSHMEM's real bitcode.

Run by ``test_device_nvshmem.py`` in a child process, Triton's interpreter off. With
``--network`` (``IRIS_BACKEND=nvshmem IRIS_NVSHMEM_NETWORK=1``): the GPU worker's kernels compile
and link; their PTX calls NVSHMEM; a block atomic is refused with a message. Without it (the cuda
backend): iris.device's load/store compile to the same instructions as a hand-written translate +
tl.load/tl.store, and nothing of NVSHMEM is in them. Prints one JSON object as its last line.
"""

from __future__ import annotations

import json
import re
import sys
import traceback

import triton
import triton.language as tl

import iris.device as device
from iris.device import testing

RMA_SIG = {"src": "*{t}", "load_dst": "*{t}", "store_dst": "*{t}", "get_dst": "*{t}", "put_dst": "*{t}",
           "copy_dst": "*{t}", "heap_bases": "*i64", "cur": "i32", "peer": "i32", "n": "i32"}


def compile_ptx(fn, signature: dict, constexprs: dict) -> str:
    return testing.compile_ptx(fn, signature, constexprs, options={"num_warps": 4})


def instructions(ptx: str, name: str) -> list[str]:
    """The kernel's instructions, without debug info, comments, labels' names and its own name."""
    ptx = ptx.replace(name, "KERNEL")
    body = ptx[ptx.index(".entry"):]
    body = body[:body.find(".section")] if ".section" in body else body
    lines = []
    for line in body.splitlines():
        line = line.split("//")[0].strip()
        if not line or line.startswith((".loc", ".file", "$L__tmp", "$L__func")) or line in ("{", "}"):
            continue
        lines.append(re.sub(r"\$L__\w+", "L", line))
    return lines


@triton.jit
def library_kernel(buf, heap_bases, cur, peer, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = device.load(buf + offs, cur, peer, heap_bases, mask=m, other=0.0)
    device.store(buf + n + offs, x * 2, cur, peer, heap_bases, mask=m)


@triton.jit
def hand_kernel(buf, heap_bases, cur, peer, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(device.translate(buf + offs, cur, peer, heap_bases), mask=m, other=0.0)
    tl.store(device.translate(buf + n + offs, cur, peer, heap_bases), x * 2, mask=m)


@triton.jit
def block_atomic_kernel(flags, heap_bases, cur, peer, BLOCK: tl.constexpr):
    device.atomic_add(flags + tl.arange(0, BLOCK), 1, cur, peer, heap_bases, scope="sys")


def network(out: dict) -> None:
    from device_nvshmem_worker import amo_kernel, bulk_put_kernel, message_kernel, rma_kernel

    from iris.device import _nvshmem_host

    _nvshmem_host.install(_nvshmem_host.device_bitcode(), lambda handle: 0)
    cases = {f"rma {t}": (rma_kernel, {k: v.format(t=t) for k, v in RMA_SIG.items()}, {"BLOCK": 128})
             for t in ("fp32", "bf16", "i8")}
    cases["amo"] = (amo_kernel, {"words32": "*i32", "words64": "*i64", "old_out": "*i64", "heap_bases": "*i64",
                                 "cur": "i32", "peer": "i32"}, {})
    cases["message"] = (message_kernel, {"data": "*fp32", "flag": "*i32", "heap_bases": "*i64", "cur": "i32",
                                         "peer": "i32", "n": "i32"}, {"BLOCK": 128})
    cases["bulk put"] = (bulk_put_kernel, {"src": "*fp32", "dst": "*fp32", "signal": "*i64",
                                           "bytes_per_program": "i64", "peer": "i32"}, {})
    for name, (fn, sig, const) in cases.items():
        try:
            ptx = compile_ptx(fn, sig, const)
            out[name] = {"compiled": True, "nvshmem_functions": nvshmem_functions(ptx)}
        except Exception as exc:
            out[name] = {"compiled": False, "error": f"{type(exc).__name__}: {exc}"[-1500:]}
    # What NVSHMEM cannot carry (block atomics, fp32 adds) still compiles: the pointer path for
    # mapped peers, a printed message and a trap for unmapped ones.
    try:
        ptx = compile_ptx(block_atomic_kernel, {"flags": "*fp32", "heap_bases": "*i64", "cur": "i32", "peer": "i32"},
                          {"BLOCK": 64})
        out["block atomic"] = {"compiled": True, "trap": "trap;" in ptx, "prints": "vprintf" in ptx,
                               "vector_atomic": "atom.global" in ptx or "red.global" in ptx}
    except Exception as exc:
        out["block atomic"] = {"compiled": False, "error": f"{type(exc).__name__}: {exc}"[-1500:]}


def nvshmem_functions(ptx: str) -> list[str]:
    """NVSHMEM functions the PTX declares or calls (file names in debug info do not count)."""
    return sorted(set(re.findall(r"(?:\.func|call[.\w]*)\s+(?:\([^)]*\),\s*)?(\w*nvshmem\w*)", ptx)))


def pointer_only(out: dict) -> None:
    sig = {"buf": "*fp32", "heap_bases": "*i64", "cur": "i32", "peer": "i32", "n": "i32"}
    library = instructions(compile_ptx(library_kernel, sig, {"BLOCK": 1024}), "library_kernel")
    hand = instructions(compile_ptx(hand_kernel, sig, {"BLOCK": 1024}), "hand_kernel")
    # Compared as multisets: the scheduler may order the same instructions differently.
    out["pointer"] = {"nvshmem_functions": nvshmem_functions("\n".join(library)),
                      "same_instructions": sorted(library) == sorted(hand),
                      "instructions": len(library), "hand_instructions": len(hand)}


def main() -> None:
    out: dict = {"NVSHMEM": bool(device.nvshmem.NVSHMEM.value)}
    try:
        (network if "--network" in sys.argv else pointer_only)(out)
    except Exception:
        out["crash"] = traceback.format_exc()[-3000:]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
