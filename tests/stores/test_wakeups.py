"""Followers woken by their store's saves in this process, not by the poll (`Wakeups`).

The store tests that follow a tree with the poll made endless (`POLL_FIRST`, `POLL_MOST` an
hour) return only if the save itself woke the follower; each follower first reads the empty
feed, so the save lands while it waits. ``fail_after`` only bounds a hang.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

import stores.backend
from orchestrator import Agent, Message, State, TreeEntry
from orchestrator.testing import FakeModel
from stores import AioSQLiteStore, FileStore, MemoryStore, SQLiteStore
from stores._contract_tree import linked
from stores.backend import Wakeups, poll_entries

pytestmark = pytest.mark.anyio

_HOUR = 3600.0


@pytest.fixture
def no_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """The poll of another process's saves looks once, then in an hour: only a wake is seen."""
    monkeypatch.setattr(stores.backend, "POLL_FIRST", _HOUR)
    monkeypatch.setattr(stores.backend, "POLL_MOST", _HOUR)


# -- Wakeups -----------------------------------------------------------------------------------


async def test_a_wake_from_a_worker_thread_ends_the_wait() -> None:
    wakeups = Wakeups()
    with wakeups.watching("run") as waiter:
        await anyio.to_thread.run_sync(wakeups.wake, ["run"])
        with anyio.fail_after(10):
            assert await waiter.wait() is True


async def test_a_wake_before_the_wait_is_kept_and_used_once() -> None:
    wakeups = Wakeups()
    with wakeups.watching("run") as waiter:
        wakeups.wake(["run"])
        wakeups.wake(["run"])  # a second one while one is pending adds nothing
        assert await waiter.wait(0) is True
        assert await waiter.wait(0) is False


async def test_only_the_keys_watched_wake_and_only_inside_the_block() -> None:
    wakeups = Wakeups()
    with wakeups.watching("a", "b") as waiter:
        wakeups.wake(["c"])
        assert await waiter.wait(0) is False
        wakeups.wake(["b"])
        assert await waiter.wait(0) is True
    assert repr(wakeups) == "<Wakeups keys=0>"
    wakeups.wake(["a"])  # nobody watches: nothing happens
    assert await waiter.wait(0) is False


async def test_a_save_wakes_the_followers_of_its_known_ancestors() -> None:
    wakeups = Wakeups()
    wakeups.saved([("root", None), ("kid", "root")])
    with wakeups.watching("root") as root, wakeups.watching("kid") as kid:
        wakeups.saved([("grandkid", "kid")])
        assert await root.wait(0) is True
        assert await kid.wait(0) is True
        wakeups.saved([("stranger", "elsewhere")])
        assert await root.wait(0) is False


async def test_links_are_bounded_the_oldest_forgotten_first() -> None:
    wakeups = Wakeups(links=2)
    wakeups.saved([("a", "root"), ("b", "root"), ("c", "root")])
    with wakeups.watching("root") as root:
        wakeups.saved([("a", None)])  # its link was the oldest: forgotten
        assert await root.wait(0) is False
        wakeups.saved([("c", None)])
        assert await root.wait(0) is True


async def test_poll_entries_needs_a_probe_or_a_watching() -> None:
    async def read() -> tuple[int, ...]:
        return ()

    with pytest.raises(TypeError, match="probe"):
        await poll_entries(read, None)


# -- stores ------------------------------------------------------------------------------------


_AnyStore = MemoryStore | SQLiteStore | AioSQLiteStore | FileStore


async def _follow_then_save(
    monkeypatch: pytest.MonkeyPatch,
    store: _AnyStore,
    root: State,
    save: Callable[[], Awaitable[None]],
) -> tuple[TreeEntry, ...]:
    """Follow the tree of `root` from its end; once its first read is done, `save()`."""
    end = (await store.atree_entries(root.id))[-1].cursor
    read_once = anyio.Event()
    reads = 0
    original = type(store).atree_entries

    async def atree_entries(
        self: _AnyStore, root_id: str, *, after: str | None = None, limit: int | None = None
    ) -> tuple[TreeEntry, ...]:
        nonlocal reads
        found = await original(self, root_id, after=after, limit=limit)  # pyright: ignore[reportArgumentType]
        reads += 1
        read_once.set()
        return found

    monkeypatch.setattr(type(store), "atree_entries", atree_entries)
    found: tuple[TreeEntry, ...] = ()

    async def follow() -> None:
        nonlocal found
        found = await store.await_tree_entries(root.id, after=end)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(follow)
            await read_once.wait()
            await save()
    assert reads == 2  # the empty feed, then once after the wake
    return found


def _states(found: tuple[TreeEntry, ...]) -> set[str]:
    return {item.state_id for item in found}


async def test_a_memory_store_wakes_a_follower_when_another_event_loop_saves(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = MemoryStore()
    root = State(id="root", messages=[Message.user("go")])
    store.save(root)

    async def save_in_another_thread_and_loop() -> None:
        async def save() -> None:
            await store.asave(linked("kid", "root"))

        def run() -> None:
            anyio.run(save, backend="trio" if anyio_backend == "asyncio" else "asyncio")

        thread = threading.Thread(target=run)
        thread.start()
        await anyio.to_thread.run_sync(thread.join)

    found = await _follow_then_save(monkeypatch, store, root, save_in_another_thread_and_loop)
    assert _states(found) == {"kid"}


@pytest.mark.usefixtures("no_poll")
async def test_an_sqlite_store_wakes_a_follower_of_the_tree_when_a_grandchild_saves(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with SQLiteStore(path) as store:
        root = State(id="root", messages=[Message.user("go")])
        store.save(root)
        kid = linked("kid", "root")
        store.save(kid)
        grandkid = linked("grandkid", "kid")

        async def save() -> None:
            await store.asave(grandkid)  # in a worker thread

        found = await _follow_then_save(monkeypatch, store, root, save)
    assert _states(found) == {"grandkid"}


@pytest.mark.usefixtures("no_poll")
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_aiosqlite_store_wakes_a_follower_when_a_batch_saves(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with AioSQLiteStore(path) as store:
        root = State(id="root", messages=[Message.user("go")])
        await store.asave(root)

        async def save() -> None:
            root.add_message(Message.user("on"))
            await store.asave_many([root, linked("kid", "root")])

        found = await _follow_then_save(monkeypatch, store, root, save)
    assert _states(found) == {"kid", "root"}


@pytest.mark.usefixtures("no_poll")
async def test_a_file_store_wakes_a_follower_of_the_tree(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(root)
    run = State(id="run", messages=[Message.user("go")])
    store.save(run)

    async def save() -> None:
        run.add_message(Message.user("on"))
        await store.asave(run)

    found = await _follow_then_save(monkeypatch, store, run, save)
    assert [(item.state_id, item.index) for item in found] == [("run", 1)]


@pytest.mark.usefixtures("no_poll")
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_save_through_another_store_object_on_the_file_wakes_the_follower(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with AioSQLiteStore(path) as followed:
        root = State(id="root", messages=[Message.user("go")])
        await followed.asave(root)
        with SQLiteStore(path) as other:

            async def save() -> None:
                await other.asave(linked("kid", "root"))  # another connection, a worker thread

            found = await _follow_then_save(monkeypatch, followed, root, save)
    assert _states(found) == {"kid"}


@pytest.mark.usefixtures("no_poll")
async def test_an_sqlite_store_wakes_a_follower_when_a_run_saves_on_the_event_loop(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A run's saves commit on the event loop (`save_many_nowait`) when they need not wait.
    with SQLiteStore(path) as store:
        root = State(id="root", messages=[Message.user("go")])
        store.save(root)
        nowait = 0
        original = SQLiteStore.save_many_nowait

        def save_many_nowait(self: SQLiteStore, states: Sequence[State]) -> Any:
            nonlocal nowait
            refused = original(self, states)
            nowait += refused is not None
            return refused

        monkeypatch.setattr(SQLiteStore, "save_many_nowait", save_many_nowait)

        async def save() -> None:
            await Agent(FakeModel(["done"]), store=store).arun(root)

        found = await _follow_then_save(monkeypatch, store, root, save)
    assert nowait > 0
    assert _states(found) == {"root"}
