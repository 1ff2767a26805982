"""Test doubles, documents and helpers shared by several test modules."""

from __future__ import annotations

import builtins
import dataclasses
import enum
import sqlite3
import stat
import threading
from pathlib import Path
from typing import Any, Literal, cast

import pydantic

from orchestrator import (
    ErrorEntry,
    Message,
    ModelReplyEntry,
    Reporter,
    State,
    StateInfo,
    StateSnapshot,
    TextBlock,
    ToolCall,
    ToolResultBlock,
    ToolResultEntry,
    tool,
)
from orchestrator._record._recording import store_of
from orchestrator.models import Request, RetryPolicy
from stores import MemoryStore, chain_digests, first_digest
from stores.backend import bind_state


class ThreadCheckedStore:
    """A sync-only store (`orchestrator.Store`, no ``a``-methods) noting calls on the loop thread.

    Set `loop_thread` to the event loop's thread (``threading.get_ident()`` in the test); every
    call is listed in `calls`, and those made on that thread in `on_loop` as well.
    """

    def __init__(self, loop_thread: int | None = None) -> None:
        self.inner = MemoryStore()
        self.loop_thread = loop_thread
        self.calls: builtins.list[str] = []
        self.on_loop: builtins.list[str] = []

    def _note(self, method: str) -> None:
        self.calls.append(method)
        if threading.get_ident() == self.loop_thread:
            self.on_loop.append(method)

    def save(self, state: State) -> None:
        self._note("save")
        self.inner.save(state)
        bind_state(state, self)

    def load(self, state_id: str) -> State:
        self._note("load")
        loaded = self.inner.load(state_id)
        bind_state(loaded, self)
        return loaded

    def list(
        self, *, parent_id: str | None = None, limit: int | None = None
    ) -> builtins.list[StateInfo]:
        self._note("list")
        return self.inner.list(parent_id=parent_id, limit=limit)

    def delete(self, state_id: str) -> None:
        self._note("delete")
        self.inner.delete(state_id)


class AsyncOnlyStore:
    """An `orchestrator.AsyncStore` as a third party writes it: the ``a``-methods, nothing else."""

    def __init__(self) -> None:
        self.inner = MemoryStore()

    async def asave(self, state: State) -> None:
        await self.inner.asave(state)
        bind_state(state, self)

    async def aload(self, state_id: str) -> State:
        loaded = await self.inner.aload(state_id)
        bind_state(loaded, self)
        return loaded

    async def alist(
        self, *, parent_id: str | None = None, limit: int | None = None
    ) -> builtins.list[StateInfo]:
        return await self.inner.alist(parent_id=parent_id, limit=limit)

    async def adelete(self, state_id: str) -> None:
        await self.inner.adelete(state_id)


# Retries in the provider model tests: three, without waiting long.
FAST_RETRY = RetryPolicy(retries=3, base=0.001, max_delay=0.01)


def hello_request() -> Request:
    """A model request holding one user message, "Hi"."""
    return Request(system=None, messages=(Message.user("Hi"),))


class StreamRecorder(Reporter):
    """Notes each retry (attempt, delay, error) and each streamed text chunk of a run."""

    def __init__(self) -> None:
        self.retries: builtins.list[tuple[int, float, BaseException]] = []
        self.text: builtins.list[str] = []

    def on_retry(self, state: State, attempt: int, delay: float, error: BaseException) -> None:
        self.retries.append((attempt, delay, error))

    def on_text(self, state: State, chunk: str) -> None:
        self.text.append(chunk)


class Loop(pydantic.BaseModel):
    """An open loop: something to come back to."""

    title: str
    status: Literal["open", "resolved"]
    due: str | None = None


class Person(pydantic.BaseModel):
    """A person: a document with a constrained field."""

    name: str
    age: int = pydantic.Field(ge=0)
    tags: list[str] = []


def assert_replays(value: State | StateSnapshot) -> None:
    """The replay invariant: a State rebuilt from the history has the same value.

    Given a State, its properties also agree with its snapshot. Given a snapshot (taken while
    other threads change the State), the snapshot is the value its own history folds to.
    """
    snap = value.snapshot() if isinstance(value, State) else value
    assert State(history=snap.history).snapshot() == snap
    if isinstance(value, State):
        assert State(history=value.history).snapshot() == snap
        assert value.messages == snap.messages
        assert value.pending_calls == snap.pending_calls
        assert value.turn == snap.turn
        assert value.usage == snap.usage
        assert value.extra_data == snap.extra_data
        assert value.answer == snap.answer
        assert value.stopped == snap.stopped
        assert value.finished == snap.finished


def assert_consistent(state: State) -> None:
    """A State a run left: nothing open, each call answered once, and it replays.

    No call is pending and no request is waited on (a request without a reply was taken back);
    every call the model asked for has exactly one (non-late) result, and every result is in the
    messages, so the model can be asked again.
    """
    assert state.pending_calls == ()
    replies = [entry for entry in state.history if isinstance(entry, ModelReplyEntry)]
    assert state.turn == len(replies)
    requested = [call.id for entry in replies for call in entry.tool_calls]
    answered = [entry.call.id for entry in results(state) if not entry.late]
    assert sorted(answered) == sorted(requested)
    assert len(set(answered)) == len(answered)
    in_messages = [block.call_id for message in state.messages for block in message.tool_results]
    assert sorted(in_messages) == sorted(requested)
    assert_replays(state)


def results(state: State) -> list[ToolResultEntry]:
    """The `tool_result` entries of `state`, in order."""
    return [entry for entry in state.history if isinstance(entry, ToolResultEntry)]


def write_sql(path: Path, sql: str, *params: Any) -> None:
    """Run one statement on an SQLite store file, as another program would, and commit it."""
    db = sqlite3.connect(path)
    with db:
        db.execute(sql, params)
    db.close()


def reseal_sql(path: Path, state_id: str) -> None:
    """Give the stored entries of `state_id` valid digests again, and count them in its row.

    What someone who knows the format can do after editing rows: the entries then pass the
    integrity checks, so the checks behind them (decoding, order, replay) are what a load meets.
    """
    db = sqlite3.connect(path)
    with db:
        rows = db.execute(
            "SELECT seq, data FROM entries WHERE state_id = ? ORDER BY seq", (state_id,)
        ).fetchall()
        digests = chain_digests(first_digest(state_id), [bytes(data) for _, data in rows])
        for (seq, _), digest in zip(rows, digests, strict=True):
            db.execute(
                "UPDATE entries SET digest = ? WHERE state_id = ? AND seq = ?",
                (digest, state_id, seq),
            )
        head = digests[-1] if digests else None
        db.execute(
            "UPDATE states SET entries = ?, head = ? WHERE id = ?", (len(rows), head, state_id)
        )
    db.close()


def mode_of(path: Path) -> int:
    """The permission bits of `path` (``0o600``, ...)."""
    return stat.S_IMODE(path.stat().st_mode)


# Values: calls, results and what the history tells ----------------------------------------------


def call(call_id: str, name: str = "tool", **args: Any) -> ToolCall:
    """A tool call whose args go through the library's own freezing."""
    return ToolCall(call_id, name, cast("Any", args))


def block(call_id: str, text: str, *, is_error: bool = False) -> ToolResultBlock:
    """A text result for the call `call_id`."""
    return ToolResultBlock(call_id, (TextBlock(text),), is_error)


def result_of(state: State, call: ToolCall) -> ToolResultEntry:
    """The one (non-late) result entry of `call` in `state`."""
    (entry,) = [e for e in results(state) if e.call.id == call.id and not e.late]
    return entry


def errors(state: State) -> list[str]:
    """The text of each `error` entry of `state`, in order."""
    return [entry.content for entry in state.history if isinstance(entry, ErrorEntry)]


def child_ids(state: State) -> list[str]:
    """The ids of the children the calls of `state` started, in order."""
    return [child for entry in results(state) for child in entry.child_ids]


def only_child(state: State) -> State:
    """The one child State the calls of `state` started."""
    (child_id,) = child_ids(state)
    return state.child(child_id)


def assert_same(loaded: State, state: State) -> None:
    """A State loaded from a store is `state`: its id, value and entry times."""
    assert loaded.id == state.id
    assert loaded.snapshot() == state.snapshot()
    assert [entry.at for entry in loaded.history] == [entry.at for entry in state.history]


def bound_store(state: State) -> object | None:
    """The store `state` is bound to (private: the binding has no public accessor)."""
    client = store_of(state)
    return None if client is None else client.store


# Typing helpers: values the type checker must not narrow or check --------------------------------


def is_a(value: object, cls: type[Any] | tuple[type[Any], ...]) -> bool:
    """`isinstance` that does not narrow `value` (frozen values are typed `Any`)."""
    return isinstance(value, cls)


def type_of(value: object) -> type[Any]:
    """`type(value)`, without narrowing `value` for the type checker."""
    return type(value)


def as_any(value: object) -> Any:
    """Hide a deliberately wrong argument from the type checker."""
    return value


# Tools and documents --------------------------------------------------------------------------


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool
def read_file(path: str) -> str:
    """Read a file.

    Args:
        path: Where the file is.
    """
    return f"contents of {path}"


@tool
def lookup() -> str:
    """Look the bug up."""
    return "b.py:12"


@dataclasses.dataclass
class Point:
    """A plain dataclass value."""

    x: int
    y: int


class Color(enum.Enum):  # no docstring: JSON schemas of it would carry it
    RED = "red"
    BLUE = "blue"
