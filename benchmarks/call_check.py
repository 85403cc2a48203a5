"""What does the call check cost? ``benchmarks/ccl.py`` with the call agreement on and off, side by side.

    python3 benchmarks/call_check.py --ranks 2                # GPU: host and device jobs, the check on and off
    python3 benchmarks/call_check.py --ranks 4 --repeats 3    # three jobs per setting and kind, medians
    python3 benchmarks/call_check.py --ranks 2 --quick        # ccl.py --quick (cpu backend), the code path only

Not under mpirun: it launches the jobs itself, with the launcher of the tests
(``iris.runtime.testing``: ``IRIS_MPIEXEC``, else the ``mpiexec`` next to Python or on ``PATH``;
Open MPI gets ``--oversubscribe``, ``--allow-run-as-root`` as root, and ``-x`` for every variable
the ranks need, ``IRIS_CHECK_CALLS`` among them). The call agreement (``IRIS_CHECK_CALLS``) is
read at import, so each setting is a job of its own. For each of ``--repeats`` rounds (the order
of the settings alternating, so that a drift of the machine falls on both), with
``IRIS_CHECK_CALLS=1`` and ``=0``:

- host: ``ccl.py --host`` (4 KiB fp32, the five collectives on plain and heap tensors):
  ``dispatch``, the host's microseconds per call on a cache hit with the launch replaced by a no-op
  (the Python that the check's host part lives in), and on the GPU ``enqueue``, real launches back
  to back; the empty kernel's launch and the peer's call, which the check does not touch, as a
  reference for how far two jobs differ anyway;
- device: ``ccl.py --no-peer`` at sizes where launches and flags decide (``--sizes``, default
  4K,64K,1M; ``--collectives`` all_reduce,all_gather,reduce_scatter; bf16), plain and heap tensors,
  eager and in a CUDA graph of ``--graph`` calls (the GPU time of a call without the host's), with
  the copy floor, which the check does not touch either. Every call is checked before it is timed.

Prints one table: per row the time with the check on, off, their difference (us) and ratio, and
verdict lines: the host's price on a cache hit against the budget (``BUDGET_US``), the device's
in a graph against the floor's own move between the jobs. With ``--repeats`` of 2 or more, each
number is the median of its jobs and ``spread`` is how far the jobs of one setting differ.
Writes ``results/call_check_<W>ranks[_cpu|_<G>gpu][_quick].{json,md,png}`` (the JSON keeps every
job's full results). docs/performance.md says how to read it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile

from common import NO_PLOT, human, pyplot

from iris.runtime.testing import launcher, run_command

HERE = os.path.dirname(os.path.abspath(__file__))
CCL = os.path.join(HERE, "ccl.py")
#: What a cached call's check may cost the host (issue: no benchmark may see it).
BUDGET_US = 0.3
SETTINGS = {"on": "1", "off": "0"}
DEVICE_SIZES = "4K,64K,1M"
DEVICE_COLLECTIVES = "all_reduce,all_gather,reduce_scatter"
#: Variables the ranks need from this process's environment, beside every IRIS_* one (Open MPI
#: starts its ranks with what ``-x`` names; MPICH's launcher passes everything).
FORWARD = ("PYTHONPATH", "PYTHONUNBUFFERED", "TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY",
           "CUDA_MPS_LOG_DIRECTORY", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
           "TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2, help="ranks of each job")
    p.add_argument("--quick", action="store_true",
                   help="ccl.py's --quick (its size, one timed call; the cpu backend unless IRIS_BACKEND is set), "
                        "a few host calls")
    p.add_argument("--repeats", type=int, default=None,
                   help="jobs per setting and kind, the median counts (default 2; 1 with --quick)")
    p.add_argument("--sizes", default=None,
                   help=f"device jobs' --sizes (default {DEVICE_SIZES}; ccl.py's with --quick)")
    p.add_argument("--collectives", default=DEVICE_COLLECTIVES, help="device jobs' --collectives")
    p.add_argument("--dtypes", default="bf16", help="device jobs' --dtypes")
    p.add_argument("--graph", type=int, default=None, metavar="CALLS", help="device jobs' calls per CUDA graph")
    p.add_argument("--calls", type=int, default=None, help="host jobs' --calls (default ccl.py's; 50 with --quick)")
    p.add_argument("--rounds", type=int, default=None, help="host jobs' --rounds (default ccl.py's; 2 with --quick)")
    p.add_argument("--only", choices=("host", "device"), default=None, help="run one kind of job only")
    p.add_argument("--job-timeout", type=float, default=900, help="seconds each job may take")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    args = p.parse_args(argv)
    if args.repeats is None:
        args.repeats = 1 if args.quick else 2
    if args.quick:
        args.calls = args.calls or 50
        args.rounds = args.rounds or 2
    if args.ranks < 2 or args.repeats < 1:
        p.error(f"--ranks {args.ranks} --repeats {args.repeats}: the check compares ranks (2 or more) and "
                "needs one job per setting at least (--repeats 1)")
    return args


# --- the jobs -----------------------------------------------------------------------------------------

def ccl_args(args, kind: str, out: str) -> list[str]:
    """``benchmarks/ccl.py``'s arguments for a ``kind`` ("host" or "device") job writing into ``out``."""
    quick = ["--quick"] if args.quick else []
    if kind == "host":
        extra = [f"--{k}={v}" for k, v in (("calls", args.calls), ("rounds", args.rounds)) if v is not None]
        return ["--host", *quick, *extra, "--out", out]
    sizes = args.sizes or (None if args.quick else DEVICE_SIZES)
    extra = (["--sizes", sizes] if sizes else []) + ([f"--graph={args.graph}"] if args.graph is not None else [])
    return [*quick, "--collectives", args.collectives, "--dtypes", args.dtypes, "--no-peer", *extra, "--out", out]


def job_launcher(env: dict) -> list[str]:
    """The tests' launcher command line, with Open MPI's ``-x`` for each variable of ``env`` that
    the ranks need and that it does not pass yet (an ``IRIS_MPIEXEC`` may name some already)."""
    cmd = launcher()
    version = subprocess.run([cmd[0], "--version"], capture_output=True, text=True, env=env).stdout
    if "Open MPI" not in version and "OpenRTE" not in version:
        return cmd
    passed = {cmd[i + 1] for i, word in enumerate(cmd[:-1]) if word == "-x"}
    names = sorted(n for n in env if (n.startswith("IRIS_") or n in FORWARD) and n not in passed | {"IRIS_MPIEXEC"})
    return cmd + [word for n in names for word in ("-x", n)]


def run_job(args, kind: str, setting: str, folder: str) -> dict:
    """One ``ccl.py`` job with the check ``setting`` ("on"/"off"); its results, checked to be of
    that setting (a launcher that drops the variable would compare the check with itself)."""
    out = os.path.join(folder, f"{kind}_{setting}")
    os.makedirs(out, exist_ok=True)
    changes = {"IRIS_CHECK_CALLS": SETTINGS[setting]}
    if args.quick and "IRIS_BACKEND" not in os.environ:
        changes["IRIS_BACKEND"] = "cpu"  # as ccl.py --quick: the cpu backend unless the environment names one
    env = dict(os.environ, PYTHONUNBUFFERED="1", **changes)  # what run_command gives the launcher
    cmd = job_launcher(env) + ["-n", str(args.ranks), sys.executable, "-m", "mpi4py", CCL, *ccl_args(args, kind, out)]
    print(f"=== check {setting} ({kind}): {' '.join(cmd)}", flush=True)
    proc = run_command(cmd, timeout=args.job_timeout, env=changes)
    print(proc.stdout.rstrip(), flush=True)
    pattern = "ccl_host_" if kind == "host" else "ccl_"
    found = sorted(f for f in os.listdir(out) if f.startswith(pattern) and f.endswith(".json")
                   and (kind == "host" or not f.startswith("ccl_host_")))
    if len(found) != 1:
        raise SystemExit(f"call_check.py: the {kind} job with the check {setting} wrote {found or 'nothing'} into "
                         f"{out}; expected one {pattern}*.json (see its output above)")
    with open(os.path.join(out, found[0])) as f:
        result = json.load(f)
    if result.get("check_calls") is not (setting == "on"):
        raise SystemExit(f"call_check.py: the {kind} job with IRIS_CHECK_CALLS={SETTINGS[setting]} ran with the check "
                         f"{'on' if result.get('check_calls') else 'off'}: its launcher did not pass the variable to "
                         f"the ranks; set IRIS_MPIEXEC to a launcher that passes the environment (Open MPI: -x)")
    return result


def run_all(args) -> dict:
    """Every job: per repeat, the kinds in turn, each with the check on and off (off first in odd
    repeats). Returns {"on": [{"host": ..., "device": ...}, ...], "off": [...]}."""
    runs = {setting: [{} for _ in range(args.repeats)] for setting in SETTINGS}
    kinds = [args.only] if args.only else ["host", "device"]
    with tempfile.TemporaryDirectory(prefix="call_check_") as folder:
        for r in range(args.repeats):
            for kind in kinds:
                for setting in (("on", "off") if r % 2 == 0 else ("off", "on")):
                    runs[setting][r][kind] = run_job(args, kind, setting, os.path.join(folder, str(r)))
    return runs


# --- the comparison -----------------------------------------------------------------------------------

def compare(on: list, off: list) -> dict | None:
    """Medians of the jobs' values with the check on and off, their difference and ratio, and the
    spread (the largest difference between jobs of one setting; None from one job each). None
    when either setting has no value."""
    on, off = [v for v in on if v is not None], [v for v in off if v is not None]
    if not on or not off:
        return None
    a, b = statistics.median(on), statistics.median(off)
    spread = max(max(on) - min(on), max(off) - min(off)) if len(on) > 1 or len(off) > 1 else None
    return {"on": a, "off": b, "diff": a - b, "ratio": a / b if b else None, "spread": spread,
            "jobs": {"on": on, "off": off}}


def host_rows(runs: dict) -> tuple[list[dict], list[dict]]:
    """The host jobs' rows compared (collective, tensors: dispatch and enqueue), and the reference
    rows the check does not touch (the empty kernel's launches, the peer's call)."""
    jobs = {s: [r["host"] for r in runs[s] if "host" in r] for s in SETTINGS}
    if not jobs["on"]:
        return [], []
    rows = []
    for i, row in enumerate(jobs["on"][0]["rows"]):
        tensors = "heap" if row["heap"] else "plain, agreed" if row.get("agreed") else "plain"
        values = {s: [job["rows"][i] for job in jobs[s]] for s in SETTINGS}
        rows.append({"collective": row["collective"], "tensors": tensors, "cache_hit": not row.get("agreed"),
                     "dispatch_us": compare(*([v.get("dispatch_median_us") for v in values[s]] for s in SETTINGS)),
                     "enqueue_us": compare(*([v.get("enqueue_median_us") for v in values[s]] for s in SETTINGS))})
    reference = []
    for key, label in (("empty_triton_launch_us", "empty Triton kernel, Triton's launcher"),
                       ("empty_direct_launch_us", "empty Triton kernel, the plans' direct launch")):
        c = compare(*([job.get(key) for job in jobs[s]] for s in SETTINGS))
        if c:
            reference.append({"what": label, "enqueue_us": c})
    for peer in jobs["on"][0].get("peer_rows", []):  # a peer that failed to start in a job has no row there
        c = compare(*([row["enqueue_median_us"] for job in jobs[s] for row in job.get("peer_rows", [])
                       if row["label"] == peer["label"]] for s in SETTINGS))
        if c:
            reference.append({"what": f"all_reduce, {peer['label']} (the peer)", "enqueue_us": c})
    return rows, reference


def device_rows(runs: dict) -> list[dict]:
    """The device jobs' points compared: per collective, dtype, size and tensors (plain: ``ccl``,
    staged; heap), eager and in a graph, with the floor and whether every call was right."""
    jobs = {s: [r["device"] for r in runs[s] if "device" in r] for s in SETTINGS}
    if not jobs["on"]:
        return []

    def key(p):
        return p["collective"], p["dtype"], p["bytes"]

    points = {s: [{key(p): p for p in job["points"]} for job in jobs[s]] for s in SETTINGS}
    rows = []
    for point in jobs["on"][0]["points"]:
        k = key(point)
        mine = {s: [by_key[k] for by_key in points[s] if k in by_key] for s in SETTINGS}
        for label, tensors in (("ccl", "plain"), ("heap", "heap")):
            if label not in point["eager_us"]:
                continue
            correct = all(p["correct"].get(label, False) for s in SETTINGS for p in mine[s])
            rows.append({"collective": k[0], "dtype": k[1], "bytes": k[2], "tensors": tensors, "correct": correct,
                         "eager_us": compare(*([p["eager_us"].get(label) for p in mine[s]] for s in SETTINGS)),
                         "graph_us": compare(*([p["graph_us"].get(label) for p in mine[s]] for s in SETTINGS)),
                         "floor_us": compare(*([p.get("floor_us") for p in mine[s]] for s in SETTINGS))})
    return rows


def _spread(cs: list) -> float | None:
    values = [c["spread"] for c in cs if c and c["spread"] is not None]
    return max(values) if values else None


def verdicts(result: dict) -> list[str]:
    """The lines that answer the question: the host's price on a cache hit against the budget,
    the enqueue's, and the device's in a graph (eager where no graph ran) against the floor."""
    lines = []
    hits = [r["dispatch_us"] for r in result["host_rows"] if r["cache_hit"] and r["dispatch_us"]]
    if hits:
        diffs = [c["diff"] for c in hits]
        price, spread = statistics.median(diffs), _spread(hits)
        # the check adds the same work to every cached call: rows that disagree about its price by
        # more than the budget, or jobs of one setting that do, say the noise hides it
        quartiles = statistics.quantiles(diffs, n=4) if len(diffs) > 1 else [0.0, 0.0, 0.0]
        rows_disagree = quartiles[2] - quartiles[0]
        if spread is not None and spread > BUDGET_US:
            judged = (f"not resolved: jobs of one setting differ by up to {spread:.2f} us, more than the "
                      f"{BUDGET_US} us budget (more --repeats or --calls)")
        elif rows_disagree > BUDGET_US:
            judged = (f"not resolved: the calls' differences spread over {rows_disagree:.2f} us (interquartile), "
                      f"more than the {BUDGET_US} us budget (more --repeats or --calls)")
        else:
            judged = "within" if price <= BUDGET_US else "OVER"
            judged += f" the {BUDGET_US} us budget"
        lines.append(f"host, cache hit (dispatch, {len(hits)} rows): the check adds {price:+.2f} us per call (median; "
                     f"{min(diffs):+.2f} to {max(diffs):+.2f}): {judged}"
                     + ("" if result["backend"] == "cuda" else " (cpu backend: the same Python as on the GPU, "
                        "on this machine's CPU)"))
    enqueue = [r["enqueue_us"] for r in result["host_rows"] if r["cache_hit"] and r["enqueue_us"]]
    if enqueue:
        diffs = [c["diff"] for c in enqueue]
        moved = [abs(r["enqueue_us"]["diff"]) for r in result["reference_rows"] if r["enqueue_us"]]
        lines.append(f"host, cache hit (enqueue, real launches): {statistics.median(diffs):+.2f} us per call (median; "
                     f"{min(diffs):+.2f} to {max(diffs):+.2f})"
                     + (f"; the rows the check does not touch moved by up to {max(moved):.2f} us" if moved else ""))
    rows = [r for r in result["device_rows"] if r["graph_us"]]
    what = "in a CUDA graph"
    if not rows:
        rows, what = [r for r in result["device_rows"] if r["eager_us"]], "eager (no CUDA graphs on this backend)"
    if rows:
        cs = [r["graph_us"] or r["eager_us"] for r in rows]
        ratios = [c["ratio"] for c in cs if c["ratio"]]
        floors = [abs(r["floor_us"]["diff"]) for r in rows if r["floor_us"]]
        lines.append(f"device, {what}: on/off {statistics.median(ratios):.3f} (median of {len(cs)} rows; "
                     f"{min(ratios):.3f} to {max(ratios):.3f}), {statistics.median(c['diff'] for c in cs):+.2f} us "
                     "per call (median)"
                     + (f"; the floor, which the check does not touch, moved by up to {max(floors):.2f} us"
                        if floors else ""))
    wrong = [r for r in result["device_rows"] if not r["correct"]]
    if result["device_rows"]:
        lines.append(f"every call correct in both settings: {'yes' if not wrong else f'NO ({len(wrong)} rows wrong)'}")
    return lines


def build(args, runs: dict) -> dict:
    """The comparison of ``runs`` (see :func:`run_all`), with what identifies the run."""
    first = runs["on"][0]
    some = first.get("device") or first.get("host")
    shared = first["device"].get("ranks_per_gpu", 1) if "device" in first else 1
    hosts, reference = host_rows(runs)
    result = {"world_size": some["world_size"], "backend": some["backend"], "device": some["device"],
              "ranks_per_gpu": shared, "date": datetime.date.today().isoformat(), "repeats": args.repeats,
              "budget_us": BUDGET_US, "command": " ".join(["benchmarks/call_check.py", *sys.argv[1:]]),
              "host_rows": hosts, "reference_rows": reference, "device_rows": device_rows(runs),
              "graph_calls": first["device"]["graph_calls"] if "device" in first else None,
              "notes": [], "runs": runs}
    if result["backend"] != "cuda":
        result["notes"].append("cpu backend (Triton's interpreter): times show the code path works, not the GPU's "
                               "price")
    result["verdict"] = verdicts(result)
    return result


# --- output -------------------------------------------------------------------------------------------


def cells(c: dict | None) -> list[str]:
    """on, off, on - off (with the spread where measured), on / off."""
    if not c:
        return ["-"] * 4
    diff = f"{c['diff']:+.2f}" + (f" ±{c['spread']:.2f}" if c["spread"] is not None else "")
    return [f"{c['on']:.2f}", f"{c['off']:.2f}", diff, f"{c['ratio']:.3f}" if c["ratio"] else "-"]


def md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|",
            *("| " + " | ".join(r) + " |" for r in rows)]


def table(result: dict) -> str:
    """The Markdown table of ``result``: host rows, reference rows, device rows, the verdict."""
    W = result["world_size"]
    lines = [f"The call check's price: benchmarks/ccl.py with IRIS_CHECK_CALLS=1 (on) and =0 (off), {W} ranks, "
             f"{result['device']}, {result['date']}; us per call, slowest rank; median of {result['repeats']} "
             f"job(s) per setting" + (", ± the spread between them" if result["repeats"] > 1 else "")]
    pair = ["on", "off", "on - off", "on/off"]
    if result["host_rows"]:
        lines += ["", "Host (ccl.py --host, 4 KiB fp32): dispatch = a cached call with its launch a no-op; "
                  "enqueue = real launches back to back (GPU only)", ""]
        rows = [[r["collective"], r["tensors"], *cells(r["dispatch_us"]), *cells(r["enqueue_us"])]
                for r in result["host_rows"]]
        rows += [[r["what"], "-", *cells(None), *cells(r["enqueue_us"])] for r in result["reference_rows"]]
        lines += md_table(["collective", "tensors", *(f"dispatch {h}" for h in pair), *(f"enqueue {h}" for h in pair)],
                          rows)
    if result["device_rows"]:
        graph = f"in a CUDA graph of {result['graph_calls']} calls" if result["backend"] == "cuda" else "(GPU only)"
        lines += ["", f"Device (ccl.py, plain tensors staged and heap tensors): eager, and graph = {graph}; floor = "
                  "every rank copying its bytes (untouched by the check)", ""]
        rows = [[r["collective"], r["dtype"], human(r["bytes"]), r["tensors"], *cells(r["eager_us"]),
                 *cells(r["graph_us"]), *cells(r["floor_us"])[:3], "yes" if r["correct"] else "NO"]
                for r in result["device_rows"]]
        lines += md_table(["collective", "dtype", "size", "tensors", *(f"eager {h}" for h in pair),
                           *(f"graph {h}" for h in pair), "floor on", "floor off", "floor on - off", "ok"], rows)
    lines += [""] + [f"verdict: {v}" for v in result["verdict"]] + [f"note: {n}" for n in result["notes"]]
    return "\n".join(lines)


def plot(result: dict, path: str) -> str | None:
    """Left: the host's dispatch (and enqueue) per cached call, on and off (hatched); right: the
    device's time per call of plain tensors against size (in a graph where timed), on solid and
    off dashed with hollow markers."""
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    rows = [r for r in result["host_rows"] if r["dispatch_us"] and r["cache_hit"]]
    series = [(key, s) for key in ("dispatch_us", "enqueue_us") for s in ("on", "off")
              if any(r[key] for r in rows)]
    width = 0.8 / max(1, len(series))
    for i, (key, s) in enumerate(series):
        left.bar([j + i * width for j in range(len(rows))], [r[key][s] if r[key] else 0 for r in rows], width,
                 label=f"{key.removesuffix('_us')}, check {s}", hatch="//" if s == "off" else None)
    left.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))],
                    [f"{r['collective']}\n{r['tensors']}" for r in rows], fontsize=6, rotation=45)
    left.set_ylabel("host us per call")
    left.set_title(f"host, cached calls, {result['world_size']} ranks, {result['device']}", fontsize=9)
    tallest = max((r[key][s] for key, s in series for r in rows if r[key]), default=1.0)
    left.set_ylim(0, 1.35 * tallest)  # room for the legend above the bars
    left.legend(fontsize=7, ncol=2, loc="upper left")
    key = "graph_us" if any(r["graph_us"] for r in result["device_rows"]) else "eager_us"
    for name in dict.fromkeys(r["collective"] for r in result["device_rows"]):
        pts = [r for r in result["device_rows"] if r["collective"] == name and r["tensors"] == "plain" and r[key]]
        line = None
        for s, style, face in (("on", "-", None), ("off", "--", "none")):
            line, = right.plot([r["bytes"] for r in pts], [r[key][s] for r in pts], style, marker="o", markersize=5,
                               markerfacecolor=face, color=line.get_color() if line else None,
                               label=f"{name}, check {s}")
    right.set_xscale("log", base=2)
    times = [r[key][s] for r in result["device_rows"] if r[key] for s in ("on", "off")]
    if times and max(times) > 10 * min(times):  # sizes whose times differ by orders of magnitude
        right.set_yscale("log")
    right.set_xlabel("bytes per rank")
    right.set_ylabel("device us per call" + (" (graph)" if key == "graph_us" else " (eager)"))
    right.set_title(f"device, plain tensors, {result['world_size']} ranks", fontsize=9)
    right.grid(True, alpha=0.3)
    right.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def stem_of(args, result: dict) -> str:
    """``<out>/call_check_<W>ranks[_cpu|_<G>gpu][_quick]``."""
    W, shared = result["world_size"], result["ranks_per_gpu"]
    where = "_cpu" if result["backend"] != "cuda" else f"_{W // shared}gpu" if shared > 1 else ""
    return os.path.join(args.out, f"call_check_{W}ranks{where}{'_quick' if args.quick else ''}")


def save(args, result: dict) -> None:
    """Prints the table; writes the JSON (every job's results too), the Markdown and the plot."""
    os.makedirs(args.out, exist_ok=True)
    stem = stem_of(args, result)
    why_no_plot = plot(result, stem + ".png")
    if why_no_plot:
        result["notes"].append(why_no_plot)
    text = table(result)
    print(text)
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(f"{text}\n\n`{result['command']}`\n")
    print(f"wrote {stem}.json, .md and .png", flush=True)


def main(argv=None) -> None:
    args = parse_args(argv)

    def stop(signum, frame):
        # a time limit's SIGTERM (tools/gpu-bench.sh): run_command ends the running job's ranks too
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    save(args, build(args, run_all(args)))


if __name__ == "__main__":
    main()
