"""`SQLiteStore` commits a small batch on the event loop when nothing can make it wait there.

Otherwise (another process holds the write lock, the log starts again) the batch goes to a
worker thread as before, and the loop never blocks: a second process
holds the lock with ``BEGIN IMMEDIATE`` while a run saves, and a task keeps running meanwhile.
What a commit on the loop writes is what the thread writes, row for row, and another process
follows it. Checkpoints run in the store's checkpointer thread: no save waits for one, the
log stays bounded, and `close` leaves no thread. Orderings are forced with pipes and events,
never with timing.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Generator, Sequence
from pathlib import Path

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from orchestrator import Agent, Message, State
from orchestrator._record._store_client import client_of
from orchestrator.testing import FakeModel, tool_call
from stores import SQLiteStore
from stores._sql import CHECKPOINT_FRAMES
from stores._wal import WalIndex
from stores.backend import NowaitBatchStore
from tests.doubles import add

ROOT = Path(__file__).resolve().parents[2]


class WhereStore(SQLiteStore):
    """A SQLiteStore that notes where each batch was committed: "loop" or "thread"."""

    def __init__(self, path: Path, *, on_loop: bool = True) -> None:
        super().__init__(path)
        self.on_loop = on_loop
        self.where: list[str] = []

    def save_many_nowait(self, states: Sequence[State]) -> dict[int, ValueError] | None:
        refused = super().save_many_nowait(states) if self.on_loop else None
        if refused is not None:
            self.where.append("loop")
        return refused

    def save_many(self, states: Sequence[State]) -> dict[int, ValueError]:
        self.where.append("thread")
        return super().save_many(states)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "runs.db"


def rows(path: Path) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    """Every states row and entries row of the file, in order."""
    db = sqlite3.connect(path)
    try:
        states = db.execute("SELECT * FROM states ORDER BY id").fetchall()
        entries = db.execute("SELECT * FROM entries ORDER BY position").fetchall()
    finally:
        db.close()
    return states, entries


# It holds the lock until told to let go, or for WATCHDOG seconds at most: less than the
# store's 10 s busy timeout, so a save that waited on the lock on the event loop (which then
# cannot tell it to let go) would get the lock when the watchdog lets go, and say "timeout".
LOCK_HOLDER = """
    import select, sqlite3, sys
    db = sqlite3.connect(sys.argv[1], isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    print("held", flush=True)
    told, _, _ = select.select([sys.stdin], [], [], float(sys.argv[2]))
    db.execute("ROLLBACK")
    db.close()
    print("go" if told else "timeout", flush=True)
"""
WATCHDOG = 8.0


@contextlib.contextmanager
def lock_holder(tmp_path: Path, path: Path) -> Generator[subprocess.Popen[str]]:
    """A second process that holds the file's write lock until a line is written to it.

    Start it once the store has opened the file (in WAL mode, its tables made).
    """
    script = tmp_path / "hold.py"
    script.write_text(textwrap.dedent(LOCK_HOLDER), encoding="utf-8")
    process = subprocess.Popen(
        [sys.executable, str(script), str(path), str(WATCHDOG)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()


async def held(process: subprocess.Popen[str]) -> None:
    """Wait until `process` holds the lock."""
    assert process.stdout is not None
    assert await anyio.to_thread.run_sync(process.stdout.readline) == "held\n"


async def release(process: subprocess.Popen[str]) -> None:
    """Tell `process` to let go of the lock; check it was told before its watchdog let go."""
    assert process.stdin is not None
    assert process.stdout is not None
    process.stdin.write("go\n")
    process.stdin.flush()
    assert await anyio.to_thread.run_sync(process.stdout.readline) == "go\n"


def test_sqlite_store_is_a_nowait_batch_store(path: Path) -> None:
    with SQLiteStore(path) as store:
        assert isinstance(store, NowaitBatchStore)


@pytest.mark.anyio
async def test_a_run_commits_on_the_loop_and_loads_the_same(path: Path) -> None:
    with WhereStore(path) as store:
        store.list()  # opened: a store not yet connected saves in a thread
        state = State(id="run", messages=[Message.user("add")])
        model = FakeModel([tool_call("add", a=1, b=2), tool_call("add", a=3, b=4), "done"])
        await Agent(model, tools=[add], store=store).arun(state)
        assert store.where.count("loop") >= 4  # each save point of the three turns
        loaded = store.load("run")
        assert loaded.snapshot() == state.snapshot()
        feed = store.tree_entries("run")
        assert [item.entry.seq for item in feed] == [entry.seq for entry in state.history]


@pytest.mark.anyio
async def test_the_loop_writes_what_the_thread_writes(tmp_path: Path) -> None:
    loop_store = WhereStore(tmp_path / "loop.db")
    thread_store = WhereStore(tmp_path / "thread.db", on_loop=False)
    with loop_store, thread_store:
        loop_store.list()
        thread_store.list()
        loop, thread = client_of(loop_store), client_of(thread_store)
        state = State(id="same", messages=[Message.user("hi")])
        for i in range(4):
            await loop.save(state)
            await thread.save(state)
            state.add_message(Message.user(f"again {i}"))
        others = [State(id=f"other{i}", messages=[Message.user(str(i))]) for i in range(3)]
        assert await loop.save_many([state, *others]) == {}
        assert await thread.save_many([state, *others]) == {}
        assert set(loop_store.where) == {"loop"}
        assert set(thread_store.where) == {"thread"}
    assert rows(tmp_path / "loop.db") == rows(tmp_path / "thread.db")


@pytest.mark.anyio
async def test_a_refused_state_is_refused_on_the_loop_too(path: Path) -> None:
    with WhereStore(path) as store:
        store.list()
        client = client_of(store)
        await client.save(State(id="taken", messages=[Message.user("first")]))
        other = State(id="taken", messages=[Message.user("another history")])
        fine = State(id="fine", messages=[Message.user("ok")])
        refused = await client.save_many([other, fine])
        assert list(refused) == [0]
        assert "load" in str(refused[0])
        assert store.where == ["loop", "loop"]
        assert store.load("fine").snapshot() == fine.snapshot()
        assert store.load("taken").messages[0].text == "first"


@pytest.mark.anyio
async def test_another_process_holding_the_lock_never_blocks_the_loop(
    tmp_path: Path, path: Path
) -> None:
    with WhereStore(path) as store, contextlib.ExitStack() as stack:
        store.list()
        client = client_of(store)
        state = State(id="held", messages=[Message.user("one")])
        await client.save(state)
        assert store.where == ["loop"]
        holder = stack.enter_context(lock_holder(tmp_path, path))
        await held(holder)

        state.add_message(Message.user("two"))
        saved = anyio.Event()
        ticks = 0

        async def save() -> None:
            await client.save(state)
            saved.set()

        with anyio.fail_after(60):  # a blocked loop fails here (or on the busy timeout)
            async with anyio.create_task_group() as group:
                group.start_soon(save)
                while ticks < 200:  # the loop runs other tasks while the save waits
                    await anyio.lowlevel.checkpoint()
                    ticks += 1
                assert not saved.is_set()  # the lock is still held: it cannot have committed
                await release(holder)
                await saved.wait()
        assert store.where == ["loop", "thread"]  # declined on the loop, waited in a thread
        assert [m.text for m in store.load("held").messages] == ["one", "two"]

        state.add_message(Message.user("three"))
        await client.save(state)  # the lock is free again: back on the loop
        assert store.where == ["loop", "thread", "loop"]


@pytest.mark.anyio
async def test_a_run_goes_on_while_another_process_holds_the_lock(
    tmp_path: Path, path: Path
) -> None:
    with WhereStore(path) as store, contextlib.ExitStack() as stack:
        store.list()
        holder = stack.enter_context(lock_holder(tmp_path, path))
        await held(holder)
        state = State(id="run", messages=[Message.user("add")])
        model = FakeModel([tool_call("add", a=1, b=2), "done"])
        finished = anyio.Event()

        async def run() -> None:
            await Agent(model, tools=[add], store=store).arun(state)
            finished.set()

        with anyio.fail_after(60):
            async with anyio.create_task_group() as group:
                group.start_soon(run)
                for _ in range(200):
                    await anyio.lowlevel.checkpoint()
                assert not finished.is_set()  # its first save waits for the lock, in a thread
                await release(holder)
        assert "thread" in store.where
        assert store.load("run").snapshot() == state.snapshot()


def padding(path: Path, pages: int) -> None:
    """Grow the file's log by about `pages` frames from another connection (no checkpoint)."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("PRAGMA wal_autocheckpoint = 0")
        db.execute("CREATE TABLE IF NOT EXISTS padding (data BLOB)")
        db.execute("INSERT INTO padding VALUES (zeroblob(?))", (pages * 4096,))
    finally:
        db.close()


def wait_for_restart(path: Path) -> int:
    """Wait until the file's log is shorter than a due checkpoint's; the size of its file.

    The checkpointer runs in its own thread: this polls the log's index, 30 s at most.
    """
    wal = WalIndex(str(path))
    try:
        for _ in range(6000):
            if (wal.frames() or (CHECKPOINT_FRAMES, 0))[0] < CHECKPOINT_FRAMES:
                return os.path.getsize(str(path) + "-wal")
            time.sleep(0.005)
        raise AssertionError("the checkpointer did not start the log again in 30 s")
    finally:
        wal.close()


async def log_started_again(path: Path) -> int:
    """`wait_for_restart` in a worker thread."""
    return await anyio.to_thread.run_sync(wait_for_restart, path)


def checkpoint_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("checkpoint ")]


@pytest.mark.anyio
async def test_a_due_checkpoint_runs_off_the_turn(path: Path) -> None:
    with WhereStore(path) as store:
        store.list()
        client = client_of(store)
        state = State(id="s", messages=[Message.user("one")])
        await client.save(state)
        padding(path, 1200)  # past the 1000 frames of SQLite's automatic checkpoint
        state.add_message(Message.user("two"))
        await client.save(state)  # appended on the loop; the checkpointer is woken
        await log_started_again(path)
        await store.alist()  # takes the store's lock: the checkpointer's pass let go of it
        for text in ("three", "four"):  # the log was started again: they only append
            state.add_message(Message.user(text))
            await client.save(state)
        assert store.where == ["loop"] * 4  # no save waited for the checkpoint
        db = sqlite3.connect(path)
        try:
            busy, frames, copied = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        finally:
            db.close()
        assert busy == 0
        assert frames == copied
        assert frames < 1000  # the log started again after the checkpoint
        assert [m.text for m in store.load("s").messages] == ["one", "two", "three", "four"]
    assert checkpoint_threads() == []


@pytest.mark.anyio
async def test_the_log_stays_bounded_over_many_saves(path: Path) -> None:
    big = "x" * 40_000  # about 15 pages of the log a save
    rounds, saves = 5, 120  # some 1,800 pages a round
    size = 0
    written = 0  # pages the saves wrote to the log, counted from its index
    state = State(id="s", messages=[Message.user("go")])
    with SQLiteStore(path) as store:
        store.list()
        client = client_of(store)
        wal = WalIndex(str(path))
        try:
            for _ in range(rounds):
                for _ in range(saves):
                    before = (wal.frames() or (0, 0))[0]
                    state.add_message(Message.user(big))
                    await client.save(state)
                    after = (wal.frames() or (0, 0))[0]
                    written += after - before if after >= before else after  # or started again
                size = await log_started_again(path)
        finally:
            wal.close()
        assert checkpoint_threads() != []
    assert checkpoint_threads() == []  # close() stopped and joined it
    # The log's file holds about one round's pages, not all five rounds': it started again.
    assert written > rounds * CHECKPOINT_FRAMES
    assert size < written / 2 * 4096
    with SQLiteStore(path) as again:
        assert again.load("s").snapshot() == state.snapshot()


def test_a_store_dropped_unclosed_ends_its_checkpoint_thread(path: Path) -> None:
    store = SQLiteStore(path)
    state = State(id="s", messages=[Message.user("one")])
    store.save(state)
    padding(path, 1200)
    state.add_message(Message.user("two"))
    store.save(state)  # wakes the checkpointer
    wait_for_restart(path)
    assert checkpoint_threads() != []
    del store, state  # a saved State is bound to its store
    gc.collect()
    for _ in range(6000):  # 30 s at most: the thread ends once it sees the store is gone
        if not checkpoint_threads():
            break
        time.sleep(0.005)
    assert checkpoint_threads() == []


def test_a_store_that_never_checkpoints_starts_no_thread(path: Path) -> None:
    with SQLiteStore(path) as store:
        store.save(State(id="s", messages=[Message.user("one")]))
        assert checkpoint_threads() == []


@pytest.mark.anyio
async def test_a_due_checkpoint_and_another_process_holding_the_lock_never_block_the_loop(
    tmp_path: Path, path: Path
) -> None:
    with WhereStore(path) as store, contextlib.ExitStack() as stack:
        store.list()
        client = client_of(store)
        state = State(id="s", messages=[Message.user("one")])
        await client.save(state)
        padding(path, 1200)  # a checkpoint is due
        holder = stack.enter_context(lock_holder(tmp_path, path))
        await held(holder)
        state.add_message(Message.user("two"))
        saved = anyio.Event()

        async def save() -> None:
            await client.save(state)
            saved.set()

        with anyio.fail_after(60):
            async with anyio.create_task_group() as group:
                group.start_soon(save)
                for _ in range(200):  # the loop runs other tasks while the save waits
                    await anyio.lowlevel.checkpoint()
                assert not saved.is_set()
                await release(holder)
                await saved.wait()
        assert store.where == ["loop", "thread"]  # waited in a thread; it woke the checkpointer
        await log_started_again(path)
        await store.alist()  # the checkpointer let go of the store's lock
        state.add_message(Message.user("three"))
        await client.save(state)
        assert store.where == ["loop", "thread", "loop"]
        assert [m.text for m in store.load("s").messages] == ["one", "two", "three"]


@pytest.mark.anyio
async def test_a_large_batch_goes_to_the_thread(path: Path) -> None:
    with WhereStore(path) as store:
        store.list()
        states = [State(id=f"s{i}", messages=[Message.user(str(i))]) for i in range(40)]
        assert await client_of(store).save_many(states) == {}
        assert store.where == ["thread"]
        assert len(store.list()) == 40


FOLLOWER = """
    import sys
    from stores import SQLiteStore
    with SQLiteStore(sys.argv[1]) as store:
        state = store.load("run")
        feed = store.tree_entries("run")
        print(len(state.history), [item.entry.seq for item in feed] == list(range(len(feed))))
"""


@pytest.mark.anyio
async def test_another_process_follows_what_the_loop_committed(tmp_path: Path, path: Path) -> None:
    with WhereStore(path) as store:
        store.list()
        state = State(id="run", messages=[Message.user("add")])
        model = FakeModel([tool_call("add", a=1, b=2), "done"])
        await Agent(model, tools=[add], store=store).arun(state)
        assert "loop" in store.where
        script = tmp_path / "follow.py"
        script.write_text(textwrap.dedent(FOLLOWER), encoding="utf-8")
        done = await anyio.run_process(
            [sys.executable, str(script), str(path)], cwd=ROOT, check=False
        )
        assert done.returncode == 0, done.stderr.decode()
        assert done.stdout.decode().split() == [str(len(state.history)), "True"]


def test_the_wal_index_reads_what_sqlite_reports(path: Path) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA wal_autocheckpoint = 0")
        db.execute("CREATE TABLE t (x)")
        wal = WalIndex(str(path))
        for i in range(5):
            db.execute("INSERT INTO t VALUES (?)", (i,))
        frames = wal.frames()
        busy, log, copied = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        assert (busy, copied) == (0, log)
        assert frames == (log, 0)  # before the checkpoint: none copied back
        assert wal.frames() == (log, log)
        db.execute("INSERT INTO t VALUES (5)")  # the log starts again
        assert wal.frames() == (1, 0)
        wal.close()
        assert wal.frames() is None
    finally:
        db.close()


def test_an_index_that_is_missing_is_refused(path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        WalIndex(str(path))  # no file open in WAL mode: no -shm


@pytest.mark.anyio
async def test_without_a_readable_index_every_save_goes_to_the_thread(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(os, "pread")  # as on Windows
    with WhereStore(path) as store:
        store.list()
        client = client_of(store)
        state = State(id="s", messages=[Message.user("one")])
        await client.save(state)
        state.add_message(Message.user("two"))
        await client.save(state)
        assert store.where == ["thread", "thread"]
        assert [m.text for m in store.load("s").messages] == ["one", "two"]


@pytest.mark.anyio
async def test_only_a_write_checkpoints_a_long_log(path: Path) -> None:
    with SQLiteStore(path) as store:
        state = State(id="s", messages=[Message.user("one")])
        store.save(state)
        padding(path, 1200)
        wal = WalIndex(str(path))
        try:
            store.load("s")
            store.list()
            frames, copied = wal.frames() or (0, 0)
            assert frames >= 1000
            assert copied == 0  # reads leave the log as it is
            assert checkpoint_threads() == []
            state.add_message(Message.user("two"))
            store.save(state)  # a write, in sync code: the checkpointer is woken
            await log_started_again(path)
            frames, copied = wal.frames() or (0, 0)
            assert frames < 1000
            assert [m.text for m in store.load("s").messages] == ["one", "two"]
        finally:
            wal.close()
