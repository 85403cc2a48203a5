"""tools/pytest_shard.py: the shards of one n partition the suite, keep a test function's
parametrisations together, and a malformed IRIS_TEST_SHARD is refused with the fix;
IRIS_TEST_RESUME_AT resumes a shard at a test, and names the fix when no test matches; processes
that share IRIS_TEST_CLAIMS run every test once between them, a function's parametrisations in one."""

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


SLOW_SUITE = """
import time
import pytest

def test_a(): time.sleep(0.3)
def test_b(): time.sleep(0.3)

@pytest.mark.parametrize("nranks", [2, 4])
def test_c(nranks): time.sleep(0.3)

def test_d(): time.sleep(0.3)
def test_e(): time.sleep(0.3)
"""


def test_processes_sharing_claims_run_every_test_once(tmp_path):
    (tmp_path / "test_suite.py").write_text(SLOW_SUITE)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "tools") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               IRIS_TEST_CLAIMS=str(tmp_path / "claims"))
    cmd = [sys.executable, "-m", "pytest", "-p", "pytest_shard", "-v", "-p", "no:cacheprovider", "test_suite.py"]
    jobs = [subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for _ in range(3)]
    outputs = [job.communicate(timeout=120)[0] for job in jobs]
    assert all(job.returncode in (0, 5) for job in jobs), outputs
    ran = [[line.split("::", 1)[1].split()[0] for line in out.splitlines() if " PASSED" in line] for out in outputs]
    everything = ["test_a", "test_b", "test_c[2]", "test_c[4]", "test_d", "test_e"]
    assert sorted(t for tests in ran for t in tests) == everything, outputs  # each test once, none lost
    # each parametrisation is claimed on its own: the claim files are one per node id
    assert len(os.listdir(tmp_path / "claims")) == len(everything)


MODULE_FIXTURES = """
import time
import pytest

@pytest.fixture(scope="module")
def opened():
    yield "open"

def test_{m}1(opened): time.sleep(0.2)
def test_{m}2(opened): time.sleep(0.2)
def test_{m}3(opened): time.sleep(0.2)
"""


def test_claims_tear_down_module_fixtures_between_modules(tmp_path):
    # A process that skips the tests of a module that others claimed must still have torn down that
    # module's fixtures before it sets up the next module's ("previous item was not torn down").
    for m in ("one", "two", "three"):
        (tmp_path / f"test_{m}.py").write_text(MODULE_FIXTURES.format(m=m))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "tools") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               IRIS_TEST_CLAIMS=str(tmp_path / "claims"))
    cmd = [sys.executable, "-m", "pytest", "-p", "pytest_shard", "-v", "-p", "no:cacheprovider",
           "test_one.py", "test_two.py", "test_three.py"]
    jobs = [subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for _ in range(2)]
    outputs = [job.communicate(timeout=120)[0] for job in jobs]
    assert all(job.returncode in (0, 5) for job in jobs), outputs
    passed = sorted(line.split("::", 1)[1].split()[0] for out in outputs for line in out.splitlines()
                    if " PASSED" in line)
    assert passed == sorted(f"test_{m}{k}" for m in ("one", "two", "three") for k in (1, 2, 3)), outputs
