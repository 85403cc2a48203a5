"""Which backend runs: ``cuda`` (GPU heaps over CUDA IPC), ``nvshmem`` (GPU heaps in NVSHMEM's
symmetric memory, across nodes) or ``cpu`` (shared memory + Triton's interpreter), and switching
the interpreter on for the user.

Triton chooses interpreted or compiled kernels when ``@triton.jit`` runs, so the choice must be
made before the user's kernels (and ``iris.device``) are defined. ``import iris.runtime`` does it:
``IRIS_BACKEND`` (``auto``, ``cuda`` or ``cpu``) decides, ``auto`` meaning ``cuda`` when a GPU is
usable. For the cpu backend it sets ``TRITON_INTERPRET=1``; nobody has to set it by hand.
"""

from __future__ import annotations

import os

import torch

# Nothing from iris.device at module level: this module runs before the interpreter switch, and
# importing iris.device would fix its kernels in the wrong mode.

BACKENDS = ("auto", "cuda", "nvshmem", "cpu")


def gpu_usable() -> bool:
    """True when torch sees at least one CUDA device (no CUDA context is created)."""
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def resolve_backend(backend: str | None) -> str:
    """``"cuda"`` or ``"cpu"`` for a requested backend (``None`` reads ``IRIS_BACKEND``)."""
    from iris.device import IrisBackendError, IrisUsageError

    requested = backend if backend is not None else os.environ.get("IRIS_BACKEND", "auto")
    if requested not in BACKENDS:
        raise IrisUsageError(
            f"iris.runtime.iris(backend={requested!r}): backend must be one of {BACKENDS}; "
            f"'auto' picks 'cuda' when a GPU is usable, else 'cpu'"
        )
    if requested == "auto":
        return "cuda" if gpu_usable() else "cpu"
    if requested in ("cuda", "nvshmem") and not gpu_usable():
        raise IrisBackendError(
            f"iris.runtime.iris(backend={requested!r}): no usable CUDA GPU (torch.cuda.is_available() is False); "
            "use backend='cpu' (shared memory + Triton's interpreter) or 'auto', or run on a GPU machine"
        )
    if requested == "nvshmem":
        from ._heap_nvshmem import nvshmem_modules

        nvshmem_modules()  # the install command now, not after the bootstrap
    return requested


def prepare_network_path(heap) -> None:
    """For the nvshmem backend: make kernels that call NVSHMEM's device functions link and run
    (:mod:`iris.device._nvshmem_host`), and refuse a job whose peers kernels cannot reach."""
    from iris.device import IrisBackendError, _nvshmem, _nvshmem_host

    unmapped = heap.unmapped_peers
    if unmapped and not _nvshmem.NVSHMEM:
        raise IrisBackendError(
            f"iris.runtime.iris(backend='nvshmem'): ranks {unmapped} are not mapped into this process (another node, "
            f"or IRIS_NVSHMEM_FORCE_REMOTE=1), and iris.device was imported without its network path; set "
            f"IRIS_BACKEND=nvshmem and IRIS_NVSHMEM_NETWORK=1 in the environment before Python starts "
            f"(mpirun -x IRIS_BACKEND=nvshmem -x IRIS_NVSHMEM_NETWORK=1 ...)")
    if _nvshmem.NVSHMEM:
        _nvshmem_host.install(_nvshmem_host.device_bitcode(), heap.module_init)


def prepare_interpreter_at_import() -> str:
    """Called by ``import iris.runtime``: switch Triton's interpreter on when the backend that
    ``IRIS_BACKEND`` selects is cpu. Returns that backend (``"cuda"``/``"cpu"``), or ``"auto"``
    when it cannot be resolved yet (an invalid value is reported by ``iris()`` later)."""
    requested = os.environ.get("IRIS_BACKEND", "auto")
    backend = "auto"
    if requested == "cpu" or (requested == "auto" and not gpu_usable()):
        os.environ["TRITON_INTERPRET"] = "1"
        backend = "cpu"
    elif requested in ("auto", "cuda", "nvshmem"):
        backend = "cuda" if requested == "auto" else requested
    # iris.device applies the mode (and converts triton.language if triton came first).
    import iris.device  # noqa: F401
    return backend


def check_interpreter_matches(backend: str) -> None:
    """Fail early when kernels were defined in the wrong mode for ``backend``."""
    import iris.device
    from iris.device import IrisBackendError, interpreter_enabled

    kernels_interpreted = bool(iris.device.INTERPRETER.value)
    if backend == "cpu" and not (kernels_interpreted and interpreter_enabled()):
        raise IrisBackendError(
            "iris.runtime.iris(backend='cpu'): Triton's interpreter was off when iris.device was imported, "
            "so kernels would be compiled for a GPU; set IRIS_BACKEND=cpu (or TRITON_INTERPRET=1) in the "
            "environment before starting Python"
        )
    if backend in ("cuda", "nvshmem") and kernels_interpreted:
        raise IrisBackendError(
            f"iris.runtime.iris(backend={backend!r}): TRITON_INTERPRET=1 is set, so kernels run on the CPU "
            "interpreter and cannot touch GPU memory; unset TRITON_INTERPRET (and IRIS_BACKEND=cpu)"
        )
