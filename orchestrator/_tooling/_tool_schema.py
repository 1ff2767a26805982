"""Tool parameters: from a function's signature to the model's JSON schema, and back.

`Parameters.analyse` reads a tool function once. Each parameter is one of three kinds:

- filled by the model: validated by one pydantic model built with ``extra="forbid"``, whose JSON
  schema is what the model is shown (when every such parameter is a plain str, int, float or
  bool, pydantic-core validates that model's core schema with no model class built: the same
  checks and errors, without the memory a model class costs a fresh process);
- filled from state (``inputs_from_state``): read when the call starts, hidden from the model;
- annotated `State` (or ``State | None``): receives the live State, hidden from the model;
- annotated `Memory` (or ``Memory | None``): receives the agent's memory, hidden from the model.

`Parameters.bind` turns the arguments a model sent into the keyword arguments to call the
function with, or raises `ToolInputError` listing every problem with its path.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import json
import math
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, TypeAlias, Union, cast, get_args, get_origin

import pydantic
from pydantic.fields import FieldInfo
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaWarningKind
from pydantic_core import PydanticUndefined, SchemaValidator, core_schema

from .._base._errors import Issue, OrchestratorError
from .._base._json import FrozenDict, freeze, thaw
from .._base._messages import INVALID_ARGUMENTS
from .._record._state import State
from ._memory import Memory

__all__ = ("Parameters", "ToolInputError", "parse_docstring")

_MISSING: Any = object()

Validate: TypeAlias = "Callable[[dict[Any, Any]], Mapping[str, Any]]"
"""Validates a tool's arguments (raising `pydantic.ValidationError`): values by field name."""

# -- docstrings ----------------------------------------------------------------------------------

_SECTION = re.compile(r"^([A-Za-z][A-Za-z ]*):\s*$")
_ARG_SECTIONS = frozenset({"args", "arguments", "parameters", "params"})
_HIDDEN_SECTIONS = _ARG_SECTIONS | frozenset(
    {"returns", "return", "yields", "yield", "raises", "keyword args", "keyword arguments"}
)
_ARG_ENTRY = re.compile(r"^\*{0,2}([A-Za-z_]\w*)\s*(?:\([^)]*\))?\s*:(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into its description and its parameter descriptions.

    The description is the summary and body without the ``Args:``, ``Returns:`` and ``Raises:``
    sections; the parameter descriptions come from ``Args:`` (``name (type): text`` entries,
    continued on more indented lines).
    """
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    kept: list[str] = []
    args: dict[str, str] = {}
    index = 0
    while index < len(lines):
        match = _SECTION.match(lines[index])
        section = match.group(1).lower() if match else ""
        if section not in _HIDDEN_SECTIONS:
            kept.append(lines[index])
            index += 1
            continue
        end = _section_end(lines, index)
        if section in _ARG_SECTIONS:
            args.update(_parse_args(lines[index + 1 : end]))
        index = end
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(line.rstrip() for line in kept))
    return text.strip(), args


def _section_end(lines: list[str], start: int) -> int:
    """Where the section whose header is at `start` ends: at the next unindented line.

    A header on the docstring's first line (right after the quotes) has its body dedented by
    `inspect.cleandoc`, so that body runs to the next section header instead.
    """
    end = start + 1
    flat = start == 0 and end < len(lines) and not lines[end][:1].isspace()
    while end < len(lines):
        line = lines[end]
        if flat and _SECTION.match(line):
            break
        if not flat and line.strip() and not line[0].isspace():
            break
        end += 1
    return end


def _parse_args(lines: list[str]) -> dict[str, str]:
    indents = [len(line) - len(line.lstrip()) for line in lines if line.strip()]
    base = min(indents, default=0)
    entries: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines:
        indent = len(line) - len(line.lstrip())
        match = _ARG_ENTRY.match(line.strip()) if line.strip() and indent == base else None
        if match:
            current = entries.setdefault(match.group(1), [])
            current.append(match.group(2))
        elif current is not None:
            current.append(line)
    return {name: " ".join(" ".join(parts).split()) for name, parts in entries.items()}


# -- type hints ----------------------------------------------------------------------------------


def _annotations_of(fn: Callable[..., Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The raw parameter annotations of `fn` (the return annotation left out) and its globals."""
    target: Any = fn
    while isinstance(target, functools.partial):
        target = cast("functools.partial[Any]", target).func
    if not (inspect.isfunction(target) or inspect.ismethod(target)) and callable(target):
        target = type(target).__call__  # pyright: ignore[reportUnknownMemberType]
    annotations = dict(getattr(target, "__annotations__", None) or {})
    annotations.pop("return", None)
    globalns = getattr(inspect.unwrap(target), "__globals__", {})
    return annotations, globalns


def _type_hints(fn: Callable[..., Any], tool: str) -> dict[str, Any]:
    """The parameter type hints of `fn`, string annotations resolved, `Annotated` kept."""
    annotations, globalns = _annotations_of(fn)
    holder = types.SimpleNamespace(__annotations__=annotations)
    try:
        return typing.get_type_hints(holder, globalns=globalns, include_extras=True)
    except (NameError, SyntaxError, TypeError) as error:
        raise TypeError(
            f"Tool {tool!r}: cannot resolve a parameter's type hint ({error}). Define the type"
            " at module level before the tool, or import it outside `if TYPE_CHECKING:`."
        ) from None


def _is_state(tp: Any, injected: type = State) -> bool:
    return tp is injected or (get_origin(tp) is Annotated and get_args(tp)[0] is injected)


def state_injection(tp: Any, injected: type = State) -> bool | None:
    """For a `State` annotation: whether it also accepts None. None when it is not one.

    `injected` is the class looked for: `State`, or `Memory` (see `memory_injection`).
    """
    if _is_state(tp, injected):
        return False
    if get_origin(tp) in (Union, types.UnionType):
        members = get_args(tp)
        others = [m for m in members if m is not type(None)]
        if len(others) == 1 and _is_state(others[0], injected) and len(members) == 2:
            return True
    return None


def memory_injection(tp: Any) -> bool | None:
    """For a `Memory` annotation: whether it also accepts None. None when it is not one."""
    return state_injection(tp, Memory)


def _annotated_description(tp: Any) -> tuple[str | None, bool]:
    """The string metadata of ``Annotated[T, "text"]``, and whether a `Field` describes it."""
    if get_origin(tp) is not Annotated:
        return None, False
    metadata = get_args(tp)[1:]
    texts = [item for item in metadata if isinstance(item, str)]
    described = any(isinstance(item, FieldInfo) and item.description for item in metadata)
    return (texts[-1] if texts else None), described


# -- JSON schema -----------------------------------------------------------------------------------


class _QuietJsonSchema(GenerateJsonSchema):
    """Leaves out what JSON cannot show (such as a default that is not JSON) without warning."""

    def emit_warning(self, kind: JsonSchemaWarningKind, detail: str) -> None:
        """Drop the warning: the library never warns at decoration time."""


_NAME_MAPS = frozenset({"properties", "$defs", "definitions", "patternProperties"})
_VALUES = frozenset({"default", "examples", "example", "const", "enum"})


def _tidy(node: Any) -> Any:
    """The schema without pydantic's ``title`` keys (property names are kept, even 'title')."""
    if isinstance(node, list):
        return [_tidy(item) for item in cast("list[Any]", node)]
    if not isinstance(node, dict):
        return node
    tidy: dict[str, Any] = {}
    for key, value in cast("dict[str, Any]", node).items():
        if key == "title":
            continue
        if key in _NAME_MAPS and isinstance(value, dict):
            names = cast("dict[str, Any]", value)
            tidy[key] = {name: _tidy(sub) for name, sub in names.items()}
        else:
            tidy[key] = value if key in _VALUES else _tidy(value)
    return tidy


def _input_schema(model: type[pydantic.BaseModel], tool: str) -> FrozenDict[str, Any]:
    try:
        raw = model.model_json_schema(schema_generator=_QuietJsonSchema)
    except pydantic.PydanticUserError as error:
        raise TypeError(
            f"Tool {tool!r}: a parameter type has no JSON schema ({error}). Model-facing"
            " parameters take JSON: str, int, float, bool, lists, dicts, Literal, Enum,"
            " dataclasses, TypedDicts and pydantic models."
        ) from None
    body = cast("dict[str, Any]", _tidy(raw))
    return _object_schema(tool, body.get("properties", {}), body.get("required"), body.get("$defs"))


def _object_schema(
    tool: str, properties: dict[str, Any], required: list[str] | None, defs: Any
) -> FrozenDict[str, Any]:
    """The tool's input schema: an object of `properties`, no other keys allowed."""
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    schema["additionalProperties"] = False
    if defs:
        schema["$defs"] = defs
    return cast("FrozenDict[str, Any]", freeze(schema, f"tool {tool!r} input schema"))


# -- errors ----------------------------------------------------------------------------------------


def format_path(path: Iterable[str | int]) -> str:
    """``("doc", "tags", 0)`` as ``doc.tags[0]``; the empty path is ``arguments``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "arguments"


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= 80 else text[:77] + "..."


class ToolInputError(OrchestratorError):
    """The arguments a model sent to a tool are wrong.

    `str(error)` lists every problem with its path, written for the model to read and fix its
    call; `issues` holds them as `Issue` values, and `tool` names the tool.
    """

    def __init__(self, tool: str, issues: Iterable[Issue]) -> None:
        self.tool: str = tool
        self.issues: tuple[Issue, ...] = tuple(issues)
        lines = [f"Invalid arguments for the tool {tool!r}:"]
        lines += [f"- {format_path(issue.path)}: {issue.message}" for issue in self.issues]
        lines.append("Call the tool again with every problem fixed.")
        super().__init__("\n".join(lines))

    def __reduce__(self) -> tuple[type[ToolInputError], tuple[str, tuple[Issue, ...]]]:
        return (ToolInputError, (self.tool, self.issues))


# -- parameters ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StateInput:
    """A parameter filled from the state key `key` (``inputs_from_state``)."""

    key: str
    param: str
    default: Any
    adapter: pydantic.TypeAdapter[Any] | None


@dataclass(frozen=True, slots=True)
class Parameters:
    """How to call one tool function: its model-facing arguments and its hidden parameters."""

    tool: str
    validate: Validate
    fields: tuple[tuple[str, str], ...]
    input_schema: FrozenDict[str, Any]
    from_state: tuple[StateInput, ...]
    state_params: tuple[tuple[str, bool], ...]
    order: tuple[str, ...]
    memory_params: tuple[tuple[str, bool], ...] = ()

    @classmethod
    def analyse(
        cls,
        fn: Callable[..., Any],
        *,
        tool: str,
        inputs_from_state: Mapping[str, str],
        descriptions: Mapping[str, str],
    ) -> Parameters:
        """Read `fn`'s signature once; raise `TypeError` saying how to fix what cannot work."""
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError) as error:
            raise TypeError(
                f"Tool {tool!r}: cannot read the function's signature ({error})."
            ) from None
        hints = _type_hints(fn, tool)
        keys_of = _state_keys_by_param(inputs_from_state, tuple(signature.parameters), tool)
        arguments: list[_Argument] = []
        from_state: list[StateInput] = []
        state_params: list[tuple[str, bool]] = []
        memory_params: list[tuple[str, bool]] = []
        for param in signature.parameters.values():
            _check_kind(param, tool)
            hint = hints.get(param.name, _MISSING)
            optional = None if hint is _MISSING else state_injection(hint)
            memory = None if hint is _MISSING else memory_injection(hint)
            if memory is not None:
                if param.name in keys_of:
                    raise TypeError(
                        f"Tool {tool!r}: the parameter {param.name!r} receives the agent's"
                        " memory, so it cannot also be filled from inputs_from_state. Remove it"
                        " from the mapping."
                    )
                memory_params.append((param.name, memory))
            elif optional is not None:
                if param.name in keys_of:
                    raise TypeError(
                        f"Tool {tool!r}: the parameter {param.name!r} receives the State, so it"
                        " cannot also be filled from inputs_from_state. Remove it from the mapping."
                    )
                state_params.append((param.name, optional))
            elif param.name in keys_of:
                from_state.append(_state_input(keys_of[param.name], param, hint, tool))
            else:
                if hint is _MISSING:
                    raise TypeError(_missing_hint(param.name, tool))
                arguments.append(_argument(len(arguments), param, hint, descriptions))
        if all(_is_plain(argument) for argument in arguments):
            validate, input_schema = _plain_arguments(tool, arguments)
        else:
            validate, input_schema = _model_arguments(tool, arguments)
        return cls(
            tool=tool,
            validate=validate,
            fields=tuple((argument.field, argument.param) for argument in arguments),
            input_schema=input_schema,
            from_state=tuple(from_state),
            state_params=tuple(state_params),
            order=tuple(signature.parameters),
            memory_params=tuple(memory_params),
        )

    @property
    def argument_names(self) -> tuple[str, ...]:
        """The names the model may send, in signature order."""
        return tuple(param for _, param in self.fields)

    def bind(
        self, args: object, state: State | None, memory: Memory | None = None
    ) -> dict[str, Any]:
        """The keyword arguments to call the function with, validated.

        Raises:
            ToolInputError: The arguments are wrong, or a state key a parameter needs is unset.
            TypeError: A parameter needs the State and `state` is None, or needs the agent's
                memory and `memory` is None.
        """
        kwargs: dict[str, Any] = {}
        for param, optional in self.state_params:
            if state is None and not optional:
                raise TypeError(
                    f"Tool {self.tool!r}: the parameter {param!r} needs the live State:"
                    " pass the State to bind(args, state)."
                )
            kwargs[param] = state
        for param, optional in self.memory_params:
            if memory is None and not optional:
                raise TypeError(
                    f"Tool {self.tool!r}: the parameter {param!r} needs the agent's memory:"
                    " pass it to bind(args, state, memory=agent.memory)."
                )
            kwargs[param] = memory
        if not isinstance(args, dict | Mapping):  # dict first: a fast check, no ABC
            shown = type(args).__name__
            issue = Issue((), f"must be a JSON object of named arguments, got {shown}")
            raise ToolInputError(self.tool, (issue,))
        # thaw copies a dict (a FrozenDict too): only another Mapping needs dict() first.
        plain = thaw(args if isinstance(args, dict) else dict(cast("Mapping[Any, Any]", args)))
        if len(plain) == 1 and INVALID_ARGUMENTS in plain:
            text = _shown(plain[INVALID_ARGUMENTS])
            issue = Issue(
                (),
                f"the arguments were not a JSON object (cut off or malformed): {text}. Send all"
                " arguments again as one JSON object",
            )
            raise ToolInputError(self.tool, (issue,))
        issues = self._hidden_issues(plain)
        kwargs.update(self._validated(plain, issues))
        kwargs.update(self._state_values(state, issues))
        if issues:
            raise ToolInputError(self.tool, issues)
        return {name: kwargs[name] for name in self.order if name in kwargs}

    def _hidden_issues(self, args: dict[Any, Any]) -> list[Issue]:
        """Report, and take out of `args`, what the model sent for a hidden parameter."""
        issues: list[Issue] = []
        for item in self.from_state:
            if item.param in args:
                del args[item.param]
                message = f"filled from the state key {item.key!r}; do not send it"
                issues.append(Issue((item.param,), message))
        for param, _ in (*self.state_params, *self.memory_params):
            if param in args:
                del args[param]
                issues.append(Issue((param,), "supplied by the agent; do not send it"))
        return issues

    def _validated(self, args: dict[Any, Any], issues: list[Issue]) -> dict[str, Any]:
        try:
            values = self.validate(args)
        except pydantic.ValidationError as error:
            issues.extend(self._issue(detail) for detail in error.errors())
            return {}
        return {param: values[field] for field, param in self.fields}

    def _issue(self, detail: Any) -> Issue:
        path = tuple(cast("tuple[str | int, ...]", detail["loc"]))
        kind = detail["type"]
        top = len(path) == 1
        if kind == "missing":
            message = "missing: this argument is required" if top else "missing: a required field"
        elif kind == "extra_forbidden" and top:
            message = self._unknown(str(path[0]))
        elif kind == "extra_forbidden":
            message = "unknown field"
        else:
            message = f"{detail['msg']}, got {_shown(detail.get('input'))}"
        return Issue(path, message)

    def _unknown(self, name: str) -> str:
        names = self.argument_names
        if not names:
            return "unknown argument: this tool takes no arguments"
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        return f"unknown argument: this tool takes {', '.join(names)}.{hint}"

    def _state_values(self, state: State | None, issues: list[Issue]) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for item in self.from_state:
            if state is not None and state.has(item.key):
                value = state.get(item.key)
            elif item.default is not _MISSING:
                values[item.param] = item.default
                continue
            else:
                value = _MISSING if state is None else state.get(item.key, _MISSING)
            if value is _MISSING:
                message = (
                    f"filled from the state key {item.key!r}, which is not set yet, so this tool"
                    " cannot run now"
                )
                issues.append(Issue((item.param,), message))
            else:
                values[item.param] = _state_value(item, value, issues)
        return values


def _state_value(item: StateInput, value: Any, issues: list[Issue]) -> Any:
    plain = thaw(value)
    if item.adapter is None:
        return plain
    try:
        return item.adapter.validate_python(plain)
    except pydantic.ValidationError as error:
        first = error.errors()[0]
        message = f"the state key {item.key!r} holds {_shown(plain)}, which does not fit: "
        issues.append(Issue((item.param,), message + first["msg"]))
        return None


def _state_keys_by_param(
    inputs_from_state: Mapping[str, str], params: tuple[str, ...], tool: str
) -> dict[str, str]:
    keys_of: dict[str, str] = {}
    for key, param in inputs_from_state.items():
        if param not in params:
            close = difflib.get_close_matches(param, params, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise TypeError(
                f"Tool {tool!r}: inputs_from_state maps the state key {key!r} to {param!r}, which"
                f" is not a parameter of the function (parameters: {', '.join(params) or 'none'})."
                f"{hint}"
            )
        if param in keys_of:
            raise TypeError(
                f"Tool {tool!r}: inputs_from_state fills the parameter {param!r} from both"
                f" {keys_of[param]!r} and {key!r}. Map one state key to it."
            )
        keys_of[param] = key
    return keys_of


def _check_kind(param: inspect.Parameter, tool: str) -> None:
    if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
        stars = "*" if param.kind is param.VAR_POSITIONAL else "**"
        raise TypeError(
            f"Tool {tool!r}: the parameter {stars}{param.name} cannot be shown to a model."
            " Declare each argument as a named, typed parameter."
        )
    if param.kind is param.POSITIONAL_ONLY:
        raise TypeError(
            f"Tool {tool!r}: the parameter {param.name!r} is positional-only, but tools are"
            " called with named arguments. Remove the '/' from the signature."
        )


def _missing_hint(name: str, tool: str) -> str:
    if name in ("self", "cls"):
        return (
            f"Tool {tool!r}: the parameter {name!r} has no type hint. @tool takes a plain"
            " function; for a method, subclass Tool and define run(self, ...)."
        )
    return (
        f"Tool {tool!r}: the parameter {name!r} has no type hint, so the model cannot be told"
        f" what to send. Annotate it, for example `{name}: str`."
    )


def _state_input(key: str, param: inspect.Parameter, hint: Any, tool: str) -> StateInput:
    default = _MISSING if param.default is param.empty else param.default
    adapter = None
    if hint is not _MISSING and hint is not Any:
        try:
            adapter = pydantic.TypeAdapter[Any](hint)
        except (pydantic.PydanticUserError, TypeError) as error:
            raise TypeError(
                f"Tool {tool!r}: pydantic cannot validate the type of {param.name!r} ({error})."
                " Use a JSON type, a dataclass or a pydantic model."
            ) from None
    return StateInput(key, param.name, default, adapter)


# -- the model-facing arguments -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Argument:
    """One parameter the model fills, sent as `param`.

    It is validated under the field name `field` (``p0``, ``p1``...), so that no parameter name
    can clash with a pydantic attribute.
    """

    field: str
    param: str
    hint: Any
    default: Any  # _MISSING when the argument is required
    description: str | None


def _argument(
    index: int, param: inspect.Parameter, hint: Any, docs: Mapping[str, str]
) -> _Argument:
    text, described = _annotated_description(hint)
    description = text or (None if described else docs.get(param.name))
    default = _MISSING if param.default is param.empty else param.default
    return _Argument(f"p{index}", param.name, hint, default, description)


# The plain types: the core schema pydantic builds for each, and its JSON schema type.
_PLAIN: dict[type, tuple[Callable[[], core_schema.CoreSchema], str]] = {
    str: (core_schema.str_schema, "string"),
    int: (core_schema.int_schema, "integer"),
    float: (core_schema.float_schema, "number"),
    bool: (core_schema.bool_schema, "boolean"),
}


def _is_plain(argument: _Argument) -> bool:
    """Whether pydantic-core can validate the argument without a model class.

    That is a plain str, int, float or bool with no default, or a default of exactly that type
    (a finite float).
    """
    hint, default = argument.hint, argument.default
    if not (isinstance(hint, type) and hint in _PLAIN):
        return False
    if default is _MISSING:
        return True
    return type(default) is hint and (hint is not float or math.isfinite(default))


def _plain_arguments(
    tool: str, arguments: list[_Argument]
) -> tuple[Validate, FrozenDict[str, Any]]:
    """The validator and JSON schema of plain arguments, without a pydantic model class.

    The validator is pydantic-core's, over the very core schema `_model_arguments` has pydantic
    build (the model's fields and config), so it accepts, converts and rejects the same input
    with the same errors. Building a model class would import pydantic's schema generation and
    its plugin loader (which imports importlib.metadata, email, zipfile and csv): memory a
    run with plain tools never needed.
    """
    name = f"{tool}_arguments"
    fields: dict[str, core_schema.ModelField] = {}
    properties: dict[str, Any] = {}
    for argument in arguments:
        make, json_type = _PLAIN[argument.hint]
        schema = make()
        prop: dict[str, Any] = {}  # the keys in pydantic's (sorted) order
        if argument.default is not _MISSING:
            schema = core_schema.with_default_schema(schema, default=argument.default)
            prop["default"] = argument.default
        if argument.description is not None:
            prop["description"] = argument.description
        prop["type"] = json_type
        fields[argument.field] = core_schema.model_field(
            schema, validation_alias=argument.param, serialization_alias=argument.param
        )
        properties[argument.param] = prop
    validator = SchemaValidator(
        core_schema.model_fields_schema(fields, model_name=name),
        core_schema.CoreConfig(title=name, extra_fields_behavior="forbid"),
    )

    def validate(args: dict[Any, Any]) -> Mapping[str, Any]:
        values, _, _ = validator.validate_python(args)
        return cast("dict[str, Any]", values)

    required = [argument.param for argument in arguments if argument.default is _MISSING]
    return validate, _object_schema(tool, properties, required, None)


def _model_arguments(
    tool: str, arguments: list[_Argument]
) -> tuple[Validate, FrozenDict[str, Any]]:
    """The validator and JSON schema of any arguments: one pydantic model, ``extra="forbid"``."""
    fields: dict[str, Any] = {}
    for argument in arguments:
        default = PydanticUndefined if argument.default is _MISSING else argument.default
        if argument.description is None:
            info = pydantic.Field(default=default, alias=argument.param)
        else:
            info = pydantic.Field(
                default=default, alias=argument.param, description=argument.description
            )
        fields[argument.field] = (argument.hint, info)
    model = _arguments_model(tool, fields)

    def validate(args: dict[Any, Any]) -> Mapping[str, Any]:
        instance = model.model_validate(args)
        return {argument.field: getattr(instance, argument.field) for argument in arguments}

    return validate, _input_schema(model, tool)


def _arguments_model(tool: str, fields: dict[str, tuple[Any, Any]]) -> type[pydantic.BaseModel]:
    config = pydantic.ConfigDict(extra="forbid")
    try:
        return pydantic.create_model(
            f"{tool}_arguments", __config__=config, **cast("dict[str, Any]", fields)
        )
    except (pydantic.PydanticUserError, TypeError) as error:
        culprit = _unsupported_param(fields)
        where = f"the type of {culprit!r}" if culprit else "a parameter type"
        raise TypeError(
            f"Tool {tool!r}: pydantic cannot validate {where} ({error}). Model-facing parameters"
            " take JSON types, Literal, Enum, dataclasses, TypedDicts and pydantic models."
        ) from None


def _unsupported_param(fields: dict[str, tuple[Any, Any]]) -> str | None:
    for hint, info in fields.values():
        try:
            pydantic.TypeAdapter[Any](hint)
        except (pydantic.PydanticUserError, TypeError):
            return str(cast(FieldInfo, info).alias)
    return None
