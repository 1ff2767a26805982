"""What every store is: the `Store` and `AsyncStore` protocols and `StateInfo`.

The two protocols have the same method names, the async ones prefixed with ``a``. A backend
implements one or both. `save` writes only the entries not yet stored (idempotent by `seq`), so
storage grows with the history, never with snapshots.

`MemoryBackend` and `AsyncMemoryBackend` are the memory primitive behind `orchestrator.Memory`:
JSON text kept under ``(agent, space, key)`` beside the States, read one key at a time or a
whole space at once, and written one key at a time with an optional effect key.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

from orchestrator import HistoryEntry, Message, State, Stopped, Usage

__all__ = (
    "AsyncMemoryBackend",
    "AsyncStore",
    "MemoryBackend",
    "StateInfo",
    "Store",
    "bind_state",
    "info_of",
    "recover_state",
    "title_of",
)

TITLE_LENGTH = 200


@dataclass(frozen=True, slots=True, kw_only=True)
class StateInfo:
    """What a store knows of a State without loading it: what `list` returns.

    `damage` says why a State's info could not be read, when it could not (then only `id` is
    sure, and loading the State raises `orchestrator.StoreDamagedError`, or loads it if its
    history is whole): damage to one State never stops `list` from returning the others.
    """

    id: str
    parent_id: str | None = None
    parent_call_id: str | None = None
    title: str = ""  # the first user message, cut to 200 characters
    created_at: datetime | None = None
    updated_at: datetime | None = None
    turn: int = 0
    stopped: Stopped | None = None
    finished: bool = False
    usage: Usage = field(default_factory=Usage)
    entries: int = 0
    damage: str | None = None


def title_of(messages: Iterable[Message]) -> str:
    """A State's title: its first user message's text (not a tool result), cut short."""
    for message in messages:
        if message.role == "user":
            text = message.text
            if text and not message.tool_results:
                return text[:TITLE_LENGTH]
    return ""


def info_of(state: State) -> StateInfo:
    """The `StateInfo` of `state` as it is now.

    It reads the folded value and builds no tuple, so a save that calls it on every turn does
    not cost more as the history grows.
    """
    folded = state._folded
    return StateInfo(
        id=state.id,
        parent_id=folded.parent_id,
        parent_call_id=folded.parent_call_id,
        title=title_of(folded.messages),
        created_at=folded.at_first,
        updated_at=folded.at_last,
        turn=folded.turn,
        stopped=folded.stopped,
        finished=folded.finished,
        usage=folded.usage,
        entries=len(folded.entries),
    )


def recover_state(state: State, children: Iterable[StateInfo] = ()) -> tuple[HistoryEntry, ...]:
    """Close the turn a crash cut off in a loaded `state`; return the entries that added.

    Every backend calls it on load (a third-party one too). A request that was waiting on the
    model is taken back; each pending call gets an ``unknown`` result (the tool may or may not
    have run, so it is never run again on its own). `children` are the stored States whose
    `parent_id` is this State: the ones a cut-off call started stay listed in its result, with
    their usage, so `state.child(id)` still opens them. The added entries are written by the
    next save.
    """
    links: dict[str, tuple[list[str], Usage]] = {}
    pending = {call.id for call in state.pending_calls}
    for child in sorted(children, key=lambda info: info.created_at or _EPOCH):
        call_id = child.parent_call_id
        if call_id is not None and call_id in pending:
            ids, usage = links.get(call_id, ([], Usage()))
            links[call_id] = ([*ids, child.id], usage + child.usage)
    return state._recover(links)


def bind_state(state: State, store: object) -> None:
    """Bind `state` to `store`: what `save` and `load` do, so `child` can open its children."""
    state._bind_store(store)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@runtime_checkable
class Store(Protocol):
    """A store used from sync code (its methods block)."""

    def save(self, state: State) -> None:
        """Write the entries of `state` not stored yet, and its info; bind it to this store."""
        ...

    def load(self, state_id: str) -> State:
        """The State saved under `state_id`, bound to this store; `LookupError` if absent.

        A turn that was cut off is closed: a request waiting on the model is taken back and each
        pending call gets an ``unknown`` result (the tool may or may not have run).
        """
        ...

    def list(
        self, *, parent_id: str | None = None, limit: int | None = None
    ) -> builtins.list[StateInfo]:
        """The saved States, most recently updated first; only children of `parent_id` if set."""
        ...

    def delete(self, state_id: str) -> None:
        """Forget the State `state_id` (nothing happens if it is absent)."""
        ...


@runtime_checkable
class AsyncStore(Protocol):
    """A store used from async code: the same methods as `Store`, awaited, prefixed ``a``."""

    async def asave(self, state: State) -> None:
        """Write the entries of `state` not stored yet, and its info; bind it to this store."""
        ...

    async def aload(self, state_id: str) -> State:
        """The State saved under `state_id`, bound to this store; `LookupError` if absent."""
        ...

    async def alist(
        self, *, parent_id: str | None = None, limit: int | None = None
    ) -> builtins.list[StateInfo]:
        """The saved States, most recently updated first; only children of `parent_id` if set."""
        ...

    async def adelete(self, state_id: str) -> None:
        """Forget the State `state_id` (nothing happens if it is absent)."""
        ...


@runtime_checkable
class MemoryBackend(Protocol):
    """A store that keeps agent memory, used from sync code: the primitive under `Memory`.

    Memory is JSON text (the caller encodes it) under a key, in a space, of an agent. The agent
    name is an id (``[A-Za-z0-9_-]{1,128}``); a space and a key are any str of 1 to 128 and 1 to
    512 characters (`orchestrator.Memory` uses the space ``"kv"`` and one space
    ``"collection:<name>"`` per collection). Different agents never see each other's keys.

    A write may carry an effect key: the store records it with the write, atomically, and a
    later write of that agent with the same effect key changes nothing. So a write repeated
    with its key (a replayed tool call) is applied once.

    `orchestrator.Memory` takes a store as keeping memory when it has these methods (or their
    async twins) and no class attribute ``keeps_memory = False`` (which `ThreadedAsync` sets
    on a subclass that does not define them).
    """

    def memory_get(self, agent: str, space: str, key: str) -> str | None:
        """The text stored under `key`, or None if there is none."""
        ...

    def memory_scan(self, agent: str, space: str) -> builtins.list[tuple[str, str]]:
        """Every ``(key, text)`` of the space, in key order (by code point)."""
        ...

    def memory_put(
        self, agent: str, space: str, key: str, data: str | None, *, effect: str | None = None
    ) -> bool:
        """Store `data` under `key` (None: delete it); return whether the write applied.

        With an `effect` key the agent's store has seen, nothing changes and it returns False;
        otherwise the write and the effect key are stored together.
        """
        ...


@runtime_checkable
class AsyncMemoryBackend(Protocol):
    """A store that keeps agent memory, used from async code: `MemoryBackend`, awaited."""

    async def amemory_get(self, agent: str, space: str, key: str) -> str | None:
        """The text stored under `key`, or None if there is none."""
        ...

    async def amemory_scan(self, agent: str, space: str) -> builtins.list[tuple[str, str]]:
        """Every ``(key, text)`` of the space, in key order (by code point)."""
        ...

    async def amemory_put(
        self, agent: str, space: str, key: str, data: str | None, *, effect: str | None = None
    ) -> bool:
        """Store `data` under `key` (None: delete it); return whether the write applied."""
        ...
