"""The links crash recovery follows are checked against each child's own digested history.

A store keeps links beside the histories (FileStore's ``children.jsonl``, the SQL stores'
``parent_id`` / ``parent_call_id`` columns, a child's listed usage); the digests do not cover
them. Recovery of a cut-off call keeps the children it started in the call's result: each one is
read from its own history, whose first ``run_start`` names its parent and call, so a link
pointed at an unrelated State is a `StoreDamagedError`, never a stranger's work (or answer) in
the parent. The usage rolled into the parent is the child's own, from its history.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import pytest

from orchestrator import (
    Message,
    ModelReplyEntry,
    ModelRequest,
    ModelRequestEntry,
    Reply,
    RunStart,
    RunStartEntry,
    State,
    Store,
    StoreDamagedError,
    ToolResultEntry,
    Usage,
)
from stores import AioSQLiteStore, FileStore, SQLiteStore
from stores._contract_support import appended, dated
from stores.contract import crashed_pending

LEAD = "lead"
KID = "kid"  # the child the cut-off call c2 started
STRANGER = "stranger"  # a finished State of its own, no child of anyone


def spent(state: State, tokens: int) -> State:
    state = appended(state, ModelRequestEntry, ModelRequest(model="fake"))
    reply = Reply(Message.assistant("the stranger's answer"), Usage(input_tokens=tokens))
    return appended(state, ModelReplyEntry, reply)


def the_states() -> tuple[State, State, State]:
    """A lead cut off with calls c2 and c3 open, the child of c2, and an unrelated State."""
    at = datetime(2026, 1, 1, tzinfo=UTC)
    kid = spent(dated(KID, at, parent=(LEAD, "c2")), 10)
    ran = appended(dated(STRANGER, at), RunStartEntry, RunStart())  # a run of no parent
    stranger = spent(ran, 999)
    stranger.finish()
    return crashed_pending(LEAD), kid, stranger


class Disk:
    """A FileStore or SQLite file, its links edited behind the store's back."""

    def __init__(self, kind: str, path: Path) -> None:
        self.kind = kind
        self.path = path

    def store(self) -> Store:
        return FileStore(self.path) if self.kind == "file" else SQLiteStore(self.path)

    def link(self, child: str, parent: str, call: str) -> None:
        """Make the store's link say `child` was started by `call` of `parent`."""
        if self.kind == "file":
            with (self.path / parent / "children.jsonl").open("a") as file:
                file.write(json.dumps({"id": child, "call": call}) + "\n")
            return
        self.sql(
            "UPDATE states SET parent_id = ?, parent_call_id = ? WHERE id = ?", parent, call, child
        )

    def listed_usage(self, state_id: str, usage: Usage) -> None:
        """Make the State's listed usage (its info.json, its row) say `usage`."""
        text = json.dumps({"input_tokens": usage.input_tokens, "requests": usage.requests})
        if self.kind == "file":
            path = self.path / state_id / "info.json"
            info = json.loads(path.read_bytes())
            info["usage"] = json.loads(text)
            path.write_text(json.dumps(info))
            return
        self.sql("UPDATE states SET usage = ? WHERE id = ?", text, state_id)

    def sql(self, statement: str, *params: object) -> None:
        db = sqlite3.connect(self.path)
        with db:
            db.execute(statement, params)
        db.close()


@pytest.fixture(params=["file", "sqlite"])
def disk(request: pytest.FixtureRequest, tmp_path: Path) -> Disk:
    kind: str = request.param
    return Disk(kind, tmp_path / ("states" if kind == "file" else "states.db"))


def saved(disk: Disk) -> tuple[State, State, State]:
    states = the_states()
    store = disk.store()
    for state in states:
        store.save(state)
    return states


def closed(lead: State) -> list[ToolResultEntry]:
    """The results recovery added to `lead`: of c2, then of c3."""
    return cast("list[ToolResultEntry]", list(lead.history[-2:]))


def test_an_untouched_link_is_kept_with_the_childs_usage(disk: Disk) -> None:
    saved(disk)
    added = closed(disk.store().load(LEAD))
    assert [(entry.call.id, entry.child_ids) for entry in added] == [("c2", (KID,)), ("c3", ())]
    assert added[0].usage.input_tokens == 10


def test_a_link_to_an_unrelated_state_is_damage(disk: Disk) -> None:
    _, kid, stranger = saved(disk)
    disk.link(STRANGER, LEAD, "c3")
    for store in (disk.store(), disk.store()):
        with pytest.raises(StoreDamagedError) as caught:
            store.load(LEAD)
        message = str(caught.value)
        assert f"State {LEAD!r} is damaged" in message
        assert f"links State {STRANGER!r} to its cut-off call 'c3'" in message
        assert "started by no parent" in message
        # The others load as they are.
        assert store.load(STRANGER).snapshot() == stranger.snapshot()
        assert store.load(KID).snapshot() == kid.snapshot()


def test_a_link_moved_to_another_call_is_damage(disk: Disk) -> None:
    saved(disk)
    disk.link(KID, LEAD, "c3")
    if disk.kind == "file":  # its own list of children says c2 first: the first line wins
        (disk.path / LEAD / "children.jsonl").write_text(
            json.dumps({"id": KID, "call": "c3"}) + "\n"
        )
    with pytest.raises(StoreDamagedError, match=r"started by State 'lead', call 'c2'"):
        disk.store().load(LEAD)


def test_the_usage_rolled_up_is_the_childs_own_not_its_listing(disk: Disk) -> None:
    saved(disk)
    disk.listed_usage(KID, Usage(input_tokens=1_000_000, requests=7))
    (c2, _) = closed(disk.store().load(LEAD))
    assert c2.child_ids == (KID,)
    assert c2.usage.input_tokens == 10  # from the child's history, not its edited listing


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_link_to_an_unrelated_state_is_damage_to_aiosqlitestore(tmp_path: Path) -> None:
    disk = Disk("sqlite", tmp_path / "states.db")
    saved(disk)
    disk.link(STRANGER, LEAD, "c3")
    store = AioSQLiteStore(disk.path)
    try:
        with pytest.raises(StoreDamagedError, match=r"links State 'stranger' to its cut-off"):
            await store.aload(LEAD)
        assert (await store.aload(STRANGER)).finished
    finally:
        await store.aclose()


@pytest.mark.anyio
async def test_a_link_to_an_unrelated_state_is_damage_to_async_sqlitestore(
    tmp_path: Path,
) -> None:
    disk = Disk("sqlite", tmp_path / "states.db")
    saved(disk)
    disk.link(STRANGER, LEAD, "c3")
    store = SQLiteStore(disk.path)
    try:
        with pytest.raises(StoreDamagedError, match=r"links State 'stranger' to its cut-off"):
            await store.aload(LEAD)
    finally:
        store.close()


@pytest.fixture
def file_disk(tmp_path: Path) -> Disk:
    return Disk("file", tmp_path / "states")


@pytest.mark.anyio
async def test_a_link_to_an_unrelated_state_is_damage_to_async_filestore(file_disk: Disk) -> None:
    saved(file_disk)
    file_disk.link(STRANGER, LEAD, "c3")
    store = FileStore(file_disk.path)
    with pytest.raises(StoreDamagedError, match=r"links State 'stranger' to its cut-off"):
        await store.aload(LEAD)


# -- what list() shows ------------------------------------------------------------------------

LISTED_EDITS = {
    # field: (info.json value, states column value)
    "title": ("Pay 900 EUR to Eve", "Pay 900 EUR to Eve"),
    "usage": ({"input_tokens": 1}, '{"input_tokens": 1}'),
    "turn": (7, 7),
    "parent_id": ("someone", "someone"),
    "stopped": ({"kind": "finish"}, '{"kind": "finish"}'),
    "created_at": ("2020-01-01T00:00:00Z", 1_577_836_800_000_000),
}


def edit_listing(disk: Disk, state_id: str, field: str) -> None:
    in_file, in_row = LISTED_EDITS[field]
    if disk.kind == "file":
        path = disk.path / state_id / "info.json"
        info = json.loads(path.read_bytes())
        info[field] = in_file
        path.write_text(json.dumps(info))
        return
    disk.sql(f"UPDATE states SET {field} = ? WHERE id = ?", in_row, state_id)


@pytest.mark.parametrize("field", sorted(LISTED_EDITS))
def test_an_edited_listing_is_listed_as_damage_not_shown(disk: Disk, field: str) -> None:
    _, kid, _ = saved(disk)
    edit_listing(disk, KID, field)
    for store in (disk.store(), disk.store()):
        infos = {info.id: info for info in store.list()}
        assert set(infos) == {LEAD, KID, STRANGER}
        damage = infos[KID].damage or ""
        assert f"State {KID!r} is damaged: its listed info" in damage
        assert infos[KID].title == ""  # nothing of what was edited is shown
        assert infos[KID].usage == Usage()
        assert infos[LEAD].damage is None
        assert infos[STRANGER].damage is None
        assert infos[STRANGER].usage.input_tokens == 999
        # Its history is whole: it loads as it was saved.
        assert store.load(KID).snapshot() == kid.snapshot()
    loaded = disk.store().load(KID)
    loaded.add_message(Message.user("again"))
    store = disk.store()
    store.save(loaded)  # the next save writes the listing again
    listed = {info.id: info for info in store.list()}[KID]
    assert listed.damage is None
    assert (listed.title, listed.usage.input_tokens) == ("task of kid", 10)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_edited_listing_is_listed_as_damage_by_aiosqlitestore(tmp_path: Path) -> None:
    disk = Disk("sqlite", tmp_path / "states.db")
    saved(disk)
    edit_listing(disk, STRANGER, "usage")
    store = AioSQLiteStore(disk.path)
    try:
        infos = {info.id: info for info in await store.alist()}
        assert "its listed info does not match its seal" in (infos[STRANGER].damage or "")
        assert infos[KID].damage is None
    finally:
        await store.aclose()


def test_an_sqlite_file_made_before_listings_were_sealed_gets_its_seals(tmp_path: Path) -> None:
    disk = Disk("sqlite", tmp_path / "states.db")
    _, kid, _ = saved(disk)
    db = sqlite3.connect(disk.path)
    with db:
        db.execute("ALTER TABLE states DROP COLUMN seal")
    db.close()
    store = disk.store()
    assert [info.damage for info in store.list()] == [None] * 3
    assert {info.id: info for info in store.list()}[KID].usage.input_tokens == 10
    assert store.load(KID).snapshot() == kid.snapshot()
