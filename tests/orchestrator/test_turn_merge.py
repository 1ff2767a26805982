"""A turn's state updates merge with the tools' own handlers: live, loaded, forked and replayed.

A handler is code, which a history cannot hold. So a tool's update is recorded in its result and
stays due until the turn closes; then the agent that has the tools merges the turn's updates in
request order as one `extra_data` entry. A State loaded, forked or replayed mid-turn holds the
same due updates, and ends where the live run ends once the agent runs it on.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import (
    Agent,
    Message,
    Reply,
    Reporter,
    State,
    ToolCall,
    ToolResultEntry,
    tool,
)

# Private: close_pending has no public name (an Agent closes pending calls itself).
from orchestrator._record._recording import (
    begin_think,
    close_pending,
    record_reply,
    record_tool_result,
    value_of,
)
from orchestrator.testing import FakeModel, tool_call
from stores import FileStore, MemoryStore, SQLiteStore
from tests.doubles import assert_replays

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = {"count": {"type": int}}


def add(current: int | None, new: int) -> int:
    return (current or 0) + new


@tool(outputs_to_state={"count": {"source": "n", "handler": add}})
async def bump(n: int) -> dict[str, int]:
    """Add n to the count."""
    return {"n": n}


def slow_tool(gate: anyio.Event | None) -> Any:
    @tool
    async def slow() -> str:
        """Take a while."""
        if gate is not None:
            await gate.wait()
        return "slow done"

    return slow


def model() -> FakeModel:
    return FakeModel([[tool_call("bump", n=5), tool_call("slow")], "Counted."])


def start() -> State:
    return State(messages=[Message.user("Count")], extra_data={"count": 10})


def agent(gate: anyio.Event | None = None, *, resumed: bool = False, **settings: Any) -> Agent:
    """The agent of the run; `resumed`: its model only answers (the turn was already asked)."""
    replies = FakeModel(["Counted."]) if resumed else model()
    return Agent(replies, tools=[bump, slow_tool(gate)], state_schema=SCHEMA, **settings)


@pytest.mark.anyio
async def test_the_live_run_merges_with_the_tools_handler() -> None:
    state = start()
    assert await agent().arun(state) == "Counted."
    assert state.get("count") == 15
    merge = [e for e in state.history if e.kind == "extra_data" and e.content.turn_merge]
    assert [entry.content.changed for entry in merge] == [{"count": 15}]
    assert State(history=state.history).extra_data == state.extra_data


class Bumped(Reporter):
    """Sets `done` when `bump`'s result is recorded (and `slow` still runs)."""

    def __init__(self) -> None:
        self.done = anyio.Event()

    def on_tool_end(self, state: State, call: ToolCall, entry: ToolResultEntry) -> None:
        if call.name == "bump":
            self.done.set()


class WatchedStore(MemoryStore):
    """A MemoryStore that sets `bumped` once a save holds `bump`'s result."""

    def __init__(self) -> None:
        super().__init__()
        self.bumped = anyio.Event()

    async def asave(self, state: State) -> None:
        await super().asave(state)
        if any(entry.kind == "tool_result" for entry in state.history):
            self.bumped.set()


async def mid_turn(store: WatchedStore | None = None) -> tuple[State, State | None]:
    """A run's State replayed while `slow` runs and `bump`'s update is recorded, and loaded."""
    gate, bumped = anyio.Event(), Bumped()
    state = start()
    running = agent(gate, store=store, reporter=bumped)
    copy = loaded = None
    async with anyio.create_task_group() as group:
        group.start_soon(running.arun, state)
        await (bumped.done if store is None else store.bumped).wait()
        copy = State(history=state.history)  # what a fork or a crash would see
        if store is not None:
            # What a crash leaves: the store as it is now, in a store of its own (the live run,
            # cancelled below, goes on saving to the first).
            loaded = store.load(state.id)
            MemoryStore().save(loaded)
        group.cancel_scope.cancel()
    assert copy is not None
    return copy, loaded


@pytest.mark.anyio
async def test_a_state_replayed_mid_turn_holds_the_update_due_and_agrees() -> None:
    mid, _ = await mid_turn()
    assert mid.get("count") == 10  # not merged yet: the turn is open
    assert [call.name for call in mid.pending_calls] == ["slow"]
    # The replay agrees with the live State at this point, and after the turn closes the same
    # agent ends where an uninterrupted run ends.
    assert_replays(mid)
    await agent().ause_tools(mid)  # runs `slow`: the turn closes, the agent merges
    assert mid.get("count") == 15
    assert await agent(resumed=True).arun(mid) == "Counted."
    assert mid.get("count") == 15


@pytest.mark.anyio
async def test_a_fork_mid_turn_ends_where_the_live_run_ends() -> None:
    gate, bumped = anyio.Event(), Bumped()
    state = start()
    running = agent(gate, reporter=bumped)
    fork = None
    async with anyio.create_task_group() as group:
        group.start_soon(running.arun, state)
        await bumped.done.wait()
        fork = state.fork()
        gate.set()
    assert fork is not None
    assert state.get("count") == 15
    assert fork.get("count") == 10
    await agent().ause_tools(fork)
    assert fork.get("count") == 15
    assert await agent(resumed=True).arun(fork) == "Counted."
    assert fork.get("count") == 15


@pytest.mark.anyio
async def test_a_load_mid_turn_recovers_and_resumes_to_the_same_end() -> None:
    _, loaded = await mid_turn(WatchedStore())
    assert loaded is not None
    # Loaded mid-turn: `slow` is closed as unknown, and the due update waits for the agent's
    # handler: it never merges by another rule.
    assert loaded.get("count") == 10
    # private: due updates have no public view
    assert [entry.call.name for entry in value_of(loaded).due] == ["bump"]
    assert await agent(resumed=True).arun(loaded) == "Counted."
    assert loaded.get("count") == 15


@pytest.mark.anyio
async def test_an_agent_without_the_tool_refuses_to_merge_by_another_rule() -> None:
    mid, _ = await mid_turn()
    close_pending(mid, "unknown", "(cut off)")
    other = Agent(FakeModel(["Hi"]), state_schema=SCHEMA)
    with pytest.raises(ValueError, match=r"updates from bump waiting .* no such tool"):
        await other.arun(mid)
    assert mid.get("count") == 10


CRASH = """
import os, sys, time
from orchestrator import Agent, Message, State, tool
from orchestrator.testing import FakeModel, tool_call
from stores import SQLiteStore
from tests.orchestrator.test_turn_merge import SCHEMA, bump

@tool
def slow() -> str:
    \"\"\"Crash the process once bump's result is stored (bounded wait).\"\"\"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with SQLiteStore(sys.argv[1]) as reader:
            stored = reader.load("crashed").history  # recovered: cut-off calls read unknown
            if any(e.kind == "tool_result" and e.outcome == "done" for e in stored):
                break
        time.sleep(0.01)
    os._exit(1)

store = SQLiteStore(sys.argv[1])
state = State(id="crashed", messages=[Message.user("Count")], extra_data={"count": 10})
model = FakeModel([[tool_call("bump", n=5), tool_call("slow")], "Counted."])
Agent(model, tools=[bump, slow], state_schema=SCHEMA, store=store).run(state)
"""


def test_a_real_crash_mid_turn_then_resume_ends_where_the_live_run_ends(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CRASH), str(tmp_path / "runs.db")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    with SQLiteStore(tmp_path / "runs.db") as store:
        loaded = store.load("crashed")
        assert loaded.get("count") == 10
        bumped = [e for e in loaded.history if e.kind == "tool_result" and e.call.name == "bump"]
        assert [(entry.state_update, entry.merge_due) for entry in bumped] == [({"count": 5}, True)]
        assert agent(store=store, resumed=True).run(loaded) == "Counted."
        assert loaded.get("count") == 15
        assert store.load("crashed").get("count") == 15


def test_file_and_sqlite_stores_keep_the_due_update(tmp_path: Path) -> None:
    for store in (FileStore(tmp_path / "files"), SQLiteStore(tmp_path / "runs.db")):
        state = start()
        begin_think(state)
        calls = (tool_call("bump", n=5), tool_call("slow"))
        record_reply(state, Reply(Message.assistant("", calls)))
        record_tool_result(
            state, calls[0], _result(calls[0].id), outcome="done", state_update={"count": 5}
        )
        store.save(state)
        loaded = store.load(state.id)
        # private: due updates have no public view
        assert [entry.call.name for entry in value_of(loaded).due] == ["bump"]
        assert agent(resumed=True).run(loaded) == "Counted."
        assert loaded.get("count") == 15


def _result(call_id: str) -> Any:
    from orchestrator import TextBlock, ToolResultBlock

    return ToolResultBlock(call_id, (TextBlock("ok"),))


# Random runs: live and replayed agree at every point ---------------------------------------------

TYPED = {"count": {"type": int}, "tags": {"type": list[str]}, "name": {"type": str}}


@tool(outputs_to_state={"tags": {"source": "tag"}})
async def tag(tag: str) -> dict[str, str]:
    """Add a tag (merged by the schema's default for lists)."""
    return {"tag": tag}


@tool(outputs_to_state={"name": {}})
def rename(name: str) -> str:
    """Replace the name (a sync tool, in a worker thread)."""
    return name


class Replayed(Reporter):
    """At every hook, the live State and its replayed history agree, typed values included."""

    def __init__(self) -> None:
        self.checks = 0

    def check(self, state: State) -> None:
        replayed = State(history=state.history, schema=TYPED)
        assert replayed.snapshot() == state.snapshot()
        assert [replayed.get(key) for key in TYPED] == [state.get(key) for key in TYPED]
        self.checks += 1

    def on_think_start(self, state: State) -> None:
        self.check(state)

    def on_think_end(self, state: State, reply: Reply) -> None:
        self.check(state)

    def on_tool_start(self, state: State, call: ToolCall) -> None:
        self.check(state)

    def on_tool_end(self, state: State, call: ToolCall, entry: ToolResultEntry) -> None:
        self.check(state)


def bump_call(n: int) -> ToolCall:
    return tool_call("bump", n=n)


def tag_call(tag: str) -> ToolCall:
    return tool_call("tag", tag=tag)


def rename_call(name: str) -> ToolCall:
    return tool_call("rename", name=name)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    turns=st.lists(
        st.lists(
            st.one_of(
                st.integers(-5, 5).map(bump_call),
                st.sampled_from("abc").map(tag_call),
                st.sampled_from(["x", "y"]).map(rename_call),
            ),
            min_size=1,
            max_size=4,
        ),
        min_size=1,
        max_size=4,
    )
)
def test_random_runs_agree_live_and_replayed_at_every_point(turns: list[list[ToolCall]]) -> None:
    reporter = Replayed()
    state = State(messages=[Message.user("Go")], extra_data={"count": 10}, schema=TYPED)
    model = FakeModel([*turns, "Done."])
    Agent(model, tools=[bump, tag, rename], state_schema=TYPED, reporter=reporter).run(state)
    reporter.check(state)
    calls = [call for turn in turns for call in turn]
    assert state.get("count") == 10 + sum(call.args["n"] for call in calls if call.name == "bump")
    tags = [call.args["tag"] for call in calls if call.name == "tag"]
    assert state.get("tags") == (tags or None)
    renamed = [call.args["name"] for turn in turns for call in turn if call.name == "rename"]
    assert state.get("name") == (renamed[-1] if renamed else None)
    assert reporter.checks >= 2 * len(calls)
