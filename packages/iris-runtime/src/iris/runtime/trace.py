"""Look at a trace that ``Iris.tracing.export`` wrote, without a browser.

    python -m iris.runtime.trace summary trace.json             # table per rank and operation
    python -m iris.runtime.trace plot trace.json --png out.png  # timeline picture (needs matplotlib)

(installed as the ``iris-trace`` command too). For the interactive view, open the JSON file in
https://ui.perfetto.dev.
"""

from __future__ import annotations

import argparse
import sys

from ._errors import IrisError
from ._trace_export import build_trace, write_trace
from ._trace_report import load_trace, plot_timeline, summarize

__all__ = ["build_trace", "load_trace", "main", "plot_timeline", "summarize", "write_trace"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m iris.runtime.trace",
                                     description="Summarise or draw an Iris device trace (Iris.tracing.export).")
    sub = parser.add_subparsers(dest="command", required=True)
    summary = sub.add_parser("summary", help="per rank and operation: count, bytes, total and mean time")
    summary.add_argument("file", help="trace JSON written by Iris.tracing.export()")
    plot = sub.add_parser("plot", help="timeline PNG (needs matplotlib: pip install 'iris-runtime[trace]')")
    plot.add_argument("file", help="trace JSON written by Iris.tracing.export()")
    plot.add_argument("--png", required=True, help="where to write the picture")
    plot.add_argument("--rows", choices=("auto", "track", "rank"), default="auto",
                      help="one row per track (rank and SM/program) or per rank; auto: per rank when tracks are many")
    plot.add_argument("--title", default=None, help="title of the picture")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (0 ok, 2 bad input)."""
    args = _parser().parse_args(argv)
    try:
        trace = load_trace(args.file, call=f"iris.runtime.trace {args.command}")
        if args.command == "summary":
            print(summarize(trace))
        else:
            out = plot_timeline(trace, args.png, rows=args.rows, title=args.title)
            print(f"wrote {out}")
    except IrisError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
