"""The ``iris`` logger: every line carries ``[rank/world]``; level from ``IRIS_LOG_LEVEL`` or
:func:`set_log_level`."""

from __future__ import annotations

import logging
import os

from ._errors import IrisUsageError

logger = logging.getLogger("iris")
_handler: logging.Handler | None = None


class _RankFilter(logging.Filter):
    def __init__(self, rank: int, world_size: int):
        super().__init__()
        self.prefix = f"[{rank}/{world_size}]"

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank_prefix = self.prefix
        return True


def configure_logging(rank: int, world_size: int, level: int | str | None = None) -> logging.Logger:
    """Attach the rank-prefixed handler once and set the level (argument, else ``IRIS_LOG_LEVEL``,
    else WARNING)."""
    global _handler
    if _handler is None:
        _handler = logging.StreamHandler()
        logger.addHandler(_handler)
        logger.propagate = False
    for old in list(_handler.filters):
        _handler.removeFilter(old)
    _handler.addFilter(_RankFilter(rank, world_size))
    _handler.setFormatter(logging.Formatter("iris %(rank_prefix)s %(levelname)s: %(message)s"))
    set_log_level(level if level is not None else os.environ.get("IRIS_LOG_LEVEL", "WARNING"))
    return logger


def set_log_level(level: int | str) -> None:
    """Set the ``iris`` logger's level: a ``logging`` constant or a name such as ``"INFO"``."""
    if isinstance(level, str):
        value = logging.getLevelName(level.upper())
        if not isinstance(value, int):
            raise IrisUsageError(
                f"set_log_level({level!r}): not a logging level; use DEBUG, INFO, WARNING or ERROR "
                f"(the same names work in IRIS_LOG_LEVEL)")
        level = value
    logger.setLevel(level)
