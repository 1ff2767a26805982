"""The hooks the agent loop records a turn with, and the ordering rules of `State.messages`."""

from __future__ import annotations

from typing import Any, cast

import anyio
import anyio.to_thread
import pytest

from orchestrator import (
    Agent,
    Message,
    Reply,
    RunStart,
    State,
    StateSnapshot,
    StoppedByFinish,
    StoppedByLimit,
    StoppedByPermission,
    StoppedByUntil,
    ToolCall,
    Usage,
)

# Private: the recording functions an Agent records a turn with; these tests drive a State
# through them by hand. They have no public name.
from orchestrator._record._recording import (
    add_child,
    begin_run,
    begin_think,
    close_pending,
    compaction,
    end_run,
    merge_turn,
    record_ask,
    record_compact,
    record_error,
    record_reply,
    record_run_start,
    record_stop,
    record_tool_result,
    value_of,
)
from orchestrator.models import Request, TextCallback
from stores.backend import bind_state
from tests.doubles import assert_replays, block, call

# Helpers --------------------------------------------------------------------------------------


def done(state: State, tool_call: ToolCall, text: str = "ok", **kwargs: Any) -> None:
    """Record a `done` result for `tool_call`."""
    record_tool_result(state, tool_call, block(tool_call.id, text), outcome="done", **kwargs)


def assert_unchanged(state: State, before: StateSnapshot) -> None:
    """The State has exactly the value it had before a rejected call."""
    assert state.snapshot() == before
    assert len(state.history) == len(before.history)


def texts(state: State) -> list[str]:
    """The text of each message, tool results shown as `results:<ids>`."""
    out: list[str] = []
    for message in state.messages:
        if message.tool_results:
            out.append("results:" + ",".join(b.call_id for b in message.tool_results))
        elif message.tool_calls:
            out.append(f"{message.text}->" + ",".join(c.id for c in message.tool_calls))
        else:
            out.append(message.text)
    return out


USAGE = Usage(input_tokens=10, output_tokens=2, requests=1, cost=0.5)


@pytest.fixture
def state() -> State:
    return State(messages=[Message.user("Find the bug")])


# think, reply and the turn --------------------------------------------------------------------


def test_begin_think_records_a_request_and_counts_the_turn(state: State) -> None:
    begin_think(state, model="fake-1")
    entry = state.history[-1]
    assert entry.kind == "model_request"
    assert entry.content.model == "fake-1"
    assert entry.content.message_count == 1
    assert entry.turn == 1
    assert state.turn == 1
    assert state.messages == (Message.user("Find the bug"),)
    assert_replays(state)


def test_a_text_reply_enters_messages_and_becomes_the_answer(state: State) -> None:
    begin_think(state, model="fake")
    record_reply(state, Reply(Message.assistant("It is in b.py"), USAGE, "end_turn", "fake"))
    assert texts(state) == ["Find the bug", "It is in b.py"]
    assert state.turn == 1
    assert state.answer == "It is in b.py"
    assert state.usage == USAGE
    entry = state.history[-1]
    assert entry.kind == "model_reply"
    assert entry.content.stop_reason == "end_turn"
    assert entry.content.model == "fake"
    assert entry.turn == 1
    assert_replays(state)


def test_think_while_waiting_or_pending_raises_value_error(state: State) -> None:
    begin_think(state)
    waiting = state.snapshot()
    with pytest.raises(ValueError, match="waited on"):
        begin_think(state)
    assert_unchanged(state, waiting)
    record_reply(state, Reply(Message.assistant("", [call("c1")])))
    pending = state.snapshot()
    with pytest.raises(ValueError, match="pending"):
        begin_think(state)
    assert_unchanged(state, pending)


def test_a_reply_without_a_request_raises_value_error(state: State) -> None:
    before = state.snapshot()
    with pytest.raises(ValueError, match="model_reply"):
        record_reply(state, Reply(Message.assistant("unasked")))
    assert_unchanged(state, before)


def test_record_reply_takes_a_reply_only(state: State) -> None:
    begin_think(state)
    before = state.snapshot()
    with pytest.raises(TypeError, match="Reply"):
        record_reply(state, cast("Any", Message.assistant("no wrapper")))
    assert_unchanged(state, before)


def test_a_reply_with_two_calls_of_one_id_raises_value_error(state: State) -> None:
    begin_think(state)
    before = state.snapshot()
    with pytest.raises(ValueError, match="same id"):
        record_reply(state, Reply(Message.assistant("", [call("c1"), call("c1", "other")])))
    assert_unchanged(state, before)


def test_a_finished_state_cannot_think(state: State) -> None:
    state.finish("done")
    before = state.snapshot()
    with pytest.raises(ValueError, match="finished"):
        begin_think(state)
    assert_unchanged(state, before)


# tool calls and results -----------------------------------------------------------------------


def test_calls_are_pending_in_request_order_until_each_has_a_result(state: State) -> None:
    a, b, c = call("a", "read", path="x"), call("b", "grep"), call("c", "run")
    begin_think(state)
    record_reply(state, Reply(Message.assistant("checking", [a, b, c])))
    assert state.pending_calls == (a, b, c)
    done(state, b)
    assert state.pending_calls == (a, c)
    done(state, c)
    assert state.pending_calls == (a,)
    assert texts(state) == ["Find the bug", "checking->a,b,c"]
    done(state, a)
    assert state.pending_calls == ()
    assert texts(state) == ["Find the bug", "checking->a,b,c", "results:a,b,c"]
    assert_replays(state)


def test_results_enter_as_one_user_message_in_request_order(state: State) -> None:
    calls = [call(f"c{i}") for i in range(5)]
    begin_think(state)
    record_reply(state, Reply(Message.assistant("", calls)))
    for index in (3, 0, 4, 2, 1):
        done(state, calls[index], f"result {index}")
        assert_replays(state)
    last = state.messages[-1]
    assert last.role == "user"
    assert [b.call_id for b in last.tool_results] == ["c0", "c1", "c2", "c3", "c4"]
    assert [b.text for b in last.tool_results] == [f"result {i}" for i in range(5)]
    assert len(state.messages) == 3
    recorded = [e.call.id for e in state.history if e.kind == "tool_result"]
    assert recorded == ["c3", "c0", "c4", "c2", "c1"]


def test_a_tool_result_entry_keeps_call_outcome_and_child_ids(state: State) -> None:
    delegate = call("d1", "delegate", task="look")
    begin_think(state)
    record_reply(state, Reply(Message.assistant("", [delegate])))
    record_tool_result(
        state,
        delegate,
        block("d1", "failed", is_error=True),
        outcome="error",
        child_ids=("kid-1", "kid-2"),
        usage=Usage(output_tokens=4),
        state_update=None,
    )
    entry = state.history[-1]
    assert entry.kind == "tool_result"
    assert entry.call == delegate
    assert entry.outcome == "error"
    assert entry.child_ids == ("kid-1", "kid-2")
    assert entry.late is False
    assert entry.content.is_error is True
    assert state.messages[-1].tool_results[0].is_error is True


def test_messages_added_while_waiting_go_in_after_the_reply(state: State) -> None:
    begin_think(state)
    state.add_message(Message.user("also check c.py"))
    state.add_message(Message.notice("tests failed"))
    assert texts(state) == ["Find the bug"]
    assert_replays(state)
    record_reply(state, Reply(Message.assistant("ok")))
    assert texts(state) == ["Find the bug", "ok", "also check c.py", "[notice] tests failed"]
    assert_replays(state)


def test_messages_added_while_waiting_go_in_after_all_the_results(state: State) -> None:
    a, b = call("a"), call("b")
    begin_think(state)
    state.add_message(Message.user("while waiting"))
    record_reply(state, Reply(Message.assistant("", [a, b])))
    state.add_message(Message.notice("while pending"))
    done(state, b)
    assert texts(state) == ["Find the bug", "->a,b"]
    state.add_message(Message.user("still pending"))
    done(state, a)
    assert texts(state) == [
        "Find the bug",
        "->a,b",
        "results:a,b",
        "while waiting",
        "[notice] while pending",
        "still pending",
    ]
    assert_replays(state)
    kinds = [entry.kind for entry in state.history]
    assert kinds.count("user") == 2
    assert kinds.count("notice") == 1


class GateModel:
    """Replies "ok" once `release` is set; `entered` is set when the request arrives."""

    def __init__(self) -> None:
        self.entered = anyio.Event()
        self.release = anyio.Event()

    @property
    def name(self) -> str:
        return "gate"

    @property
    def context_window(self) -> int | None:
        return None

    async def respond(self, request: Request, *, on_text: TextCallback | None = None) -> Reply:
        self.entered.set()
        await self.release.wait()
        return Reply(Message.assistant("ok"))


@pytest.mark.anyio
async def test_messages_added_from_threads_while_the_model_is_waited_on_keep_order() -> None:
    # Seed 004: methods are "thread-safe, so tools may call them from worker threads";
    # add_message: "while think waits on the model, the message is held and goes into messages
    # right after ... the reply".
    model = GateModel()
    agent = Agent(model)
    state = State(messages=[Message.user("start")])
    threads, per_thread = 8, 50

    def add_many(tag: str) -> None:
        for i in range(per_thread):
            state.add_message(Message.user(f"{tag}-{i}"))

    async with anyio.create_task_group() as group:
        group.start_soon(agent.athink, state)
        await model.entered.wait()
        async with anyio.create_task_group() as adders:
            for t in range(threads):
                adders.start_soon(anyio.to_thread.run_sync, add_many, f"t{t}")
        assert [m.text for m in state.messages] == ["start"]  # held while waiting
        model.release.set()

    seen = [m.text for m in state.messages]
    assert seen[:2] == ["start", "ok"]
    assert len(seen) == 2 + threads * per_thread
    for t in range(threads):
        mine = [text for text in seen if text.startswith(f"t{t}-")]
        assert mine == [f"t{t}-{i}" for i in range(per_thread)]
    assert_replays(state)


def test_messages_between_turns_go_in_at_once(state: State) -> None:
    state.add_message(Message.user("more"))
    assert texts(state) == ["Find the bug", "more"]


# failed thinks --------------------------------------------------------------------------------


# The agent loop records errors inside its event loop, so these tests run in one too.


@pytest.mark.anyio
async def test_a_failed_think_takes_the_turn_back(state: State) -> None:
    begin_think(state)
    record_reply(state, Reply(Message.assistant("first")))
    begin_think(state)
    state.add_message(Message.user("held"))
    assert state.turn == 2
    record_error(state, RuntimeError("connection reset"))
    assert state.turn == 1
    assert state.answer == "first"
    assert texts(state) == ["Find the bug", "first", "held"]
    entry = state.history[-1]
    assert entry.kind == "error"
    assert entry.content == "RuntimeError: connection reset"
    assert_replays(state)
    begin_think(state)
    assert state.turn == 2
    assert state.history[-1].turn == 2


def test_record_error_of_an_exception_works_outside_an_event_loop(state: State) -> None:
    # A sync caller (or a worker thread) records a failure without any event loop running.
    begin_think(state)
    record_error(state, RuntimeError("connection reset"))
    assert state.turn == 0
    entry = state.history[-1]
    assert entry.kind == "error"
    assert entry.content == "RuntimeError: connection reset"


def test_record_error_takes_a_message_too(state: State) -> None:
    record_error(state, "Cancelled: by the user")
    entry = state.history[-1]
    assert entry.kind == "error"
    assert entry.content == "Cancelled: by the user"
    assert state.turn == 0


@pytest.mark.anyio
async def test_an_error_while_calls_are_pending_keeps_them(state: State) -> None:
    pending = call("a")
    begin_think(state)
    record_reply(state, Reply(Message.assistant("", [pending])))
    record_error(state, ValueError("tool crashed"))
    assert state.pending_calls == (pending,)
    assert state.turn == 1
    assert_replays(state)


# closing and late results ---------------------------------------------------------------------


def test_close_pending_gives_every_pending_call_an_error_result(state: State) -> None:
    a, b, c = call("a"), call("b"), call("c")
    begin_think(state)
    record_reply(state, Reply(Message.assistant("", [a, b, c])))
    done(state, b, "b done")
    state.add_message(Message.user("stop"))
    entries = close_pending(state, "interrupted", "(interrupted by user)")
    assert [entry.call.id for entry in entries] == ["a", "c"]
    assert all(entry.outcome == "interrupted" for entry in entries)
    assert state.pending_calls == ()
    results = state.messages[-2].tool_results
    assert [r.call_id for r in results] == ["a", "b", "c"]
    assert [r.text for r in results] == ["(interrupted by user)", "b done", "(interrupted by user)"]
    assert [r.is_error for r in results] == [True, False, True]
    assert state.messages[-1].text == "stop"
    assert_replays(state)


def test_close_pending_with_nothing_pending_records_nothing(state: State) -> None:
    before = state.snapshot()
    assert close_pending(state, "aborted", "(aborted)") == ()
    assert_unchanged(state, before)


def test_a_result_for_a_closed_call_is_late_and_leaves_messages(state: State) -> None:
    slow = call("slow", "run")
    begin_think(state)
    record_reply(state, Reply(Message.assistant("", [slow]), USAGE))
    close_pending(state, "interrupted", "(interrupted by user)")
    messages = state.messages
    record_tool_result(
        state, slow, block("slow", "finally"), outcome="done", usage=Usage(output_tokens=7)
    )
    entry = state.history[-1]
    assert entry.kind == "tool_result"
    assert entry.late is True
    assert state.messages == messages
    assert state.pending_calls == ()
    assert state.usage == USAGE + Usage(output_tokens=7)
    assert_replays(state)


def test_a_result_for_a_call_never_requested_is_late(state: State) -> None:
    stranger = call("nobody-asked")
    messages = state.messages
    record_tool_result(state, stranger, block("nobody-asked", "x"), outcome="unknown")
    entry = state.history[-1]
    assert entry.kind == "tool_result"
    assert entry.late is True
    assert state.messages == messages
    assert_replays(state)


def test_a_result_whose_block_names_another_call_raises_value_error(state: State) -> None:
    a = call("a")
    begin_think(state)
    record_reply(state, Reply(Message.assistant("", [a])))
    before = state.snapshot()
    with pytest.raises(ValueError, match="tool_result"):
        record_tool_result(state, a, block("b", "x"), outcome="done")
    assert_unchanged(state, before)


def test_a_non_json_state_update_is_refused_when_recorded(state: State) -> None:
    a = call("a")
    begin_think(state)
    record_reply(state, Reply(Message.assistant("", [a])))
    before = state.snapshot()
    with pytest.raises(TypeError, match="state_update"):
        record_tool_result(state, a, block("a", "x"), outcome="done", state_update={"s": {1}})
    assert_unchanged(state, before)
    assert state.pending_calls == (a,)


# usage ----------------------------------------------------------------------------------------


def test_usage_adds_replies_asks_compactions_and_subagents(state: State) -> None:
    delegate = call("d1", "delegate")
    begin_think(state)
    record_reply(state, Reply(Message.assistant("", [delegate]), Usage(input_tokens=100)))
    done(state, delegate, child_ids=("kid",), usage=Usage(input_tokens=20, requests=2))
    record_ask(state, "Is it b.py?", {"yes": True}, Usage(output_tokens=3, requests=1))
    record_compact(state, "b.py is broken", Usage(input_tokens=5, output_tokens=1, requests=1))
    assert state.usage == Usage(input_tokens=125, output_tokens=4, requests=4)
    ask = next(e for e in state.history if e.kind == "ask")
    assert ask.kind == "ask"
    assert ask.content.question == "Is it b.py?"
    assert ask.content.answer == {"yes": True}
    assert_replays(state)


def test_usage_cost_is_summed_when_known(state: State) -> None:
    begin_think(state)
    record_reply(state, Reply(Message.assistant("a"), Usage(input_tokens=1, cost=0.25)))
    record_ask(state, "q", "a", Usage(output_tokens=1, cost=0.5))
    assert state.usage == Usage(input_tokens=1, output_tokens=1, cost=0.75)


def test_restore_does_not_lower_usage(state: State) -> None:
    before = state.snapshot()
    begin_think(state)
    record_reply(state, Reply(Message.assistant("spent"), USAGE))
    record_ask(state, "q", "a", USAGE)
    spent = state.usage
    state.restore(before)
    assert state.usage == spent
    assert state.usage == USAGE + USAGE
    assert state.messages == before.messages
    assert_replays(state)


def test_a_non_json_ask_answer_is_refused_when_recorded(state: State) -> None:
    before = state.snapshot()
    with pytest.raises(TypeError, match="answer"):
        record_ask(state, "q", {"when": object()}, USAGE)
    assert_unchanged(state, before)


def test_ask_answers_are_recorded_as_json(state: State) -> None:
    record_ask(state, "q", {"pair": (1, 2)}, Usage())
    entry = state.history[-1]
    assert entry.kind == "ask"
    answer: Any = entry.content.answer
    assert answer == {"pair": [1, 2]}
    with pytest.raises(TypeError):
        answer["pair"].append(3)


def test_an_ask_does_not_change_the_messages(state: State) -> None:
    messages = state.messages
    record_ask(state, "q", ["a", 1], Usage())
    assert state.messages == messages
    assert state.answer is None


# answer and stopped ---------------------------------------------------------------------------


def test_answer_ignores_replies_with_tool_calls(state: State) -> None:
    begin_think(state)
    record_reply(state, Reply(Message.assistant("looking", [call("a")])))
    assert state.answer is None
    done(state, call("a"))
    begin_think(state)
    record_reply(state, Reply(Message.assistant("found it")))
    assert state.answer == "found it"
    begin_think(state)
    record_reply(state, Reply(Message.assistant("one more look", [call("b")])))
    assert state.answer == "found it"


def test_a_finish_answer_wins_over_later_replies(state: State) -> None:
    begin_think(state)
    record_reply(state, Reply(Message.assistant("", [call("submit", "submit")])))
    state.finish({"file": "b.py"})
    done(state, call("submit", "submit"))
    assert state.answer == {"file": "b.py"}
    assert state.stopped == StoppedByFinish({"file": "b.py"})


def test_record_stop_sets_stopped_without_finishing(state: State) -> None:
    record_stop(state, StoppedByLimit(3))
    assert state.stopped == StoppedByLimit(3)
    assert state.finished is False
    entry = state.history[-1]
    assert entry.kind == "stop"
    assert entry.content == StoppedByLimit(3)
    record_stop(state, StoppedByUntil("waiting_for_user"))
    assert state.stopped == StoppedByUntil("waiting_for_user")
    assert_replays(state)


def test_a_permission_stop_does_not_finish(state: State) -> None:
    denied = call("rm", "shell", cmd="rm -rf /")
    begin_think(state)
    record_reply(state, Reply(Message.assistant("", [denied])))
    record_tool_result(state, denied, block("rm", "denied", is_error=True), outcome="denied")
    record_stop(state, StoppedByPermission(denied, "no_shell"))
    assert state.stopped == StoppedByPermission(denied, "no_shell")
    assert state.finished is False
    state.add_message(Message.user("do not delete things"))
    record_run_start(state, RunStart())
    begin_think(state)
    assert state.turn == 2


def test_run_start_resets_stopped(state: State) -> None:
    record_stop(state, StoppedByLimit(3))
    record_run_start(state, RunStart(agent="a", model="m", tools=("read",)))
    assert state.stopped is None
    entry = state.history[-1]
    assert entry.kind == "run_start"
    assert entry.content.tools == ("read",)
    assert_replays(state)


@pytest.mark.anyio
async def test_an_error_entry_resets_stopped(state: State) -> None:
    record_stop(state, StoppedByLimit(3))
    record_error(state, RuntimeError("run failed"))
    assert state.stopped is None
    state.finish("x")
    record_error(state, RuntimeError("after finish"))
    assert state.stopped is None
    assert state.finished is True
    assert_replays(state)


def test_run_start_while_waiting_raises_value_error(state: State) -> None:
    begin_think(state)
    before = state.snapshot()
    with pytest.raises(ValueError, match="run_start"):
        record_run_start(state, RunStart())
    assert_unchanged(state, before)


def test_parent_links_come_from_the_first_run_start(state: State) -> None:
    record_run_start(state, RunStart(parent_id="boss", parent_call_id="call-7"))
    record_run_start(state, RunStart(parent_id="other", parent_call_id="call-9"))
    assert state.parent_id == "boss"
    assert state.parent_call_id == "call-7"
    entry = state.history[1]
    assert entry.kind == "run_start"
    assert entry.parent_id == "boss"
    assert entry.parent_call_id == "call-7"
    rebuilt = State(history=state.history)
    assert (rebuilt.parent_id, rebuilt.parent_call_id) == ("boss", "call-7")


def test_a_first_run_start_without_parent_keeps_none(state: State) -> None:
    record_run_start(state, RunStart())
    record_run_start(state, RunStart(parent_id="late", parent_call_id="c"))
    assert state.parent_id is None
    assert state.parent_call_id is None


def test_parent_links_survive_restore(state: State) -> None:
    before = state.snapshot()
    record_run_start(state, RunStart(parent_id="boss", parent_call_id="call-7"))
    state.restore(before)
    assert state.parent_id == "boss"
    assert state.parent_call_id == "call-7"


# compaction, runs, stores, children -----------------------------------------------------------


def test_compact_records_summary_and_usage(state: State) -> None:
    begin_think(state)
    record_reply(state, Reply(Message.assistant("long answer")))
    record_compact(state, "short summary", USAGE)
    assert len(state.messages) == 2
    assert state.messages[0] == Message.user("Find the bug")
    assert "short summary" in state.messages[1].text
    entry = state.history[-1]
    assert entry.kind == "context_change"
    assert entry.content.usage == USAGE
    assert state.usage == USAGE
    assert_replays(state)


def test_compaction_marks_restore_unavailable_until_it_ends(state: State) -> None:
    before = state.snapshot()
    state.add_message(Message.user("more"))
    with compaction(state):
        record_compact(state, "summary", USAGE)
        after = state.snapshot()
        with pytest.raises(ValueError, match="compaction"):
            state.restore(before)
        assert_unchanged(state, after)
        with pytest.raises(ValueError, match="already under way"), compaction(state):
            pass
    state.restore(before)
    assert state.messages == before.messages


def test_compaction_ends_when_its_block_raises(state: State) -> None:
    before = state.snapshot()

    def fail() -> None:
        with compaction(state):
            raise RuntimeError("model failed")

    with pytest.raises(RuntimeError, match="model failed"):
        fail()
    state.restore(before)
    assert state.history[-1].kind == "context_change"


def test_one_run_at_a_time(state: State) -> None:
    before = state.snapshot()
    begin_run(state)
    with pytest.raises(ValueError, match="already running"):
        begin_run(state)
    end_run(state)
    begin_run(state)
    end_run(state)
    assert_unchanged(state, before)


def test_a_fork_of_a_running_state_can_run(state: State) -> None:
    begin_run(state)
    copy = state.fork()
    begin_run(copy)
    end_run(copy)
    end_run(state)


class _Store:
    async_only = False

    def __init__(self, **states: State) -> None:
        self.states = states

    def load(self, state_id: str) -> State:
        return State(id=state_id, history=self.states[state_id].history)


def test_bind_store_lets_child_load_from_it(state: State) -> None:
    delegate = call("d1", "delegate")
    begin_think(state)
    record_reply(state, Reply(Message.assistant("", [delegate])))
    done(state, delegate, child_ids=("kid",))
    kid = State(id="kid", messages=[Message.user("look")])
    rebuilt = State(id=state.id, history=state.history)
    with pytest.raises(ValueError, match="not in memory"):
        rebuilt.child("kid")
    bind_state(rebuilt, _Store(kid=kid))
    assert rebuilt.child("kid").messages == kid.messages
    add_child(state, kid)
    assert state.child("kid") is kid


def test_add_child_alone_does_not_make_a_child(state: State) -> None:
    kid = State(id="kid")
    add_child(state, kid)
    with pytest.raises(KeyError):
        state.child("kid")


# state updates of tools -----------------------------------------------------------------------


def test_state_updates_apply_when_the_last_result_is_in_in_request_order(state: State) -> None:
    first, second = call("first"), call("second")
    begin_think(state)
    record_reply(state, Reply(Message.assistant("", [first, second])))
    record_tool_result(
        state, second, block("second", "2"), outcome="done", state_update={"winner": "second"}
    )
    assert "winner" not in state.extra_data
    record_tool_result(
        state,
        first,
        block("first", "1"),
        outcome="done",
        state_update={"winner": "first", "a": [1]},
    )
    # The turn closed: its updates are due until merged (an agent merges them at once, with
    # its tools' handlers), and a State replayed from here agrees.
    assert "winner" not in state.extra_data
    assert [entry.call.id for entry in value_of(state).due] == [
        "first",
        "second",
    ]  # private: due updates have no public view
    assert_replays(state)
    with pytest.raises(ValueError, match=r"state updates of the last turn \(tool\)"):
        begin_think(state)
    merge_turn(state, {"tool": {}})
    # The later call in request order wins a replace, whatever order the results came in.
    assert state.extra_data == {"winner": "second", "a": [1]}
    assert state.history[-1].kind == "extra_data"
    assert state.history[-1].content.turn_merge
    assert value_of(state).due == ()  # private: due updates have no public view
    assert_replays(state)


def test_state_updates_of_late_results_are_not_applied(state: State) -> None:
    slow = call("slow")
    begin_think(state)
    record_reply(state, Reply(Message.assistant("", [slow])))
    close_pending(state, "cancelled", "(cancelled)")
    record_tool_result(state, slow, block("slow", "x"), outcome="done", state_update={"k": 1})
    assert "k" not in state.extra_data
    assert_replays(state)


# entries --------------------------------------------------------------------------------------


def test_entries_are_numbered_and_carry_their_turn(state: State) -> None:
    a = call("a")
    begin_think(state)
    record_reply(state, Reply(Message.assistant("", [a])))
    done(state, a)
    begin_think(state)
    record_reply(state, Reply(Message.assistant("done")))
    history = state.history
    assert [entry.seq for entry in history] == list(range(len(history)))
    assert [(entry.kind, entry.turn) for entry in history] == [
        ("context_change", 0),
        ("model_request", 1),
        ("model_reply", 1),
        ("tool_result", 1),
        ("model_request", 2),
        ("model_reply", 2),
    ]
