"""Stored entries carry chained digests: damage or an edit is a clear error, never another State.

Each test changes what a store holds the way a damaged disk, a careless edit or a forger would,
then loads: the load raises `StoreDamagedError` naming the store, the State and the entry, and
the other States of the store still load as they were.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator import Message, State, Store, StoreDamagedError
from stores import (
    FORMAT_VERSION,
    AioSQLiteStore,
    FileStore,
    SQLiteStore,
    chain_digests,
    encode_entry,
    first_digest,
)
from stores._sql import FORMAT as SQLITE_FORMAT
from stores.contract import rich_state

Stored = list[tuple[bytes, bytes | None]]  # (encoded entry, digest) of each stored entry


class Disk:
    """What a backend holds, read and written behind its back."""

    def __init__(self, kind: str, path: Path) -> None:
        self.kind = kind
        self.path = path

    def store(self) -> Store:
        return FileStore(self.path) if self.kind == "file" else SQLiteStore(self.path)

    def read(self, state_id: str) -> Stored:
        if self.kind == "file":
            lines = (self.path / state_id / "log.jsonl").read_bytes().splitlines()
            return [
                (line.split(b'","e":', 1)[1][:-1], bytes.fromhex(json.loads(line)["d"]))
                for line in lines
            ]
        with sqlite3.connect(self.path) as db:
            rows = db.execute(
                "SELECT data, digest FROM entries WHERE state_id = ? ORDER BY seq", (state_id,)
            ).fetchall()
        db.close()
        return [(bytes(data), digest) for data, digest in rows]

    def write(self, state_id: str, stored: Stored) -> None:
        """Replace the stored entries of `state_id` with `stored`, exactly (info untouched)."""
        if self.kind == "file":
            (self.path / state_id / "log.jsonl").write_bytes(
                b"".join(
                    b'{"d":"' + (digest or b"").hex().encode() + b'","e":' + data + b"}\n"
                    for data, digest in stored
                )
            )
            return
        db = sqlite3.connect(self.path)
        with db:
            db.execute("DELETE FROM entries WHERE state_id = ?", (state_id,))
            db.executemany(  # each State here is a root
                "INSERT INTO entries (state_id, seq, data, digest, root_id) VALUES (?, ?, ?, ?, ?)",
                [
                    (state_id, seq, data, digest, state_id)
                    for seq, (data, digest) in enumerate(stored)
                ],
            )
        db.close()

    def count(self, state_id: str, entries: int) -> None:
        """Make the State's info (row, info.json) count `entries`, its digest left as it is."""
        if self.kind == "file":
            path = self.path / state_id / "info.json"
            info = json.loads(path.read_bytes())
            info["entries"] = entries
            path.write_text(json.dumps(info))
            return
        db = sqlite3.connect(self.path)
        with db:
            db.execute("UPDATE states SET entries = ? WHERE id = ?", (entries, state_id))
        db.close()


@pytest.fixture(params=["file", "sqlite"])
def disk(request: pytest.FixtureRequest, tmp_path: Path) -> Disk:
    kind: str = request.param
    return Disk(kind, tmp_path / ("states" if kind == "file" else "states.db"))


def payment(state_id: str = "paid") -> State:
    state = State(id=state_id, messages=[Message.user("Pay 100 EUR to Bob")])
    state.add_message(Message.notice("approved by Ann"))
    state.add_message(Message.user("and 5 EUR to Carl"))
    state.add_message(Message.user("thanks"))
    return state


def saved(disk: Disk, *states: State) -> Store:
    store = disk.store()
    for state in states:
        store.save(state)
    return store


def assert_refused(disk: Disk, state_id: str, pattern: str, *, others: tuple[State, ...]) -> None:
    for store in (disk.store(), disk.store()):  # a fresh store, and the same one again
        with pytest.raises(StoreDamagedError, match=pattern) as caught:
            store.load(state_id)
        message = str(caught.value)
        assert f"State {state_id!r} is damaged" in message
        assert "backup" in message
        assert f"store.delete({state_id!r})" in message
        for other in others:
            assert store.load(other.id).snapshot() == other.snapshot()


EDITS: dict[str, tuple[Callable[[Stored], Stored], str]] = {
    # A number changed inside a stored message, its digest kept.
    "changed": (
        lambda s: [(s[0][0].replace(b"100", b"900"), s[0][1]), *s[1:]],
        "entry 0 fails",
    ),
    "entry removed": (lambda s: [*s[:1], *s[2:]], "entry 1 fails"),
    "entries swapped": (lambda s: [s[0], s[2], s[1], *s[3:]], "entry 1 fails"),
    "entry repeated": (lambda s: [*s[:2], s[1], *s[2:]], "entry 2 fails"),
    "digest dropped": (lambda s: [s[0], (s[1][0], None), *s[2:]], "entry 1 fails"),
}


@pytest.mark.parametrize("edit", EDITS)
def test_an_edited_history_is_refused_naming_the_entry(disk: Disk, edit: str) -> None:
    state, other = payment(), payment("other")
    saved(disk, state, other)
    change, pattern = EDITS[edit]
    disk.write("paid", change(disk.read("paid")))
    assert_refused(disk, "paid", rf"history {pattern}", others=(other,))


def test_the_number_edit_is_in_the_first_entry(disk: Disk) -> None:
    # The "changed" case above edits the message that holds "100": it is entry 0.
    saved(disk, payment())
    assert b"100" in disk.read("paid")[0][0]


def test_an_entry_of_another_kind_with_the_same_seq_is_refused(disk: Disk) -> None:
    state, other = payment(), payment("other")
    saved(disk, state, other)
    stored = disk.read("paid")
    # A well-formed entry (a user message) put where a notice was, with the notice's digest.
    forged = State(id="x", messages=[Message.user("a")])
    forged.add_message(Message.user("Pay 900 EUR to Eve"))
    line = encode_entry(forged.history[1])
    assert json.loads(line)["seq"] == 1
    assert (json.loads(line)["kind"], json.loads(stored[1][0])["kind"]) == ("user", "notice")
    disk.write("paid", [stored[0], (line, stored[1][1]), *stored[2:]])
    assert_refused(disk, "paid", r"history entry 1 fails its integrity check", others=(other,))


def test_another_states_history_copied_in_is_refused(disk: Disk) -> None:
    state, other = payment(), payment("other")
    saved(disk, state, other)
    disk.write("paid", disk.read("other"))  # well-formed, with the digests it was stored with
    assert_refused(disk, "paid", r"history entry 0 fails", others=(other,))


def test_entries_cut_from_the_end_are_missing(disk: Disk) -> None:
    state, other = payment(), payment("other")
    saved(disk, state, other)
    stored = disk.read("paid")
    disk.write("paid", stored[:-2])
    assert_refused(
        disk, "paid", r"counts 4 history entries but 2 .*entries 2 to 3 are missing", others=()
    )
    disk.count("paid", 2)  # the count edited to match: the last digest does not
    assert_refused(
        disk, "paid", r"entry 1 does not match the digest its info holds", others=(other,)
    )


def test_resealing_the_chain_is_what_it_takes_to_forge(disk: Disk) -> None:
    # The digests detect damage and careless edits; someone who recomputes them can forge
    # (SECURITY.md says so). This pins down that the check covers exactly the chain.
    saved(disk, payment())
    stored = disk.read("paid")
    edited = [data.replace(b"100", b"900") for data, _ in stored]
    digests = chain_digests(first_digest("paid"), edited)
    disk.write("paid", list(zip(edited, digests, strict=True)))
    if disk.kind == "file":
        path = disk.path / "paid" / "info.json"
        info = json.loads(path.read_bytes())
        info["head"] = digests[-1].hex()
        path.write_text(json.dumps(info))
    else:
        db = sqlite3.connect(disk.path)
        with db:
            db.execute("UPDATE states SET head = ? WHERE id = 'paid'", (digests[-1],))
        db.close()
    assert disk.store().load("paid").messages[0].text == "Pay 900 EUR to Bob"


def test_an_untouched_store_loads_every_state_as_saved(disk: Disk) -> None:
    states = [payment(), rich_state(), payment("other")]
    store = saved(disk, *states)
    for state in states:
        loaded = disk.store().load(state.id)
        assert loaded.snapshot() == state.snapshot()
        assert loaded.history == state.history
    assert {info.id for info in store.list()} == {"paid", "rich", "other"}


# Format 1 (no digests): still read, and given digests ------------------------------------------

V1_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value)",
    """
    CREATE TABLE states (
        id TEXT PRIMARY KEY NOT NULL, parent_id TEXT, parent_call_id TEXT, title TEXT NOT NULL,
        created_at INTEGER, updated_at INTEGER, turn INTEGER NOT NULL, finished INTEGER NOT NULL,
        stopped TEXT, usage TEXT NOT NULL, entries INTEGER NOT NULL
    )
    """,
    "CREATE INDEX states_by_update ON states (updated_at DESC, id)",
    "CREATE INDEX states_by_parent ON states (parent_id, updated_at DESC, id)",
    "CREATE TABLE entries (state_id TEXT NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL)",
    "CREATE UNIQUE INDEX entries_by_state ON entries (state_id, seq)",
)


def write_v1(disk: Disk, state: State) -> None:
    """Store `state` as orchestrator 0.1 (format 1, no digests) wrote it."""
    lines = [encode_entry(entry) for entry in state.history]
    info: dict[str, Any] = {"id": state.id, "title": state.messages[0].text, "entries": len(lines)}
    if disk.kind == "file":
        folder = disk.path / state.id
        folder.mkdir(parents=True)
        (folder / "log.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
        (folder / "info.json").write_text(json.dumps({"format": 1, **info}))
        return
    db = sqlite3.connect(disk.path)
    with db:
        if not db.execute("SELECT name FROM sqlite_master").fetchall():
            for statement in V1_SCHEMA:
                db.execute(statement)
            db.execute("INSERT INTO meta VALUES ('format_version', 1)")
        db.execute(
            "INSERT INTO states (id, title, turn, finished, usage, entries)"
            " VALUES (?, ?, 0, 0, '{}', ?)",
            (state.id, info["title"], len(lines)),
        )
        db.executemany(
            "INSERT INTO entries VALUES (?, ?, ?)",
            [(state.id, seq, line) for seq, line in enumerate(lines)],
        )
    db.close()


def test_a_state_of_format_1_loads_and_continues_with_digests(disk: Disk) -> None:
    old, other = payment("old"), payment("other")
    write_v1(disk, old)
    write_v1(disk, other)
    store = disk.store()
    loaded = store.load("old")
    assert loaded.snapshot() == old.snapshot()
    assert loaded.history == old.history
    loaded.add_message(Message.user("one more"))
    store.save(loaded)
    again = disk.store().load("old")
    assert again.snapshot() == loaded.snapshot()
    digests = chain_digests(first_digest("old"), [data for data, _ in disk.read("old")])
    assert [digest for _, digest in disk.read("old")] == digests
    assert disk.store().load("other").snapshot() == other.snapshot()
    if disk.kind == "sqlite":  # the whole file was migrated when it was opened
        db = sqlite3.connect(disk.path)
        version = db.execute("SELECT value FROM meta WHERE key = 'format_version'").fetchone()
        db.close()
        assert version == (SQLITE_FORMAT,)
        assert [digest for _, digest in disk.read("other")] == chain_digests(
            first_digest("other"), [data for data, _ in disk.read("other")]
        )
    else:  # each folder is given digests by its next save
        info = json.loads((disk.path / "old" / "info.json").read_bytes())
        assert (info["format"], info["head"]) == (FORMAT_VERSION, digests[-1].hex())
        assert json.loads((disk.path / "other" / "info.json").read_bytes())["format"] == 1


def test_a_state_of_format_1_with_lines_missing_is_refused(disk: Disk) -> None:
    write_v1(disk, payment("old"))
    if disk.kind == "file":
        log = disk.path / "old" / "log.jsonl"
        log.write_bytes(b"".join(line + b"\n" for line in log.read_bytes().splitlines()[:2]))
        pattern = r"counts 4 history entries but log.jsonl holds 2"
    else:
        db = sqlite3.connect(disk.path)
        with db:
            db.execute("DELETE FROM entries WHERE state_id = 'old' AND seq >= 2")
        db.close()
        pattern = r"counts 4 history entries but 2 are stored: history entries 2 to 3 are missing"
    with pytest.raises(StoreDamagedError, match=pattern):
        disk.store().load("old")


# Found by the fuzz (tests/stress/test_fuzz.py) ------------------------------------------------


def test_a_negative_entry_count_is_damage(disk: Disk) -> None:
    # It raised IndexError: the check looked up the digest of entry -4.
    state, other = payment(), payment("other")
    saved(disk, state, other)
    disk.count("paid", -3)
    assert_refused(disk, "paid", r"counts -3 history entries", others=(other,))


def test_entries_without_their_info_are_damage_not_an_absent_state(disk: Disk) -> None:
    # A State appears whole (its SQLite row in the transaction of its entries, its folder
    # renamed from a draft) and its info is only ever replaced: so entries without an info
    # were damaged, where the load said no State had the id (LookupError).
    state, other = payment(), payment("other")
    store = saved(disk, state, other)
    if disk.kind == "file":
        (disk.path / "paid" / "info.json").unlink()
        pattern = "log.jsonl exists but info.json is missing"
    else:
        db = sqlite3.connect(disk.path)
        with db:
            db.execute("DELETE FROM states WHERE id = 'paid'")
        db.close()
        pattern = "its history entries are stored, its states row is not"
    assert_refused(disk, "paid", pattern, others=(other,))
    store.delete("other")
    with pytest.raises(LookupError) as absent:
        disk.store().load("other")  # a deleted State is absent, not damaged
    assert not isinstance(absent.value, StoreDamagedError)


def _edit_schema(path: Path, edit: Callable[[bytes], bytes]) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA writable_schema = ON")
    (sql,) = db.execute("SELECT sql FROM sqlite_master WHERE name = 'states'").fetchone()
    changed = edit(sql.encode())
    db.execute("UPDATE sqlite_master SET sql = CAST(? AS TEXT) WHERE name = 'states'", (changed,))
    db.close()


def not_utf8(sql: bytes) -> bytes:
    # SQLite's error quotes this schema text, which is not UTF-8: sqlite3 raised
    # UnicodeDecodeError while making the error.
    return sql + b" \xe6\xe6"


def column_renamed(sql: bytes) -> bytes:
    # A valid schema with a column renamed: "no such column" was a plain StoreError.
    return sql.replace(b"turn", b"tuZn")


@pytest.mark.parametrize("edit", [not_utf8, column_renamed])
def test_a_damaged_sqlite_schema_is_damage(tmp_path: Path, edit: Callable[[bytes], bytes]) -> None:
    path = tmp_path / "states.db"
    with SQLiteStore(path) as store:
        store.save(payment())
    _edit_schema(path, edit)
    with SQLiteStore(path) as store, pytest.raises(StoreDamagedError, match="is damaged"):
        store.list()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_schema_not_in_utf8_is_damage_to_aiosqlitestore(tmp_path: Path) -> None:
    path = tmp_path / "states.db"
    with SQLiteStore(path) as store:
        store.save(payment())
    _edit_schema(path, not_utf8)
    async with AioSQLiteStore(path) as store:
        with pytest.raises(StoreDamagedError, match="is damaged"):
            await store.aload("paid")


# A format set back ------------------------------------------------------------------------


def set_back(disk: Disk, state_id: str) -> None:
    """Edit the store to say format 1 (before digests), as a careless or hostile edit would."""
    if disk.kind == "file":
        path = disk.path / state_id / "info.json"
        info = json.loads(path.read_bytes())
        info["format"] = 1
        path.write_text(json.dumps(info))
        return
    db = sqlite3.connect(disk.path)
    with db:
        db.execute("UPDATE meta SET value = 1 WHERE key = 'format_version'")
    db.close()


def test_a_format_set_back_to_1_is_refused(disk: Disk) -> None:
    # Format 1 had no digests: read as it is, and given digests on the next save (or when an
    # SQLite file is opened), which would seal whatever was edited meanwhile.
    state, other = payment(), payment("other")
    saved(disk, state, other)
    forged = [(data.replace(b"100 EUR", b"900 EUR"), digest) for data, digest in disk.read("paid")]
    disk.write("paid", forged)
    set_back(disk, "paid")
    pattern = r"format 1 \(before digests\).*set back"
    if disk.kind == "file":
        assert_refused(disk, "paid", pattern, others=(other,))
        with pytest.raises(StoreDamagedError, match=pattern):
            disk.store().save(payment())  # a save does not seal it either
    else:  # the format is the file's: the file is refused, whichever State is asked for
        for call in (lambda: disk.store().load("paid"), lambda: disk.store().list()):
            with pytest.raises(StoreDamagedError, match=pattern):
                call()


def test_a_set_back_info_without_its_head_still_checks_the_sealed_log(tmp_path: Path) -> None:
    # FileStore only: an SQLite file's format is the file's (tested above).
    disk = Disk("file", tmp_path / "states")
    state, other = payment(), payment("other")
    saved(disk, state, other)
    forged = [(data.replace(b"100 EUR", b"900 EUR"), digest) for data, digest in disk.read("paid")]
    disk.write("paid", forged)
    path = disk.path / "paid" / "info.json"
    info = json.loads(path.read_bytes())
    info.update(format=1, head=None)
    path.write_text(json.dumps(info))
    assert_refused(disk, "paid", r"history entry 0 fails its integrity check", others=(other,))


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_format_set_back_is_refused_by_aiosqlitestore(tmp_path: Path) -> None:
    disk = Disk("sqlite", tmp_path / "states.db")
    saved(disk, payment())
    set_back(disk, "paid")
    store = AioSQLiteStore(disk.path)
    try:
        with pytest.raises(StoreDamagedError, match=r"format 1 \(before digests\).*set back"):
            await store.aload("paid")
    finally:
        await store.aclose()
