"""`State` from many threads at once: no update is lost and every snapshot is consistent.

Real threads start together at a barrier; the switch interval is lowered so they interleave
often. Nothing here measures time: every assertion is about the values recorded.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import pytest

from orchestrator import (
    Message,
    Reply,
    State,
    StateSnapshot,
    TextBlock,
    ToolCall,
    ToolResultBlock,
    merge_lists,
)
from orchestrator._record._recording import begin_think, record_reply, record_tool_result
from tests.doubles import assert_replays

THREADS = 8


@pytest.fixture(autouse=True)
def frequent_switches() -> Iterator[None]:
    """Let the interpreter switch threads far more often than by default."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def run_together(count: int, work: Callable[[int], object]) -> list[Any]:
    """Run `work(0)`, ..., `work(count - 1)` in `count` threads released at once.

    Returns their results in order; an exception in any thread is raised here.
    """
    barrier = threading.Barrier(count)

    def start(index: int) -> object:
        barrier.wait(timeout=60)
        return work(index)

    with ThreadPoolExecutor(max_workers=count) as pool:
        futures = [pool.submit(start, index) for index in range(count)]
        return [future.result() for future in futures]


def call(call_id: str) -> ToolCall:
    """A tool call without arguments."""
    return ToolCall(call_id, "tool", cast("Any", {}))


# Writers only ---------------------------------------------------------------------------------


def test_edit_extra_data_increments_lose_nothing() -> None:
    state = State()

    def increment(_: int) -> None:
        for _ in range(100):
            with state.edit_extra_data() as data:
                data["count"] = data.get("count", 0) + 1

    run_together(THREADS, increment)
    assert state.extra_data["count"] == THREADS * 100
    entries = [entry for entry in state.history if entry.kind == "extra_data"]
    assert len(entries) == THREADS * 100
    assert [e.content.changed["count"] for e in entries if e.kind == "extra_data"] == list(
        range(1, THREADS * 100 + 1)
    )
    assert_replays(state.snapshot())


def test_edit_extra_data_of_separate_keys_lose_nothing() -> None:
    state = State(extra_data={"total": 0})

    def edit(index: int) -> None:
        for step in range(100):
            with state.edit_extra_data() as data:
                data.setdefault(f"t{index}", []).append(step)
                data["total"] += 1

    run_together(THREADS, edit)
    assert state.extra_data["total"] == THREADS * 100
    for index in range(THREADS):
        assert state.extra_data[f"t{index}"] == list(range(100))
    assert_replays(state.snapshot())


def test_add_message_keeps_each_threads_order() -> None:
    state = State(messages=[Message.user("start")])

    def add(index: int) -> None:
        for step in range(50):
            if step % 5 == 0:
                state.add_message(Message.notice(f"t{index}:{step}"))
            else:
                state.add_message(Message.user(f"t{index}:{step}"))

    run_together(THREADS, add)
    texts = [message.text.removeprefix("[notice] ") for message in state.messages]
    assert len(texts) == 1 + THREADS * 50
    for index in range(THREADS):
        mine = [t for t in texts if t.startswith(f"t{index}:")]
        assert mine == [f"t{index}:{step}" for step in range(50)]
    kinds = [entry.kind for entry in state.history]
    assert kinds.count("user") == THREADS * 40
    assert kinds.count("notice") == THREADS * 10
    assert_replays(state.snapshot())


@pytest.mark.parametrize("typed", [False, True], ids=["handler", "schema"])
def test_concurrent_set_with_merge_lists_loses_nothing(typed: bool) -> None:
    state = State(schema={"items": {"type": list[str]}}) if typed else State()

    def append(index: int) -> None:
        for step in range(50):
            if typed:
                state.set("items", [f"{index}-{step}"])
            else:
                state.set("items", [f"{index}-{step}"], handler=merge_lists)

    run_together(THREADS, append)
    items = list(state.get("items"))
    assert len(items) == THREADS * 50
    assert set(items) == {f"{i}-{s}" for i in range(THREADS) for s in range(50)}
    for index in range(THREADS):
        assert [i for i in items if i.startswith(f"{index}-")] == [
            f"{index}-{step}" for step in range(50)
        ]
    assert_replays(state.snapshot())


def test_tool_results_from_worker_threads_enter_as_one_message_in_request_order() -> None:
    state = State(messages=[Message.user("go")])
    calls = tuple(call(f"c{index}") for index in range(THREADS * 2))
    begin_think(state, model="fake")
    record_reply(state, Reply(Message.assistant("", calls)))

    def work(index: int) -> bool:
        if index % 2:
            state.add_message(Message.notice(f"worker {index} is busy"))
        tool_call = calls[index]
        block = ToolResultBlock(tool_call.id, (TextBlock(f"result {index}"),))
        entry = record_tool_result(state, tool_call, block, outcome="done")
        return entry.late

    lates = run_together(len(calls), work)
    assert lates == [False] * len(calls)
    assert state.pending_calls == ()
    results = state.messages[2]
    assert [b.call_id for b in results.tool_results] == [c.id for c in calls]
    assert [b.text for b in results.tool_results] == [f"result {i}" for i in range(len(calls))]
    held = state.messages[3:]
    assert sorted(m.text for m in held) == sorted(
        f"[notice] worker {i} is busy" for i in range(len(calls)) if i % 2
    )
    assert_replays(state.snapshot())


def test_a_state_and_its_fork_written_at_once_stay_apart() -> None:
    state = State(messages=[Message.user("start")], extra_data={"n": 0})
    copy = state.fork()
    shared = len(state.history)

    def write(index: int) -> None:
        target = state if index % 2 == 0 else copy
        for step in range(100):
            target.add_message(Message.user(f"{index}:{step}"))

    run_together(THREADS, write)
    for target, owners in ((state, {0, 2, 4, 6}), (copy, {1, 3, 5, 7})):
        assert target.history[:shared] == state.history[:shared]
        texts = [message.text for message in target.messages[1:]]
        assert {int(text.split(":")[0]) for text in texts} == owners
        assert len(texts) == len(owners) * 100
        assert_replays(target.snapshot())


# Readers while writers write ------------------------------------------------------------------


def with_readers(
    writers: list[Callable[[], None]], readers: int, read_once: Callable[[], None]
) -> list[int]:
    """Run the writers and `readers` threads calling `read_once` until every writer is done.

    Each reader reads at least once after the last write. Returns how often each reader read.
    """
    done = threading.Event()
    lock = threading.Lock()
    finished: list[int] = []

    def role(index: int) -> int:
        if index < len(writers):
            try:
                writers[index]()
            finally:
                with lock:
                    finished.append(index)
                    if len(finished) == len(writers):
                        done.set()
            return 0
        reads = 0
        while True:
            last_round = done.is_set()
            read_once()
            reads += 1
            if last_round:
                return reads

    return run_together(len(writers) + readers, role)[len(writers) :]


def _consistent(snap: StateSnapshot) -> None:
    """Everything in one snapshot belongs together: its values agree with its history."""
    assert_replays(snap)
    edits = [e for e in snap.history if e.kind == "extra_data"]
    users = [e.content.text for e in snap.history if e.kind == "user"]
    assert snap.extra_data["count"] == len(edits) - 1
    assert [m.text for m in snap.messages[1:]] == users


def test_readers_always_see_a_consistent_snapshot() -> None:
    state = State(messages=[Message.user("start")], extra_data={"count": 0})

    def writer(index: int) -> Callable[[], None]:
        def write() -> None:
            for step in range(100):
                if step % 2:
                    state.add_message(Message.user(f"{index}:{step}"))
                else:
                    with state.edit_extra_data() as data:
                        data["count"] += 1

        return write

    local = threading.local()

    def read_once() -> None:
        _consistent(state.snapshot())
        # Single properties read a value that only grows while nothing goes back.
        history, messages = state.history, state.messages
        seen_history: tuple[object, ...] = getattr(local, "history", ())
        seen_messages: tuple[Message, ...] = getattr(local, "messages", ())
        assert history[: len(seen_history)] == seen_history
        assert messages[: len(seen_messages)] == seen_messages
        local.history, local.messages = history, messages

    reads = with_readers([writer(i) for i in range(4)], 4, read_once)
    assert all(count >= 1 for count in reads)
    final = state.snapshot()
    _consistent(final)
    assert final.extra_data["count"] == 4 * 50
    assert len(final.messages) == 1 + 4 * 50


def test_readers_see_consistent_snapshots_while_others_restore() -> None:
    state = State(messages=[Message.user("start")], extra_data={"count": 0})

    def writer(index: int) -> Callable[[], None]:
        def write() -> None:
            for step in range(60):
                before = state.snapshot()
                with state.edit_extra_data() as data:
                    data["count"] += 1
                state.add_message(Message.user(f"{index}:{step}"))
                if step % 3 == 0:
                    state.restore(before)

        return write

    def read_once() -> None:
        snap = state.snapshot()
        assert_replays(snap)
        assert snap.history[0].kind == "context_change"
        assert len(snap.messages) >= 1

    reads = with_readers([writer(i) for i in range(4)], 4, read_once)
    assert all(count >= 1 for count in reads)
    final = state.snapshot()
    assert_replays(final)
    restores = [e for e in final.history if e.kind == "context_change"]
    assert len(restores) == 1 + 4 * 20
