"""A follower reconnecting with an event id reads the feed after it, not the whole tree.

The exactness of reconnects (nothing lost, nothing twice, at every point and while the tree
runs) is tested in `test_runs.py`; these check what a reconnect reads, the ids of earlier
versions, and ids that name something else.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import StoppedByApproval, TreeEntry
from orchestrator._apps._durable import HistoryEvents, progress_after
from orchestrator.apps import Followed, Runs
from stores import MemoryStore, SQLiteStore
from tests.apps.test_runs import helper_agent, tree_agent

pytestmark = pytest.mark.anyio


class _CountingStore(MemoryStore):
    """A MemoryStore that counts the feed entries it returns."""

    def __init__(self) -> None:
        super().__init__()
        self.read = 0

    async def atree_entries(
        self, root_id: str, *, after: str | None = None, limit: int | None = None
    ) -> tuple[TreeEntry, ...]:
        found = await super().atree_entries(root_id, after=after, limit=limit)
        self.read += len(found)
        return found


async def _all(runs: Runs, state_id: str, after: str | None = None) -> list[Followed]:
    return [item async for item in runs.follow(state_id, after=after)]


async def test_a_reconnect_reads_only_the_feed_after_its_event() -> None:
    store = _CountingStore()
    async with Runs([tree_agent()], store) as runs:
        handle = await runs.start("parent", "go")
        await handle.wait()
        every = await _all(runs, handle.state_id)
        whole = len(await store.atree_entries(handle.state_id))
        for at, item in enumerate(every):
            cursor = item.id.rpartition("/")[0]
            tail = len(await store.atree_entries(handle.state_id, after=cursor))
            store.read = 0
            rest = await _all(runs, handle.state_id, after=item.id)
            assert [followed.id for followed in rest] == [f.id for f in every[at + 1 :]]
            assert store.read <= tail + 1  # the tail, and one entry to check the cursor
        assert whole > len(every) > 3  # the tree is longer than any tail read above


async def test_a_reconnect_in_a_child_continues_from_that_childs_own_history(
    tmp_path: Path,
) -> None:
    with SQLiteStore(tmp_path / "runs.db") as store:
        async with Runs([tree_agent()], store) as runs:
            handle = await runs.start("parent", "go")
            await handle.wait()
            every = await _all(runs, handle.state_id)
            child = next(
                at for at, item in enumerate(every) if item.event.state_id != handle.state_id
            )
            rest = await _all(runs, handle.state_id, after=every[child + 1].id)
    assert [item.event for item in rest] == [item.event for item in every[child + 2 :]]
    assert rest[0].event.parent_id == handle.state_id  # its link, read from its own history


async def test_an_id_of_an_earlier_version_still_continues_exactly() -> None:
    store = MemoryStore()
    async with Runs([tree_agent()], store) as runs:
        handle = await runs.start("parent", "go")
        await handle.wait()
        every = await _all(runs, handle.state_id)
        for at, item in enumerate(every):
            cursor, _, place = item.id.rpartition("/")
            old = f"{cursor}/{place.rpartition(':')[2]}"  # "cursor/ordinal"
            rest = await _all(runs, handle.state_id, after=old)
            assert [followed.event for followed in rest] == [f.event for f in every[at + 1 :]]


async def test_an_id_naming_another_run_or_a_missing_entry_is_refused() -> None:
    store = MemoryStore()
    async with Runs([tree_agent()], store) as runs:
        first = await runs.start("parent", "go")
        await first.wait()
        second = await runs.start("parent", "go again")
        await second.wait()
        of_second = (await _all(runs, second.state_id))[-1].id
        cursor, _, place = (await _all(runs, first.state_id))[-1].id.rpartition("/")
        state_id, index, ordinal = place.split(":")
        with pytest.raises(ValueError, match="not an event id of run"):
            await _all(runs, first.state_id, after=f"{cursor}/{of_second.rpartition('/')[2]}")
        with pytest.raises(ValueError, match="not an event id of run"):
            await _all(runs, first.state_id, after=f"{cursor}/{state_id}:{int(index) + 9}:0")
        with pytest.raises(ValueError, match="not an event id of run"):
            await _all(runs, first.state_id, after=f"{cursor}/nobody:{index}:{ordinal}")


async def test_progress_after_entries_is_what_reading_their_events_leaves() -> None:
    store = MemoryStore()
    async with Runs([tree_agent(), helper_agent()], store) as runs:
        await (await runs.start("parent", "go")).wait()
        mail = await runs.start("helper", "mail kim")  # stops for an approval, then goes on
        stopped = (await mail.wait()).stopped
        assert isinstance(stopped, StoppedByApproval)
        await runs.approve(mail.state_id, stopped.calls[0].call.id)
        assert (await mail.wait()).status == "answered"
    states = [info.id for info in store.list()]
    assert len(states) >= 3
    for state_id in states:
        entries = store.entries(state_id)
        reader = HistoryEvents(state_id)
        for at, entry in enumerate(entries):
            reader.read(entry)
            resumed = progress_after(entries[: at + 1])
            assert (resumed.running, resumed.ending) == (
                reader.progress.running,
                reader.progress.ending,
            )
            assert resumed.value.entries == reader.progress.value.entries
