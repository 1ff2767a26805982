"""The app's AG-UI and Vercel endpoints, driven over HTTP by the official clients in Node.js.

uvicorn serves `asgi_app` on 127.0.0.1 (on asyncio: uvicorn has no trio loop); `@ag-ui/client`'s
HttpAgent and the `ai` package's DefaultChatTransport send a user's message, read the run as it
streams, answer the call that waits for approval the way each protocol does it, and read the
run that carries it out.
"""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator import Agent
from orchestrator.apps import Runs, asgi_app
from orchestrator.permissions import ApproveLater
from orchestrator.testing import FakeModel, tool_call
from stores import MemoryStore
from tests.apps.nodejs import run_client
from tests.apps.serving import serving
from tests.apps.test_runs import SENT, send, tree_agent

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]


@pytest.fixture(autouse=True)
def _clear() -> None:
    SENT.clear()


def _mailer() -> Agent:
    return Agent(
        FakeModel([tool_call("send", to="bob"), "mailed bob"]),
        name="mailer",
        tools=[send],
        permissions=[ApproveLater("send", reason="mail leaves the house")],
    )


async def test_agui_client_runs_an_agent_and_answers_its_interrupt() -> None:
    store = MemoryStore()
    async with Runs([_mailer()], store) as runs, serving(asgi_app(runs)) as base:
        read = await run_client("agui_http.mjs", f"{base}/agents/mailer/agui", "thread-1", "mail")
    first, second = read["runs"]
    assert first["error"] is None, first["error"]
    assert first["types"][0] == "RUN_STARTED"
    assert first["types"][-1] == "RUN_FINISHED"
    assert "TOOL_CALL_START" in first["types"]
    assert len(second["answered"]) == 1
    assert second["error"] is None, second["error"]
    assert "TOOL_CALL_RESULT" in second["types"]
    assert second["types"][-1] == "RUN_FINISHED"
    texts = [m.get("content") for m in read["messages"] if m["role"] == "assistant"]
    assert "mailed bob" in texts
    assert SENT == ["bob"]
    assert store.load("thread-1").answer == "mailed bob"


async def test_agui_client_sees_subagents_of_the_run() -> None:
    async with Runs([tree_agent()], MemoryStore()) as runs, serving(asgi_app(runs)) as base:
        read = await run_client("agui_http.mjs", f"{base}/agents/parent/agui", "thread-2", "go")
    (run,) = read["runs"]
    assert run["error"] is None, run["error"]
    assert "SUBAGENT_STARTED" in run["types"]
    assert "SUBAGENT_FINISHED" in run["types"]


async def test_vercel_chat_transport_reads_the_run_and_sends_the_approval() -> None:
    store = MemoryStore()
    async with Runs([_mailer()], store) as runs, serving(asgi_app(runs)) as base:
        read = await run_client("vercel_http.mjs", f"{base}/agents/mailer/vercel", "chat-1", "mail")
    first, second = read["replies"]
    assert first["errors"] == []
    asking = [p for p in first["message"]["parts"] if p.get("state") == "approval-requested"]
    assert [part["type"] for part in asking] == ["dynamic-tool"]
    assert second["errors"] == []
    parts: list[dict[str, Any]] = second["message"]["parts"]
    assert any(p.get("state") == "output-available" for p in parts)
    assert any(p["type"] == "text" and p["text"] == "mailed bob" for p in parts)
    assert SENT == ["bob"]
    assert store.load("chat-1").answer == "mailed bob"
