"""Logging: structlog over the standard library, silent until the app configures logging.

The library never configures logging. A `NullHandler` on the ``orchestrator`` logger keeps
Python's last-resort handler from printing our warnings when the app set nothing up.

structlog is imported at the first event that is logged, not with the library: importing it
loads rich and pygments too (when installed), a large part of the memory of a fresh process
that imports the library, and an app that logs nothing never needs it.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ("Log", "get_log")

logging.getLogger("orchestrator").addHandler(logging.NullHandler())


class Log:
    """A structlog logger over ``logging.getLogger(name)``, skipped cheaply when disabled.

    Event names are stable dotted names (``state.tool.finished``) with key-value fields.
    """

    __slots__ = ("_bound", "_std")

    def __init__(self, name: str) -> None:
        self._std = logging.getLogger(name)
        self._bound: Any = None

    @property
    def _logger(self) -> Any:
        """The structlog logger, made (and structlog imported) at the first logged event."""
        if self._bound is None:
            import structlog

            self._bound = structlog.wrap_logger(self._std)
        return self._bound

    @property
    def debugging(self) -> bool:
        """Whether debug events are logged: check it before computing their fields."""
        return self._std.isEnabledFor(logging.DEBUG)

    def debug(self, event: str, **fields: Any) -> None:
        """Log `event` at debug level, if enabled."""
        if self._std.isEnabledFor(logging.DEBUG):
            self._logger.debug(event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        """Log `event` at info level, if enabled."""
        if self._std.isEnabledFor(logging.INFO):
            self._logger.info(event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        """Log `event` at warning level, if enabled."""
        if self._std.isEnabledFor(logging.WARNING):
            self._logger.warning(event, **fields)


def get_log(name: str) -> Log:
    """The logger for the module `name` (``orchestrator.<name>``)."""
    return Log(f"orchestrator.{name}")
