"""Run leases in SQL (`orchestrator.AsyncRunLeases`): one plan per call, for SQLite and PostgreSQL.

The statements are each dialect's (`stores._sql.SQLITE_LEASES`,
`stores._postgres_sql.postgres_leases`), like all of a store's SQL. A lease is a row of
``run_leases``: the State, its owner, when the lease runs out, and whether
another process asked the owner to cancel. Every change is one statement that checks and writes
at once (an upsert that takes a lease only when it is free, ran out or is the owner's own), so
two processes claiming together cannot both win. SQLite's times are this machine's clock (its
processes share it); PostgreSQL's are the server's (``clock_timestamp()``), so processes on
several machines agree.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ._leases import check_lease
from ._plan import Plan, Query, Row

__all__ = (
    "LeaseSql",
    "SqlLeases",
    "cancel_plan",
    "claim_plan",
    "owners_plan",
    "release_plan",
    "renew_plan",
)

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class LeaseSql:
    """The statements of run leases in one dialect, and what ends a write.

    The parameters are named: id, owner, seconds, now, ids. SQLite's writes end with COMMIT;
    PostgreSQL's commit each statement.
    """

    claim: str
    owner_of: str
    renew: str
    held: str
    release: str
    cancel: str
    owners: str
    commit: str | None
    ids: Callable[[Sequence[str]], Any]  # the `ids` parameter's value


def _params(sql: LeaseSql, **values: Any) -> dict[str, Any]:
    values.setdefault("ids", ())
    return {**values, "now": time.time(), "ids": sql.ids(values["ids"])}


def _commit(sql: LeaseSql) -> Plan[None]:
    if sql.commit is not None:
        yield Query(sql.commit)


def claim_plan(sql: LeaseSql, state_id: str, owner: str, seconds: float) -> Plan[str | None]:
    """Take the lease of `state_id` for `owner`; the owner holding it when another one does."""
    check_lease(state_id, owner, seconds)
    params = _params(sql, id=state_id, owner=owner, seconds=float(seconds))
    yield Query(sql.claim, params)
    rows: list[Row] = yield Query(sql.owner_of, params)
    yield from _commit(sql)
    holder = rows[0][0] if rows else None
    return None if holder == owner else holder


def renew_plan(
    sql: LeaseSql, owner: str, state_ids: Sequence[str], seconds: float
) -> Plan[frozenset[str]]:
    """Extend `owner`'s leases of `state_ids`; the ids it must stop (cancel asked, or lost)."""
    for state_id in state_ids:
        check_lease(state_id, owner, seconds)
    params = _params(sql, owner=owner, seconds=float(seconds), ids=list(state_ids))
    yield Query(sql.renew, params)
    rows: list[Row] = yield Query(sql.held, params)
    yield from _commit(sql)
    kept = {row[0] for row in rows if row[1] == owner and not row[2]}
    return frozenset(state_ids) - kept


def release_plan(sql: LeaseSql, state_id: str, owner: str) -> Plan[None]:
    """Give back `owner`'s lease of `state_id`."""
    check_lease(state_id, owner, 1)
    yield Query(sql.release, _params(sql, id=state_id, owner=owner))
    yield from _commit(sql)


def cancel_plan(sql: LeaseSql, state_id: str) -> Plan[str | None]:
    """Ask the owner running `state_id` to cancel it; that owner, or None if none runs it."""
    check_lease(state_id, "-", 1)
    params = _params(sql, id=state_id)
    yield Query(sql.cancel, params)
    rows: list[Row] = yield Query(sql.owners, {**params, "ids": sql.ids([state_id])})
    yield from _commit(sql)
    return rows[0][1] if rows else None


def owners_plan(sql: LeaseSql, state_ids: Sequence[str]) -> Plan[dict[str, str]]:
    """The owners of the leases of `state_ids` that have not run out."""
    rows: list[Row] = yield Query(sql.owners, _params(sql, ids=list(state_ids)))
    return {row[0]: row[1] for row in rows}


class SqlLeases:
    """`orchestrator.AsyncRunLeases` for a SQL store: each call one plan, carried out its way.

    The store says which statements (`_lease_statements`) and how a plan runs from the event
    loop (`_carry_out`: a worker thread, or an async driver).
    """

    __slots__ = ()

    def _lease_statements(self) -> LeaseSql:
        raise NotImplementedError

    def _carry_out(self, plan: Plan[_T]) -> Awaitable[_T]:
        raise NotImplementedError

    async def aclaim_run(self, state_id: str, owner: str, *, seconds: float) -> str | None:
        """Take the lease of `state_id` for `owner`; the owner holding it, if another does."""
        return await self._carry_out(claim_plan(self._lease_statements(), state_id, owner, seconds))

    async def arenew_runs(
        self, owner: str, state_ids: Sequence[str], *, seconds: float
    ) -> frozenset[str]:
        """Extend `owner`'s leases; the ids to stop (cancel asked, or held by another now)."""
        if not state_ids:
            return frozenset()
        return await self._carry_out(
            renew_plan(self._lease_statements(), owner, state_ids, seconds)
        )

    async def arelease_run(self, state_id: str, owner: str) -> None:
        """Give back `owner`'s lease of `state_id`."""
        await self._carry_out(release_plan(self._lease_statements(), state_id, owner))

    async def arequest_cancel(self, state_id: str) -> str | None:
        """Ask the owner running `state_id` to cancel it; that owner, or None."""
        return await self._carry_out(cancel_plan(self._lease_statements(), state_id))

    async def arun_owners(self, state_ids: Sequence[str]) -> dict[str, str]:
        """The owners of the leases of `state_ids` that have not run out."""
        if not state_ids:
            return {}
        return await self._carry_out(owners_plan(self._lease_statements(), state_ids))
