"""Device tracing end to end: recorded events, dropped counts, the exported trace file (checked
against the trace-event format by the validator below), the summary and plot command, and what
tracing leaves in compiled kernels.

The multi-rank part runs workers/tracing_worker.py once per world size; the sm_90 part compiles
kernels in a child process without Triton's interpreter (no GPU needed).
"""

from __future__ import annotations

import collections
import importlib.util
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import iris.runtime.testing
from iris.device import EVENT_IDS, EVENT_NAMES, TraceEvent
from iris.device import _layout as layout
from iris.runtime import IrisUsageError
from iris.runtime import trace as trace_cli
from iris.runtime._trace_export import LANE_TID_STRIDE, RankTrace, build_trace, write_trace

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "workers", "tracing_worker.py")
PTX_WORKER = os.path.join(HERE, "workers", "tracing_ptx_worker.py")

# Mirrors tracing_worker.py: per program, 1 compute range, 3 stores to every rank, 2 atomic adds,
# 1 wait instant; GRID programs of BLOCK elements over N.
GRID, BLOCK, N, STORES_PER_PEER = 2, 64, 100, 3
RANK0_CAPACITY = 10


# --- the validator ---------------------------------------------------------------------------------------------
METADATA_ARGS = {"process_name": ("name", str), "process_labels": ("labels", str),
                 "process_sort_index": ("sort_index", int), "thread_name": ("name", str),
                 "thread_sort_index": ("sort_index", int)}
PHASES = {"X", "i", "I", "B", "E", "M", "C"}


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def validate_trace_events(trace) -> list[str]:
    """Problems that keep ``trace`` from being a valid trace-event JSON object (empty when valid).

    Checks the JSON object form (``traceEvents`` list, ``displayTimeUnit``, ``otherData``), the
    required fields of every event and their types (``ph``, ``name``, ``pid``, ``tid``, ``ts``,
    ``dur`` >= 0 for complete events, ``s`` for instants), the metadata events and their args,
    that every track and process used is named, and that complete events on one track nest.
    """
    problems = []
    if not isinstance(trace, dict):
        return ["top level is not a JSON object"]
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        return ["'traceEvents' is not a list"]
    if trace.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        problems.append(f"displayTimeUnit {trace.get('displayTimeUnit')!r} is not 'ms' or 'ns'")
    if "otherData" in trace and not isinstance(trace["otherData"], dict):
        problems.append("otherData is not an object")
    named_processes, named_threads, used_threads = set(), set(), set()
    spans = collections.defaultdict(list)
    for i, e in enumerate(events):
        where = f"traceEvents[{i}]"
        if not isinstance(e, dict):
            problems.append(f"{where} is not an object")
            continue
        ph = e.get("ph")
        if ph not in PHASES:
            problems.append(f"{where}: ph {ph!r} unknown")
            continue
        if not isinstance(e.get("name"), str) or not e["name"]:
            problems.append(f"{where}: name missing or not a string")
        if not isinstance(e.get("pid"), int) or isinstance(e.get("pid"), bool):
            problems.append(f"{where}: pid missing or not an int")
        if "args" in e and not isinstance(e["args"], dict):
            problems.append(f"{where}: args is not an object")
        if "cat" in e and not isinstance(e["cat"], str):
            problems.append(f"{where}: cat is not a string")
        if ph == "M":
            spec = METADATA_ARGS.get(e.get("name"))
            if spec is None:
                problems.append(f"{where}: unknown metadata event {e.get('name')!r}")
                continue
            key, kind = spec
            if not isinstance(e.get("args", {}).get(key), kind):
                problems.append(f"{where}: {e['name']} needs args.{key} of type {kind.__name__}")
            if e["name"].startswith("thread_"):
                if not isinstance(e.get("tid"), int):
                    problems.append(f"{where}: {e['name']} needs an int tid")
                elif e["name"] == "thread_name":
                    named_threads.add((e["pid"], e["tid"]))
            elif e["name"] == "process_name":
                named_processes.add(e["pid"])
            continue
        if not isinstance(e.get("tid"), int) or isinstance(e.get("tid"), bool):
            problems.append(f"{where}: tid missing or not an int")
            continue
        if not _is_number(e.get("ts")) or e["ts"] < 0:
            problems.append(f"{where}: ts {e.get('ts')!r} is not a number >= 0")
            continue
        used_threads.add((e["pid"], e["tid"]))
        if ph == "X":
            if not _is_number(e.get("dur")) or e["dur"] < 0:
                problems.append(f"{where}: complete event needs dur >= 0, has {e.get('dur')!r}")
                continue
            spans[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], i))
        if ph in ("i", "I") and e.get("s", "t") not in ("g", "p", "t"):
            problems.append(f"{where}: instant scope s={e.get('s')!r} is not g, p or t")
    for pid in {p for p, _ in used_threads} - named_processes:
        problems.append(f"process {pid} has events but no process_name")
    for track in sorted(used_threads - named_threads):
        problems.append(f"track {track} has events but no thread_name")
    for track, intervals in spans.items():
        intervals.sort(key=lambda s: (s[0], -s[1]))
        open_ends = []
        for start, end, i in intervals:
            while open_ends and open_ends[-1] <= start + 1e-9:
                open_ends.pop()
            if open_ends and end > open_ends[-1] + 1e-9:
                problems.append(f"traceEvents[{i}] on track {track} overlaps an enclosing event without nesting")
            open_ends.append(end)
    return problems


def load_strict(path):
    """json.load that refuses NaN and Infinity (not JSON, and Perfetto rejects them)."""
    with open(path, encoding="utf-8") as f:
        return json.load(f, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(f"{c} in trace")))


def test_validator_catches_broken_traces():
    good = {"traceEvents": [
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "rank 0"}},
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": 1, "args": {"name": "SM 1"}},
        {"name": "store", "ph": "X", "ts": 0.0, "dur": 2.0, "pid": 0, "tid": 1},
        {"name": "load", "ph": "X", "ts": 0.5, "dur": 1.0, "pid": 0, "tid": 1},
        {"name": "wait", "ph": "i", "s": "t", "ts": 3.0, "pid": 0, "tid": 1},
    ], "displayTimeUnit": "ns"}
    assert validate_trace_events(good) == []
    broken = [
        ("dur", -1.0, "dur >= 0"), ("ts", None, "ts"), ("tid", "1", "tid"), ("ph", "Q", "ph"), ("name", 3, "name"),
    ]
    for key, value, message in broken:
        bad = json.loads(json.dumps(good))
        bad["traceEvents"][2][key] = value
        assert any(message in p for p in validate_trace_events(bad)), (key, validate_trace_events(bad))
    overlapping = json.loads(json.dumps(good))
    overlapping["traceEvents"][3]["dur"] = 5.0  # starts inside 'store' and ends after it
    assert any("nesting" in p for p in validate_trace_events(overlapping))
    unnamed = json.loads(json.dumps(good))
    del unnamed["traceEvents"][1]
    assert any("no thread_name" in p for p in validate_trace_events(unnamed))


# --- ids ---------------------------------------------------------------------------------------------------------
def test_trace_event_ids_match_names():
    events = TraceEvent()
    for name, event_id in EVENT_IDS.items():
        value = getattr(events, name)
        assert getattr(value, "value", value) == event_id, name
    assert len(set(EVENT_NAMES.values())) == len(EVENT_NAMES)
    for op in ("load", "store", "get", "put", "copy", "atomic_add", "atomic_sub", "atomic_cas", "atomic_xchg",
               "atomic_xor", "atomic_and", "atomic_or", "atomic_min", "atomic_max", "compute", "wait", "barrier"):
        assert op in EVENT_IDS, op


# --- multi-rank: recording and export ----------------------------------------------------------------------------
@pytest.fixture(scope="module", params=iris.runtime.testing.world_sizes())
def exported(request, tmp_path_factory):
    """Run every tracing scenario on ``world`` ranks; the exported trace file and the job's output."""
    world = request.param
    out_dir = tmp_path_factory.mktemp(f"trace_w{world}")
    proc = iris.runtime.testing.run_ranks(world, WORKER, timeout=300, env={"IRIS_TRACE_TEST_DIR": str(out_dir)})
    return world, out_dir / f"trace_w{world}.json", proc.stdout


@pytest.mark.multirank
def test_scenarios_pass(exported):
    world, _, stdout = exported
    for name in ("not_enabled", "known_events", "compiled_out", "host_disabled", "dropped", "export"):
        assert f"PASS {name} " in stdout, f"scenario {name} did not pass on {world} ranks:\n{stdout}"
    per_program = 1 + STORES_PER_PEER * world + 2 + 1
    assert f"CHECK known-events {GRID * per_program} per rank" in stdout
    assert f"CHECK dropped {2 * GRID * per_program - 5} of {2 * GRID * per_program}" in stdout


@pytest.mark.multirank
def test_exported_trace_is_valid_and_exact(exported):
    world, path, _ = exported
    trace = load_strict(path)
    assert validate_trace_events(trace) == []
    assert trace["displayTimeUnit"] == "ns"
    events = trace["traceEvents"]
    meta = [e for e in events if e["ph"] == "M"]
    real = [e for e in events if e["ph"] != "M"]
    names = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert names == {r: f"rank {r}" for r in range(world)}
    assert min(e["ts"] for e in real) == 0.0, "timestamps must start at 0 (aligned to the earliest event)"

    per_program = 1 + STORES_PER_PEER * world + 2 + 1
    dropped = trace["otherData"]["dropped"]
    assert dropped == {str(r): (GRID * per_program - RANK0_CAPACITY if r == 0 else 0) for r in range(world)}
    assert [m["events"] for m in trace["otherData"]["ranks"]] == [
        RANK0_CAPACITY if r == 0 else GRID * per_program for r in range(world)]

    for e in real:
        args = e["args"]
        assert set(args) >= {"target_rank", "address", "bytes", "pid_m", "pid_n", "program", "sm"}, args
        assert args["address"].startswith("0x") and int(args["address"], 16) > 0
        assert e["tid"] % LANE_TID_STRIDE == args["sm"]
        assert e["ph"] == ("i" if e["name"] == "wait" else "X"), e
        if e["name"] in ("store", "compute", "atomic_add"):
            assert "heap_offset" in args, e  # every buffer of the kernel is on the heap

    by_rank = collections.defaultdict(list)
    for e in real:
        by_rank[e["pid"]].append(e)
    assert len(by_rank[0]) == RANK0_CAPACITY
    for rank in range(1, world):
        mine = by_rank[rank]
        counts = collections.Counter(e["name"] for e in mine)
        assert counts == {"compute": GRID, "store": GRID * STORES_PER_PEER * world, "atomic_add": 2 * GRID,
                          "wait": GRID}, counts
        store_targets = collections.Counter(e["args"]["target_rank"] for e in mine if e["name"] == "store")
        assert store_targets == {q: GRID * STORES_PER_PEER for q in range(world)}
        atomic_targets = collections.Counter(e["args"]["target_rank"] for e in mine if e["name"] == "atomic_add")
        assert atomic_targets == collections.Counter([(rank + 1) % world, (rank + world - 1) % world] * GRID)
        nbytes = collections.Counter()
        for e in mine:
            nbytes[e["name"]] += e["args"]["bytes"]
        assert nbytes == {"compute": N * 4, "store": STORES_PER_PEER * world * N * 4, "atomic_add": 2 * GRID * 4,
                          "wait": GRID * 4}, nbytes
        assert {e["args"]["program"] for e in mine} == set(range(GRID))
        assert {(e["args"]["pid_m"], e["args"]["pid_n"]) for e in mine if e["name"] == "compute"} == {(0, 7), (1, 7)}
        assert all(e["dur"] >= 0 for e in mine if e["ph"] == "X")

    summary = trace_cli.summarize(trace)
    for rank in range(world):
        assert f"dropped: {dropped[str(rank)]}" in summary
    # Which events rank 0 kept depends on the order programs claimed slots (sequential under the
    # interpreter, concurrent on a GPU), so look for the names that were actually kept.
    for name in {e["name"] for e in real}:
        assert name in summary, (name, summary)
    if any(e["ph"] == "i" for e in real):
        assert "(instant)" in summary


# --- export format on synthetic events (GPU-like: programs sharing an SM) --------------------------------------
def _row(event_id, start, end, sm, program, target=1, nbytes=256, address=0x1000):
    row = [0] * layout.TRACE_EVENT_FIELDS
    row[layout.EVENT_ID], row[layout.EVENT_START], row[layout.EVENT_END] = event_id, start, end
    row[layout.EVENT_SM], row[layout.EVENT_PID], row[layout.EVENT_TARGET] = sm, program, target
    row[layout.EVENT_BYTES], row[layout.EVENT_ADDRESS] = nbytes, address
    row[layout.EVENT_PID_M] = row[layout.EVENT_PID_N] = -1
    return row


def synthetic_trace() -> dict:
    t = 1_700_000_000_000_000_000  # %globaltimer counts from about the Unix epoch
    store, compute, wait = EVENT_IDS["store"], EVENT_IDS["compute"], EVENT_IDS["wait"]
    rank0 = np.array([
        _row(compute, t + 1000, t + 9000, sm=3, program=0),
        _row(store, t + 2000, t + 3000, sm=3, program=0),
        _row(store, t + 4000, t + 8000, sm=3, program=0),
        _row(store, t + 2500, t + 6000, sm=3, program=1),     # another program on SM 3, overlapping
        _row(wait, t + 9500, 0, sm=3, program=0),              # never closed: an instant
        _row(store, t + 500, t + 500, sm=7, program=2),       # zero duration
        [0] * layout.TRACE_EVENT_FIELDS,                       # claimed, never written
    ], dtype=np.int64)
    rank1 = np.array([_row(store, t + 200, t + 700, sm=0, program=0, target=0, address=0x5000 + 64)], dtype=np.int64)
    return build_trace([
        RankTrace(rank=1, events=rank1, dropped=0, max_events=4, backend="cuda", device="cuda:0 (H200)",
                  heap_base=0x5000, heap_size=4096),
        RankTrace(rank=0, events=rank0, dropped=3, max_events=7, backend="cuda", device="cuda:0 (H200)"),
    ])


def test_export_format_splits_overlapping_programs_and_aligns_time():
    trace = synthetic_trace()
    assert validate_trace_events(trace) == []
    real = [e for e in trace["traceEvents"] if e["ph"] != "M"]
    assert len(real) == 7  # the unwritten row is left out ...
    ranks = {m["rank"]: m for m in trace["otherData"]["ranks"]}
    assert ranks[0]["incomplete"] == 1 and ranks[0]["dropped"] == 3  # ... and counted
    assert min(e["ts"] for e in real) == 0.0 and trace["otherData"]["time_origin_ns"] == 1_700_000_000_000_000_200
    first_store = next(e for e in real if e["pid"] == 0 and e["name"] == "store" and e["args"]["program"] == 0)
    assert first_store["ts"] == 1.8 and first_store["dur"] == 1.0  # (t + 2000 - origin) ns -> us
    other_program = next(e for e in real if e["args"]["program"] == 1)
    assert other_program["tid"] == 3 + LANE_TID_STRIDE, "an overlapping program must get its own track of SM 3"
    thread_names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert thread_names[(0, 3)] == "SM 3" and thread_names[(0, 3 + LANE_TID_STRIDE)] == "SM 3 #2"
    wait = next(e for e in real if e["name"] == "wait")
    assert wait["ph"] == "i" and wait["s"] == "t" and "dur" not in wait
    zero = next(e for e in real if e["tid"] == 7)
    assert zero["ph"] == "X" and zero["dur"] == 0.0
    remote = next(e for e in real if e["pid"] == 1)
    assert remote["args"]["heap_offset"] == 64 and remote["args"]["address"] == hex(0x5000 + 64)
    assert "heap_offset" not in first_store["args"]  # rank 0 gave no heap range


def test_cli_summary_and_plot(tmp_path):
    path = tmp_path / "synthetic.json"
    write_trace(synthetic_trace(), path)
    assert validate_trace_events(load_strict(path)) == []
    env = {k: v for k, v in os.environ.items() if k != "IRIS_TRACE_TEST_DIR"}
    summary = subprocess.run([sys.executable, "-m", "iris.runtime.trace", "summary", str(path)], capture_output=True,
                             text=True, timeout=120, env=env)
    assert summary.returncode == 0, summary.stderr
    lines = summary.stdout.splitlines()
    row = next(line for line in lines if line.split()[:2] == ["0", "store"])
    assert row.split()[2] == "4", row  # 4 stores on rank 0 (3 on SM 3, 1 on SM 7)
    assert "dropped: 3" in summary.stdout and "(instant)" in summary.stdout
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed here (the optional 'trace' extra), so no PNG can be drawn; "
                    "the summary part passed")
    png = tmp_path / "timeline.png"
    plot = subprocess.run([sys.executable, "-m", "iris.runtime.trace", "plot", str(path), "--png", str(png)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert plot.returncode == 0, plot.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert trace_cli.main(["plot", str(path), "--png", str(tmp_path / "by_rank.png"), "--rows", "rank"]) == 0


def test_cli_bad_input_names_the_file(tmp_path, capsys):
    missing = tmp_path / "nope.json"
    assert trace_cli.main(["summary", str(missing)]) == 2
    assert "no such file" in capsys.readouterr().err
    not_trace = tmp_path / "x.json"
    not_trace.write_text('{"events": []}')
    assert trace_cli.main(["summary", str(not_trace)]) == 2
    assert "no 'traceEvents' list" in capsys.readouterr().err


def test_plot_without_matplotlib_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes "import matplotlib" raise ImportError
    with pytest.raises(IrisUsageError, match=r"iris-runtime\[trace\]"):
        trace_cli.plot_timeline(synthetic_trace(), tmp_path / "x.png")


# --- compiled kernels --------------------------------------------------------------------------------------------
def test_sm90_traced_kernel_compiles_and_tracing_false_is_free():
    # An explicit "0": without it, iris.device picks the interpreter on a machine with no GPU.
    env = {k: v for k, v in os.environ.items() if k != "IRIS_BACKEND"}
    env["TRITON_INTERPRET"] = "0"
    proc = subprocess.run([sys.executable, PTX_WORKER], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    assert "CHECK traced:" in proc.stdout
    assert "CHECK compiled-out: tracing=False PTX == untraced PTX == free-function PTX" in proc.stdout
