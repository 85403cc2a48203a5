"""Where a multi-rank suite's time went: sums the files that ``IRIS_TEST_TIMINGS=<folder>`` makes
(``iris.runtime.testing.record_timing``) into a table per worker and world size, and the slowest
scenarios.

For each job: its seconds (launcher to exit), the worker's start-up before its first scenario
(interpreter, imports, MPI, the context), its scenarios (and the Triton compilation inside them:
seconds and kernels compiled), its close, and the rest (launcher start and teardown, the ranks'
exit). Jobs that run no ``run_scenarios`` worker (examples, benchmarks, faults) have the job's
seconds only.

Jobs that never finished (cut by a deadline, or stuck) are listed after the table from the
workers' progress lines: the scenario each was in when the records stop, since when, and the ones
it had passed.

Usage: ``python tools/suite_timings.py <folder> [--top 15]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections import defaultdict


def read_lines(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def job_name(cmd: str) -> tuple[str, int]:
    """(script, ranks) of a job's command line ``-n N python -m mpi4py path/script.py args``."""
    ranks = re.search(r"(?:-n|--nproc-per-node=?)\s*(\d+)", cmd)
    script = re.search(r"([\w.-]+\.py)", cmd)
    return (script.group(1) if script else cmd[:40]), int(ranks.group(1)) if ranks else 0


def breakdown(folder: str, top: int = 15) -> str:
    jobs = read_lines(os.path.join(folder, "jobs.jsonl"))
    workers = read_lines(os.path.join(folder, "workers.jsonl"))
    per_job: dict[tuple[str, int], dict] = defaultdict(lambda: defaultdict(float))
    for job in jobs:
        row = per_job[job_name(job["cmd"])]
        row["jobs"] += 1
        row["seconds"] += job["seconds"]
    scenarios = []
    for worker in workers:
        row = per_job[(worker["worker"], worker["ranks"])]
        row["startup"] += worker["startup_s"]
        row["close"] += worker.get("close_s", 0.0)
        for name, seconds, compile_s, compiled, _hits in worker["scenarios"]:
            row["scenarios"] += seconds
            row["compile"] += compile_s
            row["compiled"] += compiled
            scenarios.append((seconds, compile_s, compiled, f"{worker['worker']}:{name}[{worker['ranks']}]"))
    lines = ["| job (ranks) | jobs | seconds | start-up | scenarios | of which compiling (kernels) | close | rest |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    total = defaultdict(float)
    for (script, ranks), row in sorted(per_job.items(), key=lambda item: -item[1]["seconds"]):
        rest = row["seconds"] - row["startup"] - row["scenarios"] - row["close"] if row["scenarios"] else 0.0
        for key in ("jobs", "seconds", "startup", "scenarios", "compile", "compiled", "close"):
            total[key] += row[key]
        total["rest"] += rest
        lines.append(f"| {script} ({ranks}) | {row['jobs']:.0f} | {row['seconds']:.1f} | {row['startup']:.1f} | "
                     f"{row['scenarios']:.1f} | {row['compile']:.1f} ({row['compiled']:.0f}) | {row['close']:.1f} | "
                     f"{rest:.1f} |")
    lines.append(f"| all | {total['jobs']:.0f} | {total['seconds']:.1f} | {total['startup']:.1f} | "
                 f"{total['scenarios']:.1f} | {total['compile']:.1f} ({total['compiled']:.0f}) | "
                 f"{total['close']:.1f} | {total['rest']:.1f} |")
    lines += ["", f"Slowest {top} scenarios (seconds, of which compiling, kernels compiled):"]
    for seconds, compile_s, compiled, name in sorted(scenarios, reverse=True)[:top]:
        lines.append(f"  {seconds:7.1f} s  {compile_s:6.1f} s  {compiled:3d}  {name}")
    lines += unfinished(read_lines(os.path.join(folder, "progress.jsonl")), {w.get("pid") for w in workers})
    return "\n".join(lines)


def unfinished(progress: list[dict], finished: set) -> list[str]:
    """Lines for the jobs whose progress lines have no finished worker row (same process id): the
    scenario each was in at its last line, and the scenarios before it, which passed."""
    started: dict[int, list[dict]] = defaultdict(list)
    for line in progress:
        if line["pid"] not in finished:
            started[line["pid"]].append(line)
    if not started:
        return []
    lines = ["", "Jobs that did not finish (cut by a deadline, or stuck), the scenario they were in:"]
    for steps in started.values():
        last = steps[-1]
        passed = ", ".join(step["scenario"] for step in steps[:-1]) or "none"
        lines.append(f"  {last['worker']}[{last['ranks']}]: in {last['scenario']} since {last['at_s']:.1f} s after "
                     f"the job's start (passed: {passed})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    print(breakdown(args.folder, args.top))


if __name__ == "__main__":
    main()
