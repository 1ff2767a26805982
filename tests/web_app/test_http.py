"""The example web app over real HTTP: SSE parsed, concurrent runs, restart then decide, cancel."""

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
    """Every server-sent event of `url` until the server ends the stream (the run ended)."""
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
    response = await client.post(base + "/runs", json={"agent": "desk", "input": "Update them"})
    assert response.status_code == 201, response.text
    run_id = response.json()["id"]
    events = await _sse(client, f"{base}/runs/{run_id}/events")
    return run_id, events


def _durable(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [event for event in events if "~" not in event["id"]]  # not live text


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the client side only; the app runs in its own process


async def test_concurrent_runs_stream_events_and_wait_for_approval(app: App) -> None:
    server = app.start()
    async with httpx.AsyncClient(timeout=30) as client:
        page = await client.get(server.url + "/")
        assert page.status_code == 200
        assert "EventSource" in page.text
        assert (await client.get(server.url + "/viewer/")).status_code == 200  # asgi_app's
        results: dict[int, tuple[str, list[Any]]] = {}

        async def one(index: int) -> None:
            results[index] = await _run_until_waiting(client, server.url)

        async with anyio.create_task_group() as group:
            for index in range(5):
                group.start_soon(one, index)
        assert len({run_id for run_id, _ in results.values()}) == 5
        for run_id, events in results.values():
            kinds = [event["event"] for event in events]
            assert kinds[0] == "run_start"
            assert "child_start" in kinds
            assert "approval_needed" in kinds
            assert events[-1]["event"] == "run_end"
            assert events[-1]["data"]["state_id"] == run_id
            assert events[-1]["data"]["stop_kind"] == "approval"
            assert len({event["id"] for event in events}) == len(events)
            children = {e["data"]["state_id"] for e in events if e["event"] == "child_start"}
            (child,) = children
            assert {e["data"]["parent_id"] for e in events if e["data"]["state_id"] == child} == {
                run_id
            }

            info = (await client.get(f"{server.url}/runs/{run_id}")).json()
            assert info["status"] == "waiting"
            (waiting,) = info["waiting"]
            assert waiting["name"] == "send_email"
            assert waiting["state_id"] == child  # the subagent's call, decided at the root

        # Reconnecting with Last-Event-ID gives exactly what came after it.
        run_id, events = results[0]
        stored = _durable(events)
        later = await _sse(client, f"{server.url}/runs/{run_id}/events", last_id=stored[3]["id"])
        assert [e["id"] for e in later] == [e["id"] for e in stored[4:]]

        # Approve over HTTP: the run continues and ends; the mail goes out once.
        call_id = (await client.get(f"{server.url}/runs/{run_id}")).json()["waiting"][0]["call_id"]
        bad = await client.post(f"{server.url}/runs/{run_id}/calls/nope/approve", json={})
        assert bad.status_code == 404
        assert call_id in bad.json()["error"]  # it names the waiting calls
        done = await client.post(
            f"{server.url}/runs/{run_id}/calls/{call_id}/approve", json={"by": "ann"}
        )
        assert done.status_code == 200
        assert done.json()["status"] == "running"
        rest = await _sse(client, f"{server.url}/runs/{run_id}/events", last_id=stored[-1]["id"])
        assert rest[0]["event"] == "run_start"
        assert rest[-1]["event"] == "run_end"
        assert rest[-1]["data"]["answer"].startswith("Done:")
        final = (await client.get(f"{server.url}/runs/{run_id}")).json()
        assert final["status"] == "answered"
        assert final["waiting"] == []
    server.stop()
    assert app.outbox.read_text().count("customer@example.com") == 1


async def test_a_run_from_before_a_restart_is_denied_after_it(app: App) -> None:
    first = app.start()
    async with httpx.AsyncClient(timeout=30) as client:
        run_id, events = await _run_until_waiting(client, first.url)
        assert events[-1]["data"]["stop_kind"] == "approval", events[-3:]
        first.stop()
        second = app.start()
        info = (await client.get(f"{second.url}/runs/{run_id}")).json()
        assert info["status"] == "waiting", info
        (waiting,) = info["waiting"]
        denied = await client.post(
            f"{second.url}/runs/{run_id}/calls/{waiting['call_id']}/deny",
            json={"by": "ann", "reason": "no"},
        )
        assert denied.status_code == 200
        # A client that saw the first process's events reconnects with its last id: the ids
        # of stored events hold across processes, so it continues exactly, nothing repeated.
        seen = events[-1]["id"]
        later = await _sse(client, f"{second.url}/runs/{run_id}/events", last_id=seen)
        assert later[0]["event"] == "run_start"
        assert not {e["id"] for e in later} & {e["id"] for e in events}
        assert later[-1]["event"] == "run_end"
        ends = [e for e in later if e["event"] == "tool_end"]
        assert any(e["data"]["outcome"] == "denied" for e in ends)
    second.stop()
    assert not app.outbox.exists()  # denied: nothing was sent
    with SQLiteStore(app.store) as store:
        root = store.load(run_id)
        assert root.answer is not None
        child = root.child(waiting["state_id"])
        decisions = [e.content for e in child.history if e.kind == "approval"]
        assert [(d.approved, d.by, d.reason) for d in decisions] == [(False, "ann", "no")]


async def test_a_run_is_cancelled_over_http_and_saved(app: App) -> None:
    server = app.start(latency=30)  # the first model step takes 30 s: still running at the cancel
    async with httpx.AsyncClient(timeout=30) as client:
        started = await client.post(server.url + "/runs", json={"agent": "desk", "input": "Slow"})
        run_id = started.json()["id"]
        refused = await client.post(
            f"{server.url}/runs/{run_id}/cancel", json={}, headers={"Origin": "http://evil.example"}
        )
        assert refused.status_code == 403  # another site's page cannot cancel it
        cancelled = await client.post(f"{server.url}/runs/{run_id}/cancel", json={})
        assert cancelled.status_code == 200
        assert cancelled.json()["status"] == "idle"
        events = await _sse(client, f"{server.url}/runs/{run_id}/events")
        assert events[-1]["event"] == "run_end"
        assert events[-1]["data"]["error"]
    server.stop()


async def test_stopping_the_app_cancels_and_saves_its_runs(app: App) -> None:
    server = app.start(latency=30)  # the first model step takes 30 s: still running at the stop
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(server.url + "/runs", json={"agent": "desk", "input": "Slow"})
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
