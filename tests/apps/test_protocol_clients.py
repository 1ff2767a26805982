"""The protocol adapters, read by the official clients in Node.js: `ai` and `@ag-ui/client`.

A run with streamed text, tools (one failing), two parallel subagents and a call waiting for
approval is turned into AG-UI and UI message stream bodies; small scripts in `node/` read them
with the clients' own parsing and validation (`ai`'s `uiMessageChunkSchema` and
`readUIMessageStream`; `@ag-ui/client`'s `HttpAgent`, against a server on 127.0.0.1) and print
what the clients made of them. `scripts/ensure_node_clients.sh` installs Node.js and the
pinned packages (`make unit` runs it); without them these tests fail saying so, unless
``ORCHESTRATOR_TEST_NODE=skip`` is set.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator import Agent, Event, Message, State, ToolError, tool
from orchestrator.apps.agui import agui_sse
from orchestrator.apps.vercel import HEADERS, vercel_sse
from orchestrator.models import Model, Request
from orchestrator.permissions import AllowByName, ApproveLater
from orchestrator.testing import FakeModel, tool_call

pytestmark = pytest.mark.anyio

NODE_DIR = Path(__file__).parent / "node"
OPT_OUT = "ORCHESTRATOR_TEST_NODE"


def _node() -> str:
    """The `node` program with the clients installed; fails (or skips, if opted out) without."""
    node = shutil.which("node")
    installed = (NODE_DIR / "node_modules" / "ai").is_dir() and (
        NODE_DIR / "node_modules" / "@ag-ui" / "client"
    ).is_dir()
    if node is not None and installed:
        return node
    message = (
        "Node.js or the official protocol clients are not installed: run"
        " scripts/ensure_node_clients.sh (it installs Debian's nodejs as root, then the pinned"
        " npm packages)."
    )
    if os.environ.get(OPT_OUT) == "skip":
        pytest.skip(message + f" ({OPT_OUT}=skip)")
    pytest.fail(message + f" Set {OPT_OUT}=skip to skip these tests instead.")


def _client(script: str, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [_node(), str(NODE_DIR / script), *args],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "NODE_NO_WARNINGS": "1"},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@tool
def look(where: str) -> str:
    """Look somewhere."""
    return f"saw {where}"


@tool
def broken() -> str:
    """Fail."""
    raise ToolError("it broke")


@tool
def send(to: str) -> str:
    """Send a message."""
    return f"sent to {to}"


class _Streaming(Model):
    """Streams its final reply in chunks; asks for the scripted calls first."""

    def __init__(self, replies: list[Any]) -> None:
        self.inner = FakeModel(replies)

    @property
    def name(self) -> str:
        return "streaming"

    @property
    def context_window(self) -> int:
        return 1000

    async def respond(self, request: Request, *, on_text: Any = None) -> Any:
        reply = await self.inner.respond(request)
        if on_text is not None and reply.message.text:
            text = reply.message.text
            for start in range(0, len(text), 4):
                on_text(text[start : start + 4])
        return reply


def _helper() -> Agent:
    # A model per child: the two run at once, each with its own script.
    return Agent(
        FakeModel([tool_call("look", where="cellar"), "the cellar is dry"]),
        tools=[look],
        name="helper",
        description="Looks into things",
    )


async def _run() -> tuple[State, list[Event]]:
    """A run of the whole tree: streamed text, tools, subagents, an approval stop."""

    first, second = _helper(), _helper().copy(name="inspector", description="Inspects")
    model = _Streaming(
        [
            [
                tool_call("look", where="attic"),
                tool_call("broken"),
                tool_call("helper", task="cellar"),
                tool_call("inspector", task="roof"),
            ],
            ["Looked everywhere. Mailing bob now.", tool_call("send", to="bob")],
        ]
    )
    root = Agent(
        model,
        tools=[look, broken, first, second, send],
        permissions=[
            AllowByName(["look", "broken", "helper", "inspector"]),
            ApproveLater("send", reason="mail leaves the house"),
        ],
        name="lead",
    )
    state = State(id="lead-run", messages=[Message.user("check the house, then mail bob")])
    async with root.events(state) as events:
        seen = [event async for event in events]
    return state, seen


async def _body(chunks: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in chunks])


async def _replay(events: list[Event]) -> AsyncIterator[Event]:
    for event in events:
        yield event


async def test_the_ai_package_reads_the_ui_message_stream(tmp_path: Path) -> None:
    state, events = await _run()
    body = await _body(vercel_sse(_replay(events)))
    assert body.endswith(b"data: [DONE]\n\n")
    assert HEADERS["x-vercel-ai-ui-message-stream"] == "v1"
    path = tmp_path / "vercel.sse"
    path.write_bytes(body)
    read = _client("vercel.mjs", str(path))
    assert read["errors"] == []
    message = read["message"]
    assert message["id"] == state.id
    assert message["role"] == "assistant"
    parts = message["parts"]
    texts = [part["text"] for part in parts if part["type"] == "text"]
    assert texts == ["Looked everywhere. Mailing bob now."]
    tools = {part["toolCallId"]: part for part in parts if part["type"] == "dynamic-tool"}
    by_name = {part["toolName"]: part for part in tools.values()}
    assert by_name["look"]["state"] == "output-available"
    assert by_name["look"]["input"] == {"where": "attic"}
    assert by_name["look"]["output"] == "saw attic"
    assert by_name["broken"]["state"] == "output-error"
    assert by_name["broken"]["errorText"] == "it broke"
    assert by_name["helper"]["output"] == "the cellar is dry"
    assert by_name["send"]["state"] == "approval-requested"
    assert by_name["send"]["approval"]["id"] == by_name["send"]["toolCallId"]
    children = [part["data"] for part in parts if part["type"] == "data-subagent"]
    assert sorted(child["agent"] for child in children) == ["helper", "inspector"]
    for child in children:
        assert child["parent_id"] == state.id
        assert child["status"] == "done"
        assert child["answer"] == "the cellar is dry"
        assert tools[child["parent_call_id"]]["toolName"] == child["agent"]
    (approval,) = [part["data"] for part in parts if part["type"] == "data-approval"]
    assert [call["name"] for call in approval["calls"]] == ["send"]
    assert message["metadata"]["stop_kind"] == "approval"
    assert read["chunks"][0] == "start"
    assert read["chunks"][-1] == "finish"
    assert read["chunks"].count("start-step") == read["chunks"].count("finish-step") == 2


async def test_the_ag_ui_client_runs_the_stream(tmp_path: Path) -> None:
    state, events = await _run()
    body = await _body(agui_sse(_replay(events), run_id="run-1"))
    path = tmp_path / "agui.sse"
    path.write_bytes(body)
    read = _client("agui.mjs", str(path), state.id, "run-1")
    assert read["error"] is None
    kinds = [event["type"] for event in read["events"]]
    assert kinds[0] == "RUN_STARTED"
    assert kinds[-1] == "RUN_FINISHED"
    assert "TEXT_MESSAGE_CONTENT" in kinds
    finished = read["events"][-1]
    outcome = finished["outcome"]
    assert outcome["type"] == "interrupt"
    (interrupt,) = outcome["interrupts"]
    assert interrupt["reason"] == "tool_approval"
    assert interrupt["message"] == "mail leaves the house"
    assert interrupt["metadata"]["tool"] == "send"
    started = [event for event in read["events"] if event["type"] == "SUBAGENT_STARTED"]
    assert sorted(event["name"] for event in started) == ["helper", "inspector"]
    ended = [event for event in read["events"] if event["type"] == "SUBAGENT_FINISHED"]
    assert sorted(event["result"] for event in ended) == ["the cellar is dry"] * 2
    messages = read["messages"]
    root = [m for m in messages if m["role"] == "assistant" and "subagentRunId" not in m]
    calls = {call["function"]["name"]: call for m in root for call in m.get("toolCalls", [])}
    assert set(calls) == {"look", "broken", "helper", "inspector", "send"}
    assert json.loads(calls["look"]["function"]["arguments"]) == {"where": "attic"}
    assert interrupt["toolCallId"] == calls["send"]["id"]
    results = {m["toolCallId"]: m["content"] for m in messages if m["role"] == "tool"}
    assert results[calls["look"]["id"]] == "saw attic"
    assert results[calls["broken"]["id"]] == "it broke"
    assert any(m.get("content") == "Looked everywhere. Mailing bob now." for m in root)
    for event in started:
        children = [m for m in messages if m.get("subagentRunId") == event["subagentRunId"]]
        assert any(m.get("content") == "the cellar is dry" for m in children)
        assert event["parentToolCallId"] == calls[event["name"]]["id"]
