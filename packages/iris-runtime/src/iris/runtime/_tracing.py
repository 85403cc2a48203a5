"""Host side of device tracing: ``Iris.tracing``.

The event buffer and the slot counter live on the heap's device, beside (not inside) the
symmetric heap; their addresses go into the context tensor after the heap bases.
"""

from __future__ import annotations

import torch

from iris.device import _layout as layout

from ._context import write_trace_info
from ._errors import IrisUsageError


class Tracing:
    """``iris.tracing``: enable, disable, reset and export device events."""

    def __init__(self, owner):
        self._owner = owner
        self.enabled = False
        self.max_events = 0
        self.counter: torch.Tensor | None = None
        self.buffer: torch.Tensor | None = None

    def enable(self, max_events: int = 1_000_000) -> None:
        """Allocate room for ``max_events`` events per rank and switch recording on.

        Only kernels that call ``DeviceContext.initialize(..., tracing=True)`` record.
        """
        if not isinstance(max_events, int) or max_events <= 0:
            raise IrisUsageError(f"tracing.enable(max_events={max_events!r}): pass a positive int, e.g. 1_000_000")
        device = self._owner.device
        if self.buffer is None or self.max_events != max_events:
            self.counter = torch.zeros(1, dtype=torch.int64, device=device)
            self.buffer = torch.zeros((max_events, layout.TRACE_EVENT_FIELDS), dtype=torch.int64, device=device)
        self.max_events = max_events
        self.enabled = True
        self._publish()

    def disable(self) -> None:
        """Stop recording (events recorded so far are kept for ``export``)."""
        self.enabled = False
        if self.buffer is not None:
            self._publish()

    def reset(self) -> None:
        """Forget recorded events and the dropped count."""
        if self.counter is not None:
            self.counter.zero_()
            self.buffer.zero_()

    def _publish(self) -> None:
        write_trace_info(self._owner.get_device_context(), self._owner.world_size, self.enabled, self.max_events,
                         self.counter.data_ptr(), self.buffer.data_ptr())

    def recorded(self) -> tuple[torch.Tensor, int]:
        """This rank's events as an ``(n, TRACE_EVENT_FIELDS)`` int64 CPU tensor and the number of
        events dropped for lack of room. One bulk copy from the device."""
        if self.counter is None:
            return torch.zeros((0, layout.TRACE_EVENT_FIELDS), dtype=torch.int64), 0
        claimed = int(self.counter.item())
        kept = min(claimed, self.max_events)
        return self.buffer[:kept].cpu(), claimed - kept

    def close(self) -> None:
        self.enabled = False
        self.counter = None
        self.buffer = None
