"""Helpers of the iris-runtime tests: worker paths and files in /dev/shm.

(A module with a name of its own, not ``conftest``: several packages' test folders run in one
pytest session, and ``from conftest import ...`` would pick whichever conftest came first.)
"""

from __future__ import annotations

import os

WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers")
SHM = "/dev/shm"


def worker(name: str) -> str:
    """Absolute path of a worker script in tests/workers."""
    return os.path.join(WORKERS, name)


def existing(paths) -> list[str]:
    """The paths of ``paths`` that exist."""
    return [p for p in paths if os.path.exists(p)]
