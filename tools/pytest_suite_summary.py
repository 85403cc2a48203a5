"""pytest plugin: one closing line that a note can quote, naming what ran where.

    suite: NVIDIA H200, commit 1a2b3c4, worlds 2,4, shard all: 310 passed, 0 failed, 0 errors, 4 skipped in 498 s

The card comes from ``nvidia-smi`` (no CUDA context is made in the pytest process), "no GPU"
where there is none; ``IRIS_TREE_COMMIT`` where set (a copy of the tree on a GPU machine, whose
``.git``, if any, is not the tree's), else the commit from ``git``. With ``IRIS_TEST_TIMINGS``
set, the breakdown of ``tools/suite_timings.py`` is printed above the line. Loaded by ``tools/gpu-tests.sh``.

With ``IRIS_SUITE_RESULTS=<folder>`` the counts also go to ``<folder>/<shard>.json``, and
``python tools/pytest_suite_summary.py <folder> <seconds>`` prints one line for the shards that
ran side by side (``gpu-tests.sh`` does, after its parallel shards).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
    if os.environ.get("IRIS_TREE_COMMIT"):  # the caller knows better than a .git that came along
        return os.environ["IRIS_TREE_COMMIT"]
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
    if timings and not os.environ.get("IRIS_SUITE_RESULTS"):  # side by side: gpu-tests.sh prints it once
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from suite_timings import breakdown

        terminalreporter.write_line("")
        terminalreporter.write_line(breakdown(timings))
    stats = terminalreporter.stats
    counts = {key: len(stats.get(key, [])) for key in ("failed", "error", "skipped")}
    counts["passed"] = len([r for r in stats.get("passed", []) if getattr(r, "when", "call") == "call"])
    counts["seconds"] = round(time.monotonic() - _START)
    shard = os.environ.get("IRIS_TEST_SHARD") or os.environ.get("IRIS_TEST_PROCESS") or "all"
    resumed = os.environ.get("IRIS_TEST_RESUME_AT")
    results = os.environ.get("IRIS_SUITE_RESULTS")
    if results:
        os.makedirs(results, exist_ok=True)
        with open(os.path.join(results, shard.replace("/", "-of-") + ".json"), "w") as f:
            json.dump(counts, f)
    terminalreporter.write_line(summary_line(f"shard {shard}" + (f" from {resumed}" if resumed else ""), counts))


def summary_line(what: str, counts: dict) -> str:
    worlds = os.environ.get("IRIS_TEST_WORLD_SIZES", "default")
    return (f"suite: {card()}, commit {commit()}, worlds {worlds}, {what}: {counts['passed']} passed, "
            f"{counts['failed']} failed, {counts['error']} errors, {counts['skipped']} skipped in "
            f"{counts['seconds']:.0f} s")


def combine(folder: str, seconds: float) -> str:
    """The summary line of the shards whose counts are in ``folder``, run side by side for ``seconds``."""
    shards = sorted(name for name in os.listdir(folder) if name.endswith(".json")) if os.path.isdir(folder) else []
    total = {"passed": 0, "failed": 0, "error": 0, "skipped": 0, "seconds": seconds}
    for name in shards:
        with open(os.path.join(folder, name)) as f:
            for key, value in json.load(f).items():
                if key != "seconds":
                    total[key] += value
    faults = [name for name in shards if name.startswith("faults")]
    how = f"{len(shards) - len(faults)} processes side by side" + (
        f", then the gpu_fault tests in {len(faults)} without MPS" if faults else "")
    return summary_line(how, total)


if __name__ == "__main__":
    print(combine(sys.argv[1], float(sys.argv[2])))
