"""What a tool returns, and how it reaches the model and the State.

`convert` turns a return value into content blocks (a str as is, None as ``"(done)"``, images as
blocks, anything else as JSON text) and a state update: a `ToolResult`'s `state`, and the parts of
the result that ``outputs_to_state`` maps to state keys.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypedDict, cast

from .._base._json import freeze, freeze_values
from .._base._messages import Image, TextBlock
from .._record._typed import Handler

__all__ = (
    "Converted",
    "Output",
    "OutputMapping",
    "ToolResult",
    "as_mapping",
    "check_outputs",
    "convert",
)

_OUTPUT_FIELDS = ("source", "handler")


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A tool's return value that also updates the State's typed data.

    `message` is what the model sees, converted like any return value; `state` maps state keys
    to values merged through the schema's handlers when the turn's results are recorded;
    `is_error` marks the result as a failure the model should act on.

    Example::

        @tool
        def select_city(city: str) -> ToolResult:
            return ToolResult(f"City set to {city}.", state={"city": city})
    """

    message: Any = None
    state: Mapping[str, Any] | None = None
    is_error: bool = False

    def __post_init__(self) -> None:
        state: object = self.state
        if state is not None:
            if not isinstance(state, Mapping):
                raise TypeError(
                    f"ToolResult.state must be a dict of state keys to values, got"
                    f" {type(state).__name__}."
                )
            copy = dict(cast("Mapping[Any, Any]", state))
            for key in copy:
                if not isinstance(key, str):
                    raise TypeError(f"ToolResult.state keys are state keys (str), got {key!r}.")
            object.__setattr__(self, "state", MappingProxyType(copy))
        object.__setattr__(self, "is_error", bool(self.is_error))


@dataclass(frozen=True, slots=True)
class Converted:
    """A return value as the model sees it, and the state update it carries (or None)."""

    content: tuple[TextBlock | Image, ...]
    state_update: dict[str, Any] | None
    is_error: bool


class OutputMapping(TypedDict, total=False):
    """One ``outputs_to_state`` entry: where a state key's value comes from, and how it merges.

    `source` is the key to read from a dict result (left out: the whole result is stored);
    `handler` merges it instead of the schema's handler for this mapping only.
    """

    source: str
    handler: Handler | None


@dataclass(frozen=True, slots=True)
class Output:
    """One checked ``outputs_to_state`` entry."""

    key: str
    source: str | None
    handler: Handler | None


# -- outputs_to_state ------------------------------------------------------------------------------


def check_outputs(tool: str, value: object) -> tuple[Output, ...]:
    """Check an ``outputs_to_state`` option; raise `TypeError` saying how to fix it."""
    if not isinstance(value, Mapping):
        raise TypeError(
            f"Tool {tool!r}: outputs_to_state maps state keys to {{'source': key, 'handler': fn}},"
            f" e.g. {{'documents': {{'source': 'docs'}}}}; got {type(value).__name__}."
        )
    outputs: list[Output] = []
    for key, entry in cast("Mapping[object, object]", value).items():
        if not isinstance(key, str):
            raise TypeError(f"Tool {tool!r}: outputs_to_state keys are state keys, got {key!r}.")
        outputs.append(_check_output(tool, key, entry))
    return tuple(outputs)


def _check_output(tool: str, key: str, entry: object) -> Output:
    where = f"Tool {tool!r}: outputs_to_state[{key!r}]"
    if not isinstance(entry, Mapping):
        raise TypeError(
            f"{where} must be a dict with 'source' and/or 'handler' ({{}} stores the whole"
            f" result), got {entry!r}."
        )
    fields = cast("Mapping[object, object]", entry)
    for name in fields:
        if name not in _OUTPUT_FIELDS:
            close = difflib.get_close_matches(str(name), _OUTPUT_FIELDS, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise TypeError(
                f"{where} has the unknown field {name!r}: it takes 'source' and 'handler'.{hint}"
            )
    source = fields.get("source")
    if source is not None and not isinstance(source, str):
        raise TypeError(f"{where}: 'source' names a key of the result (a str), got {source!r}.")
    handler = fields.get("handler")
    if handler is not None and not callable(handler):
        raise TypeError(
            f"{where}: 'handler' must be a function handler(current, new) -> merged,"
            f" got {handler!r}."
        )
    return Output(key, source, cast("Handler | None", handler))


def as_mapping(out: Output) -> OutputMapping:
    """The entry as the user wrote it, for `Tool.outputs_to_state`."""
    mapping = OutputMapping()
    if out.source is not None:
        mapping["source"] = out.source
    if out.handler is not None:
        mapping["handler"] = out.handler
    return mapping


# -- conversion -----------------------------------------------------------------------------------


def convert(tool: str, outputs: tuple[Output, ...], value: Any) -> Converted:
    """The content the model sees for `value` and the state update it carries.

    Raises:
        TypeError: The value is not JSON, or a ``source`` mapping got a result that is not a
            dict; the message names the tool and says how to fix it.
    """
    if not isinstance(value, ToolResult):
        return Converted(_content(tool, value), _update(tool, outputs, value) or None, False)
    if isinstance(value.message, ToolResult):
        raise TypeError(
            f"Tool {tool!r} returned a ToolResult whose message is a ToolResult:"
            " put the text in message= and merge the state updates into one dict."
        )
    update = {} if value.is_error else _update(tool, outputs, value.message)
    if value.state is not None:
        update.update(_json(tool, value.state, "ToolResult.state", keyed=True))
    return Converted(_content(tool, value.message), update or None, value.is_error)


def _content(tool: str, value: Any) -> tuple[TextBlock | Image, ...]:
    if isinstance(value, str):
        return (TextBlock(str.__str__(value)),)
    if value is None:
        return (TextBlock("(done)"),)
    if isinstance(value, TextBlock | Image):
        return (value,)
    if isinstance(value, list | tuple):
        items = cast("list[Any] | tuple[Any, ...]", value)
        if any(isinstance(item, TextBlock | Image) for item in items):
            return tuple(_block(tool, item, index) for index, item in enumerate(items))
    return (TextBlock(_json_text(tool, value, "the result")),)


def _block(tool: str, item: Any, index: int) -> TextBlock | Image:
    if isinstance(item, TextBlock | Image):
        return item
    if isinstance(item, str):
        return TextBlock(str.__str__(item))
    return TextBlock(_json_text(tool, item, f"the result[{index}]"))


_RETURN = "Return a str, JSON data, a dataclass or pydantic model, an Image, or a ToolResult."


def _json(tool: str, value: Any, path: str, *, keyed: bool = False) -> Any:
    """`value` as frozen JSON; `keyed`: a dict of state values, each checked by itself.

    Every failure is a `TypeError` naming the tool, so the call gets an error result and the
    run goes on: a value that is not JSON, or one whose own conversion raised (a pydantic
    model's dump, a Mapping's items).
    """
    try:
        return freeze_values(value, path) if keyed else freeze(value, path)
    except TypeError as error:
        raise TypeError(
            f"Tool {tool!r} returned a value that is not JSON: {error} {_RETURN}"
        ) from None
    except Exception as error:
        raise TypeError(
            f"Tool {tool!r} returned a value that could not be turned into JSON: {path} raised"
            f" {type(error).__name__}: {error}. {_RETURN}"
        ) from None


def _json_text(tool: str, value: Any, path: str) -> str:
    data = _json(tool, value, path)
    try:
        return json.dumps(data, ensure_ascii=False)
    except ValueError as error:  # an int longer than this process's sys.get_int_max_str_digits()
        raise TypeError(
            f"Tool {tool!r} returned a value that could not be written as JSON: {error}. {_RETURN}"
        ) from None


def _update(tool: str, outputs: tuple[Output, ...], value: Any) -> dict[str, Any]:
    if not outputs:
        return {}
    data = _json(tool, value, "the result")
    update: dict[str, Any] = {}
    for out in outputs:
        if out.source is None:
            update[out.key] = data
        elif not isinstance(data, dict):
            raise TypeError(
                f"Tool {tool!r} returned {type(value).__name__}, but"
                f" outputs_to_state[{out.key!r}] reads the key {out.source!r} of a dict"
                " result. Return a dict (or a dataclass or pydantic model), or drop"
                " 'source' to store the whole result."
            )
        elif out.source in data:
            update[out.key] = cast("dict[str, Any]", data)[out.source]
    return update
