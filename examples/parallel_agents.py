"""Parallel subagents: a lead agent fans out to three specialists at once, saved in SQLite.

Each specialist is an Agent with its own tool, given to the lead in `tools=` (an Agent there is a
tool that runs it on a new child State). The lead's model asks for all three in one turn, so they
run concurrently; their slow tools overlap. Every State of the tree is saved in one SQLite file
and reopened from it. It runs offline on scripted FakeModels.

Run it with ``python examples/parallel_agents.py [runs.db]`` (a temporary file by default).
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import anyio

from orchestrator import (
    Agent,
    Message,
    Reply,
    RunStartEntry,
    State,
    Tool,
    ToolCall,
    ToolResultEntry,
    Usage,
    tool,
)
from orchestrator.models import Request
from orchestrator.testing import FakeModel, tool_call
from stores import SQLiteStore

SLOW = 0.3  # seconds each specialist's tool takes
running = peak = 0


async def slow_io(result: str) -> str:
    """Pretend to wait on a disk or a network for SLOW seconds."""
    global running, peak
    running += 1
    peak = max(peak, running)
    await anyio.sleep(SLOW)
    running -= 1
    return result


@tool
async def search_code(pattern: str) -> str:
    """Search the code base for a pattern."""
    return await slow_io(f"'{pattern}' found in payments/refund.py:42")


@tool
async def read_logs(service: str) -> str:
    """Read the recent error logs of a service."""
    return await slow_io(f"{service}: 17 x TimeoutError in refund()")


@tool
async def run_tests(suite: str) -> str:
    """Run a test suite."""
    return await slow_io(f"{suite}: 2 failed (test_refund_retry, test_refund_twice)")


def reply(content: str | list[ToolCall], tokens: int, cost: float) -> Reply:
    """A scripted model reply with its usage."""
    message = (
        Message.assistant(content) if isinstance(content, str) else Message.assistant("", content)
    )
    return Reply(
        message, Usage(input_tokens=tokens, output_tokens=tokens // 4, requests=1, cost=cost)
    )


def relay(prefix: str, tokens: int, cost: float) -> Callable[[Request], Reply]:
    """A scripted reply built from the tool result the model was just shown."""

    def answer(request: Request) -> Reply:
        return reply(f"{prefix}: {request.messages[-1].tool_results[0].text}", tokens, cost)

    return answer


def specialist(name: str, description: str, own_tool: Tool, **args: str) -> Agent:
    """A subagent with its own tool: it calls the tool once, then reports what it found."""
    model = FakeModel(
        [reply([tool_call(own_tool.name, **args)], 300, 0.001), relay(name, 400, 0.002)]
    )
    return Agent(model, tools=[own_tool], name=name, description=description)


def summarize(request: Request) -> Reply:
    """The lead's answer, built from its subagents' answers."""
    findings = "".join(f"\n  - {block.text}" for block in request.messages[-1].tool_results)
    return reply(f"Refunds are retried without an idempotency key.{findings}", 900, 0.01)


def agent_of(state: State) -> str:
    """The name of the agent that ran `state` (recorded in its first run_start)."""
    start = next(entry for entry in state.history if isinstance(entry, RunStartEntry))
    return start.content.agent or "?"


def print_tree(state: State, depth: int = 0) -> int:
    """Print `state` and its subagents, one line each; return how many States were printed."""
    usage = state.usage
    print(
        f"{'   ' * depth}{agent_of(state):<12} turns={state.turn}  tokens={usage.input_tokens}"
        f"+{usage.output_tokens}  requests={usage.requests}  cost=${usage.cost or 0:.3f}"
        f"  id={state.id}"
    )
    count = 1
    for entry in state.history:
        if entry.kind == "tool_result":
            for child_id in entry.child_ids:
                count += print_tree(state.child(child_id), depth + 1)
    return count


async def main(path: Path) -> None:
    team = [
        specialist("code_reader", "Reads the code.", search_code, pattern="refund("),
        specialist("log_reader", "Reads the logs.", read_logs, service="payments"),
        specialist("test_runner", "Runs the tests.", run_tests, suite="refunds"),
    ]
    # One reply asks for all three subagents: they run at once, each on a new child State.
    fan_out = [tool_call(str(agent.name), task="Why are refunds paid twice?") for agent in team]
    lead_model = FakeModel([reply(fan_out, 500, 0.005), summarize])
    lead = State(messages=[Message.user("Why are refunds paid twice?")])
    started = time.perf_counter()
    async with SQLiteStore(path) as store:
        answer = await Agent(lead_model, tools=team, name="lead", store=store).arun(lead)
    elapsed = time.perf_counter() - started
    print(f"answer: {answer}")
    print(f"3 tools of {SLOW} s each took {elapsed:.2f} s in all")
    print(f"peak tools running at once: {peak}")
    print("tree of States:")
    print(f"states in the tree: {print_tree(lead)}")

    async with SQLiteStore(path) as store:  # a new connection, as another process would open
        loaded = await store.aload(lead.id)
        # The child of the lead's first call (`children` lists them as their calls ended).
        child_id = next(
            entry.child_ids[0]
            for entry in loaded.history
            if isinstance(entry, ToolResultEntry) and entry.call.id == fan_out[0].id
        )
        child = await loaded.achild(child_id)
    print(f"reopened {agent_of(child)} from {path.name} with achild: {child.answer}")
    same = child.snapshot() == lead.child(child_id).snapshot()
    print(
        f"same as the State that ran: {same}; its parent is the lead: {child.parent_id == lead.id}"
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        anyio.run(main, Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as folder:
            anyio.run(main, Path(folder) / "runs.db")
