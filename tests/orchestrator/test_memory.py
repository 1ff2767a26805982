"""`Memory`: key-value data and typed collections of one agent, kept in a store.

The API is tested on every backend (sync methods on the sync ones, async twins everywhere);
validation, where/limit and the refusals on `MemoryStore`, where nothing else can go wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest

from orchestrator import Issue, Memory, OrchestratorError, ValidationError
from stores import AioSQLiteStore, MemoryStore
from tests.doubles import Loop, Person, Point


class Team(pydantic.BaseModel):
    lead: Person
    members: list[Person]


COLLECTIONS: dict[str, type[pydantic.BaseModel]] = {"loops": Loop, "people": Person, "teams": Team}


@pytest.fixture
def memory() -> Memory:
    return Memory.open("digest", COLLECTIONS, MemoryStore())


# The seed's example, on every sync backend --------------------------------------------------------


def test_the_seed_example_runs_on_every_sync_backend(sync_store: Any) -> None:
    state = Memory.open("digest", {"loops": Loop}, sync_store)
    state.set("lastUid", 1042)
    assert state.get("lastUid") == 1042
    loops = state.collection("loops")
    loops.upsert("reply-anna", {"title": "Reply to Anna", "status": "open"})
    assert loops.list(where={"status": "open"}, limit=10) == [
        {"id": "reply-anna", "title": "Reply to Anna", "status": "open", "due": None}
    ]
    loops.remove("reply-anna")
    assert loops.list() == []
    assert state.get("lastUid") == 1042


@pytest.mark.anyio
async def test_the_async_twins_on_every_backend(sync_store: Any) -> None:
    state = Memory.open("digest", {"loops": Loop}, sync_store)
    await state.aset("lastUid", 1042)
    assert await state.aget("lastUid") == 1042
    loops = state.collection("loops")
    stored = await loops.aupsert("reply-anna", {"title": "Reply to Anna", "status": "open"})
    assert stored == {"id": "reply-anna", "title": "Reply to Anna", "status": "open", "due": None}
    assert await loops.alist(where={"status": "open"}) == [stored]
    assert await loops.aget("reply-anna") == stored
    await loops.aremove("reply-anna")
    assert await loops.alist() == []
    assert await loops.aget("reply-anna") is None
    await state.adelete("lastUid")
    assert await state.aget("lastUid") is None


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_the_async_twins_on_aiosqlite(tmp_path: Path) -> None:
    async with AioSQLiteStore(tmp_path / "runs.db") as store:
        state = Memory.open("digest", {"loops": Loop}, store)
        await state.aset("lastUid", 1042)
        loops = state.collection("loops")
        await loops.aupsert("reply-anna", {"title": "Reply to Anna", "status": "open"})
        assert [doc["id"] for doc in await loops.alist(where={"status": "open"})] == ["reply-anna"]
        assert await state.aget("lastUid") == 1042
        with pytest.raises(ValidationError):
            await loops.aupsert("x", {"title": "X", "status": "later"})
        assert len(await loops.alist()) == 1


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_sync_methods_over_an_async_only_store_name_their_twins(tmp_path: Path) -> None:
    async with AioSQLiteStore(tmp_path / "runs.db") as store:
        state = Memory.open("digest", {"loops": Loop}, store)
        loops = state.collection("loops")
        calls = [
            (lambda: state.get("k"), "aget"),
            (lambda: state.set("k", 1), "aset"),
            (lambda: state.delete("k"), "adelete"),
            (lambda: loops.list(), "alist"),
            (lambda: loops.get("x"), "aget"),
            (lambda: loops.upsert("x", {"title": "X", "status": "open"}), "aupsert"),
            (lambda: loops.remove("x"), "aremove"),
        ]
        for call, twin in calls:
            with pytest.raises(TypeError, match=f"await .*{twin}"):
                call()
        assert await loops.alist() == []
        assert await state.aget("k") is None


# Key-value ----------------------------------------------------------------------------------------


def test_get_of_a_missing_key_is_none(memory: Memory) -> None:
    assert memory.get("nothing") is None


def test_values_are_json_and_come_back_as_new_plain_values(memory: Memory) -> None:
    value: dict[str, Any] = {
        "n": [1, 2.5, None, True],
        "text": "ünïcode\u2028✓",
        "nested": {"a": {"b": []}},
    }
    memory.set("data", value)
    first, second = memory.get("data"), memory.get("data")
    assert first == value
    assert type(second) is dict
    assert first is not second
    first["n"].append(3)  # a plain copy: changing it changes nothing stored
    assert memory.get("data") == value


def test_dataclasses_models_and_tuples_are_stored_as_json(memory: Memory) -> None:
    memory.set("point", Point(1, 2))
    memory.set("loop", Loop(title="T", status="open"))
    memory.set("pair", (1, "a"))
    assert memory.get("point") == {"x": 1, "y": 2}
    assert memory.get("loop") == {"title": "T", "status": "open", "due": None}
    assert memory.get("pair") == [1, "a"]


def test_none_is_stored_and_reads_as_absent(memory: Memory) -> None:
    memory.set("k", None)
    assert memory.get("k") is None


def test_set_replaces_and_delete_forgets(memory: Memory) -> None:
    memory.set("k", 1)
    memory.set("k", "two")
    assert memory.get("k") == "two"
    memory.delete("k")
    assert memory.get("k") is None
    memory.delete("k")  # deleting a missing key is fine


def test_a_value_that_is_not_json_is_refused_naming_its_place(memory: Memory) -> None:
    with pytest.raises(TypeError, match=r"memory\['k'\]\['when'\].*set"):
        memory.set("k", {"when": {1, 2}})
    with pytest.raises(TypeError, match="nan"):
        memory.set("k", float("nan"))
    with pytest.raises(TypeError, match="JSON keys are strings"):
        memory.set("k", {1: "a"})
    assert memory.get("k") is None


def test_a_lone_surrogate_is_refused_in_a_key_and_replaced_in_a_value(memory: Memory) -> None:
    with pytest.raises(ValueError, match="surrogate"):
        memory.get("\ud800")
    memory.set("k", {"note\ud800": "caf\udce9"})  # as in a State: U+FFFD, the rest kept
    assert memory.get("k") == {"note\ufffd": "caf\ufffd"}


@pytest.mark.parametrize(
    ("key", "error", "match"),
    [("", ValueError, "empty"), ("x" * 513, ValueError, "513"), (7, TypeError, "str")],
)
def test_bad_keys_are_refused(memory: Memory, key: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        memory.set(key, 1)
    with pytest.raises(error, match=match):
        memory.get(key)


def test_any_key_text_works(memory: Memory) -> None:
    for key in ("a b/c:d", "../etc", "ключ", "x" * 512):
        memory.set(key, key)
        assert memory.get(key) == key


# Collections --------------------------------------------------------------------------------------


def test_upsert_stores_the_models_output(memory: Memory) -> None:
    people = memory.collection("people")
    stored = people.upsert("ann", {"name": "Ann", "age": "41", "unknown": "dropped"})
    assert stored == {"id": "ann", "name": "Ann", "age": 41, "tags": []}
    assert people.get("ann") == stored
    assert people.list() == [stored]


def test_upsert_takes_a_model_instance_and_replaces(memory: Memory) -> None:
    loops = memory.collection("loops")
    loops.upsert("x", Loop(title="First", status="open", due="2024-05-01"))
    loops.upsert("x", {"title": "Second", "status": "resolved"})
    assert loops.list() == [{"id": "x", "title": "Second", "status": "resolved", "due": None}]


def test_documents_are_listed_in_id_order(memory: Memory) -> None:
    loops = memory.collection("loops")
    for doc_id in ("b", "c", "a", "B"):
        loops.upsert(doc_id, {"title": doc_id, "status": "open"})
    assert [doc["id"] for doc in loops.list()] == ["B", "a", "b", "c"]


def test_where_matches_top_level_fields_by_equality(memory: Memory) -> None:
    people = memory.collection("people")
    people.upsert("ann", {"name": "Ann", "age": 41, "tags": ["x"]})
    people.upsert("bob", {"name": "Bob", "age": 30})
    people.upsert("cid", {"name": "Cid", "age": 41})
    assert [d["id"] for d in people.list(where={"age": 41})] == ["ann", "cid"]
    assert [d["id"] for d in people.list(where={"age": 41.0})] == ["ann", "cid"]
    assert [d["id"] for d in people.list(where={"age": 41, "name": "Cid"})] == ["cid"]
    assert [d["id"] for d in people.list(where={"tags": ["x"]})] == ["ann"]
    assert [d["id"] for d in people.list(where={"id": "bob"})] == ["bob"]
    assert [d["id"] for d in people.list(where={})] == ["ann", "bob", "cid"]
    assert people.list(where={"age": "41"}) == []
    assert people.list(where={"nickname": "A"}) == []


def test_where_never_takes_a_bool_for_a_number(memory: Memory) -> None:
    people = memory.collection("people")
    people.upsert("one", {"name": "One", "age": 1})
    assert people.list(where={"age": True}) == []
    assert [d["id"] for d in people.list(where={"age": 1})] == ["one"]


def test_limit_caps_the_documents_after_where(memory: Memory) -> None:
    loops = memory.collection("loops")
    for i in range(6):
        loops.upsert(f"l{i}", {"title": str(i), "status": "open" if i % 2 else "resolved"})
    assert [d["id"] for d in loops.list(limit=2)] == ["l0", "l1"]
    assert [d["id"] for d in loops.list(where={"status": "open"}, limit=2)] == ["l1", "l3"]
    assert loops.list(limit=0) == []
    assert len(loops.list(limit=100)) == 6


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"where": "status=open"}, TypeError, "where maps"),
        ({"where": {"t": {1, 2}}}, TypeError, "where"),
        ({"limit": -1}, ValueError, ">= 0"),
        ({"limit": True}, TypeError, "int"),
        ({"limit": 1.5}, TypeError, "int"),
    ],
)
def test_bad_where_and_limit_are_refused(
    memory: Memory, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        memory.collection("loops").list(**kwargs)


def test_remove_deletes_one_document(memory: Memory) -> None:
    loops = memory.collection("loops")
    loops.upsert("a", {"title": "A", "status": "open"})
    loops.upsert("b", {"title": "B", "status": "open"})
    loops.remove("a")
    loops.remove("never-there")
    assert [d["id"] for d in loops.list()] == ["b"]


def test_collections_and_the_key_value_space_are_separate(memory: Memory) -> None:
    memory.set("a", 1)
    memory.collection("loops").upsert("a", {"title": "A", "status": "open"})
    assert memory.collection("people").list() == []
    assert memory.get("a") == 1
    assert memory.collection("loops").get("a") == {
        "id": "a",
        "title": "A",
        "status": "open",
        "due": None,
    }


# Validation errors --------------------------------------------------------------------------------


def test_an_invalid_document_raises_validation_error_with_paths_and_stores_nothing(
    memory: Memory,
) -> None:
    loops = memory.collection("loops")
    with pytest.raises(ValidationError) as raised:
        loops.upsert("x", {"title": "Call Bob", "status": "later"})
    error = raised.value
    assert isinstance(error, OrchestratorError)
    assert isinstance(error, ValueError)
    assert [(issue.path, issue.message) for issue in error.issues] == [
        (("status",), "Input should be 'open' or 'resolved'")
    ]
    assert all(isinstance(issue, Issue) for issue in error.issues)
    assert "'x'" in str(error)
    assert "status" in str(error)
    assert "nothing was stored" in str(error)
    assert loops.list() == []


class Task(pydantic.BaseModel):
    title: str
    priority: int | list[int]


def test_issue_paths_point_into_the_document_for_union_fields() -> None:
    # Seed 003: "its issues hold the validation issues with their paths" - paths into the doc,
    # also when pydantic tries several members of a union.
    tasks = Memory.open("digest", {"tasks": Task}, MemoryStore()).collection("tasks")
    with pytest.raises(ValidationError) as raised:
        tasks.upsert("t", {"title": "T", "priority": "high"})
    assert raised.value.issues
    assert {issue.path for issue in raised.value.issues} == {("priority",)}
    assert tasks.list() == []


def test_nested_problems_have_full_paths(memory: Memory) -> None:
    teams = memory.collection("teams")
    doc = {
        "lead": {"name": "Ann", "age": -1},
        "members": [{"name": "Bob", "age": 3}, {"age": "old", "tags": ["a", 5]}],
    }
    with pytest.raises(ValidationError) as raised:
        teams.upsert("core", doc)
    paths = {issue.path: issue.message for issue in raised.value.issues}
    assert set(paths) == {
        ("lead", "age"),
        ("members", 1, "name"),
        ("members", 1, "age"),
        ("members", 1, "tags", 1),
    }
    assert "greater than or equal to 0" in paths[("lead", "age")]
    assert paths[("members", 1, "name")] == "Field required"
    assert teams.list() == []


def test_a_replacing_document_that_fails_keeps_the_old_one(memory: Memory) -> None:
    loops = memory.collection("loops")
    loops.upsert("x", {"title": "Keep me", "status": "open"})
    with pytest.raises(ValidationError):
        loops.upsert("x", {"title": None, "status": "open"})
    assert loops.get("x") == {"id": "x", "title": "Keep me", "status": "open", "due": None}


def test_a_document_that_is_not_an_object_is_refused(memory: Memory) -> None:
    with pytest.raises(ValidationError) as raised:
        memory.collection("loops").upsert("x", ["not", "a", "dict"])
    assert [issue.path for issue in raised.value.issues] == [()]


def test_a_model_that_keeps_an_id_field_is_refused_at_upsert() -> None:
    class Loose(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="allow")
        title: str

    loose = Memory.open("digest", {"loose": Loose}, MemoryStore()).collection("loose")
    with pytest.raises(ValidationError) as raised:
        loose.upsert("x", {"title": "T", "id": "y"})
    assert [issue.path for issue in raised.value.issues] == [("id",)]
    loose.upsert("x", {"title": "T", "more": 1})
    assert loose.list() == [{"id": "x", "title": "T", "more": 1}]


# Declared collections only are writable -----------------------------------------------------------


def test_an_undeclared_collection_is_not_writable(memory: Memory) -> None:
    lops = memory.collection("lops")
    assert lops.model is None
    with pytest.raises(ValueError, match=r"does not declare it.*Did you mean 'loops'"):
        lops.upsert("x", {"title": "X", "status": "open"})
    with pytest.raises(ValueError, match="declared: loops, people, teams"):
        lops.remove("x")
    assert lops.list() == []


def test_an_undeclared_collection_reads_what_another_declaration_wrote() -> None:
    store = MemoryStore()
    Memory.open("digest", {"loops": Loop}, store).collection("loops").upsert(
        "x", {"title": "X", "status": "open"}
    )
    later = Memory.open("digest", None, store)
    assert later.collections == {}
    assert [doc["id"] for doc in later.collection("loops").list()] == ["x"]
    with pytest.raises(ValueError, match="declared: none"):
        later.collection("loops").remove("x")


def test_a_bad_collection_name_is_refused(memory: Memory) -> None:
    with pytest.raises(ValueError, match="not valid"):
        memory.collection("no spaces")


# Scope: one agent name in one store ---------------------------------------------------------------


def test_two_agents_never_see_each_others_memory(sync_store: Any) -> None:
    digest = Memory.open("digest", {"loops": Loop}, sync_store)
    other = Memory.open("other", {"loops": Loop}, sync_store)
    digest.set("k", "digest's")
    digest.collection("loops").upsert("x", {"title": "X", "status": "open"})
    assert other.get("k") is None
    assert other.collection("loops").list() == []
    other.set("k", "other's")
    assert digest.get("k") == "digest's"


def test_two_memories_of_one_name_share_it() -> None:
    store = MemoryStore()
    Memory.open("digest", None, store).set("k", 1)
    assert Memory.open("digest", {"loops": Loop}, store).get("k") == 1


# Memory.open and its checks -----------------------------------------------------------------------


def test_open_gives_the_settings_back() -> None:
    store = MemoryStore()
    memory = Memory.open("digest", {"loops": Loop}, store)
    assert memory.agent_name == "digest"
    assert memory.store is store
    assert dict(memory.collections) == {"loops": Loop}
    assert memory.collection("loops").model is Loop
    assert memory.collection("loops").name == "loops"
    assert "digest" in repr(memory)
    assert "Loop" in repr(memory.collection("loops"))
    with pytest.raises(TypeError):
        memory.collections["x"] = Loop  # type: ignore[index]


@pytest.mark.parametrize("name", ["", "../x", "a b", "x" * 129])
def test_open_refuses_a_bad_agent_name(name: str) -> None:
    with pytest.raises(ValueError, match="agent_name"):
        Memory.open(name, None, MemoryStore())


def test_open_refuses_a_collection_that_is_not_a_model() -> None:
    with pytest.raises(TypeError, match="pydantic model class"):
        Memory.open("digest", {"loops": dict}, MemoryStore())  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="maps collection names"):
        Memory.open("digest", [Loop], MemoryStore())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not valid"):
        Memory.open("digest", {"x" * 52: Loop}, MemoryStore())


def test_open_refuses_a_model_with_an_id_field() -> None:
    class WithId(pydantic.BaseModel):
        id: str
        title: str

    with pytest.raises(ValueError, match=r"field 'id'.*Rename"):
        Memory.open("digest", {"things": WithId}, MemoryStore())


def test_open_refuses_a_store_that_keeps_no_memory() -> None:
    class Plain:
        def save(self, state: Any) -> None: ...

    with pytest.raises(TypeError, match="keeps agent memory"):
        Memory.open("digest", None, Plain())
    with pytest.raises(TypeError, match="keeps agent memory"):
        Memory.open("digest", None, None)
