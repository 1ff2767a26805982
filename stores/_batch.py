"""Group commit: saves that arrive while one is being written go out together.

Many States saving at once (a lead with a thousand subagents) would otherwise queue one
transaction and one thread hop each. Saves join the open batch; the first to join leads it:
it writes the batch as soon as no other batch is being written, while the others of the batch
sleep until it is written. So each save wakes once, and only the leader twice. No task runs in
the background: the writer is always one of the callers. A leader cancelled before it starts
writing hands the lead to another save of its batch; once it starts, the write is shielded, so
the saves of its batch are never told they were written when they were not.

A save cancelled before its batch is taken for writing raises the cancellation and its State
is not written (unless another save of the batch waits for the same State); one cancelled while
its batch is written raises it too, and the State may have been written.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from weakref import WeakKeyDictionary

import anyio
import anyio.lowlevel

from orchestrator import State

__all__ = ("GroupCommit", "LoopGroupCommits")

Flush = Callable[[list[State]], Awaitable[dict[int, ValueError]]]

try:
    from sniffio import current_async_library as _running_library
except ModuleNotFoundError:  # then trio, which needs sniffio, is not installed either

    def _running_library() -> str:
        return "asyncio"


# The group commits of each event loop, by the `LoopGroupCommits` of their store.
_COMMITS: anyio.lowlevel.RunVar[WeakKeyDictionary[LoopGroupCommits, GroupCommit]] = (
    anyio.lowlevel.RunVar("stores_group_commits")
)


class _Batch:
    """States queued for one transaction, and what came of it."""

    __slots__ = ("changed", "done", "failure", "led", "refused", "saves", "states", "turn")

    def __init__(self) -> None:
        self.states: dict[int, State] = {}  # by id(state): a State queued twice is written once
        self.saves: dict[int, int] = {}  # by id(state): how many saves wait for it
        self.led = False  # a save of this batch has taken the lead
        self.turn = anyio.Event()  # set when the batch before it is written: the leader writes
        self.changed = anyio.Event()  # set when it is written, or its leader was cancelled
        self.done = False
        self.refused: dict[int, ValueError] = {}
        self.failure: BaseException | None = None

    def add(self, state: State) -> None:
        key = id(state)
        self.states.setdefault(key, state)
        self.saves[key] = self.saves.get(key, 0) + 1

    def drop(self, state: State) -> None:
        """Take back one save of `state` (cancelled); the State goes with its last save."""
        key = id(state)
        left = self.saves[key] - 1
        if left:
            self.saves[key] = left
        else:
            del self.saves[key], self.states[key]


class GroupCommit:
    """Batches concurrent saves on one event loop; `flush` writes one batch (in a thread)."""

    def __init__(self, flush: Flush) -> None:
        self._flush = flush
        self._open = _Batch()
        self._writing = False

    async def save(self, state: State) -> None:
        """Queue `state` and return once a transaction holding it committed.

        Raises what writing it raised: the `ValueError` of a refused State, or the failure of
        the whole transaction.
        """
        batch = self._open
        batch.add(state)
        try:
            while not batch.done:
                if batch.led:
                    await batch.changed.wait()
                else:
                    await self._lead(batch)
        except BaseException:
            if batch is self._open:  # cancelled before its batch was taken: not written
                batch.drop(state)
            raise
        if batch.failure is not None:
            raise batch.failure
        refused = batch.refused.get(id(state))
        if refused is not None:
            raise refused

    async def _lead(self, batch: _Batch) -> None:
        """Wait until no other batch is being written, then write `batch` (still the open one)."""
        batch.led = True
        try:
            while self._writing:
                await batch.turn.wait()
            await anyio.lowlevel.checkpoint_if_cancelled()  # not written if cancelled already
        except BaseException:  # cancelled before writing: another save of the batch leads
            batch.led = False
            changed, batch.changed = batch.changed, anyio.Event()
            changed.set()
            raise
        self._open = _Batch()
        self._writing = True
        try:
            with anyio.CancelScope(shield=True):  # a cancellation waits until it is written
                batch.refused = await self._flush(list(batch.states.values()))
        except Exception as error:
            batch.failure = error
        except BaseException as error:  # e.g. KeyboardInterrupt: raised here, not in every save
            batch.failure = RuntimeError(f"The write was interrupted ({error!r}); save again.")
            raise
        finally:
            batch.done = True
            self._writing = False
            batch.changed.set()
            if self._open.led:
                self._open.turn.set()


class LoopGroupCommits:
    """A store's `GroupCommit` on each event loop that saves through it.

    A group commit's events belong to the loop that made them, and a sync ``agent.run`` starts
    a new loop each time: so one per loop, found through a RunVar. That lookup costs about a
    microsecond and an object per save; on asyncio the last one found is kept beside a weak
    reference to its loop, and taken while that loop is the running one.
    """

    __slots__ = ("__weakref__", "_flush", "_last")

    def __init__(self, flush: Flush) -> None:
        self._flush = flush
        self._last: tuple[weakref.ref[object], GroupCommit] | None = None

    def current(self) -> GroupCommit:
        """The group commit of the running event loop."""
        # Not asyncio.get_running_loop() alone: trio run as a guest of an asyncio loop sees
        # that loop too, and its saves must not share asyncio's batches and events.
        loop = asyncio.get_running_loop() if _running_library() == "asyncio" else None
        last = self._last
        if loop is not None and last is not None and last[0]() is loop:
            return last[1]
        commits = _COMMITS.get(None)
        if commits is None:
            commits = WeakKeyDictionary[LoopGroupCommits, GroupCommit]()
            _COMMITS.set(commits)
        commit = commits.get(self)
        if commit is None:
            commit = commits[self] = GroupCommit(self._flush)
        if loop is not None:
            self._last = (weakref.ref(loop), commit)
        return commit
