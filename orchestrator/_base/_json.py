"""Frozen JSON values: what history holds.

Everything recorded in a State's history is JSON from the moment it is recorded: dicts with string
keys, lists, str, int, float (finite), bool and None. Dicts and lists are frozen (`FrozenDict`,
`FrozenList`): they index, compare, hash and `json.dumps` like the plain ones, and every mutation
raises `TypeError`. `dict(value)` or `list(value)` makes an editable shallow copy, `thaw` a deep
one.

What a store can write and read back is the rule, so a State never holds what it cannot save:
text is valid Unicode (`valid_text` replaces each lone surrogate with U+FFFD), lists and dicts
nest at most `MAX_DEPTH` levels (a value that holds itself never ends, so it is refused too),
and an int has at most `MAX_INT_DIGITS` digits (Python's own limit for reading one back).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, NoReturn, SupportsIndex, TypeAlias, TypeVar, cast, overload

import pydantic

__all__ = (
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "FrozenDict",
    "FrozenList",
    "JSONValue",
    "empty_dict",
    "freeze",
    "freeze_values",
    "same_json",
    "thaw",
    "valid_fields",
    "valid_text",
)

MAX_DEPTH = 100
"""How many levels lists and dicts nest in a recorded value, at most.

Stores read entries with a JSON parser that stops at 200 levels; an entry wraps a value in a
few levels of its own, so a value at this limit always saves and loads.
"""
MAX_INT_DIGITS = 4300
"""How many decimal digits an int has, at most: Python's default limit for converting text."""
_INT_BOUND = 10**MAX_INT_DIGITS

_K = TypeVar("_K")
_V = TypeVar("_V")
_T = TypeVar("_T")


def _read_only(self: object, *args: object, **kwargs: object) -> NoReturn:
    kind = type(self).__name__
    copy = "dict(value)" if isinstance(self, dict) else "list(value)"
    raise TypeError(
        f"{kind} is read-only: recorded values never change. Make an editable"
        f" copy with {copy} (or orchestrator.thaw(value) for a deep copy)."
    )


class FrozenDict(dict[_K, _V]):
    """A read-only dict. Equal to, and serialized like, a plain dict with the same items.

    Building one freezes what it holds, so it only ever holds frozen JSON: a value that is not
    JSON raises `TypeError` naming its key.
    """

    __slots__ = ("_hash", "_height")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self._hash: int | None = None
        frozen = freeze(dict(*args, **kwargs))
        self._height: int = frozen._height
        super().update(frozen)

    def __hash__(self) -> int:  # type: ignore[override]
        if self._hash is None:
            self._hash = hash(frozenset(self.items()))
        return self._hash

    def __repr__(self) -> str:
        return f"FrozenDict({super().__repr__()})"

    def __reduce__(self) -> tuple[Callable[..., FrozenDict[_K, _V]], tuple[dict[_K, _V]]]:
        # Its items were unpickled frozen already: rebuilt as they are, as the fold built it.
        return (_frozen_dict, (dict(self),))

    def __copy__(self) -> FrozenDict[_K, _V]:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenDict[_K, _V]:
        return self

    # Read-only at run time. Type checkers see dict's signatures, so that a FrozenDict can be
    # passed where a dict is expected and its public type stays exact.
    if not TYPE_CHECKING:
        __setitem__ = __delitem__ = __ior__ = _read_only
        clear = pop = popitem = setdefault = update = _read_only


class FrozenList(list[_T]):
    """A read-only list. Equal to, and serialized like, a plain list with the same items.

    Building one freezes what it holds, so it only ever holds frozen JSON.
    """

    __slots__ = ("_hash", "_height")

    def __init__(self, items: Iterable[_T] = (), /) -> None:
        super().__init__()
        self._hash: int | None = None
        frozen = freeze(list(items))
        self._height: int = frozen._height
        super().extend(frozen)

    def __hash__(self) -> int:  # type: ignore[override]
        if self._hash is None:
            self._hash = hash(tuple(self))
        return self._hash

    def __repr__(self) -> str:
        return f"FrozenList({super().__repr__()})"

    def __reduce__(self) -> tuple[Callable[..., FrozenList[_T]], tuple[list[_T]]]:
        return (_frozen_list, (list(self),))

    def __copy__(self) -> FrozenList[_T]:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenList[_T]:
        return self

    @overload
    def __getitem__(self, index: SupportsIndex, /) -> _T: ...
    @overload
    def __getitem__(self, index: slice, /) -> FrozenList[_T]: ...
    def __getitem__(self, index: SupportsIndex | slice, /) -> _T | FrozenList[_T]:
        if isinstance(index, slice):
            return _frozen_list(super().__getitem__(index))
        return super().__getitem__(index)

    if not TYPE_CHECKING:  # read-only at run time, as FrozenDict
        __setitem__ = __delitem__ = __iadd__ = __imul__ = _read_only
        append = extend = insert = pop = remove = clear = sort = reverse = _read_only


JSONValue: TypeAlias = "str | int | float | bool | FrozenDict[str, Any] | FrozenList[Any] | None"
"""A value as a State records it: JSON, its dicts and lists frozen (an answer, a tool's args)."""


def _height_of(items: Iterable[Any]) -> int:
    """How many levels a container of frozen `items` nests: 1 with no list or dict inside."""
    height = 1
    for item in items:
        height = _above(item, height)
    return height


def _above(item: Any, height: int) -> int:
    """`height`, or one more than `item`'s own when that is more: a frozen list or dict's."""
    kind: type[object] = type(item)  # pyright: ignore[reportUnknownVariableType]
    if (kind is FrozenDict or kind is FrozenList) and item._height >= height:
        return item._height + 1
    return height


def _frozen_dict(items: dict[Any, Any], height: int = 0) -> FrozenDict[Any, Any]:
    """A FrozenDict of items that are frozen already (no second pass); `height` if known."""
    new = cast("FrozenDict[Any, Any]", FrozenDict.__new__(FrozenDict))
    # The class's own slots, set as its __init__ sets them (it would freeze the items again).
    height = height or _height_of(items.values())
    new._hash, new._height = None, height  # pyright: ignore[reportPrivateUsage]
    super(FrozenDict, new).update(items)
    return new


def _frozen_list(items: list[Any], height: int = 0) -> FrozenList[Any]:
    """A FrozenList of items that are frozen already (no second pass); `height` if known."""
    new = cast("FrozenList[Any]", FrozenList.__new__(FrozenList))
    # The class's own slots, set as its __init__ sets them (it would freeze the items again).
    height = height or _height_of(items)
    new._hash, new._height = None, height  # pyright: ignore[reportPrivateUsage]
    super(FrozenList, new).extend(items)
    return new


def valid_text(text: str) -> str:
    r"""`text` as a store can write it: each lone surrogate replaced with U+FFFD.

    A lone surrogate (``"\ud83d"``, half of a character) comes from JSON that escapes one half
    only, or from bytes decoded with ``errors="surrogateescape"``. UTF-8 cannot hold it, so a
    State holding one could never be saved. Two surrogates that make a pair become the character
    they encode. Valid text, nearly all of it, is returned as it is: ASCII text after an O(1)
    check, other text after one UTF-8 encode.
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def valid_fields(value: object, *names: str) -> None:
    """Make the text fields `names` of the frozen dataclass `value` valid (see `valid_text`).

    Each field holds a str, None, or a tuple of str; anything else is left for its own check.
    """
    for name in names:
        field: object = getattr(value, name)
        if isinstance(field, str):
            if not field.isascii():
                object.__setattr__(value, name, valid_text(field))
        elif isinstance(field, tuple) and not all(
            isinstance(item, str) and item.isascii() for item in cast("tuple[object, ...]", field)
        ):
            fixed = tuple(
                valid_text(item) if isinstance(item, str) else item
                for item in cast("tuple[object, ...]", field)
            )
            object.__setattr__(value, name, fixed)


def _where(path: str) -> str:
    return path or "the value"


def _too_deep(path: str) -> TypeError:
    where = _where(path)
    if len(where) > 80:
        where = where[:60] + "..." + where[-17:]
    return TypeError(
        f"{where} nests lists and dicts more than {MAX_DEPTH} levels deep (or holds itself),"
        " which a State cannot record: flatten it, or record it as text."
    )


def _too_long(path: str) -> TypeError:
    return TypeError(
        f"{_where(path)} is an int of more than {MAX_INT_DIGITS} digits, which JSON readers"
        " refuse: record it as a str."
    )


def freeze(value: Any, path: str = "") -> Any:
    """Return `value` as frozen JSON, or raise `TypeError` naming the key path that is not JSON.

    Dataclasses and pydantic models become dicts, tuples become lists, text (keys included) is
    made valid (`valid_text`). `path` prefixes the place named in the error, for example
    ``"extra_data"`` gives ``extra_data['notes'][2]``.

    Raises:
        TypeError: A value that is not JSON, a float that is not finite, lists and dicts nested
            more than `MAX_DEPTH` levels (a value that holds itself), an int of more than
            `MAX_INT_DIGITS` digits, or two keys of a dict that are the same text once made
            valid. Never a `RecursionError`.
    """
    try:
        return _freeze(value, path, 0)
    except RecursionError:  # a model_dump or a Mapping of the user's that recursed on its own
        raise _too_deep(path) from None


def freeze_values(values: Mapping[str, Any], path: str) -> FrozenDict[str, Any]:
    """Return named values as a `FrozenDict`, each value frozen and checked by itself.

    For the dicts that hold a State's values by name (`extra_data`, a state update): each value
    may nest `MAX_DEPTH` levels, and the dict holding them is one level more, so a value that
    `freeze` takes is always taken here too.

    Raises:
        TypeError: As `freeze`, or `values` is not a dict.
    """
    if not isinstance(values, Mapping):
        raise TypeError(f"{path} must be a dict of str keys, got {type(values).__name__}.")
    try:
        return _freeze_dict(cast("Mapping[object, Any]", values), path, -1)
    except RecursionError:
        raise _too_deep(path) from None


def _freeze(value: Any, path: str, depth: int) -> Any:
    """`value` frozen; it sits `depth` levels of lists and dicts down in what is frozen."""
    kind: type[object] = type(value)  # pyright: ignore[reportUnknownVariableType]
    if kind is str:
        return value if value.isascii() else valid_text(value)
    if kind is int:
        if -_INT_BOUND < value < _INT_BOUND:
            return value
        raise _too_long(path)
    if kind is bool or value is None:
        return value
    if kind is FrozenDict or kind is FrozenList:
        # Frozen containers only ever hold frozen JSON, so they are taken as they are.
        if depth + value._height > MAX_DEPTH:
            raise _too_deep(path)
        return value
    if kind is float:
        if not math.isfinite(value):
            raise TypeError(
                f"{_where(path)} is {value!r}, which JSON cannot hold: use None or a finite number."
            )
        return value
    if kind is dict or isinstance(value, Mapping):
        return _freeze_dict(cast("Mapping[object, Any]", value), path, depth)
    if isinstance(value, list | tuple):
        return _freeze_list(cast("list[Any] | tuple[Any, ...]", value), path, depth)
    if isinstance(value, enum.Enum):
        raise TypeError(
            f"{_where(path)} is the enum member {value!r}, which is not JSON: record its .value."
        )
    if isinstance(value, pydantic.BaseModel):
        try:
            data = value.model_dump(mode="json")
        except (ValueError, TypeError) as error:  # a cycle, or a field pydantic cannot dump
            raise TypeError(f"{_where(path)} could not be turned into JSON: {error}") from None
        return _freeze(data, path, depth)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return _freeze(fields, path, depth)
    if isinstance(value, bool | int | str):
        # A subclass of a JSON atom that is not an enum: keep its plain value.
        if isinstance(value, bool):
            return bool(value)
        plain = int(value) if isinstance(value, int) else str.__str__(value)
        return _freeze(plain, path, depth)
    if isinstance(value, float):
        return _freeze(float(value), path, depth)
    raise TypeError(
        f"{_where(path)} is a {type(value).__name__}, which is not JSON. Use dicts with string"
        " keys, lists, str, int, float, bool or None (a dataclass or pydantic model is turned into"
        " a dict)."
    )


# An atom item of a list or dict is checked inline, with no call: a call would format its path,
# which only an error uses. The checks are those of `_freeze`.


def _freeze_dict(value: Mapping[object, Any], path: str, depth: int) -> FrozenDict[str, Any]:
    if depth >= MAX_DEPTH:
        raise _too_deep(path)
    items: dict[str, Any] = {}
    height = 1
    renamed = False
    for key, item in value.items():
        if type(key) is not str:
            if not isinstance(key, str):
                raise TypeError(
                    f"{_where(path)} has the key {key!r} of type {type(key).__name__}:"
                    " JSON keys are strings. Convert the key with str()."
                )
            key = str.__str__(key)
        if not key.isascii():
            text = valid_text(key)
            renamed = renamed or text is not key
            key = text
        kind: type[object] = type(item)  # pyright: ignore[reportUnknownVariableType]
        if kind is str:
            items[key] = item if item.isascii() else valid_text(item)
        elif kind is bool or item is None or (kind is int and -_INT_BOUND < item < _INT_BOUND):
            items[key] = item
        else:
            item = items[key] = _freeze(item, f"{path}[{key!r}]", depth + 1)
            height = _above(item, height)
    if renamed and len(items) < len(value):
        raise TypeError(
            f"{_where(path)} has keys that are the same text once their lone surrogates are"
            " replaced with U+FFFD: give its keys distinct, valid text."
        )
    return _frozen_dict(items, height)


def _freeze_list(value: list[Any] | tuple[Any, ...], path: str, depth: int) -> FrozenList[Any]:
    if depth >= MAX_DEPTH:
        raise _too_deep(path)
    items: list[Any] = []
    append = items.append
    height = 1
    for index, item in enumerate(value):
        kind: type[object] = type(item)  # pyright: ignore[reportUnknownVariableType]
        if kind is str:
            append(item if item.isascii() else valid_text(item))
        elif kind is bool or item is None or (kind is int and -_INT_BOUND < item < _INT_BOUND):
            append(item)
        else:
            item = _freeze(item, f"{path}[{index}]", depth + 1)
            append(item)
            height = _above(item, height)
    return _frozen_list(items, height)


def thaw(value: Any) -> Any:
    """Return a deep, editable copy of a frozen JSON value: plain dicts and lists."""
    if isinstance(value, dict):
        return {key: thaw(item) for key, item in cast("dict[str, Any]", value).items()}
    if isinstance(value, list):
        return [thaw(item) for item in cast("list[Any]", value)]
    return value


_EMPTY_DICT: FrozenDict[str, Any] = FrozenDict()


def empty_dict() -> FrozenDict[str, Any]:
    """The shared empty `FrozenDict`."""
    return _EMPTY_DICT


def same_json(a: Any, b: Any) -> bool:
    """Whether two JSON values are the same, types included (``1``, ``1.0`` and ``True`` differ)."""
    if a is b:
        return True
    if type(a) is not type(b) and not (
        (isinstance(a, dict) and isinstance(b, dict))
        or (isinstance(a, list) and isinstance(b, list))
    ):
        return False
    if isinstance(a, dict):
        da = cast("dict[str, Any]", a)
        db = cast("dict[str, Any]", b)
        return da.keys() == db.keys() and all(same_json(da[key], db[key]) for key in da)
    if isinstance(a, list):
        la = cast("list[Any]", a)
        lb = cast("list[Any]", b)
        return len(la) == len(lb) and all(same_json(x, y) for x, y in zip(la, lb, strict=True))
    return bool(a == b)
