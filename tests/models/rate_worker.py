"""A process that asks a model through a `RateLimit` shared in a store, for the tests and bench.

``python -m tests.models.rate_worker SPEC``, where SPEC is JSON: ``store`` (``"sqlite"`` or
``"postgres"``), ``where`` (the file, or the DSN), ``schema``, ``key``, ``rpm``, ``base_url``,
``requests`` (how many to send, or 0 to send until ``seconds`` ran out), ``seconds``, ``tasks``
(concurrent senders) and ``backend`` (``"asyncio"`` or ``"trio"``). It opens the store and
prints ``ready``, waits for a line on stdin (so every process starts together), sends, then
prints its counts as JSON: ``ok`` (answered), ``limited`` (429s), and ``acquire_us`` (the time
of each take of the limit's row, in microseconds).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import anyio

from orchestrator import Message, RateLimitError
from orchestrator.models import OpenAIModel, RateLimit, Request, RetryPolicy
from orchestrator.models._rate import AsyncRateLimits, RateAsk, RateTimes
from stores import PostgresStore, SQLiteStore


class TimedTakes:
    """A rate-limit table that notes how long each take takes."""

    def __init__(self, table: AsyncRateLimits) -> None:
        self.table = table
        self.micros: list[float] = []

    async def arate_take(self, key: str, ask: RateAsk) -> RateTimes:
        started = time.perf_counter()
        times = await self.table.arate_take(key, ask)
        self.micros.append((time.perf_counter() - started) * 1e6)
        return times

    async def arate_hold(self, key: str, seconds: float, tolerance: float) -> None:
        await self.table.arate_hold(key, seconds, tolerance)

    async def arate_settle(self, key: str, tokens: float) -> None:
        await self.table.arate_settle(key, tokens)


def open_store(spec: dict[str, Any]) -> Any:
    if spec["store"] == "sqlite":
        return SQLiteStore(spec["where"])
    return PostgresStore(spec["where"], schema=spec["schema"], pool_size=2)


async def main(spec: dict[str, Any]) -> dict[str, Any]:
    with open_store(spec) as store:
        timed = TimedTakes(store)
        limit = RateLimit(requests_per_minute=spec["rpm"], store=timed, key=spec["key"])
        model = OpenAIModel(
            "gpt-4o",
            base_url=spec["base_url"],
            api_key="sk-test",
            rate_limit=limit,
            retry=RetryPolicy(retries=0),
        )
        request = Request(system=None, messages=(Message.user("Hi"),))
        await store.arate_settle("warm-up", 0.0)  # the connection is open before the start
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        counts = {"ok": 0, "limited": 0}
        left = spec["requests"]
        deadline = time.monotonic() + spec["seconds"]

        async def sender() -> None:
            nonlocal left
            while (left > 0) if spec["requests"] else (time.monotonic() < deadline):
                left -= 1
                try:
                    await model.respond(request)
                except RateLimitError:
                    counts["limited"] += 1
                else:
                    counts["ok"] += 1

        async with anyio.create_task_group() as group:
            for _ in range(spec["tasks"]):
                group.start_soon(sender)
    return {**counts, "acquire_us": timed.micros}


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    result = anyio.run(main, spec, backend=spec["backend"])
    print(json.dumps(result), flush=True)
