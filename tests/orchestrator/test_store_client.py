"""One client per store: what `client_of` resolves from the protocols a store implements."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from orchestrator import Agent, Message, State
from orchestrator._record._store_client import client_of
from orchestrator.testing import FakeModel
from stores import AioSQLiteStore, FileStore, MemoryStore, SQLiteStore
from stores.backend import NowaitBatchStore
from tests.doubles import AsyncOnlyStore, ThreadCheckedStore


def test_an_async_store_is_called_directly_with_no_wrapper_per_call(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    client = client_of(store)
    # The resolved call is the store's own async twin: a call is one call and one await.
    assert client.batches  # its saves go out in batches (tried on the loop first: below)
    assert client.load == store.aload
    assert client.memory_put == store.amemory_put
    store.close()
    aio = AioSQLiteStore(tmp_path / "aio.db")
    assert client_of(aio).save_many == aio.asave_many
    plain = MemoryStore()  # no batch save: a save is the store's own
    assert not client_of(plain).batches
    assert client_of(plain).save == plain.asave


def test_a_store_has_one_client_while_it_is_held(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    client = client_of(store)
    assert client_of(store) is client  # so its saves share one group commit per loop
    assert Agent(FakeModel(["hi"]), store=store).store is store
    assert client_of(MemoryStore()) is not client
    store.close()


def test_urls_come_from_the_stores_that_declare_them(tmp_path: Path) -> None:
    sqlite, folder = SQLiteStore(tmp_path / "a.db"), FileStore(tmp_path / "f")
    assert client_of(sqlite).url == sqlite.url
    assert sqlite.url.startswith("sqlite:///")
    assert client_of(folder).url == folder.url == (tmp_path / "f").as_uri()
    sqlite.close()
    assert client_of(MemoryStore()).url is None  # nothing another process can open
    assert client_of(ThreadCheckedStore()).url is None  # a third party's, without `url`


def test_async_only_stores_are_known_by_their_declaration_or_their_methods(
    tmp_path: Path,
) -> None:
    aio = client_of(AioSQLiteStore(tmp_path / "a.db"))  # sync methods that refuse
    assert aio.is_async
    assert aio.keeps_memory
    with pytest.raises(TypeError, match="no sync"):
        aio.sync_store("no sync")
    with pytest.raises(TypeError, match="no sync"):
        aio.sync_memory("no sync")
    third = client_of(AsyncOnlyStore())  # the a-methods and nothing else
    assert third.is_async
    assert not third.keeps_memory
    sync = client_of(ThreadCheckedStore())
    assert not sync.is_async
    assert not sync.keeps_memory
    assert isinstance(sync.sync_store("unused"), ThreadCheckedStore)


class NowaitStore(MemoryStore):
    """A batch store that saves on the loop (`save_many_nowait`) unless told to decline."""

    def __init__(self) -> None:
        super().__init__()
        self.decline = False
        self.calls: list[tuple[str, int, int]] = []  # (where, States, thread id)

    def save_many(self, states: Sequence[State]) -> dict[int, ValueError]:
        self.calls.append(("thread", len(states), threading.get_ident()))
        for state in states:
            self.save(state)
        return {}

    def save_many_nowait(self, states: Sequence[State]) -> dict[int, ValueError] | None:
        self.calls.append(("loop", len(states), threading.get_ident()))
        if self.decline:
            return None
        return self.save_many(states)


@pytest.mark.anyio
async def test_a_nowait_batch_store_is_tried_on_the_loop_then_in_a_thread() -> None:
    store = NowaitStore()
    assert isinstance(store, NowaitBatchStore)
    client = client_of(store)
    here = threading.get_ident()
    await client.save(State(id="a"))  # saved on the loop: no thread
    assert [(where, n) for where, n, _ in store.calls] == [("loop", 1), ("thread", 1)]
    assert {ident for _, _, ident in store.calls} == {here}
    store.calls.clear()
    store.decline = True  # it would wait: the batch goes to save_many in a worker thread
    assert await client.save_many([State(id="b"), State(id="c")]) == {}
    assert [(where, n) for where, n, _ in store.calls] == [("loop", 2), ("thread", 2)]
    assert store.calls[0][2] == here
    assert store.calls[1][2] != here
    assert {info.id for info in store.list()} == {"a", "b", "c"}


@pytest.mark.anyio
async def test_a_sync_only_store_is_reached_from_the_loop_in_a_worker_thread() -> None:
    store = ThreadCheckedStore(threading.get_ident())
    client = client_of(store)
    state = State(id="t1", messages=[Message.user("hi")])
    await client.save(state)
    assert (await client.load("t1")).history == state.history
    assert [info.id for info in await client.list()] == ["t1"]
    await client.delete("t1")
    assert store.calls == ["save", "load", "list", "delete"]
    assert store.on_loop == []


@pytest.mark.anyio
async def test_a_store_with_neither_method_is_refused_naming_both() -> None:
    class SavesOnly:
        async def asave(self, state: State) -> None: ...

    client = client_of(SavesOnly())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="neither load nor aload"):
        await client.load("x")


def test_an_agent_resolves_its_store_once_and_shows_the_store_itself() -> None:
    store = MemoryStore()
    agent = Agent(FakeModel(["hi"]), store=store)
    assert agent.store is store
    assert agent.run("hello") == "hi"
