"""Why a run is set to stop: the `Stopped*` values of `state.stopped`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import Field

from ._json import freeze
from ._messages import ToolCall

__all__ = (
    "Stopped",
    "StoppedByFinish",
    "StoppedByLimit",
    "StoppedByPermission",
    "StoppedByUntil",
)


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
    """The `until` function `name` returned true before a turn."""

    name: str
    kind: Literal["until"] = field(default="until", init=False, repr=False)

    def __str__(self) -> str:
        return f"stopped: {self.name} returned true"


@dataclass(frozen=True, slots=True)
class StoppedByLimit:
    """The loop ran `turns` turns, its limit, in this call.

    The model was not done: raise `Agent(max_turns=...)` (the default loop's limit, 50 unless
    set), or ``@loop(limit=...)`` for a loop of your own, and run the State again to go on.
    """

    turns: int
    kind: Literal["limit"] = field(default="limit", init=False, repr=False)

    def __str__(self) -> str:
        return (
            f"stopped: reached the limit of {self.turns} turns; allow more with"
            " Agent(max_turns=N), or @loop(limit=N) for a loop of your own"
        )


@dataclass(frozen=True, slots=True)
class StoppedByPermission:
    """The permission `permission` denied `call` with ``stop=True``."""

    call: ToolCall
    permission: str
    kind: Literal["permission"] = field(default="permission", init=False, repr=False)

    def __str__(self) -> str:
        return f"stopped: {self.permission} denied the call {self.call.name} ({self.call.id})"


Stopped: TypeAlias = StoppedByFinish | StoppedByUntil | StoppedByLimit | StoppedByPermission
AnyStopped: TypeAlias = Annotated[Stopped, Field(discriminator="kind")]
