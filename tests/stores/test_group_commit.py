"""The SQL stores' batch save: an agent's concurrent saves share transactions, errors stay per
State, and a store serves event loops in turn, in threads, and trio as a guest of asyncio.

The saves go through the store's client, as an agent's do (`orchestrator._record._group_commit`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
import trio

from orchestrator import Message, State
from orchestrator._record._store_client import client_of
from stores import SQLiteStore
from tests.doubles import bound_store


class CountingStore(SQLiteStore):
    """A SQLiteStore that counts the transactions its batch saves run."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.batches: list[int] = []

    def save_many(self, states: Sequence[State]) -> dict[int, ValueError]:
        self.batches.append(len(states))
        return super().save_many(states)


@pytest.mark.anyio
async def test_concurrent_saves_share_transactions_and_all_land(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "batch.db")
    client = client_of(store)

    async def save(state: State) -> None:
        await client.save(state)

    states = [State(id=f"s{i}", messages=[Message.user(str(i))]) for i in range(50)]
    async with anyio.create_task_group() as group:
        for state in states:
            group.start_soon(save, state)
    assert store.batches == [50]  # saves started together share one transaction
    reopened = SQLiteStore(tmp_path / "batch.db")
    for state in states:
        assert reopened.load(state.id).snapshot() == state.snapshot()
        assert bound_store(state) is store  # a save binds, batched or not (private: no accessor)
    reopened.close()
    store.close()


@pytest.mark.anyio
async def test_a_direct_asave_writes_just_its_state(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "batch.db")
    states = [State(id=f"s{i}", messages=[Message.user(str(i))]) for i in range(5)]
    async with anyio.create_task_group() as group:
        for state in states:
            group.start_soon(store.asave, state)
    assert store.batches == []  # only an agent's saves (the client's) are batched
    assert len(store.list()) == 5
    store.close()


@pytest.mark.anyio
async def test_a_refused_state_fails_alone(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "batch.db")
    client = client_of(store)

    async def save(state: State) -> None:
        await client.save(state)

    store.save(State(id="taken", messages=[Message.user("first")]))
    impostor = State(id="taken", messages=[Message.user("other")])
    impostor.add_message(Message.user("more"))
    good = [State(id=f"ok{i}", messages=[Message.user("x")]) for i in range(5)]
    outcomes: dict[str, BaseException | None] = {}

    async def one(state: State) -> None:
        try:
            await save(state)
        except ValueError as error:
            outcomes[state.id] = error
        else:
            outcomes[state.id] = None

    async with anyio.create_task_group() as group:
        for state in [impostor, *good]:
            group.start_soon(one, state)
    assert isinstance(outcomes["taken"], ValueError)
    assert "store.load" in str(outcomes["taken"])
    assert all(outcomes[state.id] is None for state in good)
    assert {info.id for info in store.list()} == {"taken", *(s.id for s in good)}
    assert store.load("taken").messages[0].text == "first"
    store.close()


def test_two_states_under_one_id_in_one_batch_refuse_the_second(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "batch.db")
    kept = State(id="twin", messages=[Message.user("kept")])
    other = State(id="twin", messages=[Message.user("other")])
    refused = store.save_many([kept, other])  # one transaction, by position
    assert list(refused) == [1]
    assert "store.load('twin')" in str(refused[1])
    assert store.load("twin").snapshot() == kept.snapshot()
    store.close()


def test_a_batch_of_many_new_states_still_checks_the_stored_ones(tmp_path: Path) -> None:
    # New States are told from stored ones with a few queries (500 ids each), not one each:
    # a taken id among 1,200 new ones must still be checked against its stored history.
    path = tmp_path / "batch.db"
    with SQLiteStore(path) as other:  # another connection: this store does not know it
        other.save(State(id="taken", messages=[Message.user("first")]))
    store = SQLiteStore(path)
    new = [State(id=f"new{i}", messages=[Message.user(str(i))]) for i in range(1200)]
    impostor = State(id="taken", messages=[Message.user("other")])
    refused = store.save_many([*new[:700], impostor, *new[700:]])
    assert list(refused) == [700]
    assert len(store.list()) == 1201
    assert store.load("new1199").messages[0].text == "1199"
    assert store.load("taken").messages[0].text == "first"
    store.close()


def test_a_batch_with_something_not_a_state_saves_nothing(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "batch.db") as store:
        with pytest.raises(TypeError, match="State objects"):
            store.save_many([State(id="a"), "b"])  # type: ignore[list-item]
        assert store.list() == []


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_one_store_serves_event_loops_in_turn_and_in_two_threads(
    tmp_path: Path, backend: str
) -> None:
    # Each event loop has its own group commit (its events belong to that loop): a store
    # used by one loop after another, and by two loops at once, must never mix them up.
    store = SQLiteStore(tmp_path / "loops.db")
    client = client_of(store)

    async def save(state: State) -> None:
        await client.save(state)

    async def save_many(prefix: str) -> None:
        async with anyio.create_task_group() as group:
            for i in range(30):
                state = State(id=f"{prefix}-{i}", messages=[Message.user(str(i))])
                group.start_soon(save, state)

    for round_ in range(3):
        anyio.run(save_many, f"turn{round_}", backend=backend)
    failures: list[BaseException] = []

    def in_thread(prefix: str) -> None:
        try:
            for round_ in range(5):
                anyio.run(save_many, f"{prefix}{round_}", backend=backend)
        except BaseException as error:  # reported by the main thread
            failures.append(error)

    threads = [threading.Thread(target=in_thread, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert len(store.list()) == 3 * 30 + 2 * 5 * 30
    store.close()


def test_trio_as_a_guest_of_asyncio_keeps_its_own_group_commit(tmp_path: Path) -> None:
    # Inside trio run as a guest of an asyncio loop, asyncio.get_running_loop() finds the
    # host's loop: the store must still tell trio's saves from asyncio's (their events differ).
    store = SQLiteStore(tmp_path / "guest.db")
    client = client_of(store)

    async def save(state: State) -> None:
        await client.save(state)

    async def save_rounds(states: list[State], gather: Any, sleep: Any) -> None:
        for round_ in range(50):
            for state in states:
                state.add_message(Message.user(f"round {round_}"))
            await gather(states)
            await sleep(0)

    async def in_trio(states: list[State]) -> None:
        async with trio.open_nursery() as nursery:
            for state in states:
                nursery.start_soon(save, state)

    async def in_asyncio(states: list[State]) -> None:
        async with anyio.create_task_group() as group:
            for state in states:
                group.start_soon(save, state)

    guests = [State(id=f"trio-{i}", messages=[Message.user("go")]) for i in range(3)]
    hosts = [State(id=f"asyncio-{i}", messages=[Message.user("go")]) for i in range(3)]

    async def host() -> None:
        loop = asyncio.get_running_loop()
        finished = anyio.Event()
        outcome: list[Any] = []

        def done(result: Any) -> None:
            outcome.append(result)
            finished.set()

        trio.lowlevel.start_guest_run(
            save_rounds,
            guests,
            in_trio,
            trio.sleep,
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            run_sync_soon_not_threadsafe=loop.call_soon,
            done_callback=done,
            host_uses_signal_set_wakeup_fd=True,
        )
        await save_rounds(hosts, in_asyncio, anyio.sleep)
        with anyio.fail_after(20):
            await finished.wait()
        outcome[0].unwrap()

    anyio.run(host, backend="asyncio")
    for state in guests + hosts:
        assert store.load(state.id).history == state.history
    store.close()


@pytest.mark.anyio
async def test_a_sqlite_save_in_a_cancelled_scope_raises_and_writes_nothing(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "cancelled.db")
    client = client_of(store)

    async def save(state: State) -> None:
        await client.save(state)

    state = State(messages=[Message.user("hi")])
    with anyio.CancelScope() as scope:
        scope.cancel()
        await save(state)
    assert scope.cancelled_caught
    assert store.list() == []
    await save(state)  # the store is not left waiting on anything
    assert store.load(state.id).history == state.history
    store.close()
