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

import time

import torch
import torch.distributed as dist

#: torch's current stream of a device as ``(stream_id, device_index, device_type)``, without making a
#: ``torch.cuda.Stream`` (a call of the backend pays for this once; a Stream object costs more).
_current_stream = getattr(torch._C, "_cuda_getCurrentStream", None)


def stream_key(device_index: int) -> tuple:
    """The current CUDA stream of ``device_index``, as ``(stream_id, device_index, device_type)``."""
    if _current_stream is not None:
        return tuple(_current_stream(device_index))
    stream = torch.cuda.current_stream(device_index)
    return stream.stream_id, stream.device_index, stream.device_type


def _stream(key: tuple) -> torch.cuda.Stream:
    return torch.cuda.Stream(stream_id=key[0], device_index=key[1], device_type=key[2])


#: ``dist.Work``'s own constructor, called directly (cheaper than ``super().__init__()``).
_work_init = dist.Work.__init__


class IrisWork(dist.Work):
    """The work of one call: ``tensors`` (its outputs) enqueued on the stream ``stream`` (a
    :func:`stream_key`; None on the cpu backend, where the call has run); ``blocking``: ``wait()``
    also waits on the host (``barrier``)."""

    # Defaults as class attributes: an all-reduce (the path of every DDP bucket) sets two attributes
    # per call, not four (about 0.3 us less per call on a 2-core x86 host).
    _blocking = False
    _inner = None  # a point-to-point call's ccl.Work (on a stream of its own)

    def __init__(self, tensors: list, stream: tuple | None = None, blocking: bool = False, inner=None):
        _work_init(self)
        self._tensors, self._stream = tensors, stream
        if blocking:
            self._blocking = True
        if inner is not None:
            self._inner = inner

    def wait(self, timeout=None) -> bool:
        """Order the current stream after the call (no host wait; ``barrier``: the host waits too).
        Always True: a peer that never comes is the watchdog's to report (``IRIS_TIMEOUT_S``)."""
        if self._inner is not None:
            return self._inner.wait()
        key = self._stream
        if key is not None:
            if self._blocking:
                _stream(key).synchronize()
            elif stream_key(key[1]) != key:
                torch.cuda.current_stream(key[1]).wait_stream(_stream(key))
        return True

    def is_completed(self) -> bool:
        """Whether the call has finished on the device (on the cpu backend: always)."""
        if self._inner is not None:
            return self._inner.is_completed()
        return self._stream is None or _stream(self._stream).query()

    def is_success(self) -> bool:
        return True

    def exception(self):
        return None

    def result(self) -> list:
        """The call's output tensors."""
        return self._tensors

    def synchronize(self) -> None:
        """Wait on the host until the call has finished on the device."""
        if self._inner is not None:
            while not self._inner.is_completed():
                time.sleep(0)
            return
        if self._stream is not None:
            _stream(self._stream).synchronize()

    def get_future(self) -> torch.futures.Future:
        """A future whose value is the call's output tensors, complete on the call's stream (a
        CUDA-aware future: whoever waits on it, or chains a callback, is ordered after the call)."""
        if self._stream is None or self._inner is not None:
            self.wait()  # a point-to-point call: the current stream waits for it, the future on it
            future = torch.futures.Future()
            future.set_result(self._tensors)
            return future
        stream = _stream(self._stream)
        future = torch.futures.Future(devices=[stream.device])
        with torch.cuda.stream(stream):
            future.set_result(self._tensors)
        return future


def completed(tensors: list) -> IrisWork:
    """The work of a call that enqueued nothing (empty tensors)."""
    return IrisWork(tensors)
