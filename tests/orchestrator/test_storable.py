"""What a State records can always be saved: lone surrogates, and tool results that are not JSON.

A lone surrogate (half of a character, which JSON from a provider or ``surrogateescape`` text can
carry) becomes U+FFFD wherever text enters a State, so every save writes and every load reads
back the same State. A tool result that cannot be JSON (a value holding itself, nested too deep,
an int too long, NaN, a value whose own conversion raises) is an error result the model reads,
and the run goes on.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import pydantic
import pytest

from orchestrator import (
    Agent,
    Message,
    ReasoningBlock,
    State,
    ToolError,
    ToolResult,
    tool,
)
from orchestrator.testing import FakeModel, tool_call
from stores import AioSQLiteStore, FileStore, MemoryStore, SQLiteStore
from tests.doubles import results

HALF = "\ud83d"  # the first half of an emoji: JSON "\ud83d" alone decodes to it
ESCAPED = "\udce9"  # the byte 0xE9 of b"caf\xe9" decoded with errors="surrogateescape"
DEPTH = 100  # the documented nesting limit (docs/guides/tools.md)

SyncStore = MemoryStore | FileStore | SQLiteStore


def _same(loaded: State, state: State) -> None:
    assert list(loaded.history) == list(state.history)
    assert loaded.messages == state.messages
    assert loaded.extra_data == state.extra_data
    assert loaded.answer == state.answer


def _nested(levels: int, inner: Any = 1) -> Any:
    value = inner
    for _ in range(levels):
        value = [value]
    return value


# -- item 6: every path text enters a State ----------------------------------------------------


@tool
def echo(text: str) -> str:
    """Give the text back."""
    return text


@tool
def half_text() -> str:
    """A result with a lone surrogate."""
    return f"caf{ESCAPED}"


@tool
def half_json() -> dict[str, Any]:
    """A JSON result with lone surrogates in a key and a value."""
    return {f"k{HALF}": [f"v{ESCAPED}"]}


@tool
def refuse() -> str:
    """A ToolError with a lone surrogate."""
    raise ToolError(f"no {HALF}")


@tool
def update() -> ToolResult:
    """A state update with a lone surrogate."""
    return ToolResult("ok", state={"note": f"n{HALF}"})


def _started() -> State:
    return State(messages=[Message.user("go")])


def _reply_text() -> State:
    state = _started()
    assert Agent(FakeModel([f"hi {HALF} there"])).run(state) == "hi \ufffd there"
    return state


def _reasoning() -> State:
    state = _started()
    Agent(FakeModel([[ReasoningBlock(f"hm {HALF}"), "ok"]])).run(state)
    [block] = [b for b in state.messages[-1].content if isinstance(b, ReasoningBlock)]
    assert block.text == "hm \ufffd"
    return state


def _tool_call_args() -> State:
    state = _started()
    agent = Agent(FakeModel([tool_call("echo", text=f"a{HALF}"), "done"]), tools=[echo])
    agent.run(state)
    [call] = state.messages[1].tool_calls
    assert call.args == {"text": "a\ufffd"}
    assert state.messages[2].tool_results[0].text == "a\ufffd"
    return state


def _tool_result(name: str, expected: str) -> Callable[[], State]:
    def build() -> State:
        state = _started()
        tools = [half_text, half_json, refuse, update]
        Agent(FakeModel([tool_call(name), "done"]), tools=tools).run(state)
        assert state.messages[2].tool_results[0].text == expected
        return state

    return build


def _user_message() -> State:
    state = State()
    state.add_message(Message.user(f"u{HALF}"))
    assert state.messages[-1].text == "u\ufffd"
    return state


def _notice() -> State:
    state = _started()
    state.add_message(Message.notice(f"n{ESCAPED}"))
    assert state.messages[-1].text == "[notice] n\ufffd"
    return state


def _extra_data() -> State:
    state = State(extra_data={f"a{HALF}": f"b{ESCAPED}"})
    state.set("k", {"list": [f"v{HALF}"]})
    with state.edit_extra_data() as data:
        data["edited"] = f"e{HALF}"
    assert state.extra_data == {
        "a\ufffd": "b\ufffd",
        "k": {"list": ["v\ufffd"]},
        "edited": "e\ufffd",
    }
    return state


def _state_update() -> State:
    state = _tool_result("update", "ok")()
    assert state.get("note") == "n\ufffd"
    return state


def _error_entry() -> State:
    state = _started()
    with pytest.raises(RuntimeError):
        Agent(FakeModel([RuntimeError(f"boom {HALF}")])).run(state)
    [error] = [entry for entry in state.history if entry.kind == "error"]
    assert error.content == "RuntimeError: boom \ufffd"
    return state


def _ask() -> State:
    state = _started()
    assert Agent(FakeModel([f"an {ESCAPED}"])).ask(state, f"q{HALF}?") == "an \ufffd"
    [asked] = [entry.content for entry in state.history if entry.kind == "ask"]
    assert (asked.question, asked.answer) == ("q\ufffd?", "an \ufffd")
    return state


def _compact_summary() -> State:
    state = _reply_text()
    Agent(FakeModel([f"sum {HALF}"])).compact(state)
    [change] = [
        e.content
        for e in state.history
        if e.kind == "context_change" and e.content.kind == "compact"
    ]
    assert change.summary is not None
    assert "sum \ufffd" in change.summary
    return state


def _finish_answer() -> State:
    state = _started()
    state.finish({f"k{HALF}": f"v{HALF}"})
    assert state.answer == {"k\ufffd": "v\ufffd"}
    return state


PATHS: dict[str, Callable[[], State]] = {
    "reply text": _reply_text,
    "reasoning": _reasoning,
    "tool call args": _tool_call_args,
    "tool result str": _tool_result("half_text", "caf\ufffd"),
    "tool result JSON": _tool_result("half_json", '{"k\ufffd": ["v\ufffd"]}'),
    "ToolError message": _tool_result("refuse", "no \ufffd"),
    "ToolResult.state": _state_update,
    "user message": _user_message,
    "notice": _notice,
    "extra_data, state.set, edit_extra_data": _extra_data,
    "error entry": _error_entry,
    "ask question and answer": _ask,
    "compact summary": _compact_summary,
    "finish answer": _finish_answer,
}


@pytest.mark.parametrize("path", PATHS)
def test_text_with_lone_surrogates_saves_on_every_sync_store(
    path: str, sync_store: SyncStore
) -> None:
    state = PATHS[path]()
    sync_store.save(state)
    _same(sync_store.load(state.id), state)


@pytest.fixture
def async_store(anyio_backend: str, tmp_path: Path) -> Iterator[Any]:
    """aiosqlite on asyncio; on trio (which aiosqlite does not run on) the FileStore's twins."""
    if anyio_backend == "asyncio":
        yield AioSQLiteStore(tmp_path / "runs.db")
    else:
        yield FileStore(tmp_path / "runs")


@contextlib.asynccontextmanager
async def _opened(store: Any) -> AsyncGenerator[None]:
    if isinstance(store, AioSQLiteStore):
        async with store:
            yield
    else:
        yield


@pytest.mark.parametrize("path", PATHS)
def test_text_with_lone_surrogates_saves_on_an_async_store(
    path: str, anyio_backend: str, async_store: Any
) -> None:
    state = PATHS[path]()  # built by the sync API, before any event loop runs

    async def save_and_load() -> State:
        async with _opened(async_store):
            await async_store.asave(state)
            return await async_store.aload(state.id)

    _same(anyio.run(save_and_load, backend=anyio_backend), state)


@pytest.mark.anyio
async def test_a_run_whose_model_replies_with_a_lone_surrogate_completes_and_saves(
    async_store: Any,
) -> None:
    async with _opened(async_store):
        model = FakeModel([[f"look {HALF}", tool_call("echo", text=f"x{ESCAPED}")], f"done {HALF}"])
        agent = Agent(model, tools=[echo], store=async_store)
        state = _started()
        assert await agent.arun(state) == "done \ufffd"
        assert state.messages[1].text == "look \ufffd"
        _same(await async_store.aload(state.id), state)


# -- item 8: tool results that are not JSON are error results ------------------------------------


def _cyclic_dict() -> object:
    value: dict[str, Any] = {"name": "loop"}
    value["self"] = value
    return value


def _cyclic_list() -> object:
    value: list[Any] = []
    value.append(value)
    return value


class _Tree(pydantic.BaseModel):
    children: list[Any] = []


def _cyclic_model() -> object:
    tree = _Tree()
    tree.children.append(tree)
    return tree


class _Broken(Mapping[str, Any]):
    """A Mapping whose items cannot be read."""

    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("the backing file is gone")

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("the backing file is gone")

    def __len__(self) -> int:
        return 1


BAD_RESULTS: dict[str, tuple[Callable[[], object], str]] = {
    "cyclic dict": (_cyclic_dict, "holds itself"),
    "cyclic list": (_cyclic_list, "holds itself"),
    "cyclic pydantic model": (_cyclic_model, "Circular reference"),
    "100,000-deep list": (lambda: _nested(100_000), "more than 100 levels deep"),
    "int of 5,000 digits": (lambda: {"n": 10**4999}, "int of more than 4300 digits"),
    "nan": (lambda: [math.nan], "nan, which JSON cannot hold"),
    "inf": (lambda: {"x": math.inf}, "inf, which JSON cannot hold"),
    "a Mapping that raises": (_Broken, "raised RuntimeError: the backing file is gone"),
    "ToolResult.state holding itself": (
        lambda: ToolResult("ok", state={"graph": _cyclic_dict()}),
        "ToolResult.state['graph']",
    ),
}


def _bad_tools(make: Callable[[], object]) -> list[Any]:
    @tool
    def bad_sync() -> object:
        """Return what cannot be JSON, from a worker thread."""
        return make()

    @tool
    async def bad_async() -> object:
        """Return what cannot be JSON, from the event loop."""
        return make()

    return [bad_sync, bad_async]


@pytest.mark.parametrize("bad", BAD_RESULTS)
@pytest.mark.parametrize("name", ["bad_sync", "bad_async"])
@pytest.mark.anyio
async def test_a_tool_result_that_is_not_json_is_an_error_result(
    bad: str, name: str, async_store: Any
) -> None:
    make, problem = BAD_RESULTS[bad]
    async with _opened(async_store):
        model = FakeModel([tool_call(name), "I will return plain data."])
        agent = Agent(model, tools=_bad_tools(make), store=async_store)
        state = _started()
        assert await agent.arun(state) == "I will return plain data."
        [entry] = results(state)
        assert entry.outcome == "error"
        assert entry.content.is_error
        text = entry.content.text
        assert f"Tool {name!r} returned a value" in text
        assert problem in text
        assert "Return a str, JSON data" in text
        # The model read it in its next request.
        assert model.requests[1].messages[-1].tool_results[0].text == text
        _same(await async_store.aload(state.id), state)


# -- item 8: state.set and extra_data name the key path ------------------------------------------


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (_cyclic_dict(), "holds itself"),
        (_nested(100_000), "more than 100 levels deep"),
        (10**4999, "int of more than 4300 digits"),
        (math.nan, "nan, which JSON cannot hold"),
    ],
    ids=["cyclic", "100,000-deep", "5,000 digits", "nan"],
)
def test_state_values_that_cannot_be_stored_raise_naming_the_key(
    value: object, problem: str
) -> None:
    state = State()
    with pytest.raises(TypeError, match=problem) as info:
        state.set("data", value)
    assert str(info.value).startswith("state['data']")
    with pytest.raises(TypeError, match=problem) as info:
        State(extra_data={"data": value})
    assert str(info.value).startswith("extra_data['data']")
    with pytest.raises(TypeError, match=problem), state.edit_extra_data() as data:
        data["data"] = value
    assert len(state.history) == 0  # nothing was recorded


def test_values_at_the_depth_limit_save_and_load_on_every_sync_store(
    sync_store: SyncStore,
) -> None:
    @tool
    def take(value: Any) -> ToolResult:
        """Take a deep value and store it too."""
        return ToolResult("ok", state={"from_tool": value})

    state = _started()
    deepest = _nested(DEPTH)
    model = FakeModel([tool_call("take", value=deepest), "done"])
    Agent(model, tools=[take]).run(state)
    assert state.get("from_tool") == deepest
    # A value wrapped once more each time stops at the limit instead of growing past it.
    state.set("chain", _nested(DEPTH - 1))
    state.set("chain", [state.get("chain")])
    with pytest.raises(TypeError, match="more than 100 levels deep"):
        state.set("chain", [state.get("chain")])
    sync_store.save(state)
    loaded = sync_store.load(state.id)
    _same(loaded, state)
    assert loaded.get("chain") == deepest


@pytest.mark.anyio
async def test_an_int_this_process_cannot_write_is_an_error_result(async_store: Any) -> None:
    # An app may lower Python's own limit below the one a State keeps (4300 digits).
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(1000)
    try:
        async with _opened(async_store):
            model = FakeModel([tool_call("bad_async"), "ok"])
            tools = _bad_tools(lambda: [10**2000])
            state = _started()
            assert await Agent(model, tools=tools, store=async_store).arun(state) == "ok"
            [entry] = results(state)
            assert entry.outcome == "error"
            assert "could not be written as JSON" in entry.content.text
            _same(await async_store.aload(state.id), state)
    finally:
        sys.set_int_max_str_digits(limit)
