"""The GPU benchmarks' code paths, in their tiny --quick mode on whatever backend this machine has.

No timing is judged here (benchmarks print tables; tests never assert speed): a benchmark must run
to the end, check its own kernels' results, and write its results file.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from iris.runtime.testing import run_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")


def results_file(directory, pattern):
    """The one file in ``directory`` matching ``pattern``: the benchmarks name their files after the
    backend (``_cpu``) and the GPUs the ranks share (``_1gpu``), so a pattern fits every machine."""
    found = sorted(directory.glob(pattern))
    assert len(found) == 1, f"expected one file {pattern} in {directory}, found {[f.name for f in found]}"
    return found[0]


@pytest.mark.multirank
def test_rma_bandwidth_quick(tmp_path):
    out = tmp_path / "rma"
    proc = run_ranks(2, os.path.join(BENCH, "rma_bandwidth.py"), "--quick", "--out", str(out), timeout=600)
    assert "remote GB/s" in proc.stdout, proc.stdout
    results = json.loads((tmp_path / "rma.json").read_text())
    rows = results["rows"] if isinstance(results, dict) and "rows" in results else results
    ops = {row["op"] for row in rows}
    assert {"load", "store", "get", "put", "copy"} <= ops, ops
    assert all(row["remote_gbps"] > 0 and row["local_gbps"] > 0 for row in rows)
    table = (tmp_path / "rma.md").read_text()  # the printed table, for the docs' results page
    assert "remote GB/s" in table and table.count("\n") >= len(rows) + 3, table


@pytest.mark.multirank
def test_peer_traffic_quick(tmp_path):
    # three ranks: tiles go to and come from every peer; each mode checks where its values came from
    proc = run_ranks(3, os.path.join(BENCH, "peer_traffic.py"), "--quick", "--sizes", "1", "--out", str(tmp_path),
                     timeout=600)
    result = json.loads((tmp_path / "peer_traffic_3ranks_quick.json").read_text())
    (row,) = result["rows"]
    modes = ("local", "read", "write", "share", "owner")
    assert all(row[mode]["correct"] and row[mode]["us"] > 0 for mode in modes), row
    assert "read/local" in proc.stdout and "read/local" in (tmp_path / "peer_traffic_3ranks_quick.md").read_text()
    if importlib.util.find_spec("matplotlib") is None:
        assert "no matplotlib" in proc.stdout, proc.stdout
        pytest.skip("matplotlib is not installed, so the plot was not checked (table and JSON were)")
    assert (tmp_path / "peer_traffic_3ranks_quick.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.multirank
def test_ccl_quick_writes_results_and_a_table(tmp_path):
    table = tmp_path / "table" / "_table.py"
    proc = run_ranks(2, os.path.join(BENCH, "ccl.py"), "--quick", "--collectives", "all_reduce,all_gather", "--out",
                     str(tmp_path), "--write-table", "--table-out", str(table), timeout=600)
    stem = results_file(tmp_path, "ccl_2ranks*_quick.json").with_suffix("")
    result = json.loads(stem.with_suffix(".json").read_text())
    assert {p["collective"] for p in result["points"]} == {"all_reduce", "all_gather"}, proc.stdout
    assert all(all(p["correct"].values()) for p in result["points"]), result["points"]
    assert "busbw" in stem.with_suffix(".md").read_text()
    backend, shared = result["backend"], result["ranks_per_gpu"]
    spec = importlib.util.spec_from_file_location("measured_table", table)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # this run's configuration has exactly the rows it measured (earlier rows of it replaced); the
    # committed rows of other world sizes stay (on a GPU: the cuda rows of 4 and 8 ranks)
    this_run = [r for r in module.TABLE if (r["backend"], r["world_size"], r.get("ranks_per_gpu", 0)) ==
                (backend, 2, shared)]
    assert this_run and all("measured" in r for r in this_run), this_run
    assert {r["collective"] for r in this_run} == {"all_reduce", "all_gather"}, module.TABLE
    assert any(r["backend"] != backend for r in module.TABLE)  # other backends' rows are kept
    # the fallback rows (any world size) are kept, after every measured row: the first match wins
    first_fallback = min(i for i, r in enumerate(module.TABLE) if r["world_size"] == 0)
    assert all(i < first_fallback for i, r in enumerate(module.TABLE) if "measured" in r), module.TABLE

    # --merge joins runs cut short: a later file's point replaces an earlier one, sizes are united,
    # and runs of different configurations are refused
    first = json.loads(stem.with_suffix(".json").read_text())
    later = json.loads(json.dumps(first))
    later["points"] = [p for p in later["points"] if p["collective"] == "all_reduce"]
    later["points"][0]["times_us"]["ccl"] = 12345.0
    moved = dict(later["points"][0], bytes=later["points"][0]["bytes"] * 4)  # a size only the later run has
    later["points"].append(moved)
    later["notes"].append("partial: a note that the merge drops")
    (tmp_path / "a.json").write_text(json.dumps(first))
    (tmp_path / "b.json").write_text(json.dumps(later))
    merged_dir = tmp_path / "merged"
    runs = [str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    done = subprocess.run([sys.executable, os.path.join(BENCH, "ccl.py"), "--quick", "--merge", *runs,
                           "--out", str(merged_dir)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    merged = json.loads(results_file(merged_dir, "ccl_2ranks*_quick.json").read_text())
    keys = [(p["collective"], p["bytes"]) for p in merged["points"]]
    assert len(keys) == len(set(keys)) == len(first["points"]) + 1, keys
    replaced = next(p for p in merged["points"] if (p["collective"], p["bytes"]) == (moved["collective"],
                                                                                     first["points"][0]["bytes"]))
    assert replaced["times_us"]["ccl"] == 12345.0
    assert not any(n.startswith("partial: ") for n in merged["notes"]), merged["notes"]
    later["world_size"] = 4
    (tmp_path / "b.json").write_text(json.dumps(later))
    refused = subprocess.run([sys.executable, os.path.join(BENCH, "ccl.py"), "--merge", *runs,
                              "--out", str(merged_dir)], capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and "merge only runs of one configuration" in refused.stderr, refused.stderr


@pytest.mark.multirank
def test_trace_overhead_quick(tmp_path):
    out = tmp_path / "overhead.md"
    proc = run_ranks(2, os.path.join(BENCH, "trace_overhead.py"), "--quick", "--out", str(out), timeout=600)
    table = out.read_text()
    for variant in ("| off |", "| on |"):
        assert variant in table, table
    assert "tracing=False == untraced" in proc.stdout + table, proc.stdout


def test_rma_short_gpu_calls_are_timed_in_batches(monkeypatch):
    # A 38 us kernel timed alone is known only to ~2 % (event resolution); time_ms must time
    # enough back-to-back calls per sample and divide. do_bench is replaced by a fake GPU clock.
    import importlib.util
    import sys

    import torch
    import triton.testing

    spec = importlib.util.spec_from_file_location("rma_bandwidth_under_test", os.path.join(BENCH, "rma_bandwidth.py"))
    rma = importlib.util.module_from_spec(spec)
    monkeypatch.setattr(sys, "argv", ["rma_bandwidth.py"])
    spec.loader.exec_module(rma)

    calls = []

    def kernel():
        calls.append(1)

    per_call_ms = [0.038]  # a 38 us kernel

    def fake_do_bench(fn, warmup, rep, return_mode):
        before = len(calls)
        fn()
        return per_call_ms[0] * (len(calls) - before)

    monkeypatch.setattr(triton.testing, "do_bench", fake_do_bench)
    ms = rma.time_ms(kernel, torch.device("cuda"), quick=False)
    assert abs(ms - 0.038) < 1e-9
    batch = len(calls) - 1  # the first sample times one call
    assert batch * 0.038 >= rma.MIN_SAMPLE_MS, batch
    calls.clear()
    per_call_ms[0] = 2.0  # long enough alone: one sample, no batch
    assert rma.time_ms(kernel, torch.device("cuda"), quick=False) == 2.0 and len(calls) == 1


@pytest.mark.once  # matplotlib redrawing a committed JSON: no kernel runs
@pytest.mark.parametrize("script, results", [("mps_host_blocking.py", "mps_host_blocking.json"),
                                             ("mps_residency.py", "mps_residency_8ranks.json"),
                                             ("watchdog_overhead.py", "watchdog_overhead_2ranks_placebo.json"),
                                             ("watchdog_overhead.py", "watchdog_overhead_2ranks.json")])
def test_gpu_probes_draw_their_committed_results(tmp_path, script, results):
    # The MPS probes and the watchdog A/B need a GPU to measure; their --plot path redraws a
    # committed GPU result anywhere (the watchdog's newest file layout and the eleventh session's).
    import shutil
    import subprocess
    import sys

    pytest.importorskip("matplotlib", reason="the plots need matplotlib (a test dependency of this session)")
    copy = tmp_path / results
    shutil.copy(os.path.join(BENCH, "results", results), copy)
    proc = subprocess.run([sys.executable, os.path.join(BENCH, script), "--plot", str(copy)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    png = copy.with_suffix(".png")
    assert png.exists() and png.stat().st_size > 10_000, proc.stdout
    if script == "watchdog_overhead.py":  # its table is redrawn too; spills only where kernels were recorded
        table = copy.with_suffix(".md").read_text()
        assert "| compiled out (us, median) |" in table, table
        assert ("spilled 4-byte words" in table) == (results == "watchdog_overhead_2ranks_placebo.json"), table


@pytest.mark.multirank
def test_fused_ops_quick(tmp_path):
    # every op, fused and unfused (gloo stands in for nccl on the cpu backend, next to ccl), checked
    # against each other
    proc = run_ranks(2, os.path.join(BENCH, "fused_ops.py"), "--quick", "--out", str(tmp_path), timeout=600)
    stem = results_file(tmp_path, "fused_ops_2ranks*_quick.json").with_suffix("")
    result = json.loads(stem.with_suffix(".json").read_text())
    assert {r["op"] for r in result["rows"]} == {"all_gather_matmul", "matmul_reduce_scatter", "matmul_all_reduce",
                                                 "matmul_all_gather"}, result
    assert all(r["correct"] and r["times_s"]["fused"] > 0 and r["times_s"]["ideal"] > 0 for r in result["rows"])
    # the unfused baseline with this library's collective, and that collective alone
    assert all(r["times_s"]["unfused_ccl"] > 0 and r["times_s"]["ccl"] > 0 for r in result["rows"]), result
    assert "f/ideal" in proc.stdout and "f/ideal" in stem.with_suffix(".md").read_text()


def test_backends_comparison_joins_points_of_both_backends(tmp_path):
    # The side-by-side table of benchmarks/backends.py, from two committed GPU result files given
    # as both backends (no launch): every point present on both sides gets one row.
    spec = importlib.util.spec_from_file_location("backends", os.path.join(BENCH, "backends.py"))
    backends = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backends)
    results_dir = os.path.join(BENCH, "results")
    with open(os.path.join(results_dir, "rma_bandwidth.json")) as f:
        rma = json.load(f)
    with open(os.path.join(results_dir, "tile_collectives_2ranks.json")) as f:
        coll = json.load(f)
    paths = []
    for backend in ("cuda", "nvshmem"):
        path = tmp_path / f"{backend}.json"
        path.write_text(json.dumps({"backend": backend, "rma": rma, "tile_collectives": coll}))
        paths.append(str(path))
    backends.main(["--combine", *paths, "--out", str(tmp_path)])
    result = json.loads((tmp_path / "backends_2ranks.json").read_text())
    rows = result["rows"]
    assert len([r for r in rows if r["benchmark"] == "rma remote GB/s"]) == len(rma["rows"])
    assert any(r["benchmark"] == "tile all-reduce us" for r in rows)
    assert all(abs(r["ratio"] - 1.0) < 1e-12 for r in rows)
    assert "nvshmem / cuda" in (tmp_path / "backends_2ranks.md").read_text()


@pytest.mark.multirank
def test_ops_host_times_every_op(tmp_path):
    proc = run_ranks(2, os.path.join(BENCH, "ops_host.py"), "--calls", "50", "--rounds", "2", "--out", str(tmp_path),
                     timeout=600)
    stem = results_file(tmp_path, "ops_host_2ranks*.json").with_suffix("")
    result = json.loads(stem.with_suffix(".json").read_text())
    names = [r["op"] for r in result["rows"]]
    assert names == ["matmul_all_reduce", "matmul_reduce_scatter", "all_gather_matmul", "matmul_all_gather",
                     "gemm core"], names
    assert all(r["dispatch_median_us"] > 0 for r in result["rows"]), result["rows"]
    assert "dispatch" in proc.stdout and "| gemm core |" in stem.with_suffix(".md").read_text()


@pytest.mark.multirank
@pytest.mark.once  # two launches of tile_collectives.py: the same interpreted code on every Triton line
def test_watchdog_overhead_quick_records_times_and_kernels(tmp_path):
    # One round of each setting plus A/B trees (this checkout again, watchdog on and off), two tile shapes and two
    # dtypes: every row has the times of every setting and the kernel of each as launched (the
    # grid; registers on the GPU only), and each dtype a "tuned" row: per setting the faster shape.
    proc = subprocess.run([sys.executable, os.path.join(BENCH, "watchdog_overhead.py"), "--quick", "--rounds", "1",
                           "--variants", "two_shot", "--shapes", "8x4,16x4", "--dtypes", "fp32,bf16",
                           "--tree", f"again={ROOT}", "--tree-off", f"placebo={ROOT}", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "watchdog_overhead_2ranks_quick.json").read_text())
    rows = {(r["dtype"], r["shape"]): r for r in result["rows"]}
    assert set(rows) == {(d, s) for d in ("fp32", "bf16") for s in ("8x4", "16x4", "tuned")}, sorted(rows)
    for row in result["rows"]:
        assert row["variant"] == "two_shot" and len(row["bounded_us"]) == len(row["trees_us"]["again"]) == 1
        assert set(row["kernels"]) == {"bounded", "compiled out", "again", "placebo"}
    # --tree-off runs its tree with the watchdog compiled out, --tree with it compiled in
    assert result["watchdog_compiled_in"] == {"bounded": True, "compiled out": False, "again": True,
                                              "placebo": False}, result["watchdog_compiled_in"]
    for dtype in ("fp32", "bf16"):
        tuned = rows[(dtype, "tuned")]
        for setting, times in (("bounded", "bounded_us"), ("compiled out", "compiled_out_us")):
            assert tuned[times] == [min(rows[(dtype, s)][times][0] for s in ("8x4", "16x4"))], (dtype, setting)
            # the shape it names is the faster one, whose kernel (its grid) was recorded
            shape = tuned["kernels"][setting]["shape"]
            assert rows[(dtype, shape)][times] == tuned[times] and rows[(dtype, shape)]["kernels"][setting]["grid"] >= 1
    table = (tmp_path / "watchdog_overhead_2ranks_quick.md").read_text()
    assert "| two_shot | 4096 | bf16 | tuned |" in table and "kernels as launched" in table, table


def test_sass_schedule_reads_the_benchmark_kernel_for_sm_90():
    # tools/sass_schedule.py compiles the benchmark's kernel for an H200 here (ptxas and nvdisasm
    # ship with Triton): a two-shot all-reduce of 8 x 1024 fp32 tiles at 2 ranks loads 2 x 8 vectors
    # of 4 floats per thread (4 warps), adds 64 and stores 16 (8 per rank); the watchdog compiled in
    # adds instructions and keeps the loop's work.
    def run(**env):
        child = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "IRIS_TIMEOUT_S")}
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "sass_schedule.py"), "--json",
                               "--variants", "two_shot"], env=dict(child, **env), capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        (row,) = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        return row

    bounded, off = run(), run(IRIS_TIMEOUT_S="0")
    for row in (bounded, off):
        order = row["schedule"]
        assert (order.count("L"), order.count("a"), order.count("S")) == (16, 64, 16), row
        assert row["registers"] > 0 and row["stack"] == 0, row
    assert bounded["instructions"] > off["instructions"], (bounded, off)
