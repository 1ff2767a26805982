"""`SQLiteStore`: States in one SQLite file, through the standard library's `sqlite3`.

The sync methods do the work; `ThreadedAsync` gives the async twins, which run them in a worker
thread and so work on asyncio and trio. The SQL and the steps of each call are the plans of
`stores._sql`, shared with `AioSQLiteStore`, driven by `stores._plan.run_plan`.
"""

from __future__ import annotations

import builtins
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import anyio

from orchestrator import HistoryEntry, State, StateInfo, TreeEntry

from ._lease_sql import LeaseSql, SqlLeases
from ._offload import OneAtATime, ThreadedClosing
from ._plan import Operation, Plan, Query, QueryMany, Work, run_plan
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
from .backend import (
    TailCache,
    check_after,
    check_limit,
    check_state,
    poll_entries,
    validate_id,
)

_T = TypeVar("_T")

__all__ = ("SQLiteStore", "refuse_folder")


class SQLiteStore(ThreadedClosing, SqlLeases, SqlRateLimits):
    """States kept in one SQLite file: safe for many threads and several processes.

    Each save appends only the entries not stored yet, in one ``BEGIN IMMEDIATE`` transaction,
    so a turn costs a few rows however long the State grows. The file is in WAL mode (readers
    never wait for a writer) with a 10 s busy timeout, so processes that share it wait for
    each other instead of failing with "database is locked". A committed save survives a crash
    of the process.

    The methods block; `asave`, `aload`, `alist` and `adelete` run them in a worker thread,
    one call at a time, and work on asyncio and trio. `save_many` (and `asave_many`) saves
    several States in one transaction: an agent's saves made at once go out that way. Close the
    store when done: `close()` or ``with``, `aclose()` or ``async with``.

    Example:
        ```python
        with SQLiteStore("runs.db") as store:
            agent = Agent(model=model, store=store)
            agent.run(state)
            again = store.load(state.id)
        ```
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """Use the SQLite file at `path`; it is created on first use if it does not exist.

        Raises:
            ValueError: `path` is a folder.
        """
        self._path = os.fspath(path)
        refuse_folder(self._path, "SQLiteStore")
        self._where = f"SQLite store {self._path!r}"
        self._lock = threading.Lock()
        self._known = TailCache()  # what its connection stored
        self._connection: sqlite3.Connection | None = None
        self._closed = False
        self._limiters = OneAtATime()  # its worker threads: one call at a time

    def __repr__(self) -> str:
        return f"SQLiteStore({self._path!r})"

    @property
    def path(self) -> str:
        """The path of the SQLite file."""
        return self._path

    @property
    def url(self) -> str:
        """The URL `stores.open_store` opens this file with (absolute), e.g. for a runner."""
        return "sqlite:///" + urllib.parse.quote(os.path.abspath(self._path))

    # -- the Store methods --------------------------------------------------------------------

    def save(self, state: State) -> None:
        """Write the entries of `state` not stored yet and its info; bind it to this store.

        Raises:
            TypeError: `state` is not a State.
            ValueError: The store holds a different history under this id (load it instead),
                or the file has another format version.
        """
        self._run(save_plan(state, self, self._where, self._known), check_state(state).id)

    def save_many(self, states: Sequence[State]) -> dict[int, ValueError]:
        """Save each of `states` as `save` does, in one transaction; the refused, by position.

        A State the store refuses is left out and its `ValueError` returned under its position
        in `states`; the others are saved (`orchestrator.BatchStore`).

        Raises:
            TypeError: An item is not a State (nothing is saved).
            StoreError: SQLite failed: none of the States is saved.
        """
        return self._run(save_many_plan(states, self, self._where, self._known))

    async def asave_many(self, states: Sequence[State]) -> dict[int, ValueError]:
        """`save_many` in a worker thread (`orchestrator.AsyncBatchStore`)."""
        return await self._offload(self.save_many, states)

    def load(self, state_id: str) -> State:
        """The State saved under `state_id`, bound to this store.

        A turn a crash cut off is closed (see `orchestrator.Store.load`); the entries that adds are
        written by the next save.

        Raises:
            LookupError: No State has this id.
            ValueError: `state_id` is not a valid id, an entry is damaged (the message names the
                State and the entry's index), or the file has another format version.
        """
        return self._run(load_plan(state_id, self, self._where), state_id)

    def list(
        self, *, parent_id: str | None = None, limit: int | None = None
    ) -> builtins.list[StateInfo]:
        """The saved States, most recently updated first; only children of `parent_id` if set."""
        return self._run(list_plan(parent_id, limit, self._where))

    def delete(self, state_id: str) -> None:
        """Forget the State `state_id` (nothing happens if it is absent)."""
        self._run(delete_plan(state_id, self._known), state_id)

    # -- following a State (`orchestrator.Followable`, `AsyncFollowable`) -----------------------

    def entries(self, state_id: str, *, after: int = -1) -> tuple[HistoryEntry, ...]:
        """The stored entries of `state_id` after the `seq` `after`, checked as a load checks them.

        Raises:
            LookupError: No State has this id.
            ValueError: `state_id` or `after` is not valid, or an entry is damaged.
        """
        return self._run(entries_plan(state_id, after, self._where), state_id)

    async def aentries(self, state_id: str, *, after: int = -1) -> tuple[HistoryEntry, ...]:
        """`entries` in a worker thread."""
        return await self._offload(self._entries, state_id, after)

    def _entries(self, state_id: str, after: int) -> tuple[HistoryEntry, ...]:
        return self.entries(state_id, after=after)

    async def await_entries(self, state_id: str, *, after: int = -1) -> tuple[HistoryEntry, ...]:
        """Wait for entries of `state_id` after `after`, and return them (see `AsyncFollowable`).

        Another process's commits are seen by polling the State's entry count, at
        `stores.backend.POLL_FIRST` to `POLL_MOST` intervals; a cancellation ends the wait at once.
        """
        validate_id(state_id, "state_id")
        check_after(after)
        return await poll_entries(
            lambda: self.aentries(state_id, after=after),
            lambda: self._offload(self._run, count_plan(state_id)),
        )

    # -- following a tree (`orchestrator.TreeFollowable`, `AsyncTreeFollowable`) ---------------

    def root_of(self, state_id: str) -> str:
        """The id of the root of the tree of the stored State `state_id`.

        Raises:
            LookupError: No State has this id.
            ValueError: `state_id` is not a valid id.
        """
        return self._run(root_of_plan(state_id, self._where), state_id)

    async def aroot_of(self, state_id: str) -> str:
        """`root_of` in a worker thread."""
        return await self._offload(self.root_of, state_id)

    def tree_entries(
        self, root_id: str, *, after: str | None = None, limit: int | None = None
    ) -> tuple[TreeEntry, ...]:
        """The entries of the tree of `root_id` after the cursor `after`, in the order saved.

        The cursor is the entry's position in the file's entries table: positions grow as
        saves commit (one writer at a time) and are never given twice.

        Raises:
            LookupError: No State `root_id` is stored.
            ValueError: `root_id` is not a root, or `after` or `limit` is not valid.
            StoreDamagedError: An entry is damaged (the message names the State and index).
        """
        return self._run(tree_entries_plan(root_id, after, limit, self._where), root_id)

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

        Another process's commits are seen by polling the tree's last position (one lookup in
        an index), at `stores.backend.POLL_FIRST` to `POLL_MOST` intervals; a cancellation
        ends the wait at once.
        """
        validate_id(root_id, "root_id")
        position_of(after)
        check_limit(limit)
        return await poll_entries(
            lambda: self.atree_entries(root_id, after=after, limit=limit),
            lambda: self._offload(self._run, tree_end_plan(root_id)),
        )

    # -- agent memory (`orchestrator.MemoryBackend`) --------------------------------------------

    def memory_get(self, agent: str, space: str, key: str) -> str | None:
        """The text stored under `key` in the agent's space, or None."""
        return self._run(memory_get_plan(agent, space, key, self._where))

    def memory_scan(self, agent: str, space: str) -> builtins.list[tuple[str, str]]:
        """Every ``(key, text)`` of the agent's space, in key order."""
        return self._run(memory_scan_plan(agent, space, self._where))

    def memory_put(
        self, agent: str, space: str, key: str, data: str | None, *, effect: str | None = None
    ) -> bool:
        """Write `data` under `key` (None deletes it), once per `effect` key; whether it applied."""
        return self._run(memory_put_plan(agent, space, key, data, effect, self._where))

    # -- closing ------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection; the store cannot be used afterwards. Closing twice is fine."""
        with self._lock:
            self._closed = True
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    # -- running plans ------------------------------------------------------------------------

    def _offload_limiter(self) -> anyio.CapacityLimiter:
        return self._limiters.current()

    def _run(self, plan: Plan[Any], state_id: str | None = None) -> Any:
        """Carry out `plan` on the connection, holding the lock; roll back if it fails.

        An error of SQLite is raised as the library's (`stores._sql.backend_error`), naming
        `state_id` if the call is about one State.
        """
        with self._lock:
            try:
                connection = self._connect()
                try:
                    return run_plan(plan, lambda operation: _execute(connection, operation))
                except BaseException:
                    if connection.in_transaction:
                        connection.execute(ROLLBACK)
                    raise
            except (sqlite3.Error, OSError, UnicodeDecodeError) as error:
                raise backend_error(self._where, error, state_id) from error
            finally:
                plan.close()

    def _lease_statements(self) -> LeaseSql:
        return SQLITE_LEASES

    def _rate_statements(self) -> RateSql:
        return SQLITE_RATES

    def _carry_out(self, plan: Plan[_T]) -> Awaitable[_T]:
        return self._offload(self._run, plan)

    def _connect(self) -> sqlite3.Connection:
        if self._connection is not None:
            return self._connection
        if self._closed:
            raise ValueError(f"{self!r} is closed: open a new SQLiteStore to use the file again.")
        create_private(self._path)
        connection = sqlite3.connect(
            self._path, isolation_level=ISOLATION_LEVEL, check_same_thread=False
        )
        try:
            run_plan(open_plan(self._where), lambda operation: _execute(connection, operation))
        except BaseException:
            connection.close()
            raise
        self._connection = connection
        return connection


def refuse_folder(path: str, store: str) -> None:
    """Refuse a folder where an SQLite file is wanted: said when the store is made, not at use.

    Raises:
        ValueError: `path` is a folder; the message names a file in it, and `FileStore`.
    """
    if os.path.isdir(path):
        raise ValueError(
            f"{store} takes the path of an SQLite file, and {path!r} is a folder: give a file"
            f" in it, such as {os.path.join(path, 'runs.db')!r}, or use FileStore({path!r}) to"
            " keep States as files in that folder."
        )


def _execute(connection: sqlite3.Connection, operation: Operation) -> Any:
    if isinstance(operation, Query):
        if not operation.retry_busy:
            return connection.execute(operation.sql, operation.params).fetchall()
        deadline = time.monotonic() + BUSY_RETRY_SECONDS
        while True:
            try:
                return connection.execute(operation.sql, operation.params).fetchall()
            except sqlite3.OperationalError as error:
                if not is_busy(error) or time.monotonic() > deadline:
                    raise
                time.sleep(BUSY_RETRY_PAUSE)
    if isinstance(operation, QueryMany):
        return connection.executemany(operation.sql, operation.rows).rowcount
    assert isinstance(operation, Work)
    return operation.func()
