"""Cancellation and unexpected exceptions end to end, on asyncio and on trio.

Whatever await point of a turn a run is cancelled at, the interruption is recorded once (one
`error` entry), every pending call is closed (`interrupted`), no call is left without a result,
the State replays, and it runs again. An unexpected exception waits for the running calls, closes
the rest as `aborted`, and is re-raised unchanged (the same object).
"""

from __future__ import annotations

import signal
import threading
from typing import Any

import anyio
import anyio.to_thread
import pytest

from orchestrator import (
    Agent,
    Message,
    ModelReplyEntry,
    Reply,
    Reporter,
    State,
    ToolCall,
    ToolResultEntry,
    loop,
    tool,
    waiting_for_user,
)
from orchestrator.models import Request, TextCallback
from orchestrator.permissions import AskApproval
from orchestrator.testing import FakeModel, tool_call
from tests.doubles import assert_consistent, errors, result_of, results

# Helpers --------------------------------------------------------------------------------------


def assert_interrupted_once(state: State, errors_before: int = 0) -> None:
    new = errors(state)[errors_before:]
    assert len(new) == 1, new
    assert new[0].endswith(": interrupted")
    assert "Cancelled" in new[0]
    assert state.stopped is None


async def assert_runs_again(state: State) -> None:
    model = FakeModel(["Back again."])
    if not state.messages or state.messages[-1].role == "assistant":
        state.add_message(Message.user("Go on"))
    assert await Agent(model).arun(state) == "Back again."
    # The model saw every call of the interrupted turn with its result.
    calls = [c.id for m in model.requests[0].messages for c in m.tool_calls]
    shown = [b.call_id for m in model.requests[0].messages for b in m.tool_results]
    assert sorted(calls) == sorted(shown)
    assert_consistent(state)


class GateModel:
    """A scripted model that blocks forever at the request numbers in `block_at`."""

    def __init__(self, replies: list[Any], *, block_at: tuple[int, ...] = ()) -> None:
        self.fake = FakeModel(replies)
        self.block_at = block_at
        self.count = 0
        self.entered = anyio.Event()

    @property
    def name(self) -> str:
        return "gate"

    @property
    def context_window(self) -> int | None:
        return None

    async def respond(self, request: Request, *, on_text: TextCallback | None = None) -> Reply:
        self.count += 1
        if self.count in self.block_at:
            self.entered.set()
            await anyio.sleep_forever()
        return await self.fake.respond(request, on_text=on_text)


class GateStore:
    """An async store that counts saves and blocks forever at save number `block_at`."""

    def __init__(self, block_at: int | None = None) -> None:
        self.block_at = block_at
        self.saves = 0
        self.saved_sizes: list[int] = []  # len(history) at each save that completed
        self.entered = anyio.Event()

    async def asave(self, state: State) -> None:
        self.saves += 1
        if self.saves == self.block_at:
            self.entered.set()
            await anyio.sleep_forever()
        await anyio.lowlevel.checkpoint()
        self.saved_sizes.append(len(state.history))


async def cancel_when(event: anyio.Event, run: Any, state: State) -> None:
    """Run `run(state)` and cancel it once `event` is set."""
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:

            async def go() -> None:
                await run(state)
                pytest.fail("the run ended before it was cancelled")

            group.start_soon(go)
            await event.wait()
            group.cancel_scope.cancel()


# cancelling during think ----------------------------------------------------------------------


@pytest.mark.anyio
async def test_cancel_during_think_takes_the_request_back() -> None:
    model = GateModel(["never"], block_at=(1,))
    state = State(messages=[Message.user("Go")])
    await cancel_when(model.entered, Agent(model).arun, state)
    assert state.turn == 0
    assert [e.kind for e in state.history] == [
        "context_change",
        "run_start",
        "prompt",  # what the model is told: recorded before its first request
        "model_request",
        "error",
    ]
    assert_interrupted_once(state)
    assert_consistent(state)
    assert await Agent(FakeModel(["Now it works."])).arun(state) == "Now it works."
    assert_consistent(state)


@pytest.mark.anyio
async def test_fail_after_around_arun_during_the_second_think() -> None:
    @tool
    def ping() -> str:
        return "pong"

    model = GateModel([tool_call("ping"), "never"], block_at=(2,))
    state = State(messages=[Message.user("Go")])
    with pytest.raises(TimeoutError):
        with anyio.fail_after(0.2):
            await Agent(model, tools=[ping]).arun(state)
    assert state.turn == 1
    assert results(state)[0].outcome == "done"
    assert_interrupted_once(state)
    assert_consistent(state)
    await assert_runs_again(state)


@pytest.mark.anyio
async def test_a_message_held_during_a_cancelled_think_is_kept() -> None:
    model = GateModel(["never"], block_at=(1,))
    state = State(messages=[Message.user("Go")])

    async def run_and_add(state: State) -> None:
        await Agent(model).arun(state)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(run_and_add, state)
            await model.entered.wait()
            state.add_message(Message.user("while waiting"))
            assert [m.text for m in state.messages] == ["Go"]  # held
            group.cancel_scope.cancel()
    assert [m.text for m in state.messages] == ["Go", "while waiting"]
    assert_interrupted_once(state)
    assert_consistent(state)


# cancelling during tools ----------------------------------------------------------------------


@pytest.mark.anyio
async def test_cancel_during_parallel_async_tools_closes_the_pending_calls() -> None:
    quick_done = anyio.Event()
    hanging = 0
    both_hang = anyio.Event()

    @tool
    async def quick() -> str:
        quick_done.set()  # its result is recorded before any other task runs
        return "quick"

    @tool
    async def hang() -> str:
        nonlocal hanging
        await quick_done.wait()
        hanging += 1
        if hanging == 2:
            both_hang.set()  # quick is recorded and both are running
        await anyio.sleep_forever()
        return "never"

    calls = [tool_call("quick"), tool_call("hang"), tool_call("hang")]
    state = State(messages=[Message.user("Go")])
    agent = Agent(FakeModel([calls, "never"]), tools=[quick, hang])
    await cancel_when(both_hang, agent.arun, state)
    assert result_of(state, calls[0]).outcome == "done"
    for call in calls[1:]:
        entry = result_of(state, call)
        assert entry.outcome == "interrupted"
        assert entry.content.text == "(interrupted by user)"
        assert entry.content.is_error
    assert_interrupted_once(state)
    assert_consistent(state)
    await assert_runs_again(state)


@pytest.mark.anyio
async def test_cancel_during_a_serial_tool_closes_it_and_the_serial_ones_after_it() -> None:
    started = anyio.Event()
    ran: list[str] = []

    @tool
    async def para() -> str:
        ran.append("para")
        return "para"

    @tool(parallel=False)
    async def serial(name: str) -> str:
        ran.append(name)
        if name == "s1":
            started.set()
            await anyio.sleep_forever()
        return name

    calls = [tool_call("serial", name="s1"), tool_call("para"), tool_call("serial", name="s2")]
    state = State(messages=[Message.user("Go")])
    agent = Agent(FakeModel([calls, "never"]), tools=[para, serial])
    await cancel_when(started, agent.arun, state)
    assert ran == ["para", "s1"]
    assert result_of(state, calls[1]).outcome == "done"
    assert result_of(state, calls[0]).outcome == "interrupted"
    assert result_of(state, calls[2]).outcome == "interrupted"
    assert_interrupted_once(state)
    assert_consistent(state)
    await assert_runs_again(state)


@pytest.mark.anyio
async def test_cancel_while_a_sync_tool_runs_in_a_worker_thread() -> None:
    started = threading.Event()
    release = threading.Event()

    @tool
    def blocking() -> str:
        started.set()
        release.wait(10)
        return "finished"

    @tool
    async def hang() -> str:
        await anyio.sleep_forever()
        return "never"

    calls = [tool_call("blocking"), tool_call("hang")]
    state = State(messages=[Message.user("Go")])
    agent = Agent(FakeModel([calls, "never"]), tools=[blocking, hang])
    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(agent.arun, state)
                await anyio.to_thread.run_sync(started.wait, 10)
                group.cancel_scope.cancel()
    finally:
        release.set()  # only now: the run did not wait for the thread (issue 26)
    # The thread's call was abandoned, not waited for: interrupted like the other.
    assert result_of(state, calls[0]).outcome == "interrupted"
    assert result_of(state, calls[1]).outcome == "interrupted"
    assert_interrupted_once(state)
    assert_consistent(state)
    await assert_runs_again(state)


@pytest.mark.anyio
async def test_cancel_while_calls_wait_for_a_max_concurrency_slot() -> None:
    started = anyio.Event()
    ran: list[int] = []

    @tool
    async def job(n: int) -> str:
        ran.append(n)
        started.set()
        await anyio.sleep_forever()
        return "never"

    calls = [tool_call("job", n=n) for n in range(3)]
    state = State(messages=[Message.user("Go")])
    agent = Agent(FakeModel([calls, "never"]), tools=[job], max_concurrency=1)
    await cancel_when(started, agent.arun, state)
    assert len(ran) == 1  # the others were still waiting for the slot
    assert [result_of(state, c).outcome for c in calls] == ["interrupted"] * 3
    assert_interrupted_once(state)
    assert_consistent(state)
    await assert_runs_again(state)


@pytest.mark.anyio
async def test_cancel_while_a_permission_waits_for_approval() -> None:
    asked = anyio.Event()
    ran: list[str] = []

    async def approve(call: ToolCall, state: State) -> bool:
        asked.set()
        await anyio.sleep_forever()
        return True

    @tool
    def risky() -> str:
        ran.append("risky")
        return "done"

    call = tool_call("risky")
    state = State(messages=[Message.user("Go")])
    agent = Agent(FakeModel([call, "never"]), tools=[risky], permissions=[AskApproval(approve)])
    await cancel_when(asked, agent.arun, state)
    assert ran == []
    assert result_of(state, call).outcome == "interrupted"
    assert_interrupted_once(state)
    assert_consistent(state)


async def _cancel_a_run_with_a_subagent() -> tuple[State, State, ToolCall]:
    child_model = GateModel(["never"], block_at=(1,))
    child_agent = Agent(child_model, name="child")
    children: list[State] = []

    class Watch(Reporter):
        def on_child_start(self, parent: State, call: ToolCall, child: State) -> None:
            children.append(child)

    @tool
    async def delegate(task: str) -> str:
        return str(await child_agent.arun(task))

    call = tool_call("delegate", task="dig")
    state = State(messages=[Message.user("Go")])
    agent = Agent(FakeModel([call, "never"]), tools=[delegate], reporter=Watch())
    await cancel_when(child_model.entered, agent.arun, state)
    (child,) = children
    return state, child, call


@pytest.mark.anyio
async def test_cancel_while_a_subagent_runs_cancels_it_too() -> None:
    state, child, call = await _cancel_a_run_with_a_subagent()
    assert result_of(state, call).outcome == "interrupted"
    assert_interrupted_once(state)
    assert_consistent(state)
    assert child.parent_id == state.id
    assert child.parent_call_id == call.id
    assert_interrupted_once(child)
    assert_consistent(child)


@pytest.mark.anyio
async def test_an_interrupted_call_still_lists_the_subagent_it_started() -> None:
    state, child, call = await _cancel_a_run_with_a_subagent()
    entry = result_of(state, call)
    assert entry.child_ids == (child.id,)
    assert state.child(child.id) is child


# every save point is an await point ------------------------------------------------------------


def _scenario_tools() -> list[Any]:
    @tool
    async def first() -> str:
        return "first"

    @tool
    def second() -> str:
        return "second"

    @tool(parallel=False)
    async def third() -> str:
        return "third"

    return [first, second, third]


def _scenario_script() -> list[Any]:
    return [[tool_call("first"), tool_call("second"), tool_call("third")], "All done."]


@pytest.mark.anyio
async def test_the_scenario_saves_at_each_save_point() -> None:
    store = GateStore()
    state = State(messages=[Message.user("Go")])
    agent = Agent(FakeModel(_scenario_script()), tools=_scenario_tools(), store=store)  # pyright: ignore[reportArgumentType] (a save-only double)
    assert await agent.arun(state) == "All done."
    # Request 1 (with the run's start), reply 1, the results of `first` and `second`, request 2
    # (with the result of `third`, the turn's last), the run's end (with reply 2).
    assert store.saves == 6


@pytest.mark.anyio
@pytest.mark.parametrize("block_at", range(1, 7))
async def test_cancel_at_every_save_point(block_at: int) -> None:
    store = GateStore(block_at)
    state = State(messages=[Message.user("Go")])
    agent = Agent(FakeModel(_scenario_script()), tools=_scenario_tools(), store=store)  # pyright: ignore[reportArgumentType] (a save-only double)
    await cancel_when(store.entered, agent.arun, state)
    assert_interrupted_once(state)
    assert_consistent(state)
    # The State was saved after the interruption was recorded.
    assert store.saved_sizes[-1] == len(state.history)
    assert state.history[-1].kind == "error"
    await assert_runs_again(state)


@pytest.mark.anyio
@pytest.mark.parametrize("block_at", [1, 2])
async def test_cancel_at_every_model_request(block_at: int) -> None:
    model = GateModel(_scenario_script(), block_at=(block_at,))
    state = State(messages=[Message.user("Go")])
    agent = Agent(model, tools=_scenario_tools())
    await cancel_when(model.entered, agent.arun, state)
    assert state.turn == block_at - 1
    assert_interrupted_once(state)
    assert_consistent(state)
    await assert_runs_again(state)


@pytest.mark.anyio
async def test_two_cancelled_runs_record_one_error_each() -> None:
    state = State(messages=[Message.user("Go")])
    for attempt in range(2):
        model = GateModel(["never"], block_at=(1,))
        await cancel_when(model.entered, Agent(model).arun, state)
        assert len(errors(state)) == attempt + 1
    assert_consistent(state)
    await assert_runs_again(state)


@pytest.mark.anyio
async def test_no_task_is_left_running_after_a_cancelled_arun() -> None:
    # DESIGN 3: "nothing runs in the background after a call returns; cancelling a parent cancels
    # its whole subtree"; DESIGN 6: "children are cancelled too".
    entered = anyio.Event()

    @tool
    async def wait_forever() -> str:
        entered.set()
        await anyio.sleep_forever()
        return "never"

    child_model = GateModel([], block_at=(1,))
    helper = Agent(child_model, name="helper", description="Helps with a task")
    model = FakeModel(
        [[tool_call("wait_forever"), tool_call("wait_forever"), tool_call("helper", task="x")]]
    )
    agent = Agent(model, tools=[wait_forever, helper])
    state = State(messages=[Message.user("go")])
    before = {task.id for task in anyio.get_running_tasks()}
    async with anyio.create_task_group() as group:
        group.start_soon(agent.arun, state)
        await entered.wait()
        await child_model.entered.wait()
        group.cancel_scope.cancel()
    assert {task.id for task in anyio.get_running_tasks()} == before
    assert sorted(e.outcome for e in results(state)) == ["interrupted"] * 3
    (child_id,) = [c for e in results(state) for c in e.child_ids]
    child = state.child(child_id)
    assert child.pending_calls == ()
    assert child.turn == 0


@pytest.mark.anyio
async def test_a_cancelled_run_with_a_sync_loop_body_records_the_interruption_once() -> None:
    # DESIGN 6: "when arun is cancelled ... the error is recorded once"; sync methods called from
    # a worker thread of a running run "hop onto that loop" (a sync @loop body runs in one).
    model = GateModel([], block_at=(1,))

    @loop(until=[waiting_for_user], limit=3)
    def body(agent: Agent, state: State) -> None:
        agent.think(state)

    agent = Agent(model, loop=body)
    state = State(messages=[Message.user("go")])
    await cancel_when(model.entered, agent.arun, state)
    assert_interrupted_once(state)
    assert state.turn == 0
    assert_consistent(state)


# Ctrl+C ---------------------------------------------------------------------------------------


def test_ctrl_c_in_a_sync_run_closes_pending_calls_and_the_state_runs_again() -> None:
    @tool
    async def press_ctrl_c() -> str:
        signal.raise_signal(signal.SIGINT)
        await anyio.sleep_forever()
        return "never"

    @tool
    async def other() -> str:
        await anyio.sleep_forever()
        return "never"

    calls = [tool_call("other"), tool_call("press_ctrl_c")]
    state = State(messages=[Message.user("Go")])
    with pytest.raises(KeyboardInterrupt):
        Agent(FakeModel([calls, "never"]), tools=[press_ctrl_c, other]).run(state)
    assert [result_of(state, c).outcome for c in calls] == ["interrupted", "interrupted"]
    assert len(errors(state)) == 1
    assert errors(state)[0].endswith(": interrupted")
    assert_consistent(state)
    state.add_message(Message.user("Go on"))
    assert Agent(FakeModel(["Back again."])).run(state) == "Back again."
    assert_consistent(state)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_keyboard_interrupt_inside_a_tool_is_reraised_unchanged(anyio_backend: str) -> None:
    # On trio, Ctrl+C raises KeyboardInterrupt at a checkpoint of whichever task runs.
    interrupt = KeyboardInterrupt()

    @tool
    async def pressed() -> str:
        raise interrupt

    @tool
    async def other() -> str:
        await anyio.sleep_forever()
        return "never"

    calls = [tool_call("other"), tool_call("pressed")]
    state = State(messages=[Message.user("Go")])
    with pytest.raises(BaseException) as caught:  # noqa: PT011 - the type is what is checked
        await Agent(FakeModel([calls, "never"]), tools=[pressed, other]).arun(state)
    assert caught.value is interrupt
    assert [result_of(state, c).outcome for c in calls] == ["interrupted", "interrupted"]
    assert len(errors(state)) == 1
    assert_consistent(state)


# unexpected exceptions ------------------------------------------------------------------------


@pytest.mark.anyio
async def test_an_unexpected_exception_waits_for_running_calls_and_aborts_the_rest() -> None:
    failure = ValueError("boom")
    running_started = anyio.Event()
    failed = anyio.Event()
    ran: list[str] = []

    @tool
    async def explode() -> str:
        await running_started.wait()
        failed.set()
        raise failure

    @tool
    async def running() -> str:
        running_started.set()
        await failed.wait()  # still running when the other call fails: it is waited for
        await anyio.lowlevel.checkpoint()
        ran.append("running")
        return "finished"

    @tool(parallel=False)
    async def later() -> str:
        ran.append("later")
        return "never"

    calls = [tool_call("explode"), tool_call("running"), tool_call("later")]
    model = FakeModel([calls, "never"])
    state = State(messages=[Message.user("Go")])
    with pytest.raises(ValueError, match="boom") as caught:
        await Agent(model, tools=[explode, running, later]).arun(state)
    assert caught.value is failure
    assert ran == ["running"]
    assert result_of(state, calls[1]).outcome == "done"
    for call in (calls[0], calls[2]):
        entry = result_of(state, call)
        assert entry.outcome == "aborted"
        assert entry.content.text == "(aborted: ValueError)"
    assert errors(state) == ["ValueError: boom"]
    assert len(model.requests) == 1
    assert_consistent(state)
    await assert_runs_again(state)


@pytest.mark.anyio
async def test_an_unexpected_exception_in_a_sync_tool_is_reraised_unchanged() -> None:
    failure = OSError(28, "No space left on device")

    @tool
    def write() -> str:
        raise failure

    @tool
    def fine() -> str:
        return "fine"

    calls = [tool_call("fine"), tool_call("write")]
    state = State(messages=[Message.user("Go")])
    with pytest.raises(OSError) as caught:  # noqa: PT011 - identity is what is checked
        await Agent(FakeModel([calls, "never"]), tools=[write, fine]).arun(state)
    assert caught.value is failure
    assert result_of(state, calls[0]).outcome == "done"
    assert result_of(state, calls[1]).outcome == "aborted"
    assert len(errors(state)) == 1
    assert_consistent(state)


@pytest.mark.anyio
async def test_an_unexpected_exception_in_a_serial_tool_aborts_the_later_ones() -> None:
    failure = RuntimeError("serial broke")
    ran: list[str] = []

    @tool(parallel=False)
    async def step(n: int) -> str:
        ran.append(f"step {n}")
        if n == 2:
            raise failure
        return str(n)

    calls = [tool_call("step", n=1), tool_call("step", n=2), tool_call("step", n=3)]
    state = State(messages=[Message.user("Go")])
    with pytest.raises(RuntimeError) as caught:
        await Agent(FakeModel([calls, "never"]), tools=[step]).arun(state)
    assert caught.value is failure
    assert ran == ["step 1", "step 2"]
    assert [result_of(state, c).outcome for c in calls] == ["done", "aborted", "aborted"]
    assert len(errors(state)) == 1
    assert_consistent(state)


@pytest.mark.anyio
async def test_two_failing_calls_reraise_the_first_failure_once() -> None:
    first_failed = anyio.Event()
    first = ValueError("first")
    second = KeyError("second")

    @tool
    async def fail_first() -> str:
        first_failed.set()
        raise first

    @tool
    async def fail_second() -> str:
        await first_failed.wait()
        raise second

    calls = [tool_call("fail_second"), tool_call("fail_first")]
    state = State(messages=[Message.user("Go")])
    with pytest.raises(ValueError) as caught:  # noqa: PT011 - identity is what is checked
        await Agent(FakeModel([calls, "never"]), tools=[fail_first, fail_second]).arun(state)
    assert caught.value is first
    assert [result_of(state, c).outcome for c in calls] == ["aborted", "aborted"]
    assert errors(state) == ["ValueError: first"]
    assert_consistent(state)


@pytest.mark.anyio
async def test_the_same_exception_object_is_recorded_in_each_run_it_ends() -> None:
    failure = RuntimeError("flaky disk")

    @tool
    def flaky() -> str:
        raise failure

    state = State(messages=[Message.user("Go")])
    for attempt in (1, 2):
        model = FakeModel([tool_call("flaky")])
        with pytest.raises(RuntimeError) as caught:
            await Agent(model, tools=[flaky]).arun(state)
        assert caught.value is failure
        assert errors(state) == ["RuntimeError: flaky disk"] * attempt
        state.add_message(Message.user("Try again"))
    assert_consistent(state)


class FailingStore:
    """An async store whose save number `fail_at` raises `error`."""

    def __init__(self, fail_at: int, error: BaseException) -> None:
        self.fail_at = fail_at
        self.error = error
        self.saves = 0

    async def asave(self, state: State) -> None:
        self.saves += 1
        number = self.saves  # taken before the await: saves of parallel calls interleave
        await anyio.lowlevel.checkpoint()
        if number == self.fail_at:
            raise self.error


class FailingReporter(Reporter):
    """A reporter whose on_tool_end raises `error` for the first result."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.raised = False

    def on_tool_end(self, state: State, call: ToolCall, entry: ToolResultEntry) -> None:
        if not self.raised:
            self.raised = True
            raise self.error


@pytest.mark.anyio
@pytest.mark.parametrize("source", ["store", "reporter"])
async def test_an_exception_from_a_save_or_a_hook_during_parallel_calls_is_reraised_unchanged(
    source: str,
) -> None:
    failure = OSError(28, "No space left on device")

    @tool
    async def job(n: int) -> str:
        return str(n)

    settings: dict[str, Any] = (
        {"store": FailingStore(3, failure)}  # run start, reply, then the first result
        if source == "store"
        else {"reporter": FailingReporter(failure)}
    )
    calls = [tool_call("job", n=1), tool_call("job", n=2)]
    state = State(messages=[Message.user("Go")])
    with pytest.raises(OSError) as caught:  # noqa: PT011 - identity is what is checked
        await Agent(FakeModel([calls, "never"]), tools=[job], **settings).arun(state)
    assert caught.value is failure
    assert errors(state) == ["OSError: [Errno 28] No space left on device"]
    assert_consistent(state)


@pytest.mark.anyio
async def test_an_exception_from_the_model_is_reraised_unchanged_and_recorded_once() -> None:
    failure = ConnectionError("reset by peer")
    model = FakeModel([failure])
    state = State(messages=[Message.user("Go")])
    with pytest.raises(ConnectionError) as caught:
        await Agent(model).arun(state)
    assert caught.value is failure
    assert errors(state) == ["ConnectionError: reset by peer"]
    assert state.turn == 0
    assert state.stopped is None
    assert_consistent(state)
    await assert_runs_again(state)


@pytest.mark.anyio
async def test_an_exception_from_a_sync_loop_body_is_reraised_unchanged() -> None:
    failure = RuntimeError("body broke")

    def body(agent: Agent, state: State) -> None:
        agent.think(state)
        raise failure

    state = State(messages=[Message.user("Go")])
    with pytest.raises(RuntimeError) as caught:
        await Agent(FakeModel([tool_call("nothing"), "never"]), loop=body).arun(state)
    assert caught.value is failure
    (reply,) = [e for e in state.history if isinstance(e, ModelReplyEntry)]
    (call,) = reply.tool_calls
    entry = result_of(state, call)
    assert entry.outcome == "aborted"
    assert errors(state) == ["RuntimeError: body broke"]
    assert_consistent(state)
