"""Approvals that wait: deferred calls, decisions in history, resumption, subagents, races."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

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
from stores import MemoryStore, SQLiteStore

pytestmark = pytest.mark.anyio

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
    stored_child = store.load(child_id)  # the decisions reached the child, saved
    assert len([e for e in stored_child.history if e.kind == "approval"]) == 2

    resumed = store.load("root")
    assert await agent.arun(resumed) == "root done"
    assert SENT == ["bob"]
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
