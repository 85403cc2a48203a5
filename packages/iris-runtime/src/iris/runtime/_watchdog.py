"""The watchdog's host side: read the report a stopped wait wrote, say it, end the job.

The device side (``iris.device._watchdog``) bounds every wait of iris.collectives by the timeout
in the context tensor and, when one runs out, writes a report into the host-visible words that
this module allocates. A daemon thread polls those words every ``POLL_S`` seconds: plain reads of
pinned host memory, no CUDA call, so it works while kernels spin, while another thread captures a
CUDA graph, and while the main thread is blocked in a synchronisation or in MPI. When a report
appears it prints it on stderr, waits ``GRACE_S`` so that the other ranks' reports get out too,
and ends the whole job with ``MPI_Abort`` (exit code ``EXIT_CODE``). ``Iris.barrier()`` and
``Iris.close()`` also look, so a program never goes on past a wait that gave up.
"""

from __future__ import annotations

import sys
import threading
import time

import torch

from iris.device import _layout as layout
from iris.device import _watchdog as device_watchdog

from ._errors import IrisTimeoutError

#: How often the thread looks at the report, in seconds.
POLL_S = 0.05
#: How long the rank whose wait ran out waits before aborting, so that peers print their reports.
GRACE_S = 1.0
#: The exit code of a job that the watchdog ended.
EXIT_CODE = 75

_FIELDS = device_watchdog.RECORD_FIELDS


def describe(words: list[int], world_size: int, timeout_s: float) -> str:
    """The report of a stopped wait (``words``: the record's int64 words) as one message."""
    r = dict(zip(_FIELDS, words))
    call = device_watchdog.WAIT_CALLS[r["call"]] if 0 <= r["call"] < len(device_watchdog.WAIT_CALLS) else "an iris wait"
    flag = device_watchdog.WAIT_FLAGS[r["flag"]] if 0 <= r["flag"] < len(device_watchdog.WAIT_FLAGS) else "flag"
    if r["peer"] >= 0:
        peers = f"peer {r['peer']}"
    elif world_size == 2:
        peers = f"peer {1 - r['rank']}"
    else:
        peers = f"{r['target'] - r['seen']} arrival(s) from the other {world_size - 1} ranks"
    where = (f"in {call} on flag '{flag}' of tile/slot {r['index']}: it holds {r['seen']}, expected >= {r['target']}, "
             f"still missing: {peers}")
    if r["state"] == device_watchdog.STATE_TIMED_OUT:
        return (f"iris watchdog: rank {r['rank']} waited {r['waited_ns'] / 1e9:.1f} s {where}. A rank did not make the "
                f"matching call (every rank must call each collective for the same tiles, in the same order, with "
                f"the same grid), died, or is slower than the timeout ({timeout_s:g} s) allows: raise it with "
                f"IRIS_TIMEOUT_S or iris.runtime.iris(timeout_s=...), or set 0 to switch the watchdog off. "
                f"Ending the job.")
    return (f"iris watchdog: rank {r['rank']} stopped waiting after {r['waited_ns'] / 1e9:.1f} s {where}, because "
            f"a wait timed out on some rank (its report says which).")


class Watchdog:
    """The report words of this rank and the thread that watches them."""

    def __init__(self, comm, rank: int, world_size: int, device: torch.device, timeout_s: float):
        self.comm, self.rank, self.world_size, self.timeout_s = comm, rank, world_size, timeout_s
        # Pinned host memory: with unified addressing its address is valid on the GPU as well.
        self.record = torch.zeros(device_watchdog.RECORD_WORDS, dtype=torch.int64,
                                  pin_memory=device.type == "cuda")
        self._words = self.record.numpy()
        self._stop = threading.Event()
        self._thread = None
        if timeout_s > 0:
            self._thread = threading.Thread(target=self._watch, name=f"iris-watchdog-{rank}", daemon=True)
            self._thread.start()

    @property
    def address(self) -> int:
        return self.record.data_ptr()

    @property
    def timeout_ns(self) -> int:
        return int(self.timeout_s * 1e9) if device_watchdog.WATCHDOG.value else 0

    def report(self) -> str | None:
        """The message of this rank's report, or None while no wait stopped."""
        if int(self._words[0]) == 0:
            return None
        return describe([int(w) for w in self._words], self.world_size, self.timeout_s)

    def check(self, call: str) -> None:
        """Raise :class:`IrisTimeoutError` if a wait of this rank stopped (``call`` names the caller)."""
        message = self.report()
        if message is not None:
            raise IrisTimeoutError(f"{call}: {message}")

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            message = self.report()
            if message is None:
                continue
            print(message, file=sys.stderr, flush=True)
            timed_out = int(self._words[0]) == device_watchdog.STATE_TIMED_OUT
            # The rank that timed out ends the job after a grace period; the ranks it drained only
            # if it could not (e.g. it died while aborting).
            time.sleep(GRACE_S if timed_out else 10 * GRACE_S)
            print(f"iris watchdog: rank {self.rank}: MPI_Abort({EXIT_CODE})", file=sys.stderr, flush=True)
            self.comm.Abort(EXIT_CODE)
            return

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * POLL_S)


def write_watchdog_info(context: torch.Tensor, world_size: int, timeout_ns: int, record_ptr: int) -> None:
    """Update the watchdog words of ``context`` in place (kernels launched afterwards see them)."""
    trailer = layout.HEAP_BASES + world_size
    assert layout.WATCHDOG_RECORD - layout.WATCHDOG_NS == 1  # the two words are adjacent
    values = torch.tensor([timeout_ns, record_ptr], dtype=torch.int64)
    context[trailer + layout.WATCHDOG_NS:trailer + layout.WATCHDOG_NS + 2].copy_(values.to(context.device))
