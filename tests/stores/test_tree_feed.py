"""The feeds of trees, backend by backend: migrations, crashes, what the SQL reads.

The behaviour every backend shares is the contract (`stores.contract.TreeFollowContract`);
these are the parts each backend does its own way: SQLite's positions and index, a format 2
file migrated, a `FileStore` feed after a crash between its files.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from orchestrator import Message, State, StoreDamagedError, TreeEntry, UserEntry
from stores import FORMAT_VERSION, FileStore, SQLiteStore
from stores._contract_tree import linked
from stores._sql import FORMAT as SQLITE_FORMAT
from stores._sql import LIST_CHILDREN, TREE_END, TREE_ENTRIES, roots_of_links


def keys(feed: tuple[TreeEntry, ...]) -> list[tuple[str, int]]:
    return [(item.state_id, item.index) for item in feed]


def grown(state: State, *texts: str) -> State:
    for text in texts:
        state.add_message(Message.user(text))
    return state


def a_tree(store: SQLiteStore | FileStore) -> tuple[State, State, State]:
    """A root, a child and a grandchild, saved in turns."""
    root = State(id="root", messages=[Message.user("go")])
    store.save(root)
    kid, grandkid = linked("kid", "root"), linked("grandkid", "kid")
    store.save(kid)
    store.save(grown(root, "on"))
    store.save(grandkid)
    store.save(grown(kid, "more"))
    return root, kid, grandkid


# -- SQLite ------------------------------------------------------------------------------------


def test_roots_of_links_walk_up_and_end_a_loop() -> None:
    parents: dict[str, object] = {"r": None, "a": "r", "b": "a", "x": "gone", "p": "q", "q": "p"}
    roots = roots_of_links(parents)
    assert {key: roots[key] for key in ("r", "a", "b", "x")} == {
        "r": "r",
        "a": "r",
        "b": "r",
        "x": "x",
    }
    assert roots["p"] == roots["q"] in ("p", "q")  # damaged links: one of the loop is the root


def test_the_tree_page_and_probe_read_the_trees_rows_only(tmp_path: Path) -> None:
    """A follower of one tree among many reads through `entries_by_root`, never the table."""
    path = tmp_path / "states.db"
    with SQLiteStore(path) as store:
        store.save(State(id="root", messages=[Message.user("go")]))
        for k in range(1000):
            store.save(linked(f"kid{k}", "root"))
        store.save(State(id="other", messages=[Message.user("other tree")]))
    db = sqlite3.connect(path)
    try:
        for statement, params in ((TREE_ENTRIES, ("root", 5, 10)), (TREE_END, ("root",))):
            plan = " | ".join(
                row[3] for row in db.execute("EXPLAIN QUERY PLAN " + statement, params)
            )
            assert "INDEX entries_by_root (root_id=?" in plan, plan
            assert "SCAN" not in plan, plan
    finally:
        db.close()


def test_only_states_with_a_parent_are_in_the_parent_index(tmp_path: Path) -> None:
    """A root's save moves its `updated_at` without writing a page of the parent index."""
    path = tmp_path / "states.db"
    with SQLiteStore(path) as store:
        root, kid, _ = a_tree(store)
    db = sqlite3.connect(path)
    try:
        plan = " | ".join(
            row[3] for row in db.execute("EXPLAIN QUERY PLAN " + LIST_CHILDREN, ("root", 10))
        )
        assert "INDEX states_with_parent (parent_id=?)" in plan, plan
        (sql,) = db.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'states_with_parent'"
        ).fetchone()
        assert sql.endswith("WHERE parent_id IS NOT NULL"), sql  # the root has no row in it
    finally:
        db.close()
    with SQLiteStore(path) as store:
        assert [info.id for info in store.list(parent_id="root")] == [kid.id]
        assert [info.id for info in store.list(parent_id="kid")] == ["grandkid"]
        assert store.list(parent_id=root.id)[0].parent_id == "root"


def test_a_file_with_the_old_parent_index_gets_the_partial_one(tmp_path: Path) -> None:
    path = tmp_path / "states.db"
    with SQLiteStore(path) as store:
        a_tree(store)
    db = sqlite3.connect(path)
    with db:  # the index every file had before it was partial
        db.execute("DROP INDEX states_with_parent")
        db.execute("CREATE INDEX states_by_parent ON states (parent_id, updated_at DESC, id)")
    db.close()
    with SQLiteStore(path) as store:
        assert [info.id for info in store.list(parent_id="root")] == ["kid"]
        store.save(linked("kid2", "root"))
        assert {info.id for info in store.list(parent_id="root")} == {"kid", "kid2"}
    db = sqlite3.connect(path)
    try:
        names = {
            row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
        }
    finally:
        db.close()
    assert "states_with_parent" in names
    assert "states_by_parent" not in names


def test_positions_survive_a_vacuum(tmp_path: Path) -> None:
    path = tmp_path / "states.db"
    with SQLiteStore(path) as store:
        a_tree(store)
        store.delete("kid")  # a gap in the middle
        before = store.tree_entries("root")
    db = sqlite3.connect(path)
    db.execute("VACUUM")
    db.close()
    with SQLiteStore(path) as store:
        assert store.tree_entries("root") == before
        assert store.tree_entries("root", after=before[0].cursor) == before[1:]


def _set_back_to_format_2(path: Path) -> list[int]:
    """Make a format 3 file what format 2 wrote: no roots, no positions (rowids instead)."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        positions = [row[0] for row in db.execute("SELECT position FROM entries ORDER BY position")]
        db.execute("BEGIN")
        db.execute(
            "CREATE TABLE old (state_id TEXT NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL,"
            " digest BLOB)"
        )
        db.execute(
            "INSERT INTO old (rowid, state_id, seq, data, digest)"
            " SELECT position, state_id, seq, data, digest FROM entries ORDER BY position"
        )
        db.execute("DROP TABLE entries")
        db.execute("ALTER TABLE old RENAME TO entries")
        db.execute("CREATE UNIQUE INDEX entries_by_state ON entries (state_id, seq)")
        db.execute("ALTER TABLE states DROP COLUMN root_id")
        db.execute("UPDATE meta SET value = 2 WHERE key = 'format_version'")
        db.execute("COMMIT")
    finally:
        db.close()
    return positions


def test_a_file_of_format_2_gets_its_feeds_in_the_order_written(tmp_path: Path) -> None:
    path = tmp_path / "states.db"
    with SQLiteStore(path) as store:
        _, kid, _ = a_tree(store)
        store.save(linked("orphan", "gone"))
        expected = keys(store.tree_entries("root"))
    positions = _set_back_to_format_2(path)
    with SQLiteStore(path) as store:
        assert [store.root_of(i) for i in ("root", "kid", "grandkid")] == ["root"] * 3
        assert store.root_of("orphan") == "orphan"
        feed = store.tree_entries("root")
        assert keys(feed) == expected  # the rowids were the order the rows were written in
        store.save(grown(store.load("kid"), "after"))
        assert keys(store.tree_entries("root", after=feed[-1].cursor)) == [
            ("kid", len(kid.history))
        ]
        assert store.load("kid").history[: len(kid.history)] == kid.history
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT value FROM meta WHERE key = 'format_version'").fetchone() == (
            SQLITE_FORMAT,
        )
        assert [row[0] for row in db.execute("SELECT position FROM entries ORDER BY position")][
            : len(positions)
        ] == positions
    finally:
        db.close()


V3_ENTRIES = (  # the entries table as format 3 made it
    """
    CREATE TABLE entries (
        position INTEGER PRIMARY KEY AUTOINCREMENT,
        state_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        data BLOB NOT NULL,
        digest BLOB,
        root_id TEXT NOT NULL
    )
    """,
    "CREATE UNIQUE INDEX entries_by_state ON entries (state_id, seq)",
    "CREATE INDEX entries_by_root ON entries (root_id)",
)


def _set_back_to_format_3(path: Path, *, deleted: int) -> int:
    """Make a format 4 file what format 3 wrote: positions given by ``AUTOINCREMENT``.

    Format 3 then deleted a State that held the `deleted` newest rows (its sequence kept their
    positions). Returns the last position given.
    """
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("BEGIN")
        db.execute("ALTER TABLE entries RENAME TO new")
        db.execute("DROP INDEX entries_by_state")
        db.execute("DROP INDEX entries_by_root")
        for statement in V3_ENTRIES:
            db.execute(statement)
        db.execute("INSERT INTO entries SELECT * FROM new ORDER BY position")
        db.execute("DROP TABLE new")
        db.execute("UPDATE sqlite_sequence SET seq = seq + ? WHERE name = 'entries'", (deleted,))
        db.execute("UPDATE meta SET value = 3 WHERE key = 'format_version'")
        db.execute("COMMIT")
        (last,) = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'entries'").fetchone()
    finally:
        db.close()
    return int(last)


def test_a_file_of_format_3_keeps_its_positions_and_is_marked_4(tmp_path: Path) -> None:
    path = tmp_path / "states.db"
    with SQLiteStore(path) as store:
        root, kid, _ = a_tree(store)
        seen = store.tree_entries("root")
    last = _set_back_to_format_3(path, deleted=5)
    passed = f"sqlite:{last}"  # a follower read the deleted rows, up to the last one
    with SQLiteStore(path) as store:
        assert store.tree_entries("root") == seen
        assert store.tree_entries("root", after=passed) == ()  # not past the end
        store.save(grown(store.load("kid"), "after"))
        new = store.tree_entries("root", after=passed)
        assert keys(new) == [("kid", len(kid.history))]
        assert store.tree_entries("root", after=seen[-1].cursor) == new
        store.delete("kid")  # the newest rows
        store.save(grown(store.load("root"), "later"))
        assert keys(store.tree_entries("root", after=new[-1].cursor)) == [
            ("root", len(root.history))
        ]
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT value FROM meta WHERE key = 'format_version'").fetchone() == (
            SQLITE_FORMAT,
        )
        (table,) = db.execute("SELECT sql FROM sqlite_master WHERE name = 'entries'").fetchone()
        assert "AUTOINCREMENT" in table  # kept as it was: not copied again
    finally:
        db.close()


def test_a_new_file_gives_positions_without_autoincrement(tmp_path: Path) -> None:
    path = tmp_path / "states.db"
    with SQLiteStore(path) as store:
        root, _, _ = a_tree(store)
        seen = store.tree_entries("root")
        store.delete("grandkid")  # not the newest rows (the kid's): no position to keep
        store.save(linked("late", "root"))
        late = store.tree_entries("root", after=seen[-1].cursor)
        assert keys(late) == [("late", 0), ("late", 1)]
        store.delete("late")  # the newest row
        with SQLiteStore(path) as again:  # another connection, after the delete
            again.save(grown(again.load("root"), "later"))
            assert keys(again.tree_entries("root", after=late[-1].cursor)) == [
                ("root", len(root.history))
            ]
    db = sqlite3.connect(path)
    try:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
        (table,) = db.execute("SELECT sql FROM sqlite_master WHERE name = 'entries'").fetchone()
        kept = db.execute("SELECT count(*) FROM entries WHERE state_id = ''").fetchone()
    finally:
        db.close()
    assert "AUTOINCREMENT" not in table
    assert "sqlite_sequence" not in tables
    assert kept == (1,)  # the one row that keeps the deleted last position


def test_a_format_2_file_with_roots_was_set_back(tmp_path: Path) -> None:
    path = tmp_path / "states.db"
    with SQLiteStore(path) as store:
        a_tree(store)
    db = sqlite3.connect(path)
    with db:
        db.execute("UPDATE meta SET value = 2 WHERE key = 'format_version'")
    db.close()
    with SQLiteStore(path) as store, pytest.raises(StoreDamagedError, match=r"format 2.*set back"):
        store.list()


# -- FileStore ---------------------------------------------------------------------------------


def _info(folder: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((folder / "info.json").read_bytes())
    return data


@pytest.mark.parametrize("lost", ["the feed", "the info"])
def test_a_crash_between_the_files_of_a_save_loses_and_repeats_nothing(
    tmp_path: Path, lost: str
) -> None:
    """A save writes the log, then the feed, then info.json; a crash may stop it in between.

    "the feed": the log holds the entries, the feed and the info do not say so. "the info":
    the log and the feed hold them, the info does not say so. The next save puts each entry
    in the feed once.
    """
    store = FileStore(tmp_path / "states")
    root, kid, _ = a_tree(store)
    folder, feed_file = tmp_path / "states" / "kid", tmp_path / "states" / "root" / "tree.jsonl"
    info, feed = (folder / "info.json").read_bytes(), feed_file.read_bytes()
    store.save(grown(kid, "cut off"))
    (folder / "info.json").write_bytes(info)  # as the crash left it
    if lost == "the feed":
        feed_file.write_bytes(feed)
    store.save(grown(store.load("kid"), "next"))  # a new store object: nothing cached
    store.save(grown(root, "and the root"))
    items = FileStore(tmp_path / "states").tree_entries("root")
    assert len(set(keys(items))) == len(items)
    kid_seqs = [index for state_id, index in keys(items) if state_id == "kid"]
    assert kid_seqs == list(range(len(store.load("kid").history)))
    assert _info(folder)["fed"] == len(store.load("kid").history)


def test_a_torn_line_at_the_end_of_the_feed_is_cut(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "states")
    root, _, _ = a_tree(store)
    feed_file = tmp_path / "states" / "root" / "tree.jsonl"
    seen = store.tree_entries("root")
    with feed_file.open("ab") as torn:
        torn.write(b'{"s":"kid","g":"')  # what a crash mid-write leaves
    assert store.tree_entries("root", after=seen[-1].cursor) == ()
    store.save(grown(root, "after the tear"))
    assert keys(store.tree_entries("root", after=seen[-1].cursor)) == [("root", 2)]


def test_a_state_of_format_2_joins_its_feed_at_its_next_save(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "states")
    root, kid, grandkid = a_tree(store)
    for state in (root, kid, grandkid):
        folder = tmp_path / "states" / state.id
        info = _info(folder)
        for key in ("root", "generation", "fed", "fed_at"):
            del info[key]
        info["format"] = 2
        (folder / "info.json").write_text(json.dumps(info))
    (tmp_path / "states" / "root" / "tree.jsonl").unlink()
    again = FileStore(tmp_path / "states")
    assert [again.root_of(i) for i in ("root", "kid", "grandkid")] == ["root"] * 3
    assert again.tree_entries("root") == ()  # written before feeds: not in one yet
    again.save(grown(again.load("grandkid"), "one more"))
    assert keys(again.tree_entries("root")) == [("grandkid", i) for i in range(3)]
    assert _info(tmp_path / "states" / "grandkid")["format"] == FORMAT_VERSION


def test_a_state_deleted_and_saved_again_leaves_its_old_lines_behind(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "states")
    a_tree(store)
    store.delete("grandkid")
    store.save(grown(linked("grandkid", "kid"), "new life"))
    items = store.tree_entries("root")
    assert [index for state_id, index in keys(items) if state_id == "grandkid"] == [0, 1, 2]
    last = [item.entry for item in items if item.state_id == "grandkid"][-1]
    assert isinstance(last, UserEntry)
    assert last.content.text == "new life"


def test_deleting_the_root_ends_its_feed_and_its_children_still_save(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "states")
    _, kid, _ = a_tree(store)
    store.delete("root")
    store.save(grown(kid, "orphaned"))
    assert store.root_of("kid") == "root"
    with pytest.raises(LookupError, match="root"):
        store.tree_entries("root")
