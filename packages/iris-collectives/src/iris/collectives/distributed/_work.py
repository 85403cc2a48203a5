"""``IrisWork``: what a collective of the ``iris`` backend returns (``async_op=True`` gives it to
the caller; torch calls ``wait()`` on it otherwise).

A ccl call has already been enqueued on torch's current stream when the work object exists, and
on the cpu backend it has already run (Triton's interpreter runs a launch on the host). So the
work is complete *on the stream*, as NCCL's is: ``wait()`` only makes the stream that is current
at the wait (when it is not the one the call was enqueued on) wait for the call's stream, and
does not block the host, except for ``barrier``, whose ``wait()`` waits on the host too, as
``torch.distributed.barrier`` promises. ``get_future()`` gives a CUDA-aware future (its value: the
call's output tensors) for DDP's communication hooks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class IrisWork(dist.Work):
    """The work of one call: ``tensors`` (its outputs) enqueued on ``stream`` (a CUDA stream, or
    None on the cpu backend, where the call has run); ``blocking``: ``wait()`` also waits on the
    host (``barrier``)."""

    def __init__(self, tensors: list, stream=None, blocking: bool = False):
        super().__init__()
        self._tensors, self._stream, self._blocking = tensors, stream, blocking

    def wait(self, timeout=None) -> bool:
        """Order the current stream after the call (no host wait; ``barrier``: the host waits too).
        Always True: a peer that never comes is the watchdog's to report (``IRIS_TIMEOUT_S``)."""
        stream = self._stream
        if stream is not None:
            if self._blocking:
                stream.synchronize()
            else:
                current = torch.cuda.current_stream(stream.device)
                if current != stream:
                    current.wait_stream(stream)
        return True

    def is_completed(self) -> bool:
        """Whether the call has finished on the device (on the cpu backend: always)."""
        return self._stream is None or self._stream.query()

    def is_success(self) -> bool:
        return True

    def exception(self):
        return None

    def result(self) -> list:
        """The call's output tensors."""
        return self._tensors

    def synchronize(self) -> None:
        """Wait on the host until the call has finished on the device."""
        if self._stream is not None:
            self._stream.synchronize()

    def get_future(self) -> torch.futures.Future:
        """A future whose value is the call's output tensors, complete on the call's stream (a
        CUDA-aware future: whoever waits on it, or chains a callback, is ordered after the call)."""
        if self._stream is None:
            future = torch.futures.Future()
            future.set_result(self._tensors)
            return future
        future = torch.futures.Future(devices=[self._stream.device])
        with torch.cuda.stream(self._stream):
            future.set_result(self._tensors)
        return future


def completed(tensors: list) -> IrisWork:
    """The work of a call that ran nothing (empty tensors, a world of one)."""
    return IrisWork(tensors)
