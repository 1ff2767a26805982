"""A follower reconnecting near the end of a big run (issue 28): what `after=` costs.

A run's tree is stored first: a parent that calls a child agent `fan` times at once, `turns`
turns in a row (about 10,000 entries at the full size: `turns * (2 + 6 * fan)`). Then a
client reconnects with the id of an event near the end (`Runs.follow(run, after=ID)`, what
an SSE ``Last-Event-ID`` does) and reads to the end: the time to the last event, median of
`repeats`. The floor, in the same run: reading the tail alone, the tree's entries after the
id's cursor (`atree_entries`), with nothing made of them.

Each on a `MemoryStore` and an `SQLiteStore` (a file in a temporary folder).

``python -m benchmarks.reconnect_bench [--quick]`` prints the rows.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import anyio

from orchestrator import Agent
from orchestrator.apps import Followed, Runs
from orchestrator.testing import FakeModel, tool_call
from stores import MemoryStore, SQLiteStore

from .report import Metric

__all__ = ("bench_reconnect", "main")

TAIL = 10
"""How many events the reconnecting client has not seen yet."""


def _agents(turns: int, fan: int) -> Agent:
    child = Agent(FakeModel(["done"] * (turns * fan)), name="child")
    replies: list[object] = [
        [tool_call("child", task=f"part {turn}.{n}") for n in range(fan)] for turn in range(turns)
    ]
    return Agent(
        FakeModel([*replies, "all done"]),
        name="parent",
        tools=[child.as_tool(description="Does a part")],
        max_turns=turns + 2,
    )


async def _median(repeats: int, measure: Callable[[], Awaitable[None]]) -> float:
    """The median time of `measure()`, in ms."""
    times: list[float] = []
    for _ in range(repeats):
        start = time.perf_counter()
        await measure()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


async def _bench_store(
    store: MemoryStore | SQLiteStore, turns: int, fan: int, repeats: int
) -> tuple[int, int, float, float]:
    """The tree's entries, the tail's, the reconnect's time and the floor's (ms)."""
    async with Runs([_agents(turns, fan)], store) as runs:
        handle = await runs.start("parent", "go")
        await handle.wait()
        every = [item async for item in runs.follow(handle.state_id)]
        root = handle.state_id
        entries = len(await store.atree_entries(root))
        seen = every[-TAIL - 1].id
        cursor = seen.partition("~")[0].rpartition("/")[0]
        tail = len(await store.atree_entries(root, after=cursor))
        rest: list[Followed] = []

        async def reconnect() -> None:
            rest[:] = [item async for item in runs.follow(root, after=seen)]

        async def floor() -> None:
            await store.atree_entries(root, after=cursor)

        took = await _median(repeats, reconnect)
        if [item.id for item in rest] != [item.id for item in every[-TAIL:]]:
            raise RuntimeError("the reconnect did not give exactly the events after its id")
        floor_ms = await _median(repeats, floor)
    return entries, tail, took, floor_ms


def bench_reconnect(
    *,
    turns: int = 20,
    fan: int = 80,
    repeats: int = 5,
    progress: Callable[[str], None] = lambda text: None,
) -> list[Metric]:
    """The rows: a reconnect near the end of a big stored tree, beside reading its tail."""
    metrics: list[Metric] = []
    with tempfile.TemporaryDirectory() as folder:
        stores: list[tuple[str, MemoryStore | SQLiteStore]] = [
            ("memory", MemoryStore()),
            ("sqlite", SQLiteStore(Path(folder) / "reconnect.db")),
        ]
        for name, store in stores:
            progress(f"reconnect: a tree of {turns} x {fan} children on {name} ...")
            entries, tail, took, floor = anyio.run(_bench_store, store, turns, fan, repeats)
            if isinstance(store, SQLiteStore):
                store.close()
            label = f"reconnect near the end of a {entries:,}-entry tree ({name})"
            metrics += [
                Metric(f"reconnect.{name}.ms", f"{label}, {TAIL} events left", took, "ms"),
                Metric(
                    f"reconnect.{name}.floor.ms",
                    f"  floor: read the {tail} tail entries alone",
                    floor,
                    "ms",
                ),
                Metric(
                    f"reconnect.{name}.ratio",
                    "  reconnect / floor",
                    took / max(floor, 1e-6),
                    "x",
                ),
            ]
    return metrics


def main(argv: Sequence[str] | None = None) -> int:
    """Print the rows."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.reconnect_bench")
    parser.add_argument("--quick", action="store_true", help="a small tree, to check it runs")
    parsed = parser.parse_args(argv)
    sizes = {"turns": 2, "fan": 5, "repeats": 2} if parsed.quick else {}
    for metric in bench_reconnect(**sizes, progress=lambda text: print(text, file=sys.stderr)):
        sys.stdout.write(f"{metric.label:<75} {metric.value:10.2f} {metric.unit}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
