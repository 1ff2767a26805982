"""`FileStore` beyond the contract: the files it writes, and what it does with damaged ones."""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from orchestrator import AsyncStore, Message, RunStart, State, Store, StoreDamagedError, StoreError

# Private: record_run_start has no public name; INFO and LOG name the files on disk.
from orchestrator._record._recording import record_run_start
from stores import FORMAT_VERSION, FileStore, ThreadedAsync, chain_digests, first_digest
from stores._file import INFO, LOG
from stores.contract import crashed_pending, rich_state
from tests.doubles import mode_of, results


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")


def files_under(path: Path) -> dict[str, bytes]:
    return {
        str(item.relative_to(path)): item.read_bytes()
        for item in sorted(path.rglob("*"))
        if item.is_file()
    }


def entries_of(root: Path, state_id: str) -> list[bytes]:
    """The encoded entries of a stored State, out of their sealed log lines."""
    return [
        line.split(b'","e":', 1)[1][:-1]
        for line in (root / state_id / LOG).read_bytes().splitlines()
    ]


def forge(root: Path, state_id: str, entries: list[bytes]) -> None:
    """Write `entries` as the State's log with valid digests, and count them in its info.

    What someone who knows the format can do: the entries then pass the integrity checks, so
    the checks behind them (decoding, order, replay) are what a load meets.
    """
    digests = chain_digests(first_digest(state_id), entries)
    (root / state_id / LOG).write_bytes(
        b"".join(
            b'{"d":"' + digest.hex().encode() + b'","e":' + entry + b"}\n"
            for digest, entry in zip(digests, entries, strict=True)
        )
    )
    info = json.loads((root / state_id / INFO).read_bytes())
    info["entries"], info["head"] = len(entries), digests[-1].hex() if digests else None
    (root / state_id / INFO).write_text(json.dumps(info))


@pytest.fixture
def store(root: Path) -> FileStore:
    return FileStore(root)


# Files ----------------------------------------------------------------------------------------


def test_a_state_is_a_folder_with_a_log_and_an_info_file(store: FileStore, root: Path) -> None:
    assert isinstance(store, Store)
    assert isinstance(store, AsyncStore)
    assert repr(store) == f"FileStore({str(root)!r})"
    assert store.path == root
    state = rich_state()
    store.save(state)
    assert sorted(os.listdir(root)) == ["rich"]
    assert sorted(os.listdir(root / "rich")) == [INFO, LOG, "tree.jsonl"]  # a root: its feed
    log = lines_of(root / "rich" / LOG)
    assert log[-1] == b""  # every line ends with a newline
    assert len(log) - 1 == len(state.history)
    sealed = [json.loads(line) for line in log[:-1]]
    assert [line["e"]["seq"] for line in sealed] == list(range(len(state.history)))
    digests = chain_digests(first_digest("rich"), entries_of(root, "rich"))
    assert [line["d"] for line in sealed] == [digest.hex() for digest in digests]
    info = json.loads((root / "rich" / INFO).read_bytes())
    assert info["format"] == FORMAT_VERSION == 3
    assert (info["root"], info["fed"]) == ("rich", len(state.history))
    assert (info["id"], info["entries"], info["finished"]) == ("rich", len(state.history), True)
    assert info["head"] == digests[-1].hex()


def test_files_are_0600_and_folders_0700(store: FileStore, root: Path) -> None:
    old = os.umask(0)  # even with a permissive umask
    try:
        state = State(id="private", messages=[Message.user("secret")])
        store.save(state)
        state.add_message(Message.user("more"))
        store.save(state)
    finally:
        os.umask(old)
    assert mode_of(root) == 0o700
    assert mode_of(root / "private") == 0o700
    assert mode_of(root / "private" / LOG) == 0o600
    assert mode_of(root / "private" / INFO) == 0o600


def test_a_save_appends_only_the_new_lines(store: FileStore, root: Path) -> None:
    state = State(id="grows", messages=[Message.user("one")])
    store.save(state)
    log = root / "grows" / LOG
    first = log.read_bytes()
    store.save(state)
    assert log.read_bytes() == first
    for text in ("two", "three", "four"):
        state.add_message(Message.user(text))
    store.save(state)
    data = log.read_bytes()
    assert data.startswith(first)
    assert data[len(first) :].count(b"\n") == 3
    assert json.loads((root / "grows" / INFO).read_bytes())["entries"] == 4


def test_line_separators_inside_text_survive(store: FileStore, root: Path) -> None:
    text = "a\u2028b\u2029c\x85d\re\nf\x0bg\x0ch\x1c"
    state = State(id="seps", messages=[Message.user(text)])
    state.add_message(Message.user("after"))
    store.save(state)
    assert len(lines_of(root / "seps" / LOG)) == 3
    loaded = FileStore(root).load("seps")
    assert [message.text for message in loaded.messages] == [text, "after"]


def test_nothing_is_created_before_the_first_save(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "not" / "yet")
    assert store.list() == []
    with pytest.raises(LookupError, match="'nope'"):
        store.load("nope")
    store.delete("nope")
    assert os.listdir(tmp_path) == []


def test_leftovers_of_an_interrupted_create_or_delete_are_ignored(
    store: FileStore, root: Path
) -> None:
    store.save(State(id="real", messages=[Message.user("hi")]))
    (root / ".new-real-0123").mkdir()
    (root / ".del-gone-0123").mkdir()
    (root / "stray-file").write_text("not a state")
    (root / "empty-folder").mkdir()
    assert [info.id for info in store.list()] == ["real"]


# Torn last lines ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "torn",
    [b'{"seq":3,"turn":1,"at":"2024-', b"\x00\x00\x00\x00", b'{"seq":3}', b" "],
    ids=["half-line", "zeros", "valid-json-no-newline", "blank"],
)
def test_a_torn_last_line_is_ignored_then_cut_on_the_next_append(
    store: FileStore, root: Path, torn: bytes
) -> None:
    state = State(id="torn", messages=[Message.user("one")])
    state.add_message(Message.user("two"))
    state.add_message(Message.user("three"))
    store.save(state)
    log = root / "torn" / LOG
    clean = log.read_bytes()
    with log.open("ab") as file:
        file.write(torn)
    for reader in (store, FileStore(root)):  # with and without what the store remembers
        loaded = reader.load("torn")
        assert loaded.snapshot() == state.snapshot()
        assert log.read_bytes() == clean + torn  # loading writes nothing
    loaded.add_message(Message.user("four"))
    FileStore(root).save(loaded)
    data = log.read_bytes()
    assert data.startswith(clean)
    assert torn not in data[len(clean) :]
    assert data.count(b"\n") == 4
    assert FileStore(root).load("torn").snapshot() == loaded.snapshot()


def test_the_same_store_cuts_a_torn_line_left_after_its_own_save(
    store: FileStore, root: Path
) -> None:
    state = State(id="torn", messages=[Message.user("one")])
    store.save(state)
    with (root / "torn" / LOG).open("ab") as file:
        file.write(b'{"seq":1,"tu')
    state.add_message(Message.user("two"))
    store.save(state)
    assert store.load("torn").snapshot() == state.snapshot()
    assert (root / "torn" / LOG).read_bytes().count(b"\n") == 2


# Damaged data: a clear error, and nothing else touched ----------------------------------------


def damage_line(root: Path, state_id: str, index: int, line: bytes) -> None:
    log = root / state_id / LOG
    lines = lines_of(log)
    lines[index] = line
    log.write_bytes(b"\n".join(lines))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b'{"seq":2,"turn":0,"at":"2024-01-01T00:00:00Z","kind":"us', "entry 2 cannot be read"),
        (b"not json at all", "entry 2 cannot be read"),
        (b"", "entry 2 cannot be read"),
        (
            b'{"seq":2,"turn":0,"at":"2024-01-01T00:00:00Z","kind":"alien"}',
            "entry 2 cannot be read",
        ),
        (
            b'{"seq":7,"turn":0,"at":"2024-01-01T00:00:00Z","kind":"user","content":'
            b'{"role":"user","content":[{"kind":"text","text":"x"}]}}',
            "entry 2 says it is entry 7",
        ),
    ],
    ids=["truncated", "not-json", "empty", "unknown-kind", "wrong-seq"],
)
def test_a_bad_line_raises_value_error_naming_the_state_and_index(
    store: FileStore, root: Path, line: bytes, message: str
) -> None:
    bad, good = rich_state("bad"), rich_state("good")
    store.save(bad)
    store.save(good)
    entries = entries_of(root, "bad")
    # Written in place of a line, it fails the integrity check; written with valid digests (as
    # someone who knows the format could), it fails to decode or is out of place.
    damage_line(root, "bad", 2, line)
    for reader in (store, FileStore(root)):
        with pytest.raises(StoreDamagedError, match=r"entry 2 fails its integrity check"):
            reader.load("bad")
    forge(root, "bad", [*entries[:2], line, *entries[3:]])
    before = files_under(root)
    for reader in (store, FileStore(root)):
        pattern = rf"FileStore .*: State 'bad' is damaged: history {message}"
        with pytest.raises(StoreDamagedError, match=pattern) as caught:
            reader.load("bad")
        assert "backup" in str(caught.value)
    assert files_under(root) == before
    # The others work as before.
    assert FileStore(root).load("good").snapshot() == good.snapshot()
    good.add_message(Message.user("still fine"))
    FileStore(root).save(good)
    assert FileStore(root).load("good").snapshot() == good.snapshot()
    assert {info.id for info in FileStore(root).list()} == {"bad", "good"}
    FileStore(root).delete("bad")
    assert [info.id for info in FileStore(root).list()] == ["good"]


def test_a_damaged_last_line_stops_a_save_and_changes_nothing(store: FileStore, root: Path) -> None:
    state = crashed_pending("hurt")
    store.save(state)
    count = len(state.history)
    damage_line(root, "hurt", count - 1, b'{"seq": "oops"}')
    with (root / "hurt" / LOG).open("ab") as file:
        file.write(b'{"seq": 9')  # and a torn line after it: not cut by a failing save
    before = files_under(root)
    state.add_message(Message.user("more"))
    pattern = rf"State 'hurt' is damaged: history entry {count - 1} cannot be read"
    with pytest.raises(StoreDamagedError, match=pattern):
        FileStore(root).save(state)
    assert files_under(root) == before


def test_a_damaged_info_file_is_a_clear_error(store: FileStore, root: Path) -> None:
    store.save(State(id="hurt", messages=[Message.user("a")]))
    store.save(State(id="good", messages=[Message.user("b")]))
    for text, problem in (
        (b"{not json", "damaged"),
        (b"[1]", "not a JSON object"),
        (b'{"format": 1, "id": 5}', "damaged"),
    ):
        (root / "hurt" / INFO).write_bytes(text)
        with pytest.raises(StoreDamagedError, match=rf"State 'hurt'.*{problem}.*delete the State"):
            FileStore(root).load("hurt")
        # Listing goes on: the damaged State is named, with its damage; the other is whole.
        good, hurt = sorted(FileStore(root).list(), key=lambda info: info.id)
        assert (hurt.id, good.id, good.damage, good.title) == ("hurt", "good", None, "b")
        assert hurt.damage is not None
        assert re.search(rf"State 'hurt' is damaged: {INFO} cannot be read", hurt.damage)
    assert FileStore(root).load("good").messages[0].text == "b"


def test_a_missing_log_is_a_clear_error(store: FileStore, root: Path) -> None:
    store.save(State(id="half", messages=[Message.user("a")]))
    (root / "half" / LOG).unlink()
    with pytest.raises(ValueError, match=r"State 'half'.*log.jsonl is missing"):
        store.load("half")


@pytest.mark.parametrize(
    ("found", "words"),
    [(0, "older"), (4, "newer orchestrator: upgrade"), (None, "older or unknown"), ("1", "older")],
)
def test_another_format_version_is_refused_naming_both(
    store: FileStore, root: Path, found: object, words: str
) -> None:
    state = State(id="versioned", messages=[Message.user("a")])
    store.save(state)
    store.save(State(id="current", messages=[Message.user("b")]))
    info = json.loads((root / "versioned" / INFO).read_bytes())
    if found is None:
        del info["format"]
    else:
        info["format"] = found
    (root / "versioned" / INFO).write_text(json.dumps(info))
    before = files_under(root)
    pattern = rf"State 'versioned'.*format version {found!r}.*reads version 3; .*{words}"
    with pytest.raises(ValueError, match=pattern):
        FileStore(root).load("versioned")
    state.add_message(Message.user("more"))
    with pytest.raises(ValueError, match=pattern):
        FileStore(root).save(state)
    with pytest.raises(ValueError, match=pattern):
        store.save(state)  # the store that saved it before the change refuses too
    listed = {info.id: info.damage for info in FileStore(root).list()}
    assert listed["current"] is None
    assert re.search(pattern, listed["versioned"] or "")
    assert files_under(root) == before
    assert FileStore(root).load("current").messages[0].text == "b"


# Ids ------------------------------------------------------------------------------------------


def test_an_id_with_dot_dot_is_refused_and_nothing_outside_is_touched(
    tmp_path: Path, root: Path, store: FileStore
) -> None:
    outside = tmp_path / "x"
    outside.mkdir()
    (outside / INFO).write_text(json.dumps({"format": 1, "id": "x"}))
    (outside / LOG).write_text("")
    store.save(State(id="inside", messages=[Message.user("a")]))
    before = files_under(tmp_path)
    for bad in ("../x", "..", "x/../../x", "/tmp/x", "x\x00"):
        with pytest.raises(ValueError, match="not valid"):
            store.load(bad)
        with pytest.raises(ValueError, match="not valid"):
            store.delete(bad)
        with pytest.raises(ValueError, match="not valid"):
            store.list(parent_id=bad)
        with pytest.raises(ValueError, match="not valid"):
            State(id=bad)
    assert files_under(tmp_path) == before
    assert sorted(os.listdir(tmp_path)) == ["states", "x"]


# Several store objects on one folder ----------------------------------------------------------


def test_a_store_notices_what_another_store_appended(root: Path) -> None:
    first, second = FileStore(root), FileStore(root)
    state = State(id="shared", messages=[Message.user("a")])
    first.save(state)
    copy = second.load("shared")
    copy.add_message(Message.user("from the second"))
    second.save(copy)
    state.add_message(Message.user("from the first"))
    with pytest.raises(ValueError, match=r"'shared'.*different.*load"):
        first.save(state)  # its history diverged from what the second saved
    again = first.load("shared")
    again.add_message(Message.user("continued"))
    first.save(again)
    assert second.load("shared").snapshot() == again.snapshot()


def test_a_store_notices_a_state_deleted_and_made_again_by_another(root: Path) -> None:
    first, second = FileStore(root), FileStore(root)
    old = State(id="reborn", messages=[Message.user("old")])
    first.save(old)
    second.delete("reborn")
    new = State(id="reborn", messages=[Message.user("new")])
    second.save(new)
    old.add_message(Message.user("more"))
    with pytest.raises(ValueError, match="'reborn'"):
        first.save(old)
    assert first.load("reborn").snapshot() == new.snapshot()


# The async twins ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_async_twins_run_the_sync_methods_in_a_worker_thread(root: Path) -> None:
    threads: list[threading.Thread] = []

    class Watched(FileStore):
        def save(self, state: State) -> None:
            threads.append(threading.current_thread())
            super().save(state)

    store = Watched(root)
    state = State(id="away", messages=[Message.user("hi")])
    await store.asave(state)
    assert len(threads) == 1
    assert threads[0] is not threading.current_thread()
    assert (await store.aload("away")).snapshot() == state.snapshot()
    assert [info.id for info in await store.alist(limit=1)] == ["away"]
    await store.adelete("away")
    assert await store.alist() == []


@pytest.mark.anyio
async def test_a_cancelled_asave_finishes_its_write_then_raises(root: Path) -> None:
    started, release = threading.Event(), threading.Event()

    class Slow(FileStore):
        def save(self, state: State) -> None:
            started.set()
            release.wait()
            super().save(state)

    store = Slow(root)
    state = State(id="slow", messages=[Message.user("hi")])
    scope = anyio.CancelScope()
    after_save: list[bool] = []

    async def save() -> None:
        with scope:
            await store.asave(state)
            after_save.append(True)

    async with anyio.create_task_group() as group:
        group.start_soon(save)
        await anyio.to_thread.run_sync(started.wait)
        scope.cancel()  # while the write runs in its thread
        release.set()
    assert scope.cancelled_caught
    assert after_save == []
    assert FileStore(root).load("slow").snapshot() == state.snapshot()


def test_a_threaded_async_class_must_define_the_sync_methods() -> None:
    with pytest.raises(TypeError, match=r"Half.*does not define list, delete"):

        class Half(ThreadedAsync):  # pyright: ignore[reportUnusedClass]
            def save(self, state: State) -> None: ...
            def load(self, state_id: str) -> State: ...


def test_a_last_line_encoded_differently_still_continues(tmp_path: Path) -> None:
    # A line written by another library version may encode the same entry differently: a save
    # that continues it compares the decoded entry, not only the bytes.
    state = State(id="older", messages=[Message.user("hi")])
    FileStore(tmp_path).save(state)
    entries = entries_of(tmp_path, "older")
    reencoded = json.dumps(json.loads(entries[-1]), indent=None, separators=(", ", ": "))
    assert reencoded.encode() != entries[-1]
    forge(tmp_path, "older", [*entries[:-1], reencoded.encode()])
    state.add_message(Message.user("more"))
    FileStore(tmp_path).save(state)  # a new store object: nothing cached, only the file
    assert FileStore(tmp_path).load("older").snapshot() == state.snapshot()


def test_a_different_entry_at_the_stored_end_is_still_refused(tmp_path: Path) -> None:
    FileStore(tmp_path).save(State(id="taken", messages=[Message.user("one")]))
    other = State(id="taken", messages=[Message.user("two")])
    other.add_message(Message.user("three"))
    with pytest.raises(ValueError, match=r"store\.load"):
        FileStore(tmp_path).save(other)


# Damage stays with its State -------------------------------------------------------------------


def cut_off_lead_with_children(store: FileStore) -> None:
    store.save(crashed_pending("lead"))
    for kid in ("kid-a", "kid-b"):
        child = State(id=kid, messages=[Message.user("sub task")])
        record_run_start(child, RunStart(parent_id="lead", parent_call_id="c2"))
        store.save(child)


def test_recovery_reads_only_the_loaded_states_own_data(store: FileStore, root: Path) -> None:
    cut_off_lead_with_children(store)
    store.save(State(id="stranger", messages=[Message.user("unrelated")]))
    (root / "stranger" / INFO).write_bytes(b"{damaged")
    lead = FileStore(root).load("lead")
    assert [entry.child_ids for entry in results(lead)[-2:]] == [("kid-a", "kid-b"), ()]
    # The parent keeps its own list of children: the others' files are not read.
    listed = (root / "lead" / "children.jsonl").read_bytes().splitlines()
    assert [json.loads(line) for line in listed] == [
        {"id": "kid-a", "call": "c2"},
        {"id": "kid-b", "call": "c2"},
    ]
    infos = {info.id: info for info in FileStore(root).list()}
    assert set(infos) == {"lead", "kid-a", "kid-b", "stranger"}
    assert infos["stranger"].damage is not None
    assert [info.damage for name, info in infos.items() if name != "stranger"] == [None] * 3


def test_a_child_with_damaged_info_is_named_when_its_parent_is_recovered(
    store: FileStore, root: Path
) -> None:
    # Recovery checks each child's link against the child's own history: a child that cannot
    # be read cannot be checked, so it is named, never listed unchecked.
    cut_off_lead_with_children(store)
    (root / "kid-a" / INFO).write_bytes(b"[]")
    (root / "kid-b").rename(root / ".gone")  # deleted meanwhile: left out
    with pytest.raises(StoreDamagedError, match=r"State 'kid-a' is damaged: info.json"):
        FileStore(root).load("lead")
    store.delete("kid-a")
    lead = FileStore(root).load("lead")
    assert results(lead)[-2].child_ids == ()


def test_a_damaged_list_of_children_names_the_parent(store: FileStore, root: Path) -> None:
    cut_off_lead_with_children(store)
    with (root / "lead" / "children.jsonl").open("ab") as file:
        file.write(b'{"id": "../x"}\n{"id": "torn')  # a bad line, then a torn last one
    with pytest.raises(StoreDamagedError, match=r"State 'lead' is damaged: line 3 of children"):
        FileStore(root).load("lead")


def test_a_torn_line_in_the_list_of_children_is_cut_before_the_next(
    store: FileStore, root: Path
) -> None:
    # Found by tests/stress/test_chaos.py: a crash in the middle of noting a child left a torn
    # line, the next child's line was appended to it, and the parent could not be recovered.
    cut_off_lead_with_children(store)
    with (root / "lead" / "children.jsonl").open("ab") as file:
        file.write(b'{"id":"kid-')
    child = State(id="kid-c", messages=[Message.user("sub task")])
    record_run_start(child, RunStart(parent_id="lead", parent_call_id="c2"))
    FileStore(root).save(child)
    lead = FileStore(root).load("lead")
    assert results(lead)[-2].child_ids == ("kid-a", "kid-b", "kid-c")
    assert (root / "lead" / "children.jsonl").read_bytes().count(b"kid-") == 3


def test_a_folder_whose_info_names_another_state_is_damaged(store: FileStore, root: Path) -> None:
    store.save(State(id="original", messages=[Message.user("mine")]))
    shutil.copytree(root / "original", root / "copy")
    with pytest.raises(StoreDamagedError, match=r"'copy' is damaged: its info.json says it is"):
        FileStore(root).load("copy")
    infos = {info.id: info for info in FileStore(root).list()}
    assert infos["original"].damage is None
    assert "says it is State 'original'" in (infos["copy"].damage or "")


def test_a_failing_file_system_is_a_store_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("a file where the store's folder should be")
    store = FileStore(tmp_path / "file")
    with pytest.raises(StoreError, match=r"FileStore .*file' failed \(State 'x'\)") as caught:
        store.save(State(id="x"))
    assert isinstance(caught.value.__cause__, OSError)
    with pytest.raises(StoreError, match=r"FileStore .* failed") as caught:
        store.list()
    assert isinstance(caught.value.__cause__, NotADirectoryError)


def test_a_child_noted_before_its_first_run_was_written_is_left_out(
    store: FileStore, root: Path
) -> None:
    # A State saved before it ran, then run as a subagent: its parent notes it in
    # children.jsonl before its run_start is appended, and a crash may come between. Its
    # history names no parent, yet it is no stranger's work: it never ran, so it is left out.
    cut_off_lead_with_children(store)
    store.save(State(id="kid-c", messages=[Message.user("not started")]))
    with (root / "lead" / "children.jsonl").open("a") as file:
        file.write(json.dumps({"id": "kid-c", "call": "c3"}) + "\n")
    lead = FileStore(root).load("lead")
    assert [entry.child_ids for entry in results(lead)[-2:]] == [("kid-a", "kid-b"), ()]
