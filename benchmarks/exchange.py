"""The exchange issue 13 measures, and its floor: one async tool call a turn.

A model deciding from ``len(request.messages)`` (a `FakeModel` whose every scripted reply is
that decision) and one async tool that counts its calls under a `threading.Lock`. `agent_seconds`
runs it through an `Agent` (the default loop, or the same body as a user's `@loop`);
`floor_seconds` through a hand-written loop with the same model and tool function.

This module imports only `orchestrator` and `anyio`, so that a fresh process running it
(`benchmarks.peak_rss`) holds nothing the run does not need.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator import (
    Agent,
    HistoryEntry,
    Message,
    State,
    TextBlock,
    ToolCall,
    ToolResultBlock,
    loop,
    tool,
    waiting_for_user,
)
from orchestrator.models import Request
from orchestrator.testing import FakeModel, tool_call

__all__ = (
    "Commit",
    "Counter",
    "agent_seconds",
    "counting_tool",
    "deciding_model",
    "floor_seconds",
    "think_then_use_tools",
)

Commit = Callable[[Sequence[HistoryEntry]], Awaitable[None]]
"""Saves the entries of one save point (the floor's stand-in for a store)."""


async def think_then_use_tools(agent: Agent, state: State) -> None:
    """The default loop's body, written as a user's `@loop` would be."""
    await agent.athink(state)
    if state.pending_calls:
        await agent.ause_tools(state)


@dataclass(slots=True)
class Counter:
    """Counts tool calls under a lock, as a tool that threads share would."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    calls: int = 0

    def check(self, turns: int) -> None:
        """Raise unless there was one call per turn: else the run measured something else."""
        if self.calls != turns:
            raise RuntimeError(
                f"the run made {self.calls} tool calls in {turns} turns, not one a turn"
            )


def counting_tool(counter: Counter) -> Callable[[int], Awaitable[str]]:
    """The async tool function of the harness: it counts its calls in `counter`."""

    async def count(n: int) -> str:
        """Count one call."""
        with counter.lock:
            counter.calls += 1
        return "ok"

    return count


def deciding_model(turns: int) -> FakeModel:
    """A model that asks for the tool until `turns` results came back, then answers."""

    def decide(request: Request) -> ToolCall | str:
        size = len(request.messages)  # the prompt, then a call and its result a turn
        return tool_call("count", n=size) if size < 2 * turns else "done"

    return FakeModel([decide] * (turns + 1))


async def agent_seconds(turns: int, user_loop: bool, store: Any = None) -> float:
    """Seconds of one `arun` of `turns` tool turns: the default loop, or the same body as a
    user's `@loop`; saved by `store` if given. The Agent is built before the clock starts.
    """
    counter = Counter()
    tools = [tool(counting_tool(counter))]
    model = deciding_model(turns)
    if user_loop:
        body = loop(until=[waiting_for_user], limit=turns + 1)(think_then_use_tools)
        agent = Agent(model, tools=tools, store=store, loop=body)
    else:
        agent = Agent(model, tools=tools, store=store, max_turns=turns + 1)
    start = time.perf_counter()
    await agent.arun("go")
    elapsed = time.perf_counter() - start
    counter.check(turns)
    return elapsed


async def floor_seconds(
    turns: int,
    commit: Commit | None = None,
    points: Iterable[Sequence[HistoryEntry]] = (),
    *,
    before_tools: bool = False,
) -> float:
    """Seconds of the floor: a hand-written loop doing the agent's exchange, `turns` tool turns.

    The same model and tool function; the messages kept in a list. With `commit`, it saves
    each of `points` in turn: one before each model request and the last at the end, where the
    default loop saves; with `before_tools` also one before the tools of each reply run (the
    other save point of a turn, DESIGN 13).
    """
    counter = Counter()
    count = counting_tool(counter)
    model = deciding_model(turns)
    specs = (tool(count).spec,)
    messages: list[Message] = [Message.user("go")]
    pending: Iterator[Sequence[HistoryEntry]] = iter(points)
    start = time.perf_counter()
    while True:
        if commit is not None:
            await commit(next(pending))
        reply = await model.respond(Request(None, messages, specs))
        messages.append(reply.message)
        if not reply.message.tool_calls:
            break
        if commit is not None and before_tools:
            await commit(next(pending))
        for call in reply.message.tool_calls:
            text = await count(call.args["n"])
            messages.append(Message("user", (ToolResultBlock(call.id, (TextBlock(text),)),)))
    if commit is not None:
        await commit(next(pending))
    elapsed = time.perf_counter() - start
    counter.check(turns)
    return elapsed
