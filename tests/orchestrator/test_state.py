"""`State`: every property, method and error of its reference page (seed 004)."""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import anyio
import anyio.lowlevel
import pytest
from pydantic import BaseModel

from orchestrator import (
    Agent,
    ExtraDataEntry,
    FrozenDict,
    FrozenList,
    HistoryEntry,
    Image,
    Message,
    ModelReplyEntry,
    NoticeEntry,
    ReasoningBlock,
    Reply,
    RunStart,
    State,
    StateSnapshot,
    StoppedByFinish,
    StoppedByLimit,
    TextBlock,
    ToolCall,
    ToolResult,
    ToolResultBlock,
    ToolResultEntry,
    Usage,
    UserEntry,
    tool,
)

# Private: the recording functions an Agent records a turn with; these tests drive a State
# through them by hand. They have no public name.
from orchestrator._record._recording import (
    add_child,
    begin_think,
    compaction,
    record_reply,
    record_run_start,
    record_stop,
    record_tool_result,
)
from orchestrator.testing import FakeModel, tool_call
from stores.backend import bind_state
from tests.doubles import Color, assert_replays, block, call

CLEARED = "(cleared: kept in history)"
PNG = Image(b"\x89PNG\r\n\x1a\n", "image/png")

# Helpers --------------------------------------------------------------------------------------


def assert_unchanged(state: State, before: StateSnapshot) -> None:
    """The State has exactly the value (and history length) it had before a rejected call."""
    assert state.snapshot() == before
    assert len(state.history) == len(before.history)
    assert state.messages == before.messages
    assert state.extra_data == before.extra_data


def open_turn(state: State, *calls: ToolCall, text: str = "") -> None:
    """A think whose reply requests `calls` (which stay pending)."""
    begin_think(state, model="fake")
    record_reply(state, Reply(Message.assistant(text, calls), Usage(input_tokens=1, requests=1)))


def result(state: State, tool_call: ToolCall, text: str = "ok", **kwargs: Any) -> None:
    """Record a `done` result for `tool_call`."""
    record_tool_result(state, tool_call, block(tool_call.id, text), outcome="done", **kwargs)


def reply(state: State, text: str, usage: Usage | None = None) -> None:
    """A whole think that ends with a text reply without tool calls."""
    begin_think(state, model="fake")
    record_reply(state, Reply(Message.assistant(text), usage or Usage()))


def parent_of(child_id: str) -> State:
    """A State one of whose tool calls started the subagent `child_id`."""
    state = State(messages=[Message.user("delegate")])
    delegate = call("d1", "delegate", task="look")
    open_turn(state, delegate)
    result(state, delegate, "found it", child_ids=(child_id,))
    return state


def child_of(parent: State, child_id: str) -> State:
    """The subagent State `child_id`, linked to `parent` by its first run_start."""
    child = State(id=child_id, messages=[Message.user("look")])
    record_run_start(child, RunStart(parent_id=parent.id, parent_call_id="d1"))
    child.finish("the bug is in b.py")
    return child


class MissingStateError(LookupError):
    """What the fake stores raise for an id they do not hold."""


class FakeStore:
    """A synchronous store holding histories by id."""

    async_only = False

    def __init__(self, *states: State) -> None:
        self.saved: dict[str, tuple[HistoryEntry, ...]] = {s.id: s.history for s in states}
        self.loads: list[str] = []

    def load(self, state_id: str) -> State:
        self.loads.append(state_id)
        if state_id not in self.saved:
            raise MissingStateError(state_id)
        return State(id=state_id, history=self.saved[state_id])

    async def aload(self, state_id: str) -> State:
        await anyio.lowlevel.checkpoint()
        return self.load(state_id)


class AsyncOnlyStore:
    """A store that works only asynchronously."""

    async_only = True

    def __init__(self, *states: State) -> None:
        self.saved: dict[str, tuple[HistoryEntry, ...]] = {s.id: s.history for s in states}
        self.loads: list[str] = []

    def load(self, state_id: str) -> State:
        raise AssertionError("an async-only store must not be loaded synchronously")

    async def aload(self, state_id: str) -> State:
        await anyio.lowlevel.checkpoint()
        self.loads.append(state_id)
        if state_id not in self.saved:
            raise MissingStateError(state_id)
        return State(id=state_id, history=self.saved[state_id])


@pytest.fixture
def busy() -> State:
    """A State with a few turns behind it, extra data and two tool results."""
    state = State(messages=[Message.user("Find the bug")], extra_data={"repo": "api"})
    first = call("c1", "read", path="a.py")
    open_turn(state, first)
    result(state, first, "contents of a.py")
    second = call("c2", "read", path="b.py")
    open_turn(state, second)
    result(state, second, "contents of b.py")
    reply(state, "The bug is in b.py")
    return state


# Constructor ----------------------------------------------------------------------------------


def test_empty_state_has_no_history_and_default_values() -> None:
    state = State()
    assert state.history == ()
    assert state.messages == ()
    assert state.pending_calls == ()
    assert state.turn == 0
    assert state.usage == Usage()
    assert state.extra_data == {}
    assert state.finished is False
    assert state.answer is None
    assert state.stopped is None
    assert state.parent_id is None
    assert state.parent_call_id is None
    assert state.created_at is None
    assert state.updated_at is None


def test_messages_are_recorded_as_one_import_entry() -> None:
    first, second = Message.user("hello"), Message.assistant("hi there")
    state = State(messages=[first, second])
    assert state.messages == (first, second)
    assert len(state.history) == 1
    entry = state.history[0]
    assert entry.kind == "context_change"
    assert entry.content.kind == "import"
    assert entry.content.messages == (first, second)
    assert entry.seq == 0


def test_messages_accept_any_iterable_and_are_copied() -> None:
    given = [Message.user("one")]
    state = State(messages=iter(given))
    given.append(Message.user("two"))
    assert state.messages == (Message.user("one"),)


def test_extra_data_is_recorded_as_one_entry_and_copied() -> None:
    given: dict[str, Any] = {"repo": "api", "notes": [1, 2]}
    state = State(messages=[Message.user("x")], extra_data=given)
    given["notes"].append(3)
    given["repo"] = "web"
    assert state.extra_data == {"repo": "api", "notes": [1, 2]}
    assert [entry.kind for entry in state.history] == ["context_change", "extra_data"]
    entry = state.history[1]
    assert isinstance(entry, ExtraDataEntry)
    assert entry.content.changed == {"repo": "api", "notes": [1, 2]}


def test_history_rebuilds_an_equal_state() -> None:
    source = State(messages=[Message.user("x")], extra_data={"k": [1]})
    source.add_message(Message.notice("careful"))
    rebuilt = State(history=source.history)
    assert rebuilt.snapshot() == source.snapshot()
    assert rebuilt.history == source.history
    assert rebuilt.id != source.id


def test_history_rebuild_keeps_a_given_id() -> None:
    source = State(messages=[Message.user("x")])
    assert State(id="saved-1", history=source.history).id == "saved-1"


@pytest.mark.parametrize("value", ["a", "A-z_09", "x" * 128, "0", "under_score", "da-sh"])
def test_valid_ids_are_kept(value: str) -> None:
    assert State(id=value).id == value


def test_random_ids_are_distinct_and_valid() -> None:
    ids = {State().id for _ in range(20)}
    assert len(ids) == 20
    for value in ids:
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,128}", value)


@pytest.mark.parametrize("value", ["../x", "a b", "x" * 129, "é", "café", "", "a/b", "a.b", "a\n"])
def test_invalid_ids_raise_value_error(value: str) -> None:
    with pytest.raises(ValueError, match="id"):
        State(id=value)


@pytest.mark.parametrize("value", [123, b"abc", ["a"], 1.5])
def test_non_str_ids_raise_type_error(value: object) -> None:
    with pytest.raises(TypeError, match="id"):
        State(id=cast("Any", value))


def test_positional_arguments_raise_type_error() -> None:
    make: Any = State
    with pytest.raises(TypeError, match="keyword"):
        make([Message.user("hi")])
    with pytest.raises(TypeError):
        make("my-id")


@pytest.mark.parametrize(
    ("keyword", "replacement"),
    [("task", "messages="), ("context", "messages="), ("data", "extra_data=")],
)
def test_keywords_of_0_4_name_their_replacement(keyword: str, replacement: str) -> None:
    make: Any = State
    with pytest.raises(TypeError) as raised:
        make(**{keyword: "x"})
    message = str(raised.value)
    assert f"{keyword}=" in message
    assert replacement in message


def test_a_typo_keyword_gets_did_you_mean() -> None:
    make: Any = State
    with pytest.raises(TypeError, match=r"(?i)did you mean messages="):
        make(mesages=[Message.user("x")])
    with pytest.raises(TypeError, match=r"(?i)did you mean extra_data="):
        make(extra_dta={})


def test_an_unknown_keyword_is_named() -> None:
    make: Any = State
    with pytest.raises(TypeError, match="zzz"):
        make(zzz=1)


@pytest.mark.parametrize("value", ["text", b"bytes", Message.user("one message")])
def test_messages_that_are_not_a_list_raise_type_error(value: object) -> None:
    with pytest.raises(TypeError, match="Message"):
        State(messages=cast("Any", value))


def test_a_messages_item_that_is_not_a_message_raises_type_error() -> None:
    with pytest.raises(TypeError, match=r"messages\[1\]"):
        State(messages=cast("Any", [Message.user("ok"), "not a message"]))
    with pytest.raises(TypeError):
        State(messages=cast("Any", [{"role": "user", "content": "hi"}]))


class _Opaque:
    pass


@pytest.mark.parametrize(
    ("extra", "path"),
    [
        ({"tags": {"a", "b"}}, "extra_data['tags']"),
        ({"score": float("nan")}, "extra_data['score']"),
        ({"score": float("inf")}, "extra_data['score']"),
        ({"thing": _Opaque()}, "extra_data['thing']"),
        ({"outer": {"inner": [1, {2}]}}, "extra_data['outer']['inner'][1]"),
        ({"outer": {1: "x"}}, "extra_data['outer']"),
        ({"when": datetime(2024, 1, 1, tzinfo=UTC)}, "extra_data['when']"),
    ],
)
def test_extra_data_that_is_not_json_raises_type_error_naming_the_key(
    extra: dict[str, Any], path: str
) -> None:
    with pytest.raises(TypeError) as raised:
        State(extra_data=extra)
    assert path in str(raised.value)


def test_extra_data_with_a_non_str_key_raises_type_error() -> None:
    with pytest.raises(TypeError, match="key 1"):
        State(extra_data=cast("Any", {1: "x"}))


def test_history_cannot_be_combined_with_messages_or_extra_data() -> None:
    source = State(messages=[Message.user("x")])
    with pytest.raises(TypeError, match="history"):
        State(history=source.history, messages=[Message.user("y")])
    with pytest.raises(TypeError, match="history"):
        State(history=source.history, extra_data={"k": 1})


@pytest.mark.parametrize("items", [["not an entry"], [1], [Message.user("x")], [None]])
def test_history_items_that_are_not_entries_raise_type_error(items: list[object]) -> None:
    with pytest.raises(TypeError, match=r"history\[0\]"):
        State(history=cast("Any", items))


def test_history_given_as_a_str_raises_type_error() -> None:
    with pytest.raises(TypeError):
        State(history=cast("Any", "entries"))


def test_inconsistent_history_raises_value_error_naming_the_index() -> None:
    source = State(messages=[Message.user("x")], extra_data={"k": 1})
    source.add_message(Message.user("y"))
    entries = source.history
    with pytest.raises(ValueError, match=r"history\[1\]"):
        State(history=(entries[0], entries[2], entries[1]))


# Properties -----------------------------------------------------------------------------------


def test_parent_links_come_from_the_first_run_start_and_survive_a_reload() -> None:
    parent = parent_of("kid")
    child = child_of(parent, "kid")
    assert child.parent_id == parent.id
    assert child.parent_call_id == "d1"
    reloaded = State(id=child.id, history=child.history)
    assert reloaded.parent_id == parent.id
    assert reloaded.parent_call_id == "d1"


def test_a_state_no_tool_call_started_has_no_parent() -> None:
    state = State(messages=[Message.user("x")])
    record_run_start(state, RunStart())
    assert state.parent_id is None
    assert state.parent_call_id is None


def test_history_is_an_append_only_tuple_of_numbered_entries(busy: State) -> None:
    before = busy.history
    assert isinstance(before, tuple)
    assert [entry.seq for entry in before] == list(range(len(before)))
    busy.compact("b.py has the bug")
    after = busy.history
    assert after[: len(before)] == before
    assert len(after) == len(before) + 1


def test_history_entries_narrow_on_kind(busy: State) -> None:
    replies = [entry for entry in busy.history if entry.kind == "model_reply"]
    results = [entry for entry in busy.history if entry.kind == "tool_result"]
    assert all(isinstance(entry, ModelReplyEntry) for entry in replies)
    assert all(isinstance(entry, ToolResultEntry) for entry in results)
    assert [entry.call.name for entry in results if entry.kind == "tool_result"] == [
        "read",
        "read",
    ]
    assert [entry.outcome for entry in results if entry.kind == "tool_result"] == ["done", "done"]


def test_entry_times_are_utc_and_drive_created_and_updated_at(busy: State) -> None:
    history = busy.history
    assert all(entry.at.tzinfo is not None for entry in history)
    assert all(entry.at.utcoffset() == UTC.utcoffset(None) for entry in history)
    assert busy.created_at == history[0].at
    assert busy.updated_at == history[-1].at
    created = busy.created_at
    with busy.edit_extra_data() as data:
        data["moved"] = True
    assert busy.created_at == created
    assert busy.updated_at == busy.history[-1].at
    assert busy.history[-1].kind == "extra_data"


def test_extra_data_property_is_read_only() -> None:
    state = State(extra_data={"notes": {"bug": "b.py"}, "list": [1]})
    before = state.snapshot()
    extra: Any = state.extra_data
    with pytest.raises(TypeError):
        extra["x"] = 1
    with pytest.raises(TypeError):
        del extra["list"]
    with pytest.raises(TypeError):
        extra["notes"]["bug"] = "c.py"
    with pytest.raises(TypeError):
        extra["list"].append(2)
    with pytest.raises(TypeError):
        extra.update({"x": 1})
    assert_unchanged(state, before)


def test_turn_counts_replies_and_the_waiting_request() -> None:
    state = State(messages=[Message.user("x")])
    begin_think(state)
    assert state.turn == 1
    record_reply(state, Reply(Message.assistant("a")))
    assert state.turn == 1
    reply(state, "b")
    assert state.turn == 2


def test_answer_is_the_latest_text_reply_unless_finish_gave_one() -> None:
    state = State(messages=[Message.user("x")])
    assert state.answer is None
    reply(state, "first")
    assert state.answer == "first"
    lookup = call("c1")
    open_turn(state, lookup, text="let me look")
    assert state.answer == "first"
    result(state, lookup)
    reply(state, "second")
    assert state.answer == "second"
    state.finish({"verdict": "b.py"})
    assert state.answer == {"verdict": "b.py"}


def test_properties_read_the_same_values_as_snapshot(busy: State) -> None:
    snap = busy.snapshot()
    assert snap.history == busy.history
    assert snap.messages == busy.messages
    assert snap.pending_calls == busy.pending_calls
    assert snap.turn == busy.turn
    assert snap.usage == busy.usage
    assert snap.extra_data == busy.extra_data
    assert snap.finished == busy.finished
    assert snap.answer == busy.answer
    assert snap.stopped == busy.stopped
    assert snap.created_at == busy.created_at
    assert snap.updated_at == busy.updated_at


# snapshot -------------------------------------------------------------------------------------


SNAPSHOT_FIELDS = [
    "history",
    "messages",
    "pending_calls",
    "turn",
    "usage",
    "extra_data",
    "finished",
    "answer",
    "stopped",
    "created_at",
    "updated_at",
]


def test_snapshot_has_exactly_the_public_fields() -> None:
    # Seed 004 lists history..updated_at; DESIGN 5: "exactly the listed public fields", so
    # dataclasses.fields and asdict expose (and deep-copy) no internals.
    assert [f.name for f in dataclasses.fields(StateSnapshot)] == SNAPSHOT_FIELDS
    snapshot = State(messages=[Message.user("hi")], extra_data={"k": 1}).snapshot()
    assert list(dataclasses.asdict(snapshot)) == SNAPSHOT_FIELDS


def test_snapshot_defaults_are_the_documented_ones() -> None:
    # Seed 004: history=(), messages=(), pending_calls=(), turn=0, usage=Usage(),
    # extra_data=FrozenDict(), finished=False, answer=None, stopped=None, times None.
    empty = StateSnapshot()
    assert empty == State().snapshot()
    assert (empty.created_at, empty.updated_at) == (None, None)
    with pytest.raises(TypeError):
        empty.extra_data["x"] = 1  # read-only


def test_snapshot_is_frozen_and_never_changes(busy: State) -> None:
    snap = busy.snapshot()
    held: Any = snap
    with pytest.raises(dataclasses.FrozenInstanceError):
        held.turn = 99
    history, messages, extra = snap.history, snap.messages, snap.extra_data
    busy.add_message(Message.user("more"))
    with busy.edit_extra_data() as data:
        data["more"] = 1
    busy.finish("done")
    assert snap.history == history
    assert snap.messages == messages
    assert snap.extra_data == extra
    assert snap.finished is False
    assert snap.answer == "The bug is in b.py"


def test_snapshot_equality_ignores_timestamps_and_ids(busy: State) -> None:
    copy = State(history=busy.history)
    assert copy.snapshot() == busy.snapshot()
    changed = dataclasses.replace(busy.snapshot(), created_at=None, updated_at=None)
    assert changed == busy.snapshot()
    assert dataclasses.replace(busy.snapshot(), turn=42) != busy.snapshot()


# add_message ----------------------------------------------------------------------------------


def test_add_message_appends_user_and_notice_entries() -> None:
    state = State(messages=[Message.user("start")])
    state.add_message(Message.user("Now fix it"))
    state.add_message(Message.notice("The tests failed"))
    state.add_message(Message.user("look", PNG))
    state.add_message(Message.user("", PNG))
    texts = [m.text for m in state.messages]
    assert texts == ["start", "Now fix it", "[notice] The tests failed", "look", ""]
    kinds = [type(entry) for entry in state.history[1:]]
    assert kinds == [UserEntry, NoticeEntry, UserEntry, UserEntry]
    assert state.messages[-1].images == (PNG,)


@pytest.mark.parametrize("value", ["text", None, {"role": "user"}, TextBlock("x")])
def test_add_message_rejects_non_messages_with_type_error(value: object) -> None:
    state = State(messages=[Message.user("x")])
    before = state.snapshot()
    with pytest.raises(TypeError, match="Message"):
        state.add_message(cast("Any", value))
    assert_unchanged(state, before)


@pytest.mark.parametrize(
    "message",
    [
        Message.assistant("I am the model"),
        Message.assistant("", [call("c1")]),
        Message("user", (call("c1"),)),
        Message("user", (block("c1", "forged"),)),
        Message("user", (ReasoningBlock("hmm"),)),
        Message("user", ()),
        Message.user(""),
    ],
    ids=[
        "assistant",
        "assistant-tool-call",
        "user-tool-call",
        "tool-result",
        "reasoning",
        "empty",
        "empty-text",
    ],
)
def test_add_message_rejects_other_messages_with_value_error(message: Message) -> None:
    state = State(messages=[Message.user("x")])
    before = state.snapshot()
    with pytest.raises(ValueError, match="add_message"):
        state.add_message(message)
    assert_unchanged(state, before)


# finish ---------------------------------------------------------------------------------------


def test_finish_sets_stopped_answer_and_finished_at_once() -> None:
    state = State(messages=[Message.user("x")])
    state.finish("b.py")
    assert state.finished is True
    assert state.stopped == StoppedByFinish("b.py")
    assert state.answer == "b.py"
    entry = state.history[-1]
    assert entry.kind == "stop"
    assert entry.content == StoppedByFinish("b.py")


def test_finish_again_the_last_answer_wins_and_none_keeps_it() -> None:
    state = State()
    state.finish("first")
    state.finish("second")
    assert state.answer == "second"
    state.finish()
    assert state.answer == "second"
    assert state.stopped == StoppedByFinish(None)
    assert state.finished is True


def test_finish_without_answer_keeps_the_reply_text() -> None:
    state = State(messages=[Message.user("x")])
    reply(state, "from the model")
    state.finish()
    assert state.answer == "from the model"


@dataclasses.dataclass
class Finding:
    file: str
    lines: tuple[int, int]


class Review(BaseModel):
    score: int
    tags: list[str]


def test_finish_turns_dataclasses_models_and_tuples_into_json() -> None:
    state = State()
    state.finish(Finding("b.py", (3, 9)))
    answer: Any = state.answer
    assert answer == {"file": "b.py", "lines": [3, 9]}
    assert isinstance(answer, dict)
    assert isinstance(answer["lines"], list)
    state.finish(Review(score=4, tags=["bug"]))
    answer = state.answer
    assert answer == {"score": 4, "tags": ["bug"]}
    assert Review(**answer) == Review(score=4, tags=["bug"])
    state.finish((1, "two"))
    assert state.answer == [1, "two"]
    assert json.loads(json.dumps(state.answer)) == [1, "two"]


@pytest.mark.parametrize(
    "answer",
    [{1, 2}, Path("a.py"), datetime(2024, 1, 1, tzinfo=UTC), Color.RED, b"bytes", float("nan")],
    ids=["set", "path", "datetime", "enum", "bytes", "nan"],
)
def test_finish_with_a_non_json_answer_raises_type_error(answer: object) -> None:
    state = State(messages=[Message.user("x")])
    before = state.snapshot()
    with pytest.raises(TypeError):
        state.finish(answer)
    assert_unchanged(state, before)
    assert state.finished is False


def test_finish_rejects_non_json_inside_a_frozen_dict() -> None:
    # A FrozenDict is a public type; what it holds must still be JSON to be recorded.
    state = State()
    before = state.snapshot()
    with pytest.raises(TypeError):
        state.finish(FrozenDict({"tags": {"a", "b"}}))
    assert_unchanged(state, before)


def test_finish_works_while_calls_are_pending() -> None:
    state = State(messages=[Message.user("x")])
    submit, other = call("c1", "submit"), call("c2", "other")
    open_turn(state, submit, other)
    state.finish({"done": True})
    assert state.finished is True
    assert state.pending_calls == (submit, other)
    result(state, submit)
    result(state, other)
    assert state.pending_calls == ()
    assert state.answer == {"done": True}


def test_a_finished_state_cannot_think_until_restored() -> None:
    state = State(messages=[Message.user("x")])
    before = state.snapshot()
    state.finish("done")
    finished = state.snapshot()
    with pytest.raises(ValueError, match="finished"):
        begin_think(state)
    assert_unchanged(state, finished)
    state.restore(before)
    assert state.finished is False
    assert state.stopped is None
    assert state.answer is None
    begin_think(state)
    assert state.turn == 1


# compact --------------------------------------------------------------------------------------


def test_compact_keeps_the_first_user_message_and_the_summary(busy: State) -> None:
    full = busy.history
    busy.compact("The bug is in b.py, line 3.")
    assert len(busy.messages) == 2
    assert busy.messages[0] == Message.user("Find the bug")
    assert busy.messages[1].role == "user"
    assert "The bug is in b.py, line 3." in busy.messages[1].text
    assert busy.history[: len(full)] == full
    entry = busy.history[-1]
    assert entry.kind == "context_change"
    assert entry.content.kind == "compact"
    assert entry.content.summary == "The bug is in b.py, line 3."


@pytest.mark.parametrize("summary", [None, 3, b"bytes", ["a"]])
def test_compact_with_a_non_str_summary_raises_type_error(busy: State, summary: object) -> None:
    before = busy.snapshot()
    with pytest.raises(TypeError):
        busy.compact(cast("Any", summary))
    assert_unchanged(busy, before)


@pytest.mark.parametrize("summary", ["", "   ", "\n\t"])
def test_compact_with_an_empty_summary_raises_value_error(busy: State, summary: str) -> None:
    before = busy.snapshot()
    with pytest.raises(ValueError, match="empty summary"):
        busy.compact(summary)
    assert_unchanged(busy, before)


def test_compact_while_calls_are_pending_raises_value_error(busy: State) -> None:
    open_turn(busy, call("c9"))
    before = busy.snapshot()
    with pytest.raises(ValueError, match="pending"):
        busy.compact("summary")
    assert_unchanged(busy, before)


# clear_tool_results ---------------------------------------------------------------------------


def _results_of(state: State) -> list[ToolResultBlock]:
    return [block for message in state.messages for block in message.tool_results]


def _state_with_results(count: int) -> State:
    state = State(messages=[Message.user("x")])
    for index in range(count):
        tool_call = call(f"c{index}", "shot")
        open_turn(state, tool_call)
        block = ToolResultBlock(tool_call.id, (TextBlock(f"result {index}"), PNG))
        record_tool_result(state, tool_call, block, outcome="done")
    return state


def test_clear_tool_results_blanks_all_but_the_last_ones() -> None:
    state = _state_with_results(4)
    full = [entry.content for entry in state.history if entry.kind == "tool_result"]
    state.clear_tool_results(keep_last=1)
    blocks = _results_of(state)
    assert [block.content for block in blocks[:3]] == [(TextBlock(CLEARED),)] * 3
    assert blocks[3].content == (TextBlock("result 3"), PNG)
    assert [block.call_id for block in blocks] == ["c0", "c1", "c2", "c3"]
    assert [entry.content for entry in state.history if entry.kind == "tool_result"] == full
    entry = state.history[-1]
    assert entry.kind == "context_change"
    assert entry.content.kind == "clear_tool_results"
    assert entry.content.keep_last == 1


def test_clear_tool_results_defaults_to_keeping_five() -> None:
    state = _state_with_results(7)
    state.clear_tool_results()
    texts = [block.text for block in _results_of(state)]
    assert texts == [CLEARED, CLEARED] + [f"result {i}" for i in range(2, 7)]


def test_clear_tool_results_records_nothing_when_nothing_changes() -> None:
    state = _state_with_results(3)
    before = state.snapshot()
    state.clear_tool_results(keep_last=3)
    state.clear_tool_results(keep_last=10)
    assert_unchanged(state, before)
    state.clear_tool_results(keep_last=1)
    after = state.snapshot()
    # The cleared ones still count toward keep_last, so keeping 2 changes nothing now.
    state.clear_tool_results(keep_last=2)
    assert_unchanged(state, after)
    state.clear_tool_results(keep_last=0)
    assert [block.text for block in _results_of(state)] == [CLEARED] * 3
    assert len(state.history) == len(after.history) + 1


@pytest.mark.parametrize("keep_last", [-1, 1.5, True, "2", None])
def test_clear_tool_results_with_a_bad_keep_last_raises_value_error(keep_last: object) -> None:
    state = _state_with_results(2)
    before = state.snapshot()
    with pytest.raises(ValueError, match="keep_last"):
        state.clear_tool_results(cast("Any", keep_last))
    assert_unchanged(state, before)


def test_clear_tool_results_while_calls_are_pending_raises_value_error() -> None:
    state = _state_with_results(3)
    open_turn(state, call("late"))
    before = state.snapshot()
    with pytest.raises(ValueError, match="pending"):
        state.clear_tool_results(0)
    assert_unchanged(state, before)


# edit_extra_data ------------------------------------------------------------------------------


def test_edit_extra_data_records_one_entry_with_changes_and_removals() -> None:
    state = State(extra_data={"draft": "x", "keep": 1})
    with state.edit_extra_data() as data:
        assert type(data) is dict
        data.setdefault("notes", {})["bug"] = "b.py"
        data["notes"]["lines"] = [3]
        data.pop("draft", None)
    assert state.extra_data == {"keep": 1, "notes": {"bug": "b.py", "lines": [3]}}
    assert len(state.history) == 2
    entry = state.history[-1]
    assert entry.kind == "extra_data"
    assert entry.content.changed == {"notes": {"bug": "b.py", "lines": [3]}}
    assert list(entry.content.removed) == ["draft"]


def test_edit_extra_data_gives_an_editable_deep_copy() -> None:
    state = State(extra_data={"list": [1], "nested": {"a": {"b": 1}}})
    with state.edit_extra_data() as data:
        data["list"].append(2)
        data["nested"]["a"]["b"] = 2
        assert state.extra_data == {"list": [1], "nested": {"a": {"b": 1}}}
    assert state.extra_data == {"list": [1, 2], "nested": {"a": {"b": 2}}}


def test_edit_extra_data_records_nothing_when_nothing_changed() -> None:
    state = State(extra_data={"n": 1})
    before = state.snapshot()
    with state.edit_extra_data() as data:
        data["n"] = 2
        data["n"] = 1
    with state.edit_extra_data():
        pass
    assert_unchanged(state, before)


def test_edit_extra_data_that_raises_changes_nothing() -> None:
    state = State(extra_data={"n": 1})
    before = state.snapshot()

    def edit() -> None:
        with state.edit_extra_data() as data:
            data["n"] = 2
            data["m"] = 3
            raise KeyError("oops")

    with pytest.raises(KeyError, match="oops"):
        edit()
    assert_unchanged(state, before)


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({1, 2}, "extra_data['bad']"),
        (_Opaque(), "extra_data['bad']"),
        (float("nan"), "extra_data['bad']"),
        ({"inner": {3}}, "extra_data['bad']['inner']"),
        ({1: "x"}, "extra_data['bad']"),
    ],
    ids=["set", "object", "nan", "nested-set", "int-key"],
)
def test_edit_extra_data_with_a_non_json_value_raises_type_error_naming_the_key(
    value: object, path: str
) -> None:
    state = State(extra_data={"n": 1})
    before = state.snapshot()

    def edit() -> None:
        with state.edit_extra_data() as data:
            data["n"] = 2
            data["bad"] = value

    with pytest.raises(TypeError) as raised:
        edit()
    assert path in str(raised.value)
    assert_unchanged(state, before)


def test_edit_extra_data_with_a_non_str_top_level_key_raises_type_error() -> None:
    state = State(extra_data={"n": 1})
    before = state.snapshot()
    with pytest.raises(TypeError, match="key 7"), state.edit_extra_data() as data:
        cast("dict[Any, Any]", data)[7] = "x"
    assert_unchanged(state, before)


# fork -----------------------------------------------------------------------------------------


def test_fork_has_the_same_value_and_a_new_id(busy: State) -> None:
    copy = busy.fork()
    assert copy.id != busy.id
    assert copy.snapshot() == busy.snapshot()
    assert copy.history == busy.history


def test_fork_is_independent(busy: State) -> None:
    before = busy.snapshot()
    copy = busy.fork()
    copy.add_message(Message.user("try the other approach"))
    with copy.edit_extra_data() as data:
        data["attempt"] = 2
    reply(copy, "another answer")
    copy.finish("other")
    assert_unchanged(busy, before)
    busy.add_message(Message.user("original goes on"))
    assert copy.messages[-2].text == "try the other approach"
    assert copy.extra_data["attempt"] == 2


def test_fork_of_a_finished_state_is_finished(busy: State) -> None:
    busy.finish("done")
    copy = busy.fork()
    assert copy.finished is True
    assert copy.answer == "done"
    with pytest.raises(ValueError, match="finished"):
        begin_think(copy)


def test_fork_while_calls_are_pending_is_allowed(busy: State) -> None:
    pending = call("c9")
    open_turn(busy, pending)
    copy = busy.fork()
    assert copy.snapshot() == busy.snapshot()
    result(copy, pending)
    assert busy.pending_calls == (pending,)
    assert copy.pending_calls == ()


def test_fork_while_the_model_is_waited_on_raises_value_error(busy: State) -> None:
    begin_think(busy)
    before = busy.snapshot()
    with pytest.raises(ValueError, match="waited on"):
        busy.fork()
    assert_unchanged(busy, before)
    # A plain replay of that snapshot is still allowed.
    assert State(history=before.history).snapshot() == before


def test_fork_shares_the_children_in_memory() -> None:
    parent = parent_of("kid")
    kid = child_of(parent, "kid")
    add_child(parent, kid)
    copy = parent.fork()
    assert copy.child("kid") is kid
    assert kid.snapshot() == kid.fork().snapshot()


def test_fork_of_a_loaded_state_opens_children_from_that_store() -> None:
    parent = parent_of("kid")
    kid = child_of(parent, "kid")
    store = FakeStore(parent, kid)
    loaded = store.load(parent.id)
    bind_state(loaded, store)
    copy = loaded.fork()
    opened = copy.child("kid")
    assert opened.id == "kid"
    assert opened.snapshot() == kid.snapshot()


# child / achild -------------------------------------------------------------------------------


def test_children_lists_child_ids_in_history_order_once_each() -> None:
    state = State(messages=[Message.user("delegate")])
    assert state.children == ()
    first, second = call("d1", "delegate", task="a"), call("d2", "delegate", task="b")
    open_turn(state, first, second)
    result(state, second, "b done", child_ids=("kid_b1", "kid_b2"))
    result(state, first, "a done", child_ids=("kid_a",))
    assert state.children == ("kid_b1", "kid_b2", "kid_a")
    assert State(history=state.history).children == state.children


def test_children_of_a_state_without_subagents_is_empty(busy: State) -> None:
    assert busy.children == ()


def test_child_in_memory_is_the_very_same_object() -> None:
    parent = parent_of("kid")
    kid = child_of(parent, "kid")
    add_child(parent, kid)
    assert parent.child("kid") is kid
    assert parent.child("kid") is parent.child("kid")
    assert parent.child("kid").answer == "the bug is in b.py"


def test_child_is_loaded_from_the_bound_store_and_not_cached() -> None:
    parent = parent_of("kid")
    kid = child_of(parent, "kid")
    store = FakeStore(kid)
    loaded = State(id=parent.id, history=parent.history)
    bind_state(loaded, store)
    first = loaded.child("kid")
    second = loaded.child("kid")
    assert first is not second
    assert first.snapshot() == kid.snapshot()
    assert first.parent_id == parent.id
    assert store.loads == ["kid", "kid"]


def test_child_of_an_unknown_id_raises_key_error() -> None:
    parent = parent_of("kid")
    grandchild_parent = parent_of("grandkid")
    store = FakeStore(grandchild_parent)
    bind_state(parent, store)
    before = parent.snapshot()
    with pytest.raises(KeyError):
        parent.child("stranger")
    with pytest.raises(KeyError):
        parent.child("grandkid")
    assert store.loads == []
    assert_unchanged(parent, before)


@pytest.mark.anyio
@pytest.mark.parametrize("child_id", ["no/such child", "x" * 200, "ü", "../escape"])
async def test_child_and_achild_of_a_malformed_id_raise_key_error(child_id: str) -> None:
    # Seed 004: KeyError is for any id that is not a child of this State, malformed or not;
    # ValueError only for "It is a child, but this State has no way to open it".
    state = State(messages=[Message.user("hi")])
    with pytest.raises(KeyError):
        state.child(child_id)
    with pytest.raises(KeyError):
        await state.achild(child_id)


def test_child_not_in_memory_without_a_store_raises_value_error() -> None:
    parent = parent_of("kid")
    loaded = State(history=parent.history)
    with pytest.raises(ValueError, match="kid"):
        loaded.child("kid")


def test_child_with_an_async_only_store_raises_type_error() -> None:
    parent = parent_of("kid")
    store = AsyncOnlyStore(child_of(parent, "kid"))
    bind_state(parent, store)
    with pytest.raises(TypeError, match="achild"):
        parent.child("kid")
    assert store.loads == []


def test_child_propagates_the_store_lookup_error() -> None:
    parent = parent_of("kid")
    store = FakeStore()
    bind_state(parent, store)
    with pytest.raises(MissingStateError):
        parent.child("kid")
    assert store.loads == ["kid"]


def test_grandchild_opens_through_its_parent() -> None:
    parent = parent_of("kid")
    kid = State(id="kid", history=parent_of("grandkid").history)
    grandkid = State(id="grandkid", messages=[Message.user("deep")])
    store = FakeStore(kid, grandkid)
    bind_state(parent, store)
    opened_kid = parent.child("kid")
    bind_state(opened_kid, store)
    assert opened_kid.child("grandkid").messages == (Message.user("deep"),)
    with pytest.raises(KeyError):
        parent.child("grandkid")


@pytest.mark.anyio
async def test_achild_loads_with_aload_and_does_not_cache() -> None:
    parent = parent_of("kid")
    kid = child_of(parent, "kid")
    store = AsyncOnlyStore(kid)
    bind_state(parent, store)
    first = await parent.achild("kid")
    second = await parent.achild("kid")
    assert first is not second
    assert first.snapshot() == kid.snapshot()
    assert store.loads == ["kid", "kid"]


@pytest.mark.anyio
async def test_achild_in_memory_is_the_very_same_object() -> None:
    parent = parent_of("kid")
    kid = child_of(parent, "kid")
    add_child(parent, kid)
    bind_state(parent, AsyncOnlyStore())
    assert await parent.achild("kid") is kid


@pytest.mark.anyio
async def test_achild_raises_the_same_errors_as_child() -> None:
    parent = parent_of("kid")
    with pytest.raises(KeyError):
        await parent.achild("stranger")
    with pytest.raises(ValueError, match="not in memory"):
        await State(history=parent.history).achild("kid")
    bind_state(parent, AsyncOnlyStore())
    with pytest.raises(MissingStateError):
        await parent.achild("kid")


@pytest.mark.anyio
async def test_achild_works_with_a_sync_store_too() -> None:
    parent = parent_of("kid")
    kid = child_of(parent, "kid")
    loaded = State(history=parent.history)
    bind_state(loaded, FakeStore(kid))
    assert (await loaded.achild("kid")).snapshot() == kid.snapshot()


# restore --------------------------------------------------------------------------------------


def test_restore_brings_every_value_back_but_usage_and_history(busy: State) -> None:
    before = busy.snapshot()
    busy.add_message(Message.user("try again"))
    reply(busy, "another", Usage(output_tokens=10, requests=1))
    with busy.edit_extra_data() as data:
        data["repo"] = "web"
    busy.finish("other")
    spent = busy.usage
    length = len(busy.history)
    busy.restore(before)
    assert busy.messages == before.messages
    assert busy.turn == before.turn
    assert busy.extra_data == before.extra_data
    assert busy.finished is False
    assert busy.answer == before.answer
    assert busy.stopped == before.stopped
    assert busy.usage == spent
    assert busy.usage != before.usage
    assert len(busy.history) == length + 1
    entry = busy.history[-1]
    assert entry.kind == "context_change"
    assert entry.content.kind == "restore"
    assert busy.snapshot() != before


def test_restore_brings_back_stopped() -> None:
    state = State(messages=[Message.user("x")])
    record_stop(state, StoppedByLimit(3))
    limited = state.snapshot()
    record_run_start(state, RunStart())
    assert state.stopped is None
    state.restore(limited)
    assert state.stopped == StoppedByLimit(3)


def test_restore_twice_to_the_same_snapshot() -> None:
    state = State(messages=[Message.user("x")])
    before = state.snapshot()
    state.add_message(Message.user("a"))
    state.restore(before)
    state.add_message(Message.user("b"))
    state.restore(before)
    assert state.messages == before.messages
    assert_replays(state)


@pytest.mark.parametrize("value", [None, "snapshot", {"history": ()}])
def test_restore_with_a_non_snapshot_raises_type_error(busy: State, value: object) -> None:
    before = busy.snapshot()
    with pytest.raises(TypeError, match="StateSnapshot"):
        busy.restore(cast("Any", value))
    assert_unchanged(busy, before)


def test_restore_with_a_snapshot_of_another_state_raises_value_error(busy: State) -> None:
    other = State(messages=[Message.user("Find the bug")])
    before = busy.snapshot()
    with pytest.raises(ValueError, match="not from this State"):
        busy.restore(other.snapshot())
    with pytest.raises(ValueError, match="not from this State"):
        busy.restore(StateSnapshot())
    assert_unchanged(busy, before)


def test_restore_with_a_snapshot_of_a_fork_raises_value_error(busy: State) -> None:
    copy = busy.fork()
    forked = copy.snapshot()
    busy.add_message(Message.user("more"))
    before = busy.snapshot()
    with pytest.raises(ValueError, match="not from this State"):
        busy.restore(forked)
    assert_unchanged(busy, before)


def test_restore_while_calls_are_pending_raises_value_error(busy: State) -> None:
    earlier = busy.snapshot()
    open_turn(busy, call("c9"))
    before = busy.snapshot()
    with pytest.raises(ValueError, match="pending"):
        busy.restore(earlier)
    assert_unchanged(busy, before)


def test_restore_while_the_model_is_waited_on_raises_value_error(busy: State) -> None:
    earlier = busy.snapshot()
    begin_think(busy)
    before = busy.snapshot()
    with pytest.raises(ValueError, match="waited on"):
        busy.restore(earlier)
    assert_unchanged(busy, before)


def test_restore_while_a_compaction_is_under_way_raises_value_error(busy: State) -> None:
    earlier = busy.snapshot()
    busy.add_message(Message.user("more"))
    before = busy.snapshot()
    with compaction(busy):
        with pytest.raises(ValueError, match="compaction"):
            busy.restore(earlier)
        assert_unchanged(busy, before)
    busy.restore(earlier)
    assert busy.messages == earlier.messages


def test_restore_to_a_snapshot_taken_while_waiting_raises_value_error(busy: State) -> None:
    begin_think(busy)
    waiting = busy.snapshot()
    record_reply(busy, Reply(Message.assistant("done")))
    before = busy.snapshot()
    with pytest.raises(ValueError, match="waited on"):
        busy.restore(waiting)
    assert_unchanged(busy, before)


@pytest.mark.anyio
async def test_restore_to_a_snapshot_with_pending_calls_forgets_undone_state_updates() -> None:
    # Seed 004 restore: "Every value goes back to what it was then"; DESIGN 5a: a tool's update
    # is recorded in its tool_result entry and applied when the turn's last result is recorded.
    # A result undone by restore must not be applied again.
    picks: list[str] = []

    @tool
    def pick(city: str) -> Any:
        picks.append(city)
        if len(picks) == 1:
            return ToolResult("picked", state={"city": city})
        return "not picked this time"

    agent = Agent(FakeModel([tool_call("pick", city="Paris")]), tools=[pick])
    state = State(messages=[Message.user("Pick a city")])
    await agent.athink(state)
    before = state.snapshot()  # after think returned: the seed's "between turns"
    await agent.ause_tools(state)
    assert state.get("city") == "Paris"
    state.restore(before)
    assert state.extra_data == {}
    assert len(state.pending_calls) == 1
    await agent.ause_tools(state)  # runs again; this time the tool updates nothing
    assert len(picks) == 2
    assert state.extra_data == {}
    assert_replays(state)


@pytest.mark.anyio
async def test_restore_to_a_snapshot_with_pending_calls_closes_the_turn_once_again() -> None:
    # Seed 004: "Results of this turn's tool calls go in together once the last call has a
    # result"; restore brings messages back, so only the new results go in.
    @tool
    def echo(text: str) -> str:
        return text

    agent = Agent(
        FakeModel([[tool_call("echo", text="a"), tool_call("echo", text="b")]]), tools=[echo]
    )
    state = State(messages=[Message.user("Echo")])
    await agent.athink(state)
    before = state.snapshot()
    await agent.ause_tools(state)
    state.restore(before)
    assert state.messages == before.messages
    await agent.ause_tools(state)
    assert state.pending_calls == ()
    assert len(state.messages) == 3
    (results,) = [m for m in state.messages if m.tool_results]
    assert [block.text for block in results.tool_results] == ["a", "b"]
    late = [e for e in state.history if isinstance(e, ToolResultEntry) and e.late]
    assert late == []
    assert_replays(state)


# Frozen values --------------------------------------------------------------------------------


def test_tool_call_args_in_history_are_frozen_json() -> None:
    state = State(messages=[Message.user("x")])
    edit = call("c1", "edit", path="a.py", lines=(1, 2), options={"dry": True})
    open_turn(state, edit)
    entry = next(e for e in state.history if e.kind == "model_reply")
    assert entry.kind == "model_reply"
    args: Any = entry.content.message.tool_calls[0].args
    assert args == {"path": "a.py", "lines": [1, 2], "options": {"dry": True}}
    assert isinstance(args["lines"], list)
    assert json.dumps(args, sort_keys=True) == (
        '{"lines": [1, 2], "options": {"dry": true}, "path": "a.py"}'
    )
    with pytest.raises(TypeError):
        args["path"] = "b.py"
    with pytest.raises(TypeError):
        args["lines"].append(3)
    with pytest.raises(TypeError):
        args["options"]["dry"] = False
    copy = dict(args)
    copy["path"] = "b.py"
    assert args["path"] == "a.py"
    assert state.pending_calls[0].args == {
        "path": "a.py",
        "lines": [1, 2],
        "options": {"dry": True},
    }


def test_answer_and_extra_data_in_history_are_frozen() -> None:
    state = State(extra_data={"notes": {"bug": ["b.py"]}})
    state.finish({"files": ["b.py"], "meta": {"line": 3}})
    answer: Any = state.answer
    with pytest.raises(TypeError):
        answer["files"] = []
    with pytest.raises(TypeError):
        answer["files"].append("c.py")
    with pytest.raises(TypeError):
        answer["meta"].pop("line")
    editable = dict(answer)
    editable["files"] = []
    assert state.answer == {"files": ["b.py"], "meta": {"line": 3}}
    recorded = state.history[0]
    assert recorded.kind == "extra_data"
    changed: Any = recorded.content.changed
    with pytest.raises(TypeError):
        changed["notes"]["bug"].append("c.py")
    assert isinstance(changed["notes"]["bug"], FrozenList)


def test_values_inside_frozen_containers_are_frozen_too() -> None:
    # FrozenDict/FrozenList are public: a plain list inside one must not stay editable.
    state = State()
    state.finish(FrozenDict({"files": ["b.py"]}))
    answer: Any = state.answer
    with pytest.raises(TypeError):
        answer["files"].append("c.py")
    assert state.answer == {"files": ["b.py"]}
