"""Every backend of `stores` passes the one contract suite (`stores.contract`), and so do two
third-party backends written from public names only: the stores guide's `DictStore`, and
`PublicApiStore` below."""

from __future__ import annotations

import builtins
import re
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import pydantic
import pytest

from orchestrator import HistoryEntry, State, StateInfo, StoreConflictError
from stores import AioSQLiteStore, FileStore, MemoryStore, SQLiteStore, ThreadedAsync
from stores.backend import bind_state, recover_state, storage_view
from stores.contract import FollowContract, LeaseContract, StoreContract, TreeFollowContract


def _damaged(data: bytes, seq: int) -> bytes:
    """`data` (a stored entry, ``text-<seq>`` in it) with that text changed, same length."""
    assert f"text-{seq}".encode() in data
    return data.replace(f"text-{seq}".encode(), b"text-X")


class TestMemoryStore(LeaseContract, TreeFollowContract, FollowContract, StoreContract):
    @pytest.fixture
    def store(self) -> MemoryStore:
        return MemoryStore()

    def damage(self, store: MemoryStore, state_id: str, seq: int) -> None:
        # Its lines are private: no public way reaches what it keeps.
        lines = store._states[state_id].lines  # pyright: ignore[reportPrivateUsage]
        lines[seq] = _damaged(lines[seq], seq)


class StatesOnly(MemoryStore):
    """A store that keeps States but no agent memory, like a third-party one may."""

    keeps_memory = False  # what `Memory` asks before it trusts the memory methods


class TestStoreWithoutMemory(StoreContract):
    keeps_memory = False

    @pytest.fixture
    def store(self) -> StatesOnly:
        return StatesOnly()


class TestFileStore(TreeFollowContract, FollowContract, StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> FileStore:
        return FileStore(tmp_path / "states")

    def damage(self, store: FileStore, state_id: str, seq: int) -> None:
        log = store.path / state_id / "log.jsonl"
        lines = log.read_bytes().split(b"\n")
        lines[seq] = _damaged(lines[seq], seq)
        log.write_bytes(b"\n".join(lines))

    def writer_url(self, store: FileStore) -> str:
        return store.url


def _damage_sqlite(path: str, state_id: str, seq: int) -> None:
    db = sqlite3.connect(path)
    try:
        with db:
            query = "SELECT data FROM entries WHERE state_id = ? AND seq = ?"
            (data,) = db.execute(query, (state_id, seq)).fetchone()
            db.execute(
                "UPDATE entries SET data = ? WHERE state_id = ? AND seq = ?",
                (_damaged(bytes(data), seq), state_id, seq),
            )
    finally:
        db.close()


class TestSQLiteStore(LeaseContract, TreeFollowContract, FollowContract, StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[SQLiteStore]:
        with SQLiteStore(tmp_path / "states.db") as store:
            yield store

    def damage(self, store: SQLiteStore, state_id: str, seq: int) -> None:
        _damage_sqlite(store.path, state_id, seq)

    def writer_url(self, store: SQLiteStore) -> str:
        return store.url


class TestAioSQLiteStore(LeaseContract, TreeFollowContract, FollowContract, StoreContract):
    colours = ("async",)
    asyncio_only = True

    @pytest.fixture
    def store(self, tmp_path: Path) -> AioSQLiteStore:
        return AioSQLiteStore(tmp_path / "states.db")

    def damage(self, store: AioSQLiteStore, state_id: str, seq: int) -> None:
        _damage_sqlite(store.path, state_id, seq)

    def writer_url(self, store: AioSQLiteStore) -> str:
        return store.url


def _guide_backend() -> type[Any]:
    """The `DictStore` the stores guide writes from public names: it must pass the contract."""
    page = Path(__file__).resolve().parents[2] / "docs" / "guides" / "stores.md"
    text = page.read_text(encoding="utf-8")
    start = text.index("```python\nimport threading\n")
    code = text[start + len("```python\n") : text.index("\n```", start)]
    code = code[: code.index("\nmine = DictStore()")]  # the class, not the example after it
    namespace: dict[str, Any] = {"State": State, "__name__": "guide_dict_store"}
    exec(compile(code, f"{page}:DictStore", "exec"), namespace)
    return namespace["DictStore"]


class TestGuideDictStore(StoreContract):
    colours = ("sync",)
    keeps_memory = False

    @pytest.fixture
    def store(self) -> Any:
        return _guide_backend()()


# The contract, run on a third-party backend written with the public API only ---------------

_ENTRY: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(
    Annotated[HistoryEntry, pydantic.Field(discriminator="kind")],
    config=pydantic.ConfigDict(ser_json_bytes="base64", val_json_bytes="base64"),
)


_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


class PublicApiStore(ThreadedAsync):
    """What a third party writes from the docs: public names only (no ``_``-prefixed API).

    Entries are kept as JSON per id; `ThreadedAsync` gives the async twins.
    """

    def __init__(self) -> None:
        self._rows: dict[str, builtins.list[bytes]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _check(state_id: str) -> None:
        if not _ID.fullmatch(state_id):
            raise ValueError(f"The id {state_id!r} is not valid: use [A-Za-z0-9_-]{{1,128}}.")

    def save(self, state: State) -> None:
        history = state.history
        with self._lock:
            rows = self._rows.setdefault(state.id, [])
            if len(history) < len(rows) or (
                rows and _ENTRY.dump_json(history[len(rows) - 1]) != rows[-1]
            ):
                raise StoreConflictError(
                    f"State {state.id!r} differs from the stored one: load it to continue it."
                )
            rows.extend(_ENTRY.dump_json(entry) for entry in history[len(rows) :])
        bind_state(state, self)

    def load(self, state_id: str) -> State:
        self._check(state_id)
        with self._lock:
            rows = self._rows.get(state_id)
            if rows is None:
                raise LookupError(f"No State {state_id!r} in this store.")
            stored = builtins.list(rows)
        state = self._rebuild(state_id, stored)
        # The public helpers every backend uses: close a cut-off turn, bind to this store.
        recover_state(state, self._children_of(state_id) if state.pending_calls else ())
        bind_state(state, self)
        return state

    @staticmethod
    def _rebuild(state_id: str, rows: builtins.list[bytes]) -> State:
        return State(id=state_id, history=[_ENTRY.validate_json(row) for row in rows])

    def _children_of(self, state_id: str) -> builtins.list[StateInfo]:
        return self.list(parent_id=state_id)

    def list(
        self, *, parent_id: str | None = None, limit: int | None = None
    ) -> builtins.list[StateInfo]:
        with self._lock:
            stored = {state_id: builtins.list(rows) for state_id, rows in self._rows.items()}
        infos = [
            storage_view(self._rebuild(state_id, rows)).info for state_id, rows in stored.items()
        ]
        infos = [info for info in infos if parent_id is None or info.parent_id == parent_id]
        infos.sort(key=lambda info: info.id)
        infos.sort(
            key=lambda info: info.updated_at.timestamp() if info.updated_at else 0.0,
            reverse=True,
        )
        return infos if limit is None else infos[:limit]

    def delete(self, state_id: str) -> None:
        self._check(state_id)
        with self._lock:
            self._rows.pop(state_id, None)


class TestPublicApiStore(StoreContract):
    # Issue 4, item 5: the contract suite is for "every backend ... (including a third-party
    # one: it is importable as a pytest plugin or helper)"; DESIGN 9: "A loaded State is bound
    # to its store" and load "closes a half-done turn": stores.backend's bind_state and
    # recover_state are the public helpers for both.
    colours = ("sync",)
    keeps_memory = False

    @pytest.fixture
    def store(self) -> PublicApiStore:
        return PublicApiStore()


def test_a_store_that_cannot_be_followed_is_told_what_it_lacks() -> None:
    """Following is optional: a store without `AsyncFollowable` gets a TypeError naming it."""
    from orchestrator._record._storage import require_followable

    with pytest.raises(TypeError, match=r"PublicApiStore cannot follow.*AsyncFollowable"):
        require_followable(PublicApiStore())
    store = MemoryStore()
    assert require_followable(store) is store
