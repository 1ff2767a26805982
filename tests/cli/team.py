"""A lead with two researcher subagents and a search tool: runs to record, inspect and replay.

`build(model)` is the factory ``orchestrator replay --agents tests.cli.team:build`` calls; the
recording uses `deciding_model()`, a FakeModel that answers from the request, so the lead and
its parallel subagents each get the right reply whatever order they ask in.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio

from orchestrator import (
    Agent,
    HistoryEntry,
    Message,
    ModelReplyEntry,
    ModelRequest,
    ModelRequestEntry,
    Reply,
    RunStart,
    RunStartEntry,
    State,
    Tool,
    ToolCall,
    Usage,
    loop,
    tool,
)
from orchestrator.models import Model, Request
from orchestrator.testing import FakeModel, tool_call
from stores import SQLiteStore

QUESTION = "Why are refunds paid twice?"
TOPICS = ("retries", "idempotency")
NOTES = {
    "retries": "refund() retries on timeout [3 times]",
    "idempotency": "no idempotency key on refund requests",
}


@tool
def search(query: str) -> str:
    """Search the team's notes.

    Args:
        query: A topic.
    """
    return NOTES.get(query, "nothing found")


# A changed version, for a replay that must not match: the same spec (the model is told the
# same), another answer.
@tool(name="search")
def search_changed(query: str) -> str:
    """Search the team's notes.

    Args:
        query: A topic.
    """
    return NOTES.get(query, "nothing found").upper()


def _reply(message: Message, tokens: int, cost: float) -> Reply:
    stop = "tool_use" if message.tool_calls else "end_turn"
    usage = Usage(input_tokens=tokens, output_tokens=tokens // 4, requests=1, cost=cost)
    return Reply(message, usage, stop_reason=stop, model="fake")


def decide(request: Request) -> Reply:
    """The recorded model: the lead fans out, each researcher searches once, then answers."""
    first, last = request.messages[0].text, request.messages[-1]
    if first == QUESTION:
        if last.tool_results:
            findings = "; ".join(result.text for result in last.tool_results)
            return _reply(Message.assistant(f"Answer: {findings}"), 900, 0.01)
        calls = [tool_call("researcher", task=topic) for topic in TOPICS]
        return _reply(Message.assistant("Asking the researchers.", calls), 500, 0.005)
    if last.tool_results:
        return _reply(Message.assistant(f"{first}: {last.tool_results[0].text}"), 400, 0.002)
    return _reply(Message.assistant("", [tool_call("search", query=first)]), 300, 0.001)


def deciding_model() -> FakeModel:
    """A FakeModel that answers every request of the team with `decide`."""
    return FakeModel([decide] * 20)


def build(model: Model, search_tool: Tool = search) -> dict[str, Agent]:
    """The team's agents by name, every one asking `model`."""
    researcher = Agent(
        model, tools=[search_tool], name="researcher", description="Researches one topic."
    )
    lead = Agent(model, tools=[researcher], name="lead", instructions="Split the question.")
    return {"lead": lead, "researcher": researcher}


def build_changed(model: Model) -> dict[str, Agent]:
    """The team with a search tool that now answers otherwise: its replay differs."""
    return build(model, search_changed)


def build_instructed(model: Model) -> dict[str, Agent]:
    """The team whose lead is told otherwise: its replay differs at the lead's first request."""
    team = build(model)
    return {**team, "lead": team["lead"].copy(instructions="Split the question in two.")}


def build_nothing(model: Model) -> Any:
    """Not a factory's result: no agents by name."""
    return [model]


async def record(store: Any) -> State:
    """Run the team once on `store`; return the lead's State."""
    lead = build(deciding_model())["lead"].copy(store=store)
    state = State(messages=[Message.user(QUESTION)])
    await lead.arun(state)
    return state


@loop
async def broken(agent: Agent, state: State) -> None:
    """A loop that fails before asking anything."""
    raise RuntimeError("broken loop")


def build_broken(model: Model) -> dict[str, Agent]:
    """The team with a lead whose loop fails: its replay raises what the recording did not."""
    team = build(model)
    return {**team, "lead": team["lead"].copy(loop=broken)}


def build_solo(model: Model, search_tool: Tool = search) -> dict[str, Agent]:
    """One agent that searches once and stops at its turn limit, before reading the result."""
    return {"solo": Agent(model, tools=[search_tool], name="solo", max_turns=1)}


def build_solo_changed(model: Model) -> dict[str, Agent]:
    """`build_solo` with the changed search tool."""
    return build_solo(model, search_changed)


def build_short(model: Model) -> dict[str, Agent]:
    """The team with a lead that stops after one turn: its replay asks fewer requests."""
    team = build(model)
    return {**team, "lead": team["lead"].copy(max_turns=1)}


DEEP = 1200  # States in a chain: deeper than Python's recursion limit (1000)


def save_chain(path: Path) -> None:
    """Save `chain(DEEP)` in the SQLite store at `path`, in a few group commits."""

    async def save_all() -> None:
        async with SQLiteStore(path) as store, anyio.create_task_group() as group:
            for state in chain(DEEP):
                group.start_soon(store.asave, state)

    anyio.run(save_all)


def deep_json(text: str) -> Any:
    """Parse JSON nested deeper than Python's recursion limit: its parser recurses too."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(10 * DEEP)
    try:
        return json.loads(text)
    finally:
        sys.setrecursionlimit(limit)


def chain(length: int) -> list[State]:
    """States `c0` ... that each started the next from its call ``to-<next>``: a deep tree.

    Built from history entries, not by running agents, so a chain deeper than Python's
    recursion limit costs a fraction of a second to make and save.
    """
    at = datetime.now(UTC)
    states: list[State] = []
    for index in range(length):
        history: list[HistoryEntry] = []
        if index:
            start = RunStart(parent_id=f"c{index - 1}", parent_call_id=f"to-c{index}")
            history.append(RunStartEntry(seq=0, turn=0, at=at, content=start))
        else:
            history.append(RunStartEntry(seq=0, turn=0, at=at, content=RunStart(agent="lead")))
        if index + 1 < length:
            call = ToolCall(id=f"to-c{index + 1}", name="delegate", args={"depth": index + 1})
            reply = _reply(Message.assistant("Passing it on.", [call]), 10, 0.0)
            request = ModelRequest(message_count=1, model="fake")
            history.append(ModelRequestEntry(seq=1, turn=1, at=at, content=request))
            history.append(ModelReplyEntry(seq=2, turn=1, at=at, content=reply))
        states.append(State(id=f"c{index}", history=history))
    return states
