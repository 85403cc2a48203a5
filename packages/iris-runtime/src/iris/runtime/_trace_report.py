"""Reading an exported trace back: a text summary and a PNG timeline.

Both work from the file alone (what ``Iris.tracing.export`` wrote), so a trace from the GPU
machine can be looked at anywhere. The picture needs matplotlib (``pip install
'iris-runtime[trace]'``); the summary needs nothing beyond the standard library and numpy.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass

from ._errors import IrisUsageError

#: Above this many tracks the timeline draws one row per rank instead of one per track.
MAX_TRACK_ROWS = 48


def load_trace(path: str | os.PathLike, call: str = "load_trace") -> dict:
    """The trace-event JSON object in ``path``, or :class:`IrisUsageError` saying what is wrong."""
    try:
        with open(path, encoding="utf-8") as f:
            trace = json.load(f)
    except FileNotFoundError:
        raise IrisUsageError(f"{call}({os.fspath(path)!r}): no such file; pass the path given to "
                             f"Iris.tracing.export()") from None
    except json.JSONDecodeError as exc:
        raise IrisUsageError(f"{call}({os.fspath(path)!r}): not JSON ({exc}); pass a file written by "
                             f"Iris.tracing.export()") from None
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise IrisUsageError(f"{call}({os.fspath(path)!r}): no 'traceEvents' list; pass a trace-event JSON object "
                             f"written by Iris.tracing.export()")
    return trace


@dataclass
class OpStats:
    """Totals for one (rank, operation): events, bytes, time in microseconds."""

    count: int = 0
    instants: int = 0
    bytes: int = 0
    total_us: float = 0.0

    @property
    def mean_us(self) -> float:
        timed = self.count - self.instants
        return self.total_us / timed if timed else 0.0


def op_stats(trace: dict) -> dict[int, dict[str, OpStats]]:
    """``{rank: {operation: OpStats}}`` over the trace's events (metadata events skipped)."""
    stats: dict[int, dict[str, OpStats]] = defaultdict(lambda: defaultdict(OpStats))
    for event in trace["traceEvents"]:
        phase = event.get("ph")
        if phase not in ("X", "i", "I"):
            continue
        entry = stats[int(event["pid"])][event["name"]]
        entry.count += 1
        entry.bytes += int(event.get("args", {}).get("bytes", 0) or 0)
        if phase == "X":
            entry.total_us += float(event.get("dur", 0.0))
        else:
            entry.instants += 1
    return stats


def _dropped(trace: dict) -> dict[int, int]:
    other = trace.get("otherData", {}) or {}
    return {int(rank): int(n) for rank, n in (other.get("dropped", {}) or {}).items()}


def _format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def summarize(trace: dict) -> str:
    """A text table: per rank and operation, the count, bytes, total and mean time; then the
    dropped events per rank. Instants (events with no end) count but have no time."""
    stats = op_stats(trace)
    dropped = _dropped(trace)
    ranks = sorted(set(stats) | set(dropped))
    header = f"{'rank':>4}  {'operation':<14} {'count':>8} {'bytes':>12} {'total us':>12} {'mean us':>10}"
    lines = [header, "-" * len(header)]
    for rank in ranks:
        ops = stats.get(rank, {})
        for name in sorted(ops, key=lambda n: (-ops[n].total_us, n)):
            s = ops[name]
            timed = s.count > s.instants
            total = f"{s.total_us:12.3f}" if timed else f"{'-':>12}"
            mean = f"{s.mean_us:10.3f}" if timed else f"{'(instant)':>10}"
            lines.append(f"{rank:>4}  {name:<14} {s.count:>8} {_format_bytes(s.bytes):>12} {total} {mean}")
        events = sum(s.count for s in ops.values())
        lines.append(f"{rank:>4}  {'= all':<14} {events:>8} {_format_bytes(sum(s.bytes for s in ops.values())):>12}"
                     f"   dropped: {dropped.get(rank, 0)}")
    if not ranks:
        lines.append("(no events)")
    total_dropped = sum(dropped.values())
    lines.append(f"{len(ranks)} ranks, {sum(sum(s.count for s in o.values()) for o in stats.values())} events, "
                 f"{total_dropped} dropped" + (" (raise max_events in tracing.enable)" if total_dropped else ""))
    return "\n".join(lines)


def _track_names(trace: dict) -> dict[tuple[int, int], str]:
    names = {}
    for event in trace["traceEvents"]:
        if event.get("ph") == "M" and event.get("name") == "thread_name":
            names[(int(event["pid"]), int(event["tid"]))] = event["args"]["name"]
    return names


def _nesting_depths(events: list[dict]) -> list[int]:
    # Depth of each complete event inside the others of its track (0 = outermost).
    depth = [0] * len(events)
    by_track: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, e in enumerate(events):
        if e["ph"] == "X":
            by_track[(int(e["pid"]), int(e["tid"]))].append(i)
    for indices in by_track.values():
        indices.sort(key=lambda i: (float(events[i]["ts"]), -float(events[i].get("dur", 0.0))))
        open_ends: list[float] = []
        for i in indices:
            start = float(events[i]["ts"])
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            depth[i] = len(open_ends)
            open_ends.append(start + float(events[i].get("dur", 0.0)))
    return depth


def plot_timeline(trace: dict, png: str | os.PathLike, rows: str = "auto", title: str | None = None) -> str:
    """Draw the trace as a timeline PNG: one row per track (rank and SM/program), or one row per
    rank (``rows="rank"``; ``"auto"`` picks it above ``MAX_TRACK_ROWS`` tracks). Bars are complete
    events coloured by operation; ticks are instants. Returns the PNG path."""
    if rows not in ("auto", "track", "rank"):
        raise IrisUsageError(f"plot_timeline(rows={rows!r}): rows must be 'auto', 'track' or 'rank'")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as exc:
        raise IrisUsageError(
            f"plot_timeline: matplotlib is needed for the PNG timeline ({exc}); "
            f"install it with pip install 'iris-runtime[trace]' (or pip install matplotlib), "
            f"or use the text summary instead") from None

    events = [e for e in trace["traceEvents"] if e.get("ph") in ("X", "i", "I")]
    tracks = sorted({(int(e["pid"]), int(e["tid"])) for e in events})
    per_rank = rows == "rank" or (rows == "auto" and len(tracks) > MAX_TRACK_ROWS)
    names = _track_names(trace)
    if per_rank:
        keys = sorted({pid for pid, _ in tracks})
        row_of = {t: keys.index(t[0]) for t in tracks}
        labels = [f"rank {k}" for k in keys]
    else:
        keys = tracks
        row_of = {t: i for i, t in enumerate(tracks)}
        labels = [f"rank {pid} · {names.get((pid, tid), f'track {tid}')}" for pid, tid in tracks]

    ops = sorted({e["name"] for e in events})
    cmap = plt.get_cmap("tab20" if len(ops) > 10 else "tab10")
    color = {name: cmap(i % cmap.N) for i, name in enumerate(ops)}
    height = min(max(2.0, 0.32 * len(labels) + 1.6), 40.0)
    fig, ax = plt.subplots(figsize=(12, height))
    depth = _nesting_depths(events)
    span = max((float(e["ts"]) + float(e.get("dur", 0.0)) for e in events), default=0.0)
    unit, scale = ("s", 1e-6) if span >= 1e6 else ("ms", 1e-3) if span >= 1e4 else ("us", 1.0)
    bars: dict[tuple[int, int, str], list[tuple[float, float]]] = defaultdict(list)
    ticks: dict[str, tuple[list[float], list[int]]] = defaultdict(lambda: ([], []))
    for e, level in zip(events, depth):
        row = row_of[(int(e["pid"]), int(e["tid"]))]
        if e["ph"] == "X":
            width = max(float(e.get("dur", 0.0)), 0.0) * scale
            bars[(0 if per_rank else level, row, e["name"])].append((float(e["ts"]) * scale, width))
        else:
            ticks[e["name"]][0].append(float(e["ts"]) * scale)
            ticks[e["name"]][1].append(row)
    alpha = 0.6 if per_rank else 0.95
    # Outer ranges first, the operations they contain on top as thinner bars.
    for (level, row, name), spans in sorted(bars.items(), key=lambda item: item[0][0]):
        h = 0.8 * 0.6 ** level
        ax.broken_barh(spans, (row - h / 2, h), facecolors=color[name], edgecolors="none", alpha=alpha)
    for name, (xs, ys) in ticks.items():
        ax.scatter(xs, ys, marker="|", s=120, color=color[name], linewidths=1.5, zorder=3)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=7 if len(labels) > 16 else 9)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlabel(f"time ({unit}, from the first event)")
    ax.grid(axis="x", alpha=0.3)
    dropped = sum(_dropped(trace).values())
    heading = title or f"Iris device trace: {len({pid for pid, _ in tracks})} ranks, {len(events)} events"
    if dropped:
        heading += f" ({dropped} dropped)"
    ax.set_title(heading)
    ax.legend(handles=[Patch(color=color[n], label=n) for n in ops], loc="upper left", bbox_to_anchor=(1.01, 1.0),
              fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return os.fspath(png)
