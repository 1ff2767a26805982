"""Durable events: what a stored history gives equals what the live run reported.

Each test runs a tree with `agent.events` (the live stream), loads every State of the tree from
the store, and checks that the durable events of each State are the live events of the durable
kinds, in order: `seq` and `at` aside, and a `ToolDeferred` moved to its turn's approval stop
(the documented differences).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator import (
    EVENT_ADAPTER,
    Agent,
    Event,
    Message,
    Reporter,
    State,
    StoppedByApproval,
    ToolCall,
    ToolError,
    ToolResultEntry,
    aapprove,
    tool,
)
from orchestrator._apps._durable import (
    LIVE_ONLY,
    EventId,
    HistoryEvents,
    durable_events,
    history_events,
)
from orchestrator.permissions import AllowByName, ApproveLater
from orchestrator.testing import FakeModel, tool_call
from stores import FileStore, MemoryStore

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


@tool
def look(where: str) -> str:
    """Look somewhere."""
    return f"saw {where}"


@tool
def send(to: str) -> str:
    """Send a message."""
    return f"sent to {to}"


@tool
def broken(why: str) -> str:
    """Fail."""
    raise ToolError(f"broken: {why}")


def _plain(event: Event) -> dict[str, Any]:
    return event.model_copy(update={"seq": 0, "at": EPOCH}).model_dump()


def _by_state(events: list[Event]) -> dict[str, list[dict[str, Any]]]:
    """The live events of durable kinds per State, a deferral moved to its approval stop."""
    grouped: dict[str, list[Event]] = defaultdict(list)
    for event in events:
        if event.kind not in LIVE_ONLY:
            grouped[event.state_id].append(event)
    result: dict[str, list[dict[str, Any]]] = {}
    for state_id, items in grouped.items():
        ordered: list[Event] = []
        deferred: list[Event] = []
        for event in items:
            if event.kind == "tool_deferred":
                deferred.append(event)
                continue
            if event.kind == "approval_needed":
                ordered.extend(deferred)
                deferred = []
            ordered.append(event)
        result[state_id] = [_plain(event) for event in ordered]
    return result


def _tree(store: MemoryStore | FileStore, root_id: str) -> list[State]:
    """Every State of the tree under `root_id`, each loaded from `store`."""
    found = [store.load(root_id)]
    for state in found:
        found.extend(store.load(info.id) for info in store.list(parent_id=state.id))
    return found


def _durable(states: list[State]) -> dict[str, list[dict[str, Any]]]:
    result: dict[str, list[dict[str, Any]]] = {}
    for state in states:
        events = history_events(state)
        if events:
            result[state.id] = [_plain(item.event) for item in events]
    return result


async def _live(agent: Agent, state: State) -> list[Event]:
    async with agent.events(state) as events:
        return [event async for event in events]


async def test_a_run_with_tools_and_a_tool_error() -> None:
    store = MemoryStore()
    model = FakeModel(
        [[tool_call("look", where="attic"), tool_call("broken", why="rust")], "found it"]
    )
    agent = Agent(model, tools=[look, broken], store=store, name="finder")
    state = State(id="tools", messages=[Message.user("search")])
    live = await _live(agent, state)
    durable = _durable(_tree(store, "tools"))
    assert durable == _by_state(live)
    kinds = [event["kind"] for event in durable["tools"]]
    assert kinds == ["run_start", "model_reply", "tool_end", "tool_end", "model_reply", "run_end"]
    ends = {event["name"]: event for event in durable["tools"] if event["kind"] == "tool_end"}
    assert ends["broken"]["outcome"] == "error"
    assert ends["broken"]["is_error"] is True
    assert ends["broken"]["result"] == "broken: rust"
    assert durable["tools"][-1]["answer"] == "found it"
    assert durable["tools"][-1]["stop_kind"] == "until"


async def test_parallel_subagents_link_to_their_calls() -> None:
    store = MemoryStore()
    child = Agent(
        FakeModel([tool_call("look", where="cellar"), "child done"]),
        tools=[look],
        name="helper",
        description="Helps",
    )
    calls = [tool_call("helper", task="one"), tool_call("helper", task="two")]
    root = Agent(FakeModel([calls, "root done"]), tools=[child], store=store, name="lead")
    state = State(id="tree", messages=[Message.user("go")])
    live = await _live(root, state)
    states = _tree(store, "tree")
    assert len(states) == 3
    durable = _durable(states)
    assert durable == _by_state(live)
    for loaded in states[1:]:
        events = durable[loaded.id]
        assert [event["kind"] for event in events][:2] == ["child_start", "run_start"]
        assert events[0]["parent_id"] == "tree"
        assert events[0]["call_id"] == loaded.parent_call_id
        assert {event["parent_call_id"] for event in events} == {loaded.parent_call_id}


async def test_an_approval_stop_and_the_approved_resume() -> None:
    store = MemoryStore()

    def mailer(replies: list[Any]) -> Agent:
        return Agent(
            FakeModel(replies),
            tools=[send, look],
            store=store,
            permissions=[AllowByName("look"), ApproveLater("send", reason="mail leaves")],
        )

    state = State(id="mail", messages=[Message.user("mail bob")])
    replies: list[Any] = [[tool_call("send", to="bob"), tool_call("look", where="desk")], "done"]
    first = await _live(mailer(replies), state)
    assert _durable(_tree(store, "mail")) == _by_state(first)
    waiting = [item.event for item in history_events(store.load("mail"))][-3:]
    assert [event.kind for event in waiting] == ["tool_deferred", "approval_needed", "run_end"]
    loaded = store.load("mail")
    (call,) = [call for call in loaded.pending_calls if call.name == "send"]
    await aapprove(loaded, call.id, by="ann")
    second = await _live(mailer(["sent it"]), loaded)
    assert _durable(_tree(store, "mail")) == _by_state(first + second)


async def test_a_subagent_waiting_for_approval() -> None:
    store = MemoryStore()
    child = Agent(
        FakeModel([tool_call("send", to="eve"), "child sent"]),
        tools=[send],
        name="courier",
        description="Sends",
        permissions=[ApproveLater("send")],
    )
    root = Agent(FakeModel([tool_call("courier", task="mail"), "all sent"]), tools=[child])
    root = root.copy(store=store)
    state = State(id="deep", messages=[Message.user("go")])
    first = await _live(root, state)
    assert _durable(_tree(store, "deep")) == _by_state(first)
    loaded = store.load("deep")
    stopped = loaded.stopped
    assert isinstance(stopped, StoppedByApproval)
    await aapprove(loaded, stopped.calls[0].call.id)
    second = await _live(root, loaded)
    assert _durable(_tree(store, "deep")) == _by_state(first + second)


async def test_a_finish_inside_a_turn_ends_the_run_once_the_turn_is_closed() -> None:
    finishing = anyio.Event()

    @tool
    def done(answer: str, state: State) -> str:
        """Give the answer."""
        state.finish(answer)
        return "finished"

    @tool
    async def slow() -> str:
        """Finish after `done`."""
        await finishing.wait()
        return "slow result"

    class _Watch(Reporter):
        def on_tool_end(self, state: State, call: ToolCall, entry: ToolResultEntry) -> None:
            if call.name == "done":
                finishing.set()

    store = MemoryStore()
    calls = [tool_call("slow"), tool_call("done", answer="42")]
    agent = Agent(FakeModel([calls]), tools=[slow, done], store=store, reporter=_Watch())
    state = State(id="finish", messages=[Message.user("go")])
    live = await _live(agent, state)
    durable = _durable(_tree(store, "finish"))
    assert durable == _by_state(live)
    kinds = [event["kind"] for event in durable["finish"]]
    assert kinds == ["run_start", "model_reply", "tool_end", "tool_end", "run_end"]
    assert [event.get("name") for event in durable["finish"][2:4]] == ["done", "slow"]
    assert durable["finish"][-1]["answer"] == "42"
    assert durable["finish"][-1]["stop_kind"] == "finish"
    stop = next(entry.seq for entry in state.history if entry.kind == "stop")
    ended = history_events(state)[-1].id
    assert ended.index > stop  # at the last result of the turn, not at the stop


async def test_a_cancelled_run() -> None:
    started = anyio.Event()

    @tool
    async def slow() -> str:
        """Take forever."""
        started.set()
        await anyio.sleep_forever()
        return "never"

    store = MemoryStore()
    agent = Agent(FakeModel([[tool_call("slow"), tool_call("look", where="x")]]), store=store)
    agent = agent.copy(tools=[slow, look])
    state = State(id="cancelled", messages=[Message.user("go")])
    live: list[Event] = []
    with anyio.CancelScope() as scope:
        async with agent.events(state) as events:
            async for event in events:
                live.append(event)
                if event.kind == "tool_end":
                    await started.wait()
                    scope.cancel()
    durable = _durable(_tree(store, "cancelled"))
    # Leaving cancels the run: the stream ends before its closing events, which the history has.
    events = durable["cancelled"]
    assert [event["kind"] for event in events][-2:] == ["tool_end", "run_end"]
    assert events[-2]["outcome"] == "interrupted"
    assert "interrupted" in events[-1]["error"]
    expected = _by_state(live)["cancelled"]
    assert events[: len(expected)] == expected


async def test_a_failed_run_ends_with_the_same_error() -> None:
    store = MemoryStore()
    agent = Agent(FakeModel([tool_call("look", where="x"), RuntimeError("model down")]))
    agent = agent.copy(tools=[look], store=store)
    state = State(id="failed", messages=[Message.user("go")])
    live: list[Event] = []

    async def follow() -> None:
        async with agent.events(state) as events:
            async for event in events:
                live.append(event)

    with pytest.raises(RuntimeError, match="model down"):
        await follow()
    durable = _durable(_tree(store, "failed"))
    assert durable == _by_state(live)
    assert durable["failed"][-1]["error"] == "RuntimeError: model down"


CRASH = """
import os, sys
import anyio
from orchestrator import Agent, Message, State, tool
from orchestrator.testing import FakeModel, tool_call
from stores import FileStore

seen = anyio.Event()

@tool
def look(where: str) -> str:
    \"\"\"Look somewhere.\"\"\"
    return f"saw {where}"

@tool(parallel=False)  # runs after the others' results are stored
async def deploy(target: str) -> str:
    \"\"\"Deploy to a target.\"\"\"
    await seen.wait()
    os._exit(1)

async def main() -> None:
    store = FileStore(sys.argv[1])
    model = FakeModel([[tool_call("look", where="logs"), tool_call("deploy", target="prod")]])
    agent = Agent(model, tools=[look, deploy], store=store)
    state = State(id="crashed", messages=[Message.user("Deploy")])
    async with agent.events(state) as events:
        async for event in events:
            print(event.model_dump_json(), flush=True)
            if event.kind == "tool_start" and event.name == "deploy":
                seen.set()

anyio.run(main)
"""


async def test_a_crashed_run_recovered_and_resumed(tmp_path: Path) -> None:
    done = subprocess.run(  # noqa: ASYNC221 - the test waits for the crash, nothing else runs
        [sys.executable, "-c", textwrap.dedent(CRASH), str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    crashed = [EVENT_ADAPTER.validate_json(line) for line in done.stdout.splitlines()]
    assert [event.kind for event in crashed][-1] == "tool_start"
    store = FileStore(tmp_path)
    loaded = store.load("crashed")  # the cut-off call closed `unknown`
    agent = Agent(FakeModel(["recovered"]), tools=[look], store=store)
    resumed = await _live(agent, loaded)
    durable = _durable(_tree(store, "crashed"))["crashed"]
    unknown = [event for event in durable if event.get("outcome") == "unknown"]
    assert [event["name"] for event in unknown] == ["deploy"]
    # The recovery's result is in no live stream: the process that ran the call had died.
    assert [event for event in durable if event not in unknown] == _by_state(crashed + resumed)[
        "crashed"
    ]


async def test_a_reload_gives_equal_events_with_the_recorded_times() -> None:
    store = MemoryStore()
    agent = Agent(FakeModel([tool_call("look", where="attic"), "found"]), tools=[look])
    state = State(id="times", messages=[Message.user("search")])
    await agent.copy(store=store).arun(state)
    first = history_events(store.load("times"))
    assert first == history_events(store.load("times"))
    assert first == history_events(state)
    by_seq = {entry.seq: entry.at for entry in state.history}
    assert all(item.event.at == by_seq[item.id.index] for item in first)
    ids = [item.id for item in first]
    assert len(set(ids)) == len(ids)
    assert all(EventId.parse(str(item)) == item for item in ids)


async def test_the_reader_and_the_pure_function_agree() -> None:
    agent = Agent(FakeModel([tool_call("look", where="attic"), "found"]), tools=[look])
    state = State(id="pure")
    await agent.arun(state)
    reader = HistoryEvents("pure")
    progress = reader.progress
    for entry in state.history:
        events, after = durable_events(entry, state_id="pure", before=progress)
        assert reader.read(entry) == events
        now = reader.progress
        assert (now.running, now.ending, now.value.entries) == (
            after.running,
            after.ending,
            after.value.entries,
        )
        progress = after
    assert reader.position == len(state.history)
    with pytest.raises(ValueError, match="position"):
        reader.read(state.history[0])


def test_event_ids_parse_back_and_refuse_other_text() -> None:
    assert str(EventId("a_b-1", 3, 0)) == "a_b-1:3:0"
    assert EventId.parse("a_b-1:3:0") == EventId("a_b-1", 3, 0)
    for bad in ("", "a:1", "a:-1:0", ":1:0", "a:1:x", "a:1:0:0", "a b:1:0", "a:1:0\n"):
        with pytest.raises(ValueError, match="event id"):
            EventId.parse(bad)
