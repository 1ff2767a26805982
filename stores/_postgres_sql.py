"""The SQL of `PostgresStore`, written once: schema, migrations, statements, row mapping.

No SQL literal of the PostgreSQL store lives outside this module, and nothing here does I/O. A
*plan* (`stores._plan`, shared with SQLite) is a generator that yields the `Query` objects of
one store call in order and receives each one's rows; its return value is the call's result.
The plans of the store calls are in `stores._postgres_plans` (the one that makes the schema is
here, beside its statements); `stores._postgres` drives them on a psycopg connection with
`stores._plan.run_plan` (its sync methods directly, its async twins in a worker thread).

The tables, in one PostgreSQL schema (``orchestrator`` unless the store is given another)::

    meta     (key, value)          'schema_version' (the layout below) and 'format_version'
                                   (the entry encoding, `stores.FORMAT_VERSION`)
    states   (id, parent_id, ..., entries, head, seal, root_id)   one row per State: what
                                   `list` returns, its entry count, the digest of its last
                                   entry, the seal of its listed values (checked by `list`)
                                   and the root of its tree (fixed at its first save)
    entries  (state_id, seq, data, digest, root_id, xid)   one row per history entry, keyed
                                   by (state_id, seq); written and deleted with its states row;
                                   with its State's root and the writing transaction's id
    memory   (agent, space, key, value)   agent memory: JSON text per key
    memory_effects (agent, effect, at)    the effect keys of the memory writes applied

The schema is made and migrated by `MIGRATIONS`, under an advisory lock so that processes
starting at once do it once. Schema version n is what the first n steps make: a database at an
older version gets the steps it lacks, one at a newer version is refused, naming both.

A save is one statement (`Sql.save`): the entries of every State of a group commit and their
states rows, gated per State on its stored end. A State's row is written, and its entries
inserted, only if the row still holds the count and last digest the writer continued (or, for
a State the writer believes new, only if there is no row yet). The statement returns the ids
it wrote; a State left out was changed by another writer meanwhile, and the unique key
(state_id, seq) is a second guard against interleaved entries. The usual save of a run, one
State this store knew stored, has a plainer statement with the same gate and writes
(`Sql.save_one`).

The feed of a tree (`orchestrator.TreeFollowable`) must be in an order fixed at commit time,
and an id given at insert is not: a transaction that began earlier may commit later. So each
entry row keeps the id of the transaction that wrote it (``xid``, `pg_current_xact_id()`), and
a reader takes only the rows of transactions below its snapshot's ``xmin``: every transaction
there has ended, so no row can appear below it any more. The feed is ordered by (xid, State id,
seq), and a cursor is that triple. The price: an entry is in the feed once every transaction
older than the one that wrote it has ended, so a transaction left open (anywhere on the
server, by any application, once it has written something) holds every follower back until
it ends. A save's NOTIFY names its State and the State's root, so a follower of a tree is
told when any of its States saves.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from orchestrator import StateInfo, StoreDamagedError

from ._codec import FORMAT_V2, FORMAT_VERSION, check_format, damaged, listing_seal
from ._lease_sql import LeaseSql
from ._plan import (
    STOPPED,
    UNSEALED,
    USAGE,
    Plan,
    Query,
    Row,
    json_of,
    micros,
    stopped_json,
    usage_json,
)
from ._rate_sql import RateSql
from .backend import StorageView, Tail

__all__ = (
    "DEFAULT_SCHEMA",
    "MIGRATIONS",
    "SAVE_ONE_MOST",
    "SCHEMA_VERSION",
    "Sql",
    "StateRows",
    "check_schema_name",
    "info_of_row",
    "lock_key",
    "open_plan",
    "postgres_leases",
    "postgres_rates",
    "sql_for",
    "state_row",
)

DEFAULT_SCHEMA = "orchestrator"
"""The PostgreSQL schema the tables go in unless the store is given another."""

SCHEMA_VERSION = 7
"""The layout of the tables this library makes: the number of `MIGRATIONS` steps."""

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

# -- the schema: each step of MIGRATIONS makes schema version n + 1 from version n ------------

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: the States. Times are timestamptz (UTC), so rows sort and compare in SQL as users expect.
    (
        "CREATE TABLE {s}.meta (key text PRIMARY KEY, value bigint NOT NULL)",
        """
        CREATE TABLE {s}.states (
            id text PRIMARY KEY,
            parent_id text,
            parent_call_id text,
            title text NOT NULL,
            created_at timestamptz,
            updated_at timestamptz,
            turn integer NOT NULL,
            finished boolean NOT NULL,
            stopped text,
            usage text NOT NULL,
            entries integer NOT NULL,
            head bytea
        )
        """,
        # The order of `list` (ties by id; a State without entries has no time: last).
        "CREATE INDEX states_by_update ON {s}.states (updated_at DESC NULLS LAST, id)",
        "CREATE INDEX states_by_parent ON {s}.states (parent_id, updated_at DESC NULLS LAST, id)",
        # No foreign key to states: its checks made a save of 100 States take 17-25 ms
        # against 10-11 ms without (measured); a save and a delete write both tables in one
        # statement instead.
        """
        CREATE TABLE {s}.entries (
            state_id text NOT NULL,
            seq integer NOT NULL,
            data bytea NOT NULL,
            digest bytea NOT NULL,
            PRIMARY KEY (state_id, seq)
        )
        """,
    ),
    # 2: agent memory. Keys in "C" collation: the order of code points, as Python sorts str.
    (
        """
        CREATE TABLE {s}.memory (
            agent text NOT NULL,
            space text NOT NULL,
            key text COLLATE "C" NOT NULL,
            value text NOT NULL,
            PRIMARY KEY (agent, space, key)
        )
        """,
        """
        CREATE TABLE {s}.memory_effects (
            agent text NOT NULL,
            effect text NOT NULL,
            at timestamptz NOT NULL,
            PRIMARY KEY (agent, effect)
        )
        """,
    ),
    # 3: the seal of each State's listed info (`stores._codec.listing_seal`), checked by `list`;
    # the rows of an older schema get theirs in the same transaction (`open_plan`).
    ("ALTER TABLE {s}.states ADD COLUMN seal bytea",),
    # 4: the feed of each tree. Each State's root (walked down from the States whose parent is
    # not stored; one on a loop of damaged links is its own), each entry's root and the id of
    # the transaction that wrote it: the rows written before get 3, the first an ordinary
    # transaction can have, so they come first, by State and seq.
    (
        "ALTER TABLE {s}.states ADD COLUMN root_id text",
        """
        WITH RECURSIVE tree (id, root_id) AS (
            SELECT s.id, s.id FROM {s}.states AS s
            WHERE s.parent_id IS NULL
                OR NOT EXISTS (SELECT 1 FROM {s}.states AS p WHERE p.id = s.parent_id)
            UNION ALL
            SELECT s.id, t.root_id FROM {s}.states AS s JOIN tree AS t ON s.parent_id = t.id
        )
        UPDATE {s}.states AS s SET root_id = t.root_id FROM tree AS t WHERE s.id = t.id
        """,
        "UPDATE {s}.states SET root_id = id WHERE root_id IS NULL",
        "ALTER TABLE {s}.entries ADD COLUMN root_id text",
        """
        UPDATE {s}.entries AS e SET root_id = coalesce(
            (SELECT s.root_id FROM {s}.states AS s WHERE s.id = e.state_id), e.state_id
        )
        """,
        "ALTER TABLE {s}.entries ALTER COLUMN root_id SET NOT NULL",
        "ALTER TABLE {s}.entries ADD COLUMN xid xid8 NOT NULL DEFAULT '3'",
        "ALTER TABLE {s}.entries ALTER COLUMN xid SET DEFAULT pg_current_xact_id()",
        'CREATE INDEX entries_by_root ON {s}.entries (root_id, xid, state_id COLLATE "C", seq)',
    ),
    # 5: run leases (`orchestrator.AsyncRunLeases`): which process runs a State, cancels asked.
    (
        """
        CREATE TABLE {s}.run_leases (
            state_id text PRIMARY KEY,
            owner text NOT NULL,
            until timestamptz NOT NULL,
            cancel boolean NOT NULL DEFAULT false
        )
        """,
    ),
    # 6: rate limits (`orchestrator.models.RateLimit`): when each key's requests and tokens
    # are paid off, in seconds since the epoch on the server's clock.
    (
        """
        CREATE TABLE {s}.rate_limits (
            key text PRIMARY KEY,
            requests_at double precision NOT NULL,
            tokens_at double precision NOT NULL
        )
        """,
    ),
    # 7: concurrent slots of rate limits: each held by one request, leased until expires_at
    # (seconds since the epoch on the server's clock), so a killed process's slots come free.
    (
        """
        CREATE TABLE {s}.rate_slots (
            key text NOT NULL,
            slot integer NOT NULL,
            holder text NOT NULL,
            expires_at double precision NOT NULL,
            PRIMARY KEY (key, slot)
        )
        """,
    ),
)

_SEALED_SINCE = 3  # the schema version that added `states.seal`
_FEEDS_SINCE = 4  # the schema version that added the feeds of trees
_SCHEMA_KEY = "schema_version"
_FORMAT_KEY = "format_version"

_LOCK = "SELECT pg_advisory_xact_lock(%s)"
_NAMESPACE = "SELECT to_regnamespace(%s) IS NOT NULL"
_TABLES = "SELECT tablename FROM pg_tables WHERE schemaname = %s"
_CREATE_SCHEMA = "CREATE SCHEMA IF NOT EXISTS {s}"
_GET_META = "SELECT key, value FROM {s}.meta"
_SET_META = (
    "INSERT INTO {s}.meta (key, value) VALUES (%s, %s)"
    " ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)

# -- statements -----------------------------------------------------------------------------

_STATE_COLUMNS = (
    "id, parent_id, parent_call_id, title, created_at, updated_at, turn, finished, stopped,"
    " usage, entries, head, seal"
)
_INFO_COLUMNS = (
    "id, parent_id, parent_call_id, title, created_at, updated_at, turn, finished, stopped,"
    " usage, entries"
)

# Each save tells the followers of its States (`PostgresStore.await_entries`, which LISTENs):
# a NOTIFY per State written, its id as the payload, sent when the save commits. A CTE that is
# read (the count) is always run; a pg_notify in a WHERE clause may be skipped by the planner.
_NOTIFY = """notified AS (
    SELECT pg_notify('{{channel}}', id || ' ' || coalesce(root_id, id)) FROM {rows}
)
SELECT id FROM {rows}, (SELECT count(*) FROM notified) AS n
"""
# One statement for a whole group commit. `incoming` has a row per State: `prev` is the
# count the writer continued (-1: it believes the State new) and `prev_head` that end's digest.
# The parameters go in binary (%b): psycopg sends a list of bytes as text with every byte
# escaped, about 15 us an entry line, against 0.5 us in binary (measured, psycopg 3.3).
_SAVE = (
    """
WITH incoming AS (
    SELECT * FROM unnest(
        %(ids)b::text[], %(prevs)b::integer[], %(prev_heads)b::bytea[],
        %(parent_ids)b::text[], %(parent_call_ids)b::text[], %(titles)b::text[],
        %(created)b::timestamptz[], %(updated)b::timestamptz[], %(turns)b::integer[],
        %(finished)b::boolean[], %(stopped)b::text[], %(usages)b::text[],
        %(counts)b::integer[], %(heads)b::bytea[], %(seals)b::bytea[],
        %(root_parents)b::text[], %(root_selves)b::text[]
    ) AS i (
        id, prev, prev_head, parent_id, parent_call_id, title, created_at, updated_at, turn,
        finished, stopped, usage, entries, head, seal, root_parent, root_self
    )
),
created AS (
    INSERT INTO {s}.states ("""
    + _STATE_COLUMNS
    + """, root_id)
    SELECT """
    + _STATE_COLUMNS
    + """, coalesce(
        (SELECT coalesce(p.root_id, p.id) FROM {s}.states AS p WHERE p.id = i.root_parent),
        i.root_self
    ) FROM incoming AS i WHERE prev < 0
    ON CONFLICT (id) DO NOTHING
    RETURNING id, root_id
),
updated AS (
    UPDATE {s}.states AS s SET
        parent_id = i.parent_id, parent_call_id = i.parent_call_id, title = i.title,
        created_at = i.created_at, updated_at = i.updated_at, turn = i.turn,
        finished = i.finished, stopped = i.stopped, usage = i.usage, entries = i.entries,
        head = i.head, seal = i.seal
    FROM incoming AS i
    WHERE s.id = i.id AND i.prev >= 0 AND s.entries = i.prev
        AND s.head IS NOT DISTINCT FROM i.prev_head
    RETURNING s.id, s.root_id
),
written AS (SELECT id, root_id FROM created UNION ALL SELECT id, root_id FROM updated),
appended AS (
    INSERT INTO {s}.entries (state_id, seq, data, digest, root_id)
    SELECT e.state_id, e.seq, e.data, e.digest, w.root_id
    FROM unnest(
        %(entry_ids)b::text[], %(seqs)b::integer[], %(lines)b::bytea[], %(digests)b::bytea[]
    ) AS e (state_id, seq, data, digest)
    JOIN written AS w ON w.id = e.state_id
),
"""
    + _NOTIFY.format(rows="written")
)
# The save of one State this store knew stored (the usual save of a run): the same gate and
# writes as `_SAVE` for that case, without the unnest of the states columns, and with the new
# entries as VALUES rows (`{rows}`, one statement per count up to `SAVE_ONE_MOST`). One save
# alone took 690-844 us against 844-1,075 us with `_SAVE`; VALUES rows instead of an unnest
# of arrays took 80-95 us more off the statement (3 entries; prepared, loopback).
_SAVE_ONE = """
WITH updated AS (
    UPDATE {s}.states SET
        parent_id = %(parent_id)s, parent_call_id = %(parent_call_id)s, title = %(title)s,
        created_at = %(created_at)s, updated_at = %(updated_at)s, turn = %(turn)s,
        finished = %(finished)s, stopped = %(stopped)s, usage = %(usage)s,
        entries = %(entries)s, head = %(head)b, seal = %(seal)b
    WHERE id = %(id)s AND entries = %(prev)s AND head IS NOT DISTINCT FROM %(prev_head)b
    RETURNING id, root_id
),
appended AS (
    INSERT INTO {s}.entries (state_id, seq, data, digest, root_id)
    SELECT u.id, e.seq, e.data, e.digest, u.root_id
    FROM updated AS u, (VALUES {rows}) AS e (seq, data, digest)
),
""" + _NOTIFY.format(rows="updated")
_SAVE_ONE_ROW = "(%(seq{k})s::integer, %(line{k})b::bytea, %(digest{k})b::bytea)"

SAVE_ONE_MOST = 8
"""The most new entries `Sql.save_one` takes; a save of more goes through `Sql.save`."""

# Where the stored histories of some States end: count, last digest and last line.
_ENDS = """
SELECT s.id, s.entries, s.head, e.data
FROM {s}.states AS s
LEFT JOIN {s}.entries AS e ON e.state_id = s.id AND e.seq = s.entries - 1
WHERE s.id = ANY(%s::text[])
"""
# One statement, so one snapshot: the row and the entries always agree.
_LOAD = """
SELECT s.entries, s.head, e.data, e.digest
FROM {s}.states AS s
LEFT JOIN {s}.entries AS e ON e.state_id = s.id
WHERE s.id = %s
ORDER BY e.seq
"""
_LIST_ALL = (
    f"SELECT {_INFO_COLUMNS}, head, seal FROM {{s}}.states"
    " ORDER BY updated_at DESC NULLS LAST, id LIMIT %s"
)
_LIST_CHILDREN = (
    f"SELECT {_INFO_COLUMNS}, head, seal FROM {{s}}.states WHERE parent_id = %s"
    " ORDER BY updated_at DESC NULLS LAST, id LIMIT %s"
)
# The rows of a schema made before listings were sealed (the migration to version 3).
_UNSEALED_ROWS = f"SELECT {_INFO_COLUMNS}, head FROM {{s}}.states"
_SET_SEAL = "UPDATE {s}.states SET seal = %s WHERE id = %s"
# A delete locks the row first, in its transaction: a save of the State that committed
# meanwhile is then seen by the delete (its statement starts after the lock), so none of its
# entries is left behind without a row.
_LOCK_STATE = "SELECT 1 FROM {s}.states WHERE id = %s FOR UPDATE"
_DELETE = (
    "WITH gone AS (DELETE FROM {s}.states WHERE id = %s)"
    " DELETE FROM {s}.entries WHERE state_id = %s"
)

_ROOT_OF = "SELECT root_id FROM {s}.states WHERE id = %s"
# A page of a tree's feed after a cursor, in one snapshot: the root's own root (is it one?),
# the snapshot's xmax (a cursor at or past it is not this server's), and each row with whether
# its transaction is below the snapshot's xmin (settled: nothing can appear before it any
# more) and the stored digest before it (to check its link). Settled rows come first in the
# order; the first unsettled one ends the page. One row with no entry when the page is empty.
_TREE = """
WITH horizon AS (
    SELECT pg_snapshot_xmin(s) AS xmin, pg_snapshot_xmax(s) AS xmax
    FROM pg_current_snapshot() AS s
),
page AS (
    SELECT e.xid, e.state_id, e.seq, e.data, e.digest, p.digest AS previous
    FROM {s}.entries AS e
    LEFT JOIN {s}.entries AS p ON p.state_id = e.state_id AND p.seq = e.seq - 1
    WHERE e.root_id = %(root)s AND (e.xid, e.state_id COLLATE "C", e.seq)
        > (%(xid)s::xid8, %(state)s COLLATE "C", %(seq)s::integer)
    ORDER BY e.xid, e.state_id COLLATE "C", e.seq
    LIMIT %(limit)s
)
SELECT (SELECT root_id FROM {s}.states WHERE id = %(root)s), h.xmax::text,
    page.xid::text, page.xid < h.xmin, page.state_id, page.seq, page.data, page.digest,
    page.previous
FROM horizon AS h LEFT JOIN page ON true
ORDER BY page.xid, page.state_id COLLATE "C", page.seq
"""

_MEMORY_GET = "SELECT value FROM {s}.memory WHERE agent = %s AND space = %s AND key = %s"
_MEMORY_SCAN = "SELECT key, value FROM {s}.memory WHERE agent = %s AND space = %s ORDER BY key"
_MEMORY_SET = (
    "INSERT INTO {s}.memory (agent, space, key, value) VALUES (%s, %s, %s, %s)"
    " ON CONFLICT (agent, space, key) DO UPDATE SET value = excluded.value"
)
_MEMORY_DELETE = "DELETE FROM {s}.memory WHERE agent = %s AND space = %s AND key = %s"
# With an effect key: the key and the write in one statement, the write only if the key is new.
# A concurrent write with the same key waits for this one's commit, then inserts nothing.
_EFFECT = """
INSERT INTO {s}.memory_effects (agent, effect, at) VALUES (%(agent)s, %(effect)s, now())
ON CONFLICT (agent, effect) DO NOTHING
RETURNING 1
"""
_MEMORY_SET_ONCE = (
    "WITH effect AS (" + _EFFECT + "), written AS ("
    " INSERT INTO {s}.memory (agent, space, key, value)"
    " SELECT %(agent)s, %(space)s, %(key)s, %(value)s WHERE EXISTS (SELECT 1 FROM effect)"
    " ON CONFLICT (agent, space, key) DO UPDATE SET value = excluded.value"
    ") SELECT count(*) FROM effect"
)
_MEMORY_DELETE_ONCE = (
    "WITH effect AS (" + _EFFECT + "), removed AS ("
    " DELETE FROM {s}.memory WHERE agent = %(agent)s AND space = %(space)s AND key = %(key)s"
    " AND EXISTS (SELECT 1 FROM effect)"
    ") SELECT count(*) FROM effect"
)


def check_schema_name(schema: object) -> str:
    """`schema` if it is a PostgreSQL schema name this store uses as is (no quoting surprises).

    Raises:
        TypeError, ValueError: It is not a str of 1 to 63 lowercase letters, digits or ``_``,
            starting with a letter or ``_``.
    """
    if not isinstance(schema, str):
        raise TypeError(f"schema must be a str, got {type(schema).__name__}.")
    if not _SCHEMA_NAME.fullmatch(schema):
        raise ValueError(
            f"schema {schema!r} is not a name this store takes: use 1 to 63 lowercase ASCII"
            " letters, digits or '_', starting with a letter or '_' (e.g. 'orchestrator')."
        )
    return schema


@dataclass(frozen=True, slots=True)
class Sql:
    """Every statement of the store, with its tables in the PostgreSQL schema `schema`."""

    schema: str
    migrations: tuple[tuple[str, ...], ...] = field(init=False)
    create_schema: str = field(init=False)
    get_meta: str = field(init=False)
    set_meta: str = field(init=False)
    save: str = field(init=False)
    save_one: tuple[str, ...] = field(init=False)  # by new entry count - 1
    channel: str = field(init=False)  # what saves NOTIFY on: one per schema
    listen: str = field(init=False)
    unlisten: str = field(init=False)
    ends: str = field(init=False)
    load: str = field(init=False)
    list_all: str = field(init=False)
    list_children: str = field(init=False)
    unsealed_rows: str = field(init=False)
    set_seal: str = field(init=False)
    lock_state: str = field(init=False)
    delete: str = field(init=False)
    root_of: str = field(init=False)
    tree: str = field(init=False)
    memory_get: str = field(init=False)
    memory_scan: str = field(init=False)
    memory_set: str = field(init=False)
    memory_delete: str = field(init=False)
    memory_set_once: str = field(init=False)
    memory_delete_once: str = field(init=False)
    leases: LeaseSql = field(init=False)
    rates: RateSql = field(init=False)

    def __post_init__(self) -> None:
        quoted = f'"{check_schema_name(self.schema)}"'
        # A channel name is at most 63 bytes: a digest of the schema name keeps it short.
        digest = hashlib.blake2b(self.schema.encode(), digest_size=8).hexdigest()
        channel = f"orchestrator_entries_{digest}"
        object.__setattr__(self, "channel", channel)
        object.__setattr__(self, "listen", f'LISTEN "{channel}"')
        object.__setattr__(self, "unlisten", f'UNLISTEN "{channel}"')

        def put(name: str, template: str) -> None:
            text = template.replace("{s}", quoted).replace("{channel}", channel)
            object.__setattr__(self, name, text)

        object.__setattr__(self, "leases", postgres_leases(quoted))
        object.__setattr__(self, "rates", postgres_rates(quoted))
        object.__setattr__(
            self,
            "migrations",
            tuple(tuple(step.replace("{s}", quoted) for step in steps) for steps in MIGRATIONS),
        )
        put("create_schema", _CREATE_SCHEMA)
        put("get_meta", _GET_META)
        put("set_meta", _SET_META)
        put("save", _SAVE)
        object.__setattr__(
            self,
            "save_one",
            tuple(
                _SAVE_ONE.replace("{s}", quoted)
                .replace("{channel}", channel)
                .replace("{rows}", ", ".join(_SAVE_ONE_ROW.format(k=k) for k in range(count)))
                for count in range(1, SAVE_ONE_MOST + 1)
            ),
        )
        put("ends", _ENDS)
        put("load", _LOAD)
        put("list_all", _LIST_ALL)
        put("list_children", _LIST_CHILDREN)
        put("unsealed_rows", _UNSEALED_ROWS)
        put("set_seal", _SET_SEAL)
        put("lock_state", _LOCK_STATE)
        put("delete", _DELETE)
        put("root_of", _ROOT_OF)
        put("tree", _TREE)
        put("memory_get", _MEMORY_GET)
        put("memory_scan", _MEMORY_SCAN)
        put("memory_set", _MEMORY_SET)
        put("memory_delete", _MEMORY_DELETE)
        put("memory_set_once", _MEMORY_SET_ONCE)
        put("memory_delete_once", _MEMORY_DELETE_ONCE)


@functools.lru_cache(maxsize=64)
def sql_for(schema: str) -> Sql:
    """The statements for `schema` (made once per schema name)."""
    return Sql(schema)


def lock_key(schema: str) -> int:
    """The advisory lock that serializes making and migrating `schema` (a signed 64-bit int)."""
    digest = hashlib.blake2b(f"orchestrator:{schema}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


# -- making and migrating the schema ----------------------------------------------------------


def open_plan(sql: Sql, where: str) -> Plan[int]:
    """Make the schema if it is missing, migrate an older one; the version it was at (0: new).

    Runs in one transaction, under an advisory lock on the schema's name.

    Raises:
        ValueError: The schema holds tables of something else, or a newer schema version or
            entry format than this library knows (both versions are named).
    """
    yield Query(_LOCK, (lock_key(sql.schema),))
    exists: list[Row] = yield Query(_NAMESPACE, (sql.schema,))
    tables: set[str] = set()
    if exists[0][0]:
        rows: list[Row] = yield Query(_TABLES, (sql.schema,))
        tables = {str(row[0]) for row in rows}
    else:
        yield Query(sql.create_schema)
    found = 0
    if "meta" in tables:
        meta: list[Row] = yield Query(sql.get_meta)
        values = {str(key): value for key, value in meta}
        found = _check_schema_version(values.get(_SCHEMA_KEY), where)
        # Before the feeds of trees (schema 4) the entries were of format 2.
        older = (FORMAT_V2,) if found < _FEEDS_SINCE else ()
        check_format(values.get(_FORMAT_KEY), where=where, readable=older)
    elif tables & {"states", "entries", "memory"}:
        shown = ", ".join(sorted(tables)[:5])
        raise ValueError(
            f"{where}: schema {sql.schema!r} holds tables of something else ({shown}) and no"
            " orchestrator version row: give the store a schema of its own (schema=...)."
        )
    for steps in sql.migrations[found:]:
        for statement in steps:
            yield Query(statement)
    if 0 < found < _SEALED_SINCE:  # rows written before listings were sealed: seal them now
        rows = yield Query(sql.unsealed_rows)
        for row in rows:
            yield Query(sql.set_seal, (_seal_of(row[:11], row[11]), row[0]))
    if found < SCHEMA_VERSION:
        yield Query(sql.set_meta, (_SCHEMA_KEY, SCHEMA_VERSION))
        yield Query(sql.set_meta, (_FORMAT_KEY, FORMAT_VERSION))
    return found


def _check_schema_version(found: object, where: str) -> int:
    if isinstance(found, int) and not isinstance(found, bool) and 1 <= found <= SCHEMA_VERSION:
        return found
    if isinstance(found, int) and found > SCHEMA_VERSION:
        raise ValueError(
            f"{where} has schema version {found}, but this orchestrator knows schema version"
            f" {SCHEMA_VERSION}: it was migrated by a newer orchestrator. Upgrade orchestrator"
            " in this process to use it (every process sharing the database needs the newer"
            " version)."
        )
    raise damaged_schema(where, found)


def damaged_schema(where: str, found: object) -> ValueError:
    """The error for a schema version no orchestrator wrote."""
    return StoreDamagedError(
        f"{where} has schema version {found!r}, but this orchestrator knows schema version"
        f" {SCHEMA_VERSION}: the meta table was changed or is damaged. Restore the database"
        " from a backup, or give the store a new schema (schema=...)."
    )


# -- row mapping ----------------------------------------------------------------------------


def _utc(at: datetime | None) -> datetime | None:
    if at is None or at.tzinfo is not None:
        return at
    return at.replace(tzinfo=UTC)  # a naive time of a State is UTC


def _text(value: str) -> str:
    """`value` as PostgreSQL text holds it: it cannot hold NUL (U+0000), which becomes U+FFFD."""
    return value.replace("\x00", "\ufffd") if "\x00" in value else value


@dataclass(slots=True)
class StateRows:
    """The parameters of one save statement, column by column (see `_SAVE`)."""

    ids: list[str] = field(default_factory=list[str])
    prevs: list[int] = field(default_factory=list[int])
    prev_heads: list[bytes | None] = field(default_factory=list["bytes | None"])
    parent_ids: list[str | None] = field(default_factory=list["str | None"])
    parent_call_ids: list[str | None] = field(default_factory=list["str | None"])
    titles: list[str] = field(default_factory=list[str])
    created: list[datetime | None] = field(default_factory=list["datetime | None"])
    updated: list[datetime | None] = field(default_factory=list["datetime | None"])
    turns: list[int] = field(default_factory=list[int])
    finished: list[bool] = field(default_factory=list[bool])
    stopped: list[str | None] = field(default_factory=list["str | None"])
    usages: list[str] = field(default_factory=list[str])
    counts: list[int] = field(default_factory=list[int])
    heads: list[bytes | None] = field(default_factory=list["bytes | None"])
    seals: list[bytes] = field(default_factory=list[bytes])
    root_parents: list[str | None] = field(default_factory=list["str | None"])
    root_selves: list[str] = field(default_factory=list[str])
    entry_ids: list[str] = field(default_factory=list[str])
    seqs: list[int] = field(default_factory=list[int])
    lines: list[bytes] = field(default_factory=list[bytes])
    digests: list[bytes] = field(default_factory=list[bytes])

    def __len__(self) -> int:
        return len(self.ids)

    def params(self) -> dict[str, list[Any]]:
        """The named parameters of the save statement."""
        return {name: getattr(self, name) for name in self.__slots__}

    def query(self, sql: Sql) -> Query:
        """The statement that saves these rows: `Sql.save_one` where it applies, else `Sql.save`.

        `Sql.save_one` takes one State known stored that grew by at most `SAVE_ONE_MOST`
        entries.
        """
        added = len(self.lines)
        if len(self.ids) != 1 or self.prevs[0] < 0 or not 0 < added <= SAVE_ONE_MOST:
            return Query(sql.save, self.params())
        params: dict[str, Any] = {
            "id": self.ids[0],
            "prev": self.prevs[0],
            "prev_head": self.prev_heads[0],
            "parent_id": self.parent_ids[0],
            "parent_call_id": self.parent_call_ids[0],
            "title": self.titles[0],
            "created_at": self.created[0],
            "updated_at": self.updated[0],
            "turn": self.turns[0],
            "finished": self.finished[0],
            "stopped": self.stopped[0],
            "usage": self.usages[0],
            "entries": self.counts[0],
            "head": self.heads[0],
            "seal": self.seals[0],
        }
        for k in range(added):
            params[f"seq{k}"] = self.seqs[k]
            params[f"line{k}"] = self.lines[k]
            params[f"digest{k}"] = self.digests[k]
        return Query(sql.save_one[added - 1], params)


def state_row(
    rows: StateRows,
    view: StorageView,
    stored: Tail | None,
    end: Tail,
    lines: Sequence[bytes],
    digests: Sequence[bytes],
    root: tuple[str | None, str],
) -> None:
    """Add the save of `view` to `rows`: its states row gated on `stored`, and its new entries.

    `stored` is the end the writer continued (None: it believes the State new); `end` the end
    once written; `lines` and `digests` the new entries' (seqs from ``end.count - len(lines)``);
    `root` where a new State's root comes from (`stores.backend.root_from`).
    """
    stopped = view.stopped
    rows.ids.append(view.id)
    rows.prevs.append(-1 if stored is None else stored.count)
    rows.prev_heads.append(None if stored is None or not stored.digest else stored.digest)
    rows.parent_ids.append(view.parent_id)
    rows.parent_call_ids.append(view.parent_call_id)
    rows.titles.append(_text(view.title))
    rows.created.append(_utc(view.created_at))
    rows.updated.append(_utc(view.updated_at))
    rows.turns.append(view.turn)
    rows.finished.append(view.finished)
    stopped_text = stopped_json(stopped)
    rows.stopped.append(None if stopped_text is None else _text(stopped_text))
    rows.usages.append(usage_json(view.usage))
    rows.counts.append(end.count)
    rows.heads.append(end.digest or None)
    listing = [getattr(rows, name)[-1] for name in _LISTED]
    rows.seals.append(_seal_of(listing, end.digest or None))
    rows.root_parents.append(root[0])
    rows.root_selves.append(root[1])
    first = end.count - len(lines)
    rows.entry_ids += [view.id] * len(lines)
    rows.seqs += range(first, end.count)
    rows.lines += lines
    rows.digests += digests


_LISTED = (
    "ids",
    "parent_ids",
    "parent_call_ids",
    "titles",
    "created",
    "updated",
    "turns",
    "finished",
    "stopped",
    "usages",
    "counts",
)  # the columns of `StateRows` that `list` shows, in the order of `_INFO_COLUMNS`


def _seal_of(listing: Sequence[object], head: object) -> bytes:
    """The seal of a row's listed values (times as microseconds since 1970, UTC)."""
    values = [micros(value) if isinstance(value, datetime) else value for value in listing]
    return listing_seal(head if isinstance(head, bytes) else None, values)


def info_of_row(row: Row, where: str, *, sealed: bool = True) -> StateInfo:
    """The `StateInfo` of a states row; a damaged row gives one naming its damage.

    Only that State's info is lost: `list` goes on with the others. With `sealed`, a row whose
    listed values do not match its seal is damaged too (crash recovery reads the links
    unsealed: it checks each one against the child's own history).
    """
    state_id = str(row[0])
    if sealed and (len(row) < 13 or row[12] != _seal_of(row[:11], row[11])):
        return StateInfo(id=state_id, damage=str(damaged(where, state_id, UNSEALED)))
    try:
        (_, parent_id, parent_call_id, title, created, updated, turn, finished, stopped) = row[:9]
        usage, entries = row[9:11]
        return StateInfo(
            id=state_id,
            parent_id=parent_id,
            parent_call_id=parent_call_id,
            title=title,
            created_at=None if created is None else created.astimezone(UTC),
            updated_at=None if updated is None else updated.astimezone(UTC),
            turn=turn,
            stopped=None if stopped is None else json_of(STOPPED, stopped, "stopped"),
            finished=finished,
            usage=json_of(USAGE, usage, "usage"),
            entries=entries,
        )
    except (TypeError, ValueError, AttributeError) as error:
        problem = f"its states row is damaged ({error})"
        return StateInfo(id=state_id, damage=str(damaged(where, state_id, problem)))


# -- run leases (`stores._lease_sql`) --------------------------------------------------------

# PostgreSQL's, with {s} for the schema: the server's clock, so machines agree.
_POSTGRES_LEASES = {
    "claim": """
        INSERT INTO {s}.run_leases AS l (state_id, owner, until, cancel)
        VALUES (%(id)s, %(owner)s, clock_timestamp() + make_interval(secs => %(seconds)s), false)
        ON CONFLICT (state_id) DO UPDATE SET
            owner = EXCLUDED.owner, until = EXCLUDED.until, cancel = false
        WHERE l.owner = EXCLUDED.owner OR l.until <= clock_timestamp()
    """,
    "owner_of": "SELECT owner FROM {s}.run_leases WHERE state_id = %(id)s",
    "renew": """
        UPDATE {s}.run_leases SET until = clock_timestamp() + make_interval(secs => %(seconds)s)
        WHERE owner = %(owner)s AND state_id = ANY(%(ids)s)
    """,
    "held": "SELECT state_id, owner, cancel FROM {s}.run_leases WHERE state_id = ANY(%(ids)s)",
    "release": "DELETE FROM {s}.run_leases WHERE state_id = %(id)s AND owner = %(owner)s",
    "cancel": """
        UPDATE {s}.run_leases SET cancel = true
        WHERE state_id = %(id)s AND until > clock_timestamp()
    """,
    "owners": """
        SELECT state_id, owner FROM {s}.run_leases
        WHERE state_id = ANY(%(ids)s) AND until > clock_timestamp()
    """,
}


def postgres_leases(schema: str) -> LeaseSql:
    """The statements of run leases in the (quoted) PostgreSQL schema `schema`."""
    statements = {name: text.replace("{s}", schema) for name, text in _POSTGRES_LEASES.items()}
    return LeaseSql(**statements, commit=None, ids=list)


# -- rate limits (`stores._rate_sql`) --------------------------------------------------------

# The server's clock (seconds since the epoch), so machines agree.
_NOW = "extract(epoch from clock_timestamp())::double precision"

_POSTGRES_RATES = {
    "take": f"""
        WITH c AS (SELECT {_NOW} AS now)
        INSERT INTO {{s}}.rate_limits AS r (key, requests_at, tokens_at)
        SELECT %(key)s, c.now + %(requests)s, c.now + %(tokens)s FROM c
        ON CONFLICT (key) DO UPDATE SET
            requests_at = greatest(r.requests_at, EXCLUDED.requests_at - %(requests)s)
                + %(requests)s,
            tokens_at = greatest(r.tokens_at, EXCLUDED.tokens_at - %(tokens)s) + %(tokens)s
        RETURNING r.requests_at, r.tokens_at, (SELECT now FROM c)
    """,
    "hold": f"""
        INSERT INTO {{s}}.rate_limits AS r (key, requests_at, tokens_at)
        VALUES (
            %(key)s, {_NOW} + %(seconds)s + %(tolerance)s, {_NOW} + %(seconds)s
        )
        ON CONFLICT (key) DO UPDATE SET
            requests_at = greatest(r.requests_at, EXCLUDED.requests_at),
            tokens_at = greatest(r.tokens_at, EXCLUDED.tokens_at)
    """,
    "settle": "UPDATE {s}.rate_limits SET tokens_at = tokens_at + %(tokens)s WHERE key = %(key)s",
    # Two takes of one free slot at once: the second waits on the first's row, then finds its
    # lease running and takes nothing (it looks again), so no slot has two holders.
    "slot_take": f"""
        WITH c AS (SELECT {_NOW} AS now)
        INSERT INTO {{s}}.rate_slots AS r (key, slot, holder, expires_at)
        SELECT %(key)s, n.slot, %(holder)s, c.now + %(lease)s
        FROM c, generate_series(0, %(most)s - 1) AS n(slot)
        WHERE NOT EXISTS (
            SELECT 1 FROM {{s}}.rate_slots AS s
            WHERE s.key = %(key)s AND s.slot = n.slot AND s.expires_at > c.now
        )
        ORDER BY n.slot LIMIT 1
        ON CONFLICT (key, slot) DO UPDATE SET
            holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
            WHERE r.expires_at <= EXCLUDED.expires_at - %(lease)s
        RETURNING r.slot
    """,
    "slot_renew": f"""
        UPDATE {{s}}.rate_slots SET expires_at = {_NOW} + %(lease)s
        WHERE key = %(key)s AND slot = %(slot)s AND holder = %(holder)s
        RETURNING slot
    """,
    "slot_release": (
        "DELETE FROM {s}.rate_slots WHERE key = %(key)s AND slot = %(slot)s AND holder = %(holder)s"
    ),
}


def postgres_rates(schema: str) -> RateSql:
    """The statements of rate limits in the (quoted) PostgreSQL schema `schema`."""
    statements = {name: text.replace("{s}", schema) for name, text in _POSTGRES_RATES.items()}
    return RateSql(**statements, commit=None)
