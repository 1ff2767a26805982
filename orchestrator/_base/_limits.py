"""`Limits`: what a run and its whole subagent tree may spend."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Literal, TypeAlias, get_args

__all__ = ("LIMIT_NAMES", "LimitName", "Limits")

LimitName: TypeAlias = Literal[
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "cost",
    "requests",
    "tool_calls",
    "children",
    "depth",
    "seconds",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """What a run may spend, counting every subagent below it. Each field is optional.

    Give it to ``Agent(limits=...)``, to one run (``agent.arun(state, limits=...)``) or to an
    agent used as a tool (``agent.as_tool(limits=...)``: the slice a parent gives each child).
    Where several apply, each holds: the tightest one stops the run first.

    Attributes:
        input_tokens: Input tokens of every model request in the tree.
        output_tokens: Output tokens of every reply in the tree.
        total_tokens: Input plus output tokens.
        cost: The cost of the replies, in the currency of the models' `Price` (replies of
            unknown cost count as 0).
        requests: Model requests.
        tool_calls: Tool calls run (a subagent's own calls included).
        children: Subagent States started below the run, at any depth.
        depth: How many levels of subagents may nest below the run (0: none).
        seconds: Wall time of the run, from its start in this call.
    """

    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None
    cost: float | None = None
    requests: int | None = None
    tool_calls: int | None = None
    children: int | None = None
    depth: int | None = None
    seconds: float | None = None

    def __post_init__(self) -> None:
        for item in fields(self):
            value: object = getattr(self, item.name)
            if value is None:
                continue
            whole = item.name not in ("cost", "seconds")
            if (
                isinstance(value, bool)
                or not isinstance(value, int if whole else int | float)
                or (isinstance(value, float) and math.isnan(value))
                or value < 0
            ):
                kind = "an integer" if whole else "a number"
                raise ValueError(
                    f"Limits({item.name}=...) must be {kind} >= 0 or None (no limit), got"
                    f" {value!r}."
                )

    def set(self) -> tuple[tuple[str, float], ...]:
        """The limits given, as (name, maximum) pairs in field order."""
        pairs: list[tuple[str, float]] = []
        for name in LIMIT_NAMES:
            value: float | None = getattr(self, name)
            if value is not None:
                pairs.append((name, value))
        return tuple(pairs)

    def tighter(self, other: Limits | None) -> Limits:
        """Both limits at once: for each field, the lower of the two (None is no limit)."""
        if other is None:
            return self
        values: dict[str, Any] = {}
        for name in LIMIT_NAMES:
            mine, theirs = getattr(self, name), getattr(other, name)
            values[name] = theirs if mine is None else mine if theirs is None else min(mine, theirs)
        return Limits(**values)


LIMIT_NAMES: tuple[LimitName, ...] = get_args(LimitName)
