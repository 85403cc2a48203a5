"""The network path (NVSHMEM's device API for peers on other nodes).

- when it is compiled in (a pure rule of the environment);
- compiled for sm_90 without a GPU and linked with NVSHMEM's real device bitcode (the
  ``nvidia-nvshmem-cu13`` wheel, a test dependency of this package): every primitive kind compiles,
  calls NVSHMEM, and what NVSHMEM cannot carry (a block atomic) compiles to the pointer path
  plus a message and a trap for unmapped peers; with the path off, iris.device's
  load and store compile to the same instructions as a hand-written translate + tl.load/tl.store;
- on a GPU with nvshmem4py: the network path against the pointer path in one process
  (``device_nvshmem_worker.py``), one node.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
from iris_device_testlib import TESTS, child_env, run_json_script

from iris.device import IrisBackendError
from iris.device import _nvshmem_host as host
from iris.device._nvshmem import launcher_spans_nodes, network_path_selected


def test_network_path_is_on_only_for_nvshmem_across_nodes_or_when_asked():
    one_node = {"IRIS_BACKEND": "nvshmem", "OMPI_COMM_WORLD_LOCAL_SIZE": "8", "OMPI_COMM_WORLD_SIZE": "8"}
    two_nodes = dict(one_node, OMPI_COMM_WORLD_SIZE="16")
    assert not network_path_selected(one_node)
    assert network_path_selected(two_nodes)
    assert not network_path_selected(dict(two_nodes, IRIS_BACKEND="cuda"))
    assert not network_path_selected(dict(two_nodes, IRIS_NVSHMEM_NETWORK="0"))
    assert network_path_selected(dict(one_node, IRIS_NVSHMEM_NETWORK="1"))
    assert network_path_selected(dict(one_node, IRIS_NVSHMEM_FORCE_REMOTE="1"))
    assert not network_path_selected({"IRIS_BACKEND": "nvshmem"})  # no launcher: one process, one node
    assert launcher_spans_nodes({"SLURM_NTASKS_PER_NODE": "4", "SLURM_NTASKS": "32"})
    assert launcher_spans_nodes({"LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "16"})
    assert not launcher_spans_nodes({"MPI_LOCALNRANKS": "2", "PMI_SIZE": "2"})


def test_missing_bitcode_names_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("IRIS_NVSHMEM_BITCODE", str(tmp_path / "nope.bc"))
    with pytest.raises(IrisBackendError, match=r"IRIS_NVSHMEM_BITCODE=.*no such file"):
        host.device_bitcode()
    monkeypatch.delenv("IRIS_NVSHMEM_BITCODE")
    monkeypatch.setattr("sys.path", [str(tmp_path)])
    with pytest.raises(IrisBackendError, match="pip install nvidia-nvshmem-cu13"):
        host.device_bitcode()


def _bitcode() -> str | None:
    try:
        return host.device_bitcode()
    except IrisBackendError:
        return None


def test_pointer_path_is_unchanged_when_the_network_path_is_off():
    out = run_json_script("device_nvshmem_compile.py", env=child_env(interpret=False, IRIS_BACKEND="cuda"),
                          timeout=600)
    assert not out["NVSHMEM"], out
    assert "crash" not in out, out.get("crash")
    assert out["pointer"]["nvshmem_functions"] == [], out
    assert out["pointer"]["same_instructions"], out


@pytest.mark.skipif(_bitcode() is None, reason="NVSHMEM's device bitcode (pip install nvidia-nvshmem-cu13) is not "
                                              "installed; the nox test session of iris-device installs it")
def test_network_path_compiles_links_and_calls_nvshmem():
    env = child_env(interpret=False, IRIS_BACKEND="nvshmem", IRIS_NVSHMEM_NETWORK="1",
                    IRIS_NVSHMEM_BITCODE=_bitcode())
    out = run_json_script("device_nvshmem_compile.py", "--network", env=env, timeout=900)
    assert out["NVSHMEM"], out
    assert "crash" not in out, out.get("crash")
    expect = {  # the NVSHMEM transfer functions each kernel must end up calling (mangled names)
        "rma fp32": ("transfer_rma_gIf", "transfer_rma_pIf"),
        "rma bf16": ("transfer_rma_gIs", "transfer_rma_pIs"),  # 16-bit floats travel as int16 bits
        "rma i8": ("transfer_rma_gIa", "transfer_rma_pIa"),
        "amo": ("transfer_quiet", "transfer_amo_fetchIi", "transfer_amo_fetchIl"),  # release: quiet first
        "message": ("transfer_quiet", "transfer_rma_pIf", "transfer_amo_fetchIi"),
        "bulk put": ("transfer_put_signal",),
    }
    for case, needles in expect.items():
        assert out[case]["compiled"], (case, out[case])
        calls = " ".join(out[case]["nvshmem_functions"])
        for needle in needles:
            assert needle in calls, (case, needle, calls)
    block = out["block atomic"]  # an fp32 block atomic: fine to a mapped peer, refused at run time otherwise
    assert block["compiled"] and block["trap"] and block["prints"] and block["vector_atomic"], block


GPU_NVSHMEM = importlib.util.find_spec("nvshmem") is not None and os.environ.get("IRIS_BACKEND") == "nvshmem"


@pytest.mark.multirank
@pytest.mark.skipif(not GPU_NVSHMEM, reason="needs a GPU, nvshmem4py and IRIS_BACKEND=nvshmem (the GPU runs)")
@pytest.mark.parametrize("world_size", [1, 2])
def test_network_path_matches_the_pointer_path_on_the_gpu(world_size):
    from iris_device_testlib import rank_env

    from iris.runtime.testing import run_ranks

    env = dict(rank_env(), IRIS_BACKEND="nvshmem", IRIS_NVSHMEM_NETWORK="1")
    proc = run_ranks(world_size, str(TESTS / "device_nvshmem_worker.py"), timeout=600, env=env)
    for name in ("scenario_rma", "scenario_amo", "scenario_message"):
        assert f"PASS {name}" in proc.stdout, proc.stdout + proc.stderr
