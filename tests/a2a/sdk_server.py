"""An A2A server made of the SDK's own parts only: its default request handler, its in-memory
task store, its JSON-RPC routes, and a small executor. It echoes the text it is sent; a text
starting with ``hold`` holds until cancelled; one starting with ``slow`` sends its first event
only once the test sets `EchoExecutor.release`, then holds too. Served by the tests with
uvicorn on 127.0.0.1."""

from __future__ import annotations

import anyio
from a2a.helpers.proto_helpers import (
    new_task_from_user_message,
    new_text_message,
    new_text_part,
)
from a2a.server.agent_execution.agent_executor import AgentExecutor
from a2a.server.agent_execution.context import RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes.jsonrpc_routes import create_jsonrpc_routes
from a2a.server.tasks.inmemory_task_store import InMemoryTaskStore
from a2a.server.tasks.task_updater import TaskUpdater
from a2a.types.a2a_pb2 import AgentCapabilities, AgentCard, AgentInterface, AgentSkill
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

__all__ = ("EchoExecutor", "sdk_app")


class EchoExecutor(AgentExecutor):
    """Answers ``echo: <text>`` as an artifact; ``hold ...`` waits until cancelled; ``message
    ...`` answers with a message and no task."""

    def __init__(self) -> None:
        self.executed: list[str] = []
        self.cancelled: list[str] = []
        self.holding = anyio.Event()
        self.slow = anyio.Event()  # set when a ``slow`` request waits to send its first event
        self.release = anyio.Event()

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        text = context.get_user_input()
        self.executed.append(text)
        if text.startswith("message"):  # answered with a message, no task
            await event_queue.enqueue_event(new_text_message(f"echo: {text}"))
            return
        if text.startswith("slow"):
            self.slow.set()
            await self.release.wait()
        task = context.current_task
        if task is None:
            assert context.message is not None
            task = new_task_from_user_message(context.message)
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.start_work()
        if text.startswith(("hold", "slow")):
            self.holding.set()
            await anyio.sleep_forever()
        await updater.add_artifact([new_text_part(f"echo: {text}")], name="echo")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id is not None
        assert context.context_id is not None
        self.cancelled.append(context.task_id)
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


def _card(url: str) -> AgentCard:
    return AgentCard(
        name="echo",
        description="Echoes what it is sent.",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="echo", description="Echoes.", tags=["echo"])],
    )


def sdk_app(executor: EchoExecutor, store: InMemoryTaskStore) -> Starlette:
    """The SDK's server for `executor`, its tasks in `store`; the card names the URL asked."""
    handler = DefaultRequestHandler(executor, store, _card("http://unused/"))

    async def card(request: Request) -> Response:
        url = str(request.url).removesuffix("/.well-known/agent-card.json") + "/"
        return JSONResponse(agent_card_to_dict(_card(url)))

    async def root(request: Request) -> Response:
        return Response(status_code=204)

    return Starlette(
        routes=[
            Route("/.well-known/agent-card.json", card, methods=["GET"]),
            Route("/", root, methods=["GET"]),
            *create_jsonrpc_routes(handler, "/"),
        ]
    )
