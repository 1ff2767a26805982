"""Interop with the official A2A JavaScript SDK (npm ``@a2a-js/sdk``, pinned in tests/apps/node).

Its client, in Node.js, calls an agent of ours served by uvicorn on 127.0.0.1 (asyncio: uvicorn
has no trio loop); its server (with express), in Node.js on 127.0.0.1, is called by our tool.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from orchestrator import Agent, Message, State, tool
from orchestrator.a2a import TASK_KEY, a2a_agent, a2a_routes
from orchestrator.apps import Runs, asgi_app
from orchestrator.permissions import ApproveLater
from orchestrator.testing import FakeModel, tool_call
from stores import MemoryStore
from tests.a2a.calls import recorded_task
from tests.apps.nodejs import NODE_DIR, node_program, run_client
from tests.apps.serving import serving

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

SENT: list[str] = []


@tool
def send(to: str) -> str:
    """Send a mail."""
    SENT.append(to)
    return f"sent to {to}"


async def test_the_js_client_streams_a_run_approves_its_call_and_reads_the_task() -> None:
    SENT.clear()
    mailer = Agent(
        FakeModel([tool_call("send", to="bob"), "mailed bob"]),
        name="mailer",
        description="Sends mail.",
        tools=[send],
        permissions=[ApproveLater("send", reason="mail leaves the house")],
    )
    store = MemoryStore()
    async with (
        Runs([mailer], store) as runs,
        serving(asgi_app(runs, routes=a2a_routes(runs))) as base,
    ):
        read = await run_client("a2a_client.mjs", f"{base}/a2a/mailer", "mail bob")
    first, second = read["runs"]
    assert first["seen"][0] == "task"
    assert first["seen"][-1] == "TASK_STATE_INPUT_REQUIRED"
    assert "send" in first["lastText"]
    assert second["seen"][-2:] == ["artifact", "TASK_STATE_COMPLETED"]
    assert second["artifact"] == "mailed bob"
    task = read["task"]
    assert task["state"] == "TASK_STATE_COMPLETED"
    assert task["answer"] == "mailed bob"
    assert task["history"] == ["mail bob", "mailed bob"]
    assert read["listed"] == [task["id"]]
    assert SENT == ["bob"]
    assert store.load(task["id"]).answer == "mailed bob"


# -- their server, called by our tool -----------------------------------------------------------


@asynccontextmanager
async def js_server() -> AsyncGenerator[tuple[str, BufferedByteReceiveStream]]:
    """tests/apps/node/a2a_server.mjs running in Node.js; its URL, and the rest of its output."""
    command = [node_program(), str(NODE_DIR / "a2a_server.mjs")]
    async with await anyio.open_process(command, cwd=NODE_DIR) as process:
        assert process.stdout is not None
        assert process.stdin is not None
        output = BufferedByteReceiveStream(process.stdout)
        try:
            with anyio.fail_after(20):
                url = json.loads(await output.receive_until(b"\n", 10_000))["url"]
            yield url, output
        finally:
            await process.stdin.aclose()  # it stops when its stdin closes
            with anyio.move_on_after(10, shield=True):
                await process.wait()


async def test_our_tool_calls_an_agent_served_by_the_js_sdk() -> None:
    store = MemoryStore()
    async with js_server() as (url, _):
        lead = Agent(
            FakeModel([tool_call("echo", task="say hi"), "It said hi."]),
            tools=[a2a_agent(url, name="echo", description="Echoes.").as_tool()],
            store=store,
        )
        state = State(messages=[Message.user("go")])
        await lead.arun(state)
    assert state.answer == "It said hi."
    (child_id,) = state.children
    child = store.load(child_id)
    assert child.answer == "js echo: say hi"
    recorded = child.get(TASK_KEY)
    assert recorded["status"] == "completed"
    assert recorded["artifacts"][0]["name"] == "echo"
    assert (child.usage.input_tokens, child.usage.output_tokens) == (11, 13)  # as it reports


async def test_cancelling_our_call_cancels_the_js_task() -> None:
    store = MemoryStore()
    async with js_server() as (url, output):
        lead = Agent(
            FakeModel([tool_call("echo", task="hold on")]),
            tools=[a2a_agent(url, name="echo", description="Echoes.").as_tool()],
            store=store,
        )
        state = State(messages=[Message.user("go")])
        task_id = ""
        async with anyio.create_task_group() as group:
            group.start_soon(lead.arun, state)
            with anyio.fail_after(10):
                task_id = await recorded_task(store)
            group.cancel_scope.cancel()
        with anyio.fail_after(10):
            said = json.loads(await output.receive_until(b"\n", 10_000))
    assert said == {"cancelled": task_id}
