"""RayRunner on a real local Ray cluster: the local guarantees, child by child.

Run inside a loopback-only network namespace (``scripts/in_netns.sh``; `make unit` does). The
shared store is an SQLite file: PostgreSQL (the store of a real cluster) listens on the outer
loopback, which this namespace cannot reach, and a file on the one disk is shared just as well
by the workers of a local cluster.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from orchestrator import (
    Agent,
    Limits,
    Message,
    Reporter,
    State,
    StoppedByApproval,
    StoppedByLimit,
    ToolCall,
    aapprove,
    awaiting,
)
from orchestrator.otel import OtelReporter
from orchestrator.runners import LocalRunner, RayRunner, Runner
from orchestrator.testing import FakeModel
from stores import MemoryStore, SQLiteStore
from tests.doubles import results
from tests.runners import ray_agents

pytestmark = [pytest.mark.anyio, pytest.mark.ray]

REGISTRY = "tests.runners.ray_agents"
ROOT = Path(__file__).resolve().parents[2]


def lead(
    store: Any, runner: Runner, *tasks: str, answer: str = "done", reporter: Reporter | None = None
) -> Agent:
    """A lead that asks the researcher `tasks` in one turn (parallel calls), then answers."""
    calls = [ToolCall(f"call_lead_{n}", "researcher", {"task": t}) for n, t in enumerate(tasks)]
    return Agent(
        FakeModel([calls, answer]),
        name="lead",
        tools=[ray_agents.researcher(store)],
        store=store,
        runner=runner,
        reporter=reporter,
    )


@pytest.fixture
def runner(ray_cluster: Any) -> Any:
    ray_runner = RayRunner(REGISTRY, actors=2)
    yield ray_runner
    ray_runner.shutdown()


async def test_children_are_linked_answer_and_roll_up_their_usage(
    runner: RayRunner, tmp_path: Path
) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    state = State(messages=[Message.user("go")])
    await lead(store, runner, "turns 3", "turns 2").arun(state)
    first, second = sorted(results(state), key=lambda r: r.call.id)  # in request order
    assert [r.content.content[0].text for r in (first, second)] == [  # type: ignore[union-attr]
        "answer to turns 3",
        "answer to turns 2",
    ]
    for result in (first, second):
        (child_id,) = result.child_ids
        child = state.child(child_id)
        assert (child.parent_id, child.parent_call_id) == (state.id, result.call.id)
        assert store.load(child_id).history == child.history
    assert first.usage.requests == 3
    assert second.usage.requests == 2
    assert state.usage.requests == 2 + 3 + 2
    assert {info.id for info in store.list(parent_id=state.id)} == {
        *first.child_ids,
        *second.child_ids,
    }


async def test_a_remote_child_gets_what_is_left_of_the_limits_and_counts_against_them(
    runner: RayRunner, tmp_path: Path
) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    state = State(messages=[Message.user("go")])
    await lead(store, runner, "turns 5").arun(state, limits=Limits(requests=3))
    (result,) = results(state)
    child = state.child(result.child_ids[0])
    assert child.usage.requests == 2  # the lead's request left 2 of 3 when it started
    assert isinstance(child.stopped, StoppedByLimit)
    assert (child.stopped.limit, child.stopped.maximum) == ("requests", 2)
    assert result.outcome == "error"
    assert "stopped: limit requests=2 of State" in result.content.content[0].text  # type: ignore[union-attr]
    # Its spending counted against the lead: the lead stops, nothing left.
    assert isinstance(state.stopped, StoppedByLimit)
    assert (state.stopped.limit, state.stopped.spent, state.stopped.owner) == (
        "requests",
        3,
        state.id,
    )
    assert store.load(state.id).stopped == state.stopped


async def test_ray_children_spending_together_past_the_leads_limit_are_stopped_while_they_run(
    runner: RayRunner, tmp_path: Path
) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    state = State(messages=[Message.user("go")])
    limit = 2200  # 20 of the spender's replies; each child alone was given all of it
    calls = [ToolCall(f"call_lead_{n}", "spender", {"task": "spend 60"}) for n in range(2)]
    spending_lead = Agent(
        FakeModel([calls, "done"]),
        name="lead",
        tools=[ray_agents.spender(store)],
        store=store,
        runner=runner,
    )
    await spending_lead.arun(state, limits=Limits(total_tokens=limit))
    found = results(state)
    kids = [store.load(result.child_ids[0]) for result in found]
    for result, kid in zip(found, kids, strict=True):
        assert result.outcome == "error"
        assert "was stopped: limit total_tokens=" in result.content.content[0].text  # type: ignore[union-attr]
        assert kid.answer != "spent"  # stopped while it ran, not after
        assert not isinstance(kid.stopped, StoppedByLimit)  # by the lead, not by itself
        assert not kid.pending_calls
    spent = sum(kid.usage.input_tokens + kid.usage.output_tokens for kid in kids)
    assert limit <= spent < 1.5 * limit  # counted only when they ended, they spend 2 x limit
    stopped = state.stopped
    assert isinstance(stopped, StoppedByLimit)
    assert (stopped.limit, stopped.spent) == ("total_tokens", spent)  # each reply counted once
    assert stopped.by in {kid.id for kid in kids}
    assert store.load(state.id).stopped == stopped


def effects(db: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(db) as connection:
        rows = connection.execute("SELECT agent, effect FROM memory_effects ORDER BY effect")
        found = [(str(agent), str(effect)) for agent, effect in rows]
    connection.close()
    return found


async def test_memory_effect_keys_are_the_ones_of_a_local_run(
    runner: RayRunner, tmp_path: Path
) -> None:
    keys: list[list[tuple[str, str]]] = []
    for name, each in (("local", LocalRunner()), ("ray", runner)):
        db = tmp_path / f"{name}.db"
        store = SQLiteStore(db)
        state = State(id="lead", messages=[Message.user("go")])
        await lead(store, each, "remember a", "remember b").arun(state)
        store.close()
        keys.append(effects(db))
    local, remote = keys
    assert len(local) == 2
    assert remote == local


async def wait_for_file(path: Path) -> str:
    """The text of `path` once it exists (polled, 60 s at most).

    Polled: another process writes it, so there is no event to wait on.
    """
    with anyio.fail_after(60):
        while not (await anyio.Path(path).exists() and await anyio.Path(path).read_text()):  # noqa: ASYNC110
            await anyio.sleep(0.05)
        return await anyio.Path(path).read_text()


async def test_cancelling_the_parent_stops_the_remote_child_which_records_interrupted(
    runner: RayRunner, tmp_path: Path
) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    marker = tmp_path / "waiting"
    state = State(messages=[Message.user("go")])
    async with anyio.create_task_group() as group:
        group.start_soon(lead(store, runner, f"wait {marker}").arun, state)
        await wait_for_file(marker)
        group.cancel_scope.cancel()
    (result,) = results(state)
    assert result.outcome == "interrupted"
    (child_id,) = result.child_ids
    child = store.load(child_id)  # saved by the worker before the parent's call returned
    assert [r.outcome for r in results(child)] == ["interrupted"]
    assert child.parent_call_id == result.call.id


async def test_a_worker_killed_by_sigkill_is_never_retried_and_the_parent_gets_an_error(
    runner: RayRunner, tmp_path: Path
) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    marker = tmp_path / "dying"
    state = State(messages=[Message.user("go")])
    await lead(store, runner, f"die {marker}", answer="noted").arun(state)
    (result,) = results(state)
    (child_id,) = result.child_ids
    assert result.outcome == "error"
    text = result.content.content[0].text  # type: ignore[union-attr]
    assert f"child State {child_id}" in text
    assert "died" in text
    assert marker.exists()
    marker.unlink()
    child = SQLiteStore(tmp_path / "runs.db").load(child_id)  # as saved: unknown, on disk
    assert [r.outcome for r in results(child)] == ["unknown"]
    assert child.usage.requests == 1
    assert result.usage.requests == 1  # rolled up
    # Never retried: the tool did not run again; and the next child gets a new worker.
    again = State(messages=[Message.user("go")])
    await lead(store, runner, "turns 1").arun(again)
    assert results(again)[0].outcome == "done"
    assert not marker.exists()


async def test_a_worker_that_dies_before_the_childs_first_save_gives_an_error_and_no_state(
    runner: RayRunner, tmp_path: Path
) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    marker = tmp_path / "vanished"
    state = State(messages=[Message.user("go")])
    await lead(store, runner, f"vanish {marker}", answer="noted").arun(state)
    assert marker.exists()  # the worker got the job, and died as the child's run started
    (result,) = results(state)
    assert result.outcome == "error"
    text = result.content.text
    assert "died" in text
    assert "nothing of it was saved" in text
    child_id = text.split("child State ")[1].split(" ")[0]
    with pytest.raises(LookupError):
        store.load(child_id)  # never saved, and not made up afterwards
    assert state.answer == "noted"  # the parent ran on and answered
    # Never retried: the next child gets a new worker and runs.
    again = State(messages=[Message.user("go")])
    await lead(store, runner, "turns 1").arun(again)
    assert results(again)[0].outcome == "done"


async def test_a_remote_childs_approval_stops_the_parent_and_the_decision_reaches_it(
    runner: RayRunner, tmp_path: Path
) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    out = tmp_path / "published"
    boss = Agent(
        FakeModel([ToolCall("call_boss", "publisher", {"task": f"publish {out}"}), "boss done"]),
        name="lead",
        tools=[ray_agents.publisher(store)],
        store=store,
        runner=runner,
    )
    state = State(id="boss", messages=[Message.user("go")])
    await boss.arun(state)
    assert isinstance(state.stopped, StoppedByApproval)
    (waiting,) = awaiting(state)  # the remote child's call, shown at the root
    assert waiting.call.name == "publish"
    assert waiting.via == "call_boss"
    assert not out.exists()
    child_id = waiting.state_id
    assert store.load(child_id).parent_id == "boss"  # saved by the worker, waiting

    loaded = store.load("boss")  # later, as another request would
    await aapprove(loaded, waiting.call.id, by="ann")
    assert await boss.arun(loaded) == "boss done"
    assert out.read_text() == "published\n"  # ran once, on a worker
    (result,) = results(loaded)
    assert result.child_ids == (child_id,)  # the same child continued, not a new one
    assert store.load(child_id).answer == "publisher done"


def test_a_store_without_url_or_an_unknown_agent_is_refused_before_anything_is_sent() -> None:
    # No cluster: the check comes first, so nothing is sent (nor Ray started).
    runner = RayRunner(REGISTRY)
    state = State(messages=[Message.user("go")])
    with pytest.raises(ValueError, match="has no URL the workers can open"):
        lead(MemoryStore(), runner, "turns 1").run(state)
    stranger = Agent(FakeModel([]), name="stranger", description="Not in the registry")
    boss = Agent(
        FakeModel([ToolCall("c1", "stranger", {"task": "x"})]),
        tools=[stranger],
        store=SQLiteStore(":memory:"),
        runner=runner,
    )
    with pytest.raises(ValueError, match=r"registry 'tests\.runners\.ray_agents' has no agent"):
        boss.run("go")


# The parent process: its RayRunner joins the running cluster itself (`address="auto"`).
DRIVER = """
import sys
import anyio
from orchestrator import Message, State
from orchestrator.runners import RayRunner
from stores import SQLiteStore
from tests.runners.test_ray import lead

state = State(id="lead", messages=[Message.user("go")])
store = SQLiteStore(sys.argv[1])
runner = RayRunner("tests.runners.ray_agents", address="auto")
anyio.run(lead(store, runner, "wait " + sys.argv[2]).arun, state)
"""


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_killed_parent_leaves_children_that_stop_and_resume_from_the_store(
    ray_cluster: Any, tmp_path: Path
) -> None:
    db, marker = tmp_path / "runs.db", tmp_path / "waiting"
    driver = await anyio.open_process(
        [sys.executable, "-c", textwrap.dedent(DRIVER), str(db), str(marker)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=None,
        stderr=None,
    )
    try:
        worker_pid = int(await wait_for_file(marker))
    finally:
        driver.send_signal(signal.SIGKILL)
        await driver.wait()
    with anyio.fail_after(60):  # Ray kills the actors of a dead owner (polled: another process)
        while pid_alive(worker_pid):  # noqa: ASYNC110
            await anyio.sleep(0.1)
    marker.unlink()

    store = SQLiteStore(db)
    state = store.load("lead")
    (cut,) = results(state)
    assert cut.outcome == "unknown"
    runner = RayRunner(REGISTRY)
    try:
        agent = Agent(
            FakeModel(["the lead's answer"]),
            name="lead",
            tools=[ray_agents.researcher(store)],
            store=store,
            runner=runner,
        )
        assert await agent.arun(state) == "the lead's answer"
    finally:
        runner.shutdown()
    assert not marker.exists()  # the child's cut-off `wait` was not run again
    delivered = results(state)[-1]
    assert (delivered.late, delivered.outcome) == (True, "done")
    assert delivered.content.content[0].text == f"answer to wait {marker}"  # type: ignore[union-attr]
    child = store.load(cut.child_ids[0])
    assert [r.outcome for r in results(child)] == ["unknown"]
    assert child.answer == f"answer to wait {marker}"


async def test_a_remote_child_run_span_hangs_under_the_parent_call_span(
    ray_cluster: Any, tmp_path: Path
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    store = SQLiteStore(tmp_path / "runs.db")
    runner = RayRunner(f"{REGISTRY}:traced", actors=1)
    try:
        reporter = OtelReporter(tracer_provider=provider)
        await lead(store, runner, "turns 2", reporter=reporter).arun("go")
    finally:
        runner.shutdown()
    (call,) = [s for s in exporter.get_finished_spans() if s.name == "execute_tool researcher"]
    context = call.get_span_context()
    assert context is not None
    lines = (tmp_path / "spans.jsonl").read_text().splitlines()
    remote = {span["name"]: span for span in map(json.loads, lines)}  # the worker's spans
    run = remote["invoke_agent researcher"]
    assert (run["trace_id"], run["parent_id"]) == (
        f"{context.trace_id:032x}",
        f"{context.span_id:016x}",
    )
    assert remote["execute_tool note"]["parent_id"] == run["span_id"]
    assert remote["execute_tool note"]["trace_id"] == run["trace_id"]


async def test_remote_childrens_events_reach_the_roots_stream(
    runner: RayRunner, tmp_path: Path
) -> None:
    from orchestrator.apps import Runs

    store = SQLiteStore(tmp_path / "runs.db")
    async with Runs([lead(store, runner, "turns 2", "turns 1")], store) as runs:
        handle = await runs.start("lead", "go")
        followed = [item async for item in handle.follow()]
    root = handle.state_id
    children = {item.event.state_id for item in followed} - {root}
    assert len(children) == 2
    for child in children:
        kinds = [item.event.kind for item in followed if item.event.state_id == child]
        assert kinds[:2] == ["child_start", "run_start"]
        assert kinds[-1] == "run_end"
        assert {item.event.parent_id for item in followed if item.event.state_id == child} == {root}
    assert followed[-1].event.kind == "run_end"
    assert followed[-1].event.state_id == root
    store.close()
