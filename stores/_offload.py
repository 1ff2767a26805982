"""The one way a sync store gets its async twins: the sync method runs in a worker thread.

A backend written with blocking I/O (`FileStore`, `SQLiteStore`) defines `save`, `load`, `list`
and `delete` and inherits `ThreadedAsync`; it then has `asave`, `aload`, `alist` and `adelete`
too, with no method written twice. The same goes for the memory primitive: a backend that
defines `memory_get`, `memory_scan` and `memory_put` gets `amemory_get`, `amemory_scan` and
`amemory_put`. Each async twin runs its sync method with
`anyio.to_thread.run_sync`, so it works on asyncio and trio.

A cancelled caller does not abandon the thread: the call runs to its end, so a write is never
left half-done, and the cancellation is raised as soon as the thread returns.
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, ClassVar, Self, TypeVar, cast
from weakref import WeakKeyDictionary

import anyio
import anyio.lowlevel
import anyio.to_thread

from orchestrator import MemoryBackend, StateInfo, Store

if TYPE_CHECKING:
    from orchestrator import State

__all__ = ("AsyncClosing", "Closing", "OneAtATime", "ThreadedAsync", "ThreadedClosing")

_T = TypeVar("_T")
_SYNC_METHODS = ("save", "load", "list", "delete")
_MEMORY_METHODS = ("memory_get", "memory_scan", "memory_put")


class ThreadedAsync:
    """Mixin giving a sync store the async twins of its methods, run in a worker thread.

    Subclass it and define the sync methods of `orchestrator.Store`; the class then also implements
    `orchestrator.AsyncStore`. A backend that must not run two calls at once (one SQLite connection)
    overrides `_offload_limiter` to return its own `anyio.CapacityLimiter`.

    Example:
        ```python
        class MyStore(ThreadedAsync):
            def save(self, state): ...
            def load(self, state_id): ...
            def list(self, *, parent_id=None, limit=None): ...
            def delete(self, state_id): ...

        await MyStore().asave(state)  # runs MyStore.save in a worker thread
        ```
    """

    __slots__ = ()

    keeps_memory: ClassVar[bool] = False
    """Whether the store keeps agent memory: it defines the sync memory methods (set for you)."""

    def __init_subclass__(cls, *, abstract: bool = False, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if abstract:  # a mixin on the way to a store (`ThreadedClosing`): checked in its stores
            return
        missing = [name for name in _SYNC_METHODS if not callable(getattr(cls, name, None))]
        if missing:
            raise TypeError(
                f"{cls.__name__} inherits ThreadedAsync but does not define {', '.join(missing)}:"
                " define the sync methods save, load, list and delete; the async twins come"
                " from ThreadedAsync."
            )
        memory = [name for name in _MEMORY_METHODS if callable(getattr(cls, name, None))]
        if memory and len(memory) < len(_MEMORY_METHODS):
            absent = [name for name in _MEMORY_METHODS if name not in memory]
            raise TypeError(
                f"{cls.__name__} defines {', '.join(memory)} but not {', '.join(absent)}: a"
                " store that keeps agent memory defines memory_get, memory_scan and memory_put"
                " (or none of them)."
            )
        cls.keeps_memory = bool(memory)

    def _offload_limiter(self) -> anyio.CapacityLimiter | None:
        """The limiter for the worker threads of this store (None: anyio's default)."""
        return None

    async def _offload(self, func: Callable[..., _T], *args: object) -> _T:
        result = await anyio.to_thread.run_sync(func, *args, limiter=self._offload_limiter())
        # The thread was not abandoned, so a cancellation that came meanwhile waited: raise it.
        await anyio.lowlevel.checkpoint_if_cancelled()
        return result

    def _sync(self) -> Store:
        return cast("Store", self)

    async def asave(self, state: State) -> None:
        """`save` in a worker thread: write the entries of `state` not stored yet."""
        await self._offload(self._sync().save, state)

    async def aload(self, state_id: str) -> State:
        """`load` in a worker thread: the State saved under `state_id` (`LookupError` if absent)."""
        return await self._offload(self._sync().load, state_id)

    async def alist(
        self, *, parent_id: str | None = None, limit: int | None = None
    ) -> builtins.list[StateInfo]:
        """`list` in a worker thread: the saved States, most recently updated first."""

        def call() -> builtins.list[StateInfo]:
            return self._sync().list(parent_id=parent_id, limit=limit)

        return await self._offload(call)

    async def adelete(self, state_id: str) -> None:
        """`delete` in a worker thread: forget the State `state_id` (fine if it is absent)."""
        await self._offload(self._sync().delete, state_id)

    def _memory(self) -> MemoryBackend:
        if not self.keeps_memory:
            raise TypeError(
                f"{type(self).__name__} keeps no agent memory: define memory_get, memory_scan and"
                " memory_put to give it one."
            )
        return cast("MemoryBackend", self)  # `__init_subclass__` checked all three are there

    async def amemory_get(self, agent: str, space: str, key: str) -> str | None:
        """`memory_get` in a worker thread: the text under `key`, or None."""
        return await self._offload(self._memory().memory_get, agent, space, key)

    async def amemory_scan(self, agent: str, space: str) -> builtins.list[tuple[str, str]]:
        """`memory_scan` in a worker thread: every ``(key, text)`` of the space, in key order."""
        return await self._offload(self._memory().memory_scan, agent, space)

    async def amemory_put(
        self, agent: str, space: str, key: str, data: str | None, *, effect: str | None = None
    ) -> bool:
        """`memory_put` in a worker thread: write (or delete) once per effect key."""
        put = self._memory().memory_put

        def call() -> bool:
            return bool(put(agent, space, key, data, effect=effect))

        return await self._offload(call)


class OneAtATime:
    """A `anyio.CapacityLimiter` of 1 for each event loop: one worker thread at a time.

    A store with one connection (SQLite) runs one call at a time; the others wait on the loop,
    not in threads of their own. A limiter belongs to the loop that used it first, and a sync
    ``agent.run`` starts a new loop each time: so one per loop, kept weakly by the loop
    (asyncio's loop, trio's token), held by the store.
    """

    __slots__ = ("_limiters", "_mutex")

    def __init__(self) -> None:
        self._limiters = WeakKeyDictionary[object, anyio.CapacityLimiter]()
        self._mutex = threading.Lock()  # loops in several threads may use one store

    def current(self) -> anyio.CapacityLimiter:
        """The limiter of the running event loop."""
        loop = anyio.lowlevel.current_token().native_token
        with self._mutex:
            limiter = self._limiters.get(loop)
            if limiter is None:
                limiter = self._limiters[loop] = anyio.CapacityLimiter(1)
        return limiter


class AsyncClosing:
    """A store whose `aclose` releases what it holds: ``async with`` closes it at the end."""

    __slots__ = ()

    async def aclose(self) -> None:
        """Release what the store holds; the subclass defines it."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()


class Closing:
    """A store whose `close` releases what it holds: a ``with`` block closes it at the end."""

    __slots__ = ()

    def close(self) -> None:
        """Release what the store holds; the subclass defines it."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class ThreadedClosing(ThreadedAsync, Closing, AsyncClosing, abstract=True):
    """A `ThreadedAsync` store holding a resource its `close` releases (a connection, a pool).

    It gives `aclose` (`close` in a worker thread: closing may wait on I/O) and the ``with`` and
    ``async with`` blocks that close the store at their end.
    """

    __slots__ = ()

    async def aclose(self) -> None:
        """`close` in a worker thread (closing may wait on I/O: a WAL written back, a pool)."""
        await self._offload(self.close)
