"""Approvals that wait: deferred calls, decisions in history, resumption, subagents, races."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from orchestrator import (
    Agent,
    ApprovalEntry,
    Message,
    State,
    StoppedByApproval,
    StoreConflictError,
    aapprove,
    adeny,
    approve,
    awaiting,
    resumed_child,
    tool,
)
from orchestrator.permissions import AllowByName, ApproveLater, Deferred
from orchestrator.testing import FakeModel, tool_call
from stores import AioSQLiteStore, MemoryStore, PostgresStore, SQLiteStore
from tests.postgres import fresh_schema

pytestmark = pytest.mark.anyio

Loader = Callable[[str], Awaitable[State]]

SENT: list[str] = []


@tool
def send(to: str) -> str:
    """Send a message."""
    SENT.append(to)
    return f"sent to {to}"


@tool
def look() -> str:
    """Look around."""
    return "looked"


@pytest.fixture(autouse=True)
def _clear_sent() -> None:
    SENT.clear()


def _mailer(store: object | None = None) -> Agent:
    return Agent(
        FakeModel([[tool_call("send", to="bob"), tool_call("look")], "done"]),
        tools=[send, look],
        store=store,  # type: ignore[arg-type]
        permissions=[AllowByName("look"), ApproveLater("send", reason="mail leaves the house")],
    )


async def test_a_deferred_call_stops_the_run_and_the_others_run() -> None:
    store = MemoryStore()
    state = State(id="s1", messages=[Message.user("mail bob")])
    await _mailer(store).arun(state)
    stopped = state.stopped
    assert isinstance(stopped, StoppedByApproval)
    (item,) = stopped.calls
    assert item.call.name == "send"
    assert item.state_id == "s1"
    assert item.via is None
    assert item.reason == "mail leaves the house"
    assert awaiting(state) == stopped.calls
    assert [call.name for call in state.pending_calls] == ["send"]
    assert SENT == []
    assert any(e.kind == "tool_result" and e.call.name == "look" for e in state.history)
    loaded = store.load("s1")  # the waiting call is not closed as unknown on a load
    assert [call.name for call in loaded.pending_calls] == ["send"]
    assert awaiting(loaded) == stopped.calls


async def test_approved_runs_once_in_a_later_run_recorded_with_who_and_why() -> None:
    store = MemoryStore()
    state = State(id="s2", messages=[Message.user("mail bob")])
    agent = _mailer(store)
    await agent.arun(state)
    call_id = awaiting(state)[0].call.id
    loaded = store.load("s2")
    await aapprove(loaded, call_id, by="ann", reason="fine")
    await aapprove(loaded, call_id, by="ann", reason="fine")  # twice: harmless
    assert awaiting(loaded) == ()
    again = store.load("s2")  # the decision was saved
    decisions = [e for e in again.history if isinstance(e, ApprovalEntry)]
    assert len(decisions) == 1
    record = decisions[0].content
    assert (record.call_id, record.approved, record.by, record.reason) == (
        call_id,
        True,
        "ann",
        "fine",
    )
    answer = await agent.arun(again)
    assert answer == "done"
    assert SENT == ["bob"]
    result = next(e for e in again.history if e.kind == "tool_result" and e.call.id == call_id)
    assert result.outcome == "done"
    assert store.load("s2").history == again.history


async def test_denied_gets_an_error_result_the_model_reads() -> None:
    store = MemoryStore()
    state = State(id="s3", messages=[Message.user("mail bob")])
    model_agent = _mailer(store)
    await model_agent.arun(state)
    call_id = awaiting(state)[0].call.id
    await adeny(state, call_id, by="ann", reason="not today")
    await model_agent.arun(state)
    result = next(e for e in state.history if e.kind == "tool_result" and e.call.id == call_id)
    assert result.outcome == "denied"
    assert result.content.is_error
    assert "ann" in result.content.text
    assert "not today" in result.content.text
    assert SENT == []
    model = model_agent.model
    assert isinstance(model, FakeModel)
    last_request = model.requests[-1]
    texts = [b.text for m in last_request.messages for b in m.tool_results]
    assert any("not today" in text for text in texts)


async def test_unknown_call_names_the_waiting_ones_and_a_flip_is_refused() -> None:
    state = State(id="s4", messages=[Message.user("mail bob")])
    await _mailer().arun(state)
    call_id = awaiting(state)[0].call.id
    with pytest.raises(KeyError, match=call_id):
        await aapprove(state, "no-such-call")
    await aapprove(state, call_id, by="ann")
    with pytest.raises(ValueError, match="approved by ann already"):
        await adeny(state, call_id)


async def test_running_again_without_a_decision_stops_again() -> None:
    state = State(id="s5", messages=[Message.user("mail bob")])
    agent = _mailer()
    await agent.arun(state)
    first = awaiting(state)
    await agent.arun(state)
    assert isinstance(state.stopped, StoppedByApproval)
    assert awaiting(state) == first
    assert SENT == []


def _tree(store: object) -> Agent:
    child = Agent(
        FakeModel([[tool_call("send", to="bob"), tool_call("send", to="eve")], "child done"]),
        name="mailer",
        description="Sends mail",
        tools=[send],
        permissions=[ApproveLater("send")],
    )
    return Agent(
        FakeModel([tool_call("mailer", task="mail them"), "root done"]),
        tools=[child],
        store=store,  # type: ignore[arg-type]
    )


async def test_a_subagents_waiting_call_stops_the_root_and_the_decision_reaches_it() -> None:
    store = MemoryStore()
    root = State(id="root", messages=[Message.user("go")])
    agent = _tree(store)
    await agent.arun(root)
    assert isinstance(root.stopped, StoppedByApproval)
    waiting = awaiting(root)
    assert [item.call.args["to"] for item in waiting] == ["bob", "eve"]
    child_id = waiting[0].state_id
    assert child_id != "root"
    assert waiting[0].via == root.pending_calls[0].id
    child = store.load(child_id)
    assert child.parent_id == "root"
    assert isinstance(child.stopped, StoppedByApproval)

    loaded = store.load("root")
    await aapprove(loaded, waiting[0].call.id, by="ann")
    await adeny(loaded, waiting[1].call.id, by="ann", reason="not eve")
    stored_child = store.load(child_id)  # recorded at the root alone: one save
    assert [e for e in stored_child.history if e.kind == "approval"] == []

    resumed = store.load("root")
    assert await agent.arun(resumed) == "root done"
    assert SENT == ["bob"]
    # The root handed its decisions down: the child recorded them, who and why, before it ran.
    kinds = [e.kind for e in store.load(child_id).history]
    first = kinds.index("approval")
    assert kinds[first : first + 3] == ["approval", "approval", "run_start"]
    handed = [e.content for e in store.load(child_id).history if isinstance(e, ApprovalEntry)]
    assert [(r.call_id, r.approved, r.by, r.reason) for r in handed] == [
        (waiting[0].call.id, True, "ann", None),
        (waiting[1].call.id, False, "ann", "not eve"),
    ]
    result = next(e for e in resumed.history if e.kind == "tool_result")
    assert result.child_ids == (child_id,)  # the same child continued, not a new one
    assert resumed.child(child_id).answer == "child done"
    assert [info.id for info in store.list(parent_id="root")] == [child_id]


def _plain_tree(store: MemoryStore, *, continues: bool) -> Agent:
    """A root whose plain tool starts the subagent itself (continuing it or not on resume)."""
    child = Agent(
        FakeModel([tool_call("send", to="bob"), "child done"]),
        name="mailer",
        tools=[send],
        permissions=[ApproveLater("send")],
    )

    @tool
    async def mail(task: str) -> str:
        """Have the mail sent."""
        fresh = State(messages=[Message.user(task)])
        state = (resumed_child() or fresh) if continues else fresh
        return str(await child.arun(state))

    return Agent(
        FakeModel([tool_call("mail", task="mail bob"), "root done"]), tools=[mail], store=store
    )


async def test_a_plain_tool_continues_its_subagent_with_resumed_child() -> None:
    assert resumed_child() is None  # outside a tool call
    store = MemoryStore()
    root = State(id="root", messages=[Message.user("go")])
    agent = _plain_tree(store, continues=True)
    await agent.arun(root)
    (waiting,) = awaiting(root)
    child_id = waiting.state_id
    assert waiting.via == root.pending_calls[0].id
    loaded = store.load("root")
    await aapprove(loaded, waiting.call.id, by="ann")
    assert await agent.arun(loaded) == "root done"
    assert SENT == ["bob"]  # the approved call ran once, in the same child
    result = next(e for e in loaded.history if e.kind == "tool_result")
    assert result.content.text == "child done"
    assert result.child_ids == (child_id,)
    assert [info.id for info in store.list(parent_id="root")] == [child_id]


async def test_a_plain_tool_that_starts_a_new_subagent_instead_gets_an_error_result() -> None:
    store = MemoryStore()
    root = State(id="root", messages=[Message.user("go")])
    agent = _plain_tree(store, continues=False)
    await agent.arun(root)
    (waiting,) = awaiting(root)
    loaded = store.load("root")
    await aapprove(loaded, waiting.call.id, by="ann")
    await agent.arun(loaded)
    result = next(e for e in loaded.history if e.kind == "tool_result")
    assert result.content.is_error
    assert waiting.state_id in result.content.text
    assert "resumed_child()" in result.content.text


async def test_deferred_is_a_decision_permissions_may_return() -> None:
    assert Deferred().reason is None
    with pytest.raises(TypeError):
        Deferred(3)  # type: ignore[arg-type]


_RACE = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from orchestrator import Agent, StoreConflictError, tool
    from orchestrator.permissions import AllowByName, ApproveLater
    from orchestrator.testing import FakeModel
    from stores import SQLiteStore

    marks = Path(sys.argv[2])

    @tool
    def send(to: str) -> str:
        "Send a message."
        with marks.open("a") as out:
            out.write(to + "\\n")
        return "sent"

    @tool
    def look() -> str:
        "Look around."
        return "looked"

    store = SQLiteStore(sys.argv[1])
    agent = Agent(FakeModel(["done"]), tools=[send, look], store=store,
                  permissions=[AllowByName("look"), ApproveLater("send")])
    state = store.load("race")
    Path(sys.argv[3]).write_text("loaded")
    while not Path(sys.argv[4]).exists():
        pass
    try:
        agent.run(state)
    except StoreConflictError as error:
        print("CONFLICT", error)
    else:
        print("RAN")
    """
)


def test_two_processes_resume_one_runs_the_other_gets_a_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    store = SQLiteStore(db)
    state = State(id="race", messages=[Message.user("mail bob")])
    _mailer(store).run(state)
    approve(store.load("race"), awaiting(state)[0].call.id, by="ann")
    script = tmp_path / "race.py"
    script.write_text(_RACE)
    marks, go = tmp_path / "marks.txt", tmp_path / "go"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(script),
                str(db),
                str(marks),
                str(tmp_path / f"ready{i}"),
                str(go),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        for i in range(2):
            for _ in range(600):
                if (tmp_path / f"ready{i}").exists():
                    break
                time.sleep(0.05)
        go.write_text("go")
        outputs = [proc.communicate(timeout=60) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    lines = sorted(out.strip().splitlines()[-1] for out, _ in outputs)
    assert lines[0].startswith("CONFLICT"), outputs
    assert lines[1] == "RAN", outputs
    assert "load" in lines[0]  # the error says how to go on
    assert marks.read_text() == "bob\n"  # the approved call ran exactly once
    final = store.load("race")
    assert final.answer == "done"
    assert issubclass(StoreConflictError, ValueError)


# -- one source of truth: a decision is saved in the State it was made on, in one save --------


def _waiting_for(state: State) -> list[str]:
    """Whom the waiting calls of `state` would mail."""
    return [item.call.args["to"] for item in awaiting(state)]


def _call_to(state: State, to: str) -> str:
    return next(item.call.id for item in awaiting(state) if item.call.args["to"] == to)


def _approvals_in(state: State) -> list[tuple[str, bool]]:
    return [(e.content.call_id, e.content.approved) for e in state.history if e.kind == "approval"]


async def _approve_while_another_copy_is_saved(store: Any, load: Loader) -> None:
    """An approval whose save of the root conflicts takes effect nowhere; a later one works."""
    agent = _tree(store)
    await agent.arun(State(id="root", messages=[Message.user("go")]))
    first, second = await load("root"), await load("root")
    bob, eve = _call_to(first, "bob"), _call_to(first, "eve")
    await adeny(second, eve, by="bo")  # another copy of the root is saved meanwhile
    with pytest.raises(StoreConflictError, match="load"):
        await aapprove(first, bob, by="ann")
    assert _waiting_for(first) == ["bob", "eve"]  # taken back: the State passed is as it was
    fresh = await load("root")
    assert _waiting_for(fresh) == ["bob"]  # decidable: nothing of it was stored anywhere
    child_id = awaiting(fresh)[0].state_id
    assert _approvals_in(await load(child_id)) == []

    await agent.arun(fresh)  # eve's denial is carried out; bob still waits
    assert SENT == []
    assert isinstance(fresh.stopped, StoppedByApproval)
    assert _waiting_for(await load("root")) == ["bob"]

    await aapprove(await load("root"), bob, by="ann")  # a later approval works
    resumed = await load("root")
    assert await agent.arun(resumed) == "root done"
    assert SENT == ["bob"]  # once, only after the approval that was saved
    assert _approvals_in(await load(child_id)) == [(eve, False), (bob, True)]


def _threaded(store: Any) -> Loader:
    async def load(state_id: str) -> State:
        return await anyio.to_thread.run_sync(store.load, state_id)

    return load


async def test_an_approval_whose_root_save_conflicts_takes_effect_nowhere(
    sync_store: MemoryStore,
) -> None:
    await _approve_while_another_copy_is_saved(sync_store, _threaded(sync_store))


async def test_an_approval_whose_root_save_conflicts_on_postgres() -> None:
    with fresh_schema() as (dsn, schema):
        store = PostgresStore(dsn, schema=schema, pool_size=2)
        try:
            await _approve_while_another_copy_is_saved(store, _threaded(store))
        finally:
            store.close()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # aiosqlite runs on asyncio only
async def test_an_approval_whose_root_save_conflicts_on_aiosqlite(tmp_path: Path) -> None:
    async with AioSQLiteStore(tmp_path / "runs.db") as store:
        await _approve_while_another_copy_is_saved(store, store.aload)


class _RootSaveFails(MemoryStore):
    """A store whose saves of the State `root` fail while `failing` is set."""

    failing = False

    def save(self, state: State) -> None:
        if self.failing and state.id == "root":
            raise OSError("the disk is full")
        super().save(state)

    async def asave(self, state: State) -> None:
        if self.failing and state.id == "root":
            raise OSError("the disk is full")
        await super().asave(state)


@pytest.mark.parametrize("verdict", [aapprove, adeny])
async def test_a_decision_whose_root_save_fails_is_never_carried_out(verdict: object) -> None:
    store = _RootSaveFails()
    agent = _tree(store)
    root = State(id="root", messages=[Message.user("go")])
    await agent.arun(root)
    bob = _call_to(root, "bob")
    child_id = awaiting(root)[0].state_id
    store.failing = True
    with pytest.raises(OSError, match="disk is full"):
        await verdict(root, bob, by="ann")  # type: ignore[operator]
    store.failing = False
    assert _waiting_for(root) == ["bob", "eve"]  # the State in memory: as it was
    assert _approvals_in(store.load(child_id)) == []
    await agent.arun(root)  # the next run: nothing was decided, so nothing runs
    assert SENT == []
    assert _waiting_for(root) == ["bob", "eve"]
    assert _waiting_for(store.load("root")) == ["bob", "eve"]

    await aapprove(root, bob, by="ann")  # decided again: now it runs, once
    await adeny(root, _call_to(root, "eve"), by="ann")
    assert await agent.arun(store.load("root")) == "root done"
    assert SENT == ["bob"]


async def test_a_decision_only_the_subagent_holds_is_not_carried_out_by_the_root() -> None:
    # What an earlier version left when the root's save failed, or a decision made on the
    # subagent State itself: the root's run never carries it out against the root's view.
    store = MemoryStore()
    agent = _tree(store)
    await agent.arun(State(id="root", messages=[Message.user("go")]))
    root = store.load("root")
    bob = _call_to(root, "bob")
    child_id = awaiting(root)[0].state_id
    await aapprove(store.load(child_id), bob, by="ann")  # in the child alone
    assert _approvals_in(store.load(child_id)) == [(bob, True)]
    assert _waiting_for(root) == ["bob", "eve"]  # the root still sees it decidable
    await agent.arun(root)
    assert SENT == []
    assert isinstance(root.stopped, StoppedByApproval)
    assert _waiting_for(store.load("root")) == ["bob", "eve"]

    loaded = store.load("root")
    await aapprove(loaded, bob, by="ann")  # the same decision at the root: harmless twice
    await adeny(loaded, _call_to(loaded, "eve"), by="ann")
    assert await agent.arun(store.load("root")) == "root done"
    assert SENT == ["bob"]
    child = store.load(child_id)
    assert sorted(_approvals_in(child)) == sorted([(bob, True), (_call_to(root, "eve"), False)])


async def test_a_decision_made_on_a_subagent_is_carried_out_when_it_runs() -> None:
    store = MemoryStore()
    mailer = Agent(
        FakeModel([tool_call("send", to="bob"), "child done"]),
        name="mailer",
        description="Sends mail",
        tools=[send],
        permissions=[ApproveLater("send")],
    )
    root_agent = Agent(
        FakeModel([tool_call("mailer", task="mail bob")]), tools=[mailer], store=store
    )
    await root_agent.arun(State(id="root", messages=[Message.user("go")]))
    (item,) = awaiting(store.load("root"))
    child = store.load(item.state_id)
    await aapprove(child, item.call.id, by="ann")
    assert _approvals_in(store.load(child.id)) == [(item.call.id, True)]  # saved in the child
    assert await mailer.arun(child) == "child done"
    assert SENT == ["bob"]


async def test_opposite_decisions_in_the_root_and_the_subagent_run_nothing() -> None:
    store = MemoryStore()
    agent = _tree(store)
    await agent.arun(State(id="root", messages=[Message.user("go")]))
    root = store.load("root")
    bob, eve = _call_to(root, "bob"), _call_to(root, "eve")
    child_id = awaiting(root)[0].state_id
    await aapprove(store.load(child_id), bob, by="ann")  # in the child alone
    loaded = store.load("root")
    await adeny(loaded, bob, by="bo")
    await adeny(loaded, eve, by="bo")
    assert await agent.arun(loaded) == "root done"
    assert SENT == []
    (result,) = [e for e in loaded.history if e.kind == "tool_result"]
    assert result.outcome == "error"
    assert "approved by ann" in result.content.text
    assert "denied by bo" in result.content.text
    assert child_id in result.content.text


def _nested(store: MemoryStore | None) -> Agent:
    """root -> manager -> mailer: the mailer's mail waits for a person."""
    mailer = Agent(
        FakeModel([tool_call("send", to="bob"), "mailer done"]),
        name="mailer",
        description="Sends mail",
        tools=[send],
        permissions=[ApproveLater("send")],
    )
    manager = Agent(
        FakeModel([tool_call("mailer", task="mail bob"), "manager done"]),
        name="manager",
        description="Manages",
        tools=[mailer],
    )
    return Agent(
        FakeModel([tool_call("manager", task="go"), "root done"]), tools=[manager], store=store
    )


@pytest.mark.parametrize("stored", [True, False])
async def test_each_level_hands_the_decision_down(stored: bool) -> None:
    store = MemoryStore() if stored else None
    agent = _nested(store)
    root = State(id="root", messages=[Message.user("go")])
    await agent.arun(root)
    (item,) = awaiting(root)
    assert item.via == root.pending_calls[0].id
    if store is not None:
        root = store.load("root")
    await aapprove(root, item.call.id, by="ann", reason="fine")
    assert await agent.arun(root) == "root done"
    assert SENT == ["bob"]
    (result,) = [e for e in root.history if e.kind == "tool_result"]
    (manager_id,) = result.child_ids
    manager = root.child(manager_id)
    mailer_id = next(i for e in manager.history if e.kind == "tool_result" for i in e.child_ids)
    mailer = manager.child(mailer_id)
    assert mailer.id == item.state_id  # the same mailer continued
    for state in (root, manager, mailer):
        assert _approvals_in(state) == [(item.call.id, True)], state.id
    assert mailer.answer == "mailer done"


async def test_a_subagent_neither_in_memory_nor_in_a_store_is_a_clear_error() -> None:
    agent = _tree(None)
    root = State(id="root", messages=[Message.user("go")])
    await agent.arun(root)
    copy = State(id="root", history=root.history)  # the children stay with the original
    await aapprove(copy, _call_to(copy, "bob"))
    with pytest.raises(ValueError, match="not in memory and there is no store"):
        await agent.arun(copy)
    assert SENT == []


async def test_a_waiting_call_of_a_state_the_store_does_not_link_is_a_clear_error() -> None:
    first = MemoryStore()
    await _tree(first).arun(State(id="root", messages=[Message.user("go")]))
    root = first.load("root")
    other = MemoryStore()  # the root copied alone; another State under the subagent's id
    other.save(State(id="root", history=root.history))
    other.save(State(id=awaiting(root)[0].state_id, messages=[Message.user("unrelated")]))
    copy = other.load("root")
    await aapprove(copy, _call_to(copy, "bob"))
    with pytest.raises(ValueError, match="does not link to it"):
        await _tree(other).arun(copy)
    assert SENT == []


class _RecordsThenFails(MemoryStore):
    """A store whose save of `root` records a message in it, then fails."""

    async def asave(self, state: State) -> None:
        if state.id == "root":
            state.add_message(Message.user("meanwhile"))
            raise OSError("the disk is full")
        await super().asave(state)


async def test_a_failed_save_keeps_the_decision_when_more_was_recorded_meanwhile() -> None:
    agent = _tree(None)
    root = State(id="root", messages=[Message.user("go")])
    await agent.arun(root)
    bob = _call_to(root, "bob")
    store = _RecordsThenFails()
    store.save(root)  # binds it
    with pytest.raises(OSError, match="disk is full"):
        await aapprove(root, bob)
    # Taking the decision back would take the message too: both stay, for the next save.
    assert _waiting_for(root) == ["eve"]
    assert root.history[-1].kind == "user"
