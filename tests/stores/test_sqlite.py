"""`SQLiteStore`: what only the SQLite backend must show, on top of the contract suite.

Real processes (started with `sys.executable`) share one file and crash mid-run; threads and
concurrent async runs share one store; damaged rows and other format versions are refused with
a message that names the place. Orderings are forced with files and events, never with timing.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import subprocess
import sys
import textwrap
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator import (
    Agent,
    ErrorEntry,
    Image,
    Message,
    ModelReplyEntry,
    Reply,
    State,
    StateInfo,
    StoppedByFinish,
    StoreDamagedError,
    StoreError,
    ToolResultEntry,
    Usage,
)
from orchestrator._record._recording import begin_think, record_reply
from orchestrator.testing import FakeModel, tool_call
from stores import SQLiteStore
from stores._sql import FORMAT as SQLITE_FORMAT
from stores.backend import Tail, TailCache, storage_view
from tests.doubles import add, assert_same, bound_store, reseal_sql, results, write_sql

ROOT = Path(__file__).resolve().parents[2]

# Helpers --------------------------------------------------------------------------------------


def run_agent(store: SQLiteStore, state: State, replies: list[Any], **settings: Any) -> Any:
    return Agent(FakeModel(replies), tools=[add], store=store, **settings).run(state)


def stored_rows(path: Path, state_id: str) -> list[tuple[int, bytes]]:
    with sqlite3.connect(path) as db:
        rows = db.execute(
            "SELECT seq, data FROM entries WHERE state_id = ? ORDER BY seq", (state_id,)
        ).fetchall()
    db.close()
    return [(int(seq), bytes(data)) for seq, data in rows]


def run_script(
    tmp_path: Path, name: str, body: str, *args: str
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(body), encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def store(path: Path) -> Any:
    with SQLiteStore(path) as store:
        yield store


# Saving and loading ---------------------------------------------------------------------------


def test_a_run_round_trips_and_the_loaded_state_is_bound(store: SQLiteStore) -> None:
    state = State(messages=[Message.user("What is 1 + 2?")], extra_data={"k": [1, "two"]})
    answer = run_agent(store, state, [tool_call("add", a=1, b=2), "It is 3."])
    assert answer == "It is 3."
    loaded = store.load(state.id)
    assert_same(loaded, state)
    assert bound_store(loaded) is store  # private: the binding has no public accessor
    loaded.add_message(Message.user("And now?"))
    with SQLiteStore(store.path) as other:  # a loaded State runs on, here with a second store
        run_agent(other, loaded, ["Still 3."])
    assert_same(store.load(state.id), loaded)
    assert loaded.answer == "Still 3."


def test_save_writes_only_new_entries_and_is_idempotent(store: SQLiteStore, path: Path) -> None:
    state = State(messages=[Message.user("hi")])
    store.save(state)
    first = stored_rows(path, state.id)
    assert [seq for seq, _ in first] == [0]
    store.save(state)
    store.save(state)
    assert stored_rows(path, state.id) == first
    state.add_message(Message.user("more"))
    state.add_message(Message.user("and more"))
    store.save(state)
    rows = stored_rows(path, state.id)
    assert [seq for seq, _ in rows] == [0, 1, 2]
    assert rows[0] == first[0]  # the stored entry was not written again
    assert store.list()[0].entries == 3


def test_an_empty_state_is_listed_and_loads(store: SQLiteStore) -> None:
    state = State(id="empty")
    store.save(state)
    assert store.list() == [storage_view(state).info]
    assert store.load("empty").history == ()


def test_list_gives_the_same_info_as_info_of(store: SQLiteStore) -> None:
    researcher = Agent(FakeModel(["Found it."]), name="researcher", description="Looks up.")
    parent = State(messages=[Message.user("x" * 300)])
    Agent(
        FakeModel([tool_call("researcher", task="look"), "Done."]),
        tools=[researcher.as_tool()],
        store=store,
    ).run(parent)
    (child_id,) = [child for e in results(parent) for child in e.child_ids]
    child = parent.child(child_id)
    finished = State(messages=[Message.notice("a notice"), Message.user("the title")])
    finished.finish({"answer": [1, 2.5, None]})
    store.save(finished)
    priced = State(messages=[Message.user("priced")])
    begin_think(priced, model="m")
    record_reply(priced, Reply(Message.assistant("ok"), Usage(input_tokens=3, cost=0.25)))
    store.save(priced)
    infos = {info.id: info for info in store.list()}
    for state in (parent, child, finished, priced):
        assert infos[state.id] == storage_view(state).info
    assert infos[parent.id].title == "x" * 200
    assert infos[child.id].parent_id == parent.id
    assert infos[finished.id].stopped == StoppedByFinish({"answer": [1, 2.5, None]})
    assert infos[finished.id].title == "[notice] a notice"  # a notice is a user message too
    assert infos[priced.id].usage.cost == 0.25
    assert store.list(parent_id=parent.id) == [storage_view(child).info]


def test_titles_and_naive_times_map_like_info_of(store: SQLiteStore) -> None:
    untitled = State(messages=[Message.assistant("I start"), Message.user("the question")])
    store.save(untitled)
    first = State(messages=[Message.user("naive")]).history[0]
    naive = dataclasses.replace(first, at=datetime(2024, 5, 6, 7, 8, 9, 123456))
    dated = State(history=[naive])
    store.save(dated)
    infos = {info.id: info for info in store.list()}
    assert infos[untitled.id] == storage_view(untitled).info
    assert infos[untitled.id].title == "the question"
    assert infos[dated.id].created_at == datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    assert [info.id for info in store.list()] == [untitled.id, dated.id]


def test_the_row_follows_every_change_between_saves(store: SQLiteStore) -> None:
    # A store reuses the parts of a row whose sources did not change (title, usage, stop);
    # each save must still list what info_of gives, as title, usage and stop change.
    state = State()
    empty = state.snapshot()
    saved: list[StateInfo] = []

    def save() -> None:
        store.save(state)
        (info,) = store.list()
        assert info == storage_view(state).info
        saved.append(info)

    save()
    state.add_message(Message.user("the question"))  # the first message gives the title
    save()
    begin_think(state, model="m")
    record_reply(state, Reply(Message.assistant("ok"), Usage(input_tokens=3, cost=0.25)))
    save()
    state.finish("done")
    save()
    state.restore(empty)
    state.add_message(Message.user("another start"))  # another first message
    save()
    assert [info.title for info in saved] == [
        "", "the question", "the question", "the question", "another start",
    ]  # fmt: skip
    assert [info.usage.input_tokens for info in saved] == [0, 0, 3, 3, 3]  # spent stays spent
    assert [info.finished for info in saved] == [False, False, False, True, False]


def test_an_in_memory_database_works_while_the_store_is_open() -> None:
    with SQLiteStore(":memory:") as store:
        state = State(messages=[Message.user("kept in memory")])
        store.save(state)
        assert_same(store.load(state.id), state)


def test_list_orders_by_update_then_id_and_limits(store: SQLiteStore) -> None:
    older = State(id="older", messages=[Message.user("1")])
    newer = State(id="newer", messages=[Message.user("2")])
    store.save(older)
    store.save(newer)
    assert [info.id for info in store.list()] == ["newer", "older"]
    older.add_message(Message.user("again"))
    store.save(older)
    assert [info.id for info in store.list()] == ["older", "newer"]
    assert [info.id for info in store.list(limit=1)] == ["older"]
    assert store.list(limit=0) == []
    twin_b = State(id="b", history=older.history)
    twin_a = State(id="a", history=older.history)
    store.save(twin_b)
    store.save(twin_a)
    assert [info.id for info in store.list(limit=3)] == ["a", "b", "older"]  # ties: by id
    with pytest.raises(ValueError, match="limit"):
        store.list(limit=-1)
    with pytest.raises(TypeError, match="limit"):
        store.list(limit="2")  # pyright: ignore[reportArgumentType]


def test_delete_forgets_one_state_only(store: SQLiteStore, path: Path) -> None:
    keep = State(messages=[Message.user("keep")])
    drop = State(messages=[Message.user("drop")])
    store.save(keep)
    store.save(drop)
    store.delete(drop.id)
    store.delete(drop.id)  # absent: nothing happens
    assert [info.id for info in store.list()] == [keep.id]
    assert stored_rows(path, drop.id) == []
    with pytest.raises(LookupError, match=drop.id):
        store.load(drop.id)
    assert_same(store.load(keep.id), keep)


def test_another_history_under_a_taken_id_is_refused(store: SQLiteStore) -> None:
    state = State(id="taken", messages=[Message.user("first")])
    store.save(state)
    other = State(id="taken", messages=[Message.user("second")])
    with pytest.raises(ValueError, match=r"store\.load\('taken'\)"):
        store.save(other)
    loaded = store.load("taken")
    loaded.add_message(Message.user("next"))
    store.save(loaded)
    with pytest.raises(ValueError, match="holds 2 entries under this id and this State has fewer"):
        store.save(State(id="taken"))
    state.add_message(Message.user("a stale copy"))
    with pytest.raises(ValueError, match="entry 1 differs"):
        store.save(state)
    assert_same(store.load("taken"), loaded)  # nothing was written by the refused saves


def test_a_save_after_another_connection_wrote_reads_the_stored_end_again(path: Path) -> None:
    # A store remembers where each history it wrote ends; a write by another connection (here
    # a second store on the file, as another process would be) must make it read the end again.
    with SQLiteStore(path) as first, SQLiteStore(path) as second:
        state = State(id="shared", messages=[Message.user("one")])
        first.save(state)
        theirs = second.load("shared")
        theirs.add_message(Message.user("theirs"))
        second.save(theirs)
        state.add_message(Message.user("ours"))
        with pytest.raises(ValueError, match="entry 1 differs"):
            first.save(state)
        assert_same(first.load("shared"), theirs)
        second.delete("shared")
        first.save(state)  # the other connection deleted it: written whole again
        assert_same(second.load("shared"), state)


ANOTHER_PROCESS = """
    import sys
    from orchestrator import Message
    from stores import SQLiteStore

    path, state_id, action = sys.argv[1:]
    with SQLiteStore(path) as store:
        if action == "delete":
            store.delete(state_id)
        else:
            theirs = store.load(state_id)
            theirs.add_message(Message.user(action))
            store.save(theirs)
"""


def test_a_save_after_another_process_wrote_reads_the_stored_end_again(
    store: SQLiteStore, path: Path, tmp_path: Path
) -> None:
    # The store writes after the ends it remembers while the file's data version stays where it
    # was; a commit by another process moves it, and the next save must read the ends again.
    state = State(id="shared", messages=[Message.user("one")])
    store.save(state)
    state.add_message(Message.user("two"))
    store.save(state)  # its end is remembered now
    done = run_script(tmp_path, "other", ANOTHER_PROCESS, str(path), "shared", "theirs")
    assert done.returncode == 0, done.stderr
    state.add_message(Message.user("ours"))
    with pytest.raises(ValueError, match="entry 2 differs"):
        store.save(state)
    assert [m.text for m in store.load("shared").messages] == ["one", "two", "theirs"]
    done = run_script(tmp_path, "other", ANOTHER_PROCESS, str(path), "shared", "delete")
    assert done.returncode == 0, done.stderr
    store.save(state)  # the other process deleted it: written whole again
    assert_same(store.load("shared"), state)


def test_a_save_that_fails_after_its_states_row_is_written_leaves_nothing(
    store: SQLiteStore, path: Path
) -> None:
    # A save of a remembered end writes its states row first, then the entries: the two are one
    # transaction, so a failure of the second takes the first back.
    state = State(id="atomic", messages=[Message.user("one")])
    store.save(state)
    fail = "SELECT RAISE(ABORT, 'refused by the test')"
    trigger = f"CREATE TRIGGER refuse BEFORE INSERT ON entries WHEN NEW.seq = 2 BEGIN {fail}; END"
    write_sql(path, trigger)
    state.add_message(Message.user("two"))
    store.save(state)  # another connection made the trigger: this save reads the end again
    state.add_message(Message.user("three"))
    with pytest.raises(StoreError, match="refused by the test"):
        store.save(state)  # from the remembered end
    write_sql(path, "DROP TRIGGER refuse")
    assert [info.entries for info in store.list()] == [2]
    assert [m.text for m in store.load("atomic").messages] == ["one", "two"]
    store.save(state)
    assert_same(store.load("atomic"), state)


def test_a_save_interrupted_right_after_its_commit_can_be_saved_again(
    store: SQLiteStore, path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ctrl+C during COMMIT is raised as the call returns: the rows are written but the store
    # never learns it. The next save must read the stored end, not write the same rows again.
    state = State(messages=[Message.user("one")])
    store.save(state)
    state.add_message(Message.user("two"))
    put = TailCache.put

    def interrupted(self: TailCache, state_id: str, tail: Tail) -> None:
        monkeypatch.setattr(TailCache, "put", put)
        raise KeyboardInterrupt

    monkeypatch.setattr(TailCache, "put", interrupted)
    with pytest.raises(KeyboardInterrupt):
        store.save(state)
    assert [seq for seq, _ in stored_rows(path, state.id)] == [0, 1]  # it was committed
    state.add_message(Message.user("three"))
    store.save(state)
    assert_same(store.load(state.id), state)


def test_a_state_ending_in_a_long_entry_saves_again_and_again(store: SQLiteStore) -> None:
    # Its end is too long to keep in memory: each save reads it back from the file instead.
    state = State(messages=[Message.user("look", Image(b"\x89PNG" + bytes(100_000), "image/png"))])
    store.save(state)
    store.save(state)  # nothing new: nothing written
    state.add_message(Message.user("and now?", Image(bytes(80_000), "image/png")))
    store.save(state)
    state.add_message(Message.user("thanks"))
    store.save(state)
    assert_same(store.load(state.id), state)


def test_a_state_deleted_and_saved_again_is_written_whole(store: SQLiteStore, path: Path) -> None:
    state = State(messages=[Message.user("one")])
    store.save(state)
    state.add_message(Message.user("two"))
    store.save(state)
    store.delete(state.id)
    state.add_message(Message.user("three"))
    store.save(state)
    assert [seq for seq, _ in stored_rows(path, state.id)] == [0, 1, 2]
    assert_same(store.load(state.id), state)


def test_the_same_entry_written_with_other_formatting_still_continues(
    store: SQLiteStore, path: Path
) -> None:
    state = State(messages=[Message.user("hi")], extra_data={"a": 1})
    store.save(state)
    (_, last) = stored_rows(path, state.id)[-1]
    reformatted = json.dumps(dict(reversed(json.loads(last).items())), indent=1).encode()
    write_sql(path, "UPDATE entries SET data = ? WHERE seq = 1", reformatted)
    reseal_sql(path, state.id)  # as the other library version would have sealed it
    store = SQLiteStore(path)  # nothing known of the State: the end is read back
    state.add_message(Message.user("next"))
    store.save(state)
    assert_same(store.load(state.id), state)


def test_a_first_save_of_a_long_state_writes_every_entry(store: SQLiteStore) -> None:
    state = State(messages=[Message.user(f"m{i}") for i in range(600)])
    for i in range(300):
        state.add_message(Message.user(f"more {i}"))
    store.save(state)
    assert_same(store.load(state.id), state)


# Ids, damaged rows, format versions, closing -------------------------------------------------


def test_a_bad_id_is_refused_and_nothing_is_touched(store: SQLiteStore, path: Path) -> None:
    for call in (
        lambda: store.load("../x"),
        lambda: store.delete("../x"),
        lambda: store.list(parent_id="../x"),
    ):
        with pytest.raises(ValueError, match=r"'\.\./x' is not valid"):
            call()
    assert not path.exists()  # refused before the file was opened
    with pytest.raises(TypeError, match="State"):
        store.save("not a state")  # pyright: ignore[reportArgumentType]
    assert list(path.parent.iterdir()) == []


def test_a_damaged_entry_names_the_state_and_index(store: SQLiteStore, path: Path) -> None:
    damaged = State(id="damaged", messages=[Message.user("a"), Message.user("b")])
    damaged.add_message(Message.user("c"))
    healthy = State(id="healthy", messages=[Message.user("fine")])
    store.save(damaged)
    store.save(healthy)
    write_sql(path, "UPDATE entries SET data = ? WHERE state_id = 'damaged' AND seq = 1", b"{bad")
    with pytest.raises(StoreDamagedError, match=r"'damaged' is damaged: history entry 1 fails"):
        store.load("damaged")
    reseal_sql(path, "damaged")
    with pytest.raises(StoreDamagedError, match=r"'damaged' is damaged: history entry 1 cannot"):
        store.load("damaged")
    assert_same(store.load("healthy"), healthy)
    assert {info.id for info in store.list()} == {"damaged", "healthy"}
    store.delete("damaged")  # the way out the message gives
    assert [info.id for info in store.list()] == ["healthy"]


def test_an_entry_out_of_place_or_missing_is_reported(store: SQLiteStore, path: Path) -> None:
    state = State(id="gappy", messages=[Message.user("a")])
    state.add_message(Message.user("b"))
    state.add_message(Message.user("c"))
    store.save(state)
    write_sql(path, "DELETE FROM entries WHERE state_id = 'gappy' AND seq = 2")
    with pytest.raises(StoreDamagedError, match="entry 2 is missing"):
        store.load("gappy")
    write_sql(path, "UPDATE states SET entries = 2 WHERE id = 'gappy'")
    with pytest.raises(StoreDamagedError, match="entry 1 does not match the digest its info"):
        store.load("gappy")
    write_sql(path, "DELETE FROM entries WHERE state_id = 'gappy' AND seq = 0")
    write_sql(path, "UPDATE states SET entries = 1 WHERE id = 'gappy'")
    with pytest.raises(StoreDamagedError, match="entry 0 fails its integrity check"):
        store.load("gappy")
    reseal_sql(path, "gappy")
    with pytest.raises(StoreDamagedError, match="history entry 0 says it is entry 1"):
        store.load("gappy")


@pytest.mark.parametrize(("found", "hint"), [(0, "older"), (SQLITE_FORMAT + 1, "newer")])
def test_another_format_version_is_refused_naming_both(path: Path, found: int, hint: str) -> None:
    state = State(messages=[Message.user("kept")])
    with SQLiteStore(path) as store:
        store.save(state)
        write_sql(path, "UPDATE meta SET value = ? WHERE key = 'format_version'", found)
        with pytest.raises(ValueError, match=rf"version {found}.*version {SQLITE_FORMAT}"):
            store.load(state.id)  # an open store checks on each load
        more = State(id=state.id, history=state.history)
        more.add_message(Message.user("more"))
        with pytest.raises(ValueError, match=rf"version {found}.*version {SQLITE_FORMAT}"):
            store.save(more)  # and on each save, though it saved this State before
    message = rf"format version {found}, but this orchestrator reads version {SQLITE_FORMAT}"
    with SQLiteStore(path) as store, pytest.raises(ValueError, match=message) as error:
        store.list()
    assert hint in str(error.value)
    assert str(path) in str(error.value)
    write_sql(path, "UPDATE meta SET value = ? WHERE key = 'format_version'", SQLITE_FORMAT)
    with SQLiteStore(path) as store:
        assert_same(store.load(state.id), state)  # the refusals damaged nothing


def test_a_file_that_is_not_a_database_is_refused(path: Path) -> None:
    path.write_bytes(b"this is not an SQLite file, it is just some text" * 100)
    with (
        SQLiteStore(path) as store,
        pytest.raises(StoreDamagedError, match=r"is damaged \(file is not a database\)") as caught,
    ):
        store.list()
    assert isinstance(caught.value.__cause__, sqlite3.DatabaseError)
    assert "give the path of a store file" in str(caught.value)
    assert path.read_bytes().startswith(b"this is not")


def test_a_database_of_something_else_is_left_alone(path: Path) -> None:
    write_sql(path, "CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    with SQLiteStore(path) as store, pytest.raises(ValueError, match=r"something else.*invoices"):
        store.save(State())
    db = sqlite3.connect(path)
    tables = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    db.close()
    assert tables == [("invoices",)]


def test_a_folder_is_refused_when_the_store_is_made(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is a folder: give a file in it") as refused:
        SQLiteStore(tmp_path)
    assert repr(str(tmp_path / "runs.db")) in str(refused.value)
    assert f"FileStore({str(tmp_path)!r})" in str(refused.value)
    assert list(tmp_path.iterdir()) == []


def test_the_file_is_private_and_a_closed_store_says_so(path: Path) -> None:
    store = SQLiteStore(path)
    assert repr(store) == f"SQLiteStore({str(path)!r})"
    store.save(State())
    assert path.stat().st_mode & 0o777 == 0o600
    store.close()
    store.close()
    with pytest.raises(ValueError, match="is closed"):
        store.list()


# Crash recovery -------------------------------------------------------------------------------

CRASH_IN_TOOL = """
    import os, sys
    from orchestrator import Agent, Message, State, tool
    from orchestrator.testing import FakeModel, tool_call
    from stores._sqlite import SQLiteStore

    @tool
    def deploy(target: str) -> str:
        \"\"\"Deploy somewhere.\"\"\"
        os._exit(1)

    store = SQLiteStore(sys.argv[1])
    state = State(id="crashed", messages=[Message.user("Deploy it")])
    model = FakeModel([tool_call("deploy", target="prod")])
    Agent(model, tools=[deploy], store=store).run(state)
"""

CRASH_IN_MODEL = """
    import os, sys
    from orchestrator import Agent, Message, State, tool
    from orchestrator.testing import FakeModel, tool_call
    from stores._sqlite import SQLiteStore

    @tool
    def add(a: int, b: int) -> int:
        \"\"\"Add two numbers.\"\"\"
        return a + b

    store = SQLiteStore(sys.argv[1])
    state = State(id="crashed", messages=[Message.user("Add 1 and 2")])

    def crash(request):
        if sys.argv[2] == "saved":
            store.save(state)  # as a checkpoint taken while the model is waited on would
        os._exit(1)

    model = FakeModel([tool_call("add", a=1, b=2), crash])
    Agent(model, tools=[add], store=store).run(state)
"""


def test_a_crash_inside_a_tool_gives_the_call_an_unknown_result(tmp_path: Path, path: Path) -> None:
    done = run_script(tmp_path, "crash_in_tool", CRASH_IN_TOOL, str(path))
    assert done.returncode == 1, done.stderr
    with SQLiteStore(path) as store:
        stored = store.list()[0].entries
        state = store.load("crashed")
        result = state.history[-1]
        assert isinstance(result, ToolResultEntry)
        assert result.outcome == "unknown"
        assert result.call.name == "deploy"
        assert "may or may not have run" in result.content.text
        assert state.pending_calls == ()
        assert len(state.history) == stored + 1
        assert store.list()[0].entries == stored  # loading wrote nothing ...
        run_agent(store, state, ["I could not tell whether it deployed."])
        again = store.load("crashed")  # ... the next save wrote the recovery with the rest
    assert_same(again, state)
    assert again.answer == "I could not tell whether it deployed."
    assert [e.outcome for e in results(again)] == ["unknown"]


@pytest.mark.parametrize("when", ["saved", "unsaved"])
def test_a_crash_inside_the_model_call_takes_the_request_back(
    tmp_path: Path, path: Path, when: str
) -> None:
    done = run_script(tmp_path, "crash_in_model", CRASH_IN_MODEL, str(path), when)
    assert done.returncode == 1, done.stderr
    with SQLiteStore(path) as store:
        state = store.load("crashed")
        assert state.turn == 1  # the first reply counts; the cut-off request does not
        assert state.pending_calls == ()
        last = state.history[-1]
        # The Agent saves the request before waiting on the model (and the "saved" variant
        # saves once more inside the call): either way the request is taken back.
        assert isinstance(last, ErrorEntry)
        assert "taken back" in last.content
        assert state.messages[-1].tool_results[0].text == "3"
        run_agent(store, state, ["1 + 2 = 3"])
        again = store.load("crashed")
    assert_same(again, state)
    assert again.answer == "1 + 2 = 3"
    assert again.turn == 2


# Threads, processes, concurrent runs ----------------------------------------------------------


def test_many_threads_save_through_one_store(store: SQLiteStore) -> None:
    states = [State(id=f"thread-{i}", messages=[Message.user(str(i))]) for i in range(8)]
    shared = State(id="shared", messages=[Message.user("shared")])
    barrier = threading.Barrier(len(states) + 2)
    errors: list[BaseException] = []

    def own(state: State) -> None:
        try:
            barrier.wait()
            for turn in range(40):
                state.add_message(Message.user(f"turn {turn}"))
                store.save(state)
                store.list(limit=2)
        except BaseException as error:  # pragma: no cover - shown by the assert below
            errors.append(error)

    def saver() -> None:  # saves a State another thread records into
        try:
            barrier.wait()
            for _ in range(80):
                store.save(shared)
        except BaseException as error:  # pragma: no cover
            errors.append(error)

    threads = [threading.Thread(target=own, args=(state,)) for state in states]
    threads += [threading.Thread(target=saver)]
    for thread in threads:
        thread.start()
    barrier.wait()
    for turn in range(80):
        shared.add_message(Message.user(f"shared {turn}"))
    for thread in threads:
        thread.join()
    assert errors == []
    store.save(shared)
    for state in [*states, shared]:
        assert_same(store.load(state.id), state)
    assert len(store.list()) == 9


APPENDER = """
    import sys, time
    from pathlib import Path
    from orchestrator import Agent, Message, State, tool
    from orchestrator.testing import FakeModel, tool_call
    from stores._sqlite import SQLiteStore

    path, name, turns, ready, go = sys.argv[1:]

    @tool
    def step(i: int) -> int:
        \"\"\"One step.\"\"\"
        return i

    Path(ready).touch()
    while not Path(go).exists():
        time.sleep(0.001)
    with SQLiteStore(path) as store:  # both open the new file at the same time
        calls = [tool_call("step", i=i) for i in range(int(turns))]
        model = FakeModel([calls[i : i + 4] for i in range(0, len(calls), 4)] + ["done"])
        Agent(model, tools=[step], store=store).run(State(id=name, messages=[Message.user(name)]))
"""


def test_two_processes_append_to_one_file_at_the_same_time(tmp_path: Path, path: Path) -> None:
    script = tmp_path / "appender.py"
    script.write_text(textwrap.dedent(APPENDER), encoding="utf-8")
    go = tmp_path / "go"
    turns = 160  # 40 turns of 4 calls: 200 saves by each process
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                str(script),
                str(path),
                name,
                str(turns),
                str(tmp_path / name),
                str(go),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("first", "second")
    ]
    while not all((tmp_path / name).exists() for name in ("first", "second")):
        assert all(process.poll() is None for process in processes)
    go.touch()
    outputs = [process.communicate(timeout=90) for process in processes]
    for process, (_, stderr) in zip(processes, outputs, strict=True):
        assert "locked" not in stderr
        assert process.returncode == 0, stderr
    with SQLiteStore(path) as store:
        for name in ("first", "second"):
            state = store.load(name)
            texts = sorted(int(e.content.text) for e in results(state))
            assert texts == list(range(turns))  # the calls of a turn finish in any order
            assert state.answer == "done"
            assert [e.seq for e in state.history] == list(range(len(state.history)))
        assert {info.id for info in store.list()} == {"first", "second"}


@pytest.mark.anyio
async def test_fifty_concurrent_runs_share_one_store(path: Path) -> None:
    with SQLiteStore(path) as store:
        states = [State(messages=[Message.user(f"run {i}")]) for i in range(50)]

        async def run(i: int) -> None:
            model = FakeModel([tool_call("add", a=i, b=1), f"answer {i + 1}"])
            await Agent(model, tools=[add], store=store).arun(states[i])

        async with anyio.create_task_group() as group:
            for i in range(50):
                group.start_soon(run, i)
        infos = await store.alist()
        assert len(infos) == 50
        for i, state in enumerate(states):
            loaded = await store.aload(state.id)
            assert_same(loaded, state)
            assert loaded.answer == f"answer {i + 1}"
        await store.adelete(states[0].id)
        assert len(await store.alist(limit=100)) == 49


@pytest.mark.anyio
async def test_async_twins_recover_and_save_like_the_sync_methods(path: Path) -> None:
    async with SQLiteStore(path) as store:
        state = State(messages=[Message.user("go")])
        begin_think(state, model="m")
        await store.asave(state)
        loaded = await store.aload(state.id)
        assert isinstance(loaded.history[-1], ErrorEntry)
        assert [info.entries for info in await store.alist()] == [len(state.history)]
        await store.asave(loaded)
        assert (await store.aload(state.id)).history == loaded.history
        assert not isinstance(loaded.history[-2], ModelReplyEntry)
    with pytest.raises(ValueError, match="is closed"):
        await store.alist()


def test_list_info_is_a_state_info(store: SQLiteStore) -> None:
    store.save(State(messages=[Message.user("x")]))
    (info,) = store.list()
    assert isinstance(info, StateInfo)


# Damage: the library's error, naming the store and the State ----------------------------------


def test_a_truncated_file_is_a_damaged_store_naming_the_state(path: Path) -> None:
    with SQLiteStore(path) as store:
        for i in range(40):
            store.save(State(id=f"s{i}", messages=[Message.user(f"task {i} " + "x" * 200)]))
    data = path.read_bytes()
    path.write_bytes(data[:-3000])
    with SQLiteStore(path) as store:
        failures: list[StoreDamagedError] = []
        for i in range(40):  # the pages cut off hold some of them
            try:
                store.load(f"s{i}")
            except StoreDamagedError as error:
                failures.append(error)
        assert failures
        assert all(f"SQLite store {str(path)!r} is damaged" in str(e) for e in failures)
        first = failures[0]
        assert "while reading or writing State 's" in str(first)
        assert "backup" in str(first)
        assert isinstance(first.__cause__, sqlite3.DatabaseError)


def test_a_failing_database_is_a_store_error_with_the_cause(path: Path) -> None:
    with SQLiteStore(path) as store:
        store.save(State(id="kept"))
    Path(f"{path}-wal").mkdir()  # SQLite cannot open its write-ahead log
    with SQLiteStore(path) as store, pytest.raises(StoreError) as caught:
        store.save(State(id="new", messages=[Message.user("a")]))
    assert not isinstance(caught.value, StoreDamagedError)
    assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
    message = str(caught.value)
    assert f"SQLite store {str(path)!r} failed while reading or writing State 'new'" in message
    assert "unable to open database file" in message


@pytest.mark.parametrize(
    ("column", "value", "problem"),
    [
        ("updated_at", "yesterday", "updated_at holds str 'yesterday', not int"),
        ("usage", "{not json", "usage holds JSON that does not read: Invalid JSON"),
        ("stopped", '{"kind": "nope"}', "stopped holds JSON that does not read"),
        ("turn", "three", "turn holds str 'three', not int"),
    ],
)
def test_a_damaged_states_row_is_listed_with_its_damage(
    store: SQLiteStore, path: Path, column: str, value: object, problem: str
) -> None:
    hurt = State(id="hurt", messages=[Message.user("a")])
    fine = [State(id=f"fine{i}", messages=[Message.user(f"b{i}")]) for i in range(2)]
    for state in (hurt, *fine):
        store.save(state)
    write_sql(path, f"UPDATE states SET {column} = ? WHERE id = 'hurt'", value)
    for reader in (store, SQLiteStore(path)):
        infos = {info.id: info for info in reader.list()}
        assert set(infos) == {"hurt", "fine0", "fine1"}
        assert [infos[f"fine{i}"].title for i in range(2)] == ["b0", "b1"]
        damage = infos["hurt"].damage or ""
        assert f"State 'hurt' is damaged: its states row is damaged ({problem}" in damage
        # Its history is whole: it loads, and its next save writes the row anew.
        loaded = reader.load("hurt")
        assert loaded.snapshot() == hurt.snapshot()
        assert reader.load("fine0").snapshot() == fine[0].snapshot()
    loaded.add_message(Message.user("again"))
    store.save(loaded)
    assert {info.id: info.damage for info in store.list()}["hurt"] is None
