"""`SQLiteStore`: States in one SQLite file, through the standard library's `sqlite3`.

The sync methods do the work; `ThreadedAsync` gives the async twins, which run them in a worker
thread and so work on asyncio and trio. The SQL and the steps of each call are the plans of
`stores._sql`, shared with `AioSQLiteStore`, driven by `stores._plan.run_plan`.
"""

from __future__ import annotations

import builtins
import functools
import os
import sqlite3
import threading
import time
import urllib.parse
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import anyio

from orchestrator import HistoryEntry, State, StateInfo, TreeEntry

from ._checkpointer import Checkpointer
from ._lease_sql import LeaseSql, SqlLeases
from ._offload import OneAtATime, ThreadedClosing
from ._plan import Operation, Plan, Query, QueryMany, Work, run_plan
from ._rate_sql import RateSql, SqlRateLimits
from ._sql import (
    BUSY_RETRY_PAUSE,
    BUSY_RETRY_SECONDS,
    CHECKPOINT,
    CHECKPOINT_FRAMES,
    COMMIT,
    FORMAT_KEY,
    ISOLATION_LEVEL,
    RESTART_LOG,
    ROLLBACK,
    SET_BUSY_TIMEOUT,
    SET_NO_AUTOCHECKPOINT,
    SET_NO_BUSY_WAIT,
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
from ._wal import WalIndex
from .backend import (
    TailCache,
    Wakeups,
    check_after,
    check_limit,
    check_state,
    poll_entries,
    validate_id,
)

_T = TypeVar("_T")

NOWAIT_STATES = 16
"""The most States `save_many_nowait` writes on the event loop; a larger batch goes to a thread."""

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
        # the followers in this process of any store on this file, woken by saves here
        self._wakeups = Wakeups.shared(self.url)
        self._connection: sqlite3.Connection | None = None
        self._wal: WalIndex | None = None  # its log's index, once connected (None: unreadable)
        self._no_busy_wait = False  # its connection's busy timeout is 0 (set by a loop commit)
        self._closed = False
        self._limiters = OneAtATime()  # its worker threads: one call at a time
        # Copies the log back into the file in a thread of its own, so no save waits for it.
        self._checkpointer = Checkpointer(self._path, self._finish_checkpoint)
        weakref.finalize(self, self._checkpointer.close, join=False)

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
        self._wakeups.saved(((state.id, state.parent_id),))

    def save_many(self, states: Sequence[State]) -> dict[int, ValueError]:
        """Save each of `states` as `save` does, in one transaction; the refused, by position.

        A State the store refuses is left out and its `ValueError` returned under its position
        in `states`; the others are saved (`orchestrator.BatchStore`).

        Raises:
            TypeError: An item is not a State (nothing is saved).
            StoreError: SQLite failed: none of the States is saved.
        """
        refused = self._run(save_many_plan(states, self, self._where, self._known))
        self._wakeups.saved((state.id, state.parent_id) for state in states)
        return refused

    async def asave_many(self, states: Sequence[State]) -> dict[int, ValueError]:
        """`save_many` in a worker thread (`orchestrator.AsyncBatchStore`)."""
        return await self._offload(self.save_many, states)

    def save_many_nowait(self, states: Sequence[State]) -> dict[int, ValueError] | None:
        """`save_many`, if it can run now without waiting; None, with nothing written, if not.

        The core tries it on the event loop before it sends the batch to a worker thread
        (`stores.backend.NowaitBatchStore`). It writes only when nothing can make it wait: the
        batch is small (at most `NOWAIT_STATES` States, few entries), no thread of this store
        is using the connection, the file's write lock is free at once (another process
        holding it gives None, never a busy wait), and the commit only appends to the
        write-ahead log, which ``synchronous = NORMAL`` does not fsync (the log is not
        starting again, which syncs its header; checkpoints run in the store's checkpointer).
        Like `save_many`, it wakes this process's followers of the States it wrote.

        Raises:
            TypeError: An item is not a State (nothing is saved).
            StoreError: SQLite failed: none of the States is saved.
        """
        if len(states) > NOWAIT_STATES or not self._lock.acquire(blocking=False):
            return None
        try:
            connection, wal = self._connection, self._wal
            if connection is None or wal is None:
                return None
            # The log is checked once, at the commit (`_Nowait`), with the write lock held: a
            # save that finds a checkpoint due there is rolled back and goes to the thread.
            plan = save_many_plan(states, self, self._where, self._known)
            try:
                refused = self._drive(plan, None, nowait=wal)
            except _WouldWait:
                return None
            except sqlite3.Error as error:
                raise backend_error(self._where, error, None) from error
            finally:
                plan.close()
        finally:
            self._lock.release()
        self._wakeups.saved((state.id, state.parent_id) for state in states)
        return refused

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
            watching=self._wakeups.watching(state_id),
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
            watching=self._wakeups.watching(root_id),
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
        """Close the connection; the store cannot be used afterwards. Closing twice is fine.

        Its checkpointer's thread, if it started, is stopped first and joined.
        """
        self._checkpointer.close()  # without the lock: its pass may be waiting for it
        with self._lock:
            self._closed = True
            self._no_busy_wait = False
            if self._connection is not None:
                self._connection.close()
                self._connection = None
            if self._wal is not None:
                self._wal.close()
                self._wal = None

    # -- running plans ------------------------------------------------------------------------

    def _offload_limiter(self) -> anyio.CapacityLimiter:
        return self._limiters.current()

    def _run(self, plan: Plan[Any], state_id: str | None = None) -> Any:
        """Carry out `plan` on the connection, holding the lock; roll back if it fails.

        An error of SQLite is raised as the library's (`stores._sql.backend_error`), naming
        `state_id` if the call is about one State.
        """
        with self._lock:
            return self._drive(plan, state_id, nowait=None)

    def _drive(self, plan: Plan[_T], state_id: str | None, *, nowait: WalIndex | None) -> _T:
        """`_run`, the lock held; with `nowait`, `_WouldWait` where a step could wait.

        A plan that wrote wakes the checkpointer if the log is `CHECKPOINT_FRAMES` long: where
        SQLite's automatic checkpoint would run, after a commit, but in a thread of its own.

        With `nowait` the connection's busy timeout is 0, else `BUSY_TIMEOUT_MS`; each is set
        only when the other was, so saves in a row on the loop set nothing.
        """
        try:
            connection = self._connect()
            if (nowait is not None) != self._no_busy_wait:
                connection.execute(SET_NO_BUSY_WAIT if nowait is not None else SET_BUSY_TIMEOUT)
                self._no_busy_wait = nowait is not None
            if nowait is None:
                execute: Callable[[Operation], Any] = functools.partial(_execute, connection)
            else:
                execute = _Nowait(connection, nowait)
            changes = connection.total_changes
            try:
                result = run_plan(plan, execute)
            except BaseException:
                if connection.in_transaction:
                    connection.execute(ROLLBACK)
                raise
            wal = self._wal
            if wal is not None and connection.total_changes != changes:
                frames = wal.frames()
                if frames is not None and frames[0] >= CHECKPOINT_FRAMES:
                    self._checkpointer.wake()
            return result
        except (sqlite3.Error, OSError, UnicodeDecodeError) as error:
            raise backend_error(self._where, error, state_id) from error
        finally:
            plan.close()

    def _finish_checkpoint(self) -> None:
        """End a pass of the checkpointer: copy the rest of the log, then start it again.

        It runs in the checkpointer's thread, holding the lock: no save of this store commits
        meanwhile (one on the event loop finds the lock taken and goes to a worker thread), so
        the copy catches up with the log. A commit that changes no data (the format row
        replaced by itself) then starts the log again and syncs its new header, here: a save on the
        loop then finds a log it only appends to. Another process reading or writing the file
        can keep the log from being all copied; it is then left as it is, started again later.
        """
        with self._lock:
            connection, wal = self._connection, self._wal
            if connection is None or wal is None:
                return
            frames = wal.frames()
            if frames is None or frames[0] < CHECKPOINT_FRAMES:
                return  # started again since the checkpointer was woken
            connection.execute(CHECKPOINT).fetchall()
            frames = wal.frames()
            if frames is None or frames[1] < frames[0]:
                return
            if not self._no_busy_wait:  # never wait for another process's lock here
                connection.execute(SET_NO_BUSY_WAIT)
                self._no_busy_wait = True
            try:
                connection.execute(RESTART_LOG, (FORMAT_KEY,))
                connection.execute(COMMIT)
            except sqlite3.OperationalError as error:
                if connection.in_transaction:
                    connection.execute(ROLLBACK)
                if not is_busy(error):
                    raise

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
            self._wal = _wal_index(connection, self._path)
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


def _wal_index(connection: sqlite3.Connection, path: str) -> WalIndex | None:
    """The index of the file's log, with automatic checkpoints off; None if it cannot be read.

    Without a readable index nothing can tell that a commit will not sync, so no save runs on
    the event loop and SQLite keeps checkpointing by itself.
    """
    try:
        wal = WalIndex(path)
    except OSError:
        return None
    if wal.frames() is None:
        wal.close()
        return None
    connection.execute(SET_NO_AUTOCHECKPOINT)
    return wal


def _appends(wal: WalIndex) -> bool:
    """Whether a commit now only appends to the log, with no sync.

    The log must hold frames not all copied back: else it starts again, and syncs its header.
    No checkpoint runs inside a commit (automatic ones are off; see `_checkpointer`).
    """
    frames = wal.frames()
    return frames is not None and frames[1] < frames[0]


class _WouldWait(Exception):
    """A save on the event loop would have to wait: it is rolled back and goes to a thread."""


class _Nowait:
    """`_execute` for a save on the event loop: any step that could wait raises `_WouldWait`.

    Those are: SQLite answering "database is locked" (another connection holds the write lock;
    the busy timeout is 0), heavy work meant for a thread, and a commit that would not only
    append to the log (checked with the write lock held, so no other writer moves the log).
    """

    __slots__ = ("_connection", "_wal")

    def __init__(self, connection: sqlite3.Connection, wal: WalIndex) -> None:
        self._connection = connection
        self._wal = wal

    def __call__(self, operation: Operation) -> Any:
        if isinstance(operation, Work) and operation.heavy:
            raise _WouldWait
        if isinstance(operation, Query) and (
            operation.retry_busy or (operation.sql == COMMIT and not _appends(self._wal))
        ):
            raise _WouldWait
        try:
            return _execute(self._connection, operation)
        except sqlite3.OperationalError as error:
            if is_busy(error):
                raise _WouldWait from None
            raise
