"""`Reporter`: hooks that let an app show a run as it happens.

Every hook is a no-op here; subclass and override the ones you need. Hooks run on the event
loop thread, so keep them quick. Children report to the same reporter: `state.parent_id` tells
where they hang. A hook may run before the entries it follows are in the store (they are stored
before the model is asked, a tool runs, or the run returns): read the State it is given.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._history import ToolResultEntry
    from ._messages import ToolCall
    from ._reply import Reply
    from ._state import State

__all__ = ("Reporter", "report_retry", "thinking")

# The State whose think is waiting on the model, and the reporter that sees it: a provider
# reports its retries through `report_retry` without knowing either.
thinking: contextvars.ContextVar[tuple[State, tuple[Reporter, ...]] | None] = (
    contextvars.ContextVar("orchestrator_thinking", default=None)
)


def report_retry(attempt: int, delay: float, error: BaseException) -> None:
    """Tell the reporter of the think in progress that the model request is retried."""
    current = thinking.get()
    if current is not None:
        state, reporters = current
        for reporter in reporters:
            reporter.on_retry(state, attempt, delay, error)


class Reporter:
    """No-op hooks for the events of a run. Override what you want to see."""

    def on_run_start(self, state: State) -> None:
        """A run of `state` began."""

    def on_think_start(self, state: State) -> None:
        """A model request is about to be sent."""

    def on_text(self, state: State, chunk: str) -> None:
        """A chunk of the reply's text streamed in."""

    def on_think_end(self, state: State, reply: Reply) -> None:
        """The model replied and the reply is recorded."""

    def on_retry(self, state: State, attempt: int, delay: float, error: BaseException) -> None:
        """The model request failed with `error` and is tried again (`attempt`) after `delay` s."""

    def on_tool_start(self, state: State, call: ToolCall) -> None:
        """A tool call is about to run."""

    def on_tool_end(self, state: State, call: ToolCall, entry: ToolResultEntry) -> None:
        """A tool call's result is recorded."""

    def on_child_start(self, parent: State, call: ToolCall, child: State) -> None:
        """A tool call of `parent` started the subagent State `child`."""

    def on_run_end(self, state: State, error: BaseException | None) -> None:
        """A run ended, with the exception that ended it or None."""
