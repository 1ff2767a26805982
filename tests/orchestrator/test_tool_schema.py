"""Tool arguments: plain parameters are validated by pydantic-core without a model class.

A tool whose model-facing parameters are all plain (str, int, float, bool, with no default or
one of exactly that type) gets its validator and JSON schema without pydantic building a model
class; every other tool gets a pydantic model. The two must not differ in anything a model or
a caller sees, so each plain tool is checked against its twin annotated
``Annotated[T, pydantic.Field()]``, which takes the model path.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Annotated, Any

import pydantic
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import Tool, ToolInputError, thaw, tool

_MISSING: Any = inspect.Parameter.empty

PLAIN_VALUES: dict[type, st.SearchStrategy[Any]] = {
    str: st.text(max_size=4),
    int: st.integers(),
    float: st.floats(allow_nan=False, allow_infinity=False),
    bool: st.booleans(),
}

# What a model may send: right and wrong types, numbers as strings, nested values.
ANY_JSON: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=4)
    | st.sampled_from(["1", "1.5", "true", "no", " 2 ", "1e3", "inf"]),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=2), inner),
    max_leaves=3,
)

Argument = tuple[type, Any, str | None]  # the type, the default (or _MISSING), the description


@st.composite
def signatures(draw: st.DrawFn) -> list[Argument]:
    arguments: list[Argument] = []
    for hint in draw(st.lists(st.sampled_from([str, int, float, bool]), max_size=4)):
        default = draw(
            st.just(_MISSING)
            | PLAIN_VALUES[hint]
            | st.sampled_from([None, 0, 1.0, True, "x", float("inf")])  # not plain: a model
        )
        description = draw(st.none() | st.sampled_from(["", "how many", "the name"]))
        arguments.append((hint, default, description))
    return arguments


def _function(arguments: list[Argument], twin: bool) -> Callable[..., Any]:
    """A tool function with `arguments` as keyword-only parameters ``a0``, ``a1``...; with
    `twin`, each annotated ``Annotated[T, pydantic.Field()]`` (the model path)."""

    def fn(**kwargs: Any) -> str:
        return "ok"

    parameters: list[inspect.Parameter] = []
    annotations: dict[str, Any] = {}
    docs: list[str] = []
    for index, (hint, default, description) in enumerate(arguments):
        name = f"a{index}"
        annotations[name] = Annotated[hint, pydantic.Field()] if twin else hint
        parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default))
        if description is not None:
            docs.append(f"    {name}: {description}")
    fn.__signature__ = inspect.Signature(parameters)
    fn.__annotations__ = annotations
    fn.__doc__ = "Do it.\n\nArgs:\n" + "\n".join(docs) if docs else "Do it."
    return fn


def _made(fn: Callable[..., Any]) -> Tool | str:
    """The tool, or the message of the `TypeError` that refused it."""
    try:
        return tool(fn)
    except TypeError as error:
        return str(error)


def _bound(checked: Tool, args: dict[str, Any]) -> Any:
    """What `bind` gives, with each value's type (1, 1.0 and True are equal), or the error."""
    try:
        kwargs = checked.bind(args)
    except ToolInputError as error:
        return ("error", str(error), error.issues)
    return [(name, type(value), value) for name, value in kwargs.items()]


@settings(max_examples=300, deadline=None)
@given(
    signatures(),
    st.lists(
        st.dictionaries(
            st.sampled_from(["a0", "a1", "a2", "a3", "p0", "other"]), ANY_JSON, max_size=4
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_plain_arguments_behave_as_the_pydantic_model(
    arguments: list[Argument], calls: list[dict[str, Any]]
) -> None:
    plain = _made(_function(arguments, twin=False))
    model = _made(_function(arguments, twin=True))
    if isinstance(plain, str) or isinstance(model, str):  # a default JSON cannot hold (inf)
        assert plain == model
        return
    assert json.dumps(thaw(plain.spec.input_schema)) == json.dumps(thaw(model.spec.input_schema))
    for args in calls:
        assert _bound(plain, args) == _bound(model, args)


def test_plain_arguments_build_no_pydantic_model() -> None:
    # In a fresh process: the test process has built pydantic models already.
    code = textwrap.dedent(
        """
        import sys
        from orchestrator import ToolInputError, tool

        def find(text: str, limit: int = 3, score: float = 0.5, exact: bool = False) -> str:
            '''Find text.

            Args:
                text: What to look for.
                limit: How many results.
            '''
            return text

        found = tool(find)
        print(found.bind({"text": "a", "limit": "7", "exact": True}))
        try:
            found.bind({"limit": 1.5, "txt": "a"})
        except ToolInputError as error:
            print(error.issues)
        print(dict(found.spec.input_schema["properties"]["limit"]))
        print([name for name in ("pydantic.main", "importlib.metadata") if name in sys.modules])
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stderr == ""
    assert done.stdout.splitlines() == [
        "{'text': 'a', 'limit': 7, 'score': 0.5, 'exact': True}",
        "(Issue(path=('text',), message='missing: this argument is required'),"
        " Issue(path=('limit',), message='Input should be a valid integer, got a number with a"
        " fractional part, got 1.5'), Issue(path=('txt',), message=\"unknown argument: this tool"
        " takes text, limit, score, exact. Did you mean 'text'?\"))",
        "{'default': 3, 'description': 'How many results.', 'type': 'integer'}",
        "[]",
    ]
