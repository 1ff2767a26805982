"""Rate limits in SQL (`orchestrator.models.RateLimit` with ``store=``), for SQLite and PostgreSQL.

A limit's key is a row of ``rate_limits``: when its requests and its tokens are paid off (seconds
since the epoch). A take is one UPSERT that moves both times on and returns them
(`orchestrator.models._rate.next_times` is the rule), so processes taking at once are put in
line by the database and none can overtake another's reservation. SQLite's clock is this
machine's (its processes share it); PostgreSQL's is the server's, so machines agree. The
statements are each dialect's (`stores._sql.SQLITE_RATES`, `stores._postgres_sql.postgres_rates`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from orchestrator.models._rate import RateAsk, RateTimes

from ._plan import Plan, Query, Row

__all__ = ("RateSql", "SqlRateLimits", "hold_plan", "settle_plan", "take_plan")

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class RateSql:
    """The statements of rate limits in one dialect, and what ends a write.

    The parameters are named: key, now (SQLite's clock), requests, tokens, seconds, tolerance.
    `take` returns the row's two times and the clock's now. SQLite's writes end with COMMIT;
    PostgreSQL's commit each statement.
    """

    take: str
    hold: str
    settle: str
    commit: str | None


def _check_key(key: object) -> None:
    if not isinstance(key, str) or not key:
        raise TypeError(f"A rate limit's key must be a non-empty str, got {key!r}.")


def _commit(sql: RateSql) -> Plan[None]:
    if sql.commit is not None:
        yield Query(sql.commit)


def take_plan(sql: RateSql, key: str, ask: RateAsk) -> Plan[RateTimes]:
    """Move `key`'s times on by `ask`; the times after, with the clock's now."""
    _check_key(key)
    params = {"key": key, "now": time.time(), "requests": ask.requests, "tokens": ask.tokens}
    rows: list[Row] = yield Query(sql.take, params)
    yield from _commit(sql)
    requests_at, tokens_at, now = rows[0]
    return RateTimes(float(requests_at), float(tokens_at), float(now))


def hold_plan(sql: RateSql, key: str, seconds: float, tolerance: float) -> Plan[None]:
    """Let no request of `key` go for `seconds` from now."""
    _check_key(key)
    params = {
        "key": key,
        "now": time.time(),
        "seconds": float(seconds),
        "tolerance": float(tolerance),
    }
    yield Query(sql.hold, params)
    yield from _commit(sql)


def settle_plan(sql: RateSql, key: str, tokens: float) -> Plan[None]:
    """Add `tokens` seconds to `key`'s tokens time."""
    _check_key(key)
    yield Query(sql.settle, {"key": key, "tokens": float(tokens)})
    yield from _commit(sql)


class SqlRateLimits:
    """`orchestrator.models.AsyncRateLimits` for a SQL store: each call one plan.

    The store says which statements (`_rate_statements`) and how a plan runs from the event
    loop (`_carry_out`, which run leases use too).
    """

    __slots__ = ()

    def _rate_statements(self) -> RateSql:
        raise NotImplementedError

    def _carry_out(self, plan: Plan[_T]) -> Awaitable[_T]:
        raise NotImplementedError

    async def arate_take(self, key: str, ask: RateAsk) -> RateTimes:
        """Move `key`'s times on by `ask` and return them, with the clock's now."""
        return await self._carry_out(take_plan(self._rate_statements(), key, ask))

    async def arate_hold(self, key: str, seconds: float, tolerance: float) -> None:
        """Let no request of `key` go for `seconds` from now."""
        await self._carry_out(hold_plan(self._rate_statements(), key, seconds, tolerance))

    async def arate_settle(self, key: str, tokens: float) -> None:
        """Add `tokens` seconds (< 0 gives back) to `key`'s tokens time."""
        await self._carry_out(settle_plan(self._rate_statements(), key, tokens))
