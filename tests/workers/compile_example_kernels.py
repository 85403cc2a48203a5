"""Compile the kernels of the examples for an H100/H200 (sm_90) without a GPU, and report.

Run by tests/test_examples_compile.py in a process where Triton's interpreter is off
(``IRIS_BACKEND=cuda``, no ``TRITON_INTERPRET``), so that ``@triton.jit`` builds real kernels.
Prints one line per kernel: ``OK <name> <facts>``; any compile error fails the process.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys

os.environ["IRIS_BACKEND"] = "cuda"
os.environ.pop("TRITON_INTERPRET", None)

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import iris.runtime  # noqa: F401  (decides compiled kernels: IRIS_BACKEND=cuda above)

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")
TARGET = GPUTarget("cuda", 90, 32)
WORLD = 4


def load(name: str):
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), os.path.join(EXAMPLES, name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compile_kernel(fn, signature: dict, constexprs: dict) -> str:
    """PTX of ``fn`` for sm_90; arguments not in ``signature`` are constexprs."""
    sig = {name: signature.get(name, "constexpr") for name in fn.arg_names}
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs), target=TARGET).asm["ptx"]


def facts(ptx: str) -> str:
    """Counts of system-scope memory operations by semantics (PTX spells ``atom.global.sys.release``
    for some and ``atom.global.release.sys`` for others; an acquire atomic add of 0 may become an
    ``ld.global.sys.acquire``, and the collectives' waits poll with ``ld.acquire.sys.global``)."""
    ops = re.findall(r"\b(?:atom|red|ld|st)\.([\w.]+)", ptx)
    qualifiers = [q for q in (set(op.split(".")) for op in ops) if "global" in q]
    count = {sem: sum("sys" in q and sem in q for q in qualifiers) for sem in ("release", "acquire", "relaxed")}
    # The collectives release with one system-scope fence before relaxed adds (see signal_all).
    return (f"sys.release={count['release']} sys.fence={ptx.count('fence.acq_rel.sys')} "
            f"sys.acquire={count['acquire']} sys.relaxed={count['relaxed']} wgmma={'wgmma' in ptx}")


def one_kernel_for(fn, param: str, values) -> bool:
    """Whether Triton builds one kernel for all ``values`` of int argument ``param`` (it builds
    separate ones for 1 and for multiples of 16 unless the parameter is not specialised on)."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import native_specialize_impl

    kp = next(p for p in fn.params if p.name == param)
    specialize, align = not kp.do_not_specialize, not kp.do_not_specialize_on_alignment
    keys = {native_specialize_impl(BaseBackend, v, False, specialize, align) for v in values}
    return len(keys) == 1


def message_passing() -> None:
    mp = load("01_message_passing.py")
    sig = {"context": "*i64", "inbox": "*fp32", "staging": "*fp32", "ready": "*i32", "ack": "*i32",
           "errors": "*i32", "n": "i32", "rounds": "i32", "max_spins": "i32"}
    # the warm-up launch has rounds=0, the timed one the user's count
    warmup_builds_it = one_kernel_for(mp.exchange, "rounds", (0, 1, 4, 20))
    for use_put in (False, True):
        ptx = compile_kernel(mp.exchange, sig, {"rank": 1, "world_size": WORLD, "USE_PUT": use_put, "BLOCK": 1024})
        print(f"OK 01_message_passing.exchange[USE_PUT={use_put}] {facts(ptx)} warmup_builds_it={warmup_builds_it}",
              flush=True)


def gemm_all_reduce() -> None:
    ex = load("02_gemm_all_reduce.py")
    sig = {"context": "*i64", "a": "*fp32", "b": "*fp32", "partial": "*fp32", "c": "*fp32", "locks": "*i32",
           **{n: "i32" for n in ("M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cm",
                                 "stride_cn")}}
    for variant in ex.KERNEL_VARIANTS:  # the kernel in the file (the op_* variants call the library)
        ptx = compile_kernel(ex.gemm_all_reduce, sig, {
            "rank": 1, "world_size": WORLD, "VARIANT": variant, "PRECISION": "tf32", "BLOCK_M": 64, "BLOCK_N": 64,
            "BLOCK_K": 32})
        print(f"OK 02_gemm_all_reduce.gemm_all_reduce[{variant}] {facts(ptx)}", flush=True)


def gemm_all_gather() -> None:
    ex = load("03_gemm_all_gather.py")
    sig = {"context": "*i64", "a": "*fp32", "b": "*fp32", "c": "*fp32",
           **{n: "i32" for n in ("M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cm",
                                 "stride_cn")}}
    for dim in (0, 1):
        for method in ("collective", "stores"):
            ptx = compile_kernel(ex.gemm_all_gather, sig, {
                "rank": 1, "world_size": WORLD, "DIM": dim, "METHOD": method, "PRECISION": "tf32", "BLOCK_M": 64,
                "BLOCK_N": 64, "BLOCK_K": 32})
            print(f"OK 03_gemm_all_gather.gemm_all_gather[dim={dim}, {method}] {facts(ptx)}", flush=True)


def hello_heap() -> None:
    ex = load("00_hello_heap.py")
    ptx = compile_kernel(ex.write_to_every_peer, {"context": "*i64", "inbox": "*fp32", "n": "i32"},
                         {"rank": 1, "world_size": WORLD, "BLOCK": 1024})
    print(f"OK 00_hello_heap.write_to_every_peer {facts(ptx)}", flush=True)


if __name__ == "__main__":
    wanted = sys.argv[1:] or ["hello_heap", "message_passing", "gemm_all_reduce", "gemm_all_gather"]
    for name in wanted:
        globals()[name]()
