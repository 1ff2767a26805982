"""What recording the prompt costs in a store (issue 30): a 200-turn run, a 5 KB prompt, 20 tools.

An Agent with 5 KB of instructions and 20 tools runs `turns` turns on a `FakeModel` (each turn
a call to one of the tools, whose result is about 400 characters); the run's State is then
saved to a new SQLite file at each model reply, as its save points would. The floor is the
same run without prompt recording: the same history with its prompt entries taken out and its
requests naming none (what a store held before), saved the same way. Two numbers, each beside
its floor: the SQLite file's size (whole pages), and the bytes of the encoded entries (what
every backend stores, before its own overhead).

A fan-out tree (a lead and `children` subagents of one agent, each with the same 5 KB prompt
and 20 tools, one tool call each) is measured the same way, against the same floor, and beside
what it stored before a tree kept each prompt once (a full copy in every child State).

``python -m benchmarks.prompt_bench [--quick]`` prints the rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator import (
    Agent,
    HistoryEntry,
    Message,
    ModelRequestEntry,
    PromptEntry,
    State,
    Tool,
    tool,
)
from orchestrator.models import Request
from orchestrator.testing import FakeModel, tool_call
from stores import SQLiteStore, encode_entry

from .report import Metric

__all__ = ("bench_fan_out", "bench_prompt", "main")

TOOLS = 20
INSTRUCTIONS = 5_000  # characters


def _look_up(number: int) -> Tool:
    """Tool `number`: a description and two arguments, like a real agent's tools."""

    @tool(
        name=f"look_up_{number}",
        description=f"Look a topic up in source {number} and return up to `limit` findings,"
        " each with where it was found. Use it before answering.",
    )
    def look_up(topic: str, limit: int = 5) -> str:
        return f"[{number}] {topic}: " + "a finding about it, with its source. " * 10

    return look_up


def _tools() -> list[Tool]:
    return [_look_up(number) for number in range(TOOLS)]


def _instructions() -> str:
    line = "You are a careful research assistant: check each claim against two sources.\n"
    return (line * (INSTRUCTIONS // len(line) + 1))[:INSTRUCTIONS]


def recorded_run(turns: int) -> State:
    """The State of a run of `turns` turns, each one tool call, then an answer."""
    replies: list[Any] = [
        tool_call(f"look_up_{turn % TOOLS}", topic=f"question {turn}") for turn in range(turns)
    ]
    model = FakeModel([*replies, "Done."])
    agent = Agent(model, instructions=_instructions(), tools=_tools(), max_turns=turns + 1)
    state = State(messages=[Message.user("Research the questions one by one.")])
    agent.run(state)
    return state


def without_prompts(state: State) -> State:
    """The same history as a store held it before prompts were recorded."""
    history: list[HistoryEntry] = []
    for entry in state.history:
        if isinstance(entry, PromptEntry):
            continue
        entry = dataclasses.replace(entry, seq=len(history))
        if isinstance(entry, ModelRequestEntry):
            content = dataclasses.replace(entry.content, prompt=None, prompt_holder=None)
            entry = dataclasses.replace(entry, content=content)
        history.append(entry)
    return State(history=history)


def _child_reply(request: Request) -> Any:
    """A subagent's model: one tool call, then an answer."""
    if len(request.messages) == 1:
        return tool_call("look_up_0", topic=request.messages[0].text)
    return "Found it."


def recorded_tree(children: int) -> list[State]:
    """The States of a lead that starts `children` subagents of one agent at once, lead first.

    The lead and the subagents have the same 5 KB instructions and 20 tools (the lead's plus
    the agent tool); each subagent makes one tool call, then answers.
    """
    researcher = Agent(
        FakeModel([_child_reply] * (2 * children)),
        instructions=_instructions(),
        tools=_tools(),
        name="researcher",
        description="Researches one question.",
    )
    calls = [tool_call("researcher", task=f"question {n}") for n in range(children)]
    lead = Agent(
        FakeModel([calls, "Done."]), instructions=_instructions(), tools=[*_tools(), researcher]
    )
    root = State(messages=[Message.user("Research the questions, all at once.")])
    lead.run(root)
    return [root, *(root.child(child_id) for child_id in root.children)]


def with_copies(tree: Sequence[State]) -> list[State]:
    """The tree as it was stored before a tree kept each prompt once: a copy in every State."""
    held = {
        entry.content.digest: entry
        for state in tree
        for entry in state.history
        if isinstance(entry, PromptEntry)
    }
    copied: list[State] = []
    for state in tree:
        history: list[HistoryEntry] = []
        for entry in state.history:
            if isinstance(entry, ModelRequestEntry) and entry.content.prompt_holder is not None:
                digest = entry.content.prompt
                if not any(
                    isinstance(e, PromptEntry) and e.content.digest == digest for e in history
                ):
                    history.append(dataclasses.replace(held[str(digest)], seq=len(history)))
                content = dataclasses.replace(entry.content, prompt_holder=None)
                entry = dataclasses.replace(entry, content=content)
            history.append(dataclasses.replace(entry, seq=len(history)))
        copied.append(State(id=state.id, history=history))
    return copied


def _file_size(state: State, folder: Path, name: str) -> int:
    """The SQLite file's bytes after saving `state` as its run did: at each model reply."""
    path = folder / f"{name}.db"
    history = state.history
    ends = [entry.seq + 1 for entry in history if entry.kind == "model_reply"]
    with SQLiteStore(path) as store:
        for end in [*ends, len(history)]:
            store.save(State(id=state.id, history=history[:end]))
    return sum(part.stat().st_size for part in folder.glob(f"{name}.db*"))


def _entry_bytes(state: State) -> int:
    return sum(len(encode_entry(entry)) for entry in state.history)


def _tree_bytes(tree: Sequence[State]) -> int:
    return sum(_entry_bytes(state) for state in tree)


def _tree_file_size(tree: Sequence[State], folder: Path, name: str) -> int:
    """The SQLite file's bytes after saving each State of `tree` at each of its model replies."""
    path = folder / f"{name}.db"
    with SQLiteStore(path) as store:
        for state in tree:
            history = state.history
            ends = [entry.seq + 1 for entry in history if entry.kind == "model_reply"]
            for end in [*ends, len(history)]:
                store.save(State(id=state.id, history=history[:end]))
    return sum(part.stat().st_size for part in folder.glob(f"{name}.db*"))


def bench_fan_out(children: int = 20) -> list[Metric]:
    """A lead and `children` subagents of one agent: store growth from their prompts."""
    tree = recorded_tree(children)
    floor = [without_prompts(state) for state in tree]
    copies = with_copies(tree)
    data, floor_data, copies_data = _tree_bytes(tree), _tree_bytes(floor), _tree_bytes(copies)
    with tempfile.TemporaryDirectory() as folder:
        size = _tree_file_size(tree, Path(folder), "with")
        floor_size = _tree_file_size(floor, Path(folder), "without")
        copies_size = _tree_file_size(copies, Path(folder), "copies")
    what = f"lead + {children} subagents of one agent, 5 KB prompt, {TOOLS} tools"
    growth = (data / floor_data - 1) * 100
    copies_growth = (copies_data / floor_data - 1) * 100
    file_growth = (size / floor_size - 1) * 100
    copies_file_growth = (copies_size / floor_size - 1) * 100
    return [
        Metric(
            "prompt.fanout.entries.floor.kb",
            f"{what}: encoded entries without prompts",
            floor_data / 1e3,
            "KB",
        ),
        Metric(
            "prompt.fanout.entries.kb", f"{what}: encoded entries, once per tree", data / 1e3, "KB"
        ),
        Metric(
            "prompt.fanout.entries.growth",
            f"{what}: encoded entries growth, once per tree",
            growth,
            "%",
        ),
        Metric(
            "prompt.fanout.entries.copies.growth",
            f"{what}: encoded entries growth, a copy per State (before)",
            copies_growth,
            "%",
        ),
        Metric(
            "prompt.fanout.sqlite.growth",
            f"{what}: SQLite file growth, once per tree",
            file_growth,
            "%",
        ),
        Metric(
            "prompt.fanout.sqlite.copies.growth",
            f"{what}: SQLite file growth, a copy per State (before)",
            copies_file_growth,
            "%",
        ),
    ]


def bench_prompt(turns: int = 200) -> list[Metric]:
    """The store growth from recording the prompt, in file bytes and encoded entry bytes."""
    state = recorded_run(turns)
    floor = without_prompts(state)
    with tempfile.TemporaryDirectory() as folder:
        size, floor_size = (
            _file_size(state, Path(folder), "with"),
            _file_size(floor, Path(folder), "without"),
        )
    data, floor_data = _entry_bytes(state), _entry_bytes(floor)
    child = recorded_run(1)  # a subagent's State: one call, then an answer
    child_data, child_floor = _entry_bytes(child), _entry_bytes(without_prompts(child))
    child_growth = (child_data / child_floor - 1) * 100
    file_growth = (size / floor_size - 1) * 100
    data_growth = (data / floor_data - 1) * 100
    what = f"{turns}-turn run, 5 KB prompt, {TOOLS} tools"
    return [
        Metric(
            "prompt.sqlite.floor.kb", f"{what}: SQLite file without prompts", floor_size / 1e3, "KB"
        ),
        Metric("prompt.sqlite.kb", f"{what}: SQLite file with prompts", size / 1e3, "KB"),
        Metric(
            "prompt.sqlite.growth",
            f"{what}: SQLite file growth",
            file_growth,
            "%",
            "< 10%",
            file_growth < 10,
        ),
        Metric(
            "prompt.entries.floor.kb",
            f"{what}: encoded entries without prompts",
            floor_data / 1e3,
            "KB",
        ),
        Metric("prompt.entries.kb", f"{what}: encoded entries with prompts", data / 1e3, "KB"),
        Metric(
            "prompt.entries.growth",
            f"{what}: encoded entries growth",
            data_growth,
            "%",
            "< 10%",
            data_growth < 10,
        ),
        # Reported, no target: a 1-turn State that holds its prompt itself (a root, or the
        # first subagent of its tree to use it; the others name it: see bench_fan_out).
        Metric(
            "prompt.child.growth",
            "a 1-turn State holding its own prompt: encoded entries growth",
            child_growth,
            "%",
        ),
    ]


def main(argv: Sequence[str] | None = None) -> None:
    """Print the rows."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.prompt_bench")
    parser.add_argument("--quick", action="store_true", help="20 turns, to check that it runs")
    args = parser.parse_args(argv)
    for metric in [
        *bench_prompt(20 if args.quick else 200),
        *bench_fan_out(5 if args.quick else 20),
    ]:
        print(f"{metric.label}: {metric.value:,.2f} {metric.unit}")


if __name__ == "__main__":
    main()
