"""PostgreSQL benchmarks (issue 14): saves alone and in group commits, a long load, a fan-out.

They run against the server whose DSN is in ``ORCHESTRATOR_TEST_POSTGRES_DSN``: ``make bench``
starts a local one with the server's durable defaults (fsync on), as the targets assume. Each
run works in a schema of its own, dropped at the end. Without a server, the rows are skipped
with a line saying so.

- one save alone: a State saved after each turn of 3 entries, one save at a time (median).
- 100 concurrent saves: 100 States each grown by a turn, saved by 100 tasks at once through
  the store's client, as an agent saves: the wall time over 100, per round (median). Saves
  arriving while one statement runs go out in the next (group commit).
- load: one State of about 100,000 entries, loaded (best of 3).
- fan-out: a lead whose 1,000 children run 3 tool turns each, with no store, `SQLiteStore` and
  `PostgresStore`, taken in turn (median of each; the ratios are medians of each round's).

Each has its floor beside it, measured in the same run (the machine's speed and its disk's
fsync move a lot): one bare commit of a one-row UPDATE; 100 saves' rows (3 entries of 400
bytes each and a row update) written by one bare statement; the same State loaded from a
`MemoryStore` (decoding and replaying, no I/O). The concurrent saves and the load also give
their ratio to the floor: it moves less than the absolute numbers from run to run.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Generator
from contextlib import contextmanager
from pathlib import Path
from typing import LiteralString, cast

import anyio

from orchestrator import Message, State
from orchestrator._record._store_client import client_of
from stores import MemoryStore, PostgresStore, SQLiteStore

from .agent_bench import fanout_seconds
from .report import Metric
from .stores_bench import record_turn

__all__ = ("DSN_VARIABLE", "bench_postgres")

DSN_VARIABLE = "ORCHESTRATOR_TEST_POSTGRES_DSN"


@contextmanager
def _store(dsn: str) -> Generator[PostgresStore]:
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


class _Floor:
    """The floors, on a connection of their own, in scratch tables of the store's schema."""

    def __init__(self, store: PostgresStore, dsn: str, crowd: int) -> None:
        import psycopg

        store.list()  # makes the schema
        self._schema = store.schema
        self._connection = psycopg.connect(dsn, autocommit=True)
        self._run(f"CREATE TABLE {self._schema}.floor_rows (id text PRIMARY KEY, n int)")
        self._run(
            f"CREATE TABLE {self._schema}.floor_entries (id text, seq int, data bytea,"
            " PRIMARY KEY (id, seq))"
        )
        self._ids = [f"s{i}" for i in range(crowd)]
        self._entry_ids = [state_id for state_id in self._ids for _ in range(3)]
        self._run(f"INSERT INTO {self._schema}.floor_rows SELECT unnest(%b::text[]), 0", self._ids)
        self._round = 0

    def _run(self, statement: str, *params: object) -> float:
        start = time.perf_counter()
        self._connection.execute(cast("LiteralString", statement), params)
        return time.perf_counter() - start

    def commit(self) -> float:
        """Seconds of one bare commit: a one-row UPDATE."""
        return self._run(f"UPDATE {self._schema}.floor_rows SET n = n + 1 WHERE id = 's0'")

    def batch(self) -> float:
        """Seconds of one statement writing the rows of `crowd` saves of a turn each."""
        first = self._round * 3
        self._round += 1
        seqs = [first + k for _ in self._ids for k in range(3)]
        return self._run(
            f"WITH e AS (INSERT INTO {self._schema}.floor_entries SELECT * FROM unnest("
            " %b::text[], %b::int[], %b::bytea[]))"
            f" UPDATE {self._schema}.floor_rows AS r SET n = n + 3"
            " FROM unnest(%b::text[]) AS u (id) WHERE r.id = u.id",
            self._entry_ids,
            seqs,
            [_LINE] * len(self._entry_ids),
            self._ids,
        )

    def close(self) -> None:
        self._connection.close()


_LINE = b"x" * 400  # about an entry line of `record_turn`


def save_alone_us(dsn: str, saves: int) -> tuple[float, float]:
    """Median µs of one save of a turn (3 entries and the states row), one at a time; and of
    one bare commit, taken in turn with them."""
    with _store(dsn) as store:
        floor = _Floor(store, dsn, 1)
        state = _state("alone")
        store.save(state)
        times: list[float] = []
        commits: list[float] = []
        for i in range(saves):
            record_turn(state, i)
            start = time.perf_counter()
            store.save(state)
            times.append(time.perf_counter() - start)
            commits.append(floor.commit())
        floor.close()
    return statistics.median(times) * 1e6, statistics.median(commits) * 1e6


def save_concurrent_us(dsn: str, states: int, rounds: int) -> tuple[float, float, float]:
    """Median µs per save when `states` tasks save a turn each at once (wall time / states);
    per save of one bare statement writing the same rows, taken in turn with them; and the
    median of each round's ratio of the two."""
    with _store(dsn) as store:
        floor = _Floor(store, dsn, states)
        crowd = [_state(f"crowd-{i}") for i in range(states)]
        client = client_of(store)  # an agent's saves go through it, in group commits

        async def save(state: State) -> None:
            await client.save(state)

        async def main() -> tuple[list[float], list[float]]:
            per_save: list[float] = []
            bare: list[float] = []
            for round_ in range(rounds + 1):
                for state in crowd:
                    record_turn(state, round_)
                start = time.perf_counter()
                async with anyio.create_task_group() as group:
                    for state in crowd:
                        group.start_soon(save, state)
                if round_:  # the first round makes the rows and warms the pool up
                    per_save.append((time.perf_counter() - start) / states)
                    bare.append(floor.batch() / states)  # nothing else runs meanwhile
            return per_save, bare

        measured, bare = anyio.run(main)
        floor.close()
        ratio = statistics.median(m / b for m, b in zip(measured, bare, strict=True))
        return statistics.median(measured) * 1e6, statistics.median(bare) * 1e6, ratio


def load_seconds(dsn: str, entries: int, repeats: int = 3) -> tuple[int, float, float]:
    """Entries of the State, the best seconds to load it, and to load it from a MemoryStore."""
    state = _state("long")
    for i in range(max(1, (entries - 1) // 3)):
        record_turn(state, i)
    memory = MemoryStore()
    memory.save(state)
    with _store(dsn) as store:
        store.save(state)
        best = {"postgres": float("inf"), "memory": float("inf")}
        for _ in range(repeats):
            for name, load in (("postgres", store.load), ("memory", memory.load)):
                gc.collect()
                start = time.perf_counter()
                loaded = load("long")
                best[name] = min(best[name], time.perf_counter() - start)
                if len(loaded.history) != len(state.history):
                    raise AssertionError(f"loaded {len(loaded.history)} of {len(state.history)}")
                del loaded
    return len(state.history), best["postgres"], best["memory"]


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
    alone, commit = save_alone_us(dsn, saves)
    progress(f"postgres: {crowd} concurrent saves ...")
    together, batched, together_ratio = save_concurrent_us(dsn, crowd, rounds)
    progress(f"postgres: load of {load_entries:,} entries ...")
    size, loaded, replayed = load_seconds(dsn, load_entries)
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
        Metric("store.postgres.commit.us", "postgres floor: one bare commit", commit, "µs"),
        Metric(
            f"store.postgres.batch_{crowd}.us",
            f"postgres floor: per save, {crowd} saves' rows in one bare statement",
            batched,
            "µs",
        ),
        Metric(
            f"store.postgres.save_{crowd}.ratio",
            f"postgres: per save, {crowd} saves at once / its floor",
            together_ratio,
            "x",
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
            "store.postgres.load.floor.s",
            f"postgres floor: load {size:,} entries from a MemoryStore",
            replayed,
            "s",
        ),
        Metric(
            "store.postgres.load.ratio",
            f"postgres: load {size:,} entries / its floor",
            loaded / replayed,
            "x",
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
