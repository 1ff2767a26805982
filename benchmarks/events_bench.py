"""Events: what streaming a run costs per turn, and the memory a stalled consumer holds.

Each number stands beside its floor, measured in the same process: the per-turn time of the same
run with no consumer, and the peak traced memory of the same run with no stream.
"""

from __future__ import annotations

import gc
import time
import tracemalloc
from typing import Any

import anyio

from orchestrator import Agent, tool
from orchestrator.testing import FakeModel, tool_call

from .report import Metric


@tool
async def noop(x: int) -> str:
    """Do nothing."""
    return "ok"


def _agent(turns: int) -> Agent:
    replies: list[Any] = [tool_call("noop", x=i) for i in range(turns)] + ["done"]
    return Agent(FakeModel(replies), tools=[noop], max_turns=turns + 1)


async def _plain(turns: int) -> None:
    await _agent(turns).arun("go")


async def _streamed(turns: int) -> None:
    async with _agent(turns).events("go") as events:
        async for _ in events:
            pass


async def _stalled(turns: int, held: list[int]) -> None:
    """A consumer that reads nothing until the run cannot go on, then drains it."""
    async with _agent(turns).events("go") as events:
        await anyio.wait_all_tasks_blocked()
        held.append(events.state.turn)
        async for _ in events:
            pass


def _best(run: Any, turns: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        anyio.run(run, turns)
        best = min(best, time.perf_counter() - start)
    return best


def _peak(run: Any, *args: Any) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        anyio.run(run, *args)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def bench_events(turns: int, memory_turns: int, repeats: int) -> list[Metric]:
    """Per-turn overhead of a consumer that reads everything; memory of one that reads nothing."""
    plain = _best(_plain, turns, repeats) / turns * 1e6
    streamed = _best(_streamed, turns, repeats) / turns * 1e6
    held: list[int] = []
    floor_peak = _peak(_plain, memory_turns)
    stalled_peak = _peak(_stalled, memory_turns, held)
    ratio = stalled_peak / floor_peak
    return [
        Metric("events.turn.floor.us", f"per turn, {turns:,} turns, no consumer", plain, "µs"),
        Metric(
            "events.turn.us",
            f"per turn, {turns:,} turns, a consumer reading every event",
            streamed,
            "µs",
        ),
        Metric(
            "events.turn.overhead.us",
            "events overhead per turn (streamed - no consumer)",
            streamed - plain,
            "µs",
        ),
        Metric(
            "events.stalled.turns",
            f"turns run before a consumer that reads nothing holds it ({memory_turns:,}-turn run)",
            float(held[0]) if held else -1.0,
            "turns",
            "<< run length (bounded)",
            bool(held) and held[0] < memory_turns // 2,
        ),
        Metric(
            "events.stalled.peak.ratio",
            f"peak traced memory, stalled consumer / no stream ({memory_turns:,} turns)",
            ratio,
            "x",
            "<= 1.1 (the stream holds at most a buffer)",
            ratio <= 1.1,
        ),
    ]
