"""SQLiteStore's group commit: concurrent asaves share transactions, errors stay per State."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
import trio

from orchestrator import Message, State
from stores import SQLiteStore
from stores.backend import GroupCommit
from tests.doubles import bound_store


class CountingStore(SQLiteStore):
    """A SQLiteStore that counts the transactions its async saves run."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.batches: list[int] = []

    async def _write_batch(self, states: list[State]) -> dict[int, ValueError]:
        self.batches.append(len(states))
        return await super()._write_batch(states)


class HeldFirstBatch:
    """A flush that notes each batch's State ids and holds the first until `release` is set.

    Made inside the event loop (its events belong to it); `entered` is set when the first
    batch is being written.
    """

    def __init__(self) -> None:
        self.written: list[list[str]] = []
        self.entered = anyio.Event()
        self.release = anyio.Event()

    async def __call__(self, states: list[State]) -> dict[int, ValueError]:
        self.written.append([s.id for s in states])
        if len(self.written) == 1:
            self.entered.set()
            with anyio.CancelScope(shield=True):  # like a thread that is never abandoned
                await self.release.wait()
        return {}


@pytest.mark.anyio
async def test_concurrent_saves_share_transactions_and_all_land(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "batch.db")
    states = [State(id=f"s{i}", messages=[Message.user(str(i))]) for i in range(50)]
    async with anyio.create_task_group() as group:
        for state in states:
            group.start_soon(store.asave, state)
    assert sum(store.batches) == 50
    assert store.batches == [50]  # saves started together share one transaction
    reopened = SQLiteStore(tmp_path / "batch.db")
    for state in states:
        assert reopened.load(state.id).snapshot() == state.snapshot()
        assert bound_store(state) is store  # a save binds, batched or not (private: no accessor)
    reopened.close()
    store.close()


@pytest.mark.anyio
async def test_a_refused_state_fails_alone(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "batch.db")
    store.save(State(id="taken", messages=[Message.user("first")]))
    impostor = State(id="taken", messages=[Message.user("other")])
    impostor.add_message(Message.user("more"))
    good = [State(id=f"ok{i}", messages=[Message.user("x")]) for i in range(5)]
    outcomes: dict[str, BaseException | None] = {}

    async def save(state: State) -> None:
        try:
            await store.asave(state)
        except ValueError as error:
            outcomes[state.id] = error
        else:
            outcomes[state.id] = None

    async with anyio.create_task_group() as group:
        for state in [impostor, *good]:
            group.start_soon(save, state)
    assert isinstance(outcomes["taken"], ValueError)
    assert "store.load" in str(outcomes["taken"])
    assert all(outcomes[state.id] is None for state in good)
    assert {info.id for info in store.list()} == {"taken", *(s.id for s in good)}
    assert store.load("taken").messages[0].text == "first"
    store.close()


@pytest.mark.anyio
async def test_two_states_under_one_id_in_one_batch_refuse_the_second(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "batch.db")
    kept = State(id="twin", messages=[Message.user("kept")])
    other = State(id="twin", messages=[Message.user("other")])
    # One transaction, as a batch writes it: the private writer under test.
    refused = await store._write_batch([kept, other])  # pyright: ignore[reportPrivateUsage]
    assert list(refused) == [id(other)]
    assert "store.load('twin')" in str(refused[id(other)])
    assert store.load("twin").snapshot() == kept.snapshot()
    store.close()


@pytest.mark.anyio
async def test_a_batch_of_many_new_states_still_checks_the_stored_ones(tmp_path: Path) -> None:
    # New States are told from stored ones with a few queries (500 ids each), not one each:
    # a taken id among 1,200 new ones must still be checked against its stored history.
    path = tmp_path / "batch.db"
    with SQLiteStore(path) as other:  # another connection: this store does not know it
        other.save(State(id="taken", messages=[Message.user("first")]))
    store = SQLiteStore(path)
    new = [State(id=f"new{i}", messages=[Message.user(str(i))]) for i in range(1200)]
    impostor = State(id="taken", messages=[Message.user("other")])
    batch = [*new[:700], impostor, *new[700:]]
    refused = await store._write_batch(batch)  # pyright: ignore[reportPrivateUsage]
    assert list(refused) == [id(impostor)]
    assert len(store.list()) == 1201
    assert store.load("new1199").messages[0].text == "1199"
    assert store.load("taken").messages[0].text == "first"
    store.close()


@pytest.mark.anyio
async def test_a_cancelled_writer_leaves_the_waiting_saves_to_another_writer() -> None:
    flush = HeldFirstBatch()
    commit = GroupCommit(flush)
    first, second = State(id="first"), State(id="second")
    writer = anyio.CancelScope()

    async def first_save() -> None:
        with writer:
            await commit.save(first)

    async with anyio.create_task_group() as group:
        group.start_soon(first_save)
        await flush.entered.wait()
        group.start_soon(commit.save, second)  # queued while the first batch is written
        await anyio.wait_all_tasks_blocked()
        writer.cancel()
        flush.release.set()
    assert flush.written == [["first"], ["second"]]


@pytest.mark.anyio
async def test_a_writer_cancelled_as_it_starts_still_writes_its_whole_batch() -> None:
    # The writer's own save is cancelled just as its write starts: the other saves of its batch
    # must not return until they are written (they once returned having written nothing).
    written: list[list[str]] = []
    blocking = anyio.Event()
    release = anyio.Event()
    writer = anyio.CancelScope()

    async def flush(states: list[State]) -> dict[int, ValueError]:
        if not written:
            written.append([s.id for s in states])
            blocking.set()
            with anyio.CancelScope(shield=True):
                await release.wait()
            return {}
        writer.cancel()  # the leader of the second batch is cancelled as its write starts
        await anyio.lowlevel.checkpoint()
        written.append([s.id for s in states])
        return {}

    commit = GroupCommit(flush)
    returned: list[str] = []

    async def lead() -> None:
        with writer:
            await commit.save(State(id="leader"))

    async def follow() -> None:
        await commit.save(State(id="follower"))
        returned.append("follower")

    async with anyio.create_task_group() as group:
        group.start_soon(commit.save, State(id="first"))
        await blocking.wait()
        group.start_soon(lead)  # the first to join the second batch leads it
        await anyio.wait_all_tasks_blocked()
        group.start_soon(follow)
        await anyio.wait_all_tasks_blocked()
        release.set()
    assert written == [["first"], ["leader", "follower"]]
    assert returned == ["follower"]


@pytest.mark.anyio
async def test_a_leader_cancelled_while_it_waits_hands_the_batch_on() -> None:
    flush = HeldFirstBatch()
    commit = GroupCommit(flush)
    leader = anyio.CancelScope()

    async def lead() -> None:
        with leader:
            await commit.save(State(id="leader"))

    async with anyio.create_task_group() as group:
        group.start_soon(commit.save, State(id="first"))
        await flush.entered.wait()
        group.start_soon(lead)
        await anyio.wait_all_tasks_blocked()
        group.start_soon(commit.save, State(id="follower"))
        await anyio.wait_all_tasks_blocked()
        leader.cancel()  # it waits for its turn: the follower must take the lead
        await anyio.wait_all_tasks_blocked()
        flush.release.set()
    assert flush.written[0] == ["first"]
    assert flush.written[1][-1] == "follower"  # written, with or without the cancelled save's State


@pytest.mark.anyio
async def test_a_failed_transaction_fails_every_save_of_its_batch() -> None:
    async def flush(states: list[State]) -> dict[int, ValueError]:
        await anyio.lowlevel.checkpoint()
        raise OSError("disk full")

    commit = GroupCommit(flush)
    failures: list[Any] = []

    async def save(state: State) -> None:
        try:
            await commit.save(state)
        except OSError as error:
            failures.append(error)

    async with anyio.create_task_group() as group:
        for i in range(3):
            group.start_soon(save, State(id=f"s{i}"))
    assert len(failures) == 3


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_one_store_serves_event_loops_in_turn_and_in_two_threads(
    tmp_path: Path, backend: str
) -> None:
    # Each event loop has its own group commit (its events belong to that loop): a store
    # used by one loop after another, and by two loops at once, must never mix them up.
    store = SQLiteStore(tmp_path / "loops.db")

    async def save_many(prefix: str) -> None:
        async with anyio.create_task_group() as group:
            for i in range(30):
                state = State(id=f"{prefix}-{i}", messages=[Message.user(str(i))])
                group.start_soon(store.asave, state)

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

    async def save_rounds(states: list[State], gather: Any, sleep: Any) -> None:
        for round_ in range(50):
            for state in states:
                state.add_message(Message.user(f"round {round_}"))
            await gather(states)
            await sleep(0)

    async def in_trio(states: list[State]) -> None:
        async with trio.open_nursery() as nursery:
            for state in states:
                nursery.start_soon(store.asave, state)

    async def in_asyncio(states: list[State]) -> None:
        async with anyio.create_task_group() as group:
            for state in states:
                group.start_soon(store.asave, state)

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
async def test_a_save_cancelled_while_its_batch_waits_is_not_written() -> None:
    # Its batch waits behind a write: cancelled then, the State leaves the batch; a State that
    # another save of the batch still waits for stays in it.
    flush = HeldFirstBatch()
    commit = GroupCommit(flush)
    first, dropped, shared = State(id="first"), State(id="dropped"), State(id="shared")
    cancelled = anyio.CancelScope()

    async def cancelled_saves() -> None:
        with cancelled:
            async with anyio.create_task_group() as inner:
                inner.start_soon(commit.save, dropped)
                inner.start_soon(commit.save, shared)

    async with anyio.create_task_group() as group:
        group.start_soon(commit.save, first)
        await flush.entered.wait()
        group.start_soon(cancelled_saves)
        group.start_soon(commit.save, shared)  # waits for `shared` too, and is not cancelled
        await anyio.wait_all_tasks_blocked()
        cancelled.cancel()
        await anyio.wait_all_tasks_blocked()
        flush.release.set()
    assert flush.written == [["first"], ["shared"]]


@pytest.mark.anyio
async def test_a_sqlite_save_in_a_cancelled_scope_raises_and_writes_nothing(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "cancelled.db")
    state = State(messages=[Message.user("hi")])
    with anyio.CancelScope() as scope:
        scope.cancel()
        await store.asave(state)
    assert scope.cancelled_caught
    assert store.list() == []
    await store.asave(state)  # the store is not left waiting on anything
    assert store.load(state.id).history == state.history
    store.close()
