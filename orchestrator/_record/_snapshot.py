"""`StateSnapshot`: the frozen value of a State at one moment."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from .._base._json import FrozenDict
from .._base._messages import Message, ToolCall
from .._base._reply import Usage
from .._base._stopped import Stopped
from ._history import HistoryEntry

if TYPE_CHECKING:
    from ._fold import Folded

__all__ = ("StateSnapshot", "snapshot_origin", "with_origin")


@dataclass(frozen=True)
class StateSnapshot:
    """The value of a State at one moment: what `state.snapshot()` returns.

    It is frozen and every field is a pure function of `history`, so
    ``State(history=snap.history).snapshot() == snap``. ``==`` compares the public fields.
    Pass it to `state.restore(snapshot)` to go back to that point. To keep one across
    processes, keep its history.
    """

    history: tuple[HistoryEntry, ...] = ()
    messages: tuple[Message, ...] = ()
    pending_calls: tuple[ToolCall, ...] = ()
    turn: int = 0
    usage: Usage = field(default_factory=Usage)
    extra_data: FrozenDict[str, Any] = field(default_factory=FrozenDict[str, Any])
    finished: bool = False
    answer: Any = None
    stopped: Stopped | None = None
    created_at: datetime | None = field(default=None, compare=False)
    updated_at: datetime | None = field(default=None, compare=False)
    # `state.snapshot()` also sets two plain attributes, `_folded` (the folded value) and
    # `_state_id` (the State that took it), for restore (`with_origin`). They are not fields:
    # the fields are exactly the public ones. Read them with `snapshot_origin`.


def snapshot_origin(snapshot: StateSnapshot) -> tuple[Folded | None, str | None]:
    """The folded value a snapshot was taken from, and the id of its State.

    Both are None for a snapshot made by hand.
    """
    folded = cast("Folded | None", getattr(snapshot, "_folded", None))
    return folded, cast("str | None", getattr(snapshot, "_state_id", None))


def with_origin(snapshot: StateSnapshot, folded: Folded, state_id: str | None) -> StateSnapshot:
    """`snapshot`, marked as taken from the folded value `folded` of the State `state_id`."""
    object.__setattr__(snapshot, "_folded", folded)
    object.__setattr__(snapshot, "_state_id", state_id)
    return snapshot
