"""Interop with the official A2A JavaScript SDK (npm ``@a2a-js/sdk``, pinned in tests/apps/node).

Its client, in Node.js, calls an agent of ours served by uvicorn on 127.0.0.1 (asyncio: uvicorn
has no trio loop).
"""

from __future__ import annotations

import pytest

from orchestrator import Agent, tool
from orchestrator.a2a import a2a_routes
from orchestrator.apps import Runs, asgi_app
from orchestrator.permissions import ApproveLater
from orchestrator.testing import FakeModel, tool_call
from stores import MemoryStore
from tests.apps.nodejs import run_client
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
