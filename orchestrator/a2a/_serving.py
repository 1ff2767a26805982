"""Serving an agent of a `Runs` service over A2A 1.0: its card, and a request handler.

`A2AHandler` answers the A2A methods for one agent of a `Runs` service, so each run lives in
the service's task group (a client that disconnects never cancels it) and any process sharing
the store sees it. `a2a_routes` gives the Starlette routes (JSON-RPC and the agent card) for
`orchestrator.apps.asgi_app(runs, routes=...)`, which puts them behind its checks.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from datetime import UTC, datetime
from typing import Any

from a2a.helpers.proto_helpers import get_data_parts, get_text_parts
from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event as A2AEvent
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes.jsonrpc_routes import create_jsonrpc_routes
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH, PROTOCOL_VERSION_1_0
from a2a.utils.errors import (
    ExtendedAgentCardNotConfiguredError,
    InvalidParamsError,
    InvalidRequestError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
)
from a2a.utils.task import apply_history_length
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from .._base._stopped import StoppedByApproval
from .._record._history import RunStartEntry
from .._record._recording import validate_id
from .._record._state import State
from .._record._store_client import StoreClient, client_of
from .._running._agent import Agent
from ..apps import RunInfo, Runs
from ._tasks import TaskStream, task_of

__all__ = ("APPROVE_WORDS", "DEFAULT_PREFIX", "A2AHandler", "a2a_routes", "agent_card")

DEFAULT_PREFIX = "/a2a"
"""Where `a2a_routes` serves each agent: ``/a2a/<agent name>/``."""

APPROVE_WORDS = frozenset({"approve", "approved", "yes", "y", "ok"})
"""A follow-up text that approves every waiting call (case and spaces aside); other text denies."""

_DEFAULT_PAGE = 50
_MAX_PAGE = 100


def agent_card(agent: Agent, url: str, *, version: str = "1.0.0") -> AgentCard:
    """The A2A agent card of `agent`, served at `url` (its JSON-RPC endpoint).

    Its name and description are the agent's; its skills are the agent itself and each of its
    tools (name and description), so a caller sees what it can do. It streams, and takes and
    gives text (a structured answer comes as a JSON data part).

    Raises:
        ValueError: The agent has no name.
    """
    if agent.name is None:
        raise ValueError("An agent served over A2A needs a name: Agent(..., name='support').")
    about = agent.description or f"The {agent.name} agent."
    skills = [AgentSkill(id=agent.name, name=agent.name, description=about, tags=["agent"])]
    skills.extend(
        AgentSkill(id=tool.name, name=tool.name, description=tool.description, tags=["tool"])
        for tool in agent.tools
    )
    return AgentCard(
        name=agent.name,
        description=about,
        version=version,
        supported_interfaces=[
            AgentInterface(
                url=url, protocol_binding="JSONRPC", protocol_version=PROTOCOL_VERSION_1_0
            )
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain", "application/json"],
        skills=skills,
    )


def _agent_of(state: State) -> str | None:
    for entry in reversed(state.history):
        if isinstance(entry, RunStartEntry):
            return entry.content.agent
    return None


def _decisions(
    message: Message, waiting: Sequence[str]
) -> tuple[list[tuple[str, bool]], str | None]:
    """The decisions a follow-up message gives the waiting calls, and the reason it gives.

    A data part ``{"approve": [...], "deny": [...], "reason": "..."}`` decides call by call;
    else its text: one of `APPROVE_WORDS` approves every waiting call, any other text denies
    every one, the text being the reason.
    """
    for data in get_data_parts(message.parts):
        if isinstance(data, dict) and ("approve" in data or "deny" in data):
            fields: dict[str, Any] = dict(data)  # pyright: ignore[reportUnknownArgumentType]
            found: list[tuple[str, bool]] = []
            for key, approved in (("approve", True), ("deny", False)):
                ids: Any = fields.get(key, [])
                if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):  # pyright: ignore[reportUnknownVariableType]
                    raise InvalidParamsError(f'"{key}" must be a list of call ids.')
                for call_id in ids:  # pyright: ignore[reportUnknownVariableType]
                    if call_id not in waiting:
                        raise InvalidParamsError(
                            f"No call {call_id!r} waits in this task: the waiting ones are"
                            f" {', '.join(waiting)}."
                        )
                    found.append((str(call_id), approved))  # pyright: ignore[reportUnknownArgumentType]
            reason = fields.get("reason")
            return found, reason if isinstance(reason, str) else None
    text = "\n".join(get_text_parts(message.parts)).strip()
    if not text:
        raise InvalidParamsError(
            "The task waits for approval: reply 'approve', a reason to deny, or a data part"
            ' {"approve": [call ids], "deny": [call ids]}.'
        )
    if text.lower() in APPROVE_WORDS:
        return [(call_id, True) for call_id in waiting], None
    return [(call_id, False) for call_id in waiting], text


def _may_match(
    info: RunInfo, context_id: str, status: TaskState.ValueType, after: datetime | None
) -> bool:
    """Whether a listed run may be a task `tasks/list` asks for, judged without loading it."""
    if context_id and info.state_id != context_id:
        return False  # a task's context id is its id
    running = info.status == "running"
    if status and (status == TaskState.TASK_STATE_WORKING) != running:
        return False
    if status == TaskState.TASK_STATE_INPUT_REQUIRED and info.status != "waiting":
        return False
    return after is None or info.updated_at is None or info.updated_at > after


def _token_of(info: RunInfo) -> str:
    """The token of the page after `info`: its id and update time.

    The time lets a later page start in place when `info`'s run was updated since (listed
    first now) or deleted.
    """
    at = "" if info.updated_at is None else info.updated_at.isoformat()
    return f"{info.state_id}@{at}"


def _page_start(candidates: Sequence[RunInfo], token: str) -> int:
    """Where the page of `token` starts in `candidates` (newest first)."""
    if not token:
        return 0
    state_id, found, at_text = token.rpartition("@")
    try:
        if not found:
            raise ValueError(token)
        validate_id(state_id)
        at = datetime.fromisoformat(at_text) if at_text else None
        if at is not None and at.tzinfo is None:
            raise ValueError(token)  # a store's times are aware: not a token of ours
    except (TypeError, ValueError):
        raise InvalidParamsError(
            "pageToken must be the nextPageToken of an earlier page."
        ) from None
    for index, info in enumerate(candidates):
        if info.state_id == state_id and info.updated_at == at:
            return index + 1
    if at is None:  # gone since, and never saved with a time: start with the unsaved
        return next(
            (i for i, info in enumerate(candidates) if info.updated_at is None), len(candidates)
        )
    for index, info in enumerate(candidates):  # updated or deleted since: the ones older
        if info.updated_at is None or info.updated_at < at:
            return index
    return len(candidates)


class A2AHandler(RequestHandler):
    """The A2A request handler of agent `agent` of a `Runs` service (entered by the app).

    A task is a conversation: its id and context id are the run's State id. A message naming
    no task starts a new run (a context id that names no stored State becomes the new State's
    id); a message naming a task (by task id, or by context id) that answered, failed or was
    cancelled continues its State with a new run; one naming a task that waits for approval
    decides its waiting calls (see `APPROVE_WORDS`). ``SendMessage`` answers once the run
    stops (or at once with ``returnImmediately``); streaming gives the run's events as they
    come. ``tasks/cancel`` cancels the run, ``tasks/list`` lists this agent's runs, newest
    first.
    """

    def __init__(self, runs: Runs, agent: str) -> None:
        if agent not in runs.agents:
            known = ", ".join(repr(name) for name in runs.agents)
            raise KeyError(f"No agent named {agent!r} in this Runs service; it runs {known}.")
        self.runs: Runs = runs
        self.agent: str = agent
        self._client: StoreClient = client_of(runs.store)

    async def _state(self, task_id: str) -> State:
        try:
            validate_id(task_id, "task id")
            state = await self._client.load(task_id)
        except (LookupError, ValueError, TypeError):
            raise TaskNotFoundError(f"No task {task_id!r}.") from None
        if state.parent_id is not None or _agent_of(state) not in (None, self.agent):
            raise TaskNotFoundError(f"No task {task_id!r} of this agent.")
        return state

    async def _task(self, task_id: str) -> Task:
        state = await self._state(task_id)
        info = await self.runs.get(task_id)
        return task_of(state, running=info.status == "running")

    async def _existing(self, message: Message) -> tuple[str | None, State | None]:
        """The conversation a message names (its task id, else its context id), if stored.

        Raises:
            TaskNotFoundError: The task id names no task of this agent.
            InvalidParamsError: The context id is not a valid id, or names another's State.
        """
        if message.task_id:
            return message.task_id, await self._state(message.task_id)
        if not message.context_id:
            return None, None
        try:
            validate_id(message.context_id, "context id")
        except (TypeError, ValueError) as error:
            raise InvalidParamsError(str(error)) from None
        try:
            return message.context_id, await self._state(message.context_id)
        except TaskNotFoundError:
            pass
        try:
            await self._client.load(message.context_id)
        except LookupError:
            return message.context_id, None  # a new conversation of that id
        raise InvalidParamsError(
            f"The context {message.context_id!r} is not a conversation of this agent: use"
            " another context id."
        )

    async def _send(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> tuple[str, int]:
        """Start or continue the run `params` names; its id, and where its events begin."""
        message = params.message
        state_id, state = await self._existing(message)
        if state_id is not None and state is not None:
            info = await self.runs.get(state_id)
            if info.status == "running":
                raise InvalidRequestError(
                    f"Task {state_id} is working: wait for it (tasks/get, SubscribeToTask) or"
                    " cancel it before sending another message."
                )
            stopped = state.stopped
            if info.status == "waiting" and isinstance(stopped, StoppedByApproval):
                waiting = [item.call.id for item in stopped.calls]
                decisions, reason = _decisions(message, waiting)
                by = context.user.user_name if context.user.is_authenticated else "a2a"
                try:
                    for call_id, approved in decisions:
                        decide = self.runs.approve if approved else self.runs.deny
                        await decide(state_id, call_id, by=by, reason=reason)
                except (LookupError, ValueError) as error:  # decided or started meanwhile
                    raise InvalidRequestError(str(error)) from None
                return state_id, info.entries
        text = "\n".join(get_text_parts(message.parts)).strip()
        if not text:
            raise InvalidParamsError("The message has no text: send a text part to answer.")
        try:
            handle = await self.runs.start(self.agent, text, state_id=state_id)
        except ValueError as error:  # started meanwhile, or finished
            raise InvalidRequestError(str(error)) from None
        return handle.state_id, handle.since

    async def on_message_send(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Task | Message:
        """Start or continue a run; its task once it stops (or at once, if asked)."""
        task_id, _ = await self._send(params, context)
        if not params.configuration.return_immediately:
            await self.runs.wait(task_id)
        return apply_history_length(await self._task(task_id), params.configuration)

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[A2AEvent]:
        """Start or continue a run; the task, then its updates until it stops."""
        task_id, since = await self._send(params, context)
        async for event in self._updates(task_id, since):
            yield event

    async def _updates(self, task_id: str, since: int) -> AsyncGenerator[A2AEvent]:
        following = self.runs.follow(task_id, since=since)
        await following.ready()
        task = await self._task(task_id)
        yield task
        if task.status.state != TaskState.TASK_STATE_WORKING:
            return  # waiting for more decisions, or ended already: the task says it all
        stream = TaskStream(task_id)
        async for item in following:
            events = stream.feed(item.event)
            if stream.final:  # answer once the service let go of the run: it can run again
                await self.runs.wait(task_id)
            for event in events:
                yield event
            if stream.final:
                return

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[A2AEvent]:
        """The task, then its updates while its run runs."""
        state = await self._state(params.id)
        info = await self.runs.get(params.id)
        if info.status != "running":
            yield task_of(state, running=False)
            return
        async for event in self._updates(params.id, info.entries):
            yield event

    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        """The task of run `params.id`: live if it runs here, else as stored."""
        return apply_history_length(await self._task(params.id), params)

    async def on_list_tasks(
        self, params: ListTasksRequest, context: ServerCallContext
    ) -> ListTasksResponse:
        """This agent's tasks, newest first, a page at a time.

        The store's listing picks the candidates (root runs, by context id, by working or not,
        by update time); only the page's candidates are loaded, at most ``pageSize``, to tell
        this agent's runs and the other filters. So a page may hold fewer tasks than
        ``pageSize`` and still have a ``nextPageToken``; ``totalSize`` counts the candidates,
        an upper bound of the tasks.
        """
        size = params.page_size or _DEFAULT_PAGE
        if not 1 <= size <= _MAX_PAGE:
            raise InvalidParamsError(f"pageSize must be between 1 and {_MAX_PAGE}, got {size}.")
        after = (
            params.status_timestamp_after.ToDatetime(UTC)
            if params.HasField("status_timestamp_after")
            else None
        )
        candidates = [
            info
            for info in await self.runs.list()
            if _may_match(info, params.context_id, params.status, after)
        ]
        start = _page_start(candidates, params.page_token)
        page = candidates[start : start + size]
        tasks: list[Task] = []
        for info in page:
            try:
                state = await self._state(info.state_id)
            except TaskNotFoundError:
                continue  # another agent's run, or deleted since listed
            task = task_of(state, running=info.status == "running")
            if params.status and task.status.state != params.status:
                continue
            if after is not None and state.updated_at is not None and state.updated_at <= after:
                continue
            if not params.include_artifacts:
                task.ClearField("artifacts")
            tasks.append(apply_history_length(task, params))
        more = start + size < len(candidates)
        return ListTasksResponse(
            tasks=tasks,
            next_page_token=_token_of(page[-1]) if more else "",
            page_size=size,
            total_size=len(candidates),
        )

    async def on_cancel_task(
        self, params: CancelTaskRequest, context: ServerCallContext
    ) -> Task | None:
        """Cancel the run of task `params.id`; the task once the run is saved."""
        await self._state(params.id)
        try:
            await self.runs.cancel(params.id)
        except LookupError:
            raise TaskNotCancelableError(
                f"Task {params.id} is not working, so there is nothing to cancel."
            ) from None
        return await self._task(params.id)

    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        """Not supported: follow a task with SubscribeToTask instead."""
        raise PushNotificationNotSupportedError

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        """Not supported."""
        raise PushNotificationNotSupportedError

    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        """Not supported."""
        raise PushNotificationNotSupportedError

    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        """Not supported."""
        raise PushNotificationNotSupportedError

    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> AgentCard:
        """Not supported: the public card says it all."""
        raise ExtendedAgentCardNotConfiguredError


def a2a_routes(
    runs: Runs, agents: Sequence[str] | None = None, *, prefix: str = DEFAULT_PREFIX
) -> list[BaseRoute]:
    """The A2A routes of the agents of `runs`, for ``asgi_app(runs, routes=...)``.

    Each agent (all of the service's, or those named) is served at ``<prefix>/<name>/``: its
    JSON-RPC endpoint there (``POST``), its card at
    ``<prefix>/<name>/.well-known/agent-card.json``, naming the URL the request reached.
    """
    if not prefix.startswith("/") or prefix.endswith("/"):
        raise ValueError(f"prefix must start with '/' and not end with one, got {prefix!r}.")
    names = list(runs.agents) if agents is None else list(agents)
    routes: list[BaseRoute] = []
    for name in names:
        handler = A2AHandler(runs, name)
        agent = runs.agents[name]

        async def card(request: Request, agent: Agent = agent) -> Response:
            url = str(request.url).removesuffix(AGENT_CARD_WELL_KNOWN_PATH) + "/"
            return JSONResponse(agent_card_to_dict(agent_card(agent, url)))

        routes.append(
            Mount(
                f"{prefix}/{name}",
                routes=[
                    Route(AGENT_CARD_WELL_KNOWN_PATH, card, methods=["GET"]),
                    *create_jsonrpc_routes(handler, "/"),
                ],
            )
        )
    return routes
