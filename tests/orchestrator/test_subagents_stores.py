"""Subagents and stores (issue #5, seed 004): children are saved with their parent, and the tree
of States reopens from a store after `load`.

Every sync-capable backend (`MemoryStore`, `FileStore`, `SQLiteStore`) runs on asyncio and trio;
`AioSQLiteStore` runs on asyncio by parametrization. A store on a path is reopened as a new
object on the same path, as another process would.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeAlias

import pytest

from orchestrator import (
    Agent,
    Message,
    ModelReplyEntry,
    Reply,
    RunStart,
    State,
    Tool,
    ToolCall,
    Usage,
    tool,
)

# Private: record_run_start has no public name; a run cut off mid-call is built by hand.
from orchestrator._record._recording import begin_think, record_reply, record_run_start
from orchestrator.models import Request
from orchestrator.testing import FakeModel, tool_call
from stores import AioSQLiteStore, FileStore, MemoryStore, SQLiteStore
from tests.doubles import AsyncOnlyStore, ThreadCheckedStore, child_ids, lookup, only_child, results

SyncStore: TypeAlias = MemoryStore | FileStore | SQLiteStore
on_asyncio = pytest.mark.parametrize("anyio_backend", ["asyncio"])

# Helpers --------------------------------------------------------------------------------------


def assert_same(loaded: State, state: State) -> None:
    assert loaded is not state
    assert loaded.id == state.id
    assert loaded.snapshot() == state.snapshot()
    assert (loaded.parent_id, loaded.parent_call_id) == (state.parent_id, state.parent_call_id)


def text(value: str, cost: float) -> Reply:
    return Reply(Message.assistant(value), Usage(requests=1, cost=cost))


def ask_for(call: ToolCall, cost: float) -> Reply:
    return Reply(Message.assistant(tool_calls=[call]), Usage(requests=1, cost=cost))


def three_levels(
    *,
    store: Any = None,
    leaf_store: Any = None,
    lookup_tool: Tool = lookup,
) -> Agent:
    """lead -> mid -> leaf; only the lead's agent has a store unless `leaf_store` is given."""

    def leaf_script(request: Request) -> Any:
        if request.messages[-1].tool_results:
            return text("line 12", 0.125)
        return ask_for(tool_call(lookup_tool.name), 0.125)

    def mid_script(request: Request) -> Any:
        if request.messages[-1].tool_results:
            return text("leaf said line 12", 0.25)
        return ask_for(tool_call("leaf", task="find the line"), 0.25)

    leaf = Agent(
        FakeModel([leaf_script] * 2),
        tools=[lookup_tool],
        name="leaf",
        description="Looks things up.",
        store=leaf_store,
    )
    mid = Agent(FakeModel([mid_script] * 2), tools=[leaf], name="mid", description="Digs.")
    lead_model = FakeModel(
        [ask_for(tool_call("mid", task="investigate"), 0.5), text("Line 12.", 0.5)]
    )
    return Agent(lead_model, tools=[mid], name="lead", store=store)


async def run_tree(agent: Agent) -> tuple[State, State, State]:
    lead = State(messages=[Message.user("Find the crash")])
    assert await agent.arun(lead) == "Line 12."
    mid = only_child(lead)
    return lead, mid, only_child(mid)


@pytest.fixture(params=["memory", "file", "sqlite"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], SyncStore]]:
    """Opens the test's store: a new object on the same path each call (the same MemoryStore)."""
    opened: list[SyncStore] = []
    memory = MemoryStore()

    def open_store() -> SyncStore:
        store: SyncStore
        if request.param == "memory":
            store = memory
        elif request.param == "file":
            store = FileStore(tmp_path / "states")
        else:
            store = SQLiteStore(tmp_path / "states.db")
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        if isinstance(store, SQLiteStore):
            store.close()


# Saved with the parent -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_children_are_saved_in_the_lead_agent_store(
    opener: Callable[[], SyncStore],
) -> None:
    store = opener()
    lead, mid, leaf = await run_tree(three_levels(store=store))
    again = opener()
    for state in (lead, mid, leaf):
        assert_same(again.load(state.id), state)
    assert [info.id for info in again.list(parent_id=lead.id)] == [mid.id]
    assert [info.id for info in again.list(parent_id=mid.id)] == [leaf.id]
    (info,) = again.list(parent_id=mid.id)
    assert (info.parent_id, info.parent_call_id) == (mid.id, leaf.parent_call_id)
    assert info.usage == leaf.usage
    assert {info.id for info in again.list()} == {lead.id, mid.id, leaf.id}
    assert again.load(lead.id).usage == Usage(requests=6, cost=1.75)


@pytest.mark.anyio
@pytest.mark.parametrize("sync", [False, True], ids=["async_tool", "sync_tool"])
async def test_children_run_by_a_tool_are_saved_in_the_lead_agent_store(
    opener: Callable[[], SyncStore], sync: bool
) -> None:
    helper = Agent(FakeModel(["b.py:12"]), name="helper")

    @tool(name="delegate")
    async def delegate_async(task: str) -> str:
        """Hand a task to a helper."""
        return str(await helper.arun(task))

    @tool(name="delegate")
    def delegate_sync(task: str) -> str:
        """Hand a task to a helper, from a worker thread."""
        return str(helper.run(task))

    lead = State(messages=[Message.user("Find the crash")])
    model = FakeModel([tool_call("delegate", task="find it"), "Line 12."])
    agent = Agent(model, tools=[delegate_sync if sync else delegate_async], store=opener())
    await agent.arun(lead)
    child = only_child(lead)
    loaded = opener().load(lead.id)
    assert_same(loaded.child(child.id), child)
    assert loaded.child(child.id).answer == "b.py:12"


@pytest.mark.anyio
async def test_children_are_saved_at_the_same_save_points(
    opener: Callable[[], SyncStore],
) -> None:
    store = opener()
    seen: dict[str, tuple[int, int, str | None]] = {}

    @tool(name="lookup")
    async def look_in_the_store(state: State) -> str:
        """Look the bug up, and at what the store holds meanwhile."""
        # The call is open in all three States; each was saved after its model reply.
        mid_id = state.parent_id
        assert mid_id is not None
        mid = await store.aload(mid_id)
        assert mid.parent_id is not None
        for each in (state, mid, await store.aload(mid.parent_id)):
            saved = await store.aload(each.id)
            replies = [e for e in saved.history if isinstance(e, ModelReplyEntry)]
            seen[each.id] = (saved.turn, len(replies), saved.parent_id)
        return "b.py:12"

    lead, mid, leaf = await run_tree(three_levels(store=store, lookup_tool=look_in_the_store))
    assert seen == {
        lead.id: (1, 1, None),
        mid.id: (1, 1, lead.id),
        leaf.id: (1, 1, mid.id),
    }
    for state in (lead, mid, leaf):
        assert_same(await opener().aload(state.id), state)


@pytest.mark.anyio
async def test_a_child_whose_agent_has_a_store_is_saved_there_only(
    opener: Callable[[], SyncStore],
) -> None:
    store, own = opener(), MemoryStore()
    lead, mid, leaf = await run_tree(three_levels(store=store, leaf_store=own))
    assert_same(own.load(leaf.id), leaf)
    with pytest.raises(LookupError):
        own.load(mid.id)
    with pytest.raises(LookupError):
        store.load(leaf.id)
    assert mid.child(leaf.id) is leaf  # in memory it opens as usual
    loaded_mid = opener().load(lead.id).child(mid.id)
    with pytest.raises(LookupError):
        loaded_mid.child(leaf.id)
    with pytest.raises(LookupError):
        await loaded_mid.achild(leaf.id)


# Reopened after load ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_tree_reopens_from_the_store_after_load(
    opener: Callable[[], SyncStore],
) -> None:
    lead, mid, leaf = await run_tree(three_levels(store=opener()))
    loaded = opener().load(lead.id)
    assert_same(loaded, lead)
    reopened_mid = loaded.child(mid.id)
    assert_same(reopened_mid, mid)
    # Loaded from the store each time, not cached.
    assert loaded.child(mid.id) is not reopened_mid
    assert_same(reopened_mid.child(leaf.id), leaf)
    assert reopened_mid.child(leaf.id) is not reopened_mid.child(leaf.id)
    assert_same(await loaded.achild(mid.id), mid)
    assert await loaded.achild(mid.id) is not await loaded.achild(mid.id)
    assert_same(await (await loaded.achild(mid.id)).achild(leaf.id), leaf)
    # A grandchild opens only through its parent; an unknown id is no child.
    for missing in (leaf.id, "nobody"):
        with pytest.raises(KeyError, match="not a child"):
            loaded.child(missing)
        with pytest.raises(KeyError, match="not a child"):
            await loaded.achild(missing)
    # A fork of the loaded State opens the children from that store too.
    assert_same(loaded.fork().child(mid.id), mid)
    assert_same(await loaded.fork().achild(mid.id), mid)


@pytest.mark.anyio
async def test_a_child_missing_from_the_store_raises_lookup_error(
    opener: Callable[[], SyncStore],
) -> None:
    store = opener()
    lead, mid, _ = await run_tree(three_levels(store=store))
    store.delete(mid.id)
    loaded = opener().load(lead.id)
    with pytest.raises(LookupError):
        loaded.child(mid.id)
    with pytest.raises(LookupError):
        await loaded.achild(mid.id)
    assert lead.child(mid.id) is mid  # the process that ran it still has it in memory


@pytest.mark.anyio
async def test_a_loaded_lead_run_by_an_agent_without_a_store_saves_new_children_to_it(
    opener: Callable[[], SyncStore],
) -> None:
    lead, mid, _ = await run_tree(three_levels(store=opener()))
    store = opener()
    loaded = store.load(lead.id)
    loaded.add_message(Message.user("Check once more"))
    helper = Agent(FakeModel(["still line 12"]), name="helper", description="Checks.")
    again = Agent(FakeModel([tool_call("helper", task="check"), "Confirmed."]), tools=[helper])
    assert await again.arun(loaded) == "Confirmed."
    new_id = child_ids(loaded)[-1]
    assert new_id != mid.id
    assert loaded.child(new_id) is loaded.child(new_id)  # this process ran it: in memory
    assert loaded.child(mid.id) is not loaded.child(mid.id)  # loaded from the store
    reloaded = opener().load(lead.id)
    assert_same(reloaded, loaded)
    assert_same(reloaded.child(new_id), loaded.child(new_id))
    assert reloaded.child(new_id).answer == "still line 12"
    assert_same(reloaded.child(mid.id), mid)


def test_a_sync_run_saves_the_tree_and_it_reopens_from_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    lead = State(messages=[Message.user("Find the crash")])
    with SQLiteStore(path) as store:
        assert three_levels(store=store).run(lead) == "Line 12."
    mid = only_child(lead)
    leaf = only_child(mid)
    with SQLiteStore(path) as store:
        loaded = store.load(lead.id)
        assert_same(loaded, lead)
        assert_same(loaded.child(mid.id).child(leaf.id), leaf)
        assert [info.id for info in store.list(parent_id=lead.id)] == [mid.id]


def test_a_sync_run_saves_the_tree_and_it_reopens_from_the_file_store(tmp_path: Path) -> None:
    lead = State(messages=[Message.user("Find the crash")])
    assert three_levels(store=FileStore(tmp_path / "runs")).run(lead) == "Line 12."
    mid = only_child(lead)
    leaf = only_child(mid)
    loaded = FileStore(tmp_path / "runs").load(lead.id)
    assert_same(loaded, lead)
    assert_same(loaded.child(mid.id).child(leaf.id), leaf)


async def run_with_one_child(store: Any) -> tuple[State, str]:
    """Run a lead (saved to `store`) whose call starts one helper child; the lead and its id."""
    helper = Agent(FakeModel(["helped"]), name="helper", description="Helps.")
    lead = Agent(FakeModel([tool_call("helper", task="help"), "ok"]), tools=[helper], store=store)
    state = State(messages=[Message.user("Go")])
    assert await lead.arun(state) == "ok"
    (kid,) = child_ids(state)
    return state, kid


@pytest.mark.anyio
async def test_achild_opens_a_child_from_a_sync_store_off_the_loop_thread() -> None:
    # Seed 004, achild: "The async version of child: the same lookup and the same errors";
    # issue 4: sync stores are "called from worker threads inside async runs".
    store = ThreadCheckedStore(threading.get_ident())
    state, kid = await run_with_one_child(store)
    loaded = store.load(state.id)
    assert loaded.child(kid).answer == "helped"  # the sync lookup works
    store.on_loop.clear()
    opened = await loaded.achild(kid)
    assert opened.answer == "helped"
    assert opened.parent_id == state.id
    assert store.on_loop == []


@pytest.mark.anyio
async def test_child_of_a_state_bound_to_a_third_party_async_only_store_raises_type_error() -> None:
    # Seed 004, child raises "TypeError: The store works only asynchronously. Use achild.",
    # also for a store that only has the a-methods (no capability flag).
    store = AsyncOnlyStore()
    state, kid = await run_with_one_child(store)
    loaded = await store.aload(state.id)
    assert (await loaded.achild(kid)).answer == "helped"
    with pytest.raises(TypeError, match="achild"):
        loaded.child(kid)


def test_a_cut_off_call_still_lists_the_child_it_started_after_load(sync_store: Any) -> None:
    # DESIGN 8: "the parent's tool_result entry lists child_ids"; issue 5: "after a save and
    # load, the tree reopens"; DESIGN 9: load closes a half-done turn with `unknown` results.
    lead = State(id="lead", messages=[Message.user("Delegate the search")])
    record_run_start(lead, RunStart(agent="lead", model="fake", tools=("helper",)))
    begin_think(lead, model="fake")
    call = ToolCall("c1", "helper", {"task": "search"})
    record_reply(lead, Reply(Message.assistant("", [call]), Usage(requests=1)))
    sync_store.save(lead)
    kid = State(id="kid", messages=[Message.user("search")])
    record_run_start(
        kid, RunStart(parent_id="lead", parent_call_id="c1", agent="helper", model="fake")
    )
    begin_think(kid, model="fake")
    record_reply(kid, Reply(Message.assistant("found it"), Usage(input_tokens=7, requests=1)))
    sync_store.save(kid)
    # The process stops here: the lead's call never got its result.
    loaded = sync_store.load("lead")
    (result,) = results(loaded)
    assert result.outcome == "unknown"
    assert result.child_ids == ("kid",)
    assert loaded.child("kid").answer == "found it"


# AioSQLiteStore: async only --------------------------------------------------------------------


@pytest.mark.anyio
@on_asyncio
async def test_the_tree_reopens_from_an_async_only_store_with_achild(tmp_path: Path) -> None:
    aio_path = tmp_path / "states.db"
    async with AioSQLiteStore(aio_path) as store:
        lead, mid, leaf = await run_tree(three_levels(store=store))
    async with AioSQLiteStore(aio_path) as store:
        loaded = await store.aload(lead.id)
        assert_same(loaded, lead)
        with pytest.raises(TypeError, match="achild"):
            loaded.child(mid.id)
        reopened_mid = await loaded.achild(mid.id)
        assert_same(reopened_mid, mid)
        assert await loaded.achild(mid.id) is not reopened_mid
        with pytest.raises(TypeError, match="achild"):
            reopened_mid.child(leaf.id)
        assert_same(await reopened_mid.achild(leaf.id), leaf)
        with pytest.raises(KeyError, match="not a child"):
            await loaded.achild(leaf.id)
        with pytest.raises(KeyError, match="not a child"):
            loaded.child(leaf.id)
        assert [info.id for info in await store.alist(parent_id=mid.id)] == [leaf.id]
        assert_same(await loaded.fork().achild(mid.id), mid)
        await store.adelete(leaf.id)
        with pytest.raises(LookupError):
            await reopened_mid.achild(leaf.id)


# Many children at once -------------------------------------------------------------------------


def fan_out_agent(store: Any, children: int) -> Agent:
    """A lead whose one turn starts `children` workers at once; each calls `lookup` once."""

    def worker_script(request: Request) -> Any:
        if request.messages[-1].tool_results:
            return text(f"done {request.messages[0].text}", 0.125)
        return ask_for(tool_call("lookup"), 0.125)

    worker = Agent(
        FakeModel([worker_script] * (children * 2)),
        tools=[lookup],
        name="worker",
        description="Works on one part.",
    )
    calls = [tool_call("worker", task=f"part {i}") for i in range(children)]
    return Agent(FakeModel([calls, "all done"]), tools=[worker], store=store)


@pytest.mark.anyio
async def test_ten_children_saved_at_once_all_reopen(opener: Callable[[], SyncStore]) -> None:
    lead = State(messages=[Message.user("Split the work")])
    await fan_out_agent(opener(), 10).arun(lead)
    ids = child_ids(lead)
    assert len(set(ids)) == 10
    store = opener()
    loaded = store.load(lead.id)
    assert_same(loaded, lead)
    assert sorted(info.id for info in store.list(parent_id=lead.id)) == sorted(ids)
    for child_id in ids:
        assert_same(loaded.child(child_id), lead.child(child_id))
    assert sorted(loaded.child(c).answer for c in ids) == sorted(
        f"done part {i}" for i in range(10)
    )


@pytest.mark.anyio
@on_asyncio
async def test_ten_children_saved_at_once_reopen_from_an_async_only_store(tmp_path: Path) -> None:
    lead = State(messages=[Message.user("Split the work")])
    async with AioSQLiteStore(tmp_path / "states.db") as store:
        await fan_out_agent(store, 10).arun(lead)
    async with AioSQLiteStore(tmp_path / "states.db") as store:
        loaded = await store.aload(lead.id)
        assert_same(loaded, lead)
        for child_id in child_ids(lead):
            assert_same(await loaded.achild(child_id), lead.child(child_id))
        listed = await store.alist(parent_id=lead.id)
        assert sorted(info.id for info in listed) == sorted(child_ids(lead))
