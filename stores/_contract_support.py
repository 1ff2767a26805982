"""What the store contract suite is built from.

Sample States, and a client that runs one test body against the sync or the async methods of
a store.

Public through `stores.contract`; kept apart so each module stays small.
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar, cast

import anyio
import anyio.from_thread
import anyio.to_thread
import pydantic
from anyio.from_thread import BlockingPortal

from orchestrator import (
    Agent,
    AskEntry,
    AskRecord,
    AsyncBatchStore,
    BatchStore,
    ExtraDataChange,
    ExtraDataEntry,
    HistoryEntry,
    Image,
    Memory,
    Message,
    ModelReplyEntry,
    ModelRequest,
    ModelRequestEntry,
    Prompt,
    PromptEntry,
    RawBlock,
    ReasoningBlock,
    Reply,
    RunStart,
    RunStartEntry,
    State,
    StateInfo,
    TextBlock,
    ToolCall,
    ToolResultBlock,
    ToolResultEntry,
    Usage,
    UserEntry,
    tool,
)

__all__ = (
    "PNG",
    "Colour",
    "Loop",
    "Mode",
    "Notes",
    "StoreClient",
    "appended",
    "assert_same",
    "crashed_pending",
    "crashed_waiting",
    "dated",
    "echo",
    "result_block",
    "rich_state",
    "tool_call_of",
)

_T = TypeVar("_T")
_I = TypeVar("_I")
Colour = Literal["sync", "async"]
Mode = Literal["sync", "asyncio", "trio"]

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
_USAGE = Usage(input_tokens=120, output_tokens=30, cache_read_tokens=7, requests=1, cost=0.25)


class Notes(pydantic.BaseModel):
    """The typed data of `rich_state`."""

    items: list[str] = []
    score: int = 0


class Loop(pydantic.BaseModel):
    """A document of the memory tests: an open loop."""

    title: str
    status: Literal["open", "resolved"]
    due: str | None = None


def tool_call_of(call_id: str, name: str, **args: Any) -> ToolCall:
    return ToolCall(call_id, name, cast("Any", args))


def result_block(
    call_id: str, *blocks: TextBlock | Image, is_error: bool = False
) -> ToolResultBlock:
    return ToolResultBlock(call_id, blocks, is_error)


def appended(state: State, entry_type: type[HistoryEntry], content: Any, **fields: Any) -> State:
    """`state` with one more entry, given as data (as a store or a replay gives a history).

    The contract builds its States this way, from public entry types, so it depends on no
    private recording API; the State itself checks that each entry may follow the ones before.
    """
    turn = state.turn + 1 if entry_type is ModelRequestEntry else state.turn
    entry = entry_type(
        seq=len(state.history), turn=turn, at=datetime.now(UTC), content=content, **fields
    )
    return State(id=state.id, history=[*state.history, entry], schema=state.schema)


def rich_state(state_id: str = "rich") -> State:
    """A State that has every kind of entry and value a store must keep.

    Messages with images and a U+2028 inside text, a reply with reasoning, raw blocks and
    parallel tool calls, results with images and errors, a child link, typed data merged at a
    turn's end, extra data edits, a notice, a restore, an ask, a compaction, cleared results,
    and a finish.
    """
    state = State(
        id=state_id,
        messages=[Message.user("Look at this\u2028screenshot, ünïcode ✓", Image(PNG, "image/png"))],
        extra_data={"repo": "api", "ids": [1, 2.5, None, True], "nested": {"a": {"b": "c"}}},
        schema=Notes,
    )
    start = RunStart(agent="tester", model="fake", tools=("grep", "look"))
    state = appended(state, RunStartEntry, start)
    state = appended(state, ModelRequestEntry, ModelRequest(model="fake", message_count=1))
    grep, look = tool_call_of("c1", "grep", q="bug", n=3), tool_call_of("c2", "look", path="a.png")
    reply = Message(
        "assistant",
        (
            ReasoningBlock("I should search."),
            TextBlock("Let me see."),
            RawBlock("fake", {"signature": "abc", "n": [1, 2]}),
            grep,
            look,
        ),
    )
    state = appended(state, ModelReplyEntry, Reply(reply, _USAGE, "tool_use", "fake-1"))
    found = result_block("c1", TextBlock("found in b.py"))
    state = appended(
        state,
        ToolResultEntry,
        found,
        call=grep,
        outcome="done",
        state_update={"items": ["b"]},
        merge_due=True,
    )
    state.add_message(Message.notice("the user is watching"))
    shown = result_block("c2", TextBlock("it shows"), Image(PNG, "image/jpeg"), is_error=True)
    state = appended(
        state,
        ToolResultEntry,
        shown,
        call=look,
        outcome="error",
        child_ids=("rich-child",),
        usage=Usage(input_tokens=5, requests=2),
    )
    merged = ExtraDataChange(changed={"items": ["b"]}, turn_merge=True)
    state = appended(state, ExtraDataEntry, merged)  # what the agent of the tools records
    state.set("score", 5)
    before = state.snapshot()
    state.add_message(Message.user("never mind"))
    state.restore(before)
    with state.edit_extra_data() as data:
        data["k"] = {"a": None, "text": "line\nbreak\u2028sep"}
        del data["repo"]
    asked = AskRecord(question="Is it fixed?", answer={"fixed": False, "why": "tests"})
    state = appended(state, AskEntry, asked)
    told = Prompt.of("Find the bug.", [{"name": "grep", "description": "Search."}], {"seed": 1})
    state = appended(state, PromptEntry, told)  # what the model was told, named by digest
    request = ModelRequest(model="fake", message_count=4, prompt=told.digest)
    state = appended(state, ModelRequestEntry, request)
    answer = Reply(Message.assistant("It is in b.py."), _USAGE, "end_turn", "fake-1")
    state = appended(state, ModelReplyEntry, answer)
    state.clear_tool_results(keep_last=0)
    state.compact("We found the bug in b.py.")
    state.finish({"answer": 42, "files": ["b.py"]})
    return state


def _waiting(state_id: str, task: str) -> State:
    state = State(id=state_id, messages=[Message.user(task)])
    state = appended(state, RunStartEntry, RunStart(agent="tester", model="fake"))
    return appended(state, ModelRequestEntry, ModelRequest(model="fake", message_count=1))


def crashed_waiting(state_id: str = "waiting") -> State:
    """A State cut off while its request waited on the model (as a crash leaves it)."""
    return _waiting(state_id, "Summarize the repo")


def crashed_pending(state_id: str = "pending") -> State:
    """A State cut off with two tool calls open; one other call already has its result."""
    state = _waiting(state_id, "Fix the bug")
    calls = (
        tool_call_of("c1", "grep", q="bug"),
        tool_call_of("c2", "edit", path="b.py"),
        tool_call_of("c3", "test"),
    )
    reply = Reply(Message.assistant("", calls), _USAGE, "tool_use", "fake")
    state = appended(state, ModelReplyEntry, reply)
    done = result_block("c1", TextBlock("b.py:3"))
    return appended(state, ToolResultEntry, done, call=calls[0], outcome="done")


def dated(state_id: str, at: datetime, *, parent: tuple[str, str] | None = None) -> State:
    """A State of one user message recorded at `at` (and a run start linking it to `parent`)."""
    entries: builtins.list[Any] = [
        UserEntry(seq=0, turn=0, at=at, content=Message.user(f"task of {state_id}"))
    ]
    state = State(id=state_id, history=entries)
    if parent is not None:
        link = RunStart(parent_id=parent[0], parent_call_id=parent[1])
        state = appended(state, RunStartEntry, link)
    return state


def assert_same(loaded: State, state: State) -> None:
    """`loaded` is a new State with the value, history and times of `state`."""
    assert loaded is not state
    assert loaded.id == state.id
    assert loaded.snapshot() == state.snapshot()
    assert loaded.history == state.history
    assert [entry.at for entry in loaded.history] == [entry.at for entry in state.history]
    assert loaded.created_at == state.created_at
    assert loaded.updated_at == state.updated_at
    assert loaded.parent_id == state.parent_id
    assert loaded.parent_call_id == state.parent_call_id


@tool
def echo(text: str) -> str:
    """Say `text` back."""
    return text


class StoreClient:
    """The store under test, called through its sync methods or awaited on an event loop.

    Tests call it like a sync store; in an async mode each call awaits the store's
    ``a``-method on the portal's event loop.
    """

    def __init__(self, store: Any, portal: BlockingPortal | None) -> None:
        self.store = store
        self.portal = portal

    def call(self, func: Callable[..., Awaitable[_T]], *args: Any) -> _T:
        """Run the coroutine function `func(*args)` on the event loop of this client."""
        assert self.portal is not None
        return self.portal.call(func, *args)

    def save(self, state: State) -> None:
        """`save` or `asave`."""
        if self.portal is None:
            self.store.save(state)
        else:
            self.call(self.store.asave, state)

    def save_many(self, states: Sequence[State]) -> dict[int, ValueError] | None:
        """`save_many` or `asave_many`; None if the store has no batch save of this colour."""
        if self.portal is None:
            if not isinstance(self.store, BatchStore):
                return None
            return self.store.save_many(states)
        if not isinstance(self.store, AsyncBatchStore):
            return None
        return self.call(self.store.asave_many, states)

    def load(self, state_id: str) -> State:
        """`load` or `aload`."""
        if self.portal is None:
            return cast("State", self.store.load(state_id))
        return cast("State", self.call(self.store.aload, state_id))

    def list(
        self, *, parent_id: str | None = None, limit: int | None = None
    ) -> builtins.list[StateInfo]:
        """`list` or `alist`."""
        infos: Any
        if self.portal is None:
            infos = self.store.list(parent_id=parent_id, limit=limit)
            return cast("builtins.list[StateInfo]", infos)

        async def alist() -> builtins.list[StateInfo]:
            infos = await self.store.alist(parent_id=parent_id, limit=limit)
            return cast("builtins.list[StateInfo]", infos)

        return self.call(alist)

    def delete(self, state_id: str) -> None:
        """`delete` or `adelete`."""
        if self.portal is None:
            self.store.delete(state_id)
        else:
            self.call(self.store.adelete, state_id)

    def memory_get(self, agent: str, space: str, key: str) -> str | None:
        """`memory_get` or `amemory_get`."""
        if self.portal is None:
            return cast("str | None", self.store.memory_get(agent, space, key))
        return cast("str | None", self.call(self.store.amemory_get, agent, space, key))

    def memory_scan(self, agent: str, space: str) -> builtins.list[tuple[str, str]]:
        """`memory_scan` or `amemory_scan`."""
        rows: Any
        if self.portal is None:
            rows = self.store.memory_scan(agent, space)
        else:
            rows = self.call(self.store.amemory_scan, agent, space)
        return cast("builtins.list[tuple[str, str]]", rows)

    def memory_put(
        self, agent: str, space: str, key: str, data: str | None, effect: str | None = None
    ) -> bool:
        """`memory_put` or `amemory_put`."""
        if self.portal is None:
            return bool(self.store.memory_put(agent, space, key, data, effect=effect))

        async def put() -> bool:
            return bool(await self.store.amemory_put(agent, space, key, data, effect=effect))

        return self.call(put)

    def memory(self, agent: str) -> Memory:
        """`Memory.open(agent, {"loops": Loop}, store)`."""
        return Memory.open(agent, {"loops": Loop}, self.store)

    def upsert(self, memory: Memory, doc_id: str, doc: Any) -> Any:
        """``memory.collection("loops").upsert`` or ``aupsert``."""
        loops = memory.collection("loops")
        if self.portal is None:
            return loops.upsert(doc_id, doc)
        return self.call(loops.aupsert, doc_id, doc)

    def loops(self, memory: Memory, **filters: Any) -> builtins.list[dict[str, Any]]:
        """``memory.collection("loops").list(**filters)`` or ``alist``."""
        loops = memory.collection("loops")
        if self.portal is None:
            return loops.list(**filters)

        async def alist() -> builtins.list[dict[str, Any]]:
            return await loops.alist(**filters)

        return self.call(alist)

    def ids(self, **filters: Any) -> builtins.list[str]:
        """The ids `list` returns, in its order."""
        return [info.id for info in self.list(**filters)]

    def run_agent(self, agent: Agent, state: State) -> Any:
        """`agent.run(state)`, or `await agent.arun(state)` on the loop."""
        if self.portal is None:
            return agent.run(state)
        return self.call(agent.arun, state)

    def child(self, state: State, child_id: str) -> State:
        """`state.child(child_id)`, or `await state.achild(child_id)` on the loop."""
        if self.portal is None:
            return state.child(child_id)
        return self.call(state.achild, child_id)

    def concurrent_puts(
        self, workers: int, puts: Callable[[int], Iterator[tuple[str, str, str, str | None]]]
    ) -> builtins.list[bool]:
        """Run memory writers ``0 .. workers-1`` at once; every `memory_put` result, in no order.

        Writer `i` makes the writes ``(agent, key, data, effect)`` that `puts(i)` yields, in the
        space ``"kv"``, as `in_workers` runs them.
        """
        results: builtins.list[bool] = []
        lock = threading.Lock()
        store = self.store

        def put(write: tuple[str, str, str, str | None]) -> None:
            agent, key, data, effect = write
            applied = store.memory_put(agent, "kv", key, data, effect=effect)
            with lock:
                results.append(bool(applied))

        async def aput(write: tuple[str, str, str, str | None]) -> None:
            agent, key, data, effect = write
            applied = await store.amemory_put(agent, "kv", key, data, effect=effect)
            with lock:
                results.append(bool(applied))

        self.in_workers(workers, puts, put, aput)
        return results

    def concurrently(self, workers: int, rounds: Callable[[int], Iterator[State]]) -> None:
        """Run the workers ``0 .. workers-1`` at the same time and wait for them all.

        Worker `i` saves each State that `rounds(i)` yields (the generator changes the States
        between its yields), with `save` or `asave` as `in_workers` runs them.
        """
        store = self.store

        async def asave(state: State) -> object:
            return await store.asave(state)  # looked up only where the async methods are used

        self.in_workers(workers, rounds, lambda state: store.save(state), asave)

    def in_workers(
        self,
        workers: int,
        items: Callable[[int], Iterator[_I]],
        sync: Callable[[_I], object],
        asynchronous: Callable[[_I], Coroutine[Any, Any, object]],
    ) -> None:
        """Run workers ``0 .. workers-1`` at once, each on the items `items(i)` yields, in order.

        Sync: every worker is a thread calling `sync(item)`; the first error is re-raised here.
        Async: even workers are tasks awaiting `asynchronous(item)`, odd ones threads awaiting it
        on the loop from outside it.
        """
        if self.portal is None:
            errors: builtins.list[BaseException] = []

            def run(i: int) -> None:
                try:
                    for item in items(i):
                        sync(item)
                except BaseException as error:  # re-raised below, in the test's thread
                    errors.append(error)

            threads = [threading.Thread(target=run, args=(i,)) for i in range(workers)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if errors:
                raise errors[0]
            return

        def in_thread(i: int) -> None:
            for item in items(i):
                anyio.from_thread.run(asynchronous, item)

        async def in_task(i: int) -> None:
            for item in items(i):
                await asynchronous(item)

        async def main() -> None:
            async with anyio.create_task_group() as group:
                for i in range(workers):
                    if i % 2:
                        group.start_soon(anyio.to_thread.run_sync, in_thread, i)
                    else:
                        group.start_soon(in_task, i)

        self.call(main)
