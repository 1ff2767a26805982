"""PostgreSQL benchmarks (issue 14): saves alone and in group commits, a long load, a fan-out.

They run against the server whose DSN is in ``ORCHESTRATOR_TEST_POSTGRES_DSN``: ``make bench``
starts a local one with the server's durable defaults (fsync on), as the targets assume. Each
run works in a schema of its own, dropped at the end. Without a server, the rows are skipped
with a line saying so.

- one save alone: a State saved after each turn of 3 entries, one save at a time (median).
- 100 concurrent saves: 100 States each grown by a turn, saved by 100 tasks at once
  (`asave`): the wall time over 100, per round (median). Saves arriving while one statement
  runs go out in the next (group commit).
- load: one State of about 100,000 entries, loaded (best of 3).
- fan-out: a lead whose 1,000 children run 3 tool turns each, with no store, `SQLiteStore` and
  `PostgresStore`, taken in turn (median of each; the ratios are medians of each round's).
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio

from orchestrator import Message, State
from stores import PostgresStore, SQLiteStore

from .agent_bench import fanout_seconds
from .report import Metric
from .stores_bench import record_turn

__all__ = ("DSN_VARIABLE", "bench_postgres")

DSN_VARIABLE = "ORCHESTRATOR_TEST_POSTGRES_DSN"


@contextmanager
def _store(dsn: str) -> Iterator[PostgresStore]:
    """A store in a new schema, dropped afterwards."""
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    store = PostgresStore(dsn, schema=schema)
    try:
        yield store
    finally:
        store.close()
        import psycopg
        from psycopg import sql

        with psycopg.connect(dsn, autocommit=True) as connection:
            connection.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            )


def _state(state_id: str) -> State:
    return State(id=state_id, messages=[Message.user("Find where the config is parsed.")])


def save_alone_us(dsn: str, saves: int) -> float:
    """Median µs of one save of a turn (3 entries and the states row), one at a time."""
    with _store(dsn) as store:
        state = _state("alone")
        store.save(state)
        times: list[float] = []
        for i in range(saves):
            record_turn(state, i)
            start = time.perf_counter()
            store.save(state)
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def save_concurrent_us(dsn: str, states: int, rounds: int) -> float:
    """Median µs per save when `states` tasks save a turn each at once (wall time / states)."""
    with _store(dsn) as store:
        crowd = [_state(f"crowd-{i}") for i in range(states)]

        async def main() -> list[float]:
            per_save: list[float] = []
            for round_ in range(rounds + 1):
                for state in crowd:
                    record_turn(state, round_)
                start = time.perf_counter()
                async with anyio.create_task_group() as group:
                    for state in crowd:
                        group.start_soon(store.asave, state)
                if round_:  # the first round makes the rows and warms the pool up
                    per_save.append((time.perf_counter() - start) / states)
            return per_save

        return statistics.median(anyio.run(main)) * 1e6


def load_seconds(dsn: str, entries: int, repeats: int = 3) -> tuple[int, float]:
    """Entries of the State, and the best seconds to load it."""
    with _store(dsn) as store:
        state = _state("long")
        for i in range(max(1, (entries - 1) // 3)):
            record_turn(state, i)
        store.save(state)
        best = float("inf")
        for _ in range(repeats):
            gc.collect()
            start = time.perf_counter()
            loaded = store.load("long")
            best = min(best, time.perf_counter() - start)
            if len(loaded.history) != len(state.history):
                raise AssertionError(f"loaded {len(loaded.history)} of {len(state.history)}")
    return len(state.history), best


def fanout(dsn: str, children: int, repeats: int) -> dict[str, list[float]]:
    """Seconds of each fan-out run: no store, SQLiteStore, PostgresStore, taken in turn."""
    runs: dict[str, list[float]] = {"none": [], "sqlite": [], "postgres": []}
    for _ in range(repeats):
        runs["none"].append(fanout_seconds(children, None))
        with tempfile.TemporaryDirectory() as folder, SQLiteStore(Path(folder) / "f.db") as lite:
            runs["sqlite"].append(fanout_seconds(children, lite))
        with _store(dsn) as store:
            store.list()  # the schema is made before the clock starts, as in a long-lived app
            runs["postgres"].append(fanout_seconds(children, store))
    return runs


def bench_postgres(
    *,
    saves: int = 300,
    crowd: int = 100,
    rounds: int = 20,
    load_entries: int = 100_000,
    children: int = 1_000,
    repeats: int = 5,
    progress: Callable[[str], None] = lambda text: None,
) -> list[Metric]:
    """The PostgreSQL rows, or none (with a line on stdout) when there is no server."""
    dsn = os.environ.get(DSN_VARIABLE)
    if not dsn:
        print(
            f"PostgreSQL rows skipped: no server ({DSN_VARIABLE} is not set; `make bench` starts"
            " one, installing Debian's postgresql package if it can)."
        )
        return []
    progress("postgres: one save alone ...")
    alone = save_alone_us(dsn, saves)
    progress(f"postgres: {crowd} concurrent saves ...")
    together = save_concurrent_us(dsn, crowd, rounds)
    progress(f"postgres: load of {load_entries:,} entries ...")
    size, loaded = load_seconds(dsn, load_entries)
    progress(f"postgres: {children:,} children x 3 turns, beside sqlite and no store ...")
    runs = fanout(dsn, children, repeats)
    none, lite, pg = (statistics.median(runs[name]) for name in ("none", "sqlite", "postgres"))
    pg_ratio = statistics.median(p / n for p, n in zip(runs["postgres"], runs["none"], strict=True))
    lite_ratio = statistics.median(s / n for s, n in zip(runs["sqlite"], runs["none"], strict=True))
    return [
        Metric(
            "store.postgres.save.us",
            "postgres: one save of a turn, alone",
            alone,
            "µs",
            "≤ 1 ms",
            alone <= 1000,
        ),
        Metric(
            f"store.postgres.save_{crowd}.us",
            f"postgres: per save, {crowd} saves at once (group commit)",
            together,
            "µs",
            "≤ 150 µs",
            together <= 150,
        ),
        Metric(
            "store.postgres.load.s",
            f"postgres: load {size:,} entries",
            loaded,
            "s",
            "< 2 s",
            loaded < 2,
        ),
        Metric(
            f"postgres.fanout.{children}.none.s",
            f"{children:,} children x 3 turns, no store (this run)",
            none,
            "s",
        ),
        Metric(
            f"postgres.fanout.{children}.sqlite.s",
            f"{children:,} children x 3 turns, SQLiteStore (this run)",
            lite,
            "s",
        ),
        Metric(
            f"postgres.fanout.{children}.sqlite.ratio",
            "SQLiteStore / no store (this run)",
            lite_ratio,
            "x",
        ),
        Metric(
            f"postgres.fanout.{children}.postgres.s",
            f"{children:,} children x 3 turns, PostgresStore",
            pg,
            "s",
        ),
        Metric(
            f"postgres.fanout.{children}.postgres.ratio",
            "PostgresStore / no store",
            pg_ratio,
            "x",
            "< 2.5x",
            pg_ratio < 2.5,
        ),
    ]


if __name__ == "__main__":
    for metric in bench_postgres(progress=lambda text: print(text, file=sys.stderr)):
        print(f"{metric.label:<58} {metric.value:>10.3f} {metric.unit:<3} {metric.target or ''}")
