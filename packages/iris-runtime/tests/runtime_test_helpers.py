"""Helpers of the iris-runtime tests: worker paths and /dev/shm bookkeeping.

(A module with a name of its own, not ``conftest``: several packages' test folders run in one
pytest session, and ``from conftest import ...`` would pick whichever conftest came first.)
"""

from __future__ import annotations

import contextlib
import glob
import os
import time

WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers")
SHM = "/dev/shm"


def worker(name: str) -> str:
    """Absolute path of a worker script in tests/workers."""
    return os.path.join(WORKERS, name)


def existing(paths) -> list[str]:
    """The paths of ``paths`` that exist."""
    return [p for p in paths if os.path.exists(p)]


def mapped_anywhere(path: str) -> bool:
    """True when some live process maps ``path`` (so it belongs to a running job)."""
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                if path in f.read():
                    return True
        except OSError:
            continue
    return False


def shm_listing() -> set[str]:
    return set(os.listdir(SHM)) if os.path.isdir(SHM) else set()


def remove_dead_mpich_segments(before: set[str]) -> None:
    """Remove the ``mpich_shm_*`` segments that appeared since ``before`` and that no live process
    maps. An aborted MPICH job leaves them behind (MPICH's files, not ours: a killed rank never
    unlinks them); segments of jobs still running are mapped, so they are left alone."""
    for name in sorted(shm_listing() - before):
        if not name.startswith("mpich_shm_"):
            continue
        path = os.path.join(SHM, name)
        deadline = time.monotonic() + 3  # killed ranks may take a moment to go after mpiexec returned
        while mapped_anywhere(path) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not mapped_anywhere(path):
            with contextlib.suppress(OSError):
                os.unlink(path)
