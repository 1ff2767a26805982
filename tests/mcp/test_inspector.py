"""The MCP Inspector's CLI mode (npm ``@modelcontextprotocol/inspector``, pinned in
tests/apps/node) lists and calls our served tools, over stdio and over streamable HTTP, offline.

The clients are installed by scripts/ensure_node_clients.sh; without them these tests fail
naming it (``ORCHESTRATOR_TEST_NODE=skip`` skips them instead).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.apps.nodejs import NODE_DIR, node_program

ROOT = Path(__file__).resolve().parents[2]
INSPECTOR = NODE_DIR / "node_modules" / "@modelcontextprotocol" / "inspector" / "cli" / "build"
WAIT = 60.0  # the longest one Inspector run may take: a bound, never a measure
SERVE = [sys.executable, "-m", "orchestrator", "mcp-serve"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "NODE_NO_WARNINGS": "1"}


def inspect(target: list[str], *args: str) -> Any:
    """Run the Inspector's CLI mode on `target` (a command or a URL); its JSON output."""
    done = subprocess.run(
        [node_program(), str(INSPECTOR / "cli.js"), "--cli", *target, *args],
        cwd=NODE_DIR,
        env=_env(),
        capture_output=True,
        timeout=WAIT,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode() + done.stdout.decode()
    return json.loads(done.stdout)


@pytest.fixture
def http_url(tmp_path: Path) -> Iterator[str]:
    """``mcp-serve --http --port 0`` in a subprocess: its URL; stopped afterwards."""
    process = subprocess.Popen(
        [*SERVE, "tests.mcp.served:tools", "--http", "--port", "0"],
        cwd=ROOT,
        env={**_env(), "MCP_TEST_DIR": str(tmp_path)},
        stdout=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode().strip()
        assert line.startswith("Serving MCP at http://127.0.0.1:"), line
        yield line.removeprefix("Serving MCP at ")
    finally:
        process.terminate()
        process.wait(timeout=WAIT)
        if process.stdout is not None:
            process.stdout.close()


def test_the_inspector_lists_our_tools_over_stdio() -> None:
    listed = inspect([*SERVE, "tests.mcp.served:tools"], "--method", "tools/list")
    tools = {item["name"]: item for item in listed["tools"]}
    assert sorted(tools) == ["add", "crash", "fail", "picture", "send_mail", "wait"]
    assert tools["add"]["inputSchema"]["required"] == ["a", "b"]
    assert tools["add"]["annotations"] == {"readOnlyHint": True}


def test_the_inspector_calls_our_agent_over_stdio() -> None:
    result = inspect(
        [*SERVE, "tests.mcp.served:agent"],
        *("--method", "tools/call", "--tool-name", "adder", "--tool-arg", "prompt=2 + 3?"),
    )
    assert result == {"content": [{"type": "text", "text": "the sum is 5"}], "isError": False}


def test_the_inspector_lists_and_calls_our_tools_over_http(http_url: str) -> None:
    listed = inspect([http_url], "--method", "tools/list", "--transport", "http")
    assert [item["name"] for item in listed["tools"]][:2] == ["add", "fail"]
    call = ("--method", "tools/call", "--transport", "http", "--tool-name")
    added = inspect([http_url], *call, "add", "--tool-arg", "a=2", "b=40")
    wrong = inspect([http_url], *call, "add", "--tool-arg", "a=two")
    assert added == {"content": [{"type": "text", "text": "42"}], "isError": False}
    assert wrong["isError"] is True
    assert "Invalid arguments for the tool 'add'" in wrong["content"][0]["text"]
