"""Values: Usage, Reply, the Stopped* values, history entries and the errors module."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pydantic
import pytest

import orchestrator
from orchestrator import (
    AskEntry,
    AskRecord,
    AuthError,
    ContextChange,
    ContextChangeEntry,
    ContextTooLongError,
    ErrorEntry,
    ExtraDataChange,
    ExtraDataEntry,
    FrozenDict,
    FrozenList,
    Issue,
    Message,
    ModelReplyEntry,
    ModelRequest,
    ModelRequestEntry,
    NoticeEntry,
    OrchestratorError,
    OutputError,
    ProviderError,
    RateLimitError,
    Reply,
    RunStart,
    RunStartEntry,
    State,
    StopEntry,
    StoppedByFinish,
    StoppedByLimit,
    StoppedByPermission,
    StoppedByUntil,
    ToolCall,
    ToolError,
    ToolResultBlock,
    ToolResultEntry,
    Usage,
    UserEntry,
    ValidationError,
)
from stores import decode_entry, encode_entry
from tests.doubles import as_any, is_a

T0 = datetime(2025, 1, 1, tzinfo=UTC)
T1 = T0 + timedelta(hours=3)

_COUNTS = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "requests",
    "reasoning_tokens",
)


# -- Usage -------------------------------------------------------------------------------------


def test_usage_defaults() -> None:
    usage = Usage()
    for name in _COUNTS:
        assert getattr(usage, name) == 0
    assert usage.cost is None


def test_usage_add_sums_every_field() -> None:
    a = Usage(
        input_tokens=1,
        output_tokens=2,
        cache_read_tokens=3,
        cache_write_tokens=4,
        requests=5,
        cost=0.25,
        reasoning_tokens=6,
    )
    b = Usage(
        input_tokens=10,
        output_tokens=20,
        cache_read_tokens=30,
        cache_write_tokens=40,
        requests=50,
        cost=0.5,
        reasoning_tokens=60,
    )
    total = a + b
    assert total == Usage(
        input_tokens=11,
        output_tokens=22,
        cache_read_tokens=33,
        cache_write_tokens=44,
        requests=55,
        cost=0.75,
        reasoning_tokens=66,
    )
    assert b + a == total


@pytest.mark.parametrize("name", _COUNTS)
def test_usage_add_each_count_separately(name: str) -> None:
    one = Usage(**{name: 7})
    two = Usage(**{name: 5})
    total = one + two
    assert getattr(total, name) == 12
    for other in _COUNTS:
        if other != name:
            assert getattr(total, other) == 0


def test_usage_cost_unknown_on_either_side_gives_none() -> None:
    known = Usage(input_tokens=1, cost=0.5)
    unknown = Usage(input_tokens=2)
    assert (known + unknown).cost is None
    assert (unknown + known).cost is None
    assert (known + unknown).input_tokens == 3
    assert (unknown + unknown).cost is None


def test_usage_cost_zero_is_known() -> None:
    assert (Usage(requests=1, cost=0.0) + Usage(requests=1, cost=0.0)).cost == 0.0


@pytest.mark.parametrize(
    "usage",
    [
        Usage(input_tokens=3, cost=1.5),
        Usage(output_tokens=9),
        Usage(requests=1, cost=0.0),
        Usage(),
    ],
)
def test_empty_usage_is_neutral(usage: Usage) -> None:
    assert Usage() + usage == usage
    assert usage + Usage() == usage


def test_usage_sum_with_empty_start() -> None:
    parts = [Usage(input_tokens=1, cost=0.1), Usage(input_tokens=2, cost=0.2)]
    total = sum(parts, Usage())
    assert total.input_tokens == 3
    assert total.cost == pytest.approx(0.3)


@pytest.mark.parametrize("name", _COUNTS)
@pytest.mark.parametrize("bad", [-1, True, False, 1.5, "3", None])
def test_usage_rejects_bad_counts(name: str, bad: object) -> None:
    with pytest.raises((TypeError, ValueError), match=name):
        Usage(**{name: as_any(bad)})


@pytest.mark.parametrize("bad", ["0.1", True, [1]])
def test_usage_rejects_bad_cost(bad: object) -> None:
    with pytest.raises((TypeError, ValueError), match="cost"):
        Usage(cost=as_any(bad))


def test_usage_add_non_usage_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        _ = Usage() + as_any(1)


def test_usage_is_frozen() -> None:
    usage = Usage(input_tokens=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        usage.input_tokens = 2  # pyright: ignore[reportAttributeAccessIssue]


# -- Reply -------------------------------------------------------------------------------------


def test_reply_defaults() -> None:
    message = Message.assistant("hi")
    reply = Reply(message)
    assert reply.message is message
    assert reply.usage == Usage()
    assert reply.stop_reason is None
    assert reply.model is None


def test_reply_with_all_fields() -> None:
    usage = Usage(input_tokens=3, output_tokens=4, requests=1)
    reply = Reply(Message.assistant("ok"), usage, stop_reason="end_turn", model="fake")
    assert reply.usage == usage
    assert reply.stop_reason == "end_turn"
    assert reply.model == "fake"


def test_reply_needs_an_assistant_message() -> None:
    with pytest.raises(ValueError, match="assistant"):
        Reply(Message.user("hi"))


@pytest.mark.parametrize("message", ["hi", None, {"role": "assistant"}])
def test_reply_message_must_be_a_message(message: object) -> None:
    with pytest.raises(TypeError, match="Message"):
        Reply(as_any(message))


def test_reply_usage_must_be_a_usage() -> None:
    with pytest.raises(TypeError, match="Usage"):
        Reply(Message.assistant("x"), as_any({"input_tokens": 1}))


# -- Stopped values ----------------------------------------------------------------------------


def test_stopped_by_finish_str_with_answer() -> None:
    assert "42" in str(StoppedByFinish(42))
    assert "The bug is in parse()" in str(StoppedByFinish("The bug is in parse()"))
    text = str(StoppedByFinish({"status": "ok"}))
    assert "status" in text
    assert "ok" in text


def test_stopped_by_finish_str_without_answer() -> None:
    text = str(StoppedByFinish())
    assert "finish" in text
    assert "None" not in text


def test_stopped_by_finish_str_is_short_for_long_answers() -> None:
    text = str(StoppedByFinish("x" * 5000))
    assert len(text) < 200


def test_stopped_by_finish_answer_is_frozen_json() -> None:
    stopped = StoppedByFinish({"items": [1, 2]})
    assert stopped.answer == {"items": [1, 2]}
    assert is_a(stopped.answer, FrozenDict)
    assert is_a(stopped.answer["items"], FrozenList)
    with pytest.raises(TypeError):
        StoppedByFinish({1, 2})


def test_stopped_by_until_str_names_the_function() -> None:
    stopped = StoppedByUntil("budget_spent")
    assert stopped.name == "budget_spent"
    assert str(stopped) == "stopped by budget_spent (it returned true)"


def test_stopped_by_the_default_until_says_answered() -> None:
    assert str(StoppedByUntil("waiting_for_user")) == "answered"


def test_stopped_by_approval_str_says_waiting_and_names_the_calls() -> None:
    call = ToolCall("call_3", "pay", {"amount": 5})
    stopped = orchestrator.StoppedByApproval((orchestrator.AwaitingCall("s1", call, "over 1"),))
    assert str(stopped) == "waiting for approval of pay (call_3)"


def test_stopped_by_limit_str_names_the_turns() -> None:
    stopped = StoppedByLimit(50)
    assert stopped.turns == 50
    assert "50" in str(stopped)
    assert str(stopped).startswith("turn limit reached (50 turns)")


def test_stopped_by_permission_str_names_call_and_permission() -> None:
    call = ToolCall("call_7", "delete_repo", {"name": "api"})
    stopped = StoppedByPermission(call, "DenyByName")
    assert stopped.call is call
    assert stopped.permission == "DenyByName"
    text = str(stopped)
    assert "DenyByName" in text
    assert "delete_repo" in text
    assert "call_7" in text


def test_stopped_values_compare_by_value() -> None:
    call = ToolCall("c1", "f", {})
    assert StoppedByFinish({"a": 1}) == StoppedByFinish({"a": 1})
    assert StoppedByUntil("f") == StoppedByUntil("f")
    assert StoppedByUntil("f") != StoppedByUntil("g")
    assert StoppedByLimit(3) == StoppedByLimit(3)
    assert StoppedByPermission(call, "p") == StoppedByPermission(ToolCall("c1", "f", {}), "p")
    assert StoppedByLimit(3) != StoppedByUntil("3")


@pytest.mark.parametrize(
    ("value", "attribute"),
    [
        (StoppedByFinish(1), "answer"),
        (StoppedByUntil("f"), "name"),
        (StoppedByLimit(1), "turns"),
        (StoppedByPermission(ToolCall("c", "f", {}), "p"), "permission"),
    ],
)
def test_stopped_values_are_frozen(value: object, attribute: str) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, attribute, 2)


# -- history entries ---------------------------------------------------------------------------


def _entries(at: datetime) -> list[Any]:
    call = ToolCall("c1", "search", {"q": "x"})
    return [
        ContextChangeEntry(seq=0, turn=0, at=at, content=ContextChange(kind="import", messages=())),
        ExtraDataEntry(seq=1, turn=0, at=at, content=ExtraDataChange(changed={"k": 1})),
        RunStartEntry(seq=2, turn=0, at=at, content=RunStart(agent="a", model="m")),
        ModelRequestEntry(seq=3, turn=1, at=at, content=ModelRequest(model="m", message_count=1)),
        ModelReplyEntry(
            seq=4, turn=1, at=at, content=Reply(Message.assistant("x", [call]), Usage(requests=1))
        ),
        ToolResultEntry(
            seq=5,
            turn=1,
            at=at,
            content=ToolResultBlock("c1", as_any("done")),
            call=call,
            outcome="done",
        ),
        UserEntry(seq=6, turn=1, at=at, content=Message.user("hi")),
        NoticeEntry(seq=7, turn=1, at=at, content=Message.notice("note")),
        ErrorEntry(seq=8, turn=1, at=at, content="RuntimeError: boom"),
        StopEntry(seq=9, turn=1, at=at, content=StoppedByLimit(1)),
        AskEntry(seq=10, turn=1, at=at, content=AskRecord(question="q?", answer={"a": 1})),
    ]


_KINDS = [
    "context_change",
    "extra_data",
    "run_start",
    "model_request",
    "model_reply",
    "tool_result",
    "user",
    "notice",
    "error",
    "stop",
    "ask",
]


@pytest.mark.parametrize("index", range(len(_KINDS)), ids=_KINDS)
def test_history_entry_kind(index: int) -> None:
    entry = _entries(T0)[index]
    assert entry.kind == _KINDS[index]
    assert entry.seq == index
    assert entry.at == T0


@pytest.mark.parametrize("index", range(len(_KINDS)), ids=_KINDS)
def test_history_entry_at_is_excluded_from_equality(index: int) -> None:
    early = _entries(T0)[index]
    late = _entries(T1)[index]
    assert early.at != late.at
    assert early == late
    assert hash(early) == hash(late)


@pytest.mark.parametrize("index", range(len(_KINDS)), ids=_KINDS)
def test_history_entry_other_fields_take_part_in_equality(index: int) -> None:
    entry = _entries(T0)[index]
    assert entry != dataclasses.replace(entry, seq=entry.seq + 100)
    assert entry != dataclasses.replace(entry, turn=entry.turn + 1)


@pytest.mark.parametrize("index", range(len(_KINDS)), ids=_KINDS)
def test_history_entry_kind_cannot_be_passed(index: int) -> None:
    entry = _entries(T0)[index]
    fields = {f.name: getattr(entry, f.name) for f in dataclasses.fields(entry) if f.init}
    with pytest.raises(TypeError):
        type(entry)(**fields, kind="user" if entry.kind != "user" else "notice")


@pytest.mark.parametrize("index", range(len(_KINDS)), ids=_KINDS)
def test_history_entries_are_frozen(index: int) -> None:
    entry = _entries(T0)[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(entry, "seq", 99)  # noqa: B010
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(entry, "kind", "other")  # noqa: B010


def test_history_entries_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        ErrorEntry(as_any(0), as_any(0), as_any(T0), as_any("x"))  # pyright: ignore[reportCallIssue]


@pytest.mark.parametrize(
    "outcome",
    ["done", "error", "input_error", "denied", "cancelled", "interrupted", "aborted", "unknown"],
)
def test_tool_result_entry_accepts_each_outcome(outcome: Any) -> None:
    call = ToolCall("c1", "f", {})
    entry = ToolResultEntry(
        seq=0, turn=1, at=T0, content=ToolResultBlock("c1", as_any("x")), call=call, outcome=outcome
    )
    assert entry.outcome == outcome
    assert entry.child_ids == ()
    assert entry.late is False


@pytest.mark.parametrize("outcome", ["ok", "DONE", "", None, "failed"])
def test_tool_result_entry_rejects_unknown_outcome(outcome: object) -> None:
    call = ToolCall("c1", "f", {})
    with pytest.raises(ValueError, match="outcome"):
        ToolResultEntry(
            seq=0,
            turn=1,
            at=T0,
            content=ToolResultBlock("c1", as_any("x")),
            call=call,
            outcome=as_any(outcome),
        )


def test_tool_result_entry_state_update_is_frozen() -> None:
    call = ToolCall("c1", "f", {})
    entry = ToolResultEntry(
        seq=0,
        turn=1,
        at=T0,
        content=ToolResultBlock("c1", as_any("x")),
        call=call,
        outcome="done",
        state_update=as_any({"docs": [1, 2]}),
    )
    assert entry.state_update == {"docs": [1, 2]}
    assert is_a(entry.state_update, FrozenDict)
    update: Any = entry.state_update
    with pytest.raises(TypeError):
        update["docs"].append(3)


def test_extra_data_change_freezes_and_names_bad_keys() -> None:
    change = ExtraDataChange(changed=as_any({"k": [1, (2, 3)]}), removed=as_any(["gone"]))
    assert change.changed == {"k": [1, [2, 3]]}
    assert is_a(change.changed, FrozenDict)
    assert is_a(change.removed, FrozenList)
    assert change.removed == ["gone"]
    with pytest.raises(TypeError) as info:
        ExtraDataChange(changed=as_any({"k": [1, {2}]}))
    assert "extra_data['k'][1]" in str(info.value)


def test_ask_record_answer_is_frozen() -> None:
    record = AskRecord(question="q", answer=[{"a": 1}])
    assert is_a(record.answer, FrozenList)
    with pytest.raises(TypeError):
        AskRecord(question="q", answer=object())


def test_run_start_entry_exposes_parent_links() -> None:
    entry = RunStartEntry(
        seq=0, turn=0, at=T0, content=RunStart(parent_id="p1", parent_call_id="call_1")
    )
    assert entry.parent_id == "p1"
    assert entry.parent_call_id == "call_1"


def test_model_reply_entry_exposes_tool_calls() -> None:
    call = ToolCall("c1", "f", {})
    entry = ModelReplyEntry(seq=0, turn=1, at=T0, content=Reply(Message.assistant("", [call])))
    assert entry.tool_calls == (call,)


def test_state_records_entries_with_kind_seq_and_utc_at() -> None:
    state = State(messages=[Message.user("start")], extra_data={"k": 1})
    state.add_message(Message.notice("heads up"))
    state.add_message(Message.user("more"))
    kinds = [entry.kind for entry in state.history]
    assert kinds == ["context_change", "extra_data", "notice", "user"]
    assert [entry.seq for entry in state.history] == [0, 1, 2, 3]
    for entry in state.history:
        assert entry.at.tzinfo is not None
        assert entry.at.utcoffset() == timedelta(0)


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "bases"),
    [
        (OutputError, (OrchestratorError,)),
        (ValidationError, (OrchestratorError, ValueError)),
        (ProviderError, (OrchestratorError,)),
        (RateLimitError, (ProviderError, OrchestratorError)),
        (AuthError, (ProviderError, OrchestratorError)),
        (ContextTooLongError, (ProviderError, OrchestratorError)),
    ],
)
def test_error_tree(cls: type[Exception], bases: tuple[type[Exception], ...]) -> None:
    for base in bases:
        assert issubclass(cls, base)
    assert issubclass(cls, Exception)
    error = cls("something failed")
    assert str(error) == "something failed"


def test_orchestrator_error_is_an_exception() -> None:
    assert issubclass(OrchestratorError, Exception)
    assert not issubclass(OrchestratorError, (TypeError, ValueError, LookupError))


def test_tool_error_is_not_an_orchestrator_error() -> None:
    assert issubclass(ToolError, Exception)
    assert not issubclass(ToolError, OrchestratorError)
    error = ToolError("file not found: a.txt")
    assert str(error) == "file not found: a.txt"
    with pytest.raises(ToolError):
        raise error


def test_provider_errors_are_distinct() -> None:
    assert not issubclass(RateLimitError, AuthError)
    assert not issubclass(AuthError, ContextTooLongError)
    assert not issubclass(OutputError, ProviderError)
    assert not issubclass(ValidationError, ProviderError)


def test_validation_error_issues() -> None:
    issues = (
        Issue(path=("items", 0, "price"), message="Input should be a valid number"),
        Issue(path=(), message="Field required"),
    )
    error = ValidationError("document is invalid", issues)
    assert error.issues == issues
    assert error.issues[0].path == ("items", 0, "price")
    assert error.issues[0].message == "Input should be a valid number"
    assert "document is invalid" in str(error)
    with pytest.raises(ValueError, match="invalid"):
        raise error


def test_validation_error_issues_default_to_empty() -> None:
    assert ValidationError("bad").issues == ()


def test_issue_str_shows_path_and_message() -> None:
    assert str(Issue(path=("items", 0), message="bad")) == "items.0: bad"
    assert "bad" in str(Issue(path=(), message="bad"))


def test_issue_is_frozen() -> None:
    issue = Issue(path=("a",), message="m")
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(issue, "message", "other")  # noqa: B010


def test_errors_are_exported_from_the_package() -> None:
    for name in (
        "OrchestratorError",
        "OutputError",
        "ValidationError",
        "ProviderError",
        "RateLimitError",
        "AuthError",
        "ContextTooLongError",
        "ToolError",
        "Issue",
    ):
        assert name in orchestrator.__all__
        assert getattr(orchestrator, name).__module__.startswith("orchestrator")


# -- every text field of every entry is valid text, so it encodes ------------------------------


def _half(text: str) -> str:
    """`text` with a lone surrogate (half of an emoji) in it."""
    return f"{text}\ud83d"


def _entries_with_lone_surrogates(at: datetime) -> list[orchestrator.HistoryEntry]:
    h = _half
    call = ToolCall(h("c1"), h("tool"), {h("key"): [h("value")]})
    awaiting = orchestrator.AwaitingCall(h("child"), call, reason=h("why"), via=h("c0"))
    message = Message(
        "assistant",
        (
            orchestrator.TextBlock(h("text")),
            orchestrator.ReasoningBlock(h("thinking")),
            orchestrator.RawBlock(h("provider"), {h("k"): h("v")}),
            call,
        ),
    )
    return [
        ContextChangeEntry(
            seq=0, turn=0, at=at, content=ContextChange(kind="compact", summary=h("summary"))
        ),
        ExtraDataEntry(
            seq=1,
            turn=0,
            at=at,
            content=ExtraDataChange(changed={h("k"): h("v")}, removed=[h("gone")]),
        ),
        RunStartEntry(
            seq=2,
            turn=0,
            at=at,
            content=RunStart(
                parent_id=h("p"),
                parent_call_id=h("pc"),
                agent=h("agent"),
                model=h("model"),
                tools=(h("tool"), "plain"),
            ),
        ),
        ModelRequestEntry(seq=3, turn=1, at=at, content=ModelRequest(model=h("model"))),
        ModelReplyEntry(
            seq=4,
            turn=1,
            at=at,
            content=Reply(message, stop_reason=h("stop"), model=h("model")),
        ),
        ToolResultEntry(
            seq=5,
            turn=1,
            at=at,
            content=ToolResultBlock(h("c1"), (orchestrator.TextBlock(h("result")),)),
            call=call,
            outcome="error",
            state_update={h("k"): h("v")},
        ),
        UserEntry(seq=6, turn=1, at=at, content=Message.user(h("hi"))),
        NoticeEntry(seq=7, turn=1, at=at, content=Message.notice(h("note"))),
        ErrorEntry(seq=8, turn=1, at=at, content=h("RuntimeError: boom")),
        StopEntry(seq=9, turn=1, at=at, content=StoppedByUntil(h("done"))),
        StopEntry(seq=10, turn=1, at=at, content=StoppedByPermission(call, h("Ask"))),
        StopEntry(seq=11, turn=1, at=at, content=orchestrator.StoppedByApproval((awaiting,))),
        StopEntry(seq=12, turn=1, at=at, content=StoppedByFinish({h("k"): h("v")})),
        AskEntry(
            seq=13,
            turn=1,
            at=at,
            content=AskRecord(question=h("q"), answer=[h("a")], error=h("bad")),
        ),
        orchestrator.ApprovalEntry(
            seq=14,
            turn=1,
            at=at,
            content=orchestrator.ApprovalRecord(
                call_id=h("c1"), approved=False, by=h("ann"), reason=h("no")
            ),
        ),
    ]


@pytest.mark.parametrize("index", range(15))
def test_every_text_field_of_an_entry_replaces_lone_surrogates(index: int) -> None:
    entry = _entries_with_lone_surrogates(T0)[index]
    line = encode_entry(entry)  # raised PydanticSerializationError before
    assert "\ud83d" not in line.decode("utf-8")
    assert "\\ud83d" not in line.decode("utf-8")
    assert "\ufffd" in line.decode("utf-8")
    assert decode_entry(line, state_id="s", index=entry.seq) == entry


def test_usage_stored_before_reasoning_tokens_loads_with_none() -> None:
    # Entries stored before Usage had reasoning_tokens load as they were, with 0 of them.
    old = b'{"input_tokens":5,"output_tokens":2,"cache_read_tokens":0,"cache_write_tokens":0,'
    old += b'"requests":1,"cost":null}'
    usage = pydantic.TypeAdapter(Usage).validate_json(old)
    assert usage == Usage(input_tokens=5, output_tokens=2, requests=1)
    assert usage.reasoning_tokens == 0
