"""LLMock, a third-party mock of the provider APIs (``llmock`` on PyPI), run for the model tests.

Our own `tests.models._server` plays exactly the bytes a test scripts; LLMock is someone else's
reading of the same APIs, with faults of its own making: HTTP errors with each provider's error
body, scripted replies and tool calls, and stream faults (a dropped connection, a stream that
ends early, a corrupted chunk, a stall). Testing against both keeps our fakes honest.

It runs in a subprocess on 127.0.0.1 (a port the OS picks) and is scripted over its HTTP control
API (``/_llmock/...``): behaviours are queued as JSON objects in LLMock's documented form, e.g.
``{"type": "stream_fault", "kind": "disconnect", "after_chunks": 3}``, and each request takes the
first one that matches it. Killing the process at the end stops everything it still serves.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Generator
from contextlib import contextmanager
from typing import Any, Literal, cast

import anyio.to_thread

__all__ = ("LLMock", "run_llmock")

# The child process: LLMock's own in-process server class binds a free port before it starts
# (no race for the port), then the process serves until it is killed.
_LAUNCH = """
import sys
from llmock.simulation import MockResponseSettings
from llmock.testing import LLMockServer

server = LLMockServer(port=0, responses=MockResponseSettings(tool_mode="off")).start()
print(server.port, flush=True)
sys.stdin.read()
"""

# Where each provider's API lives on an LLMock server.
_PATHS = {"openai": "/v1", "anthropic": "/anthropic"}


class LLMock:
    """A running LLMock server: where it is, what to script, what it received."""

    def __init__(self, url: str) -> None:
        self.url = url

    def base_url(self, provider: Literal["openai", "anthropic"]) -> str:
        """The ``base_url`` a provider model needs to talk to this server."""
        return self.url + _PATHS[provider]

    async def script(self, *behaviors: dict[str, Any]) -> None:
        """Queue behaviours; each request takes, per kind, the first one that matches it."""
        await anyio.to_thread.run_sync(self._call, "POST", "/_llmock/scenario", behaviors)

    async def requests(self) -> list[dict[str, Any]]:
        """Every provider request since the last reset: path, status, fault, body, chunks sent."""
        answer = await anyio.to_thread.run_sync(self._call, "GET", "/_llmock/requests", None)
        return cast("list[dict[str, Any]]", answer["requests"])

    def reset(self) -> None:
        """Forget the requests and the behaviours not used yet."""
        self._call("POST", "/_llmock/reset", None)

    def _call(self, method: str, path: str, behaviors: tuple[dict[str, Any], ...] | None) -> Any:
        data = None if behaviors is None else json.dumps({"behaviors": list(behaviors)}).encode()
        request = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)


@contextmanager
def run_llmock() -> Generator[LLMock]:
    """A started LLMock server on 127.0.0.1, killed on exit."""
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(
            [sys.executable, "-c", _LAUNCH],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
        try:
            assert process.stdout is not None
            port = process.stdout.readline().strip()
            if not port.isdigit():
                process.kill()
                process.wait()
                errors.seek(0)
                output = errors.read().decode(errors="replace")
                raise RuntimeError(f"LLMock did not start (exit {process.returncode}):\n{output}")
            yield LLMock(f"http://127.0.0.1:{port}")
        finally:
            process.kill()
            process.wait()
            for pipe in (process.stdin, process.stdout):
                if pipe is not None:
                    pipe.close()
