"""The contract of a store that keeps run leases (`orchestrator.AsyncRunLeases`).

Public through `stores.contract`. Mix `LeaseContract` into a `StoreContract` subclass; it uses
`FollowContract`'s `writer_url` hook (the URL another process opens the store with) when the
class has one, to check that a second handle on the store (another connection, as another
process has) sees the same leases and that claims made at once have one winner.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import anyio
import pytest

from orchestrator import AsyncRunLeases

__all__ = ("LeaseContract",)

_T = TypeVar("_T")

SHORT = 0.3
"""Seconds of a lease that is let run out."""
CLAIMERS = 6
"""How many handles claim one State at once."""


def _run(func: Callable[[], Awaitable[_T]]) -> _T:
    """`func()` on a new event loop (asyncio: every store's async methods run there)."""
    return anyio.run(func)


class LeaseContract:
    """The tests every store with run leases passes; mix it into a contract class."""

    @staticmethod
    def leases(store: Any) -> AsyncRunLeases:
        """`store` as run leases (it must keep them)."""
        assert isinstance(store, AsyncRunLeases), f"{type(store).__name__} keeps no run leases"
        return store

    def other_handles(self, store: Any, count: int) -> list[Any]:
        """`count` more handles on `store`'s data: new stores opened by its URL, or itself."""
        from stores import open_store

        url_of = getattr(self, "writer_url", None)
        url = None if url_of is None else url_of(store)
        if url is None:
            return [store] * count
        return [open_store(url) for _ in range(count)]

    def test_a_lease_has_one_owner_until_given_back(self, store: Any) -> None:
        leases = self.leases(store)

        async def check() -> None:
            assert await leases.aclaim_run("run-1", "alpha", seconds=30) is None
            assert await leases.aclaim_run("run-1", "beta", seconds=30) == "alpha"
            assert await leases.aclaim_run("run-1", "alpha", seconds=30) is None  # its own
            assert await leases.arun_owners(["run-1", "run-2"]) == {"run-1": "alpha"}
            await leases.arelease_run("run-1", "beta")  # not beta's: nothing happens
            assert await leases.arun_owners(["run-1"]) == {"run-1": "alpha"}
            await leases.arelease_run("run-1", "alpha")
            assert await leases.arun_owners(["run-1"]) == {}
            assert await leases.aclaim_run("run-1", "beta", seconds=30) is None

        _run(check)

    def test_renewing_says_which_runs_to_stop(self, store: Any) -> None:
        leases = self.leases(store)

        async def check() -> None:
            await leases.aclaim_run("kept", "alpha", seconds=30)
            await leases.aclaim_run("asked", "alpha", seconds=30)
            assert await leases.arenew_runs("alpha", ["kept", "asked"], seconds=30) == frozenset()
            assert await leases.arequest_cancel("asked") == "alpha"
            assert await leases.arequest_cancel("nobody-runs-it") is None
            stop = await leases.arenew_runs("alpha", ["kept", "asked", "never"], seconds=30)
            assert stop == {"asked", "never"}
            assert await leases.arenew_runs("alpha", [], seconds=30) == frozenset()
            assert await leases.arun_owners([]) == {}
            # Taking it again (after the cancelled run ended) drops the old request.
            await leases.arelease_run("asked", "alpha")
            assert await leases.aclaim_run("asked", "alpha", seconds=30) is None
            assert await leases.arenew_runs("alpha", ["asked"], seconds=30) == frozenset()

        _run(check)

    def test_a_lease_nobody_renews_runs_out(self, store: Any) -> None:
        leases = self.leases(store)

        async def check() -> None:
            assert await leases.aclaim_run("dying", "dead", seconds=SHORT) is None
            assert await leases.aclaim_run("dying", "alive", seconds=30) == "dead"
            await anyio.sleep(SHORT * 1.5)
            assert await leases.arun_owners(["dying"]) == {}
            assert await leases.arequest_cancel("dying") is None
            assert await leases.aclaim_run("dying", "alive", seconds=30) is None
            assert await leases.arenew_runs("dead", ["dying"], seconds=30) == {"dying"}

        _run(check)

    def test_leases_refuse_bad_arguments(self, store: Any) -> None:
        leases = self.leases(store)

        async def check() -> None:
            with pytest.raises(TypeError, match="owner"):
                await leases.aclaim_run("run", "", seconds=1)
            with pytest.raises(ValueError, match="seconds"):
                await leases.aclaim_run("run", "me", seconds=-1)
            with pytest.raises(TypeError, match="state_id"):
                await leases.arelease_run(cast("str", None), "me")

        _run(check)

    def test_another_handle_sees_the_leases_and_one_claim_wins(self, store: Any) -> None:
        handles = self.other_handles(store, CLAIMERS)
        leases = self.leases(store)
        try:
            _run(lambda: leases.aclaim_run("shared", "first", seconds=30))
            seen = _run(lambda: self.leases(handles[0]).arun_owners(["shared"]))
            assert seen == {"shared": "first"}
            won: list[str | None] = [None] * CLAIMERS
            start = threading.Barrier(CLAIMERS)

            def claim(index: int) -> None:
                start.wait()
                holder = _run(
                    lambda: self.leases(handles[index]).aclaim_run(
                        "raced", f"claimer-{index}", seconds=30
                    )
                )
                won[index] = holder or f"claimer-{index}"

            threads = [threading.Thread(target=claim, args=(i,)) for i in range(CLAIMERS)]
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + 60
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
            assert len(set(won)) == 1  # every claimer names the one that won
            assert _run(lambda: leases.arun_owners(["raced"])) == {"raced": won[0]}
        finally:
            for handle in handles:
                if handle is not store:
                    handle.close()
