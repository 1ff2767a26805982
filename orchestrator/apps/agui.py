"""AG-UI: a run's events in the Agent User Interaction protocol (the `ag-ui-protocol` types).

``async for data in agui_sse(events): ...`` turns the events of a run and its subagents (what
`agent.events` yields, or durable events read from a store) into AG-UI 1.0 events, encoded as
server-sent events by the package's own encoder. `AGUIStream` does the mapping one event at a
time, for an app that sends the events some other way. Needs ``pip install
'orchestrator[apps]'``.

The mapping:

- The root State's run: ``RUN_STARTED``, then ``RUN_FINISHED`` with its answer as `result`,
  its usage, and an outcome: ``success``, or ``interrupt`` listing an `Interrupt` per call that
  waits for a person (its id and `tool_call_id` are the call's id, `reason` is
  ``"tool_approval"``, `message` the permission's reason, `metadata` the State, tool and
  arguments). A failed run ends with ``RUN_ERROR``. A stream may hold several runs of the root
  (a run that waited for approval, then the run that carries out the decision).
- A reply's text: ``TEXT_MESSAGE_START``/``CONTENT``/``END`` (streamed as the model writes it
  when the deltas are there; from the stored reply otherwise). Its tool calls:
  ``TOOL_CALL_START``/``ARGS``/``END`` (arguments as one JSON text); a call's result:
  ``TOOL_CALL_RESULT``.
- Subagents: ``SUBAGENT_STARTED``/``FINISHED``/``ERROR``, with every event of a subagent's State
  carrying its `subagent_run_id` (the child State's id). AG-UI 1.0 has these events for exactly
  this (a subagent as a tool call of its parent: `parent_tool_call_id`; nested ones:
  `parent_subagent_run_id`), so parallel subagents interleave and a client still groups each
  one's messages; steps (``STEP_STARTED``) carry no such identity and activity events are for
  UI widgets, so neither is used. A subagent that waits for approval finishes ``suspended``
  with the ids of its own waiting calls.
- A retried model request: ``CUSTOM`` named ``orchestrator.retry``.
- No ``STATE_SNAPSHOT``: the events do not carry a State's data.

Tool starts and deferrals need no events of their own: the call's start came with the reply
and its wait with the run's interrupt.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

try:
    from ag_ui.core import (
        BaseEvent,
        CustomEvent,
        Interrupt,
        RunErrorEvent,
        RunFinishedEvent,
        RunFinishedInterruptOutcome,
        RunFinishedSuccessOutcome,
        RunStartedEvent,
        SubagentErrorEvent,
        SubagentFinishedEvent,
        SubagentFinishedSuccessOutcome,
        SubagentFinishedSuspendedOutcome,
        SubagentStartedEvent,
        TextMessageContentEvent,
        TextMessageEndEvent,
        TextMessageStartEvent,
        TokenUsage,
        ToolCallArgsEvent,
        ToolCallEndEvent,
        ToolCallResultEvent,
        ToolCallStartEvent,
    )
    from ag_ui.encoder import EventEncoder
except ImportError as _missing:  # pragma: no cover - the extra is missing
    raise ImportError(
        "orchestrator.apps.agui needs the AG-UI types: pip install 'orchestrator[apps]'"
    ) from _missing

from .. import (
    ApprovalNeeded,
    ChildStarted,
    Event,
    ModelReplied,
    RateLimitWaited,
    Retrying,
    RunEnded,
    RunStarted,
    TextDelta,
    ToolEnded,
)

__all__ = ("MEDIA_TYPE", "AGUIStream", "agui_events", "agui_sse", "encode")

MEDIA_TYPE = "text/event-stream"
"""The content type of `agui_sse`'s body."""

_ENCODER = EventEncoder()


def encode(event: BaseEvent) -> bytes:
    """`event` as one server-sent event (``data: {json}``), by the package's own encoder."""
    return _ENCODER.encode(event).encode()


class AGUIStream:
    """Maps our events to AG-UI events, one at a time, keeping what lies between them.

    `thread_id` names the conversation (the root State's id unless given); `run_id` the first
    run of the root (a random id unless given; later runs get ``run_id-2``, ``run_id-3``...).
    The root is the State of the first event unless `root_id` says which.
    """

    def __init__(
        self,
        *,
        thread_id: str | None = None,
        run_id: str | None = None,
        root_id: str | None = None,
    ) -> None:
        self.thread_id: str | None = thread_id
        self.run_id: str = run_id or uuid.uuid4().hex
        self.root_id: str | None = root_id
        self._runs = 0
        self._replies: dict[str, int] = {}  # replies seen per State: each one's message id
        self._open: dict[str, str] = {}  # the text message being streamed, per State
        self._children: set[str] = set()  # the subagents announced
        self._waiting: list[Interrupt] = []  # the root's calls waiting for a person
        self._suspended: dict[str, list[str]] = {}  # each State's own waiting calls

    def feed(self, event: Event) -> list[BaseEvent]:
        """The AG-UI events `event` stands for (often one, sometimes none)."""
        if self.root_id is None:
            self.root_id = event.state_id
        root = event.state_id == self.root_id
        at = int(event.at.timestamp() * 1000)
        sub = None if root else event.state_id
        out: list[BaseEvent] = []
        if isinstance(event, RunStarted):
            if root:
                self._runs += 1
                self._waiting = []
                out.append(
                    RunStartedEvent(thread_id=self._thread(), run_id=self._run(), timestamp=at)
                )
            elif event.state_id not in self._children:
                out.append(self._child_started(event.state_id, event.agent, event, None, at))
        elif isinstance(event, ChildStarted):
            if event.state_id not in self._children:
                out.append(
                    self._child_started(event.state_id, event.agent, event, event.call_id, at)
                )
        elif isinstance(event, TextDelta):
            message_id = self._open.get(event.state_id)
            if message_id is None:
                message_id = self._open[event.state_id] = self._next_message(event.state_id)
                out.append(
                    TextMessageStartEvent(
                        message_id=message_id, role="assistant", subagent_run_id=sub, timestamp=at
                    )
                )
            out.append(
                TextMessageContentEvent(
                    message_id=message_id, delta=event.text, subagent_run_id=sub, timestamp=at
                )
            )
        elif isinstance(event, ModelReplied):
            out.extend(self._reply(event, sub, at))
        elif isinstance(event, ToolEnded):
            out.append(
                ToolCallResultEvent(
                    message_id=f"{event.call_id}-result",
                    tool_call_id=event.call_id or "",
                    content=event.result,
                    role="tool",
                    subagent_run_id=sub,
                    timestamp=at,
                )
            )
        elif isinstance(event, ApprovalNeeded):
            self._suspended[event.state_id] = [
                item.call.id for item in event.calls if item.state_id == event.state_id
            ]
            if root:
                self._waiting = [
                    Interrupt(
                        id=item.call.id,
                        reason="tool_approval",
                        message=item.reason,
                        tool_call_id=item.call.id,
                        subagent_run_id=None if item.state_id == self.root_id else item.state_id,
                        metadata={
                            "state_id": item.state_id,
                            "tool": item.call.name,
                            "args": item.call.args,
                        },
                    )
                    for item in event.calls
                ]
        elif isinstance(event, RunEnded):
            out.extend(self._close(event.state_id, at))
            out.append(self._root_end(event, at) if root else self._child_end(event, at))
        elif isinstance(event, Retrying):
            out.append(
                CustomEvent(
                    name="orchestrator.retry",
                    value={"attempt": event.attempt, "delay": event.delay, "error": event.error},
                    subagent_run_id=sub,
                    timestamp=at,
                )
            )
        elif isinstance(event, RateLimitWaited):
            out.append(
                CustomEvent(
                    name="orchestrator.rate_limit",
                    value={"limit": event.limit, "delay": event.delay},
                    subagent_run_id=sub,
                    timestamp=at,
                )
            )
        return out

    def _thread(self) -> str:
        return self.thread_id or self.root_id or self.run_id

    def _run(self) -> str:
        return self.run_id if self._runs <= 1 else f"{self.run_id}-{self._runs}"

    def _next_message(self, state_id: str) -> str:
        count = self._replies.get(state_id, 0) + 1
        self._replies[state_id] = count
        return f"{self._run()}-{state_id}-m{count}"  # unique in the thread: the client merges by id

    def _child_started(
        self, state_id: str, agent: str | None, event: Event, call_id: str | None, at: int
    ) -> SubagentStartedEvent:
        self._children.add(state_id)
        parent = event.parent_id
        return SubagentStartedEvent(
            subagent_run_id=state_id,
            name=agent or "subagent",
            parent_subagent_run_id=None if parent in (None, self.root_id) else parent,
            parent_tool_call_id=call_id or event.parent_call_id,
            timestamp=at,
        )

    def _reply(self, event: ModelReplied, sub: str | None, at: int) -> list[BaseEvent]:
        out: list[BaseEvent] = []
        message_id = self._open.pop(event.state_id, None)
        if message_id is not None:  # streamed: its deltas are out
            out.append(
                TextMessageEndEvent(message_id=message_id, subagent_run_id=sub, timestamp=at)
            )
        else:
            message_id = self._next_message(event.state_id)
            if event.text:
                out.append(
                    TextMessageStartEvent(
                        message_id=message_id, role="assistant", subagent_run_id=sub, timestamp=at
                    )
                )
                out.append(
                    TextMessageContentEvent(
                        message_id=message_id, delta=event.text, subagent_run_id=sub, timestamp=at
                    )
                )
                out.append(
                    TextMessageEndEvent(message_id=message_id, subagent_run_id=sub, timestamp=at)
                )
        for call in event.tool_calls:
            out.append(
                ToolCallStartEvent(
                    tool_call_id=call.id,
                    tool_call_name=call.name,
                    parent_message_id=message_id,
                    subagent_run_id=sub,
                    timestamp=at,
                )
            )
            out.append(
                ToolCallArgsEvent(
                    tool_call_id=call.id,
                    delta=json.dumps(call.args),
                    subagent_run_id=sub,
                    timestamp=at,
                )
            )
            out.append(ToolCallEndEvent(tool_call_id=call.id, subagent_run_id=sub, timestamp=at))
        return out

    def _close(self, state_id: str, at: int) -> list[BaseEvent]:
        """End the text message `state_id` left open (a run that ended while streaming)."""
        message_id = self._open.pop(state_id, None)
        if message_id is None:
            return []
        sub = None if state_id == self.root_id else state_id
        return [TextMessageEndEvent(message_id=message_id, subagent_run_id=sub, timestamp=at)]

    def _root_end(self, event: RunEnded, at: int) -> BaseEvent:
        if event.error is not None:
            return RunErrorEvent(message=event.error, usage=_usage(event.usage), timestamp=at)
        waiting, self._waiting = self._waiting, []
        outcome: Any = (
            RunFinishedInterruptOutcome(interrupts=waiting)
            if waiting and event.stop_kind == "approval"
            else RunFinishedSuccessOutcome()
        )
        return RunFinishedEvent(
            thread_id=self._thread(),
            run_id=self._run(),
            result=event.answer,
            outcome=outcome,
            usage=_usage(event.usage),
            timestamp=at,
        )

    def _child_end(self, event: RunEnded, at: int) -> BaseEvent:
        if event.error is not None:
            return SubagentErrorEvent(
                subagent_run_id=event.state_id, message=event.error, timestamp=at
            )
        if event.stop_kind == "approval":
            own = self._suspended.pop(event.state_id, [])
            return SubagentFinishedEvent(
                subagent_run_id=event.state_id,
                outcome=SubagentFinishedSuspendedOutcome(interrupt_ids=own or None),
                timestamp=at,
            )
        return SubagentFinishedEvent(
            subagent_run_id=event.state_id,
            result=event.answer,
            outcome=SubagentFinishedSuccessOutcome(),
            timestamp=at,
        )


def _usage(usage: dict[str, Any]) -> list[TokenUsage] | None:
    if not usage:
        return None
    inputs, outputs = usage.get("input_tokens"), usage.get("output_tokens")
    total = inputs + outputs if isinstance(inputs, int) and isinstance(outputs, int) else None
    return [TokenUsage(input_tokens=inputs, output_tokens=outputs, total_tokens=total)]


async def agui_events(
    events: AsyncIterable[Event],
    *,
    thread_id: str | None = None,
    run_id: str | None = None,
    root_id: str | None = None,
) -> AsyncIterator[BaseEvent]:
    """The AG-UI events of `events` (see `AGUIStream` for the ids)."""
    stream = AGUIStream(thread_id=thread_id, run_id=run_id, root_id=root_id)
    async for event in events:
        for item in stream.feed(event):
            yield item


async def agui_sse(
    events: AsyncIterable[Event],
    *,
    thread_id: str | None = None,
    run_id: str | None = None,
    root_id: str | None = None,
) -> AsyncIterator[bytes]:
    """The body of an AG-UI response (`MEDIA_TYPE`): each AG-UI event of `events`, encoded."""
    async for item in agui_events(events, thread_id=thread_id, run_id=run_id, root_id=root_id):
        yield encode(item)
