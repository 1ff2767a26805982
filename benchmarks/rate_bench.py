"""Rate-limit benchmarks (issue 29): a limiter's cost per turn, per take of a store's row, and
how fairly processes sharing one limit get their turns.

- per-turn overhead: an agent's tool loop on `FakeModel`, with and without a process-local
  `RateLimit` (requests per minute and a concurrent cap, high enough never to wait); and with
  tokens per minute. Its model reports each reply's usage, as providers do: a request's
  estimate is then the last reply's tokens plus the tool results since. A third row has a model
  that reports no usage, whose every request is counted whole (no target). Paired rounds
  (`inside_bench.paired`); each ratio is the median of each round's ratio to no limit, and the
  issue targets the first two at <= 1.1x.
- one take of a store's row (`arate_take`, the atomic UPSERT every request makes), one at a
  time, p50 and p99, on `SQLiteStore` and `PostgresStore`, beside its floor: the same statement
  on a bare connection of the driver, from a worker thread as the store runs it.
- one concurrent slot of a store (``RateLimit(concurrent=..., store=...)``): a request's
  take and release of its leased row (``async with limit.request()``, the lease renewer started
  and stopped), one at a time, p50 and p99, on `SQLiteStore` and `PostgresStore`, beside its
  floor: the bare take and release statements on a bare connection, each from a worker thread.
- fairness: 4 processes with 4 senders each share a limit of 100 requests a second through a
  SQLite file (and a PostgreSQL schema) against a server refusing above 120: each process's
  share (Jain's index over the processes' counts, 1 = equal shares), the rate the server saw
  beside the limit, and its 429s.

The PostgreSQL rows need ``ORCHESTRATOR_TEST_POSTGRES_DSN`` (``make bench`` starts a server).
"""

from __future__ import annotations

import gc
import os
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from orchestrator import Agent, Loop, Message, Reply, Reporter, Usage, tool, waiting_for_user
from orchestrator.models import RateLimit, RateLimited
from orchestrator.models._rate import AsyncRateLimits, RateAsk
from orchestrator.testing import FakeModel, tool_call
from stores import PostgresStore, SQLiteStore
from stores._postgres_sql import postgres_rates
from stores._rate_sql import RateSql
from stores._sql import SET_BUSY_TIMEOUT, SET_SYNCHRONOUS, SQLITE_RATES

from .exchange import think_then_use_tools
from .inside_bench import paired
from .rate_load import counting_server, run_workers
from .report import Metric

__all__ = ("bench_rate",)

DSN_VARIABLE = "ORCHESTRATOR_TEST_POSTGRES_DSN"
_ASK = RateAsk(requests=0.000001, tokens=0.0)


@tool
async def noop(x: int) -> str:
    """Do nothing."""
    return "ok"


def _turn_us(turns: int, limit: RateLimit | None, *, usage: bool = True) -> float:
    """Microseconds per turn of one run of `turns` tool turns (its model reports `usage`)."""

    async def run() -> float:
        replies: list[Any] = [
            Reply(
                Message.assistant(tool_calls=[tool_call("noop", x=i)]),
                Usage(input_tokens=200 + 40 * i, output_tokens=20, requests=1)
                if usage
                else Usage(requests=1),
                stop_reason="tool_use",
            )
            for i in range(turns)
        ]
        fake = FakeModel([*replies, "done"])
        model = fake if limit is None else RateLimited(fake, limit)
        body = Loop(think_then_use_tools, until=[waiting_for_user], limit=turns + 1)
        agent = Agent(model, tools=[noop], loop=body, reporter=Reporter())
        started = time.perf_counter()
        await agent.arun("go")
        return time.perf_counter() - started

    gc.collect()
    return anyio.run(run) / turns * 1e6


def _ratio(results: dict[str, list[float]], name: str) -> float:
    """The median over rounds of `name`'s per-turn time / no limit's in the same round."""
    pairs = zip(results[name], results["plain"], strict=True)
    return statistics.median(value / base for value, base in pairs)


def _overhead(turns: int, rounds: int) -> list[Metric]:
    limit = RateLimit(requests_per_minute=1e9, concurrent=1_000, key=f"bench-{uuid.uuid4().hex}")
    # Pacing tokens estimates each request's tokens.
    tokens = RateLimit(tokens_per_minute=1e12, key=f"bench-{uuid.uuid4().hex}")
    results = paired(
        {
            "plain": lambda: _turn_us(turns, None),
            "limited": lambda: _turn_us(turns, limit),
            "counted": lambda: _turn_us(turns, tokens),
            "unreported": lambda: _turn_us(turns, tokens, usage=False),
        },
        rounds,
    )
    ratio = _ratio(results, "limited")
    counted = _ratio(results, "counted")
    unreported = _ratio(results, "unreported")
    return [
        Metric(
            "rate.turn.plain.us",
            f"per turn, {turns} tool turns, no limit",
            statistics.median(results["plain"]),
            "µs",
        ),
        Metric(
            "rate.turn.limited.us",
            f"per turn, {turns} tool turns, a process-local RateLimit",
            statistics.median(results["limited"]),
            "µs",
        ),
        Metric(
            "rate.turn.ratio",
            "per-turn time with a process-local RateLimit / without (median of paired rounds)",
            ratio,
            "x",
            "<= 1.1x",
            ratio <= 1.1,
        ),
        Metric(
            "rate.turn.tokens.ratio",
            f"per-turn time with tokens_per_minute / without ({turns} turns; the model reports"
            " usage, each estimate is its last reply's tokens plus the tool results since;"
            " median of paired rounds)",
            counted,
            "x",
            "<= 1.1x",
            counted <= 1.1,
        ),
        Metric(
            "rate.turn.tokens.unreported.ratio",
            f"per-turn time with tokens_per_minute / without ({turns} turns; the model reports"
            " no usage, each request is counted whole; median of paired rounds)",
            unreported,
            "x",
        ),
    ]


def _percentiles(micros: list[float]) -> tuple[float, float]:
    ordered = sorted(micros)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _takes_us(table: AsyncRateLimits, count: int) -> list[float]:
    async def run() -> list[float]:
        times: list[float] = []
        key = f"bench-{uuid.uuid4().hex}"
        for _ in range(count):
            started = time.perf_counter()
            await table.arate_take(key, _ASK)
            times.append((time.perf_counter() - started) * 1e6)
        return times

    return anyio.run(run)


def _floor_us(execute: Callable[[dict[str, Any]], None], count: int) -> list[float]:
    async def run() -> list[float]:
        times: list[float] = []
        key = f"floor-{uuid.uuid4().hex}"
        for _ in range(count):
            params = {"key": key, "now": time.time(), "requests": _ASK.requests, "tokens": 0.0}
            started = time.perf_counter()
            await anyio.to_thread.run_sync(execute, params)
            times.append((time.perf_counter() - started) * 1e6)
        return times

    return anyio.run(run)


def _acquire_metrics(name: str, takes: list[float], floor: list[float]) -> list[Metric]:
    p50, p99 = _percentiles(takes)
    f50, f99 = _percentiles(floor)
    label = f"one take of a shared limit's row, {name}"
    return [
        Metric(f"rate.take.{name}.p50.us", f"{label}, p50", p50, "µs"),
        Metric(f"rate.take.{name}.p99.us", f"{label}, p99", p99, "µs"),
        Metric(f"rate.take.{name}.floor.p50.us", f"the bare UPSERT, {name}, p50", f50, "µs"),
        Metric(f"rate.take.{name}.floor.p99.us", f"the bare UPSERT, {name}, p99", f99, "µs"),
        Metric(f"rate.take.{name}.ratio", f"take / bare UPSERT, {name}, p50", p50 / f50, "x"),
    ]


def _slots_us(table: AsyncRateLimits, count: int) -> list[float]:
    """Microseconds of each request's slot: taken, held for nothing, given back."""

    async def run() -> list[float]:
        limit = RateLimit(concurrent=1, store=table, key=f"slots-{uuid.uuid4().hex}")
        times: list[float] = []
        for _ in range(count):
            started = time.perf_counter()
            async with limit.request():
                pass
            times.append((time.perf_counter() - started) * 1e6)
        return times

    return anyio.run(run)


def _slot_floor_us(
    execute: Callable[[str, dict[str, Any]], None], statements: RateSql, count: int
) -> list[float]:
    """Microseconds of the bare take and release statements, each from a worker thread."""

    async def run() -> list[float]:
        times: list[float] = []
        key = f"floor-{uuid.uuid4().hex}"
        for _ in range(count):
            holder = uuid.uuid4().hex
            take = {"key": key, "now": time.time(), "most": 1, "holder": holder, "lease": 30.0}
            release = {"key": key, "slot": 0, "holder": holder}
            started = time.perf_counter()
            await anyio.to_thread.run_sync(execute, statements.slot_take, take)
            await anyio.to_thread.run_sync(execute, statements.slot_release, release)
            times.append((time.perf_counter() - started) * 1e6)
        return times

    return anyio.run(run)


def _slot_metrics(name: str, slots: list[float], floor: list[float]) -> list[Metric]:
    p50, p99 = _percentiles(slots)
    f50, f99 = _percentiles(floor)
    label = f"a request's concurrent slot of a store, taken and released, {name}"
    bare = f"the bare take and release statements, {name}"
    return [
        Metric(f"rate.slot.{name}.p50.us", f"{label}, p50", p50, "µs"),
        Metric(f"rate.slot.{name}.p99.us", f"{label}, p99", p99, "µs"),
        Metric(f"rate.slot.{name}.floor.p50.us", f"{bare}, p50", f50, "µs"),
        Metric(f"rate.slot.{name}.floor.p99.us", f"{bare}, p99", f99, "µs"),
        Metric(f"rate.slot.{name}.ratio", f"slot / bare statements, {name}, p50", p50 / f50, "x"),
    ]


def _sqlite_acquires(folder: Path, count: int) -> list[Metric]:
    with SQLiteStore(folder / "rates.db") as store:
        takes = _takes_us(store, count)
        slots = _slots_us(store, count)
    connection = sqlite3.connect(
        folder / "rates.db", isolation_level="IMMEDIATE", check_same_thread=False
    )
    connection.execute(SET_BUSY_TIMEOUT)
    connection.execute(SET_SYNCHRONOUS)  # as the store has it (WAL: no fsync per commit)
    try:

        def execute(params: dict[str, Any]) -> None:
            connection.execute(SQLITE_RATES.take, params).fetchall()
            connection.execute("COMMIT")

        floor = _floor_us(execute, count)

        def execute_slot(statement: str, params: dict[str, Any]) -> None:
            connection.execute(statement, params).fetchall()
            connection.execute("COMMIT")

        slot_floor = _slot_floor_us(execute_slot, SQLITE_RATES, count)
    finally:
        connection.close()
    return _acquire_metrics("sqlite", takes, floor) + _slot_metrics("sqlite", slots, slot_floor)


@contextmanager
def _schema(dsn: str) -> Generator[str]:
    import psycopg
    from psycopg import sql

    schema = f"bench_{uuid.uuid4().hex[:12]}"
    try:
        yield schema
    finally:
        with psycopg.connect(dsn, autocommit=True) as connection:
            connection.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            )


def _postgres_acquires(dsn: str, count: int) -> list[Metric]:
    import psycopg

    with _schema(dsn) as schema:
        with PostgresStore(dsn, schema=schema, pool_size=2) as store:
            takes = _takes_us(store, count)
            slots = _slots_us(store, count)
        statements = postgres_rates(f'"{schema}"')
        statement = statements.take
        with psycopg.connect(dsn, autocommit=True) as connection:

            def execute(params: dict[str, Any]) -> None:
                connection.execute(statement, params).fetchall()  # pyright: ignore[reportArgumentType, reportCallIssue]

            def execute_slot(text: str, params: dict[str, Any]) -> None:
                cursor = connection.execute(text, params)  # pyright: ignore[reportArgumentType, reportCallIssue]
                if cursor.description is not None:
                    cursor.fetchall()

            floor = _floor_us(execute, count)
            slot_floor = _slot_floor_us(execute_slot, statements, count)
    return _acquire_metrics("postgres", takes, floor) + _slot_metrics("postgres", slots, slot_floor)


def _jain(counts: list[int]) -> float:
    return sum(counts) ** 2 / (len(counts) * sum(count * count for count in counts))


def _fairness(name: str, where: dict[str, Any], seconds: float) -> list[Metric]:
    rpm = 6_000
    with counting_server(120) as server:
        key = f"fair-{uuid.uuid4().hex[:8]}"
        spec = {
            **where,
            "key": key,
            "rpm": rpm,
            "base_url": server.url,
            "requests": 0,
            "seconds": seconds,
            "tasks": 4,
        }
        results = run_workers(
            [{**spec, "backend": ("asyncio", "trio")[number % 2]} for number in range(4)]
        )
    counts = [result["ok"] for result in results]
    rate = server.rate()
    limited = len(server.limited) + sum(result["limited"] for result in results)
    return [
        Metric(
            f"rate.fair.{name}.jain",
            f"4 processes sharing {rpm // 60}/s through {name}: Jain's index of their shares",
            _jain(counts),
            "",
            ">= 0.95",
            _jain(counts) >= 0.95,
        ),
        Metric(
            f"rate.fair.{name}.min_share",
            f"the smallest process's share / an equal share, {name}",
            min(counts) / (sum(counts) / len(counts)),
            "x",
        ),
        Metric(
            f"rate.fair.{name}.rate",
            f"the rate the server saw / the limit ({rpm // 60}/s), {name}",
            rate / (rpm / 60),
            "x",
            "within 10%",
            abs(rate / (rpm / 60) - 1) <= 0.10,
        ),
        Metric(
            f"rate.fair.{name}.refused",
            f"429s while sharing, {name} (+1, to show 0 on a log scale)",
            limited + 1,
            "",
            "1 (none)",
            limited == 0,
        ),
    ]


def bench_rate(
    *,
    turns: int,
    rounds: int,
    acquires: int,
    fair_seconds: float,
    progress: Callable[[str], None],
) -> list[Metric]:
    """Every rate-limit row: per-turn overhead, a take's cost, fairness across processes."""
    progress("rate limits: per-turn overhead ...")
    metrics = _overhead(turns, rounds)
    dsn = os.environ.get(DSN_VARIABLE)
    with tempfile.TemporaryDirectory() as folder:
        progress("rate limits: a take of a store's row ...")
        metrics += _sqlite_acquires(Path(folder), acquires)
        if dsn:
            metrics += _postgres_acquires(dsn, acquires)
        else:
            progress(f"rate limits: no PostgreSQL rows ({DSN_VARIABLE} is not set)")
        progress("rate limits: fairness across 4 processes ...")
        path = Path(folder) / "fair.db"
        SQLiteStore(path).close()
        metrics += _fairness("sqlite", {"store": "sqlite", "where": str(path)}, fair_seconds)
    if dsn:
        with _schema(dsn) as schema:
            with PostgresStore(dsn, schema=schema) as store:
                store.list()
            where = {"store": "postgres", "where": dsn, "schema": schema}
            metrics += _fairness("postgres", where, fair_seconds)
    return metrics
