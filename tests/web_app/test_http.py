"""The example web app over real HTTP: SSE parsed, concurrent runs, restart then approve."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx
import pytest

from stores import SQLiteStore
from tests.web_app.conftest import App

pytestmark = pytest.mark.anyio


async def _sse(
    client: httpx.AsyncClient, url: str, last_id: str | None = None
) -> list[dict[str, Any]]:
    """Every server-sent event of `url` until the server ends the stream."""
    headers = {} if last_id is None else {"Last-Event-ID": last_id}
    events: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    async with client.stream("GET", url, headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if not line:
                if current:
                    events.append(current)
                current = {}
            elif line.startswith(":"):
                continue
            else:
                name, _, value = line.partition(": ")
                current[name] = json.loads(value) if name == "data" else value
    return events


async def _run_until_waiting(client: httpx.AsyncClient, base: str) -> tuple[str, list[Any]]:
    response = await client.post(base + "/runs", json={"prompt": "Update the customer"})
    assert response.status_code == 201
    run_id = response.json()["id"]
    events = await _sse(client, f"{base}/runs/{run_id}/events")
    return run_id, events


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the client side only; the app runs in its own process


async def test_concurrent_runs_stream_events_and_wait_for_approval(app: App) -> None:
    server = app.start()
    async with httpx.AsyncClient(timeout=30) as client:
        results: dict[int, tuple[str, list[Any]]] = {}

        async def one(index: int) -> None:
            results[index] = await _run_until_waiting(client, server.url)

        async with anyio.create_task_group() as group:
            for index in range(5):
                group.start_soon(one, index)
        ids = {run_id for run_id, _ in results.values()}
        assert len(ids) == 5
        for run_id, events in results.values():
            kinds = [event["event"] for event in events]
            assert kinds[0] == "run_start"
            assert "child_start" in kinds
            assert "approval_needed" in kinds
            assert kinds[-1] == "end"
            assert events[-1]["data"] == {"status": "waiting"}
            ids_seen = [event["id"].split(".") for event in events if "id" in event]
            assert len({boot for boot, _ in ids_seen}) == 1  # one app process
            assert [int(index) for _, index in ids_seen] == list(range(len(ids_seen)))
            assert {event["data"]["state_id"] for event in events[:1]} == {run_id}

            tree = (await client.get(f"{server.url}/runs/{run_id}")).json()
            assert tree["status"] == "waiting"
            (waiting,) = tree["awaiting"]
            assert waiting["name"] == "send_email"
            (child,) = tree["children"]
            assert waiting["state_id"] == child["id"]
            assert child["parent_id"] == run_id

        # Resuming with Last-Event-ID gives only what came after it.
        run_id, events = results[0]
        ids = [e["id"] for e in events if "id" in e]
        later = await _sse(client, f"{server.url}/runs/{run_id}/events", last_id=ids[3])
        assert [e["id"] for e in later if "id" in e] == ids[4:]

        # Approve one over HTTP: the run continues and finishes; the mail goes out once.
        tree = (await client.get(f"{server.url}/runs/{run_id}")).json()
        call_id = tree["awaiting"][0]["call_id"]
        bad = await client.post(f"{server.url}/runs/{run_id}/calls/nope/approve", json={})
        assert bad.status_code == 404
        assert call_id in bad.json()["error"]  # it names the waiting calls
        done = await client.post(
            f"{server.url}/runs/{run_id}/calls/{call_id}/approve", json={"by": "ann"}
        )
        assert done.status_code == 200
        rest = await _sse(client, f"{server.url}/runs/{run_id}/events", last_id=events[-2]["id"])
        assert rest[-1]["data"] == {"status": "done"}
        assert any(e["event"] == "run_end" and e["data"]["state_id"] == run_id for e in rest)
        final = (await client.get(f"{server.url}/runs/{run_id}")).json()
        assert final["status"] == "done"
        assert final["answer"].startswith("Done:")
    server.stop()
    assert app.outbox.read_text().count("customer@example.com") == 1


async def test_a_run_from_before_a_restart_is_approved_after_it(app: App) -> None:
    first = app.start()
    async with httpx.AsyncClient(timeout=30) as client:
        run_id, events = await _run_until_waiting(client, first.url)
        assert events[-1]["data"] == {"status": "waiting"}, events[-3:]
        first.stop()
        second = app.start()
        tree = (await client.get(f"{second.url}/runs/{run_id}")).json()
        assert tree["status"] == "waiting", tree
        call_id = tree["awaiting"][0]["call_id"]
        denied = await client.post(
            f"{second.url}/runs/{run_id}/calls/{call_id}/deny", json={"by": "ann", "reason": "no"}
        )
        assert denied.status_code == 200
        # A client that saw the first process's events reconnects with its last id: the id of
        # another boot, so it gets the continued run's events from the start, none skipped.
        seen = events[-2]["id"]
        events = await _sse(client, f"{second.url}/runs/{run_id}/events", last_id=seen)
        assert events[0]["event"] == "run_start"
        boot, _, index = events[0]["id"].partition(".")
        assert index == "0"
        assert boot != seen.partition(".")[0]
        assert events[-1]["data"] == {"status": "done"}
        ends = [e for e in events if e["event"] == "tool_end"]
        assert any(e["data"]["outcome"] == "denied" for e in ends)
    second.stop()
    assert not app.outbox.exists()  # denied: nothing was sent
    with SQLiteStore(app.store) as store:
        root = store.load(run_id)
        assert root.answer is not None
        child = root.child(tree["children"][0]["id"])
        decisions = [e.content for e in child.history if e.kind == "approval"]
        assert [(d.approved, d.by, d.reason) for d in decisions] == [(False, "ann", "no")]


async def test_stopping_the_app_cancels_and_saves_its_runs(app: App) -> None:
    server = app.start(latency=30)  # the first model step takes 30 s: still running at the stop
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(server.url + "/runs", json={"prompt": "Slow"})
        run_id = response.json()["id"]
        for _ in range(100):  # until the run has sent its request (stored before it waits)
            with SQLiteStore(app.store) as store:
                if any(e.kind == "model_request" for e in store.load(run_id).history):
                    break
            await anyio.sleep(0.1)
    log = server.stop()
    assert server.process.returncode == 0, log
    with SQLiteStore(app.store) as store:
        state = store.load(run_id)
        errors = [e.content for e in state.history if e.kind == "error"]
        assert errors, [e.kind for e in state.history]
        assert "Cancelled" in errors[-1] or "interrupted" in errors[-1].lower()
