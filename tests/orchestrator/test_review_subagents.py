"""Review of subagents against DESIGN section 8, issue #5 and the seed page (004).

Each test cites the sentence it checks. Async tests run on asyncio and trio.
"""

from __future__ import annotations

import builtins
import threading
from typing import Any

import anyio
import pytest

from orchestrator import Agent, Message, Reporter, State, StateInfo, ToolCall, ToolResultEntry, tool
from orchestrator._recording import bind_state
from orchestrator.models import Request
from orchestrator.testing import FakeModel, tool_call
from stores import MemoryStore
from tests.doubles import ThreadCheckedStore

TIMEOUT = 20  # seconds; only reached when a regression makes something wait forever


def child_ids(state: State) -> builtins.list[str]:
    return [c for e in state.history if isinstance(e, ToolResultEntry) for c in e.child_ids]


def has_results(request: Request) -> bool:
    return bool(request.messages[-1].tool_results)


class AsyncOnlyStore:
    """An `orchestrator.AsyncStore` as a third party writes it: the ``a``-methods, nothing else."""

    def __init__(self) -> None:
        self.inner = MemoryStore()

    async def asave(self, state: State) -> None:
        await self.inner.asave(state)
        bind_state(state, self)

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


async def run_with_one_child(store: Any) -> tuple[State, str]:
    """Run a lead (saved to `store`) whose call starts one helper child; the lead and its id."""
    helper = Agent(FakeModel(["helped"]), name="helper", description="Helps.")
    lead = Agent(FakeModel([tool_call("helper", task="help"), "ok"]), tools=[helper], store=store)
    state = State(messages=[Message.user("Go")])
    assert await lead.arun(state) == "ok"
    (kid,) = child_ids(state)
    return state, kid


# child / achild (seed 004) --------------------------------------------------------------------


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
async def test_child_of_a_state_bound_to_an_async_only_store_raises_type_error() -> None:
    # Seed 004, child raises "TypeError: The store works only asynchronously. Use achild."
    store = AsyncOnlyStore()
    state, kid = await run_with_one_child(store)
    loaded = await store.aload(state.id)
    assert (await loaded.achild(kid)).answer == "helped"
    with pytest.raises(TypeError, match="achild"):
        loaded.child(kid)


@pytest.mark.anyio
async def test_an_id_that_is_no_child_raises_key_error() -> None:
    # Seed 004, child raises "KeyError: child_id is not a child of this State"; its ValueError
    # means "It is a child, but this State has no way to open it", which "../x" is not.
    state, _ = await run_with_one_child(None)
    with pytest.raises(KeyError):
        state.child("../x")
    with pytest.raises(KeyError):
        await state.achild("../x")


# Reporters and concurrency (issue 5) ----------------------------------------------------------


class Events(Reporter):
    """Notes (hook, state id) of every event it sees."""

    def __init__(self) -> None:
        self.events: builtins.list[tuple[str, str]] = []

    def on_run_start(self, state: State) -> None:
        self.events.append(("run_start", state.id))

    def on_tool_start(self, state: State, call: ToolCall) -> None:
        self.events.append(("tool_start", state.id))

    def on_child_start(self, parent: State, call: ToolCall, child: State) -> None:
        self.events.append(("child_start", child.id))

    def on_run_end(self, state: State, error: BaseException | None) -> None:
        self.events.append(("run_end", state.id))


@pytest.mark.anyio
async def test_a_child_run_from_a_sync_tool_reports_to_its_own_and_the_lead_reporter() -> None:
    # Issue 5: "children's events go to the parent's reporter too, with
    # on_child_start(parent, call, child)"; DESIGN 8: linking works "from sync tools in
    # worker threads".
    own, leads = Events(), Events()

    @tool
    async def look() -> str:
        """Look."""
        return "seen"

    helper = Agent(
        FakeModel([tool_call("look"), "helped"]),
        tools=[look],
        name="helper",
        description="Helps.",
        reporter=own,
    )

    @tool
    def delegate(task: str) -> str:
        """Hand the task to the helper (in a worker thread)."""
        return str(helper.run(task))

    state = State(messages=[Message.user("Go")])
    lead = Agent(
        FakeModel([tool_call("delegate", task="x"), "ok"]), tools=[delegate], reporter=leads
    )
    assert await lead.arun(state) == "ok"
    (kid,) = child_ids(state)
    expected = [("child_start", kid), ("run_start", kid), ("tool_start", kid), ("run_end", kid)]
    assert [event for event in leads.events if event[1] == kid] == expected
    assert own.events == expected
    assert ("run_end", state.id) in leads.events
    assert all(state_id == kid for _, state_id in own.events)


@pytest.mark.anyio
async def test_max_concurrency_bounds_children_started_from_sync_tools() -> None:
    # Issue 5: "the children of one turn run concurrently (bounded by the agent's
    # max_concurrency)".
    bound, total = 2, 5
    active = peak = 0
    bound_reached = anyio.Event()

    @tool
    async def work() -> str:
        """Work until `bound` workers are in."""
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        if active == bound:
            bound_reached.set()
        await bound_reached.wait()
        active -= 1
        return "worked"

    def worker_script(request: Request) -> Any:
        return "done" if has_results(request) else tool_call("work")

    worker = Agent(
        FakeModel([worker_script] * (2 * total)), tools=[work], name="worker", description="W."
    )

    @tool
    def delegate(task: str) -> str:
        """Hand the task to a worker (in a worker thread)."""
        return str(worker.run(task))

    fan_out = [tool_call("delegate", task=f"part {i}") for i in range(total)]
    state = State(messages=[Message.user("Go")])
    lead = Agent(FakeModel([fan_out, "ok"]), tools=[delegate], max_concurrency=bound)
    with anyio.fail_after(TIMEOUT):
        assert await lead.arun(state) == "ok"
    assert peak == bound
    assert len(child_ids(state)) == total
