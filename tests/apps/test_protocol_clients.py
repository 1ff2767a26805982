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
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator import Agent, Event, Message, State, ToolError, aapprove, awaiting, tool
from orchestrator.apps import history_events
from orchestrator.apps.agui import agui_sse
from orchestrator.apps.vercel import HEADERS, vercel_sse
from orchestrator.models import Model, Request
from orchestrator.permissions import AllowByName, ApproveLater
from orchestrator.testing import FakeModel, tool_call
from stores import MemoryStore
from tests.apps.nodejs import NODE_DIR, node_program

pytestmark = pytest.mark.anyio


def _client(script: str, *args: str) -> Any:
    done = subprocess.run(
        [node_program(), str(NODE_DIR / script), *args],
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


def _lead() -> Agent:
    """The root: streamed text, tools (one failing), two parallel subagents, one call to approve."""
    model = _Streaming(
        [
            [
                tool_call("look", where="attic"),
                tool_call("broken"),
                tool_call("helper", task="cellar"),
                tool_call("inspector", task="roof"),
            ],
            ["Looked everywhere. Mailing bob now.", tool_call("send", to="bob")],
            "Mailed bob.",
        ]
    )
    return Agent(
        model,
        tools=[look, broken, _helper(), _helper().copy(name="inspector"), send],
        permissions=[
            AllowByName(["look", "broken", "helper", "inspector"]),
            ApproveLater("send", reason="mail leaves the house"),
        ],
        name="lead",
    )


async def _events(agent: Agent, state: State) -> list[Event]:
    async with agent.events(state) as events:
        return [event async for event in events]


async def _run() -> tuple[Agent, State, list[Event]]:
    """The first run of the lead: it stops with `send` waiting for a person."""
    agent = _lead()
    state = State(id="lead-run", messages=[Message.user("check the house, then mail bob")])
    return agent, state, await _events(agent, state)


async def _resume(agent: Agent, state: State) -> list[Event]:
    """`send` approved, the run that carries it out."""
    (waiting,) = awaiting(state)
    await aapprove(state, waiting.call.id, by="ann")
    return await _events(agent, state)


async def _replay(events: list[Event]) -> AsyncIterator[Event]:
    for event in events:
        yield event


async def _file(path: Path, chunks: AsyncIterator[bytes]) -> str:
    body = b"".join([chunk async for chunk in chunks])
    await anyio.Path(path).write_bytes(body)
    return str(path)


async def _vercel(tmp_path: Path, *streams: list[Event]) -> list[dict[str, Any]]:
    files = [
        await _file(tmp_path / f"vercel-{n}.sse", vercel_sse(_replay(events)))
        for n, events in enumerate(streams)
    ]
    return _client("vercel.mjs", *files)


async def _agui(tmp_path: Path, thread: str, *streams: list[Event]) -> dict[str, Any]:
    args: list[str] = []
    for n, events in enumerate(streams):
        run_id = f"run-{n + 1}"
        args += [
            run_id,
            await _file(tmp_path / f"agui-{n}.sse", agui_sse(_replay(events), run_id=run_id)),
        ]
    return _client("agui.mjs", thread, *args)


def _tools(message: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {part["toolName"]: part for part in message["parts"] if part["type"] == "dynamic-tool"}


async def test_the_ai_package_reads_the_ui_message_stream(tmp_path: Path) -> None:
    _, state, events = await _run()
    assert HEADERS["x-vercel-ai-ui-message-stream"] == "v1"
    (read,) = await _vercel(tmp_path, events)
    assert read["errors"] == []
    message = read["message"]
    assert message["id"] == state.id
    assert message["role"] == "assistant"
    parts = message["parts"]
    texts = [part["text"] for part in parts if part["type"] == "text"]
    assert texts == ["Looked everywhere. Mailing bob now."]
    by_name = _tools(message)
    assert by_name["look"]["state"] == "output-available"
    assert by_name["look"]["input"] == {"where": "attic"}
    assert by_name["look"]["output"] == "saw attic"
    assert by_name["broken"]["state"] == "output-error"
    assert by_name["broken"]["errorText"] == "it broke"
    assert by_name["helper"]["output"] == "the cellar is dry"
    assert by_name["send"]["state"] == "approval-requested"
    assert by_name["send"]["approval"]["id"] == by_name["send"]["toolCallId"]
    calls = {part["toolCallId"]: part for part in by_name.values()}
    children = [part["data"] for part in parts if part["type"] == "data-subagent"]
    assert sorted(child["agent"] for child in children) == ["helper", "inspector"]
    for child in children:
        assert child["parent_id"] == state.id
        assert child["status"] == "done"
        assert child["answer"] == "the cellar is dry"
        assert calls[child["parent_call_id"]]["toolName"] == child["agent"]
    (approval,) = [part["data"] for part in parts if part["type"] == "data-approval"]
    assert [call["name"] for call in approval["calls"]] == ["send"]
    assert message["metadata"]["stop_kind"] == "approval"
    assert read["chunks"][0] == "start"
    assert read["chunks"][-1] == "finish"
    assert read["chunks"].count("start-step") == read["chunks"].count("finish-step") == 2


async def test_the_ag_ui_client_runs_the_stream(tmp_path: Path) -> None:
    _, state, events = await _run()
    read = await _agui(tmp_path, state.id, events)
    (run,) = read["runs"]
    assert run["error"] is None
    kinds = [event["type"] for event in run["events"]]
    assert kinds[0] == "RUN_STARTED"
    assert kinds[-1] == "RUN_FINISHED"
    assert "TEXT_MESSAGE_CONTENT" in kinds
    outcome = run["events"][-1]["outcome"]
    assert outcome["type"] == "interrupt"
    (interrupt,) = outcome["interrupts"]
    assert interrupt["reason"] == "tool_approval"
    assert interrupt["message"] == "mail leaves the house"
    assert interrupt["metadata"]["tool"] == "send"
    started = [event for event in run["events"] if event["type"] == "SUBAGENT_STARTED"]
    assert sorted(event["name"] for event in started) == ["helper", "inspector"]
    ended = [event for event in run["events"] if event["type"] == "SUBAGENT_FINISHED"]
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


async def test_an_approved_run_continues_in_both_clients(tmp_path: Path) -> None:
    agent, state, first = await _run()
    second = await _resume(agent, state)
    assert state.answer == "Mailed bob."
    read = await _agui(tmp_path, state.id, first, second)
    assert [run["error"] for run in read["runs"]] == [None, None]
    send_interrupt = read["runs"][0]["events"][-1]["outcome"]["interrupts"][0]["id"]
    assert read["runs"][1]["answered"] == [send_interrupt]
    last = read["runs"][1]["events"]
    assert last[-1]["type"] == "RUN_FINISHED"
    assert last[-1]["outcome"]["type"] == "success"
    assert last[-1]["result"] == "Mailed bob."
    messages = read["messages"]
    send_id = next(
        call["id"]
        for m in messages
        for call in m.get("toolCalls", [])
        if call["function"]["name"] == "send"
    )
    results = {m["toolCallId"]: m["content"] for m in messages if m["role"] == "tool"}
    assert results[send_id] == "sent to bob"
    assert messages[-1]["content"] == "Mailed bob."
    # The UI message stream of the second run is a message of its own.
    (read_second,) = await _vercel(tmp_path, second)
    assert read_second["errors"] == []
    sent = _tools(read_second["message"])["send"]
    assert (sent["state"], sent["input"], sent["output"]) == (
        "output-available",
        {"to": "bob"},
        "sent to bob",
    )
    texts = [p["text"] for p in read_second["message"]["parts"] if p["type"] == "text"]
    assert texts == ["Mailed bob."]


async def test_a_failed_run_in_both_clients(tmp_path: Path) -> None:
    agent = Agent(
        FakeModel([tool_call("look", where="attic"), RuntimeError("model down")]), tools=[look]
    )
    state = State(id="failing", messages=[Message.user("look")])
    events: list[Event] = []

    async def follow() -> None:
        async with agent.events(state) as stream:
            async for event in stream:
                events.append(event)

    with pytest.raises(RuntimeError, match="model down"):
        await follow()
    (read,) = await _vercel(tmp_path, events)
    assert read["errors"] == ["RuntimeError: model down"]
    assert read["chunks"][-2:] == ["error", "finish"]
    assert _tools(read["message"])["look"]["output"] == "saw attic"
    agui = await _agui(tmp_path, state.id, events)
    (run,) = agui["runs"]
    assert run["events"][-1]["type"] == "RUN_ERROR"
    assert run["events"][-1]["message"] == "RuntimeError: model down"


async def test_stored_events_in_both_clients(tmp_path: Path) -> None:
    """The durable events of a loaded State: no text deltas, the replies' text instead."""
    store = MemoryStore()
    _, state, _ = await _run()
    await store.asave(state)
    stored = [item.event for item in history_events(store.load(state.id))]
    assert not [event for event in stored if event.kind == "text"]
    (read,) = await _vercel(tmp_path, stored)
    assert read["errors"] == []
    texts = [p["text"] for p in read["message"]["parts"] if p["type"] == "text"]
    assert texts == ["Looked everywhere. Mailing bob now."]
    assert _tools(read["message"])["send"]["state"] == "approval-requested"
    agui = await _agui(tmp_path, state.id, stored)
    (run,) = agui["runs"]
    assert run["error"] is None
    assert run["events"][-1]["outcome"]["type"] == "interrupt"
    root = [m for m in agui["messages"] if m["role"] == "assistant"]
    assert any(m.get("content") == "Looked everywhere. Mailing bob now." for m in root)


async def test_a_subagent_waiting_for_approval_in_both_clients(tmp_path: Path) -> None:
    courier = Agent(
        FakeModel([tool_call("send", to="eve"), "sent to eve"]),
        tools=[send],
        name="courier",
        description="Sends mail",
        permissions=[ApproveLater("send", reason="mail leaves")],
    )
    root = Agent(
        FakeModel([tool_call("courier", task="mail eve"), "Eve has mail."]), tools=[courier]
    )
    state = State(id="courier-run", messages=[Message.user("mail eve")])
    first = await _events(root, state)
    second = await _resume(root, state)
    assert state.answer == "Eve has mail."
    read = await _agui(tmp_path, state.id, first, second)
    assert [run["error"] for run in read["runs"]] == [None, None]
    events = read["runs"][0]["events"]
    (interrupt,) = events[-1]["outcome"]["interrupts"]
    (started,) = [event for event in events if event["type"] == "SUBAGENT_STARTED"]
    child = started["subagentRunId"]
    assert interrupt["subagentRunId"] == child
    (suspended,) = [event for event in events if event["type"] == "SUBAGENT_FINISHED"]
    assert suspended["outcome"] == {"type": "suspended", "interruptIds": [interrupt["id"]]}
    assert read["runs"][1]["answered"] == [interrupt["id"]]
    finished = read["runs"][1]["events"][-1]
    assert (finished["outcome"]["type"], finished["result"]) == ("success", "Eve has mail.")
    child_messages = [m for m in read["messages"] if m.get("subagentRunId") == child]
    assert any(m.get("content") == "sent to eve" for m in child_messages)
    (vercel,) = await _vercel(tmp_path, first)
    assert vercel["errors"] == []
    (waiting,) = [p["data"] for p in vercel["message"]["parts"] if p["type"] == "data-subagent"]
    assert (waiting["state_id"], waiting["status"]) == (child, "waiting")
    (approval,) = [p["data"] for p in vercel["message"]["parts"] if p["type"] == "data-approval"]
    assert approval["calls"][0]["state_id"] == child
