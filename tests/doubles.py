"""Test doubles, documents and helpers shared by several test modules."""

from __future__ import annotations

import builtins
import threading
from typing import Literal

import pydantic

from orchestrator import State, ToolResultEntry
from stores import MemoryStore, StateInfo


class ThreadCheckedStore:
    """A sync-only store (`stores.Store`, no ``a``-methods) that notes calls on the loop thread.

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
        state._bind_store(self)

    def load(self, state_id: str) -> State:
        self._note("load")
        loaded = self.inner.load(state_id)
        loaded._bind_store(self)
        return loaded

    def list(
        self, *, parent_id: str | None = None, limit: int | None = None
    ) -> builtins.list[StateInfo]:
        self._note("list")
        return self.inner.list(parent_id=parent_id, limit=limit)

    def delete(self, state_id: str) -> None:
        self._note("delete")
        self.inner.delete(state_id)


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


def results(state: State) -> list[ToolResultEntry]:
    """The `tool_result` entries of `state`, in order."""
    return [entry for entry in state.history if isinstance(entry, ToolResultEntry)]
