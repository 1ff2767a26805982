"""`Agent(max_turns=N)`: the default loop's limit, and a run cut off by a limit says which to raise.

A run that hits its limit returns as usual (``state.stopped`` is `StoppedByLimit`, `run` returns
the answer). It names the setting that raises the limit in ``str(state.stopped)`` and in the
``state.loop.limit_reached`` log event; the library stays quiet (no `warnings.warn`: the suite
makes any warning an error).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import structlog

from orchestrator import (
    Agent,
    Loop,
    Message,
    State,
    StoppedByLimit,
    StoppedByUntil,
    loop,
    tool,
    waiting_for_user,
)
from orchestrator.testing import FakeModel, tool_call
from stores import MemoryStore
from tests.orchestrator.test_save_points import CountingStore


@tool
def noop() -> None:
    """Do nothing."""
    return None


def busy(turns: int, answer: str | None = None) -> FakeModel:
    """A model that calls `noop` for `turns` turns, then answers (or runs out)."""
    replies: list[Any] = [tool_call("noop") for _ in range(turns)]
    return FakeModel([*replies, answer] if answer is not None else replies)


def user_state(text: str = "Keep going") -> State:
    return State(messages=[Message.user(text)])


async def by_hand(agent: Agent, state: State) -> None:
    await agent.athink(state)
    if state.pending_calls:
        await agent.ause_tools(state)


# max_turns runs the default loop past 50 turns, or stops it sooner ------------------------------


@pytest.mark.anyio
async def test_max_turns_lets_the_default_loop_run_past_50_turns() -> None:
    model = busy(70, "Done after 70 calls.")
    state = user_state()
    agent = Agent(model, tools=[noop], max_turns=100)
    assert await agent.arun(state) == "Done after 70 calls."
    assert state.turn == 71
    assert state.stopped == StoppedByUntil("waiting_for_user")
    assert model.remaining == 0


@pytest.mark.anyio
async def test_max_turns_stops_the_default_loop_sooner() -> None:
    model = busy(10)
    state = user_state()
    # The usual StoppedByLimit, at the limit the user chose.
    assert await Agent(model, tools=[noop], max_turns=3).arun(state) is None
    assert state.stopped == StoppedByLimit(3)
    assert len(model.requests) == 3
    assert state.pending_calls == ()  # the last turn's call has its result
    assert state.history[-1].kind == "stop"


@pytest.mark.anyio
async def test_max_turns_applies_to_each_run() -> None:
    model = busy(5, "Done.")
    state = user_state()
    agent = Agent(model, tools=[noop], max_turns=2)
    await agent.arun(state)
    assert state.stopped == StoppedByLimit(2)
    await agent.arun(state)  # the same State runs on: two more turns
    assert state.stopped == StoppedByLimit(2)
    assert await agent.arun(state) == "Done."
    assert state.turn == 6


@pytest.mark.anyio
async def test_max_turns_is_saved_like_the_default_loop() -> None:
    # The default loop saves the run's start with its first request: a limit changes nothing.
    counts: list[int] = []
    for max_turns in (None, 5):
        store = CountingStore()
        model = busy(1, "Done.")
        await Agent(model, tools=[noop], store=store, max_turns=max_turns).arun("Go")
        counts.append(store.saves)
    assert counts == [4, 4]


# the setting, copy and the rule with a loop of one's own ----------------------------------------


def test_max_turns_is_a_setting_kept_by_copy() -> None:
    agent = Agent(FakeModel(["ok"]), max_turns=200)
    assert agent.max_turns == 200
    assert isinstance(agent.loop, Loop)
    assert agent.loop.limit == 200
    variant = agent.copy(instructions="Be brief.")
    assert variant.max_turns == 200
    assert isinstance(variant.loop, Loop)
    assert variant.loop.limit == 200
    assert agent.copy(max_turns=None).max_turns == 50
    assert agent.copy(max_turns=7).max_turns == 7
    assert Agent(FakeModel(["ok"])).max_turns == 50


@pytest.mark.anyio
async def test_a_copy_runs_with_the_kept_max_turns() -> None:
    agent = Agent(busy(10), tools=[noop], max_turns=2)
    state = user_state()
    await agent.copy(instructions="Go on.").arun(state)
    assert state.stopped == StoppedByLimit(2)


@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        (0, ValueError, "at least 1"),
        (-5, ValueError, "at least 1"),
        (True, TypeError, "must be an int"),
        (2.5, TypeError, "must be an int"),
        ("100", TypeError, "must be an int"),
    ],
)
def test_a_bad_max_turns_is_refused_with_the_fix(
    value: Any, error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words) as caught:
        Agent(FakeModel(["ok"]), max_turns=value)
    assert "max_turns" in str(caught.value)
    assert "turns" in str(caught.value)


def test_max_turns_with_a_loop_of_ones_own_is_refused() -> None:
    # One place sets each limit: a user loop's is @loop(limit=...), never silently overridden
    # or ignored.
    own = loop(limit=5)(by_hand)
    with pytest.raises(ValueError, match=re.escape("@loop(limit=N)")) as caught:
        Agent(FakeModel(["ok"]), loop=own, max_turns=100)
    assert "max_turns=100" in str(caught.value)
    with pytest.raises(ValueError, match="max_turns"):
        Agent(FakeModel(["ok"]), loop=by_hand, max_turns=100)  # a plain loop function too
    limited = Agent(FakeModel(["ok"]), max_turns=100)
    with pytest.raises(ValueError, match=re.escape("max_turns=None")):
        limited.copy(loop=own)
    mine = limited.copy(loop=own, max_turns=None)
    assert mine.loop is own
    assert mine.max_turns is None
    with pytest.raises(ValueError, match="loop="):
        mine.copy(max_turns=10)


@pytest.mark.anyio
async def test_a_loop_of_ones_own_keeps_its_limit() -> None:
    own = loop(until=[waiting_for_user], limit=2)(by_hand)
    state = user_state()
    agent = Agent(busy(10), tools=[noop], loop=own)
    assert agent.max_turns is None
    await agent.arun(state)
    assert state.stopped == StoppedByLimit(2)


# a run cut off by its limit says which setting raises it ----------------------------------------


def test_stopped_by_limit_names_the_settings_that_raise_it() -> None:
    text = str(StoppedByLimit(50))
    assert "turn limit reached (50 turns)" in text
    assert "Agent(max_turns=N)" in text
    assert "@loop(limit=N)" in text


def test_a_sync_run_cut_off_by_the_default_limit_returns_quietly_saying_why() -> None:
    # run() returns, but the model was still calling tools, and the answer is the one of the
    # run before: state.stopped says so, and names the setting to raise.
    state = user_state("Hi")
    assert Agent(FakeModel(["Hello!"])).run(state) == "Hello!"
    state.add_message(Message.user("Now check every file"))
    answer = Agent(busy(60), tools=[noop]).run(state)
    assert answer == "Hello!"  # returned as before: stale
    assert state.stopped == StoppedByLimit(50)
    assert "Agent(max_turns=N)" in str(state.stopped)


@pytest.mark.anyio
async def test_the_default_loop_stops_after_50_turns_with_nothing_pending() -> None:
    # DESIGN 6: "The default loop: until=waiting_for_user, limit=50, body = think, then use_tools".
    model = busy(60)
    state = user_state()
    await Agent(model, tools=[noop]).arun(state)
    assert state.stopped == StoppedByLimit(50)
    assert len(model.requests) == 50
    assert state.turn == 50
    assert state.pending_calls == ()


@pytest.mark.anyio
async def test_a_loop_of_ones_own_at_its_default_limit_stops_at_50() -> None:
    state = user_state()
    own = loop(until=[waiting_for_user])(by_hand)
    await Agent(busy(60), tools=[noop], loop=own).arun(state)
    assert state.stopped == StoppedByLimit(50)
    assert "@loop(limit=N)" in str(state.stopped)


@pytest.mark.anyio
async def test_a_loop_limit_chosen_of_50_stops_there() -> None:
    state = user_state()
    own = loop(until=[waiting_for_user], limit=50)(by_hand)
    await Agent(busy(60), tools=[noop], loop=own).arun(state)
    assert state.stopped == StoppedByLimit(50)


@pytest.mark.anyio
async def test_the_limit_is_logged_as_a_warning_naming_the_setting() -> None:
    own = loop(limit=1)(by_hand)
    first, second = user_state(), user_state()
    with structlog.testing.capture_logs() as logs:
        await Agent(busy(5), tools=[noop], max_turns=2).arun(first)
        await Agent(busy(5), tools=[noop], loop=own).arun(second)
    reached = [log for log in logs if log["event"] == "state.loop.limit_reached"]
    assert reached == [
        {
            "event": "state.loop.limit_reached",
            "log_level": "warning",
            "state_id": first.id,
            "turns": 2,
            "setting": "Agent(max_turns=N)",
        },
        {
            "event": "state.loop.limit_reached",
            "log_level": "warning",
            "state_id": second.id,
            "turns": 1,
            "setting": "@loop(limit=N)",
        },
    ]


@pytest.mark.anyio
async def test_a_run_stopped_by_its_limit_is_saved_and_loads_the_same() -> None:
    store = MemoryStore()
    state = user_state()
    await Agent(busy(5), tools=[noop], store=store, max_turns=2).arun(state)
    loaded = store.load(state.id)
    assert loaded.stopped == StoppedByLimit(2)
    assert loaded.history == state.history
