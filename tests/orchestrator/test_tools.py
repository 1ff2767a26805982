import dataclasses
import enum
import functools
import json
import math
import pickle
import subprocess
import sys
from collections.abc import Callable, Generator
from typing import Annotated, Any, Literal, Optional, cast

import pydantic
import pytest
from typing_extensions import TypedDict  # pydantic needs it on Python < 3.12

from orchestrator import (
    FrozenDict,
    FrozenList,
    FunctionTool,
    Image,
    Issue,
    OrchestratorError,
    State,
    TextBlock,
    Tool,
    ToolCall,
    ToolInputError,
    ToolResult,
    ToolSpec,
    tool,
)

# Private: the schema and conversion internals of tools, checked as units.
from orchestrator._record._state import RESERVED
from orchestrator._record._typed import Schema
from orchestrator._tooling._tool_schema import parse_docstring
from orchestrator._tooling._tools import Converted, as_tool_list, check_outputs_against_schema
from tests.doubles import Color

PNG = b"\x89PNG\r\n\x1a\n"


class Doc(pydantic.BaseModel):
    title: str
    tags: list[str] = []


@dataclasses.dataclass
class Point:
    x: int
    y: int = 0


class Filters(TypedDict):
    lang: str


class Profile(pydantic.BaseModel):
    user: str = "guest"
    docs: list[str] = []


def schema_of(t: Tool) -> dict[str, Any]:
    return json.loads(json.dumps(t.spec.input_schema))


def props(t: Tool) -> dict[str, Any]:
    return schema_of(t)["properties"]


def input_error(t: Tool, args: Any, state: State | None = None) -> ToolInputError:
    with pytest.raises(ToolInputError) as info:
        t.bind(args, state)
    return info.value


# -- the spec: schema from type hints --------------------------------------------------------------


def test_schema_for_basic_types_and_defaults() -> None:
    @tool
    def f(s: str, i: int, x: float, b: bool, tags: list[str], n: int = 3) -> None:
        """Do it."""

    assert f.spec == ToolSpec(
        "f",
        "Do it.",
        {
            "type": "object",
            "properties": {
                "s": {"type": "string"},
                "i": {"type": "integer"},
                "x": {"type": "number"},
                "b": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "n": {"type": "integer", "default": 3},
            },
            "required": ["s", "i", "x", "b", "tags"],
            "additionalProperties": False,
        },
    )


def test_schema_is_frozen_json() -> None:
    @tool
    def f(s: str) -> None: ...

    schema = f.spec.input_schema
    assert isinstance(schema, FrozenDict)
    with pytest.raises(TypeError):
        schema["type"] = "array"  # type: ignore[index]


def test_schema_for_optional_literal_and_enum() -> None:
    @tool
    def f(
        mode: Literal["fast", "slow"],
        color: Color = Color.RED,
        note: str | None = None,
        old: Optional[int] = None,  # noqa: UP045 - the spelling under test
    ) -> None: ...

    schema = schema_of(f)
    assert schema["properties"]["mode"] == {"type": "string", "enum": ["fast", "slow"]}
    assert schema["properties"]["color"] == {"$ref": "#/$defs/Color", "default": "red"}
    assert schema["$defs"]["Color"] == {"type": "string", "enum": ["red", "blue"]}
    assert schema["properties"]["note"] == {
        "anyOf": [{"type": "string"}, {"type": "null"}],
        "default": None,
    }
    assert schema["properties"]["old"]["anyOf"] == [{"type": "integer"}, {"type": "null"}]
    assert schema["required"] == ["mode"]


def test_schema_for_nested_model_dataclass_and_typeddict() -> None:
    @tool
    def f(doc: Doc, point: Point, filters: Filters) -> None: ...

    schema = schema_of(f)
    assert schema["properties"] == {
        "doc": {"$ref": "#/$defs/Doc"},
        "point": {"$ref": "#/$defs/Point"},
        "filters": {"$ref": "#/$defs/Filters"},
    }
    assert schema["$defs"]["Doc"] == {
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}, "default": []},
        },
        "required": ["title"],
    }
    assert schema["$defs"]["Point"]["required"] == ["x"]
    assert schema["$defs"]["Filters"]["properties"] == {"lang": {"type": "string"}}


def test_schema_drops_pydantic_titles_but_keeps_a_property_named_title() -> None:
    @tool
    def f(title: str, doc: Doc) -> None: ...

    text = json.dumps(f.spec.input_schema)
    assert '"title": {"type": "string"}' in text
    assert '"title": "' not in text


def test_schema_without_parameters() -> None:
    @tool
    def ping() -> str:
        return "pong"

    assert schema_of(ping) == {"type": "object", "properties": {}, "additionalProperties": False}


def test_parameter_names_that_shadow_pydantic_attributes() -> None:
    @tool
    def f(json: str, schema: int, model_config: bool = False, _private: int = 0) -> None: ...

    assert list(props(f)) == ["json", "schema", "model_config", "_private"]
    assert f.bind({"json": "j", "schema": "2"}) == {
        "json": "j",
        "schema": 2,
        "model_config": False,
        "_private": 0,
    }


def test_default_that_is_not_json_is_left_out_of_the_schema_quietly() -> None:
    marker = object()

    @tool
    def f(value: Any = marker) -> None: ...

    assert props(f)["value"] == {}
    assert f.bind({})["value"] is marker


# -- descriptions ----------------------------------------------------------------------------------


def test_description_and_parameter_descriptions_from_a_google_docstring() -> None:
    @tool
    def search(query: str, limit: int = 5) -> list[str]:
        """Search the documents.

        Matches words anywhere in the text.

        Args:
            query: The words to look for.
            limit (int): How many results
                to return at most.

        Returns:
            The matching titles.

        Raises:
            ValueError: Never.

        Example:
            search("anyio")
        """
        return []

    assert search.description == (
        "Search the documents.\n\nMatches words anywhere in the text.\n\nExample:\n"
        '    search("anyio")'
    )
    assert props(search)["query"]["description"] == "The words to look for."
    assert props(search)["limit"]["description"] == "How many results to return at most."


def test_annotated_string_and_field_descriptions() -> None:
    @tool
    def f(
        a: Annotated[str, "From Annotated"],
        b: Annotated[int, pydantic.Field(description="From Field", ge=0)],
        c: str = "",
    ) -> None:
        """Do it.

        Args:
            a: From the docstring.
            b: From the docstring too.
            c: Only here.
        """

    properties = props(f)
    assert properties["a"] == {"type": "string", "description": "From Annotated"}
    assert properties["b"] == {"type": "integer", "description": "From Field", "minimum": 0}
    assert properties["c"]["description"] == "Only here."


def test_description_option_wins_and_no_docstring_gives_empty_text() -> None:
    @tool(description="Told by hand.")
    def f(x: int) -> None:
        """Docstring."""

    @tool
    def g(x: int) -> None: ...

    assert f.spec.description == "Told by hand."
    assert g.spec.description == ""


def test_parse_docstring_handles_empty_and_args_only() -> None:
    assert parse_docstring(None) == ("", {})
    assert parse_docstring("Args:\n    a: One.\n\n    Returns:\n        Nothing.") == (
        "",
        {"a": "One."},
    )
    assert parse_docstring("Do.\n\n    Args:\n        (see below)\n        a: One.\n    ") == (
        "Do.",
        {"a": "One."},
    )
    assert parse_docstring("Args:\n    a: One.\n    b: Two\n        lines.") == (
        "",
        {"a": "One.", "b": "Two lines."},
    )


# -- hidden parameters -----------------------------------------------------------------------------


def test_state_parameters_are_hidden_and_receive_the_live_state() -> None:
    @tool
    def f(x: int, state: State, maybe: State | None = None, old: Optional[State] = None) -> None:  # noqa: UP045
        ...

    assert list(props(f)) == ["x"]
    live = State()
    kwargs = f.bind({"x": 1}, live)
    assert kwargs["state"] is live
    assert kwargs["maybe"] is live
    assert kwargs["old"] is live


def test_optional_state_gets_none_and_required_state_needs_one() -> None:
    @tool
    def f(state: State | None) -> None: ...

    @tool
    def g(state: State) -> None: ...

    assert f.bind({}, None) == {"state": None}
    with pytest.raises(TypeError, match="needs the live State"):
        g.bind({}, None)


def test_parameters_from_state_are_hidden() -> None:
    @tool(inputs_from_state={"user_name": "user"})
    def f(query: str, user: str) -> None: ...

    assert list(props(f)) == ["query"]
    assert schema_of(f)["required"] == ["query"]


# -- bind: what the model sent ---------------------------------------------------------------------


@tool(inputs_from_state={"user_name": "user"})
def search(query: str, limit: int, doc: Doc | None, user: str, state: State | None) -> None:
    """Search."""


def test_bind_lists_every_problem_with_its_path() -> None:
    error = input_error(
        search,
        {"limit": "ten", "doc": {"tags": [1]}, "qurey": "x", "user": "eve", "state": {}},
        State(extra_data={"user_name": "bob"}),
    )
    assert {(issue.path, issue.message.split(":")[0]) for issue in error.issues} == {
        (("query",), "missing"),
        (
            ("limit",),
            'Input should be a valid integer, unable to parse string as an integer, got "ten"',
        ),
        (("doc", "title"), "missing"),
        (("doc", "tags", 0), "Input should be a valid string, got 1"),
        (("qurey",), "unknown argument"),
        (("user",), "filled from the state key 'user_name'; do not send it"),
        (("state",), "supplied by the agent; do not send it"),
    }
    text = str(error)
    assert text.startswith("Invalid arguments for the tool 'search':")
    assert "- doc.tags[0]: Input should be a valid string, got 1" in text
    assert (
        "- qurey: unknown argument: this tool takes query, limit, doc. Did you mean 'query'?"
        in (text)
    )
    assert "- query: missing: this argument is required" in text
    assert error.tool == "search"
    assert isinstance(error, OrchestratorError)


@pytest.mark.parametrize("args", [[1, 2], "query=x", None, 3])
def test_bind_refuses_arguments_that_are_not_an_object(args: Any) -> None:
    error = input_error(search, args)
    assert error.issues == (
        Issue((), f"must be a JSON object of named arguments, got {type(args).__name__}"),
    )
    assert (
        f"- arguments: must be a JSON object of named arguments, got {type(args).__name__}"
        in str(error)
    )


class Strict(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    name: str


def test_unknown_field_inside_a_nested_object() -> None:
    @tool
    def f(item: Strict) -> None: ...

    error = input_error(f, {"item": {"name": "n", "color": "red"}})
    assert error.issues == (Issue(("item", "color"), "unknown field"),)


def test_unknown_argument_for_a_tool_without_arguments() -> None:
    @tool
    def ping() -> None: ...

    error = input_error(ping, {"x": 1})
    assert error.issues == (Issue(("x",), "unknown argument: this tool takes no arguments"),)


def test_tool_input_error_pickles() -> None:
    error = input_error(search, {})
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error)
    assert copy.issues == error.issues


def test_bind_is_lax_like_a_model() -> None:
    @tool
    def f(
        n: int, x: float, b: bool, color: Color, doc: Doc, point: Point, tags: list[str]
    ) -> None: ...

    kwargs = f.bind(
        {
            "n": "3",
            "x": 2,
            "b": "true",
            "color": "blue",
            "doc": {"title": "T"},
            "point": {"x": "4"},
            "tags": ("a", "b"),
        }
    )
    assert kwargs == {
        "n": 3,
        "x": 2.0,
        "b": True,
        "color": Color.BLUE,
        "doc": Doc(title="T"),
        "point": Point(4, 0),
        "tags": ["a", "b"],
    }


def test_bind_gives_plain_values_from_a_tool_call() -> None:
    @tool
    def f(data: dict[str, Any], anything: Any) -> None: ...

    call = ToolCall("c1", "f", {"data": {"k": [1]}, "anything": {"k": [2]}})
    assert isinstance(call.args["data"], FrozenDict)
    kwargs = f.bind(call.args)
    assert kwargs == {"data": {"k": [1]}, "anything": {"k": [2]}}
    copy: dict[str, list[int]] = kwargs["anything"]
    assert type(copy) is dict
    assert type(copy["k"]) is list
    copy["k"].append(3)  # the tool may change its own copy
    assert call.args["anything"] == {"k": [2]}


def test_bind_fills_defaults_in_signature_order() -> None:
    @tool
    def f(a: int, b: str = "x", c: list[int] | None = None) -> None: ...

    assert list(f.bind({"c": [1], "a": 1}).items()) == [("a", 1), ("b", "x"), ("c", [1])]


# -- inputs_from_state -----------------------------------------------------------------------------


def test_inputs_from_state_reads_the_state_when_bound() -> None:
    @tool(inputs_from_state={"user_name": "user", "docs": "documents"})
    def f(query: str, user: str, documents: list[Doc]) -> None: ...

    state = State(extra_data={"user_name": "bob", "docs": [{"title": "A"}]})
    kwargs = f.bind({"query": "q"}, state)
    assert kwargs == {"query": "q", "user": "bob", "documents": [Doc(title="A")]}


def test_inputs_from_state_give_editable_copies() -> None:
    @tool(inputs_from_state={"docs": "documents"})
    def f(documents: list[str]) -> None: ...

    @tool(inputs_from_state={"docs": "documents"})
    def g(documents=None) -> None:  # type: ignore[no-untyped-def]
        ...

    state = State(extra_data={"docs": ["a"]})
    for t in (f, cast(Tool, g)):
        documents = t.bind({}, state)["documents"]
        assert documents == ["a"]
        assert not isinstance(documents, FrozenList)
        documents.append("b")
    assert state.get("docs") == ["a"]


def test_missing_state_key_uses_the_parameter_default() -> None:
    sentinel: list[str] = []

    @tool(inputs_from_state={"docs": "documents"})
    def f(documents: list[str] = sentinel) -> None: ...

    assert f.bind({}, State())["documents"] is sentinel
    assert f.bind({}, None)["documents"] is sentinel


def test_missing_state_key_without_default_is_an_input_error() -> None:
    @tool(inputs_from_state={"user_name": "user"})
    def f(user: str) -> None: ...

    for state in (State(), None):
        error = input_error(f, {}, state)
        assert error.issues == (
            Issue(
                ("user",),
                "filled from the state key 'user_name', which is not set yet, so this tool"
                " cannot run now",
            ),
        )


def test_a_set_none_is_a_value() -> None:
    @tool(inputs_from_state={"note": "note"})
    def f(note: str | None = "default") -> None: ...

    assert f.bind({}, State(extra_data={"note": None})) == {"note": None}


def test_state_value_of_the_wrong_type_is_an_input_error() -> None:
    @tool(inputs_from_state={"count": "count"})
    def f(count: int) -> None: ...

    error = input_error(f, {}, State(extra_data={"count": "many"}))
    assert error.issues[0].path == ("count",)
    assert "the state key 'count' holds \"many\", which does not fit" in error.issues[0].message


def test_schema_default_fills_a_parameter_without_default() -> None:
    @tool(inputs_from_state={"user": "user", "docs": "docs"})
    def f(user: str, docs: list[str] = ["mine"]) -> None:  # noqa: B006
        ...

    state = State(schema=Profile)
    assert not state.has("user")
    assert f.bind({}, state) == {"user": "guest", "docs": ["mine"]}


# -- return values ---------------------------------------------------------------------------------


@tool
def plain() -> None: ...


def content_of(value: Any) -> tuple[TextBlock | Image, ...]:
    converted = plain.convert(value)
    assert converted.state_update is None
    assert converted.is_error is False
    return converted.content


class Mood(enum.StrEnum):
    HAPPY = "happy"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("as is", "as is"),
        ("", ""),
        (None, "(done)"),
        (Mood.HAPPY, "happy"),
        ({"café": 1.5, "ok": True, "none": None}, '{"café": 1.5, "ok": true, "none": null}'),
        ([1, "two", (3, 4)], '[1, "two", [3, 4]]'),
        (3, "3"),
        (False, "false"),
        (Doc(title="T"), '{"title": "T", "tags": []}'),
        (Point(1, 2), '{"x": 1, "y": 2}'),
        ([], "[]"),
    ],
)
def test_return_values_become_text(value: Any, text: str) -> None:
    assert content_of(value) == (TextBlock(text),)


def test_images_become_blocks() -> None:
    image = Image(PNG, "image/png")
    assert content_of(image) == (image,)
    assert content_of(TextBlock("t")) == (TextBlock("t"),)
    assert content_of(["Look:", image, {"n": 1}, TextBlock("end"), 2]) == (
        TextBlock("Look:"),
        image,
        TextBlock('{"n": 1}'),
        TextBlock("end"),
        TextBlock("2"),
    )
    assert content_of((image,)) == (image,)


@pytest.mark.parametrize(
    ("value", "found"),
    [
        (object(), "the result is a object"),
        ({"when": math.nan}, "the result['when'] is nan"),
        ({1: "a"}, "has the key 1"),
        (b"raw", "the result is a bytes"),
        ([Image(PNG, "image/png"), {"x": {1, 2}}], "the result[1]['x'] is a set"),
        ({"img": Image(PNG, "image/png")}, "the result['img']['data'] is a bytes"),
        (ToolResult(ToolResult("x")), "whose message is a ToolResult"),
        (ToolResult("ok", state={"when": object()}), "ToolResult.state['when'] is a object"),
    ],
)
def test_values_that_are_not_json_raise_type_error(value: Any, found: str) -> None:
    with pytest.raises(TypeError) as info:
        plain.convert(value)
    assert "Tool 'plain' returned" in str(info.value)
    assert found in str(info.value)


def test_tool_result_gives_message_state_and_error_flag() -> None:
    converted = plain.convert(ToolResult("City set.", state={"city": "Paris", "n": Doc(title="T")}))
    assert converted == Converted(
        (TextBlock("City set."),), {"city": "Paris", "n": {"title": "T", "tags": []}}, False
    )
    assert plain.convert(ToolResult(is_error=True)) == Converted((TextBlock("(done)"),), None, True)
    assert plain.convert(ToolResult({"a": 1}, state={})).state_update is None


def test_tool_result_checks_its_state() -> None:
    with pytest.raises(TypeError, match="dict of state keys"):
        ToolResult("x", state=["a"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="keys are state keys"):
        ToolResult("x", state={1: "a"})  # type: ignore[dict-item]
    given = {"a": 1}
    result = ToolResult("x", state=given)
    given["a"] = 2
    assert result.state == {"a": 1}


# -- outputs_to_state ------------------------------------------------------------------------------


def keep_first(current: Any, new: Any) -> Any:
    return new if current is None else current


@tool(
    outputs_to_state={
        "documents": {"source": "docs"},
        "count": {"source": "count", "handler": keep_first},
        "everything": {},
    }
)
def retrieve() -> None: ...


def test_outputs_to_state_maps_keys_of_a_dict_result() -> None:
    converted = retrieve.convert({"docs": ["a"], "count": 1, "other": True})
    assert converted.state_update == {
        "documents": ["a"],
        "count": 1,
        "everything": {"docs": ["a"], "count": 1, "other": True},
    }
    assert json.loads(converted.content[0].text) == {"docs": ["a"], "count": 1, "other": True}  # type: ignore[union-attr]


def test_outputs_to_state_skips_a_missing_source_key() -> None:
    assert retrieve.convert({"docs": []}).state_update == {
        "documents": [],
        "everything": {"docs": []},
    }

    @tool(outputs_to_state={"documents": {"source": "docs"}})
    def f() -> None: ...

    assert f.convert({"other": 1}).state_update is None


def test_outputs_to_state_reads_models_and_dataclasses_as_dicts() -> None:
    @tool(outputs_to_state={"t": {"source": "title"}, "x": {"source": "x"}})
    def f() -> None: ...

    assert f.convert(Doc(title="T")).state_update == {"t": "T"}
    assert f.convert(Point(1)).state_update == {"x": 1}


def test_outputs_to_state_with_a_source_needs_a_dict_result() -> None:
    with pytest.raises(TypeError) as info:
        retrieve.convert(["a"])
    assert (
        "Tool 'retrieve' returned list, but outputs_to_state['documents'] reads the key 'docs'"
        in (str(info.value))
    )


def test_outputs_to_state_without_source_stores_any_result() -> None:
    @tool(outputs_to_state={"last": {}})
    def f() -> None: ...

    assert f.convert("text").state_update == {"last": "text"}
    assert f.convert(None).state_update == {"last": None}
    assert f.convert([1]).state_update == {"last": [1]}


def test_outputs_to_state_with_a_tool_result() -> None:
    update = retrieve.convert(ToolResult({"docs": ["a"]}, state={"documents": ["b"], "k": 1}))
    assert update.state_update == {"documents": ["b"], "everything": {"docs": ["a"]}, "k": 1}
    error = retrieve.convert(ToolResult({"docs": ["a"]}, state={"k": 1}, is_error=True))
    assert error.state_update == {"k": 1}
    assert error.is_error


def test_output_handlers_and_mappings_are_exposed() -> None:
    assert retrieve.output_handlers == {"count": keep_first}
    assert retrieve.outputs_to_state == {
        "documents": {"source": "docs"},
        "count": {"source": "count", "handler": keep_first},
        "everything": {},
    }
    assert plain.output_handlers == {}


def test_check_outputs_against_schema() -> None:
    schema = Schema.parse({"documents": {"type": list}, "count": {"type": int}}, RESERVED)
    check_outputs_against_schema(plain, schema)
    check_outputs_against_schema(retrieve, None)
    with pytest.raises(ValueError, match="'everything'") as info:
        check_outputs_against_schema(retrieve, schema)
    assert "declared: documents, count" in str(info.value)

    @tool(outputs_to_state={"cont": {}})
    def f() -> None: ...

    with pytest.raises(ValueError, match="Did you mean 'count'"):
        check_outputs_against_schema(f, schema)


# -- options checked at decoration -----------------------------------------------------------------


def decorate(**options: Any) -> Any:
    def f(query: str, user: str = "") -> None: ...

    return tool(**options)(f)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"name": ""}, "The tool name '' is not valid"),
        ({"name": "has space"}, "The tool name 'has space' is not valid"),
        ({"name": "x" * 65}, "is not valid"),
        ({"name": "café"}, "is not valid"),
        ({"name": 3}, "The tool name 3 is not valid"),
        ({"description": 3}, "description must be a str"),
        ({"parallel": "yes"}, "parallel must be True or False"),
        ({"read_only": 1}, "read_only must be True or False"),
        ({"timeout": 0}, "timeout is a number of seconds greater than 0"),
        ({"timeout": -1.5}, "greater than 0"),
        ({"timeout": math.inf}, "greater than 0"),
        ({"timeout": True}, "greater than 0"),
        ({"timeout": "5"}, "greater than 0"),
        ({"inputs_from_state": {"user_name": "usr"}}, "'usr', which is not a parameter"),
        ({"inputs_from_state": {"user_name": "usr"}}, "Did you mean 'user'?"),
        ({"inputs_from_state": ["user"]}, "inputs_from_state maps state keys to parameter names"),
        ({"inputs_from_state": {"k": 1}}, "(both str)"),
        ({"inputs_from_state": {"a": "user", "b": "user"}}, "from both 'a' and 'b'"),
        ({"outputs_to_state": {"docs": {"sorce": "d"}}}, "unknown field 'sorce'"),
        ({"outputs_to_state": {"docs": {"sorce": "d"}}}, "Did you mean 'source'?"),
        ({"outputs_to_state": {"docs": {"handler": "merge"}}}, "'handler' must be a function"),
        ({"outputs_to_state": {"docs": {"source": 1}}}, "'source' names a key of the result"),
        ({"outputs_to_state": {"docs": "d"}}, "must be a dict with 'source' and/or 'handler'"),
        ({"outputs_to_state": ["docs"]}, "outputs_to_state maps state keys"),
        ({"outputs_to_state": {1: {}}}, "keys are state keys"),
    ],
)
def test_bad_options_raise_type_error_saying_how_to_fix_them(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(TypeError) as info:
        decorate(**options)
    assert message in str(info.value)


def test_good_options_are_kept() -> None:
    t = decorate(
        name="find-it",
        description="Finds.",
        parallel=False,
        timeout=5,
        read_only=True,
        inputs_from_state={"user_name": "user"},
        outputs_to_state={"last": {}},
    )
    assert (t.name, t.description, t.parallel, t.timeout, t.read_only) == (
        "find-it",
        "Finds.",
        False,
        5.0,
        True,
    )
    assert t.inputs_from_state == {"user_name": "user"}
    assert t.outputs_to_state == {"last": {}}
    assert (plain.parallel, plain.timeout, plain.read_only) == (True, None, False)


def test_signatures_that_cannot_work_raise_type_error() -> None:
    def star(*queries: str) -> None: ...

    def double_star(**options: str) -> None: ...

    def untyped(query) -> None:  # type: ignore[no-untyped-def]  # pyright: ignore[reportMissingParameterType]
        ...

    def positional(query: str, /) -> None: ...

    def generator(query: str) -> Generator[str, None, None]:
        yield query

    class Opaque:
        pass

    def opaque(value: Opaque) -> None: ...

    def not_json(callback: Callable[[int], int]) -> None: ...

    def opaque_from_state(value: Opaque) -> None: ...

    cases: list[tuple[Any, str]] = [
        (min, "cannot read the function's signature"),
        (star, "the parameter *queries cannot be shown to a model"),
        (double_star, "the parameter **options cannot be shown"),
        (untyped, "the parameter 'query' has no type hint"),
        (positional, "Remove the '/'"),
        (generator, "is a generator function"),
        (opaque, "pydantic cannot validate the type of 'value'"),
        (not_json, "has no JSON schema"),
    ]
    for fn, message in cases:
        with pytest.raises(TypeError) as info:
            tool(name="t")(fn)
        assert message in str(info.value), fn
    with pytest.raises(TypeError, match="pydantic cannot validate the type of 'value'"):
        tool(inputs_from_state={"k": "value"})(opaque_from_state)


def test_unresolvable_type_hint_says_where_to_define_it() -> None:
    def f(value: "Missing") -> None: ...  # type: ignore[name-defined]  # noqa: F821

    with pytest.raises(TypeError, match="Define the type at module level"):
        tool(cast(Any, f))


def test_string_annotations_resolve_and_the_return_hint_is_not_needed() -> None:
    def f(query: "Annotated[str, 'Q']", state: "State | None", later: "Later") -> "Later":
        return later

    t = tool(f)
    assert props(t) == {
        "query": {"type": "string", "description": "Q"},
        "later": {"$ref": "#/$defs/Later"},
    }
    assert t.bind({"query": "q", "later": {"n": 1}}) == {
        "query": "q",
        "state": None,
        "later": Later(n=1),
    }


def test_the_module_imports_alone() -> None:
    code = (
        "from typing import Annotated\n"
        "from orchestrator._tooling._tools import tool\n"
        "def f(q: Annotated[str, 'Q']) -> None: ...\n"
        "assert tool(f).spec.input_schema['properties']['q']['description'] == 'Q'\n"
    )
    subprocess.run([sys.executable, "-W", "error", "-c", code], check=True)


def test_a_parameter_cannot_be_state_and_from_state() -> None:
    def f(state: State) -> None: ...

    with pytest.raises(TypeError, match="receives the State"):
        tool(inputs_from_state={"k": "state"})(f)


def test_tool_decorator_misuse() -> None:
    with pytest.raises(TypeError, match=r"write @tool\(name='search'\)"):
        tool("search")  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="already a tool"):
        tool(plain)
    with pytest.raises(TypeError, match="subclass Tool"):
        tool(Color)
    with pytest.raises(TypeError, match="takes a function"):
        FunctionTool(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="no __name__"):
        tool(functools.partial(Point, 1))
    with pytest.raises(TypeError, match="not valid"):
        tool(lambda: None)


def test_a_method_needs_a_tool_subclass() -> None:
    class Holder:
        def find(self, query: str) -> None: ...

    with pytest.raises(TypeError, match="subclass Tool and define run"):
        tool(Holder.find)


# -- function tools --------------------------------------------------------------------------------


def test_function_tool_stays_callable_like_the_function() -> None:
    def add(a: int, b: int = 1) -> int:
        """Add two numbers."""
        return a + b

    t = tool(add)
    assert isinstance(t, FunctionTool)
    assert t(2, b=3) == 5
    assert t.__wrapped__ is add
    assert t.__name__ == "add"
    assert t.__doc__ == "Add two numbers."
    assert repr(t) == "<FunctionTool 'add'>"
    assert t.call(t.bind({"a": "2"})) == 3


def test_options_with_empty_parentheses() -> None:
    @tool()
    def f(x: int) -> int:
        return x

    assert f.name == "f"
    assert f(1) == 1


def test_partial_and_callable_object_tools() -> None:
    def scale(x: int, factor: int) -> int:
        """Scale x."""
        return x * factor

    double = tool(name="double")(functools.partial(scale, factor=2))
    assert double.description == "Scale x."
    assert double.call(double.bind({"x": 3})) == 6

    class Counter:
        def __call__(self, step: int) -> int:
            return step

    counter = tool(name="count")(Counter())
    assert list(props(counter)) == ["step"]
    assert counter.call({"step": 2}) == 2


@pytest.mark.anyio
async def test_async_function_tool() -> None:
    @tool
    async def fetch(url: str) -> str:
        return f"got {url}"

    assert fetch.is_async
    assert await fetch.acall(fetch.bind({"url": "u"})) == "got u"
    assert await fetch("v") == "got v"
    with pytest.raises(TypeError, match=r"is async: use `await tool\.acall"):
        fetch.call({"url": "u"})


@pytest.mark.anyio
async def test_acall_runs_a_sync_tool_in_a_worker_thread() -> None:
    import threading

    main = threading.get_ident()

    @tool
    def where() -> bool:
        return threading.get_ident() != main

    assert not where.is_async
    assert await where.acall({}) is True


def test_a_sync_tool_returning_an_awaitable_is_refused() -> None:
    async def inner() -> str:
        return "x"

    @tool
    def sneaky() -> Any:
        return inner()

    with pytest.raises(TypeError, match="make it `async def`"):
        sneaky.call({})


# -- Tool subclasses -------------------------------------------------------------------------------


class SearchDocs(Tool):
    """Search the documents.

    Args:
        query: Ignored: run's docstring wins.
    """

    read_only = True
    inputs_from_state = {"user_name": "user"}  # noqa: RUF012
    outputs_to_state = {"last": {"source": "query"}}  # noqa: RUF012

    def run(self, query: str, user: str = "guest") -> dict[str, Any]:
        """Args:
        query: What to look for.
        """
        return {"query": query, "user": user}


def test_tool_subclass_with_run() -> None:
    t = SearchDocs()
    assert t.name == "search_docs"
    assert t.description == "Search the documents."
    assert t.read_only
    assert t.parallel
    assert not t.is_async
    assert props(t) == {"query": {"type": "string", "description": "What to look for."}}
    kwargs = t.bind({"query": "q"}, State(extra_data={"user_name": "ann"}))
    result = t.call(kwargs)
    assert result == {"query": "q", "user": "ann"}
    assert t.convert(result).state_update == {"last": "q"}


def test_tool_subclass_options_in_init() -> None:
    class Lookup(Tool):
        name = "lookup"

        def __init__(self, table: dict[str, int]) -> None:
            super().__init__(description=f"Look up one of {len(table)} keys.", timeout=2)
            self.table = table

        def run(self, key: str) -> int:
            return self.table[key]

    t = Lookup({"a": 1})
    assert (t.name, t.description, t.timeout) == ("lookup", "Look up one of 1 keys.", 2.0)
    assert t.call(t.bind({"key": "a"})) == 1


def test_tool_subclass_without_super_init_still_works() -> None:
    class HTTPFetch(Tool):
        """Fetch a page."""

        def __init__(self) -> None:
            self.calls = 0

        def run(self, url: str) -> str:
            self.calls += 1
            return url

    t = HTTPFetch()
    assert t.spec.name == "http_fetch"
    assert t.call(t.bind({"url": "u"})) == "u"


@pytest.mark.anyio
async def test_tool_subclass_with_arun() -> None:
    class Select(Tool):
        name = "select_city"
        description = "Select a city."
        parallel = False

        async def arun(self, city: str, state: State) -> ToolResult:
            return ToolResult(f"{city} selected in {state.id}.", state={"city": city})

    t = Select()
    assert t.is_async
    assert not t.parallel
    assert list(props(t)) == ["city"]
    state = State(id="s1")
    value = await t.acall(t.bind({"city": "Paris"}, state))
    assert t.convert(value) == Converted(
        (TextBlock("Paris selected in s1."),), {"city": "Paris"}, False
    )


def test_tool_subclass_mistakes() -> None:
    with pytest.raises(TypeError, match="defines both run and arun"):

        class Both(Tool):  # pyright: ignore[reportUnusedClass]
            def run(self) -> None: ...

            async def arun(self) -> None: ...

    with pytest.raises(TypeError, match="run is async: name it arun"):

        class AsyncRun(Tool):  # pyright: ignore[reportUnusedClass]
            async def run(self) -> None: ...

    with pytest.raises(TypeError, match="arun must be `async def`"):

        class SyncArun(Tool):  # pyright: ignore[reportUnusedClass]
            def arun(self) -> None: ...

    class Empty(Tool):
        pass

    with pytest.raises(TypeError, match="without a run method"):
        Empty()

    class BadName(Tool):
        name = "bad name"

        def run(self) -> None: ...

    with pytest.raises(TypeError, match="is not valid"):
        BadName()


# -- tool lists ------------------------------------------------------------------------------------


def test_as_tool_list_makes_functions_tools() -> None:
    def helper(x: int) -> int:
        return x

    tools = as_tool_list([plain, helper, SearchDocs()])
    assert [t.name for t in tools] == ["plain", "helper", "search_docs"]
    assert tools[0] is plain
    assert isinstance(tools[1], FunctionTool)
    assert as_tool_list(()) == ()


def test_as_tool_list_refuses_duplicates_and_non_tools() -> None:
    def plain_again() -> None: ...

    with pytest.raises(
        ValueError, match=r"Two tools are named 'plain' \(tools\[0\] and tools\[1\]\)"
    ):
        as_tool_list([plain, tool(name="plain")(plain_again)])
    with pytest.raises(TypeError, match=r"tools\[1\] is a int, not a tool"):
        as_tool_list([plain, 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"pass an instance, SearchDocs\(\)"):
        as_tool_list([SearchDocs])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="takes a list of tools"):
        as_tool_list(plain)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="takes a list of tools"):
        as_tool_list("plain")  # type: ignore[arg-type]


def test_tool_spec_checks_and_freezes() -> None:
    spec = ToolSpec("n", "d", {"type": "object", "properties": {}})
    assert isinstance(spec.input_schema, FrozenDict)
    with pytest.raises(TypeError):
        ToolSpec("n", None, {})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ToolSpec("n", "d", [])  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "m"  # type: ignore[misc]


class Later(pydantic.BaseModel):
    """Defined after the tools that name it."""

    n: int


def test_arguments_a_provider_could_not_parse_get_one_clear_issue() -> None:
    # A provider keeps cut-off argument text under INVALID_ARGUMENTS (orchestrator._base._messages).
    from orchestrator._base._messages import INVALID_ARGUMENTS  # private: the exact text

    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    with pytest.raises(ToolInputError) as caught:
        add.bind({INVALID_ARGUMENTS: '{"a": 1, "b'}, None)
    (issue,) = caught.value.issues
    assert "not a JSON object" in issue.message
    assert '{\\"a\\": 1, \\"b' in issue.message
    assert "Send all arguments again as one JSON object" in str(caught.value)
