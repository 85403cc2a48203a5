"""Which bootstrap a process gets (iris.runtime._launcher), with no launch: every rule of ``auto``,
the errors for a launcher Iris cannot join, and the argument errors of ``iris(bootstrap=...)``.

Nothing here starts MPI in the pytest process (under Open MPI that breaks later mpiexec calls):
the one check that needs a started MPI runs in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import iris.runtime
from iris.runtime import IrisBackendError, IrisBootstrapError, IrisError, IrisUsageError
from iris.runtime._launcher import check_mpi_world, choose_bootstrap, torch_env_missing

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "localhost",
            "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_RESTART_COUNT": "0"}
ENV_INIT = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"}
OPEN_MPI = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "0", "PMIX_RANK": "0"}
HYDRA = {"PMI_SIZE": "4", "PMI_RANK": "0", "MPI_LOCALNRANKS": "4", "PMI_FD": "9"}


@pytest.mark.parametrize(("env", "initialised", "expected"), [
    ({}, False, "mpi"),                              # python app.py: a world of one (MPI's singleton)
    ({}, True, "torch"),                             # the program made a process group
    (TORCHRUN, False, "torch"),
    (OPEN_MPI, False, "mpi"),
    (HYDRA, False, "mpi"),
    ({**HYDRA, **TORCHRUN}, False, "torch"),         # srun ... torchrun: the agent's workers
    ({**OPEN_MPI, **ENV_INIT}, False, "mpi"),        # mpirun -x MASTER_ADDR ...: the MPI launcher
    (ENV_INIT, False, "torch"),                      # another launcher speaking env://
    ({"WORLD_SIZE": "1"}, False, "mpi"),
    (OPEN_MPI, True, "torch"),                       # an existing group wins
], ids=["plain", "group", "torchrun", "openmpi", "hydra", "srun-torchrun", "mpirun-with-env", "env-init",
        "world-1", "mpirun-with-group"])
def test_auto_picks(env, initialised, expected):
    assert choose_bootstrap("auto", env, initialised, comm_given=False) == expected


@pytest.mark.parametrize("requested", ["mpi", "torch"])
def test_explicit_choice_is_kept(requested):
    assert choose_bootstrap(requested, TORCHRUN if requested == "mpi" else OPEN_MPI, False, False) == requested


def test_comm_means_mpi():
    assert choose_bootstrap("auto", TORCHRUN, True, comm_given=True) == "mpi"
    with pytest.raises(IrisUsageError, match=r"comm=\.\.\., bootstrap='torch'.*drop comm="):
        choose_bootstrap("torch", {}, False, comm_given=True)


@pytest.mark.parametrize("bad", ["MPI", "nccl", "gloo", ""])
def test_unknown_bootstrap_is_a_usage_error(bad):
    with pytest.raises(IrisUsageError, match=rf"bootstrap={bad!r}.*one of \('auto', 'mpi', 'torch'\)"):
        choose_bootstrap(bad, {}, False, False)


def test_world_size_without_a_launcher_is_an_error():
    with pytest.raises(IrisBootstrapError) as info:
        choose_bootstrap("auto", {"WORLD_SIZE": "4", "RANK": "2"}, False, False)
    text = str(info.value)
    for needle in ("WORLD_SIZE=4", "one of 4 ranks", "MASTER_ADDR, MASTER_PORT missing", "torchrun", "mpirun -n 4"):
        assert needle in text, (needle, text)


@pytest.mark.parametrize(("env", "needles"), [
    ({"OMPI_COMM_WORLD_SIZE": "4"}, ["MPICH 5", "OMPI_COMM_WORLD_SIZE=4", "different MPI", "Get_library_version"]),
    ({"PMI_SIZE": "3"}, ["PMI_SIZE=3", "reinstall mpi4py"]),
    (TORCHRUN, ["bootstrap='mpi'", "torchrun started this process", "WORLD_SIZE=4", "bootstrap='torch'",
                "mpirun -n 4"]),
    ({"WORLD_SIZE": "2", "RANK": "0"}, ["a launcher that set RANK/WORLD_SIZE", "WORLD_SIZE=2"]),
])
def test_mpi_world_of_one_under_a_bigger_launch_is_an_error(env, needles):
    with pytest.raises(IrisBootstrapError) as info:
        check_mpi_world(1, env, "MPICH 5")
    assert all(n in str(info.value) for n in needles), (needles, str(info.value))


def test_mpi_world_matching_the_launch_passes():
    check_mpi_world(4, OPEN_MPI)
    check_mpi_world(1, {"OMPI_COMM_WORLD_SIZE": "1", "WORLD_SIZE": "1"})
    check_mpi_world(1, {})


def test_torch_without_group_or_env_names_the_fix():
    text = str(torch_env_missing(HYDRA))
    for needle in ("bootstrap='torch'", "no default process group", "RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT are",
                   "torchrun", "init_process_group()", "PMI_SIZE=4", "bootstrap='mpi'"):
        assert needle in text, (needle, text)


def test_bootstrap_error_is_a_backend_error():
    assert issubclass(IrisBootstrapError, IrisBackendError) and issubclass(IrisBootstrapError, IrisError)
    assert iris.runtime.IrisBootstrapError is IrisBootstrapError


# --- the same rules through iris.runtime.iris(), still before any communication ---------------------
def test_iris_rejects_a_bad_bootstrap(monkeypatch):
    with pytest.raises(IrisUsageError, match=r"bootstrap='torchrun'"):
        iris.runtime.iris(heap_size=1 << 20, bootstrap="torchrun")
    monkeypatch.setenv("IRIS_BOOTSTRAP", "slurm")
    with pytest.raises(IrisUsageError, match=r"bootstrap='slurm'.*IRIS_BOOTSTRAP"):
        iris.runtime.iris(heap_size=1 << 20)
    with pytest.raises(IrisUsageError, match=r"comm=\.\.\., bootstrap='torch'"):
        iris.runtime.iris(heap_size=1 << 20, comm=object(), bootstrap="torch")


def test_iris_refuses_a_silent_world_of_one(monkeypatch):
    for name in ("RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(IrisBootstrapError, match=r"WORLD_SIZE=4 says this process is one of 4 ranks"):
        iris.runtime.iris(heap_size=1 << 20)
    with pytest.raises(IrisBootstrapError, match=r"bootstrap='torch'\): torch.distributed has no default"):
        iris.runtime.iris(heap_size=1 << 20, bootstrap="torch")


MISMATCH = """
import os, mpi4py
mpi4py.rc.initialize = False
from mpi4py import MPI
# a variable of another MPI's launcher than the one mpi4py uses: what a mismatched mpirun sets
mine = MPI.Get_library_version()
os.environ["MPI_LOCALNRANKS" if "Open MPI" in mine else "OMPI_COMM_WORLD_SIZE"] = "4"
MPI.Init()
import iris.runtime
try:
    iris.runtime.iris(heap_size=1 << 20)
except iris.runtime.IrisBootstrapError as exc:
    print("RAISED", exc)
"""


@pytest.mark.once  # a subprocess that starts MPI and no kernel: nothing here depends on Triton
def test_mpi4py_of_another_mpi_is_an_error():
    """mpi4py's MPI sees one rank while the launcher announced four: an error, not a world of one."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "TORCHELASTIC_RUN_ID")}
    proc = subprocess.run([sys.executable, "-c", MISMATCH], capture_output=True, text=True, timeout=120, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "RAISED iris.runtime.iris(): mpi4py's MPI (" in proc.stdout, out
    assert "sees a world of 1, but the launcher set" in proc.stdout and "=4: mpi4py was built for" in proc.stdout, out


def test_a_gloo_group_made_by_hand_is_the_torch_bootstrap_of_its_ranks():
    # what the iris backend of torch.distributed passes for a group of some of the ranks (torch made
    # it on them alone): the context's ranks and host collectives are the group's
    import datetime

    import torch.distributed as dist

    group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=30))
    with pytest.raises(IrisUsageError, match=r"comm=.*bootstrap='mpi'\): comm is a torch.distributed process group"):
        iris.runtime.iris(heap_size=1 << 20, comm=group, bootstrap="mpi")
    with iris.runtime.iris(heap_size=1 << 20, comm=group) as ctx:
        assert (ctx.rank, ctx.world_size, ctx.bootstrap) == (0, 1, "torch") and ctx.process_group is group
        assert ctx.comm.allgather({"x": [1, 2]}) == [{"x": [1, 2]}] and ctx.comm.bcast("b") == "b"
        assert ctx.comm.gather(3) == [3] and ctx.comm.allreduce(5, "max") == 5
        assert ctx.zeros(4).sum().item() == 0


@pytest.mark.parametrize(("env", "slot"), [
    ({}, None),
    ({"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8"}, (3, 8)),                           # torchrun
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, (1, 4)),  # Open MPI
    ({"MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "4"}, (2, 4)),                         # Hydra
    ({"LOCAL_RANK": "3"}, None),                                                        # half a pair
    ({"LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "4"}, None),                               # not a place
])
def test_the_jobs_place_on_the_node_from_the_launcher(env, slot):
    from iris.runtime._launcher import node_slot

    assert node_slot(env) == slot


def test_a_context_of_some_ranks_takes_the_gpu_the_process_has_in_the_job(monkeypatch):
    # ranks 2 and 3 of 4 on a node of 4 GPUs: their context's own local ranks are 0 and 1, but their
    # GPUs are 2 and 3, which no other rank of the job shares
    import datetime

    import torch
    import torch.distributed as dist

    from iris.runtime import _heap_cuda
    from iris.runtime._bootstrap_torch import GroupBootstrap

    boot = GroupBootstrap(dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=30)))
    assert (boot.local_rank, boot.local_size) == (0, 1)
    bound = []

    class Runtime:
        @staticmethod
        def cudaSetDevice(index):
            bound.append(index)
            return (0,)

    monkeypatch.setattr(_heap_cuda, "_cuda", lambda: (None, Runtime))
    monkeypatch.setattr(_heap_cuda, "wait_for_device", lambda driver, index: None)
    monkeypatch.setattr(_heap_cuda, "_check", lambda result, call: None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert _heap_cuda.bind_device(boot) == (torch.device("cuda", 2), 1) and bound == [2]
    # 8 ranks on 2 GPUs: local rank 5 is on GPU 1 with 3 others of the job (ranks_on_device 4)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "5")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert _heap_cuda.bind_device(boot) == (torch.device("cuda", 1), 4)
    # a bootstrap of the whole job keeps its own local ranks
    boot.some_of_the_job = False
    assert boot.node_slot() == (0, 1)
