"""Agent loop benchmarks: framework overhead per turn, parallel tool calls, subagents.

All run on `FakeModel` (zero latency), so what is measured is the framework.
"""

from __future__ import annotations

import gc
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from orchestrator import Agent, Loop, Message, State, Tool, tool, waiting_for_user
from orchestrator.testing import FakeModel, tool_call
from stores import AioSQLiteStore, SQLiteStore

from .exchange import think_then_use_tools
from .report import Metric

__all__ = (
    "bench_fanout",
    "bench_parallel_tools",
    "bench_subagents",
    "bench_turns",
    "fanout_seconds",
    "nap",
    "sync_nap",
    "use_tools_seconds",
)


def _timed(run: Callable[[], Awaitable[Any]], repeats: int) -> float:
    """The best wall time of `repeats` runs of the async `run`, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        gc.collect()

        async def once() -> float:
            start = time.perf_counter()
            await run()
            return time.perf_counter() - start

        best = min(best, anyio.run(once))
    return best


def bench_turns(turn_counts: Sequence[int], repeats: int) -> list[Metric]:
    """Framework overhead per turn: one tool call per turn, no store."""

    @tool
    async def noop(x: int) -> str:
        """Do nothing."""
        return "ok"

    metrics: list[Metric] = []
    per_turn: list[float] = []
    for turns in turn_counts:

        async def run(turns: int = turns) -> None:
            model = FakeModel([tool_call("noop", x=i) for i in range(turns)] + ["done"])
            body = Loop(think_then_use_tools, until=[waiting_for_user], limit=turns + 1)
            await Agent(model, tools=[noop], loop=body).arun("go")

        seconds = _timed(run, repeats)
        us = seconds / turns * 1e6
        per_turn.append(us)
        metrics.append(
            Metric(
                f"loop.turn.{turns}.us",
                f"overhead per turn, {turns:,} turns of one tool call",
                us,
                "µs",
                "< 100 µs",
                us < 100,
            )
        )
    if len(per_turn) >= 2:
        ratio = per_turn[-1] / per_turn[0]
        metrics.append(
            Metric(
                "loop.turn.ratio",
                f"per-turn cost at {turn_counts[-1]:,} / at {turn_counts[0]:,} turns",
                ratio,
                "x",
                "about 1 (flat)",
                ratio < 1.5,
            )
        )
    return metrics


@tool
async def nap() -> str:
    """Sleep 10 ms."""
    await anyio.sleep(0.01)
    return "ok"


@tool
def sync_nap() -> str:
    """Sleep 10 ms in a worker thread."""
    time.sleep(0.01)
    return "ok"


def use_tools_seconds(
    count: int, fn: Tool, max_concurrency: int | None = None, *, warm: bool = False
) -> float:
    """Wall seconds of one `ause_tools` turn of `count` calls of `fn`, in a fresh event loop.

    With `warm`, an untimed turn runs first in the same loop: its worker threads are then
    started, as in a run past its first turn (starting 50 threads takes 20-130 ms here).
    """

    async def run() -> float:
        turns = 2 if warm else 1
        model = FakeModel([[tool_call(fn.name) for _ in range(count)] for _ in range(turns)])
        agent = Agent(model, tools=[fn], max_concurrency=max_concurrency)
        state = State(messages=[Message.user("go")])
        if warm:
            await agent.athink(state)
            await agent.ause_tools(state)
        await agent.athink(state)
        start = time.perf_counter()
        await agent.ause_tools(state)
        return time.perf_counter() - start

    return anyio.run(run)


def bench_parallel_tools(repeats: int) -> list[Metric]:
    """One turn of 1,000 async tool calls that each sleep 10 ms: wall time of `use_tools`.

    The 50-call turns, beside their floors, are in `inside_bench`.
    """
    ms = min(use_tools_seconds(1000, nap) for _ in range(repeats)) * 1000
    return [
        Metric(
            "tools.async.1000.ms",
            "1,000 async tools sleeping 10 ms, one turn",
            ms,
            "ms",
            "< 100 ms",
            ms < 100,
        )
    ]


def bench_subagents(repeats: int) -> list[Metric]:
    """20 children under one parent, each 5 turns of one async tool sleeping 10 ms."""

    def child_model() -> FakeModel:
        return FakeModel([tool_call("nap") for _ in range(5)] + ["child done"])

    @tool  # defined once, as an app would: making a tool's schema is not a run's work
    async def delegate(task: str) -> str:
        """Run a child agent."""
        body = Loop(think_then_use_tools, until=[waiting_for_user], limit=10)
        return str(await Agent(child_model(), tools=[nap], loop=body).arun(task))

    async def run() -> None:
        calls = [tool_call("delegate", task=f"part {i}") for i in range(20)]
        await Agent(FakeModel([calls, "all done"]), tools=[delegate]).arun("go")

    ms = _timed(run, repeats) * 1000
    return [
        Metric(
            "subagents.20x5.ms",
            "20 children x 5 turns of a 10 ms async tool",
            ms,
            "ms",
            "< 70 ms",
            ms < 70,
        )
    ]


def bench_fanout(children: int, repeats: int = 5) -> list[Metric]:
    """`children` concurrent children, each 3 turns with one async tool call: time and memory,
    with no store and with a `SQLiteStore` (the store may add under 2x), and the time with an
    `AioSQLiteStore` (best of 2 runs).

    Wall times are medians of `repeats` runs, with and without the store taken in turn (this
    machine's speed drifts); the ratio is the median of each pair's. Memory is measured in a
    run of its own, under tracemalloc, which would slow the timed runs about four times.
    """
    plain: list[float] = []
    stored: list[float] = []
    for _ in range(repeats):
        plain.append(_fanout(children, None))
        with tempfile.TemporaryDirectory() as folder, SQLiteStore(Path(folder) / "f.db") as store:
            stored.append(_fanout(children, store))
    peak = _fanout_peak_mb(children)
    seconds, with_store = statistics.median(plain), statistics.median(stored)
    ratio = statistics.median(s / p for s, p in zip(stored, plain, strict=True))
    with_aiosqlite = min(anyio.run(_fanout_aiosqlite, children) for _ in range(2))
    return [
        Metric(
            f"subagents.fanout.{children}.s",
            f"{children:,} concurrent children x 3 turns, no store",
            seconds,
            "s",
            "< 3 s",
            seconds < 3,
        ),
        Metric(
            f"subagents.fanout.{children}.peak_mb",
            f"{children:,} concurrent children, peak traced memory",
            peak,
            "MB",
            "< 300 MB",
            peak < 300,
        ),
        Metric(
            f"subagents.fanout.{children}.sqlite.s",
            f"{children:,} concurrent children x 3 turns, SQLiteStore",
            with_store,
            "s",
        ),
        Metric(
            f"subagents.fanout.{children}.sqlite.ratio",
            "SQLiteStore / no store, wall time",
            ratio,
            "x",
            "< 2x",
            ratio < 2,
        ),
        Metric(
            f"subagents.fanout.{children}.aiosqlite.s",
            f"{children:,} concurrent children x 3 turns, AioSQLiteStore",
            with_aiosqlite,
            "s",
        ),
    ]


def _fanout_peak_mb(children: int) -> float:
    """Peak traced memory of one fan-out run with no store, in MB."""
    gc.collect()
    tracemalloc.start()
    try:
        _fanout(children, None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak / 1e6


def fanout_seconds(children: int, store: Any) -> float:
    """Wall seconds of one fan-out run of `children` children x 3 turns, saved in `store`."""
    return _fanout(children, store)


def _fanout(children: int, store: Any) -> float:
    """Wall seconds of one fan-out run."""
    gc.collect()
    start = time.perf_counter()
    anyio.run(_lead, children, store)
    return time.perf_counter() - start


async def _fanout_aiosqlite(children: int) -> float:
    """Wall seconds of one fan-out run saved by an `AioSQLiteStore` (opened in this loop)."""
    with tempfile.TemporaryDirectory() as folder:
        async with AioSQLiteStore(Path(folder) / "f.db") as store:
            gc.collect()
            start = time.perf_counter()
            await _lead(children, store)
            return time.perf_counter() - start


@tool(name="step")
async def _step() -> str:
    """One step."""
    await anyio.lowlevel.checkpoint()
    return "ok"


async def _lead(children: int, store: Any) -> None:
    """A lead whose one turn starts `children` children of 3 tool turns each."""

    @tool
    async def delegate(task: str) -> str:
        """Run a child agent."""
        model = FakeModel([tool_call("step"), tool_call("step"), tool_call("step"), "done"])
        return str(await Agent(model, tools=[_step]).arun(task))

    calls = [tool_call("delegate", task=f"part {i}") for i in range(children)]
    await Agent(FakeModel([calls, "all done"]), tools=[delegate], store=store).arun("go")
