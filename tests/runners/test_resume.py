"""Resume of cut-off children (LocalRunner): after a crash cut off a subagent call, running the
parent again continues the child from its own history and delivers its answer."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
import pytest

from orchestrator import (
    Agent,
    Message,
    State,
    StoreDamagedError,
    Tool,
    Usage,
    tool,
)
from orchestrator.runners import ChildJob, LocalRunner
from orchestrator.runners.contract import crash_during
from orchestrator.testing import FakeModel, tool_call
from stores import SQLiteStore
from tests.doubles import results

pytestmark = pytest.mark.anyio


class Searches:
    """A search tool that blocks (the crash comes while it runs) and counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.started = anyio.Event()

    def tool(self) -> Tool:
        @tool
        async def search(query: str) -> str:
            """Search the notes.

            Args:
                query: What to look for.
            """
            self.calls += 1
            self.started.set()
            await anyio.sleep_forever()
            return "never"

        return search


def researcher(model: FakeModel, searches: Searches, **settings: object) -> Agent:
    return Agent(
        model,
        name="researcher",
        description="Finds facts",
        tools=[searches.tool()],
        **settings,  # type: ignore[arg-type]
    )


async def crashed(tmp_path: Path) -> tuple[SQLiteStore, str]:
    """A lead whose researcher was cut off while its search ran; the store after the crash."""
    db, after = tmp_path / "runs.db", tmp_path / "after.db"
    searches = Searches()
    child_model = FakeModel([tool_call("search", query="outage")])
    lead_model = FakeModel([tool_call("researcher", task="Find the cause")])
    store = SQLiteStore(db)
    lead = Agent(lead_model, name="lead", tools=[researcher(child_model, searches)], store=store)
    state = State(messages=[Message.user("Why the outage?")])
    await crash_during(lead, state, db, after, searches.started.wait)
    store.close()
    return SQLiteStore(after), state.id


async def test_a_cut_off_child_continues_from_its_history_and_its_answer_reaches_the_parent(
    tmp_path: Path,
) -> None:
    store, lead_id = await crashed(tmp_path)
    lead_state = await store.aload(lead_id)
    (cut,) = results(lead_state)
    assert cut.outcome == "unknown"
    (child_id,) = cut.child_ids

    searches = Searches()
    child_model = FakeModel(["The pool was shrunk to 5."])
    lead_model = FakeModel(["Root cause: the pool size."])
    lead = Agent(
        lead_model,
        name="lead",
        tools=[researcher(child_model, searches)],
        store=store,
    )
    assert await lead.arun(lead_state) == "Root cause: the pool size."

    assert searches.calls == 0  # the cut-off search was closed `unknown`, never run again
    assert len(child_model.requests) == 1  # the child went on from its own history
    child = await store.aload(child_id)
    assert child.answer == "The pool was shrunk to 5."
    assert (child.parent_id, child.parent_call_id) == (lead_id, cut.call.id)
    assert [e.outcome for e in results(child)] == ["unknown"]
    delivered = results(lead_state)[-1]
    assert delivered.late
    assert (delivered.outcome, delivered.child_ids) == ("done", (child_id,))
    assert delivered.content.content[0].text == "The pool was shrunk to 5."  # type: ignore[union-attr]
    assert delivered.usage == Usage(requests=1)  # what the child spent after the crash
    # The model saw the answer in a notice, right before its reply.
    seen = lead_model.requests[0].messages[-1]
    assert seen.is_notice
    assert "The pool was shrunk to 5." in seen.text
    assert lead_state.usage.requests == 1 + 1 + 1 + 1  # lead 2, child 2, rolled up
    again = await store.aload(lead_id)
    assert again.history == lead_state.history  # saved


async def test_a_finished_child_is_delivered_without_any_model_request(tmp_path: Path) -> None:
    """The child answered, then the parent died before it recorded the call's result."""
    db, after = tmp_path / "runs.db", tmp_path / "after.db"
    ended = anyio.Event()

    class EndsThenHangs(LocalRunner):
        async def run(self, job: ChildJob) -> State:
            state = await super().run(job)
            ended.set()
            await anyio.sleep_forever()
            return state

    child = Agent(FakeModel(["Found: pool size 5."]), name="researcher", description="Finds")
    store = SQLiteStore(db)
    lead = Agent(
        FakeModel([tool_call("researcher", task="Find")]),
        name="lead",
        tools=[child.as_tool(runner=EndsThenHangs())],
        store=store,
    )
    state = State(messages=[Message.user("Why?")])
    await crash_during(lead, state, db, after, ended.wait)
    lead_id = state.id
    store.close()

    store = SQLiteStore(after)
    lead_state = await store.aload(lead_id)
    child_model = FakeModel([])  # any request would fail the child
    lead_model = FakeModel(["Done."])
    child = Agent(child_model, name="researcher", description="Finds")
    lead = Agent(lead_model, name="lead", tools=[child], store=store)
    await lead.arun(lead_state)
    assert child_model.requests == []
    delivered = results(lead_state)[-1]
    assert (delivered.late, delivered.outcome) == (True, "done")
    assert delivered.usage == Usage()  # nothing spent since: nothing counted twice
    assert "Found: pool size 5." in lead_model.requests[0].messages[-1].text


async def test_resume_false_leaves_the_call_unknown_and_runs_no_child(tmp_path: Path) -> None:
    store, lead_id = await crashed(tmp_path)
    lead_state = await store.aload(lead_id)
    child_model = FakeModel([])
    lead_model = FakeModel(["Starting over."])
    child = researcher(child_model, Searches())
    lead = Agent(lead_model, name="lead", tools=[child.as_tool(resume=False)], store=store)
    await lead.arun(lead_state)
    assert child_model.requests == []
    assert [e.outcome for e in results(lead_state)] == ["unknown"]
    last = lead_model.requests[0].messages[-1]
    assert not last.is_notice
    assert "(unknown:" in str(last.content[0])


async def test_a_delivered_call_is_not_resumed_twice(tmp_path: Path) -> None:
    store, lead_id = await crashed(tmp_path)
    lead_state = await store.aload(lead_id)
    child_model = FakeModel(["Answer."])
    lead = Agent(
        FakeModel(["One.", "Two."]),
        name="lead",
        tools=[researcher(child_model, Searches())],
        store=store,
    )
    await lead.arun(lead_state)
    lead_state.add_message(lead_state.messages[0])  # the user asks again
    await lead.arun(lead_state)
    assert len(child_model.requests) == 1
    assert sum(entry.late for entry in results(lead_state)) == 1


async def test_a_child_that_fails_when_continued_gives_the_parent_an_error(
    tmp_path: Path,
) -> None:
    store, lead_id = await crashed(tmp_path)
    lead_state = await store.aload(lead_id)
    lead_model = FakeModel(["Noted."])
    child = researcher(FakeModel([ConnectionError("model down")]), Searches())
    lead = Agent(lead_model, name="lead", tools=[child], store=store)
    await lead.arun(lead_state)
    delivered = results(lead_state)[-1]
    assert (delivered.late, delivered.outcome) == (True, "error")
    assert "model down" in lead_model.requests[0].messages[-1].text


async def unrelated_answer(store: SQLiteStore, state_id: str) -> State:
    """A finished State `state_id` of no parent, whose answer is a stranger's, saved."""
    state = State(id=state_id, messages=[Message.user("Something else")])
    await Agent(FakeModel(["The stranger's answer."]), store=store).arun(state)
    return state


async def test_a_link_pointed_at_an_unrelated_state_never_delivers_its_answer(
    tmp_path: Path,
) -> None:
    store, lead_id = await crashed(tmp_path)
    await unrelated_answer(store, "stranger")
    path = tmp_path / "after.db"
    with sqlite3.connect(path) as db:  # the real child unlinked, the stranger linked instead
        (call,) = db.execute("SELECT parent_call_id FROM states WHERE parent_id = ?", (lead_id,))
        db.execute("UPDATE states SET parent_id = NULL WHERE parent_id = ?", (lead_id,))
        db.execute(
            "UPDATE states SET parent_id = ?, parent_call_id = ? WHERE id = 'stranger'",
            (lead_id, call[0]),
        )
    db.close()
    with pytest.raises(StoreDamagedError, match=r"links State 'stranger' to its cut-off call"):
        await SQLiteStore(path).aload(lead_id)


async def test_a_listed_child_whose_history_names_another_parent_is_not_delivered(
    tmp_path: Path,
) -> None:
    # The parent's result lists the child by id (as a recovery before links were checked
    # might have written): the child's own history decides, and its answer never reaches
    # the model.
    store, lead_id = await crashed(tmp_path)
    lead_state = await store.aload(lead_id)
    (cut,) = results(lead_state)
    (child_id,) = cut.child_ids
    await store.adelete(child_id)
    await unrelated_answer(store, child_id)
    lead_model = FakeModel(["Root cause: the pool size."])
    lead = Agent(
        lead_model, name="lead", tools=[researcher(FakeModel([]), Searches())], store=store
    )
    with pytest.raises(StoreDamagedError, match=rf"lists State '{child_id}' as its subagent"):
        await lead.arun(lead_state)
    assert lead_model.requests == []
    assert [entry.outcome for entry in results(lead_state)] == ["unknown"]
