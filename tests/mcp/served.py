"""What the MCP serving tests serve (``orchestrator mcp-serve tests.mcp.served:<function>``).

With ``MCP_TEST_DIR`` set, the `wait` tool writes ``started`` there when it starts and
``cancelled`` when it is cancelled, and the agents save their States in ``runs.db`` there, so a
test sees from outside what reached the server.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
from mcp.server import Server

from orchestrator import Agent, Image, ToolError, ToolResultBlock, tool
from orchestrator.mcp import serve_tools
from orchestrator.models import Request
from orchestrator.permissions import AllowByName, ApproveLater, DenyByName
from orchestrator.testing import FakeModel, tool_call
from stores import SQLiteStore

# A 1x1 PNG.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
    "0000000d4944415478da63fccf0c0000030101007a1f1bd50000000049454e44ae426082"
)


def marks() -> Path | None:
    """Where to leave marks (read at each use: an in-process test sets it after import)."""
    return Path(os.environ["MCP_TEST_DIR"]) if os.environ.get("MCP_TEST_DIR") else None


def mark(name: str) -> None:
    folder = marks()
    if folder is not None:
        (folder / name).write_text(name, encoding="utf-8")


@tool(read_only=True)
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


@tool
def fail(reason: str) -> str:
    """Always fails with the reason."""
    raise ToolError(f"failed on purpose: {reason}")


@tool
def crash() -> str:
    """Raises an exception that is not a ToolError."""
    raise RuntimeError("a bug in the tool")


@tool(read_only=True)
def picture() -> Image:
    """A tiny picture."""
    return Image(PNG, "image/png")


@tool
def delete_all() -> str:
    """Denied by name: never listed, never run."""
    mark("deleted")
    return "deleted"


@tool
def send_mail(to: str) -> str:
    """Left to a person by the permissions: refused over MCP."""
    mark("sent")
    return f"sent to {to}"


@tool
async def wait() -> str:
    """Wait until cancelled."""
    mark("started")
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        mark("cancelled")
        raise
    return "never"


def tools() -> Server[Any]:
    """The tools, behind permissions that deny one and leave one to a person."""
    return serve_tools(
        [add, fail, crash, picture, delete_all, send_mail, wait],
        name="test-tools",
        permissions=[DenyByName("delete_*"), ApproveLater("send_*"), AllowByName("*")],
    )


def plain_tools() -> list[Any]:
    """A list of tools: the CLI serves it with serve_tools."""
    return [add, fail]


def _store() -> SQLiteStore | None:
    folder = marks()
    return SQLiteStore(folder / "runs.db") if folder is not None else None


def _adder(request: Request) -> Any:
    """Call add once, then answer with its result."""
    last = request.messages[-1]
    results = [block for block in last.content if isinstance(block, ToolResultBlock)]
    if not results:
        return tool_call("add", a=2, b=3)
    return f"the sum is {results[0].text}"


def agent() -> Agent:
    """An agent that calls add, then answers: two model replies and one tool call."""
    return Agent(
        FakeModel([_adder] * 1000),
        tools=[add],
        name="adder",
        description="Adds numbers.",
        store=_store(),
    )


def waiting_agent() -> Agent:
    """An agent whose tool waits until cancelled."""
    return Agent(FakeModel([tool_call("wait")] * 1000), tools=[wait], name="waiter", store=_store())


def approval_agent() -> Agent:
    """An agent whose only call waits for a person."""
    return Agent(
        FakeModel([tool_call("send_mail", to="bob")] * 1000),
        tools=[send_mail],
        name="mailer",
        permissions=[ApproveLater("send_*")],
        store=_store(),
    )


def broken_agent() -> Agent:
    """An agent whose model fails."""
    return Agent(FakeModel([RuntimeError("the model is down")] * 1000), name="broken")


def not_servable() -> int:
    """Returns nothing the CLI can serve."""
    return 42


def not_tools() -> list[int]:
    """A list, but not of tools."""
    return [1, 2]


def server() -> Server[Any]:
    """A server built already: served as it is."""
    return tools()
