"""`AioSQLiteStore`: async only, asyncio only, and the same file as `SQLiteStore`.

Its tests run on asyncio by parametrization (aiosqlite needs asyncio); the one that shows the
error under trio runs on trio.
"""

from __future__ import annotations

import gc
import os
import sqlite3
import sys
import textwrap
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import anyio
import pytest

from orchestrator import (
    Agent,
    AsyncStore,
    ErrorEntry,
    Message,
    State,
    StoreDamagedError,
    StoreError,
    ToolResultEntry,
)
from orchestrator._record._store_client import client_of
from orchestrator.testing import FakeModel, tool_call
from stores import AioSQLiteStore, SQLiteStore
from stores._sql import FORMAT as SQLITE_FORMAT
from stores.backend import storage_view
from tests.doubles import add, assert_same, bound_store, reseal_sql, results, write_sql

ROOT = Path(__file__).resolve().parents[2]
on_asyncio = pytest.mark.parametrize("anyio_backend", ["asyncio"])
pytestmark = pytest.mark.anyio


@pytest.fixture
async def store(path: Path) -> AsyncIterator[AioSQLiteStore]:
    async with AioSQLiteStore(path) as store:
        yield store


# What it is -----------------------------------------------------------------------------------


def test_it_is_an_async_store_that_says_it_is_async_only(path: Path) -> None:
    store = AioSQLiteStore(path)
    assert isinstance(store, AsyncStore)
    assert AioSQLiteStore.async_only is True
    assert AioSQLiteStore.asyncio_only is True
    assert repr(store) == f"AioSQLiteStore({str(path)!r})"
    assert store.path == str(path)


SYNC_CALLS: dict[str, Callable[[AioSQLiteStore], object]] = {
    "asave": lambda store: store.save(State()),
    "aload": lambda store: store.load("x"),
    "alist": lambda store: store.list(),
    "adelete": lambda store: store.delete("x"),
}


@pytest.mark.parametrize("method", SYNC_CALLS)
def test_sync_methods_raise_type_error_naming_the_async_method(path: Path, method: str) -> None:
    with pytest.raises(TypeError, match=rf"await store\.{method}\(.*SQLiteStore"):
        SYNC_CALLS[method](AioSQLiteStore(path))
    assert not path.exists()


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_under_trio_it_raises_naming_sqlite_store(path: Path) -> None:
    store = AioSQLiteStore(path)
    calls = [store.asave(State()), store.aload("x"), store.alist(), store.adelete("x")]
    for call in calls:
        with pytest.raises(TypeError, match=r"outside asyncio.*Use SQLiteStore\(path\)"):
            await call
    with pytest.raises(TypeError, match="SQLiteStore"):
        await Agent(FakeModel(["hi"]), store=store).arun("hello")
    assert not await anyio.Path(path).exists()


# Saving and loading ---------------------------------------------------------------------------


@on_asyncio
async def test_a_run_round_trips_in_the_file_sqlite_store_reads(
    store: AioSQLiteStore, path: Path
) -> None:
    state = State(messages=[Message.user("What is 1 + 2?")], extra_data={"k": [1, "two"]})
    model = FakeModel([tool_call("add", a=1, b=2), "It is 3."])
    assert await Agent(model, tools=[add], store=store).arun(state) == "It is 3."
    loaded = await store.aload(state.id)
    assert_same(loaded, state)
    assert bound_store(loaded) is store  # private: the binding has no public accessor
    assert await store.alist() == [storage_view(state).info]
    with SQLiteStore(path) as sync_store:  # one format for both backends
        assert_same(await sync_store.aload(state.id), state)
        loaded.add_message(Message.user("And now?"))
        await Agent(FakeModel(["Still 3."]), store=sync_store).arun(loaded)
    assert_same(await store.aload(state.id), loaded)


@on_asyncio
async def test_a_long_state_saves_and_loads_through_a_worker_thread(
    store: AioSQLiteStore,
) -> None:
    state = State(messages=[Message.user(f"m{i}") for i in range(400)])
    await store.asave(state)
    for i in range(400):
        state.add_message(Message.user(f"more {i}"))
    await store.asave(state)
    assert_same(await store.aload(state.id), state)
    assert [info.entries for info in await store.alist()] == [401]


@on_asyncio
async def test_another_history_under_a_taken_id_is_refused(store: AioSQLiteStore) -> None:
    await store.asave(State(id="taken", messages=[Message.user("first")]))
    with pytest.raises(ValueError, match=r"store\.load\('taken'\)"):
        await store.asave(State(id="taken", messages=[Message.user("second")]))
    assert (await store.aload("taken")).messages[0].text == "first"


@on_asyncio
async def test_a_save_after_another_connection_wrote_reads_the_stored_end_again(
    path: Path,
) -> None:
    async with AioSQLiteStore(path) as first, AioSQLiteStore(path) as second:
        state = State(id="shared", messages=[Message.user("one")])
        await first.asave(state)
        theirs = await second.aload("shared")
        theirs.add_message(Message.user("theirs"))
        await second.asave(theirs)
        state.add_message(Message.user("ours"))
        with pytest.raises(ValueError, match="entry 1 differs"):
            await first.asave(state)
        assert_same(await first.aload("shared"), theirs)
        again = State(messages=[Message.user("again")])
        await first.asave(again)
        await first.adelete(again.id)
        again.add_message(Message.user("more"))
        await first.asave(again)  # deleted through this connection: written whole again
        assert_same(await second.aload(again.id), again)


ANOTHER_PROCESS = """
    import asyncio, sys
    from orchestrator import Message
    from stores import AioSQLiteStore

    async def main(path, state_id, action):
        async with AioSQLiteStore(path) as store:
            if action == "delete":
                await store.adelete(state_id)
            else:
                theirs = await store.aload(state_id)
                theirs.add_message(Message.user(action))
                await store.asave(theirs)

    asyncio.run(main(*sys.argv[1:]))
"""


@on_asyncio
async def test_a_save_after_another_process_wrote_reads_the_stored_end_again(
    store: AioSQLiteStore, path: Path, tmp_path: Path
) -> None:
    # The store writes after the ends it remembers while the file's data version stays where it
    # was; a commit by another process moves it, and the next save must read the ends again.
    script = tmp_path / "other.py"
    script.write_text(textwrap.dedent(ANOTHER_PROCESS), encoding="utf-8")

    async def other(action: str) -> None:
        command = [sys.executable, str(script), str(path), "shared", action]
        done = await anyio.run_process(command, cwd=ROOT, check=False)
        assert done.returncode == 0, done.stderr.decode()

    state = State(id="shared", messages=[Message.user("one")])
    await store.asave(state)
    state.add_message(Message.user("two"))
    await store.asave(state)  # its end is remembered now
    await other("theirs")
    state.add_message(Message.user("ours"))
    with pytest.raises(ValueError, match="entry 2 differs"):
        await store.asave(state)
    assert [m.text for m in (await store.aload("shared")).messages] == ["one", "two", "theirs"]
    await other("delete")
    await store.asave(state)  # the other process deleted it: written whole again
    assert_same(await store.aload("shared"), state)


@on_asyncio
async def test_a_save_that_fails_after_its_states_row_is_written_leaves_nothing(
    store: AioSQLiteStore, path: Path
) -> None:
    # A save of a remembered end writes its states row first, then the entries: the two are one
    # transaction, so a failure of the second takes the first back.
    state = State(id="atomic", messages=[Message.user("one")])
    await store.asave(state)
    fail = "SELECT RAISE(ABORT, 'refused by the test')"
    trigger = f"CREATE TRIGGER refuse BEFORE INSERT ON entries WHEN NEW.seq = 2 BEGIN {fail}; END"
    write_sql(path, trigger)
    state.add_message(Message.user("two"))
    await store.asave(state)  # another connection made the trigger: this save reads the end again
    state.add_message(Message.user("three"))
    with pytest.raises(StoreError, match="refused by the test"):
        await store.asave(state)  # from the remembered end
    write_sql(path, "DROP TRIGGER refuse")
    assert [info.entries for info in await store.alist()] == [2]
    assert [m.text for m in (await store.aload("atomic")).messages] == ["one", "two"]
    await store.asave(state)
    assert_same(await store.aload("atomic"), state)


@on_asyncio
async def test_delete_and_list_by_parent(store: AioSQLiteStore) -> None:
    researcher = Agent(FakeModel(["Found it."]), name="researcher", description="Looks up.")
    parent = State(messages=[Message.user("look it up")])
    model = FakeModel([tool_call("researcher", task="look"), "Done."])
    await Agent(model, tools=[researcher.as_tool()], store=store).arun(parent)
    (child_id,) = [child for e in results(parent) for child in e.child_ids]
    assert [info.id for info in await store.alist(parent_id=parent.id)] == [child_id]
    assert len(await store.alist(limit=1)) == 1
    await store.adelete(child_id)
    await store.adelete(child_id)
    assert [info.id for info in await store.alist()] == [parent.id]
    with pytest.raises(LookupError, match=child_id):
        await store.aload(child_id)


@on_asyncio
async def test_children_of_a_loaded_state_open_with_achild_only(store: AioSQLiteStore) -> None:
    researcher = Agent(FakeModel(["Found it."]), name="researcher", description="Looks up.")
    parent = State(messages=[Message.user("look it up")])
    model = FakeModel([tool_call("researcher", task="look"), "Done."])
    await Agent(model, tools=[researcher.as_tool()], store=store).arun(parent)
    (child_id,) = [child for e in results(parent) for child in e.child_ids]
    loaded = await store.aload(parent.id)
    with pytest.raises(TypeError, match="achild"):
        loaded.child(child_id)
    child = await loaded.achild(child_id)
    assert child.answer == "Found it."
    assert child.parent_id == parent.id


# Damage, ids, format versions, closing -------------------------------------------------------


@on_asyncio
async def test_a_damaged_entry_names_the_state_and_index(store: AioSQLiteStore, path: Path) -> None:
    damaged = State(id="damaged", messages=[Message.user("a"), Message.user("b")])
    healthy = State(id="healthy", messages=[Message.user("fine")])
    await store.asave(damaged)
    await store.asave(healthy)
    write_sql(path, "UPDATE entries SET data = ? WHERE state_id = 'damaged' AND seq = 0", b"[1")
    with pytest.raises(StoreDamagedError, match=r"'damaged' is damaged: history entry 0 fails"):
        await store.aload("damaged")
    reseal_sql(path, "damaged")
    with pytest.raises(StoreDamagedError, match=r"'damaged' is damaged: history entry 0 cannot"):
        await store.aload("damaged")
    assert_same(await store.aload("healthy"), healthy)
    with pytest.raises(ValueError, match=r"'\.\./x' is not valid"):
        await store.aload("../x")
    with pytest.raises(ValueError, match=r"'\.\./x' is not valid"):
        await store.adelete("../x")


@on_asyncio
@pytest.mark.parametrize("found", [0, SQLITE_FORMAT + 1])
async def test_another_format_version_is_refused_naming_both(path: Path, found: int) -> None:
    state = State(messages=[Message.user("kept")])
    async with AioSQLiteStore(path) as store:
        await store.asave(state)
    write_sql(path, "UPDATE meta SET value = ? WHERE key = 'format_version'", found)
    message = rf"format version {found}, but this orchestrator reads version {SQLITE_FORMAT}"
    async with AioSQLiteStore(path) as store:
        with pytest.raises(ValueError, match=message):
            await store.aload(state.id)
    write_sql(path, "UPDATE meta SET value = ? WHERE key = 'format_version'", SQLITE_FORMAT)
    async with AioSQLiteStore(path) as store:
        assert_same(await store.aload(state.id), state)


@pytest.mark.anyio
@on_asyncio
async def test_an_open_store_refuses_to_save_into_a_newer_format(path: Path) -> None:
    # DESIGN 9: "a newer or older format is refused with a message naming both versions" - by
    # a store that was open (and saved) before the format changed, too.
    newer = SQLITE_FORMAT + 1
    async with AioSQLiteStore(path) as store:
        state = State(id="versioned", messages=[Message.user("a")])
        await store.asave(state)
        write_sql(path, "UPDATE meta SET value = ? WHERE key = 'format_version'", newer)
        state.add_message(Message.user("b"))
        with pytest.raises(ValueError, match=rf"version {newer}\b.*version {SQLITE_FORMAT}\b"):
            await store.asave(state)


@on_asyncio
async def test_a_file_that_is_not_a_database_is_refused(path: Path) -> None:
    await anyio.Path(path).write_bytes(b"not an SQLite file at all" * 100)
    async with AioSQLiteStore(path) as store:
        with pytest.raises(StoreDamagedError, match=r"is damaged .*not a database") as caught:
            await store.alist()
    assert isinstance(caught.value.__cause__, sqlite3.DatabaseError)


@on_asyncio
async def test_a_closed_store_says_so(path: Path) -> None:
    store = AioSQLiteStore(path)
    await store.asave(State())
    await store.aclose()
    await store.aclose()
    with pytest.raises(ValueError, match="is closed"):
        await store.alist()


@on_asyncio
@pytest.mark.timeout(30)
async def test_an_unclosed_store_closes_when_collected(tmp_path: Path) -> None:
    """A store dropped without `aclose` ends its thread and closes its files, as SQLiteStore."""

    def workers() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if "_connection_worker_thread" in t.name}

    async with AioSQLiteStore(tmp_path / "first.db") as first:  # anyio's worker thread, warm
        await first.asave(State())
    fds = set(os.listdir("/proc/self/fd"))
    started: set[threading.Thread] = set()
    for index in range(3):
        before = workers()
        store = AioSQLiteStore(tmp_path / f"{index}.db")
        await store.asave(State(messages=[Message.user("hi")]))
        (thread,) = workers() - before  # its own connection's thread (the last may be collected)
        started.add(thread)
        del store
    gc.collect()
    for thread in started:
        thread.join(timeout=5)  # bounded: an unclosed connection's thread never ends
    assert not any(thread.is_alive() for thread in started)
    assert set(os.listdir("/proc/self/fd")) <= fds
    with SQLiteStore(tmp_path / "0.db") as again:  # what was saved is there
        assert [info.title for info in again.list()] == ["hi"]


def test_a_folder_is_refused_when_the_store_is_made(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is a folder: give a file in it") as refused:
        AioSQLiteStore(tmp_path)
    assert repr(str(tmp_path / "runs.db")) in str(refused.value)
    assert f"FileStore({str(tmp_path)!r})" in str(refused.value)


@on_asyncio
async def test_a_save_cancelled_before_it_starts_writes_nothing(store: AioSQLiteStore) -> None:
    state = State(messages=[Message.user("hi")])
    with anyio.CancelScope() as scope:
        scope.cancel()
        await store.asave(state)
    assert scope.cancelled_caught
    assert await store.alist() == []
    await store.asave(state)
    assert_same(await store.aload(state.id), state)


def test_one_store_serves_runs_on_successive_event_loops(path: Path) -> None:
    store = AioSQLiteStore(path)
    state = State(messages=[Message.user("first")])
    Agent(FakeModel(["one"]), store=store).run(state)  # each sync run has its own loop
    state.add_message(Message.user("second"))
    Agent(FakeModel(["two"]), store=store).run(state)

    async def check() -> None:
        assert_same(await store.aload(state.id), state)
        await store.aclose()

    anyio.run(check)


# Concurrent runs, crash recovery --------------------------------------------------------------


@on_asyncio
async def test_fifty_concurrent_runs_share_one_store(store: AioSQLiteStore) -> None:
    states = [State(messages=[Message.user(f"run {i}")]) for i in range(50)]

    async def run(i: int) -> None:
        model = FakeModel([tool_call("add", a=i, b=1), f"answer {i + 1}"])
        await Agent(model, tools=[add], store=store).arun(states[i])

    async with anyio.create_task_group() as group:
        for i in range(50):
            group.start_soon(run, i)
    assert len(await store.alist()) == 50
    for i, state in enumerate(states):
        loaded = await store.aload(state.id)
        assert_same(loaded, state)
        assert loaded.answer == f"answer {i + 1}"


@on_asyncio
async def test_two_connections_to_one_file_write_at_once_without_locked_errors(
    path: Path,
) -> None:
    async with AioSQLiteStore(path) as first, AioSQLiteStore(path) as second:
        with SQLiteStore(path) as third:
            stores: list[AsyncStore] = [first, second, third]
            states = [State(messages=[Message.user(f"writer {i}")]) for i in range(12)]

            async def write(i: int) -> None:
                store = stores[i % 3]
                for turn in range(15):
                    states[i].add_message(Message.user(f"turn {turn}"))
                    await store.asave(states[i])

            async with anyio.create_task_group() as group:
                for i in range(len(states)):
                    group.start_soon(write, i)
        for state in states:
            assert_same(await second.aload(state.id), state)
        assert len(await first.alist()) == 12


CRASH_IN_TOOL = """
    import asyncio, os, sys
    from orchestrator import Agent, Message, State, tool
    from orchestrator.testing import FakeModel, tool_call
    from stores._aiosqlite import AioSQLiteStore

    @tool
    async def deploy(target: str) -> str:
        \"\"\"Deploy somewhere.\"\"\"
        os._exit(1)

    async def main():
        store = AioSQLiteStore(sys.argv[1])
        state = State(id="crashed", messages=[Message.user("Deploy it")])
        model = FakeModel([tool_call("deploy", target="prod")])
        await Agent(model, tools=[deploy], store=store).arun(state)

    asyncio.run(main())
"""


@on_asyncio
async def test_a_crash_inside_a_tool_gives_the_call_an_unknown_result(
    tmp_path: Path, path: Path
) -> None:
    script = tmp_path / "crash.py"
    script.write_text(textwrap.dedent(CRASH_IN_TOOL), encoding="utf-8")
    done = await anyio.run_process([sys.executable, str(script), str(path)], cwd=ROOT, check=False)
    assert done.returncode == 1, done.stderr.decode()
    async with AioSQLiteStore(path) as store:
        state = await store.aload("crashed")
        result = state.history[-1]
        assert isinstance(result, ToolResultEntry)
        assert result.outcome == "unknown"
        assert "may or may not have run" in result.content.text
        model = FakeModel(["I could not tell whether it deployed."])
        await Agent(model, store=store).arun(state)
        again = await store.aload("crashed")
    assert_same(again, state)
    assert not [e for e in again.history if isinstance(e, ErrorEntry)]
    assert again.answer == "I could not tell whether it deployed."


@on_asyncio
async def test_concurrent_saves_share_transactions_and_refusals_stay_per_state(path: Path) -> None:
    # The saves an agent makes go through the core's group commit (its store's client).
    class CountingStore(AioSQLiteStore):
        def __init__(self, path: Path) -> None:
            super().__init__(path)
            self.batches: list[int] = []

        async def asave_many(self, states: Sequence[State]) -> dict[int, ValueError]:
            self.batches.append(len(states))
            return await super().asave_many(states)

    async with CountingStore(path) as store:
        await store.asave(State(id="taken", messages=[Message.user("first")]))
        states = [State(id=f"s{i}", messages=[Message.user(str(i))]) for i in range(50)]
        impostor = State(id="taken", messages=[Message.user("another history")])
        refused: list[BaseException] = []
        client = client_of(store)

        async def save(state: State) -> None:
            await client.save(state)

        async def save_impostor() -> None:
            try:
                await save(impostor)
            except ValueError as error:
                refused.append(error)

        async with anyio.create_task_group() as group:
            for state in states:
                group.start_soon(save, state)
            group.start_soon(save_impostor)
        assert sum(store.batches) == 51
        assert len(store.batches) < 51  # saves that waited went out together
        assert len(refused) == 1
        assert "taken" in str(refused[0])
        for state in states:
            assert (await store.aload(state.id)).history == state.history
        assert (await store.aload("taken")).messages[0].text == "first"
