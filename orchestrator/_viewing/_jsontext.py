"""JSON text of values nested deeper than Python's recursion limit: the tree of a long chain.

`json.dumps` recurses once per level (twice per State of a tree: its object and its children
list), so a chain of a few hundred subagents raises `RecursionError`. `dumps` gives the text
`json.dumps` gives, written with a list of what is left to write instead of recursion.
"""

from __future__ import annotations

import json
from typing import Any, cast

__all__ = ("dumps",)

DEEPEST_INDENT = 32
"""Lines of nesting deeper than this stop moving right: the text stays linear in size."""


class _Raw(str):
    """Text written as it is (punctuation, line breaks), not as a JSON string."""

    __slots__ = ()


def dumps(value: Any, *, indent: int | None = None) -> str:
    """`value` as JSON text, non-ASCII kept: ``json.dumps(value, ensure_ascii=False, indent=...)``.

    Without `indent` the text is compact (``","`` and ``":"``, as the viewer sends it), written
    by `json.dumps` unless the value is nested too deep for it. With `indent` it is written here
    (`json.dumps` writes indented text in Python too, and recurses), its indentation capped at
    `DEEPEST_INDENT` levels.

    Raises:
        TypeError: A value is not JSON (as `json.dumps` raises).
    """
    if indent is None:
        try:
            return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        except RecursionError:
            pass
    return _deep(value, indent)


def _break(indent: int | None, depth: int) -> str:
    return "" if indent is None else "\n" + " " * (indent * min(depth, DEEPEST_INDENT))


def _deep(value: Any, indent: int | None) -> str:
    colon = ":" if indent is None else ": "
    out: list[str] = []
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, _Raw):
            out.append(item)
        elif isinstance(item, dict) and item:
            members = cast("dict[Any, Any]", item)
            inner, close = _break(indent, depth + 1), _break(indent, depth)
            todo: list[tuple[Any, int]] = []
            for index, (key, member) in enumerate(members.items()):
                key_text = json.dumps(str(key), ensure_ascii=False)
                todo += [(_Raw(("," if index else "") + inner + key_text + colon), depth)]
                todo += [(member, depth + 1)]
            out.append("{")
            pending += reversed([*todo, (_Raw(close + "}"), depth)])
        elif isinstance(item, list | tuple) and item:
            items = cast("list[Any] | tuple[Any, ...]", item)
            inner, close = _break(indent, depth + 1), _break(indent, depth)
            todo = []
            for index, member in enumerate(items):
                todo += [(_Raw(("," if index else "") + inner), depth), (member, depth + 1)]
            out.append("[")
            pending += reversed([*todo, (_Raw(close + "]"), depth)])
        else:  # a leaf, or an empty object or list
            out.append(json.dumps(item, ensure_ascii=False))
    return "".join(out)
