"""Review tests for `State` against seed 004 and DESIGN sections 3-5.

Each test cites the sentence it checks. Some of them fail on purpose: they prove a gap.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import anyio
import anyio.to_thread
import pytest

from orchestrator import (
    Agent,
    Message,
    Reply,
    State,
    StateSnapshot,
    ToolResult,
    ToolResultEntry,
    tool,
)
from orchestrator.models import Request, TextCallback
from orchestrator.testing import FakeModel, tool_call

LISTED_FIELDS = [
    "history",
    "messages",
    "pending_calls",
    "turn",
    "usage",
    "extra_data",
    "finished",
    "answer",
    "stopped",
    "created_at",
    "updated_at",
]


def assert_replays(state: State) -> None:
    assert State(history=state.history).snapshot() == state.snapshot()


class GateModel:
    """Replies "ok" once `release` is set; `entered` is set when the request arrives."""

    def __init__(self) -> None:
        self.entered = anyio.Event()
        self.release = anyio.Event()

    @property
    def name(self) -> str:
        return "gate"

    @property
    def context_window(self) -> int | None:
        return None

    async def respond(self, request: Request, *, on_text: TextCallback | None = None) -> Reply:
        self.entered.set()
        await self.release.wait()
        return Reply(Message.assistant("ok"))


# StateSnapshot ----------------------------------------------------------------------------------


def test_state_snapshot_dataclass_fields_are_exactly_the_listed_ones() -> None:
    # Seed 004 StateSnapshot dataclass lists history..updated_at; DESIGN 5: "exactly the listed
    # public fields". dataclasses.fields/asdict must not expose (and deep-copy) internals.
    assert [f.name for f in dataclasses.fields(StateSnapshot)] == LISTED_FIELDS
    snapshot = State(messages=[Message.user("hi")], extra_data={"k": 1}).snapshot()
    assert list(dataclasses.asdict(snapshot)) == LISTED_FIELDS


def test_state_snapshot_defaults_are_the_documented_ones() -> None:
    # Seed 004 StateSnapshot: history=(), messages=(), pending_calls=(), turn=0, usage=Usage(),
    # extra_data=FrozenDict(), finished=False, answer=None, stopped=None, created/updated None.
    empty = StateSnapshot()
    assert empty == State().snapshot()
    assert (empty.created_at, empty.updated_at) == (None, None)
    with pytest.raises(TypeError):
        empty.extra_data["x"] = 1  # read-only


# child / achild ---------------------------------------------------------------------------------


@pytest.mark.parametrize("child_id", ["no/such child", "x" * 200, "ü"])
def test_child_of_an_id_no_tool_call_started_raises_key_error_even_if_malformed(
    child_id: str,
) -> None:
    # Seed 004 child: "KeyError: child_id is not a child of this State"; its ValueError is only
    # for "It is a child, but this State has no way to open it".
    state = State(messages=[Message.user("hi")])
    with pytest.raises(KeyError):
        state.child(child_id)


@pytest.mark.anyio
async def test_achild_of_a_malformed_id_raises_key_error_like_child() -> None:
    # Seed 004 achild: "the same lookup and the same errors" as child, whose KeyError covers any
    # id that is not a child of this State.
    state = State(messages=[Message.user("hi")])
    with pytest.raises(KeyError):
        await state.achild("../escape")


# restore ----------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_restore_to_a_snapshot_with_pending_calls_forgets_undone_state_updates() -> None:
    # Seed 004 restore: "Every value goes back to what it was then (messages, turn, extra_data,
    # ...)"; DESIGN 5a: a tool's update is recorded in *its* tool_result entry and applied when
    # the turn's last result is recorded. A result undone by restore must not be applied again.
    picks: list[str] = []

    @tool
    def pick(city: str) -> Any:
        picks.append(city)
        if len(picks) == 1:
            return ToolResult("picked", state={"city": city})
        return "not picked this time"

    agent = Agent(FakeModel([tool_call("pick", city="Paris")]), tools=[pick])
    state = State(messages=[Message.user("Pick a city")])
    await agent.athink(state)
    before = state.snapshot()  # after think returned: the seed's "between turns"
    await agent.ause_tools(state)
    assert state.get("city") == "Paris"
    state.restore(before)
    assert state.extra_data == {}
    assert len(state.pending_calls) == 1
    await agent.ause_tools(state)  # runs again; this time the tool updates nothing
    assert len(picks) == 2
    assert state.extra_data == {}
    assert_replays(state)


@pytest.mark.anyio
async def test_restore_to_a_snapshot_with_pending_calls_closes_the_turn_once_again() -> None:
    # Seed 004 pending_calls/messages: "Results of this turn's tool calls go in together once the
    # last call has a result"; restore brings messages back, so only the new results go in.
    @tool
    def echo(text: str) -> str:
        return text

    agent = Agent(
        FakeModel([[tool_call("echo", text="a"), tool_call("echo", text="b")]]), tools=[echo]
    )
    state = State(messages=[Message.user("Echo")])
    await agent.athink(state)
    before = state.snapshot()
    await agent.ause_tools(state)
    state.restore(before)
    assert state.messages == before.messages
    await agent.ause_tools(state)
    assert state.pending_calls == ()
    assert len(state.messages) == 3
    (results,) = [m for m in state.messages if m.tool_results]
    assert [block.text for block in results.tool_results] == ["a", "b"]
    late = [e for e in state.history if isinstance(e, ToolResultEntry) and e.late]
    assert late == []
    assert_replays(state)


# thread-safety and message order ---------------------------------------------------------------


@pytest.mark.anyio
async def test_messages_added_from_threads_while_the_model_is_waited_on_keep_order() -> None:
    # Seed 004: methods are "thread-safe, so tools may call them from worker threads";
    # add_message: "while think waits on the model, the message is held and goes into messages
    # right after ... the reply".
    model = GateModel()
    agent = Agent(model)
    state = State(messages=[Message.user("start")])
    threads, per_thread = 8, 50

    def add_many(tag: str) -> None:
        for i in range(per_thread):
            state.add_message(Message.user(f"{tag}-{i}"))

    async with anyio.create_task_group() as group:
        group.start_soon(agent.athink, state)
        await model.entered.wait()
        async with anyio.create_task_group() as adders:
            for t in range(threads):
                adders.start_soon(anyio.to_thread.run_sync, add_many, f"t{t}")
        assert [m.text for m in state.messages] == ["start"]  # held while waiting
        model.release.set()

    texts = [m.text for m in state.messages]
    assert texts[:2] == ["start", "ok"]
    assert len(texts) == 2 + threads * per_thread
    for t in range(threads):
        mine = [text for text in texts if text.startswith(f"t{t}-")]
        assert mine == [f"t{t}-{i}" for i in range(per_thread)]
    assert_replays(state)
