"""Runs across processes: a run started in one app process, followed, decided and cancelled from
another, and taken over after its process is killed.

Process A is ``orchestrator serve`` (uvicorn on 127.0.0.1); this test is process B, a `Runs`
service on the same store (an SQLite file, and PostgreSQL). B reads A's runs from the store:
their events from the tree feed, who runs them from the run leases.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import httpx
import pytest

from orchestrator import StoppedByApproval
from orchestrator.apps import Followed, Runs
from stores import open_store
from tests.cli.serve_agents import build
from tests.postgres import fresh_schema

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
LEASE = 1.0  # seconds: a killed process's runs are free again this soon


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Generator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shared.db'}"
        return
    with fresh_schema("runs") as (dsn, schema):
        separator = "&" if "?" in dsn else "?"
        yield f"{dsn}{separator}schema={schema}"


@asynccontextmanager
async def _process_a(url: str) -> AsyncGenerator[tuple[httpx.AsyncClient, anyio.abc.Process]]:
    """``orchestrator serve`` on the store `url`: an HTTP client on it, and its process."""
    command = [
        sys.executable,
        "-m",
        "orchestrator",
        "serve",
        "--agents",
        "tests.cli.serve_agents:build",
        "--store",
        url,
        "--port",
        "0",
        "--lease",
        str(LEASE),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    async with await anyio.open_process(command, cwd=ROOT, env=env) as process:
        assert process.stdout is not None
        line = b""
        with anyio.fail_after(60):
            while b"\n" not in line:
                line += await process.stdout.receive(1)
        found = re.search(rb"at (http://127\.0\.0\.1:\d+) ", line)
        assert found is not None, line
        try:
            async with httpx.AsyncClient(base_url=found[1].decode(), timeout=30) as client:
                yield client, process
        finally:
            if process.returncode is None:
                process.kill()
            with anyio.CancelScope(shield=True), anyio.fail_after(30):
                await process.wait()


async def _until(check: Callable[[], Awaitable[bool]]) -> None:
    """Wait until `check()` is true (it looks at another process's progress), at most 30 s."""
    with anyio.fail_after(30):
        while True:
            if await check():
                return
            await anyio.sleep(0.05)


async def _turn_at_least(runs: Runs, run_id: str, turn: int) -> bool:
    return (await runs.get(run_id)).turn >= turn


async def _seen(seen: list[Followed], kinds: list[str]) -> bool:
    return [item.event.kind for item in seen] == kinds


async def _collect(runs: Runs, run_id: str, seen: list[Followed], after: str | None = None) -> None:
    async for item in runs.follow(run_id, after=after):
        seen.append(item)


async def test_a_run_in_process_a_is_followed_and_cancelled_from_b(store_url: str) -> None:
    with open_store(store_url) as store:
        async with _process_a(store_url) as (client, _), Runs(build(), store, lease=LEASE) as b:
            run_id = (await client.post("/runs", json={"agent": "echo", "input": "wait"})).json()[
                "id"
            ]
            await _until(lambda: _turn_at_least(b, run_id, 1))
            assert (await b.get(run_id)).status == "running"
            assert [info.status for info in await b.list()] == ["running"]
            with pytest.raises(ValueError, match="running in another process"):
                await b.start("echo", "hi", state_id=run_id)
            seen: list[Followed] = []
            async with anyio.create_task_group() as group:
                group.start_soon(_collect, b, run_id, seen)
                with anyio.fail_after(30):
                    info = await b.cancel(run_id)  # recorded, seen by A, then saved by A
                assert info.status == "idle"
        loaded = store.load(run_id)
    assert [e.outcome for e in loaded.history if e.kind == "tool_result"] == ["interrupted"]
    assert [item.event.kind for item in seen] == ["run_start", "model_reply", "tool_end", "run_end"]


async def test_a_waiting_run_of_process_a_is_approved_and_finished_in_b(store_url: str) -> None:
    with open_store(store_url) as store:
        async with _process_a(store_url) as (client, _), Runs(build(), store, lease=LEASE) as b:
            started = await client.post("/runs", json={"agent": "echo", "input": "mail ann"})
            run_id = started.json()["id"]
            events = await client.get(f"/runs/{run_id}/events")  # until the run waits
            assert "event: run_end" in events.text
            waiting = await b.get(run_id)
            assert waiting.status == "waiting"
            assert isinstance(waiting.stopped, StoppedByApproval)
            call_id = waiting.stopped.calls[0].call.id
            assert (await b.approve(run_id, call_id, by="ann")).status == "running"
            shown = (await client.get(f"/runs/{run_id}")).json()
            assert shown["status"] in ("running", "answered")  # A sees B run it
            assert (await b.wait(run_id)).status == "answered"
        assert store.load(run_id).answer == "done"


async def test_a_killed_process_run_is_resumed_in_b_and_a_follower_continues_exactly(
    store_url: str,
) -> None:
    with open_store(store_url) as store:
        async with Runs(build(), store, lease=LEASE) as b:
            seen: list[Followed] = []
            async with _process_a(store_url) as (client, process):
                run_id = (
                    await client.post("/runs", json={"agent": "echo", "input": "wait"})
                ).json()["id"]
                async with anyio.create_task_group() as group:
                    group.start_soon(_collect, b, run_id, seen)
                    await _until(lambda: _seen(seen, ["run_start", "model_reply"]))
                    process.send_signal(signal.SIGKILL)  # no save, no lease given back
                    with anyio.fail_after(30):
                        await process.wait()
                # The follower ends once the dead lease runs out: nothing runs the run.
            assert (await b.get(run_id)).status == "idle"
            resumed = await b.start("echo", state_id=run_id)  # the cut-off call: unknown
            assert (await resumed.wait()).status == "answered"
            rest: list[Followed] = []
            await _collect(b, run_id, rest, after=seen[-1].id)
            every: list[Followed] = []
            await _collect(b, run_id, every)
        loaded = store.load(run_id)
    assert [e.outcome for e in loaded.history if e.kind == "tool_result"] == ["unknown"]
    assert [item.id for item in seen + rest] == [item.id for item in every]
    assert [item.event.kind for item in rest][-2:] == ["model_reply", "run_end"]
