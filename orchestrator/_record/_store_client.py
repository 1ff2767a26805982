"""How the core talks to a store: one `StoreClient`, resolved once per store and State.

A store declares its shape through protocols (`Store`, `AsyncStore`, the memory backends, and
the small ones here: its `url`, whether it is `async_only`, whether it `keeps_memory`).
`client_of(store)` asks each protocol once, with ``isinstance``, and keeps the answer: the
method each call uses (the async twin, or the sync method in a worker thread), the store's URL,
whether it works only asynchronously and whether it keeps agent memory. No caller asks a store
what it can do again.

Each protocol here holds one method, because a store may implement only part of a protocol (a
test double that only saves): the client then uses what is there, and a call of what is not
raises `TypeError` naming the method.

A store that saves several States in one transaction (`BatchStore`, `AsyncBatchStore`) is
saved through a group commit (`_group_commit`): the saves made at once on an event loop go out
together. One without it is saved one State at a time. A store that can also save a batch on
the event loop when nothing would wait there (`NowaitBatchStore`) is asked that first; when it
declines, the batch goes to its usual flush (a worker thread). A store has one client while
anything holds it, so all its saves share one group commit per event loop.
"""

from __future__ import annotations

import builtins
import functools
import inspect
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast, runtime_checkable

import anyio.to_thread

from ._group_commit import Flush, GroupCommits, Now, save_now_or_flush
from ._storage import (
    AsyncBatchStore,
    AsyncMemoryBackend,
    AsyncStore,
    BatchStore,
    MemoryBackend,
    NowaitBatchStore,
    StateInfo,
    Store,
)

if TYPE_CHECKING:
    from ._state import State

__all__ = ("AnyStore", "StoreClient", "client_of")

AnyStore = Store | AsyncStore
"""A store of either protocol (or both)."""

_T = TypeVar("_T")


@runtime_checkable
class _Located(Protocol):
    @property
    def url(self) -> str | None: ...


@runtime_checkable
class _AsyncOnly(Protocol):
    @property
    def async_only(self) -> bool: ...


@runtime_checkable
class _DeclaresMemory(Protocol):
    @property
    def keeps_memory(self) -> bool: ...


@runtime_checkable
class _Save(Protocol):
    def save(self, state: State) -> None: ...


@runtime_checkable
class _Load(Protocol):
    def load(self, state_id: str) -> State: ...


@runtime_checkable
class _List(Protocol):
    def list(
        self, *, parent_id: str | None = None, limit: int | None = None
    ) -> builtins.list[StateInfo]: ...


@runtime_checkable
class _Delete(Protocol):
    def delete(self, state_id: str) -> None: ...


@runtime_checkable
class _ASave(Protocol):
    async def asave(self, state: State) -> None: ...


@runtime_checkable
class _ALoad(Protocol):
    async def aload(self, state_id: str) -> State: ...


@runtime_checkable
class _AList(Protocol):
    async def alist(
        self, *, parent_id: str | None = None, limit: int | None = None
    ) -> builtins.list[StateInfo]: ...


@runtime_checkable
class _ADelete(Protocol):
    async def adelete(self, state_id: str) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True, weakref_slot=True)
class StoreClient:
    """A store as the core reaches it, resolved once by `client_of`.

    `save`, `load`, `list` and `delete` are awaited on the event loop: a store's async twin,
    or its sync method in a worker thread (never blocking the loop). Each is the resolved
    callable itself, so a call is one call and one await, as if the store were called directly.
    For a store that saves in batches, `save` joins the running loop's group commit, and
    `save_alone` too, for a save nothing started with it could join (one run saving on its
    own): its batch goes out without a pass of the loop first (else it is `save`); `save_many`
    saves several States (in one transaction if the store can, else one by one) and returns the
    refused States' errors by position.
    The sync API (`State.child`, `Memory.get`, `ReplayModel.load`) uses `sync_store` and
    `sync_memory`, which refuse a store that works only asynchronously.
    """

    store: AnyStore
    """The store itself."""
    url: str | None
    """Its URL (`stores.open_store` opens it elsewhere), or None: no other process can open it."""
    is_async: bool
    """Whether it works only asynchronously (an `AsyncStore` and no usable `Store`)."""
    keeps_memory: bool
    """Whether it keeps agent memory (a `MemoryBackend` or `AsyncMemoryBackend`)."""
    memory_is_async: bool
    """Whether its memory works only asynchronously (no usable `MemoryBackend`)."""
    batches: bool
    """Whether it saves several States in one transaction (a `BatchStore` or `AsyncBatchStore`)."""
    save: Callable[[State], Awaitable[None]]
    save_alone: Callable[[State], Awaitable[None]]
    save_many: Flush
    load: Callable[[str], Awaitable[State]]
    list: Callable[..., Awaitable[builtins.list[StateInfo]]]
    delete: Callable[[str], Awaitable[None]]
    memory_get: Callable[..., Awaitable[str | None]]
    memory_scan: Callable[..., Awaitable[builtins.list[tuple[str, str]]]]
    memory_put: Callable[..., Awaitable[bool]]

    def sync_store(self, refusal: str) -> Store:
        """The store, for a sync call; `TypeError(refusal)` if it works only asynchronously."""
        if self.is_async:
            raise TypeError(refusal)
        return cast("Store", self.store)

    def sync_memory(self, refusal: str) -> MemoryBackend:
        """The store's sync memory methods; `TypeError(refusal)` if it has none usable."""
        if self.memory_is_async:
            raise TypeError(refusal)
        return cast("MemoryBackend", self.store)


# The client of each store that has one alive, by id(store): a client holds its store, so the
# id names that store for as long as the entry lives (it goes with the client).
_CLIENTS = weakref.WeakValueDictionary[int, StoreClient]()


def client_of(store: AnyStore) -> StoreClient:
    """The client of `store`: every protocol asked once, here; the same client while it lives.

    An agent resolves its store once, when it is made; a State bound to a store resolves it
    when first asked and keeps it (`orchestrator._record._recording.store_of`). So a run reaches its
    store at no cost per save, and every saver of one store shares its group commits.
    """
    client = _CLIENTS.get(id(store))
    if client is not None and client.store is store:
        return client
    client = _resolve(store)
    _CLIENTS[id(store)] = client
    return client


def _resolve(store: AnyStore) -> StoreClient:
    sync_load = isinstance(store, _Load)
    declared = store.async_only if isinstance(store, _AsyncOnly) else False
    is_async = bool(declared) or not (sync_load or isinstance(store, _Save))
    memory_is_async = bool(declared) or not isinstance(store, MemoryBackend)
    keeps = store.keeps_memory if isinstance(store, _DeclaresMemory) else True
    memory = bool(keeps) and (isinstance(store, (MemoryBackend, AsyncMemoryBackend)))
    save = _pick(
        store,
        "save",
        store.asave if isinstance(store, _ASave) else None,
        store.save if isinstance(store, _Save) else None,
    )
    batch: Flush | None = None
    now: Now | None = None
    if isinstance(store, AsyncBatchStore) and inspect.iscoroutinefunction(store.asave_many):
        batch = store.asave_many
    elif isinstance(store, BatchStore) and not declared:
        batch = _threaded(store.save_many)
    if batch is not None and isinstance(store, NowaitBatchStore) and not declared:
        now = store.save_many_nowait
    save_alone = save
    if batch is not None:
        save_many = batch if now is None else functools.partial(save_now_or_flush, now, batch)
        commits = GroupCommits(batch, now)
        save, save_alone = commits.save, commits.save_alone
    else:
        save_many = functools.partial(_one_by_one, save)
    return StoreClient(
        store=store,
        url=store.url if isinstance(store, _Located) else None,
        is_async=is_async,
        keeps_memory=memory,
        memory_is_async=memory_is_async,
        batches=batch is not None,
        save=save,
        save_alone=save_alone,
        save_many=save_many,
        load=_pick(
            store,
            "load",
            store.aload if isinstance(store, _ALoad) else None,
            store.load if sync_load else None,
        ),
        list=_pick(
            store,
            "list",
            store.alist if isinstance(store, _AList) else None,
            store.list if isinstance(store, _List) else None,
        ),
        delete=_pick(
            store,
            "delete",
            store.adelete if isinstance(store, _ADelete) else None,
            store.delete if isinstance(store, _Delete) else None,
        ),
        memory_get=_pick_memory(store, "memory_get"),
        memory_scan=_pick_memory(store, "memory_scan"),
        memory_put=_pick_memory(store, "memory_put"),
    )


async def _one_by_one(
    save: Callable[[State], Awaitable[None]], states: Sequence[State]
) -> dict[int, ValueError]:
    """Save `states` in turn with `save` (a store that has no batch save); the refused."""
    refused: dict[int, ValueError] = {}
    for at, state in enumerate(states):
        try:
            await save(state)
        except ValueError as error:
            refused[at] = error
    return refused


def _pick(
    store: object,
    name: str,
    twin: Callable[..., Awaitable[_T]] | None,
    method: Callable[..., _T] | None,
) -> Callable[..., Awaitable[_T]]:
    """The async twin when it is a coroutine function, else `method` in a worker thread."""
    if twin is not None and inspect.iscoroutinefunction(twin):
        return twin
    if method is not None:
        return _threaded(method)
    return _missing(store, name)


def _pick_memory(store: object, name: str) -> Callable[..., Awaitable[Any]]:
    if isinstance(store, AsyncMemoryBackend):
        twins: dict[str, Callable[..., Awaitable[Any]]] = {
            "memory_get": store.amemory_get,
            "memory_scan": store.amemory_scan,
            "memory_put": store.amemory_put,
        }
        twin = twins[name]
        if inspect.iscoroutinefunction(twin):
            return twin
    if isinstance(store, MemoryBackend):
        methods: dict[str, Callable[..., Any]] = {
            "memory_get": store.memory_get,
            "memory_scan": store.memory_scan,
            "memory_put": store.memory_put,
        }
        return _threaded(methods[name])
    return _missing(store, name)


def _threaded(method: Callable[..., _T]) -> Callable[..., Awaitable[_T]]:
    def call(*args: Any, **kwargs: Any) -> Awaitable[_T]:
        return anyio.to_thread.run_sync(functools.partial(method, *args, **kwargs))

    return call


def _missing(store: object, name: str) -> Callable[..., Awaitable[Any]]:
    def call(*args: Any, **kwargs: Any) -> Awaitable[Any]:
        raise TypeError(
            f"{type(store).__name__} has neither {name} nor a{name}: a store implements"
            " orchestrator.Store or orchestrator.AsyncStore."
        )

    return call
