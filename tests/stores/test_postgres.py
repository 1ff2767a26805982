"""`PostgresStore` against a real server: the contract suite in every mode, and what is its own.

The server is the one `make test` starts (see `tests.postgres`); each test gets a schema of its
own, dropped afterwards.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, LiteralString, cast

import anyio
import psycopg
import psycopg.errors
import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from orchestrator import (
    Message,
    State,
    StoreConflictError,
    StoreDamagedError,
    StoreError,
    ToolResultEntry,
    TreeEntry,
    Usage,
)
from orchestrator._record._store_client import client_of
from stores import FORMAT_VERSION, PostgresStore
from stores._contract_tree import linked

# Private: the query plans and SQL of the PostgreSQL backend, checked as units.
from stores._plan import Query, run_plan
from stores._postgres import _execute  # pyright: ignore[reportPrivateUsage]
from stores._postgres_plans import save_plan
from stores._postgres_sql import SAVE_ONE_MOST, SCHEMA_VERSION, sql_for
from stores.backend import RateAsk, Tail, TailCache, continuation, storage_view
from stores.contract import FollowContract, LeaseContract, StoreContract, TreeFollowContract
from tests.postgres import fresh_schema
from tests.stores.test_links import the_states

_TABLES = "SELECT tablename FROM pg_tables WHERE schemaname = %s"


class TestPostgresStore(LeaseContract, TreeFollowContract, FollowContract, StoreContract):
    colours = ("sync", "async")
    asyncio_only = False  # the async twins run the sync driver in a worker thread
    dsn = ""

    @pytest.fixture
    def store(self) -> Iterator[PostgresStore]:
        with fresh_schema() as (dsn, schema):
            self.dsn = dsn
            store = PostgresStore(dsn, schema=schema, pool_size=4)
            try:
                yield store
            finally:
                store.close()

    def damage(self, store: PostgresStore, state_id: str, seq: int) -> None:
        (data,) = sql(
            self.dsn,
            f'SELECT data FROM "{store.schema}".entries WHERE state_id = %s AND seq = %s',
            state_id,
            seq,
        )[0]
        changed = bytes(data).replace(f"text-{seq}".encode(), b"text-X")
        assert changed != bytes(data)
        update = f'UPDATE "{store.schema}".entries SET data = %s WHERE state_id = %s AND seq = %s'
        sql(self.dsn, update, changed, state_id, seq)

    def writer_url(self, store: PostgresStore) -> str | None:
        return store.url


# -- helpers ----------------------------------------------------------------------------------


@pytest.fixture
def where() -> Iterator[tuple[str, str]]:
    """A DSN and a fresh schema (dropped at the end)."""
    with fresh_schema() as found:
        yield found


@pytest.fixture
def store(where: tuple[str, str]) -> Iterator[PostgresStore]:
    dsn, schema = where
    with PostgresStore(dsn, schema=schema, pool_size=4) as opened:
        yield opened


def sql(dsn: str, statement: str, *params: object) -> list[tuple[Any, ...]]:
    """Run one statement on its own connection; its rows (none for a command)."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        cursor = connection.execute(cast("LiteralString", statement), params)
        return cursor.fetchall() if cursor.description is not None else []


def grown(state: State, *texts: str) -> State:
    for text in texts:
        state.add_message(Message.user(text))
    return state


# -- the schema: made once, versioned, migrated -----------------------------------------------


def test_the_schema_is_made_on_first_use_with_its_versions(
    where: tuple[str, str], store: PostgresStore
) -> None:
    dsn, schema = where
    assert sql(dsn, "SELECT to_regnamespace(%s) IS NOT NULL", schema) == [(False,)]
    store.save(State(id="one", messages=[Message.user("hi")]))
    meta = dict(sql(dsn, f'SELECT key, value FROM "{schema}".meta'))
    assert meta == {"schema_version": SCHEMA_VERSION, "format_version": FORMAT_VERSION}
    tables = {row[0] for row in sql(dsn, _TABLES, schema)}
    assert tables == {
        "meta",
        "states",
        "entries",
        "memory",
        "memory_effects",
        "run_leases",
        "rate_limits",
        "rate_slots",
    }


def test_stores_opening_a_new_schema_at_once_make_it_once(where: tuple[str, str]) -> None:
    dsn, schema = where
    stores = [PostgresStore(dsn, schema=schema, pool_size=1) for _ in range(6)]
    barrier = threading.Barrier(len(stores))
    errors: list[BaseException] = []

    def first_save(index: int) -> None:
        barrier.wait()
        try:
            stores[index].save(State(id=f"s{index}", messages=[Message.user("go")]))
        except BaseException as error:  # pragma: no cover - the failure the test looks for
            errors.append(error)

    threads = [threading.Thread(target=first_save, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for opened in stores:
        opened.close()
    assert errors == []
    assert sql(dsn, f'SELECT count(*) FROM "{schema}".states') == [(6,)]


def test_an_older_schema_is_migrated(where: tuple[str, str]) -> None:
    """Schema version 1 had no memory tables nor seals: a store opening it adds them."""
    dsn, schema = where
    with PostgresStore(dsn, schema=schema) as first:
        state = grown(State(id="kept"), "one", "two")
        first.save(state)
    sql(dsn, f'DROP TABLE "{schema}".memory, "{schema}".memory_effects')
    sql(dsn, f'ALTER TABLE "{schema}".states DROP COLUMN seal')
    _set_back_to_3(dsn, schema)
    sql(dsn, f"UPDATE \"{schema}\".meta SET value = 1 WHERE key = 'schema_version'")
    with PostgresStore(dsn, schema=schema) as second:
        assert second.load("kept").history == state.history
        assert [(info.id, info.damage) for info in second.list()] == [("kept", None)]
        assert second.memory_put("agent", "kv", "k", '"v"')
        assert second.memory_get("agent", "kv", "k") == '"v"'
    meta = dict(sql(dsn, f'SELECT key, value FROM "{schema}".meta'))
    assert meta["schema_version"] == SCHEMA_VERSION


def _set_back_to_3(dsn: str, schema: str) -> None:
    """Make the tables what schema version 3 made (no roots, transaction ids, leases, rates)."""
    sql(dsn, f'DROP TABLE IF EXISTS "{schema}".run_leases, "{schema}".rate_limits')
    sql(dsn, f'DROP TABLE IF EXISTS "{schema}".rate_slots')
    sql(dsn, f'ALTER TABLE "{schema}".states DROP COLUMN root_id')
    sql(dsn, f'ALTER TABLE "{schema}".entries DROP COLUMN root_id, DROP COLUMN xid')
    sql(dsn, f"UPDATE \"{schema}\".meta SET value = 3 WHERE key = 'schema_version'")
    sql(dsn, f"UPDATE \"{schema}\".meta SET value = 2 WHERE key = 'format_version'")


def test_a_schema_of_version_3_gets_the_feeds_of_its_trees(where: tuple[str, str]) -> None:
    """Version 3 had no feeds: each State gets its root, each entry a place before new ones."""
    dsn, schema = where
    with PostgresStore(dsn, schema=schema) as first:
        root = grown(State(id="root"), "one", "two")
        first.save(root)
        kid = linked("kid", "root")
        first.save(kid)
        first.save(linked("grandkid", "kid"))
        first.save(linked("orphan", "gone"))
    _set_back_to_3(dsn, schema)
    with PostgresStore(dsn, schema=schema) as second:
        assert [second.root_of(i) for i in ("root", "kid", "grandkid", "orphan")] == [
            "root",
            "root",
            "root",
            "orphan",
        ]
        feed = second.tree_entries("root")
        # The rows written before come first, by State and seq (their order of writing is lost).
        assert [(item.state_id, item.index) for item in feed] == [
            ("grandkid", 0),
            ("grandkid", 1),
            ("kid", 0),
            ("kid", 1),
            ("root", 0),
            ("root", 1),
        ]
        second.save(grown(kid, "three"))
        new = second.tree_entries("root", after=feed[-1].cursor)
        assert [(item.state_id, item.index) for item in new] == [("kid", 2)]
    meta = dict(sql(dsn, f'SELECT key, value FROM "{schema}".meta'))
    assert (meta["schema_version"], meta["format_version"]) == (SCHEMA_VERSION, FORMAT_VERSION)


def test_a_schema_of_version_5_gets_its_rate_limits_table(where: tuple[str, str]) -> None:
    """Version 5 had no rate limits: a store opening it adds the table, and can take at once."""
    dsn, schema = where
    with PostgresStore(dsn, schema=schema) as first:
        first.save(grown(State(id="kept"), "one"))
    sql(dsn, f'DROP TABLE "{schema}".rate_limits, "{schema}".rate_slots')
    sql(dsn, f"UPDATE \"{schema}\".meta SET value = 5 WHERE key = 'schema_version'")
    with PostgresStore(dsn, schema=schema) as second:
        ask = RateAsk(requests=1.0, tokens=0.0)
        assert anyio.run(second.arate_take, "k", ask).wait(ask) == 0.0
        assert second.load("kept").answer is None
    meta = dict(sql(dsn, f'SELECT key, value FROM "{schema}".meta'))
    assert meta["schema_version"] == SCHEMA_VERSION == 7


def test_a_schema_of_version_6_gets_its_rate_slots_table(where: tuple[str, str]) -> None:
    """Version 6 had no concurrent slots: a store opening it adds the table, and takes one."""
    dsn, schema = where
    with PostgresStore(dsn, schema=schema) as first:
        first.save(grown(State(id="kept"), "one"))
    sql(dsn, f'DROP TABLE "{schema}".rate_slots')
    sql(dsn, f"UPDATE \"{schema}\".meta SET value = 6 WHERE key = 'schema_version'")
    with PostgresStore(dsn, schema=schema) as second:
        assert anyio.run(second.arate_slot_take, "k", 1, "holder", 30.0) == 0
        assert anyio.run(second.arate_slot_take, "k", 1, "other", 30.0) is None
        assert second.load("kept").answer is None
    meta = dict(sql(dsn, f'SELECT key, value FROM "{schema}".meta'))
    assert meta["schema_version"] == SCHEMA_VERSION == 7


def test_a_newer_schema_is_refused_naming_both_versions(where: tuple[str, str]) -> None:
    dsn, schema = where
    with PostgresStore(dsn, schema=schema) as first:
        first.save(State(id="x"))
    newer = SCHEMA_VERSION + 1
    sql(dsn, f"UPDATE \"{schema}\".meta SET value = %s WHERE key = 'schema_version'", newer)
    with (
        PostgresStore(dsn, schema=schema) as second,
        pytest.raises(
            ValueError, match=rf"schema version {newer}.*schema version {SCHEMA_VERSION}"
        ),
    ):
        second.list()


def test_a_version_no_orchestrator_wrote_is_damage(where: tuple[str, str]) -> None:
    dsn, schema = where
    with PostgresStore(dsn, schema=schema) as first:
        first.save(State(id="x"))
    sql(dsn, f"UPDATE \"{schema}\".meta SET value = 0 WHERE key = 'schema_version'")
    with PostgresStore(dsn, schema=schema) as second, pytest.raises(StoreDamagedError):
        second.list()


def test_a_schema_holding_other_tables_is_refused(where: tuple[str, str]) -> None:
    dsn, schema = where
    sql(dsn, f'CREATE SCHEMA "{schema}"')
    sql(dsn, f'CREATE TABLE "{schema}".states (name text)')
    with (
        PostgresStore(dsn, schema=schema) as opened,
        pytest.raises(ValueError, match="holds tables of something else"),
    ):
        opened.list()
    assert sql(dsn, f'SELECT count(*) FROM "{schema}".states') == [(0,)]


def test_bad_arguments_are_refused_at_once(where: tuple[str, str]) -> None:
    dsn, _ = where
    with pytest.raises(ValueError, match="schema 'Bad-Name'"):
        PostgresStore(dsn, schema="Bad-Name")
    with pytest.raises(TypeError, match="schema must be a str"):
        PostgresStore(dsn, schema=cast("Any", 3))
    with pytest.raises(ValueError, match="pool_size"):
        PostgresStore(dsn, pool_size=0)
    with pytest.raises(ValueError, match="timeout"):
        PostgresStore(dsn, timeout=0)
    with pytest.raises(TypeError, match="a DSN"):
        PostgresStore(cast("Any", 5432))


# -- writers: several stores and processes at once --------------------------------------------


@pytest.mark.parametrize("added", [1, 2, SAVE_ONE_MOST, SAVE_ONE_MOST + 1])
def test_two_writers_of_one_state_the_second_is_refused(where: tuple[str, str], added: int) -> None:
    """Two stores (as two processes) append to one State: the second gets a conflict.

    A save of up to `SAVE_ONE_MOST` new entries and one of more take different statements:
    both write the same history and refuse the stale writer alike.
    """
    dsn, schema = where
    with (
        PostgresStore(dsn, schema=schema) as first,
        PostgresStore(dsn, schema=schema) as second,
    ):
        first.save(State(id="shared", messages=[Message.user("start")]))
        mine, theirs = first.load("shared"), second.load("shared")
        texts = [f"mine {i}" for i in range(added)]
        first.save(grown(mine, *texts))
        with pytest.raises(
            StoreConflictError, match=r"another writer saved it.*store\.load\('shared'\)"
        ):
            second.save(grown(theirs, *[f"theirs {i}" for i in range(added)]))
        stored = second.load("shared")
        assert stored.history == mine.history
        assert [m.text for m in stored.messages] == ["start", *texts]
        second.save(grown(stored, "theirs, after loading again"))
        assert first.load("shared").messages[-1].text == "theirs, after loading again"


def test_writers_racing_on_one_state_never_interleave(where: tuple[str, str]) -> None:
    """Four stores append to one State at once, each reloading when refused: no entry is lost
    or mixed, and every save that returned is in the stored history."""
    dsn, schema = where
    stores = [PostgresStore(dsn, schema=schema, pool_size=1) for _ in range(4)]
    stores[0].save(State(id="raced", messages=[Message.user("start")]))
    barrier = threading.Barrier(len(stores))
    saved: list[str] = []
    refusals: list[int] = []
    lock = threading.Lock()

    def race(index: int) -> None:
        store = stores[index]
        state = store.load("raced")
        barrier.wait()
        for round_ in range(15):
            text = f"writer {index} round {round_}"
            while True:
                state.add_message(Message.user(text))
                try:
                    store.save(state)
                except ValueError:
                    with lock:
                        refusals.append(index)
                    state = store.load("raced")
                    continue
                with lock:
                    saved.append(text)
                break

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    final = stores[0].load("raced")
    for opened in stores:
        opened.close()
    texts = [m.text for m in final.messages]
    assert sorted(texts[1:]) == sorted(saved)  # each returned save once, nothing else
    assert len(texts) == 1 + 4 * 15
    for index in range(4):  # each writer's own messages in its order
        own = [t for t in texts if t.startswith(f"writer {index} ")]
        assert own == [f"writer {index} round {r}" for r in range(15)]
    assert refusals  # the race did happen


def test_processes_saving_different_states_at_once_lose_nothing(where: tuple[str, str]) -> None:
    dsn, schema = where
    with PostgresStore(dsn, schema=schema) as opened:
        opened.list()  # the schema exists before the processes start (they may also make it)
    root = Path(__file__).resolve().parents[2]
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.stores.postgres_worker", dsn, schema, f"p{i}", "40", "5"],
            cwd=root,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    outputs = [worker.communicate(timeout=100)[0] for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0, 0, 0]
    assert outputs == ["done\n"] * 4
    with PostgresStore(dsn, schema=schema) as opened:
        infos = opened.list()
        assert len(infos) == 4 * 40
        assert {info.entries for info in infos} == {6}
        state = opened.load("p3-39")
        assert [m.text for m in state.messages][-1] == "p3 round 4"


def test_concurrent_saves_share_statements(store: PostgresStore) -> None:
    batches: list[int] = []
    write = store._save_states  # pyright: ignore[reportPrivateUsage]

    def counted(states: list[State], state_id: str | None = None) -> dict[int, ValueError]:
        batches.append(len(states))
        return write(states, state_id)

    store._save_states = counted  # type: ignore[method-assign]  # pyright: ignore[reportPrivateUsage]
    states = [State(id=f"c{i}", messages=[Message.user(str(i))]) for i in range(100)]
    client = client_of(store)  # an agent's saves go through it, in group commits

    async def save(state: State) -> None:
        await client.save(state)

    async def save_all() -> None:
        async with anyio.create_task_group() as group:
            for state in states:
                group.start_soon(save, state)

    anyio.run(save_all)
    assert sum(batches) == 100
    assert len(batches) < 10  # one statement for the first, one for all that came meanwhile
    assert len(store.list()) == 100


# -- listing uses its index ---------------------------------------------------------------------


def test_listing_children_uses_the_parent_index(
    where: tuple[str, str], store: PostgresStore
) -> None:
    dsn, schema = where
    store.list()  # makes the schema
    sql(
        dsn,
        f"""INSERT INTO "{schema}".states (id, parent_id, title, created_at, updated_at, turn,
        finished, usage, entries) SELECT 's' || n, 'p' || mod(n, 200), '', now(), now(), 0,
        false, '{{}}', 0 FROM generate_series(1, 20000) AS n""",
    )
    sql(dsn, f'ANALYZE "{schema}".states')
    query = sql_for(schema).list_children
    plan = "\n".join(row[0] for row in sql(dsn, "EXPLAIN " + query, "p7", 10))
    assert "states_by_parent" in plan, plan
    assert len(store.list(parent_id="p7")) == 100


# -- what a PostgreSQL store keeps ------------------------------------------------------------


def test_delete_takes_the_entries_with_the_state(
    where: tuple[str, str], store: PostgresStore
) -> None:
    dsn, schema = where
    store.save(grown(State(id="gone"), "a", "b"))
    store.save(grown(State(id="kept"), "c"))
    store.delete("gone")
    rows = sql(dsn, f'SELECT state_id, count(*) FROM "{schema}".entries GROUP BY state_id')
    assert rows == [("kept", 1)]


def test_a_nul_in_a_title_is_stored_as_a_replacement_character(store: PostgresStore) -> None:
    state = State(id="nul", messages=[Message.user("a\x00b")])
    store.save(state)
    assert store.list()[0].title == "a\ufffdb"
    assert store.load("nul").messages[0].text == "a\x00b"  # the entry itself is exact
    with pytest.raises(ValueError, match="NUL"):
        store.memory_put("agent", "kv", "a\x00b", '"v"')


def test_a_changed_entry_is_damage_naming_the_state_and_index(
    where: tuple[str, str], store: PostgresStore
) -> None:
    dsn, schema = where
    store.save(grown(State(id="paid"), "Pay 100 EUR", "thanks"))
    sql(
        dsn,
        f"""UPDATE "{schema}".entries
        SET data = convert_to(replace(convert_from(data, 'UTF8'), '100', '900'), 'UTF8')
        WHERE state_id = 'paid' AND seq = 0""",
    )
    with (
        PostgresStore(dsn, schema=schema) as fresh,
        pytest.raises(StoreDamagedError, match=r"State 'paid' is damaged: history entry 0"),
    ):
        fresh.load("paid")


def test_a_dropped_table_is_damage(where: tuple[str, str], store: PostgresStore) -> None:
    dsn, schema = where
    store.save(State(id="x", messages=[Message.user("hi")]))
    sql(dsn, f'DROP TABLE "{schema}".entries')
    with pytest.raises(StoreDamagedError, match="tables were changed") as raised:
        store.load("x")
    assert isinstance(raised.value.__cause__, psycopg.errors.UndefinedTable)


def test_a_server_that_is_not_there_is_a_store_error() -> None:
    with PostgresStore("postgresql://nobody@127.0.0.1:1/none", timeout=2) as nowhere:
        with pytest.raises(StoreError, match="could not reach the database") as raised:
            nowhere.list()
        assert isinstance(raised.value.__cause__, psycopg.OperationalError)
        with pytest.raises(StoreError, match="State 'x'"):
            nowhere.load("x")


def test_a_pool_of_your_own_is_used_and_left_open(where: tuple[str, str]) -> None:
    dsn, schema = where
    with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
        store = PostgresStore(pool, schema=schema)
        assert repr(store).startswith("PostgresStore(<pool ")
        store.save(grown(State(id="pooled"), "hi"))  # the pool's connections are not autocommit
        store.close()
        assert not pool.closed
        with PostgresStore(pool, schema=schema) as again:
            assert again.load("pooled").messages[0].text == "hi"


def test_an_async_pool_is_refused_naming_what_to_give(where: tuple[str, str]) -> None:
    dsn, _ = where
    pool = AsyncConnectionPool(dsn, open=False)
    with pytest.raises(TypeError, match="ConnectionPool, not an AsyncConnectionPool"):
        PostgresStore(cast("Any", pool))


def test_a_closed_store_says_so(store: PostgresStore) -> None:
    store.save(State(id="x"))
    store.close()
    store.close()
    with pytest.raises(ValueError, match="is closed"):
        store.load("x")


def test_without_psycopg_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg_pool", None)
    with pytest.raises(ImportError, match=r"orchestrator\[postgres\]"):
        PostgresStore("postgresql://localhost/db")


def test_a_delete_during_a_save_leaves_no_entry_behind(
    where: tuple[str, str], store: PostgresStore
) -> None:
    """A delete that waits for a save's commit deletes the entries that save wrote too."""
    dsn, schema = where
    state = grown(State(id="both"), "one")
    end = continuation(storage_view(state), Tail()).tail
    store.save(state)
    grown(state, "two", "three")
    known = TailCache()
    known.put("both", end)
    query = next(save_plan(sql_for(schema), [state], store, "test", known))
    assert isinstance(query, Query)
    with psycopg.connect(dsn, autocommit=True) as saver:
        deleter = threading.Thread(target=store.delete, args=("both",))
        with saver.transaction():
            written = saver.execute(cast("LiteralString", query.sql), query.params).fetchall()
            assert written == [("both",)]
            deleter.start()
            for _ in range(500):  # until the delete waits for this transaction's row lock
                waiting = sql(
                    dsn, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                )
                if waiting[0][0]:
                    break
                time.sleep(0.01)
        deleter.join()
    assert sql(dsn, f'SELECT count(*) FROM "{schema}".states') == [(0,)]
    assert sql(dsn, f'SELECT count(*) FROM "{schema}".entries') == [(0,)]


# -- links and format, checked against the histories ------------------------------------------


def test_a_link_to_an_unrelated_state_is_damage_on_recovery(
    where: tuple[str, str], store: PostgresStore
) -> None:
    dsn, schema = where
    lead, kid, stranger = the_states()
    for state in (lead, kid, stranger):
        store.save(state)
    sql(
        dsn,
        f"UPDATE \"{schema}\".states SET parent_id = 'lead', parent_call_id = 'c3'"
        " WHERE id = 'stranger'",
    )
    sql(dsn, f"UPDATE \"{schema}\".states SET usage = '{{\"input_tokens\": 7}}' WHERE id = 'kid'")
    with PostgresStore(dsn, schema=schema) as fresh:
        with pytest.raises(StoreDamagedError, match=r"links State 'stranger' to its cut-off"):
            fresh.load("lead")
        assert fresh.load("stranger").snapshot() == stranger.snapshot()
    sql(dsn, f"UPDATE \"{schema}\".states SET parent_id = NULL WHERE id = 'stranger'")
    with PostgresStore(dsn, schema=schema) as fresh:
        recovered = fresh.load("lead")
    c2, c3 = cast("list[ToolResultEntry]", list(recovered.history[-2:]))
    assert (c2.child_ids, c3.child_ids) == (("kid",), ())
    assert c2.usage.input_tokens == 10  # the child's own, not its edited row


@pytest.mark.anyio
async def test_a_link_to_an_unrelated_state_is_damage_to_aload(where: tuple[str, str]) -> None:
    dsn, schema = where
    with PostgresStore(dsn, schema=schema) as store:
        for state in the_states():
            await store.asave(state)
        sql(
            dsn,
            f"UPDATE \"{schema}\".states SET parent_id = 'lead', parent_call_id = 'c3'"
            " WHERE id = 'stranger'",
        )
        with pytest.raises(StoreDamagedError, match=r"links State 'stranger' to its cut-off"):
            await store.aload("lead")


def test_a_format_set_back_to_1_is_refused(where: tuple[str, str], store: PostgresStore) -> None:
    dsn, schema = where
    store.save(grown(State(id="paid"), "Pay 100 EUR"))
    sql(dsn, f"UPDATE \"{schema}\".meta SET value = 1 WHERE key = 'format_version'")
    with (
        PostgresStore(dsn, schema=schema) as fresh,
        pytest.raises(StoreDamagedError, match=r"format version 1"),
    ):
        fresh.load("paid")


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("title", "Pay 900 EUR to Eve"),
        ("usage", '{"input_tokens": 1}'),
        ("parent_id", "someone"),
        ("created_at", "2020-01-01T00:00:00Z"),
    ],
)
def test_an_edited_listing_is_listed_as_damage_not_shown(
    where: tuple[str, str], store: PostgresStore, column: str, value: str
) -> None:
    dsn, schema = where
    _, kid, stranger = the_states()
    for state in (kid, stranger):
        store.save(state)
    sql(dsn, f'UPDATE "{schema}".states SET {column} = %s WHERE id = %s', value, "kid")
    with PostgresStore(dsn, schema=schema) as fresh:
        infos = {info.id: info for info in fresh.list()}
        assert "State 'kid' is damaged: its listed info" in (infos["kid"].damage or "")
        assert (infos["kid"].title, infos["kid"].usage) == ("", Usage())
        assert infos["stranger"].damage is None
        assert fresh.load("kid").snapshot() == kid.snapshot()


def test_rows_of_a_schema_before_seals_are_sealed_when_migrated(where: tuple[str, str]) -> None:
    dsn, schema = where
    with PostgresStore(dsn, schema=schema) as first:
        for state in the_states():
            first.save(state)
    sql(dsn, f'ALTER TABLE "{schema}".states DROP COLUMN seal')
    _set_back_to_3(dsn, schema)
    sql(dsn, f"UPDATE \"{schema}\".meta SET value = 2 WHERE key = 'schema_version'")
    with PostgresStore(dsn, schema=schema) as second:
        infos = second.list()
        assert [info.damage for info in infos] == [None] * 3
        assert {info.id: info.usage.input_tokens for info in infos}["kid"] == 10


# -- following: a save notifies ---------------------------------------------------------------


@pytest.mark.parametrize("added", [1, SAVE_ONE_MOST + 1])
def test_a_save_notifies_the_followers_of_its_state(
    where: tuple[str, str], store: PostgresStore, added: int
) -> None:
    """Each save sends a NOTIFY with the State's id and its root's on the schema's channel.

    It is sent when the save commits.

    Both statements are covered: the usual save of a known State (`save_one`) and the group
    save (a new State, or more entries than `save_one` takes).
    """
    dsn, schema = where
    channel = sql_for(schema).channel
    state = State(id="told", messages=[Message.user("hi")])
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(cast("LiteralString", f'LISTEN "{channel}"'))
        store.save(state)  # new: the group statement
        store.save(grown(state, *(f"m{i}" for i in range(added))))
        store.save(state)  # nothing new: nothing written, nothing sent
        notes = [note.payload for note in listener.notifies(timeout=1.0)]
    assert notes == ["told told", "told told"]
    child = linked("kid", "told")
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(cast("LiteralString", f'LISTEN "{channel}"'))
        store.save(child)
        assert [note.payload for note in listener.notifies(timeout=1.0)] == ["kid told"]
    assert all(len(channel.encode()) <= 63 for channel in (sql_for("a" * 63).channel, channel))


# -- the feed of a tree: transactions that commit out of order --------------------------------


def _tree_keys(items: tuple[TreeEntry, ...]) -> list[tuple[str, int]]:
    return [(item.state_id, item.index) for item in items]


def test_a_save_that_began_first_and_commits_last_is_never_missed(
    where: tuple[str, str], store: PostgresStore
) -> None:
    """Two saves of one tree commit out of the order of their transaction ids.

    The slow one takes its transaction id first, the fast one commits first. A reader in
    between must not be given the fast one's entries: a cursor past them would skip the slow
    one's, which sort before. Once both have ended, the feed holds both, the slow one first.
    """
    dsn, schema = where
    root = State(id="root", messages=[Message.user("go")])
    store.save(root)
    store.save(linked("slow", "root"))
    store.save(linked("fast", "root"))
    start = store.tree_entries("root")[-1].cursor
    slow, fast = store.load("slow"), store.load("fast")
    with psycopg.connect(dsn) as connection:  # a transaction begins with the first statement
        connection.execute("SELECT pg_current_xact_id()")  # the slow save's id comes first
        store.save(grown(fast, "fast one"))
        assert store.tree_entries("root", after=start) == ()  # held back, not skipped
        plan = save_plan(sql_for(schema), [grown(slow, "slow one")], store, "test", TailCache())
        assert run_plan(plan, lambda query: _execute(connection, query)) == {}
        assert store.tree_entries("root", after=start) == ()
        connection.commit()
    assert _tree_keys(store.tree_entries("root", after=start)) == [("slow", 2), ("fast", 2)]


def test_a_wait_held_back_by_an_open_transaction_ends_when_it_ends(
    where: tuple[str, str], store: PostgresStore
) -> None:
    """An unrelated open transaction holds a saved entry back; its end sends no NOTIFY.

    The wait is told of the save, finds the entry held back, and looks again until the other
    transaction has ended: then it returns the entry.
    """
    dsn, _ = where
    root = State(id="root", messages=[Message.user("go")])
    store.save(root)
    start = store.tree_entries("root")[-1].cursor
    other = psycopg.connect(dsn)
    other.execute("SELECT pg_current_xact_id()")  # open, with a transaction id, writing nothing

    async def follow() -> tuple[TreeEntry, ...]:
        found: list[tuple[TreeEntry, ...]] = []
        returned = anyio.Event()

        async def wait() -> None:
            found.append(await store.await_tree_entries("root", after=start))
            returned.set()

        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                group.start_soon(wait)
                await anyio.to_thread.run_sync(store.save, grown(root, "held"))
                with anyio.move_on_after(0.3):  # held back while the other is open
                    await returned.wait()
                assert not found
                await anyio.to_thread.run_sync(other.commit)
        return found[0]

    try:
        assert _tree_keys(anyio.run(follow)) == [("root", 1)]
    finally:
        other.close()
