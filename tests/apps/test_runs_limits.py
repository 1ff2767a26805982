"""Limits on the runs of a `Runs` service: `start(limits=)` and ``POST /runs {"limits"}``.

A caller's limits join the agent's own (the tighter of each field holds), so a caller can
tighten what an agent may spend, never loosen it. The spending is in the history, so a run
started again on its State keeps its budget; a decision continues a run under its limits.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator import Agent, Limits, StoppedByApproval, StoppedByLimit, tool
from orchestrator.apps import Runs, asgi_app
from orchestrator.testing import FakeModel, tool_call
from stores import MemoryStore, SQLiteStore
from tests.apps.test_asgi import JSON
from tests.apps.test_runs import GATES, SENT, helper_agent

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _clear() -> None:
    SENT.clear()
    GATES.clear()


@tool
def noop() -> str:
    """Do nothing."""
    return "nothing done"


def busy_agent(limits: Limits | None = None, name: str = "busy") -> Agent:
    """An agent whose model calls `noop` on every request: it runs until a limit stops it."""
    return Agent(FakeModel([tool_call("noop")] * 50), name=name, tools=[noop], limits=limits)


def talker() -> Agent:
    """An agent that answers each message with one request."""
    return Agent(FakeModel(["ok"] * 50), name="talker")


def tree() -> Agent:
    """A parent whose one request starts a busy child: the child spends the parent's budget."""
    return Agent(
        FakeModel([tool_call("busy", task="work"), "parent done"]),
        name="parent",
        tools=[busy_agent().as_tool(description="Works until stopped")],
    )


# Runs.start ------------------------------------------------------------------------------------


async def test_a_run_started_with_limits_stops_at_them_and_says_so_in_get_and_events() -> None:
    async with Runs([busy_agent()], MemoryStore()) as runs:
        handle = await runs.start("busy", "go", limits=Limits(requests=3))
        info = await handle.wait()
        ended = [item.event async for item in handle.follow() if item.event.kind == "run_end"]
    assert info.status == "stopped"
    assert info.stopped == StoppedByLimit(
        limit="requests", maximum=3, spent=3, owner=handle.state_id, by=handle.state_id
    )
    assert info.usage.requests == 3
    (end,) = ended
    assert end.model_dump()["stop_kind"] == "limit"
    assert f"limit requests=3 of State {handle.state_id} reached" in end.model_dump()["stopped"]
    assert end.model_dump()["limit"] == {
        "name": "requests",
        "maximum": 3,
        "spent": 3,
        "owner": handle.state_id,
        "by": handle.state_id,
    }


async def test_a_childs_spending_stops_the_tree_at_the_limit_of_the_run() -> None:
    store = MemoryStore()
    async with Runs([tree()], store) as runs:
        handle = await runs.start("parent", "go", limits=Limits(requests=4))
        info = await handle.wait()
        ends = {
            item.event.state_id: item.event.model_dump()
            async for item in handle.follow()
            if item.event.kind == "run_end"
        }
    (child_id,) = store.load(handle.state_id).children
    child = store.load(child_id)
    assert child.stopped == StoppedByLimit(
        limit="requests", maximum=4, spent=4, owner=handle.state_id, by=child_id
    )
    assert child.usage.requests == 3  # the parent's first request, then three of the child's
    assert isinstance(info.stopped, StoppedByLimit)
    assert (info.stopped.limit, info.stopped.owner) == ("requests", handle.state_id)
    assert info.usage.requests == 4
    assert ends[child_id]["stop_kind"] == "limit"
    assert f"the last by State {child_id}" in ends[child_id]["stopped"]
    assert ends[child_id]["limit"] == {
        "name": "requests",
        "maximum": 4,
        "spent": 4,
        "owner": handle.state_id,
        "by": child_id,
    }
    assert ends[handle.state_id]["limit"]["owner"] == handle.state_id


async def test_a_callers_limits_tighten_the_agents_own_and_never_loosen_them() -> None:
    async with Runs([busy_agent(Limits(requests=2))], MemoryStore()) as runs:
        looser = await (await runs.start("busy", "go", limits=Limits(requests=100))).wait()
        tighter = await (await runs.start("busy", "go", limits=Limits(requests=1))).wait()
        other = await (await runs.start("busy", "go", limits=Limits(total_tokens=10**6))).wait()
    for info, most in ((looser, 2), (tighter, 1), (other, 2)):
        assert isinstance(info.stopped, StoppedByLimit)
        assert (info.stopped.limit, info.stopped.maximum, info.usage.requests) == (
            "requests",
            most,
            most,
        )


async def test_a_run_started_again_keeps_its_budget_also_in_a_new_service(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.db"
    two = Limits(requests=2)
    with SQLiteStore(path) as store:
        async with Runs([talker()], store) as runs:
            first = await (await runs.start("talker", "a", state_id="chat", limits=two)).wait()
            second = await (await runs.start("talker", "b", state_id="chat", limits=two)).wait()
    assert (first.status, second.status, second.usage.requests) == ("answered", "answered", 2)
    with SQLiteStore(path) as store:  # another service, as after a restart: the budget goes on
        async with Runs([talker()], store) as runs:
            used_up = await (await runs.start("talker", "c", state_id="chat", limits=two)).wait()
            raised = Limits(requests=3)
            more = await (await runs.start("talker", "d", state_id="chat", limits=raised)).wait()
    assert used_up.status == "stopped"
    assert used_up.stopped == StoppedByLimit(
        limit="requests", maximum=2, spent=2, owner="chat", by="chat"
    )
    assert used_up.usage.requests == 2  # refused before the request was sent
    assert (more.status, more.usage.requests) == ("answered", 3)


async def test_a_decision_continues_the_run_under_the_limits_it_started_with() -> None:
    async with Runs([helper_agent()], MemoryStore()) as runs:
        handle = await runs.start("helper", "mail bob", limits=Limits(requests=1))
        waiting = (await handle.wait()).stopped
        assert isinstance(waiting, StoppedByApproval)
        await runs.approve(handle.state_id, waiting.calls[0].call.id)
        done = await runs.wait(handle.state_id)
        again = await runs.start("helper", "mail al", state_id=handle.state_id)  # no limits now
        assert (await again.wait()).status == "waiting"
    assert SENT == ["bob"]  # the approved call ran; the request after it was over the limit
    assert isinstance(done.stopped, StoppedByLimit)
    assert (done.stopped.limit, done.stopped.maximum) == ("requests", 1)


async def test_a_decision_in_another_service_continues_the_run_under_its_limits(
    tmp_path: Path,
) -> None:
    """The limits are in the run's history: a service that did not start the run applies them."""
    path = tmp_path / "runs.db"
    async with SQLiteStore(path) as store, Runs([helper_agent()], store) as first:
        handle = await first.start("helper", "mail bob", limits=Limits(requests=1))
        waiting = (await handle.wait()).stopped
    assert isinstance(waiting, StoppedByApproval)
    async with SQLiteStore(path) as store, Runs([helper_agent()], store) as second:
        await second.approve(handle.state_id, waiting.calls[0].call.id)
        done = await second.wait(handle.state_id)
    assert SENT == ["bob"]  # the approved call ran; the request after it was over the limit
    assert isinstance(done.stopped, StoppedByLimit)
    assert (done.stopped.limit, done.stopped.maximum) == ("requests", 1)


async def test_start_refuses_limits_that_are_not_limits() -> None:
    async with Runs([talker()], MemoryStore()) as runs:
        with pytest.raises(TypeError, match=r"limits=Limits\(total_tokens=100_000\)"):
            await runs.start("talker", "hi", limits={"requests": 1})  # type: ignore[arg-type]
        assert runs.running == ()


# POST /runs ------------------------------------------------------------------------------------


@asynccontextmanager
async def _client(runs: Runs) -> AsyncGenerator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=asgi_app(runs))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        yield client


async def _finished(client: httpx.AsyncClient, runs: Runs, body: dict[str, Any]) -> dict[str, Any]:
    started = await client.post("/runs", json=body, headers=JSON)
    assert started.status_code == 201, started.text
    run_id = started.json()["id"]
    await runs.wait(run_id)
    return (await client.get(f"/runs/{run_id}")).json()


async def test_http_limits_stop_the_run_and_its_json_names_the_limit() -> None:
    async with Runs([busy_agent()], MemoryStore()) as runs, _client(runs) as client:
        body = {"agent": "busy", "input": "go", "limits": {"requests": 2, "cost": None}}
        shown = await _finished(client, runs, body)
        events = (await client.get(f"/runs/{shown['id']}/events")).text
    assert shown["status"] == "stopped"
    assert shown["stop_kind"] == "limit"
    assert shown["limit"] == {
        "name": "requests",
        "maximum": 2,
        "spent": 2,
        "owner": shown["id"],
        "by": shown["id"],
    }
    assert shown["usage"]["requests"] == 2
    (end,) = [
        json.loads(line.removeprefix("data: "))
        for line in events.splitlines()
        if line.startswith("data: ") and '"run_end"' in line
    ]
    assert (end["stop_kind"], end["limit"]) == ("limit", shown["limit"])


async def test_http_limits_can_only_tighten_the_agents_own() -> None:
    async with Runs([busy_agent(Limits(requests=1))], MemoryStore()) as runs, _client(runs) as c:
        asked = {"agent": "busy", "input": "go", "limits": {"requests": 9}}
        shown = await _finished(c, runs, asked)
        plain = await _finished(c, runs, {"agent": "busy", "input": "go"})
    assert shown["limit"]["maximum"] == plain["limit"]["maximum"] == 1
    assert shown["usage"]["requests"] == 1


async def test_a_run_json_without_a_limit_stop_has_no_limit() -> None:
    async with Runs([talker()], MemoryStore()) as runs, _client(runs) as client:
        shown = await _finished(client, runs, {"agent": "talker", "input": "hi", "limits": None})
    assert (shown["status"], shown["limit"]) == ("answered", None)


@pytest.mark.parametrize(
    ("limits", "says"),
    [
        (5, '"limits" must be a JSON object such as {"total_tokens": 20000}'),
        ([1], '"limits" must be a JSON object'),
        ({"tokens": 5}, '"limits" has no field "tokens": use input_tokens, output_tokens,'),
        ({"requests": -1}, '"limits.requests" must be a whole number >= 0, or null'),
        ({"requests": 1.5}, '"limits.requests" must be a whole number >= 0'),
        ({"tool_calls": True}, '"limits.tool_calls" must be a whole number >= 0'),
        ({"cost": "1"}, '"limits.cost" must be a number >= 0, or null for no limit, got "1"'),
        ({"seconds": -0.5}, '"limits.seconds" must be a number >= 0'),
    ],
)
async def test_bad_http_limits_get_a_400_that_says_how_to_fix_them(limits: Any, says: str) -> None:
    store = MemoryStore()
    async with Runs([talker()], store) as runs, _client(runs) as client:
        answer = await client.post(
            "/runs", json={"agent": "talker", "input": "hi", "limits": limits}, headers=JSON
        )
    assert answer.status_code == 400
    assert says in answer.json()["error"]
    assert store.list() == []  # nothing started, nothing saved


async def test_a_nan_limit_sent_as_json_is_refused() -> None:
    async with Runs([talker()], MemoryStore()) as runs, _client(runs) as client:
        answer = await client.post(
            "/runs",
            content=b'{"agent": "talker", "input": "hi", "limits": {"cost": NaN}}',
            headers=JSON,
        )
    assert answer.status_code == 400
    assert '"limits.cost" must be a number >= 0' in answer.json()["error"]
