"""The core's group commit: saves made at once on one event loop go out in one transaction.

A store that saves in batches (`BatchStore`, `AsyncBatchStore`) gets the saves of the agents
running at once together; one that does not gets them one by one. The group commit is the
store's, per event loop, and kept weakly: a store dropped while its loop runs is collected.
"""

from __future__ import annotations

import builtins
import functools
import gc
import weakref
from collections.abc import Sequence
from typing import Any, cast

import anyio
import anyio.lowlevel
import pytest

from orchestrator import (
    Agent,
    AsyncBatchStore,
    AsyncStore,
    BatchStore,
    Message,
    State,
    StateInfo,
    tool,
)
from orchestrator._record._group_commit import GroupCommit, GroupCommits
from orchestrator._record._store_client import client_of
from orchestrator.testing import FakeModel, tool_call
from stores import AioSQLiteStore, MemoryStore, SQLiteStore
from stores.backend import bind_state
from tests.doubles import AsyncOnlyStore


class BatchOnlyStore:
    """A store that saves only in batches (`asave_many`; no `asave`), noting each batch."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.batches: builtins.list[builtins.list[str]] = []

    async def asave_many(self, states: Sequence[State]) -> dict[int, ValueError]:
        self.batches.append([state.id for state in states])
        await anyio.lowlevel.checkpoint()
        refused: dict[int, ValueError] = {}
        for at, state in enumerate(states):
            try:
                self.inner.save(state)
            except ValueError as error:
                refused[at] = error
            else:
                bind_state(state, self)
        return refused

    async def aload(self, state_id: str) -> State:
        loaded = await self.inner.aload(state_id)
        bind_state(loaded, self)
        return loaded

    async def alist(
        self, *, parent_id: str | None = None, limit: int | None = None
    ) -> builtins.list[StateInfo]:
        return await self.inner.alist(parent_id=parent_id, limit=limit)

    async def adelete(self, state_id: str) -> None:
        await self.inner.adelete(state_id)


class CountingAsyncOnly(AsyncOnlyStore):
    """A store with `asave` only (no batch): counts its saves."""

    def __init__(self) -> None:
        super().__init__()
        self.saves = 0

    async def asave(self, state: State) -> None:
        self.saves += 1
        await super().asave(state)


@tool(name="step")
async def _step() -> str:
    """One step."""
    await anyio.lowlevel.checkpoint()
    return "ok"


async def _fan_out(store: object, children: int) -> State:
    """A lead whose one turn starts `children` subagents of two tool turns each, saved."""

    @tool
    async def delegate(task: str) -> str:
        """Run a child agent."""
        model = FakeModel([tool_call("step"), tool_call("step"), "done"])
        return str(await Agent(model, tools=[_step]).arun(task))

    calls = [tool_call("delegate", task=f"part {i}") for i in range(children)]
    state = State(id="lead", messages=[Message.user("go")])
    agent = Agent(FakeModel([calls, "all done"]), tools=[delegate], store=cast("AsyncStore", store))
    await agent.arun(state)
    return state


def test_the_batch_protocols_are_public_and_the_sql_stores_implement_them(tmp_path: Any) -> None:
    with SQLiteStore(tmp_path / "a.db") as sqlite:
        assert isinstance(sqlite, BatchStore)
        assert isinstance(sqlite, AsyncBatchStore)
    assert isinstance(AioSQLiteStore(tmp_path / "b.db"), AsyncBatchStore)
    assert isinstance(BatchOnlyStore(), AsyncBatchStore)
    assert not isinstance(MemoryStore(), BatchStore | AsyncBatchStore)


@pytest.mark.anyio
async def test_many_tasks_saving_at_once_share_one_transaction() -> None:
    store = BatchOnlyStore()
    client = client_of(cast("AsyncStore", store))

    async def save(state: State) -> None:
        await client.save(state)

    states = [State(id=f"s{i}", messages=[Message.user(str(i))]) for i in range(100)]
    async with anyio.create_task_group() as group:
        for state in states:
            group.start_soon(save, state)
    assert len(store.batches) == 1
    assert sorted(store.batches[0]) == sorted(state.id for state in states)
    for state in states:
        assert (await store.aload(state.id)).history == state.history


@pytest.mark.anyio
async def test_a_store_with_only_a_batch_save_runs_agents_and_their_subagents() -> None:
    store = BatchOnlyStore()
    lead = await _fan_out(store, 30)
    assert lead.answer == "all done"
    saved = await store.alist()
    assert len(saved) == 31
    children = await store.alist(parent_id="lead")
    for info in children:
        child = await store.aload(info.id)
        assert child.answer == "done"
    # Saves made at once went out together: fewer transactions than States saved.
    assert len(store.batches) < sum(len(batch) for batch in store.batches)


@pytest.mark.anyio
async def test_a_save_alone_goes_out_before_the_tasks_started_with_it_join() -> None:
    store = BatchOnlyStore()
    client = client_of(cast("AsyncStore", store))
    first, second = (State(id=name, messages=[Message.user(name)]) for name in "ab")

    async def save(state: State) -> None:
        await client.save(state)

    async with anyio.create_task_group() as group:
        group.start_soon(save, second)  # started, not run yet
        await client.save_alone(first)  # at once: the started save goes in the next batch
    assert store.batches == [["a"], ["b"]]
    assert (await store.aload("a")).history == first.history
    assert (await store.aload("b")).history == second.history


@pytest.mark.anyio
async def test_a_run_saving_alone_commits_at_once_and_subagents_still_share_commits() -> None:
    store = BatchOnlyStore()
    client = client_of(cast("AsyncStore", store))
    other = State(id="other", messages=[Message.user("x")])

    async def save(state: State) -> None:
        await client.save(state)

    lone = State(id="lone", messages=[Message.user("go")])
    agent = Agent(FakeModel([tool_call("step"), "done"]), tools=[_step], store=client.store)
    async with anyio.create_task_group() as group:
        group.start_soon(save, other)  # started, not run yet
        await agent.arun(lone)
    # The run's first save did not wait a pass of the loop for the started save to join it.
    assert store.batches[0] == ["lone"]
    assert (await store.aload("lone")).history == lone.history
    before = len(store.batches)
    lead = await _fan_out(store, 10)  # subagents running: their saves go out together
    assert lead.answer == "all done"
    fanned = store.batches[before:]
    assert len(fanned) < sum(len(batch) for batch in fanned)


@pytest.mark.anyio
async def test_a_store_with_only_asave_is_saved_one_state_at_a_time() -> None:
    store = CountingAsyncOnly()
    client = client_of(store)
    assert not client.batches
    lead = await _fan_out(store, 20)
    assert lead.answer == "all done"
    assert len(await store.alist()) == 21
    assert store.saves >= 21
    states = [State(id=f"x{i}", messages=[Message.user(str(i))]) for i in range(3)]
    assert await client.save_many(states) == {}  # one by one, the same answer as a batch
    assert {info.id for info in await store.alist()} >= {"x0", "x1", "x2"}


@pytest.mark.anyio
@pytest.mark.parametrize("batched", [True, False])
async def test_a_refused_state_does_not_lose_the_others_of_its_batch(batched: bool) -> None:
    store = BatchOnlyStore() if batched else CountingAsyncOnly()
    client = client_of(cast("AsyncStore", store))
    await client.save(State(id="taken", messages=[Message.user("first")]))
    impostor = State(id="taken", messages=[Message.user("another history")])
    good = [State(id=f"ok{i}", messages=[Message.user("x")]) for i in range(5)]
    outcomes: dict[str, BaseException | None] = {}

    async def save(state: State) -> None:
        try:
            await client.save(state)
        except ValueError as error:
            outcomes[state.id] = error
        else:
            outcomes[state.id] = None

    async with anyio.create_task_group() as group:
        for state in [good[0], impostor, *good[1:]]:
            group.start_soon(save, state)
    assert isinstance(outcomes["taken"], ValueError)
    assert all(outcomes[state.id] is None for state in good)
    assert (await store.aload("taken")).messages[0].text == "first"
    for state in good:
        assert (await store.aload(state.id)).history == state.history
    refused = await client.save_many([good[0], impostor])  # by position, the others saved
    assert list(refused) == [1]


@pytest.mark.anyio
async def test_a_store_dropped_while_its_loop_runs_is_collected() -> None:
    store = BatchOnlyStore()
    state = State(messages=[Message.user("hi")])
    await client_of(cast("AsyncStore", store)).save(state)  # its group commit on this loop
    gone = weakref.ref(store)
    del store, state  # the State was bound to the store
    gc.collect()
    assert gone() is None  # the loop keeps neither the store nor its client


def test_a_loop_that_ended_drops_its_group_commit() -> None:
    commits = GroupCommits(BatchOnlyStore().asave_many)
    made: builtins.list[weakref.ref[GroupCommit]] = []

    async def save() -> None:
        made.append(weakref.ref(commits.current()))
        assert commits.current() is made[-1]()  # one per loop
        await commits.save(State(messages=[Message.user("hi")]))

    for backend in ("asyncio", "trio"):
        anyio.run(save, backend=backend)
    gc.collect()
    assert len(made) == 2
    assert [ref() for ref in made] == [None, None]


# -- the group commit itself ------------------------------------------------------------------


class HeldFirstBatch:
    """A flush that notes each batch's State ids and holds the first until `release` is set.

    Made inside the event loop (its events belong to it); `entered` is set when the first
    batch is being written.
    """

    def __init__(self) -> None:
        self.written: builtins.list[builtins.list[str]] = []
        self.entered = anyio.Event()
        self.release = anyio.Event()

    async def __call__(self, states: Sequence[State]) -> dict[int, ValueError]:
        self.written.append([s.id for s in states])
        if len(self.written) == 1:
            self.entered.set()
            with anyio.CancelScope(shield=True):  # like a thread that is never abandoned
                await self.release.wait()
        return {}


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
    written: builtins.list[builtins.list[str]] = []
    blocking = anyio.Event()
    release = anyio.Event()
    writer = anyio.CancelScope()

    async def flush(states: Sequence[State]) -> dict[int, ValueError]:
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
    returned: builtins.list[str] = []

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
    async def flush(states: Sequence[State]) -> dict[int, ValueError]:
        await anyio.lowlevel.checkpoint()
        raise OSError("disk full")

    commit = GroupCommit(flush)
    failures: builtins.list[Any] = []

    async def save(state: State) -> None:
        try:
            await commit.save(state)
        except OSError as error:
            failures.append(error)

    async with anyio.create_task_group() as group:
        for i in range(3):
            group.start_soon(save, State(id=f"s{i}"))
    assert len(failures) == 3


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
async def test_a_save_alone_during_a_write_goes_in_the_next_batch() -> None:
    # A lone save is written at once only when no write is under way and none waits: here the
    # first batch is being written, so it waits and shares the next batch with a later save.
    flush = HeldFirstBatch()
    commit = GroupCommit(flush)
    first, lone, later = State(id="first"), State(id="lone"), State(id="later")

    async def save_alone(state: State) -> None:
        await commit.save(state, gather=False)

    async with anyio.create_task_group() as group:
        group.start_soon(commit.save, first)
        await flush.entered.wait()
        group.start_soon(save_alone, lone)
        group.start_soon(commit.save, later)
        await anyio.wait_all_tasks_blocked()
        flush.release.set()
    assert [sorted(batch) for batch in flush.written] == [["first"], ["later", "lone"]]


@pytest.mark.anyio
async def test_a_save_alone_raises_what_its_write_raised() -> None:
    refusal = ValueError("another history")

    async def refusing(states: Sequence[State]) -> dict[int, ValueError]:
        await anyio.lowlevel.checkpoint()
        return {0: refusal}

    async def failing(states: Sequence[State]) -> dict[int, ValueError]:
        raise OSError("disk full")

    with pytest.raises(ValueError, match="another history"):
        await GroupCommit(refusing).save(State(id="s"), gather=False)
    commit = GroupCommit(failing)
    with pytest.raises(OSError, match="disk full"):
        await commit.save(State(id="s"), gather=False)
    with pytest.raises(OSError, match="disk full"):  # the lock was let go
        await commit.save(State(id="s"), gather=False)


@pytest.mark.anyio
async def test_a_save_alone_cancelled_while_written_is_written_then_raises() -> None:
    flush = HeldFirstBatch()
    commit = GroupCommit(flush)
    cancelled = anyio.CancelScope()
    finished: builtins.list[str] = []

    async def save_alone() -> None:
        with cancelled:
            await commit.save(State(id="lone"), gather=False)
            finished.append("returned")  # not reached: the cancellation is raised after it

    async with anyio.create_task_group() as group:
        group.start_soon(save_alone)
        await flush.entered.wait()
        cancelled.cancel()
        await anyio.wait_all_tasks_blocked()
        assert flush.written == [["lone"]]  # being written, shielded: not abandoned
        flush.release.set()
    assert cancelled.cancelled_caught
    assert finished == []


class Now:
    """A store's save with no await (`NowaitBatchStore.save_many_nowait`), scripted.

    Each call notes its State ids and answers the next of `answers`: None (it would wait), the
    refused States' errors, or an exception to raise.
    """

    def __init__(self, *answers: dict[int, ValueError] | BaseException | None) -> None:
        self.answers = list(answers)
        self.written: builtins.list[builtins.list[str]] = []

    def __call__(self, states: Sequence[State]) -> dict[int, ValueError] | None:
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        if answer is not None:
            self.written.append([s.id for s in states])
        return answer


class NotedFlush:
    """A flush that notes each batch's State ids."""

    def __init__(self) -> None:
        self.written: builtins.list[builtins.list[str]] = []

    async def __call__(self, states: Sequence[State]) -> dict[int, ValueError]:
        self.written.append([s.id for s in states])
        return {}


@pytest.mark.anyio
async def test_a_save_alone_is_written_at_once_when_the_store_need_not_wait() -> None:
    flush, now = NotedFlush(), Now({}, None)
    commit = GroupCommit(flush, now)
    await commit.save(State(id="first"), gather=False)
    assert now.written == [["first"]]
    assert flush.written == []
    await commit.save(State(id="second"), gather=False)  # the store would wait: the flush
    assert flush.written == [["second"]]
    assert now.answers == []


@pytest.mark.anyio
async def test_a_save_alone_written_at_once_raises_what_the_store_raised() -> None:
    now = Now({0: ValueError("another history")}, OSError("disk full"), {})
    commit = GroupCommit(HeldFirstBatch(), now)
    with pytest.raises(ValueError, match="another history"):
        await commit.save(State(id="s"), gather=False)
    with pytest.raises(OSError, match="disk full"):
        await commit.save(State(id="s"), gather=False)
    await commit.save(State(id="s"), gather=False)  # nothing was left held
    assert now.written == [["s"], ["s"]]


@pytest.mark.anyio
async def test_a_save_alone_in_a_cancelled_scope_is_not_written_at_once() -> None:
    now = Now()  # any call would fail: it has no answer
    commit = GroupCommit(HeldFirstBatch(), now)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await commit.save(State(id="s"), gather=False)
    assert scope.cancelled_caught
    assert now.written == []


@pytest.mark.anyio
async def test_a_save_alone_during_a_write_waits_even_when_the_store_need_not() -> None:
    # Written at once, it could commit before the batch under way, which holds an older save.
    # The store declines each batch (so the flush holds the first): asked a third time, for
    # the lone save, `now` would have no answer to give.
    flush, now = HeldFirstBatch(), Now(None, None)
    commit = GroupCommit(flush, now)
    async with anyio.create_task_group() as group:
        group.start_soon(commit.save, State(id="first"))
        await flush.entered.wait()
        group.start_soon(functools.partial(commit.save, State(id="lone"), gather=False))
        await anyio.wait_all_tasks_blocked()
        flush.release.set()
    assert flush.written == [["first"], ["lone"]]
    assert now.answers == []


@pytest.mark.anyio
async def test_a_batch_is_written_at_once_unless_the_store_would_wait() -> None:
    flush, now = NotedFlush(), Now({}, None)
    commit = GroupCommit(flush, now)
    for batch in (["a", "b"], ["c", "d"]):
        async with anyio.create_task_group() as group:
            for state_id in batch:
                group.start_soon(commit.save, State(id=state_id))
    assert [sorted(ids) for ids in now.written] == [["a", "b"]]
    # declined: written by the flush, and `now` asked once
    assert [sorted(ids) for ids in flush.written] == [["c", "d"]]
