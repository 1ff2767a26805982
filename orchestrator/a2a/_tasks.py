"""A run as an A2A task: its status, history and artifact, from a stored State or live events.

A task is a conversation: its id (and its context id) is the root State's id. Its status comes
from how the State's last run ended; its history holds the text of the user's messages and of
the agent's replies; its one artifact, ``answer``, holds the run's answer once it has one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from a2a.helpers.proto_helpers import new_data_part, new_text_part
from a2a.types.a2a_pb2 import (
    Artifact,
    Message,
    Part,
    Role,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from google.protobuf.struct_pb2 import Struct
from google.protobuf.timestamp_pb2 import Timestamp

from .._apps._events import (
    ApprovalNeeded,
    Event,
    ModelReplied,
    RunEnded,
    RunStarted,
    TextDelta,
    ToolEnded,
)
from .._base._json import thaw
from .._base._reply import Usage
from .._base._stopped import AwaitingCall, Stopped, StoppedByApproval
from .._record._history import ErrorEntry, RunStartEntry, StopEntry
from .._record._state import State

__all__ = (
    "ANSWER_ARTIFACT",
    "TERMINAL",
    "TaskStream",
    "task_of",
    "task_state",
    "waiting_message",
)

ANSWER_ARTIFACT = "answer"
"""The id and name of the artifact that holds a run's answer."""

TERMINAL = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
    }
)
"""The states after which a task's stream ends (input-required ends a stream too)."""


def _cancelled(error: str | None) -> bool:
    return error is not None and error.startswith(("CancelledError", "Cancelled"))


def task_state(
    *, running: bool, stop_kind: str | None, error: str | None, started: bool = True
) -> TaskState:
    """The task state of a run: running, or how its last run ended.

    A run waiting for approval is ``input-required``; a cancelled one ``canceled``; one that
    failed, or stopped at a limit or a permission, ``failed``; one that answered (or finished,
    or stopped at an `until`) ``completed``; one that never ran ``submitted``.
    """
    if running:
        return TaskState.TASK_STATE_WORKING
    if error is not None:
        return TaskState.TASK_STATE_CANCELED if _cancelled(error) else TaskState.TASK_STATE_FAILED
    if stop_kind == "approval":
        return TaskState.TASK_STATE_INPUT_REQUIRED
    if stop_kind in ("limit", "permission"):
        return TaskState.TASK_STATE_FAILED
    return TaskState.TASK_STATE_COMPLETED if started else TaskState.TASK_STATE_SUBMITTED


def _last_run(state: State) -> tuple[bool, str | None, Stopped | None]:
    """Whether `state` ran, the error its last run ended with, and why it stopped."""
    started = False
    error: str | None = None
    for entry in reversed(state.history):
        if isinstance(entry, ErrorEntry) and error is None:
            error = entry.content
        elif isinstance(entry, StopEntry) and error is None:
            break
        elif isinstance(entry, RunStartEntry):
            started = True
            break
    if not started:
        started = any(isinstance(entry, RunStartEntry) for entry in state.history)
    return started, error, state.stopped


def _timestamp(at: datetime | None) -> Timestamp | None:
    if at is None:
        return None
    stamp = Timestamp()
    stamp.FromDatetime(at)
    return stamp


def _message(
    task_id: str, parts: Sequence[Part], *, message_id: str, role: Role = Role.ROLE_AGENT
) -> Message:
    return Message(
        message_id=message_id, task_id=task_id, context_id=task_id, role=role, parts=list(parts)
    )


def answer_parts(answer: Any) -> list[Part]:
    """A run's answer as parts: text as a text part, any other JSON value as a data part."""
    if isinstance(answer, str):
        return [new_text_part(answer)]
    return [new_data_part(json.loads(json.dumps(thaw(answer), default=str)))]


def _answer_artifact(answer: Any) -> Artifact:
    return Artifact(artifact_id=ANSWER_ARTIFACT, name=ANSWER_ARTIFACT, parts=answer_parts(answer))


def _calls_json(calls: Iterable[AwaitingCall]) -> list[dict[str, Any]]:
    return [
        {
            "call_id": item.call.id,
            "tool": item.call.name,
            "args": thaw(item.call.args),
            "reason": item.reason,
            "state_id": item.state_id,
        }
        for item in calls
    ]


def waiting_message(task_id: str, calls: list[dict[str, Any]], *, message_id: str) -> Message:
    """The status message of a task whose calls wait for a decision: what to answer."""
    names = ", ".join(f"{call['tool']} ({call['call_id']})" for call in calls)
    text = (
        f"Waiting for approval of {names}. Reply 'approve' to approve every waiting call;"
        " any other text denies them, and the model reads it as the reason. A data part"
        ' {"approve": [call ids], "deny": [call ids], "reason": "..."} decides call by call.'
    )
    return _message(
        task_id,
        [new_text_part(text), new_data_part({"waiting": calls})],
        message_id=message_id,
    )


def _usage_json(usage: Usage | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(usage, Usage):
        return {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "requests": usage.requests,
            "cost": usage.cost,
        }
    keys = ("input_tokens", "output_tokens", "requests", "cost")
    return {key: usage.get(key) for key in keys if key in usage}


def _history(state: State) -> list[Message]:
    """The text of the State's user messages and replies, as task messages."""
    found: list[Message] = []
    for index, message in enumerate(state.messages):
        if message.is_notice or not message.text:
            continue
        role = Role.ROLE_USER if message.role == "user" else Role.ROLE_AGENT
        found.append(
            _message(
                state.id, [new_text_part(message.text)], message_id=f"{state.id}-{index}", role=role
            )
        )
    return found


def task_of(state: State, *, running: bool) -> Task:
    """The task a stored (or live) State stands for."""
    started, error, stopped = _last_run(state)
    kind = None if stopped is None else stopped.kind
    status_state = task_state(running=running, stop_kind=kind, error=error, started=started)
    status = TaskStatus(state=status_state, timestamp=_timestamp(state.updated_at))
    marker = f"{state.id}-status-{len(state.history)}"
    if status_state == TaskState.TASK_STATE_INPUT_REQUIRED and isinstance(
        stopped, StoppedByApproval
    ):
        status.message.CopyFrom(
            waiting_message(state.id, _calls_json(stopped.calls), message_id=marker)
        )
    elif status_state in (TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_CANCELED):
        why = error if error is not None else str(stopped)
        status.message.CopyFrom(_message(state.id, [new_text_part(why)], message_id=marker))
    task = Task(id=state.id, context_id=state.id, status=status, history=_history(state))
    if status_state == TaskState.TASK_STATE_COMPLETED and state.answer is not None:
        task.artifacts.append(_answer_artifact(state.answer))
    metadata = Struct()
    metadata.update({"usage": _usage_json(state.usage)})
    task.metadata.CopyFrom(metadata)
    return task


StreamEvent = Task | Message | TaskStatusUpdateEvent | TaskArtifactUpdateEvent


class TaskStream:
    """Maps the events of a run (and its subagents) to A2A stream events, one at a time.

    Only the root State's events make task events: its start (``working``); its text as the
    model writes it (``text_delta``), or a reply's whole text when its deltas were not seen
    (``text``: a follower that came late); its tool calls (``tool_calls``) and results
    (``tool_result``): each a ``working`` status message marked so in
    ``metadata.orchestrator``; and its end (the ``answer`` artifact, then the final status).
    """

    def __init__(self, task_id: str) -> None:
        self.task_id: str = task_id
        self.final: bool = False
        self._count = 0
        self._waiting: list[dict[str, Any]] = []
        self._streamed = False  # whether the reply being written streamed its text

    def _status(
        self,
        state: TaskState,
        parts: Sequence[Part] = (),
        *,
        mark: str | None = None,
        message: Message | None = None,
    ) -> TaskStatusUpdateEvent:
        status = TaskStatus(state=state)
        if message is not None:
            status.message.CopyFrom(message)
        elif parts:
            self._count += 1
            found = _message(self.task_id, parts, message_id=f"{self.task_id}-e{self._count}")
            if mark is not None:
                found.metadata.update({"orchestrator": mark})
            status.message.CopyFrom(found)
        return TaskStatusUpdateEvent(task_id=self.task_id, context_id=self.task_id, status=status)

    def feed(self, event: Event) -> list[StreamEvent]:
        """The A2A events `event` stands for (none for a subagent's own events)."""
        if event.state_id != self.task_id:
            return []
        working = TaskState.TASK_STATE_WORKING
        if isinstance(event, RunStarted):
            return [self._status(working)]
        if isinstance(event, TextDelta):
            self._streamed = True
            return [self._status(working, [new_text_part(event.text)], mark="text_delta")]
        if isinstance(event, ModelReplied):
            out: list[StreamEvent] = []
            if event.text and not self._streamed:  # its deltas were not seen: the whole text
                out.append(self._status(working, [new_text_part(event.text)], mark="text"))
            self._streamed = False
            if event.tool_calls:
                calls = [
                    {"call_id": c.id, "tool": c.name, "args": c.args} for c in event.tool_calls
                ]
                part = new_data_part({"tool_calls": calls})
                out.append(self._status(working, [part], mark="tool_calls"))
            return out
        if isinstance(event, ToolEnded):
            result = {
                "call_id": event.call_id,
                "tool": event.name,
                "outcome": event.outcome,
                "result": event.result,
                "is_error": event.is_error,
            }
            return [
                self._status(working, [new_data_part({"tool_result": result})], mark="tool_result")
            ]
        if isinstance(event, ApprovalNeeded):
            self._waiting = [
                {
                    "call_id": item.call.id,
                    "tool": item.call.name,
                    "args": item.call.args,
                    "reason": item.reason,
                    "state_id": item.state_id,
                }
                for item in event.calls
            ]
            return []
        if isinstance(event, RunEnded):
            return self._end(event)
        return []

    def _end(self, event: RunEnded) -> list[StreamEvent]:
        self.final = True
        state = task_state(running=False, stop_kind=event.stop_kind, error=event.error)
        out: list[StreamEvent] = []
        if state == TaskState.TASK_STATE_COMPLETED and event.answer is not None:
            out.append(
                TaskArtifactUpdateEvent(
                    task_id=self.task_id,
                    context_id=self.task_id,
                    artifact=_answer_artifact(event.answer),
                    last_chunk=True,
                )
            )
        self._count += 1
        marker = f"{self.task_id}-e{self._count}"
        message: Message | None = None
        if state == TaskState.TASK_STATE_INPUT_REQUIRED:
            message = waiting_message(self.task_id, self._waiting, message_id=marker)
        elif state in (TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_CANCELED):
            why = event.error or event.stopped or "stopped"
            message = _message(self.task_id, [new_text_part(why)], message_id=marker)
        update = self._status(state, message=message)
        update.metadata.update({"usage": _usage_json(event.usage)})
        out.append(update)
        return out
