"""Host side of device tracing: ``Iris.tracing``.

The event buffer and the slot counter live on the heap's device, beside (not inside) the
symmetric heap; their addresses go into the context tensor after the heap bases
(:func:`iris.runtime._context.write_trace_info`). Kernels record only when they were compiled with
``DeviceContext.initialize(..., tracing=True)`` *and* the host enabled tracing.

``export(path)`` is collective: every rank copies its events off the device in one bulk copy,
rank 0 gathers them through the bootstrap (MPI or torch.distributed) and writes one Chrome/Perfetto trace file
(:mod:`iris.runtime._trace_export` describes the file and how clocks line up across ranks).
"""

from __future__ import annotations

import os
import socket

import numpy as np
import torch

from iris.device import _layout as layout

from ._context import write_trace_info
from ._errors import IrisUsageError
from ._trace_export import RankTrace, build_trace, write_trace


class Tracing:
    """``iris.tracing``: enable, disable, reset and export device events.

    ``enable(max_events)`` gives each rank room for ``max_events`` events; an event past that is
    counted as dropped, never written. Call these methods between kernels, not while a traced
    kernel runs.
    """

    def __init__(self, owner):
        self._owner = owner
        self.enabled = False
        self.max_events = 0
        self.counter: torch.Tensor | None = None
        self.buffer: torch.Tensor | None = None

    def enable(self, max_events: int = 1_000_000) -> None:
        """Allocate room for ``max_events`` events on this rank and switch recording on.

        Only kernels that call ``DeviceContext.initialize(..., tracing=True)`` record. Enabling
        again with the same ``max_events`` keeps the events recorded so far (``reset()`` forgets
        them); a different ``max_events`` allocates a new, empty buffer. Each event takes
        ``TRACE_EVENT_FIELDS`` (12) int64 words, 96 bytes, of device memory.
        """
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events <= 0:
            raise IrisUsageError(f"tracing.enable(max_events={max_events!r}): pass a positive int, e.g. 1_000_000")
        device = self._owner.device
        if self.buffer is None or self.max_events != max_events:
            self.counter = torch.zeros(1, dtype=torch.int64, device=device)
            self.buffer = torch.zeros((max_events, layout.TRACE_EVENT_FIELDS), dtype=torch.int64, device=device)
        self.max_events = max_events
        self.enabled = True
        self._publish()

    def disable(self) -> None:
        """Stop recording (kernels compiled with tracing then neither claim slots nor write).
        Events recorded so far are kept for :meth:`export`."""
        self.enabled = False
        if self.buffer is not None:
            self._publish()

    def reset(self) -> None:
        """Forget recorded events and the dropped count (on this rank)."""
        if self.counter is not None:
            self.counter.zero_()
            self.buffer.zero_()

    def _publish(self) -> None:
        write_trace_info(self._owner.get_device_context(), self._owner.world_size, self.enabled, self.max_events,
                         self.counter.data_ptr(), self.buffer.data_ptr())
        # the context's groups (iris.runtime.Group) record into the same buffer: their kernels
        # read the trace words from the group's own context tensor
        for group in list(getattr(self._owner, "_groups", ())):
            write_trace_info(group.get_device_context(), group.size, self.enabled, self.max_events,
                             self.counter.data_ptr(), self.buffer.data_ptr())

    def recorded(self) -> tuple[torch.Tensor, int]:
        """This rank's events as an ``(n, TRACE_EVENT_FIELDS)`` int64 CPU tensor (columns: see
        ``iris.device._layout``) and the number of events dropped for lack of room.

        Waits for the device (reading the counter synchronises), then one bulk copy of the used
        rows; never one copy per event.
        """
        if self.counter is None:
            return torch.zeros((0, layout.TRACE_EVENT_FIELDS), dtype=torch.int64), 0
        claimed = int(self.counter.item())
        kept = min(claimed, self.max_events)
        return self.buffer[:kept].cpu(), claimed - kept

    def export(self, path: str | os.PathLike) -> str:
        """Write every rank's events to one Chrome/Perfetto trace-event JSON file at ``path``.

        Collective: every rank must call it (rank 0 writes the file). Each rank copies its events
        off the device once and sends them to rank 0 in one gather. Open the file in
        https://ui.perfetto.dev (or chrome://tracing), or run
        ``python -m iris.runtime.trace summary|plot FILE``. Returns ``path`` on every rank once
        the file is written.
        """
        owner = self._owner
        boot = owner._boot
        path = os.fspath(path)
        events, dropped = self.recorded()
        rows = np.ascontiguousarray(events.numpy(), dtype=np.int64)
        infos = boot.gather(self._rank_info(dropped), root=0)
        chunks = boot.gather_int64(rows, root=0)
        error = None
        if owner.rank == 0:
            try:
                traces = [RankTrace(events=chunk.reshape(-1, layout.TRACE_EVENT_FIELDS), **info_r)
                          for info_r, chunk in zip(infos, chunks)]
                write_trace(build_trace(traces), path)
            except OSError as exc:
                error = f"tracing.export({path!r}): rank 0 could not write the trace file: {exc}; pass a writable path"
        error = boot.bcast(error, root=0)
        if error is not None:
            raise IrisUsageError(error)
        return path

    def _rank_info(self, dropped: int) -> dict:
        owner = self._owner
        if owner.device.type == "cuda":
            device = f"{owner.device} ({torch.cuda.get_device_name(owner.device)})"
        else:
            device = "cpu (Triton interpreter)"
        return dict(rank=owner.rank, dropped=dropped, max_events=self.max_events, backend=owner.backend,
                    device=device, host=socket.gethostname(), heap_base=int(getattr(owner, "_base", 0) or 0),
                    heap_size=int(owner.heap_size))

    def close(self) -> None:
        """Drop the buffers (called by ``Iris.close``)."""
        self.enabled = False
        self.counter = None
        self.buffer = None

    def __repr__(self) -> str:
        state = "enabled" if self.enabled else "disabled"
        return f"Tracing({state}, max_events={self.max_events})"
