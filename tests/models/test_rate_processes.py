"""Processes sharing one `RateLimit` through a store stay under it, at its rate.

Two and four processes (asyncio and trio ones side by side) ask a server that answers 429 above
65 requests in any second, through a limit of 50 a second kept in a SQLite file or a PostgreSQL
schema: two processes with 4 senders each, four with 50 each (as 4 processes of 50 subagents
would). No request is refused, and the server sees them at the limit's rate (within 10%). The
server's margin is for this shared machine: a process whose event loop stalls sends the
requests whose turn came meanwhile together when it wakes (a stall of 200 ms made 7 of 200
refused above 120 a second once, in a few dozen runs, at a limit of 100). The limit is low
enough for a loaded machine to keep up with: at 100 a second, four processes beside a parallel
test run and two benchmarks reached only 68-77 a second.
"""

from __future__ import annotations

import uuid
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from benchmarks.rate_load import counting_server, run_workers
from stores import PostgresStore, SQLiteStore
from tests.postgres import fresh_schema

RPM = 3000  # 50 a second
SERVER_LIMIT = 65  # in any second
REQUESTS = 160  # 3.2 s at the limit


@contextmanager
def shared_store(kind: str, tmp_path: Path) -> Generator[dict[str, Any]]:
    """Where the workers' store is: a SQLite file, or a fresh PostgreSQL schema (made here)."""
    if kind == "sqlite":
        path = tmp_path / "rates.db"
        SQLiteStore(path).close()
        yield {"store": "sqlite", "where": str(path), "schema": None}
        return
    with fresh_schema("rates") as (dsn, schema):
        with PostgresStore(dsn, schema=schema) as store:
            store.list()  # made now, not by the workers at once
        yield {"store": "postgres", "where": dsn, "schema": schema}


@pytest.mark.parametrize(("processes", "senders"), [(2, 4), (4, 50)])
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_processes_sharing_a_limit_stay_under_it_at_its_rate(
    kind: str, processes: int, senders: int, tmp_path: Path
) -> None:
    with shared_store(kind, tmp_path) as where, counting_server(SERVER_LIMIT) as server:
        key = f"openai-{uuid.uuid4().hex[:8]}"
        specs = [
            {
                **where,
                "key": key,
                "rpm": RPM,
                "base_url": server.url,
                "requests": REQUESTS // processes,
                "seconds": 0,
                "tasks": senders,
                "backend": ("asyncio", "trio")[number % 2],
            }
            for number in range(processes)
        ]
        results = run_workers(specs)
    assert [result["limited"] for result in results] == [0] * processes
    assert sum(result["ok"] for result in results) == REQUESTS
    assert server.limited == []
    assert len(server.served) == REQUESTS
    assert server.rate() == pytest.approx(RPM / 60, rel=0.10)
