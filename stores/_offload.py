"""The one way a sync store gets its async twins: the sync method runs in a worker thread.

A backend written with blocking I/O (`FileStore`, `SQLiteStore`) defines `save`, `load`, `list`
and `delete` and inherits `ThreadedAsync`; it then has `asave`, `aload`, `alist` and `adelete`
too, with no method written twice. Each async twin runs its sync method with
`anyio.to_thread.run_sync`, so it works on asyncio and trio.

A cancelled caller does not abandon the thread: the call runs to its end, so a write is never
left half-done, and the cancellation is raised as soon as the thread returns.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar, cast

import anyio.lowlevel
import anyio.to_thread

from ._base import StateInfo, Store

if TYPE_CHECKING:
    from orchestrator import State

__all__ = ("ThreadedAsync",)

_T = TypeVar("_T")
_SYNC_METHODS = ("save", "load", "list", "delete")


class ThreadedAsync:
    """Mixin giving a sync store the async twins of its methods, run in a worker thread.

    Subclass it and define the sync methods of `stores.Store`; the class then also implements
    `stores.AsyncStore`. A backend that must not run two calls at once (one SQLite connection)
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

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        missing = [name for name in _SYNC_METHODS if not callable(getattr(cls, name, None))]
        if missing:
            raise TypeError(
                f"{cls.__name__} inherits ThreadedAsync but does not define {', '.join(missing)}:"
                " define the sync methods save, load, list and delete; the async twins come"
                " from ThreadedAsync."
            )

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
