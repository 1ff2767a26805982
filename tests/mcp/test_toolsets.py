"""`Toolset`: tools a run opens when it starts and closes when it returns (the core hook)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import anyio
import pytest

from orchestrator import Agent, Message, State, Tool, Toolset, loop, tool, waiting_for_user
from orchestrator.testing import FakeModel, tool_call

pytestmark = pytest.mark.anyio


class Counted(Toolset):
    """A toolset that logs when it opens and closes, and gives one tool, `ping`."""

    name = "counted"

    def __init__(self, *extra: object) -> None:
        self.log: list[str] = []
        self.extra = extra

    def open(self) -> AbstractAsyncContextManager[Sequence[Tool]]:
        return self._open()

    @asynccontextmanager
    async def _open(self) -> AsyncGenerator[Sequence[Tool]]:
        log = self.log

        @tool
        async def ping() -> str:
            """Answer pong."""
            log.append("called")
            return "pong"

        log.append("open")
        try:
            yield [ping, *self.extra]  # type: ignore[list-item]
        finally:
            log.append("closed")


async def test_a_run_opens_its_toolsets_and_closes_them_when_it_returns() -> None:
    toolset = Counted()
    model = FakeModel([tool_call("ping"), "done"])
    agent = Agent(model, tools=[toolset])
    assert agent.tools == ()
    assert agent.toolsets == (toolset,)
    state = State(messages=[Message.user("go")])
    assert await agent.arun(state) == "done"
    assert toolset.log == ["open", "called", "closed"]
    assert [spec.name for spec in model.requests[0].tools] == ["ping"]
    (result,) = [e for e in state.history if e.kind == "tool_result"]
    assert result.content.text == "pong"
    (start,) = [e for e in state.history if e.kind == "run_start"]
    assert start.content.tools == ("ping",)


async def test_a_failed_or_cancelled_run_closes_its_toolsets() -> None:
    toolset = Counted()
    agent = Agent(FakeModel([RuntimeError("model down")]), tools=[toolset])
    with pytest.raises(RuntimeError, match="model down"):
        await agent.arun("go")
    assert toolset.log == ["open", "closed"]

    toolset = Counted()

    @tool
    async def block() -> str:
        """Wait forever."""
        scope.cancel()
        await anyio.sleep_forever()
        return "never"

    agent = Agent(FakeModel([tool_call("block")]), tools=[block, toolset])
    with anyio.CancelScope() as scope:
        await agent.arun("go")
    assert toolset.log == ["open", "closed"]


async def test_a_loop_body_step_uses_the_runs_toolsets_and_a_lone_step_opens_its_own() -> None:
    toolset = Counted()

    @loop(until=[waiting_for_user], limit=3)
    async def body(agent: Agent, state: State) -> None:
        await agent.athink(state)
        if state.pending_calls:
            await agent.ause_tools(state)

    agent = Agent(FakeModel([tool_call("ping"), "done"]), tools=[toolset], loop=body)
    await agent.arun("go")
    assert toolset.log == ["open", "called", "closed"]  # opened once, for the run

    toolset.log.clear()
    lone = Agent(FakeModel([tool_call("ping")]), tools=[toolset])
    state = State(messages=[Message.user("go")])
    await lone.athink(state)
    await lone.ause_tools(state)
    assert toolset.log == ["open", "closed", "open", "called", "closed"]


async def test_a_toolset_tool_named_like_the_agents_own_is_refused() -> None:
    @tool
    def ping() -> str:
        """Mine."""
        return "mine"

    toolset = Counted()
    agent = Agent(FakeModel(["never"]), tools=[ping, toolset])
    with pytest.raises(ValueError, match=r"'ping'.*prefix"):
        await agent.arun("go")
    assert toolset.log == ["open", "closed"]


async def test_a_toolset_that_gives_something_else_than_tools_is_refused() -> None:
    agent = Agent(FakeModel(["never"]), tools=[Counted("not a tool")])
    with pytest.raises(TypeError, match="not a Tool"):
        await agent.arun("go")
