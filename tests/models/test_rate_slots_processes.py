"""Processes sharing `RateLimit(concurrent=2)` through a store never run more than 2 at once.

Two and four processes (asyncio and trio ones side by side), each with 4 senders, ask a server
that holds every request 50 ms and counts the requests in flight, through a limit kept in a
SQLite file or a PostgreSQL schema: the server never sees more than 2 at once, and sees 2 (the
limit is not stricter than it says). A process killed with SIGKILL while it holds both slots
stops renewing them; their leases run out and another process takes them.
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest

from benchmarks.rate_load import counting_server, run_workers, start_workers, stop_workers
from orchestrator.models import RateLimit
from stores import PostgresStore, SQLiteStore
from tests.models.test_rate_processes import shared_store

SLOTS = 2
REQUESTS = 24


@pytest.mark.parametrize("processes", [2, 4])
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_processes_sharing_concurrent_slots_stay_under_them(
    kind: str, processes: int, tmp_path: Path
) -> None:
    with shared_store(kind, tmp_path) as where, counting_server(1_000, hold=0.05) as server:
        key = f"slots-{uuid.uuid4().hex[:8]}"
        specs = [
            {
                **where,
                "key": key,
                "rpm": None,
                "concurrent": SLOTS,
                "lease": 5.0,
                "base_url": server.url,
                "requests": REQUESTS // processes,
                "seconds": 0,
                "tasks": 4,
                "backend": ("asyncio", "trio")[number % 2],
            }
            for number in range(processes)
        ]
        results = run_workers(specs)
    assert sum(result["ok"] for result in results) == REQUESTS
    assert server.limited == []
    assert server.most_in_flight == SLOTS


def _open(where: dict[str, Any]) -> SQLiteStore | PostgresStore:
    if where["store"] == "sqlite":
        return SQLiteStore(where["where"])
    return PostgresStore(where["where"], schema=where["schema"])


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
@pytest.mark.anyio
async def test_a_killed_process_s_slots_come_free_after_their_lease(
    kind: str, tmp_path: Path
) -> None:
    # The worker's requests are held by the server until it stops: the worker holds both
    # slots, renewing their 3 s leases, until it is killed.
    with shared_store(kind, tmp_path) as where, counting_server(1_000, hold=120) as server:
        key = f"killed-{uuid.uuid4().hex[:8]}"
        spec = {
            **where,
            "key": key,
            "rpm": None,
            "concurrent": SLOTS,
            "lease": 3.0,
            "base_url": server.url,
            "requests": 4,
            "seconds": 0,
            "tasks": 4,
            "backend": "asyncio",
        }
        workers = start_workers([spec])
        try:
            [worker] = workers
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
            for _ in range(600):  # up to a minute on a busy machine
                if server.in_flight == SLOTS:
                    break
                await anyio.sleep(0.1)
            assert server.in_flight == SLOTS
            worker.send_signal(signal.SIGKILL)
            worker.wait()
        finally:
            stop_workers(workers)

        with _open(where) as store:
            # Killed just now, the slots' leases are running: none is free.
            assert await store.arate_slot_take(key, SLOTS, "peek", 30.0) is None
            limit = RateLimit(concurrent=SLOTS, store=store, key=key, lease=30.0)
            with anyio.fail_after(60):  # a bound, not a measure: the leases are 3 s
                async with limit.request(), limit.request():
                    # Both slots are this process's now.
                    assert await store.arate_slot_take(key, SLOTS, "peek", 30.0) is None
            assert await store.arate_slot_take(key, SLOTS, "peek", 30.0) == 0  # given back
