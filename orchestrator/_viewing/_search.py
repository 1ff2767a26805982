"""Searching the runs of a store: the filters of ``/api/runs?q=&agent=&status=&since=&until=``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from urllib.parse import parse_qs

__all__ = ("RunFilter",)

_KEYS = ("q", "agent", "status", "since", "until", "limit")


@dataclass(frozen=True, slots=True)
class RunFilter:
    """Which runs to list: each filter given must match (all when none is).

    `text` is found, ignoring case, in a run's title, id, agent or status; `agent` is the
    agent's name; `status` begins the status (``answered``, ``turn limit``, ``waiting for
    approval``, ...); `since` and `until` bound when the run was last updated.
    """

    text: str = ""
    agent: str = ""
    status: str = ""
    since: datetime | None = None
    until: datetime | None = None

    @classmethod
    def parse(cls, query: str) -> RunFilter:
        """The filter a query string asks for.

        Raises:
            ValueError: An unknown key, or a date that is not ISO 8601.
        """
        given = {key: values[-1].strip() for key, values in parse_qs(query).items()}
        unknown = sorted(set(given) - set(_KEYS))
        if unknown:
            raise ValueError(
                f"Unknown filter {unknown[0]!r}: /api/runs takes {', '.join(_KEYS)}"
                " (for example ?q=refund&status=answered&since=2026-12-01)."
            )
        return cls(
            text=given.get("q", "").lower(),
            agent=given.get("agent", ""),
            status=given.get("status", "").lower(),
            since=_moment(given.get("since", ""), "since", end=False),
            until=_moment(given.get("until", ""), "until", end=True),
        )

    @property
    def empty(self) -> bool:
        """Whether nothing is filtered."""
        return self == RunFilter()

    def matches(self, run: dict[str, Any]) -> bool:
        """Whether the run (as `info_data` has it, its agent included) passes every filter."""
        if self.agent and run.get("agent") != self.agent:
            return False
        if self.status and not str(run.get("status", "")).startswith(self.status):
            return False
        updated = _parsed(run.get("updated_at"))
        if self.since is not None and (updated is None or updated < self.since):
            return False
        if self.until is not None and (updated is None or updated >= self.until):
            return False
        if self.text:
            fields = (run.get("title"), run.get("id"), run.get("agent"), run.get("status"))
            return any(self.text in str(value).lower() for value in fields if value)
        return True


def _moment(text: str, name: str, *, end: bool) -> datetime | None:
    """An ISO date or time, in UTC when it names no zone; a date `end`s after its last second."""
    if not text:
        return None
    try:
        if len(text) == 10:
            day = date.fromisoformat(text)
            moment = datetime.combine(day + timedelta(days=1 if end else 0), time(), UTC)
        else:
            moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{name} must be an ISO date or time such as 2026-12-01 or 2026-12-01T14:30,"
            f" got {text!r}."
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _parsed(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    moment = datetime.fromisoformat(value)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
