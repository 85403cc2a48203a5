"""Turning recorded device events into one Chrome/Perfetto trace-event file.

The file is the JSON object form of the trace-event format, which https://ui.perfetto.dev and
chrome://tracing open as they are::

    {"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}

- one process per rank (``pid`` = rank, named ``rank r``; its labels give the device and the
  number of events kept and dropped);
- one track per SM on the GPU (``tid`` = SM id, named ``SM s``) or per program under the
  interpreter (``tid`` = program id, named ``program p``). Programs that share an SM at the same
  time would overlap on one track, which the format cannot show, so a second, third ... track of
  that SM (``SM s #2``) takes them; events of one program nest (a user range around the
  operations it contains);
- a complete event (``"ph": "X"``) per closed event and an instant (``"ph": "i"``) per event whose
  end was never recorded (``record_event``), named by operation (``store``, ``atomic_add``,
  ``compute``, ...), with the target rank, address (hex), heap offset, bytes, ``pid_m``/``pid_n``,
  program id and SM as arguments.

Time: ``ts`` and ``dur`` are microseconds (floats with ns precision), counted from the earliest
event start over all ranks, so the trace starts at 0. The raw clock is ``%globaltimer`` on the
GPU (one clock per GPU: ranks that share a GPU share it exactly; GPUs of one node each keep their
own copy, which the driver sets from the host clock, so they agree closely but Iris corrects no
offset between them) and the host's monotonic clock under the interpreter (one clock per machine:
all ranks of a CPU run line up exactly). Ranks on different nodes are not aligned.

``otherData`` keeps what the viewer does not show: per rank the events kept, dropped (past
``max_events``) and incomplete, the device, host and clock, and the raw time origin in ns.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

from iris.device import EVENT_NAMES
from iris.device import _layout as layout

from ._version import __version__

#: Track ids of extra tracks of one SM: ``tid = sm + lane * LANE_TID_STRIDE``.
LANE_TID_STRIDE = 1 << 20

CLOCKS = {
    "cuda": "%globaltimer: one clock per GPU (ranks on one GPU share it)",
    "cpu": "host monotonic clock: one clock per machine (all ranks share it)",
}


@dataclass
class RankTrace:
    """One rank's events (an ``(n, TRACE_EVENT_FIELDS)`` int64 array) and what export says about it."""

    rank: int
    events: np.ndarray
    dropped: int = 0
    max_events: int = 0
    backend: str = "cpu"
    device: str = ""
    host: str = ""
    heap_base: int = 0
    heap_size: int = 0
    extra: dict = field(default_factory=dict)


def event_category(event_id: int) -> str:
    """``memory`` (load ... copy), ``atomic`` or ``user`` (ranges and user-defined ids)."""
    if event_id <= 5:
        return "memory"
    if event_id < 32:
        return "atomic"
    return "user"


def _lanes(starts: np.ndarray, ends: np.ndarray, programs: np.ndarray) -> np.ndarray:
    # Split the events of one SM over as few tracks as possible such that, on each track, events
    # either follow one another or nest inside an event of the same program. The trace-event
    # format needs that (partly overlapping slices on one track are misdrawn or dropped).
    order = np.lexsort((-ends, starts))
    lane_of = np.zeros(len(starts), dtype=np.int64)
    stacks: list[list[tuple[int, int]]] = []  # per lane: open (end, program) intervals
    for i in order:
        start, end, program = int(starts[i]), int(ends[i]), int(programs[i])
        for lane, stack in enumerate(stacks):
            while stack and stack[-1][0] <= start:  # ended: what comes next follows it
                stack.pop()
            if not stack or (end <= stack[-1][0] and stack[-1][1] == program):
                stack.append((end, program))
                lane_of[i] = lane
                break
        else:
            stacks.append([(end, program)])
            lane_of[i] = len(stacks) - 1
    return lane_of


def _metadata(name: str, pid: int, tid: int | None, args: dict) -> dict:
    event = {"name": name, "ph": "M", "pid": pid, "args": args}
    if tid is not None:
        event["tid"] = tid
    return event


def build_trace(ranks: list[RankTrace]) -> dict:
    """The trace-event JSON object (a dict) for the events of every rank."""
    valid = []
    for r in ranks:
        events = np.asarray(r.events, dtype=np.int64).reshape(-1, layout.TRACE_EVENT_FIELDS)
        # A row whose id is 0 was claimed but never written (a kernel that died mid-record).
        valid.append(events[events[:, layout.EVENT_ID] != 0])
    starts = [v[:, layout.EVENT_START] for v in valid if len(v)]
    origin = int(min(int(s.min()) for s in starts)) if starts else 0

    trace_events: list[dict] = []
    rank_meta = []
    for r, events in sorted(zip(ranks, valid), key=lambda pair: pair[0].rank):
        pid = int(r.rank)
        incomplete = int(len(r.events) - len(events))
        on_gpu = r.backend in ("cuda", "nvshmem")
        track = "SM" if on_gpu else "program"
        labels = f"{r.device or r.backend}; {len(events)} events, {r.dropped} dropped"
        trace_events.append(_metadata("process_name", pid, None, {"name": f"rank {pid}"}))
        trace_events.append(_metadata("process_sort_index", pid, None, {"sort_index": pid}))
        trace_events.append(_metadata("process_labels", pid, None, {"labels": labels}))
        rank_meta.append({"rank": pid, "events": len(events), "dropped": int(r.dropped),
                          "incomplete": incomplete, "max_events": int(r.max_events), "backend": r.backend,
                          "device": r.device, "host": r.host, "clock": CLOCKS.get(r.backend, r.backend),
                          "heap_base": hex(r.heap_base), "heap_size": int(r.heap_size), **r.extra})
        if not len(events):
            continue
        starts_r = events[:, layout.EVENT_START]
        ends_r = events[:, layout.EVENT_END]
        closed = ends_r != 0
        ends_eff = np.where(closed, np.maximum(ends_r, starts_r), starts_r)
        sms = events[:, layout.EVENT_SM]
        tids = np.empty(len(events), dtype=np.int64)
        for sm in np.unique(sms):
            where = np.nonzero(sms == sm)[0]
            lanes = _lanes(starts_r[where], ends_eff[where], events[where, layout.EVENT_PID])
            tids[where] = int(sm) + lanes * LANE_TID_STRIDE
            for lane in np.unique(lanes):
                tid = int(sm) + int(lane) * LANE_TID_STRIDE
                name = f"{track} {int(sm)}" + (f" #{int(lane) + 1}" if lane else "")
                trace_events.append(_metadata("thread_name", pid, tid, {"name": name}))
                trace_events.append(_metadata("thread_sort_index", pid, tid, {"sort_index": int(sm) * 64 + int(lane)}))
        for row, tid, is_closed, end in zip(events.tolist(), tids.tolist(), closed.tolist(), ends_eff.tolist()):
            event_id = row[layout.EVENT_ID]
            address = row[layout.EVENT_ADDRESS]
            args = {
                "target_rank": row[layout.EVENT_TARGET],
                "address": hex(address),
                "bytes": row[layout.EVENT_BYTES],
                "pid_m": row[layout.EVENT_PID_M],
                "pid_n": row[layout.EVENT_PID_N],
                "program": row[layout.EVENT_PID],
                "sm": row[layout.EVENT_SM],
            }
            if r.heap_size and 0 <= address - r.heap_base < r.heap_size:
                args["heap_offset"] = address - r.heap_base
            event = {
                "name": EVENT_NAMES.get(event_id, f"event_{event_id}"),
                "cat": event_category(event_id),
                "ph": "X" if is_closed else "i",
                "ts": round((row[layout.EVENT_START] - origin) / 1000.0, 3),
                "pid": pid,
                "tid": tid,
                "args": args,
            }
            if is_closed:
                event["dur"] = round((end - row[layout.EVENT_START]) / 1000.0, 3)
            else:
                event["s"] = "t"
            trace_events.append(event)

    return {
        "traceEvents": trace_events,
        "displayTimeUnit": "ns",
        "otherData": {
            "producer": f"iris.runtime {__version__} (Iris.tracing.export)",
            "time_unit": "ts and dur in microseconds since time_origin_ns",
            "time_origin_ns": origin,
            "alignment": ("timestamps of all ranks count from the earliest event start; ranks on one GPU (and all "
                          "ranks of a CPU run) share one clock, GPUs of one node each have their own %globaltimer "
                          "(no offset correction), nodes are not aligned"),
            "dropped": {str(m["rank"]): m["dropped"] for m in rank_meta},
            "ranks": rank_meta,
        },
    }


def write_trace(trace: dict, path: str | os.PathLike) -> None:
    """Write ``trace`` as compact JSON (one event per line, so that text tools can read it too)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write('{"traceEvents": [\n')
        for i, event in enumerate(trace["traceEvents"]):
            f.write(("" if i == 0 else ",\n") + json.dumps(event, separators=(",", ":")))
        f.write("\n],\n")
        rest = {k: v for k, v in trace.items() if k != "traceEvents"}
        f.write(json.dumps(rest, indent=1)[1:].lstrip("\n"))
        f.write("\n")
