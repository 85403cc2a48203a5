"""The selection table of the host collectives: which variant and tiling each call gets.

Data, not code: JSON files in ``ccl/tables/`` beside this module, one per measured card
(``NVIDIA_H200.json``: the device name ``torch.cuda.get_device_name`` returns, each run of
characters other than letters and digits made ``_``) and ``fallback.json`` for any device. Each
file is ``{"device": ..., "capability": "sm_90", "rows": [...]}`` (the fallback: rows only).

The table is a list of rows, the first matching row wins (so specific rows come first). A row
matches a call when its ``backend`` is the context's, ``collective`` is the call's or ``"*"``, the
per-rank message (``inp``'s bytes; ``tensor``'s for broadcast) is at most ``max_bytes``
(``None``: any size), ``dtype`` is the call's or ``"*"``, ``world_size`` is the call's or 0, and
``ranks_per_gpu`` (ranks sharing one device, 1: one rank per GPU) is the context's or 0 (absent:
0). Its ``config`` fills the fields of :class:`~iris.collectives.ccl.Config` the caller left
``None``.

Which rows a process gets (:func:`table_source` says which and why; logged once at INFO on the
``iris`` logger):

- the ``cuda`` backend: the rows of the current device's own file, else (a card nobody measured)
  the rows of a measured card of the same compute capability, borrowed (an H100 gets the H200's:
  both sm_90 with NVLink 4; the fastest variant of a size class carries over, the absolute times
  do not), else none; then the fallback rows, always last. The device is looked up on first use,
  not at import, so importing never initialises CUDA.
- any other backend (``cpu``): the fallback rows alone (its row there); no CUDA call.

Rows with a ``measured`` entry (date, device, dtype) were written by ``benchmarks/ccl.py
--write-table`` into the file of the card it ran on: one run per world size and ranks per GPU
replaces that configuration's rows and keeps the others. The fallback rows (any world size, 0)
hold where nothing was measured: one-shot all-reduce up to 1 MiB and two-shot above; small tiles
for small messages. Rerun the benchmark to measure another card.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re

#: The folder of the table files.
TABLES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tables")
FALLBACK_FILE = "fallback.json"

_log = logging.getLogger("iris.collectives.ccl")


def file_name(device: str) -> str:
    """The table file of the card named ``device`` (``torch.cuda.get_device_name``'s words):
    ``"NVIDIA H100 80GB HBM3"`` -> ``"NVIDIA_H100_80GB_HBM3.json"``."""
    return re.sub(r"[^A-Za-z0-9]+", "_", device).strip("_") + ".json"


def read(path: str) -> dict:
    """One table file: ``{"device", "capability", "rows"}`` (the fallback file: ``rows`` alone)."""
    with open(path) as f:
        return json.load(f)


def write(path: str, rows: list[dict], device: str | None = None, capability: str | None = None) -> None:
    """Write a table file: one row a line, so that a re-measurement's diff shows the rows it changed."""
    head = {k: v for k, v in (("device", device), ("capability", capability)) if v is not None}
    text = "{\n" + "".join(f"  {json.dumps(k)}: {json.dumps(v)},\n" for k, v in head.items())
    text += '  "rows": [\n' + ",\n".join("    " + json.dumps(r) for r in rows) + "\n  ]\n}\n"
    with open(path, "w") as f:
        f.write(text)


def fallback_rows() -> list[dict]:
    """The rows for any device and world size (``fallback.json``)."""
    return read(os.path.join(TABLES_DIR, FALLBACK_FILE))["rows"]


@functools.cache
def load(device: str | None, capability: str | None, tables_dir: str = TABLES_DIR) -> tuple[list[dict], str]:
    """The table of a card named ``device`` of compute ``capability`` (``"sm_90"``; ``None`` for
    both: no CUDA device) and a line saying where its rows come from: the card's own file, else
    a measured card's of the same capability (the first by file name), else none; the fallback
    rows last."""
    fallback = read(os.path.join(tables_dir, FALLBACK_FILE))["rows"]
    if device is None:
        return fallback, f"{FALLBACK_FILE} (no CUDA device)"
    own = os.path.join(tables_dir, file_name(device))
    if os.path.exists(own):
        return read(own)["rows"] + fallback, f"{file_name(device)} (measured on this card) + {FALLBACK_FILE}"
    for name in sorted(os.listdir(tables_dir)):
        if name.endswith(".json") and name != FALLBACK_FILE:
            other = read(os.path.join(tables_dir, name))
            if capability is not None and other.get("capability") == capability:
                return other["rows"] + fallback, (f"{name} (borrowed: {device} has no table of its own; "
                                                  f"{other['device']} has the same compute capability "
                                                  f"{capability}) + {FALLBACK_FILE}")
    return fallback, (f"{FALLBACK_FILE} ({device}, {capability}: no table of its own and no measured card of "
                      f"that compute capability; run benchmarks/ccl.py --write-table to measure it)")


def current_device() -> tuple[str | None, str | None]:
    """This process's CUDA device: its name and compute capability (``"sm_90"``), or ``(None,
    None)`` without one. ``torch.cuda.is_available`` asks the driver without initialising CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None, None
    index = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    return torch.cuda.get_device_name(index), f"sm_{major}{minor}"


def _load_current() -> None:
    rows, source = load(*current_device())
    globals().update(TABLE=rows, SOURCE=source)
    _log.info("iris.collectives.ccl: selection table %s", source)


def __getattr__(name: str):
    # TABLE and SOURCE are looked up on first use (the current device then), not at import
    if name in ("TABLE", "SOURCE"):
        _load_current()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: The rows of every backend other than ``cuda``: the fallback file's, read at import.
OTHER_BACKENDS = fallback_rows()


def rows(backend: str) -> list[dict]:
    """The table that calls on ``backend`` search: :data:`TABLE` (this card's) on ``cuda``, the
    fallback rows on any other backend."""
    if backend != "cuda":
        return OTHER_BACKENDS
    if "TABLE" not in globals():
        _load_current()
    return globals()["TABLE"]


def table_source() -> str:
    """Which table file the ``cuda`` backend's calls use in this process and why: the card's own
    file, one borrowed from a measured card of the same compute capability, or the fallback alone
    (with the device's name and capability), then ``fallback.json``."""
    if "SOURCE" not in globals():
        _load_current()
    return globals()["SOURCE"]
