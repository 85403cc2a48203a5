"""What the benchmarks share: the peers' environment, their plots' matplotlib, and a torch.distributed group over the
Iris ranks. Import it before ``iris.runtime``."""

from __future__ import annotations

import os
import socket
import sys

NO_PLOT = "matplotlib is not installed: no plot"

# Set on import, before any peer starts: torch's symmetric memory with ranks that share a GPU
# (MPS), NVLink multicast off (NCCL and torch), and --quick on the cpu backend.
for _name, _value in (("TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES", "1"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NCCL_NVLS_ENABLE", "0")) + ((("IRIS_BACKEND", "cpu"),) if "--quick" in sys.argv else ()):
    os.environ.setdefault(_name, _value)


def pyplot():
    """``matplotlib.pyplot`` drawing into files (the Agg backend), or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def torch_group(ctx, backend: str):
    """``torch.distributed`` with its default group over the ranks of ``ctx`` (an Iris context: ``rank``,
    ``world_size``, ``comm``, ``device``), through a TCP rendezvous on a local port that rank 0 picks;
    nothing when a group exists. ``backend``: ``"nccl"`` (bound to the context's GPU) or ``"gloo"``."""
    import torch.distributed as dist

    if not dist.is_initialized():
        port = None
        if ctx.rank == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        port = ctx.comm.bcast(port, root=0)
        kwargs = {"device_id": ctx.device} if backend == "nccl" else {}
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=ctx.rank,
                                world_size=ctx.world_size, **kwargs)
    return dist


def symm_mem_group(group=None):
    """``(torch.distributed._symmetric_memory, the name of group)`` (default: the default group),
    symmetric memory enabled for the group where this torch needs it."""
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    name = (group or dist.group.WORLD).group_name
    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
    if enable is not None:
        try:
            enable(name)
        except Exception:  # newer torch: nothing to enable
            pass
    return symm_mem, name
