"""Run leases: which process runs a State now, and a cancel asked of it from elsewhere.

A service that runs States (`orchestrator.apps.Runs`) holds a lease on each State it runs, in
the store every process shares, and renews it while the run goes on. Another process reads
the leases to tell a run that runs somewhere (its owner renews it) from one that stopped or
whose process died (its lease ran out), refuses to start a State another process runs, and
asks the owner to cancel a run (`arequest_cancel`): the request is recorded in the lease, and
the owner sees it when it next renews, cancels the run, records that in the State's history
and gives the lease back.

A lease is not a State's value: it says who runs it, not what it holds, and nothing in a
State's history depends on it. A store without leases still runs agents; a service on it runs
and cancels only its own runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

__all__ = ("AsyncRunLeases",)


@runtime_checkable
class AsyncRunLeases(Protocol):
    """A store that keeps run leases (optional): who runs which State, and cancels asked.

    Times are the store's: `seconds` counts from when the store takes the call. `owner` names
    one service in one process (a random token it makes when it starts).
    """

    async def aclaim_run(self, state_id: str, owner: str, *, seconds: float) -> str | None:
        """Take the lease of `state_id` for `owner`, for `seconds`; None once taken.

        A lease that ran out, or `owner`'s own, is taken; a cancel asked of an earlier lease
        is dropped with it. Returns the owner holding it when another one does (nothing
        changes then).
        """
        ...

    async def arenew_runs(
        self, owner: str, state_ids: Sequence[str], *, seconds: float
    ) -> frozenset[str]:
        """Extend `owner`'s leases of `state_ids` to `seconds` from now.

        Returns the ids among them whose run another process asked to cancel, and those
        `owner` no longer holds (taken by another once they ran out): the owner stops them.
        """
        ...

    async def arelease_run(self, state_id: str, owner: str) -> None:
        """Give back `owner`'s lease of `state_id` (nothing happens if it holds none)."""
        ...

    async def arequest_cancel(self, state_id: str) -> str | None:
        """Ask the owner running `state_id` to cancel it; that owner, or None if none runs it."""
        ...

    async def arun_owners(self, state_ids: Sequence[str]) -> dict[str, str]:
        """The owners whose leases of `state_ids` have not run out, by State id."""
        ...
