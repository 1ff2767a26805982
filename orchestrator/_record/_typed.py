"""Typed data on top of `extra_data`: schemas, merge handlers and validation.

A schema is a dict ``{key: {"type": T, "handler": fn}}`` or a pydantic model class whose fields
may be ``Annotated[T, reducer]``. A handler merges the current value (None when unset) with a new
one; the result is validated against the key's type and stored as frozen JSON.

`merge_value` is that rule, written once: `State.set`, a tool's state update (checked when the
call ends) and the merge of a turn's updates all go through it. `Schema.validate_data` checks
the declared keys of initial or edited data.
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeAlias, cast, get_args, get_origin

import pydantic
import pydantic_core

from .._base._json import freeze, thaw

__all__ = (
    "Handler",
    "Schema",
    "SchemaField",
    "SchemaSource",
    "as_json",
    "merge_lists",
    "merge_value",
    "replace_values",
)

Handler = Callable[[Any, Any], Any]

SchemaSource: TypeAlias = "Mapping[str, Mapping[str, Any]] | type[pydantic.BaseModel]"
"""A typed-data schema as given: ``{key: {"type": T, "handler": fn}}``, or a pydantic model."""

_NOT_JSON_TYPES: tuple[type, ...] = (set, frozenset, tuple, bytes, bytearray)
_ENTRY_KEYS = frozenset({"type", "handler"})


def merge_lists(current: Any, new: Any) -> list[Any]:
    """Append `new` to `current`. None counts as empty; a non-list is wrapped in a one-item list.

    It never changes its inputs: the result is a new list.
    """
    left: list[Any] = [] if current is None else _as_list(current)
    right: list[Any] = [] if new is None else _as_list(new)
    return [*left, *right]


def _as_list(value: Any) -> list[Any]:
    return list(cast("list[Any]", value)) if isinstance(value, list) else [value]


def replace_values(current: Any, new: Any) -> Any:
    """Keep the new value: the default handler for every type that is not a list."""
    return new


def _is_type(tp: Any) -> bool:
    return isinstance(tp, type) or get_origin(tp) is not None or tp is Any


def _check_json_type(tp: Any, key: str) -> None:
    origin = get_origin(tp)
    if tp in _NOT_JSON_TYPES or origin in _NOT_JSON_TYPES:
        shown = getattr(tp, "__name__", None) or repr(tp)
        raise TypeError(
            f"State schema key {key!r}: the type {shown} does not survive a round trip through"
            " JSON (it would come back as another type). Use list[...] or str instead."
        )
    if origin is Literal:
        return
    if origin is Annotated:
        _check_json_type(get_args(tp)[0], key)
        return
    for arg in get_args(tp):
        if arg is not Ellipsis and _is_type(arg):
            _check_json_type(arg, key)


def _is_list_type(tp: Any) -> bool:
    if get_origin(tp) is Annotated:
        return _is_list_type(get_args(tp)[0])
    return tp is list or get_origin(tp) is list


def default_handler(tp: Any) -> Handler:
    """`merge_lists` for list types, `replace_values` for the rest (`list[T] | None` replaces)."""
    return merge_lists if _is_list_type(tp) else replace_values


@dataclass(frozen=True, slots=True)
class SchemaField:
    """One declared key: its type, handler and validator, and the default a model field gives."""

    name: str
    type: Any
    handler: Handler
    adapter: pydantic.TypeAdapter[Any]
    has_default: bool = False
    default: Any = None

    def validate(self, value: Any) -> Any:
        """`value` validated (lax, like a model field) and returned as frozen JSON.

        Raises `ValueError` naming the key, with what pydantic found wrong.
        """
        try:
            checked = self.adapter.validate_python(value)
        except pydantic.ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in issue['loc']) or 'value'}: {issue['msg']}"
                for issue in error.errors()
            )
            raise ValueError(
                f"State key {self.name!r} expects {_type_name(self.type)}, got {value!r}"
                f" ({problems}). Set a value of that type, or change the schema."
            ) from None
        return freeze(self.adapter.dump_python(checked, mode="json"), f"state[{self.name!r}]")


def _type_name(tp: Any) -> str:
    return tp.__name__ if isinstance(tp, type) else repr(tp)


def _adapter(tp: Any, key: str) -> pydantic.TypeAdapter[Any]:
    try:
        return pydantic.TypeAdapter(tp)
    except (pydantic.PydanticSchemaGenerationError, TypeError) as error:
        raise TypeError(
            f"State schema key {key!r}: pydantic cannot validate the type {_type_name(tp)}"
            f" ({error})."
        ) from None


class Schema:
    """A parsed schema: the declared keys, and the object it was made from (`source`)."""

    __slots__ = ("fields", "source")

    def __init__(self, source: Any, fields: Mapping[str, SchemaField]) -> None:
        self.source = source
        self.fields = dict(fields)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and (
            other.source is self.source or other.source == self.source
        )

    def __hash__(self) -> int:
        return id(self.source)

    def field(self, key: str) -> SchemaField:
        """The declared field `key`.

        Raises:
            KeyError: `key` is not declared (the message lists the declared keys).
        """
        field = self.fields.get(key)
        if field is None:
            declared = ", ".join(repr(name) for name in self.fields) or "none"
            close = difflib.get_close_matches(key, list(self.fields), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise KeyError(
                f"{key!r} is not a key of this State's schema (declared: {declared}).{hint}"
                " Add it to the schema to store it."
            )
        return field

    def validate_data(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """The declared keys of `data`, each validated against its type (frozen JSON).

        Other keys are free-form and left out. Raises `ValueError` naming a key whose value its
        type refuses.
        """
        fields = self.fields
        return {
            key: fields[key].validate(thaw(value)) for key, value in data.items() if key in fields
        }

    @classmethod
    def parse(cls, source: Any, reserved: Collection[str], owner: str = "State(schema=)") -> Schema:
        """Check and parse `source`: a dict schema or a pydantic model class.

        Raises `TypeError` for a malformed entry and `ValueError` for a reserved key name.
        """
        if isinstance(source, Schema):
            return source
        if isinstance(source, type) and issubclass(source, pydantic.BaseModel):
            fields = cls._model_fields(source)
        elif isinstance(source, Mapping):
            fields = cls._dict_fields(cast("Mapping[Any, Any]", source))
        else:
            raise TypeError(
                f"{owner} takes a dict {{key: {{'type': T, 'handler': fn}}}} or a pydantic model"
                f" class, got {type(cast(object, source)).__name__}."
            )
        for key in fields:
            if key in reserved:
                raise ValueError(
                    f"{owner}: the key {key!r} is the name of a State attribute and cannot be"
                    f" used for your data. Rename it, for example to 'my_{key}'."
                )
        return cls(source, fields)

    @staticmethod
    def _dict_fields(source: Mapping[Any, Any]) -> dict[str, SchemaField]:
        fields: dict[str, SchemaField] = {}
        for key, entry in source.items():
            if not isinstance(key, str):
                raise TypeError(f"State schema keys are strings, got {key!r}.")
            if not isinstance(entry, Mapping):
                raise TypeError(
                    f"State schema key {key!r} must map to {{'type': T, 'handler': fn}},"
                    f" got {entry!r}."
                )
            entry = cast("Mapping[str, Any]", entry)
            unknown = set(entry) - _ENTRY_KEYS
            if unknown:
                name = sorted(unknown)[0]
                close = difflib.get_close_matches(name, sorted(_ENTRY_KEYS), n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise TypeError(
                    f"State schema key {key!r} has the unknown field {name!r}: an entry takes"
                    f" 'type' and 'handler' only.{hint}"
                )
            if "type" not in entry:
                raise TypeError(f"State schema key {key!r} needs a 'type', e.g. {{'type': list}}.")
            tp = entry["type"]
            if not _is_type(tp):
                raise TypeError(
                    f"State schema key {key!r}: 'type' must be a type such as str or list[int],"
                    f" got {tp!r}."
                )
            handler = entry.get("handler")
            if handler is not None and not callable(handler):
                raise TypeError(
                    f"State schema key {key!r}: 'handler' must be a function"
                    f" handler(current, new) -> merged, got {handler!r}."
                )
            _check_json_type(tp, key)
            fields[key] = SchemaField(key, tp, handler or default_handler(tp), _adapter(tp, key))
        return fields

    @staticmethod
    def _model_fields(model: type[pydantic.BaseModel]) -> dict[str, SchemaField]:
        fields: dict[str, SchemaField] = {}
        for key, info in model.model_fields.items():
            tp: Any = info.annotation
            reducers = [m for m in info.metadata if callable(m) and not isinstance(m, type)]
            if len(reducers) > 1:
                raise TypeError(
                    f"State schema field {key!r} has more than one reducer in Annotated[...]:"
                    " keep the one that merges its values."
                )
            _check_json_type(tp, key)
            adapter = _adapter(Annotated[tp, info], key)
            field = SchemaField(key, tp, reducers[0] if reducers else default_handler(tp), adapter)
            if not info.is_required():
                default = info.get_default(call_default_factory=True)
                field = SchemaField(key, tp, field.handler, adapter, True, field.validate(default))
            fields[key] = field
        return fields


def as_json(key: str, field: SchemaField | None, value: Any) -> Any:
    """`value` as frozen JSON, for the key `key`.

    A declared key (`field`) also takes what pydantic can turn into JSON (a datetime, an enum
    member), since its type validates it. Raises `TypeError` naming the key for a value that is
    not JSON.
    """
    if field is not None:
        with contextlib.suppress(pydantic_core.PydanticSerializationError):
            value = pydantic_core.to_jsonable_python(value)
    return freeze(value, f"state[{key!r}]")


def merge_value(
    schema: Schema | None,
    data: Mapping[str, Any],
    key: str,
    value: Any,
    handler: Handler | None = None,
) -> Any:
    """What `key` holds once `value` is merged into `data`: frozen JSON, validated.

    The merge is `handler` if given, else the key's schema handler, else `replace_values`. The
    handler gets plain copies (`current` is None when the key is unset); its result is
    validated against the key's type when the schema declares it.

    Raises:
        TypeError: `key` is not a str, or a value is not JSON.
        KeyError: `schema` does not declare `key`.
        ValueError: The merged value does not match the key's type.
    """
    if not isinstance(key, str):
        raise TypeError(f"State keys are strings, got {type(key).__name__}.")
    field = None if schema is None else schema.field(key)
    new = thaw(as_json(key, field, value))
    current = thaw(data[key]) if key in data else None
    merge = handler or (field.handler if field is not None else replace_values)
    merged = merge(current, new)
    if field is None:
        return freeze(merged, f"state[{key!r}]")
    return field.validate(merged)
