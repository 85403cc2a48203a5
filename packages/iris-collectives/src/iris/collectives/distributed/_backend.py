"""Registering the ``iris`` backend with torch.distributed, and the function torch calls to make
each of its process groups."""

from __future__ import annotations

import torch.distributed as dist

from ._context import check_options
from ._group import BACKEND, IrisProcessGroup


def create(backend_options, pg_options):
    """Make the process group of the ``iris`` backend that torch asks for (``init_process_group``,
    ``new_group``): ``backend_options`` is torch's ``_DistributedBackendOptions`` (store, group
    rank and size, timeout, the global ranks of a sub-group), ``pg_options`` what the program
    passed as ``pg_options`` (None or an :class:`Options`). A group of some of the ranks (torch
    calls here on those ranks only) runs on a context of its members (:mod:`._context`)."""
    options = check_options(pg_options)
    ranks = tuple(backend_options.global_ranks_in_group)
    some = bool(ranks) and dist.is_initialized() and ranks != tuple(range(dist.get_world_size()))
    return IrisProcessGroup(backend_options.group_rank, backend_options.group_size, options, backend_options.store,
                            backend_options.timeout, members=ranks if some else None)


def register() -> None:
    """Register the ``iris`` backend (for CPU and CUDA tensors) with torch.distributed, once per
    process (importing :mod:`iris.collectives.distributed` does it)."""
    if BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND, create, extended_api=True, devices=["cpu", "cuda"])
