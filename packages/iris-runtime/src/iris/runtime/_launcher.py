"""Which bootstrap a process uses, read from what started it.

Pure functions of the environment (a mapping) and a few facts, so every rule is tested without
launching anything. ``"auto"`` picks, in this order:

1. ``torch`` when torch.distributed already has a default process group (the program made it);
2. ``torch`` when torchrun's elastic agent started the process (``TORCHELASTIC_RUN_ID``);
3. ``mpi`` when an MPI launcher started it (``OMPI_COMM_WORLD_SIZE``, ``PMI_SIZE``, ...);
4. ``torch`` when the ``env://`` variables are all set (``RANK``, ``WORLD_SIZE``,
   ``MASTER_ADDR``, ``MASTER_PORT``: another launcher speaking torch's protocol);
5. otherwise a world of one (through MPI, as before there was a choice), unless ``WORLD_SIZE``
   says more ranks were started: then :class:`IrisBootstrapError`, never a silent world of one.

torchrun comes before MPI because a torchrun worker inside an MPI allocation (``srun torchrun``)
inherits the allocation's variables, while the elastic agent's own are specific to its workers.
"""

from __future__ import annotations

from collections.abc import Mapping

from ._errors import IrisBootstrapError, IrisUsageError

BOOTSTRAPS = ("auto", "mpi", "torch")

#: Set by torchrun's elastic agent for each worker it starts.
TORCHELASTIC_MARKERS = ("TORCHELASTIC_RUN_ID",)
#: What ``init_process_group(init_method="env://")`` reads.
ENV_INIT_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
#: Variables MPI launchers give their processes: Open MPI, MPICH's Hydra / Intel MPI / Slurm's
#: PMI-2, PMIx. Any one of them means an MPI launcher started this process.
MPI_MARKERS = ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_SIZE", "PMI_RANK", "PMIX_RANK",
               "MPI_LOCALNRANKS")
#: The ones among them that carry a number of ranks (the job's, or the node's for MPI_LOCALNRANKS).
MPI_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MPI_LOCALNRANKS")

FIX_TORCH = ("launch with torchrun (python -m torch.distributed.run --nproc-per-node N app.py), or call "
             "torch.distributed.init_process_group() before iris.runtime.iris()")


def _int(env: Mapping[str, str], name: str) -> int | None:
    try:
        return int(env[name])
    except (KeyError, ValueError):
        return None


def _seen(env: Mapping[str, str], names) -> str:
    """``A=1, B=2`` for the variables of ``names`` present in ``env`` (for messages)."""
    return ", ".join(f"{n}={env[n]}" for n in names if n in env)


def mpi_launched(env: Mapping[str, str]) -> bool:
    """True when an MPI launcher started this process."""
    return any(name in env for name in MPI_MARKERS)


def torchrun_launched(env: Mapping[str, str]) -> bool:
    """True when torchrun's elastic agent started this process."""
    return any(name in env for name in TORCHELASTIC_MARKERS)


def mpi_announced_size(env: Mapping[str, str]) -> tuple[str, int] | None:
    """The first MPI variable that announces more than one rank, with its value, or None."""
    for name in MPI_SIZE_VARS:
        value = _int(env, name)
        if value is not None and value > 1:
            return name, value
    return None


def check_request(requested: str, comm_given: bool) -> None:
    """Raise :class:`IrisUsageError` for a ``bootstrap=`` value or combination that cannot work."""
    if requested not in BOOTSTRAPS:
        raise IrisUsageError(
            f"iris.runtime.iris(bootstrap={requested!r}): bootstrap must be one of {BOOTSTRAPS} (also read from "
            f"IRIS_BOOTSTRAP); 'auto' uses torch.distributed under torchrun or with an initialised process group, "
            f"MPI under mpirun, else a world of one")
    if comm_given and requested == "torch":
        raise IrisUsageError(
            "iris.runtime.iris(comm=..., bootstrap='torch'): comm is an mpi4py communicator, which the torch "
            "bootstrap does not use; drop comm= (the torch bootstrap uses the default process group) or pass "
            "bootstrap='mpi'")


def choose_bootstrap(requested: str, env: Mapping[str, str], group_initialised: bool, comm_given: bool) -> str:
    """``"mpi"`` or ``"torch"`` for ``requested`` (``auto``, ``mpi`` or ``torch``) in a process
    whose environment is ``env``. ``group_initialised``: torch.distributed has a default group;
    ``comm_given``: the caller passed an mpi4py communicator. Raises :class:`IrisUsageError` for a
    bad request and :class:`IrisBootstrapError` when ``auto`` sees ranks it cannot reach."""
    check_request(requested, comm_given)
    if comm_given:
        return "mpi"
    if requested != "auto":
        return requested
    if group_initialised or torchrun_launched(env):
        return "torch"
    if mpi_launched(env):
        return "mpi"
    if all(name in env for name in ENV_INIT_VARS):
        return "torch"
    world = _int(env, "WORLD_SIZE")
    if world is not None and world > 1:
        missing = ", ".join(n for n in ENV_INIT_VARS if n not in env)
        raise IrisBootstrapError(
            f"iris.runtime.iris(bootstrap='auto'): WORLD_SIZE={env['WORLD_SIZE']} says this process is one of "
            f"{world} ranks, but no launcher that Iris can join started it: no torch.distributed process group, "
            f"no torchrun (TORCHELASTIC_RUN_ID), no MPI launcher, and {missing} missing for env://; "
            f"{FIX_TORCH}, or launch with mpirun -n {world}")
    return "mpi"


def check_mpi_world(size: int, env: Mapping[str, str], library: str = "") -> None:
    """After MPI started with ``size`` ranks in COMM_WORLD: raise :class:`IrisBootstrapError` when
    the launcher announced more (``library``: mpi4py's MPI, for the message)."""
    if size > 1:
        return
    announced = mpi_announced_size(env)
    if announced is not None:
        name, value = announced
        raise IrisBootstrapError(
            f"iris.runtime.iris(): mpi4py's MPI ({library or 'unknown library'}) sees a world of 1, but the "
            f"launcher set {name}={value}: mpi4py was built for a different MPI than the mpirun that started this "
            f"job; launch with the mpiexec of the MPI that mpi4py uses (python -c 'from mpi4py import MPI; "
            f"print(MPI.Get_library_version())'), or reinstall mpi4py against this MPI")
    world = _int(env, "WORLD_SIZE")
    if world is not None and world > 1:
        started_by = "torchrun" if torchrun_launched(env) else "a launcher that set RANK/WORLD_SIZE"
        raise IrisBootstrapError(
            f"iris.runtime.iris(bootstrap='mpi'): MPI sees a world of 1, but {started_by} started this process as one "
            f"of WORLD_SIZE={world} ranks ({_seen(env, ('RANK', 'LOCAL_RANK', 'TORCHELASTIC_RUN_ID'))}) without an "
            f"MPI launcher; pass bootstrap='torch' (or 'auto'), or launch with mpirun -n {world}")


def torch_env_missing(env: Mapping[str, str]) -> IrisBootstrapError:
    """The error for ``bootstrap='torch'`` with no process group and no ``env://`` variables."""
    missing = ", ".join(n for n in ENV_INIT_VARS if n not in env)
    hint = ""
    if mpi_launched(env):
        hint = (f" This process was started by an MPI launcher ({_seen(env, MPI_MARKERS)}): pass bootstrap='mpi' "
                f"or 'auto'.")
    return IrisBootstrapError(
        f"iris.runtime.iris(bootstrap='torch'): torch.distributed has no default process group, and {missing} "
        f"{'is' if ',' not in missing else 'are'} missing from the environment for init_method='env://'; "
        f"{FIX_TORCH} (torchrun --nproc-per-node 1 runs a world of one).{hint}")


#: Pairs of variables that launchers set to a process's place among the job's processes on its
#: node: torchrun (and the iris backend of torch.distributed under mpirun), Open MPI, MPICH's Hydra.
NODE_SLOT_VARS = (("LOCAL_RANK", "LOCAL_WORLD_SIZE"), ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
                  ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"))


def node_slot(env: Mapping[str, str]) -> tuple[int, int] | None:
    """This process's (local rank, local size) among all the job's processes on its node, as the
    launcher announced them, or None. A context of some of the job's ranks picks its GPU and
    counts the ranks sharing it by this, not by its own ranks (which see only the members)."""
    for rank_name, size_name in NODE_SLOT_VARS:
        rank, size = _int(env, rank_name), _int(env, size_name)
        if rank is not None and size is not None and 0 <= rank < size:
            return rank, size
    return None
