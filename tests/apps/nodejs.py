"""Node.js and the official protocol clients, for the tests that check our endpoints with them."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import anyio
import pytest

NODE_DIR = Path(__file__).parent / "node"
OPT_OUT = "ORCHESTRATOR_TEST_NODE"


def node_program() -> str:
    """The `node` program with the clients installed; fails (or skips, if opted out) without."""
    node = shutil.which("node")
    modules = NODE_DIR / "node_modules"
    installed = all(
        (modules / package).is_dir()
        for package in ("ai", "@ag-ui/client", "@modelcontextprotocol/inspector", "@a2a-js/sdk")
    )
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


async def run_client(script: str, *args: str) -> Any:
    """Run `node/<script>` with `args` (without blocking the event loop); its JSON output."""
    with anyio.fail_after(60):
        done = await anyio.run_process(
            [node_program(), str(NODE_DIR / script), *args],
            cwd=NODE_DIR,
            check=False,
            env={**os.environ, "NODE_NO_WARNINGS": "1"},
        )
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)
