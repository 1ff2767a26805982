"""`asgi_app`: a Runs service over HTTP, its routes and its safe defaults."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from orchestrator import Agent
from orchestrator.apps import SESSION_COOKIE, Runs, asgi_app
from orchestrator.testing import FakeModel, tool_call
from stores import MemoryStore
from tests.apps.serving import serving
from tests.apps.test_runs import GATES, SENT, gate, helper_agent, tree_agent

pytestmark = pytest.mark.anyio

TOKEN = "a-token-long-enough-to-use"


@pytest.fixture(autouse=True)
def _clear() -> None:
    SENT.clear()
    GATES.clear()


JSON = {"Content-Type": "application/json"}


@asynccontextmanager
async def _client(runs: Runs, **options: Any) -> AsyncGenerator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=asgi_app(runs, **options))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        yield client


def _events(body: str) -> list[dict[str, Any]]:
    """The server-sent events of `body`: id, event and parsed data of each."""
    found: list[dict[str, Any]] = []
    for block in body.split("\n\n"):
        fields: dict[str, Any] = {}
        for line in block.splitlines():
            if line.startswith(":"):
                continue
            name, _, value = line.partition(": ")
            fields[name] = value
        if "data" in fields:
            fields["data"] = json.loads(fields["data"])
            found.append(fields)
    return found


async def _wait_done(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    body = (await client.get(f"/runs/{run_id}/events")).text
    assert _events(body)[-1]["event"] == "run_end"
    return (await client.get(f"/runs/{run_id}")).json()


async def test_a_run_started_over_http_is_listed_followed_and_shown() -> None:
    async with Runs([tree_agent()], MemoryStore()) as runs, _client(runs) as client:
        started = await client.post("/runs", json={"agent": "parent", "input": "go"})
        assert started.status_code == 201
        run_id = started.json()["id"]
        assert started.headers["location"] == f"/runs/{run_id}"
        response = await client.get(f"/runs/{run_id}/events")
        assert response.headers["content-type"].startswith("text/event-stream")
        events = _events(response.text)
        assert [e["event"] for e in events][:1] == ["run_start"]
        assert events[-1]["event"] == "run_end"
        assert len({e["id"] for e in events}) == len(events)
        assert {e["data"]["state_id"] for e in events} != {run_id}  # the child's too
        shown = (await client.get(f"/runs/{run_id}")).json()
        assert shown["status"] == "answered"
        assert shown["title"] == "go"
        listed = (await client.get("/runs")).json()
        assert [run["id"] for run in listed] == [run_id]
        assert (await client.get("/runs?limit=0")).json() == []


async def test_last_event_id_continues_exactly_after_that_event() -> None:
    async with Runs([tree_agent()], MemoryStore()) as runs, _client(runs) as client:
        run_id = (await client.post("/runs", json={"agent": "parent", "input": "go"})).json()["id"]
        await _wait_done(client, run_id)  # then no text is live: every event is stored
        every = _events((await client.get(f"/runs/{run_id}/events")).text)
        for at in (0, 3, len(every) - 1):
            again = await client.get(
                f"/runs/{run_id}/events", headers={"Last-Event-ID": every[at]["id"]}
            )
            assert [e["id"] for e in _events(again.text)] == [e["id"] for e in every[at + 1 :]]
        query = await client.get(f"/runs/{run_id}/events", params={"after": every[1]["id"]})
        assert [e["id"] for e in _events(query.text)] == [e["id"] for e in every[2:]]


async def test_approve_and_deny_over_http_continue_the_run() -> None:
    async with Runs([helper_agent()], MemoryStore()) as runs, _client(runs) as client:
        run_id = (
            await client.post("/runs", json={"agent": "helper", "input": "mail al bo"})
        ).json()["id"]
        waiting = await _wait_done(client, run_id)
        assert waiting["status"] == "waiting"
        first, second = waiting["waiting"]
        assert first["name"] == "send"
        assert first["reason"] == "mail leaves the house"
        approved = await client.post(
            f"/runs/{run_id}/calls/{first['call_id']}/approve", json={"by": "ann"}
        )
        assert approved.json()["status"] == "waiting"
        denied = await client.post(
            f"/runs/{run_id}/calls/{second['call_id']}/deny", json={"reason": "no"}
        )
        assert denied.json()["status"] == "running"
        assert (await _wait_done(client, run_id))["status"] == "answered"
        again = await client.post(f"/runs/{run_id}/calls/{first['call_id']}/approve", json={})
        assert again.status_code == 404
        assert "waits" in again.json()["error"]
    assert [first["args"]["to"]] == SENT


async def test_cancel_over_http_stops_the_run_and_saves_it() -> None:
    store = MemoryStore()
    async with Runs([helper_agent()], store) as runs, _client(runs) as client:
        run_id = (await client.post("/runs", json={"agent": "helper", "input": "hold q"})).json()[
            "id"
        ]
        await gate("q").entered.wait()
        cancelled = await client.post(f"/runs/{run_id}/cancel", json={})
        assert cancelled.json()["status"] == "idle"
        again = await client.post(f"/runs/{run_id}/cancel", json={})
        assert again.status_code == 404
    outcomes = [e.outcome for e in store.load(run_id).history if e.kind == "tool_result"]
    assert outcomes == ["interrupted"]


async def test_bad_requests_get_4xx_that_say_what_to_send() -> None:
    async with Runs([helper_agent()], MemoryStore(), max_runs=1) as runs, _client(runs) as client:
        cases: list[tuple[httpx.Response, int, str]] = [
            (await client.post("/runs", content=b"{", headers=JSON), 400, "not valid JSON"),
            (await client.post("/runs", json=[1]), 400, "JSON object"),
            (await client.post("/runs", json={"input": "hi"}), 400, '"agent"'),
            (await client.post("/runs", json={"agent": 3}), 400, "must be a string"),
            (await client.post("/runs", json={"agent": "nobody", "input": "x"}), 404, "nobody"),
            (await client.post("/runs", json={"agent": "helper"}), 409, "give the input"),
            (await client.get("/runs/absent"), 404, "absent"),
            (await client.get("/runs/absent/events"), 404, "absent"),
            (await client.get("/runs?limit=x"), 400, "whole number"),
            (await client.post("/runs/absent/cancel", json={}), 404, "not running"),
            (await client.post("/runs/absent/calls/c1/approve", json={}), 404, "absent"),
            (await client.post("/runs/a/calls/c1/maybe", json={}), 404, "approve or"),
        ]
        for response, status, words in cases:
            assert response.status_code == status, response.text
            assert words in response.json()["error"]
        held = await client.post("/runs", json={"agent": "helper", "input": "hold r"})
        full = await client.post("/runs", json={"agent": "helper", "input": "hold s"})
        assert full.status_code == 429
        assert "max_runs" in full.json()["error"]
        run_id = held.json()["id"]
        bad_id = await client.get(f"/runs/{run_id}/events", headers={"Last-Event-ID": "x"})
        assert bad_id.status_code == 400
        assert "not an event id" in bad_id.json()["error"]
        gate("r").release.set()


async def test_bad_ids_and_empty_input_are_400_naming_what_an_id_is() -> None:
    agui_input: dict[str, Any] = {"threadId": "a b", "runId": "r1", "state": {}, "tools": []}
    agui_input |= {"context": [], "forwardedProps": {}}
    agui_input["messages"] = [{"id": "m1", "role": "user", "content": "hi"}]
    vercel_input: dict[str, Any] = {"id": "a/b", "messages": [{"role": "user", "parts": []}]}
    async with Runs([helper_agent()], MemoryStore()) as runs, _client(runs) as client:
        long = "x" * 129
        for response in (
            await client.get("/runs/a%20b"),
            await client.get(f"/runs/{long}"),
            await client.get("/runs/a%20b/events"),
            await client.post("/runs/a%20b/cancel", json={}),
            await client.post("/runs/a%20b/calls/c1/approve", json={}),
            await client.post("/runs/a%20b/calls/c1/deny", json={}),
            await client.post("/runs", json={"agent": "helper", "input": "x", "state_id": ""}),
            await client.post("/runs", json={"agent": "helper", "input": "x", "state_id": ".."}),
            await client.post("/agents/helper/agui", json=agui_input),
            await client.post("/agents/helper/vercel", json=vercel_input),
        ):
            assert response.status_code == 400, response.text
            assert "1 to 128 ASCII letters, digits" in response.json()["error"]
        empty = await client.post("/runs", json={"agent": "helper", "input": "  "})
        assert empty.status_code == 400
        assert '"input" is empty' in empty.json()["error"]
        assert await runs.list() == []  # nothing was started or saved


ROUTES_THAT_CHANGE = (
    "/runs",
    "/runs/r1/cancel",
    "/runs/r1/calls/c1/approve",
    "/runs/r1/calls/c1/deny",
    "/agents/helper/agui",
    "/agents/helper/vercel",
)


async def test_malformed_bodies_to_every_route_are_4xx_never_500() -> None:
    bodies = [
        b"",
        b"{",
        b"[]",
        b'"text"',
        b"null",
        b"1e999999",
        b"\xff\xfe",
        b"[" * 100_000,  # deeper than the JSON parser goes
        b'{"a":' * 50_000,
        b'{"agent": null, "input": 5, "state_id": [], "by": 3, "reason": {}}',
        b'{"id": "c1", "messages": "x"}',
        b'{"id": "c1", "messages": [1, {"role": "assistant", "parts": [{"state": 1}]}]}',
    ]
    async with Runs([helper_agent()], MemoryStore()) as runs, _client(runs) as client:
        for path in ROUTES_THAT_CHANGE:
            for body in bodies:
                response = await client.post(path, content=body, headers=JSON)
                assert 400 <= response.status_code < 500, (path, body[:40], response.text)
                assert response.json()["error"]
        deep = await client.post("/runs", content=b"[" * 100_000, headers=JSON)
        assert "nests too deeply" in deep.json()["error"]
        assert await runs.list() == []


async def test_every_route_that_changes_runs_checks_origin_json_and_token() -> None:
    store = MemoryStore()
    async with Runs([helper_agent()], store) as runs, _client(runs, token=TOKEN) as client:
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        for path in ROUTES_THAT_CHANGE:
            foreign = await client.post(
                path, json={}, headers=bearer | {"Origin": "http://evil.example"}
            )
            assert foreign.status_code == 403, path
            form = await client.post(
                path,
                content=b"agent=helper",
                headers=bearer | {"Content-Type": "application/x-www-form-urlencoded"},
            )
            assert form.status_code == 415, path
            assert (await client.post(path, json={})).status_code == 401, path
        for path in ("/runs", "/runs/r1", "/runs/r1/events"):
            assert (await client.get(path)).status_code == 401, path
    assert store.list() == []  # nothing was started, decided or cancelled


async def test_the_safe_defaults_refuse_other_hosts_origins_and_bodies() -> None:
    async with Runs([helper_agent()], MemoryStore()) as runs, _client(runs, max_body=64) as client:
        other_host = await client.get("/runs", headers={"Host": "evil.example"})
        assert other_host.status_code == 400
        assert "Host" in other_host.json()["error"]
        assert (await client.get("/runs", headers={"Host": "localhost:8000"})).status_code == 200
        not_json = await client.post("/runs", content=b"agent=helper")
        assert not_json.status_code == 415
        foreign = await client.post(
            "/runs",
            json={"agent": "helper", "input": "x"},
            headers={"Origin": "http://evil.example"},
        )
        assert foreign.status_code == 403
        own = await client.post(
            "/runs",
            json={"agent": "helper", "input": "say x"},
            headers={"Origin": "http://127.0.0.1"},
        )
        assert own.status_code == 201
        large = await client.post("/runs", json={"agent": "helper", "input": "x" * 100})
        assert large.status_code == 413
    async with (
        Runs([helper_agent()], MemoryStore()) as runs,
        _client(runs, origins=["http://ui.example"]) as client,
    ):
        listed = await client.post(
            "/runs",
            json={"agent": "helper", "input": "say y"},
            headers={"Origin": "http://ui.example"},
        )
        assert listed.status_code == 201


async def test_a_token_guards_every_route() -> None:
    async with Runs([helper_agent()], MemoryStore()) as runs, _client(runs, token=TOKEN) as client:
        assert (await client.get("/runs")).status_code == 401
        wrong = await client.get("/runs", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert wrong.headers["www-authenticate"] == "Bearer"
        right = await client.get("/runs", headers={"Authorization": f"Bearer {TOKEN}"})
        assert right.status_code == 200
    with pytest.raises(ValueError, match="at least 16"):
        asgi_app(runs, token="short")


async def test_a_page_signs_in_with_the_token_and_its_cookie_opens_every_route() -> None:
    async with Runs([helper_agent()], MemoryStore()) as runs, _client(runs, token=TOKEN) as client:
        handle = await runs.start("helper", "say hi")
        await handle.wait()
        shell = [await client.get(path) for path in ("/viewer/", "/viewer/static/viewer.js")]
        assert [page.status_code for page in shell] == [200, 200]  # no run data: asks for it
        for path in ("/viewer/api/runs", f"/viewer/events/{handle.state_id}", "/runs"):
            assert (await client.get(path)).status_code == 401, path
        wrong = await client.post("/session", json={"token": "not-the-token-at-all"})
        assert wrong.status_code == 401
        assert "set-cookie" not in wrong.headers
        assert (await client.post("/session", json={})).status_code == 400
        foreign = await client.post(
            "/session", json={"token": TOKEN}, headers={"Origin": "http://evil.example"}
        )
        assert foreign.status_code == 403
        signed = await client.post("/session", json={"token": TOKEN})
        assert signed.status_code == 204
        cookie = signed.headers["set-cookie"]
        assert cookie.startswith(f"{SESSION_COOKIE}={TOKEN};")
        assert {"HttpOnly", "Path=/", "SameSite=strict"} <= {
            part.strip() for part in cookie.split(";")
        }
        assert "Secure" not in cookie
        assert "Max-Age" not in cookie
        assert (await client.get("/runs")).status_code == 200  # the client keeps the cookie
        events = await client.get(f"/viewer/events/{handle.state_id}")
        assert events.status_code == 200
        assert "event: run_end" in events.text
        client.cookies.set(SESSION_COOKIE, "a-forged-cookie-value-here")
        assert (await client.get("/runs")).status_code == 401
        assert (await client.get("/viewer/api/runs")).status_code == 401


async def test_a_session_on_an_app_without_a_token_sets_nothing() -> None:
    async with Runs([helper_agent()], MemoryStore()) as runs, _client(runs) as client:
        answer = await client.post("/session", json={"token": "anything-at-all-here"})
        assert answer.status_code == 204
        assert "set-cookie" not in answer.headers


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # uvicorn serves on asyncio only
async def test_a_client_that_drops_never_stops_the_run_and_reconnects_exactly() -> None:
    store = MemoryStore()
    async with (
        Runs([helper_agent()], store) as runs,
        serving(asgi_app(runs, keepalive=0.05)) as base,
        httpx.AsyncClient(base_url=base) as client,
    ):
        run_id = (await client.post("/runs", json={"agent": "helper", "input": "hold w"})).json()[
            "id"
        ]
        await gate("w").entered.wait()
        seen: list[dict[str, Any]] = []
        keepalives = 0
        async with client.stream("GET", f"/runs/{run_id}/events") as response:
            async for line in response.aiter_lines():
                if line == ": keepalive":
                    keepalives += 1
                if line.startswith("id: "):
                    seen.append({"id": line[4:]})
                if len(seen) == 2 and keepalives:
                    break  # the client goes away mid-run
        assert runs.running == (run_id,)
        gate("w").release.set()
        rest = await client.get(f"/runs/{run_id}/events", headers={"Last-Event-ID": seen[-1]["id"]})
        kinds = [event["event"] for event in _events(rest.text)]
        assert kinds == ["tool_end", "model_reply", "run_end"]
        assert store.load(run_id).answer == "done: released w"


def test_the_app_is_built_without_entering_the_service() -> None:
    runs = Runs([Agent(FakeModel([tool_call("x")]), name="a")], MemoryStore())
    app = asgi_app(runs)
    assert [route.path for route in app.routes][:2] == ["/runs", "/runs"]  # type: ignore[attr-defined]


async def test_protocol_endpoints_refuse_what_they_cannot_use() -> None:
    async with Runs([helper_agent()], MemoryStore()) as runs, _client(runs) as client:
        agui = "/agents/helper/agui"
        vercel = "/agents/helper/vercel"
        base: dict[str, Any] = {"threadId": "t1", "runId": "r1", "state": {}, "tools": []}
        base |= {"context": [], "forwardedProps": {}}
        assistant_only = [{"id": "m1", "role": "assistant", "content": "hi"}]
        nothing: list[Any] = []
        no_parts: list[Any] = [{"role": "user", "parts": nothing}]
        cases: list[tuple[httpx.Response, int, str]] = [
            (await client.post(agui, json={"threadId": "t1"}), 400, "RunAgentInput"),
            (await client.post(agui, json=base | {"messages": nothing}), 400, "no user message"),
            (await client.post(agui, json=base | {"messages": assistant_only}), 400, "no user"),
            (await client.post(vercel, json={"messages": []}), 400, '"id"'),
            (await client.post(vercel, json={"id": "c1", "messages": []}), 400, '"messages"'),
            (
                await client.post(vercel, json={"id": "c1", "messages": [{"role": "system"}]}),
                400,
                "user's",
            ),
            (
                await client.post(vercel, json={"id": "c1", "messages": no_parts}),
                400,
                "no text part",
            ),
            (
                await client.post(
                    vercel,
                    json={
                        "id": "c1",
                        "messages": [
                            {
                                "role": "assistant",
                                "parts": [{"state": "approval-responded", "approval": {"id": 1}}],
                            }
                        ],
                    },
                ),
                400,
                '"approved"',
            ),
            (
                await client.post(
                    "/agents/nobody/agui",
                    json=base | {"messages": [{"id": "u", "role": "user", "content": "x"}]},
                ),
                404,
                "nobody",
            ),
        ]
        for response, status, words in cases:
            assert response.status_code == status, response.text
            assert words in response.json()["error"]
