"""A child run elsewhere, counted against the limits above it as it saves.

A runner elsewhere (`RayRunner`, another process) runs a child where the budgets here cannot
see it spend. While the parent's call waits for it, `run_followed` reads the store's feed of
the tree (`AsyncTreeFollowable.await_tree_entries`) and counts what the child and its own
children save: each reply's usage (an ask's and a compaction's too), each tool call and each
new child, against every budget up the chain, as each save commits. When a limit above is used
up, the child is stopped the way a cancellation of its call stops it (it records
``interrupted`` and is saved), and the parent's call says which limit stopped it.

A child a crash cut off, continued elsewhere by its reloaded parent, is followed the same way.
What it saved before is in the reloaded budget already (its parent's history holds its usage
as of the load), so those entries are taken as counted (`Spending.known`) and only what it
saves from then on is counted.

When the child ended, what it spent that the feed did not show (a State saved in another
store, or a store without a tree feed) is counted from its State: its usage less what was
counted. Nothing is counted twice: each entry once, by State id and index.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

from .._base._logs import get_log
from .._base._reply import Usage, usage_since
from .._record._history import (
    AskEntry,
    ContextChangeEntry,
    HistoryEntry,
    ModelReplyEntry,
    RunStartEntry,
    ToolResultEntry,
)
from .._record._state import State
from ._budget import Budget, spend_elsewhere, used_up
from ._runner import load_state

if TYPE_CHECKING:
    from .._base._stopped import StoppedByLimit
    from .._record._storage import AsyncTreeFollowable, TreeEntry
    from ._runner import ChildJob, Runner

__all__ = ("Spending", "run_followed")

_log = get_log("limits")

_PAGE = 500  # entries read at once


class Spending:
    """What a child run elsewhere, and the children below it, spent as counted here."""

    __slots__ = (
        "budget",
        "child_id",
        "counted",
        "cursor",
        "failed",
        "ours",
        "root",
        "seen",
        "stopped",
        "usage",
    )

    def __init__(
        self,
        budget: Budget,
        child_id: str,
        counted: list[str],
        *,
        after: str | None = None,
        before: Usage | None = None,
    ) -> None:
        self.budget = budget
        self.child_id = child_id
        self.counted = counted  # the children spending here, against the budgets as they run
        self.ours: set[str] = {child_id}  # the child and every State started below it
        self.seen: set[tuple[str, int]] = set()  # (State id, entry index) counted
        # The usage counted, of all of them: a resumed child's `before` was, on its reload.
        self.usage = Usage() if before is None else before
        self.root: str | None = None
        self.failed = False  # the feed could not be read: counted when it ends
        self.cursor = after  # where the feed is read from: what came before is not the child's
        self.stopped: StoppedByLimit | None = None

    def read(self, item: TreeEntry, *, count: bool = True) -> None:
        """Count the feed's entry `item` if it is the spending of the child or one below it.

        With `count` false, only taken as counted (an entry saved before a crash).
        """
        state_id, entry = item.state_id, item.entry
        key = (state_id, item.index)
        if key in self.seen or self.child_id in self.counted:
            return  # counted already, or a runner ran it here after all: it spent as it ran
        children = 0
        if state_id not in self.ours:
            if not isinstance(entry, RunStartEntry) or entry.parent_id not in self.ours:
                return
            self.ours.add(state_id)  # started by the child or one below it
            children = 1
        self.seen.add(key)
        if not count:
            return
        usage = _spent_by(entry)
        tool_calls = 1 if isinstance(entry, ToolResultEntry) and not entry.late else 0
        if usage is not None or tool_calls or children:
            usage = usage or Usage()
            self.usage = self.usage + usage
            spend_elsewhere(self.budget, state_id, usage, tool_calls=tool_calls, children=children)

    async def known(self, feed: AsyncTreeFollowable, parent_id: str) -> None:
        """Take what the tree saved so far as counted: a resumed child's earlier entries.

        Read before the child runs again. A feed that cannot be read is logged; the child is
        then counted when it ends (`rest`).
        """
        try:
            self.root = await feed.aroot_of(parent_id)
            while page := await feed.atree_entries(self.root, after=self.cursor, limit=_PAGE):
                self.take(page, count=False)
        except Exception as error:  # the child's own outcome matters, not the follower's
            _log.warning("state.limit.unfollowed", state_id=self.child_id, error=f"{error!r}")
            self.root, self.failed = None, True

    async def follow(self, feed: AsyncTreeFollowable, parent_id: str) -> None:
        """Count the child's saves as they commit; return once a limit above is used up.

        A feed that cannot be read (the parent not stored there) is logged and left: this
        then waits until the child's end cancels it, and the child is counted then.
        """
        try:
            if self.failed:
                await anyio.sleep_forever()
            if self.root is None:
                self.root = await feed.aroot_of(parent_id)
            while True:
                page = await feed.await_tree_entries(self.root, after=self.cursor, limit=_PAGE)
                self.take(page)
                stopped = used_up(self.budget)
                if stopped is not None:
                    self.stopped = stopped
                    return
        except Exception as error:  # the child's own outcome matters, not the follower's
            _log.warning("state.limit.unfollowed", state_id=self.child_id, error=f"{error!r}")
        self.root = None  # counted when it ends instead
        await anyio.sleep_forever()

    async def catch_up(self, feed: AsyncTreeFollowable) -> None:
        """Count the entries saved since the last page read (the child ended)."""
        if self.root is None:
            await anyio.lowlevel.checkpoint()
            return
        try:
            while page := await feed.atree_entries(self.root, after=self.cursor, limit=_PAGE):
                self.take(page)
        except Exception as error:  # what is left is counted from the child's State
            _log.warning("state.limit.unfollowed", state_id=self.child_id, error=f"{error!r}")

    def take(self, page: tuple[TreeEntry, ...], *, count: bool = True) -> None:
        """Count a page of the feed (with `count` false, take it as counted)."""
        for item in page:
            self.read(item, count=count)
        if page:
            self.cursor = page[-1].cursor

    def rest(self, child: State) -> Usage:
        """What `child`, ended, spent that was not counted yet (what the feed did not show)."""
        return usage_since(child.usage, self.usage)


def _spent_by(entry: HistoryEntry) -> Usage | None:
    """What `entry` spent itself (a reply, an ask, a compaction), or None."""
    if isinstance(entry, ModelReplyEntry):
        return entry.content.usage
    if isinstance(entry, AskEntry | ContextChangeEntry) and not entry.content.usage.is_empty():
        return entry.content.usage
    return None


async def run_followed(
    runner: Runner, job: ChildJob, feed: AsyncTreeFollowable, spending: Spending
) -> State | None:
    """Run `job` on `runner` while `spending` counts what it saves; the child as it ended.

    Once a limit above is used up, the child is stopped (its run cancelled: it records
    ``interrupted`` and is saved) and loaded from the store; None if it saved nothing.
    `spending.stopped` then names the limit (None when the child ended by itself first).

    Raises:
        Exception: What `runner.run` raised (a cancellation of the caller included).
    """
    ended: list[State] = []
    failed: list[Exception] = []
    scope = anyio.CancelScope()
    async with anyio.create_task_group() as group:

        async def child_run() -> None:
            try:
                with scope:
                    ended.append(await runner.run(job))
            except Exception as error:  # raised below, outside the task group
                failed.append(error)
            finally:
                group.cancel_scope.cancel()  # the follower stops with the child

        group.start_soon(child_run)
        await spending.follow(feed, job.link.parent_id)
        scope.cancel()  # a limit above is used up: the child stops
        await anyio.sleep_forever()
    if failed:
        raise failed[0]
    await spending.catch_up(feed)
    if ended:  # it ended by itself (before the stop reached it): its own outcome holds
        spending.stopped = None
        return ended[0]
    if job.store is None:  # pragma: no cover - a followed child always has a store
        return None
    try:
        return await load_state(job.store, job.state_id)
    except LookupError:
        return None  # stopped before its first save
