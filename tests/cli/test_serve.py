"""`orchestrator serve`: agents over HTTP from a shell, stopped by Ctrl+C with every run saved."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path

import httpx

from stores import SQLiteStore

ROOT = Path(__file__).resolve().parents[2]


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator", "serve", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@contextmanager
def _service(store: Path, *extra: str) -> Generator[tuple[str, subprocess.Popen[str]]]:
    """The service running on a free port on 127.0.0.1: its URL and its process."""
    process = subprocess.Popen(
        _command(
            "--agents",
            "tests.cli.serve_agents:build",
            "--store",
            f"sqlite:///{store}",
            "--port",
            "0",
            *extra,
        ),
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        found = re.search(r"at (http://127\.0\.0\.1:\d+) ", line)
        assert found is not None, line + (process.stderr.read() if process.stderr else "")
        yield found[1], process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)  # reaps it and closes its pipes


def _events(client: httpx.Client, run_id: str) -> list[str]:
    kinds: list[str] = []
    with client.stream("GET", f"/runs/{run_id}/events") as response:
        for line in response.iter_lines():
            if line.startswith("event: "):
                kinds.append(line.removeprefix("event: "))
    return kinds


def test_serve_runs_agents_and_ctrl_c_saves_the_runs_still_going(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    with _service(path) as (url, process), httpx.Client(base_url=url, timeout=30) as client:
        done = client.post("/runs", json={"agent": "echo", "input": "hello"}).json()["id"]
        assert _events(client, done) == ["run_start", "model_reply", "run_end"]
        held = client.post("/runs", json={"agent": "echo", "input": "wait"}).json()["id"]
        with client.stream("GET", f"/runs/{held}/events") as response:
            for line in response.iter_lines():
                if line == "event: model_reply":
                    break  # the tool is running now
        listed = [run["id"] for run in client.get("/runs").json()]
        assert listed == [held, done]
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "Stopped." in out
    with SQLiteStore(path) as store:
        assert store.load(done).answer == "echo: hello"
        outcomes = [e.outcome for e in store.load(held).history if e.kind == "tool_result"]
        assert outcomes == ["interrupted"]


def test_serve_with_a_token_refuses_requests_without_it(tmp_path: Path) -> None:
    token = "a-long-enough-test-token"
    with (
        _service(tmp_path / "runs.db", "--token", token) as (url, _),
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        assert client.get("/runs").status_code == 401
        headers = {"Authorization": f"Bearer {token}"}
        assert client.get("/runs", headers=headers).json() == []


def test_serve_refuses_other_machines_without_a_token_and_bad_agents(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    env = {key: value for key, value in _env().items() if key != "ORCHESTRATOR_TOKEN"}
    open_port = subprocess.run(
        _command("--agents", "tests.cli.serve_agents:build", "--store", store, "--host", "0.0.0.0"),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert open_port.returncode == 2
    assert "give a token" in open_port.stderr
    for spec, words in (
        ("tests.cli.serve_agents:not_agents", "must return Agents"),
        ("tests.cli.serve_agents:absent", "has no 'absent'"),
        ("nowhere", "module:function"),
    ):
        bad = subprocess.run(
            _command("--agents", spec, "--store", store),
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert bad.returncode == 2, bad.stderr
        assert words in bad.stderr
    assert not (tmp_path / "runs.db").exists()  # nothing was made before the agents loaded


def test_serve_is_listed_in_the_help() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "orchestrator", "--help"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert re.search(r"^\s+serve\s+Serve agents over HTTP", shown.stdout, re.MULTILINE)


def test_serve_with_a2a_serves_each_agent_over_a2a(tmp_path: Path) -> None:
    with (
        _service(tmp_path / "runs.db", "--a2a") as (url, _),
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        card = client.get("/a2a/echo/.well-known/agent-card.json").json()
        assert card["name"] == "echo"
        assert card["supportedInterfaces"][0]["url"] == f"{url}/a2a/echo/"
        sent = client.post(
            "/a2a/echo/",
            headers={"A2A-Version": "1.0"},
            json={
                "jsonrpc": "2.0",
                "id": 1,
                "method": "SendMessage",
                "params": {
                    "message": {
                        "messageId": "m1",
                        "role": "ROLE_USER",
                        "parts": [{"text": "hello"}],
                    }
                },
            },
        ).json()
    task = sent["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert task["artifacts"][0]["parts"] == [{"text": "echo: hello"}]


def test_the_printed_url_takes_connections_before_the_server_starts() -> None:
    # `serve` and `mcp-serve` print their URL, then start uvicorn on the socket: a client that
    # read the URL first was refused ("All connection attempts failed") when the socket was
    # only bound. It listens before the URL is printed, so the connection waits in the backlog.
    from orchestrator._cli._serving import listener_on

    listener = listener_on("127.0.0.1", 0)
    try:
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            accepted, _ = listener.accept()
            with accepted:
                client.sendall(b"ping")
                assert accepted.recv(4) == b"ping"
    finally:
        listener.close()
