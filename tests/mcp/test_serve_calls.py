"""`orchestrator.mcp` serving, the cases of one call: the SDK's client connected to the server in
the process (no transport; tests/mcp/test_serve.py covers stdio and HTTP), on asyncio and trio.
"""

from __future__ import annotations

import threading
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import mcp
import mcp_types
import pytest

from orchestrator import Agent, State, ToolCall, ToolResult, tool
from orchestrator.mcp import serve_agent, serve_tools
from orchestrator.permissions import AskApproval
from orchestrator.testing import FakeModel, tool_call

pytestmark = pytest.mark.anyio

WAIT = 20.0  # the longest a test waits for a call: a bound, never a measure


def text_of(result: mcp_types.CallToolResult) -> str:
    return "".join(item.text for item in result.content if isinstance(item, mcp_types.TextContent))


async def call(server: Any, name: str, arguments: dict[str, Any]) -> mcp_types.CallToolResult:
    async with mcp.Client(server) as client:
        with anyio.fail_after(WAIT):
            return await client.call_tool(name, arguments)


async def test_a_tool_past_its_timeout_is_an_error_result() -> None:
    @tool(timeout=0.05)
    async def slow() -> str:
        await anyio.sleep_forever()
        return "never"

    result = await call(serve_tools([slow]), "slow", {})
    assert (text_of(result), result.is_error) == ("The tool 'slow' timed out after 0.05 s.", True)


async def test_a_tool_that_takes_the_state_gets_a_new_one_each_call() -> None:
    seen: list[str] = []

    @tool
    def where(state: State) -> str:
        seen.append(state.id)
        return f"{len(state.messages)} messages"

    server = serve_tools([where])
    first = await call(server, "where", {})
    second = await call(server, "where", {})
    assert text_of(first) == text_of(second) == "0 messages"
    assert len(set(seen)) == 2


async def test_results_a_tool_flags_as_errors_or_cannot_give_are_error_results() -> None:
    @tool
    def flagged() -> ToolResult:
        return ToolResult("not found", is_error=True)

    @tool
    def opaque() -> object:
        return object()

    server = serve_tools([flagged, opaque])
    (flagged_result, opaque_result) = [
        await call(server, name, {}) for name in ("flagged", "opaque")
    ]
    assert (text_of(flagged_result), flagged_result.is_error) == ("not found", True)
    assert opaque_result.is_error
    assert text_of(opaque_result).startswith("The tool 'opaque' failed: TypeError: ")


async def test_an_approval_callback_decides_each_call() -> None:
    asked: list[ToolCall] = []

    @tool
    def send(to: str) -> str:
        return f"sent to {to}"

    async def approve(call: ToolCall, state: State) -> bool:
        await anyio.lowlevel.checkpoint()
        asked.append(call)
        return call.args["to"] == "team@example.com"

    server = serve_tools([send], permissions=[AskApproval(approve)])
    allowed = await call(server, "send", {"to": "team@example.com"})
    declined = await call(server, "send", {"to": "everyone@example.com"})
    assert (text_of(allowed), allowed.is_error) == ("sent to team@example.com", False)
    assert (text_of(declined), declined.is_error) == ("Denied: the user declined", True)
    assert [(c.name, dict(c.args)) for c in asked] == [
        ("send", {"to": "team@example.com"}),
        ("send", {"to": "everyone@example.com"}),
    ]


async def test_a_cancelled_sync_tool_returns_at_once_and_its_thread_is_left_to_end() -> None:
    started, release = threading.Event(), threading.Event()

    @tool
    def block() -> str:
        started.set()
        release.wait(WAIT)
        return "late"

    @tool
    def ping() -> str:
        return "pong"

    try:
        async with mcp.Client(serve_tools([block, ping])) as client:
            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as group:

                    async def blocked() -> None:
                        await client.call_tool("block", {})
                        raise AssertionError("the call returned")

                    group.start_soon(blocked)
                    assert await anyio.to_thread.run_sync(started.wait, WAIT)
                    group.cancel_scope.cancel()
                # The server answers the next call while the abandoned thread still waits.
                assert text_of(await client.call_tool("ping", {})) == "pong"
            assert not release.is_set()
    finally:
        release.set()


async def test_a_subagents_steps_are_progress_too() -> None:
    researcher = Agent(FakeModel(["found it"]), name="researcher", description="Finds things.")
    lead = Agent(
        FakeModel([tool_call("researcher", task="look"), "done"]),
        tools=[researcher.as_tool()],
        name="lead",
    )
    steps: list[str | None] = []
    done = anyio.Event()

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        await anyio.lowlevel.checkpoint()
        steps.append(message)
        if len(steps) == 5:
            done.set()

    async with mcp.Client(serve_agent(lead)) as client:
        result = await client.call_tool("lead", {"prompt": "go"}, progress_callback=progress)
        with anyio.move_on_after(WAIT):
            await done.wait()
    assert text_of(result) == "done"
    child = steps[1]
    assert child is not None
    child_id = child.split("]")[0].removeprefix("[")
    assert steps == [
        "model replied: calling researcher",
        f"[{child_id}] subagent researcher started",
        f"[{child_id}] model replied",
        "researcher done",
        "model replied",
    ]


async def test_an_agent_stopped_without_an_answer_and_a_wrong_tool_name_are_errors() -> None:
    @tool
    def again() -> str:
        return "again"

    loops = Agent(FakeModel([tool_call("again")] * 5), tools=[again], max_turns=2)
    server = serve_agent(loops)
    stopped = await call(server, "run_agent", {"prompt": "loop"})
    wrong = await call(server, "other", {"prompt": "loop"})
    assert stopped.is_error
    assert "stopped without an answer: turn limit reached (2 turns)" in text_of(stopped)
    assert (text_of(wrong), wrong.is_error) == (
        "No tool named 'other': this server has run_agent.",
        True,
    )


def test_one_server_serves_on_one_event_loop_after_another() -> None:
    @tool
    def double(n: int) -> int:
        return n * 2

    server = serve_tools([double])
    for backend in ("asyncio", "trio", "asyncio"):
        result = anyio.run(call, server, "double", {"n": 21}, backend=backend)
        assert text_of(result) == "42"
