"""pytest plugin: one closing line that a note can quote, naming what ran where.

    suite: NVIDIA H200, commit 1a2b3c4, worlds 2,4, shard all: 310 passed, 0 failed, 0 errors, 4 skipped in 498 s

The card comes from ``nvidia-smi`` (no CUDA context is made in the pytest process), "no GPU"
where there is none; the commit from ``git``, or ``IRIS_TREE_COMMIT`` where the tree is a copy
without its ``.git`` (a GPU machine). With ``IRIS_TEST_TIMINGS`` set, the breakdown of
``tools/suite_timings.py`` is printed above the line. Loaded by ``tools/gpu-tests.sh``.
"""

from __future__ import annotations

import os
import subprocess
import time

_START = time.monotonic()


def card() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return "no GPU"
    names = [name.strip() for name in out if name.strip()]
    if not names:
        return "no GPU"
    return names[0] if len(names) == 1 else f"{len(names)} x {names[0]}"


def commit() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=here,
                             timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=here, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = dirty = ""
    if sha:
        return sha + ("+changes" if dirty else "")
    return os.environ.get("IRIS_TREE_COMMIT", "unknown")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    timings = os.environ.get("IRIS_TEST_TIMINGS")
    if timings:
        import sys

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from suite_timings import breakdown

        terminalreporter.write_line("")
        terminalreporter.write_line(breakdown(timings))
    stats = terminalreporter.stats
    counts = {key: len(stats.get(key, [])) for key in ("failed", "error", "skipped")}
    counts["passed"] = len([r for r in stats.get("passed", []) if getattr(r, "when", "call") == "call"])
    worlds = os.environ.get("IRIS_TEST_WORLD_SIZES", "default")
    shard = os.environ.get("IRIS_TEST_SHARD", "all")
    resumed = os.environ.get("IRIS_TEST_RESUME_AT")
    terminalreporter.write_line(
        f"suite: {card()}, commit {commit()}, worlds {worlds}, shard {shard}"
        f"{f' from {resumed}' if resumed else ''}: {counts['passed']} passed, {counts['failed']} failed, "
        f"{counts['error']} errors, {counts['skipped']} skipped in {time.monotonic() - _START:.0f} s")
