"""Here: the library's one context variable, and what the lower layers may ask of it.

The run layer keeps its frame here (`orchestrator._running._frame`: the run in progress, and
the tool call it is executing). This module sits at the bottom of the core, so the layers below
the run reach the frame without importing the run: a memory write asks for its effect key, a
provider reports a retry or a wait for a rate limit. They see the frame only through `Place`,
the protocol this module owns.

Context variables follow tasks and worker threads, so the frame is right in each of them.
"""

from __future__ import annotations

import contextvars
from typing import Protocol

__all__ = ("Place", "current", "enter", "leave")


class Place(Protocol):
    """What the layers below the run may ask of the frame the code runs in."""

    def effect_key(self) -> str | None:
        """The effect key of the next memory write of the tool call running here, or None."""
        ...

    def report_retry(self, attempt: int, delay: float, error: BaseException) -> None:
        """Tell the reporters of the think in progress, if any, that the request is retried."""
        ...

    def report_rate_limit(self, limit: str, delay: float) -> None:
        """Tell the reporters of the think in progress, if any, that it waits for a limit."""
        ...


_current: contextvars.ContextVar[Place | None] = contextvars.ContextVar(
    "orchestrator_frame", default=None
)

current = _current.get
"""The frame of the code calling it, or None outside any run."""


enter = _current.set
"""Make a frame current in this task (and what it starts); `leave` with the token it gives."""

leave = _current.reset
"""Go back to the frame before the `enter` that gave the token."""
