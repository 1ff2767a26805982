"""The replay invariant: a State rebuilt from its history has the same value, after every step.

``State(history=s.history).snapshot() == s.snapshot()`` is checked after each step of a scripted
conversation and of random command sequences (hypothesis), and an inconsistent history is
refused with the index of the entry that cannot follow the ones before it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from orchestrator import (
    ContextChange,
    ContextChangeEntry,
    HistoryEntry,
    Message,
    ModelReplyEntry,
    ModelRequest,
    ModelRequestEntry,
    Outcome,
    Reply,
    RunStart,
    State,
    StateSnapshot,
    StoppedByLimit,
    ToolCall,
    ToolResultEntry,
    Usage,
    UserEntry,
    merge_lists,
)

# Private: Folded is the fold's value (one test checks every slot is copied), and the
# recording functions an Agent uses (they have no public name).
from orchestrator._record._fold import Folded
from orchestrator._record._recording import (
    begin_think,
    close_pending,
    merge_turn,
    record_ask,
    record_compact,
    record_error,
    record_reply,
    record_run_start,
    record_stop,
    record_tool_result,
)
from tests.doubles import assert_replays, block, call

# Helpers --------------------------------------------------------------------------------------


def replayed(history: tuple[HistoryEntry, ...]) -> StateSnapshot:
    """The value of a new State built from `history`."""
    return State(history=history).snapshot()


def assert_results_follow_their_calls(state: State) -> None:
    """Each results message follows the assistant message whose calls it answers, in order."""
    messages = state.messages
    for index, message in enumerate(messages):
        if message.tool_results:
            assert index > 0
            asked = messages[index - 1]
            assert asked.role == "assistant"
            assert [b.call_id for b in message.tool_results] == [c.id for c in asked.tool_calls]
        if message.role == "assistant" and message.tool_calls:
            if index + 1 < len(messages):
                assert messages[index + 1].tool_results
            else:
                asked_ids = [c.id for c in message.tool_calls]
                pending_ids = [c.id for c in state.pending_calls]
                assert pending_ids
                assert pending_ids == [i for i in asked_ids if i in pending_ids]


def edit(state: State, key: str, value: Any) -> None:
    """Set one key of extra_data with edit_extra_data."""
    with state.edit_extra_data() as data:
        data[key] = value


NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
USAGE = Usage(input_tokens=3, output_tokens=1, requests=1, cost=0.01)


# A scripted conversation, checked after every step --------------------------------------------


def test_replay_matches_after_every_step_of_a_conversation() -> None:
    state = State(messages=[Message.user("Find the bug")], extra_data={"repo": "api"})
    snaps: list[StateSnapshot] = []
    read, grep = call("c1", "read", path="a.py"), call("c2", "grep", pattern="bug")
    slow = call("c3", "run")
    steps: list[Callable[[], object]] = [
        lambda: record_run_start(state, RunStart(parent_id="boss", parent_call_id="x1")),
        lambda: begin_think(state, model="fake"),
        lambda: state.add_message(Message.user("held while waiting")),
        lambda: record_reply(state, Reply(Message.assistant("look", [read, grep]), USAGE)),
        lambda: state.add_message(Message.notice("held while pending")),
        lambda: record_tool_result(
            state, grep, block("c2", "b.py:3"), outcome="done", state_update={"hits": [1]}
        ),
        lambda: record_tool_result(state, read, block("c1", "text"), outcome="done"),
        lambda: merge_turn(state, {"grep": {}}),  # the update of grep, as an agent merges it
        lambda: state.clear_tool_results(keep_last=1),
        lambda: begin_think(state, model="fake"),
        lambda: record_error(state, "TimeoutError: model timed out"),
        lambda: begin_think(state, model="fake"),
        lambda: record_reply(state, Reply(Message.assistant("", [slow]), USAGE)),
        lambda: close_pending(state, "interrupted", "(interrupted by user)"),
        lambda: record_tool_result(state, slow, block("c3", "late"), outcome="done"),
        lambda: record_ask(state, "Which file?", {"file": "b.py"}, USAGE),
        lambda: state.set("found", ["b.py"], handler=merge_lists),
        lambda: edit(state, "seen", 2),
        lambda: record_stop(state, StoppedByLimit(3)),
        lambda: record_run_start(state, RunStart()),
        lambda: record_compact(state, "b.py line 3 is wrong", USAGE),
        lambda: state.restore(snaps[8]),  # after clear_tool_results
        lambda: begin_think(state),
        lambda: record_reply(state, Reply(Message.assistant("It is b.py"), USAGE)),
        lambda: state.finish({"file": "b.py"}),
        lambda: state.restore(snaps[-2]),  # after the reply, before finish
        lambda: state.finish(),
        lambda: state.restore(snaps[3]),  # the calls are pending again
        lambda: record_tool_result(state, read, block("c1", "again"), outcome="done"),
        lambda: record_tool_result(state, grep, block("c2", "again"), outcome="error"),
    ]
    for step in steps:
        step()
        snaps.append(state.snapshot())
        assert_replays(state)
        assert_results_follow_their_calls(state)
    # Every snapshot taken on the way, waiting or not, replays from its own history.
    for snap in snaps:
        assert replayed(snap.history) == snap
    assert state.finished is False
    assert state.answer is None
    assert [b.text for b in state.messages[-2].tool_results] == ["again", "again"]
    assert state.messages[-1].text == "held while waiting"  # held again, as at snaps[3]
    assert state.usage == USAGE + USAGE + USAGE + USAGE + USAGE
    copy = state.fork()
    assert copy.snapshot() == state.snapshot()


def test_a_history_prefix_replays_to_the_value_at_that_point() -> None:
    state = State(messages=[Message.user("x")])
    values = [state.snapshot()]
    begin_think(state)
    values.append(state.snapshot())
    record_reply(state, Reply(Message.assistant("", [call("a")])))
    values.append(state.snapshot())
    record_tool_result(state, call("a"), block("a", "r"), outcome="done")
    values.append(state.snapshot())
    history = state.history
    for snap in values:
        assert replayed(history[: len(snap.history)]) == snap


# Inconsistent histories -----------------------------------------------------------------------


def _three_entries() -> tuple[HistoryEntry, ...]:
    state = State(messages=[Message.user("x")], extra_data={"k": 1})
    state.add_message(Message.user("y"))
    return state.history


def _with_results() -> tuple[HistoryEntry, ...]:
    state = State(messages=[Message.user("x")])
    first = call("c1")
    begin_think(state)
    record_reply(state, Reply(Message.assistant("", [first])))
    record_tool_result(state, first, block("c1", "r"), outcome="done")
    state.add_message(Message.user("next"))
    return state.history


def _refused(history: tuple[object, ...], index: int) -> None:
    with pytest.raises(ValueError, match=rf"history\[{index}\]"):
        State(history=cast("Any", history))


def test_a_reply_with_no_request_before_it_is_refused_at_its_index() -> None:
    entries = _three_entries()
    orphan = ModelReplyEntry(seq=3, turn=0, at=NOW, content=Reply(Message.assistant("hi")))
    _refused((*entries, orphan), 3)


def test_a_result_for_a_call_that_is_not_pending_is_refused_at_its_index() -> None:
    entries = _with_results()
    again = next(e for e in entries if e.kind == "tool_result")
    assert isinstance(again, ToolResultEntry)
    repeated = dataclasses.replace(again, seq=len(entries), turn=entries[-1].turn)
    _refused((*entries, repeated), len(entries))
    stranger = ToolResultEntry(
        seq=len(entries),
        turn=entries[-1].turn,
        at=NOW,
        content=block("nobody", "x"),
        call=call("nobody"),
        outcome="done",
    )
    _refused((*entries, stranger), len(entries))


def test_reordered_entries_are_refused_at_the_first_misplaced_one() -> None:
    entries = _with_results()
    _refused((entries[0], entries[2], entries[1], *entries[3:]), 1)
    _refused((*entries[:3], entries[4], entries[3]), 3)


def test_a_seq_gap_is_refused_at_its_index() -> None:
    entries = _with_results()
    _refused((*entries[:2], *entries[3:]), 2)
    _refused(entries[1:], 0)


def test_a_duplicated_entry_is_refused() -> None:
    entries = _three_entries()
    _refused((*entries, entries[-1]), 3)


def test_a_wrong_turn_is_refused_at_its_index() -> None:
    entries = _three_entries()
    shifted = dataclasses.replace(entries[2], turn=5)
    _refused((*entries[:2], shifted), 2)


def test_a_request_while_calls_are_pending_is_refused() -> None:
    entries = _with_results()[:3]
    request = ModelRequestEntry(seq=3, turn=2, at=NOW, content=ModelRequest())
    _refused((*entries, request), 3)


def test_a_restore_to_a_later_position_is_refused() -> None:
    entries = _three_entries()
    change = ContextChange(kind="restore", restored_to=5)
    restore = ContextChangeEntry(seq=3, turn=0, at=NOW, content=change)
    _refused((*entries, restore), 3)


def test_a_compaction_without_summary_is_refused() -> None:
    entries = _three_entries()
    change = ContextChange(kind="compact", summary="  ")
    compact = ContextChangeEntry(seq=3, turn=0, at=NOW, content=change)
    _refused((*entries, compact), 3)


def test_histories_of_two_states_cannot_be_joined() -> None:
    first, second = _three_entries(), _three_entries()
    _refused((*first, *second), 3)


def test_a_refused_history_names_the_entry_kind() -> None:
    entries = _three_entries()
    orphan = ModelReplyEntry(seq=3, turn=0, at=NOW, content=Reply(Message.assistant("hi")))
    with pytest.raises(ValueError, match=r"history\[3\] \(model_reply\)"):
        State(history=(*entries, orphan))


@pytest.mark.parametrize(
    "item",
    ["an entry", {"kind": "user", "seq": 3}, Message.user("x"), None, 3],
    ids=["str", "dict", "message", "none", "int"],
)
def test_an_item_that_is_not_an_entry_raises_type_error_naming_its_index(item: object) -> None:
    entries = _three_entries()
    with pytest.raises(TypeError, match=r"history\[3\]"):
        State(history=cast("Any", (*entries, item)))


def test_a_valid_entry_built_by_hand_is_accepted() -> None:
    entries = _three_entries()
    added = UserEntry(seq=3, turn=0, at=NOW, content=Message.user("by hand"))
    state = State(history=(*entries, added))
    assert state.messages[-1] == Message.user("by hand")
    assert state.updated_at == NOW


# Random command sequences ---------------------------------------------------------------------

JSON_ATOMS = (
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(allow_nan=False, allow_infinity=False, width=32)
    | st.text(max_size=4)
)
JSON_VALUES: st.SearchStrategy[Any] = st.recursive(
    JSON_ATOMS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)
KEYS = st.sampled_from(["a", "b", "c", "notes"])
TEXTS = st.text(alphabet="abc xyz!", min_size=1, max_size=12).filter(lambda t: t.strip() != "")
OUTCOMES: st.SearchStrategy[Outcome] = st.sampled_from(
    ["done", "error", "input_error", "denied", "cancelled", "aborted", "unknown"]
)
SMALL_USAGE = st.builds(
    Usage, input_tokens=st.integers(0, 50), output_tokens=st.integers(0, 50), requests=st.just(1)
)


class StateCommands(RuleBasedStateMachine):
    """Random public commands and agent-loop hooks on one State (or a fork of it)."""

    def __init__(self) -> None:
        super().__init__()
        self.state = State(messages=[Message.user("start")], extra_data={"a": 0})
        self.snapshots: list[tuple[StateSnapshot, bool]] = []  # (snapshot, taken while waiting)
        self.foreign: list[StateSnapshot] = []
        self.closed: list[ToolCall] = []
        self.waiting = False
        self.next_id = 0

    # -- helpers ---------------------------------------------------------------------------------

    def new_call(self) -> ToolCall:
        self.next_id += 1
        return call(f"call{self.next_id}", "tool", n=self.next_id)

    def open_turn(self) -> bool:
        return self.waiting or bool(self.state.pending_calls)

    def refused(self, error: type[Exception], action: Callable[[], object]) -> None:
        before = self.state.snapshot()
        with pytest.raises(error):
            action()
        assert self.state.snapshot() == before
        assert len(self.state.history) == len(before.history)

    # -- public commands -------------------------------------------------------------------------

    @rule(text=TEXTS, notice=st.booleans())
    def add_message(self, text: str, notice: bool) -> None:
        message = Message.notice(text) if notice else Message.user(text)
        held = self.open_turn()
        before = self.state.messages
        self.state.add_message(message)
        assert self.state.history[-1].content == message
        if held:
            assert self.state.messages == before
        else:
            assert self.state.messages == (*before, message)

    @rule(key=KEYS, value=JSON_VALUES)
    def edit_set(self, key: str, value: Any) -> None:
        with self.state.edit_extra_data() as data:
            data[key] = value
        assert self.state.extra_data[key] == value

    @rule(key=KEYS)
    def edit_remove(self, key: str) -> None:
        with self.state.edit_extra_data() as data:
            data.pop(key, None)
        assert key not in self.state.extra_data

    @rule(key=KEYS, value=JSON_VALUES, merge=st.booleans())
    def set_value(self, key: str, value: Any, merge: bool) -> None:
        self.state.set(key, value, handler=merge_lists if merge else None)

    @rule(summary=TEXTS, usage=SMALL_USAGE)
    def compact(self, summary: str, usage: Usage) -> None:
        if self.open_turn():
            self.refused(ValueError, lambda: record_compact(self.state, summary, usage))
            return
        spent = self.state.usage
        record_compact(self.state, summary, usage)
        assert self.state.usage == spent + usage
        assert len(self.state.messages) <= 2

    @rule(keep=st.integers(0, 3))
    def clear_tool_results(self, keep: int) -> None:
        if self.open_turn():
            self.refused(ValueError, lambda: self.state.clear_tool_results(keep))
            return
        self.state.clear_tool_results(keep)

    @rule()
    def take_snapshot(self) -> None:
        self.snapshots.append((self.state.snapshot(), self.waiting))

    @precondition(lambda self: bool(self.snapshots))
    @rule(data=st.data())
    def restore(self, data: st.DataObject) -> None:
        snap, taken_waiting = data.draw(st.sampled_from(self.snapshots))
        if self.open_turn() or taken_waiting:
            self.refused(ValueError, lambda: self.state.restore(snap))
            return
        spent = self.state.usage
        self.state.restore(snap)
        assert self.state.messages == snap.messages
        assert self.state.extra_data == snap.extra_data
        assert self.state.turn == snap.turn
        assert self.state.pending_calls == snap.pending_calls
        assert self.state.answer == snap.answer
        assert self.state.finished == snap.finished
        assert self.state.stopped == snap.stopped
        assert self.state.usage == spent

    @precondition(lambda self: bool(self.foreign))
    @rule(data=st.data())
    def restore_foreign(self, data: st.DataObject) -> None:
        snap = data.draw(st.sampled_from(self.foreign))
        self.refused(ValueError, lambda: self.state.restore(snap))

    @rule(answer=st.none() | JSON_VALUES)
    def finish(self, answer: Any) -> None:
        earlier = self.state.answer
        self.state.finish(answer)
        assert self.state.finished
        assert self.state.answer == (earlier if answer is None else answer)

    @rule(switch=st.booleans())
    def fork(self, switch: bool) -> None:
        if self.waiting:
            self.refused(ValueError, self.state.fork)
            return
        copy = self.state.fork()
        assert copy.snapshot() == self.state.snapshot()
        assert copy.id != self.state.id
        if switch:
            self.foreign.extend(snap for snap, _ in self.snapshots)
            self.snapshots = []
            self.state = copy

    # -- agent-loop hooks ------------------------------------------------------------------------

    @rule(model=st.none() | st.just("fake"))
    def think(self, model: str | None) -> None:
        if self.open_turn() or self.state.finished:
            self.refused(ValueError, lambda: begin_think(self.state, model=model))
            return
        turn = self.state.turn
        begin_think(self.state, model=model)
        self.waiting = True
        assert self.state.turn == turn + 1

    @precondition(lambda self: self.waiting)
    @rule(calls=st.integers(0, 3), text=st.text(alphabet="ab ", max_size=5), usage=SMALL_USAGE)
    def reply(self, calls: int, text: str, usage: Usage) -> None:
        requested = tuple(self.new_call() for _ in range(calls))
        record_reply(self.state, Reply(Message.assistant(text, requested), usage))
        self.waiting = False
        assert self.state.pending_calls == requested
        if not requested:
            assert self.state.answer == (self.state.answer if self.state.finished else text)

    @precondition(lambda self: bool(self.state.pending_calls))
    @rule(data=st.data(), outcome=OUTCOMES, child=st.booleans(), usage=SMALL_USAGE)
    def result(self, data: st.DataObject, outcome: Outcome, child: bool, usage: Usage) -> None:
        chosen = data.draw(st.sampled_from(self.state.pending_calls))
        spent = self.state.usage
        entry = record_tool_result(
            self.state,
            chosen,
            block(chosen.id, f"result of {chosen.id}"),
            outcome=outcome,
            child_ids=(f"kid-{chosen.id}",) if child else (),
            usage=usage,
        )
        assert entry.late is False
        assert chosen not in self.state.pending_calls
        assert self.state.usage == spent + usage
        self.closed.append(chosen)

    @precondition(lambda self: bool(self.closed))
    @rule(data=st.data())
    def late_result(self, data: st.DataObject) -> None:
        chosen = data.draw(st.sampled_from(self.closed))
        if chosen in self.state.pending_calls:
            return
        messages = self.state.messages
        entry = record_tool_result(self.state, chosen, block(chosen.id, "late"), outcome="done")
        assert entry.late is True
        assert self.state.messages == messages

    @precondition(lambda self: bool(self.state.pending_calls))
    @rule(outcome=st.sampled_from(["interrupted", "cancelled", "aborted"]))
    def close_pending(self, outcome: Outcome) -> None:
        closing = self.state.pending_calls
        entries = close_pending(self.state, outcome, f"({outcome})")
        assert [e.call for e in entries] == list(closing)
        assert self.state.pending_calls == ()
        self.closed.extend(closing)

    @rule(text=TEXTS)
    def error(self, text: str) -> None:
        turn = self.state.turn
        record_error(self.state, f"RuntimeError: {text}")
        assert self.state.stopped is None
        if self.waiting:
            self.waiting = False
            assert self.state.turn == turn - 1

    @rule(parent=st.none() | st.just("boss"))
    def run_start(self, parent: str | None) -> None:
        start = RunStart(parent_id=parent, parent_call_id=None if parent is None else "c0")
        if self.waiting:
            self.refused(ValueError, lambda: record_run_start(self.state, start))
            return
        record_run_start(self.state, start)
        assert self.state.stopped is None

    @rule(turns=st.integers(1, 5))
    def stop(self, turns: int) -> None:
        record_stop(self.state, StoppedByLimit(turns))
        assert self.state.stopped == StoppedByLimit(turns)

    @rule(answer=JSON_VALUES, usage=SMALL_USAGE)
    def ask(self, answer: Any, usage: Usage) -> None:
        record_ask(self.state, "question?", answer, usage)

    # -- what must always hold -------------------------------------------------------------------

    @invariant()
    def replays_to_the_same_value(self) -> None:
        assert_replays(self.state)

    @invariant()
    def results_follow_their_calls(self) -> None:
        assert_results_follow_their_calls(self.state)

    @invariant()
    def fork_has_the_same_value(self) -> None:
        if not self.waiting:
            assert self.state.fork().snapshot() == self.state.snapshot()


def test_random_command_sequences_keep_the_replay_invariant() -> None:
    run_state_machine_as_test(
        StateCommands,
        settings=settings(
            max_examples=150,
            stateful_step_count=40,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


def test_the_folded_value_copies_every_slot() -> None:
    # Folded.copy assigns each slot by name (fast): a slot added later must be copied too.
    value = object.__new__(Folded)
    for number, name in enumerate(Folded.__slots__):
        object.__setattr__(value, name, f"sentinel {number}")
    copied = value.copy()
    assert copied is not value
    assert [getattr(copied, name) for name in Folded.__slots__] == [
        f"sentinel {number}" for number in range(len(Folded.__slots__))
    ]
