"""`MemoryStore`, and the bookkeeping every backend shares to continue a stored history.

The shared part (`Tail`, `continuation`, `rebuild`, `select`) is written once here, next to the
simplest backend that uses it: what a save may write, how a load rebuilds and recovers a State,
and how `list` orders and filters.

`check_memory` checks the arguments of the memory primitive (`orchestrator.MemoryBackend`) for every
backend, before any I/O.

The save rule: a save only ever adds entries. The State saved must continue the stored history:
it holds at least the stored entries, and its entry at the stored end is the stored last entry
(compared by identity, else by its encoded bytes, so the check costs one entry, not the whole
history). Anything else (another State under an id that is taken, an older copy that has fewer
entries) raises `ValueError` telling to `load` the stored State, or to save under a new id.
"""

from __future__ import annotations

import builtins
import contextlib
import gc
import threading
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import anyio.lowlevel

from orchestrator import (
    HistoryEntry,
    State,
    StateInfo,
    StorageView,
    bind_state,
    recover_state,
    storage_view,
    validate_id,
)
from orchestrator._memory import validate_key, validate_space

from ._codec import (
    chain_digests,
    check_chain,
    damaged,
    decode_entry,
    encode_entry,
    first_digest,
)

__all__ = (
    "Continuation",
    "MemoryStore",
    "Tail",
    "check_list_args",
    "check_memory",
    "check_state",
    "continuation",
    "rebuild",
    "select",
)


@dataclass(frozen=True, slots=True)
class Tail:
    """The end of a stored history: enough to check cheaply that a save continues it.

    `count` entries are stored; `line` is the last one's encoded line, `digest` its chained
    digest (`stores._codec.chain_digests`), and `entry` that entry as an object, when this
    process has it (a State loaded or saved here holds the same object, so the usual check is
    one identity test).
    """

    count: int = 0
    line: bytes = b""
    entry: HistoryEntry | None = None
    digest: bytes = b""

    def holding(self, state: State) -> Tail:
        """This tail, with the last stored entry taken from `state` (which holds them all)."""
        if self.count == 0:
            return self
        return Tail(self.count, self.line, storage_view(state).entry(self.count - 1), self.digest)

    def continued_by(self, state_id: str, boundary: HistoryEntry) -> bool:
        """Whether `boundary` is the stored last entry.

        It is when it is the same object, encodes to the same line, or (a line written by
        another library version, encoded differently) decodes to an equal entry.
        """
        if boundary is self.entry or encode_entry(boundary) == self.line:
            return True
        if not self.line:
            return False
        stored = decode_entry(self.line, state_id=state_id, index=self.count - 1)
        return stored == boundary and stored.at == boundary.at


def check_state(state: object) -> State:
    """`state` if it is a State; a `TypeError` saying what a store saves otherwise."""
    if not isinstance(state, State):
        raise TypeError(f"A store saves State objects, got {type(state).__name__}.")
    return state


@dataclass(frozen=True, slots=True)
class Continuation:
    """What a save writes: the new entries' encoded lines and digests, and the tail after them."""

    lines: tuple[bytes, ...]
    digests: tuple[bytes, ...]
    tail: Tail


def continuation(view: StorageView, tail: Tail) -> Continuation:
    """The encoded entries of `view` after `tail`, their digests, and the tail once written.

    Only the new entries are encoded (plus, at most, the stored last one to compare it).

    Raises:
        ValueError: The State does not continue the stored history (see the module docstring).
    """
    state = view  # the messages below name the State by its id
    count = tail.count
    if count == 0:
        entries = view.entries()
        if not entries:
            return Continuation((), (), tail)
        lines = tuple([encode_entry(entry) for entry in entries])
        digests = tuple(chain_digests(first_digest(view.id), lines))
        return Continuation(lines, digests, Tail(len(entries), lines[-1], entries[-1], digests[-1]))
    if view.count < count:
        raise ValueError(
            f"State {state.id!r} cannot be saved: the store holds {count} entries under this"
            " id and this State has fewer, so it is an older copy or another State. Load the"
            f" stored one with store.load({state.id!r}) and continue that one, or save this one"
            " under a new id (state.fork())."
        )
    boundary = view.entry(count - 1)
    if not tail.continued_by(state.id, boundary):
        raise ValueError(
            f"State {state.id!r} cannot be saved: the store already holds a State with this id"
            f" whose history is different (entry {count - 1} differs), and a save only adds"
            " entries to the history it continues. Load the stored one with"
            f" store.load({state.id!r}) and continue that one, or save this one under a new id"
            " (state.fork())."
        )
    added = view.count - count
    if added == 0:
        return Continuation((), (), Tail(count, tail.line, boundary, tail.digest))
    if added == 1:  # the usual save: one entry since the last
        entry = view.entry(count)
        lines = (encode_entry(entry),)
        digests = tuple(chain_digests(tail.digest, lines))
        return Continuation(lines, digests, Tail(count + 1, lines[0], entry, digests[0]))
    new = view.entries(count)
    lines = tuple([encode_entry(entry) for entry in new])
    digests = tuple(chain_digests(tail.digest, lines))
    return Continuation(lines, digests, Tail(count + added, lines[-1], new[-1], digests[-1]))


@contextlib.contextmanager
def _collector_paused() -> Generator[None, None, None]:
    """Pause the cyclic garbage collector while a history is decoded and replayed.

    Those steps only create objects that live on (no cycles to free), yet with many objects
    alive each collection scans them all: on CPython 3.11 it took about 40% of a 100,000-entry
    load. Pausing is process-wide but brief, and it restores what it found, so an app that
    turned the collector off keeps it off.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def rebuild(
    state_id: str,
    lines: Sequence[bytes | str],
    digests: Sequence[object] | None,
    *,
    where: str,
    count: int | None = None,
    head: object = None,
) -> State:
    """The State whose encoded entries are `lines`, not yet recovered or bound.

    `digests` are the stored digests of `lines` (None: format 1, which had none); `count` and
    `head` what the State's info says of its history (see `stores._codec.check_chain`).

    Raises:
        StoreDamagedError: An entry is damaged, out of place or fails its integrity check, or
            the entries do not replay into a State; the message names `where` (the store), the
            State and the entry's index.
    """
    raw = [line.encode() if isinstance(line, str) else line for line in lines]
    if digests is not None:
        check_chain(where, state_id, raw, digests, count=count, head=head)
    with _collector_paused():
        entries = [
            decode_entry(line, state_id=state_id, index=i, where=where)
            for i, line in enumerate(raw)
        ]
    try:
        with _collector_paused():
            return State(id=state_id, history=entries)
    except (ValueError, TypeError) as error:
        raise damaged(where, state_id, f"its history cannot be replayed ({error})") from None


def check_list_args(parent_id: str | None, limit: int | None) -> None:
    """Check the arguments of `list`: a valid id or None, and a count >= 0 or None."""
    if parent_id is not None:
        validate_id(parent_id, "parent_id")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
        raise TypeError(f"limit must be an int or None, got {type(limit).__name__}.")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 (or None for all), got {limit}.")


def check_memory(
    agent: object,
    space: object,
    key: object = None,
    *,
    data: object = None,
    effect: object = None,
) -> None:
    """Check the arguments of a memory call (`key` None: a scan).

    Raises:
        TypeError, ValueError: The agent name is not an id, the space or key is not a str of
            the allowed length, `data` is not a str or None, or `effect` is not a non-empty
            str or None.
    """
    validate_id(agent, "agent")
    validate_space(space)
    if key is not None:
        validate_key(key)
    if data is not None and not isinstance(data, str):
        raise TypeError(f"data must be JSON text (a str) or None, got {type(data).__name__}.")
    if effect is not None and (not isinstance(effect, str) or not effect):
        raise TypeError(f"effect must be a non-empty str or None, got {effect!r}.")


_OLDEST = datetime.min


def _updated(info: StateInfo) -> datetime:
    at = info.updated_at
    if at is None:
        return _OLDEST
    return at if at.tzinfo is None else at.astimezone(UTC).replace(tzinfo=None)


def select(
    infos: Iterable[StateInfo], *, parent_id: str | None, limit: int | None
) -> builtins.list[StateInfo]:
    """What `list` returns: the States picked and ordered.

    Only children of `parent_id` (all if None), most recently updated first (ties by id), at
    most `limit` of them.
    """
    chosen = [info for info in infos if parent_id is None or info.parent_id == parent_id]
    chosen.sort(key=lambda info: info.id)
    chosen.sort(key=_updated, reverse=True)
    return chosen if limit is None else chosen[:limit]


@dataclass(slots=True)
class _Saved:
    lines: builtins.list[bytes]
    digests: builtins.list[bytes]
    info: StateInfo
    tail: Tail


class MemoryStore:
    """Keeps States in this process, encoded exactly as the other backends store them.

    A loaded State is a new object rebuilt from the stored entries, as with every backend, so
    tests written against a `MemoryStore` hold for the others. It implements `Store` and
    `AsyncStore` without threads, keeps agent memory (`MemoryBackend`, `AsyncMemoryBackend`),
    and is thread-safe. Everything is lost when it is dropped.

    Example:
        ```python
        store = MemoryStore()
        agent = Agent(FakeModel(["Hi!"]), store=store)
        state = State(messages=[Message.user("Hello")])
        agent.run(state)
        assert store.load(state.id).answer == "Hi!"
        ```
    """

    __slots__ = ("_effects", "_lock", "_spaces", "_states")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict[str, _Saved] = {}
        self._spaces: dict[tuple[str, str], dict[str, str]] = {}  # (agent, space): key -> text
        self._effects: dict[str, set[str]] = {}  # agent: the effect keys applied

    def __repr__(self) -> str:
        return f"<MemoryStore states={len(self._states)}>"

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
                self._states[state.id] = _Saved(list(new.lines), list(new.digests), info, new.tail)
            else:
                if new.lines:
                    saved.lines.extend(new.lines)
                    saved.digests.extend(new.digests)
                    saved.info = info
                saved.tail = new.tail
        bind_state(state, self)

    def load(self, state_id: str) -> State:
        """The State saved under `state_id`, recovered if a turn was cut off, bound to this store.

        Raises:
            LookupError: Nothing is saved under `state_id`.
            ValueError: `state_id` is not a valid id, or a stored entry is damaged.
        """
        validate_id(state_id, "state_id")
        with self._lock:
            saved = self._states.get(state_id)
            if saved is None:
                raise LookupError(
                    f"No State {state_id!r} in this MemoryStore: save it first, or pick an id"
                    " from store.list()."
                )
            lines, digests = tuple(saved.lines), tuple(saved.digests)
        state = rebuild(state_id, lines, digests, where="MemoryStore")
        if lines:
            with self._lock:
                saved = self._states.get(state_id)
                if saved is not None and saved.tail.count == len(lines):
                    saved.tail = saved.tail.holding(state)
        children = self.list(parent_id=state_id) if state.pending_calls else ()
        recover_state(state, children)
        bind_state(state, self)
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
