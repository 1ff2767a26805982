"""Benchmarks of the SQLite backends: saving a turn, loading a long State, bytes on disk.

Each function takes its sizes and a folder, and returns a dict of numbers (keys end in their
unit). ``python -m benchmarks.sqlite_bench`` prints them; ``--quick`` runs them tiny, to check
that they work. What issue #4 asks of `SQLiteStore`: a turn of 3 entries saved in under 300 µs,
a 100,000-entry State loaded in under 2 s, and 200 turns of the workload in under 1 MB.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import anyio

from orchestrator import Message, Reply, State, TextBlock, ToolCall, ToolResultBlock
from orchestrator._record._recording import begin_think, record_reply, record_tool_result
from stores._aiosqlite import AioSQLiteStore
from stores._sqlite import SQLiteStore

from .workload import USAGE, record_turn

__all__ = (
    "bench_aiosqlite_save_turn",
    "bench_load",
    "bench_save_turn",
    "bench_size",
    "main",
    "run",
)

SAVE_TURN_LIMIT_US = 300.0
LOAD_LIMIT_SECONDS = 2.0
SIZE_LIMIT_BYTES = 1_000_000


def record_three(state: State, i: int) -> None:
    """Record one turn of 3 entries: a model request, a reply with one call, its result."""
    begin_think(state, model="fake")
    call = ToolCall(f"call_{i}", "read_file", {"path": f"src/module_{i % 17}.py"})
    record_reply(state, Reply(Message.assistant("Reading it.", (call,)), USAGE))
    result = ToolResultBlock(call.id, (TextBlock(f"def f{i}(): return {i}"),))
    record_tool_result(state, call, result, outcome="done")


def _new_state() -> State:
    return State(messages=[Message.user("Find the bug in this repo")])


def _timed_saves(state: State, entries: int, save: Callable[[], None]) -> list[float]:
    """Record 3-entry turns until `state` has `entries` entries, timing each `save()`."""
    times: list[float] = []
    i = 0
    while len(state.history) < entries:
        record_three(state, i)
        i += 1
        start = time.perf_counter()
        save()
        times.append(time.perf_counter() - start)
    return times


def _summary(prefix: str, times: Sequence[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        f"{prefix}.mean_us": statistics.fmean(times) * 1e6,
        f"{prefix}.median_us": statistics.median(times) * 1e6,
        f"{prefix}.p99_us": ordered[int(len(ordered) * 0.99)] * 1e6,
        f"{prefix}.turns": float(len(times)),
    }


def bench_save_turn(folder: Path, entries: int = 10_000) -> dict[str, float]:
    """Save one State a turn (3 entries) at a time until it has `entries`; µs per save.

    Also times the async twin (`asave`, a worker thread per save) on asyncio.
    """
    with SQLiteStore(folder / "save_turn.db") as store:
        state = _new_state()
        store.save(state)
        result = _summary(
            "sqlite.save_turn", _timed_saves(state, entries, lambda: store.save(state))
        )
    with SQLiteStore(folder / "asave_turn.db") as store:
        state = _new_state()

        async def timed() -> list[float]:
            times: list[float] = []
            await store.asave(state)
            for i in range(min(entries, 3_000) // 3):
                record_three(state, i)
                start = time.perf_counter()
                await store.asave(state)
                times.append(time.perf_counter() - start)
            return times

        result.update(_summary("sqlite.asave_turn", anyio.run(timed)))
    return result


def bench_aiosqlite_save_turn(folder: Path, entries: int = 3_000) -> dict[str, float]:
    """`AioSQLiteStore.asave` of one turn (3 entries) at a time, on asyncio; µs per save."""

    async def timed() -> list[float]:
        async with AioSQLiteStore(folder / "aio_save_turn.db") as store:
            state = _new_state()
            await store.asave(state)
            times: list[float] = []
            for i in range(entries // 3):
                record_three(state, i)
                start = time.perf_counter()
                await store.asave(state)
                times.append(time.perf_counter() - start)
            return times

    return _summary("aiosqlite.save_turn", anyio.run(timed))


def bench_load(folder: Path, entries: int = 100_000, repeats: int = 3) -> dict[str, float]:
    """Load a State of `entries` entries (best of `repeats`); also the bytes per entry."""
    path = folder / "load.db"
    state = _new_state()
    while len(state.history) < entries:
        record_three(state, len(state.history))
    with SQLiteStore(path) as store:
        store.save(state)
    size = path.stat().st_size
    best = float("inf")
    with SQLiteStore(path) as store:
        for _ in range(repeats):
            gc.collect()
            start = time.perf_counter()
            loaded = store.load(state.id)
            best = min(best, time.perf_counter() - start)
            assert len(loaded.history) == len(state.history)

    async def aio_load() -> float:
        async with AioSQLiteStore(path) as aio:
            gc.collect()
            start = time.perf_counter()
            await aio.aload(state.id)
            return time.perf_counter() - start

    return {
        "sqlite.load.entries": float(len(state.history)),
        "sqlite.load.seconds": best,
        "sqlite.load.us_per_entry": best / len(state.history) * 1e6,
        "sqlite.bytes_per_entry": size / len(state.history),
        "aiosqlite.load.seconds": anyio.run(aio_load),
    }


def bench_size(folder: Path, turns: int = 200) -> dict[str, float]:
    """The file size after `turns` turns of the benchmark workload, saved after each turn."""
    path = folder / "size.db"
    state = _new_state()
    with SQLiteStore(path) as store:
        store.save(state)
        for i in range(turns):
            record_turn(state, i)
            store.save(state)
    size = path.stat().st_size  # closed: the WAL is checkpointed into the file
    return {
        "sqlite.size.turns": float(turns),
        "sqlite.size.entries": float(len(state.history)),
        "sqlite.size.bytes": float(size),
        "sqlite.size.bytes_per_entry": size / len(state.history),
    }


def run(*, quick: bool = False) -> dict[str, float]:
    """Every SQLite benchmark, at full size or (`quick`) tiny; the numbers by name."""
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="sqlite_bench_") as name:
        folder = Path(name)
        results.update(bench_save_turn(folder, 300 if quick else 10_000))
        results.update(bench_aiosqlite_save_turn(folder, 300 if quick else 3_000))
        results.update(bench_load(folder, 1_000 if quick else 100_000, 1 if quick else 3))
        results.update(bench_size(folder, 20 if quick else 200))
    return results


def _verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def main(argv: Sequence[str] | None = None) -> int:
    """Print the SQLite benchmarks and the targets of issue #4; return the exit code."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sqlite_bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to check that it runs")
    args = parser.parse_args(argv)
    results = run(quick=args.quick)
    width = max(len(key) for key in results)
    for key, value in results.items():
        print(f"{key:<{width}}  {value:>16,.3f}")
    if not args.quick:
        save_us = results["sqlite.save_turn.mean_us"]
        load_s = results["sqlite.load.seconds"]
        size = results["sqlite.size.bytes"]
        print()
        checks = (
            (f"save a turn < {SAVE_TURN_LIMIT_US:.0f} µs", save_us < SAVE_TURN_LIMIT_US),
            (f"load 100,000 entries < {LOAD_LIMIT_SECONDS:.0f} s", load_s < LOAD_LIMIT_SECONDS),
            ("200 turns of the workload < 1 MB", size < SIZE_LIMIT_BYTES),
        )
        for label, ok in checks:
            print(f"{label}: {_verdict(ok)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
