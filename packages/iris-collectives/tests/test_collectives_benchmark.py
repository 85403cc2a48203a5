"""benchmarks/tile_collectives.py --quick on 2 ranks: the benchmark's code path (every variant,
both dtypes, the result check, timing, table, JSON and plot) runs on whatever backend the tests
use (tiny sizes; on the CPU backend the torch symm_mem column is skipped with a note)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

import pytest

from iris.runtime.testing import run_ranks

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHMARK = os.path.normpath(os.path.join(HERE, "..", "..", "..", "benchmarks", "tile_collectives.py"))


@pytest.mark.multirank
@pytest.mark.skipif(not os.path.exists(BENCHMARK), reason="benchmarks/ is not part of this checkout (sdist)")
def test_benchmark_quick_mode(tmp_path):
    proc = run_ranks(2, BENCHMARK, "--quick", "--shapes", "8x4,16x4", "--out", str(tmp_path), timeout=300,
                     env={"MPIEXEC_TIMEOUT": "280"})
    result = json.loads((tmp_path / "tile_collectives_2ranks_quick.json").read_text())
    assert result["world_size"] == 2 and result["copy_bandwidth_GBps"] > 0 and result["empty_launch_us"] > 0
    variants = {"one_shot", "two_shot", "ring", "spinlock", "atomic"}
    assert {p["dtype"] for p in result["points"]} == {"fp32", "bf16"}
    for point in result["points"]:
        assert variants <= set(point["times_us"]), point
        assert all(point["correct"].values()), point
        assert point["floor_us"] > 0
        # two-shot (the default --tune) was measured at both shapes and the faster one counts
        tried = point["shapes_us"]["two_shot"]
        assert set(tried) == {"8x4", "16x4"} and point["times_us"]["two_shot"] == min(tried.values()), point
        assert point["shape"]["one_shot"] == "8x4" and point["block"]["two_shot"][0] in (8, 16), point
    if result["backend"] == "cpu":
        assert any("torch symm_mem" in n and "skipped" in n for n in result["notes"]), result["notes"]
    assert "best/floor" in proc.stdout
    png = tmp_path / "tile_collectives_2ranks_quick.png"
    if importlib.util.find_spec("matplotlib") is None:
        # the GPU image has no matplotlib: the benchmark must say so, and the plot is not checked
        assert any("matplotlib" in n for n in result["notes"]), result["notes"]
        pytest.skip("matplotlib is not installed, so the plot was not checked (table and JSON were)")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{png} is not a PNG"


@pytest.mark.multirank
@pytest.mark.skipif(not os.path.exists(BENCHMARK), reason="benchmarks/ is not part of this checkout (sdist)")
def test_benchmark_several_calls_per_launch(tmp_path):
    # three ranks, three all-reduces per launch: the ones that add into the destination must hold
    # three times the sum after the checked launch, the others the sum. On the GPU the timed
    # launches are replayed from CUDA graphs of two launches (--graph; the CPU backend ignores it).
    run_ranks(3, BENCHMARK, "--quick", "--calls-per-launch", "3", "--dtypes", "fp32", "--sizes", "4K",
              "--variants", "two_shot,one_shot,spinlock,atomic", "--shapes", "8x4", "--no-torch", "--graph", "2",
              "--out", str(tmp_path), timeout=300, env={"MPIEXEC_TIMEOUT": "280"})
    (path,) = tmp_path.glob("tile_collectives_3ranks_x3*_quick.json")
    result = json.loads(path.read_text())
    graphs = 1 if result["backend"] == "cpu" else 2
    assert result["calls_per_launch"] == 3 and result["graph_launches"] == graphs
    assert path.name == f"tile_collectives_3ranks_x3{'_graph2' if graphs > 1 else ''}_quick.json"
    (point,) = result["points"]
    assert set(point["correct"]) == {"two_shot", "one_shot", "spinlock", "atomic"} and all(point["correct"].values())


def _benchmark_module():
    # the benchmarks import their shared module (common.py) from beside them, as a script run finds it
    benchmarks = os.path.dirname(BENCHMARK)
    if benchmarks not in sys.path:
        sys.path.insert(0, benchmarks)
    spec = importlib.util.spec_from_file_location("tile_collectives_bench", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not os.path.exists(BENCHMARK), reason="benchmarks/ is not part of this checkout (sdist)")
def test_balanced_grid_and_shapes():
    bench = _benchmark_module()
    assert bench.balanced_grid(512, 462) == 256  # two rounds either way, two tiles per program
    assert bench.balanced_grid(2048, 462) == 410  # five rounds
    assert bench.balanced_grid(10, 100) == 10 and bench.balanced_grid(1, 7) == 1
    assert bench.parse_shapes("8x4, 32x8") == [(8, 4), (32, 8)]
    for bad in ("8x3", "8", "x4", "8x4x2"):
        with pytest.raises(argparse.ArgumentTypeError, match="ROWSxWARPS"):
            bench.parse_shapes(bad)
