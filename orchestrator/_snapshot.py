"""`StateSnapshot`: the frozen value of a State at one moment."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ._history import HistoryEntry
from ._json import FrozenDict
from ._messages import Message, ToolCall
from ._reply import Usage
from ._stopped import Stopped

if TYPE_CHECKING:
    from ._fold import Folded

__all__ = ("StateSnapshot",)


@dataclass(frozen=True, slots=True)
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
    # Where it came from, for restore: the folded value and the id of the State that took it.
    _folded: Folded | None = field(default=None, init=False, repr=False, compare=False)
    _state_id: str | None = field(default=None, init=False, repr=False, compare=False)
