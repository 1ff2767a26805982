"""An MCP server written with the SDK, for the tests: ``python server.py`` (stdio) or
``python server.py http PORT`` (streamable HTTP on 127.0.0.1:PORT).

With ``MCP_TEST_DIR`` set, it writes its process id to ``pid`` there at start, ``started`` when
the ``wait`` tool starts and ``cancelled`` when that call is cancelled, so a test can see from
outside what reached the server.
"""

from __future__ import annotations

import base64
import os
import sys
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextResourceContents,
    ToolAnnotations,
)

# A 1x1 PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
READ_ONLY = ToolAnnotations(read_only_hint=True)

server = MCPServer("test-server")
marks = Path(os.environ["MCP_TEST_DIR"]) if os.environ.get("MCP_TEST_DIR") else None


def mark(name: str, text: str = "") -> None:
    if marks is not None:
        (marks / name).write_text(text, encoding="utf-8")


@server.tool(annotations=READ_ONLY)
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def write_note(text: str) -> str:
    """Write a note (changes the world)."""
    return f"noted: {text}"


@server.tool(annotations=READ_ONLY)
def picture() -> Image:
    """A tiny picture."""
    return Image(data=PNG, format="png")


@server.tool(annotations=READ_ONLY, structured_output=True)
def weather(city: str) -> dict[str, Any]:
    """The weather in a city, as data."""
    return {"city": city, "celsius": 21}


@server.tool()
def fail(reason: str) -> str:
    """Always fails with the reason."""
    raise ToolError(f"failed on purpose: {reason}")


@server.tool()
async def wait() -> str:
    """Wait until cancelled."""
    mark("started")
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        mark("cancelled")
        raise
    return "never"


@server.tool()
def crash() -> str:
    """Kill the server process."""
    os._exit(3)


@server.tool(name="files.read", annotations=READ_ONLY)
def files_read(path: str) -> str:
    """A tool whose name has a dot."""
    return f"contents of {path}"


@server.tool(annotations=READ_ONLY)
def assorted() -> CallToolResult:
    """Content of the kinds a model cannot be shown as they are."""
    blob = base64.b64encode(b"\x00\x01").decode()
    return CallToolResult(
        content=[
            AudioContent(data=blob, mime_type="audio/wav"),
            ResourceLink(name="report", uri="file:///report.pdf"),
            EmbeddedResource(resource=TextResourceContents(uri="file:///a.txt", text="hello")),
            EmbeddedResource(
                resource=BlobResourceContents(
                    uri="file:///b.bin", blob=blob, mime_type="application/octet-stream"
                )
            ),
            ImageContent(data=base64.b64encode(PNG).decode(), mime_type="image/tiff"),
            ImageContent(data="not base64!", mime_type="image/png"),
        ]
    )


@server.tool(annotations=READ_ONLY)
def structured_only() -> CallToolResult:
    """Structured content without text."""
    return CallToolResult(content=[], structured_content={"ok": True})


@server.tool(annotations=READ_ONLY)
def nothing() -> CallToolResult:
    """No content at all."""
    return CallToolResult(content=[])


def main() -> None:
    mark("pid", str(os.getpid()))
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]), stateless_http=False)
    else:
        server.run()


if __name__ == "__main__":
    main()
