"""Rate limits in SQL (`orchestrator.models.RateLimit` with ``store=``), for SQLite and PostgreSQL.

A limit's key is a row of ``rate_limits``: when its requests and its tokens are paid off (seconds
since the epoch). A take is one UPSERT that moves both times on and returns them
(`orchestrator.models._rate.next_times` is the rule), so processes taking at once are put in
line by the database and none can overtake another's reservation. SQLite's clock is this
machine's (its processes share it); PostgreSQL's is the server's, so machines agree. The
statements are each dialect's (`stores._sql.SQLITE_RATES`, `stores._postgres_sql.postgres_rates`).

A key's concurrent slots are rows of ``rate_slots`` (key, slot, holder, expires_at). A take is
one INSERT of the lowest slot number no one holds (or whose lease ran out), which on a conflict
takes the row only if its lease ran out, and returns the slot: two processes never hold one
slot. A renew moves the holder's lease on; a release deletes the holder's row.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from orchestrator.models._rate import RateAsk, RateTimes

from ._plan import Plan, Query, Row

__all__ = (
    "RateSql",
    "SqlRateLimits",
    "hold_plan",
    "settle_plan",
    "slot_release_plan",
    "slot_renew_plan",
    "slot_take_plan",
    "take_plan",
)

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class RateSql:
    """The statements of rate limits in one dialect, and what ends a write.

    The parameters are named: key, now (SQLite's clock), requests, tokens, seconds, tolerance,
    and for slots most, slot, holder, lease. `take` returns the row's two times and the clock's
    now; `slot_take` the slot taken (no row: none free); `slot_renew` the slot renewed. SQLite's
    writes end with COMMIT; PostgreSQL's commit each statement.
    """

    take: str
    hold: str
    settle: str
    slot_take: str
    slot_renew: str
    slot_release: str
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


def _check_slot_ask(most: object, lease: object) -> None:
    if isinstance(most, bool) or not isinstance(most, int) or most < 1:
        raise ValueError(f"A rate limit's slots must be an int >= 1, got {most!r}.")
    if isinstance(lease, bool) or not isinstance(lease, int | float) or not lease > 0:
        raise ValueError(f"A slot's lease must be seconds > 0, got {lease!r}.")


def slot_take_plan(
    sql: RateSql, key: str, most: int, holder: str, lease: float
) -> Plan[int | None]:
    """Take the lowest free slot of `key`'s `most` for `lease` seconds; None when none is free."""
    _check_key(key)
    _check_slot_ask(most, lease)
    params = {
        "key": key,
        "now": time.time(),
        "most": most,
        "holder": holder,
        "lease": float(lease),
    }
    rows: list[Row] = yield Query(sql.slot_take, params)
    yield from _commit(sql)
    return int(rows[0][0]) if rows else None


def slot_renew_plan(sql: RateSql, key: str, slot: int, holder: str, lease: float) -> Plan[bool]:
    """Hold `slot` for `lease` seconds from now; False when `holder` no longer holds it."""
    _check_key(key)
    params = {
        "key": key,
        "now": time.time(),
        "slot": slot,
        "holder": holder,
        "lease": float(lease),
    }
    rows: list[Row] = yield Query(sql.slot_renew, params)
    yield from _commit(sql)
    return bool(rows)


def slot_release_plan(sql: RateSql, key: str, slot: int, holder: str) -> Plan[None]:
    """Free `slot` if `holder` still holds it."""
    _check_key(key)
    yield Query(sql.slot_release, {"key": key, "slot": slot, "holder": holder})
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

    async def arate_slot_take(self, key: str, most: int, holder: str, lease: float) -> int | None:
        """Take a free slot of `key`'s `most` for `lease` seconds, or None."""
        plan = slot_take_plan(self._rate_statements(), key, most, holder, lease)
        return await self._carry_out(plan)

    async def arate_slot_renew(self, key: str, slot: int, holder: str, lease: float) -> bool:
        """Hold `slot` for `lease` seconds from now; False when `holder` no longer holds it."""
        plan = slot_renew_plan(self._rate_statements(), key, slot, holder, lease)
        return await self._carry_out(plan)

    async def arate_slot_release(self, key: str, slot: int, holder: str) -> None:
        """Free `slot` if `holder` still holds it."""
        await self._carry_out(slot_release_plan(self._rate_statements(), key, slot, holder))
