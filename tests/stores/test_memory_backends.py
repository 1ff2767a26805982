"""The memory primitive for store authors: `ThreadedAsync`'s twins and third-party stores."""

from __future__ import annotations

import builtins
import threading
from typing import Any

import anyio
import pytest

from orchestrator import AsyncMemoryBackend, Memory, MemoryBackend, State, StateInfo
from stores import MemoryStore, ThreadedAsync


class _States:
    """The State methods a `ThreadedAsync` subclass needs; these tests never call them."""

    def save(self, state: State) -> None:
        raise NotImplementedError

    def load(self, state_id: str) -> State:
        raise NotImplementedError

    def list(
        self, *, parent_id: str | None = None, limit: int | None = None
    ) -> builtins.list[StateInfo]:
        raise NotImplementedError

    def delete(self, state_id: str) -> None:
        raise NotImplementedError


class Keeping(_States, ThreadedAsync):
    """A sync store that keeps memory in a MemoryStore and notes the threads it runs on."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.threads: set[int] = set()

    def memory_get(self, agent: str, space: str, key: str) -> str | None:
        self.threads.add(threading.get_ident())
        return self.inner.memory_get(agent, space, key)

    def memory_scan(self, agent: str, space: str) -> builtins.list[tuple[str, str]]:
        self.threads.add(threading.get_ident())
        return self.inner.memory_scan(agent, space)

    def memory_put(
        self, agent: str, space: str, key: str, data: str | None, *, effect: str | None = None
    ) -> bool:
        self.threads.add(threading.get_ident())
        return self.inner.memory_put(agent, space, key, data, effect=effect)


class Forgetful(_States, ThreadedAsync):
    """A sync store that keeps no memory."""


def test_memory_store_implements_both_memory_protocols() -> None:
    store = MemoryStore()
    assert isinstance(store, MemoryBackend)
    assert isinstance(store, AsyncMemoryBackend)


@pytest.mark.anyio
async def test_threaded_async_gives_the_memory_twins_run_in_a_worker_thread() -> None:
    store = Keeping()
    assert store.keeps_memory
    assert isinstance(store, AsyncMemoryBackend)
    assert await store.amemory_put("a", "kv", "k", "1", effect="e") is True
    assert await store.amemory_put("a", "kv", "k", "2", effect="e") is False
    assert await store.amemory_get("a", "kv", "k") == "1"
    assert await store.amemory_scan("a", "kv") == [("k", "1")]
    assert threading.get_ident() not in store.threads
    memory = Memory.open("a", None, store)
    await memory.aset("x", [1])
    assert memory.get("x") == [1]


@pytest.mark.anyio
async def test_a_threaded_store_without_memory_says_so() -> None:
    store = Forgetful()
    assert not store.keeps_memory
    with pytest.raises(TypeError, match="Forgetful keeps no agent memory"):
        await store.amemory_get("a", "kv", "k")
    with pytest.raises(TypeError, match="keeps agent memory"):
        Memory.open("a", None, store)


def test_a_threaded_store_must_define_all_memory_methods_or_none() -> None:
    with pytest.raises(TypeError, match="defines memory_get but not memory_scan, memory_put"):

        class Half(_States, ThreadedAsync):  # pyright: ignore[reportUnusedClass]
            def memory_get(self, agent: str, space: str, key: str) -> str | None:
                return None


class SyncOnly:
    """A third-party sync store: memory methods, no async twins."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.threads: set[int] = set()

    def memory_get(self, agent: str, space: str, key: str) -> str | None:
        self.threads.add(threading.get_ident())
        return self.inner.memory_get(agent, space, key)

    def memory_scan(self, agent: str, space: str) -> list[tuple[str, str]]:
        self.threads.add(threading.get_ident())
        return self.inner.memory_scan(agent, space)

    def memory_put(
        self, agent: str, space: str, key: str, data: str | None, *, effect: str | None = None
    ) -> bool:
        self.threads.add(threading.get_ident())
        return self.inner.memory_put(agent, space, key, data, effect=effect)


class AsyncOnly:
    """A third-party async store: only the async memory twins."""

    def __init__(self) -> None:
        self.inner = MemoryStore()

    async def amemory_get(self, agent: str, space: str, key: str) -> str | None:
        return await self.inner.amemory_get(agent, space, key)

    async def amemory_scan(self, agent: str, space: str) -> list[tuple[str, str]]:
        return await self.inner.amemory_scan(agent, space)

    async def amemory_put(
        self, agent: str, space: str, key: str, data: str | None, *, effect: str | None = None
    ) -> bool:
        return await self.inner.amemory_put(agent, space, key, data, effect=effect)


@pytest.mark.anyio
async def test_async_memory_over_a_sync_only_store_runs_in_a_worker_thread() -> None:
    store = SyncOnly()
    memory = Memory.open("a", None, store)
    await memory.aset("k", {"v": 1})
    assert await memory.aget("k") == {"v": 1}
    assert threading.get_ident() not in store.threads
    memory.set("k", 2)
    assert memory.get("k") == 2


@pytest.mark.anyio
async def test_a_store_with_only_async_memory_works_with_the_async_twins() -> None:
    memory = Memory.open("a", None, AsyncOnly())
    await memory.aset("k", 1)
    assert await memory.aget("k") == 1
    with pytest.raises(TypeError, match=r"await .*aget"):
        memory.get("k")


@pytest.mark.anyio
async def test_memory_store_async_twins_are_checkpoints() -> None:
    store = MemoryStore()
    with anyio.CancelScope() as scope:
        scope.cancel()
        await store.amemory_put("a", "kv", "k", "1")
    assert scope.cancelled_caught
    assert store.memory_get("a", "kv", "k") is None


def test_repr_counts_states_only() -> None:
    store: Any = MemoryStore()
    store.memory_put("a", "kv", "k", "1")
    assert repr(store) == "<MemoryStore states=0>"
