"""`Reporter`: hooks that let an app show a run as it happens.

Every hook is a no-op here; subclass and override the ones you need. Hooks run on the event
loop thread, so keep them quick. Children report to the same reporter: `state.parent_id` tells
where they hang. A hook may run before the entries it follows are in the store (they are stored
before the model is asked, a tool runs, or the run returns): read the State it is given.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .._base import _here

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .._base._messages import ToolCall
    from .._base._reply import Reply
    from .._record._history import ToolResultEntry
    from .._record._state import State

__all__ = ("DEFAULT_BUFFER", "Pacer", "Reporter", "report_rate_limit", "report_retry")

DEFAULT_BUFFER = 256
"""Events a consumer of `Agent.events` may be behind before the run waits for it (`Pacer`)."""


def report_retry(attempt: int, delay: float, error: BaseException) -> None:
    """Tell the reporters of the think in progress that the model request is retried.

    A provider calls it without knowing the State or the reporters: the current frame has both.
    Outside a think (a model asked by a tool, or by `ask`) it does nothing.
    """
    place = _here.current()
    if place is not None:
        place.report_retry(attempt, delay, error)


def report_rate_limit(limit: str, delay: float) -> None:
    """Tell the reporters of the think in progress that its request waits for a rate limit.

    `delay` is the wait in seconds (0: the wait is for a concurrent slot, its length unknown).
    Outside a think it does nothing, like `report_retry`.
    """
    place = _here.current()
    if place is not None:
        place.report_rate_limit(limit, delay)


@runtime_checkable
class Pacer(Protocol):
    """A reporter the run waits for before each step reports: an events stream's buffer."""

    async def pace(self) -> None:
        """Return once the reporter has room, with no await after its last check."""
        ...

    def full(self) -> bool:
        """Whether the run must wait (`pace`) before it reports its next step."""
        ...


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

    def on_rate_limit(self, state: State, limit: str, delay: float) -> None:
        """The model request waits `delay` s for the rate limit `limit` (0: for a free slot)."""

    def on_tool_start(self, state: State, call: ToolCall) -> None:
        """A tool call is about to run: its permissions allowed it (or it ends at once).

        A call deferred to a person has no start until it is approved and runs (in a later
        run): `on_tool_deferred` tells that it waits.
        """

    def on_tool_deferred(self, state: State, call: ToolCall, reason: str | None) -> None:
        """A permission deferred a tool call to a person: it waits, not running, for approval.

        The run then stops with the call in `StoppedByApproval`. Once approved, the run that
        carries it out reports `on_tool_start`; once denied, its start and its error result.
        """

    def on_tool_end(self, state: State, call: ToolCall, entry: ToolResultEntry) -> None:
        """A tool call's result is recorded."""

    def on_child_start(self, parent: State, call: ToolCall, child: State) -> None:
        """A tool call of `parent` started the subagent State `child`."""

    def on_run_end(self, state: State, error: BaseException | None) -> None:
        """A run ended, with the exception that ended it or None."""

    def tool_scope(self, state: State, call: ToolCall) -> AbstractContextManager[object]:
        """The context `call`'s tool runs in: entered right before the tool is called.

        It is entered and left in the task that runs the tool (threads and tasks the tool starts
        copy it), so what it sets in context variables holds for the tool's own code:
        `OtelReporter` makes the call's span current there, so spans a library makes inside
        the tool (the MCP client's requests, an HTTP client's) hang under it. Here: nothing.
        """
        return nullcontext()

    def trace_context(self, state: State, call: ToolCall) -> Mapping[str, str]:
        """What a child run of `call` carries to where it runs (`ChildJob.trace_context`).

        A runner sends it with the child, so a tracing reporter there can hang the child's
        spans under `call`'s span: `OtelReporter` gives the W3C trace context of the call's
        span. Here: nothing.
        """
        return {}
