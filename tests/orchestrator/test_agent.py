"""The Agent end to end with FakeModel: run/arun, think, use_tools, ask, compact, copy, settings.

Every scenario checks that the State stays replayable: a State rebuilt from its history has the
same value (`State(history=s.history).snapshot() == s.snapshot()`).
"""

from __future__ import annotations

import re
import threading
from typing import Any

import anyio
import pydantic
import pytest

from orchestrator import (
    Agent,
    AskEntry,
    ContextChangeEntry,
    Loop,
    Message,
    OutputError,
    Reply,
    Reporter,
    RunStartEntry,
    State,
    StoppedByFinish,
    StoppedByLimit,
    StoppedByPermission,
    StoppedByUntil,
    ToolResultEntry,
    Usage,
    loop,
    tool,
    waiting_for_user,
)
from orchestrator.models import Request
from orchestrator.permissions import AllowByName, DenyByName
from orchestrator.testing import FakeModel, FakeModelExhausted, tool_call
from tests.doubles import Point, add, assert_replays, errors, results

# Helpers --------------------------------------------------------------------------------------


def kinds(state: State) -> list[str]:
    return [entry.kind for entry in state.history]


def user_state(text: str = "Find the bug") -> State:
    return State(messages=[Message.user(text)])


class Review(pydantic.BaseModel):
    verdict: str
    score: int


# run / arun -----------------------------------------------------------------------------------


def test_run_with_a_str_prompt_returns_the_answer() -> None:
    model = FakeModel(["Hello!"])
    agent = Agent(model, instructions="Be brief.")
    assert agent.run("Say hello") == "Hello!"
    assert len(model.requests) == 1
    request = model.requests[0]
    assert request.system == "Be brief."
    assert request.messages == (Message.user("Say hello"),)


@pytest.mark.anyio
async def test_arun_records_one_turn_and_stops_waiting_for_the_user() -> None:
    model = FakeModel(["Found it in b.py."])
    agent = Agent(model, name="finder", tools=[add])
    state = user_state()
    answer = await agent.arun(state)
    assert answer == "Found it in b.py."
    assert state.answer == answer
    assert kinds(state) == [
        "context_change",
        "run_start",
        "prompt",  # what the model is told: recorded before its first request
        "model_request",
        "model_reply",
        "stop",
    ]
    start = state.history[1]
    assert isinstance(start, RunStartEntry)
    assert start.content.agent == "finder"
    assert start.content.model == "fake"
    assert tuple(start.content.tools) == ("add",)
    assert start.parent_id is None
    assert start.parent_call_id is None
    assert state.stopped == StoppedByUntil("waiting_for_user")
    assert state.turn == 1
    assert state.pending_calls == ()
    assert not state.finished
    assert state.usage.requests == 1
    assert [m.role for m in state.messages] == ["user", "assistant"]
    assert_replays(state)


@pytest.mark.anyio
async def test_the_request_carries_instructions_messages_and_tool_specs() -> None:
    model = FakeModel(["ok"])
    agent = Agent(model, instructions="You fix bugs.", tools=[add])
    state = user_state()
    await agent.arun(state)
    request = model.requests[0]
    assert request.system == "You fix bugs."
    assert request.messages == (Message.user("Find the bug"),)
    assert request.tools == (add.spec,)


@pytest.mark.anyio
async def test_the_default_loop_runs_the_tools_then_thinks_again() -> None:
    call = tool_call("add", a=2, b=3)
    model = FakeModel([call, "The sum is 5."])
    agent = Agent(model, tools=[add])
    state = user_state("Add 2 and 3")
    assert await agent.arun(state) == "The sum is 5."
    (result,) = results(state)
    assert result.call == call
    assert result.outcome == "done"
    assert result.content.text == "5"
    assert not result.content.is_error
    # The second request saw the call and its result, in that order.
    seen = model.requests[1].messages
    assert seen[1].tool_calls == (call,)
    assert [block.call_id for block in seen[2].tool_results] == [call.id]
    assert state.turn == 2
    assert_replays(state)


@pytest.mark.parametrize("prompt", ["", "   \n"])
def test_run_refuses_an_empty_prompt(prompt: str) -> None:
    model = FakeModel(["never"])
    with pytest.raises(ValueError, match="empty prompt"):
        Agent(model).run(prompt)
    assert model.requests == []


@pytest.mark.parametrize("value", [42, None, Message.user("hi"), [Message.user("hi")]])
def test_run_refuses_what_is_not_a_state_or_a_str(value: Any) -> None:
    model = FakeModel(["never"])
    with pytest.raises(TypeError, match="State"):
        Agent(model).run(value)
    assert model.requests == []


@pytest.mark.anyio
async def test_a_state_runs_again_after_a_new_user_message() -> None:
    seen_stopped: list[object] = []

    class Watch(Reporter):
        def on_run_start(self, state: State) -> None:
            seen_stopped.append(state.stopped)

    model = FakeModel(["first", "second"])
    agent = Agent(model, reporter=Watch())
    state = user_state()
    assert await agent.arun(state) == "first"
    assert state.stopped == StoppedByUntil("waiting_for_user")
    state.add_message(Message.user("And now?"))
    assert await agent.arun(state) == "second"
    # run/arun reset `stopped` at the start of each run.
    assert seen_stopped == [None, None]
    assert [m.text for m in state.messages] == ["Find the bug", "first", "And now?", "second"]
    assert_replays(state)


@pytest.mark.anyio
async def test_a_run_on_a_state_waiting_for_the_user_sends_nothing() -> None:
    model = FakeModel(["first"])
    agent = Agent(model)
    state = user_state()
    await agent.arun(state)
    # Nothing new from the user: the default loop stops before its first turn.
    assert await agent.arun(state) == "first"
    assert len(model.requests) == 1
    assert state.stopped == StoppedByUntil("waiting_for_user")
    assert_replays(state)


def test_a_script_that_runs_out_fails_clearly_and_the_turn_is_taken_back() -> None:
    model = FakeModel([])
    state = user_state()
    with pytest.raises(FakeModelExhausted, match="ran out of replies"):
        Agent(model).run(state)
    assert state.turn == 0
    assert len(errors(state)) == 1
    assert errors(state)[0].startswith("FakeModelExhausted: ")
    assert_replays(state)


# @loop: until / limit and the Stopped values ---------------------------------------------------


@pytest.mark.anyio
async def test_a_limit_stops_the_loop_with_stopped_by_limit() -> None:
    @loop(limit=2)
    async def forever(agent: Agent, state: State) -> None:
        await agent.athink(state)
        if state.pending_calls:
            await agent.ause_tools(state)

    model = FakeModel([tool_call("add", a=1, b=1) for _ in range(5)])
    agent = Agent(model, tools=[add], loop=forever)
    state = user_state()
    assert await agent.arun(state) is None  # no reply without tool calls yet
    assert state.stopped == StoppedByLimit(2)
    assert len(model.requests) == 2
    assert state.turn == 2
    assert kinds(state)[-1] == "stop"
    assert_replays(state)


@pytest.mark.anyio
async def test_an_until_function_stops_with_its_name_before_the_limit() -> None:
    turns_seen: list[int] = []

    def two_turns(state: State) -> bool:
        turns_seen.append(state.turn)
        return state.turn >= 2

    @loop(until=[two_turns], limit=2)
    async def body(agent: Agent, state: State) -> None:
        await agent.athink(state)
        if state.pending_calls:
            await agent.ause_tools(state)

    model = FakeModel([tool_call("add", a=1, b=1) for _ in range(5)])
    state = user_state()
    await Agent(model, tools=[add], loop=body).arun(state)
    # After two turns both would stop the loop: `until` is checked before the limit.
    assert state.stopped == StoppedByUntil("two_turns")
    assert turns_seen == [0, 1, 2]
    assert len(model.requests) == 2
    assert_replays(state)


@pytest.mark.anyio
async def test_an_until_that_is_true_at_once_runs_no_turn() -> None:
    def always(state: State) -> bool:
        return True

    @loop(until=[always])
    async def body(agent: Agent, state: State) -> None:
        await agent.athink(state)

    model = FakeModel(["never"])
    state = user_state()
    await Agent(model, loop=body).arun(state)
    assert state.stopped == StoppedByUntil("always")
    assert model.requests == []
    assert kinds(state) == ["context_change", "run_start", "stop"]
    assert_replays(state)


@pytest.mark.anyio
async def test_a_decided_stop_is_checked_before_until_and_limit() -> None:
    until_calls: list[int] = []

    def never(state: State) -> bool:
        until_calls.append(state.turn)
        return False

    @loop(until=[never], limit=1)
    async def body(agent: Agent, state: State) -> None:
        await agent.athink(state)
        if state.pending_calls:
            await agent.ause_tools(state)

    @tool
    def rm(path: str) -> str:
        return "removed"

    model = FakeModel([tool_call("rm", path="/")])
    agent = Agent(
        model,
        tools=[rm],
        loop=body,
        permissions=[AllowByName("*"), DenyByName("rm", stop=True)],
    )
    state = user_state()
    await agent.arun(state)
    # The permission stop decided the end: neither `until` nor the limit was asked after it.
    assert type(state.stopped).__name__ == "StoppedByPermission"
    assert until_calls == [0]
    assert [e.kind for e in state.history].count("stop") == 1
    assert_replays(state)


def test_loop_options_are_checked() -> None:
    with pytest.raises(ValueError, match="limit"):
        loop(limit=0)(lambda agent, state: None)  # pyright: ignore[reportUnknownLambdaType]
    with pytest.raises(ValueError, match="limit"):
        loop(limit=True)(lambda agent, state: None)  # pyright: ignore[reportUnknownLambdaType]
    with pytest.raises(TypeError, match="until"):
        loop(until=["waiting_for_user"])(lambda agent, state: None)  # pyright: ignore[reportArgumentType, reportUnknownLambdaType]


def test_loop_accepts_both_forms_and_a_misuse_says_how_to_fix_it() -> None:
    # DESIGN 3: "every misuse raises TypeError/ValueError whose message names the problem and the
    # fix"; DESIGN 6: the form is @loop(until=[...], limit=N). A bare @loop and a single until
    # function are accepted too (the forms a user reaches for).
    def body(agent: Agent, state: State) -> None:
        return None

    bare = loop(body)
    assert isinstance(bare, Loop)
    assert bare.until == ()
    assert bare.limit == 50
    single = loop(until=waiting_for_user)(body)
    assert single.until == (waiting_for_user,)
    with pytest.raises(TypeError, match=re.escape("@loop(until=...)")):
        loop(until=5)  # pyright: ignore[reportArgumentType]  # neither a function nor a list


@pytest.mark.anyio
async def test_until_functions_are_checked_in_order_and_the_first_true_one_is_named() -> None:
    # DESIGN 6: before each turn "each until function (StoppedByUntil(fn.__name__))", in order.
    def never(state: State) -> bool:
        return False

    def after_one(state: State) -> bool:
        return state.turn >= 1

    def also_after_one(state: State) -> bool:
        return state.turn >= 1

    @loop(until=[never, after_one, also_after_one], limit=9)
    async def body(agent: Agent, state: State) -> None:
        await agent.athink(state)

    state = State(messages=[Message.user("go")])
    await Agent(FakeModel(["x", "y"]), loop=body).arun(state)
    assert state.stopped == StoppedByUntil("after_one")
    assert state.turn == 1


@pytest.mark.anyio
async def test_a_loop_called_again_from_a_plain_loop_runs_after_its_until_stop() -> None:
    # Seed 004 stopped: "A @loop called inside such a loop leaves its until/limit reason set, so a
    # loop without @loop that calls one checks only for StoppedByFinish/StoppedByPermission";
    # DESIGN 6: a @loop checks "a decided stop (finish, permission stop)", then until, then limit.
    @loop(until=[waiting_for_user], limit=5)
    async def inner(agent: Agent, state: State) -> None:
        await agent.athink(state)
        if state.pending_calls:
            await agent.ause_tools(state)

    async def outer(agent: Agent, state: State) -> None:
        for text in ("second", "third", None):
            await inner(agent, state)
            if isinstance(state.stopped, StoppedByFinish | StoppedByPermission) or text is None:
                return
            state.add_message(Message.user(text))

    model = FakeModel(["a", "b", "c"])
    state = State(messages=[Message.user("first")])
    await Agent(model, loop=outer).arun(state)
    assert [m.text for m in state.messages] == ["first", "a", "second", "b", "third", "c"]
    assert len(model.requests) == 3
    assert state.stopped == StoppedByUntil("waiting_for_user")


def test_waiting_for_user_reads_the_last_message() -> None:
    assert waiting_for_user(State())
    assert not waiting_for_user(user_state())
    state = State(messages=[Message.user("hi"), Message.assistant("hello")])
    assert waiting_for_user(state)


# finish ---------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_finish_from_a_tool_ends_the_run_after_the_turn() -> None:
    finished = anyio.Event()

    @tool
    def submit(state: State, verdict: str) -> str:
        state.finish({"verdict": verdict})
        return "submitted"

    @tool
    async def note() -> str:
        # Still running when submit finishes the State: it gets its result all the same.
        await finished.wait()
        return "noted"

    class Watch(Reporter):
        def on_tool_end(self, state: State, call: Any, entry: ToolResultEntry) -> None:
            if call.name == "submit":
                finished.set()

    calls = [tool_call("note"), tool_call("submit", verdict="fixed")]
    model = FakeModel([calls, "never asked"])
    agent = Agent(model, tools=[submit, note], reporter=Watch())
    state = user_state()
    answer = await agent.arun(state)
    assert answer == {"verdict": "fixed"}
    assert state.finished
    assert state.stopped == StoppedByFinish({"verdict": "fixed"})
    assert len(model.requests) == 1
    assert model.remaining == 1
    assert {r.call.name: r.outcome for r in results(state)} == {"submit": "done", "note": "done"}
    assert state.pending_calls == ()
    # The turn's results entered the messages, in request order.
    assert [b.call_id for b in state.messages[-1].tool_results] == [c.id for c in calls]
    assert_replays(state)


def test_a_finished_state_refuses_every_action() -> None:
    model = FakeModel(["never"])
    agent = Agent(model, tools=[add])
    state = user_state()
    state.finish("done")
    before = state.snapshot()
    with pytest.raises(ValueError, match="finished"):
        agent.run(state)
    with pytest.raises(ValueError, match="finished"):
        agent.think(state)
    with pytest.raises(ValueError, match="finished"):
        agent.use_tools(state)
    with pytest.raises(ValueError, match="finished"):
        agent.ask(state, "Why?")
    assert model.requests == []
    assert state.snapshot() == before
    assert state.answer == "done"


@pytest.mark.anyio
async def test_a_finished_state_refuses_arun() -> None:
    model = FakeModel(["never"])
    state = user_state()
    state.finish()
    size = len(state.history)
    with pytest.raises(ValueError, match="finished"):
        await Agent(model).arun(state)
    assert len(state.history) == size
    assert model.requests == []


# copy and settings ----------------------------------------------------------------------------


def test_copy_changes_only_the_given_settings() -> None:
    model = FakeModel(["a", "b"])
    agent = Agent(model, instructions="one", tools=[add], name="first", max_concurrency=3)
    variant = agent.copy(instructions="two", name="second")
    assert variant is not agent
    assert variant.instructions == "two"
    assert variant.name == "second"
    assert variant.model is model
    assert variant.tools == agent.tools
    assert variant.max_concurrency == 3
    # The original is untouched.
    assert agent.instructions == "one"
    assert agent.name == "first"
    assert variant.run("hi") == "a"
    assert model.requests[0].system == "two"


def test_copy_refuses_unknown_settings_and_checks_values() -> None:
    agent = Agent(FakeModel([]))
    with pytest.raises(TypeError, match="instruction"):
        agent.copy(instruction="typo")
    with pytest.raises(ValueError, match="max_concurrency"):
        agent.copy(max_concurrency=0)


def test_settings_are_read_only() -> None:
    agent = Agent(FakeModel([]), instructions="one")
    with pytest.raises(AttributeError):
        agent.instructions = "two"  # pyright: ignore[reportAttributeAccessIssue]
    assert agent.instructions == "one"


def test_constructing_an_agent_never_calls_the_model() -> None:
    model = FakeModel(["a"])
    Agent(model, instructions="x", tools=[add], permissions=[AllowByName("*")])
    assert model.requests == []
    assert model.remaining == 1


@pytest.mark.parametrize(
    ("settings", "error", "words"),
    [
        ({"model": 42}, TypeError, "Model"),
        ({"model": "gpt-4o"}, ValueError, "provider:model"),
        ({"instructions": 3}, TypeError, "instructions"),
        ({"name": "has space"}, ValueError, "name"),
        ({"name": ""}, ValueError, "name"),
        ({"description": 1}, TypeError, "description"),
        ({"tools": "add"}, TypeError, "list of tools"),
        ({"tools": [add, add]}, ValueError, "unique"),
        ({"tools": [42]}, TypeError, "not a tool"),
        ({"permissions": AllowByName("*")}, TypeError, "list"),
        ({"permissions": ["add"]}, TypeError, "AllowByName"),
        ({"reporter": object()}, TypeError, "Reporter"),
        ({"loop": 5}, TypeError, "loop"),
        ({"max_concurrency": 0}, ValueError, "max_concurrency"),
        ({"max_concurrency": True}, ValueError, "max_concurrency"),
        ({"max_concurrency": 1.5}, ValueError, "max_concurrency"),
        ({"tool_timeout": 0}, ValueError, "tool_timeout"),
        ({"tool_timeout": -1.0}, ValueError, "tool_timeout"),
        ({"tool_timeout": "5"}, ValueError, "tool_timeout"),
        ({"state_schema": {"messages": {"type": str}}}, ValueError, "messages"),
    ],
)
def test_settings_are_checked_at_construction(
    settings: dict[str, Any], error: type[Exception], words: str
) -> None:
    arguments: dict[str, Any] = {"model": FakeModel([]), **settings}
    model = arguments.pop("model")
    with pytest.raises(error, match=words):
        Agent(model, **arguments)


def test_positional_settings_are_refused() -> None:
    with pytest.raises(TypeError):
        Agent(FakeModel([]), "instructions")  # pyright: ignore[reportCallIssue]


# one run at a time ----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_one_run_at_a_time_per_state() -> None:
    started = anyio.Event()
    release = anyio.Event()

    @tool
    async def wait() -> str:
        started.set()
        await release.wait()
        return "waited"

    model = FakeModel([tool_call("wait"), "done"])
    agent = Agent(model, tools=[wait])
    other = FakeModel(["other"])
    state = user_state()
    async with anyio.create_task_group() as group:
        group.start_soon(agent.arun, state)
        await started.wait()
        size = len(state.history)
        for _ in range(2):  # a refused run must not end the running one
            with pytest.raises(ValueError, match="already running"):
                await Agent(other).arun(state)
        assert len(state.history) == size
        assert other.requests == []
        release.set()
    assert state.answer == "done"
    # Once the run ended, the State runs again.
    state.add_message(Message.user("again"))
    assert await Agent(FakeModel(["again done"])).arun(state) == "again done"
    assert_replays(state)


@pytest.mark.anyio
async def test_one_run_at_a_time_also_from_a_worker_thread() -> None:
    started = anyio.Event()
    release = anyio.Event()
    refused: list[BaseException] = []

    @tool
    async def wait() -> str:
        started.set()
        await release.wait()
        return "waited"

    agent = Agent(FakeModel([tool_call("wait"), "done"]), tools=[wait])
    state = user_state()

    def second_run() -> None:
        try:
            Agent(FakeModel(["other"])).run(state)
        except ValueError as error:
            refused.append(error)

    async with anyio.create_task_group() as group:
        group.start_soon(agent.arun, state)
        await started.wait()
        await anyio.to_thread.run_sync(second_run)
        release.set()
    assert len(refused) == 1
    assert "already running" in str(refused[0])
    assert state.answer == "done"
    assert_replays(state)


# sync methods and the event loop -------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("method", ["run", "think", "use_tools", "compact"])
async def test_a_sync_method_on_an_event_loop_thread_names_its_async_twin(method: str) -> None:
    model = FakeModel(["never"])
    agent = Agent(model)
    state = user_state()
    before = state.snapshot()
    with pytest.raises(TypeError, match=rf"\ba{method}\("):
        getattr(agent, method)(state)
    assert model.requests == []
    assert state.snapshot() == before


@pytest.mark.anyio
async def test_sync_ask_on_an_event_loop_thread_names_aask() -> None:
    model = FakeModel(["never"])
    state = user_state()
    with pytest.raises(TypeError, match=r"\baask\("):
        Agent(model).ask(state, "Why?")
    assert model.requests == []


@pytest.mark.anyio
async def test_a_sync_tool_runs_a_subagent_from_its_worker_thread() -> None:
    main_thread = threading.get_ident()
    tool_threads: list[int] = []
    child_model = FakeModel([Reply(Message.assistant("b.py:12"), Usage(requests=1, cost=0.25))])
    researcher = Agent(child_model, name="researcher")

    @tool
    def delegate(task: str) -> str:
        tool_threads.append(threading.get_ident())
        return str(researcher.run(task))

    call = tool_call("delegate", task="find the line")
    parent_model = FakeModel(
        [
            Reply(Message.assistant(tool_calls=[call]), Usage(requests=1, cost=1.0)),
            Reply(Message.assistant("It is b.py:12."), Usage(requests=1, cost=0.5)),
        ]
    )
    state = user_state()
    answer = await Agent(parent_model, tools=[delegate]).arun(state)
    assert answer == "It is b.py:12."
    assert tool_threads
    assert tool_threads[0] != main_thread
    (result,) = results(state)
    assert result.outcome == "done"
    assert result.content.text == "b.py:12"
    (child_id,) = result.child_ids
    child = state.child(child_id)
    assert child is state.child(child_id)
    assert child.parent_id == state.id
    assert child.parent_call_id == call.id
    assert child.answer == "b.py:12"
    assert child_model.requests[0].messages == (Message.user("find the line"),)
    # The parent's usage includes the child's once the call closed.
    assert result.usage.requests == 1
    assert state.usage.requests == 3
    assert state.usage.cost == pytest.approx(1.75)  # pyright: ignore[reportUnknownMemberType]
    assert_replays(state)
    assert_replays(child)


@pytest.mark.anyio
async def test_parallel_sync_tools_each_run_their_own_subagent() -> None:
    @tool
    def delegate(task: str) -> str:
        agent = Agent(FakeModel([f"answer to {task}"]))
        return str(agent.run(task))

    calls = [tool_call("delegate", task="a"), tool_call("delegate", task="b")]
    state = user_state()
    await Agent(FakeModel([calls, "done"]), tools=[delegate]).arun(state)
    by_call = {r.call.id: r for r in results(state)}
    for call, task in zip(calls, ["a", "b"], strict=True):
        result = by_call[call.id]
        (child_id,) = result.child_ids
        child = state.child(child_id)
        assert child.parent_call_id == call.id
        assert child.answer == f"answer to {task}"
        assert result.content.text == f"answer to {task}"
    assert_replays(state)


@pytest.mark.anyio
@pytest.mark.parametrize("sync", [True, False])
async def test_a_failing_subagent_becomes_the_call_error_result(sync: bool) -> None:
    failure = RuntimeError("child model down")

    def child_agent() -> Agent:
        return Agent(FakeModel([failure]), name="child")

    @tool(name="delegate")
    def sync_delegate(task: str) -> str:
        return str(child_agent().run(task))

    @tool(name="delegate")
    async def async_delegate(task: str) -> str:
        return str(await child_agent().arun(task))

    call = tool_call("delegate", task="dig")
    model = FakeModel([call, "The helper failed."])
    state = user_state()
    delegate = sync_delegate if sync else async_delegate
    assert await Agent(model, tools=[delegate]).arun(state) == "The helper failed."
    (result,) = results(state)
    assert result.outcome == "error"
    assert result.content.is_error
    assert "child model down" in result.content.text
    (child_id,) = result.child_ids
    child = state.child(child_id)
    assert errors(child) == ["RuntimeError: child model down"]
    assert child.parent_call_id == call.id
    assert errors(state) == []
    assert_replays(state)
    assert_replays(child)


@pytest.mark.anyio
async def test_a_sync_loop_body_hops_onto_the_running_loop() -> None:
    threads: list[int] = []

    @loop(until=[waiting_for_user], limit=5)
    def body(agent: Agent, state: State) -> None:
        threads.append(threading.get_ident())
        agent.think(state)
        if state.pending_calls:
            agent.use_tools(state)

    model = FakeModel([tool_call("add", a=1, b=2), "3"])
    state = user_state()
    answer = await Agent(model, tools=[add], loop=body).arun(state)
    assert answer == "3"
    assert len(threads) == 2
    assert threading.get_ident() not in threads
    assert results(state)[0].content.text == "3"
    assert state.stopped == StoppedByUntil("waiting_for_user")
    assert_replays(state)


def test_sync_run_from_a_plain_thread_starts_its_own_event_loop() -> None:
    answers: list[object] = []
    model = FakeModel([tool_call("add", a=1, b=2), "3"])

    def work() -> None:
        answers.append(Agent(model, tools=[add]).run("Add 1 and 2"))

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(10)
    assert answers == ["3"]
    assert len(model.requests) == 2


def test_sync_think_and_use_tools_from_plain_code() -> None:
    call = tool_call("add", a=4, b=5)
    model = FakeModel([call])
    agent = Agent(model, tools=[add])
    state = user_state()
    reply = agent.think(state)
    assert reply.message.tool_calls == (call,)
    assert state.pending_calls == (call,)
    assert state.history[-1].content == reply
    agent.use_tools(state)
    assert state.pending_calls == ()
    assert state.messages[-1].tool_results[0].text == "9"
    assert_replays(state)


# think / athink -------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_think_with_pending_calls_is_refused_without_a_request() -> None:
    model = FakeModel([tool_call("add", a=1, b=2), "never"])
    agent = Agent(model, tools=[add])
    state = user_state()
    await agent.athink(state)
    before = state.snapshot()
    with pytest.raises(ValueError, match="pending"):
        await agent.athink(state)
    assert len(model.requests) == 1
    assert state.snapshot() == before


@pytest.mark.anyio
async def test_use_tools_with_nothing_pending_does_nothing() -> None:
    state = user_state()
    before = state.snapshot()
    await Agent(FakeModel([]), tools=[add]).ause_tools(state)
    assert state.snapshot() == before


@pytest.mark.anyio
async def test_a_failed_request_is_taken_back() -> None:
    failure = RuntimeError("the provider is down")
    model = FakeModel(["first answer", failure])
    agent = Agent(model)
    state = user_state()
    await agent.arun(state)
    state.add_message(Message.user("more"))
    before = state.snapshot()
    with pytest.raises(RuntimeError) as caught:
        await agent.athink(state)
    assert caught.value is failure
    assert state.turn == before.turn
    assert state.messages == before.messages
    assert state.answer == "first answer"
    assert state.pending_calls == ()
    assert errors(state) == ["RuntimeError: the provider is down"]
    assert state.history[-2].kind == "model_request"
    # The State thinks again as if the failed request had not happened.
    model2 = FakeModel(["second answer"])
    await Agent(model2).athink(state)
    assert state.turn == before.turn + 1
    assert model2.requests[0].messages == before.messages
    assert_replays(state)


@pytest.mark.anyio
async def test_a_model_that_returns_no_reply_is_a_clear_error_and_is_taken_back() -> None:
    class Broken:
        name = "broken"
        context_window: int | None = None

        async def respond(self, request: Request, *, on_text: Any = None) -> Reply:
            return {"role": "assistant", "content": "hi"}  # pyright: ignore[reportReturnType]

    state = user_state()
    with pytest.raises(TypeError, match="not a Reply"):
        await Agent(Broken()).arun(state)
    assert state.turn == 0
    assert state.pending_calls == ()
    assert len(errors(state)) == 1
    assert_replays(state)
    assert await Agent(FakeModel(["fine"])).arun(state) == "fine"


# ask / aask -----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_ask_returns_text_by_default_and_leaves_the_context_alone() -> None:
    model = FakeModel(["first", "It is about a bug."])
    agent = Agent(model, instructions="sys")
    state = user_state()
    await agent.arun(state)
    before = state.snapshot()
    answer = await agent.aask(state, "What is this about?")
    assert answer == "It is about a bug."
    assert state.messages == before.messages
    assert state.turn == before.turn
    assert state.answer == "first"
    entry = state.history[-1]
    assert isinstance(entry, AskEntry)
    assert entry.content.question == "What is this about?"
    assert entry.content.answer == "It is about a bug."
    assert entry.content.error is None
    assert state.usage.requests == before.usage.requests + 1
    request = model.requests[-1]
    assert request.system == "sys"
    assert request.messages[: len(before.messages)] == before.messages
    assert request.messages[-1].text.startswith("What is this about?")
    assert_replays(state)


@pytest.mark.anyio
async def test_ask_validates_a_pydantic_model_from_a_fenced_block() -> None:
    reply = 'Here you go:\n```json\n{"verdict": "bug", "score": 3}\n```'
    model = FakeModel([reply])
    state = user_state()
    review = await Agent(model).aask(state, "Review it", Review)
    assert review == Review(verdict="bug", score=3)
    entry = state.history[-1]
    assert isinstance(entry, AskEntry)
    assert entry.content.answer == {"verdict": "bug", "score": 3}
    # The model was shown the JSON schema it must follow.
    assert '"score"' in model.requests[0].messages[-1].text
    assert_replays(state)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("returns", "reply", "expected"),
    [
        (list[int], "The numbers are [1, 2, 3].", [1, 2, 3]),
        (int, "42", 42),
        (Point, 'Point: {"x": 1, "y": 2}', Point(1, 2)),
        (dict[str, bool], '{"ok": true}', {"ok": True}),
    ],
)
async def test_ask_validates_with_a_type_adapter(returns: Any, reply: str, expected: Any) -> None:
    state = user_state()
    value = await Agent(FakeModel([reply])).aask(state, "Answer", returns)
    assert value == expected
    assert type(value) is type(expected)
    assert_replays(state)


@pytest.mark.anyio
async def test_ask_retries_with_the_validation_error_shown_to_the_model() -> None:
    model = FakeModel(
        ["not json at all", '{"verdict": "bug", "score": "high"}', '{"verdict": "ok", "score": 1}']
    )
    state = user_state()
    review = await Agent(model).aask(state, "Review it", Review)
    assert review == Review(verdict="ok", score=1)
    assert len(model.requests) == 3
    second = model.requests[1].messages
    assert second[-2] == Message.assistant("not json at all")
    assert "not valid" in second[-1].text
    third = model.requests[2].messages
    assert "score" in third[-1].text  # the pydantic error names the field
    assert state.usage.requests == 3
    assert_replays(state)


@pytest.mark.anyio
async def test_ask_raises_output_error_after_its_retries() -> None:
    model = FakeModel(["nope", "still nope", "never asked"])
    state = user_state()
    before = state.snapshot()
    with pytest.raises(OutputError, match="Review"):
        await Agent(model).aask(state, "Review it", Review, retries=1)
    assert len(model.requests) == 2
    assert state.messages == before.messages
    entry = state.history[-1]
    assert isinstance(entry, AskEntry)
    assert entry.content.answer is None
    assert entry.content.error
    assert state.usage.requests == 2
    assert_replays(state)


@pytest.mark.anyio
async def test_ask_with_no_retries_asks_once() -> None:
    model = FakeModel(["nope", "never asked"])
    with pytest.raises(OutputError):
        await Agent(model).aask(user_state(), "Review it", Review, retries=0)
    assert len(model.requests) == 1


@pytest.mark.anyio
async def test_ask_refuses_bad_arguments_and_open_turns() -> None:
    model = FakeModel([tool_call("add", a=1, b=1), "never"])
    agent = Agent(model, tools=[add])
    state = user_state()
    with pytest.raises(ValueError, match="prompt"):
        await agent.aask(state, "  ")
    with pytest.raises(ValueError, match="retries"):
        await agent.aask(state, "Why?", str, retries=-1)
    await agent.athink(state)
    size = len(state.history)
    with pytest.raises(ValueError, match="pending"):
        await agent.aask(state, "Why?")
    assert len(model.requests) == 1
    assert len(state.history) == size


class Rating(pydantic.BaseModel):
    score: int


@pytest.mark.anyio
async def test_an_ask_that_fails_after_a_reply_still_counts_the_usage_spent() -> None:
    # Seed 004 usage: "Total tokens, requests and cost of every think, ask and compact on this
    # State"; DESIGN 6 ask "retries on a bad format". The first reply's tokens were spent.
    model = FakeModel(
        [
            Reply(Message.assistant("not json"), Usage(input_tokens=7, requests=1)),
            RuntimeError("down"),
        ]
    )
    state = State(messages=[Message.user("Rate it")])
    with pytest.raises(RuntimeError, match="down"):
        await Agent(model).aask(state, "Give a score", Rating, retries=1)
    assert state.usage == Usage(input_tokens=7, requests=1)
    assert_replays(state)


def test_sync_ask_and_compact_from_plain_code() -> None:
    model = FakeModel(['{"verdict": "bug", "score": 2}', "The user asked to find a bug."])
    agent = Agent(model)
    state = State(messages=[Message.user("Find the bug"), Message.assistant("Looking.")])
    assert agent.ask(state, "Review it", Review) == Review(verdict="bug", score=2)
    agent.compact(state)
    assert state.messages[-1].is_notice
    assert "The user asked to find a bug." in state.messages[-1].text
    assert_replays(state)


# compact / acompact ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_compact_replaces_the_messages_with_the_model_summary() -> None:
    summary = Reply(Message.assistant("  Bug is in b.py; fix pending.  "), Usage(requests=1))
    model = FakeModel([summary])
    agent = Agent(model, instructions="sys")
    first = Message.user("Find the bug")
    state = State(messages=[first, Message.assistant("Looking"), Message.user("Keep going")])
    before = state.snapshot()
    await agent.acompact(state)
    assert state.messages[0] == first
    assert len(state.messages) == 2
    assert state.messages[1].is_notice
    assert state.messages[1].text.endswith("Bug is in b.py; fix pending.")
    entry = state.history[-1]
    assert isinstance(entry, ContextChangeEntry)
    assert entry.content.kind == "compact"
    assert entry.content.summary == "Bug is in b.py; fix pending."
    assert state.usage.requests == before.usage.requests + 1
    # History keeps everything; the request carried the whole conversation and a prompt.
    assert state.history[: len(before.history)] == before.history
    request = model.requests[0]
    assert request.system == "sys"
    assert request.messages[:3] == before.messages
    assert request.messages[3].role == "user"
    assert_replays(state)


@pytest.mark.anyio
async def test_compact_with_an_empty_summary_changes_nothing() -> None:
    model = FakeModel(["   "])
    state = State(messages=[Message.user("Find the bug"), Message.assistant("Looking")])
    before = state.snapshot()
    with pytest.raises(OutputError, match="empty summary"):
        await Agent(model).acompact(state)
    assert state.messages == before.messages
    assert not any(
        isinstance(e, ContextChangeEntry) and e.content.kind == "compact" for e in state.history
    )
    assert_replays(state)


@pytest.mark.anyio
async def test_a_compaction_with_an_empty_summary_still_counts_the_usage_spent() -> None:
    # Seed 004 usage: "Total tokens, requests and cost of every think, ask and compact on this
    # State" (an ask with no valid answer counts its usage; a compaction must too).
    model = FakeModel([Reply(Message.assistant("   "), Usage(input_tokens=50, requests=1))])
    state = State(messages=[Message.user("Find the bug"), Message.assistant("Looking")])
    with pytest.raises(OutputError):
        await Agent(model).acompact(state)
    assert state.messages[1].text == "Looking"
    assert state.usage == Usage(input_tokens=50, requests=1)
    assert_replays(state)


@pytest.mark.anyio
async def test_compact_with_pending_calls_is_refused_without_a_request() -> None:
    model = FakeModel([tool_call("add", a=1, b=1), "never"])
    agent = Agent(model, tools=[add])
    state = user_state()
    await agent.athink(state)
    before = state.snapshot()
    with pytest.raises(ValueError, match="pending"):
        await agent.acompact(state)
    assert len(model.requests) == 1
    assert state.snapshot() == before
