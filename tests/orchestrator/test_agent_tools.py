"""Running a turn's tool calls end to end: ordering, held messages, concurrency, timeouts, state
updates and bad input.

Orderings are forced with events and counters; no assertion depends on timing. After every scenario
the State is consistent (every call has exactly one result) and replayable.
"""

from __future__ import annotations

import threading
from typing import Annotated, Any

import anyio
import anyio.lowlevel
import pytest
from pydantic import Field

from orchestrator import (
    Agent,
    ErrorEntry,
    ExtraDataEntry,
    Message,
    ModelReplyEntry,
    Reply,
    Reporter,
    State,
    StateSnapshot,
    ToolCall,
    ToolError,
    ToolResult,
    ToolResultEntry,
    Usage,
    tool,
)
from orchestrator.models import Request
from orchestrator.testing import FakeModel, tool_call
from tests.doubles import add, assert_consistent, assert_replays, result_of, results

# Helpers --------------------------------------------------------------------------------------


def user_state(text: str = "Go", schema: Any = None) -> State:
    return State(messages=[Message.user(text)], schema=schema)


def last_results_ids(state: State) -> list[str]:
    """The call ids of the latest message of tool results, in its order."""
    for message in reversed(state.messages):
        if message.tool_results:
            return [block.call_id for block in message.tool_results]
    raise AssertionError("no message of tool results")


# ordering -------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_results_enter_messages_in_request_order_when_tools_finish_out_of_order() -> None:
    # c finishes first, then b, then a: each waits for the one after it in request order.
    done = {name: anyio.Event() for name in "abc"}
    seen_inside_a: list[StateSnapshot] = []

    @tool
    async def step(name: str, after: str | None = None, state: State | None = None) -> str:
        if after is not None:
            await done[after].wait()
        if name == "a":
            assert state is not None
            seen_inside_a.append(state.snapshot())
        return f"result {name}"

    class Order(Reporter):
        def on_tool_end(self, state: State, call: ToolCall, entry: ToolResultEntry) -> None:
            done[str(call.args["name"])].set()

    calls = [
        tool_call("step", name="a", after="b"),
        tool_call("step", name="b", after="c"),
        tool_call("step", name="c"),
    ]
    model = FakeModel([calls, "all done"])
    state = user_state()
    await Agent(model, tools=[step], reporter=Order()).arun(state)

    # History records them as they finished ...
    assert [r.call.args["name"] for r in results(state)] == ["c", "b", "a"]
    # ... while the model sees them together, in request order.
    assert last_results_ids(state) == [c.id for c in calls]
    results_message = model.requests[1].messages[-1]
    assert [b.text for b in results_message.tool_results] == ["result a", "result b", "result c"]
    # Before the last result, none of them was in the messages.
    (inside,) = seen_inside_a
    assert inside.pending_calls == (calls[0],)
    assert not any(m.tool_results for m in inside.messages)
    assert_consistent(state)


@pytest.mark.anyio
async def test_sync_tools_finishing_out_of_order_keep_request_order() -> None:
    b_recorded = threading.Event()

    @tool
    def slow(name: str) -> str:
        if name == "a":  # a, in its worker thread, waits until b's result is recorded
            assert b_recorded.wait(10)
        return name

    class Done(Reporter):
        def on_tool_end(self, state: State, call: ToolCall, entry: ToolResultEntry) -> None:
            if call.args["name"] == "b":
                b_recorded.set()

    calls = [tool_call("slow", name="a"), tool_call("slow", name="b")]
    state = user_state()
    await Agent(FakeModel([calls, "ok"]), tools=[slow], reporter=Done()).arun(state)
    assert [r.call.args["name"] for r in results(state)] == ["b", "a"]
    assert last_results_ids(state) == [c.id for c in calls]
    assert_consistent(state)


@pytest.mark.anyio
async def test_repeated_call_ids_in_a_reply_each_get_their_own_result() -> None:
    same = [ToolCall("dup", "echo", {"text": "one"}), ToolCall("dup", "echo", {"text": "two"})]

    @tool
    def echo(text: str) -> str:
        return text

    model = FakeModel([same, "ok"])
    state = user_state()
    await Agent(model, tools=[echo]).arun(state)
    reply = next(e for e in state.history if isinstance(e, ModelReplyEntry))
    ids = [c.id for c in reply.tool_calls]
    assert len(set(ids)) == 2
    assert [r.content.text for r in sorted(results(state), key=lambda r: ids.index(r.call.id))] == [
        "one",
        "two",
    ]
    assert_consistent(state)


# held messages --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_message_added_while_the_model_is_waited_on_goes_after_the_turn() -> None:
    state = user_state()
    call = tool_call("echo", text="x")

    def reply_with_a_call(request: Request) -> ToolCall:
        state.add_message(Message.user("Also check c.py"))  # while think waits on the model
        return call

    @tool
    def echo(text: str) -> str:
        return text

    model = FakeModel([reply_with_a_call, "Checked both."])
    await Agent(model, tools=[echo]).arun(state)
    texts = [m.text if not m.tool_results else "<results>" for m in state.messages]
    # The reply, then its results, then the held message.
    assert texts == ["Go", "", "<results>", "Also check c.py", "Checked both."]
    assert model.requests[1].messages[-1] == Message.user("Also check c.py")
    assert_consistent(state)


@pytest.mark.anyio
async def test_a_message_added_during_a_text_reply_is_answered_in_another_turn() -> None:
    state = user_state()

    def first(request: Request) -> str:
        state.add_message(Message.user("One more thing"))
        return "First answer"

    model = FakeModel([first, "Second answer"])
    answer = await Agent(model).arun(state)
    # The loop does not stop waiting for the user while a user message is unanswered.
    assert answer == "Second answer"
    assert [m.text for m in state.messages] == [
        "Go",
        "First answer",
        "One more thing",
        "Second answer",
    ]
    assert model.requests[1].messages[-1] == Message.user("One more thing")
    assert_consistent(state)


@pytest.mark.anyio
async def test_messages_added_while_tools_run_go_right_after_the_results() -> None:
    release = anyio.Event()
    started = anyio.Event()

    @tool
    async def work(state: State) -> str:
        state.add_message(Message.notice("from the tool"))
        started.set()
        await release.wait()
        return "worked"

    @tool
    async def other() -> str:
        await release.wait()
        return "other"

    calls = [tool_call("work"), tool_call("other")]
    model = FakeModel([calls, "done"])
    state = user_state()
    async with anyio.create_task_group() as group:
        group.start_soon(Agent(model, tools=[work, other]).arun, state)
        await started.wait()
        state.add_message(Message.user("from outside"))
        # Held: the messages did not change while calls are pending.
        assert state.pending_calls == tuple(calls)
        assert state.messages[-1].tool_calls == tuple(calls)
        release.set()
    after_call = [m.text if not m.tool_results else "<results>" for m in state.messages[2:]]
    assert after_call == ["<results>", "[notice] from the tool", "from outside", "done"]
    kinds = [e.kind for e in state.history]
    assert kinds.index("notice") < kinds.index("user", 1) < kinds.index("tool_result")
    assert_consistent(state)


# parallel and serial --------------------------------------------------------------------------


@pytest.mark.anyio
async def test_parallel_calls_run_at_the_same_time() -> None:
    arrived = {"a": anyio.Event(), "b": anyio.Event()}

    @tool
    async def meet(me: str, other: str) -> str:
        arrived[me].set()
        await arrived[other].wait()  # deadlocks unless both run at once
        return me

    calls = [tool_call("meet", me="a", other="b"), tool_call("meet", me="b", other="a")]
    state = user_state()
    with anyio.fail_after(10):
        await Agent(FakeModel([calls, "ok"]), tools=[meet]).arun(state)
    assert {r.content.text for r in results(state)} == {"a", "b"}
    assert_consistent(state)


@pytest.mark.anyio
async def test_sync_parallel_calls_run_in_worker_threads_at_the_same_time() -> None:
    barrier = threading.Barrier(2, timeout=10)

    @tool
    def meet(me: str) -> str:
        barrier.wait()  # raises BrokenBarrierError unless both run at once
        return me

    calls = [tool_call("meet", me="a"), tool_call("meet", me="b")]
    state = user_state()
    await Agent(FakeModel([calls, "ok"]), tools=[meet]).arun(state)
    assert [r.outcome for r in results(state)] == ["done", "done"]
    assert_consistent(state)


@pytest.mark.anyio
async def test_serial_calls_run_after_the_parallel_ones_one_by_one_in_request_order() -> None:
    log: list[str] = []
    running = 0
    both_started = anyio.Event()

    @tool(parallel=False)
    async def serial(name: str) -> str:
        log.append(f"start {name}")
        await anyio.lowlevel.checkpoint()
        log.append(f"end {name}")
        return name

    @tool
    async def para(name: str) -> str:
        nonlocal running
        running += 1
        log.append(f"start {name}")
        if running == 2:
            both_started.set()
        await both_started.wait()
        log.append(f"end {name}")
        return name

    calls = [
        tool_call("serial", name="s1"),
        tool_call("para", name="p1"),
        tool_call("serial", name="s2"),
        tool_call("para", name="p2"),
    ]
    state = user_state()
    with anyio.fail_after(10):
        await Agent(FakeModel([calls, "ok"]), tools=[serial, para]).arun(state)
    parallel_part = log[:4]
    assert sorted(parallel_part) == ["end p1", "end p2", "start p1", "start p2"]
    assert log[4:] == ["start s1", "end s1", "start s2", "end s2"]
    assert last_results_ids(state) == [c.id for c in calls]
    assert_consistent(state)


# max_concurrency ------------------------------------------------------------------------------


async def _peak_async(max_concurrency: int | None, count: int) -> int:
    active = 0
    started = 0
    peak = 0

    @tool
    async def job(n: int) -> str:
        nonlocal active, started, peak
        active += 1
        started += 1
        peak = max(peak, active)
        # Wait (by checkpoints, not time) until the limit is reached or nobody else can start.
        limit = max_concurrency or count
        while active < limit and started < count:
            await anyio.lowlevel.checkpoint()
        await anyio.lowlevel.checkpoint()
        active -= 1
        return str(n)

    calls = [tool_call("job", n=n) for n in range(count)]
    state = user_state()
    with anyio.fail_after(10):
        await Agent(FakeModel([calls, "ok"]), tools=[job], max_concurrency=max_concurrency).arun(
            state
        )
    assert [r.outcome for r in results(state)] == ["done"] * count
    assert_consistent(state)
    return peak


@pytest.mark.anyio
async def test_max_concurrency_bounds_async_calls() -> None:
    assert await _peak_async(2, 6) == 2


@pytest.mark.anyio
async def test_without_max_concurrency_all_parallel_calls_run_at_once() -> None:
    assert await _peak_async(None, 6) == 6


@pytest.mark.anyio
async def test_max_concurrency_raises_the_sync_thread_bound() -> None:
    # DESIGN 7: "all parallel=True calls of a turn start at once in one task group (... sync
    # tools in worker threads through one CapacityLimiter, max_concurrency)"; issue 26: sync
    # tools use 40 threads at most unless max_concurrency says otherwise (more, here).
    count = 70
    barrier = threading.Barrier(count, timeout=2.0)

    @tool
    def meet(i: int) -> str:
        barrier.wait()
        return "met"

    model = FakeModel([[tool_call("meet", i=i) for i in range(count)], "done"])
    state = user_state()
    try:
        await Agent(model, tools=[meet], max_concurrency=count).arun(state)
    finally:
        barrier.abort()
    assert [e.outcome for e in results(state)] == ["done"] * count


@pytest.mark.anyio
async def test_max_concurrency_bounds_sync_calls_in_worker_threads() -> None:
    lock = threading.Lock()
    active = 0
    started = 0
    peak = 0
    count = 5
    changed = threading.Condition(lock)

    @tool
    def job(n: int) -> str:
        nonlocal active, started, peak
        with changed:
            active += 1
            started += 1
            peak = max(peak, active)
            changed.notify_all()
            # Wait until two run at once, or nobody else can start.
            changed.wait_for(lambda: active >= 2 or started >= count, timeout=10)
            active -= 1
            changed.notify_all()
        return str(n)

    calls = [tool_call("job", n=n) for n in range(count)]
    state = user_state()
    await Agent(FakeModel([calls, "ok"]), tools=[job], max_concurrency=2).arun(state)
    assert peak == 2
    assert [r.outcome for r in results(state)] == ["done"] * count
    assert_consistent(state)


@pytest.mark.anyio
async def test_max_concurrency_bounds_a_mix_of_sync_and_async_calls() -> None:
    lock = threading.Lock()
    active = 0
    peak = 0
    release = threading.Event()

    def enter() -> None:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)

    def leave() -> None:
        nonlocal active
        with lock:
            active -= 1

    @tool
    def sync_job() -> str:
        enter()
        release.wait(0.2)  # gives the others a chance to start; the count decides, not time
        leave()
        return "s"

    @tool
    async def async_job() -> str:
        enter()
        for _ in range(20):
            await anyio.lowlevel.checkpoint()
        leave()
        return "a"

    calls = [tool_call("sync_job"), tool_call("async_job"), tool_call("sync_job")]
    calls += [tool_call("async_job")]
    state = user_state()
    await Agent(FakeModel([calls, "ok"]), tools=[sync_job, async_job], max_concurrency=1).arun(
        state
    )
    assert peak == 1
    assert_consistent(state)


# timeouts -------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_tool_timeout_gives_an_error_result_and_the_run_goes_on() -> None:
    @tool(timeout=0.05)
    async def hang() -> str:
        await anyio.sleep_forever()
        return "never"

    @tool
    async def quick() -> str:
        return "quick"

    calls = [tool_call("hang"), tool_call("quick")]
    model = FakeModel([calls, "gave up on hang"])
    state = user_state()
    assert await Agent(model, tools=[hang, quick]).arun(state) == "gave up on hang"
    hung = result_of(state, calls[0])
    assert hung.outcome == "error"
    assert hung.content.is_error
    assert hung.content.text == "(timed out after 0.05 s)"
    assert result_of(state, calls[1]).outcome == "done"
    assert model.requests[1].messages[-1].tool_results[0].is_error
    assert_consistent(state)


@pytest.mark.anyio
async def test_the_agent_tool_timeout_applies_to_tools_without_their_own() -> None:
    @tool
    async def hang() -> str:
        await anyio.sleep_forever()
        return "never"

    call = tool_call("hang")
    state = user_state()
    await Agent(FakeModel([call, "ok"]), tools=[hang], tool_timeout=0.05).arun(state)
    entry = result_of(state, call)
    assert entry.outcome == "error"
    assert "timed out" in entry.content.text
    assert_consistent(state)


@pytest.mark.anyio
async def test_a_tool_own_timeout_wins_over_the_agent_one() -> None:
    @tool(timeout=30)
    async def slowish() -> str:
        await anyio.sleep(0.3)  # longer than the agent's limit, far shorter than its own
        return "made it"

    call = tool_call("slowish")
    state = user_state()
    await Agent(FakeModel([call, "ok"]), tools=[slowish], tool_timeout=0.05).arun(state)
    entry = result_of(state, call)
    assert entry.outcome == "done"
    assert entry.content.text == "made it"
    assert_consistent(state)


@pytest.mark.anyio
async def test_a_sync_tool_timeout_gives_an_error_result() -> None:
    release = threading.Event()

    @tool(timeout=0.05)
    def blocked() -> str:
        release.wait(2)
        return "finished anyway"

    call = tool_call("blocked")
    state = user_state()
    try:
        await Agent(FakeModel([call, "ok"]), tools=[blocked]).arun(state)
    finally:
        release.set()
    entry = result_of(state, call)
    assert entry.outcome == "error"
    assert "timed out" in entry.content.text
    assert_consistent(state)


# state updates --------------------------------------------------------------------------------

SCHEMA: dict[str, Any] = {
    "city": {"type": str},
    "tags": {"type": list[str]},
    "count": {"type": int},
}


@pytest.mark.anyio
async def test_state_updates_apply_at_the_end_of_the_turn_in_request_order() -> None:
    finished: dict[str, anyio.Event] = {}
    seen_city: list[object] = []

    @tool
    async def set_city(key: str, city: str, after: str | None = None, *, state: State) -> Any:
        if after is not None:
            await finished[after].wait()
        seen_city.append(state.get("city"))
        return ToolResult(f"City is {city}.", state={"city": city})

    @tool(outputs_to_state={"tags": {"source": "tag"}})
    async def tag(key: str, tag: str, after: str | None = None) -> dict[str, str]:
        if after is not None:
            await finished[after].wait()
        return {"tag": tag}

    class Done(Reporter):
        def on_tool_end(self, state: State, call: ToolCall, entry: ToolResultEntry) -> None:
            finished[str(call.args["key"])].set()

    for key in ("c1", "c2", "t1", "t2"):
        finished[key] = anyio.Event()
    # Each call finishes after the next one in request order: the finish order is the reverse.
    calls = [
        tool_call("set_city", key="c1", city="Paris", after="c2"),
        tool_call("set_city", key="c2", city="Rome", after="t1"),
        tool_call("tag", key="t1", tag="a", after="t2"),
        tool_call("tag", key="t2", tag="b"),
    ]
    state = State(messages=[Message.user("Go")], extra_data={"tags": ["x"]}, schema=SCHEMA)
    agent = Agent(
        FakeModel([calls, "ok"]), tools=[set_city, tag], state_schema=SCHEMA, reporter=Done()
    )
    await agent.arun(state)

    assert [r.call.args["key"] for r in results(state)] == ["t2", "t1", "c2", "c1"]
    # Calls of one turn never saw each other's updates.
    assert seen_city == [None, None]
    # The later call in request order wins a replace; lists merge in request order.
    assert state.get("city") == "Rome"
    assert state.get("tags") == ["x", "a", "b"]
    # Each update is recorded in its result, and applied as one extra_data entry after the last.
    assert result_of(state, calls[0]).state_update == {"city": "Paris"}
    assert result_of(state, calls[3]).state_update == {"tags": "b"}
    kinds = [e.kind for e in state.history]
    last_result = max(i for i, k in enumerate(kinds) if k == "tool_result")
    applied = state.history[last_result + 1]
    assert isinstance(applied, ExtraDataEntry)
    assert applied.content.changed == {"city": "Rome", "tags": ["x", "a", "b"]}
    assert kinds.count("extra_data") == 2  # the initial data, then the turn's updates
    assert_consistent(state)


@pytest.mark.anyio
async def test_a_state_update_that_fails_validation_becomes_an_error_result() -> None:
    @tool
    def count_to(n: str) -> ToolResult:
        return ToolResult("counted", state={"count": n})

    good, bad = tool_call("count_to", n="3"), tool_call("count_to", n="many")
    model = FakeModel([[good, bad], "ok"])
    state = user_state(schema=SCHEMA)
    await Agent(model, tools=[count_to], state_schema=SCHEMA).arun(state)
    assert result_of(state, good).outcome == "done"
    refused = result_of(state, bad)
    assert refused.outcome == "error"
    assert "count" in refused.content.text
    assert refused.state_update is None
    assert state.get("count") == 3
    assert_consistent(state)


PAIRS_SCHEMA: dict[str, Any] = {"items": {"type": Annotated[list[int], Field(max_length=2)]}}


@pytest.mark.anyio
async def test_a_state_update_failing_validation_at_the_turn_end_is_refused_with_a_notice() -> None:
    # DESIGN 5a: updates are "applied when the turn's last result is recorded, in request
    # order"; "An update that fails validation turns that call's result into an error result
    # and is not applied." Each update is valid alone, the merge is not: the run goes on.
    @tool
    def add_pair(n: int) -> ToolResult:
        return ToolResult(f"added {n}", state={"items": [n, n]})

    model = FakeModel([[tool_call("add_pair", n=1), tool_call("add_pair", n=2)], "done"])
    agent = Agent(model, tools=[add_pair], state_schema=PAIRS_SCHEMA)
    state = State(messages=[Message.user("go")])
    assert await agent.arun(state) == "done"
    assert state.get("items") == [1, 1]
    # The results are already in the messages when the merge fails at the turn's end, so the
    # refused update is not applied and a notice right after the results tells the model.
    notices = [m.text for m in state.messages if m.is_notice]
    assert len(notices) == 1
    assert "Not applied, the state update of add_pair" in notices[0]
    assert "items" in notices[0]
    assert_replays(state)


@pytest.mark.anyio
async def test_a_state_update_of_an_undeclared_key_becomes_an_error_result() -> None:
    @tool
    def remember() -> ToolResult:
        return ToolResult("ok", state={"citty": "Rome"})

    call = tool_call("remember")
    state = user_state(schema=SCHEMA)
    await Agent(FakeModel([call, "ok"]), tools=[remember], state_schema=SCHEMA).arun(state)
    entry = result_of(state, call)
    assert entry.outcome == "error"
    assert "citty" in entry.content.text
    assert not state.has("citty")
    assert_consistent(state)


@pytest.mark.anyio
async def test_a_direct_set_from_a_tool_applies_at_once() -> None:
    written = anyio.Event()
    seen: list[object] = []

    @tool
    async def writer(state: State) -> str:
        state.set("city", "Oslo")
        written.set()
        return "written"

    @tool
    async def reader(state: State) -> str:
        await written.wait()
        seen.append(state.get("city"))
        return "read"

    state = user_state(schema=SCHEMA)
    calls = [tool_call("reader"), tool_call("writer")]
    await Agent(FakeModel([calls, "ok"]), tools=[writer, reader], state_schema=SCHEMA).arun(state)
    assert seen == ["Oslo"]
    assert state.get("city") == "Oslo"
    assert_consistent(state)


@pytest.mark.anyio
async def test_the_agent_state_schema_is_bound_to_a_state_without_one() -> None:
    @tool
    def pick(city: str) -> ToolResult:
        return ToolResult("picked", state={"city": city})

    state = State(messages=[Message.user("Go")], extra_data={"city": "Paris", "free": 1})
    assert state.schema is None
    call = tool_call("pick", city="Rome")
    await Agent(FakeModel([call, "ok"]), tools=[pick], state_schema=SCHEMA).arun(state)
    assert state.schema is SCHEMA
    assert state.get("city") == "Rome"
    with pytest.raises(KeyError, match="undeclared"):
        state.set("undeclared", 1)
    assert_consistent(state)


@pytest.mark.anyio
async def test_binding_the_agent_schema_validates_the_existing_data_before_anything_runs() -> None:
    model = FakeModel(["never"])
    state = State(messages=[Message.user("Go")], extra_data={"count": "many"})
    with pytest.raises(ValueError, match="count"):
        await Agent(model, state_schema=SCHEMA).arun(state)
    assert model.requests == []
    assert state.schema is None


@pytest.mark.anyio
async def test_a_state_with_another_schema_is_refused_at_run_start() -> None:
    model = FakeModel(["never"])
    state = State(messages=[Message.user("Go")], schema={"other": {"type": int}})
    with pytest.raises(ValueError, match="schema"):
        await Agent(model, state_schema=SCHEMA).arun(state)
    assert model.requests == []


def test_outputs_to_state_keys_are_checked_against_the_agent_schema() -> None:
    @tool(outputs_to_state={"citty": {}})
    def where() -> str:
        return "Rome"

    with pytest.raises(ValueError, match="citty"):
        Agent(FakeModel([]), tools=[where], state_schema=SCHEMA)


@pytest.mark.anyio
async def test_inputs_from_state_missing_without_default_is_an_input_error() -> None:
    @tool(inputs_from_state={"city": "city"})
    def weather(city: str) -> str:
        return f"sunny in {city}"

    first, sent = tool_call("weather"), tool_call("weather", city="Rome")
    model = FakeModel([[first, sent], "ok"])
    state = user_state(schema=SCHEMA)
    await Agent(model, tools=[weather], state_schema=SCHEMA).arun(state)
    assert result_of(state, first).outcome == "input_error"
    assert "city" in result_of(state, first).content.text
    # The model cannot supply a parameter filled from state.
    assert result_of(state, sent).outcome == "input_error"
    assert "city" not in model.requests[0].tools[0].input_schema.get("properties", {})
    assert_consistent(state)


# bad input ------------------------------------------------------------------------------------


async def _run_one(
    call: ToolCall | list[ToolCall], *tools: Any, follow_up: str = "noted"
) -> tuple[State, FakeModel]:
    model = FakeModel([call, follow_up])
    state = user_state()
    answer = await Agent(model, tools=tools or (add,)).arun(state)
    assert answer == follow_up  # the model read the result and answered: the run went on
    assert_consistent(state)
    return state, model


@pytest.mark.anyio
async def test_an_unknown_tool_is_an_error_result_naming_the_tools() -> None:
    call = tool_call("subtract", a=1, b=2)
    state, model = await _run_one(call)
    entry = result_of(state, call)
    assert entry.outcome == "error"
    assert entry.content.is_error
    assert "subtract" in entry.content.text
    assert "add" in entry.content.text
    assert model.requests[1].messages[-1].tool_results[0].call_id == call.id


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("args", "words"),
    [
        ({"a": "one", "b": 2}, ["a"]),  # wrong type
        ({"a": 1}, ["b", "missing"]),  # truncated: an argument is missing
        ({}, ["a", "b", "missing"]),  # nothing came through
        ({"a": 1, "b": 2, "c": 3}, ["c", "unknown"]),  # an argument the tool does not take
        ({"a": [1], "b": {"x": 1}}, ["a", "b"]),  # nested junk
    ],
)
async def test_bad_arguments_are_an_input_error_listing_the_problems(
    args: dict[str, Any], words: list[str]
) -> None:
    call = ToolCall("call_bad", "add", args)
    state, _ = await _run_one(call)
    entry = result_of(state, call)
    assert entry.outcome == "input_error"
    assert entry.content.is_error
    for word in words:
        assert word in entry.content.text


def test_arguments_that_are_not_a_json_object_are_refused_when_the_call_is_made() -> None:
    with pytest.raises(TypeError, match="args"):
        ToolCall("call_1", "add", '{"a": 1, "b":')  # pyright: ignore[reportArgumentType]


@pytest.mark.anyio
async def test_lax_arguments_are_coerced_like_a_pydantic_model() -> None:
    call = tool_call("add", a="2", b=3.0)
    state, _ = await _run_one(call)
    entry = result_of(state, call)
    assert entry.outcome == "done"
    assert entry.content.text == "5"


@pytest.mark.anyio
@pytest.mark.parametrize("value", [object(), {1, 2}, {"when": threading.Lock()}, float("nan")])
async def test_a_tool_returning_a_non_json_value_is_an_error_result(value: object) -> None:
    @tool
    def weird() -> Any:
        return value

    call = tool_call("weird")
    state, _ = await _run_one(call, weird)
    entry = result_of(state, call)
    assert entry.outcome == "error"
    assert "JSON" in entry.content.text


@pytest.mark.anyio
async def test_tool_return_values_become_text_the_model_reads() -> None:
    @tool
    def nothing() -> None:
        return None

    @tool
    async def data() -> dict[str, Any]:
        return {"files": ["a.py", "b.py"], "n": 2}

    calls = [tool_call("nothing"), tool_call("data")]
    state, _ = await _run_one(calls, nothing, data)
    assert result_of(state, calls[0]).content.text == "(done)"
    assert result_of(state, calls[1]).content.text == '{"files": ["a.py", "b.py"], "n": 2}'


@pytest.mark.anyio
async def test_a_tool_error_is_an_error_result_the_model_reads() -> None:
    @tool
    def check(path: str) -> str:
        raise ToolError(f"{path} does not exist")

    @tool
    async def blank() -> str:
        raise ToolError

    @tool
    def flagged() -> ToolResult:
        return ToolResult("half done", is_error=True)

    calls = [tool_call("check", path="c.py"), tool_call("blank"), tool_call("flagged")]
    state, model = await _run_one(calls, check, blank, flagged)
    entries = [result_of(state, c) for c in calls]
    assert [e.outcome for e in entries] == ["error", "error", "error"]
    assert [e.content.text for e in entries] == ["c.py does not exist", "ToolError", "half done"]
    shown = model.requests[1].messages[-1].tool_results
    assert all(block.is_error for block in shown)


@pytest.mark.anyio
async def test_a_tool_raising_aborts_the_run_with_the_same_exception() -> None:
    failure = LookupError("index missing")

    @tool
    def lookup(key: str) -> str:
        raise failure

    call = tool_call("lookup", key="k")
    model = FakeModel([call, "never"])
    state = user_state()
    with pytest.raises(LookupError) as caught:
        await Agent(model, tools=[lookup]).arun(state)
    assert caught.value is failure
    entry = result_of(state, call)
    assert entry.outcome == "aborted"
    assert entry.content.text == "(aborted: LookupError)"
    assert [e.content for e in state.history if isinstance(e, ErrorEntry)] == [
        "LookupError: index missing"
    ]
    assert len(model.requests) == 1
    assert_consistent(state)
    # The State can be shown the error and run again.
    assert await Agent(FakeModel(["recovered"])).arun(state) == "recovered"
    assert_consistent(state)


@pytest.mark.anyio
async def test_a_sync_tool_that_returns_a_coroutine_is_an_error_not_a_hang() -> None:
    async def later() -> str:
        return "x"

    @tool
    def sneaky() -> Any:
        return later()

    call = tool_call("sneaky")
    model = FakeModel([call, "ok"])
    state = user_state()
    with pytest.raises(TypeError, match="async def"):
        await Agent(model, tools=[sneaky]).arun(state)
    assert result_of(state, call).outcome == "aborted"
    assert_consistent(state)


@pytest.mark.anyio
async def test_a_reply_with_text_and_calls_keeps_the_text_in_the_messages() -> None:
    call = tool_call("add", a=1, b=1)
    reply = Reply(Message.assistant("Let me add.", [call]), Usage(requests=1))
    model = FakeModel([reply, "2"])
    state = user_state()
    await Agent(model, tools=[add]).arun(state)
    assert state.messages[1].text == "Let me add."
    assert state.messages[1].tool_calls == (call,)
    assert state.answer == "2"
    assert_consistent(state)
