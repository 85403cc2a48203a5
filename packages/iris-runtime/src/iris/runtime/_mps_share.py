"""Each rank its own share of a GPU that several ranks share under MPS.

Measured on an H200, 8 ranks under MPS (benchmarks/NOTES.md, "the stalls"): with grids that
``resident_grid`` sized for a GPU shared by all ranks (49 programs of one-shot per rank), after 8
to 300 back-to-back calls the kernel of some ranks did not start while the other ranks' programs
spun waiting for them; with 8 programs per rank, or with every client capped at 12 % of the SMs
(``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, set before the processes started), 10 000 calls of
every collective ran clean. MPS reports the capped SM count to each process, and
``resident_grid`` still divides it by the ranks on the GPU, so the grids are smaller too (5 to 28
programs per rank there): that combination is what was measured, and what this module sets up.
Whether the cap alone (with grids sized for each rank's share) suffices was not measured yet.

The cap is read when the process starts using CUDA, so ``import iris.runtime`` sets it, before it
looks for a GPU: ``100 // ranks per GPU`` percent, from the launcher's local rank count
(``OMPI_COMM_WORLD_LOCAL_SIZE``, ``MPI_LOCALNRANKS`` or ``LOCAL_WORLD_SIZE``) and the visible
GPUs. A value you set yourself wins; ``IRIS_MPS_SHARE=0`` leaves it unset. Without MPS the
variable has no effect.
"""

from __future__ import annotations

import os

_LOCAL_SIZE_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE")
VARIABLE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"


def visible_gpu_count() -> int:
    """GPUs this process may use, counted without initialising CUDA (0 when unknown)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = 0
        for item in visible.split(","):
            if not item.strip() or item.strip().startswith("-"):
                break  # CUDA stops at the first invalid entry
            count += 1
        return count
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def launcher_ranks_per_gpu() -> int:
    """Ranks that will share each GPU of this node, from the launcher's environment (0: unknown)."""
    for name in _LOCAL_SIZE_VARIABLES:
        text = os.environ.get(name, "")
        if text.isdigit() and int(text) > 0:
            gpus = visible_gpu_count()
            return -(-int(text) // gpus) if gpus else 0
    return 0


def share_gpu_at_import() -> None:
    """Called by ``import iris.runtime`` before anything initialises CUDA (see the module doc)."""
    if os.environ.get("IRIS_MPS_SHARE", "1") == "0" or VARIABLE in os.environ:
        return
    ranks = launcher_ranks_per_gpu()
    if ranks > 1:
        os.environ[VARIABLE] = str(100 // ranks)


def share_in_effect(ranks_on_device: int) -> bool:
    """True when each of ``ranks_on_device`` ranks is capped to a share that leaves room for all."""
    try:
        percent = float(os.environ.get(VARIABLE, "100"))
    except ValueError:
        return False
    return ranks_on_device <= 1 or 0 < percent * ranks_on_device <= 100
