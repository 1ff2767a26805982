"""Group commit: the saves made at once on one event loop, written in one transaction.

Agents running at once (a thousand subagents, say) each save at their save points. A store
that can save several States together (`BatchStore.save_many`, `AsyncBatchStore.asave_many`)
gets them together: the saves that arrive while one transaction is written go out in the
next. This is the one place that gathers saves, for every backend; a backend only writes the
batch it is handed.

A store has one `GroupCommit` per event loop (its lock and events belong to that loop, and a
sync ``agent.run`` starts a new loop each time), kept by `GroupCommits`, which the store's
client holds. It keys them weakly by the loop (asyncio's loop, trio's token): a loop that ends
drops its group commit, and nothing the loop holds keeps the store alive, so a store dropped
while its loop runs is collected (and closed) like any other object.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

import anyio
import anyio.lowlevel

if TYPE_CHECKING:
    from ._state import State

__all__ = ("Flush", "GroupCommit", "GroupCommits", "Now", "save_now_or_flush")

Flush = Callable[[Sequence["State"]], Awaitable[dict[int, ValueError]]]
"""Writes States in one transaction; the refused States' errors, by position."""
Now = Callable[[Sequence["State"]], "dict[int, ValueError] | None"]
"""Writes States in one transaction if nothing makes it wait, with no await; else None
(`NowaitBatchStore.save_many_nowait`)."""


async def save_now_or_flush(
    now: Now | None, flush: Flush, states: Sequence[State]
) -> dict[int, ValueError]:
    """Write `states` with `now`, with no await; if it declines (or there is none), with `flush`."""
    refused = None if now is None else now(states)
    return await flush(states) if refused is None else refused


class _Batch:
    """The States of saves waiting to go out in one transaction, and what came of it."""

    __slots__ = ("done", "failure", "refused", "saves", "states", "taken", "writer")

    def __init__(self) -> None:
        self.states: dict[int, State] = {}  # by id(state): a State saved twice is written once
        self.saves: dict[int, int] = {}  # by id(state): how many saves wait for it
        self.writer = False  # one of its saves will write it
        self.taken = False  # its writer took it: it is being written, or was
        self.done = anyio.Event()
        self.refused: dict[int, ValueError] = {}  # by id(state)
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
    """Saves on one event loop that arrive while a transaction is written go out in the next.

    The first save of the open batch writes it: it lets the tasks already scheduled run once
    (so saves started together share one transaction; not a save told it is alone), waits,
    shielded, for the writer's lock (the batch before may still be written), takes the batch,
    writes it and wakes the batch's other saves, which wait for that. Only writers queue on
    the lock, one per batch, so a thousand saves wake together. No task runs in the
    background: the writer is always one of the callers. A save told it is alone that finds
    no save waiting and no write under way is written at once, with no batch made for it.

    `flush` writes a batch (awaited: a worker thread, say). `now`, if given, is tried first:
    a store's write that needs no await, which declines when it would have to wait (then
    `flush` writes). A save alone written by `now` takes neither the lock nor a shield: with no
    await, nothing can join it or cancel it.

    A save in a cancelled scope raises at once and is not written; a waiting save cancelled
    before its batch is taken is not written either (unless another save waits for the same
    State). A writer is shielded until its batch is written, then raises a cancellation that
    came meanwhile, as does a waiting save cancelled while its batch is written: the State may
    have been written.
    """

    __slots__ = ("__weakref__", "_flush", "_lock", "_now", "_open")

    def __init__(self, flush: Flush, now: Now | None = None) -> None:
        self._flush = flush
        self._now = now
        # Taken without a checkpoint of its own when free: the writer yields once on purpose
        # before it (see `save`), and a second loop pass would only add to every save.
        self._lock = anyio.Lock(fast_acquire=True)
        self._open = _Batch()

    async def save(self, state: State, *, gather: bool = True) -> None:
        """Queue `state` and return once a transaction holding it committed.

        With `gather` False a save that writes its batch does not first let the loop's other
        tasks run: for a save that nothing started with it could join (one run saving alone),
        that pass of the loop only made it later.

        Raises what writing it raised: the `ValueError` of a refused State, or the failure of
        the whole transaction.
        """
        await anyio.lowlevel.checkpoint_if_cancelled()
        batch = self._open
        if not gather and not batch.saves and not self._lock.locked():
            now = self._now
            refused = None if now is None else now((state,))
            if refused is None:  # it would wait: to `flush`
                await self._save_alone(state)
            elif refused:
                raise refused[0]
            return
        batch.add(state)
        if batch.writer:
            try:
                await batch.done.wait()
            except BaseException:
                if not batch.taken:  # cancelled before its batch went out: not written
                    batch.drop(state)
                raise
        else:
            batch.writer = True
            with anyio.CancelScope(shield=True):
                if gather:
                    # One pass of the loop, so the saves already scheduled join this batch.
                    # Without it, 100 saves started at once went out as 1 + 99: two commits.
                    await anyio.lowlevel.cancel_shielded_checkpoint()
                async with self._lock:
                    batch.taken = True
                    if self._open is batch:
                        self._open = _Batch()
                    await self._write(batch)
            await anyio.lowlevel.checkpoint_if_cancelled()
        if batch.failure is not None:
            raise batch.failure
        refused = batch.refused.get(id(state))
        if refused is not None:
            raise refused

    async def _save_alone(self, state: State) -> None:
        """Write `state` alone: no save waits to join it, and no transaction is under way.

        It is what `save` would do with a batch of one, without the batch: a save that comes
        while it is written opens the next batch, as it would.
        """
        refused: dict[int, ValueError] = {}
        with anyio.CancelScope(shield=True):
            async with self._lock:
                refused = await self._flush((state,))
        await anyio.lowlevel.checkpoint_if_cancelled()
        if refused:
            raise refused[0]

    async def _write(self, batch: _Batch) -> None:
        try:
            states = list(batch.states.values())
            refused = await save_now_or_flush(self._now, self._flush, states)
            batch.refused = {id(states[at]): error for at, error in refused.items()}
        except Exception as error:
            batch.failure = error
        except BaseException as error:  # e.g. KeyboardInterrupt: raised here, not in every save
            batch.failure = RuntimeError(f"The write was interrupted ({error!r}); save again.")
            raise
        finally:
            batch.done.set()


class GroupCommits:
    """A store's `GroupCommit` on each event loop that saves through it, kept weakly by loop.

    `save` is the save the core makes: it joins the running loop's group commit. Loops in
    several threads may save through one store at once; each has its own.
    """

    __slots__ = ("__weakref__", "_commits", "_flush", "_mutex", "_now")

    def __init__(self, flush: Flush, now: Now | None = None) -> None:
        self._flush = flush
        self._now = now
        self._commits = WeakKeyDictionary[object, GroupCommit]()
        self._mutex = threading.Lock()

    def current(self) -> GroupCommit:
        """The group commit of the running event loop (asyncio's loop, or trio's token)."""
        loop = anyio.lowlevel.current_token().native_token
        with self._mutex:
            commit = self._commits.get(loop)
            if commit is None:
                commit = self._commits[loop] = GroupCommit(self._flush, self._now)
        return commit

    def save(self, state: State) -> Awaitable[None]:
        """Save `state` with the other saves on this loop; await it (see `GroupCommit.save`)."""
        return self.current().save(state)

    def save_alone(self, state: State) -> Awaitable[None]:
        """`save` for a save nothing else started with: its batch goes out without a loop pass."""
        return self.current().save(state, gather=False)
