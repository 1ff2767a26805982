"""Run leases kept in memory (`MemoryStore`): who runs which State, and cancels asked of them.

The services sharing one `MemoryStore` are in one process, so its clock is the monotonic one
and a lock keeps the table whole across threads. See `orchestrator.AsyncRunLeases`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import anyio.lowlevel

__all__ = ("MemoryLeases", "check_lease")


def check_lease(state_id: object, owner: object, seconds: object) -> None:
    """Refuse arguments no lease can have, with what to pass instead."""
    if not isinstance(state_id, str) or not state_id:
        raise TypeError(f"state_id must be a State id (a non-empty str), got {state_id!r}.")
    if not isinstance(owner, str) or not owner:
        raise TypeError(f"owner must name the service (a non-empty str), got {owner!r}.")
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        raise ValueError(f"seconds must be a positive number, got {seconds!r}.")


@dataclass(slots=True)
class _Lease:
    owner: str
    until: float
    cancel: bool = False


class MemoryLeases:
    """The run leases of one in-memory store (see `orchestrator.AsyncRunLeases`)."""

    __slots__ = ("_leases", "_leases_lock")

    def __init__(self) -> None:
        self._leases: dict[str, _Lease] = {}
        self._leases_lock = threading.Lock()

    async def aclaim_run(self, state_id: str, owner: str, *, seconds: float) -> str | None:
        """Take the lease of `state_id` for `owner`; the owner holding it, if another does."""
        check_lease(state_id, owner, seconds)
        await anyio.lowlevel.checkpoint()
        now = time.monotonic()
        with self._leases_lock:
            held = self._leases.get(state_id)
            if held is not None and held.owner != owner and held.until > now:
                return held.owner
            self._leases[state_id] = _Lease(owner, now + seconds)
            return None

    async def arenew_runs(
        self, owner: str, state_ids: Sequence[str], *, seconds: float
    ) -> frozenset[str]:
        """Extend `owner`'s leases; the ids to stop (cancel asked, or held by another now)."""
        for state_id in state_ids:
            check_lease(state_id, owner, seconds)
        await anyio.lowlevel.checkpoint()
        now = time.monotonic()
        stop: set[str] = set()
        with self._leases_lock:
            for state_id in state_ids:
                held = self._leases.get(state_id)
                if held is None or held.owner != owner:
                    stop.add(state_id)
                    continue
                held.until = now + seconds
                if held.cancel:
                    stop.add(state_id)
        return frozenset(stop)

    async def arelease_run(self, state_id: str, owner: str) -> None:
        """Give back `owner`'s lease of `state_id`."""
        check_lease(state_id, owner, 1)
        await anyio.lowlevel.checkpoint()
        with self._leases_lock:
            held = self._leases.get(state_id)
            if held is not None and held.owner == owner:
                del self._leases[state_id]

    async def arequest_cancel(self, state_id: str) -> str | None:
        """Ask the owner running `state_id` to cancel it; that owner, or None."""
        check_lease(state_id, "-", 1)
        await anyio.lowlevel.checkpoint()
        with self._leases_lock:
            held = self._leases.get(state_id)
            if held is None or held.until <= time.monotonic():
                return None
            held.cancel = True
            return held.owner

    async def arun_owners(self, state_ids: Sequence[str]) -> dict[str, str]:
        """The owners of the leases of `state_ids` that have not run out."""
        await anyio.lowlevel.checkpoint()
        now = time.monotonic()
        with self._leases_lock:
            return {
                state_id: held.owner
                for state_id in state_ids
                if (held := self._leases.get(state_id)) is not None and held.until > now
            }
