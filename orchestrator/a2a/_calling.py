"""Calling a remote A2A agent as a subagent: `a2a_agent(url, ...)` and the model behind it.

``a2a_agent(url, name=..., description=...).as_tool()`` goes in ``Agent(tools=[...])`` like any
subagent: each call starts a child State linked to the call, and the child's one "model" is the
remote agent. The child records the remote task in its typed data under `TASK_KEY` (the URL,
the message sent, the task's id, status, messages and artifacts) and its answer and usage as a
model reply, so the parent's usage and limits count it like a local subagent's.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from typing import Any, cast

import anyio
import httpx
from a2a.client import A2ACardResolver, Client, ClientConfig, create_client
from a2a.helpers.proto_helpers import get_text_parts
from a2a.types.a2a_pb2 import (
    AgentCard,
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)
from google.protobuf.json_format import MessageToDict

from .._base._errors import OrchestratorError
from .._base._messages import Message as OurMessage
from .._base._reply import Reply, Usage
from .._record._state import State
from .._running._agent import Agent
from .._running._frame import current_frame
from ..models import Request, TextCallback
from ._tasks import TERMINAL

__all__ = ("TASK_KEY", "A2ACallError", "A2AModel", "a2a_agent")

TASK_KEY = "a2a_task"
"""The typed-data key under which a child State records its remote task."""

_WAITING = frozenset({TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED})
_CANCEL_GRACE = 5.0


class A2ACallError(OrchestratorError):
    """A remote A2A task failed, was rejected or cancelled, or cannot be re-attached to."""


def _state_name(state: int) -> str:
    return TaskState.Name(state).removeprefix("TASK_STATE_").lower().replace("_", "-")  # pyright: ignore[reportArgumentType]


def _texts(parts: Any) -> str:
    return "\n".join(get_text_parts(parts))


def _record(task: Task, url: str, message_id: str, sent_for: int) -> dict[str, Any]:
    """What a child State keeps of the remote task (JSON)."""
    return {
        "url": url,
        "message_id": message_id,
        "for": sent_for,
        "task_id": task.id,
        "context_id": task.context_id,
        "status": _state_name(task.status.state),
        "status_text": _texts(task.status.message.parts),
        "messages": [
            {"role": "user" if m.role == Role.ROLE_USER else "agent", "text": _texts(m.parts)}
            for m in task.history
        ],
        "artifacts": [
            {"id": a.artifact_id, "name": a.name, "parts": [MessageToDict(p) for p in a.parts]}
            for a in task.artifacts
        ],
    }


def _answer(task: Task) -> str:
    texts = [_texts(artifact.parts) for artifact in task.artifacts]
    found = "\n".join(text for text in texts if text)
    if found:
        return found
    data = [MessageToDict(part) for artifact in task.artifacts for part in artifact.parts]
    if data:
        return json.dumps(data)
    return _texts(task.status.message.parts)


def _usage(task: Task) -> Usage:
    """The usage the remote reports in the task's metadata (``usage``), else one request."""
    reported: Any = MessageToDict(task.metadata).get("usage")
    if not isinstance(reported, dict):
        return Usage(requests=1)
    fields: dict[str, Any] = dict(reported)  # pyright: ignore[reportUnknownArgumentType]

    def whole(key: str) -> int:
        value = fields.get(key)
        return int(value) if isinstance(value, int | float) and value >= 0 else 0

    cost = fields.get("cost")
    return Usage(
        input_tokens=whole("input_tokens"),
        output_tokens=whole("output_tokens"),
        requests=whole("requests") or 1,
        cost=float(cost) if isinstance(cost, int | float) else None,
    )


class A2AModel:
    """A remote A2A agent in the place of a model: each request sends the newest user message.

    It answers with the remote task's artifacts as text (its status message when it has
    none), and the usage the remote reports in the task's ``usage`` metadata. Inside a run it
    records the remote task in the State (`TASK_KEY`), saved before the message goes out: a
    request made again on that State (a resume after a crash) re-attaches to the task it names
    and never sends the message again. A cancelled request cancels the remote task: cancelled
    before the first event named it, it reads on (shielded, 5 s at most) to learn its id.

    A task that fails, is rejected or cancelled raises `A2ACallError`; one that waits for input
    answers with what it asks for. The agent's card is looked up at the first request and kept;
    each request opens its own connection, closed when it returns.
    """

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url must be the agent's http(s) URL, got {url!r}.")
        self.url: str = url
        self.headers: dict[str, str] = dict(headers or {})
        self.transport: httpx.AsyncBaseTransport | None = transport
        self._tls: ssl.SSLContext | None = None  # made once: loading the CAs takes ~50 ms
        self._card: AgentCard | None = None  # resolved once: the card says where to send

    @property
    def name(self) -> str:
        """``a2a:<url>``."""
        return f"a2a:{self.url}"

    @property
    def context_window(self) -> int | None:
        """Unknown: the remote agent keeps its own context."""
        return None

    async def respond(self, request: Request, *, on_text: TextCallback | None = None) -> Reply:
        """Send the newest user message to the remote agent (or re-attach); its answer."""
        frame = current_frame()
        state = None if frame is None else frame.run.state
        sent_for = len(request.messages)
        found: Any = None if state is None else state.get(TASK_KEY)
        recorded = dict(cast("Mapping[str, Any]", found)) if isinstance(found, Mapping) else {}
        if self._tls is None:
            self._tls = httpx.create_ssl_context()
        http = httpx.AsyncClient(
            headers=self.headers, timeout=None, transport=self.transport, verify=self._tls
        )
        async with http:
            config = ClientConfig(httpx_client=http)
            if self._card is None:
                self._card = await A2ACardResolver(http, self.url).get_agent_card()
            client = await create_client(self._card, config)
            async with client:
                if recorded.get("for") == sent_for:  # sent before this process stopped
                    task = await self._reattach(client, recorded)
                else:
                    task = await self._send(client, state, request.messages, sent_for)
        if state is not None:
            state.set(TASK_KEY, _record(task, self.url, _message_id(state, sent_for), sent_for))
        if task.status.state in _WAITING or task.status.state == TaskState.TASK_STATE_COMPLETED:
            return Reply(OurMessage.assistant(_answer(task)), _usage(task), model=self.name)
        raise A2ACallError(
            f"The remote task {task.id} at {self.url} is {_state_name(task.status.state)}:"
            f" {_texts(task.status.message.parts) or 'no reason given'}"
        )

    async def _save(self, state: State | None) -> None:
        frame = current_frame()
        if state is not None and frame is not None and frame.run.store is not None:
            await frame.run.store.save(state)

    async def _send(
        self, client: Client, state: State | None, messages: Any, sent_for: int
    ) -> Task:
        text = ""
        for message in reversed(messages):
            if message.role == "user":
                text = message.text
                break
        message_id = _message_id(state, sent_for)
        if state is not None:  # saved before it goes: a resume never sends it again
            state.set(
                TASK_KEY,
                {"url": self.url, "message_id": message_id, "for": sent_for, "task_id": None},
            )
            await self._save(state)
        # No context id: the server gives one (ours would make it a State id, which a server
        # sharing our store must not take from our child State).
        outgoing = Message(role=Role.ROLE_USER, message_id=message_id, parts=[Part(text=text)])
        record = {"url": self.url, "message_id": message_id, "for": sent_for, "task_id": None}
        task_id = ""
        answered: Task | None = None
        cancelled = finished = False
        # The stream is read shielded, so a cancel before the first event (which names the
        # task) can still learn the task's id, for up to _CANCEL_GRACE, and cancel it.
        reading = anyio.CancelScope(shield=True)

        async def watch() -> None:
            nonlocal cancelled
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                if not finished:  # the call is cancelled
                    cancelled = True
                    if task_id:
                        reading.cancel()
                    else:
                        reading.deadline = anyio.current_time() + _CANCEL_GRACE
                raise

        async with anyio.create_task_group() as group:
            group.start_soon(watch)
            try:
                with reading:
                    async for event in client.send_message(SendMessageRequest(message=outgoing)):
                        kind = event.WhichOneof("payload")
                        if kind == "message":  # answered without a task
                            status = {"state": TaskState.TASK_STATE_COMPLETED}
                            answered = Task(id="", status=status)
                            answered.status.message.CopyFrom(event.message)
                            break
                        found = (
                            event.task.id
                            if kind == "task"
                            else event.status_update.task_id or event.artifact_update.task_id
                        )
                        if found and not task_id:
                            task_id = found
                            record = {**record, "task_id": task_id, "status": "working"}
                            if state is not None:
                                state.set(TASK_KEY, record)
                                await self._save(state)
                            if cancelled:
                                break
            finally:
                finished = True
                group.cancel_scope.cancel()
            if cancelled:
                await self._cancel(client, state, record)
        if cancelled:
            await anyio.lowlevel.checkpoint()  # re-raises the call's cancellation
        if answered is not None:
            return answered
        if not task_id:
            raise A2ACallError(f"The agent at {self.url} answered with no task.")
        return await client.get_task(GetTaskRequest(id=task_id))

    async def _cancel(self, client: Client, state: State | None, record: dict[str, Any]) -> None:
        """Cancel the remote task of a cancelled call (shielded), and record how it went."""
        task_id = record.get("task_id")
        with anyio.move_on_after(_CANCEL_GRACE, shield=True):
            if not task_id:
                outcome = f"no task id came back within {_CANCEL_GRACE:g} s: not cancelled"
            else:
                try:
                    await client.cancel_task(CancelTaskRequest(id=task_id))
                    outcome = "cancelled"
                except Exception as error:  # it ended, or its server is gone
                    outcome = f"cancel failed: {error}"
            if state is not None:
                state.set(TASK_KEY, {**record, "cancel": outcome})
                await self._save(state)

    async def _reattach(self, client: Client, recorded: dict[str, Any]) -> Task:
        task_id = recorded.get("task_id")
        if not isinstance(task_id, str) or not task_id:
            raise A2ACallError(
                f"The message {recorded.get('message_id')} may have reached {self.url}, but the"
                " process stopped before the remote task's id came back: it is not sent again."
                " Ask the remote agent's owner, or run the call anew."
            )
        try:
            task = await client.get_task(GetTaskRequest(id=task_id))
        except Exception as error:
            raise A2ACallError(
                f"The remote task {task_id} at {self.url} cannot be re-attached to: {error}"
            ) from error
        if task.status.state in TERMINAL or task.status.state in _WAITING:
            return task
        async for _ in client.subscribe(SubscribeToTaskRequest(id=task_id)):
            pass
        return await client.get_task(GetTaskRequest(id=task_id))


def _message_id(state: State | None, sent_for: int) -> str:
    """The id of the message a State sends for its request over `sent_for` messages."""
    return f"m-{sent_for}" if state is None else f"{state.id}-m{sent_for}"


def a2a_agent(
    url: str,
    *,
    name: str,
    description: str,
    headers: Mapping[str, str] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> Agent:
    """A remote A2A agent as an `Agent`: ``.as_tool()`` makes it a subagent tool.

    `url` is the agent's base URL (where its card is: ``<url>/.well-known/agent-card.json``);
    `headers` go with every request (``{"Authorization": "Bearer ..."}``); `transport` is the
    httpx transport to reach it by (``httpx.ASGITransport(app)`` for an app in this process).

    Example:
        ```python
        remote = a2a_agent("http://127.0.0.1:8000/a2a/mailer", name="mailer",
                           description="Sends mail")
        lead = Agent("openai:gpt-4o", tools=[remote.as_tool()])
        ```
    """
    model = A2AModel(url, headers=headers, transport=transport)
    return Agent(model, name=name, description=description)
