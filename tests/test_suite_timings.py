"""tools/suite_timings.py: a job that never finished (cut by a deadline, or stuck) is named with the
scenario it was in and the ones it had passed, from the progress lines its worker records as each
scenario starts (``IRIS_TEST_TIMINGS``)."""

from __future__ import annotations

import importlib.util
import os

import pytest

from iris.runtime.testing import run_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "workers", "timings_worker.py")


def suite_timings():
    spec = importlib.util.spec_from_file_location("suite_timings", os.path.join(ROOT, "tools", "suite_timings.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.once
def test_a_job_cut_in_a_scenario_is_named_with_the_ones_it_passed(tmp_path):
    run_ranks(1, WORKER, "passes", "is_cut", timeout=120, env={"IRIS_TEST_TIMINGS": str(tmp_path)},
              expect_failure=True)
    text = suite_timings().breakdown(str(tmp_path))
    assert "Jobs that did not finish" in text, text
    assert "timings_worker.py[1]: in is_cut since " in text and "(passed: passes)" in text, text


@pytest.mark.once
def test_a_finished_job_is_not_listed(tmp_path):
    run_ranks(1, WORKER, "passes", timeout=120, env={"IRIS_TEST_TIMINGS": str(tmp_path)})
    text = suite_timings().breakdown(str(tmp_path))
    assert "timings_worker.py (1)" in text or "passes[1]" in text, text
    assert "Jobs that did not finish" not in text, text
