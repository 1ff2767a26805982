"""`orchestrator.mcp` serving: our tools and agents, called by the SDK's own client.

Each server runs as ``orchestrator mcp-serve tests.mcp.served:<function>`` in a subprocess, over
stdio or over streamable HTTP on 127.0.0.1 (an ephemeral port), and every test runs over both,
and once more with the server in the test's process.
"""

from __future__ import annotations

import base64
import os
import re
import sys
from collections.abc import AsyncGenerator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import anyio
import mcp
import mcp_types
import pytest
from starlette.routing import Route

from orchestrator import Agent, Memory, tool
from orchestrator.mcp import http_app, serve_agent, serve_tools
from orchestrator.permissions import AllowByName, AskApproval
from orchestrator.testing import FakeModel
from stores import SQLiteStore
from tests.doubles import results
from tests.mcp.served import PNG

# When a client closes an HTTP response stream early, httpx2 leaves an inner async generator to
# the garbage collector, and trio warns while it finalizes it (the client's side, as in
# tests/models/test_anthropic.py): only that warning is let through.
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
]

ROOT = Path(__file__).resolve().parents[2]
WAIT = 20.0  # the longest a test waits for the server: a bound, never a measure

Connect = Callable[[str], AbstractAsyncContextManager[mcp.Client]]


def _env(tmp_path: Path) -> dict[str, str]:
    return {"MCP_TEST_DIR": str(tmp_path), "PYTHONPATH": str(ROOT), "PATH": os.environ["PATH"]}


def _command(function: str) -> list[str]:
    return ["-m", "orchestrator", "mcp-serve", f"tests.mcp.served:{function}"]


@asynccontextmanager
async def over_stdio(function: str, tmp_path: Path) -> AsyncGenerator[mcp.Client]:
    params = mcp.StdioServerParameters(
        command=sys.executable, args=_command(function), env=_env(tmp_path), cwd=str(ROOT)
    )
    async with mcp.Client(params) as client:
        yield client


@asynccontextmanager
async def http_server(function: str, tmp_path: Path) -> AsyncGenerator[str]:
    """The URL of ``mcp-serve --http --port 0`` run in a subprocess, stopped on the way out."""
    command = [sys.executable, *_command(function), "--http", "--port", "0"]
    process = await anyio.open_process(command, env=_env(tmp_path), cwd=str(ROOT))
    try:
        assert process.stdout is not None
        seen = b""
        with anyio.fail_after(WAIT):
            while b"\n" not in seen:
                seen += await process.stdout.receive()
        line = seen.decode().splitlines()[0]
        assert line.startswith("Serving MCP at http://127.0.0.1:"), line
        yield line.removeprefix("Serving MCP at ")
    finally:
        with anyio.CancelScope(shield=True):
            process.terminate()
            with anyio.move_on_after(WAIT):
                await process.wait()
            await process.aclose()


@asynccontextmanager
async def over_http(function: str, tmp_path: Path) -> AsyncGenerator[mcp.Client]:
    async with http_server(function, tmp_path) as url, mcp.Client(url) as client:
        yield client


@asynccontextmanager
async def in_process(function: str, tmp_path: Path) -> AsyncGenerator[mcp.Client]:
    """The client connected to the server in this process (the SDK's own shortcut)."""
    from orchestrator._cli._mcp import load_server

    async with mcp.Client(load_server(f"tests.mcp.served:{function}")) as client:
        yield client


@pytest.fixture(params=["stdio", "http", "in-process"])
def connect(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Connect:
    """Open a client on the served `function`: over each transport, and in this process."""
    monkeypatch.setenv("MCP_TEST_DIR", str(tmp_path))  # for the server in this process
    openers = {"stdio": over_stdio, "http": over_http, "in-process": in_process}
    opener = openers[str(request.param)]
    return lambda function: opener(function, tmp_path)


async def wait_for(path: Path) -> None:
    """Wait until the server writes `path` (at most WAIT seconds)."""
    for _ in range(int(WAIT / 0.02)):
        if await anyio.Path(path).exists():
            return
        await anyio.sleep(0.02)
    raise AssertionError(f"the server did not write {path.name} in {WAIT:g} s")


def text_of(result: mcp_types.CallToolResult) -> str:
    return "".join(item.text for item in result.content if isinstance(item, mcp_types.TextContent))


# -- tools -------------------------------------------------------------------------------------


async def test_the_tools_are_listed_as_a_model_sees_them_and_denied_ones_hidden(
    connect: Connect,
) -> None:
    async with connect("tools") as client:
        listed = {item.name: item for item in (await client.list_tools()).tools}
    assert sorted(listed) == ["add", "crash", "fail", "picture", "send_mail", "wait"]
    assert listed["add"].description == "Add two integers."
    assert listed["add"].input_schema["properties"]["a"] == {
        "type": "integer",
        "description": "The first.",
    }
    assert listed["add"].input_schema["required"] == ["a", "b"]
    assert listed["add"].annotations is not None
    assert listed["add"].annotations.read_only_hint is True
    assert listed["fail"].annotations is None


async def test_a_call_returns_the_tools_text_and_images(connect: Connect) -> None:
    async with connect("tools") as client:
        added = await client.call_tool("add", {"a": 2, "b": 3})
        picture = await client.call_tool("picture", {})
    assert (text_of(added), added.is_error) == ("5", False)
    (image,) = picture.content
    assert isinstance(image, mcp_types.ImageContent)
    assert (base64.b64decode(image.data), image.mime_type) == (PNG, "image/png")


async def test_wrong_arguments_and_failures_are_tool_errors_and_the_server_goes_on(
    connect: Connect,
) -> None:
    async with connect("tools") as client:
        wrong = await client.call_tool("add", {"a": "two", "c": 1})
        failed = await client.call_tool("fail", {"reason": "testing"})
        crashed = await client.call_tool("crash", {})
        unknown = await client.call_tool("nope", {})
        after = await client.call_tool("add", {"a": 1, "b": 1})
    assert wrong.is_error
    assert "Invalid arguments for the tool 'add'" in text_of(wrong)
    for problem in ("- a: Input should be a valid integer", "- b: missing", "- c: "):
        assert problem in text_of(wrong)
    assert (failed.is_error, text_of(failed)) == (True, "failed on purpose: testing")
    assert crashed.is_error
    assert text_of(crashed) == "The tool 'crash' failed: RuntimeError: a bug in the tool"
    assert unknown.is_error
    assert text_of(unknown).startswith("No tool named 'nope': this server has add, fail,")
    assert (text_of(after), after.is_error) == ("2", False)


async def test_permissions_deny_a_call_and_refuse_one_that_needs_a_person(
    connect: Connect, tmp_path: Path
) -> None:
    async with connect("tools") as client:
        denied = await client.call_tool("delete_all", {})
        refused = await client.call_tool("send_mail", {"to": "bob"})
    assert denied.is_error
    assert "No tool named 'delete_all'" in text_of(denied)
    assert refused.is_error
    assert text_of(refused) == (
        "The tool 'send_mail' needs a person's approval, which a call over MCP cannot wait"
        " for: it was not run."
    )
    assert not (tmp_path / "deleted").exists()
    assert not (tmp_path / "sent").exists()


async def test_a_client_that_cancels_a_call_cancels_the_tool(
    connect: Connect, tmp_path: Path
) -> None:
    async with connect("tools") as client:
        async with anyio.create_task_group() as group:

            async def call() -> None:
                await client.call_tool("wait", {})
                raise AssertionError("the call returned")

            group.start_soon(call)
            await wait_for(tmp_path / "started")
            group.cancel_scope.cancel()
        await wait_for(tmp_path / "cancelled")
        after = await client.call_tool("add", {"a": 1, "b": 2})
    assert text_of(after) == "3"


# -- an agent ----------------------------------------------------------------------------------


async def test_an_agent_is_one_tool_that_runs_it_with_its_steps_as_progress(
    connect: Connect, tmp_path: Path
) -> None:
    steps: list[tuple[float, str | None]] = []

    all_in = anyio.Event()

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        await anyio.lowlevel.checkpoint()
        steps.append((progress, message))
        if len(steps) == 3:
            all_in.set()

    async with connect("agent") as client:
        (listed,) = (await client.list_tools()).tools
        result = await client.call_tool("adder", {"prompt": "2 + 3?"}, progress_callback=progress)
        # The client hands notifications to the callback in a task of its own: the last one
        # may reach it after the result does.
        with anyio.move_on_after(WAIT):
            await all_in.wait()
    assert (listed.name, listed.description) == ("adder", "Adds numbers.")
    assert listed.input_schema["required"] == ["prompt"]
    assert (text_of(result), result.is_error) == ("the sum is 5", False)
    assert steps == [(1, "model replied: calling add"), (2, "add done"), (3, "model replied")]

    # The run was a State of the agent's store, like any run.
    with SQLiteStore(tmp_path / "runs.db") as store:
        (info,) = store.list()
        state = store.load(info.id)
    assert state.answer == "the sum is 5"
    assert [entry.outcome for entry in results(state)] == ["done"]


async def test_a_client_that_cancels_an_agent_call_cancels_the_run(
    connect: Connect, tmp_path: Path
) -> None:
    async with connect("waiting_agent") as client:
        with anyio.CancelScope() as scope:

            async def cancel_when_started() -> None:
                await wait_for(tmp_path / "started")
                scope.cancel()

            async with anyio.create_task_group() as group:
                group.start_soon(cancel_when_started)
                await client.call_tool("waiter", {"prompt": "wait"})
                raise AssertionError("the call returned")
        await wait_for(tmp_path / "cancelled")
        # The run closed its call and saved the State before the server goes on.
        (listed,) = (await client.list_tools()).tools
    assert listed.name == "waiter"
    with SQLiteStore(tmp_path / "runs.db") as store:
        (info,) = store.list()
        state = store.load(info.id)
    assert [entry.outcome for entry in results(state)] == ["interrupted"]


async def test_an_agent_run_waiting_for_a_person_is_an_error_naming_its_calls(
    connect: Connect, tmp_path: Path
) -> None:
    async with connect("approval_agent") as client:
        result = await client.call_tool("mailer", {"prompt": "mail bob"})
    assert result.is_error
    with SQLiteStore(tmp_path / "runs.db") as store:
        (info,) = store.list()
    assert text_of(result).startswith(f"The run {info.id} stopped: its calls send_mail (")
    assert "wait for a person's approval" in text_of(result)
    assert not (tmp_path / "sent").exists()


async def test_a_failed_run_and_a_bad_prompt_are_tool_errors(connect: Connect) -> None:
    async with connect("broken_agent") as client:
        failed = await client.call_tool("broken", {"prompt": "hello"})
        empty = await client.call_tool("broken", {"prompt": " "})
        extra = await client.call_tool("broken", {"prompt": "hi", "other": 1})
    assert failed.is_error
    assert text_of(failed).startswith("The run ")
    assert text_of(failed).endswith("failed: RuntimeError: the model is down")
    for bad in (empty, extra):
        assert bad.is_error
        assert text_of(bad).startswith("Invalid arguments for the tool 'broken': pass")


async def test_the_cli_serves_a_list_of_tools(tmp_path: Path) -> None:
    async with over_stdio("plain_tools", tmp_path) as client:
        names = [item.name for item in (await client.list_tools()).tools]
        result = await client.call_tool("add", {"a": 20, "b": 22})
    assert names == ["add", "fail"]
    assert text_of(result) == "42"


# -- misuse ------------------------------------------------------------------------------------


def test_a_permission_that_asks_on_the_terminal_is_refused() -> None:
    @tool
    def ping() -> str:
        return "pong"

    with pytest.raises(ValueError, match=r"AskApproval\(\) asks on the terminal"):
        serve_tools([ping], permissions=[AskApproval()])
    agent = Agent(FakeModel(["hi"]), tools=[ping], permissions=[AskApproval()])
    with pytest.raises(ValueError, match=r"serve_agent: AskApproval\(\) asks on the terminal"):
        serve_agent(agent)
    serve_tools([ping], permissions=[AskApproval(lambda call, state: True)])  # a callback: fine


def test_tools_that_cannot_be_served_are_refused() -> None:
    @tool
    def remember(memory: Memory) -> str:
        return "kept"

    @tool(name="ping")
    def first() -> str:
        return "1"

    @tool(name="ping")
    def second() -> str:
        return "2"

    with pytest.raises(TypeError, match="needs an agent's Memory"):
        serve_tools([remember])
    with pytest.raises(ValueError, match="Two tools are named 'ping'"):
        serve_tools([first, second])
    with pytest.raises(TypeError, match="permissions takes a list"):
        serve_tools([first], permissions=AllowByName("*"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="serve_agent takes an Agent"):
        serve_agent("agent")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="path must start with '/'"):
        http_app(serve_tools([first]), path="mcp")
    (route,) = http_app(serve_tools([first]), path="/tools").routes
    assert isinstance(route, Route)
    assert route.path == "/tools"


def test_mcp_serve_is_listed_in_the_help() -> None:
    from click.testing import CliRunner

    from orchestrator._cli import cli

    shown = CliRunner().invoke(cli, ["--help"])
    assert re.search(r"^\s+mcp-serve\s+Serve an agent, or tools, to MCP", shown.output, re.M)
    usage = CliRunner().invoke(cli, ["mcp-serve", "--help"])
    assert usage.exit_code == 0
    assert "Usage: cli mcp-serve [OPTIONS] MODULE:FUNCTION" in usage.output


def test_the_cli_names_a_function_that_returns_nothing_to_serve() -> None:
    from click.testing import CliRunner

    from orchestrator._cli import cli

    result = CliRunner().invoke(cli, ["mcp-serve", "tests.mcp.served:not_servable"])
    assert result.exit_code != 0
    assert "must return an Agent, a list of tools or an MCP server" in result.output


def test_the_cli_serves_an_agent_a_list_of_tools_or_a_server_as_they_come() -> None:
    from mcp.server import Server

    from orchestrator._cli._mcp import load_server
    from orchestrator._cli._replaying import FactoryError

    for function in ("agent", "plain_tools", "server"):
        assert isinstance(load_server(f"tests.mcp.served:{function}"), Server)
    with pytest.raises(FactoryError, match="returned a list that is not tools"):
        load_server("tests.mcp.served:not_tools")
    with pytest.raises(FactoryError, match="got int"):
        load_server("tests.mcp.served:not_servable")
