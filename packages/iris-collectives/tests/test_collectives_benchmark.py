"""benchmarks/tile_collectives.py --quick on 2 ranks: the benchmark's code path (every variant,
both dtypes, the result check, timing, table, JSON and plot) runs on whatever backend the tests
use (tiny sizes; on the CPU backend the torch symm_mem column is skipped with a note)."""

from __future__ import annotations

import json
import os

import pytest

from iris.runtime.testing import run_ranks

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHMARK = os.path.normpath(os.path.join(HERE, "..", "..", "..", "benchmarks", "tile_collectives.py"))


@pytest.mark.multirank
@pytest.mark.skipif(not os.path.exists(BENCHMARK), reason="benchmarks/ is not part of this checkout (sdist)")
def test_benchmark_quick_mode(tmp_path):
    proc = run_ranks(2, BENCHMARK, "--quick", "--out", str(tmp_path), timeout=300, env={"MPIEXEC_TIMEOUT": "280"})
    result = json.loads((tmp_path / "tile_collectives_2ranks_quick.json").read_text())
    assert result["world_size"] == 2 and result["copy_bandwidth_GBps"] > 0
    variants = {"one_shot", "two_shot", "ring", "spinlock", "atomic"}
    assert {p["dtype"] for p in result["points"]} == {"fp32", "bf16"}
    for point in result["points"]:
        assert variants <= set(point["times_us"]), point
        assert all(point["correct"].values()), point
        assert point["floor_us"] > 0
    if result["backend"] == "cpu":
        assert any("torch symm_mem" in n and "skipped" in n for n in result["notes"]), result["notes"]
    assert "best/floor" in proc.stdout
    png = tmp_path / "tile_collectives_2ranks_quick.png"
    assert png.exists() or any("matplotlib" in n for n in result["notes"])
