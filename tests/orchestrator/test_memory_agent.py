"""An Agent's memory: `agent.memory`, `Memory` injection into tools, the generated collection
tools, effect keys under replay, and concurrent writes from parallel tool calls.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pydantic
import pytest
from pydantic_core import core_schema

from orchestrator import (
    Agent,
    Memory,
    Message,
    State,
    ToolCall,
    tool,
)
from orchestrator.permissions import AllowByReadOnly
from orchestrator.testing import FakeModel, tool_call
from stores import AioSQLiteStore, FileStore, MemoryStore
from tests.doubles import Loop, Person, results


def result_text(state: State, call: ToolCall) -> str:
    (entry,) = [e for e in results(state) if e.call.id == call.id]
    return entry.content.text


def digest(model: FakeModel, store: Any, *tools: Any, name: str = "digest") -> Agent:
    return Agent(
        model,
        name=name,
        instructions="Track open loops across days.",
        store=store,
        collections={"loops": Loop},
        tools=tools,
    )


def upsert(doc_id: str, title: str, status: str = "open", **more: Any) -> ToolCall:
    return tool_call(
        "state_loops_upsert", id=doc_id, doc={"title": title, "status": status, **more}
    )


# agent.memory -------------------------------------------------------------------------------------


def test_an_agent_with_a_name_and_a_store_has_a_memory() -> None:
    store = MemoryStore()
    agent = digest(FakeModel([]), store)
    assert isinstance(agent.memory, Memory)
    assert agent.memory.agent_name == "digest"
    assert agent.memory.store is store
    assert dict(agent.memory.collections) == {"loops": Loop}
    plain = Agent(FakeModel([]), name="plain", store=store)
    assert plain.memory.collections == {}
    plain.memory.set("k", 1)
    assert Memory.open("plain", None, store).get("k") == 1


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"store": MemoryStore()}, "no name.*name='digest'"),
        ({"name": "digest"}, "no store.*store="),
        ({}, "no name and no store"),
    ],
)
def test_memory_of_an_agent_without_name_or_store_says_what_to_add(
    settings: dict[str, Any], match: str
) -> None:
    agent = Agent(FakeModel([]), **settings)
    with pytest.raises(ValueError, match=match):
        _ = agent.memory
    with pytest.raises(ValueError, match=f"collections=.*{match}"):
        Agent(FakeModel([]), collections={"loops": Loop}, **settings)


def test_collections_with_a_store_that_keeps_no_memory_are_refused() -> None:
    class Plain:
        def save(self, state: Any) -> None: ...

    with pytest.raises(TypeError, match="keeps no agent memory"):
        Agent(FakeModel([]), name="digest", store=Plain(), collections={"loops": Loop})  # pyright: ignore[reportArgumentType]
    agent = Agent(FakeModel([]), name="digest", store=Plain())  # pyright: ignore[reportArgumentType] # no memory, still an agent
    with pytest.raises(ValueError, match="keeps no agent memory"):
        _ = agent.memory


def test_collections_are_checked_at_construction() -> None:
    with pytest.raises(TypeError, match="pydantic model class"):
        Agent(FakeModel([]), name="d", store=MemoryStore(), collections={"loops": "Loop"})  # pyright: ignore[reportArgumentType]


def test_copy_keeps_the_memory_and_its_tools() -> None:
    store = MemoryStore()
    agent = digest(FakeModel([]), store)
    again = agent.copy(instructions="Be brief.")
    assert [t.name for t in again.tools] == [t.name for t in agent.tools]
    agent.memory.set("k", 1)
    assert again.memory.get("k") == 1
    assert again.copy(name="other").memory.get("k") is None


# Memory injection ---------------------------------------------------------------------------------


@tool
async def count_open_loops(memory: Memory) -> int:
    """Counts the open loops."""
    return len(await memory.collection("loops").alist(where={"status": "open"}))


@tool
def remember(key: str, value: int, memory: Memory) -> str:
    """Remember a number (a sync tool: it runs in a worker thread)."""
    memory.set(key, value)
    return f"{key}={memory.get(key)}"


@tool
def maybe_memory(memory: Memory | None = None) -> str:
    """Say whether there is a memory."""
    return "none" if memory is None else memory.agent_name


def test_a_memory_parameter_is_hidden_from_the_model() -> None:
    assert count_open_loops.spec.input_schema == {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }
    assert list(remember.spec.input_schema["properties"]) == ["key", "value"]


def test_bind_fills_the_memory_and_refuses_it_from_the_model() -> None:
    memory = Memory.open("digest", None, MemoryStore())
    assert remember.bind({"key": "k", "value": 1}, None, memory=memory)["memory"] is memory
    assert maybe_memory.bind({}, None) == {"memory": None}
    with pytest.raises(TypeError, match="needs the agent's memory"):
        remember.bind({"key": "k", "value": 1}, None)
    with pytest.raises(Exception, match="supplied by the agent"):
        remember.bind({"key": "k", "value": 1, "memory": "x"}, None, memory=memory)


def test_a_memory_parameter_cannot_be_filled_from_state() -> None:
    def f(m: Memory) -> None: ...

    with pytest.raises(TypeError, match=r"memory.*inputs_from_state"):
        tool(inputs_from_state={"k": "m"})(f)


def test_a_tool_that_needs_memory_needs_an_agent_with_one() -> None:
    with pytest.raises(ValueError, match="'count_open_loops' takes the agent's memory"):
        Agent(FakeModel([]), tools=[count_open_loops])
    Agent(FakeModel([]), tools=[maybe_memory])  # Memory | None is fine


@pytest.mark.anyio
async def test_tools_get_the_agents_memory(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "runs")
    calls = [
        tool_call("count_open_loops"),
        tool_call("remember", key="uid", value=1042),
        tool_call("maybe_memory"),
    ]
    model = FakeModel([[upsert("a", "A"), upsert("b", "B", "resolved")], calls, "done"])
    agent = digest(model, store, count_open_loops, remember, maybe_memory)
    state = State(messages=[Message.user("go")])
    assert await agent.arun(state) == "done"
    assert [result_text(state, call) for call in calls] == ["1", "uid=1042", "digest"]
    assert await agent.memory.aget("uid") == 1042
    # Without a memory, a `Memory | None` parameter gets None.
    bare = State(messages=[Message.user("x")])
    await Agent(FakeModel([tool_call("maybe_memory"), "ok"]), tools=[maybe_memory]).arun(bare)
    assert results(bare)[0].content.text == "none"


# The generated tools ------------------------------------------------------------------------------


def test_each_collection_gives_three_tools_with_the_documents_schema() -> None:
    agent = digest(FakeModel([]), MemoryStore())
    by_name = {t.name: t for t in agent.tools}
    assert list(by_name) == ["state_loops_list", "state_loops_upsert", "state_loops_remove"]
    listing, upserting, removing = by_name.values()
    assert listing.read_only
    assert not upserting.read_only
    assert not removing.read_only
    assert "loops" in listing.spec.description
    assert "open loop" in upserting.spec.description  # the model's docstring
    assert set(listing.spec.input_schema["properties"]) == {"where", "limit"}
    assert "required" not in listing.spec.input_schema
    schema = upserting.spec.input_schema
    assert schema["required"] == ["id", "doc"]
    assert schema["properties"]["doc"]["$ref"] == "#/$defs/Loop"
    loop_schema = schema["$defs"]["Loop"]
    assert loop_schema["required"] == ["title", "status"]
    assert loop_schema["properties"]["status"]["enum"] == ["open", "resolved"]
    assert removing.spec.input_schema["required"] == ["id"]
    json.dumps(dict(schema))  # what a provider sends


def test_the_agents_own_tools_win_a_name_clash() -> None:
    @tool(name="state_loops_list")
    def mine() -> str:
        """My own listing."""
        return "mine"

    agent = digest(FakeModel([]), MemoryStore(), mine)
    names = [t.name for t in agent.tools]
    assert names == ["state_loops_list", "state_loops_upsert", "state_loops_remove"]
    assert agent.tools[0] is mine


def test_own_upsert_and_remove_tools_win_a_name_clash_and_are_the_ones_run() -> None:
    # Seed 003: "Your own tools win on a name clash" - shown to the model and run.
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


def test_the_model_is_shown_the_generated_tools() -> None:
    model = FakeModel(["hi"])
    digest(model, MemoryStore()).run("hello")
    assert [spec.name for spec in model.requests[0].tools] == [
        "state_loops_list",
        "state_loops_upsert",
        "state_loops_remove",
    ]


@pytest.mark.anyio
async def test_the_model_tracks_loops_with_the_generated_tools() -> None:
    store = MemoryStore()
    listing = tool_call("state_loops_list", where={"status": "open"}, limit=5)
    removing, missing = (
        tool_call("state_loops_remove", id="b"),
        tool_call("state_loops_remove", id="zzz"),
    )
    first = upsert("a", "Reply to Anna")
    model = FakeModel(
        [
            [first, upsert("b", "Call Bob", due="friday")],
            [upsert("a", "Reply to Anna", "resolved")],
            listing,
            [removing, missing],
            "Done.",
        ]
    )
    state = State(messages=[Message.user("go")])
    assert await digest(model, store).arun(state) == "Done."
    assert result_text(state, first) == (
        'Saved \'a\' in loops: {"id": "a", "title": "Reply to Anna", "status": "open", "due": null}'
    )
    assert json.loads(result_text(state, listing)) == [
        {"id": "b", "title": "Call Bob", "status": "open", "due": "friday"}
    ]
    assert result_text(state, removing) == "Removed 'b' from loops."
    assert "nothing to remove" in result_text(state, missing)
    memory = Memory.open("digest", {"loops": Loop}, store)
    assert await memory.collection("loops").alist() == [
        {"id": "a", "title": "Reply to Anna", "status": "resolved", "due": None}
    ]


@pytest.mark.anyio
async def test_an_invalid_document_is_a_tool_error_the_model_can_fix() -> None:
    store = MemoryStore()
    bad = upsert("x", "Call Bob", "later")
    fixed = upsert("x", "Call Bob", "open")
    model = FakeModel([bad, fixed, "ok"])
    state = State(messages=[Message.user("go")])
    await digest(model, store).arun(state)
    first = results(state)[0]
    assert first.content.is_error
    assert first.outcome == "input_error"
    assert "doc.status" in first.content.text
    assert "'open' or 'resolved'" in first.content.text
    # The model saw the error in its next request, and its fixed call was stored.
    seen = model.requests[1].messages[-1].tool_results[0]
    assert seen.is_error
    assert "doc.status" in seen.text
    assert not results(state)[1].content.is_error
    assert [
        d["id"] for d in await Memory.open("digest", None, store).collection("loops").alist()
    ] == ["x"]


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
    assert _titles(Memory.open("digest", None, store)) == {"a": "A"}


@pytest.mark.anyio
async def test_bad_list_arguments_are_tool_errors() -> None:
    bad_limit = tool_call("state_loops_list", limit=-1)
    bad_where = tool_call("state_loops_list", where="status")
    model = FakeModel([[bad_limit, bad_where], "ok"])
    state = State(messages=[Message.user("go")])
    await digest(model, MemoryStore()).arun(state)
    assert ">= 0" in result_text(state, bad_limit)
    assert [entry.content.is_error for entry in results(state)] == [True, True]


@pytest.mark.anyio
async def test_read_only_permissions_allow_list_and_deny_writes() -> None:
    listing, write = tool_call("state_loops_list"), upsert("x", "X")
    model = FakeModel([[listing, write], "ok"])
    agent = Agent(
        model,
        name="digest",
        store=MemoryStore(),
        collections={"loops": Loop},
        permissions=[AllowByReadOnly()],
    )
    state = State(messages=[Message.user("go")])
    await agent.arun(state)
    assert result_text(state, listing) == "[]"
    assert "denied" in result_text(state, write)
    assert await agent.memory.collection("loops").alist() == []


# Effect keys --------------------------------------------------------------------------------------


@tool
async def three_writes(memory: Memory) -> str:
    """Upsert A, upsert B, upsert A again: three writes of one call."""
    loops = memory.collection("loops")
    await loops.aupsert("A", {"title": "first", "status": "open"})
    await loops.aupsert("B", {"title": "b", "status": "open"})
    await loops.aupsert("A", {"title": "last", "status": "resolved"})
    return "ok"


@tool
def add_note(text: str, memory: Memory) -> str:
    """Append a note (read, change, write: not idempotent by itself)."""
    notes: list[str] = memory.get("notes") or []
    notes.append(text)
    memory.set("notes", notes)
    return f"{len(notes)} notes"


def _titles(memory: Memory) -> dict[str, str]:
    return {doc["id"]: doc["title"] for doc in memory.collection("loops").list()}


def test_each_write_of_a_call_gets_its_own_effect_key(sync_store: Any) -> None:
    agent = digest(FakeModel([ToolCall("c1", "three_writes", {})]), sync_store, three_writes)
    state = State(id="s1", messages=[Message.user("go")])
    agent.think(state)
    before = state.snapshot()
    agent.use_tools(state)
    assert _titles(agent.memory) == {"A": "last", "B": "b"}
    # Someone changes A between; a replay of the call repeats none of its three writes.
    agent.memory.collection("loops").upsert("A", {"title": "changed", "status": "open"})
    state.restore(before)
    assert [call.id for call in state.pending_calls] == ["c1"]
    agent.use_tools(state)
    assert _titles(agent.memory) == {"A": "changed", "B": "b"}


def test_replaying_upsert_a_b_a_ends_on_the_last_write(sync_store: Any) -> None:
    calls = [
        ToolCall("c1", "state_loops_upsert", {"id": "A", "doc": {"title": "1", "status": "open"}}),
        ToolCall("c2", "state_loops_upsert", {"id": "B", "doc": {"title": "2", "status": "open"}}),
        ToolCall("c3", "state_loops_upsert", {"id": "A", "doc": {"title": "3", "status": "open"}}),
    ]
    agent = digest(FakeModel([*calls, *calls[1:]]), sync_store)  # the replay asks again for c2, c3
    state = State(id="s2", messages=[Message.user("go")])
    agent.think(state)
    before = state.snapshot()
    agent.use_tools(state)
    for _ in calls[1:]:
        agent.think(state)
        agent.use_tools(state)
    assert _titles(agent.memory) == {"A": "3", "B": "2"}
    # Replay the sequence from its start: the same State, the same calls. Nothing is written
    # again, so even after only the first upsert of A it is still on the last write.
    state.restore(before)
    agent.use_tools(state)
    assert _titles(agent.memory) == {"A": "3", "B": "2"}
    for _ in calls[1:]:
        agent.think(state)
        agent.use_tools(state)
    assert _titles(agent.memory) == {"A": "3", "B": "2"}
    outcomes = [entry.outcome for entry in results(state)]
    assert outcomes == ["done"] * 6  # the replayed calls succeeded: they just wrote nothing


def test_a_retried_call_does_not_duplicate(sync_store: Any) -> None:
    agent = digest(FakeModel([ToolCall("c1", "add_note", {"text": "x"})]), sync_store, add_note)
    state = State(id="s3", messages=[Message.user("go")])
    agent.think(state)
    before = state.snapshot()
    agent.use_tools(state)
    for _ in range(2):
        state.restore(before)
        agent.use_tools(state)
    assert agent.memory.get("notes") == ["x"]
    # Another call (another id) is another write.
    other = State(id="s3b", messages=[Message.user("go")])
    again = digest(
        FakeModel([ToolCall("c1", "add_note", {"text": "y"}), "ok"]), sync_store, add_note
    )
    again.run(other)
    assert agent.memory.get("notes") == ["x", "y"]


def test_a_later_turn_that_reuses_a_call_id_still_writes(sync_store: Any) -> None:
    # Seed 003: "Each write gets its own effect key" - a new call of a later turn is a new
    # write, even when the provider reuses the call id.
    first = ToolCall(
        "call_0", "state_loops_upsert", {"id": "A", "doc": {"title": "first", "status": "open"}}
    )
    second = ToolCall(
        "call_0", "state_loops_upsert", {"id": "A", "doc": {"title": "second", "status": "open"}}
    )
    agent = digest(FakeModel([first, second, "done"]), sync_store)
    state = State(messages=[Message.user("go")])
    assert agent.run(state) == "done"
    assert [entry.outcome for entry in results(state)] == ["done", "done"]
    assert "second" in results(state)[1].content.text  # the model was told it was saved
    assert _titles(agent.memory) == {"A": "second"}


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
    # "Every store backend keeps memory" (the async-only one too).
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


def test_writes_outside_tool_calls_always_apply(sync_store: Any) -> None:
    memory = Memory.open("digest", None, sync_store)
    for value in (1, 2, 1):
        memory.set("k", value)
        assert memory.get("k") == value


# Concurrent upserts from parallel tool calls ------------------------------------------------------


@tool
def sync_upsert(doc_id: str, memory: Memory) -> str:
    """Upsert from a worker thread."""
    memory.collection("loops").upsert(doc_id, {"title": doc_id, "status": "open"})
    return "ok"


def _parallel_turn(count: int) -> list[ToolCall]:
    calls: list[ToolCall] = []
    for i in range(count):
        if i % 3 == 0:
            calls.append(tool_call("sync_upsert", doc_id=f"doc-{i:02d}"))
        else:
            calls.append(upsert(f"doc-{i:02d}", f"doc-{i:02d}"))
    return calls


@pytest.mark.anyio
async def test_concurrent_upserts_from_parallel_tool_calls(sync_store: Any) -> None:
    count = 24
    model = FakeModel([_parallel_turn(count), "done"])
    agent = digest(model, sync_store, sync_upsert)
    state = State(messages=[Message.user("go")])
    assert await agent.arun(state) == "done"
    assert all(not entry.content.is_error for entry in results(state))
    docs = await agent.memory.collection("loops").alist()
    assert [doc["id"] for doc in docs] == [f"doc-{i:02d}" for i in range(count)]


@pytest.mark.anyio
async def test_parallel_upserts_of_one_document_leave_one_whole_document(sync_store: Any) -> None:
    # Issue 6, Tests: "concurrent upserts from parallel tool calls" - of the same document.
    count = 12
    calls = [
        tool_call("state_loops_upsert", id="same", doc={"title": f"t{i}", "status": "open"})
        for i in range(count)
    ]
    state = State(messages=[Message.user("go")])
    agent = digest(FakeModel([calls, "done"]), sync_store)
    assert await agent.arun(state) == "done"
    assert [entry.outcome for entry in results(state)] == ["done"] * count
    docs = await agent.memory.collection("loops").alist()
    assert len(docs) == 1
    assert docs[0]["title"] in {f"t{i}" for i in range(count)}
    assert docs[0]["status"] == "open"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_concurrent_upserts_from_parallel_tool_calls_on_aiosqlite(tmp_path: Path) -> None:
    count = 16
    async with AioSQLiteStore(tmp_path / "runs.db") as store:
        model = FakeModel([[upsert(f"doc-{i:02d}", str(i)) for i in range(count)], "done"])
        agent = digest(model, store)
        assert await agent.arun("go") == "done"
        docs = await agent.memory.collection("loops").alist()
        assert [doc["title"] for doc in docs] == [str(i) for i in range(count)]


@pytest.mark.anyio
async def test_parallel_tasks_of_one_call_number_their_writes() -> None:
    store = MemoryStore()

    @tool
    async def fan_out(memory: Memory) -> str:
        """Write ten keys from ten tasks of one call."""
        async with anyio.create_task_group() as group:
            for i in range(10):
                group.start_soon(memory.aset, f"k{i}", i)
        return "ok"

    agent = Agent(
        FakeModel([ToolCall("c1", "fan_out", {}), "done"]),
        name="fan",
        store=store,
        tools=[fan_out],
    )
    await agent.arun(State(id="s", messages=[Message.user("go")]))
    assert [await agent.memory.aget(f"k{i}") for i in range(10)] == list(range(10))


class _Note(pydantic.BaseModel):
    """A note."""

    title: str
    due: str | None = None


def test_a_misspelled_field_in_a_generated_upsert_is_an_input_error_not_lost_data() -> None:
    store = MemoryStore()
    bad = tool_call("state_notes_upsert", id="n", doc={"title": "x", "due_date": "friday"})
    good = tool_call("state_notes_upsert", id="n", doc={"title": "x", "due": "friday"})
    agent = Agent(
        FakeModel([bad, good, "saved"]), name="notes", store=store, collections={"notes": _Note}
    )
    state = State(messages=[Message.user("Note it")])
    assert agent.run(state) == "saved"
    outcomes = [e for e in state.history if e.kind == "tool_result"]
    assert [e.outcome for e in outcomes] == ["input_error", "done"]
    assert "doc.due_date" in outcomes[0].content.text
    assert agent.memory.collection("notes").get("n") == {"id": "n", "title": "x", "due": "friday"}
    spec = next(t.spec for t in agent.tools if t.name == "state_notes_upsert")
    assert spec.input_schema["$defs"]["_Note"]["additionalProperties"] is False
    assert spec.input_schema["$defs"]["_Note"]["description"] == "A note."
