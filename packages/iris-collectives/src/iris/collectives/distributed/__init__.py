"""iris.collectives.distributed: the ``iris`` backend of torch.distributed, so that a PyTorch
program runs its collectives on Iris's kernels unchanged but for the backend's name.

    import torch.distributed as dist
    import iris.collectives.distributed      # registers the backend "iris"

    dist.init_process_group(backend="iris")                  # or "cuda:iris,cpu:gloo"
    dist.all_reduce(t)                                       # iris.collectives.ccl.all_reduce

Launch with ``torchrun`` or ``mpirun`` (under mpirun, importing this module sets torch's
``env://`` variables from MPI where they are missing: :mod:`._rendezvous`). Each collective is
one call of :mod:`iris.collectives.ccl` on the group's Iris context, which the backend makes on
the group's first call (heap size: ``pg_options=Options(heap_size=...)`` or
``IRIS_DIST_HEAP_SIZE``) or adopts (``Options(context=ctx)``):

- ``all_reduce`` (SUM, AVG, MAX, MIN, PRODUCT), ``all_gather`` and ``all_gather_into_tensor``,
  ``reduce_scatter`` and ``reduce_scatter_tensor``, ``broadcast``, ``all_to_all_single`` and
  ``all_to_all`` with equal splits, ``all_to_all_single`` with split sizes, ``reduce``,
  ``gather``, ``scatter``, ``send``/``recv`` (after ``ccl.init_p2p`` on the group's context),
  ``barrier``; the coalesced forms, one call per tensor;
- works complete on the stream (``async_op=True`` returns one; ``wait()`` orders the current
  stream after the call), ``get_future()`` for DDP, CUDA graphs of the calls after a first call;
- ``DistributedDataParallel`` all-reduces its gradient buckets with ``ccl.all_reduce``;
- ``new_group(ranks=[...])`` of some of the ranks: each such group runs on a context of its
  members (made over them alone: torch calls the backend on the members only).

Not here yet, each raising :class:`iris.runtime.IrisUnsupportedError` that says so (or, with
``"cuda:iris,cpu:gloo"``, done by gloo for CPU tensors): the list form of ``all_to_all`` with
tensors of different sizes (``all_to_all_single`` with split sizes works), ``recv`` from any
source, bitwise reductions and ``PREMUL_SUM``, reductions of dtypes ``ccl`` does not reduce.
docs/torch-backend.md has the details.

Why a module of iris-collectives and not a package of its own: it is a thin adapter over
``ccl`` (like ``functional`` and ``nn``) that needs nothing ccl does not already need, and it is
imported only on demand: ``import iris.collectives`` neither registers the backend nor imports it.
"""

from __future__ import annotations

from . import _rendezvous
from ._backend import register
from ._context import HEAP_SIZE_ENV, Options
from ._group import BACKEND, IrisProcessGroup
from ._work import IrisWork

# Before the program's init_process_group, whose env:// rendezvous needs these variables (a no-op
# unless an MPI launcher started this process and some are missing).
_rendezvous.fill_from_mpi()
register()


def context_of(group=None):
    """The Iris context of ``group`` (default: the default group), an ``iris`` group, made now if
    the group has made no call yet (collective then): e.g. to call ``iris.collectives.ccl`` or
    the fused ops on the same heap, or to make the context before capturing CUDA graphs."""
    import torch.distributed as dist

    from iris.runtime import IrisUsageError

    pg = group if group is not None else dist.group.WORLD
    if not isinstance(pg, IrisProcessGroup):
        raise IrisUsageError(f"iris.collectives.distributed.context_of({pg!r}): not a process group of the iris "
                             f"backend; pass one made with init_process_group(backend='iris') or "
                             f"new_group(backend='iris')")
    return pg.context("iris.collectives.distributed.context_of()")


__all__ = ["BACKEND", "HEAP_SIZE_ENV", "IrisProcessGroup", "IrisWork", "Options", "context_of", "register"]
