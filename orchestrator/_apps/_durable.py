"""Durable events: the events a State's stored history stands for, entry by entry.

A live run reports its events as they happen (`agent.events`). A follower in another process has
only what is stored; these functions give it the same events from the history, so a run can be
followed, and followed again after a restart, from the store alone. Each entry gives the events
of the facts it records, with the same kind and payload as the live ones:

| entry | events |
| --- | --- |
| `run_start` | `ChildStarted` (when it links the State to a parent's tool call), `RunStarted` |
| `model_reply` | `ModelReplied` |
| `tool_result` | `ToolEnded` (a crash's cut-off calls too, closed ``unknown`` on load) |
| approval `stop` | `ToolDeferred` per waiting call of the State, `ApprovalNeeded`, `RunEnded` |
| `stop` of anything else | `RunEnded`, at once or at the entry that closes the turn's last call |
| `error` in a run | `RunEnded` with the error |

Live only: `TextDelta` (a reply's text as it streams: the reply itself is stored, as
`ModelReplied.text`), `Retrying` (a failed request tried again: only its final outcome is
stored), `RateLimitWaited` (a request waiting for a rate limit) and `ToolStarted` (the history
records a call's request and its result, not the moment it began). Other entries (a request
sent, messages, data, decisions, `ask`) give no event.

Where the two streams differ, beside those kinds:

- `seq` is 0 here (a stream numbers what it sends); `at` is the entry's recorded time, so
  loading the State again gives equal events.
- A `ToolDeferred` comes with its turn's approval stop, after the results of the turn's other
  calls, where the live one comes when its permission decides (before them).
- A run ends (`RunEnded`) at its `stop` or `error` entry: a `finish` inside a turn ends it
  once the turn's last call has its result. A loop body that catches a failed model request
  and goes on ends durably at that error; one that returns without recording a stop has no
  durable end, and the State's next `RunStarted` follows.
- A process that died mid-run records no end. Loading the State closes the run's cut-off calls
  (`ToolEnded`, outcome ``unknown``) and takes back a request that waited on the model (an error
  entry: `RunEnded` with it): facts no live stream had, since the process that ran them died.
- A child run linked to a call running elsewhere (a runner's `Link`, e.g. Ray) has its
  `ChildStarted` here; no live stream reports one.

Every event gets an `EventId` from its State, its entry's index and its place among the entry's
events: a cursor that names one event and survives restarts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, TypedDict

from .._base._json import thaw
from .._base._stopped import StoppedByApproval
from .._record._fold import EMPTY, Folded, fold, replay
from ._events import (
    ApprovalNeeded,
    ChildStarted,
    Event,
    ModelReplied,
    RunEnded,
    RunStarted,
    ToolDeferred,
    ToolEnded,
    awaiting_infos,
    call_info,
    limit_info,
    usage_info,
)

if TYPE_CHECKING:
    from .._record._history import HistoryEntry
    from .._record._state import State

__all__ = (
    "LIVE_ONLY",
    "DurableEvent",
    "EventId",
    "HistoryEvents",
    "Progress",
    "durable_events",
    "history_events",
    "progress_after",
)

_EVENT_ID = re.compile(r"([A-Za-z0-9_-]{1,128}):([0-9]+):([0-9]+)")

LIVE_ONLY: frozenset[str] = frozenset({"text", "retry", "tool_start"})
"""The event kinds a history never gives: text deltas, retry notices and tool starts."""


@dataclass(frozen=True, slots=True, order=True)
class EventId:
    """Where a durable event comes from: its State, its entry's index, its place in the entry.

    ``str(event_id)`` is ``"state_id:index:ordinal"`` (a State id has no colon);
    `EventId.parse` reads it back.
    """

    state_id: str
    index: int
    ordinal: int

    def __str__(self) -> str:
        return f"{self.state_id}:{self.index}:{self.ordinal}"

    @classmethod
    def parse(cls, text: str) -> EventId:
        """The id ``str(event_id)`` gave.

        Raises:
            ValueError: `text` is not ``"state_id:index:ordinal"`` with two integers >= 0.
        """
        match = _EVENT_ID.fullmatch(text)
        if match is not None:
            return cls(match[1], int(match[2]), int(match[3]))
        raise ValueError(
            f"{text!r} is not an event id: it reads 'state_id:index:ordinal', e.g. 'a1b2:7:0'."
        )


@dataclass(frozen=True, slots=True)
class DurableEvent:
    """One event a stored entry stands for, with its stable `id`."""

    id: EventId
    event: Event


@dataclass(frozen=True, slots=True, eq=False)
class Progress:
    """What a State's entries read so far leave for the next one: its value and its run.

    `value` is the State's folded value, `running` whether a run started and has not ended,
    and `ending` whether that run recorded its stop and ends once its turn is closed.
    """

    value: Folded = EMPTY
    running: bool = False
    ending: bool = False


START = Progress()
"""The progress before a State's first entry."""


def durable_events(
    entry: HistoryEntry,
    *,
    state_id: str,
    parent_id: str | None = None,
    parent_call_id: str | None = None,
    before: Progress = START,
) -> tuple[tuple[DurableEvent, ...], Progress]:
    """The events `entry` stands for, and the progress after it. Pure: nothing is changed.

    `entry` is the next entry of the State `state_id` (child of `parent_id`'s call
    `parent_call_id`) after the ones `before` read; its index is its `seq`.

    Raises:
        ValueError: `entry` cannot follow the entries `before` read.
    """
    value = fold(before.value, entry, _Lookup(before.value))
    place = _Place(state_id, parent_id, parent_call_id, entry)
    running, ending = before.running, before.ending
    events: list[Event] = []
    if entry.kind == "run_start":
        start = entry.content
        if start.parent_call_id is not None:
            events.append(
                ChildStarted(
                    at=entry.at,
                    state_id=state_id,
                    parent_id=start.parent_id,
                    parent_call_id=start.parent_call_id,
                    call_id=start.parent_call_id,
                    agent=start.agent,
                )
            )
        events.append(RunStarted(**place.fields(), agent=start.agent))
        running, ending = True, False
    elif entry.kind == "model_reply":
        message = entry.content.message
        events.append(
            ModelReplied(
                **place.fields(),
                text=message.text,
                tool_calls=[call_info(call) for call in message.tool_calls],
                usage=usage_info(entry.content.usage),
            )
        )
    elif entry.kind == "tool_result":
        events.append(
            ToolEnded(
                **place.fields(),
                call_id=entry.call.id,
                name=entry.call.name,
                outcome=entry.outcome,
                result=entry.content.text,
                is_error=entry.content.is_error,
                child_ids=list(entry.child_ids),
            )
        )
    elif entry.kind == "stop" and running:
        stopped = entry.content
        if isinstance(stopped, StoppedByApproval):
            events.extend(
                ToolDeferred(
                    **place.fields(),
                    call_id=item.call.id,
                    name=item.call.name,
                    args=thaw(item.call.args),
                    reason=item.reason,
                )
                for item in stopped.calls
                if item.via is None and item.state_id == state_id
            )
            events.append(ApprovalNeeded(**place.fields(), calls=awaiting_infos(stopped)))
            events.append(place.ended(value))
            running = False
        ending = running
    elif entry.kind == "error" and running:
        events.append(place.ended(value, error=entry.content))
        running = ending = False
    if ending and not value.open_turn:
        events.append(place.ended(value))
        running = ending = False
    return place.number(events), Progress(value, running, ending)


def progress_after(entries: Iterable[HistoryEntry], before: Progress = START) -> Progress:
    """The progress after `entries` read from `before`: `durable_events`' without the events.

    A follower that resumes in the middle of a State's history reads the entries before the
    point this way: the same fold and run state, no event made and dropped.

    Raises:
        ValueError: An entry cannot follow the ones before it.
    """
    value, running, ending = before.value, before.running, before.ending
    for entry in entries:
        value = fold(value, entry, _Lookup(value))
        kind = entry.kind
        if kind == "run_start":
            running, ending = True, False
        elif kind == "stop" and running:
            if isinstance(entry.content, StoppedByApproval):
                running = False
            ending = running
        elif kind == "error" and running:
            running = ending = False
        if ending and not value.open_turn:
            running = ending = False
    return Progress(value, running, ending)


class _Lookup:
    """The value after the first `n` entries read: what a restore entry folds back to."""

    __slots__ = ("value",)

    def __init__(self, value: Folded) -> None:
        self.value = value

    def __call__(self, n: int) -> Folded:
        return replay(self.value.entries[:n])


class _Common(TypedDict):
    """What every event of one entry has."""

    at: datetime
    state_id: str
    parent_id: str | None
    parent_call_id: str | None


class _Place:
    """The State and entry the events of one entry are about."""

    __slots__ = ("entry", "parent_call_id", "parent_id", "state_id")

    def __init__(
        self,
        state_id: str,
        parent_id: str | None,
        parent_call_id: str | None,
        entry: HistoryEntry,
    ) -> None:
        self.state_id = state_id
        self.parent_id = parent_id
        self.parent_call_id = parent_call_id
        self.entry = entry

    def fields(self) -> _Common:
        return {
            "at": self.entry.at,
            "state_id": self.state_id,
            "parent_id": self.parent_id,
            "parent_call_id": self.parent_call_id,
        }

    def ended(self, value: Folded, error: str | None = None) -> RunEnded:
        """The end of the run, with the State's value after the entry (as live `RunEnded`)."""
        stopped = None if error is not None else value.stopped
        answer = value.answer if value.answer is not None else value.last_text
        return RunEnded(
            at=self.entry.at,
            state_id=self.state_id,
            parent_id=self.parent_id,
            parent_call_id=self.parent_call_id,
            answer=thaw(answer) if error is None else None,
            stopped=None if stopped is None else str(stopped),
            stop_kind=None if stopped is None else stopped.kind,
            limit=limit_info(stopped),
            error=error,
            usage=usage_info(value.usage),
        )

    def number(self, events: list[Event]) -> tuple[DurableEvent, ...]:
        index = self.entry.seq
        return tuple(
            DurableEvent(EventId(self.state_id, index, ordinal), event)
            for ordinal, event in enumerate(events)
        )


class HistoryEvents:
    """The durable events of one State, read entry by entry in order: `durable_events` kept.

    Give it the State's entries as they are stored (`read`), from the first; it keeps the
    progress between them.
    """

    __slots__ = ("parent_call_id", "parent_id", "progress", "state_id")

    def __init__(
        self, state_id: str, *, parent_id: str | None = None, parent_call_id: str | None = None
    ) -> None:
        self.state_id: str = state_id
        self.parent_id: str | None = parent_id
        self.parent_call_id: str | None = parent_call_id
        self.progress: Progress = START

    @property
    def position(self) -> int:
        """How many entries were read: the index of the next one."""
        return len(self.progress.value.entries)

    def read(self, entry: HistoryEntry) -> tuple[DurableEvent, ...]:
        """The events of `entry`, the State's next entry.

        Raises:
            ValueError: `entry` is not the next entry (its `seq` is not `position`), or cannot
                follow the ones read.
        """
        events, self.progress = durable_events(
            entry,
            state_id=self.state_id,
            parent_id=self.parent_id,
            parent_call_id=self.parent_call_id,
            before=self.progress,
        )
        return events

    def read_all(self, entries: Iterable[HistoryEntry]) -> list[DurableEvent]:
        """The events of `entries`, read in order."""
        return [event for entry in entries for event in self.read(entry)]


def history_events(state: State) -> list[DurableEvent]:
    """The durable events of `state`'s whole history (a live State or one a store loaded)."""
    reader = HistoryEvents(state.id, parent_id=state.parent_id, parent_call_id=state.parent_call_id)
    return reader.read_all(state.history)
