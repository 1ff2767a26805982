"""`agent.events`: typed JSON events of a run and its subagents, bounded, cancelled on leave."""

from __future__ import annotations

import json
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from orchestrator import (
    EVENT_ADAPTER,
    Agent,
    Message,
    Reporter,
    State,
    tool,
)
from orchestrator.models import Model, Request
from orchestrator.testing import FakeModel, tool_call
from stores import MemoryStore

pytestmark = pytest.mark.anyio


@tool
def look(where: str) -> str:
    """Look somewhere."""
    return f"saw {where}"


class _Streaming(Model):
    """A model that streams its reply in three chunks."""

    @property
    def name(self) -> str:
        return "streaming"

    @property
    def context_window(self) -> int:
        return 1000

    def __init__(self) -> None:
        self.inner = FakeModel(["Hello there friend"])

    async def respond(self, request: Request, *, on_text: Any = None) -> Any:
        if on_text is not None:
            for chunk in ("Hello ", "there ", "friend"):
                on_text(chunk)
        return await self.inner.respond(request)


async def test_events_cover_the_run_in_order_as_json() -> None:
    agent = Agent(FakeModel([tool_call("look", where="attic"), "found it"]), tools=[look])
    async with agent.events("search") as events:
        seen = [event async for event in events]
    kinds = [event.kind for event in seen]
    assert kinds == [
        "run_start",
        "model_reply",
        "tool_start",
        "tool_end",
        "text",
        "model_reply",
        "run_end",
    ]
    assert [event.seq for event in seen] == list(range(len(seen)))
    state_id = events.state.id
    assert {event.state_id for event in seen} == {state_id}
    start, end = seen[2], seen[3]
    assert start.kind == "tool_start"
    assert start.args == {"where": "attic"}
    assert end.kind == "tool_end"
    assert end.result == "saw attic"
    assert end.outcome == "done"
    assert start.call_id == end.call_id is not None
    assert seen[-1].kind == "run_end"
    assert seen[-1].answer == "found it"
    for event in seen:  # every event goes to JSON and back unchanged
        assert EVENT_ADAPTER.validate_json(event.model_dump_json()) == event
        json.loads(event.model_dump_json())


async def test_text_deltas_stream() -> None:
    agent = Agent(_Streaming())
    async with agent.events("hi") as events:
        texts = [event.text async for event in events if event.kind == "text"]
    assert texts == ["Hello ", "there ", "friend"]


async def test_subagent_events_carry_their_links() -> None:
    child = Agent(FakeModel(["child answer"]), name="helper", description="Helps")
    root = Agent(FakeModel([tool_call("helper", task="help"), "root answer"]), tools=[child])
    async with root.events("go") as events:
        seen = [event async for event in events]
    root_id = events.state.id
    started = [event for event in seen if event.kind == "child_start"]
    assert len(started) == 1
    child_id = started[0].state_id
    assert started[0].parent_id == root_id
    assert started[0].agent == "helper"
    child_events = [event for event in seen if event.state_id == child_id]
    assert [event.kind for event in child_events] == [
        "child_start",
        "run_start",
        "text",
        "model_reply",
        "run_end",
    ]
    assert all(event.parent_id == root_id for event in child_events)
    assert started[0].call_id == next(e.call_id for e in seen if e.kind == "tool_start")


async def test_the_agents_own_reporter_keeps_working() -> None:
    calls: list[str] = []

    class Recorder(Reporter):
        def on_run_start(self, state: State) -> None:
            calls.append("start")

        def on_run_end(self, state: State, error: BaseException | None) -> None:
            calls.append("end")

    agent = Agent(FakeModel(["hi"]), reporter=Recorder())
    async with agent.events("hello") as events:
        kinds = [event.kind async for event in events]
    assert calls == ["start", "end"]
    assert kinds[0] == "run_start"
    assert kinds[-1] == "run_end"


async def test_a_consumer_that_reads_nothing_holds_the_run_at_the_buffer() -> None:
    """The run waits once `buffer` events are unread: the buffer never grows past a step."""
    turns = 40
    replies: list[Any] = [tool_call("look", where=str(i)) for i in range(turns)] + ["done"]
    agent = Agent(FakeModel(replies), tools=[look], max_turns=turns + 5)
    async with agent.events("go", buffer=4) as events:
        await anyio.wait_all_tasks_blocked()
        held = events.state.turn
        first = [await events.__anext__() for _ in range(3)]
        rest = [event async for event in events]
    assert held < 5  # without a reader, the run stopped within a few turns
    assert first[0].kind == "run_start"
    assert rest[-1].kind == "run_end"
    assert rest[-1].answer == "done"
    assert events.state.turn == turns + 1


async def test_text_joins_when_the_buffer_is_full() -> None:
    agent = Agent(_Streaming())
    async with agent.events("hi", buffer=1) as events:
        await anyio.wait_all_tasks_blocked()
        seen = [event async for event in events]
    text = "".join(event.text for event in seen if event.kind == "text")
    assert text == "Hello there friend"
    assert len([event for event in seen if event.kind == "text"]) < 3


async def test_leaving_early_cancels_closes_and_saves_the_run() -> None:
    started = anyio.Event()

    @tool
    async def slow() -> str:
        """Take forever."""
        started.set()
        await anyio.sleep_forever()
        return "never"

    store = MemoryStore()
    agent = Agent(FakeModel([tool_call("slow")]), tools=[slow], store=store)
    state = State(id="left-early", messages=[Message.user("go")])
    async with agent.events(state) as events:
        async for event in events:
            if event.kind == "tool_start":
                await started.wait()
                break
    assert state.pending_calls == ()
    result = next(entry for entry in state.history if entry.kind == "tool_result")
    assert result.outcome == "interrupted"
    stored = store.load("left-early")
    assert stored.history == state.history


async def test_a_failed_run_raises_after_its_last_event() -> None:
    agent = Agent(FakeModel([RuntimeError("model down")]))
    seen: list[str] = []

    async def consume() -> None:
        async with agent.events("go") as events:
            async for event in events:
                seen.append(event.kind)

    with pytest.raises(RuntimeError, match="model down"):
        await consume()
    assert seen[-1] == "run_end"


async def test_buffer_must_be_positive() -> None:
    agent = Agent(FakeModel(["hi"]))
    with pytest.raises(ValueError, match="buffer"):
        async with agent.events("go", buffer=0):
            pass


@tool
async def find(where: str) -> str:
    """Find something somewhere (async)."""
    await anyio.lowlevel.checkpoint()
    return f"found {where}"


class _Sampler(Reporter):
    """Sees each step just before the stream does: the most events the stream held unread."""

    def __init__(self) -> None:
        self.events: Any = None
        self.most = 0

    def _sample(self) -> None:
        if self.events is not None:
            self.most = max(self.most, self.events.unread)

    def on_run_start(self, state: State) -> None:
        self._sample()

    def on_think_end(self, state: State, reply: Any) -> None:
        self._sample()

    def on_tool_start(self, state: State, call: Any) -> None:
        self._sample()

    def on_tool_end(self, state: State, call: Any, entry: Any) -> None:
        self._sample()

    def on_child_start(self, parent: State, call: Any, child: State) -> None:
        self._sample()

    def on_run_end(self, state: State, error: BaseException | None) -> None:
        self._sample()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tool_kind", ["async", "sync"])
async def test_the_buffer_bounds_a_turn_of_2000_calls(tool_kind: str) -> None:
    """A consumer that reads nothing during a 2,000-call turn holds the run at the buffer."""
    calls = [
        tool_call("find" if tool_kind == "async" else "look", where=str(i)) for i in range(2000)
    ]
    sampler = _Sampler()
    agent = Agent(FakeModel([calls, "done"]), tools=[look, find], reporter=sampler)
    async with agent.events("go", buffer=16) as events:
        sampler.events = events
        await anyio.wait_all_tasks_blocked()
        held = events.unread
        seen = [event async for event in events]
    assert events.bound == 16 + 3
    assert held <= events.bound
    assert sampler.most <= events.bound
    assert [event.seq for event in seen] == list(range(len(seen)))  # nothing lost, in order
    starts = [str(event.call_id) for event in seen if event.kind == "tool_start"]
    ends = [str(event.call_id) for event in seen if event.kind == "tool_end"]
    assert sorted(starts) == sorted(ends) == sorted(call.id for call in calls)
    where = {event.call_id: index for index, event in enumerate(seen) if event.kind == "tool_start"}
    assert all(
        where[event.call_id] < index for index, event in enumerate(seen) if event.kind == "tool_end"
    )
    assert seen[-1].kind == "run_end"
    assert seen[-1].answer == "done"
    assert len(seen) == 2 * 2000 + 5  # run start, two replies, text, run end


@pytest.mark.timeout(60)
async def test_the_buffer_bounds_a_turn_of_many_subagents() -> None:
    """Each subagent's start, replies and end wait for room too: the bound holds for a tree."""
    count = 300
    child = Agent(FakeModel(["child answer"] * count), name="helper", description="Helps")
    calls = [tool_call("helper", task=str(i)) for i in range(count)]
    sampler = _Sampler()
    root = Agent(FakeModel([calls, "root answer"]), tools=[child], reporter=sampler)
    async with root.events("go", buffer=8) as events:
        sampler.events = events
        await anyio.wait_all_tasks_blocked()
        held = events.unread
        seen = [event async for event in events]
    assert held <= events.bound == 8 + 3
    assert sampler.most <= events.bound
    assert [event.seq for event in seen] == list(range(len(seen)))
    assert len([event for event in seen if event.kind == "child_start"]) == count
    ended = [event for event in seen if event.kind == "run_end"]
    assert len(ended) == count + 1
    assert ended[-1].answer == "root answer"


SENT_TO: list[str] = []


@tool
def send(to: str) -> str:
    """Send a message."""
    SENT_TO.append(to)
    return f"sent to {to}"


class _Calls(Reporter):
    """Records the tool hooks as (hook, call name)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def on_tool_start(self, state: State, call: Any) -> None:
        self.seen.append(("start", call.name))

    def on_tool_deferred(self, state: State, call: Any, reason: str | None) -> None:
        self.seen.append((f"deferred: {reason}", call.name))

    def on_tool_end(self, state: State, call: Any, entry: Any) -> None:
        self.seen.append((f"end: {entry.outcome}", call.name))


def _mailer(store: MemoryStore, reporter: Reporter, replies: list[Any]) -> Agent:
    from orchestrator.permissions import AllowByName, ApproveLater

    return Agent(
        FakeModel(replies),
        tools=[send, look],
        store=store,
        reporter=reporter,
        permissions=[AllowByName("look"), ApproveLater("send", reason="mail leaves")],
    )


@pytest.mark.parametrize("verdict", ["approve", "deny"])
async def test_a_deferred_call_waits_without_starting_and_starts_once_approved(
    verdict: str,
) -> None:
    """No `tool_start` for a call deferred to a person: `tool_deferred`, then a start if run."""
    from orchestrator import aapprove, adeny

    SENT_TO.clear()
    store = MemoryStore()
    calls = _Calls()
    replies: list[Any] = [[tool_call("send", to="bob"), tool_call("look", where="desk")], "done"]
    state = State(id=f"deferred-{verdict}", messages=[Message.user("mail bob")])
    async with _mailer(store, calls, replies).events(state) as events:
        first = [event async for event in events]
    sent = next(call for call in state.pending_calls if call.name == "send")
    kinds = [(event.kind, getattr(event, "name", None)) for event in first]
    assert ("tool_deferred", "send") in kinds
    assert ("tool_start", "send") not in kinds
    assert ("tool_end", "send") not in kinds
    assert ("tool_start", "look") in kinds
    assert ("tool_end", "look") in kinds
    deferred = next(event for event in first if event.kind == "tool_deferred")
    assert deferred.call_id == sent.id
    assert deferred.args == {"to": "bob"}
    assert deferred.reason == "mail leaves"
    assert kinds.index(("tool_deferred", "send")) < kinds.index(("approval_needed", None))
    assert calls.seen.count(("start", "send")) == 0
    assert ("deferred: mail leaves", "send") in calls.seen
    assert SENT_TO == []

    loaded = store.load(state.id)
    if verdict == "approve":
        await aapprove(loaded, sent.id, by="ann")
    else:
        await adeny(loaded, sent.id, by="ann", reason="no")
    calls.seen.clear()
    async with _mailer(store, calls, ["sent it"]).events(loaded) as events:
        second = [event async for event in events]
    starts = [event for event in second if event.kind == "tool_start"]
    ends = [event for event in second if event.kind == "tool_end"]
    assert [event.call_id for event in starts] == [event.call_id for event in ends] == [sent.id]
    assert not [event for event in second if event.kind == "tool_deferred"]
    outcome = "done" if verdict == "approve" else "denied"
    assert ends[0].outcome == outcome
    assert calls.seen == [("start", "send"), (f"end: {outcome}", "send")]
    assert (["bob"] if verdict == "approve" else []) == SENT_TO


@pytest.mark.timeout(60)
async def test_the_buffer_bounds_the_calls_a_permission_stop_closes() -> None:
    """A stop closes the turn's other calls at once: their ends wait for room one by one."""
    from orchestrator import StoppedByPermission
    from orchestrator.permissions import AllowByName, DenyByName

    calls = [tool_call("find", where=str(i)) for i in range(1000)] + [tool_call("look", where="x")]
    sampler = _Sampler()
    agent = Agent(
        FakeModel([calls]),
        tools=[look, find],
        reporter=sampler,
        permissions=[DenyByName("look", stop=True), AllowByName("find")],
    )
    async with agent.events("go", buffer=16) as events:
        sampler.events = events
        await anyio.wait_all_tasks_blocked()
        held = events.unread
        seen = [event async for event in events]
    assert held <= events.bound
    assert sampler.most <= events.bound
    assert isinstance(events.state.stopped, StoppedByPermission)
    assert [event.seq for event in seen] == list(range(len(seen)))
    ends = [event for event in seen if event.kind == "tool_end"]
    assert sorted(str(event.call_id) for event in ends) == sorted(call.id for call in calls)
    assert {event.outcome for event in ends} >= {"cancelled", "denied"}
