"""tools/pytest_shard.py: the shards of one n partition the suite, keep a test function's
parametrisations together, and a malformed IRIS_TEST_SHARD is refused with the fix;
IRIS_TEST_RESUME_AT resumes a shard at a test, and names the fix when no test matches."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SUITE = '''
import pytest

def test_a(): pass
def test_b(): pass

@pytest.mark.parametrize("nranks", [2, 4])
def test_c(nranks): pass

def test_d(): pass
def test_e(): pass
'''


def collected(tmp_path, shard: str | None, resume_at: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "tools") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for name, value in (("IRIS_TEST_SHARD", shard), ("IRIS_TEST_RESUME_AT", resume_at)):
        env.pop(name, None)
        if value is not None:
            env[name] = value
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "pytest_shard", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "test_suite.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


def ids(proc: subprocess.CompletedProcess) -> list[str]:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [line.split("::", 1)[1] for line in proc.stdout.splitlines() if "::" in line]


def test_shards_partition_the_suite_and_keep_parametrisations_together(tmp_path):
    (tmp_path / "test_suite.py").write_text(SUITE)
    everything = ids(collected(tmp_path, None))
    assert len(everything) == 6, everything
    for n in (1, 2, 3):
        shards = [ids(collected(tmp_path, f"{i}/{n}")) for i in range(1, n + 1)]
        assert sorted(t for shard in shards for t in shard) == sorted(everything), (n, shards)  # each once
        for shard in shards:
            assert ("test_c[2]" in shard) == ("test_c[4]" in shard), (n, shards)
    assert ids(collected(tmp_path, "1/2")) == ["test_a", "test_c[2]", "test_c[4]", "test_e"]


def test_a_malformed_shard_is_refused(tmp_path):
    (tmp_path / "test_suite.py").write_text(SUITE)
    for bad in ("3/2", "0/2", "half", "1-2"):
        proc = collected(tmp_path, bad)
        assert proc.returncode != 0 and "expected i/n with 1 <= i <= n" in proc.stdout + proc.stderr, (bad, proc)


def test_resume_at_keeps_the_shards_tests_from_the_first_match(tmp_path):
    (tmp_path / "test_suite.py").write_text(SUITE)
    assert ids(collected(tmp_path, None, "test_c[4]")) == ["test_c[4]", "test_d", "test_e"]
    assert ids(collected(tmp_path, "1/2", "test_c")) == ["test_c[2]", "test_c[4]", "test_e"]
    assert ids(collected(tmp_path, "2/2", "test_b")) == ["test_b", "test_d"]
    proc = collected(tmp_path, "2/2", "test_e")  # test_e is in the other shard
    assert proc.returncode != 0 and "IRIS_TEST_RESUME_AT='test_e'" in proc.stdout + proc.stderr, proc
