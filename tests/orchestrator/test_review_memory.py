"""Review of agent memory (issue 6, DESIGN section 10, seed 003) against the documented contract.

Each test cites the sentence it checks. Some pin behaviour no other test covers; others show
where the library falls short of the text.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest
from pydantic_core import core_schema

from orchestrator import (
    Agent,
    Memory,
    Message,
    State,
    ToolCall,
    ValidationError,
    tool,
)
from orchestrator.testing import FakeModel, tool_call
from stores import AioSQLiteStore, FileStore, MemoryStore, SQLiteStore
from tests.doubles import Loop, Person, results


def digest(model: FakeModel, store: Any, *tools: Any, name: str = "digest") -> Agent:
    return Agent(model, name=name, store=store, collections={"loops": Loop}, tools=tools)


def titles(memory: Memory) -> dict[str, str]:
    return {doc["id"]: doc["title"] for doc in memory.collection("loops").list()}


@pytest.fixture(params=["memory", "file", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "memory":
        yield MemoryStore()
    elif request.param == "file":
        yield FileStore(tmp_path / "runs")
    else:
        with SQLiteStore(tmp_path / "runs.db") as sqlite:
            yield sqlite


# -- effect keys -----------------------------------------------------------------------------------


def test_a_later_turn_that_reuses_a_call_id_still_writes(store: Any) -> None:
    # Seed 003: "Each write gets its own effect key" - a new call of a later turn is a new write.
    first = ToolCall(
        "call_0", "state_loops_upsert", {"id": "A", "doc": {"title": "first", "status": "open"}}
    )
    second = ToolCall(
        "call_0", "state_loops_upsert", {"id": "A", "doc": {"title": "second", "status": "open"}}
    )
    agent = digest(FakeModel([first, second, "done"]), store)
    state = State(messages=[Message.user("go")])
    assert agent.run(state) == "done"
    assert [entry.outcome for entry in results(state)] == ["done", "done"]
    assert "second" in results(state)[1].content.text  # the model was told it was saved
    assert titles(agent.memory) == {"A": "second"}


@tool
def add_note(text: str, memory: Memory) -> str:
    """Append a note (read, change, write)."""
    notes: list[str] = list(memory.get("notes") or [])
    notes.append(text)
    memory.set("notes", notes)
    return f"{len(notes)} notes"


def test_a_replayed_call_that_runs_a_subagent_does_not_duplicate_its_writes() -> None:
    # Issue 6, item 4: "the same key applied twice writes once, so ... a retried call does not
    # duplicate" - the subagent's writes are part of the parent's call.
    store = MemoryStore()

    def child_reply(request: Any) -> Any:
        if len(request.messages) == 1:
            return ToolCall("n1", "add_note", {"text": "x"})
        return "noted"

    noter = Agent(
        FakeModel([child_reply] * 4),
        name="noter",
        description="Takes notes.",
        store=store,
        tools=[add_note],
    )
    lead = Agent(
        FakeModel([ToolCall("c1", "noter", {"task": "note x"})]),
        name="lead",
        store=store,
        tools=[noter],
    )
    state = State(id="lead-state", messages=[Message.user("go")])
    lead.think(state)
    before = state.snapshot()
    lead.use_tools(state)
    assert noter.memory.get("notes") == ["x"]
    state.restore(before)  # replay the same call of the same State
    lead.use_tools(state)
    assert noter.memory.get("notes") == ["x"]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_replaying_upsert_a_b_a_on_aiosqlite_ends_on_the_last_write(tmp_path: Path) -> None:
    # Issue 6, item 4: "replaying upsert A, upsert B, upsert A ends on the last write"; item 5:
    # "Every store backend keeps memory".
    calls = [
        ToolCall("c1", "state_loops_upsert", {"id": "A", "doc": {"title": "1", "status": "open"}}),
        ToolCall("c2", "state_loops_upsert", {"id": "B", "doc": {"title": "2", "status": "open"}}),
        ToolCall("c3", "state_loops_upsert", {"id": "A", "doc": {"title": "3", "status": "open"}}),
    ]
    async with AioSQLiteStore(tmp_path / "runs.db") as store:
        agent = digest(FakeModel([*calls, *calls[1:]]), store)
        state = State(id="s-aio", messages=[Message.user("go")])
        await agent.athink(state)
        before = state.snapshot()
        await agent.ause_tools(state)
        for _ in calls[1:]:
            await agent.athink(state)
            await agent.ause_tools(state)
        loops = agent.memory.collection("loops")
        expected = {"A": "3", "B": "2"}
        assert {d["id"]: d["title"] for d in await loops.alist()} == expected
        state.restore(before)
        await agent.ause_tools(state)
        assert {d["id"]: d["title"] for d in await loops.alist()} == expected
        for _ in calls[1:]:
            await agent.athink(state)
            await agent.ause_tools(state)
        assert {d["id"]: d["title"] for d in await loops.alist()} == expected


# -- validation ------------------------------------------------------------------------------------


class Task(pydantic.BaseModel):
    title: str
    priority: int | list[int]


def test_issue_paths_point_into_the_document_for_union_fields() -> None:
    # Seed 003: "its issues hold the validation issues with their paths" - paths into the doc.
    tasks = Memory.open("digest", {"tasks": Task}, MemoryStore()).collection("tasks")
    with pytest.raises(ValidationError) as raised:
        tasks.upsert("t", {"title": "T", "priority": "high"})
    assert raised.value.issues
    assert {issue.path for issue in raised.value.issues} == {("priority",)}
    assert tasks.list() == []


class Money:
    """A value pydantic validates from text, with no JSON schema of its own."""

    def __init__(self, text: str) -> None:
        amount, currency = text.split()
        self.amount, self.currency = float(amount), currency

    @classmethod
    def parse(cls, value: object) -> Money:
        return value if isinstance(value, Money) else Money(str(value))

    def __str__(self) -> str:
        return f"{self.amount:.2f} {self.currency}"

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: pydantic.GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls.parse, serialization=core_schema.plain_serializer_function_ser_schema(str)
        )


class Expense(pydantic.BaseModel):
    title: str
    cost: Money


def test_a_collection_whose_model_has_no_json_schema_still_gets_its_tools() -> None:
    # Seed 003 table: state_<collection>_upsert takes "{ id, doc } (the doc's JSON Schema, when
    # the schema can produce one)" - without one, the tool is still there.
    memory = Memory.open("books", {"expenses": Expense}, MemoryStore())
    assert memory.collection("expenses").upsert("x", {"title": "Lunch", "cost": "12.5 EUR"}) == {
        "id": "x",
        "title": "Lunch",
        "cost": "12.50 EUR",
    }
    call = tool_call("state_expenses_upsert", id="y", doc={"title": "Taxi", "cost": "30 EUR"})
    agent = Agent(
        FakeModel([call, "ok"]),
        name="books",
        store=MemoryStore(),
        collections={"expenses": Expense},
    )
    names = [t.name for t in agent.tools]
    assert names == ["state_expenses_list", "state_expenses_upsert", "state_expenses_remove"]
    assert set(agent.tools[1].spec.input_schema["properties"]) == {"id", "doc"}
    assert agent.run("go") == "ok"
    assert agent.memory.collection("expenses").list() == [
        {"id": "y", "title": "Taxi", "cost": "30.00 EUR"}
    ]


# -- the generated tools ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_upsert_tool_stores_the_models_output() -> None:
    # Seed 003: "upsert stores the schema's output" - through the generated tool too.
    store = MemoryStore()
    call = tool_call("state_people_upsert", id="ann", doc={"name": "Ann", "age": "41"})
    agent = Agent(FakeModel([call, "ok"]), name="crm", store=store, collections={"people": Person})
    state = State(messages=[Message.user("go")])
    assert await agent.arun(state) == "ok"
    [entry] = results(state)
    assert entry.outcome == "done"
    stored: dict[str, Any] = {"id": "ann", "name": "Ann", "age": 41, "tags": []}
    assert await Memory.open("crm", None, store).collection("people").alist() == [stored]


@pytest.mark.anyio
async def test_the_list_tool_applies_where_then_limit() -> None:
    # Seed 003: state_<collection>_list takes "{ where?, limit? }"; "where matches top-level
    # fields by equality".
    store = MemoryStore()
    loops = Memory.open("digest", {"loops": Loop}, store).collection("loops")
    for i in range(5):
        await loops.aupsert(f"l{i}", {"title": str(i), "status": "open" if i % 2 else "resolved"})
    listing = tool_call("state_loops_list", where={"status": "resolved"}, limit=2)
    state = State(messages=[Message.user("go")])
    await digest(FakeModel([listing, "ok"]), store).arun(state)
    [entry] = results(state)
    assert entry.outcome == "done"
    listed = pydantic.TypeAdapter(list[dict[str, Any]]).validate_json(entry.content.text)
    assert [doc["id"] for doc in listed] == ["l0", "l2"]


def test_own_upsert_and_remove_tools_win_a_name_clash_and_are_the_ones_run() -> None:
    # Seed 003: "Your own tools win on a name clash."
    seen: list[str] = []

    @tool(name="state_loops_upsert")
    def my_upsert(id: str) -> str:
        """My own upsert."""
        seen.append(f"upsert {id}")
        return "mine"

    @tool(name="state_loops_remove")
    def my_remove(id: str) -> str:
        """My own remove."""
        seen.append(f"remove {id}")
        return "mine"

    calls = [tool_call("state_loops_upsert", id="a"), tool_call("state_loops_remove", id="b")]
    model = FakeModel([calls, "ok"])
    agent = digest(model, MemoryStore(), my_upsert, my_remove)
    assert [t.name for t in agent.tools] == [
        "state_loops_upsert",
        "state_loops_remove",
        "state_loops_list",
    ]
    assert agent.run("go") == "ok"
    assert sorted(seen) == ["remove b", "upsert a"]
    shown = {spec.name: spec.description for spec in model.requests[0].tools}
    assert shown["state_loops_upsert"] == "My own upsert."
    assert agent.memory.collection("loops").list() == []


def test_the_tools_of_two_agents_in_one_store_never_see_each_others_documents() -> None:
    # Issue 6, item 5: "two agents with different names never see each other's memory".
    store = MemoryStore()
    write = tool_call("state_loops_upsert", id="a", doc={"title": "A", "status": "open"})
    digest(FakeModel([write, "ok"]), store).run("go")
    listing = tool_call("state_loops_list")
    other_state = State(messages=[Message.user("go")])
    other = digest(FakeModel([listing, "ok"]), store, name="other")
    other.run(other_state)
    assert [entry.content.text for entry in results(other_state)] == ["[]"]
    assert titles(Memory.open("digest", None, store)) == {"a": "A"}


# -- concurrency -----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_parallel_upserts_of_one_document_leave_one_whole_document(store: Any) -> None:
    # Issue 6, Tests: "concurrent upserts from parallel tool calls".
    count = 12
    calls = [
        tool_call("state_loops_upsert", id="same", doc={"title": f"t{i}", "status": "open"})
        for i in range(count)
    ]
    state = State(messages=[Message.user("go")])
    agent = digest(FakeModel([calls, "done"]), store)
    assert await agent.arun(state) == "done"
    assert [entry.outcome for entry in results(state)] == ["done"] * count
    docs = await agent.memory.collection("loops").alist()
    assert len(docs) == 1
    assert docs[0]["title"] in {f"t{i}" for i in range(count)}
    assert docs[0]["status"] == "open"
