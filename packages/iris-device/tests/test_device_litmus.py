"""Memory-ordering litmus tests across two ranks (litmus_worker.py): message passing and store
buffering with weak data, iris atomics as the only ordering, many iterations. The documented
orderings must give 0 violations; the relaxed control's count is printed so that a GPU run shows
whether a missing ordering would have been visible. On the cpu backend the same kernels run a
few iterations under Triton's interpreter (a functional check: the interpreter orders everything);
tools/gpu-tests.sh runs them on the GPU, 2 ranks on one GPU under MPS or one rank per GPU."""

from __future__ import annotations

import re

import pytest
from iris_device_testlib import TESTS, rank_env

from iris.runtime.testing import run_ranks

WORKER = str(TESTS / "litmus_worker.py")


@pytest.mark.multirank
@pytest.mark.once
def test_litmus_documented_orderings_never_violate():
    proc = run_ranks(2, WORKER, timeout=600, env=rank_env())
    results = re.findall(r"^LITMUS (\w+) (\w+) iterations=(\d+) violations=(\d+)$", proc.stdout, re.M)
    print("\n".join(f"{p} {v}: {i} iterations, {n} violations" for p, v, i, n in results))
    assert {(p, v) for p, v, _, _ in results} == {(p, v) for p in ("mp", "sb") for v in ("ordered", "relaxed")}, \
        proc.stdout
    for pattern, variant, iterations, violations in results:
        assert int(iterations) > 0
        if variant == "ordered":
            assert int(violations) == 0, f"{pattern}: {violations} violations in {iterations} iterations"
    assert "PASS message_passing" in proc.stdout and "PASS store_buffering" in proc.stdout, proc.stdout
