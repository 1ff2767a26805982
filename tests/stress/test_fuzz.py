"""Fuzz: damaged store files and rows give a clear error or the same State, never another one.

A lead with subagents, async and sync tools and usage is saved once per backend (`FileStore`,
`SQLiteStore`); each example copies that store and damages it: bytes flipped or replaced, a
number in a stored value changed (``100`` -> ``900``), lines or rows deleted, duplicated or
swapped, an entry replaced by a well-formed entry of another kind with the same seq (taken
verbatim from another State, or rewritten), files truncated. Then every State is loaded and
the States are listed, and:

- `load` returns a State identical to the original (the same encoded history, the same
  snapshot) or raises `orchestrator.StoreDamagedError`: never another exception, never a
  different State;
- damage confined to one State (its files, its rows) leaves every other State loading as
  before, and `list()` does not raise: it returns the others as they were;
- damage to the SQLite file itself (its pages) may make `list()` raise, but only
  `StoreDamagedError`;
- `list()` shows the damaged State as it was saved, with its `damage`, or not at all (its
  info deleted): never an edited title, usage or count.

The links beside the histories are fuzzed too, on a copy of the store where the lead was cut
off while its first subagents ran (so loading it recovers the call and keeps the children the
links name): a link pointed at a State that is not the call's child, moved to another cut-off
call, or a child's listed usage changed. The lead then loads exactly as from the untouched
copy, or raises `StoreDamagedError` naming the State the link points at; the other States load
as they were.

Examples are derandomized, so every run tries the same corruptions; hypothesis prints the one
that failed, and the note says which bytes it changed.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from orchestrator import (
    HistoryEntry,
    Message,
    ModelReplyEntry,
    State,
    StateInfo,
    StateSnapshot,
    StoreDamagedError,
    ToolResultEntry,
)
from stores import FileStore, SQLiteStore, encode_entry
from tests.stress.chaos_worker import LEAD, build_agents

DB = "runs.db"
BACKENDS = ("file", "sqlite")

# -- the saved States ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Original:
    """A State as it was saved: its encoded history, its snapshot and its listed info."""

    lines: tuple[bytes, ...]
    snapshot: StateSnapshot
    info: StateInfo
    history: tuple[HistoryEntry, ...] = ()  # kept where a load adds entries (a recovery)


class Saved:
    """A store folder holding a lead and its children, and how each State was saved.

    Not a dataclass: hypothesis prints a failing example's arguments, and would print every
    field of one.
    """

    def __init__(self, folder: Path, ids: tuple[str, ...], originals: dict[str, Original]):
        self.folder = folder
        self.ids = ids  # the lead, then its children in the order the lead asked for them
        self.originals = originals

    def __repr__(self) -> str:
        return f"Saved({str(self.folder)!r}, {len(self.ids)} States)"


def open_store(backend: str, folder: Path) -> Any:
    return FileStore(folder) if backend == "file" else SQLiteStore(folder / DB)


def close(store: Any) -> None:
    if isinstance(store, SQLiteStore):
        store.close()


def encoded(state: State) -> tuple[bytes, ...]:
    return tuple(encode_entry(entry) for entry in state.history)


def tree_order(lead: State) -> tuple[str, ...]:
    """The lead's id, then its children's in request order (the same in every session)."""
    results = {e.call.id: e for e in lead.history if isinstance(e, ToolResultEntry)}
    ids = [lead.id]
    for message in lead.messages:
        for call in message.tool_calls:
            ids += results[call.id].child_ids
    return tuple(ids)


def save_states(backend: str, folder: Path) -> Saved:
    """Run the lead once (two fan-out rounds: 9 States) into a new store, and read it back."""
    folder.mkdir()
    store = open_store(backend, folder)
    try:
        build_agents(store).lead.run(State(id=LEAD, messages=[Message.user("Investigate.")]))
    finally:
        close(store)
    store = open_store(backend, folder)
    try:
        lead = store.load(LEAD)
        infos = {info.id: info for info in store.list()}
        ids = tree_order(lead)
        assert sorted(ids) == sorted(infos)
        originals: dict[str, Original] = {}
        for state_id in ids:
            state = store.load(state_id)
            assert state.pending_calls == ()
            originals[state_id] = Original(encoded(state), state.snapshot(), infos[state_id])
    finally:
        close(store)
    return Saved(folder, ids, originals)


def save_cut_off(backend: str, whole: Saved, folder: Path) -> Saved:
    """The States of `whole` in a new store, the lead cut off while its first subagents ran.

    The lead's history ends with the first reply whose calls started children; loading it
    closes those calls and keeps the children its links name (the children of its later calls
    are linked to calls it no longer has, so they stay out).
    """
    folder.mkdir()
    store = open_store(backend, whole.folder)
    try:
        states = {state_id: store.load(state_id) for state_id in whole.ids}
    finally:
        close(store)
    lead = states[LEAD]
    results = {e.call.id: e for e in lead.history if isinstance(e, ToolResultEntry)}
    end = next(
        i
        for i, entry in enumerate(lead.history)
        if isinstance(entry, ModelReplyEntry)
        and any(results[call.id].child_ids for call in entry.content.message.tool_calls)
    )
    store = open_store(backend, folder)
    try:
        store.save(State(id=LEAD, history=lead.history[: end + 1]))
        for state_id in whole.ids[1:]:
            store.save(states[state_id])
    finally:
        close(store)
    store = open_store(backend, folder)
    try:
        infos = {info.id: info for info in store.list()}
        originals: dict[str, Original] = {}
        for state_id in whole.ids:
            state = store.load(state_id)
            original = Original(encoded(state), state.snapshot(), infos[state_id], state.history)
            originals[state_id] = original
        assert any(e.child_ids for e in store.load(LEAD).history if isinstance(e, ToolResultEntry))
    finally:
        close(store)
    return Saved(folder, whole.ids, originals)


@pytest.fixture(scope="module")
def saved() -> Iterator[dict[str, Saved]]:
    with tempfile.TemporaryDirectory() as root:
        stores = {
            backend: save_states(backend, Path(root) / backend) for backend in ("file", "sqlite")
        }
        for backend in ("file", "sqlite"):
            cut = save_cut_off(backend, stores[backend], Path(root) / f"{backend}-cut-off")
            stores[f"{backend}-cut-off"] = cut
        yield stores


# -- corruptions --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Corruption:
    """One damage: `kind` done to `part` of the State `target` (an index into the tree order).

    `picks` are the random numbers it uses (offsets, line numbers, byte values), each taken
    modulo what it picks from, so the same corruption hits the same place in every session.
    """

    part: str  # "log", "info" (FileStore); "entries", "states", "db" (SQLite)
    kind: str
    target: int
    picks: tuple[int, ...]

    @property
    def confined(self) -> bool:
        """Whether only the target State's own data is damaged (not the SQLite file's pages)."""
        return self.part != "db"


FILE_KINDS = {
    "log": (
        "flip",
        "set-bytes",
        "number",
        "delete-line",
        "duplicate-line",
        "swap-lines",
        "foreign-line",
        "forged-line",
        "truncate",
        "delete",
    ),
    "info": ("flip", "set-bytes", "number", "truncate", "delete"),
}
LINE_KINDS = ("delete-line", "duplicate-line", "swap-lines", "foreign-line", "forged-line")
SQLITE_KINDS = {
    "entries": (
        "flip",
        "number",
        "delete-row",
        "duplicate-row",
        "overwrite-row",
        "swap-rows",
        "foreign-row",
        "forged-row",
    ),
    "states": ("number", "garbage", "delete-row"),
    "db": ("flip", "set-bytes", "truncate"),
}


@st.composite
def corruptions(draw: st.DrawFn, kinds: dict[str, tuple[str, ...]]) -> Corruption:
    part, kind = draw(st.sampled_from([(part, kind) for part in kinds for kind in kinds[part]]))
    target = draw(st.integers(0, 8))
    picks = draw(st.lists(st.integers(0, 2**32 - 1), min_size=6, max_size=6))
    return Corruption(part, kind, target, tuple(picks))


class Picker:
    """Hands out a corruption's random numbers, each reduced to the range asked for."""

    def __init__(self, picks: tuple[int, ...]) -> None:
        self._rng = random.Random(picks[-1])
        self._picks = list(picks[:-1])

    def below(self, bound: int) -> int:
        value = self._picks.pop(0) if self._picks else self._rng.getrandbits(32)
        return value % bound

    def other_than(self, bound: int, not_this: int) -> int:
        assert bound > 1
        return (not_this + 1 + self.below(bound - 1)) % bound


def _entry_dict(value: Any) -> dict[str, Any] | None:
    """The JSON object of an entry (one holding "kind" and "seq"), wherever it is nested."""
    if isinstance(value, dict):
        found: dict[str, Any] = value  # pyright: ignore[reportUnknownVariableType]
        if "kind" in found and "seq" in found:
            return found
        for item in found.values():
            inner = _entry_dict(item)
            if inner is not None:
                return inner
    return None


def kind_of(line: bytes) -> str:
    entry = _entry_dict(json.loads(line))
    assert entry is not None
    return str(entry["kind"])


def forge(line: bytes, seq: int) -> bytes:
    """`line` rewritten to say it is entry `seq` (any integrity check it carries is stale)."""
    whole = json.loads(line)
    entry = _entry_dict(whole)
    assert entry is not None
    entry["seq"] = seq
    return json.dumps(whole, ensure_ascii=False, separators=(",", ":")).encode()


def flip(data: bytes, pick: Picker, *, xor: bool) -> tuple[bytes, str]:
    changed = bytearray(data)
    done: list[str] = []
    for _ in range(1 + pick.below(3)):
        offset = pick.below(len(changed))
        old = changed[offset]
        changed[offset] = old ^ (1 + pick.below(255)) if xor else pick.other_than(256, old)
        done.append(f"byte {offset}: {old:#04x} -> {changed[offset]:#04x}")
    return bytes(changed), ", ".join(done)


def change_number(data: bytes, pick: Picker) -> tuple[bytes, str]:
    numbers = list(re.finditer(rb"\d+", data))
    if not numbers:
        return flip(data, pick, xor=True)
    found = numbers[pick.below(len(numbers))]
    old = found.group()
    new = old
    while new == old:
        new = bytes(ord("0") + pick.below(10) for _ in old)
    start, end = found.span()
    return data[:start] + new + data[end:], f"number at {start}: {old!r} -> {new!r}"


def truncate(data: bytes, pick: Picker, *, keep: int = 0) -> tuple[bytes, str]:
    size = keep + pick.below(len(data) - keep)
    return data[:size], f"truncated from {len(data)} to {size} bytes"


def damage_bytes(data: bytes, kind: str, pick: Picker) -> tuple[bytes, str]:
    if kind == "flip":
        return flip(data, pick, xor=True)
    if kind == "set-bytes":
        return flip(data, pick, xor=False)
    if kind == "number":
        return change_number(data, pick)
    assert kind == "truncate", kind
    return truncate(data, pick)


# -- FileStore ---------------------------------------------------------------------------------


def damage_file_store(folder: Path, saved: Saved, corruption: Corruption) -> str:
    pick = Picker(corruption.picks)
    target = saved.ids[corruption.target % len(saved.ids)]
    path = folder / target / ("log.jsonl" if corruption.part == "log" else "info.json")
    data = path.read_bytes()
    kind = corruption.kind
    if kind == "delete":
        path.unlink()
        return f"{path.name} of {target} deleted"
    if kind not in LINE_KINDS:
        changed, what = damage_bytes(data, kind, pick)
    else:
        lines = data.split(b"\n")[:-1]
        index = pick.below(len(lines))
        if kind == "delete-line":
            what = f"line {index} deleted"
            del lines[index]
        elif kind == "duplicate-line":
            what = f"line {index} duplicated"
            lines.insert(index, lines[index])
        elif kind == "swap-lines":
            other = pick.other_than(len(lines), index)
            what = f"lines {index} and {other} swapped"
            lines[index], lines[other] = lines[other], lines[index]
        else:
            lines[index], what = replacement(folder, saved, target, lines, index, kind, pick)
        changed = b"".join(line + b"\n" for line in lines)
    path.write_bytes(changed)
    return f"{corruption.part} of {target}: {what}"


def replacement(
    folder: Path, saved: Saved, target: str, lines: list[bytes], index: int, kind: str, pick: Picker
) -> tuple[bytes, str]:
    """A well-formed entry of another kind to put at `index` of the target's log."""
    own = kind_of(lines[index])
    if kind == "forged-line":
        others = [i for i, line in enumerate(lines) if kind_of(line) != own]
        source = others[pick.below(len(others))]
        return forge(lines[source], index), f"line {index} ({own}) forged from line {source}"
    for state_id in saved.ids[1:] + saved.ids[:1]:
        theirs = (folder / state_id / "log.jsonl").read_bytes().split(b"\n")[:-1]
        if state_id != target and index < len(theirs) and kind_of(theirs[index]) != own:
            return theirs[index], f"line {index} ({own}) taken from {state_id}"
    return forge(lines[index - 1], index), f"line {index} ({own}) forged from the line before"


# -- SQLite ------------------------------------------------------------------------------------


def damage_sqlite(folder: Path, saved: Saved, corruption: Corruption) -> str:
    pick = Picker(corruption.picks)
    target = saved.ids[corruption.target % len(saved.ids)]
    path = folder / DB
    if corruption.part == "db":
        data = path.read_bytes()
        if corruption.kind == "truncate":
            # SQLite reads a file of 0 or 1 byte as an empty database (2 bytes or more are
            # "not a database"), which a store takes for a new one: so 2 bytes stay.
            changed, what = truncate(data, pick, keep=2)
        else:
            changed, what = damage_bytes(data, corruption.kind, pick)
        path.write_bytes(changed)
        return f"the SQLite file: {what}"
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        damage = damage_entries if corruption.part == "entries" else damage_state_row
        what = damage(connection, saved, target, corruption.kind, pick)
    finally:
        connection.close()
    return f"{corruption.part} of {target}: {what}"


def _columns(connection: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in connection.execute(f"PRAGMA table_info({table})")]


def damage_entries(
    connection: sqlite3.Connection, saved: Saved, target: str, kind: str, pick: Picker
) -> str:
    # Every column but the State's id and seq (and the row's position in the feed) is the
    # entry's payload (data, and any check).
    payload = [
        c for c in _columns(connection, "entries") if c not in ("state_id", "seq", "position")
    ]
    listed = ", ".join(payload)
    rows = connection.execute(
        f"SELECT seq, {listed} FROM entries WHERE state_id = ? ORDER BY seq", (target,)
    ).fetchall()
    index = pick.below(len(rows))
    seq = rows[index][0]

    def put(at: int, values: tuple[Any, ...]) -> None:
        sets = ", ".join(f"{column} = ?" for column in payload)
        connection.execute(
            f"UPDATE entries SET {sets} WHERE state_id = ? AND seq = ?", (*values, target, at)
        )

    data = bytes(rows[index][1 + payload.index("data")])
    if kind in ("flip", "number"):
        changed, what = flip(data, pick, xor=True) if kind == "flip" else change_number(data, pick)
        values = list(rows[index][1:])
        values[payload.index("data")] = changed
        put(seq, tuple(values))
        return f"row {seq}: {what}"
    if kind == "delete-row":
        connection.execute("DELETE FROM entries WHERE state_id = ? AND seq = ?", (target, seq))
        return f"row {seq} deleted"
    if kind == "duplicate-row":
        marks = ", ".join("?" * (2 + len(payload)))
        connection.execute(
            f"INSERT INTO entries (state_id, seq, {listed}) VALUES ({marks})",
            (target, len(rows), *rows[index][1:]),
        )
        return f"row {seq} copied to a new row {len(rows)}"
    other = pick.other_than(len(rows), index)
    if kind == "overwrite-row":
        put(rows[other][0], tuple(rows[index][1:]))
        return f"row {seq} copied over row {rows[other][0]}"
    if kind == "swap-rows":
        put(seq, tuple(rows[other][1:]))
        put(rows[other][0], tuple(rows[index][1:]))
        return f"rows {seq} and {rows[other][0]} swapped"
    own = kind_of(data)
    if kind == "foreign-row":
        for state_id in saved.ids[1:] + saved.ids[:1]:
            theirs = connection.execute(
                f"SELECT data, {listed} FROM entries WHERE state_id = ? AND seq = ?",
                (state_id, seq),
            ).fetchone()
            if state_id != target and theirs is not None and kind_of(bytes(theirs[0])) != own:
                put(seq, tuple(theirs[1:]))
                return f"row {seq} ({own}) taken from {state_id}"
    assert kind in ("forged-row", "foreign-row"), kind
    sources = [row for row in rows if kind_of(bytes(row[1 + payload.index("data")])) != own]
    source = sources[pick.below(len(sources))]
    values = list(source[1:])
    values[payload.index("data")] = forge(bytes(values[payload.index("data")]), seq)
    put(seq, tuple(values))
    return f"row {seq} ({own}) forged from row {source[0]}"


def damage_state_row(
    connection: sqlite3.Connection, saved: Saved, target: str, kind: str, pick: Picker
) -> str:
    if kind == "delete-row":
        connection.execute("DELETE FROM states WHERE id = ?", (target,))
        return "its states row deleted"
    columns = [c for c in _columns(connection, "states") if c != "id"]
    column = columns[pick.below(len(columns))]
    (old,) = connection.execute(f"SELECT {column} FROM states WHERE id = ?", (target,)).fetchone()
    new: Any
    if kind == "garbage":
        new = "{not json" if old is None or isinstance(old, str) else -1 - pick.below(1000)
    elif isinstance(old, int):
        new = old + 1 + pick.below(1000)
    elif isinstance(old, str) and re.search(r"\d", old):
        new = change_number(old.encode(), pick)[0].decode()
    else:
        new = 7 if old is None else f"{old}x"
    connection.execute(f"UPDATE states SET {column} = ? WHERE id = ?", (new, target))
    return f"states.{column}: {old!r} -> {new!r}"


# -- links -------------------------------------------------------------------------------------

LINK_KINDS = {"links": ("relink", "move-call", "usage")}


def adopted_children(saved: Saved) -> dict[str, str]:
    """By child id, the cut-off call of the lead that started each child recovery keeps."""
    return {
        child_id: entry.call.id
        for entry in saved.originals[LEAD].history
        if isinstance(entry, ToolResultEntry) and entry.outcome == "unknown"
        for child_id in entry.child_ids
    }


def damage_links(backend: str, folder: Path, saved: Saved, corruption: Corruption) -> str:
    """Point a link of the lead at another State, move it to another call, or change a usage."""
    pick = Picker(corruption.picks)
    kept = adopted_children(saved)  # the children recovery keeps, and their calls
    cut = sorted(set(kept.values()))
    kind = corruption.kind
    connection = None if backend == "file" else sqlite3.connect(folder / DB, isolation_level=None)
    try:
        if kind == "usage":
            child = sorted(kept)[pick.below(len(kept))]
            tokens = 1 + pick.below(10**6)
            usage = {"input_tokens": tokens, "requests": 1 + pick.below(9)}
            if connection is None:
                path = folder / child / "info.json"
                info = json.loads(path.read_bytes())
                info["usage"] = usage
                path.write_text(json.dumps(info))
            else:
                connection.execute(
                    "UPDATE states SET usage = ? WHERE id = ?", (json.dumps(usage), child)
                )
            return f"the listed usage of {child}: {usage}"
        if kind == "relink":  # a State no cut-off call started, linked to one of them
            strangers = [state_id for state_id in saved.ids[1:] if state_id not in kept]
            child = strangers[pick.below(len(strangers))]
            call = cut[pick.below(len(cut))]
        else:  # "move-call": a kept child's link moved to another cut-off call
            child = sorted(kept)[pick.below(len(kept))]
            others = [c for c in cut if c != kept[child]]
            call = others[pick.below(len(others))]
        if connection is None:
            path = folder / LEAD / "children.jsonl"
            lines = path.read_bytes().splitlines()
            lines = [line for line in lines if json.loads(line)["id"] != child]
            lines.insert(
                pick.below(len(lines) + 1), json.dumps({"id": child, "call": call}).encode()
            )
            path.write_bytes(b"".join(line + b"\n" for line in lines))
        else:
            connection.execute(
                "UPDATE states SET parent_id = ?, parent_call_id = ? WHERE id = ?",
                (LEAD, call, child),
            )
        return f"{kind}: {child} linked to the lead's call {call}"
    finally:
        if connection is not None:
            connection.close()


def check_links(backend: str, saved: Saved, corruption: Corruption) -> None:
    """A damaged link: the lead loads as it did, or is refused naming the linked State."""
    with tempfile.TemporaryDirectory() as root:
        folder = Path(root) / "store"
        shutil.copytree(saved.folder, folder)
        what = damage_links(backend, folder, saved, corruption)
        note(what)
        store = open_store(backend, folder)
        try:
            for state_id in saved.ids:
                original = saved.originals[state_id]
                loaded = load_or_damaged(store, state_id)
                if isinstance(loaded, ValueError):
                    assert isinstance(loaded, StoreDamagedError), f"{what}: {loaded}"
                    assert state_id == LEAD, f"{what}: loading {state_id} failed: {loaded}"
                    linked = what.split(": ", 1)[1].split(" ", 1)[0]
                    assert f"State {linked!r}" in str(loaded), f"{what}: {loaded}"
                    event(f"links {corruption.kind}: refused")
                    continue
                # Recovery stamps the entries it adds with the time of the load: compared
                # without times (entries compare without `at`).
                assert loaded.history == original.history, f"{what}: {state_id} differs"
                assert loaded.usage == original.snapshot.usage, f"{what}: {state_id} usage"
                if state_id == LEAD:
                    event(f"links {corruption.kind}: the same")
        finally:
            close(store)


# -- the check ---------------------------------------------------------------------------------


def load_or_damaged(store: Any, state_id: str) -> State | ValueError:
    """The loaded State, or the clear error loading it raised (others propagate).

    Clear: a `StoreDamagedError`, or the `ValueError` of a newer format version (a digit of the
    stored version changed upward reads exactly as a file a newer orchestrator wrote).
    """
    try:
        return store.load(state_id)
    except StoreDamagedError as error:
        return error
    except ValueError as error:
        if "written by a newer orchestrator" not in str(error):
            raise
        return error


def check(backend: str, saved: Saved, corruption: Corruption) -> None:
    damage: Callable[[Path, Saved, Corruption], str] = (
        damage_file_store if backend == "file" else damage_sqlite
    )
    with tempfile.TemporaryDirectory() as root:
        folder = Path(root) / "store"
        shutil.copytree(saved.folder, folder)
        what = damage(folder, saved, corruption)
        note(what)
        target = saved.ids[corruption.target % len(saved.ids)]
        store = open_store(backend, folder)
        refused = 0
        try:
            for state_id in saved.ids:
                original = saved.originals[state_id]
                loaded = load_or_damaged(store, state_id)
                if isinstance(loaded, ValueError):
                    refused += 1
                    if corruption.confined:
                        assert state_id == target, f"{what}: loading {state_id} failed: {loaded}"
                        assert target in str(loaded), f"the error does not name {target}: {loaded}"
                    continue
                assert encoded(loaded) == original.lines, f"{what}: {state_id} loads differently"
                assert loaded.snapshot() == original.snapshot, f"{what}: {state_id} differs"
            # What came of it, shown by ``pytest --hypothesis-show-statistics``.
            event(f"{corruption.part} {corruption.kind}: {'refused' if refused else 'the same'}")
            try:
                infos = store.list()
            except StoreDamagedError:
                assert not corruption.confined, f"{what}: list() raised"
                return
            listed = {info.id: info for info in infos}
            shown = listed.get(target)  # absent (its info deleted), damaged, or as it was
            assert shown is None or shown.damage or shown == saved.originals[target].info, (
                f"{what}: list() shows {target} otherwise, without damage"
            )
            if corruption.confined:
                for state_id in saved.ids:
                    if state_id != target:
                        assert listed.get(state_id) == saved.originals[state_id].info, (
                            f"{what}: list() shows {state_id} otherwise"
                        )
        finally:
            close(store)


FUZZ = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@FUZZ
@given(corruption=corruptions(FILE_KINDS))
def test_a_damaged_file_store_gives_a_clear_error_or_the_same_state(
    saved: dict[str, Saved], corruption: Corruption
) -> None:
    check("file", saved["file"], corruption)


@FUZZ
@given(corruption=corruptions(SQLITE_KINDS))
def test_a_damaged_sqlite_store_gives_a_clear_error_or_the_same_state(
    saved: dict[str, Saved], corruption: Corruption
) -> None:
    check("sqlite", saved["sqlite"], corruption)


LINKS_FUZZ = settings(FUZZ, max_examples=60)


@LINKS_FUZZ
@given(corruption=corruptions(LINK_KINDS))
def test_a_damaged_link_of_a_file_store_gives_a_clear_error_or_the_same_state(
    saved: dict[str, Saved], corruption: Corruption
) -> None:
    check_links("file", saved["file-cut-off"], corruption)


@LINKS_FUZZ
@given(corruption=corruptions(LINK_KINDS))
def test_a_damaged_link_of_an_sqlite_store_gives_a_clear_error_or_the_same_state(
    saved: dict[str, Saved], corruption: Corruption
) -> None:
    check_links("sqlite", saved["sqlite-cut-off"], corruption)
