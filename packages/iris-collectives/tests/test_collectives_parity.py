"""fp16/bf16 results are bit-identical on the cpu and cuda backends: two ranks run one-shot,
two-shot, ring and reduce-scatter on seeded random inputs and compare every result's bits with
``workers/parity_reference.pt``, made by the same cases on an H200 (see ``workers/parity_worker.py``,
which also regenerates it). Under Triton's interpreter an fp32 -> bf16 conversion truncates; the
collectives round through ``iris.device.round_to`` so that both backends round to nearest even."""

from __future__ import annotations

import os

import pytest

from iris.runtime.testing import run_ranks

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers", "parity_worker.py")


@pytest.mark.multirank
def test_fp16_bf16_results_match_the_gpu_bits():
    proc = run_ranks(2, WORKER, timeout=300, env={"MPIEXEC_TIMEOUT": "280"})
    assert "16 results bit-identical to the NVIDIA H200 reference" in proc.stdout, proc.stdout + proc.stderr
