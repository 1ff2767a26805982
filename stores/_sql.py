"""The SQL of both SQLite backends, written once: schema, statements, plans and row mapping.

`SQLiteStore` (sqlite3, sync) and `AioSQLiteStore` (aiosqlite, async) run the same *plans*
(`stores._plan`: generators of operations, driven by `run_plan` and `arun_plan`, with the steps
shared with PostgreSQL: what a save writes, a load). No SQLite SQL literal lives outside this
module.

The tables::

    meta     (key, value)           the format version, under 'format_version'
    states   (id, parent_id, ..., entries, head, seal, root_id)   one row per State: what
                                    `list` returns, its entry count, the digest of its last
                                    entry, the seal of its listed values (checked by `list`)
                                    and the root of its tree (fixed at its first save)
    entries  (position, state_id, seq, data, digest, root_id)   one row per history entry:
                                    its place in the feed, the JSON of `encode_entry`, its
                                    digest chained with the one before, its State's root
    memory   (agent, space, key, value)   agent memory: JSON text per key (`MemoryBackend`)
    memory_effects (agent, effect, at)    the effect keys of the memory writes applied

The memory tables are made when a connection opens (``IF NOT EXISTS``), so a file written
before they existed gains them. A file of format 1 (no digests) is migrated when a connection
opens it: the two digest columns are added and filled, in one transaction. A file that has
them already says format 1 only because its format was set back: it is refused as damaged.
A file of format 2 (no feeds) is migrated the same way: each State gets its root, and the
entries table is made again with its positions (the old rowids, so in the order they were
written) and roots.

The feed of a tree (`orchestrator.TreeFollowable`) is the entries of its States in `position`
order. Positions are given as rows are inserted, and one connection writes at a time, so they
grow in the order saves commit: a reader never finds a new row below a position it has read.
A position is never given twice: deleting the newest State must not let the next save reuse
positions a follower passed, so a delete that takes the last positions leaves a row without a
State at the last one (`KEEP_POSITION`; ``AUTOINCREMENT`` did this before format 4, at the cost
of a page written by every save). As the table's ``INTEGER PRIMARY KEY`` a ``VACUUM`` keeps
them too. `entries_by_root` finds a tree's rows after a position without reading the others.
A file of format 3 is marked 4 when it opens, its table as it is (`FORMAT`).

A memory write with an effect key inserts the key in the same transaction as the write, and
writes nothing if the key is there already.

A write runs in ``BEGIN IMMEDIATE``, so it takes the write lock before it reads and never has
to upgrade a read lock (the upgrade is what fails with "database is locked" under load).
Connections are opened with `ISOLATION_LEVEL`, so that sqlite3 itself issues that
``BEGIN IMMEDIATE`` before a write made outside a transaction: a save whose first statement
is a write then begins its transaction with that statement, in one call (see `save_many_plan`).
Every other write runs after an explicit ``BEGIN``, so the setting changes nothing for it.
"""

from __future__ import annotations

import itertools
import json
import os
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from orchestrator import HistoryEntry, State, StateInfo, StoreDamagedError, StoreError, TreeEntry

from ._codec import (
    DIGEST_SIZE,
    FORMAT_V1,
    FORMAT_V2,
    FORMAT_VERSION,
    chain_digests,
    check_format,
    damaged,
    first_digest,
    listing_seal,
)
from ._lease_sql import LeaseSql
from ._plan import (
    EPOCH,
    HEAVY_ENTRIES,
    MICROSECOND,
    STOPPED,
    UNSEALED,
    USAGE,
    ListChildren,
    Plan,
    Query,
    QueryMany,
    Read,
    Row,
    Work,
    Write,
    bind_written,
    checked_history,
    entry_columns,
    json_of,
    micros,
    not_found,
    plan_writes,
    stopped_json,
    usage_json,
)
from ._plan import entries_plan as entries_of
from ._plan import load_plan as load_state
from ._rate_sql import RateSql
from .backend import (
    StorageView,
    Tail,
    TailCache,
    bad_cursor,
    check_limit,
    check_link,
    check_list_args,
    check_memory,
    check_state,
    cursor_parts,
    make_cursor,
    not_a_root,
    root_from,
    storage_view,
    validate_id,
)

__all__ = (
    "BUSY_RETRY_PAUSE",
    "BUSY_RETRY_SECONDS",
    "BUSY_TIMEOUT_MS",
    "CHECKPOINT",
    "CHECKPOINT_FRAMES",
    "COMMIT",
    "FORMAT",
    "FORMAT_KEY",
    "ISOLATION_LEVEL",
    "RESTART_LOG",
    "ROLLBACK",
    "SET_BUSY_TIMEOUT",
    "SET_NO_AUTOCHECKPOINT",
    "SET_NO_BUSY_WAIT",
    "SET_SYNCHRONOUS",
    "SQLITE_LEASES",
    "SQLITE_LEASE_TABLE",
    "SQLITE_RATES",
    "SQLITE_RATE_TABLE",
    "SQLITE_SLOT_TABLE",
    "backend_error",
    "count_plan",
    "create_private",
    "delete_plan",
    "entries_plan",
    "is_busy",
    "list_plan",
    "load_plan",
    "memory_get_plan",
    "memory_put_plan",
    "memory_scan_plan",
    "open_plan",
    "position_of",
    "root_of_plan",
    "roots_of_links",
    "save_many_plan",
    "save_plan",
    "tree_end_plan",
    "tree_entries_plan",
)

_T = TypeVar("_T")

BUSY_TIMEOUT_MS = 10_000
"""How long a write waits for another connection's write lock before it fails."""

# -- connection settings (run outside a transaction) ------------------------------------------

ISOLATION_LEVEL = "IMMEDIATE"
"""The `isolation_level` both SQLite backends connect with (sqlite3's legacy transaction control).

sqlite3 then runs ``BEGIN IMMEDIATE`` itself before an INSERT, UPDATE, DELETE or REPLACE made
outside a transaction, in the same call as the statement: the save of known ends relies on it
to begin its transaction and write in one hop of aiosqlite's thread. A connection without it
(``None``: autocommit) would commit that first statement alone.
"""

SET_BUSY_TIMEOUT = f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}"
SET_WAL = "PRAGMA journal_mode = WAL"
# NORMAL in WAL mode: a committed save survives a crash of the process; a power cut may lose
# the last saves but never damages the file.
SET_SYNCHRONOUS = "PRAGMA synchronous = NORMAL"

# A commit on the event loop (`SQLiteStore.save_many_nowait`) must never wait: it tries the
# write lock once (no busy wait), and no checkpoint runs inside a commit (`SQLiteStore` turns
# automatic checkpoints off and runs them in its checkpointer's thread, `stores._checkpointer`,
# once the log holds `CHECKPOINT_FRAMES` frames: when SQLite's automatic one would).
SET_NO_BUSY_WAIT = "PRAGMA busy_timeout = 0"
SET_NO_AUTOCHECKPOINT = "PRAGMA wal_autocheckpoint = 0"
CHECKPOINT = "PRAGMA wal_checkpoint(PASSIVE)"
CHECKPOINT_FRAMES = 1000
"""SQLite's default automatic checkpoint: a log this long is copied back into the file."""
# A write that changes no data: the format row replaced by itself (an UPDATE that changes
# nothing writes no page; a REPLACE deletes the row and inserts it again). After a checkpoint
# copied the whole log back, it starts the log again, and syncs its header, where it runs.
RESTART_LOG = "INSERT OR REPLACE INTO meta (key, value) SELECT key, value FROM meta WHERE key = ?"


# -- transactions ----------------------------------------------------------------------------

BEGIN_READ = "BEGIN"
BEGIN_WRITE = "BEGIN IMMEDIATE"
# Changes exactly when another connection committed to the file since this one last asked.
DATA_VERSION = "PRAGMA data_version"
COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"

# -- schema ----------------------------------------------------------------------------------

FORMAT_KEY = "format_version"
FORMAT = 4
"""The format of an SQLite store file: 4 since a position is the rowid alone (no AUTOINCREMENT).

Its entries are those of `stores.FORMAT_VERSION` (3). A file of format 3 kept its positions with
``AUTOINCREMENT``, which writes the ``sqlite_sequence`` row on every save (a page of the log
each time): it is read as is and marked 4 when it opens (`_migrate_v3`); code that wrote format
3 refuses a file of format 4, whose deletes it would not keep positions for.
"""
TABLES = "SELECT name FROM sqlite_master WHERE type = 'table'"
ENTRIES_TABLE = (
    # Rows go in the order they are written, and an index finds a State's: many States
    # saving at once then append to a few pages, where keying the rows by (state_id, seq)
    # would touch a page per State (about 3x the time per row, measured with 1,000 States).
    """
    CREATE TABLE entries (
        position INTEGER PRIMARY KEY,
        state_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        data BLOB NOT NULL,
        digest BLOB,
        root_id TEXT NOT NULL
    )
    """,
    "CREATE UNIQUE INDEX entries_by_state ON entries (state_id, seq)",
    # A tree's rows by position (the rowid ends every index).
    "CREATE INDEX entries_by_root ON entries (root_id)",
)
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value)",
    # Times are integer microseconds since 1970 (UTC), so they sort and compare exactly.
    """
    CREATE TABLE IF NOT EXISTS states (
        id TEXT PRIMARY KEY NOT NULL,
        parent_id TEXT,
        parent_call_id TEXT,
        title TEXT NOT NULL,
        created_at INTEGER,
        updated_at INTEGER,
        turn INTEGER NOT NULL,
        finished INTEGER NOT NULL,
        stopped TEXT,
        usage TEXT NOT NULL,
        entries INTEGER NOT NULL,
        head BLOB,
        seal BLOB,
        root_id TEXT
    )
    """,
    # The order of `list`: most recently updated first, ties by id.
    "CREATE INDEX IF NOT EXISTS states_by_update ON states (updated_at DESC, id)",
    *ENTRIES_TABLE,
)
# A parent's children in the order of `list`. Partial: a State without a parent has no row in
# it, so a root's save (which moves its `updated_at`) writes no page of it; 7 pages a save, not
# 8. A file made before it had `states_by_parent` over every row: replaced when it opens.
PARENT_INDEX = (
    "DROP INDEX IF EXISTS states_by_parent",
    "CREATE INDEX IF NOT EXISTS states_with_parent ON states (parent_id, updated_at DESC, id)"
    " WHERE parent_id IS NOT NULL",
)
MEMORY_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS memory (
        agent TEXT NOT NULL,
        space TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        PRIMARY KEY (agent, space, key)
    ) WITHOUT ROWID
    """,
    # `at` (microseconds since 1970, UTC) lets old keys be pruned one day.
    """
    CREATE TABLE IF NOT EXISTS memory_effects (
        agent TEXT NOT NULL,
        effect TEXT NOT NULL,
        at INTEGER NOT NULL,
        PRIMARY KEY (agent, effect)
    ) WITHOUT ROWID
    """,
)
SET_FORMAT = "INSERT INTO meta (key, value) VALUES (?, ?)"
GET_FORMAT = "SELECT value FROM meta WHERE key = ?"
UPDATE_FORMAT = "UPDATE meta SET value = ? WHERE key = ?"
# Format 1 to 2: the digest columns, filled State by State.
MIGRATE_V1 = (
    "ALTER TABLE entries ADD COLUMN digest BLOB",
    "ALTER TABLE states ADD COLUMN head BLOB",
)
ADD_SEAL = "ALTER TABLE states ADD COLUMN seal BLOB"
# Format 2 to 3: each State's root, then the entries table made again with positions and roots.
ADD_ROOT = "ALTER TABLE states ADD COLUMN root_id TEXT"
STATE_PARENTS = "SELECT id, parent_id FROM states"
SET_ROOT = "UPDATE states SET root_id = ? WHERE id = ?"
MIGRATE_V2 = (
    "ALTER TABLE entries RENAME TO entries_v2",
    "DROP INDEX entries_by_state",
    *ENTRIES_TABLE,
    # The old rowids are the order the rows were written in (reused after a delete, but no
    # follower has read them): kept as positions. Entries without a states row keep their own.
    """
    INSERT INTO entries (position, state_id, seq, data, digest, root_id)
    SELECT e.rowid, e.state_id, e.seq, e.data, e.digest,
        coalesce((SELECT s.root_id FROM states AS s WHERE s.id = e.state_id), e.state_id)
    FROM entries_v2 AS e ORDER BY e.rowid
    """,
    "DROP TABLE entries_v2",
)
STATE_COLUMNS = "PRAGMA table_info(states)"
ENTRY_COLUMNS = "PRAGMA table_info(entries)"  # (cid, name, type, notnull, default, pk) each
STATE_IDS = "SELECT id FROM states"
ENTRIES_BY_SEQ = "SELECT seq, data FROM entries WHERE state_id = ? ORDER BY seq"
SET_DIGEST = "UPDATE entries SET digest = ? WHERE state_id = ? AND seq = ?"
SET_HEAD = "UPDATE states SET head = ?, seal = ? WHERE id = ?"

# -- statements ------------------------------------------------------------------------------

LAST_ENTRY = "SELECT seq, data, digest FROM entries WHERE state_id = ? ORDER BY seq DESC LIMIT 1"
_IDS_PER_QUERY = 500  # under SQLite's oldest limit of 999 parameters


def having_entries(count: int) -> str:
    """The query of which of `count` State ids have entries."""
    marks = ", ".join("?" * count)
    return f"SELECT DISTINCT state_id FROM entries WHERE state_id IN ({marks})"


# The root comes from the State's row, written first in the same transaction (one lookup of
# the primary key per entry).
INSERT_ENTRY = """
    INSERT INTO entries (state_id, seq, data, digest, root_id)
    VALUES (?1, ?2, ?3, ?4, (SELECT root_id FROM states WHERE id = ?1))
"""
# REPLACE, not an upsert: as fast here (5.2 against 5.1 us a row), and it works with SQLite
# older than 3.24, which some Pythons still link.
# The root is kept once set; a new State takes its stored parent's (`stores.backend.root_from`:
# ?14 is the State whose root it takes, ?15 its own id if there is none). The values are read
# before the old row is replaced.
PUT_STATE = """
    INSERT OR REPLACE INTO states (
        id, parent_id, parent_call_id, title, created_at, updated_at, turn, finished, stopped,
        usage, entries, head, seal, root_id
    ) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, coalesce(
        (SELECT root_id FROM states WHERE id = ?1),
        (SELECT coalesce(root_id, id) FROM states WHERE id = ?14),
        ?15
    ))
"""
# A State's states row, changed only if no other connection committed since `DATA_VERSION`
# read the last parameter (a commit of this connection leaves the version as it was); the
# parameters are the row's, id last, then the version. The version cannot move while this
# connection holds the write lock, so the rows of one executemany pass or fail together. An
# UPDATE, not a REPLACE: changed in place, a save of 3 entries took no more CPU time than
# with the REPLACE (68 against 70 us, measured); a row that is gone is left to the read path.
# (The pragma as a table-valued function: SQLite 3.16 or later.)
UPDATE_STATE_IF_VERSION = """
    UPDATE states SET
        parent_id = ?, parent_call_id = ?, title = ?, created_at = ?, updated_at = ?, turn = ?,
        finished = ?, stopped = ?, usage = ?, entries = ?, head = ?, seal = ?
    WHERE id = ? AND (SELECT data_version FROM pragma_data_version) = ?
"""
COUNT_ENTRIES = "SELECT entries, head FROM states WHERE id = ?"
ENTRIES = "SELECT data, digest FROM entries WHERE state_id = ? ORDER BY seq"
ANY_ENTRY = "SELECT 1 FROM entries WHERE state_id = ? LIMIT 1"
_INFO_COLUMNS = (
    "id, parent_id, parent_call_id, title, created_at, updated_at, turn, finished, stopped,"
    " usage, entries"
)
LISTING = f"SELECT {_INFO_COLUMNS}, head FROM states WHERE id = ?"
LIST_ALL = f"SELECT {_INFO_COLUMNS}, head, seal FROM states ORDER BY updated_at DESC, id LIMIT ?"
LIST_CHILDREN = (
    f"SELECT {_INFO_COLUMNS}, head, seal FROM states WHERE parent_id = ?"
    " ORDER BY updated_at DESC, id LIMIT ?"
)
DELETE_ENTRIES = "DELETE FROM entries WHERE state_id = ?"
MEMORY_GET = "SELECT value FROM memory WHERE agent = ? AND space = ? AND key = ?"
# BINARY collation compares UTF-8 bytes: the order of code points, as Python sorts str.
MEMORY_SCAN = "SELECT key, value FROM memory WHERE agent = ? AND space = ? ORDER BY key"
MEMORY_SET = "INSERT OR REPLACE INTO memory (agent, space, key, value) VALUES (?, ?, ?, ?)"
MEMORY_DELETE = "DELETE FROM memory WHERE agent = ? AND space = ? AND key = ?"
EFFECT_SEEN = "SELECT 1 FROM memory_effects WHERE agent = ? AND effect = ?"
EFFECT_ADD = "INSERT INTO memory_effects (agent, effect, at) VALUES (?, ?, ?)"
DELETE_STATE = "DELETE FROM states WHERE id = ?"
ROOT_OF = "SELECT root_id FROM states WHERE id = ?"
# A page of a tree's feed; each row with the stored digest before it, to check its link.
TREE_ENTRIES = """
    SELECT e.position, e.state_id, e.seq, e.data, e.digest,
        (SELECT p.digest FROM entries AS p WHERE p.state_id = e.state_id AND p.seq = e.seq - 1)
    FROM entries AS e WHERE e.root_id = ? AND e.position > ? ORDER BY e.position LIMIT ?
"""
TREE_END = "SELECT max(position) FROM entries WHERE root_id = ?"
LAST_POSITION = "SELECT max(position) FROM entries"
# A rowid is one more than the largest in the table: a delete that takes the largest positions
# leaves a row with no State (id '', never valid) at the last one, so none is given again. One
# such row at most: a later one replaces it (the unique index on (state_id, seq)).
KEEP_POSITION = """
    INSERT OR REPLACE INTO entries (position, state_id, seq, data, digest, root_id)
    SELECT ?1, '', 0, x'', NULL, '' WHERE ?1 > coalesce((SELECT max(position) FROM entries), 0)
"""
# Format 3 to 4: the position `sqlite_sequence` kept, if a delete took the rows up to it.
KEEP_SEQUENCE = """
    INSERT INTO entries (position, state_id, seq, data, digest, root_id)
    SELECT seq, '', 0, x'', NULL, '' FROM sqlite_sequence
    WHERE name = 'entries' AND seq > coalesce((SELECT max(position) FROM entries), 0)
"""

# -- retrying a busy query ------------------------------------------------------------------

# How long a driver retries a `retry_busy` query, and how long it waits between tries.
BUSY_RETRY_SECONDS = BUSY_TIMEOUT_MS / 1000
BUSY_RETRY_PAUSE = 0.005


def is_busy(error: BaseException) -> bool:
    """Whether `error` is SQLite's "database is locked" (another connection holds the lock)."""
    return "database is locked" in str(error)


# -- plans ----------------------------------------------------------------------------------


def open_plan(where: str) -> Plan[None]:
    """Set the connection up, create the schema in a new file, and check the format version.

    Raises:
        ValueError: The file holds another format version (both are named), or it is a database
            of something else.
    """
    yield Query(SET_BUSY_TIMEOUT)
    yield Query(SET_WAL, retry_busy=True)
    yield Query(SET_SYNCHRONOUS)
    yield Query(BEGIN_WRITE)
    rows: list[Row] = yield Query(TABLES)
    tables = {row[0] for row in rows}
    if "meta" in tables:
        found: list[Row] = yield Query(GET_FORMAT, (FORMAT_KEY,))
        version = check_format(
            found[0][0] if found else None,
            where=where,
            current=FORMAT,
            readable=(FORMAT_V1, FORMAT_V2, FORMAT_VERSION),
        )
        if version == FORMAT_V1:
            yield from _migrate_v1(where)
        else:
            yield from _add_seals()
        if version in (FORMAT_V1, FORMAT_V2):
            yield from _migrate_v2(where)
        elif version == FORMAT_VERSION:
            yield from _migrate_v3("sqlite_sequence" in tables)
    elif tables:
        shown = ", ".join(sorted(tables)[:5])
        raise ValueError(
            f"{where} is an SQLite database of something else (its tables: {shown}): give the"
            " path of a store file, or of a file that does not exist yet."
        )
    else:
        for statement in SCHEMA:
            yield Query(statement)
        yield Query(SET_FORMAT, (FORMAT_KEY, FORMAT))
    for statement in (*PARENT_INDEX, *MEMORY_SCHEMA):
        yield Query(statement)
    yield Query(SQLITE_LEASE_TABLE)
    yield Query(SQLITE_RATE_TABLE)
    yield Query(SQLITE_SLOT_TABLE)
    yield Query(COMMIT)


def _check_format(where: str) -> Plan[None]:
    rows: list[Row] = yield Query(GET_FORMAT, (FORMAT_KEY,))
    check_format(rows[0][0] if rows else None, where=where, current=FORMAT)


def _migrate_v1(where: str) -> Plan[None]:
    """Give a file of format 1 its digests (in the transaction that opens it).

    Raises:
        StoreDamagedError: The file has its digest columns already: it was written in format 2
            or later and its format was set back (which would turn the digests off).
    """
    columns: list[Row] = yield Query(ENTRY_COLUMNS)
    if any(row[1] == "digest" for row in columns):
        raise StoreDamagedError(
            f"{where} says it is of format {FORMAT_V1} (before digests), but its entries have"
            f" digests: it was written in format {FORMAT} and its format was set back,"
            " which would turn the integrity checks off. Restore the file from a backup."
        )
    for statement in (*MIGRATE_V1, ADD_SEAL):
        yield Query(statement)
    ids: list[Row] = yield Query(STATE_IDS)
    for (state_id,) in ids:
        rows: list[Row] = yield Query(ENTRIES_BY_SEQ, (state_id,))
        lines = [_bytes(row[1]) for row in rows]
        digests: list[bytes] = yield Work(
            lambda state_id=state_id, lines=lines: chain_digests(first_digest(state_id), lines),
            heavy=len(lines) > HEAVY_ENTRIES,
        )
        seqs = (row[0] for row in rows)
        yield QueryMany(SET_DIGEST, zip(digests, itertools.repeat(state_id), seqs))
        yield from _seal(state_id, digests[-1] if digests else None)


def _migrate_v2(where: str) -> Plan[None]:
    """Give a file of format 2 the feeds of its trees (in the transaction that opens it).

    Each State gets its root, walked up its stored parents; the entries table is made again
    with a position per row (its old rowid: the order the rows were written in) and its
    State's root.

    Raises:
        StoreDamagedError: The file has its roots already: it was written in format 3 and its
            format was set back.
    """
    columns: list[Row] = yield Query(STATE_COLUMNS)
    if any(row[1] == "root_id" for row in columns):
        raise StoreDamagedError(
            f"{where} says it is of format {FORMAT_V2} (before the feeds of trees), but its"
            f" States have roots: it was written in format {FORMAT} and its format was"
            " set back. Restore the file from a backup."
        )
    yield Query(ADD_ROOT)
    links: list[Row] = yield Query(STATE_PARENTS)
    roots = roots_of_links({str(row[0]): row[1] for row in links})
    yield QueryMany(SET_ROOT, ((root, state_id) for state_id, root in roots.items()))
    for statement in MIGRATE_V2:
        yield Query(statement)
    yield Query(UPDATE_FORMAT, (FORMAT, FORMAT_KEY))


def _migrate_v3(sequence: bool) -> Plan[None]:
    """Mark a file of format 3 as 4 (in the transaction that opens it).

    Its entries table keeps ``AUTOINCREMENT`` (making it again would copy every row): both give
    positions the same way. If a delete took the rows up to the last position given
    (`sequence`: the file has ``sqlite_sequence``), a row keeps that position, as deletes do now.
    """
    if sequence:
        yield Query(KEEP_SEQUENCE)
    yield Query(UPDATE_FORMAT, (FORMAT, FORMAT_KEY))


def _add_seals() -> Plan[None]:
    """Give the states rows of a file made before listings were sealed their seals."""
    columns: list[Row] = yield Query(STATE_COLUMNS)
    if any(row[1] == "seal" for row in columns):
        return
    yield Query(ADD_SEAL)
    ids: list[Row] = yield Query(STATE_IDS)
    for (state_id,) in ids:
        listed: list[Row] = yield Query(LISTING, (state_id,))
        yield from _seal(state_id, listed[0][-1])


def roots_of_links(parents: dict[str, object]) -> dict[str, str]:
    """The root of each State, given each one's stored parent id (None: none).

    A State whose parent is not stored is a root; so is one on a loop of parents (damaged links:
    it is the first of the loop reached).
    """
    roots: dict[str, str] = {}
    for state_id in parents:
        path: list[str] = []
        on_path: set[str] = set()
        current = state_id
        while current not in roots:
            path.append(current)
            on_path.add(current)
            parent = parents.get(current)
            if not isinstance(parent, str) or parent not in parents or parent in on_path:
                roots[current] = current
                break
            current = parent
        root = roots[current]
        for seen in path:
            roots.setdefault(seen, root)
    return roots


def _seal(state_id: str, head: object) -> Plan[None]:
    """Write the head of `state_id` and the seal of its listed info (as the row holds it)."""
    listed: list[Row] = yield Query(LISTING, (state_id,))
    seal = listing_seal(head if isinstance(head, bytes) else None, list(listed[0][:-1]))
    yield Query(SET_HEAD, (head, seal, state_id))


def _bytes(data: object) -> bytes:
    """A stored entry's data as bytes (SQLite may hand back text if it was stored as text)."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode()
    return repr(data).encode()  # not JSON text: its digest fails, naming the entry


def save_plan(state: State, store: object, where: str, known: TailCache) -> Plan[None]:
    """Write the entries of `state` the store does not hold yet, and its `states` row.

    `state` must continue the stored history (`stores.backend.continuation`: its entry at the
    stored end is the stored last one).

    Raises:
        TypeError: `state` is not a State (at once, before any I/O).
        ValueError: The store holds a different history under this id (load it instead).
    """
    return _save_one(check_state(state), store, where, known)


def _save_one(state: State, store: object, where: str, known: TailCache) -> Plan[None]:
    refused = yield from _save_many((state,), store, where, known)
    if refused:
        raise refused[0]


def save_many_plan(
    states: Sequence[State], store: object, where: str, known: TailCache
) -> Plan[dict[int, ValueError]]:
    """Write several States in one transaction (a group commit); bind each one it wrote.

    A State the store refuses (another history under its id) is left out and its error
    returned, keyed by its position in `states`; the others are written. A failure of the
    database itself fails them all (the transaction is rolled back by the caller).

    Raises:
        TypeError: An item is not a State (at once, before any I/O).
    """
    return _save_many([check_state(state) for state in states], store, where, known)


def _save_many(
    states: Sequence[State], store: object, where: str, known: TailCache
) -> Plan[dict[int, ValueError]]:
    """One transaction: write what follows each State's stored end (known, or read), commit."""
    writes, begun = yield from _write_after_known(states, known)
    if writes is None:
        writes = yield from _write_after_read(states, where, known, begun=begun)
    yield Query(COMMIT)
    for state_id, write in writes.writes.items():
        known.put(state_id, write.end)
    bind_written(writes.writes.values(), states, store)
    return writes.refused


def _write_after_known(
    states: Sequence[State], known: TailCache
) -> Plan[tuple[_Writes | None, bool]]:
    """Write after the ends `known` holds, if it holds each State's and nobody else wrote since.

    The ends are trusted while ``PRAGMA data_version`` stays where `known` last read it. Reading
    it after a ``BEGIN IMMEDIATE`` of its own took two statements before the writes, two hops of
    aiosqlite's thread: here the first write checks it (`UPDATE_STATE_IF_VERSION`) and begins the
    transaction (`ISOLATION_LEVEL`), so a save is three statements, not five.

    Returns the writes and True (the transaction is begun); or None, and whether it is begun,
    when the ends must be read: a State's is not known, or nothing is written (the read path
    checks the version), or another connection wrote since (nothing was written then).
    """
    version = known.trusted
    if version is None:
        return None, False
    saves: list[tuple[int, StorageView, Tail]] = []
    new = 0
    for at, state in enumerate(states):
        end = known.get(state.id)
        if end is None:
            return None, False
        view = storage_view(state)
        saves.append((at, view, end))
        new += view.count - end.count
    writes: _Writes = yield Work(lambda: _writes(saves), heavy=new > HEAVY_ENTRIES)
    if not writes.rows:
        return None, False
    _forget_until_committed(writes, known)
    rows = ((*row[1:], row[0], version) for row in writes.rows)
    updated: int = yield QueryMany(UPDATE_STATE_IF_VERSION, rows)
    if updated < len(writes.rows):
        # Another connection committed, and no row changed: the read path goes on in this
        # transaction. (Were the version unchanged and a row gone, the read path would find
        # the ends the rows were computed from, and write those rows again, whole.)
        return None, True
    yield QueryMany(INSERT_ENTRY, writes.entries())
    return writes, True


def _write_after_read(
    states: Sequence[State], where: str, known: TailCache, *, begun: bool
) -> Plan[_Writes]:
    """Find each State's stored end (known, or read) and write what follows it."""
    yield from _begin_write(where, known, begun=begun)
    ends = [known.get(state.id) for state in states]
    unknown = [state.id for state, end in zip(states, ends, strict=True) if end is None]
    stored_ids = (yield from _having_entries(unknown)) if unknown else set[str]()
    saves: list[tuple[int, StorageView, Tail]] = []
    unreadable: dict[int, ValueError] = {}
    new = 0
    for at, (state, stored) in enumerate(zip(states, ends, strict=True)):
        view = storage_view(state)  # one moment of it: the entries written and the row agree
        if stored is None:
            stored = Tail()
            if state.id in stored_ids:
                last: list[Row] = yield Query(LAST_ENTRY, (state.id,))
                seq, data, digest = last[0]
                if not (isinstance(digest, bytes) and len(digest) == DIGEST_SIZE):
                    unreadable[at] = damaged(
                        where, state.id, f"history entry {seq} has no digest to continue"
                    )
                    continue
                stored = Tail(seq + 1, _bytes(data), None, digest)
        saves.append((at, view, stored))
        new += view.count - stored.count
    writes: _Writes = yield Work(lambda: _writes(saves), heavy=new > HEAVY_ENTRIES)
    writes.refused.update(unreadable)
    _forget_until_committed(writes, known)
    if writes.rows:  # every State's rows in two statements, not two per State
        yield QueryMany(PUT_STATE, writes.put_rows())  # first: the entries take its root
        yield QueryMany(INSERT_ENTRY, writes.entries())
    return writes


def _forget_until_committed(writes: _Writes, known: TailCache) -> None:
    """Forget the ends of the States `writes` writes until the commit is known to be done.

    An exception that lands between the commit and the put after it (Ctrl+C during COMMIT is
    raised as it returns) must leave the next save to read the stored end, not to trust the
    end before this write.
    """
    for state_id in writes.writes:
        known.forget(state_id)


def _having_entries(state_ids: Sequence[str]) -> Plan[set[str]]:
    """Which of `state_ids` have stored entries: a few queries for a batch of new States."""
    found: set[str] = set()
    for start in range(0, len(state_ids), _IDS_PER_QUERY):
        chunk = state_ids[start : start + _IDS_PER_QUERY]
        rows: list[Row] = yield Query(having_entries(len(chunk)), chunk)
        found.update(row[0] for row in rows)
    return found


def _begin_write(where: str, known: TailCache, *, begun: bool) -> Plan[None]:
    """Take the write lock (unless `begun`); check the format if another connection wrote since."""
    if not begun:
        yield Query(BEGIN_WRITE)
    version: list[Row] = yield Query(DATA_VERSION)
    if not known.current(version[0][0]):
        yield from _check_format(where)  # another process may have moved the file on meanwhile
        known.trust(version[0][0])


@dataclass(slots=True)
class _Writes:
    """What a save of several States writes (`stores._plan.plan_writes`), as SQLite rows.

    `rows` holds the states row of each State id that has one to write (a new State, or new
    entries); `refused` the errors of the States left out, by position.
    """

    writes: dict[str, Write]
    rows: list[Row]
    refused: dict[int, ValueError]

    def entries(self) -> Iterable[tuple[str, int, bytes, bytes]]:
        """The rows of the new entries, read once (``zip`` over four columns)."""
        return zip(*entry_columns(self.writes.values()), strict=True)

    def put_rows(self) -> list[Row]:
        """The `PUT_STATE` parameters: each states row, and where a new State's root comes from."""
        new = {write.view.id: write.view for write in self.writes.values() if write.first == 0}
        roots = [root_from(write.view, new) for write in self.writes.values()]
        by_id = dict(zip(self.writes, roots, strict=True))
        return [(*row, *by_id[row[0]]) for row in self.rows]


def _writes(saves: Sequence[tuple[int, StorageView, Tail]]) -> _Writes:
    """The rows that save each `view` after its stored `tail` (no I/O).

    A State with nothing new to write (its stored end holds it all) writes no row.
    """
    refused: dict[int, ValueError] = {}
    writes = plan_writes(saves, refused)
    rows = [
        _state_row(write.view, write.end.digest or None)
        for write in writes.values()
        if write.lines or not write.end.count
    ]
    return _Writes(writes, rows, refused)


def _reader(where: str) -> Read:
    return lambda state_id: _read(state_id, where)


def _children(where: str) -> ListChildren:
    return lambda state_id: _list(state_id, -1, where, sealed=False)


def load_plan(state_id: str, store: object, where: str) -> Plan[State]:
    """Read the State `state_id` in one read transaction, rebuild it, close a cut-off turn.

    The entries that closing the turn adds are not written here: the next save writes them.

    Raises:
        TypeError, ValueError: `state_id` is not a valid id (at once, before any I/O).
        LookupError: No State has this id.
        ValueError: A damaged entry (naming the State and the index), a missing entry, entries
            without their states row, or another format version.
    """
    return load_state(_reader(where), _children(where), state_id, store, where)


def _read(state_id: str, where: str) -> Plan[State]:
    """The State `state_id` as its history holds it, read in one transaction (not recovered)."""
    yield Query(BEGIN_READ)
    yield from _check_format(where)
    counted: list[Row] = yield Query(COUNT_ENTRIES, (state_id,))
    if not counted:
        # Entries and their states row are written in one transaction: entries without a row
        # are damage, not an absent State.
        orphans: list[Row] = yield Query(ANY_ENTRY, (state_id,))
        yield Query(COMMIT)
        if orphans:
            raise damaged(where, state_id, "its history entries are stored, its states row is not")
        raise not_found(state_id, where)
    rows: list[Row] = yield Query(ENTRIES, (state_id,))
    yield Query(COMMIT)
    expected, head = counted[0]

    def rebuilt() -> State:
        lines = [_bytes(row[0]) for row in rows]
        return checked_history(state_id, expected, head, lines, [row[1] for row in rows], where)

    state: State = yield Work(rebuilt, heavy=len(rows) > HEAVY_ENTRIES)
    return state


def entries_plan(state_id: str, after: int, where: str) -> Plan[tuple[HistoryEntry, ...]]:
    """The entries of `state_id` after the `seq` `after`, read and checked as a load reads them.

    Raises:
        TypeError, ValueError: `state_id` or `after` is not valid (at once, before any I/O).
        LookupError: No State has this id.
        StoreDamagedError: A damaged or missing entry, or another format version.
    """
    return entries_of(_reader(where), state_id, after)


# -- the feed of a tree ----------------------------------------------------------------------

CURSOR_KIND = "sqlite"
_CURSOR_EXAMPLE = "sqlite:42"


def root_of_plan(state_id: str, where: str) -> Plan[str]:
    """The root of the tree of the stored State `state_id`.

    Raises:
        TypeError, ValueError: `state_id` is not a valid id (at once, before any I/O).
        LookupError: No State has this id.
    """
    validate_id(state_id, "state_id")
    return _root_of(state_id, where)


def _root_of(state_id: str, where: str) -> Plan[str]:
    yield Query(BEGIN_READ)
    yield from _check_format(where)
    rows: list[Row] = yield Query(ROOT_OF, (state_id,))
    yield Query(COMMIT)
    if not rows:
        raise not_found(state_id, where)
    return str(rows[0][0])


def position_of(after: str | None) -> int:
    """The position a cursor of this store's feed names (0: before the first entry).

    Raises:
        ValueError: `after` is not a cursor of an SQLite store.
    """
    parts = cursor_parts(after, CURSOR_KIND, _CURSOR_EXAMPLE, 1)
    if parts is None:
        return 0
    if not parts[0].isdigit() or parts[0].startswith("0"):
        raise bad_cursor(after, _CURSOR_EXAMPLE)
    return int(parts[0])


def tree_entries_plan(
    root_id: str, after: str | None, limit: int | None, where: str
) -> Plan[tuple[TreeEntry, ...]]:
    """The entries of the tree of `root_id` after the cursor `after`, at most `limit`.

    Raises:
        TypeError, ValueError: A bad argument (at once, before any I/O), a cursor past the end
            of this store (of another store?), or `root_id` is not a root.
        LookupError: No State `root_id` is stored.
        StoreDamagedError: An entry fails the check of its link of the chain.
    """
    validate_id(root_id, "root_id")
    position = position_of(after)
    return _tree_entries(root_id, after, position, check_limit(limit), where)


def _tree_entries(
    root_id: str, after: str | None, position: int, limit: int | None, where: str
) -> Plan[tuple[TreeEntry, ...]]:
    yield Query(BEGIN_READ)
    yield from _check_format(where)
    root: list[Row] = yield Query(ROOT_OF, (root_id,))
    last: list[Row] = yield Query(LAST_POSITION)
    rows: list[Row] = yield Query(TREE_ENTRIES, (root_id, position, -1 if limit is None else limit))
    yield Query(COMMIT)
    if not root:
        raise not_found(root_id, where)
    if root[0][0] != root_id:
        raise not_a_root(root_id, str(root[0][0]))
    if position > (last[0][0] if last else 0):
        raise bad_cursor(after, _CURSOR_EXAMPLE, "it is past the end of this store's feed")

    def checked() -> tuple[TreeEntry, ...]:
        return tuple(
            TreeEntry(
                make_cursor(CURSOR_KIND, at),
                state_id,
                check_link(where, state_id, seq, _bytes(data), digest, previous),
            )
            for at, state_id, seq, data, digest, previous in rows
        )

    entries: tuple[TreeEntry, ...] = yield Work(checked, heavy=len(rows) > HEAVY_ENTRIES)
    return entries


def tree_end_plan(root_id: str) -> Plan[int]:
    """The position of the last entry of the tree of `root_id` (0: none): a cheap probe."""
    yield Query(BEGIN_READ)
    rows: list[Row] = yield Query(TREE_END, (root_id,))
    yield Query(COMMIT)
    end = rows[0][0] if rows else None
    return end if isinstance(end, int) else 0


def count_plan(state_id: str) -> Plan[int]:
    """How many entries the states row of `state_id` counts (-1: no row): a cheap probe."""
    yield Query(BEGIN_READ)
    rows: list[Row] = yield Query(COUNT_ENTRIES, (state_id,))
    yield Query(COMMIT)
    count = rows[0][0] if rows else -1
    return count if isinstance(count, int) else -1


def list_plan(parent_id: str | None, limit: int | None, where: str) -> Plan[list[StateInfo]]:
    """The `StateInfo` of the saved States, most recently updated first.

    Raises:
        TypeError, ValueError: `parent_id` is not a valid id, or `limit` is not None or an
            int >= 0 (at once, before any I/O).
    """
    check_list_args(parent_id, limit)
    return _list(parent_id, -1 if limit is None else limit, where)


def _list(
    parent_id: str | None, count: int, where: str, *, sealed: bool = True
) -> Plan[list[StateInfo]]:
    yield Query(BEGIN_READ)
    yield from _check_format(where)
    # A negative LIMIT is no limit in SQLite.
    query = (
        Query(LIST_ALL, (count,)) if parent_id is None else Query(LIST_CHILDREN, (parent_id, count))
    )
    rows: list[Row] = yield query
    yield Query(COMMIT)
    return [_info_of_row(row, where, sealed=sealed) for row in rows]


def delete_plan(state_id: str, known: TailCache) -> Plan[None]:
    """Forget the State `state_id`; nothing happens if it is absent.

    Raises:
        TypeError, ValueError: `state_id` is not a valid id (at once, before any I/O).
    """
    validate_id(state_id, "state_id")
    return _delete(state_id, known)


def _delete(state_id: str, known: TailCache) -> Plan[None]:
    known.forget(state_id)
    yield Query(BEGIN_WRITE)
    last: list[Row] = yield Query(LAST_POSITION)
    yield Query(DELETE_ENTRIES, (state_id,))
    yield Query(DELETE_STATE, (state_id,))
    yield Query(KEEP_POSITION, (last[0][0],))  # if the State held the last positions
    yield Query(COMMIT)


# -- agent memory --------------------------------------------------------------------------


def memory_get_plan(agent: str, space: str, key: str, where: str) -> Plan[str | None]:
    """The text stored under `key` in the agent's space, or None.

    Raises:
        TypeError, ValueError: A bad agent name, space or key (at once, before any I/O).
    """
    check_memory(agent, space, key)
    return _memory_get(agent, space, key, where)


def _memory_get(agent: str, space: str, key: str, where: str) -> Plan[str | None]:
    yield Query(BEGIN_READ)
    yield from _check_format(where)
    rows: list[Row] = yield Query(MEMORY_GET, (agent, space, key))
    yield Query(COMMIT)
    return str(rows[0][0]) if rows else None


def memory_scan_plan(agent: str, space: str, where: str) -> Plan[list[tuple[str, str]]]:
    """Every ``(key, text)`` of the agent's space, in key order.

    Raises:
        TypeError, ValueError: A bad agent name or space (at once, before any I/O).
    """
    check_memory(agent, space)
    return _memory_scan(agent, space, where)


def _memory_scan(agent: str, space: str, where: str) -> Plan[list[tuple[str, str]]]:
    yield Query(BEGIN_READ)
    yield from _check_format(where)
    rows: list[Row] = yield Query(MEMORY_SCAN, (agent, space))
    yield Query(COMMIT)
    return [(str(row[0]), str(row[1])) for row in rows]


def memory_put_plan(
    agent: str, space: str, key: str, data: str | None, effect: str | None, where: str
) -> Plan[bool]:
    """Write `data` under `key` (None deletes it), once per `effect` key; whether it applied.

    The effect key is inserted in the write's transaction, so both happen or neither.

    Raises:
        TypeError, ValueError: A bad argument (at once, before any I/O).
    """
    check_memory(agent, space, key, data=data, effect=effect)
    return _memory_put(agent, space, key, data, effect, where)


def _memory_put(
    agent: str, space: str, key: str, data: str | None, effect: str | None, where: str
) -> Plan[bool]:
    yield Query(BEGIN_WRITE)
    yield from _check_format(where)
    if effect is not None:
        seen: list[Row] = yield Query(EFFECT_SEEN, (agent, effect))
        if seen:
            yield Query(COMMIT)
            return False
        yield Query(EFFECT_ADD, (agent, effect, _micros(datetime.now(UTC))))
    if data is None:
        yield Query(MEMORY_DELETE, (agent, space, key))
    else:
        yield Query(MEMORY_SET, (agent, space, key, data))
    yield Query(COMMIT)
    return True


# -- files ---------------------------------------------------------------------------------


def create_private(path: str) -> None:
    """Create the file `path` readable by its owner only, if it does not exist yet.

    SQLite gives its ``-wal`` and ``-shm`` files the permissions of the database file.
    """
    if path != ":memory:":
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))


# -- row mapping ----------------------------------------------------------------------------


def _micros(at: datetime | None) -> int | None:
    return None if at is None else micros(at)


def _datetime(count: int | None) -> datetime | None:
    return None if count is None else EPOCH + count * MICROSECOND


def _state_row(view: StorageView, head: bytes | None) -> Row:
    """The `states` row of a State's view; `head` is the digest of its last entry.

    The row ends with the seal of its listed info (`listing_seal`), checked by `list`.
    """
    stopped = view.stopped
    listing = [
        view.id,
        view.parent_id,
        view.parent_call_id,
        view.title,
        _micros(view.created_at),
        _micros(view.updated_at),
        view.turn,
        int(view.finished),
        stopped_json(stopped),
        usage_json(view.usage),
        view.count,
    ]
    return (*listing, head, listing_seal(head, listing))


def _info_of_row(row: Row, where: str, *, sealed: bool = True) -> StateInfo:
    """The `StateInfo` of a `states` row; a damaged row gives one naming its damage.

    A row is damaged when a column holds a value of the wrong type, or JSON that does not read,
    or (if `sealed`) its values do not match its seal. Only that State's info is lost: `list`
    goes on with the others. Crash recovery reads the links unsealed: it checks each one
    against the child's own history.
    """
    state_id = str(row[0])
    try:
        (_, parent_id, parent_call_id, title, created, updated, turn, finished, stopped) = row[:9]
        usage, entries = row[9:11]
        info = StateInfo(
            id=_of(str, row[0], "id"),
            parent_id=_of(str, parent_id, "parent_id", optional=True),
            parent_call_id=_of(str, parent_call_id, "parent_call_id", optional=True),
            title=_of(str, title, "title"),
            created_at=_datetime(_of(int, created, "created_at", optional=True)),
            updated_at=_datetime(_of(int, updated, "updated_at", optional=True)),
            turn=_of(int, turn, "turn"),
            stopped=None if stopped is None else json_of(STOPPED, stopped, "stopped"),
            finished=bool(_of(int, finished, "finished")),
            usage=json_of(USAGE, usage, "usage"),
            entries=_of(int, entries, "entries"),
        )
    except (TypeError, ValueError, OverflowError) as error:
        problem = f"its states row is damaged ({error})"
        return StateInfo(id=state_id, damage=str(damaged(where, state_id, problem)))
    head, seal = row[11:13]
    if sealed and seal != listing_seal(head if isinstance(head, bytes) else None, list(row[:11])):
        return StateInfo(id=state_id, damage=str(damaged(where, state_id, UNSEALED)))
    return info


def _of(kind: type[_T], value: object, column: str, *, optional: bool = False) -> Any:
    """`value` if it is a `kind` (or None when `optional`); a `TypeError` naming `column`."""
    if (value is None and optional) or (isinstance(value, kind) and not isinstance(value, bool)):
        return value
    raise TypeError(f"{column} holds {type(value).__name__} {value!r:.40}, not {kind.__name__}")


# -- errors ---------------------------------------------------------------------------------


def backend_error(where: str, error: Exception, state_id: str | None = None) -> StoreError:
    """The library's error for an error of SQLite or of the file system, to raise ``from`` it.

    Damage (a malformed file, a file that is not a database, text that is not UTF-8, a table or
    column of the schema missing) is a `StoreDamagedError`; anything else (a lock held too long,
    a full disk, a read-only file) a `StoreError`. The message names the store and, when one is
    concerned, the State. sqlite3 raises `UnicodeDecodeError` when SQLite's own message quotes
    damaged schema text that is not UTF-8.
    """
    name = getattr(error, "sqlite_errorname", "")
    text = str(error)
    about = "" if state_id is None else f" while reading or writing State {state_id!r}"
    if isinstance(error, UnicodeDecodeError) or (
        isinstance(error, sqlite3.Error)
        and (
            name in ("SQLITE_CORRUPT", "SQLITE_NOTADB")
            or type(error) is sqlite3.DatabaseError
            or "malformed" in text
            or "Could not decode" in text
            # The format check passed, so the tables were made whole: one changed since.
            or text.startswith(("no such column", "no such table"))
        )
    ):
        return StoreDamagedError(
            f"{where} is damaged{about} ({text}). If it is a store, restore it from a backup"
            " (a .db file is damaged by copying it while it is written, or without its -wal"
            " file); if it is not, give the path of a store file, or of one that does not exist"
            " yet."
        )
    if isinstance(error, sqlite3.Error) and is_busy(error):
        return StoreError(
            f"{where}: another connection held the file's write lock for more than"
            f" {BUSY_TIMEOUT_MS // 1000} s{about} ({text}). Try again, or find the process that"
            " keeps the file locked."
        )
    return StoreError(f"{where} failed{about}: {text} ({type(error).__name__}).")


# -- run leases (`stores._lease_sql`) --------------------------------------------------------

SQLITE_LEASE_TABLE = """
    CREATE TABLE IF NOT EXISTS run_leases (
        state_id TEXT PRIMARY KEY NOT NULL,
        owner TEXT NOT NULL,
        until REAL NOT NULL,
        cancel INTEGER NOT NULL DEFAULT 0
    ) WITHOUT ROWID
"""
"""Made when a store opens, in any file of format 3 (a table older versions never read)."""

SQLITE_LEASES = LeaseSql(
    claim="""
        INSERT INTO run_leases (state_id, owner, until, cancel)
        VALUES (:id, :owner, :now + :seconds, 0)
        ON CONFLICT (state_id) DO UPDATE SET
            owner = excluded.owner, until = excluded.until, cancel = 0
        WHERE run_leases.owner = excluded.owner OR run_leases.until <= :now
    """,
    owner_of="SELECT owner FROM run_leases WHERE state_id = :id",
    renew="""
        UPDATE run_leases SET until = :now + :seconds
        WHERE owner = :owner AND state_id IN (SELECT value FROM json_each(:ids))
    """,
    held="""
        SELECT state_id, owner, cancel FROM run_leases
        WHERE state_id IN (SELECT value FROM json_each(:ids))
    """,
    release="DELETE FROM run_leases WHERE state_id = :id AND owner = :owner",
    cancel="UPDATE run_leases SET cancel = 1 WHERE state_id = :id AND until > :now",
    owners="""
        SELECT state_id, owner FROM run_leases
        WHERE state_id IN (SELECT value FROM json_each(:ids)) AND until > :now
    """,
    commit="COMMIT",
    ids=json.dumps,
)


# -- rate limits (`stores._rate_sql`) --------------------------------------------------------

SQLITE_RATE_TABLE = """
    CREATE TABLE IF NOT EXISTS rate_limits (
        key TEXT PRIMARY KEY NOT NULL,
        requests_at REAL NOT NULL,
        tokens_at REAL NOT NULL
    ) WITHOUT ROWID
"""
"""Made when a store opens, in any file of format 3 (a table older versions never read)."""

SQLITE_SLOT_TABLE = """
    CREATE TABLE IF NOT EXISTS rate_slots (
        key TEXT NOT NULL,
        slot INTEGER NOT NULL,
        holder TEXT NOT NULL,
        expires_at REAL NOT NULL,
        PRIMARY KEY (key, slot)
    ) WITHOUT ROWID
"""
"""Made when a store opens, as ``rate_limits``: a key's concurrent slots, each leased."""

SQLITE_RATES = RateSql(
    take="""
        INSERT INTO rate_limits (key, requests_at, tokens_at)
        VALUES (:key, :now + :requests, :now + :tokens)
        ON CONFLICT (key) DO UPDATE SET
            requests_at = max(rate_limits.requests_at, :now) + :requests,
            tokens_at = max(rate_limits.tokens_at, :now) + :tokens
        RETURNING requests_at, tokens_at, :now
    """,
    hold="""
        INSERT INTO rate_limits (key, requests_at, tokens_at)
        VALUES (:key, :now + :seconds + :tolerance, :now + :seconds)
        ON CONFLICT (key) DO UPDATE SET
            requests_at = max(rate_limits.requests_at, excluded.requests_at),
            tokens_at = max(rate_limits.tokens_at, excluded.tokens_at)
    """,
    settle="UPDATE rate_limits SET tokens_at = tokens_at + :tokens WHERE key = :key",
    # It starts with INSERT (not WITH): Python's sqlite3 begins the transaction COMMIT ends
    # only before a statement that starts with INSERT, UPDATE, DELETE or REPLACE.
    slot_take="""
        INSERT INTO rate_slots (key, slot, holder, expires_at)
        SELECT :key, n.slot, :holder, :now + :lease
        FROM (
            WITH RECURSIVE n(slot) AS (
                SELECT 0 UNION ALL SELECT slot + 1 FROM n WHERE slot + 1 < :most
            )
            SELECT slot FROM n
        ) AS n
        WHERE NOT EXISTS (
            SELECT 1 FROM rate_slots AS s
            WHERE s.key = :key AND s.slot = n.slot AND s.expires_at > :now
        )
        ORDER BY n.slot LIMIT 1
        ON CONFLICT (key, slot) DO UPDATE SET
            holder = excluded.holder, expires_at = excluded.expires_at
            WHERE rate_slots.expires_at <= :now
        RETURNING slot
    """,
    slot_renew="""
        UPDATE rate_slots SET expires_at = :now + :lease
        WHERE key = :key AND slot = :slot AND holder = :holder
        RETURNING slot
    """,
    slot_release="DELETE FROM rate_slots WHERE key = :key AND slot = :slot AND holder = :holder",
    commit="COMMIT",
)
