"""Every example in examples/ runs on several ranks with small sizes, checks itself and says so.

World sizes: ``IRIS_TEST_WORLD_SIZES`` (the GPU run sets it), else 2 and 4 (on the GPU each example
at one of them, ``IRIS_TEST_SPREAD_CASES``). An example exits
non-zero when its own check fails, which ``run_ranks`` turns into a failure showing every
rank's output; the report line is checked too, so an example that silently skipped its work
fails here.
"""

from __future__ import annotations

import os
import re

import pytest

from iris.runtime.testing import run_ranks, run_torchrun, spread, world_sizes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")

# example file -> (arguments for a small run, regexes its rank-0 report must match)
CASES = {
    "00_hello_heap.py": (["--n", "3000"], [r"hello heap: {n} ranks", r"rank {last}: received every peer's block"]),
    "01_message_passing.py": (
        ["--n", "3000", "--block", "1024", "--rounds", "3", "--programs", "2"],
        [r"message passing: {n} ranks", r"store: all blocks correct.* 2 programs per rank",
         r"put  : all blocks correct"],
    ),
    # Ragged sizes (tiles stick out of C), every variant.
    "02_gemm_all_reduce.py": (
        ["--variant", "all", "--m", "96", "--n", "80", "--k-per-rank", "40"],
        [r"GEMM \+ all-reduce: {n} ranks"] + [rf"(?m)^  {v} +correct " for v in
                                              ("op_one_shot", "op_two_shot", "atomic", "spinlock", "one_shot",
                                               "two_shot", "ring")],
    ),
    "03_gemm_all_gather.py": (
        ["--m", "96", "--n", "96", "--k", "40"],  # 96 splits evenly over 1, 2, 3 and 4 ranks
        [r"GEMM \+ all-gather: {n} ranks"] + [rf"(?m)^  dim {d}, {m} +correct " for d in (0, 1)
                                              for m in ("collective", "stores")]
        + [rf"(?m)^  dim 0, {m} +correct " for m in ("op_matmul_all_gather", "op_all_gather_matmul")],
    ),
    # The MLP block checked against one device (48 tokens and 96 intermediate split over 1-4 ranks).
    "04_tp_mlp.py": (
        ["--m", "48", "--hidden", "32", "--intermediate", "96"],
        [r"tensor-parallel MLP block: {n} ranks", r"(?m)^  iris fused ops +correct ",
         r"(?m)^  iris, partials in \w+ +correct "],
    ),
    # One traced launch into the test's temporary folder: every rank's events merged, none dropped
    # (the picture needs matplotlib, which the GPU image lacks: not required here).
    "05_tracing.py": (
        ["--iters", "1", "--out", "{tmp}"],
        [r"# tracing: {n} ranks", r"(?m)^ +{last} += all .* dropped: 0$", r"{n} ranks, \d+ events, 0 dropped",
         r"wrote \S+example_trace\.json", r"results: correct on every rank"],
    ),
    # GPipe over 1-4 stages (microbatches, forward and backward), checked against one process.
    "06_pipeline.py": (
        ["--steps", "2", "--microbatches", "3", "--batch", "12", "--width", "32"],
        [r"GPipe pipeline: {n} stages", r"(?m)^  parameters of every stage after 2 steps  correct "],
    ),
    # Expert parallelism: random token counts and routing (some tokens all to expert 0), against one process.
    "07_moe.py": (
        ["--tokens", "12", "--hidden", "16", "--ffn", "24", "--top-k", "2", "--skew", "0.5"],
        [r"expert-parallel MoE: {n} ranks", r"(?m)^  outputs of every rank  correct "],
    ),
}


def example_files() -> list[str]:
    return sorted(f for f in os.listdir(EXAMPLES) if re.match(r"\d\d_.*\.py$", f))


def test_every_example_has_a_case():
    """A new example must be added to CASES, so that CI runs it."""
    assert sorted(CASES) == example_files()


# Every example at every world size; on the GPU (IRIS_TEST_SPREAD_CASES=1) each at one of them: an
# example is one MPI job that compiles its kernels at start, and what the GPU adds to the cpu suite's
# run of each example at 2 and 4 ranks is its kernels on the device, not another world size.
@pytest.mark.multirank
@pytest.mark.parametrize("example, nranks", [(example, n) for n in world_sizes(default="2,4")
                                             for example in spread(sorted(CASES), n)])
def test_example_runs(example, nranks, tmp_path):
    args, expected = CASES[example]
    args = [str(tmp_path) if a == "{tmp}" else a for a in args]  # files go to the test's temporary folder
    proc = run_ranks(nranks, os.path.join(EXAMPLES, example), *args, timeout=300, env={"MPIEXEC_TIMEOUT": "280"})
    for pattern in expected:
        pattern = pattern.format(n=nranks, last=nranks - 1)
        assert re.search(pattern, proc.stdout), f"no line matching {pattern!r} in:\n{proc.stdout}\n{proc.stderr}"
    assert "WRONG" not in proc.stdout, proc.stdout


@pytest.mark.multirank
@pytest.mark.once  # the bootstrap differs, not the kernel (test_example_runs runs it on every line)
def test_hello_heap_under_torchrun():
    """The first example runs under torchrun as it is: the ranks bootstrap through torch.distributed.
    (Its default size: torchrun would take ``--n`` for an abbreviation of its own options.)"""
    _, expected = CASES["00_hello_heap.py"]
    proc = run_torchrun(2, os.path.join(EXAMPLES, "00_hello_heap.py"), timeout=300)
    for pattern in expected + [r"bootstrap torch"]:
        pattern = pattern.format(n=2, last=1)
        assert re.search(pattern, proc.stdout), f"no line matching {pattern!r} in:\n{proc.stdout}\n{proc.stderr}"
    assert "WRONG" not in proc.stdout, proc.stdout


@pytest.mark.multirank
@pytest.mark.once  # the launcher script and its exit code: nothing here depends on Triton
def test_run_py_starts_an_example():
    """``examples/run.py`` (what ``nox -s demo`` calls) launches an example and passes its exit code on."""
    import subprocess
    import sys

    cmd = [sys.executable, os.path.join(EXAMPLES, "run.py"), "-n", "2", "00_hello_heap.py", "--", "--n", "100"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, MPIEXEC_TIMEOUT="280"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "hello heap: 2 ranks" in proc.stdout, proc.stdout
