"""A lead with two researcher subagents and a search tool: runs to record, inspect and replay.

`build(model)` is the factory ``orchestrator replay --agents tests.cli.team:build`` calls; the
recording uses `deciding_model()`, a FakeModel that answers from the request, so the lead and
its parallel subagents each get the right reply whatever order they ask in.
"""

from __future__ import annotations

from typing import Any

from orchestrator import Agent, Message, Reply, State, Tool, Usage, loop, tool
from orchestrator.models import Model, Request
from orchestrator.testing import FakeModel, tool_call

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


@tool(name="search")
def search_changed(query: str) -> str:
    """Search the team's notes (a changed version, for a replay that must not match).

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
