"""A2A (issue 31): the cost of a remote subagent turn over the SDK's bare client, p50.

One process serves an A2A agent made of the SDK's own parts (its default request handler,
in-memory task store and JSON-RPC routes; an executor that answers at once with an artifact)
with uvicorn on 127.0.0.1, and calls it in the same event loop, alternating:

- the floor: the SDK's bare client (made once, its card resolved once) sends a message, reads
  the stream to its end, then reads the task (`tasks/get`), as our call does;
- ours: one remote subagent turn: a lead agent (`FakeModel`, no store) whose model calls an
  ``a2a_agent(...).as_tool()`` tool once: a child State, its card lookup, the message, the
  stream, `tasks/get`, the record in the child, the result back in the lead; then its answer.

The rows: each p50 (ms) and the overhead (ours minus the floor, ms) beside them.

``python -m benchmarks.a2a_bench [--quick]`` prints the rows.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import time
from collections.abc import AsyncGenerator, Sequence
from contextlib import asynccontextmanager

import anyio
import httpx
import uvicorn
from a2a.client import Client, ClientConfig, create_client
from a2a.helpers.proto_helpers import new_task_from_user_message, new_text_part
from a2a.server.agent_execution.agent_executor import AgentExecutor
from a2a.server.agent_execution.context import RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes.jsonrpc_routes import create_jsonrpc_routes
from a2a.server.tasks.inmemory_task_store import InMemoryTaskStore
from a2a.server.tasks.task_updater import TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from orchestrator import Agent, State, Tool
from orchestrator import Message as OurMessage
from orchestrator.a2a import a2a_agent
from orchestrator.testing import FakeModel, tool_call

from .report import Metric

__all__ = ("bench_a2a", "main")


class _Echo(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None
        task = context.current_task or new_task_from_user_message(context.message)
        if context.current_task is None:
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.add_artifact([new_text_part(f"echo: {context.get_user_input()}")])
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError


def _card(url: str) -> AgentCard:
    return AgentCard(
        name="echo",
        description="Echoes.",
        version="1",
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="echo", description="Echoes.", tags=["echo"])],
    )


def _app() -> Starlette:
    handler = DefaultRequestHandler(_Echo(), InMemoryTaskStore(), _card("http://unused/"))

    async def card(request: Request) -> Response:
        url = str(request.url).removesuffix("/.well-known/agent-card.json") + "/"
        return JSONResponse(agent_card_to_dict(_card(url)))

    return Starlette(
        routes=[
            Route("/.well-known/agent-card.json", card, methods=["GET"]),
            *create_jsonrpc_routes(handler, "/"),
        ]
    )


@asynccontextmanager
async def _serving() -> AsyncGenerator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(_app(), host="127.0.0.1", port=port, log_level="error"))
    base = f"http://127.0.0.1:{port}"
    async with anyio.create_task_group() as group:
        group.start_soon(server.serve)
        with anyio.fail_after(10):
            for _ in range(1000):  # until it listens
                if server.started:
                    break
                await anyio.sleep(0.01)
        try:
            yield base
        finally:
            server.should_exit = True


async def _bare(client: Client, index: int) -> float:
    message = Message(role=Role.ROLE_USER, message_id=f"bare-{index}", parts=[Part(text="hi")])
    started = time.perf_counter()
    task_id = ""
    async for event in client.send_message(SendMessageRequest(message=message)):
        task_id = task_id or event.task.id or event.status_update.task_id
    await client.get_task(GetTaskRequest(id=task_id))
    return time.perf_counter() - started


async def _ours(remote: Tool) -> float:
    lead = Agent(FakeModel([tool_call("echo", task="hi"), "done"]), tools=[remote])
    state = State(messages=[OurMessage.user("Echo hi")])
    started = time.perf_counter()
    await lead.arun(state)
    return time.perf_counter() - started


async def _measure(calls: int) -> tuple[list[float], list[float]]:
    bare: list[float] = []
    ours: list[float] = []
    async with _serving() as base, httpx.AsyncClient(timeout=None) as http:
        client = await create_client(base, ClientConfig(httpx_client=http))
        # One tool for every turn, as an app keeps its agents: its card is looked up once.
        remote = a2a_agent(base, name="echo", description="Echoes.").as_tool()
        async with client:
            for index in range(calls + 2):  # alternating, after two of each to warm up
                seconds_bare = await _bare(client, index)
                seconds_ours = await _ours(remote)
                if index >= 2:
                    bare.append(seconds_bare)
                    ours.append(seconds_ours)
    return bare, ours


def bench_a2a(calls: int = 200) -> list[Metric]:
    """A remote subagent turn beside the SDK's bare client calling the same server (p50)."""
    bare, ours = anyio.run(_measure, calls)
    floor = statistics.median(bare) * 1000
    mine = statistics.median(ours) * 1000
    return [
        Metric("a2a.call.floor.p50_ms", "A2A call, SDK bare client (floor), p50", floor, "ms"),
        Metric("a2a.call.p50_ms", "A2A remote subagent turn, p50", mine, "ms"),
        Metric(
            "a2a.call.overhead_ms",
            "A2A subagent turn over the bare client, p50",
            mine - floor,
            "ms",
        ),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """Print the rows."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.a2a_bench")
    parser.add_argument("--quick", action="store_true")
    quick = parser.parse_args(argv).quick
    for metric in bench_a2a(calls=5 if quick else 200):
        print(f"{metric.label}: {metric.value:.2f} {metric.unit}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
