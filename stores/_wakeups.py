"""`Wakeups`: tasks of this process waiting for a store's saves, woken by the save itself.

A follower that only polls sees a save late (up to the poll's longest interval) and costs a
look at the store each interval while nothing happens. A store that saves in this process
knows at once what it saved: it wakes the followers of that State and of its tree here, and
they read. Another process's saves still need the bounded poll (`poll_entries`), except where
the store has its own notification (PostgreSQL ``LISTEN/NOTIFY``).

A save may run in a worker thread (a sync store's `save`, an async twin offloaded) or on
another event loop than the follower's: the wake is handed to the follower's loop without
waiting for it (`loop.call_soon_threadsafe` on asyncio, `TrioToken.run_sync_soon` on trio).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import weakref
from collections.abc import Callable, Generator, Hashable, Iterable
from contextlib import contextmanager
from typing import Any, cast

import anyio
import anyio.lowlevel

__all__ = ("Waiter", "Wakeups")


def _scheduler() -> Callable[[Callable[[], None]], object]:
    """The running loop's way to take a callback from another thread, without waiting.

    Both raise `RuntimeError` once the loop has ended.
    """
    native = anyio.lowlevel.current_token().native_token
    if isinstance(native, asyncio.AbstractEventLoop):
        return native.call_soon_threadsafe
    return cast("Any", native).run_sync_soon


class Waiter:
    """One task's wait for saves of the keys it watches (`Wakeups.watching`)."""

    __slots__ = ("_event", "_soon", "_thread", "_woken")

    def __init__(self) -> None:
        self._event = anyio.Event()
        self._soon = _scheduler()
        self._thread = threading.get_ident()
        self._woken = False

    def wake(self) -> None:
        """Wake the wait from any thread, without waiting for its loop (`Wakeups.wake`).

        `Wakeups` calls it under its lock; a wake that comes when one is already pending
        adds nothing.
        """
        if self._woken:
            return
        self._woken = True
        event = self._event
        if threading.get_ident() == self._thread:
            event.set()  # the saver runs on the waiter's loop
            return
        with contextlib.suppress(RuntimeError):  # the loop has ended: nobody waits any more
            self._soon(event.set)

    async def wait(self, longest: float | None = None) -> bool:
        """Wait for a wake since the last wait (or since watching began); whether one came.

        It returns at once when a save woke it meanwhile, and after `longest` seconds (None:
        no limit) if none did: the bound of a poll, not a deadline. A cancellation ends it at
        once.
        """
        with anyio.move_on_after(math.inf if longest is None else longest):
            await self._event.wait()
        woken = self._event.is_set()
        if woken:
            self._event = anyio.Event()
            self._woken = False
        return woken


class Wakeups:
    """The tasks of this process waiting for saves, by key; a save wakes those of its keys.

    A store keeps one and calls `wake` once a save is durable, with the keys a follower may
    watch (a State's id, its tree's root id). `saved` does it for a store that knows a State's
    parent but not its root: it wakes the State and the ancestors this process saw saved.
    Thread-safe; a wake never waits for the woken loops.

    Example:
        ```python
        wakeups = Wakeups()
        with wakeups.watching("run-1") as waiter:
            while not (found := await read()):  # read after watching: no save is missed
                await waiter.wait()
        # ... and in the store, once a save of "run-1" committed: wakeups.wake(["run-1"])
        ```
    """

    __slots__ = ("__weakref__", "_links", "_lock", "_most_links", "_waiters")

    def __init__(self, links: int = 16_384) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[Hashable, set[Waiter]] = {}
        self._links: dict[str, str] = {}  # State id -> parent id, the most recent last
        self._most_links = links

    def __repr__(self) -> str:
        return f"<Wakeups keys={len(self._waiters)}>"

    @classmethod
    def shared(cls, place: str) -> Wakeups:
        """The `Wakeups` of every store of this process that keeps its data at `place`.

        `place` names the storage (a store's `url`: an SQLite file, a folder): two store
        objects opened on the same file then wake each other's followers. It lives while a
        store holds it.
        """
        with _SHARED_LOCK:
            found = _SHARED.get(place)
            if found is None:
                found = _SHARED[place] = cls()
            return found

    @contextmanager
    def watching(self, *keys: Hashable) -> Generator[Waiter, None, None]:
        """A `Waiter` woken by each save of any of `keys`, while the block runs.

        Read what you wait for inside the block, after it began: a save between that read and
        the wait then makes the wait return at once.
        """
        waiter = Waiter()
        with self._lock:
            for key in keys:
                self._waiters.setdefault(key, set()).add(waiter)
        try:
            yield waiter
        finally:
            with self._lock:
                for key in keys:
                    watchers = self._waiters.get(key)
                    if watchers is not None:
                        watchers.discard(waiter)
                        if not watchers:
                            del self._waiters[key]

    def wake(self, keys: Iterable[Hashable]) -> None:
        """Wake every task watching one of `keys` (from any thread; it does not wait)."""
        with self._lock:
            if not self._waiters:
                return
            for key in keys:
                for waiter in self._waiters.get(key, ()):
                    waiter.wake()

    def saved(self, states: Iterable[tuple[str, str | None]]) -> None:
        """Wake the watchers of each saved ``(state id, parent id)`` and of its known ancestors.

        The links are remembered (the `links` most recent), so a save of a subagent wakes the
        followers of its tree when its parents were saved by this process. A link not known
        here only makes the wake wait for the poll.
        """
        with self._lock:
            links = self._links
            keys: list[str] = []
            for state_id, parent_id in states:
                if parent_id is not None and links.get(state_id) != parent_id:
                    links.pop(state_id, None)
                    links[state_id] = parent_id
                    if len(links) > self._most_links:
                        del links[next(iter(links))]
                if not self._waiters:
                    continue
                key: str | None = state_id
                for _ in range(64):  # a bound, in case the links ever make a cycle
                    if key is None:
                        break
                    keys.append(key)
                    key = links.get(key)
            for key in keys:
                for waiter in self._waiters.get(key, ()):
                    waiter.wake()


_SHARED: weakref.WeakValueDictionary[str, Wakeups] = weakref.WeakValueDictionary()
_SHARED_LOCK = threading.Lock()
