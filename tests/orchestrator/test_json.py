"""Frozen JSON values: FrozenDict, FrozenList, freeze and thaw."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import enum
import json
import math
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import orchestrator
from orchestrator import FrozenDict, FrozenList, State, thaw

# Private: freeze is the unit under test here (the public thaw is its inverse).
from orchestrator._base._json import MAX_DEPTH, MAX_INT_DIGITS, freeze, freeze_values, valid_text
from tests.doubles import Color, is_a, type_of


def _sample() -> Any:
    return freeze({"a": 1, "b": [1, 2, {"c": None}], "d": {"e": "f", "g": [True, 1.5]}})


def _contains_frozen(value: Any) -> bool:
    if isinstance(value, FrozenDict | FrozenList):
        return True
    if isinstance(value, dict):
        return any(_contains_frozen(item) for item in value.values())  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    if isinstance(value, list):
        return any(_contains_frozen(item) for item in value)  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    return False


# -- FrozenDict --------------------------------------------------------------------------------


def test_frozen_dict_reads_like_a_dict() -> None:
    value = FrozenDict[str, Any]({"a": 1, "b": 2})
    assert value["a"] == 1
    assert value.get("c", 3) == 3
    assert list(value) == ["a", "b"]
    assert list(value.items()) == [("a", 1), ("b", 2)]
    assert len(value) == 2
    assert "a" in value
    assert is_a(value, dict)
    with pytest.raises(KeyError):
        value["missing"]


def test_frozen_dict_equals_plain_dict() -> None:
    assert FrozenDict[str, Any]({"a": 1, "b": [1]}) == {"a": 1, "b": [1]}
    assert {"a": 1} == FrozenDict[str, Any]({"a": 1})  # noqa: SIM300 - the reflected ==
    assert FrozenDict[str, Any]({"a": 1}) != {"a": 2}
    assert _sample() == {"a": 1, "b": [1, 2, {"c": None}], "d": {"e": "f", "g": [True, 1.5]}}


def test_frozen_dict_hash_is_stable_and_by_value() -> None:
    a = _sample()
    b = _sample()
    assert a is not b
    assert hash(a) == hash(b)
    assert hash(a) == hash(a)
    assert len({a, b}) == 1
    assert {a: "x"}[b] == "x"
    assert hash(FrozenDict[str, Any]({"a": 1, "b": 2})) == hash(
        FrozenDict[str, Any]({"b": 2, "a": 1})
    )


def test_frozen_dict_json_dumps_like_a_dict() -> None:
    plain = {"a": 1, "b": [1, 2, {"c": None}], "d": {"e": "f", "g": [True, 1.5]}}
    assert json.dumps(_sample()) == json.dumps(plain)
    assert json.dumps(_sample(), sort_keys=True, indent=2) == json.dumps(
        plain, sort_keys=True, indent=2
    )


def _dict_mutations() -> list[tuple[str, Callable[[FrozenDict[str, Any]], object]]]:
    def setitem(d: FrozenDict[str, Any]) -> None:
        d["x"] = 1

    def delitem(d: FrozenDict[str, Any]) -> None:
        del d["a"]

    def ior(d: FrozenDict[str, Any]) -> None:
        d |= {"x": 1}

    return [
        ("setitem", setitem),
        ("delitem", delitem),
        ("ior", ior),
        ("clear", lambda d: d.clear()),
        ("pop", lambda d: d.pop("a")),
        ("pop-default", lambda d: d.pop("missing", None)),
        ("popitem", lambda d: d.popitem()),
        ("setdefault", lambda d: d.setdefault("x", 1)),
        ("setdefault-existing", lambda d: d.setdefault("a", 1)),
        ("update", lambda d: d.update({"x": 1})),
        ("update-kwargs", lambda d: d.update(x=1)),
    ]


@pytest.mark.parametrize(
    "mutate", [m for _, m in _dict_mutations()], ids=[name for name, _ in _dict_mutations()]
)
def test_frozen_dict_every_mutation_raises(
    mutate: Callable[[FrozenDict[str, Any]], object],
) -> None:
    value: FrozenDict[str, Any] = FrozenDict[str, Any]({"a": 1, "b": 2})
    with pytest.raises(TypeError) as info:
        mutate(value)
    message = str(info.value)
    assert "dict(value)" in message
    assert "orchestrator.thaw" in message
    assert value == {"a": 1, "b": 2}


def test_frozen_dict_dict_copy_is_editable() -> None:
    value = _sample()
    copied = dict(value)
    assert type_of(copied) is dict
    copied["new"] = 1
    del copied["a"]
    assert copied == {"b": [1, 2, {"c": None}], "d": {"e": "f", "g": [True, 1.5]}, "new": 1}
    assert value == {"a": 1, "b": [1, 2, {"c": None}], "d": {"e": "f", "g": [True, 1.5]}}


def test_frozen_dict_or_gives_a_plain_dict() -> None:
    merged = FrozenDict[str, Any]({"a": 1}) | {"b": 2}
    assert merged == {"a": 1, "b": 2}
    merged["c"] = 3  # a new, editable dict
    assert merged["c"] == 3


def test_frozen_dict_repr_names_the_type() -> None:
    assert repr(FrozenDict[str, Any]({"a": 1})) == "FrozenDict({'a': 1})"


# -- FrozenList --------------------------------------------------------------------------------


def test_frozen_list_reads_like_a_list() -> None:
    value = FrozenList[Any]([1, 2, 3, 2])
    assert value[0] == 1
    assert value[-1] == 2
    assert value.index(2) == 1
    assert value.count(2) == 2
    assert len(value) == 4
    assert 3 in value
    assert list(reversed(value)) == [2, 3, 2, 1]
    assert sorted(value) == [1, 2, 2, 3]
    assert isinstance(value, list)


def test_frozen_list_slice_is_frozen_too() -> None:
    value = FrozenList[Any]([1, 2, 3])
    part = value[1:]
    assert part == [2, 3]
    assert is_a(part, FrozenList)
    with pytest.raises(TypeError):
        part.append(4)


def test_frozen_list_equals_plain_list() -> None:
    assert FrozenList[Any]([1, [2]]) == [1, [2]]
    assert [1, 2] == FrozenList[Any]([1, 2])  # noqa: SIM300 - the reflected ==
    assert FrozenList[Any]([1, 2]) != [2, 1]


def test_frozen_list_hash_is_by_value() -> None:
    a = freeze([1, {"a": [2]}])
    b = freeze([1, {"a": [2]}])
    assert hash(a) == hash(b)
    assert len({a, b}) == 1


def test_frozen_list_json_dumps_like_a_list() -> None:
    plain = [1, "two", [3.5, None], {"k": False}]
    assert json.dumps(freeze(plain)) == json.dumps(plain)


def _list_mutations() -> list[tuple[str, Callable[[FrozenList[Any]], object]]]:
    def setitem(v: FrozenList[Any]) -> None:
        v[0] = 9

    def setslice(v: FrozenList[Any]) -> None:
        v[0:1] = [9]

    def delitem(v: FrozenList[Any]) -> None:
        del v[0]

    def delslice(v: FrozenList[Any]) -> None:
        del v[:]

    def iadd(v: FrozenList[Any]) -> None:
        v += [4]

    def imul(v: FrozenList[Any]) -> None:
        v *= 2

    return [
        ("setitem", setitem),
        ("setslice", setslice),
        ("delitem", delitem),
        ("delslice", delslice),
        ("iadd", iadd),
        ("imul", imul),
        ("append", lambda v: v.append(4)),
        ("extend", lambda v: v.extend([4])),
        ("insert", lambda v: v.insert(0, 4)),
        ("pop", lambda v: v.pop()),
        ("remove", lambda v: v.remove(1)),
        ("clear", lambda v: v.clear()),
        ("sort", lambda v: v.sort()),
        ("reverse", lambda v: v.reverse()),
    ]


@pytest.mark.parametrize(
    "mutate", [m for _, m in _list_mutations()], ids=[name for name, _ in _list_mutations()]
)
def test_frozen_list_every_mutation_raises(mutate: Callable[[FrozenList[Any]], object]) -> None:
    value: FrozenList[Any] = FrozenList[Any]([3, 1, 2])
    with pytest.raises(TypeError) as info:
        mutate(value)
    message = str(info.value)
    assert "list(value)" in message
    assert "orchestrator.thaw" in message
    assert value == [3, 1, 2]


def test_frozen_list_list_copy_is_editable() -> None:
    value = freeze([1, [2, 3]])
    copied = list(value)
    assert type_of(copied) is list
    copied.append(4)
    copied.sort(key=str)
    assert value == [1, [2, 3]]
    assert len(copied) == 3


def test_frozen_list_plus_gives_a_plain_list() -> None:
    joined = FrozenList[int]([1]) + [2]  # noqa: RUF005 - the operator is what is tested
    assert joined == [1, 2]
    joined.append(3)
    assert joined == [1, 2, 3]


def test_frozen_list_repr_names_the_type() -> None:
    assert repr(FrozenList[Any]([1])) == "FrozenList([1])"


# -- pickle and copy ---------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickle_round_trip_keeps_frozen_types(protocol: int) -> None:
    value = _sample()
    loaded = pickle.loads(pickle.dumps(value, protocol=protocol))
    assert loaded == value
    assert type_of(loaded) is FrozenDict
    assert type_of(loaded["b"]) is FrozenList
    assert type_of(loaded["b"][2]) is FrozenDict
    assert hash(loaded) == hash(value)
    with pytest.raises(TypeError):
        loaded["x"] = 1
    with pytest.raises(TypeError):
        loaded["b"].append(1)


def test_pickle_round_trip_of_a_frozen_list() -> None:
    value = freeze([{"a": 1}, [2]])
    loaded = pickle.loads(pickle.dumps(value))
    assert loaded == value
    assert type_of(loaded) is FrozenList
    with pytest.raises(TypeError):
        loaded.append(3)


@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy])
def test_copy_and_deepcopy_keep_frozen_types(copier: Callable[[Any], Any]) -> None:
    value = _sample()
    copied = copier(value)
    assert copied == value
    assert type_of(copied) is FrozenDict
    assert type_of(copied["b"]) is FrozenList
    with pytest.raises(TypeError):
        copied["x"] = 1
    # Deep-copying a structure that holds frozen values also works.
    outer = copier({"inner": value, "list": freeze([1, 2])})
    assert outer == {"inner": value, "list": [1, 2]}


# -- thaw --------------------------------------------------------------------------------------


def test_thaw_is_exported_and_deep() -> None:
    assert orchestrator.thaw is thaw
    value = _sample()
    thawed = thaw(value)
    assert thawed == value
    assert type_of(thawed) is dict
    assert type_of(thawed["b"]) is list
    assert type_of(thawed["b"][2]) is dict
    assert type_of(thawed["d"]["g"]) is list
    assert not _contains_frozen(thawed)
    thawed["b"][2]["c"] = 5
    thawed["d"]["g"].append(0)
    assert value == {"a": 1, "b": [1, 2, {"c": None}], "d": {"e": "f", "g": [True, 1.5]}}


def test_thaw_of_atoms_is_identity() -> None:
    for atom in (None, True, 0, 1.5, "s"):
        assert thaw(atom) == atom


# -- freeze ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Point:
    x: int
    y: int
    tags: tuple[str, ...] = ()


class Person(pydantic.BaseModel):
    name: str
    born: datetime.date
    friends: list[str] = []


def test_freeze_plain_json_gives_frozen_containers() -> None:
    value = freeze({"a": [1, {"b": "c"}]})
    assert type_of(value) is FrozenDict
    assert type_of(value["a"]) is FrozenList
    assert type_of(value["a"][1]) is FrozenDict


@pytest.mark.parametrize("atom", [None, True, False, 0, -3, 2**70, 1.5, -0.0, "", "héllo"])
def test_freeze_keeps_atoms(atom: object) -> None:
    frozen = freeze(atom)
    assert frozen == atom
    assert type(frozen) is type(atom)


def test_freeze_dataclass_becomes_dict() -> None:
    value = freeze(Point(1, 2, ("a", "b")))
    assert value == {"x": 1, "y": 2, "tags": ["a", "b"]}
    assert type_of(value) is FrozenDict
    assert type_of(value["tags"]) is FrozenList


def test_freeze_pydantic_model_becomes_json_dict() -> None:
    value = freeze(Person(name="Ada", born=datetime.date(1815, 12, 10), friends=["Charles"]))
    assert value == {"name": "Ada", "born": "1815-12-10", "friends": ["Charles"]}
    assert type_of(value) is FrozenDict


def test_freeze_tuple_becomes_list() -> None:
    value = freeze((1, (2, 3), [4, (5,)]))
    assert value == [1, [2, 3], [4, [5]]]
    assert type_of(value) is FrozenList
    assert type_of(value[1]) is FrozenList
    assert type_of(value[2][1]) is FrozenList


def test_freeze_nested_mix() -> None:
    value = freeze({"points": [Point(0, 1)], "pair": (Point(2, 3), None), "meta": {"n": 1}})
    assert value == {
        "points": [{"x": 0, "y": 1, "tags": []}],
        "pair": [{"x": 2, "y": 3, "tags": []}, None],
        "meta": {"n": 1},
    }
    assert not isinstance(thaw(value)["pair"], tuple)


def test_freeze_does_not_share_input_containers() -> None:
    inner = [1, 2]
    source = {"inner": inner}
    value = freeze(source)
    inner.append(3)
    source["other"] = [0]
    assert value == {"inner": [1, 2]}


class Level(enum.IntEnum):
    HIGH = 1


class Weird:
    pass


@pytest.mark.parametrize(
    "bad",
    [
        {1, 2},
        frozenset({1}),
        b"bytes",
        bytearray(b"x"),
        Path("/tmp/x"),
        datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC),
        datetime.date(2024, 1, 1),
        Color.RED,
        Level.HIGH,
        object(),
        Weird(),
        float("nan"),
        float("inf"),
        float("-inf"),
        complex(1, 2),
    ],
    # The same id in every process (xdist's workers must collect alike): no memory addresses.
    ids=lambda bad: f"{type(bad).__name__}-instance" if " at 0x" in repr(bad) else repr(bad),
)
def test_freeze_non_json_raises_type_error_naming_the_path(bad: object) -> None:
    with pytest.raises(TypeError) as info:
        freeze({"a": [0, bad]}, "extra_data")
    assert "extra_data['a'][1]" in str(info.value)


@pytest.mark.parametrize("key", [1, None, ("t",), 1.5, True])
def test_freeze_non_str_key_raises_naming_the_path(key: object) -> None:
    with pytest.raises(TypeError) as info:
        freeze({"a": [0, {key: 1}]}, "extra_data")
    message = str(info.value)
    assert "extra_data['a'][1]" in message
    assert repr(key) in message


def test_freeze_non_json_at_top_level_says_what_it_is() -> None:
    with pytest.raises(TypeError, match="set"):
        freeze({1, 2})


def test_freeze_non_json_inside_a_dataclass_names_the_field() -> None:
    @dataclasses.dataclass
    class Holder:
        blob: bytes

    with pytest.raises(TypeError) as info:
        freeze({"h": Holder(b"x")}, "extra_data")
    assert "extra_data['h']['blob']" in str(info.value)


def test_state_extra_data_non_json_names_the_key_path() -> None:
    with pytest.raises(TypeError) as info:
        State(extra_data={"a": [1, {2, 3}]})
    assert "extra_data['a'][1]" in str(info.value)


def test_hand_built_frozen_dict_is_deeply_frozen_when_recorded() -> None:
    inner = [1]
    state = State(extra_data=FrozenDict[str, Any]({"a": inner}))
    inner.append(2)
    assert state.extra_data == {"a": [1]}
    stored: Any = state.extra_data["a"]
    with pytest.raises(TypeError):
        stored.append(3)
    assert state.extra_data == {"a": [1]}


@pytest.mark.parametrize(
    "build",
    [
        lambda: FrozenDict[str, Any]({"a": {1, 2}}),
        lambda: FrozenDict[str, Any]({"a": FrozenList[Any]([b"raw"])}),
        lambda: FrozenList[Any]([object()]),
        lambda: FrozenDict[Any, Any]({1: "non-str key"}),
    ],
    ids=["set-in-dict", "bytes-in-list", "object-in-list", "int-key"],
)
def test_hand_built_frozen_value_with_non_json_is_refused(build: Callable[[], Any]) -> None:
    # Either the FrozenDict/FrozenList constructor or freeze must refuse it: history holds JSON.
    with pytest.raises(TypeError):
        freeze({"a": build()}, "extra_data")
    with pytest.raises(TypeError):
        State(extra_data={"a": build()})


def test_state_extra_data_is_frozen() -> None:
    state = State(extra_data={"a": [1, {"b": 2}]})
    data = state.extra_data
    assert data == {"a": [1, {"b": 2}]}
    with pytest.raises(TypeError, match="read-only"):
        data["a"] = 2
    with pytest.raises(TypeError, match="read-only"):
        data["a"].append(3)
    assert state.extra_data == {"a": [1, {"b": 2}]}


# -- property: freeze/thaw round trip of JSON ----------------------------------------------------

_json_atoms: st.SearchStrategy[Any] = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)


def _extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(children, max_size=5) | st.dictionaries(
        st.text(max_size=8), children, max_size=5
    )


json_values: st.SearchStrategy[Any] = st.recursive(_json_atoms, _extend, max_leaves=30)


def _only_plain(value: Any) -> bool:
    if isinstance(value, dict):
        return type(value) is dict and all(_only_plain(v) for v in value.values())  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    if isinstance(value, list):
        return type(value) is list and all(_only_plain(v) for v in value)  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    return True


def _same_types(a: Any, b: Any) -> bool:
    """Equal and of the same JSON types throughout (``1``, ``1.0`` and ``True`` differ)."""
    if isinstance(a, dict):
        if not isinstance(b, dict) or a.keys() != b.keys():  # pyright: ignore[reportUnknownMemberType]
            return False
        return all(_same_types(a[k], b[k]) for k in a)  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    if isinstance(a, list):
        if not isinstance(b, list) or len(a) != len(b):  # pyright: ignore[reportUnknownArgumentType]
            return False
        return all(_same_types(x, y) for x, y in zip(a, b, strict=True))  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    if isinstance(a, float) and math.isnan(a):
        return False
    return type(a) is type(b) and a == b


@settings(database=None, max_examples=200, deadline=None)
@given(json_values)
def test_freeze_thaw_round_trip_property(value: Any) -> None:
    frozen = freeze(value)
    assert frozen == value
    assert _same_types(frozen, value)
    assert json.dumps(frozen) == json.dumps(value)
    thawed = thaw(frozen)
    assert thawed == value
    assert _same_types(thawed, value)
    assert _only_plain(thawed)
    if isinstance(value, dict | list):
        assert not _contains_frozen(thawed)
        assert is_a(frozen, (FrozenDict, FrozenList))
        assert hash(frozen) == hash(freeze(value))  # frozen containers are hashable


# -- what a store can hold: valid text, bounded nesting, ints it reads back --------------------


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        ("\ud83d", "\ufffd"),  # half of an emoji, as JSON "\ud83d" decodes
        ("a\ude00b", "a\ufffdb"),
        ("caf\udce9", "caf\ufffd"),  # b"caf\xe9" decoded with errors="surrogateescape"
        ("\ude00\ud83d", "\ufffd\ufffd"),  # the halves in the wrong order are no pair
        ("\ud83d\ude00!", "\U0001f600!"),  # a pair written as two halves is the character
    ],
)
def test_valid_text_replaces_lone_surrogates(text: str, valid: str) -> None:
    assert valid_text(text) == valid
    valid_text(text).encode("utf-8")  # a store can write it


@pytest.mark.parametrize(
    "text", ["", "plain ascii", "héllo wörld", "日本語", "\U0001f600", "\ufffd"]
)
def test_valid_text_keeps_valid_text_as_it_is(text: str) -> None:
    assert valid_text(text) is text


def test_freeze_replaces_lone_surrogates_in_values_and_keys() -> None:
    value = freeze({"k\ud83d": ["v\udc80", {"\ude00": "x"}], "ok": "fine"})
    assert value == {"k\ufffd": ["v\ufffd", {"\ufffd": "x"}], "ok": "fine"}
    json.dumps(value, ensure_ascii=False).encode("utf-8")


def test_freeze_refuses_keys_that_become_the_same_text() -> None:
    with pytest.raises(TypeError, match=r"extra_data\['a'\] has keys that are the same text"):
        freeze({"a": dict([("\ud83d", 1), ("\ufffd", 2)])}, "extra_data")


def _nested(levels: int, inner: Any = 1) -> Any:
    """A value of `levels` lists, one inside the other, around `inner`."""
    value = inner
    for _ in range(levels):
        value = [value]
    return value


def test_freeze_takes_the_documented_depth() -> None:
    value = freeze(_nested(MAX_DEPTH))
    assert value == _nested(MAX_DEPTH)


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 1_000, 100_000])
def test_freeze_refuses_deeper_values_without_recursion_error(levels: int) -> None:
    with pytest.raises(TypeError, match=f"more than {MAX_DEPTH} levels deep") as info:
        freeze({"a": _nested(levels)}, "extra_data")
    assert str(info.value).startswith("extra_data['a'][0][0]")


def test_freeze_refuses_a_value_that_holds_itself() -> None:
    cyclic: dict[str, Any] = {"name": "loop"}
    cyclic["self"] = cyclic
    looped: list[Any] = [1]
    looped.append(looped)
    for value in (cyclic, looped):
        with pytest.raises(TypeError, match="holds itself"):
            freeze(value, "the result")


def test_freeze_refuses_a_dataclass_and_a_model_that_hold_themselves() -> None:
    @dataclasses.dataclass
    class Node:
        next: Any = None

    node = Node()
    node.next = node

    class Tree(pydantic.BaseModel):
        children: list[Any] = []

    tree = Tree()
    tree.children.append(tree)
    for value in (node, tree):
        with pytest.raises(TypeError, match="the result"):
            freeze(value, "the result")


def test_freeze_counts_the_levels_of_values_frozen_before() -> None:
    # Wrapping a recorded value again and again must stop at the limit, not grow past what a
    # store can read back.
    value = freeze(_nested(MAX_DEPTH - 1))
    value = freeze([value])
    assert value == _nested(MAX_DEPTH)
    with pytest.raises(TypeError, match=f"more than {MAX_DEPTH} levels"):
        freeze([value], "state['chain']")
    with pytest.raises(TypeError, match=f"more than {MAX_DEPTH} levels"):
        FrozenList([value])


def test_freeze_values_takes_each_value_at_the_limit() -> None:
    value = freeze(_nested(MAX_DEPTH))
    data = freeze_values({"deep": value, "flat": 1}, "extra_data")
    assert data == {"deep": _nested(MAX_DEPTH), "flat": 1}
    with pytest.raises(TypeError, match=r"extra_data\['deep'\]"):
        freeze_values({"deep": [value]}, "extra_data")
    with pytest.raises(TypeError, match="must be a dict"):
        freeze_values(cast("Any", [1]), "extra_data")


def test_frozen_levels_survive_pickle_and_slices() -> None:
    value = freeze([_nested(MAX_DEPTH - 1), 1])
    for copy_of in (pickle.loads(pickle.dumps(value)), value[:1]):
        assert copy_of == value[:1] or copy_of == value
        with pytest.raises(TypeError, match=f"more than {MAX_DEPTH} levels"):
            freeze([copy_of])


def test_freeze_takes_ints_up_to_the_documented_digits() -> None:
    largest = 10**MAX_INT_DIGITS - 1
    assert freeze([largest, -largest]) == [largest, -largest]


@pytest.mark.parametrize(
    "big", [10**MAX_INT_DIGITS, -(10**5000)], ids=["4301-digits", "-5001-digits"]
)
def test_freeze_refuses_longer_ints(big: int) -> None:
    with pytest.raises(TypeError, match=r"extra_data\['n'\] is an int of more than"):
        freeze({"n": big}, "extra_data")
    with pytest.raises(TypeError, match="record it as a str"):
        freeze(big)


def test_freeze_turns_a_recursion_error_of_the_value_into_a_type_error() -> None:
    class Endless(dict[str, Any]):
        def items(self) -> Any:
            return Endless().items()

    with pytest.raises(TypeError, match="the result"):
        freeze(Endless(a=1), "the result")


def test_freeze_values_turns_a_recursion_error_into_a_type_error() -> None:
    class Endless(dict[str, Any]):
        def items(self) -> Any:
            return Endless().items()

    with pytest.raises(TypeError, match="extra_data"):
        freeze_values({"a": Endless(a=1)}, "extra_data")
