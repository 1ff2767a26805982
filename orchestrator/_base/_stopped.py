"""Why a run is set to stop: the `Stopped*` values of `state.stopped`.

Each one's text (``str(state.stopped)``) says why in the words people use: "answered",
"finished", "turn limit reached", "denied by ...", "waiting for approval of ...". The viewer and
``orchestrator show`` print that text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import Field

from ._json import freeze, valid_fields
from ._messages import ToolCall

__all__ = (
    "AwaitingCall",
    "Stopped",
    "StoppedByApproval",
    "StoppedByFinish",
    "StoppedByLimit",
    "StoppedByPermission",
    "StoppedByUntil",
)

_ANSWERED = "waiting_for_user"  # the default loop's `until`: the model answered


@dataclass(frozen=True, slots=True)
class StoppedByFinish:
    """`finish()` was called; `answer` is what it was given (frozen JSON, or None)."""

    answer: Any = None
    kind: Literal["finish"] = field(default="finish", init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "answer", freeze(self.answer, "the answer"))

    def __str__(self) -> str:
        if self.answer is None:
            return "finished"
        text = json.dumps(self.answer, ensure_ascii=False)
        return f"finished with answer {text if len(text) <= 80 else text[:77] + '...'}"


@dataclass(frozen=True, slots=True)
class StoppedByUntil:
    """The `until` function `name` returned true before a turn.

    The default loop's `until` is ``waiting_for_user``: true when the model replied without
    asking for a tool, so the text of that stop is "answered".
    """

    name: str
    kind: Literal["until"] = field(default="until", init=False, repr=False)

    def __post_init__(self) -> None:
        valid_fields(self, "name")

    def __str__(self) -> str:
        if self.name == _ANSWERED:
            return "answered"
        return f"stopped by {self.name} (it returned true)"


@dataclass(frozen=True, slots=True)
class StoppedByLimit:
    """The run reached a limit: its loop's turns, or one of the `Limits` above it.

    A turn limit (`limit` is ``"turns"``): the loop ran `turns` turns in this call. The model
    was not done: raise `Agent(max_turns=...)` (the default loop's limit, 50 unless set), or
    ``@loop(limit=...)`` for a loop of your own, and run the State again to go on.

    A `Limits` stop: `limit` names the field reached (``"total_tokens"``, ``"cost"``, ...),
    `maximum` its value, `spent` what the subtree had spent when the run stopped, `owner` the
    State whose limit it is (this one, or an ancestor) and `by` the State whose spending
    reached it. Raise the limit (``agent.arun(state, limits=...)``) and run again to go on.
    """

    turns: int | None = None
    limit: str = "turns"
    maximum: float | None = None
    spent: float | None = None
    owner: str | None = None
    by: str | None = None
    kind: Literal["limit"] = field(default="limit", init=False, repr=False)

    def __post_init__(self) -> None:
        valid_fields(self, "limit", "owner", "by")

    def __str__(self) -> str:
        if self.limit == "turns":
            return (
                f"turn limit reached ({self.turns} turns); allow more with"
                " Agent(max_turns=N), or @loop(limit=N) for a loop of your own"
            )
        return (
            f"limit {self.limit}={_number(self.maximum)} of State {self.owner} reached (spent"
            f" {_number(self.spent)}, the last by State {self.by}); raise it with"
            " limits=Limits(...) and run again to go on"
        )


def _number(value: float | None) -> str:
    """`value` as a limit reads: whole numbers without a decimal point."""
    if value is None:
        return "?"
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


@dataclass(frozen=True, slots=True)
class StoppedByPermission:
    """The permission `permission` denied `call` with ``stop=True``."""

    call: ToolCall
    permission: str
    kind: Literal["permission"] = field(default="permission", init=False, repr=False)

    def __post_init__(self) -> None:
        valid_fields(self, "permission")

    def __str__(self) -> str:
        return f"denied by {self.permission}: the call {self.call.name} ({self.call.id})"


@dataclass(frozen=True, slots=True)
class AwaitingCall:
    """A tool call that waits for a person to approve or deny it.

    `call` belongs to the State `state_id`: this State, or a subagent below it. `via` is the
    call of this State that leads there (the subagent's call), None for a call of this State.
    `reason` is what the permission that deferred it said.
    """

    state_id: str
    call: ToolCall
    reason: str | None = None
    via: str | None = None

    def __post_init__(self) -> None:
        valid_fields(self, "state_id", "reason", "via")


@dataclass(frozen=True, slots=True)
class StoppedByApproval:
    """A permission deferred `calls` to a person: the run stopped until they are decided.

    Decide each with `orchestrator.approve` or `orchestrator.deny` (in any process, on the
    State loaded from its store), then run the State again: approved calls run, denied ones get
    error results. A subagent's waiting calls are listed at its parent too (`via`).
    """

    calls: tuple[AwaitingCall, ...]
    kind: Literal["approval"] = field(default="approval", init=False, repr=False)

    def __str__(self) -> str:
        names = ", ".join(f"{item.call.name} ({item.call.id})" for item in self.calls)
        return f"waiting for approval of {names}"


Stopped: TypeAlias = (
    StoppedByFinish | StoppedByUntil | StoppedByLimit | StoppedByPermission | StoppedByApproval
)
AnyStopped: TypeAlias = Annotated[Stopped, Field(discriminator="kind")]
