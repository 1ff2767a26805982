"""What a run went through besides its calls: costs, approvals, recoveries, resumes and stops.

The viewer and ``orchestrator show`` both show these facts; they are read here, once, from the
public history entries of a State.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from orchestrator import (
    ApprovalEntry,
    AskEntry,
    ErrorEntry,
    ModelReplyEntry,
    RunStartEntry,
    State,
    StopEntry,
    StoppedByApproval,
    ToolResultEntry,
)

__all__ = ("Cost", "Waiting", "cost_of", "marks", "waits")

_INTERRUPTED = "Interrupted: the process stopped"  # how a recovery takes a request back


@dataclass(frozen=True, slots=True)
class Cost:
    """The cost of some model requests: the dollars of the priced ones, how many had no price."""

    dollars: float = 0.0
    priced: int = 0
    unpriced: int = 0

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            self.dollars + other.dollars, self.priced + other.priced, self.unpriced + other.unpriced
        )

    def text(self) -> str:
        """``$0.0120``, ``$0.0120 + 2 unpriced``, ``2 unpriced``, or ``-`` for no request."""
        if self.unpriced and not self.priced:
            return f"{self.unpriced} unpriced"
        if not self.priced:
            return "-"
        shown = f"${self.dollars:.4f}"
        return f"{shown} + {self.unpriced} unpriced" if self.unpriced else shown

    def data(self) -> dict[str, Any]:
        """The cost as JSON, with its text."""
        return {
            "dollars": round(self.dollars, 10),
            "priced": self.priced,
            "unpriced": self.unpriced,
            "text": self.text(),
        }


def cost_of(state: State) -> Cost:
    """The cost of `state`'s own model requests and asks (its subagents' not included)."""
    total = Cost()
    for entry in state.history:
        if not isinstance(entry, ModelReplyEntry | AskEntry):
            continue
        usage = entry.content.usage
        if usage.cost is not None:
            total += Cost(usage.cost, priced=max(usage.requests, 1))
        elif usage.requests or isinstance(entry, ModelReplyEntry):
            total += Cost(unpriced=max(usage.requests, 1))
    return total


@dataclass(frozen=True, slots=True)
class Waiting:
    """A call of this State that waited for a person: since when, why, and the decision."""

    call_id: str
    since: datetime
    reason: str | None = None
    decided_at: datetime | None = None
    approved: bool | None = None
    by: str | None = None
    why: str | None = None  # the reason the person gave

    def data(self, offset: Callable[[datetime], Any]) -> dict[str, Any]:
        """As JSON, its moments passed through `offset` (a datetime to seconds)."""
        return {
            "since": offset(self.since),
            "decided": None if self.decided_at is None else offset(self.decided_at),
            "reason": self.reason,
            "approved": self.approved,
            "by": self.by,
            "why": self.why,
        }


def waits(state: State) -> dict[str, Waiting]:
    """The calls of `state` that waited for a person, by this State's call id.

    A subagent's waiting call is listed under the call of this State that leads to it (`via`).
    """
    history = state.history
    leads = {
        item.call.id: item.via or item.call.id
        for entry in history
        if isinstance(entry, StopEntry) and isinstance(entry.content, StoppedByApproval)
        for item in entry.content.calls
    }
    found: dict[str, Waiting] = {}
    asked: dict[str, datetime] = {}
    for entry in history:
        if isinstance(entry, ModelReplyEntry):
            for call in entry.tool_calls:
                asked[call.id] = entry.at
        elif isinstance(entry, StopEntry) and isinstance(entry.content, StoppedByApproval):
            for item in entry.content.calls:
                call_id = item.via or item.call.id
                if call_id not in found:
                    found[call_id] = Waiting(call_id, asked.get(call_id, entry.at), item.reason)
        elif isinstance(entry, ApprovalEntry):
            record = entry.content
            waiting = found.get(leads.get(record.call_id, record.call_id))
            if waiting is not None:
                found[waiting.call_id] = replace(
                    waiting,
                    decided_at=entry.at,
                    approved=record.approved,
                    by=record.by,
                    why=record.reason,
                )
    return found


def marks(state: State) -> list[dict[str, Any]]:
    """The moments of note in `state`'s history, in order, as ``{"kind", "at", "text"}``.

    ``recovered``: a crash cut a turn off and a load closed it (a request taken back, a call
    left ``unknown``); ``resumed``: a run after the first; ``stopped``: why a run stopped, in
    words (a limit hit, a denial, a wait for approval, an answer); ``approval``: a decision.
    """
    found: list[dict[str, Any]] = []
    runs = 0
    for entry in state.history:
        if isinstance(entry, RunStartEntry):
            runs += 1
            if runs > 1:
                found.append(_mark("resumed", entry.at, f"run {runs} started"))
        elif isinstance(entry, ErrorEntry) and entry.content.startswith(_INTERRUPTED):
            found.append(_mark("recovered", entry.at, "a crash cut the model request off"))
        elif isinstance(entry, ToolResultEntry) and entry.outcome == "unknown":
            text = f"a crash cut the call {entry.call.name} ({entry.call.id}) off"
            found.append(_mark("recovered", entry.at, text))
        elif isinstance(entry, StopEntry):
            found.append(_mark("stopped", entry.at, str(entry.content)))
        elif isinstance(entry, ApprovalEntry):
            record = entry.content
            said = "approved" if record.approved else "denied"
            who = f" by {record.by}" if record.by else ""
            why = f": {record.reason}" if record.reason else ""
            found.append(_mark("approval", entry.at, f"{record.call_id} {said}{who}{why}"))
    return found


def _mark(kind: str, at: datetime, text: str) -> dict[str, Any]:
    return {"kind": kind, "at": at, "text": text}
