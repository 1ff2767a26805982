"""`MemoryStore`: States kept in this process, encoded exactly as the other backends keep them.

It is the simplest backend built on `stores.backend`, the helpers every backend shares.
"""

from __future__ import annotations

import bisect
import builtins
import threading
from dataclasses import dataclass

import anyio.lowlevel

from orchestrator import HistoryEntry, State, StateInfo, TreeEntry
from orchestrator.models._rate import LocalRates, RateAsk, RateTimes

from ._leases import MemoryLeases
from ._offload import AsyncClosing, Closing
from .backend import (
    Tail,
    Wakeups,
    adopted,
    bad_cursor,
    bind_state,
    check_after,
    check_limit,
    check_link,
    check_list_args,
    check_memory,
    check_state,
    continuation,
    cursor_parts,
    entries_after,
    make_cursor,
    not_a_root,
    poll_entries,
    rebuild,
    recover_state,
    select,
    storage_view,
    to_adopt,
    validate_id,
)

__all__ = ("MemoryStore",)


@dataclass(slots=True)
class _Saved:
    lines: builtins.list[bytes]
    digests: builtins.list[bytes]
    info: StateInfo
    tail: Tail
    root_id: str


_KIND = "mem"
_EXAMPLE = "mem:42"


class MemoryStore(Closing, AsyncClosing, MemoryLeases):
    """Keeps States in this process, encoded exactly as the other backends store them.

    A loaded State is a new object rebuilt from the stored entries, as with every backend, so
    tests written against a `MemoryStore` hold for the others. It implements `Store` and
    `AsyncStore` without threads, keeps agent memory (`MemoryBackend`, `AsyncMemoryBackend`),
    run leases (`AsyncRunLeases`) and rate limits (`RateLimit(store=...)`), and is
    thread-safe. Everything is lost when it is dropped.

    Example:
        ```python
        store = MemoryStore()
        agent = Agent(FakeModel(["Hi!"]), store=store)
        state = State(messages=[Message.user("Hello")])
        agent.run(state)
        assert store.load(state.id).answer == "Hi!"
        ```
    """

    __slots__ = (
        "_effects",
        "_feeds",
        "_lock",
        "_position",
        "_rates",
        "_spaces",
        "_states",
        "_wakeups",
    )

    def __init__(self) -> None:
        MemoryLeases.__init__(self)
        self._rates = LocalRates()
        self._lock = threading.Lock()
        self._states: dict[str, _Saved] = {}
        # The feed of each tree (`orchestrator.TreeFollowable`): by root, (position, State id,
        # seq, what holds it) of each entry, in the order saved; positions count every entry
        # of the store. A State deleted (and maybe saved again) no longer holds its old rows.
        self._feeds: dict[str, builtins.list[tuple[int, str, int, _Saved]]] = {}
        self._position = 0
        self._spaces: dict[tuple[str, str], dict[str, str]] = {}  # (agent, space): key -> text
        self._effects: dict[str, set[str]] = {}  # agent: the effect keys applied
        self._wakeups = Wakeups()  # every save is of this process: followers never poll

    def __repr__(self) -> str:
        return f"<MemoryStore states={len(self._states)}>"

    @property
    def url(self) -> str | None:
        """None: no other process can open this store (``open_store("memory:")`` makes another)."""
        return None

    async def arate_take(self, key: str, ask: RateAsk) -> RateTimes:
        """Move `key`'s times on by `ask` and return them, with now (`AsyncRateLimits`)."""
        return await self._rates.arate_take(key, ask)

    async def arate_hold(self, key: str, seconds: float, tolerance: float) -> None:
        """Let no request of `key` go for `seconds` from now."""
        await self._rates.arate_hold(key, seconds, tolerance)

    async def arate_settle(self, key: str, tokens: float) -> None:
        """Add `tokens` seconds to `key`'s tokens time."""
        await self._rates.arate_settle(key, tokens)

    async def arate_slot_take(self, key: str, most: int, holder: str, lease: float) -> int | None:
        """Take a free slot of `key`'s `most` for `lease` seconds, or None (in this process)."""
        return await self._rates.arate_slot_take(key, most, holder, lease)

    async def arate_slot_renew(self, key: str, slot: int, holder: str, lease: float) -> bool:
        """Hold `slot` for `lease` seconds from now; False when `holder` no longer holds it."""
        return await self._rates.arate_slot_renew(key, slot, holder, lease)

    async def arate_slot_release(self, key: str, slot: int, holder: str) -> None:
        """Free `slot` if `holder` still holds it."""
        await self._rates.arate_slot_release(key, slot, holder)

    def close(self) -> None:
        """Nothing to release: so that every store `open_store` gives closes the same way."""

    async def aclose(self) -> None:
        """Nothing to release (a checkpoint, as every async method)."""
        await anyio.lowlevel.checkpoint()

    def save(self, state: State) -> None:
        """Store the entries of `state` not stored yet and its info; bind it to this store.

        Raises:
            TypeError: `state` is not a State.
            ValueError: Another history is stored under `state.id` (load it to continue it).
        """
        state = check_state(state)
        with self._lock:
            saved = self._states.get(state.id)
            view = storage_view(state)
            info = view.info
            new = continuation(view, Tail() if saved is None else saved.tail)
            if saved is None:
                parent = None if view.parent_id is None else self._states.get(view.parent_id)
                root_id = view.id if parent is None else parent.root_id
                saved = _Saved(list(new.lines), list(new.digests), info, new.tail, root_id)
                self._states[state.id] = saved
            elif new.lines:
                saved.lines.extend(new.lines)
                saved.digests.extend(new.digests)
                saved.info = info
            saved.tail = new.tail
            feed = self._feeds.setdefault(saved.root_id, [])
            first = new.tail.count - len(new.lines)
            for seq in range(first, new.tail.count):
                self._position += 1
                feed.append((self._position, state.id, seq, saved))
            root_id = saved.root_id
        bind_state(state, self)
        if new.lines:
            self._wakeups.wake((state.id, root_id))

    def load(self, state_id: str) -> State:
        """The State saved under `state_id`, recovered if a turn was cut off, bound to this store.

        Raises:
            LookupError: Nothing is saved under `state_id`.
            ValueError: `state_id` is not a valid id, or a stored entry is damaged.
        """
        validate_id(state_id, "state_id")
        state = self._read(state_id)
        children: builtins.list[StateInfo] = []
        if state.pending_calls:  # a cut-off call: the children it started stay listed
            for listed in to_adopt(state, self.list(parent_id=state_id)):
                try:
                    child = self._read(listed.id)
                except LookupError:
                    continue  # deleted since
                info = adopted("MemoryStore", state, listed, child)
                if info is not None:
                    children.append(info)
        recover_state(state, children)
        bind_state(state, self)
        return state

    def _read(self, state_id: str) -> State:
        """The State saved under `state_id` as its history holds it (not recovered, not bound)."""
        with self._lock:
            saved = self._states.get(state_id)
            if saved is None:
                raise _absent(state_id)
            lines, digests = tuple(saved.lines), tuple(saved.digests)
        state = rebuild(state_id, lines, digests, where="MemoryStore")
        if lines:
            with self._lock:
                saved = self._states.get(state_id)
                if saved is not None and saved.tail.count == len(lines):
                    saved.tail = saved.tail.holding(state)
        return state

    def list(
        self, *, parent_id: str | None = None, limit: int | None = None
    ) -> builtins.list[StateInfo]:
        """The saved States, most recently updated first; only children of `parent_id` if set."""
        check_list_args(parent_id, limit)
        with self._lock:
            infos = [saved.info for saved in self._states.values()]
        return select(infos, parent_id=parent_id, limit=limit)

    def delete(self, state_id: str) -> None:
        """Forget the State `state_id` (nothing happens if it is absent)."""
        validate_id(state_id, "state_id")
        with self._lock:
            self._states.pop(state_id, None)

    # -- following a tree (`orchestrator.TreeFollowable`, `AsyncTreeFollowable`) ---------------

    def root_of(self, state_id: str) -> str:
        """The id of the root of the tree of the stored State `state_id`.

        Raises:
            LookupError: Nothing is saved under `state_id`.
            ValueError: `state_id` is not a valid id.
        """
        validate_id(state_id, "state_id")
        with self._lock:
            saved = self._states.get(state_id)
            if saved is None:
                raise _absent(state_id)
            return saved.root_id

    def tree_entries(
        self, root_id: str, *, after: str | None = None, limit: int | None = None
    ) -> tuple[TreeEntry, ...]:
        """The entries of the tree of `root_id` after the cursor `after`, in the order saved.

        The cursor counts the entries this store saved: a save takes the next numbers under
        the store's lock. Entries of a State deleted since are left out.

        Raises:
            LookupError: Nothing is saved under `root_id`.
            ValueError: `root_id` is not a root, or `after` or `limit` is not valid.
        """
        validate_id(root_id, "root_id")
        position = self._position_of(after)
        most = check_limit(limit)
        rows: builtins.list[tuple[int, str, int, bytes, bytes, bytes | None]] = []
        with self._lock:
            root = self._states.get(root_id)
            if root is None:
                raise _absent(root_id)
            if root.root_id != root_id:
                raise not_a_root(root_id, root.root_id)
            if position > self._position:
                raise bad_cursor(after, _EXAMPLE, "it is past the end of this store's feed")
            feed = self._feeds.get(root_id, [])
            start = bisect.bisect_right(feed, position, key=lambda row: row[0])
            for at, state_id, seq, saved in feed[start:]:
                if self._states.get(state_id) is not saved:
                    continue  # deleted since (and maybe saved again: its new rows follow)
                previous = saved.digests[seq - 1] if seq else None
                rows.append((at, state_id, seq, saved.lines[seq], saved.digests[seq], previous))
                if most is not None and len(rows) == most:
                    break
        return tuple(
            TreeEntry(
                make_cursor(_KIND, at),
                state_id,
                check_link("MemoryStore", state_id, seq, line, digest, previous),
            )
            for at, state_id, seq, line, digest, previous in rows
        )

    @staticmethod
    def _position_of(after: str | None) -> int:
        parts = cursor_parts(after, _KIND, _EXAMPLE, 1)
        if parts is None:
            return 0
        if not parts[0].isdigit() or parts[0].startswith("0"):
            raise bad_cursor(after, _EXAMPLE)
        return int(parts[0])

    async def aroot_of(self, state_id: str) -> str:
        """The async twin of `root_of`."""
        await anyio.lowlevel.checkpoint()
        return self.root_of(state_id)

    async def atree_entries(
        self, root_id: str, *, after: str | None = None, limit: int | None = None
    ) -> tuple[TreeEntry, ...]:
        """The async twin of `tree_entries`."""
        await anyio.lowlevel.checkpoint()
        return self.tree_entries(root_id, after=after, limit=limit)

    async def await_tree_entries(
        self, root_id: str, *, after: str | None = None, limit: int | None = None
    ) -> tuple[TreeEntry, ...]:
        """Wait for entries of the tree of `root_id` after `after`; return them, in order.

        A save of the tree wakes the wait at once, from any thread or event loop of this
        process; nothing is polled while no State of the tree is saved.
        """
        validate_id(root_id, "root_id")
        self._position_of(after)
        check_limit(limit)
        return await poll_entries(
            lambda: self.atree_entries(root_id, after=after, limit=limit),
            None,
            watching=self._wakeups.watching(root_id),
        )

    # -- following a State (`orchestrator.Followable`, `AsyncFollowable`) -----------------------

    def entries(self, state_id: str, *, after: int = -1) -> tuple[HistoryEntry, ...]:
        """The stored entries of `state_id` after the `seq` `after` (see `orchestrator.Followable`).

        Raises:
            LookupError: Nothing is saved under `state_id`.
            ValueError: `state_id` or `after` is not valid, or a stored entry is damaged.
        """
        validate_id(state_id, "state_id")
        check_after(after)
        return entries_after(self._read(state_id), after)

    async def aentries(self, state_id: str, *, after: int = -1) -> tuple[HistoryEntry, ...]:
        """The async twin of `entries`."""
        await anyio.lowlevel.checkpoint()
        return self.entries(state_id, after=after)

    async def await_entries(self, state_id: str, *, after: int = -1) -> tuple[HistoryEntry, ...]:
        """Wait for entries of `state_id` after `after`, and return them (see `AsyncFollowable`).

        A save of the State wakes the wait at once, from any thread or event loop of this
        process; nothing is polled meanwhile.
        """
        validate_id(state_id, "state_id")
        check_after(after)
        return await poll_entries(
            lambda: self.aentries(state_id, after=after),
            None,
            watching=self._wakeups.watching(state_id),
        )

    async def asave(self, state: State) -> None:
        """The async twin of `save` (no thread: the work is in memory)."""
        await anyio.lowlevel.checkpoint()
        self.save(state)

    async def aload(self, state_id: str) -> State:
        """The async twin of `load`."""
        await anyio.lowlevel.checkpoint()
        return self.load(state_id)

    async def alist(
        self, *, parent_id: str | None = None, limit: int | None = None
    ) -> builtins.list[StateInfo]:
        """The async twin of `list`."""
        await anyio.lowlevel.checkpoint()
        return self.list(parent_id=parent_id, limit=limit)

    async def adelete(self, state_id: str) -> None:
        """The async twin of `delete`."""
        await anyio.lowlevel.checkpoint()
        self.delete(state_id)

    # -- memory ------------------------------------------------------------------------------

    def memory_get(self, agent: str, space: str, key: str) -> str | None:
        """The text stored under `key` in the agent's space, or None (see `MemoryBackend`)."""
        check_memory(agent, space, key)
        with self._lock:
            return self._spaces.get((agent, space), {}).get(key)

    def memory_scan(self, agent: str, space: str) -> builtins.list[tuple[str, str]]:
        """Every ``(key, text)`` of the agent's space, in key order."""
        check_memory(agent, space)
        with self._lock:
            return sorted(self._spaces.get((agent, space), {}).items())

    def memory_put(
        self, agent: str, space: str, key: str, data: str | None, *, effect: str | None = None
    ) -> bool:
        """Store `data` under `key` (None deletes it), once per `effect` key; whether it applied."""
        check_memory(agent, space, key, data=data, effect=effect)
        with self._lock:
            if effect is not None:
                applied = self._effects.setdefault(agent, set())
                if effect in applied:
                    return False
                applied.add(effect)
            if data is None:
                self._spaces.get((agent, space), {}).pop(key, None)
            else:
                self._spaces.setdefault((agent, space), {})[key] = data
            return True

    async def amemory_get(self, agent: str, space: str, key: str) -> str | None:
        """The async twin of `memory_get`."""
        await anyio.lowlevel.checkpoint()
        return self.memory_get(agent, space, key)

    async def amemory_scan(self, agent: str, space: str) -> builtins.list[tuple[str, str]]:
        """The async twin of `memory_scan`."""
        await anyio.lowlevel.checkpoint()
        return self.memory_scan(agent, space)

    async def amemory_put(
        self, agent: str, space: str, key: str, data: str | None, *, effect: str | None = None
    ) -> bool:
        """The async twin of `memory_put`."""
        await anyio.lowlevel.checkpoint()
        return self.memory_put(agent, space, key, data, effect=effect)


def _absent(state_id: str) -> LookupError:
    return LookupError(
        f"No State {state_id!r} in this MemoryStore: save it first, or pick an id from"
        " store.list()."
    )
