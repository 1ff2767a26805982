"""Review of the stores against DESIGN section 9 and issue #4: save points, notes, threads,
recovery, format versions, and the contract suite used by a third-party backend.

Each test cites the sentence it checks. Async tests run on asyncio and trio; the
`AioSQLiteStore` case is parametrized to asyncio only (aiosqlite runs on asyncio only).
"""

from __future__ import annotations

import builtins
import json
import re
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
import pydantic
import pytest

from orchestrator import (
    Agent,
    ContextChangeEntry,
    HistoryEntry,
    Message,
    Reply,
    RunStart,
    State,
    StateInfo,
    StoreConflictError,
    ToolCall,
    ToolResultEntry,
    Usage,
    bind_state,
    recover_state,
    storage_view,
    tool,
)
from orchestrator._recording import begin_think, record_reply, record_run_start
from orchestrator.models import Request
from orchestrator.permissions import AllowByName, DenyByName
from orchestrator.testing import FakeModel, tool_call
from stores import (
    FORMAT_VERSION,
    AioSQLiteStore,
    FileStore,
    MemoryStore,
    SQLiteStore,
    ThreadedAsync,
)
from stores.contract import StoreContract
from tests.doubles import ThreadCheckedStore

TIMEOUT = 20  # seconds; only reached when a regression makes something wait forever
NO_SPACE = "No space left on device"

Backend = Literal["memory", "file", "sqlite"]


@pytest.fixture
def loop_thread() -> int:
    """The thread this test runs on: in an async test, the event loop's thread."""
    return threading.get_ident()


class BreakableStore(MemoryStore):
    """A `MemoryStore` whose saves fail once `broken` is set (a full disk)."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = False

    def save(self, state: State) -> None:
        if self.broken:
            raise OSError(28, NO_SPACE)
        super().save(state)


# Save points (DESIGN 9) -----------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_sync_store_is_never_called_on_the_event_loop_thread(loop_thread: int) -> None:
    # Issue 4: "Sync stores are called from worker threads inside async runs, never blocking
    # the event loop."
    store = ThreadCheckedStore(loop_thread)
    entered = anyio.Event()

    @tool
    async def look() -> str:
        """Look around."""
        return "seen"

    @tool
    async def hang() -> str:
        """Wait forever."""
        entered.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    helper = Agent(
        FakeModel([tool_call("look"), "helped"]),
        tools=[look],
        name="helper",
        description="Helps.",
    )
    script: builtins.list[Any] = [
        [tool_call("look"), tool_call("helper", task="help")],
        "done",
        "The summary.",
        tool_call("hang"),
    ]
    agent = Agent(FakeModel(script), tools=[look, hang, helper], store=store)
    state = State(messages=[Message.user("Go")])
    assert await agent.arun(state) == "done"
    await agent.acompact(state)
    state.add_message(Message.user("Now wait"))
    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as group:
            group.start_soon(agent.arun, state)
            await entered.wait()
            group.cancel_scope.cancel()
    assert store.calls.count("save") >= 10  # the lead and the child (it inherits the store)
    assert store.on_loop == []
    assert store.inner.load(state.id).history == state.history


@pytest.mark.anyio
async def test_compaction_is_a_save_point() -> None:
    # DESIGN 9: "saves every State it runs at each save point: ... after compaction."
    store = MemoryStore()
    agent = Agent(FakeModel(["First answer.", "The summary."]), store=store)
    state = State(messages=[Message.user("Go")])
    await agent.arun(state)
    await agent.acompact(state)
    last = state.history[-1]
    assert isinstance(last, ContextChangeEntry)
    assert last.content.kind == "compact"
    assert store.load(state.id).history == state.history


@pytest.mark.anyio
async def test_an_ask_is_saved_like_a_model_reply() -> None:
    # DESIGN 9: "saves every State it runs at each save point: ... after each model reply";
    # an ask's reply is recorded as an `ask` entry holding the usage spent (DESIGN 5).
    store = MemoryStore()
    agent = Agent(FakeModel(["Hello.", "3"]), store=store)
    state = State(messages=[Message.user("Count the files")])
    await agent.arun(state)
    assert await agent.aask(state, "How many files?", int) == 3
    assert state.history[-1].kind == "ask"
    assert store.load(state.id).history == state.history


@pytest.mark.anyio
async def test_results_cancelled_by_a_stopping_permission_are_saved() -> None:
    # DESIGN 9: "saves every State it runs at each save point: ... after each tool result".
    store = MemoryStore()

    @tool
    async def shell() -> str:
        """Run a shell command."""
        return "ran"

    @tool(parallel=False)
    def read() -> str:
        """Read a file."""
        return "text"

    agent = Agent(
        FakeModel([[tool_call("shell"), tool_call("read")], "never"]),
        tools=[shell, read],
        store=store,
        permissions=[DenyByName(["shell"], stop=True), AllowByName(["read"])],
    )
    state = State(messages=[Message.user("Go")])
    await agent.athink(state)
    await agent.ause_tools(state)
    outcomes = [e.outcome for e in state.history if isinstance(e, ToolResultEntry)]
    assert outcomes == ["denied", "cancelled"]
    assert store.load(state.id).history == state.history


# A save failing after an error: a note, the error wins (issue 4, item 4) --------------------


@pytest.mark.anyio
@pytest.mark.parametrize("where", ["model", "tool"])
async def test_a_save_failing_after_an_error_is_a_note_and_the_error_wins(where: str) -> None:
    # Issue 4: "at run end (also when the run ends with an exception: the original exception
    # wins, a save failure is attached as a note)".
    store = BreakableStore()
    failure = RuntimeError("the original failure")

    def failing_model(request: Request) -> Any:
        store.broken = True
        return failure

    @tool
    async def explode() -> str:
        """Fail."""
        store.broken = True
        raise failure

    script: builtins.list[Any] = [failing_model] if where == "model" else [tool_call("explode")]
    state = State(messages=[Message.user("Go")])
    with pytest.raises(RuntimeError) as caught:
        await Agent(FakeModel(script), tools=[explode], store=store).arun(state)
    assert caught.value is failure
    notes: builtins.list[str] = getattr(caught.value, "__notes__", [])
    assert notes
    assert all(NO_SPACE in note and state.id in note for note in notes)
    assert state.history[-1].kind == "error"
    assert state.pending_calls == ()


@pytest.mark.anyio
async def test_a_save_failing_after_a_cancellation_is_a_note_and_the_cancellation_wins() -> None:
    # Issue 4: "the original exception wins, a save failure is attached as a note";
    # DESIGN 3: "a cancellation is always re-raised".
    store = BreakableStore()
    entered = anyio.Event()

    @tool
    async def hang() -> str:
        """Wait forever."""
        store.broken = True
        entered.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    agent = Agent(FakeModel([tool_call("hang"), "never"]), tools=[hang], store=store)
    state = State(messages=[Message.user("Go")])
    seen: builtins.list[BaseException] = []

    async def go() -> None:
        try:
            await agent.arun(state)
        except anyio.get_cancelled_exc_class() as cancelled:
            seen.append(cancelled)
            raise

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as group:
            group.start_soon(go)
            await entered.wait()
            group.cancel_scope.cancel()
    (cancelled,) = seen
    notes: builtins.list[str] = getattr(cancelled, "__notes__", [])
    assert any(NO_SPACE in note for note in notes)
    assert state.pending_calls == ()
    assert [e.outcome for e in state.history if isinstance(e, ToolResultEntry)] == ["interrupted"]


# Recovery keeps the tree (DESIGN 8 and 9) -----------------------------------------------------


@pytest.fixture(params=["memory", "file", "sqlite"])
def sync_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Each sync backend, new and empty."""
    backend: Backend = request.param
    if backend == "memory":
        yield MemoryStore()
    elif backend == "file":
        yield FileStore(tmp_path / "states")
    else:
        with SQLiteStore(tmp_path / "states.db") as store:
            yield store


def test_a_cut_off_call_still_lists_the_child_it_started_after_load(sync_store: Any) -> None:
    # DESIGN 8: "the parent's tool_result entry lists child_ids"; issue 5: "after a save and
    # load, the tree reopens"; DESIGN 9: load closes a half-done turn with `unknown` results.
    lead = State(id="lead", messages=[Message.user("Delegate the search")])
    record_run_start(lead, RunStart(agent="lead", model="fake", tools=("helper",)))
    begin_think(lead, model="fake")
    call = ToolCall("c1", "helper", {"task": "search"})
    record_reply(lead, Reply(Message.assistant("", [call]), Usage(requests=1)))
    sync_store.save(lead)
    kid = State(id="kid", messages=[Message.user("search")])
    record_run_start(
        kid, RunStart(parent_id="lead", parent_call_id="c1", agent="helper", model="fake")
    )
    begin_think(kid, model="fake")
    record_reply(kid, Reply(Message.assistant("found it"), Usage(input_tokens=7, requests=1)))
    sync_store.save(kid)
    # The process stops here: the lead's call never got its result.
    loaded = sync_store.load("lead")
    (result,) = [e for e in loaded.history if isinstance(e, ToolResultEntry)]
    assert result.outcome == "unknown"
    assert result.child_ids == ("kid",)
    assert loaded.child("kid").answer == "found it"


# Format versions (DESIGN 9) -------------------------------------------------------------------


def _bump_format(backend: str, where: Path, state_id: str) -> None:
    """Mark the stored data as written by the next format version, behind the store's back."""
    if backend == "file":
        info_path = where / state_id / "info.json"
        info = json.loads(info_path.read_bytes())
        info["format"] = FORMAT_VERSION + 1
        info_path.write_text(json.dumps(info))
        return
    db = sqlite3.connect(where)
    try:
        db.execute("UPDATE meta SET value = ? WHERE key = 'format_version'", (FORMAT_VERSION + 1,))
        db.commit()
    finally:
        db.close()


NEWER = rf"version {FORMAT_VERSION + 1}\b.*version {FORMAT_VERSION}\b"


@pytest.mark.parametrize("backend", ["file", "sqlite"])
def test_an_open_store_refuses_to_save_into_a_newer_format(backend: str, tmp_path: Path) -> None:
    # DESIGN 9: "The format is versioned; a newer or older format is refused with a message
    # naming both versions."
    where = tmp_path / ("states" if backend == "file" else "states.db")
    store: Any = FileStore(where) if backend == "file" else SQLiteStore(where)
    state = State(id="versioned", messages=[Message.user("a")])
    store.save(state)
    _bump_format(backend, where, state.id)
    state.add_message(Message.user("b"))
    try:
        with pytest.raises(ValueError, match=NEWER):
            store.save(state)
    finally:
        if isinstance(store, SQLiteStore):
            store.close()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_open_aiosqlite_store_refuses_to_save_into_a_newer_format(
    tmp_path: Path,
) -> None:
    # DESIGN 9: "a newer or older format is refused with a message naming both versions."
    where = tmp_path / "states.db"
    async with AioSQLiteStore(where) as store:
        state = State(id="versioned", messages=[Message.user("a")])
        await store.asave(state)
        _bump_format("sqlite", where, state.id)
        state.add_message(Message.user("b"))
        with pytest.raises(ValueError, match=NEWER):
            await store.asave(state)


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
    # to its store" and load "closes a half-done turn": orchestrator.bind_state and
    # orchestrator.recover_state are the public helpers for both.
    colours = ("sync",)
    keeps_memory = False

    @pytest.fixture
    def store(self) -> PublicApiStore:
        return PublicApiStore()
