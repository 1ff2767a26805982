"""Frozen JSON values: what history holds.

Everything recorded in a State's history is JSON from the moment it is recorded: dicts with string
keys, lists, str, int, float (finite), bool and None. Dicts and lists are frozen (`FrozenDict`,
`FrozenList`): they index, compare, hash and `json.dumps` like the plain ones, and every mutation
raises `TypeError`. `dict(value)` or `list(value)` makes an editable shallow copy, `thaw` a deep
one.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, NoReturn, SupportsIndex, TypeAlias, TypeVar, cast, overload

import pydantic

__all__ = ("FrozenDict", "FrozenList", "JSONValue", "empty_dict", "freeze", "same_json", "thaw")

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

    __slots__ = ("_hash",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self._hash: int | None = None
        super().update(freeze(dict(*args, **kwargs)))

    def __hash__(self) -> int:  # type: ignore[override]
        if self._hash is None:
            self._hash = hash(frozenset(self.items()))
        return self._hash

    def __repr__(self) -> str:
        return f"FrozenDict({super().__repr__()})"

    def __reduce__(self) -> tuple[Callable[..., FrozenDict[_K, _V]], tuple[dict[_K, _V]]]:
        return (FrozenDict, (dict(self),))

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

    __slots__ = ("_hash",)

    def __init__(self, items: Iterable[_T] = (), /) -> None:
        super().__init__()
        self._hash: int | None = None
        super().extend(freeze(list(items)))

    def __hash__(self) -> int:  # type: ignore[override]
        if self._hash is None:
            self._hash = hash(tuple(self))
        return self._hash

    def __repr__(self) -> str:
        return f"FrozenList({super().__repr__()})"

    def __reduce__(self) -> tuple[Callable[..., FrozenList[_T]], tuple[list[_T]]]:
        return (FrozenList, (list(self),))

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


def _frozen_dict(items: dict[Any, Any]) -> FrozenDict[Any, Any]:
    """A FrozenDict of items that are frozen already (no second pass)."""
    new = cast("FrozenDict[Any, Any]", FrozenDict.__new__(FrozenDict))
    new._hash = None
    super(FrozenDict, new).update(items)
    return new


def _frozen_list(items: Iterable[Any]) -> FrozenList[Any]:
    """A FrozenList of items that are frozen already (no second pass)."""
    new = cast("FrozenList[Any]", FrozenList.__new__(FrozenList))
    new._hash = None
    super(FrozenList, new).extend(items)
    return new


_ATOMS = (str, int, bool, type(None))


def _where(path: str) -> str:
    return path or "the value"


def freeze(value: Any, path: str = "") -> Any:
    """Return `value` as frozen JSON, or raise `TypeError` naming the key path that is not JSON.

    Dataclasses and pydantic models become dicts, tuples become lists. `path` prefixes the place
    named in the error, for example ``"extra_data"`` gives ``extra_data['notes'][2]``.
    """
    kind: type[object] = type(value)  # pyright: ignore[reportUnknownVariableType]
    if kind in _ATOMS or kind is FrozenDict or kind is FrozenList:
        # Frozen containers only ever hold frozen JSON, so they are taken as they are.
        return value
    if kind is float:
        if not math.isfinite(value):
            raise TypeError(
                f"{_where(path)} is {value!r}, which JSON cannot hold: use None or a finite number."
            )
        return value
    # An atom item is kept without a call: that would format its path, only used in an error.
    if kind is dict or isinstance(value, Mapping):
        items: dict[str, Any] = {}
        for key, item in cast("Mapping[object, Any]", value).items():
            if not isinstance(key, str):
                raise TypeError(
                    f"{_where(path)} has the key {key!r} of type {type(key).__name__}:"
                    " JSON keys are strings. Convert the key with str()."
                )
            items[key] = item if type(item) in _ATOMS else freeze(item, f"{path}[{key!r}]")
        return _frozen_dict(items)
    if isinstance(value, list | tuple):
        items_list = cast("Iterable[Any]", value)
        return _frozen_list(
            item if type(item) in _ATOMS else freeze(item, f"{path}[{i}]")
            for i, item in enumerate(items_list)
        )
    if isinstance(value, enum.Enum):
        raise TypeError(
            f"{_where(path)} is the enum member {value!r}, which is not JSON: record its .value."
        )
    if isinstance(value, pydantic.BaseModel):
        return freeze(value.model_dump(mode="json"), path)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return freeze(fields, path)
    if isinstance(value, bool | int | str):
        # A subclass of a JSON atom that is not an enum: keep its plain value.
        if isinstance(value, bool):
            return bool(value)
        return int(value) if isinstance(value, int) else str(value)
    if isinstance(value, float):
        return freeze(float(value), path)
    raise TypeError(
        f"{_where(path)} is a {type(value).__name__}, which is not JSON. Use dicts with string"
        " keys, lists, str, int, float, bool or None (a dataclass or pydantic model is turned into"
        " a dict)."
    )


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
