"""The example web app served by uvicorn in a process of its own, on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("ORCHESTRATOR_ARTIFACTS", ROOT / ".artifacts")) / "web_app"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Server:
    """A running `python -m examples.web_app`: its URL and process."""

    url: str
    process: subprocess.Popen[str]

    def stop(self) -> str:
        """Stop it as a process manager would (SIGINT), and return what it logged."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            _, log = self.process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, log = self.process.communicate()
            raise AssertionError(f"the app did not stop within 30 s:\n{log}") from None
        return log


@dataclass
class App:
    """Where a test's app keeps its runs and its outbox; `start` serves it."""

    store: Path
    outbox: Path

    def start(self, latency: float = 0.02) -> Server:
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY",)}
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "examples.web_app",
                "--store",
                str(self.store),
                "--outbox",
                str(self.outbox),
                "--port",
                str(port),
                "--latency",
                str(latency),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise AssertionError(f"the app exited: {process.communicate()[1]}")
            try:
                if httpx.get(url + "/runs", timeout=2).status_code == 200:
                    return Server(url, process)
            except httpx.TransportError:
                time.sleep(0.1)
        process.kill()
        raise AssertionError(f"the app did not answer within 30 s: {process.communicate()[1]}")


@pytest.fixture
def app(tmp_path: Path) -> Iterator[App]:
    made = App(tmp_path / "runs.db", tmp_path / "outbox.tsv")
    servers: list[Server] = []
    original = made.start

    def start(latency: float = 0.02) -> Server:
        server = original(latency)
        servers.append(server)
        return server

    made.start = start  # type: ignore[method-assign]
    yield made
    for server in servers:
        if server.process.poll() is None:
            server.process.kill()
            server.process.communicate()
