"""`AioSQLiteStore`: States in one SQLite file, through `aiosqlite`, for asyncio apps.

It runs the same plans as `SQLiteStore` (`stores._sql`), driven with awaits
(`stores._plan.arun_plan`). aiosqlite runs on asyncio only: under trio, use `SQLiteStore`,
whose async methods work on both.
"""

from __future__ import annotations

import asyncio
import builtins
import os
import sqlite3
import threading
import urllib.parse
import weakref
from collections.abc import Awaitable, Sequence
from typing import Any, ClassVar, NoReturn, TypeVar

import aiosqlite
import anyio
import anyio.lowlevel
import anyio.to_thread

from orchestrator import HistoryEntry, State, StateInfo, TreeEntry

from ._lease_sql import LeaseSql, SqlLeases
from ._offload import AsyncClosing
from ._plan import Operation, Plan, Query, QueryMany, Work, arun_plan
from ._rate_sql import RateSql, SqlRateLimits
from ._sql import (
    BUSY_RETRY_PAUSE,
    BUSY_RETRY_SECONDS,
    ISOLATION_LEVEL,
    ROLLBACK,
    SQLITE_LEASES,
    SQLITE_RATES,
    backend_error,
    count_plan,
    create_private,
    delete_plan,
    entries_plan,
    is_busy,
    list_plan,
    load_plan,
    memory_get_plan,
    memory_put_plan,
    memory_scan_plan,
    open_plan,
    position_of,
    root_of_plan,
    save_many_plan,
    save_plan,
    tree_end_plan,
    tree_entries_plan,
)
from ._sqlite import refuse_folder
from .backend import (
    TailCache,
    Wakeups,
    check_after,
    check_limit,
    check_state,
    poll_entries,
    validate_id,
)

__all__ = ("AioSQLiteStore",)

_T = TypeVar("_T")


class AioSQLiteStore(AsyncClosing, SqlLeases, SqlRateLimits):
    """States kept in one SQLite file, used with ``await`` on asyncio.

    It has `asave`, `aload`, `alist` and `adelete` with the behaviour of `SQLiteStore` (the same
    file format, WAL, busy timeout, append-only saves), run by aiosqlite's thread, and
    `asave_many`, which saves several States in one transaction. Its sync methods raise
    `TypeError`: from sync code, or under trio, use `SQLiteStore`. Close it with
    `await store.aclose()`, or use ``async with``.

    Example:
        ```python
        async with AioSQLiteStore("runs.db") as store:
            agent = Agent(model=model, store=store)
            await agent.arun(state)
            again = await store.aload(state.id)
        ```
    """

    async_only: ClassVar[bool] = True
    """Only the async methods work (`State.child` tells users to call `achild`)."""
    asyncio_only: ClassVar[bool] = True
    """It works on asyncio only, not on trio."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """Use the SQLite file at `path`; it is created on first use if it does not exist.

        Raises:
            ValueError: `path` is a folder.
        """
        self._path = os.fspath(path)
        refuse_folder(self._path, "AioSQLiteStore")
        self._where = f"SQLite store {self._path!r}"
        # One plan at a time on the connection. Taken shielded, so without a checkpoint when it
        # is free: from `_run` to the plan's first statement, 30-45 against 12-13 us (medians).
        self._lock = anyio.Lock(fast_acquire=True)
        self._known = TailCache()  # what its connection stored
        # the followers in this process of any store on this file, woken by saves here
        self._wakeups = Wakeups.shared(self.url)
        self._connection: aiosqlite.Connection | None = None
        self._closed = False
        self._on_collect: weakref.finalize[[aiosqlite.Connection], Any] | None = None

    def __repr__(self) -> str:
        return f"AioSQLiteStore({self._path!r})"

    @property
    def path(self) -> str:
        """The path of the SQLite file."""
        return self._path

    @property
    def url(self) -> str:
        """The URL `stores.open_store` opens this file with (absolute), e.g. for a runner."""
        return "sqlite:///" + urllib.parse.quote(os.path.abspath(self._path))

    # -- the AsyncStore methods ---------------------------------------------------------------

    async def asave(self, state: State) -> None:
        """Write the entries of `state` not stored yet and its info; bind it to this store.

        Raises:
            TypeError: `state` is not a State, or this is not asyncio.
            ValueError: The store holds a different history under this id (load it instead),
                or the file has another format version.
        """
        _require_asyncio("asave")
        await self._run(save_plan(state, self, self._where, self._known), check_state(state).id)
        self._wakeups.saved(((state.id, state.parent_id),))

    async def asave_many(self, states: Sequence[State]) -> dict[int, ValueError]:
        """Save each of `states` as `asave` does, in one transaction; the refused, by position.

        A State the store refuses is left out and its `ValueError` returned under its position
        in `states`; the others are saved (`orchestrator.AsyncBatchStore`).

        Raises:
            TypeError: An item is not a State (nothing is saved), or this is not asyncio.
            StoreError: SQLite failed: none of the States is saved.
        """
        _require_asyncio("asave_many")
        refused = await self._run(save_many_plan(states, self, self._where, self._known))
        self._wakeups.saved((state.id, state.parent_id) for state in states)
        return refused

    async def aload(self, state_id: str) -> State:
        """The State saved under `state_id`, bound to this store.

        A turn a crash cut off is closed (see `orchestrator.Store.load`); the entries that adds are
        written by the next save.

        Raises:
            LookupError: No State has this id.
            TypeError: This is not asyncio.
            ValueError: `state_id` is not a valid id, an entry is damaged (the message names the
                State and the entry's index), or the file has another format version.
        """
        _require_asyncio("aload")
        return await self._run(load_plan(state_id, self, self._where), state_id)

    async def alist(
        self, *, parent_id: str | None = None, limit: int | None = None
    ) -> builtins.list[StateInfo]:
        """The saved States, most recently updated first; only children of `parent_id` if set."""
        _require_asyncio("alist")
        return await self._run(list_plan(parent_id, limit, self._where))

    async def adelete(self, state_id: str) -> None:
        """Forget the State `state_id` (nothing happens if it is absent)."""
        _require_asyncio("adelete")
        await self._run(delete_plan(state_id, self._known), state_id)

    # -- following a State (`orchestrator.AsyncFollowable`) ------------------------------------

    async def aentries(self, state_id: str, *, after: int = -1) -> tuple[HistoryEntry, ...]:
        """The stored entries of `state_id` after the `seq` `after`, checked as a load checks them.

        Raises:
            LookupError: No State has this id.
            TypeError: This is not asyncio.
            ValueError: `state_id` or `after` is not valid, or an entry is damaged.
        """
        _require_asyncio("aentries")
        return await self._run(entries_plan(state_id, after, self._where), state_id)

    async def await_entries(self, state_id: str, *, after: int = -1) -> tuple[HistoryEntry, ...]:
        """Wait for entries of `state_id` after `after`, and return them (see `AsyncFollowable`).

        Another process's commits are seen by polling the State's entry count, at
        `stores.backend.POLL_FIRST` to `POLL_MOST` intervals; a cancellation ends the wait at once.

        Raises:
            TypeError: This is not asyncio.
        """
        _require_asyncio("await_entries")
        validate_id(state_id, "state_id")
        check_after(after)
        return await poll_entries(
            lambda: self.aentries(state_id, after=after),
            lambda: self._run(count_plan(state_id)),
            watching=self._wakeups.watching(state_id),
        )

    # -- following a tree (`orchestrator.AsyncTreeFollowable`) ---------------------------------

    async def aroot_of(self, state_id: str) -> str:
        """The id of the root of the tree of the stored State `state_id` (see `SQLiteStore`).

        Raises:
            LookupError: No State has this id.
            TypeError: This is not asyncio.
        """
        _require_asyncio("aroot_of")
        return await self._run(root_of_plan(state_id, self._where), state_id)

    async def atree_entries(
        self, root_id: str, *, after: str | None = None, limit: int | None = None
    ) -> tuple[TreeEntry, ...]:
        """The entries of the tree of `root_id` after `after` (see `SQLiteStore.tree_entries`).

        Raises:
            TypeError: This is not asyncio.
        """
        _require_asyncio("atree_entries")
        return await self._run(tree_entries_plan(root_id, after, limit, self._where), root_id)

    async def await_tree_entries(
        self, root_id: str, *, after: str | None = None, limit: int | None = None
    ) -> tuple[TreeEntry, ...]:
        """Wait for entries of the tree of `root_id` after `after` (see `SQLiteStore`).

        Raises:
            TypeError: This is not asyncio.
        """
        _require_asyncio("await_tree_entries")
        validate_id(root_id, "root_id")
        position_of(after)
        check_limit(limit)
        return await poll_entries(
            lambda: self.atree_entries(root_id, after=after, limit=limit),
            lambda: self._run(tree_end_plan(root_id)),
            watching=self._wakeups.watching(root_id),
        )

    # -- agent memory (`orchestrator.AsyncMemoryBackend`) ---------------------------------------

    async def amemory_get(self, agent: str, space: str, key: str) -> str | None:
        """The text stored under `key` in the agent's space, or None."""
        _require_asyncio("amemory_get")
        return await self._run(memory_get_plan(agent, space, key, self._where))

    async def amemory_scan(self, agent: str, space: str) -> builtins.list[tuple[str, str]]:
        """Every ``(key, text)`` of the agent's space, in key order."""
        _require_asyncio("amemory_scan")
        return await self._run(memory_scan_plan(agent, space, self._where))

    async def amemory_put(
        self, agent: str, space: str, key: str, data: str | None, *, effect: str | None = None
    ) -> bool:
        """Write `data` under `key` (None deletes it), once per `effect` key; whether it applied."""
        _require_asyncio("amemory_put")
        return await self._run(memory_put_plan(agent, space, key, data, effect, self._where))

    # -- sync methods: refused ----------------------------------------------------------------

    def save(self, state: State) -> NoReturn:
        """Refused: use ``await store.asave(state)``, or `SQLiteStore` from sync code."""
        _sync_refused("save")

    def save_many(self, states: Sequence[State]) -> NoReturn:
        """Refused: use ``await store.asave_many(states)``, or `SQLiteStore` from sync code."""
        _sync_refused("save_many")

    def load(self, state_id: str) -> NoReturn:
        """Refused: use ``await store.aload(state_id)``, or `SQLiteStore` from sync code."""
        _sync_refused("load")

    def list(self, *, parent_id: str | None = None, limit: int | None = None) -> NoReturn:
        """Refused: use ``await store.alist()``, or `SQLiteStore` from sync code."""
        _sync_refused("list")

    def delete(self, state_id: str) -> NoReturn:
        """Refused: use ``await store.adelete(state_id)``, or `SQLiteStore` from sync code."""
        _sync_refused("delete")

    def entries(self, state_id: str, *, after: int = -1) -> NoReturn:
        """Refused: use ``await store.aentries(state_id)``, or `SQLiteStore` from sync code."""
        _sync_refused("entries")

    def root_of(self, state_id: str) -> NoReturn:
        """Refused: use ``await store.aroot_of(state_id)``, or `SQLiteStore` from sync code."""
        _sync_refused("root_of")

    def tree_entries(
        self, root_id: str, *, after: str | None = None, limit: int | None = None
    ) -> NoReturn:
        """Refused: use ``await store.atree_entries(root_id)``, or `SQLiteStore` from sync code."""
        _sync_refused("tree_entries")

    def memory_get(self, agent: str, space: str, key: str) -> NoReturn:
        """Refused: use ``await store.amemory_get(...)``, or `SQLiteStore` from sync code."""
        _sync_refused("memory_get")

    def memory_scan(self, agent: str, space: str) -> NoReturn:
        """Refused: use ``await store.amemory_scan(...)``, or `SQLiteStore` from sync code."""
        _sync_refused("memory_scan")

    def memory_put(
        self, agent: str, space: str, key: str, data: str | None, *, effect: str | None = None
    ) -> NoReturn:
        """Refused: use ``await store.amemory_put(...)``, or `SQLiteStore` from sync code."""
        _sync_refused("memory_put")

    # -- closing ------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the connection; the store cannot be used afterwards. Closing twice is fine."""
        with anyio.CancelScope(shield=True):
            async with self._lock:
                self._closed = True
                if self._connection is not None:
                    connection, self._connection = self._connection, None
                    if self._on_collect is not None:
                        self._on_collect.detach()
                    await connection.close()

    # -- running plans ------------------------------------------------------------------------

    def _lease_statements(self) -> LeaseSql:
        return SQLITE_LEASES

    def _rate_statements(self) -> RateSql:
        return SQLITE_RATES

    def _carry_out(self, plan: Plan[_T]) -> Awaitable[_T]:
        return self._run(plan)

    async def _run(self, plan: Plan[_T], state_id: str | None = None) -> _T:
        """Carry out `plan`, one at a time; roll back if it fails.

        The plan runs shielded, so a cancellation never leaves a write half-done: it is raised
        when the plan has ended. An error of SQLite is raised as the library's
        (`stores._sql.backend_error`), naming `state_id` if the call is about one State.
        """
        try:
            await anyio.lowlevel.checkpoint_if_cancelled()
        except BaseException:
            plan.close()
            raise
        result: builtins.list[_T] = []  # set in the shielded scope, which swallows nothing
        with anyio.CancelScope(shield=True):
            async with self._lock:
                try:
                    connection = await self._connect()
                    try:
                        result.append(await _drive(plan, connection))
                    except BaseException:
                        if connection.in_transaction:
                            await connection.execute(ROLLBACK)
                        raise
                except (sqlite3.Error, OSError, UnicodeDecodeError) as error:
                    raise backend_error(self._where, error, state_id) from error
                finally:
                    plan.close()
        await anyio.lowlevel.checkpoint_if_cancelled()
        return result[0]

    async def _connect(self) -> aiosqlite.Connection:
        if self._connection is not None:
            return self._connection
        if self._closed:
            raise ValueError(
                f"{self!r} is closed: open a new AioSQLiteStore to use the file again."
            )
        await anyio.to_thread.run_sync(create_private, self._path)
        connection = await _daemon(aiosqlite.connect(self._path, isolation_level=ISOLATION_LEVEL))
        try:
            await _drive(open_plan(self._where), connection)
        except BaseException:
            await connection.close()
            raise
        self._connection = connection
        # A store dropped without `aclose` closes its connection when it is collected, as an
        # SQLiteStore does: aiosqlite's thread keeps its last call, so the connection (its
        # thread and file descriptors) would otherwise live as long as the process.
        on_collect = weakref.finalize(self, _stop, connection)
        on_collect.atexit = False  # at exit, the daemon thread ends with the process
        self._on_collect = on_collect
        return connection


def _stop(connection: aiosqlite.Connection) -> None:
    """Close an abandoned store's connection and end its thread, from any thread.

    `aiosqlite.Connection.stop` queues the close on the connection's own thread, which then
    ends; nothing waits for it, since a finalizer may run on the event loop's thread.
    """
    connection.stop()  # pyright: ignore[reportUnknownMemberType]  # an untyped Future


def _daemon(connection: aiosqlite.Connection) -> aiosqlite.Connection:
    """`connection`, not started yet, with a daemon thread, so an unclosed store exits with Python.

    aiosqlite runs each connection in a thread that is not a daemon (the Connection itself
    before aiosqlite 0.22, its `_thread` since), and Python waits for those at exit, before any
    finalizer could close the connection: a script that never closed its store would hang.
    Nothing saved is lost when the daemon thread stops with the process: a save returns once its
    transaction is committed (WAL), and an unfinished one is rolled back by the next open.
    """
    thread: object = connection
    if not isinstance(thread, threading.Thread):
        thread = getattr(connection, "_thread", None)
    if isinstance(thread, threading.Thread):
        thread.daemon = True  # awaiting the connection starts the thread
    return connection


def _drive(plan: Plan[_T], connection: aiosqlite.Connection) -> Awaitable[_T]:
    """Carry out each operation of `plan` on `connection`, with ``await``."""
    return arun_plan(plan, lambda operation: _execute(connection, operation))


async def _execute(connection: aiosqlite.Connection, operation: Operation) -> Any:
    if isinstance(operation, Query):
        if not operation.retry_busy:
            rows = await connection.execute_fetchall(operation.sql, operation.params)
            return builtins.list(rows)
        deadline = anyio.current_time() + BUSY_RETRY_SECONDS
        while True:
            try:
                rows = await connection.execute_fetchall(operation.sql, operation.params)
                return builtins.list(rows)
            except sqlite3.OperationalError as error:
                if not is_busy(error) or anyio.current_time() > deadline:
                    raise
                await anyio.sleep(BUSY_RETRY_PAUSE)
    if isinstance(operation, QueryMany):
        cursor = await connection.executemany(operation.sql, operation.rows)
        return cursor.rowcount
    assert isinstance(operation, Work)
    if operation.heavy:
        return await anyio.to_thread.run_sync(operation.func)
    return operation.func()


def _require_asyncio(method: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise TypeError(
            f"AioSQLiteStore.{method}() was called outside asyncio (under trio?): aiosqlite runs"
            " on asyncio only. Use SQLiteStore(path) instead: its async methods work on asyncio"
            " and trio, with the same file format."
        ) from None


def _sync_refused(method: str) -> NoReturn:
    raise TypeError(
        f"AioSQLiteStore works only asynchronously: use `await store.a{method}(...)` in async"
        f" code. From sync code, use SQLiteStore(path) instead (same file format)."
    )
