"""Typed data on a State: DESIGN section 5a, one rule per test (or parametrized case)."""

from __future__ import annotations

import datetime
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal

import pydantic
import pytest

import orchestrator
from orchestrator import (
    ExtraDataEntry,
    FrozenDict,
    FrozenList,
    State,
    merge_lists,
    replace_values,
)
from tests.doubles import Color, Point, as_any, assert_replays, is_a, type_of


def _extra_data_entries(state: State) -> list[ExtraDataEntry]:
    return [entry for entry in state.history if isinstance(entry, ExtraDataEntry)]


def _model(fields: dict[str, Any]) -> type[pydantic.BaseModel]:
    """A pydantic model class with the given ``name: (type, default)`` fields."""
    create: Any = pydantic.create_model
    model: type[pydantic.BaseModel] = create("Data", **fields)
    return model


def _append_zero(current: Any, new: Any) -> Any:
    """A reducer that shows it ran: appends the new items, then a 0."""
    return [*(current or []), *new, 0]


# -- no schema ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", [1, 1.5, "text", True, None, [1, "a", None], {"a": {"b": [1, 2]}}, []]
)
def test_no_schema_set_accepts_any_json(value: Any) -> None:
    state = State()
    assert state.schema is None
    state.set("anything", value)
    assert state.has("anything")
    assert state.get("anything") == value
    assert state.extra_data == {"anything": value}


def test_no_schema_set_replaces_even_lists() -> None:
    state = State()
    state.set("docs", [1, 2])
    state.set("docs", [3])
    assert state.get("docs") == [3]
    state.set("docs", "now a string")
    assert state.get("docs") == "now a string"


def test_no_schema_set_refuses_non_json_naming_the_key() -> None:
    state = State()
    with pytest.raises(TypeError) as info:
        state.set("k", [1, {2}])
    assert "['k'][1]" in str(info.value)
    assert not state.has("k")
    assert state.history == ()


# -- undeclared keys ---------------------------------------------------------------------------


def test_empty_schema_refuses_every_key() -> None:
    state = State(schema={})
    with pytest.raises(KeyError) as info:
        state.set("docs", [1])
    assert "docs" in str(info.value)
    assert state.history == ()


def test_schema_set_of_undeclared_key_names_it_and_the_declared_keys() -> None:
    state = State(schema={"documents": {"type": list}, "user_name": {"type": str}})
    with pytest.raises(KeyError) as info:
        state.set("notes", "x")
    message = str(info.value)
    assert "notes" in message
    assert "documents" in message
    assert "user_name" in message
    assert state.history == ()


def test_model_schema_set_of_undeclared_key_names_the_declared_keys() -> None:
    class Data(pydantic.BaseModel):
        city: str = ""
        visits: int = 0

    state = State(schema=Data)
    with pytest.raises(KeyError) as info:
        state.set("country", "FR")
    message = str(info.value)
    assert "country" in message
    assert "city" in message
    assert "visits" in message


def test_get_of_undeclared_key_returns_default() -> None:
    state = State(schema={"a": {"type": int}})
    assert state.get("other") is None
    assert state.get("other", "fallback") == "fallback"
    assert not state.has("other")


def test_get_of_unset_declared_key_returns_default() -> None:
    state = State(schema={"a": {"type": int}})
    assert state.get("a") is None
    assert state.get("a", 7) == 7
    assert not state.has("a")


def test_get_and_has_without_schema() -> None:
    state = State()
    assert state.get("x") is None
    assert state.get("x", 3) == 3
    assert not state.has("x")
    state.set("x", 0)
    assert state.has("x")
    assert state.get("x", 3) == 0


# -- None is a value ---------------------------------------------------------------------------


def test_none_is_a_value_without_schema() -> None:
    state = State()
    state.set("maybe", None)
    assert state.has("maybe")
    assert state.get("maybe", "default") is None
    assert len(_extra_data_entries(state)) == 1


def test_none_is_a_value_for_an_optional_type() -> None:
    state = State(schema={"maybe": {"type": int | None}})
    state.set("maybe", None)
    assert state.has("maybe")
    assert state.get("maybe", 5) is None


def test_none_is_a_value_for_typing_optional() -> None:
    state = State(schema={"maybe": {"type": typing.Optional[str]}})  # noqa: UP045
    state.set("maybe", "x")
    state.set("maybe", None)
    assert state.has("maybe")
    assert state.get("maybe", "default") is None


@pytest.mark.parametrize("tp", [int, str, dict[str, int], float, bool])
def test_non_optional_type_refuses_none(tp: Any) -> None:
    state = State(schema={"k": {"type": tp}})
    with pytest.raises(ValueError, match="'k'"):
        state.set("k", None)
    assert not state.has("k")
    assert state.history == ()


# -- schema entries ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tp",
    [
        int,
        str,
        float,
        bool,
        dict,
        list,
        list[int],
        dict[str, list[int]],
        int | None,
        str | int,
        Literal["a", "b"],
        Any,
    ],
    ids=repr,
)
def test_schema_entry_with_a_type_is_accepted(tp: Any) -> None:
    state = State(schema={"k": {"type": tp}})
    assert state.schema == {"k": {"type": tp}}


def test_schema_entry_handler_may_be_none() -> None:
    state = State(schema={"docs": {"type": list, "handler": None}})
    state.set("docs", [1])
    state.set("docs", [2])
    assert state.get("docs") == [1, 2]


def test_schema_entry_without_type_is_refused() -> None:
    with pytest.raises(TypeError, match="'docs'"):
        State(schema={"docs": {"handler": merge_lists}})


def test_schema_entry_empty_is_refused() -> None:
    with pytest.raises(TypeError, match="'docs'"):
        State(schema={"docs": {}})


@pytest.mark.parametrize("tp", ["int", "list[int]", 3, None, [int], 0], ids=repr)
def test_schema_entry_type_must_be_a_type(tp: Any) -> None:
    with pytest.raises(TypeError) as info:
        State(schema={"count": {"type": tp}})
    assert "'count'" in str(info.value)


def test_schema_entry_type_instance_of_a_model_is_refused() -> None:
    class Point(pydantic.BaseModel):
        x: int = 0

    with pytest.raises(TypeError, match="'where'"):
        State(schema={"where": {"type": Point()}})


@pytest.mark.parametrize("field", ["hander", "handle", "default", "types", "Type"])
def test_schema_entry_unknown_field_is_refused_naming_the_key(field: str) -> None:
    with pytest.raises(TypeError) as info:
        State(schema={"docs": {"type": list, field: merge_lists}})
    message = str(info.value)
    assert "'docs'" in message
    assert repr(field) in message


def test_schema_entry_typo_suggests_handler() -> None:
    with pytest.raises(TypeError, match="handler"):
        State(schema={"docs": {"type": list, "hander": merge_lists}})


@pytest.mark.parametrize("handler", ["merge_lists", 3, [merge_lists], True])
def test_schema_entry_non_callable_handler_is_refused(handler: object) -> None:
    with pytest.raises(TypeError) as info:
        State(schema={"docs": {"type": list, "handler": handler}})
    assert "'docs'" in str(info.value)


@pytest.mark.parametrize("entry", [list, "list", None, 3, [list]], ids=repr)
def test_schema_entry_must_be_a_dict(entry: object) -> None:
    with pytest.raises(TypeError, match="'docs'"):
        State(schema={"docs": entry})


def test_schema_must_be_a_dict_or_a_model_class() -> None:
    class Data(pydantic.BaseModel):
        a: int = 0

    with pytest.raises(TypeError):
        State(schema=as_any([("a", {"type": int})]))
    with pytest.raises(TypeError):
        State(schema=Data())  # an instance, not the class


@pytest.mark.parametrize(
    "tp",
    [
        set,
        frozenset,
        tuple,
        bytes,
        bytearray,
        set[int],
        frozenset[str],
        tuple[int, int],
        tuple[int, ...],
        typing.Set[int],  # noqa: UP006
        typing.Tuple[int, str],  # noqa: UP006
        list[set[int]],
        dict[str, tuple[int, int]],
        list[list[frozenset[int]]],
        bytes | None,
        set[int] | None,
        typing.Optional[tuple[int]],  # noqa: UP045
        Annotated[set[int], "doc"],
    ],
    ids=repr,
)
def test_schema_entry_non_json_type_is_refused(tp: Any) -> None:
    with pytest.raises(TypeError) as info:
        State(schema={"bad": {"type": tp}})
    assert "'bad'" in str(info.value)


@pytest.mark.parametrize(
    "tp",
    [set[int], tuple[int, int], bytes, list[set[int]]],
    ids=repr,
)
def test_model_schema_non_json_field_type_is_refused(tp: Any) -> None:
    model = _model({"bad": (tp, ...)})
    with pytest.raises(TypeError) as info:
        State(schema=model)
    assert "'bad'" in str(info.value)


def test_schema_key_must_be_a_string() -> None:
    with pytest.raises(TypeError):
        State(schema=as_any({1: {"type": int}}))


# -- reserved names ----------------------------------------------------------------------------

_RESERVED = [
    "messages",
    "history",
    "usage",
    "turn",
    "answer",
    "get",
    "set",
    "has",
    "schema",
    "extra_data",
    "id",
    "parent_id",
    "parent_call_id",
    "pending_calls",
    "finished",
    "stopped",
    "created_at",
    "updated_at",
    "snapshot",
    "add_message",
    "finish",
    "compact",
    "clear_tool_results",
    "edit_extra_data",
    "fork",
    "child",
    "children",
    "achild",
    "restore",
]


@pytest.mark.parametrize("name", _RESERVED)
def test_reserved_name_in_dict_schema_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match=repr(name)):
        State(schema={"fine": {"type": int}, name: {"type": int}})


# Field names that pydantic itself would warn about (e.g. "schema") are left to the dict case.
_MODEL_RESERVED = [n for n in _RESERVED if n not in {"schema", "copy"}]


@pytest.mark.parametrize("name", _MODEL_RESERVED)
def test_reserved_name_in_model_schema_is_refused(name: str) -> None:
    model = _model({"fine": (int, 0), name: (int, 0)})
    with pytest.raises(ValueError, match=repr(name)):
        State(schema=model)


def test_reserved_name_check_covers_every_public_state_attribute() -> None:
    public = [name for name in dir(State) if not name.startswith("_")]
    for name in public:
        with pytest.raises(ValueError, match=repr(name)):
            State(schema={name: {"type": int}})


def test_similar_but_free_names_are_allowed() -> None:
    state = State(schema={"my_messages": {"type": list}, "Usage": {"type": int}})
    state.set("my_messages", ["a"])
    state.set("Usage", 3)
    assert state.get("my_messages") == ["a"]
    assert state.get("Usage") == 3


# -- default handler ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tp",
    [list, list[int], typing.List[int], list[dict[str, int]]],  # noqa: UP006
    ids=repr,
)
def test_list_types_merge_by_default(tp: Any) -> None:
    first: list[Any] = [{"a": 1}] if tp == list[dict[str, int]] else [1, 2]
    second: list[Any] = [{"a": 2}] if tp == list[dict[str, int]] else [3]
    state = State(schema={"items": {"type": tp}})
    state.set("items", first)
    state.set("items", second)
    assert state.get("items") == [*first, *second]


@pytest.mark.parametrize(
    ("tp", "first", "second"),
    [
        (str, "Alice", "Bob"),
        (int, 1, 2),
        (dict, {"a": 1}, {"b": 2}),
        (dict[str, list[int]], {"a": [1]}, {"b": [2]}),
        (list[int] | None, [1, 2], [3]),
        (typing.Optional[list[int]], [1, 2], [3]),  # noqa: UP045
        (typing.Union[list[int], None], [1], [2]),  # noqa: UP007
        (list[int] | str, [1], [2]),
        (Any, [1], [2]),
    ],
    ids=repr,
)
def test_other_types_replace_by_default(tp: Any, first: Any, second: Any) -> None:
    state = State(schema={"k": {"type": tp}})
    state.set("k", first)
    state.set("k", second)
    assert state.get("k") == second


def test_declared_handler_is_used() -> None:
    def dedupe(current: Any, new: Any) -> Any:
        existing: list[Any] = current or []
        return existing + [item for item in new if item not in existing]

    state = State(schema={"doc_ids": {"type": list, "handler": dedupe}})
    state.set("doc_ids", ["doc-1", "doc-2"])
    state.set("doc_ids", ["doc-2", "doc-3"])
    assert state.get("doc_ids") == ["doc-1", "doc-2", "doc-3"]


def test_declared_handler_on_a_str_key() -> None:
    def concatenate(current: Any, new: Any) -> Any:
        return f"{current}-{new}" if current else new

    state = State(schema={"name": {"type": str, "handler": concatenate}})
    state.set("name", "Alice")
    state.set("name", "Bob")
    assert state.get("name") == "Alice-Bob"


def test_merge_lists_and_replace_values_are_exported() -> None:
    assert orchestrator.merge_lists is merge_lists
    assert orchestrator.replace_values is replace_values
    assert replace_values([1], [2]) == [2]
    assert replace_values("old", None) is None


# -- pydantic model schemas --------------------------------------------------------------------


class Tracked(pydantic.BaseModel):
    items: Annotated[list[int], _append_zero] = []
    tags: list[str] = pydantic.Field(default_factory=lambda: ["seed"])
    plain: typing.List[int] = []  # noqa: UP006
    maybe: list[int] | None = None
    city: str = "Paris"
    visits: int = 0


def test_model_schema_annotated_reducer_is_used() -> None:
    state = State(schema=Tracked)
    state.set("items", [1])
    assert state.get("items") == [1, 0]
    state.set("items", [2, 3])
    assert state.get("items") == [1, 0, 2, 3, 0]


def test_model_schema_list_field_merges_by_default() -> None:
    state = State(schema=Tracked)
    state.set("plain", [1])
    state.set("plain", [2])
    assert state.get("plain") == [1, 2]


def test_model_schema_optional_list_field_replaces() -> None:
    state = State(schema=Tracked)
    state.set("maybe", [1])
    state.set("maybe", [2])
    assert state.get("maybe") == [2]


def test_model_schema_scalar_field_replaces() -> None:
    state = State(schema=Tracked)
    state.set("city", "Rome")
    state.set("city", "Oslo")
    assert state.get("city") == "Oslo"


def test_model_schema_defaults_before_any_set() -> None:
    state = State(schema=Tracked)
    assert state.get("items") == []
    assert state.get("tags") == ["seed"]
    assert state.get("city") == "Paris"
    assert state.get("visits") == 0
    assert state.get("maybe") is None
    for key in ("items", "tags", "plain", "maybe", "city", "visits"):
        assert not state.has(key)
    assert state.extra_data == {}
    assert state.history == ()


def test_model_schema_default_wins_over_get_default() -> None:
    state = State(schema=Tracked)
    assert state.get("city", "Berlin") == "Paris"


def test_model_schema_default_factory_value_is_frozen() -> None:
    state = State(schema=Tracked)
    tags = state.get("tags")
    with pytest.raises(TypeError):
        tags.append("x")
    assert State(schema=Tracked).get("tags") == ["seed"]


def test_model_schema_has_becomes_true_after_set() -> None:
    state = State(schema=Tracked)
    state.set("visits", 0)  # the same as the default, but now set
    assert state.has("visits")
    assert state.get("visits") == 0


def test_model_schema_merge_starts_from_nothing_not_the_default() -> None:
    state = State(schema=Tracked)
    state.set("tags", ["a"])
    # current is None when unset, so the default ["seed"] is not merged in.
    assert state.get("tags") == ["a"]


def test_model_schema_required_fields_are_allowed() -> None:
    class Needs(pydantic.BaseModel):
        user_id: str
        count: int

    state = State(schema=Needs)
    assert state.get("user_id") is None
    assert state.get("count", 5) == 5
    assert not state.has("user_id")
    state.set("user_id", "u1")
    state.set("count", "4")
    assert state.get("user_id") == "u1"
    assert state.get("count") == 4


def test_model_schema_field_constraints_are_validated() -> None:
    class Bounded(pydantic.BaseModel):
        score: Annotated[int, pydantic.Field(ge=0, le=10)] = 0

    state = State(schema=Bounded)
    state.set("score", 7)
    assert state.get("score") == 7
    with pytest.raises(ValueError, match="'score'"):
        state.set("score", 11)
    assert state.get("score") == 7


def test_model_schema_is_reported_by_state_schema() -> None:
    state = State(schema=Tracked)
    assert state.schema is Tracked


# -- merge_lists -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("current", "new", "expected"),
    [
        (None, None, []),
        (None, [1, 2], [1, 2]),
        ([1, 2], None, [1, 2]),
        ([1], [2, 3], [1, 2, 3]),
        ([], [], []),
        (1, 2, [1, 2]),
        ([1], 2, [1, 2]),
        (1, [2], [1, 2]),
        ("a", "b", ["a", "b"]),
        ({"k": 1}, [{"k": 2}], [{"k": 1}, {"k": 2}]),
        ([[1]], [[2]], [[1], [2]]),
    ],
    ids=repr,
)
def test_merge_lists(current: Any, new: Any, expected: list[Any]) -> None:
    assert merge_lists(current, new) == expected


def test_merge_lists_never_mutates_inputs() -> None:
    current = [1, [2]]
    new = [3]
    result = merge_lists(current, new)
    assert result == [1, [2], 3]
    assert current == [1, [2]]
    assert new == [3]
    result.append(4)
    assert current == [1, [2]]
    assert new == [3]


@pytest.mark.parametrize(("current", "new"), [([1], None), (None, [1]), ([1], [])])
def test_merge_lists_returns_a_new_list(current: Any, new: Any) -> None:
    result = merge_lists(current, new)
    assert result is not current
    assert result is not new
    result.append(9)
    assert current in (None, [1])
    assert new in (None, [1], [])


def test_merge_lists_works_on_frozen_lists() -> None:
    result = merge_lists(FrozenList([1]), FrozenList([2]))
    assert result == [1, 2]
    result.append(3)  # the result is an editable list


# -- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tp", "value", "stored"),
    [
        (int, "3", 3),
        (float, "2.5", 2.5),
        (float, 2, 2.0),
        (bool, "true", True),
        (str, "x", "x"),
        (list[int], ["1", 2], [1, 2]),
        (dict[str, int], {"a": "1"}, {"a": 1}),
        (int | None, "5", 5),
    ],
    ids=repr,
)
def test_validation_is_lax_and_stores_the_validated_value(tp: Any, value: Any, stored: Any) -> None:
    state = State(schema={"k": {"type": tp}})
    state.set("k", value)
    result = state.get("k")
    assert result == stored
    assert type(result) is type(stored) or is_a(result, (FrozenList, FrozenDict))
    entry = _extra_data_entries(state)[-1]
    assert entry.content.changed == {"k": stored}


def test_validated_float_is_stored_as_float() -> None:
    state = State(schema={"ratio": {"type": float}})
    state.set("ratio", 2)
    assert type_of(state.get("ratio")) is float


def test_model_value_is_stored_in_json_form() -> None:
    class Event(pydantic.BaseModel):
        name: str
        when: datetime.date

    state = State(schema={"event": {"type": Event}})
    state.set("event", {"name": "launch", "when": "2025-03-01"})
    assert state.get("event") == {"name": "launch", "when": "2025-03-01"}
    state.set("event", Event(name="review", when=datetime.date(2025, 4, 2)))
    assert state.get("event") == {"name": "review", "when": "2025-04-02"}


@pytest.mark.parametrize(
    ("tp", "value", "stored"),
    [
        (datetime.datetime, datetime.datetime(2025, 1, 2, 3, 4, 5), "2025-01-02T03:04:05"),
        (datetime.date, datetime.date(2025, 1, 2), "2025-01-02"),
        (Color, Color.BLUE, "blue"),
    ],
    ids=["datetime", "date", "enum"],
)
def test_declared_type_accepts_its_own_python_values(tp: Any, value: Any, stored: Any) -> None:
    # "validated against the declared type with pydantic (lax, like a model field)": a model field
    # of type datetime accepts a datetime, and the stored JSON form is its ISO string.
    state = State(schema={"k": {"type": tp}})
    state.set("k", value)
    assert state.get("k") == stored


class Settings(pydantic.BaseModel):
    color: Color = Color.RED
    since: datetime.date = datetime.date(2024, 5, 6)


def test_model_schema_defaults_of_json_able_types_are_returned_in_json_form() -> None:
    # Enum and date fields are JSON (as "red" and "2024-05-06"), so the model is a valid schema
    # and get returns the defaults in their JSON form.
    state = State(schema=Settings)
    assert state.get("color") == "red"
    assert state.get("since") == "2024-05-06"
    assert not state.has("color")
    state.set("color", "blue")
    assert state.get("color") == "blue"


@pytest.mark.parametrize(
    ("tp", "value"),
    [
        (int, "three"),
        (int, 1.5),
        (str, 3),
        (list[int], ["a"]),
        (list[int], "x"),  # merge_lists wraps it into ["x"], which is not list[int]
        (dict[str, int], {"a": "x"}),
        (Literal["a", "b"], "c"),
    ],
    ids=repr,
)
def test_failed_validation_names_the_key_and_records_nothing(tp: Any, value: Any) -> None:
    state = State(schema={"counter": {"type": tp}})
    before = state.history
    with pytest.raises(ValueError, match="counter") as info:
        state.set("counter", value)
    assert "'counter'" in str(info.value)
    assert state.history == before
    assert len(state.history) == len(before)
    assert not state.has("counter")


def test_failed_validation_keeps_the_previous_value() -> None:
    state = State(schema={"n": {"type": int}})
    state.set("n", 1)
    length = len(state.history)
    with pytest.raises(ValueError, match="'n'"):
        state.set("n", "not a number")
    assert state.get("n") == 1
    assert len(state.history) == length


def test_handler_result_is_what_gets_validated() -> None:
    def to_text(current: Any, new: Any) -> Any:
        return "not a list"

    state = State(schema={"items": {"type": list[int], "handler": to_text}})
    with pytest.raises(ValueError, match="'items'"):
        state.set("items", [1])
    assert state.history == ()


def test_handler_that_raises_propagates_unchanged_and_records_nothing() -> None:
    error = RuntimeError("handler broke")

    def broken(current: Any, new: Any) -> Any:
        raise error

    state = State(schema={"items": {"type": list, "handler": broken}})
    with pytest.raises(RuntimeError) as info:
        state.set("items", [1])
    assert info.value is error
    assert state.history == ()
    assert not state.has("items")


def test_handler_raising_value_error_is_not_wrapped() -> None:
    class Custom(ValueError):
        pass

    def broken(current: Any, new: Any) -> Any:
        raise Custom("mine")

    state = State()
    state.set("k", 1)
    length = len(state.history)
    with pytest.raises(Custom, match="mine"):
        state.set("k", 2, handler=broken)
    assert state.get("k") == 1
    assert len(state.history) == length


# -- what goes in and out ----------------------------------------------------------------------


def test_get_returns_frozen_json_equal_to_plain() -> None:
    state = State(schema={"docs": {"type": list[dict[str, Any]]}})
    state.set("docs", [{"id": 1, "tags": ["a"]}])
    docs = state.get("docs")
    assert docs == [{"id": 1, "tags": ["a"]}]
    assert is_a(docs, FrozenList)
    assert is_a(docs[0], FrozenDict)
    with pytest.raises(TypeError):
        docs.append({"id": 2})
    with pytest.raises(TypeError):
        docs[0]["tags"].append("b")
    assert state.get("docs") == [{"id": 1, "tags": ["a"]}]


def test_handler_gets_none_as_current_when_unset() -> None:
    seen: list[Any] = []

    def spy(current: Any, new: Any) -> Any:
        seen.append(current)
        return new

    state = State(schema={"k": {"type": list, "handler": spy}})
    state.set("k", [1])
    assert seen == [None]


def test_handler_gets_plain_mutable_copies() -> None:
    seen: list[tuple[Any, Any]] = []

    def spy(current: Any, new: Any) -> Any:
        seen.append((current, new))
        return new

    state = State(schema={"d": {"type": dict[str, list[int]], "handler": spy}})
    state.set("d", {"a": [1]})
    state.set("d", {"a": [1, 2]})
    current, new = seen[1]
    assert current == {"a": [1]}
    assert type_of(current) is dict
    assert type_of(current["a"]) is list
    assert type_of(new) is dict
    assert type_of(new["a"]) is list


def test_handler_may_append_to_current_and_return_it() -> None:
    def add_one(current: Any, new: Any) -> Any:
        items: list[Any] = current if current is not None else []
        items.append(new)
        return items

    state = State(schema={"log": {"type": list[str], "handler": add_one}})
    state.set("log", "a")
    first = state.get("log")
    state.set("log", "b")
    assert state.get("log") == ["a", "b"]
    assert first == ["a"]
    assert len(_extra_data_entries(state)) == 2


def test_handler_mutating_current_does_not_change_the_state() -> None:
    def vandal(current: Any, new: Any) -> Any:
        if current is not None:
            current["a"].append(99)
            current["b"] = [0]
            new["a"].append(98)
        return {"a": [7]}

    state = State(schema={"d": {"type": dict[str, list[int]], "handler": vandal}})
    state.set("d", {"a": [1]})
    first = state.history[-1]
    snapshot_before = state.snapshot()
    state.set("d", {"a": [2]})
    assert state.get("d") == {"a": [7]}
    assert isinstance(first, ExtraDataEntry)
    assert first.content.changed == {"d": {"a": [7]}}
    assert snapshot_before.extra_data == {"d": {"a": [7]}}


def test_handler_mutating_current_then_failing_changes_nothing() -> None:
    def vandal(current: Any, new: Any) -> Any:
        current.append(99)
        raise RuntimeError("after mutating")

    state = State(schema={"l": {"type": list[int]}})
    state.set("l", [1])
    with pytest.raises(RuntimeError):
        state.set("l", [2], handler=vandal)
    assert state.get("l") == [1]
    assert state.extra_data == {"l": [1]}


def test_caller_mutating_its_value_after_set_does_not_change_the_state() -> None:
    value: dict[str, Any] = {"a": [1]}
    state = State()
    state.set("d", value)
    value["a"].append(2)
    value["b"] = 3
    assert state.get("d") == {"a": [1]}


class PointModel(pydantic.BaseModel):
    x: int
    y: int


@pytest.mark.parametrize(
    ("tp", "value"),
    [
        (Point, Point(1, 2)),
        (PointModel, PointModel(x=1, y=2)),
        (Point, {"x": "1", "y": 2}),
        (PointModel, {"x": 1, "y": "2"}),
    ],
    ids=["dataclass", "model", "dict-for-dataclass", "dict-for-model"],
)
def test_dataclass_and_model_values_come_back_as_dicts(tp: Any, value: Any) -> None:
    state = State(schema={"where": {"type": tp}})
    state.set("where", value)
    result = state.get("where")
    assert result == {"x": 1, "y": 2}
    assert is_a(result, dict)
    assert not isinstance(result, Point | PointModel)


def test_list_of_dataclasses_merges_as_dicts() -> None:
    state = State(schema={"points": {"type": list[Point]}})
    state.set("points", [Point(1, 2)])
    state.set("points", [Point(3, 4)])
    assert state.get("points") == [{"x": 1, "y": 2}, {"x": 3, "y": 4}]


def test_dataclass_value_without_schema_is_stored_as_dict() -> None:
    state = State()
    state.set("p", Point(5, 6))
    assert state.get("p") == {"x": 5, "y": 6}


def test_model_schema_with_model_field() -> None:
    class Data(pydantic.BaseModel):
        where: PointModel | None = None

    state = State(schema=Data)
    state.set("where", PointModel(x=3, y=4))
    assert state.get("where") == {"x": 3, "y": 4}


# -- equal values record nothing ---------------------------------------------------------------


def test_replace_with_equal_value_records_nothing() -> None:
    state = State(schema={"name": {"type": str}})
    state.set("name", "Alice")
    length = len(state.history)
    state.set("name", "Alice")
    assert len(state.history) == length


def test_merge_with_empty_list_records_nothing() -> None:
    state = State(schema={"docs": {"type": list}})
    state.set("docs", [1])
    length = len(state.history)
    state.set("docs", [])
    assert len(state.history) == length
    assert state.get("docs") == [1]


def test_lax_equal_value_records_nothing() -> None:
    state = State(schema={"n": {"type": int}})
    state.set("n", 3)
    length = len(state.history)
    state.set("n", "3")
    assert len(state.history) == length


def test_equal_nested_value_records_nothing_without_schema() -> None:
    state = State()
    state.set("d", {"a": [1, {"b": None}]})
    length = len(state.history)
    state.set("d", {"a": [1, {"b": None}]})
    assert len(state.history) == length


def test_first_set_records_even_when_equal_to_the_default() -> None:
    state = State(schema={"docs": {"type": list}})
    state.set("docs", [])
    assert state.has("docs")
    assert state.get("docs") == []
    assert len(_extra_data_entries(state)) == 1


def test_value_of_another_json_type_is_a_change() -> None:
    state = State()
    state.set("flag", 1)
    state.set("flag", True)
    assert state.get("flag") is True
    assert len(_extra_data_entries(state)) == 2


# -- initial data ------------------------------------------------------------------------------


def test_initial_data_is_validated_against_the_schema() -> None:
    with pytest.raises(ValueError, match="'count'"):
        State(schema={"count": {"type": int}}, extra_data={"count": "many"})


def test_initial_data_stores_the_validated_form() -> None:
    state = State(schema={"count": {"type": int}}, extra_data={"count": "4", "free": "q"})
    assert state.get("count") == 4
    assert state.extra_data == {"count": 4, "free": "q"}
    entries = _extra_data_entries(state)
    assert len(entries) == 1
    assert entries[0].content.changed == {"count": 4, "free": "q"}


def test_initial_data_other_keys_are_free_form() -> None:
    state = State(
        schema={"count": {"type": int}},
        extra_data={"repo": "api", "nested": {"any": [1, "x", None]}},
    )
    assert state.extra_data == {"repo": "api", "nested": {"any": [1, "x", None]}}
    assert state.get("repo") == "api"
    assert state.has("repo")


def test_initial_data_other_keys_must_still_be_json() -> None:
    with pytest.raises(TypeError, match=r"extra_data\['free'\]"):
        State(schema={"count": {"type": int}}, extra_data={"free": {1, 2}})


def test_free_form_key_cannot_be_set_through_a_schema_state() -> None:
    state = State(schema={"count": {"type": int}}, extra_data={"repo": "api"})
    with pytest.raises(KeyError, match="repo"):
        state.set("repo", "web")
    assert state.get("repo") == "api"


def test_initial_data_with_model_schema_is_validated() -> None:
    with pytest.raises(ValueError, match="'visits'"):
        State(schema=Tracked, extra_data={"visits": "lots"})
    state = State(schema=Tracked, extra_data={"visits": "2"})
    assert state.get("visits") == 2
    assert state.has("visits")


def test_history_data_is_validated_against_the_schema() -> None:
    history = State(extra_data={"n": "not a number", "free": 1}).history
    with pytest.raises(ValueError, match="'n'"):
        State(history=history, schema={"n": {"type": int}})
    state = State(history=history, schema={"other": {"type": int}})
    assert state.get("n") == "not a number"


def test_reserved_schema_is_checked_even_with_initial_data() -> None:
    with pytest.raises(ValueError, match="'history'"):
        State(schema={"history": {"type": list}}, extra_data={"history": []})


# -- handler override --------------------------------------------------------------------------


def test_handler_override_applies_to_one_call() -> None:
    state = State(schema={"docs": {"type": list[int]}})
    state.set("docs", [1])
    state.set("docs", [2], handler=replace_values)
    assert state.get("docs") == [2]
    state.set("docs", [3])
    assert state.get("docs") == [2, 3]


def test_handler_override_replaces_the_declared_handler() -> None:
    def concatenate(current: Any, new: Any) -> Any:
        return f"{current}-{new}" if current else new

    state = State(schema={"name": {"type": str}})
    state.set("name", "Alice")
    state.set("name", "Bob", handler=concatenate)
    assert state.get("name") == "Alice-Bob"
    state.set("name", "Carol")
    assert state.get("name") == "Carol"


def test_handler_override_without_schema() -> None:
    state = State()
    state.set("log", ["a"])
    state.set("log", ["b"], handler=merge_lists)
    assert state.get("log") == ["a", "b"]


def test_handler_override_result_is_still_validated() -> None:
    state = State(schema={"n": {"type": int}})
    state.set("n", 1)
    with pytest.raises(ValueError, match="'n'"):
        state.set("n", 2, handler=lambda current, new: "two")
    assert state.get("n") == 1


# -- history and replay ------------------------------------------------------------------------


def test_every_change_is_one_extra_data_entry() -> None:
    state = State(schema={"docs": {"type": list[int]}, "name": {"type": str}})
    state.set("docs", [1])
    state.set("name", "a")
    state.set("docs", [2])
    entries = state.history
    assert len(entries) == 3
    assert all(isinstance(entry, ExtraDataEntry) for entry in entries)
    changes = [entry.content.changed for entry in _extra_data_entries(state)]
    assert changes == [{"docs": [1]}, {"name": "a"}, {"docs": [1, 2]}]
    assert [entry.seq for entry in entries] == [0, 1, 2]
    for entry in _extra_data_entries(state):
        assert entry.content.removed == []


_SCHEMA: dict[str, Any] = {
    "docs": {"type": list[int]},
    "name": {"type": str},
    "score": {"type": float | None},
}


def _build() -> State:
    state = State(schema=_SCHEMA, extra_data={"free": {"a": 1}})
    state.set("docs", [1, 2])
    state.set("name", "x")
    state.set("docs", ["3"])
    state.set("score", None)
    state.set("name", "y", handler=lambda current, new: f"{current}{new}")
    state.set("score", 2)
    return state


def test_replay_gives_the_same_values() -> None:
    state = _build()
    replayed = State(history=state.history)
    assert replayed.extra_data == state.extra_data
    assert replayed.get("docs") == [1, 2, 3]
    assert replayed.get("name") == "xy"
    assert replayed.get("score") == 2.0
    assert replayed.snapshot() == state.snapshot()


def test_replay_with_the_schema_gives_the_same_values() -> None:
    state = _build()
    replayed = State(history=state.history, schema=_SCHEMA)
    assert replayed.extra_data == state.extra_data
    assert replayed.snapshot() == state.snapshot()
    replayed.set("docs", [4])
    assert replayed.get("docs") == [1, 2, 3, 4]


def test_replay_of_a_model_schema_state() -> None:
    state = State(schema=Tracked)
    state.set("items", [5])
    state.set("city", "Rome")
    replayed = State(history=state.history, schema=Tracked)
    assert replayed.get("items") == [5, 0]
    assert replayed.get("city") == "Rome"
    assert replayed.get("visits") == 0
    assert not replayed.has("visits")


def _step(name: str) -> Callable[[State], None]:
    def run(state: State) -> None:
        state.set(name, [name])

    return run


def test_replay_after_each_step_matches() -> None:
    state = State(schema={"a": {"type": list[str]}, "b": {"type": list[str]}})
    for step in (_step("a"), _step("b"), _step("a")):
        step(state)
        assert_replays(state)
    assert state.get("a") == ["a", "a"]
