"""Which bootstrap this process uses, started: MPI or torch.distributed.

:mod:`._launcher` decides from the request and the environment; this module starts the chosen
implementation (``_bootstrap_mpi`` or ``_bootstrap_torch``, each imported only when chosen, so a
torchrun job never imports MPI). It sits above the two implementations and the interface they
share (:mod:`._bootstrap`), so no module imports one that imports it back.
"""

from __future__ import annotations

import os

import torch

from . import _launcher
from ._bootstrap import Bootstrap, install_abort_on_exception
from ._errors import IrisUsageError


def group_initialised() -> bool:
    """True when torch.distributed has a default process group (torch already imports
    torch.distributed, so asking costs nothing)."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def start_bootstrap(requested: str | None = None, comm=None, backend: str = "cpu") -> Bootstrap:
    """The bootstrap of this process: ``requested`` is ``"auto"``, ``"mpi"`` or ``"torch"``
    (None reads ``IRIS_BOOTSTRAP``, default auto); ``comm`` an mpi4py communicator (MPI), or a
    gloo process group of some of the ranks that the program made by hand (torch: ranks and host
    collectives are the group's, :class:`~._bootstrap_torch.GroupBootstrap`);
    ``backend`` the Iris backend (which torch backend a default group made here gets).
    Collective. Installs :func:`~._bootstrap.install_abort_on_exception` when there are several
    ranks."""
    if requested is None:
        requested = os.environ.get("IRIS_BOOTSTRAP", "auto")
    if is_torch_group(comm):
        _launcher.check_request(requested, False)
        if requested == "mpi":
            raise IrisUsageError(
                f"iris.runtime.iris(comm={comm!r}, bootstrap='mpi'): comm is a torch.distributed process group, "
                f"which the MPI bootstrap does not use; pass bootstrap='torch' (or 'auto'), or an mpi4py communicator")
        from ._bootstrap_torch import GroupBootstrap

        boot = GroupBootstrap(comm)
        if boot.world_size > 1:
            install_abort_on_exception(boot)
        return boot
    kind = _launcher.choose_bootstrap(requested, os.environ, group_initialised(), comm is not None)
    if kind == "torch":
        from ._bootstrap_torch import TorchBootstrap

        boot = TorchBootstrap.start(backend)
    else:
        from ._bootstrap_mpi import MpiBootstrap

        boot = MpiBootstrap.start(comm)
    if boot.world_size > 1:
        install_abort_on_exception(boot)
    return boot


def is_torch_group(comm) -> bool:
    """Whether ``comm`` is a torch.distributed process group or backend object (not an mpi4py
    communicator)."""
    if comm is None or not torch.distributed.is_available():
        return False
    return isinstance(comm, (torch.distributed.ProcessGroup, torch._C._distributed_c10d.Backend))
