"""`Following`: the events of a run and its subagents, from the tree's feed, then live.

`Runs.follow` gives one. It reads the store's feed of the run's tree (`AsyncTreeFollowable`)
page by page, turns each entry into its durable events (`HistoryEvents`, one reader per
State), adds the live text of replies still streaming in this service, and waits for more.
Each event comes with an id that continues exactly after it.
"""

from __future__ import annotations

import builtins
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import anyio

from .._apps._durable import DurableEvent, EventId, HistoryEvents, progress_after
from .._apps._events import Event, TextDelta
from .._record._history import HistoryEntry
from .._record._storage import AsyncFollowable, AsyncTreeFollowable, TreeEntry

__all__ = ("Followed", "Following", "Live")


class Live(Protocol):
    """What a follower reads of a run running in this service (`Runs`' own record of it).

    `deltas` are the text deltas of replies still streaming, each numbered; each of
    `watchers` is called on each new delta and at the run's end; `done` is set once it ended.
    """

    @property
    def deltas(self) -> builtins.list[tuple[int, TextDelta]]:
        """The text deltas of replies still streaming, each with its number."""
        ...

    @property
    def watchers(self) -> set[Callable[[], object]]:
        """Called on each new delta and at the run's end (on the service's event loop)."""
        ...

    @property
    def done(self) -> anyio.Event:
        """Set once the run ended."""
        ...


_PAGE = 500  # entries read at once when a follower catches up


@dataclass(frozen=True, slots=True)
class Followed:
    """One event of a followed run, with the id that continues after it (`Runs.follow`)."""

    id: str
    event: Event


@dataclass(frozen=True, slots=True)
class _Resume:
    """Where a follower continues: after event `ordinal` of the entry at `cursor`.

    That entry is entry `index` of State `state_id` (ids before these two were added name
    only the cursor: then `state_id` is None and the feed is read from its start to find it).
    And after the live text delta `seq`, when the id came from this service (`boot`).
    """

    cursor: str | None = None
    ordinal: int = -1
    seq: int = 0
    state_id: str | None = None
    index: int = -1

    @classmethod
    def parse(cls, after: str | None, boot: str) -> _Resume:
        """Read an event id `Runs.follow` gave.

        It is ``cursor/state_id:index:ordinal`` (or, from earlier versions, ``cursor/ordinal``)
        for a durable event, then ``~boot.seq`` for live text.

        Raises:
            ValueError: `after` is not such an id.
        """
        if after is None:
            return cls()
        if not isinstance(after, str):
            raise TypeError(f"after must be an event id (str) or None, got {after!r}.")
        durable, tilde, live = after.partition("~")
        cursor, slash, place = durable.rpartition("/")
        event_id: EventId | None = None
        if cursor and slash and not place.isdigit():
            with contextlib.suppress(ValueError):
                event_id = EventId.parse(place)
        seen_boot, dot, seq = live.partition(".")
        durable_ok = durable == "" or (
            bool(cursor) and slash == "/" and (place.isdigit() or event_id is not None)
        )
        live_ok = not tilde or (dot == "." and seq.isdigit() and bool(seen_boot))
        if not (durable_ok and live_ok and (durable or tilde)):
            raise ValueError(
                f"{after!r} is not an event id of Runs.follow: pass the `id` of an event it"
                " gave (an SSE Last-Event-ID), or None to start at the beginning."
            )
        live_seq = int(seq) if tilde and seen_boot == boot else 0
        if event_id is not None:
            return cls(cursor, event_id.ordinal, live_seq, event_id.state_id, event_id.index)
        return cls(cursor or None, int(place) if durable else -1, live_seq)


class _Follower:
    """One follower's reading of a tree's feed: each State's durable events, and where it is.

    From the start of the feed, each State's reader reads its entries from the first. Resumed
    at an entry (`partial`), it reads the feed after that entry only: a State met there for
    the first time past its first entry is read up to it from its own history first
    (`unknown`, `resume`), so what a reconnect costs follows the tail, not the whole tree.
    """

    def __init__(self, root: str, start: _Resume, since: int, *, partial: bool = False) -> None:
        self.root = root
        self.start = start
        self.since = since
        self.partial = partial
        # the root's entries before `since` are not read out yet (a resumed client is past it)
        self.before = since > 0 and not partial
        self.skipping = start.cursor is not None and not partial
        self.readers: dict[str, HistoryEvents] = {}
        self.replied: dict[str, int] = {}  # by State: the turn of the last reply read
        self.last = ""  # the id of the last durable event given
        self.seq = start.seq
        # the root's last run has ended (None: not known yet, when resumed)
        self.ended: bool | None = None if partial else False

    def learn(self, state_id: str, entry: HistoryEntry) -> tuple[DurableEvent, ...]:
        """Read `entry`, the next of State `state_id`, and keep what follows from it."""
        reader = self.readers.get(state_id)
        if reader is None:
            reader = self.readers[state_id] = HistoryEvents(state_id)
        if entry.kind == "run_start" and reader.parent_id is None:
            reader.parent_id = entry.content.parent_id
            reader.parent_call_id = entry.content.parent_call_id
        elif entry.kind == "model_reply":
            self.replied[state_id] = max(self.replied.get(state_id, 0), entry.turn)
        events = reader.read(entry)
        if state_id == self.root and not self.before:
            for durable in events:
                if durable.event.kind in ("run_start", "run_end"):
                    self.ended = durable.event.kind == "run_end"
        return events

    def resume(self, state_id: str, entries: Sequence[HistoryEntry]) -> None:
        """Read the first entries of `state_id`, the ones a resumed client saw: no event made.

        The State's reader takes the progress after them (`progress_after`); its link, last
        reply and (for the root) whether its last run ended come from the same entries.
        """
        reader = self.readers.get(state_id)
        if reader is None:
            reader = self.readers[state_id] = HistoryEvents(state_id)
        reader.progress = progress_after(entries, reader.progress)
        started = False
        for entry in entries:
            if entry.kind == "run_start":
                started = True
                if reader.parent_id is None:
                    reader.parent_id = entry.content.parent_id
                    reader.parent_call_id = entry.content.parent_call_id
            elif entry.kind == "model_reply":
                self.replied[state_id] = max(self.replied.get(state_id, 0), entry.turn)
        if state_id == self.root and started:
            self.ended = not reader.progress.running

    def unknown(self, page: Sequence[TreeEntry]) -> dict[str, int]:
        """The States of `page` met past their first entry with nothing of them read yet.

        By id, the index of the first entry the page has of each: a resumed follower reads
        the ones before from the State's own history. Empty unless `partial`.
        """
        found: dict[str, int] = {}
        if self.partial:
            met: set[str] = set()
            for item in page:
                state_id = item.state_id
                if state_id not in met and state_id not in self.readers and item.index > 0:
                    found[state_id] = item.index
                met.add(state_id)
        return found

    def given(self, cursor: str, durable: DurableEvent) -> Followed:
        """`durable`, of the entry at `cursor`, as the client gets it: with its id."""
        self.last = f"{cursor}/{durable.id}"
        return Followed(self.last, durable.event)

    def read(self, item: TreeEntry) -> builtins.list[Followed]:
        """The events of the feed's next entry a client has not seen yet."""
        entry = item.entry
        if self.before and item.state_id == self.root and entry.seq >= self.since:
            self.before = False
        given: builtins.list[Followed] = []
        for durable in self.learn(item.state_id, entry):
            if self.before:
                continue
            if self.skipping:
                if item.cursor == self.start.cursor and durable.id.ordinal >= self.start.ordinal:
                    self.skipping = False
                continue
            given.append(self.given(item.cursor, durable))
        if self.skipping and item.cursor == self.start.cursor:
            self.skipping = False  # the client saw every event of its last entry
        return given

    def check_found(self, after: str | None) -> None:
        if self.skipping:
            raise ValueError(
                f"{after!r} is not an event id of run {self.root}: pass the id of an event"
                " this run's follow gave, or None to start at the beginning."
            )

    def live(self, running: Live, boot: str) -> builtins.list[Followed]:
        """The text deltas of replies still streaming that this client has not seen."""
        given: builtins.list[Followed] = []
        for seq, delta in running.deltas:
            if seq <= self.seq or delta.turn <= self.replied.get(delta.state_id, 0):
                continue
            self.seq = seq
            given.append(Followed(f"{self.last}~{boot}.{seq}", delta))
        return given


class Following:
    """`Runs.follow`'s iterator: pages of the tree's feed, then live text, then a wait.

    A plain iterator, not an async generator, so a client that stops early leaves nothing
    to close: between steps it holds no task group and no open wait.
    """

    def __init__(
        self,
        tree_feed: Callable[[], AsyncTreeFollowable],
        run_here: Callable[[str], Live | None],
        boot: str,
        state_id: str,
        after: str | None,
        since: int,
        elsewhere: Callable[[str], Awaitable[bool]] | None = None,
        recheck: float = 1.0,
    ) -> None:
        self._since = since
        self._elsewhere = elsewhere
        self._recheck = recheck
        self._tree_feed = tree_feed
        self._run_here = run_here
        self._boot = boot
        self._state_id = state_id
        self._after = after
        self._feed: AsyncTreeFollowable | None = None
        self._follower: _Follower | None = None
        self._cursor: str | None = None
        self._pending: deque[Followed] = deque()
        self._ended = False

    def __aiter__(self) -> Following:
        return self

    async def ready(self) -> None:
        """Check what was asked (the run, `after`) before the first event; raise what is wrong.

        Raises:
            TypeError, LookupError, ValueError: As `Runs.follow` says.
        """
        if self._follower is None:
            await self._begin()

    async def __anext__(self) -> Followed:
        while not self._pending:
            if self._ended:
                raise StopAsyncIteration
            await self._step()
        return self._pending.popleft()

    async def _begin(self) -> tuple[AsyncTreeFollowable, _Follower]:
        feed = self._tree_feed()
        root = await feed.aroot_of(self._state_id)
        if root != self._state_id:
            raise ValueError(
                f"State {self._state_id} is a subagent of run {root}: follow run {root}; its"
                " events cover every subagent (each names its state_id and parent_id)."
            )
        start = _Resume.parse(self._after, self._boot)
        if start.cursor is not None:
            await feed.atree_entries(root, after=start.cursor, limit=1)  # refuses a bad cursor
        partial = start.state_id is not None and isinstance(feed, AsyncFollowable)
        follower = _Follower(root, start, self._since, partial=partial)
        if partial:
            await self._resume(feed, follower, start)
            self._cursor = start.cursor
        self._feed, self._follower = feed, follower
        return feed, follower

    async def _resume(self, feed: AsyncTreeFollowable, follower: _Follower, start: _Resume) -> None:
        """Read the State of the entry the client saw last up to it; give the rest of its events.

        Raises:
            ValueError: The id names a State of another run, or an entry it does not have.
        """
        state_id, index, root = start.state_id, start.index, follower.root
        assert state_id is not None
        assert start.cursor is not None
        try:
            ours = state_id == root or await feed.aroot_of(state_id) == root
            entries = await self._entries(feed, state_id) if ours else ()
        except LookupError:
            entries = ()
        if index >= len(entries):
            raise ValueError(
                f"{self._after!r} is not an event id of run {root}: pass the id of an event"
                " this run's follow gave, or None to start at the beginning."
            )
        follower.resume(state_id, entries[:index])
        follower.last = f"{start.cursor}/{EventId(state_id, index, start.ordinal)}"
        for durable in follower.learn(state_id, entries[index]):
            if durable.id.ordinal > start.ordinal:
                self._pending.append(follower.given(start.cursor, durable))

    @staticmethod
    async def _entries(feed: AsyncTreeFollowable, state_id: str) -> tuple[HistoryEntry, ...]:
        """The stored entries of `state_id` (the feed is `AsyncFollowable` when resumed)."""
        assert isinstance(feed, AsyncFollowable)
        return await feed.aentries(state_id)

    async def _read(
        self, feed: AsyncTreeFollowable, follower: _Follower, page: Sequence[TreeEntry]
    ) -> None:
        """Add the events of `page` a client has not seen to `_pending`."""
        for state_id, index in follower.unknown(page).items():
            follower.resume(state_id, (await self._entries(feed, state_id))[:index])
        for item in page:
            self._pending.extend(follower.read(item))
            self._cursor = item.cursor

    async def _learn_live(self, feed: AsyncTreeFollowable, follower: _Follower, run: Live) -> None:
        """Learn the last reply of each State streaming text that a resumed follower has not met.

        The deltas of a reply already stored are not given (its `ModelReplied` has the text).
        """
        for state_id in {delta.state_id for _, delta in run.deltas}:
            if state_id in follower.readers or state_id in follower.replied:
                continue
            try:
                entries = await self._entries(feed, state_id)
            except LookupError:  # not saved yet: no reply of it is stored
                entries = ()
            turns = [entry.turn for entry in entries if entry.kind == "model_reply"]
            follower.replied[state_id] = max(turns, default=0)

    async def _root_ended(self, feed: AsyncTreeFollowable, root: str) -> bool:
        """Whether the root's last run has ended, from its own history (a resumed follower)."""
        entries = await self._entries(feed, root)
        started = any(entry.kind == "run_start" for entry in entries)
        return started and not progress_after(entries).running

    async def _step(self) -> None:
        """Add what comes next to `_pending`, waiting for it if need be; or end."""
        if self._feed is None or self._follower is None:
            feed, follower = await self._begin()
            if self._pending:
                return
        else:
            feed, follower = self._feed, self._follower
        root = follower.root
        page = await feed.atree_entries(root, after=self._cursor, limit=_PAGE)
        if page:
            await self._read(feed, follower, page)
            return
        follower.check_found(self._after)
        running = self._run_here(root)
        if running is not None:
            if follower.partial:
                await self._learn_live(feed, follower, running)
            self._pending.extend(follower.live(running, self._boot))
            if running.done.is_set():
                running = None
        if self._pending:
            return
        if running is not None:
            # Wait in this task for the next save of the tree, or the run's next delta or end
            # (which cancels the wait): no task of its own for either.
            with anyio.CancelScope() as scope:
                running.watchers.add(scope.cancel)
                try:
                    await feed.await_tree_entries(root, after=self._cursor, limit=1)
                finally:
                    running.watchers.discard(scope.cancel)
            return
        if follower.ended is None:
            # Resumed, and the root not met since: its history says. Its entries read may be
            # past the cursor, so the feed is read once more before anything ends.
            follower.ended = await self._root_ended(feed, root)
            return
        if follower.ended:
            self._ended = True
            return
        if self._elsewhere is not None and not await self._elsewhere(root):
            # Nothing runs it anywhere. Its owner saves before it gives the lease back, so one
            # more read has all there is (a process that died left what it had saved).
            page = await feed.atree_entries(root, after=self._cursor, limit=_PAGE)
            await self._read(feed, follower, page)
            self._ended = not page
            return
        if self._elsewhere is None:
            await feed.await_tree_entries(root, after=self._cursor, limit=1)
        else:
            with anyio.move_on_after(self._recheck):  # a process that dies saves nothing more
                await feed.await_tree_entries(root, after=self._cursor, limit=1)
