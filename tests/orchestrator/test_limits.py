"""`Limits`: what a run and its whole subagent tree may spend (issue 29, DESIGN 21).

The guarantee under test: a limit is checked before each model request, tool turn and child
start; a token or cost limit is overshot by at most one in-flight request per running State;
requests, tool calls, children and depth are never overshot. Spending lives in the history, so a
replayed or reloaded State shows the same stop and a resumed run keeps its budget.
"""

from __future__ import annotations

import contextvars
import functools
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog

from orchestrator import (
    Agent,
    LimitReachedError,
    Limits,
    Message,
    Reply,
    State,
    StoppedByLimit,
    ToolResultEntry,
    Usage,
    tool,
)
from orchestrator._running._budget import Budget, before_request, remaining, spend
from orchestrator.runners import ChildJob
from orchestrator.testing import FakeModel, tool_call
from stores import MemoryStore

INPUT, OUTPUT = 100, 10  # what every scripted request spends
ONE = INPUT + OUTPUT
STORE = MemoryStore()  # the fan-out tests' States, by their unique ids


@tool
def noop() -> None:
    """Do nothing."""
    return None


def spending(item: Any) -> Reply:
    """A reply (text or one tool call) that spent one request of INPUT + OUTPUT tokens."""
    if isinstance(item, str):
        message = Message.assistant(item)
    else:
        message = Message.assistant(tool_calls=(item,))
    return Reply(message, Usage(input_tokens=INPUT, output_tokens=OUTPUT, requests=1, cost=0.5))


def busy_model(replies: int) -> FakeModel:
    """A model that calls `noop` `replies` times."""
    return FakeModel([spending(tool_call("noop")) for _ in range(replies)])


def user_state() -> State:
    return State(messages=[Message.user("go")])


# Limits: the value -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        {"total_tokens": -1},
        {"requests": 1.5},
        {"tool_calls": True},
        {"cost": "1"},
        {"seconds": float("nan")},
    ],
)
def test_limits_refuse_values_that_are_not_counts(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=rf"Limits\({next(iter(bad))}=\.\.\.\) must be"):
        Limits(**bad)


def test_the_tighter_of_two_limits_holds_field_by_field() -> None:
    mine = Limits(total_tokens=100, requests=5)
    theirs = Limits(total_tokens=50, cost=2.0)
    assert mine.tighter(theirs) == Limits(total_tokens=50, requests=5, cost=2.0)
    assert mine.tighter(None) is mine
    assert Limits().set() == ()


def test_agent_and_run_refuse_what_is_not_limits() -> None:
    with pytest.raises(TypeError, match=r"limits must be a Limits, e\.g\."):
        Agent(FakeModel([]), limits={"total_tokens": 5})  # type: ignore[arg-type]
    agent = Agent(FakeModel([]))
    with pytest.raises(TypeError, match="limits must be a Limits"):
        agent.run("hi", limits=10)  # type: ignore[arg-type]
    assert Agent(FakeModel([]), limits=Limits(requests=1)).limits == Limits(requests=1)


# One State ---------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_token_limit_stops_the_run_before_a_request_that_would_pass_it() -> None:
    model = busy_model(10)
    agent = Agent(model, tools=[noop], limits=Limits(total_tokens=3 * ONE + 50))
    state = user_state()
    assert await agent.arun(state) is None
    # The third reply leaves 50 tokens: the next request holds at least the last 110.
    assert len(model.requests) == 3
    assert state.stopped == StoppedByLimit(
        limit="total_tokens", maximum=3 * ONE + 50, spent=3 * ONE, owner=state.id, by=state.id
    )
    assert "raise it with limits=Limits(...)" in str(state.stopped)
    assert state.pending_calls == ()
    assert state.history[-1].kind == "stop"


@pytest.mark.anyio
async def test_a_request_limit_is_never_overshot_and_run_limits_join_the_agents() -> None:
    model = busy_model(10)
    agent = Agent(model, tools=[noop], limits=Limits(requests=4))
    state = user_state()
    await agent.arun(state, limits=Limits(requests=2, total_tokens=10_000))
    assert len(model.requests) == 2
    assert isinstance(state.stopped, StoppedByLimit)
    assert (state.stopped.limit, state.stopped.maximum, state.stopped.spent) == ("requests", 2, 2)


@pytest.mark.anyio
async def test_a_tool_call_limit_closes_the_turns_calls_unrun() -> None:
    ran: list[int] = []

    @tool
    def counted() -> None:
        """Count."""
        ran.append(1)

    model = FakeModel(
        [
            Reply(
                Message.assistant(tool_calls=(tool_call("counted"), tool_call("counted"))),
                Usage(input_tokens=1, requests=1),
            )
            for _ in range(3)
        ]
    )
    agent = Agent(model, tools=[counted], limits=Limits(tool_calls=3))
    state = user_state()
    await agent.arun(state)
    assert len(ran) == 2  # the second turn's two calls would make 4
    assert isinstance(state.stopped, StoppedByLimit)
    assert state.stopped.limit == "tool_calls"
    closed = [e for e in state.history if isinstance(e, ToolResultEntry)][-2:]
    assert [e.outcome for e in closed] == ["cancelled", "cancelled"]
    assert all("not run: limit tool_calls=3" in e.content.text for e in closed)
    assert state.pending_calls == ()


@pytest.mark.anyio
async def test_a_cost_limit_counts_the_replies_cost() -> None:
    model = busy_model(10)
    agent = Agent(model, tools=[noop], limits=Limits(cost=1.0))
    state = user_state()
    await agent.arun(state)
    assert len(model.requests) == 2  # 0.5 each: used up after two
    assert isinstance(state.stopped, StoppedByLimit)
    assert state.stopped.limit == "cost"


@pytest.mark.anyio
async def test_athink_with_nothing_left_raises_limit_reached_error() -> None:
    model = busy_model(3)
    agent = Agent(model, tools=[noop])
    state = user_state()
    await agent.arun(state, limits=Limits(requests=1))

    async def twice(agent: Agent, state: State) -> None:
        await agent.athink(state)
        await agent.athink(state)

    looping = Agent(model, tools=[noop], loop=twice, limits=Limits(requests=2))
    with pytest.raises(LimitReachedError, match="limit requests=2 of State") as raised:
        await looping.arun(state)
    assert isinstance(raised.value.stopped, StoppedByLimit)
    assert len(model.requests) == 2  # the one of the first run counts: it is in the history


# A resumed run keeps its budget ----------------------------------------------------------------


@pytest.mark.anyio
async def test_a_loaded_state_keeps_its_budget_and_a_raised_limit_continues() -> None:
    store = MemoryStore()
    model = busy_model(10)
    agent = Agent(model, tools=[noop], store=store)
    state = user_state()
    await agent.arun(state, limits=Limits(requests=3))
    loaded = store.load(state.id)
    assert loaded.stopped == state.stopped  # the stop is in the history
    await agent.arun(loaded, limits=Limits(requests=3))
    assert len(model.requests) == 3  # nothing left: no request sent
    assert loaded.stopped == state.stopped
    await agent.arun(loaded, limits=Limits(requests=5))
    assert len(model.requests) == 5
    assert isinstance(loaded.stopped, StoppedByLimit)
    assert loaded.stopped.spent == 5


# A tree: every child's spending counts against every ancestor as it happens --------------------


def fan_out(children: int, parent_limits: Limits, child_replies: int = 1000) -> Agent:
    """A lead that starts `children` workers at once, each calling `noop` until stopped."""
    worker = Agent(busy_model(child_replies), tools=[noop], name="worker", description="Does work.")
    calls = [tool_call("worker", task=f"job {n}") for n in range(children)]
    lead = FakeModel([Reply(Message.assistant(tool_calls=tuple(calls)), Usage(requests=1)), "done"])
    return Agent(lead, tools=[worker], limits=parent_limits, store=STORE)


@pytest.mark.anyio
async def test_fifty_parallel_children_stop_within_one_request_each_of_the_parent_limit() -> None:
    limit = 2_000
    agent = fan_out(50, Limits(total_tokens=limit))
    state = user_state()
    await agent.arun(state)
    # The guarantee: at most one in-flight request per running State past the limit.
    spent = state.usage.input_tokens + state.usage.output_tokens
    assert limit <= spent <= limit + 51 * ONE
    stopped = state.stopped
    assert isinstance(stopped, StoppedByLimit)
    assert (stopped.limit, stopped.owner, stopped.maximum) == ("total_tokens", state.id, limit)
    assert stopped.by != state.id  # a child spent the last of it
    results = [e for e in state.history if isinstance(e, ToolResultEntry)]
    assert len(results) == 50
    children = [state.child(e.child_ids[0]) for e in results]
    for entry, child in zip(results, children, strict=True):
        assert entry.outcome == "error"
        assert f"limit total_tokens={limit} of State {state.id} reached" in entry.content.text
        assert child.pending_calls == ()  # every child closed cleanly
        assert isinstance(child.stopped, StoppedByLimit)
        assert child.stopped.owner == state.id
        assert State(history=child.history).stopped == child.stopped
        assert STORE.load(child.id).stopped == child.stopped
    # The history replays to the same stop, and so does the store.
    assert State(history=state.history).stopped == stopped
    loaded = STORE.load(state.id)
    assert loaded.stopped == stopped
    assert loaded.usage == state.usage


@pytest.mark.anyio
async def test_a_parents_children_limit_refuses_the_rest_with_an_error_result() -> None:
    agent = fan_out(5, Limits(children=3), child_replies=0)
    worker_model = FakeModel([spending("ok") for _ in range(5)])
    agent = agent.copy(
        tools=[Agent(worker_model, name="worker", description="Does work.").as_tool()]
    )
    state = user_state()
    assert await agent.arun(state) == "done"
    results = [e for e in state.history if isinstance(e, ToolResultEntry)]
    refused = [e for e in results if e.outcome == "error"]
    assert len(refused) == 2
    assert all(not e.child_ids for e in refused)
    assert all("limit children=3 of State" in e.content.text for e in refused)
    assert len(worker_model.requests) == 3


@pytest.mark.anyio
async def test_a_tool_slice_stops_each_child_and_the_parent_goes_on() -> None:
    worker = Agent(busy_model(20), tools=[noop], name="worker", description="Does work.")
    calls = [tool_call("worker", task="a"), tool_call("worker", task="b")]
    lead = FakeModel([Reply(Message.assistant(tool_calls=tuple(calls)), Usage(requests=1)), "done"])
    agent = Agent(lead, tools=[worker.as_tool(limits=Limits(requests=2))])
    state = user_state()
    assert await agent.arun(state) == "done"
    results = [e for e in state.history if isinstance(e, ToolResultEntry)]
    for entry in results:
        child = state.child(entry.child_ids[0])
        assert isinstance(child.stopped, StoppedByLimit)
        assert child.stopped.owner == child.id
        assert child.usage.requests == 2
        assert "stopped: limit requests=2 of State" in entry.content.text
    assert state.usage.requests == 2 + 4


@pytest.mark.anyio
async def test_a_depth_limit_refuses_a_grandchild() -> None:
    @tool
    async def delegate(task: str) -> str:
        """Delegate."""
        return str(await recursive.arun(task))

    def delegate_or_answer(request: Any) -> Any:
        return tool_call("delegate", task="deeper")

    recursive = Agent(FakeModel([delegate_or_answer] * 3 + ["done"] * 3), tools=[delegate])
    state = user_state()
    await recursive.arun(state, limits=Limits(depth=1))
    first = next(e for e in state.history if isinstance(e, ToolResultEntry))
    child = state.child(first.child_ids[0])
    refused = next(e for e in child.history if isinstance(e, ToolResultEntry))
    assert refused.outcome == "error"
    assert not refused.child_ids
    assert "limit depth=1 of State" in refused.content.text


# A reload in a new process continues the budget ------------------------------------------------

_FIRST = """
import os, sys
from orchestrator import Agent, Limits, Message, Reply, State, Usage, tool
from orchestrator._running._budget import Budget, before_request, remaining, spend
from orchestrator.runners import ChildJob
from orchestrator.testing import FakeModel, tool_call
from stores import SQLiteStore

ran = []

@tool
def noop() -> None:
    '''Do nothing; the 5th call ends the process, mid-tree: both children have spent.'''
    ran.append(1)
    if len(ran) == 5:  # the State is saved before a tool runs
        os._exit(3)

step = Reply(Message.assistant(tool_calls=(tool_call("noop"),)),
             Usage(input_tokens=100, output_tokens=10, requests=1))

store = SQLiteStore(sys.argv[1])
worker = Agent(FakeModel([step] * 50), tools=[noop], name="worker", description="Works.")
calls = [tool_call("worker", task="a"), tool_call("worker", task="b")]
lead = FakeModel([Reply(Message.assistant(tool_calls=tuple(calls)), Usage(requests=1)), "done"])
agent = Agent(lead, tools=[worker], store=store)
agent.run(State(id="root", messages=[Message.user("go")]), limits=Limits(total_tokens=1500))
"""

_SECOND = """
import sys
from orchestrator import Agent, Limits, Message, Reply, Usage, tool
from orchestrator._running._budget import Budget, before_request, remaining, spend
from orchestrator.runners import ChildJob
from orchestrator.testing import FakeModel, tool_call
from stores import SQLiteStore

@tool
def noop() -> None:
    '''Do nothing.'''

store = SQLiteStore(sys.argv[1])
spend = Reply(Message.assistant(tool_calls=(tool_call("noop"),)),
              Usage(input_tokens=100, output_tokens=10, requests=1))
worker = Agent(FakeModel([spend] * 50), tools=[noop], name="worker", description="Works.")
agent = Agent(FakeModel(["done"] * 5), tools=[worker], store=store)
state = store.load("root")
before = state.usage.input_tokens + state.usage.output_tokens
agent.run(state, limits=Limits(total_tokens=1500))
after = state.usage.input_tokens + state.usage.output_tokens
children = [store.load(info.id) for info in store.list(parent_id="root")]
stops = {f"{child.stopped.limit}:{child.stopped.owner}" for child in children}
late = [e for e in state.history if e.kind == "tool_result" and e.late]
said = "(the subagent stopped: limit total_tokens=1500 of State root reached"
told = sum(said in e.content.text for e in late)
print(before, after, len(children), told, *sorted(stops))
"""


def test_a_reload_mid_tree_in_a_new_process_continues_the_budget(tmp_path: Path) -> None:
    path = str(tmp_path / "runs.db")
    first = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_FIRST), path], capture_output=True, text=True
    )
    assert first.returncode == 3, first.stderr
    second = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_SECOND), path],
        capture_output=True,
        text=True,
    )
    assert second.returncode == 0, second.stderr
    before, after, children, told, *stops = second.stdout.split()
    assert int(before) >= 4 * ONE  # the first process's children spent; the load kept it
    # The budget went on from there: both children stopped at the root's limit, the tree
    # within one request per running State of it (the root's last request may still fit).
    assert (children, stops) == ("2", ["total_tokens:root"])
    assert told == "2"  # each late result tells the model its subagent stopped at the limit
    assert 1500 - ONE <= int(after) <= 1500 + 3 * ONE


# A child run elsewhere gets what is left, and counts when it ends ------------------------------


class Elsewhere:
    """A runner that runs each child here, but as a runner elsewhere does: with what was left
    of the limits above it as limits of its own, unseen by the parent's budget."""

    def check(self, job: ChildJob) -> None:
        """Every job runs."""

    async def run(self, job: ChildJob) -> State:
        state = await job.open_state()
        limits = job.remaining if job.limits is None else job.limits.tighter(job.remaining)
        child = functools.partial(job.agent.arun, state, link=job.link, limits=limits)

        def there() -> None:  # a thread with a loop of its own, and no run of this process
            contextvars.Context().run(anyio.run, child)

        await anyio.to_thread.run_sync(there)
        return state


def test_remaining_is_what_is_left_of_every_limit_up_the_chain() -> None:
    state = user_state()
    top = Budget(Limits(requests=10, total_tokens=1000, depth=3), state, None, 0)
    below = Budget(Limits(requests=4, children=2), user_state(), top, 1)
    spend(top, state.id, Usage(input_tokens=300, output_tokens=50, requests=1))
    assert before_request(below, state.id, 0) is None
    assert remaining(below, 2) == Limits(requests=3, total_tokens=650, children=2, depth=1)


@pytest.mark.anyio
async def test_a_child_run_elsewhere_gets_what_is_left_and_counts_when_it_ends() -> None:
    worker = Agent(busy_model(20), tools=[noop], name="worker", description="Does work.")
    lead_model = FakeModel(
        [Reply(Message.assistant(tool_calls=(tool_call("worker", task="a"),)), Usage(requests=1))]
    )
    agent = Agent(lead_model, tools=[worker.as_tool(runner=Elsewhere())])
    state = user_state()
    await agent.arun(state, limits=Limits(requests=3))
    (entry,) = [e for e in state.history if isinstance(e, ToolResultEntry)]
    child = state.child(entry.child_ids[0])
    assert child.usage.requests == 2  # what was left when it started
    assert isinstance(child.stopped, StoppedByLimit)
    assert child.stopped.limit == "requests"
    assert isinstance(state.stopped, StoppedByLimit)  # its spending counted when it ended
    assert (state.stopped.limit, state.stopped.spent) == ("requests", 3)


@pytest.mark.anyio
async def test_a_time_limit_used_up_sends_nothing_and_is_logged() -> None:
    model = busy_model(3)
    state = user_state()
    with structlog.testing.capture_logs() as logs:
        await Agent(model, tools=[noop]).arun(state, limits=Limits(seconds=0))
    assert model.requests == []
    assert isinstance(state.stopped, StoppedByLimit)
    assert (state.stopped.limit, state.stopped.maximum) == ("seconds", 0)
    (event,) = [log for log in logs if log["event"] == "state.limit.reached"]
    assert (event["log_level"], event["limit"], event["owner"]) == ("warning", "seconds", state.id)


@pytest.mark.anyio
async def test_a_child_a_tool_starts_itself_is_refused_past_the_children_limit() -> None:
    helper = Agent(FakeModel([spending("ok") for _ in range(3)]))

    @tool
    async def ask_helper(question: str) -> str:
        """Ask the helper."""
        return str(await helper.arun(question))

    calls = tuple(tool_call("ask_helper", question=f"q{n}") for n in range(3))
    lead = FakeModel([Reply(Message.assistant(tool_calls=calls), Usage(requests=1)), "done"])
    state = user_state()
    await Agent(lead, tools=[ask_helper]).arun(state, limits=Limits(children=2))
    results = [e for e in state.history if isinstance(e, ToolResultEntry)]
    assert sum(len(e.child_ids) for e in results) == 2
    refused = [e for e in results if not e.child_ids]
    assert len(refused) == 1
    assert "LimitReachedError: limit children=2 of State" in refused[0].content.text


@pytest.mark.anyio
async def test_ask_and_compact_requests_count_against_the_limits() -> None:
    model = FakeModel([spending("hello"), spending("42"), spending("a summary"), spending("x")])
    agent = Agent(model, limits=Limits(requests=3))
    state = user_state()
    await agent.arun(state)
    assert await agent.aask(state, "How many?", returns=int) == 42
    await agent.acompact(state)
    with pytest.raises(LimitReachedError, match="limit requests=3 of State"):
        await agent.aask(state, "And now?")
    assert len(model.requests) == 3


@pytest.mark.anyio
async def test_an_events_stream_shows_a_run_its_limits_stop() -> None:
    agent = Agent(busy_model(5), tools=[noop])
    state = user_state()
    async with agent.events(state, limits=Limits(requests=2)) as events:
        kinds = [event.kind async for event in events]
    assert kinds.count("model_reply") == 2
    assert isinstance(state.stopped, StoppedByLimit)
    assert state.stopped.limit == "requests"
