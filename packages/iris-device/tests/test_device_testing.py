"""iris.device.testing: memory_order's reading of PTX (text only), compile_ptx's errors, and one
real compile for sm_90 in a child process with Triton's interpreter off (its docstring's example,
and the alignment hint that makes Triton vectorise)."""

from __future__ import annotations

import json
import textwrap

import pytest
from iris_device_testlib import child_env, run_python
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from iris.device import IrisBackendError, IrisUsageError
from iris.device.testing import compile_ptx, memory_order

# Shaped like Triton's output: a CTA barrier, a guarded release atomic (3.9 writes red), a spin loop
# on an acquire load inside an inline-asm block, fences, plain memory operations in between.
PTX = """
.visible .entry kernel(
    .param .u64 kernel_param_0
)
{
    .loc 1 10 0                               // a directive: skipped
    ld.global.b32 %r1, [%rd1];                // a plain load: not an ordering instruction
    bar.sync 0;
    @%p1 red.release.sys.global.add.u32 [%rd2], %r3;
$L__BB0_1:
    // begin inline asm
    { ld.acquire.sys.global.b32 %r4, [%rd3]; membar.gl; }
    // end inline asm
    setp.eq.s32 %p2, %r4, 0;
    @%p2 bra $L__BB0_1;
    barrier.sync 0;
    atom.global.acq_rel.gpu.cas.b32 %r5, [%rd4], %r6, %r7;
    atom.global.add.f32 %f1, [%rd5], %f2;
    st.volatile.global.b32 [%rd6], %r8;
    bar.red.or.pred %p3, 0, %p4;
    fence.acq_rel.sys;
    bra.uni $L__BB0_2;
$L__BB0_2:
    st.global.b32 [%rd7], %r9;
    ret;
}
"""


def test_memory_order_reads_the_ordering_instructions_in_program_order():
    assert memory_order(PTX) == [
        "bar.sync",
        "atom.release.sys.add.u32",  # red and atom alike, the state space dropped
        "loop{", "ld.acquire.sys", "membar.gl", "}",  # the branch back to $L__BB0_1 makes a loop
        "bar.sync",
        "atom.acq_rel.gpu.cas.b32",
        "atom.-.-.add.f32",  # no sem, no scope: "-"
        "st.volatile",
        "bar.sync",  # a vote orders memory as a barrier does
        "fence.acq_rel.sys",  # a branch forward opens no loop
    ]


def test_memory_order_marks_nested_loops_and_ignores_comments():
    ptx = textwrap.dedent("""
        $L__BB1_1:
        $L__BB1_2:
            ld.relaxed.gpu.global.b32 %r1, [%rd1];   // atom.release.sys in a comment does not count
            @%p1 bra $L__BB1_2;
            st.release.gpu.global.b32 [%rd2], %r2;
            @%p2 bra $L__BB1_1;
    """)
    assert memory_order(ptx) == ["loop{", "loop{", "ld.relaxed.gpu", "}", "st.release.gpu", "}"]
    assert memory_order("") == []


def _pyfn(flag):
    pass


def test_compile_ptx_refuses_an_interpreted_kernel_and_says_how_to_compile():
    with pytest.raises(IrisBackendError, match=r"compile_ptx\(_pyfn\): the kernel is interpreted.*IRIS_BACKEND=cuda"):
        compile_ptx(InterpretedFunction(_pyfn), {"flag": "*i32"})
    with pytest.raises(IrisUsageError, match=r"fn must be a @triton.jit function"):
        compile_ptx(_pyfn, {"flag": "*i32"})


def test_compile_ptx_names_an_aligned_argument_that_does_not_exist():
    with pytest.raises(IrisUsageError, match=r"aligned=\['flags'\] names \['flags'\].*\['flag', 'BLOCK'\]"):
        compile_ptx(JITFunction(_pyfn), {"flag": "*i32"}, {"BLOCK": 4}, aligned=("flags",))


# Compiled for sm_90 with the interpreter off: the module docstring's example, a spin-wait, and a
# copy with and without the alignment hint (only the hinted one can use 16-byte vector accesses).
CHILD = """
import json
import triton
import triton.language as tl
from iris.device.testing import compile_ptx, memory_order

@triton.jit
def signal(flag):
    tl.atomic_add(flag, 1, sem="release", scope="sys")

@triton.jit
def wait(flag):
    while tl.atomic_add(flag, 0, sem="acquire", scope="sys") == 0:
        pass

@triton.jit
def copy(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)

sig = {"src": "*fp32", "dst": "*fp32", "n": "i32"}
print(json.dumps({
    "signal": memory_order(compile_ptx(signal, {"flag": "*i32"})),
    "wait": memory_order(compile_ptx(wait, {"flag": "*i32"})),
    "plain": compile_ptx(copy, sig, {"BLOCK": 1024}, options={"num_warps": 4}).count("ld.global.v4"),
    "aligned": compile_ptx(copy, sig, {"BLOCK": 1024}, aligned=("src", "dst", "n")).count("ld.global.v4"),
}))
"""


def test_compile_ptx_compiles_for_sm90_without_a_gpu(tmp_path):
    script = tmp_path / "compile_for_sm90.py"  # Triton reads a kernel's source from its file
    script.write_text(CHILD)
    out = run_python([str(script)], env=child_env(interpret=False), timeout=600)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    # Triton 3.9 puts a CTA barrier before a release atomic of its own accord; 3.6 does not.
    assert got["signal"] in (["atom.release.sys.add.u32"], ["bar.sync", "atom.release.sys.add.u32"]), got
    # An atomic add of 0 whose result is read is lowered to an acquire load, in a loop.
    assert got["wait"][0] == "loop{" and got["wait"][-1] == "}" and "ld.acquire.sys" in got["wait"], got
    assert got["plain"] == 0 and got["aligned"] > 0, got
