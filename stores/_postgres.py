"""`PostgresStore`: States kept in PostgreSQL, shared by many processes on many machines.

The SQL is in `stores._postgres_sql`, the steps of each call in `stores._postgres_plans`; this
module drives them on psycopg 3 connections from a `psycopg_pool.ConnectionPool`. The sync
methods do the work; the async twins run them in a worker thread (`ThreadedAsync`), so they
work on asyncio and on trio alike. psycopg's own async API runs on asyncio only, and its async
pool keeps tasks of its own running in the background; the thread hop costs one per call, or
one per group commit of many saves, against a round trip to the server (see the benchmarks).

psycopg is an optional dependency (``pip install 'orchestrator[postgres]'``): it is imported
when a store is made, so ``import stores`` works without it.
"""

from __future__ import annotations

import builtins
import contextlib
import threading
from collections.abc import Awaitable, Generator, Sequence
from typing import TYPE_CHECKING, Any, LiteralString, TypeVar, cast

import anyio.to_thread

from orchestrator import HistoryEntry, State, StateInfo, StoreDamagedError, StoreError, TreeEntry

from ._lease_sql import LeaseSql, SqlLeases
from ._offload import ThreadedClosing
from ._plan import Operation, Plan, Query, Work, run_plan
from ._postgres_plans import (
    delete_plan,
    entries_plan,
    list_plan,
    load_plan,
    memory_get_plan,
    memory_put_plan,
    memory_scan_plan,
    root_of_plan,
    save_plan,
    tree_cursor,
    tree_plan,
)
from ._postgres_sql import DEFAULT_SCHEMA, open_plan, sql_for
from ._rate_sql import RateSql, SqlRateLimits
from ._redact import redact_url, url_secrets
from .backend import (
    POLL_FIRST,
    POLL_MOST,
    Tail,
    TailCache,
    check_after,
    check_limit,
    check_state,
    validate_id,
)

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

_T = TypeVar("_T")

__all__ = ("PostgresStore",)

_INSTALL = "pip install 'orchestrator[postgres]'"
_LISTEN_SECONDS = 0.25
"""How long a follower's thread waits for a NOTIFY before it looks whether it was cancelled."""


class PostgresStore(ThreadedClosing, SqlLeases, SqlRateLimits):
    """States kept in a PostgreSQL database: safe for many processes on many machines.

    Give it a DSN (``postgresql://user@host/db``, or libpq's ``key=value`` form) and it opens
    a `psycopg_pool.ConnectionPool` of at most `pool_size` connections on first use, closed by
    `close()`; or give it your own open `ConnectionPool`, which it uses and never closes. The
    tables go in the PostgreSQL schema `schema` (made on first use, with the tables, and
    migrated when a newer orchestrator needs it).

    A save appends the new entries of each State and its `states` row in one statement, and so
    does `save_many` for several States: an agent's saves made at once go out that way, one
    commit for the batch. Many processes may save different States at once; if
    two writers append to the same State, the second gets a `ValueError` naming the State
    (load it again and continue that one) and nothing is interleaved.

    The sync methods block; the async twins run them in a worker thread, on asyncio and trio.

    Example:
        ```python
        with PostgresStore("postgresql://app@db.internal/runs") as store:
            agent = Agent(model=model, store=store)
            agent.run(state)
            again = store.load(state.id)
        ```
    """

    def __init__(
        self,
        dsn_or_pool: str | ConnectionPool[Any],
        *,
        schema: str = DEFAULT_SCHEMA,
        pool_size: int = 10,
        timeout: float = 30.0,
    ) -> None:
        """Use the database of `dsn_or_pool`; the schema is made on first use if it is missing.

        Args:
            dsn_or_pool: A libpq connection string or URL, or an open
                `psycopg_pool.ConnectionPool` (not an async one: see the class docstring).
            schema: The PostgreSQL schema of the tables (lowercase letters, digits, ``_``).
            pool_size: The most connections the store's own pool opens (with a DSN).
            timeout: Seconds to wait for a connection before failing with `StoreError`.

        Raises:
            ImportError: psycopg is not installed (``pip install 'orchestrator[postgres]'``).
            TypeError, ValueError: A bad argument; the DSN is never shown with its password.
        """
        try:
            import psycopg_pool
        except ImportError as error:
            raise ImportError(
                f"PostgresStore needs psycopg 3 and psycopg_pool: {_INSTALL}"
            ) from error
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise ValueError(f"pool_size must be an int >= 1, got {pool_size!r}.")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}.")
        self._sql = sql_for(schema)
        self._timeout = float(timeout)
        self._secrets: tuple[str, ...] = ()
        self._dsn: str | None = None
        if isinstance(dsn_or_pool, str):
            shown, self._secrets = _shown_dsn(dsn_or_pool)
            self._dsn = dsn_or_pool
            self._pool: ConnectionPool[Any] | None = None
            self._pool_size = pool_size
            self._shown = shown
        elif isinstance(dsn_or_pool, psycopg_pool.ConnectionPool):
            self._pool = dsn_or_pool
            self._pool_size = dsn_or_pool.max_size
            self._shown = f"<pool {dsn_or_pool.name!r}>"
        elif isinstance(dsn_or_pool, psycopg_pool.AsyncConnectionPool):
            raise TypeError(
                "PostgresStore takes a psycopg_pool.ConnectionPool, not an AsyncConnectionPool:"
                " its async methods run the sync driver in worker threads (so they work on"
                " asyncio and trio). Give it the DSN, or a ConnectionPool."
            )
        else:
            raise TypeError(
                "PostgresStore takes a DSN (a str such as 'postgresql://user@host/db') or a"
                f" psycopg_pool.ConnectionPool, got {type(dsn_or_pool).__name__}."
            )
        suffix = "" if schema == DEFAULT_SCHEMA else f", schema {schema!r}"
        self._where = f"PostgreSQL store {self._shown}{suffix}"
        self._lock = threading.Lock()
        self._ready = False
        self._closed = False
        self._known = _LockedTails()  # the stored ends of the States this store wrote or read

    def __repr__(self) -> str:
        schema = self._sql.schema
        suffix = "" if schema == DEFAULT_SCHEMA else f", schema={schema!r}"
        shown = self._shown if self._dsn is None else repr(self._shown)
        return f"PostgresStore({shown}{suffix})"

    @property
    def schema(self) -> str:
        """The PostgreSQL schema that holds the store's tables."""
        return self._sql.schema

    @property
    def url(self) -> str | None:
        """The URL `stores.open_store` opens this store with, e.g. for a runner's workers.

        None when the store was made from a pool or a ``key=value`` DSN. It holds the
        password: pass it only to what must connect, never log it.
        """
        dsn = self._dsn
        if dsn is None or not dsn.lower().startswith(("postgresql://", "postgres://")):
            return None
        schema = self._sql.schema
        if schema == DEFAULT_SCHEMA:
            return dsn
        return f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"

    # -- the Store methods --------------------------------------------------------------------

    def save(self, state: State) -> None:
        """Write the entries of `state` not stored yet and its info; bind it to this store.

        Raises:
            TypeError: `state` is not a State.
            ValueError: The store holds a different history under this id (load it instead),
                or another writer appended to it meanwhile (load it again).
            StoreError: The database failed (its error is the cause).
        """
        refused = self._save_states([check_state(state)], state.id)
        if refused:
            raise refused[0]

    def save_many(self, states: Sequence[State]) -> dict[int, ValueError]:
        """Save each of `states` as `save` does, in one statement; the refused, by position.

        A State the store refuses is left out and its `ValueError` returned under its position
        in `states`; the others are saved (`orchestrator.BatchStore`).

        Raises:
            TypeError: An item is not a State (nothing is saved).
            StoreError: The database failed: none of the States is saved.
        """
        return self._save_states([check_state(state) for state in states])

    async def asave_many(self, states: Sequence[State]) -> dict[int, ValueError]:
        """`save_many` in a worker thread (`orchestrator.AsyncBatchStore`)."""
        return await self._offload(self.save_many, states)

    def _save_states(
        self, states: builtins.list[State], state_id: str | None = None
    ) -> dict[int, ValueError]:
        return self._run(save_plan(self._sql, states, self, self._where, self._known), state_id)

    def load(self, state_id: str) -> State:
        """The State saved under `state_id`, bound to this store.

        A turn a crash cut off is closed (see `orchestrator.Store.load`); the entries that adds
        are written by the next save.

        Raises:
            LookupError: No State has this id.
            ValueError: `state_id` is not a valid id.
            StoreDamagedError: An entry is damaged (the message names the State and the index).
        """
        return self._run(load_plan(self._sql, state_id, self, self._where, self._known), state_id)

    def list(
        self, *, parent_id: str | None = None, limit: int | None = None
    ) -> builtins.list[StateInfo]:
        """The saved States, most recently updated first; only children of `parent_id` if set."""
        return self._run(list_plan(self._sql, parent_id, limit, self._where))

    def delete(self, state_id: str) -> None:
        """Forget the State `state_id` and its entries (nothing happens if it is absent)."""
        self._run(delete_plan(self._sql, state_id, self._known), state_id, transaction=True)

    # -- following a State (`orchestrator.Followable`, `AsyncFollowable`) -----------------------

    def entries(self, state_id: str, *, after: int = -1) -> tuple[HistoryEntry, ...]:
        """The stored entries of `state_id` after the `seq` `after`, checked as a load checks them.

        Raises:
            LookupError: No State has this id.
            ValueError: `state_id` or `after` is not valid.
            StoreDamagedError: An entry is damaged (the message names the State and the index).
        """
        plan = entries_plan(self._sql, state_id, after, self._where, self._known)
        return self._run(plan, state_id)

    async def aentries(self, state_id: str, *, after: int = -1) -> tuple[HistoryEntry, ...]:
        """`entries` in a worker thread."""
        return await self._offload(self._entries, state_id, after)

    def _entries(self, state_id: str, after: int) -> tuple[HistoryEntry, ...]:
        return self.entries(state_id, after=after)

    async def await_entries(self, state_id: str, *, after: int = -1) -> tuple[HistoryEntry, ...]:
        """Wait for entries of `state_id` after `after`, and return them (see `AsyncFollowable`).

        Every save sends a NOTIFY naming its States when it commits; the wait LISTENs for it on
        a connection of its own (its own pool's connection when the store was given a pool),
        in a worker thread. A cancellation ends the wait at once; the thread it leaves behind
        sees it within 0.25 s, stops listening and closes its connection.
        """
        validate_id(state_id, "state_id")
        check_after(after)
        stop = threading.Event()
        try:
            return await anyio.to_thread.run_sync(
                self._await_entries, state_id, after, stop, abandon_on_cancel=True
            )
        finally:
            stop.set()

    def _await_entries(
        self, state_id: str, after: int, stop: threading.Event
    ) -> tuple[HistoryEntry, ...]:
        import psycopg

        try:
            with self._listening() as connection:
                told = True  # read once after LISTEN: a save that commits in between is read
                while not stop.is_set():
                    if told:
                        new = self.entries(state_id, after=after)
                        if new:
                            return new
                    told = _told(connection, state_id)
        except psycopg.Error as error:
            raise self._error(error, state_id) from _cause(error, self._secrets)
        return ()  # cancelled: nobody reads this

    @contextlib.contextmanager
    def _listening(self) -> Generator[psycopg.Connection[Any]]:
        """A connection that LISTENs to the saves of this store's schema, for one wait."""
        import psycopg

        pool = self._open()
        if self._dsn is None:
            with pool.connection(timeout=self._timeout) as connection:
                _execute(connection, Query(self._sql.listen))
                try:
                    yield connection
                finally:
                    _execute(connection, Query(self._sql.unlisten))
            return
        with psycopg.connect(
            self._dsn, autocommit=True, connect_timeout=max(1, int(self._timeout))
        ) as connection:
            _execute(connection, Query(self._sql.listen))
            yield connection

    # -- following a tree (`orchestrator.TreeFollowable`, `AsyncTreeFollowable`) ---------------

    def root_of(self, state_id: str) -> str:
        """The id of the root of the tree of the stored State `state_id`.

        Raises:
            LookupError: No State has this id.
            ValueError: `state_id` is not a valid id.
        """
        return self._run(root_of_plan(self._sql, state_id, self._where), state_id)

    async def aroot_of(self, state_id: str) -> str:
        """`root_of` in a worker thread."""
        return await self._offload(self.root_of, state_id)

    def tree_entries(
        self, root_id: str, *, after: str | None = None, limit: int | None = None
    ) -> tuple[TreeEntry, ...]:
        """The entries of the tree of `root_id` after the cursor `after`, in feed order.

        The feed is ordered by the id of the transaction that wrote each entry, then State and
        seq; an entry joins it once every older transaction on the server has ended, so a
        transaction left open anywhere on the server holds it back (see `stores._postgres_sql`).

        Raises:
            LookupError: No State `root_id` is stored.
            ValueError: `root_id` is not a root, or `after` or `limit` is not valid.
            StoreDamagedError: An entry is damaged (the message names the State and index).
        """
        plan = tree_plan(self._sql, root_id, after, limit, self._where)
        entries, _ = self._run(plan, root_id)
        return entries

    async def atree_entries(
        self, root_id: str, *, after: str | None = None, limit: int | None = None
    ) -> tuple[TreeEntry, ...]:
        """`tree_entries` in a worker thread."""
        return await self._offload(self._tree_entries, root_id, after, limit)

    def _tree_entries(
        self, root_id: str, after: str | None, limit: int | None
    ) -> tuple[TreeEntry, ...]:
        return self.tree_entries(root_id, after=after, limit=limit)

    async def await_tree_entries(
        self, root_id: str, *, after: str | None = None, limit: int | None = None
    ) -> tuple[TreeEntry, ...]:
        """Wait for entries of the tree of `root_id` after `after`; return them, in order.

        Every save's NOTIFY names its State's root; the wait LISTENs for its tree's, as
        `await_entries` does. Entries a transaction committed while an older one was still
        open join the feed when that one ends, which sends no NOTIFY: while there are such,
        the wait looks again at `stores.backend.POLL_FIRST` to `POLL_MOST` intervals.
        """
        validate_id(root_id, "root_id")
        tree_cursor(after)
        check_limit(limit)
        stop = threading.Event()
        try:
            return await anyio.to_thread.run_sync(
                self._await_tree, root_id, after, limit, stop, abandon_on_cancel=True
            )
        finally:
            stop.set()

    def _await_tree(
        self, root_id: str, after: str | None, limit: int | None, stop: threading.Event
    ) -> tuple[TreeEntry, ...]:
        import psycopg

        try:
            with self._listening() as connection:
                look = True  # once after LISTEN: a save that commits in between is read
                interval = POLL_FIRST
                while not stop.is_set():
                    held = False
                    if look:
                        plan = tree_plan(self._sql, root_id, after, limit, self._where)
                        new, held = self._run(plan, root_id)
                        if new:
                            return new
                    if held:  # committed, behind an older open transaction: look again soon
                        look = True
                        _told_tree(connection, root_id, interval)
                        interval = min(interval * 2, POLL_MOST)
                    else:
                        look = _told_tree(connection, root_id, _LISTEN_SECONDS)
                        interval = POLL_FIRST
        except psycopg.Error as error:
            raise self._error(error, root_id) from _cause(error, self._secrets)
        return ()  # cancelled: nobody reads this

    # -- agent memory (`orchestrator.MemoryBackend`) --------------------------------------------

    def memory_get(self, agent: str, space: str, key: str) -> str | None:
        """The text stored under `key` in the agent's space, or None."""
        return self._run(memory_get_plan(self._sql, agent, space, key))

    def memory_scan(self, agent: str, space: str) -> builtins.list[tuple[str, str]]:
        """Every ``(key, text)`` of the agent's space, in key order."""
        return self._run(memory_scan_plan(self._sql, agent, space))

    def memory_put(
        self, agent: str, space: str, key: str, data: str | None, *, effect: str | None = None
    ) -> bool:
        """Write `data` under `key` (None deletes it), once per `effect` key; whether it applied."""
        return self._run(memory_put_plan(self._sql, agent, space, key, data, effect))

    # -- closing ------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the store's own pool (a pool you gave it stays open). Closing twice is fine."""
        with self._lock:
            self._closed = True
            pool, self._pool = (self._pool, None) if self._dsn is not None else (None, self._pool)
        if pool is not None:
            pool.close()

    # -- running plans ------------------------------------------------------------------------

    def _lease_statements(self) -> LeaseSql:
        return self._sql.leases

    def _rate_statements(self) -> RateSql:
        return self._sql.rates

    def _carry_out(self, plan: Plan[_T]) -> Awaitable[_T]:
        return self._offload(self._run, plan)

    def _run(
        self, plan: Plan[Any], state_id: str | None = None, *, transaction: bool = False
    ) -> Any:
        """Carry out `plan` on a connection of the pool (in one transaction if `transaction`).

        An error of psycopg is raised as the library's (`StoreError`, or `StoreDamagedError`
        when the tables were changed), naming `state_id` if the call is about one State.
        """
        import psycopg

        try:
            pool = self._open()
            with pool.connection(timeout=self._timeout) as connection:
                if not transaction:
                    return run_plan(plan, lambda query: _execute(connection, query))
                with connection.transaction():
                    return run_plan(plan, lambda query: _execute(connection, query))
        except psycopg.Error as error:
            raise self._error(error, state_id) from _cause(error, self._secrets)
        finally:
            plan.close()

    def _open(self) -> ConnectionPool[Any]:
        """The pool, once the schema is made or checked (the first call does it)."""
        with self._lock:
            if self._closed:
                raise ValueError(f"{self!r} is closed: make a new PostgresStore to use it again.")
            if self._ready:
                assert self._pool is not None
                return self._pool
            import psycopg
            from psycopg_pool import ConnectionPool

            if self._dsn is not None:
                # A direct connection first: its error says why (the pool would only time out).
                with psycopg.connect(
                    self._dsn, autocommit=True, connect_timeout=max(1, int(self._timeout))
                ) as connection:
                    self._migrate(connection)
                self._pool = ConnectionPool(
                    self._dsn,
                    min_size=1,
                    max_size=self._pool_size,
                    kwargs={"autocommit": True},
                    open=True,
                    name="orchestrator",
                    timeout=self._timeout,
                )
            else:
                assert self._pool is not None
                with self._pool.connection(timeout=self._timeout) as connection:
                    self._migrate(connection)
            self._ready = True
            return self._pool

    def _migrate(self, connection: psycopg.Connection[Any]) -> None:
        with connection.transaction():
            run_plan(open_plan(self._sql, self._where), lambda query: _execute(connection, query))

    def _error(self, error: Exception, state_id: str | None) -> StoreError:
        """The library's error for an error of psycopg, its text free of the password."""
        import psycopg.errors

        text = " ".join(_scrub(str(error), self._secrets).split()) or type(error).__name__
        about = "" if state_id is None else f" while reading or writing State {state_id!r}"
        if isinstance(
            error,
            psycopg.errors.UndefinedTable
            | psycopg.errors.UndefinedColumn
            | psycopg.errors.DataCorrupted
            | psycopg.errors.IndexCorrupted,
        ):
            return StoreDamagedError(
                f"{self._where} is damaged{about}: its tables were changed since it was made"
                f" ({text}). Restore the database from a backup, or give the store a new schema"
                " (schema=...)."
            )
        if isinstance(error, psycopg.OperationalError):
            return StoreError(
                f"{self._where} could not reach the database{about} ({text}). Check that the"
                " server runs and that the DSN (host, port, user, password) is right."
            )
        return StoreError(f"{self._where} failed{about}: {text} ({type(error).__name__}).")


def _told(connection: psycopg.Connection[Any], state_id: str) -> bool:
    """Whether a save of `state_id` was notified within `_LISTEN_SECONDS`.

    A save's payload is its State's id and its root's, separated by a space.
    """
    return any(
        note.payload.partition(" ")[0] == state_id
        for note in connection.notifies(timeout=_LISTEN_SECONDS)
    )


def _told_tree(connection: psycopg.Connection[Any], root_id: str, seconds: float) -> bool:
    """Whether a save of a State of the tree of `root_id` was notified within `seconds`."""
    return any(
        note.payload.partition(" ")[2] == root_id for note in connection.notifies(timeout=seconds)
    )


class _LockedTails(TailCache):
    """A `TailCache` for many threads: the pool's connections save at once."""

    __slots__ = ("_mutex",)

    def __init__(self) -> None:
        super().__init__()
        self._mutex = threading.Lock()

    def get(self, state_id: str) -> Tail | None:
        with self._mutex:
            return super().get(state_id)

    def put(self, state_id: str, tail: Tail) -> None:
        with self._mutex:
            super().put(state_id, tail)

    def forget(self, state_id: str) -> None:
        with self._mutex:
            super().forget(state_id)


def _execute(connection: psycopg.Connection[Any], query: Operation) -> Any:
    if isinstance(query, Work):
        return query.func()
    assert isinstance(query, Query), "PostgreSQL plans yield queries and work"
    # The statements are the literals of `stores._postgres_sql`, with a checked schema name.
    sql = cast("LiteralString", query.sql)
    cursor = connection.execute(sql, query.params, binary=True)
    return cursor.fetchall() if cursor.description is not None else []


# -- the DSN, shown without its password ------------------------------------------------------


def _shown_dsn(dsn: str) -> tuple[str, tuple[str, ...]]:
    """`dsn` as it may be shown (`stores.redact_url`), and its secrets to scrub from messages.

    Raises:
        ValueError: The DSN does not parse (the message does not quote it).
    """
    from psycopg.conninfo import conninfo_to_dict

    secrets = url_secrets(dsn)
    try:
        conninfo_to_dict(dsn)
    except Exception as error:  # psycopg.ProgrammingError; its text may quote the DSN
        text = _scrub(str(error), (*secrets, dsn))
        raise ValueError(
            f"The PostgreSQL DSN does not parse ({text}): give a URL such as"
            " 'postgresql://user@host:5432/db' or libpq's 'host=... dbname=...' form."
        ) from None
    return redact_url(dsn), secrets


def _scrub(text: str, secrets: tuple[str, ...]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def _cause(error: Exception, secrets: tuple[str, ...]) -> Exception | None:
    """`error`, unless its text holds a secret: then no cause is chained at all."""
    text = str(error)
    return None if any(secret and secret in text for secret in secrets) else error
