"""Agent memory in the SQLite backends beyond the contract: tables, transactions, processes."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import AsyncMemoryBackend, Memory, MemoryBackend, Message, State, StoreError
from stores import AioSQLiteStore, SQLiteStore
from stores import _sql as sql

ROOT = Path(__file__).resolve().parents[2]


def test_memory_lives_in_its_own_tables(path: Path) -> None:
    with SQLiteStore(path) as store:
        assert isinstance(store, MemoryBackend)
        assert isinstance(store, AsyncMemoryBackend)
        store.memory_put("digest", "kv", "k", "1", effect="s:c:0")
        store.save(State(id="s", messages=[Message.user("hi")]))
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT agent, space, key, value FROM memory").fetchall() == [
            ("digest", "kv", "k", "1")
        ]
        ((agent, effect, at),) = db.execute("SELECT agent, effect, at FROM memory_effects")
        assert (agent, effect) == ("digest", "s:c:0")
        assert isinstance(at, int)
        assert at > 0
    finally:
        db.close()


def test_memory_outlives_the_store_object(path: Path) -> None:
    with SQLiteStore(path) as store:
        Memory.open("digest", None, store).set("lastUid", 1042)
    with SQLiteStore(path) as store:
        assert Memory.open("digest", None, store).get("lastUid") == 1042


def test_a_file_made_before_memory_gains_its_tables(path: Path) -> None:
    with SQLiteStore(path) as store:
        store.save(State(id="old", messages=[Message.user("kept")]))
    db = sqlite3.connect(path)
    db.execute("DROP TABLE memory")
    db.execute("DROP TABLE memory_effects")
    db.commit()
    db.close()
    with SQLiteStore(path) as store:
        assert store.load("old").messages[0].text == "kept"
        assert store.memory_get("digest", "kv", "k") is None
        assert store.memory_put("digest", "kv", "k", "1", effect="e") is True
        assert store.memory_get("digest", "kv", "k") == "1"


def test_a_failed_write_records_no_effect_key(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with SQLiteStore(path) as store:
        monkeypatch.setattr(sql, "MEMORY_SET", "INSERT INTO nowhere VALUES (?, ?, ?, ?)")
        with pytest.raises(StoreError, match="no such table: nowhere") as caught:
            store.memory_put("digest", "kv", "k", "1", effect="s:c:0")
        assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
        monkeypatch.undo()
        # The effect key was rolled back with the write: the write applies when retried.
        assert store.memory_put("digest", "kv", "k", "1", effect="s:c:0") is True
        assert store.memory_get("digest", "kv", "k") == "1"


def test_memory_of_a_closed_store_is_refused(path: Path) -> None:
    store = SQLiteStore(path)
    store.close()
    with pytest.raises(ValueError, match="closed"):
        store.memory_get("digest", "kv", "k")


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_both_sqlite_backends_share_the_memory(path: Path) -> None:
    with SQLiteStore(path) as sync_store:
        Memory.open("digest", None, sync_store).set("from", "sqlite3")
        async with AioSQLiteStore(path) as async_store:
            memory = Memory.open("digest", None, async_store)
            assert await memory.aget("from") == "sqlite3"
            await memory.aset("back", "aiosqlite")
            assert await async_store.amemory_put("digest", "kv", "x", "1", effect="e") is True
        assert Memory.open("digest", None, sync_store).get("back") == "aiosqlite"
        assert sync_store.memory_put("digest", "kv", "x", "2", effect="e") is False


@pytest.mark.parametrize("anyio_backend", ["trio"])
@pytest.mark.anyio
async def test_aiosqlite_memory_under_trio_points_at_sqlitestore(path: Path) -> None:
    store = AioSQLiteStore(path)
    with pytest.raises(TypeError, match="SQLiteStore"):
        await store.amemory_get("digest", "kv", "k")
    with pytest.raises(TypeError, match="SQLiteStore"):
        await Memory.open("digest", None, store).aset("k", 1)


_WRITER = """
import sys
from stores import SQLiteStore
with SQLiteStore(sys.argv[1]) as store:
    worker = int(sys.argv[2])
    applied = 0
    for i in range(30):
        store.memory_put("digest", "kv", f"w{worker}-{i}", str(i))
        applied += store.memory_put("digest", "kv", f"race-{i}", str(worker), effect=f"race:{i}")
print(applied)
"""


def test_processes_share_the_memory(path: Path) -> None:
    with SQLiteStore(path) as store:  # made once, so the writers only open it
        store.memory_put("digest", "kv", "start", "0")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path), str(worker)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for worker in range(3)
    ]
    outputs = [worker.communicate(timeout=60) for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0, 0], [err for _, err in outputs]
    assert sum(int(out) for out, _ in outputs) == 30
    with SQLiteStore(path) as store:
        rows = dict(store.memory_scan("digest", "kv"))
    assert len(rows) == 1 + 3 * 30 + 30
