"""`orchestrator.mcp`: tools from MCP servers written with the SDK (`server.py` beside this file,
over stdio and over streamable HTTP on 127.0.0.1) and from a PyPI package (`mcp-server-time`)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp
import pytest

from orchestrator import Agent, Image, Message, State, TextBlock, thaw, tool
from orchestrator.mcp import MCPServerError, MCPToolset
from orchestrator.permissions import AllowByReadOnly
from orchestrator.testing import FakeModel, tool_call
from tests.doubles import results

pytestmark = pytest.mark.anyio

SERVER = Path(__file__).with_name("server.py")
WAIT = 20.0  # the longest a test waits for a mark of the server: a bound, never a measure


def local(tmp_path: Path, **options: Any) -> MCPToolset:
    """The test server as a subprocess, leaving its marks in `tmp_path`."""
    return MCPToolset.stdio(
        sys.executable, [str(SERVER)], env={"MCP_TEST_DIR": str(tmp_path)}, **options
    )


def gone(pid: int) -> bool:
    """Whether the process `pid` has exited and been reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def wait_for(path: Path) -> None:
    """Wait until the server writes `path` (at most WAIT seconds)."""
    for _ in range(int(WAIT / 0.02)):
        if await anyio.Path(path).exists():
            return
        await anyio.sleep(0.02)
    raise AssertionError(f"the server did not write {path.name} in {WAIT:g} s")


async def test_a_run_calls_the_servers_tools_shown_with_their_schemas_as_they_are(
    tmp_path: Path,
) -> None:
    model = FakeModel([tool_call("add", a=2, b=3), "5"])
    agent = Agent(model, tools=[local(tmp_path)])
    state = State(messages=[Message.user("2 + 3?")])
    assert await agent.arun(state) == "5"
    (entry,) = results(state)
    assert (entry.outcome, entry.content.text) == ("done", "5")

    # The model saw the server's own descriptions and schemas, unchanged.
    params = mcp.StdioServerParameters(command=sys.executable, args=[str(SERVER)])
    async with mcp.Client(params) as client:
        listed = (await client.list_tools()).tools
    shown = {spec.name: spec for spec in model.requests[0].tools}
    for item in listed:
        name = item.name.replace(".", "_")
        assert thaw(shown[name].input_schema) == item.input_schema
        assert shown[name].description == item.description

    # The run's connection closed with it: the server's process has exited.
    assert gone(int((tmp_path / "pid").read_text()))


async def test_each_run_connects_unless_a_block_holds_one_connection(tmp_path: Path) -> None:
    toolset = local(tmp_path)
    agent = Agent(FakeModel([tool_call("add", a=1, b=1), "2"] * 3), tools=[toolset])
    await agent.arun("1 + 1?")
    first = int((tmp_path / "pid").read_text())
    await agent.arun("1 + 1?")
    second = int((tmp_path / "pid").read_text())
    assert first != second
    assert gone(first)
    assert gone(second)

    async with toolset:
        shared = int((tmp_path / "pid").read_text())
        assert [tool.name for tool in toolset.tools][:2] == ["add", "write_note"]
        await agent.arun("1 + 1?")
        assert int((tmp_path / "pid").read_text()) == shared
        assert not gone(shared)
        with pytest.raises(RuntimeError, match="open already"):
            await toolset.__aenter__()
    assert gone(shared)
    with pytest.raises(RuntimeError, match="not open"):
        _ = toolset.tools


async def test_a_subset_of_the_tools_under_a_prefix(tmp_path: Path) -> None:
    toolset = local(tmp_path, tools=["files.read", "add"], prefix="demo.")
    model = FakeModel([tool_call("demo_files_read", path="/etc/motd"), "read"])
    agent = Agent(model, tools=[toolset])
    state = State(messages=[Message.user("read it")])
    await agent.arun(state)
    assert [spec.name for spec in model.requests[0].tools] == ["demo_files_read", "demo_add"]
    (entry,) = results(state)
    assert entry.content.text == "contents of /etc/motd"

    async with toolset:
        assert [tool.remote_name for tool in toolset.tools] == ["files.read", "add"]


async def test_a_tool_the_server_does_not_have_is_named_with_a_suggestion(tmp_path: Path) -> None:
    agent = Agent(FakeModel(["never"]), tools=[local(tmp_path, tools=["ad"])])
    with pytest.raises(MCPServerError, match=r"no tool 'ad'.*Did you mean 'add'"):
        await agent.arun("go")


async def test_results_map_text_images_structured_content_and_errors(tmp_path: Path) -> None:
    calls = [
        tool_call("picture"),
        tool_call("weather", city="Oslo"),
        tool_call("fail", reason="no disk"),
        tool_call("add", a="two"),
    ]
    agent = Agent(FakeModel([calls, "seen"]), tools=[local(tmp_path)])
    state = State(messages=[Message.user("go")])
    await agent.arun(state)
    picture, weather, fail, add = sorted(results(state), key=lambda e: calls.index(e.call))
    assert picture.outcome == "done"
    (image,) = picture.content.content
    assert isinstance(image, Image)
    assert image.media_type == "image/png"
    assert image.data.startswith(b"\x89PNG")
    assert weather.outcome == "done"
    assert '"celsius": 21' in weather.content.text
    assert fail.outcome == "error"
    assert fail.content.is_error
    assert "failed on purpose: no disk" in fail.content.text
    # Arguments that break the server's schema never reach it: the model is told what to fix.
    assert add.outcome == "input_error"
    assert "'b' is a required property" in add.content.text
    assert "a: 'two' is not of type 'integer'" in add.content.text


async def test_content_a_model_cannot_be_shown_is_named(tmp_path: Path) -> None:
    calls = [tool_call("assorted"), tool_call("structured_only"), tool_call("nothing")]
    agent = Agent(FakeModel([calls, "seen"]), tools=[local(tmp_path)])
    state = State(messages=[Message.user("go")])
    await agent.arun(state)
    assorted, structured, nothing = sorted(results(state), key=lambda e: calls.index(e.call))
    assert [b.text if isinstance(b, TextBlock) else b for b in assorted.content.content] == [
        "(audio the model cannot be shown: audio/wav)",
        "(resource: file:///report.pdf)",
        "(resource file:///a.txt)\nhello",
        "(resource file:///b.bin: application/octet-stream)",
        "(an image the model cannot be shown: image/tiff)",
        "(an image the model cannot be shown: image/png)",
    ]
    assert structured.content.text == '{"ok": true}'
    assert nothing.content.text == "(no content)"


async def test_read_only_hints_feed_allow_by_read_only(tmp_path: Path) -> None:
    calls = [tool_call("add", a=1, b=2), tool_call("write_note", text="hi")]
    agent = Agent(
        FakeModel([calls, "ok"]), tools=[local(tmp_path)], permissions=[AllowByReadOnly()]
    )
    state = State(messages=[Message.user("go")])
    await agent.arun(state)
    outcomes = {entry.call.name: entry.outcome for entry in results(state)}
    assert outcomes == {"add": "done", "write_note": "denied"}


async def test_cancelling_a_run_cancels_the_call_on_the_server(tmp_path: Path) -> None:
    toolset = local(tmp_path)
    agent = Agent(FakeModel([tool_call("wait"), tool_call("add", a=1, b=2), "3"]), tools=[toolset])
    state = State(messages=[Message.user("go")])
    async with toolset:  # the server outlives the run: only the cancellation can reach it
        async with anyio.create_task_group() as group:

            async def run() -> None:
                await agent.arun(state)

            group.start_soon(run)
            await wait_for(tmp_path / "started")
            group.cancel_scope.cancel()
        await wait_for(tmp_path / "cancelled")
        (entry,) = results(state)
        assert entry.outcome == "interrupted"
        # The connection still serves the next run.
        assert await agent.arun(state) == "3"


async def test_a_call_that_takes_too_long_is_an_error_result_and_cancelled_on_the_server(
    tmp_path: Path,
) -> None:
    toolset = local(tmp_path, timeout=0.5)
    agent = Agent(FakeModel([tool_call("wait"), "gave up"]), tools=[toolset])
    state = State(messages=[Message.user("go")])
    async with toolset:
        assert await agent.arun(state) == "gave up"
        await wait_for(tmp_path / "cancelled")
    (entry,) = results(state)
    assert entry.outcome == "error"
    assert entry.content.text == "(timed out after 0.5 s)"


async def test_a_server_that_dies_gives_error_results_and_the_run_goes_on(tmp_path: Path) -> None:
    model = FakeModel([tool_call("crash"), tool_call("add", a=1, b=2), "it died"])
    agent = Agent(model, tools=[local(tmp_path)])
    state = State(messages=[Message.user("go")])
    assert await agent.arun(state) == "it died"
    crash, add = results(state)
    assert crash.outcome == "error"
    assert "The MCP server" in crash.content.text
    assert "'crash'" in crash.content.text
    assert add.outcome == "error"
    assert gone(int((tmp_path / "pid").read_text()))


async def test_a_server_that_never_answers_fails_the_run_start_and_is_stopped(
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "pid"
    code = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"
    silent = MCPToolset.stdio(sys.executable, ["-c", code, str(pid_file)], connect_timeout=0.5)
    agent = Agent(FakeModel(["never"]), tools=[silent])
    with pytest.raises(MCPServerError, match=r"did not answer within 0\.5 s"):
        await agent.arun("go")
    assert gone(int(pid_file.read_text()))


async def test_a_server_that_cannot_start_fails_with_the_reason(tmp_path: Path) -> None:
    missing = MCPToolset.stdio(str(tmp_path / "no-such-server"))
    with pytest.raises(MCPServerError, match=r"Could not connect.*no-such-server"):
        async with missing:
            pass


def test_options_are_checked() -> None:
    with pytest.raises(TypeError, match=r"tools=\['add'\]"):
        MCPToolset.stdio("server", tools="add")
    with pytest.raises(ValueError, match="timeout"):
        MCPToolset.stdio("server", timeout=0)
    with pytest.raises(ValueError, match="connect_timeout"):
        MCPToolset.stdio("server", connect_timeout=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="http"):
        MCPToolset.http("127.0.0.1:8000/mcp")
    assert (
        repr(MCPToolset.stdio("uvx", ["mcp-server-time"])) == "<MCPToolset 'uvx mcp-server-time'>"
    )


def test_the_sync_run_works_too(tmp_path: Path) -> None:
    agent = Agent(FakeModel([tool_call("add", a=4, b=5), "9"]), tools=[local(tmp_path)])
    assert agent.run("4 + 5?") == "9"


# -- over streamable HTTP --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def http_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The test server over streamable HTTP on 127.0.0.1, for this module's tests."""
    port = _free_port()
    marks = tmp_path_factory.mktemp("http")
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "http", str(port)],
        env={**os.environ, "MCP_TEST_DIR": str(marks)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(400):  # up to 20 s for the server to listen
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None:
                    raise RuntimeError("the HTTP test server exited") from None
                time.sleep(0.05)
        else:
            raise RuntimeError("the HTTP test server did not listen in 20 s")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=10)


async def test_a_server_over_streamable_http(http_url: str) -> None:
    toolset = MCPToolset.http(http_url, headers={"X-Test": "1"}, tools=["add", "weather"])
    calls = [tool_call("add", a=20, b=22), tool_call("weather", city="Lima")]
    agent = Agent(FakeModel([calls, "done"]), tools=[toolset])
    state = State(messages=[Message.user("go")])
    assert await agent.arun(state) == "done"
    texts = {entry.call.name: entry.content.text for entry in results(state)}
    assert texts["add"] == "42"
    assert '"city": "Lima"' in texts["weather"]


async def test_an_http_server_that_is_not_there_fails_with_the_reason() -> None:
    nobody = MCPToolset.http(f"http://127.0.0.1:{_free_port()}/mcp", connect_timeout=10)
    with pytest.raises(MCPServerError, match="Could not connect"):
        await Agent(FakeModel(["never"]), tools=[nobody]).arun("go")


# -- a server someone else wrote: mcp-server-time from PyPI --------------------------------------


async def test_mcp_server_time_from_pypi() -> None:
    clock = MCPToolset.stdio(
        sys.executable, ["-m", "mcp_server_time", "--local-timezone", "UTC"], prefix="time_"
    )
    call = tool_call(
        "time_convert_time", source_timezone="UTC", time="12:00", target_timezone="Asia/Tokyo"
    )
    model = FakeModel([call, "It is 21:00 in Tokyo."])
    agent = Agent(model, tools=[clock], permissions=[AllowByReadOnly()])
    state = State(messages=[Message.user("12:00 UTC in Tokyo?")])
    assert await agent.arun(state) == "It is 21:00 in Tokyo."
    names = {spec.name for spec in model.requests[0].tools}
    assert {"time_get_current_time", "time_convert_time"} <= names
    (entry,) = results(state)
    assert entry.outcome == "done"  # allowed: the server marks its tools read-only
    assert "Asia/Tokyo" in entry.content.text
    assert "21:00" in entry.content.text


async def test_a_toolset_tool_clashing_with_the_agents_own_is_refused(tmp_path: Path) -> None:
    @tool
    def add(a: int, b: int) -> int:
        """Mine."""
        return a + b

    agent = Agent(FakeModel(["never"]), tools=[add, local(tmp_path)])
    with pytest.raises(ValueError, match="prefix"):
        await agent.arun("go")
    assert gone(int((tmp_path / "pid").read_text()))


# The app's own process: its global tracer provider records to memory, the way an app that
# configured OpenTelemetry does; the MCP SDK makes its client spans with that global provider.
# It runs apart, so the global provider it sets does not leak into the other tests.
TRACED_APP = """
import json
import sys

import anyio
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from orchestrator import Agent
from orchestrator.mcp import MCPToolset
from orchestrator.otel import OtelReporter
from orchestrator.testing import FakeModel, tool_call

server, marks, backend = sys.argv[1:4]
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
toolset = MCPToolset.stdio(sys.executable, [server], env={"MCP_TEST_DIR": marks})
agent = Agent(
    FakeModel([tool_call("add", a=2, b=3), "5"]), tools=[toolset], reporter=OtelReporter()
)
assert anyio.run(agent.arun, "2 + 3?", backend=backend) == "5"
spans = [
    {
        "name": span.name,
        "trace": span.context.trace_id,
        "id": span.context.span_id,
        "parent": span.parent.span_id if span.parent else None,
    }
    for span in exporter.get_finished_spans()
]
print(json.dumps(spans))
"""


@pytest.mark.timeout(60)
async def test_the_mcp_sdks_spans_hang_under_the_calls_execute_tool_span(
    tmp_path: Path, anyio_backend: str
) -> None:
    """The SDK's client span of a tool call is a child of our span, in the run's trace."""
    app = tmp_path / "app.py"
    app.write_text(TRACED_APP)
    done = await anyio.run_process(
        [sys.executable, str(app), str(SERVER), str(tmp_path), anyio_backend],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    spans = json.loads(done.stdout)
    (tool_span,) = [span for span in spans if span["name"] == "execute_tool add"]
    (sdk_span,) = [span for span in spans if span["name"] == "MCP send tools/call add"]
    (run_span,) = [span for span in spans if span["name"].startswith("invoke_agent")]
    assert sdk_span["parent"] == tool_span["id"]
    assert sdk_span["trace"] == tool_span["trace"] == run_span["trace"]
    assert tool_span["parent"] == run_span["id"]
