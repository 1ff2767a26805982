"""`Agent(tool_errors=...)`: an exception from a tool aborts the run, or reaches the model."""

from __future__ import annotations

import anyio
import pytest

from orchestrator import Agent, Message, State, ToolResultEntry, tool
from orchestrator.testing import FakeModel, tool_call
from tests.doubles import assert_consistent, assert_replays


@tool
def divide(a: int, b: int) -> float:
    """Divide a by b."""
    return a / b


@tool
async def wait_forever() -> str:
    """Never ends."""
    await anyio.sleep_forever()
    return "never"


class Stop(BaseException):
    """Not an Exception: it always ends the run."""


@tool
def pull_the_plug() -> str:
    """Raises a BaseException."""
    raise Stop


def asked() -> State:
    return State(messages=[Message.user("What is 1 / 0?")])


def only_result(state: State) -> ToolResultEntry:
    (result,) = [entry for entry in state.history if isinstance(entry, ToolResultEntry)]
    return result


@pytest.mark.anyio
async def test_by_default_an_exception_aborts_the_run_and_is_raised() -> None:
    model = FakeModel([tool_call("divide", a=1, b=0), "unreachable"])
    state = asked()
    with pytest.raises(ZeroDivisionError):
        await Agent(model, tools=[divide]).arun(state)
    assert only_result(state).outcome == "aborted"
    assert_consistent(state)


@pytest.mark.anyio
async def test_to_model_gives_the_model_the_error_and_the_run_goes_on() -> None:
    model = FakeModel([tool_call("divide", a=1, b=0), "Dividing by zero is undefined."])
    state = asked()
    answer = await Agent(model, tools=[divide], tool_errors="to_model").arun(state)
    assert answer == "Dividing by zero is undefined."
    result = only_result(state)
    assert result.outcome == "error"
    assert result.content.is_error
    assert result.content.text == "(the tool raised ZeroDivisionError: division by zero)"
    # The model read it: the second request carried the error result.
    assert model.requests[1].messages[-1].tool_results[0].text == result.content.text
    assert_consistent(state)
    assert_replays(state)


@pytest.mark.anyio
async def test_to_model_still_lets_a_base_exception_through() -> None:
    model = FakeModel([tool_call("pull_the_plug"), "unreachable"])
    state = asked()
    with pytest.raises(Stop):
        await Agent(model, tools=[pull_the_plug], tool_errors="to_model").arun(state)
    assert len(model.requests) == 1


@pytest.mark.anyio
async def test_to_model_still_lets_a_cancellation_through() -> None:
    model = FakeModel([tool_call("wait_forever"), "unreachable"])
    state = asked()
    agent = Agent(model, tools=[wait_forever], tool_errors="to_model")
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:
            group.start_soon(agent.arun, state)
            while not state.pending_calls:
                await anyio.lowlevel.checkpoint()
            scope.cancel()
    assert scope.cancelled_caught
    assert only_result(state).outcome == "interrupted"
    assert len(model.requests) == 1


def test_the_setting_is_kept_by_copy() -> None:
    agent = Agent(FakeModel(["hi"]), tool_errors="to_model")
    assert agent.tool_errors == "to_model"
    assert agent.copy(name="helper").tool_errors == "to_model"
    assert agent.copy(tool_errors="raise").tool_errors == "raise"
    assert Agent(FakeModel(["hi"])).tool_errors == "raise"


def test_a_wrong_value_says_what_to_pass() -> None:
    with pytest.raises(ValueError, match='tool_errors must be "raise"'):
        Agent(FakeModel(["hi"]), tool_errors="model")  # type: ignore[arg-type]
