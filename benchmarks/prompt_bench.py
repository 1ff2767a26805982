"""What recording the prompt costs in a store (issue 30): a 200-turn run, a 5 KB prompt, 20 tools.

An Agent with 5 KB of instructions and 20 tools runs `turns` turns on a `FakeModel` (each turn
a call to one of the tools, whose result is about 400 characters); the run's State is then
saved to a new SQLite file at each model reply, as its save points would. The floor is the
same run without prompt recording: the same history with its prompt entries taken out and its
requests naming none (what a store held before), saved the same way. Two numbers, each beside
its floor: the SQLite file's size (whole pages), and the bytes of the encoded entries (what
every backend stores, before its own overhead).

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
from orchestrator.testing import FakeModel, tool_call
from stores import SQLiteStore, encode_entry

from .report import Metric

__all__ = ("bench_prompt", "main")

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
            content = dataclasses.replace(entry.content, prompt=None)
            entry = dataclasses.replace(entry, content=content)
        history.append(entry)
    return State(history=history)


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
        # Reported, no target: a prompt is recorded once per State, so each subagent State of
        # a fan-out holds its agent's prompt (the issue asks for once per tree).
        Metric(
            "prompt.child.growth",
            "a 1-turn subagent State with the same prompt: encoded entries growth",
            child_growth,
            "%",
        ),
    ]


def main(argv: Sequence[str] | None = None) -> None:
    """Print the rows."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.prompt_bench")
    parser.add_argument("--quick", action="store_true", help="20 turns, to check that it runs")
    args = parser.parse_args(argv)
    for metric in bench_prompt(20 if args.quick else 200):
        print(f"{metric.label}: {metric.value:,.2f} {metric.unit}")


if __name__ == "__main__":
    main()
