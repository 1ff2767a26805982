"""What a store is, and the view of a State a store works from.

The protocols a backend implements (`Store`, `AsyncStore`, and the memory primitive
`MemoryBackend`, `AsyncMemoryBackend`) live here, in the core, so that `Agent` and `Memory` are
typed with them. A backend reads a State only through `storage_view` (its id, entries and info
at one moment, all from one immutable value) and changes it only through `bind_store` and
`recover`: the whole of what a store needs, on public names, for `stores` and third-party
backends alike.

The two store protocols have the same method names, the async ones prefixed with ``a``. A
backend implements one or both. `save` writes only the entries not yet stored (idempotent by
`seq`), so storage grows with the history, never with snapshots.

A store may also save several States in one transaction (`BatchStore`, `AsyncBatchStore`).
These protocols are optional: the core gathers the saves of the agents running at once on an
event loop and hands them to `save_many` together, so a store that has it commits once for
them all; a store without it gets them one by one.

A store may also let a State be followed from another process (`Followable`,
`AsyncFollowable`): the entries stored after a position, and a wait for new ones. These
protocols are optional, so a store without them still runs agents; what needs them checks once
with `require_followable`, which says what is missing.

A store may also let a whole tree of States be followed as one feed (`TreeFollowable`,
`AsyncTreeFollowable`): every entry of a root State and of all its descendants, in one order
fixed when each save commits, each with a cursor. A reader that has seen up to a cursor never
later finds an entry that sorts before it, so "the entries after cursor C" is exact in any
process: a follower that reconnects with its last cursor loses nothing and sees nothing twice.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Protocol, runtime_checkable

from pydantic import Field

from .._base._messages import Message, TextBlock, ToolResultBlock
from .._base._reply import Usage
from .._base._stopped import Stopped
from ._fold import Folded
from ._history import HistoryEntry

if TYPE_CHECKING:
    from ._state import State

__all__ = (
    "AsyncBatchStore",
    "AsyncFollowable",
    "AsyncMemoryBackend",
    "AsyncStore",
    "AsyncTreeFollowable",
    "BatchStore",
    "Followable",
    "MemoryBackend",
    "NowaitBatchStore",
    "StateInfo",
    "StorageView",
    "Store",
    "TreeEntry",
    "TreeFollowable",
    "require_followable",
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
    stopped: Annotated[Stopped, Field(discriminator="kind")] | None = None
    finished: bool = False
    usage: Usage = field(default_factory=Usage)
    entries: int = 0
    damage: str | None = None


def title_of(messages: Iterable[Message]) -> str:
    """A State's title: its first user message's text (not a tool result), cut short.

    One pass over the blocks of each message (a store writes the title on every save).
    """
    for message in messages:
        if message.role != "user":
            continue
        texts: list[str] = []
        for block in message.content:
            if isinstance(block, TextBlock):
                texts.append(block.text)
            elif isinstance(block, ToolResultBlock):
                break
        else:
            text = "".join(texts)
            if text:
                return text[:TITLE_LENGTH]
    return ""


class StorageView:
    """A State as a store writes it: its id, entries and info, all of one moment.

    Made by `storage_view(state)`. It holds one immutable value of the State, so the entries a
    store writes and the info it writes beside them always agree, whatever the State records
    meanwhile. Reading an entry or the info costs O(1), never the length of the history.
    """

    __slots__ = ("_value", "id")

    id: str
    """The State's id."""

    def __init__(self, state_id: str, value: Folded) -> None:
        self.id = state_id
        self._value = value

    @property
    def count(self) -> int:
        """How many entries the State has."""
        return len(self._value.entries)

    def entry(self, index: int) -> HistoryEntry:
        """Entry `index` (its `seq`)."""
        return self._value.entries.get(index)

    def entries(self, start: int = 0) -> tuple[HistoryEntry, ...]:
        """The entries from `start` on: what a store holding `start` entries writes next."""
        return self._value.entries.after(start)

    @property
    def info(self) -> StateInfo:
        """The State's `StateInfo` at this moment."""
        return StateInfo(
            id=self.id,
            parent_id=self.parent_id,
            parent_call_id=self.parent_call_id,
            title=self.title,
            created_at=self.created_at,
            updated_at=self.updated_at,
            turn=self.turn,
            stopped=self.stopped,
            finished=self.finished,
            usage=self.usage,
            entries=self.count,
        )

    # The fields of `info` one by one: a backend writing columns reads them without building
    # a `StateInfo` (a frozen dataclass costs about 4 us to make, on every save).

    @property
    def parent_id(self) -> str | None:
        """The id of the State whose tool call started this one, or None."""
        return self._value.parent_id

    @property
    def parent_call_id(self) -> str | None:
        """The id of the parent's tool call that started this State, or None."""
        return self._value.parent_call_id

    @property
    def title(self) -> str:
        """The first user message's text, cut to 200 characters."""
        return title_of(self._value.messages)

    @property
    def created_at(self) -> datetime | None:
        """The `at` of the first entry."""
        return self._value.at_first

    @property
    def updated_at(self) -> datetime | None:
        """The `at` of the last entry."""
        return self._value.at_last

    @property
    def turn(self) -> int:
        """The State's turn."""
        return self._value.turn

    @property
    def stopped(self) -> Stopped | None:
        """Why the State stopped, or None."""
        return self._value.stopped

    @property
    def finished(self) -> bool:
        """Whether the State is finished."""
        return self._value.finished

    @property
    def usage(self) -> Usage:
        """What the State spent, its children included."""
        return self._value.usage

    @property
    def open_turn(self) -> bool:
        """Whether a turn is open: the model is waited on, or tool calls are pending.

        A State stored like this was cut off; `recover_state` closes the turn when it is loaded.
        """
        return self._value.open_turn

    def links(self, children: Iterable[StateInfo]) -> dict[str, tuple[list[str], Usage]]:
        """By pending call id, the `children` that call started and what they spent.

        `children` are the stored States whose `parent_id` is this State; the ones started by a
        call that is still pending are kept, oldest first.
        """
        pending = {call.id for call in self._value.pending}
        links: dict[str, tuple[list[str], Usage]] = {}
        for child in sorted(children, key=lambda info: info.created_at or _EPOCH):
            call_id = child.parent_call_id
            if call_id is not None and call_id in pending:
                ids, usage = links.get(call_id, ([], Usage()))
                links[call_id] = ([*ids, child.id], usage + child.usage)
        return links


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
class BatchStore(Protocol):
    """A store that saves several States in one transaction, from sync code (optional).

    Agents running at once on one event loop have their saves gathered and handed to
    `save_many` together: one commit for them all, where `save` would commit each.
    """

    def save_many(self, states: Sequence[State]) -> dict[int, ValueError]:
        """Save each of `states` as `save` does, in one transaction; the refused, by position.

        A State the store refuses (it does not continue the history stored under its id) is
        left out, and its `ValueError` is returned under its position in `states`; the others
        are saved and bound. So one bad State does not sink the others.

        Raises:
            TypeError: An item is not a State (nothing is saved).
            StoreError: The store failed: none of the States is saved.
        """
        ...


@runtime_checkable
class NowaitBatchStore(Protocol):
    """A batch store that can save on the event loop when the save would not wait (optional).

    The core tries `save_many_nowait` on the event loop first and, when it returns None, saves
    the batch in a worker thread as it would without it. A thread hop costs more than a small
    commit that blocks on nothing (`stores.SQLiteStore`: the write lock free, no fsync).
    """

    def save_many_nowait(self, states: Sequence[State]) -> dict[int, ValueError] | None:
        """`BatchStore.save_many` if nothing makes it wait; else None, and nothing is written.

        It must return None, at once and with nothing written, whenever the save would have to
        wait: on a lock another thread or process holds, on the disk (an fsync), or on work
        too long for the event loop. Returning the refused States' errors means it saved.

        Raises:
            TypeError: An item is not a State (nothing is saved).
            StoreError: The store failed: none of the States is saved.
        """
        ...


@runtime_checkable
class AsyncBatchStore(Protocol):
    """A store that saves several States in one transaction, from async code (optional)."""

    async def asave_many(self, states: Sequence[State]) -> dict[int, ValueError]:
        """`BatchStore.save_many`, awaited: the refused States' errors, by position."""
        ...


@runtime_checkable
class Followable(Protocol):
    """A store whose States can be followed from sync code: their entries after a position.

    A reader (another process, say) keeps the `seq` of the last entry it has and asks for the
    ones after it; it never reloads the whole State to see what changed.
    """

    def entries(self, state_id: str, *, after: int = -1) -> tuple[HistoryEntry, ...]:
        """The stored entries of `state_id` whose `seq` is greater than `after`, in order.

        `after=-1` gives them all; `after` at or past the last entry gives ``()``. The entries
        are checked as a load checks them.

        Raises:
            LookupError: Nothing is saved under `state_id`.
            ValueError: `state_id` is not a valid id, or `after` is not an int >= -1.
            StoreDamagedError: A stored entry is damaged (the message names the index).
        """
        ...


@runtime_checkable
class AsyncFollowable(Protocol):
    """A store whose States can be followed from async code: read, and wait for, new entries.

    `await_entries` is how a process follows a run another process executes: it returns as
    soon as the store holds entries after `after`. How a backend waits is its own: PostgreSQL
    is told by ``LISTEN``/``NOTIFY``, SQLite and files are polled at a bounded interval.
    """

    async def aentries(self, state_id: str, *, after: int = -1) -> tuple[HistoryEntry, ...]:
        """The stored entries of `state_id` after `after`, in order (see `Followable.entries`)."""
        ...

    async def await_entries(self, state_id: str, *, after: int = -1) -> tuple[HistoryEntry, ...]:
        """Wait until entries of `state_id` after `after` are stored; return them, in order.

        It returns at once if there are some already, so a follower that passes the `seq` of
        the last entry it got sees each entry exactly once. It waits as long as it takes: the
        caller bounds it (``with anyio.move_on_after(...)``), and a cancellation ends it
        promptly.

        Raises:
            LookupError: Nothing is saved under `state_id` (save it before following it).
            ValueError: `state_id` is not a valid id, or `after` is not an int >= -1.
            StoreDamagedError: A stored entry is damaged (the message names the index).
        """
        ...


def require_followable(store: object) -> AsyncFollowable:
    """`store` as an `AsyncFollowable`; a `TypeError` saying what is missing otherwise.

    Checked once, where a store is taken to follow runs (never on each call).
    """
    if isinstance(store, AsyncFollowable):
        return store
    raise TypeError(
        f"{type(store).__name__} cannot follow a run from another process: it does not"
        " implement orchestrator.AsyncFollowable (async aentries and await_entries). Use one"
        " of the stores of `stores` (SQLiteStore, AioSQLiteStore, FileStore, PostgresStore,"
        " MemoryStore), or add those two methods to yours."
    )


@dataclass(frozen=True, slots=True)
class TreeEntry:
    """One entry of a tree's feed (`TreeFollowable.tree_entries`): where it is, whose, what.

    `cursor` is opaque: pass it back as ``after=`` to get the entries that follow this one.
    Cursors sort in the feed's order only for the store that made them; a store refuses
    another kind of store's cursor with a `ValueError`.
    """

    cursor: str
    """Where this entry is in its tree's feed: ``after=cursor`` gives the entries after it."""
    state_id: str
    """The id of the State the entry belongs to (the root, or one of its descendants)."""
    entry: HistoryEntry
    """The history entry, checked as a load checks it."""

    @property
    def index(self) -> int:
        """The entry's index in its State's history (its `seq`)."""
        return self.entry.seq


@runtime_checkable
class TreeFollowable(Protocol):
    """A store whose trees of States can be followed from sync code, as one feed (optional).

    A tree is a root State (one saved without a parent in this store) and every State started
    under it, at any depth. Its feed holds every entry of them all, in an order fixed when each
    save commits and never revised: the entries of one State keep their order, and those of
    States saving at once interleave as their saves committed. Each entry has a cursor; the
    entries after a cursor are exactly the ones a reader holding it has not seen.

    A State's root is fixed at its first save, from its parent's stored row (the parent is
    saved before the child runs); a State whose parent is not stored here then is a root.
    """

    def root_of(self, state_id: str) -> str:
        """The id of the root of the tree the stored State `state_id` belongs to.

        Raises:
            LookupError: Nothing is saved under `state_id`.
            ValueError: `state_id` is not a valid id.
        """
        ...

    def tree_entries(
        self, root_id: str, *, after: str | None = None, limit: int | None = None
    ) -> tuple[TreeEntry, ...]:
        """The stored entries of the tree of `root_id` after the cursor `after`, in feed order.

        `after=None` starts at the beginning; `limit` caps how many come back (None: all), so a
        long tree is read page by page, each page after the last cursor of the one before.

        Raises:
            LookupError: No State `root_id` is saved.
            ValueError: `root_id` is not a valid id or not a root (the message names its root),
                `after` is not a cursor of this store, or `limit` is not None or an int >= 1.
            StoreDamagedError: A stored entry is damaged (the message names the State and index).
        """
        ...


@runtime_checkable
class AsyncTreeFollowable(Protocol):
    """A store whose trees of States can be followed from async code: read, and wait for, them.

    `await_tree_entries` is how a process follows a run and its children that another process
    executes. How a backend waits is its own: PostgreSQL is told by ``LISTEN``/``NOTIFY``,
    SQLite and files are polled at a bounded interval.
    """

    async def aroot_of(self, state_id: str) -> str:
        """The id of the root of the tree of `state_id` (see `TreeFollowable.root_of`)."""
        ...

    async def atree_entries(
        self, root_id: str, *, after: str | None = None, limit: int | None = None
    ) -> tuple[TreeEntry, ...]:
        """The entries of the tree of `root_id` after `after` (see `TreeFollowable`)."""
        ...

    async def await_tree_entries(
        self, root_id: str, *, after: str | None = None, limit: int | None = None
    ) -> tuple[TreeEntry, ...]:
        """Wait until the tree of `root_id` has entries after `after`; return them, in order.

        It returns at once if there are some already, and as soon as any State of the tree
        (the root or a descendant) saves new ones. It waits as long as it takes: the caller
        bounds it (``with anyio.move_on_after(...)``), and a cancellation ends it promptly.

        Raises:
            LookupError: No State `root_id` is saved (save it before following it).
            ValueError: See `TreeFollowable.tree_entries`.
            StoreDamagedError: A stored entry is damaged.
        """
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
