"""What a store backend is built from: the names only a backend needs, in one public home.

A backend (ours, or yours: see the stores guide) implements `orchestrator.Store` and/or
`orchestrator.AsyncStore`. It reaches a State through these:

- `storage_view`: a `StorageView` of a State, the one way a backend reads it (its id, entries
  and info, all of one moment);
- `bind_state`: tie a saved or loaded State to its store, so its children save there too;
- `recover_state`: close a turn a crash cut off, when a State is loaded;
- `validate_id`: check an id (of a State, a parent, an agent) before any I/O.

A batch store (`orchestrator.BatchStore`) may also be a `NowaitBatchStore`: the core then tries
each batch on the event loop first, and the store declines (None) whenever it would wait.

And it keeps the rules every backend keeps with these:

- `continuation`: what a save may write after the stored `Tail` (new entries, encoded, with
  their chained digests) and the check that the State continues the stored history;
- `rebuild`: a loaded State from its stored lines, every digest checked;
- `listing_seal`: the seal of what `list` shows of a State, kept beside it and checked by `list`;
- `to_adopt`, `adopted`: the children crash recovery keeps in a cut-off call's result, each
  checked against its own history (the store's links are not covered by the digests);
- `select`, `check_list_args`, `check_memory`, `check_state`: the arguments and order of
  `list` and of the memory primitive, checked before any I/O;
- `TailCache`: where each stored history ends, for the States a store wrote or read recently,
  so a save need not read it back (bounded);
- `entries_after`, `check_after`, `poll_entries`: what `orchestrator.Followable` and
  `orchestrator.AsyncFollowable` need (the entries after a position, and a bounded poll that
  waits for new ones);
- `Wakeups`, `Waiter`: the followers in this process, woken by the store's own saves at once
  (from any thread or event loop), so they need not wait for the poll;
- `AsyncRateLimits`, `RateAsk`, `RateTimes`, `next_times`: what a store that shares rate
  limits across processes implements (`orchestrator.models.RateLimit(store=...)`): one row per
  key, moved on atomically by each take, and a key's concurrent slots, each a leased row taken
  atomically by one holder;
- `make_cursor`, `cursor_parts`, `check_limit`, `check_link`, `root_from`: what
  `orchestrator.TreeFollowable` needs (cursors of a store kind, checked when they come back;
  a page size; a stored entry checked against the one before it; a new State's root).

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
from collections.abc import Awaitable, Callable, Generator, Hashable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

import anyio

from orchestrator import HistoryEntry, State, StateInfo, StoreConflictError
from orchestrator._record._state import bind_state, recover_state, storage_view, validate_id
from orchestrator._record._storage import NowaitBatchStore, StorageView
from orchestrator._tooling._memory import validate_key, validate_space
from orchestrator.models._rate import AsyncRateLimits, RateAsk, RateTimes, next_times

from ._codec import (
    chain_digests,
    check_chain,
    damaged,
    decode_entry,
    encode_entry,
    first_digest,
    listing_seal,
)
from ._wakeups import Waiter, Wakeups

_E = TypeVar("_E")

__all__ = (
    "AsyncRateLimits",
    "Continuation",
    "NowaitBatchStore",
    "RateAsk",
    "RateTimes",
    "StorageView",
    "Tail",
    "TailCache",
    "Waiter",
    "Wakeups",
    "adopted",
    "bad_cursor",
    "bind_state",
    "check_after",
    "check_limit",
    "check_link",
    "check_list_args",
    "check_memory",
    "check_state",
    "continuation",
    "cursor_parts",
    "entries_after",
    "listing_seal",
    "make_cursor",
    "next_times",
    "not_a_root",
    "poll_entries",
    "rebuild",
    "recover_state",
    "root_from",
    "select",
    "storage_view",
    "to_adopt",
    "validate_id",
)


@dataclass(frozen=True, slots=True)
class Tail:
    """The end of a stored history: enough to check cheaply that a save continues it.

    `count` entries are stored; `line` is the last one's encoded line, `digest` its chained
    digest (`stores.chain_digests`), and `entry` that entry as an object, when this process has
    it (a State loaded or saved here holds the same object, so the usual check is one identity
    test). `at` is where the stored history ends in the backend's own terms, if it needs one
    (a `FileStore`'s log size).
    """

    count: int = 0
    line: bytes = b""
    entry: HistoryEntry | None = None
    digest: bytes = b""
    at: int = 0

    def holding(self, state: State) -> Tail:
        """This tail, with the last stored entry taken from `state` (which holds them all)."""
        if self.count == 0:
            return self
        entry = storage_view(state).entry(self.count - 1)
        return Tail(self.count, self.line, entry, self.digest, self.at)

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
        StoreConflictError: The State does not continue the stored history (see the module
            docstring); a `ValueError`.
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
        raise StoreConflictError(
            f"State {state.id!r} cannot be saved: the store holds {count} entries under this"
            " id and this State has fewer, so it is an older copy or another State. Load the"
            f" stored one with store.load({state.id!r}) and continue that one, or save this one"
            " under a new id (state.fork())."
        )
    boundary = view.entry(count - 1)
    if not tail.continued_by(state.id, boundary):
        raise StoreConflictError(
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
    alive each collection scans them all, a large part of loading a long history. Pausing is
    process-wide but brief, and it restores what it found, so an app that turned the collector
    off keeps it off.
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
            return State(id=state_id, history=entries)
        except (ValueError, TypeError) as error:
            raise damaged(where, state_id, f"its history cannot be replayed ({error})") from None


def check_after(after: object) -> int:
    """`after` if it is a position to follow from (an int >= -1); a `ValueError` otherwise."""
    if isinstance(after, bool) or not isinstance(after, int) or after < -1:
        raise ValueError(
            f"after must be the seq of an entry (an int >= 0), or -1 for all entries;"
            f" got {after!r}."
        )
    return after


def entries_after(state: State, after: int) -> tuple[HistoryEntry, ...]:
    """The entries of `state` (rebuilt from its store, every digest checked) after `after`."""
    return storage_view(state).entries(after + 1)


POLL_FIRST = 0.005
"""Seconds `poll_entries` waits after its first look; it doubles up to `POLL_MOST`."""
POLL_MOST = 0.1
"""The longest `poll_entries` waits between two looks."""


async def poll_entries(
    read: Callable[[], Awaitable[tuple[_E, ...]]],
    probe: Callable[[], Awaitable[Hashable]] | None,
    *,
    watching: contextlib.AbstractContextManager[Waiter] | None = None,
) -> tuple[_E, ...]:
    """Wait for `read()` to return entries, looking again each time `probe()` changes.

    `probe` is cheap (a file's size, a stored count) and says when `read` may find more: it is
    asked first, so a save landing between the two is seen at the next look. The looks are
    `POLL_FIRST` apart at first, then further apart up to `POLL_MOST`: no busy loop, and a new
    entry is seen at most `POLL_MOST` after it was stored. A cancellation ends it at once.
    `read` returns history entries or `TreeEntry` items alike.

    `watching` is a `Wakeups.watching` of what a save of the entries read wakes: a save in
    this process then ends the wait at once, and `read` looks without waiting for the next
    probe. With `probe` None nothing is polled (no other process saves: a `MemoryStore`), and
    only a wake makes `read` look again.
    """
    if probe is None and watching is None:
        raise TypeError("poll_entries needs a probe, a watching, or both.")
    with contextlib.nullcontext(None) if watching is None else watching as waiter:
        interval = POLL_FIRST
        seen: Hashable = object()  # equal to no probe: the first look reads
        while True:
            now = None if probe is None else await probe()
            if probe is None or now != seen:
                seen = now
                new = await read()
                if new:
                    return new
                interval = POLL_FIRST
            if waiter is None:
                await anyio.sleep(interval)
            elif await waiter.wait(None if probe is None else interval):
                seen = object()  # woken by a save here: read, whatever the probe says
                interval = POLL_FIRST
                continue
            interval = min(interval * 2, POLL_MOST)


# -- the feed of a tree (`orchestrator.TreeFollowable`) --------------------------------------

_CURSOR_KINDS = {
    "mem": "a MemoryStore",
    "file": "a FileStore",
    "sqlite": "an SQLite store",
    "pg": "a PostgreSQL store",
}


def make_cursor(kind: str, *parts: object) -> str:
    """The cursor of a feed position: ``<kind>:<part>.<part>...`` (see `cursor_parts`)."""
    return f"{kind}:{'.'.join(str(part) for part in parts)}"


def cursor_parts(after: object, kind: str, example: str, count: int) -> list[str] | None:
    """The `count` parts of the cursor `after` of a store of `kind`; None for ``after=None``.

    `example` is a cursor of the kind, shown when `after` is not one. A store checks the parts
    themselves (numbers, ids) and says what is wrong the same way (`bad_cursor`).

    Raises:
        ValueError: `after` is not a str of ``kind:`` and `count` dot-separated parts, or it is
            the cursor of another kind of store (the message names both).
    """
    if after is None:
        return None
    if isinstance(after, str):
        kind_of, _, rest = after.partition(":")
        if kind_of != kind and kind_of in _CURSOR_KINDS:
            raise ValueError(
                f"after {after!r} is a cursor of {_CURSOR_KINDS[kind_of]}, and this is"
                f" {_CURSOR_KINDS.get(kind, kind)}: a cursor only works with the store that"
                " made it. Start again with after=None."
            )
        parts = rest.split(".", count - 1)
        if kind_of == kind and len(parts) == count and all(parts):
            return parts
    raise bad_cursor(after, example)


def bad_cursor(after: object, example: str, why: str = "") -> ValueError:
    """The error for `after` that is not a cursor this store made."""
    because = f" ({why})" if why else ""
    return ValueError(
        f"after must be the cursor of an entry this store returned (a TreeEntry's cursor, such"
        f" as {example!r}), or None for the whole tree; got {after!r}{because}."
    )


def not_a_root(state_id: str, root_id: str) -> ValueError:
    """The error for following the tree of a State that is not a root."""
    return ValueError(
        f"State {state_id!r} is not the root of a tree: its root is {root_id!r}. Follow the"
        f" tree of {root_id!r} (root_of gives it) and keep the entries of the States you want."
    )


def check_limit(limit: object) -> int | None:
    """`limit` if it is None or an int >= 1 (how many entries a page holds at most)."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be an int >= 1, or None for all; got {limit!r}.")
    return limit


def check_link(
    where: str, state_id: str, seq: int, line: bytes, digest: object, previous: object
) -> HistoryEntry:
    """The stored entry `seq` of `state_id`, checked against the stored digest before it.

    `previous` is the stored digest of entry ``seq - 1`` (unused for entry 0, which chains from
    the State's id). A feed reads entries of many States page by page: each is checked against
    its own link of the chain, so a changed entry is damage, as in a load, without reading the
    whole history again.

    Raises:
        StoreDamagedError: The entry fails its check, or does not decode to entry `seq`.
    """
    start = first_digest(state_id) if seq == 0 else previous
    if not isinstance(start, bytes) or chain_digests(start, (line,))[0] != digest:
        raise damaged(
            where,
            state_id,
            f"history entry {seq} fails its integrity check (it was changed, or an entry"
            " before it was removed, repeated or moved)",
        )
    return decode_entry(line, state_id=state_id, index=seq, where=where)


def root_from(view: StorageView, batch: dict[str, StorageView]) -> tuple[str | None, str]:
    """Where a new State's root comes from: (the State whose root it takes, or None; its own id).

    A new State takes the root of its stored parent (or the parent itself, if the parent is a
    root); with no stored parent it is a root. A parent saved in the same batch (`batch`, the
    new States of it by id) is walked up first, so a batch saves as if one State at a time.
    The backend looks up the first, in its own storage, and falls back to the second.
    """
    first = view
    seen = {view.id}
    while first.parent_id is not None and first.parent_id in batch and first.parent_id not in seen:
        first = batch[first.parent_id]
        seen.add(first.id)
    return first.parent_id, first.id


def to_adopt(state: State, listed: Iterable[StateInfo]) -> builtins.list[StateInfo]:
    """The `listed` children of `state` that crash recovery would keep: its pending calls'.

    `listed` is what the store's links say (a `list(parent_id=state.id)`, a list of children
    kept beside the State). Those links are not covered by the digests, so a backend opens each
    State returned here from its own history (without recovering it) and gives it to `adopted`
    before it calls `recover_state`.
    """
    pending = {call.id for call in state.pending_calls}
    return [info for info in listed if info.parent_call_id in pending and info.id != state.id]


def adopted(where: str, parent: State, listed: StateInfo, child: State) -> StateInfo | None:
    """The info of `child` from its own history, once its link to `parent` is checked.

    `listed` is what the store's link said of `child` (`to_adopt`); `child` is that State as
    its own digested history holds it (not recovered). Its first ``run_start`` names the State
    and the call that started it: they must be `parent` and the listed call. The info returned
    (usage included) comes from the history, never from a listing column. None when `child`
    never ran (no ``run_start``): nothing of it started under the call, so it is left out (a
    `FileStore` notes a child before it writes its first run, and a crash may come between).

    Raises:
        StoreDamagedError: The child's history names another parent or call: the link was
            changed, and recovery would list a stranger's work (and answer) as the call's.
    """
    call = listed.parent_call_id
    if not any(entry.kind == "run_start" for entry in child.history):
        return None
    if child.id == listed.id and child.parent_id == parent.id and child.parent_call_id == call:
        return storage_view(child).info
    said = (
        "no parent"
        if child.parent_id is None
        else f"State {child.parent_id!r}, call {child.parent_call_id!r}"
    )
    raise damaged(
        where,
        parent.id,
        f"the store links State {listed.id!r} to its cut-off call {call!r}, but that State's"
        f" own history says it was started by {said}: the link was changed, so the call's"
        " children cannot be recovered",
    )


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


# -- where stored histories end ---------------------------------------------------------------

_LONGEST_LINE = 64 * 1024  # bytes of a last entry's encoded line worth keeping


class TailCache:
    """Where the stored history of each recently written or read State ends, by id.

    A save must know the stored end of its State (a `Tail`) to write only what follows and to
    check that the State continues it; reading it back costs a query or a file read per save.
    A store keeps the tails it wrote or read here instead. At most `limit` are kept (the least
    recently used go first), and none whose last line is long (an image): a long-lived store
    holds a bounded amount.

    `current` and `trust` let a backend keep the cache only while nobody else wrote: SQLite's
    ``PRAGMA data_version``, for one, changes exactly when another connection committed.
    """

    __slots__ = ("_limit", "_tails", "_version")

    def __init__(self, limit: int = 4096) -> None:
        self._limit = limit
        self._tails: dict[str, Tail] = {}
        self._version: object = None

    def get(self, state_id: str) -> Tail | None:
        """The stored end of `state_id`, if known (else read it from storage)."""
        return self._tails.get(state_id)

    def put(self, state_id: str, tail: Tail) -> None:
        """Remember `tail` once what wrote or read it is durable."""
        tails = self._tails
        tails.pop(state_id, None)  # to the end: the most recently used is forgotten last
        if len(tail.line) > _LONGEST_LINE:
            return
        tails[state_id] = tail
        if len(tails) > self._limit:
            del tails[next(iter(tails))]

    def forget(self, state_id: str) -> None:
        """Drop what is known of `state_id`: it was deleted, or a write of it is under way."""
        self._tails.pop(state_id, None)

    def current(self, version: object) -> bool:
        """Whether storage is still at the `version` given to `trust`; else forget everything."""
        if version == self._version:
            return True
        self._tails.clear()
        self._version = None
        return False

    def trust(self, version: object) -> None:
        """Keep what is known while storage stays at `version`."""
        self._version = version

    @property
    def trusted(self) -> object:
        """The version given to `trust`, or None: before it, and once `current` found another."""
        return self._version
