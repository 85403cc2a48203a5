"""The GPU benchmarks' code paths, in their tiny --quick mode on whatever backend this machine has.

No timing is judged here (benchmarks print tables; tests never assert speed): a benchmark must run
to the end, check its own kernels' results, and write its results file.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
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
def test_ccl_quick_writes_results_and_a_table(tmp_path):
    # --write-table into a copy of a measured card's file (JSON), so that its other rows must stay
    committed_file = os.path.join(ROOT, "packages", "iris-collectives", "src", "iris", "collectives", "ccl", "tables",
                                  "NVIDIA_H200.json")
    table = tmp_path / "table" / "NVIDIA_H200.json"
    table.parent.mkdir()
    shutil.copy(committed_file, table)
    proc = run_ranks(2, os.path.join(BENCH, "ccl.py"), "--quick", "--collectives", "all_reduce,all_gather", "--out",
                     str(tmp_path), "--write-table", "--table-out", str(table), timeout=600)
    stem = results_file(tmp_path, "ccl_2ranks*_quick.json").with_suffix("")
    result = json.loads(stem.with_suffix(".json").read_text())
    assert {p["collective"] for p in result["points"]} == {"all_reduce", "all_gather"}, proc.stdout
    assert {p["dtype"] for p in result["points"]} == {"bf16", "fp32"}, proc.stdout
    assert all(all(p["correct"].values()) for p in result["points"]), result["points"]
    # plain and heap tensors, and every candidate of the table, timed side by side
    assert all({"ccl", "heap", "registered"} <= set(p["eager_us"]) for p in result["points"]), result["points"]
    # the all-reduce on heap tensors in one pass and in rounds (Config.heap_chunk), for the table
    assert all("0" in p["heap_rounds_us"] for p in result["points"] if p["collective"] == "all_reduce"), result
    text = stem.with_suffix(".md").read_text()
    assert "ccl/peer" in text and "pln/heap" in text and "reg/heap" in text and "floor" in text, text
    backend, shared = result["backend"], result["ranks_per_gpu"]

    written_file = json.loads(table.read_text())
    committed_file = json.loads(open(committed_file).read())
    # the file is the card's still: its device and capability, rows, nothing else
    assert {k: v for k, v in written_file.items() if k != "rows"} == \
        {k: v for k, v in committed_file.items() if k != "rows"}, written_file.keys()
    written, committed = written_file["rows"], committed_file["rows"]

    def same_config(r):
        return (r["backend"], r["world_size"], r.get("ranks_per_gpu", 0)) == (backend, 2, shared)

    # this run's configuration has exactly the rows it measured for the collectives it measured
    # (earlier rows of those replaced); its other collectives' rows and the committed rows of other
    # world sizes stay (on a GPU: the cuda rows of all four collectives at 4 and 8 ranks)
    ran = ("all_reduce", "all_gather")
    this_run = [r for r in written if same_config(r) and r["collective"] in ran]
    assert this_run and all("measured" in r for r in this_run), this_run
    assert {r["collective"] for r in this_run} == set(ran), written
    assert [r for r in written if same_config(r) and r["collective"] not in ran] == \
        [r for r in committed if same_config(r) and r["collective"] not in ran], written
    assert [r for r in written if not same_config(r)] == [r for r in committed if not same_config(r)], written
    # fp32's rows serve any dtype, bf16's bf16 and fp16; specific dtypes come first
    assert {r["dtype"] for r in this_run} == {"*", "bfloat16", "float16"}, this_run
    assert [r["dtype"] == "*" for r in this_run] == sorted(r["dtype"] == "*" for r in this_run), this_run
    assert backend == "cuda" or any(r["backend"] == "cuda" for r in written)  # other backends' rows are kept
    # every row of a card's file is measured (the rows for any world size are in fallback.json)
    assert all("measured" in r and r["world_size"] != 0 for r in written), written


@pytest.mark.multirank
def test_p2p_quick_writes_latency_and_bandwidth(tmp_path):
    # send/recv as a ping-pong and back to back (the bandwidth message flows through the inbox in
    # chunks between plain tensors, and is copied once between heap tensors), checked, with
    # ccl.broadcast of the same bytes beside it; the peers need CUDA and say so
    proc = run_ranks(2, os.path.join(BENCH, "p2p.py"), "--quick", "--out", str(tmp_path), timeout=600)
    stem = results_file(tmp_path, "p2p_2ranks*_quick.json").with_suffix("")
    result = json.loads(stem.with_suffix(".json").read_text())
    assert [p["bytes"] for p in result["latency"]] == [4, 4096] and [p["bytes"] for p in result["bandwidth"]] == [65536]
    for point in result["latency"] + result["bandwidth"]:
        assert point["correct"] and point["eager_us"]["ccl"] > 0 and point["eager_us"]["bcast"] > 0, point
        assert point["eager_us"]["heap"] > 0, point  # heap tensors: the large message is copied once
    assert all(p["floor_us"] > 0 for p in result["bandwidth"]), result
    assert result["mailboxes"]["chunk_bytes"] < 65536, result  # chunked through the inbox
    if result["backend"] != "cuda":
        assert result["peer"] is None and any("peer columns skipped" in n for n in result["notes"]), result
    text = stem.with_suffix(".md").read_text()
    assert "latency: half a ping-pong round trip" in text and "ccl/flr" in text and "grph/mty" in text, text
    assert "heap/flr" in text, text
    assert "ccl/flr" in proc.stdout, proc.stdout


@pytest.mark.multirank
def test_moe_quick_prints_its_table(tmp_path):
    # dispatch and combine at two token counts, each checked (counts per expert, the combine bit for bit,
    # the peer's sums close), beside the peer and the copy floor: gloo's all_to_all_single and no files on
    # the cpu backend; on the GPU suite (IRIS_BACKEND=cuda, ranks sharing a GPU, where NCCL refuses and
    # NVSHMEM ends the job) ccl.all_to_all of padded buffers, and the results files
    proc = run_ranks(2, os.path.join(BENCH, "moe.py"), "--quick", "--out", str(tmp_path), timeout=600)
    out = proc.stdout
    cuda = os.environ.get("IRIS_BACKEND") == "cuda"
    peer = "ccl.all_to_all, padded" if cuda else "gloo all_to_all_single"
    assert f"peer = {peer}" in out and "iris/peer" in out and "grph/flr" in out, out
    for tokens in (4, 8):
        for op in ("dispatch", "combine"):
            assert re.search(rf"(?m)^ +{tokens} +{op} +\d", out), (tokens, op, out)
    assert "wrong result" not in out and "WRONG" not in out, out
    if cuda:
        assert {p.suffix for p in tmp_path.iterdir()} >= {".json", ".md"}, out
    else:
        assert "no results files" in out and not list(tmp_path.iterdir()), out


@pytest.mark.multirank
def test_trace_overhead_quick(tmp_path):
    proc = run_ranks(2, os.path.join(BENCH, "trace_overhead.py"), "--quick", "--out", str(tmp_path), timeout=600)
    stem = results_file(tmp_path, "trace_overhead*_quick.json").with_suffix("")
    result = json.loads(stem.with_suffix(".json").read_text())
    assert set(result["us"]) == {"off", "idle", "on", "torch copy_"} and all(v > 0 for v in result["us"].values())
    table = stem.with_suffix(".md").read_text()
    for variant in ("| off |", "| on |", "| torch copy_ |"):
        assert variant in table, table
    assert "| variant |" in proc.stdout, proc.stdout
    if importlib.util.find_spec("matplotlib") is not None:
        assert stem.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rma_short_gpu_calls_are_timed_in_batches(monkeypatch):
    # A 38 us kernel timed alone is known only to ~2 % (event resolution); time_ms must time
    # enough back-to-back calls per sample and divide. do_bench is replaced by a fake GPU clock.
    import importlib.util
    import sys

    import torch
    import triton.testing

    monkeypatch.syspath_prepend(BENCH)  # the benchmarks import their shared module, common.py, from beside them
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


@pytest.mark.multirank
def test_fused_ops_quick(tmp_path):
    # every op, fused and unfused (gloo stands in for nccl on the cpu backend, next to ccl), checked
    # against each other
    # both shape sets, and the strategies named beside the table's choice, each checked
    # (bf16 runs as fp32 in quick mode: the interpreter's bf16 products are widened anyway)
    proc = run_ranks(2, os.path.join(BENCH, "fused_ops.py"), "--quick", "--shapes", "mlp,square", "--variants",
                     "rotated,rotated/input,one_shot", "--dtype", "bf16,fp16", "--b-layout", "columns", "--out",
                     str(tmp_path), timeout=600)
    stem = results_file(tmp_path, "fused_ops_2ranks*_quick.json").with_suffix("")
    result = json.loads(stem.with_suffix(".json").read_text())
    assert result["b_layout"] == "columns", result  # b as the nn layers pass it (weight.t())
    assert {(r["op"], r["shapes"], r["dtype"]) for r in result["rows"]} == {
        (op, shape, dt) for op in ("all_gather_matmul", "matmul_reduce_scatter", "matmul_all_reduce",
                                   "matmul_all_gather") for shape in ("mlp", "square") for dt in ("fp32", "fp16")}
    assert all(r["correct"] and r["times_s"]["fused"] > 0 and r["times_s"]["ideal"] > 0 for r in result["rows"])
    # the unfused baseline with this library's collective, and that collective alone
    assert all(r["times_s"]["unfused_ccl"] > 0 and r["times_s"]["ccl"] > 0 for r in result["rows"]), result
    # the best alternative is the fastest of those that ran: on the cpu backend torch's symmetric
    # memory does not run (the json says why) and it is cuBLAS + gloo or + ccl; on a GPU torch's ops count
    alternatives = ("torch_fused", "torch_unfused", "unfused", "unfused_ccl")
    assert all(r["times_s"]["best_alt"] == min(r["times_s"][k] for k in alternatives if r["times_s"].get(k))
               for r in result["rows"]), result
    if result["device"].startswith("cpu"):
        assert result["torch_fused_note"], result
    strategies = {(r["op"], k) for r in result["rows"] for k in r["rel_error"]}
    assert {("matmul_all_reduce", "rotated"), ("matmul_all_reduce", "one_shot"),
            ("matmul_reduce_scatter", "rotated"), ("matmul_reduce_scatter", "rotated/input")} <= strategies, strategies
    assert "alt/fused" in proc.stdout and "fused/GEMM" in stem.with_suffix(".md").read_text()


@pytest.mark.multirank
def test_tp_mlp_quick(tmp_path):
    # the compiled sequence-parallel MLP (aot_eager here), forward and forward + backward, checked against
    # cuBLAS + this library's collectives; torch's peers need CUDA and say so
    proc = run_ranks(2, os.path.join(BENCH, "fused_ops.py"), "--mlp", "--quick", "--out", str(tmp_path), timeout=600)
    stem = results_file(tmp_path, "tp_mlp_2ranks*_quick.json").with_suffix("")
    result = json.loads(stem.with_suffix(".json").read_text())
    assert [r["mode"] for r in result["rows"]] == ["fwd", "fwd+bwd"], result
    for row in result["rows"]:
        assert row["correct"] and row["times_s"]["iris"] > 0 and row["times_s"]["iris_unfused"] > 0, row
        assert row["times_s"]["iris_regather"] > 0, row
        assert set(row["times_s"]) == {"iris", "torch_async_tp", "torch_fused", "torch_unfused", "iris_unfused",
                                       "iris_regather"}
        # each of torch's peers either ran (on a GPU) or says why not (torch's symmetric memory needs CUDA)
        for peer in ("torch_async_tp", "torch_fused", "torch_unfused"):
            assert (row["times_s"][peer] or 0) > 0 or row["notes"].get(peer), (peer, row)
            if result["device"].startswith("cpu"):
                assert row["notes"].get(peer), (peer, row["notes"])
    assert "iris/torch" in proc.stdout and "iris/torch" in stem.with_suffix(".md").read_text()
    if importlib.util.find_spec("matplotlib") is not None:
        assert stem.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.multirank
def test_fused_norm_quick(tmp_path):
    # the fused all-reduce + residual + RMSNorm beside the unfused pairs (ccl + the norm, eager and
    # compiled; torch's symmetric-memory pairs need CUDA and say so), each checked against the fused op
    # and the two-shot strategy forced beside the table's choice (--variants)
    proc = run_ranks(2, os.path.join(BENCH, "fused_norm.py"), "--quick", "--variants", "two_shot", "--out",
                     str(tmp_path), timeout=600)
    stem = results_file(tmp_path, "fused_norm_2ranks*_quick.json").with_suffix("")
    result = json.loads(stem.with_suffix(".json").read_text())
    assert [(r["tokens"], r["hidden"]) for r in result["rows"]] == [(3, 64), (16, 64)], result["rows"]
    for row in result["rows"]:
        assert row["correct"] and row["floor_us"] > 0 and row["all_reduce_us"]["ccl"] > 0, row
        assert {"fused", "fused_heap", "ccl_norm", "ccl_norm_c", "fused_two_shot"} <= {
            k for k, v in row["eager_us"].items() if v > 0}
        assert set(row["rel_error"]) == set(row["eager_us"]), row
    if result["device"].startswith("cpu"):
        assert any("torch columns" in n for n in result["notes"]), result["notes"]
    text = stem.with_suffix(".md").read_text()
    assert "fused/pair" in proc.stdout and "fused/pair" in text and "fused/AR" in text, proc.stdout
    assert "fused_two_shot" in text, text
    if importlib.util.find_spec("matplotlib") is not None:
        assert stem.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.once  # arithmetic only: no kernel, nothing that depends on Triton
def test_multinode_model_writes_its_tables(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(BENCH, "multinode_model.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "multinode_model.json").read_text())
    assert {r["nodes"] for r in result["allreduce"]} == {1, 2, 4, 16}, result["allreduce"]
    assert all(r["fused_us"] <= r["unfused_us"] * 1.1 for r in result["fused"]), result["fused"]
    assert "Hierarchical all-reduce" in (tmp_path / "multinode_model.md").read_text()


@pytest.mark.multirank
def test_ccl_host_times_the_python_of_a_call(tmp_path):
    proc = run_ranks(2, os.path.join(BENCH, "ccl.py"), "--host", "--calls", "50", "--rounds", "2", "--out",
                     str(tmp_path), timeout=600)
    stem = results_file(tmp_path, "ccl_host_2ranks*.json").with_suffix("")
    assert json.loads(stem.with_suffix(".json").read_text()), proc.stdout
    assert stem.with_suffix(".md").read_text().strip(), proc.stdout


@pytest.mark.multirank
@pytest.mark.once  # the backend's adapter does not depend on Triton; ccl's kernels are tested on every line
def test_torch_backend_quick(tmp_path):
    # dist.all_reduce through backend="iris" next to ccl and gloo (torch's symmetric memory needs a GPU),
    # a DDP step over iris and over gloo, and the host's microseconds per call of each layer
    proc = run_ranks(2, os.path.join(BENCH, "torch_backend.py"), "--quick", "--out", str(tmp_path), timeout=600)
    stem = results_file(tmp_path, "torch_backend_2ranks*_quick.json").with_suffix("")
    result = json.loads(stem.with_suffix(".json").read_text())
    assert {p["dtype"] for p in result["points"]} == {"bf16", "fp32"}, result
    for point in result["points"]:
        assert {"iris", "ccl", "gloo"} <= set(point["us"]) and all(point["correct"].values()), point
    assert set(result["ddp"]["step_us"]) == {"iris", "gloo", "no ddp"}, result["ddp"]
    assert set(result["host"]["rows"]) == {"ccl", "backend", "dist"} and result["bootstrap"] == "mpi", result
    assert all(row["dispatch_us"] > 0 for row in result["host"]["rows"].values()), result["host"]
    text = stem.with_suffix(".md").read_text()
    assert "iris/ccl" in text and "DDP training step" in text and "backend overhead over ccl" in text, text
    assert "iris/ccl" in proc.stdout
    if importlib.util.find_spec("matplotlib") is not None:
        assert stem.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.multirank
@pytest.mark.once  # the group path of ccl is tested on every Triton line; this is the script's
def test_ccl_groups_quick(tmp_path):
    # 4 ranks as 2 groups of 2 next to 2 contexts of 2 ranks: every call checked, the ratio printed
    proc = run_ranks(4, os.path.join(BENCH, "ccl.py"), "--quick", "--group-size", "2", "--dtypes", "fp32",
                     "--collectives", "all_reduce,broadcast", "--out", str(tmp_path), timeout=600)
    stem = results_file(tmp_path, "ccl_groups_4ranks_g2_quick.json").with_suffix("")
    result = json.loads(stem.with_suffix(".json").read_text())
    assert result["group_size"] == 2 and result["world_size"] == 4, result
    assert {p["collective"] for p in result["points"]} == {"all_reduce", "broadcast"}, result["points"]
    for point in result["points"]:
        assert point["correct"] == {"group": True, "context": True}, point
        assert point["group_us"] > 0 and point["context_us"] > 0 and point["floor_us"] > 0, point
    text = stem.with_suffix(".md").read_text()
    assert "group us" in text and "context us" in text and "floor us" in text, text
    assert "ratio" in proc.stdout


@pytest.mark.multirank
@pytest.mark.once  # the script compares two ccl.py jobs; ccl.py's paths are tested on every line above
def test_call_check_compares_the_check_on_and_off(tmp_path):
    # ccl.py --host and ccl.py, each as a job with IRIS_CHECK_CALLS=1 and one with =0, launched by the
    # script itself (not under mpiexec), compared in one table with a verdict against the host budget
    proc = subprocess.run([sys.executable, os.path.join(BENCH, "call_check.py"), "--ranks", "2", "--quick",
                           "--collectives", "all_reduce,all_gather", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-4000:]
    stem = results_file(tmp_path, "call_check_2ranks*_quick.json").with_suffix("")
    result = json.loads(stem.with_suffix(".json").read_text())
    # each setting ran as its own jobs, and the ranks saw it (a launcher that drops the variable would
    # compare the check with itself)
    for setting, on in (("on", True), ("off", False)):
        assert [job[kind]["check_calls"] for job in result["runs"][setting] for kind in ("host", "device")] == \
            [on, on], (setting, result["runs"][setting])
    hits = [r for r in result["host_rows"] if r["cache_hit"]]
    assert {(r["collective"], r["tensors"]) for r in hits} >= {("all_reduce", "plain"), ("all_reduce", "heap")}, hits
    assert all(r["dispatch_us"]["on"] > 0 and r["dispatch_us"]["off"] > 0 for r in result["host_rows"]), hits
    assert {(r["collective"], r["tensors"]) for r in result["device_rows"]} == {
        (c, t) for c in ("all_reduce", "all_gather") for t in ("plain", "heap")}, result["device_rows"]
    assert all(r["correct"] and r["eager_us"]["on"] > 0 and r["eager_us"]["off"] > 0 and r["floor_us"]
               for r in result["device_rows"]), result["device_rows"]
    if result["backend"] == "cuda":  # the GPU suite (IRIS_BACKEND=cuda): real launches and CUDA graphs too
        assert all(r["enqueue_us"] for r in hits) and all(r["graph_us"] for r in result["device_rows"]), result
    assert result["budget_us"] == 0.3 and any(v.startswith("host, cache hit") for v in result["verdict"]), result
    assert "every call correct in both settings: yes" in result["verdict"], result["verdict"]
    text = stem.with_suffix(".md").read_text()
    for column in ("dispatch on - off", "eager on/off", "graph on/off", "floor on - off", "verdict: host, cache hit"):
        assert column in text and column in proc.stdout, (column, text)
    if importlib.util.find_spec("matplotlib") is not None:
        assert stem.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.once  # arithmetic on results: no kernel, nothing that depends on Triton
def test_call_check_verdict_against_the_host_budget(monkeypatch):
    # the verdict of benchmarks/call_check.py on made-up jobs: a price under 0.3 us is within the budget,
    # one over it is OVER, and rows that disagree by more than the budget leave it unresolved; the rows
    # that agree on every call by design (not cache hits) never count, and a wrong call is reported
    monkeypatch.syspath_prepend(BENCH)
    spec = importlib.util.spec_from_file_location("call_check_under_test", os.path.join(BENCH, "call_check.py"))
    call_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(call_check)
    args = call_check.parse_args(["--repeats", "1"])

    def runs(prices, correct=True):
        def job(setting):
            rows = [{"collective": c, "heap": heap, "agreed": False,
                     "dispatch_median_us": 2.0 + (price if setting == "on" else 0.0)}
                    for (c, heap), price in zip([(c, h) for h in (False, True) for c in ("all_reduce", "all_gather")],
                                                prices)]
            rows.append({"collective": "all_reduce", "heap": False, "agreed": True,
                         "dispatch_median_us": 50.0 if setting == "on" else 10.0})
            point = {"collective": "all_reduce", "dtype": "bf16", "bytes": 4096, "eager_us": {"ccl": 9.0, "heap": 8.0},
                     "graph_us": {}, "correct": {"ccl": correct or setting == "off", "heap": True}, "floor_us": 1.0}
            common = {"world_size": 2, "backend": "cpu", "device": "cpu (interpreter)", "check_calls": setting == "on"}
            return {"host": dict(common, rows=rows, peer_rows=[], empty_triton_launch_us=None,
                                 empty_direct_launch_us=None),
                    "device": dict(common, ranks_per_gpu=2, graph_calls=20, points=[point])}
        return {"on": [job("on")], "off": [job("off")]}

    def verdict(prices, correct=True):
        result = call_check.build(args, runs(prices, correct))
        return next(v for v in result["verdict"] if v.startswith("host, cache hit")), result

    text, result = verdict([0.1, 0.1, 0.1, 0.1])
    assert "4 rows" in text and "+0.10 us" in text and "within the 0.3 us budget" in text, text
    assert "every call correct in both settings: yes" in result["verdict"], result["verdict"]
    assert "| all_reduce | plain, agreed |" in call_check.table(result)  # shown, but not a cache hit
    text, _ = verdict([0.5, 0.5, 0.5, 0.5])
    assert "+0.50 us" in text and "OVER the 0.3 us budget" in text, text
    text, _ = verdict([-2.0, 2.0, -1.0, 1.5])
    assert "not resolved" in text and "within" not in text and "OVER" not in text, text
    _, result = verdict([0.1, 0.1, 0.1, 0.1], correct=False)
    assert "every call correct in both settings: NO (1 rows wrong)" in result["verdict"], result["verdict"]
