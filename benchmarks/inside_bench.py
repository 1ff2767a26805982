"""Issue 13's measured targets, each beside its floor measured in the same run (DESIGN 12).

The harness is the issue's (`benchmarks.exchange`): a model deciding from
``len(request.messages)``, one async tool per turn that counts its calls under a
`threading.Lock`, 200 turns. Absolute times on this machine move 20-50% from run to run, so
each variant runs beside its floor in rounds (each round starts one further along the list, so
none always runs first); a time is the median over the rounds, a ratio the median of each
round's ratio.

- Per turn, no store: the default loop and the same body as a user `@loop`, beside the floor,
  a hand-written loop doing the same exchange with the same model and tool function.
- Per turn, `SQLiteStore`: beside that loop appending the same entries (`stores.encode_entry`)
  to a sqlite3 file in WAL mode with ``synchronous = NORMAL`` (the store's setting), one commit
  a turn, before the model is asked (the issue's floor), in a worker thread, since an event
  loop must not block on the disk. The same commits on the event loop's thread are shown too:
  the difference is what the thread costs. A third floor commits at each save point of DESIGN
  13, before the tools run too (two a turn, as DESIGN 12 words the floor): the store's ratio to
  it is what the store adds beyond the commits the design asks for (issue 27: at most 1.5x);
  that floor on the event loop's thread is shown too. `SQLiteStore` commits small batches on
  the loop when nothing can wait there; `ThreadCommits`, the same store committing every batch
  in its thread, runs beside it, so the rows show what the loop commits save.
- Per turn, `AioSQLiteStore`: beside `SQLiteStore`.
- One turn of 50 async tools sleeping 10 ms, and of 50 sync ones with ``max_concurrency=50``:
  beside the same 50 sleeps in a task group (the sync ones in 50 worker threads).
- Peak RSS of a fresh process running 2,000 turns, beside a fresh process running the same
  exchange in a bare loop, and one that only imports `orchestrator` (`benchmarks.peak_rss`).
- 1,000 children x 3 turns, SQLiteStore vs no store: `agent_bench.bench_fanout`.

``python -m benchmarks.inside_bench`` prints only these rows (``--quick``: tiny sizes).
"""

from __future__ import annotations

import argparse
import functools
import gc
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import anyio
import anyio.to_thread

from orchestrator import Agent, HistoryEntry, Message, State, Tool, tool
from stores import AioSQLiteStore, SQLiteStore, encode_entry

from .agent_bench import bench_fanout, nap, sync_nap, use_tools_seconds
from .exchange import Counter, agent_seconds, counting_tool, deciding_model, floor_seconds
from .report import Metric, render

__all__ = (
    "SQLiteFloor",
    "ThreadCommits",
    "bench_inside",
    "bench_parallel_tools_floor",
    "bench_peak_rss",
    "bench_turn_no_store",
    "bench_turn_sqlite",
    "main",
    "paired",
    "save_points",
)

ROOT = Path(__file__).resolve().parent.parent


# -- the harness -------------------------------------------------------------------------------


def save_points(turns: int, *, before_tools: bool = False) -> list[tuple[HistoryEntry, ...]]:
    """The entries of a `turns`-turn run of the default loop, cut where the floor commits.

    Each point but the last ends with a model request (saved before the model is asked), or
    with `before_tools` also with a reply that calls tools (saved before they run); the last
    holds the rest. Building the entries is not the floor's work; encoding them is.
    """
    state = State(messages=[Message.user("go")])
    counter = Counter()
    agent = Agent(deciding_model(turns), tools=[tool(counting_tool(counter))], max_turns=turns + 1)
    anyio.run(agent.arun, state)
    points: list[tuple[HistoryEntry, ...]] = []
    point: list[HistoryEntry] = []
    for entry in state.history:
        point.append(entry)
        calls = entry.kind == "model_reply" and bool(entry.content.message.tool_calls)
        if entry.kind == "model_request" or (before_tools and calls):
            points.append(tuple(point))
            point = []
    points.append(tuple(point))
    return points


class SQLiteFloor:
    """The floor of saving: encoded entries appended to one sqlite3 table, a commit each time.

    WAL mode with ``synchronous = NORMAL`` and a unique index on (state_id, seq), as
    `SQLiteStore` keeps its entries.
    """

    def __init__(self, path: Path) -> None:
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = NORMAL")
        self._db.execute(
            "CREATE TABLE entries"
            " (state_id TEXT NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL)"
        )
        self._db.execute("CREATE UNIQUE INDEX entries_by_state ON entries (state_id, seq)")

    def write(self, entries: Sequence[HistoryEntry]) -> None:
        """Append `entries` in one transaction."""
        rows = [("floor", entry.seq, encode_entry(entry)) for entry in entries]
        self._db.execute("BEGIN IMMEDIATE")
        self._db.executemany("INSERT INTO entries VALUES (?, ?, ?)", rows)
        self._db.execute("COMMIT")

    async def commit(self, entries: Sequence[HistoryEntry]) -> None:
        """`write` in a worker thread."""
        await anyio.to_thread.run_sync(self.write, entries)

    async def commit_here(self, entries: Sequence[HistoryEntry]) -> None:
        """`write` on the event loop's thread (blocking it)."""
        self.write(entries)

    def close(self) -> None:
        """Close the connection."""
        self._db.close()


def paired(
    runs: dict[str, Callable[[], float]], repeats: int, *, warm_up: bool = True
) -> dict[str, list[float]]:
    """Each of `runs` once a round for `repeats` rounds; each one's results in round order.

    Round r starts with the r-th run, so the machine's drift falls on all of them alike. With
    `warm_up`, each runs once untimed first: a first run pays one-off costs (imports, caches;
    a floor's first 200 turns took 5x its next ones).
    """
    if warm_up:
        for run in runs.values():
            run()
    names = list(runs)
    results: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(repeats):
        for i in range(len(names)):
            name = names[(round_ + i) % len(names)]
            gc.collect()
            results[name].append(runs[name]())
    return results


def _ratio(results: dict[str, list[float]], name: str, floor: str) -> float:
    """The median over rounds of `name`'s result divided by `floor`'s of the same round."""
    pairs = zip(results[name], results[floor], strict=True)
    return statistics.median(value / base for value, base in pairs)


def _at_most(value: float, limit: float, text: str) -> tuple[str, bool]:
    return f"≤ {text}", value <= limit


# -- per turn ----------------------------------------------------------------------------------

_LOOPS: tuple[tuple[str, str, bool], ...] = (
    ("default", "default loop", False),
    ("user", "user @loop", True),
)


def _no_store_seconds(turns: int, user_loop: bool) -> float:
    return anyio.run(agent_seconds, turns, user_loop)


def bench_turn_no_store(turns: int, repeats: int) -> list[Metric]:
    """µs per turn with no store, both loops, beside the hand-written floor; and the ratios."""
    runs: dict[str, Callable[[], float]] = {"floor": lambda: anyio.run(floor_seconds, turns)}
    for key, _, user_loop in _LOOPS:
        runs[key] = functools.partial(_no_store_seconds, turns, user_loop)
    results = paired(runs, repeats)
    floor_us = statistics.median(results["floor"]) / turns * 1e6
    metrics = [
        Metric(
            "turn.none.floor.us",
            f"per turn, no store: floor (hand-written loop, {turns} turns)",
            floor_us,
            "µs",
        )
    ]
    for key, label, _ in _LOOPS:
        us = statistics.median(results[key]) / turns * 1e6
        ratio = _ratio(results, key, "floor")
        metrics += [
            Metric(
                f"turn.none.{key}.us",
                f"per turn, no store: {label}",
                us,
                "µs",
                *_at_most(us, 100, "100 µs"),
            ),
            Metric(
                f"turn.none.{key}.ratio",
                f"per turn, no store: {label} / floor",
                ratio,
                "x",
                *_at_most(ratio, 2.5, "2.5x"),
            ),
        ]
    return metrics


class ThreadCommits(SQLiteStore):
    """`SQLiteStore` that never commits on the event loop: every save in its worker thread.

    What the store did before it committed small batches on the loop: the same run beside it
    shows what that saves.
    """

    def save_many_nowait(self, states: Sequence[State]) -> dict[int, ValueError] | None:
        """Decline: the batch goes to the worker thread."""
        return None


def _sqlite_seconds(turns: int, user_loop: bool, *, on_loop: bool = True) -> float:
    kind = SQLiteStore if on_loop else ThreadCommits
    with tempfile.TemporaryDirectory() as folder, kind(Path(folder) / "s.db") as store:
        store.list()  # opened, its tables made, before the clock starts (as the floor's are)
        return anyio.run(agent_seconds, turns, user_loop, store)


def _aiosqlite_seconds(turns: int, user_loop: bool) -> float:
    async def run(folder: Path) -> float:
        async with AioSQLiteStore(folder / "s.db") as store:
            await store.alist()
            return await agent_seconds(turns, user_loop, store)

    with tempfile.TemporaryDirectory() as folder:
        return anyio.run(run, Path(folder))


def _sqlite_floor_seconds(
    turns: int,
    points: Sequence[Sequence[HistoryEntry]],
    *,
    in_thread: bool = True,
    before_tools: bool = False,
) -> float:
    with tempfile.TemporaryDirectory() as folder:
        db = SQLiteFloor(Path(folder) / "floor.db")
        try:
            commit = db.commit if in_thread else db.commit_here
            run = functools.partial(floor_seconds, before_tools=before_tools)
            return anyio.run(run, turns, commit, points)
        finally:
            db.close()


def bench_turn_sqlite(turns: int, repeats: int) -> list[Metric]:
    """µs per turn saved by `SQLiteStore` and `AioSQLiteStore`, both loops, beside the floor."""
    points = save_points(turns)
    every_point = save_points(turns, before_tools=True)
    runs: dict[str, Callable[[], float]] = {
        "floor": functools.partial(_sqlite_floor_seconds, turns, points),
        "floor_here": functools.partial(_sqlite_floor_seconds, turns, points, in_thread=False),
        "floor_points": functools.partial(
            _sqlite_floor_seconds, turns, every_point, before_tools=True
        ),
        "floor_points_here": functools.partial(
            _sqlite_floor_seconds, turns, every_point, in_thread=False, before_tools=True
        ),
    }
    for key, _, user_loop in _LOOPS:
        runs[f"sqlite.{key}"] = functools.partial(_sqlite_seconds, turns, user_loop)
        runs[f"sqlite_thread.{key}"] = functools.partial(
            _sqlite_seconds, turns, user_loop, on_loop=False
        )
        runs[f"aiosqlite.{key}"] = functools.partial(_aiosqlite_seconds, turns, user_loop)
    results = paired(runs, repeats)

    def us(name: str) -> float:
        return statistics.median(results[name]) / turns * 1e6

    metrics = [
        Metric(
            "turn.sqlite.floor.us",
            "per turn, saved: floor (sqlite3, WAL, a commit per turn in a thread)",
            us("floor"),
            "µs",
        ),
        Metric(
            "turn.sqlite.floor_here.us",
            "per turn, saved: floor, its commits on the event loop's thread",
            us("floor_here"),
            "µs",
        ),
        Metric(
            "turn.sqlite.floor_points.us",
            "per turn, saved: floor with a commit per save point (2 a turn, DESIGN 12-13)",
            us("floor_points"),
            "µs",
        ),
        Metric(
            "turn.sqlite.floor_points_here.us",
            "per turn, saved: floor with a commit per save point, on the event loop's thread",
            us("floor_points_here"),
            "µs",
        ),
    ]
    for key, label, _ in _LOOPS:
        sqlite_us, ratio = us(f"sqlite.{key}"), _ratio(results, f"sqlite.{key}", "floor")
        points_ratio = _ratio(results, f"sqlite.{key}", "floor_points")
        aio_us = us(f"aiosqlite.{key}")
        aio_ratio = _ratio(results, f"aiosqlite.{key}", f"sqlite.{key}")
        metrics += [
            Metric(
                f"turn.sqlite.{key}.us",
                f"per turn, SQLiteStore: {label}",
                sqlite_us,
                "µs",
                *_at_most(sqlite_us, 300, "300 µs"),
            ),
            Metric(
                f"turn.sqlite.{key}.ratio",
                f"per turn, SQLiteStore: {label} / floor",
                ratio,
                "x",
                *_at_most(ratio, 2, "2x"),
            ),
            Metric(
                f"turn.sqlite.{key}.points_ratio",
                f"per turn, SQLiteStore: {label} / floor with a commit per save point",
                points_ratio,
                "x",
                *_at_most(points_ratio, 1.5, "1.5x"),
            ),
            Metric(
                f"turn.sqlite.{key}.points_here_ratio",
                f"per turn, SQLiteStore: {label} / the same floor on the event loop's thread",
                _ratio(results, f"sqlite.{key}", "floor_points_here"),
                "x",
            ),
            Metric(
                f"turn.sqlite.{key}.here_ratio",
                f"per turn, SQLiteStore: {label} / floor of one commit a turn on the loop",
                _ratio(results, f"sqlite.{key}", "floor_here"),
                "x",
            ),
            Metric(
                f"turn.sqlite_thread.{key}.points_ratio",
                f"per turn, SQLiteStore, every commit in a thread: {label} / floor with a commit"
                " per save point",
                _ratio(results, f"sqlite_thread.{key}", "floor_points"),
                "x",
            ),
            Metric(f"turn.aiosqlite.{key}.us", f"per turn, AioSQLiteStore: {label}", aio_us, "µs"),
            Metric(
                f"turn.aiosqlite.{key}.ratio",
                f"per turn, AioSQLiteStore / SQLiteStore: {label}",
                aio_ratio,
                "x",
                *_at_most(aio_ratio, 1.5, "1.5x"),
            ),
        ]
    return metrics


# -- parallel tools ----------------------------------------------------------------------------


def _sleeps_seconds(count: int, in_threads: bool) -> float:
    """Wall seconds of `count` sleeps of 10 ms in one task group (in as many worker threads),
    in a fresh event loop, after the same sleeps once untimed (as `use_tools_seconds` warms up).
    """

    async def run() -> float:
        limiter = anyio.CapacityLimiter(count)

        async def sleep() -> None:
            if in_threads:
                await anyio.to_thread.run_sync(time.sleep, 0.01, limiter=limiter)
            else:
                await anyio.sleep(0.01)

        async def sleeps() -> float:
            start = time.perf_counter()
            async with anyio.create_task_group() as group:
                for _ in range(count):
                    group.start_soon(sleep)
            return time.perf_counter() - start

        await sleeps()
        return await sleeps()

    return anyio.run(run)


def bench_parallel_tools_floor(repeats: int, count: int = 50) -> list[Metric]:
    """One turn of `count` tools sleeping 10 ms (async; sync with ``max_concurrency=count``),
    beside the same sleeps in a task group. Times are medians of the rounds, in ms.

    Each is timed after one untimed turn in the same event loop, so that the worker threads
    exist: starting 50 threads takes 20-130 ms on this loaded 2-core machine, which would
    measure the machine rather than the framework (the floor then takes as long).
    """
    fns: dict[str, Tool] = {"async": nap, "sync": sync_nap}
    runs: dict[str, Callable[[], float]] = {}
    for kind, fn in fns.items():
        limit = count if kind == "sync" else None
        runs[kind] = functools.partial(use_tools_seconds, count, fn, limit, warm=True)
        runs[f"{kind}.floor"] = functools.partial(_sleeps_seconds, count, kind == "sync")
    results = paired(runs, repeats)

    def ms(name: str) -> float:
        return statistics.median(results[name]) * 1000

    metrics: list[Metric] = []
    for kind, what, target in (
        ("async", f"{count} async tools x 10 ms", 15),
        ("sync", f"{count} sync tools x 10 ms, max_concurrency={count}", 30),
    ):
        value = ms(kind)
        metrics += [
            Metric(
                f"tools.{kind}.{count}.warm.ms",
                f"{what}, second turn",
                value,
                "ms",
                *_at_most(value, target, f"{target} ms"),
            ),
            Metric(
                f"tools.{kind}.{count}.floor.ms",
                f"floor: {count} sleeps of 10 ms in a task group"
                + (f", in {count} worker threads" if kind == "sync" else ""),
                ms(f"{kind}.floor"),
                "ms",
            ),
            Metric(
                f"tools.{kind}.{count}.ratio",
                f"{count} {kind} tools / floor",
                _ratio(results, kind, f"{kind}.floor"),
                "x",
            ),
        ]
    return metrics


# -- peak memory -------------------------------------------------------------------------------


def _child_peak_mb(what: Literal["agent", "import", "floor"], turns: int) -> float:
    """Peak RSS, in MB, of a fresh process that runs `what` (see `benchmarks.peak_rss`)."""
    command = [sys.executable, "-m", "benchmarks.peak_rss", what, str(turns)]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"the {what} process failed:\n{done.stderr}")
    return int(done.stdout.split()[-1]) / 1e6


def bench_peak_rss(turns: int, repeats: int) -> list[Metric]:
    """Peak RSS (MB, 10^6 bytes) of a fresh process running `turns` turns of the default loop
    with no store, beside one running the same exchange in a bare loop and one that only
    imports `orchestrator`.
    """
    runs: dict[str, Callable[[], float]] = {
        what: functools.partial(_child_peak_mb, what, turns)
        for what in ("agent", "import", "floor")
    }
    results = paired(runs, repeats, warm_up=False)  # each a fresh process anyway
    agent = statistics.median(results["agent"])
    return [
        Metric(
            f"rss.{turns}.mb",
            f"peak RSS, {turns:,} turns of the default loop, fresh process",
            agent,
            "MB",
            *_at_most(agent, 40, "40 MB"),
        ),
        Metric(
            "rss.import.mb",
            "peak RSS, a fresh process importing orchestrator only",
            statistics.median(results["import"]),
            "MB",
        ),
        Metric(
            f"rss.{turns}.floor.mb",
            f"peak RSS, {turns:,} turns of a bare anyio loop, fresh process",
            statistics.median(results["floor"]),
            "MB",
        ),
    ]


# -- all of them -------------------------------------------------------------------------------


def bench_inside(
    turns: int, repeats: int, rss_turns: int, fanout: int, progress: Callable[[str], None]
) -> list[Metric]:
    """Every target of issue 13, each beside its floor; `progress` hears what starts."""
    # A round of these takes under 0.2 s: three times the rounds, a steadier median.
    progress(f"issue 13: per turn, {turns} turns, beside the floor ...")
    metrics = bench_turn_no_store(turns, 3 * repeats)
    progress("issue 13: per turn, saved, beside sqlite3 ...")
    metrics += bench_turn_sqlite(turns, repeats)
    progress("issue 13: parallel tools ...")
    metrics += bench_parallel_tools_floor(3 * repeats)
    progress(f"issue 13: peak RSS of {rss_turns:,} turns ...")
    metrics += bench_peak_rss(rss_turns, min(repeats, 3))
    progress(f"issue 13: {fanout:,} children ...")
    metrics += bench_fanout(fanout, repeats)
    return metrics


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Print issue 13's rows (not saved: ``python -m benchmarks`` keeps the results)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.inside_bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to check that it runs")
    args = parser.parse_args(argv)
    if args.quick:
        metrics = bench_inside(20, 2, 50, 20, _progress)
    else:
        metrics = bench_inside(200, 5, 2_000, 1_000, _progress)
    print(render(metrics, None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
