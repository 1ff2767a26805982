"""Quick start: a State, its typed data, one turn, snapshots, fork, restore, finish and replay.

An Agent drives a State for you (see examples/parallel_agents.py), recording each step of a
turn as one history entry. Here one turn is written by hand, entry by entry (a State is its
history, so the State after a step is `State(history=...)` with one more entry), to show what
the State does on its own. Run it with ``python examples/quickstart.py``.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

from orchestrator import (
    HistoryEntry,
    Message,
    ModelReplyEntry,
    ModelRequest,
    ModelRequestEntry,
    Reply,
    State,
    TextBlock,
    ToolCall,
    ToolResultBlock,
    ToolResultEntry,
    Usage,
    merge_lists,
)


def describe(message: Message) -> str:
    """One line for a message: who, and what it holds."""
    if message.tool_calls:
        return f"assistant asks for {', '.join(c.id for c in message.tool_calls)}"
    if message.tool_results:
        return f"user brings the results of {', '.join(r.call_id for r in message.tool_results)}"
    return f"{message.role}: {message.text}"


def show(state: State) -> None:
    for number, message in enumerate(state.messages, 1):
        print(f"   {number}. {describe(message)}")


def result(call: ToolCall, text: str) -> ToolResultBlock:
    return ToolResultBlock(call.id, (TextBlock(text),))


def then(state: State, entry_type: type[HistoryEntry], content: Any, **fields: Any) -> State:
    """`state` after one more step: its history and one more entry (what an Agent records)."""
    turn = state.turn + 1 if entry_type is ModelRequestEntry else state.turn
    entry = entry_type(
        seq=len(state.history), turn=turn, at=datetime.now(UTC), content=content, **fields
    )
    return State(id=state.id, history=[*state.history, entry], schema=state.schema)


def think(state: State, reply: Reply) -> State:
    """`state` after the model was asked and gave `reply`."""
    asked = ModelRequest(model="fake", message_count=len(state.messages))
    return then(then(state, ModelRequestEntry, asked), ModelReplyEntry, reply)


def main() -> None:
    print("1. A State with a first message, free-form extra data and a typed key")
    state = State(
        id="quickstart",
        messages=[Message.user("Find the bug in the payments service")],
        extra_data={"repo": "payments"},
        schema={"notes": {"type": list[str]}},
    )
    print(f"   id={state.id} messages={len(state.messages)} repo={state.extra_data['repo']}")

    print("2. Typed data: list keys merge with merge_lists, values are validated")
    state.set("notes", ["look at refunds"])
    state.set("notes", "check the retry loop")  # a single item is appended too
    print(f"   notes: {list(state.get('notes'))}")
    print(f"   merge_lists(['a'], 'b') == {merge_lists(['a'], 'b')}")
    try:
        state.set("notes", [{"not": "a string"}])
    except ValueError as error:
        print(f"   refused: {str(error).split(' (')[0]}")
    try:
        state.set("owner", "me")
    except KeyError:
        print(f"   refused: 'owner' is not declared; has('owner') is {state.has('owner')}")

    print("3. One turn: the model asks for two tools; their results come back out of order")
    read = ToolCall("call_1", "read_file", {"path": "refunds.py"})
    test = ToolCall("call_2", "run_tests", {"suite": "refunds"})
    usage = Usage(input_tokens=120, output_tokens=30, requests=1)
    state = think(state, Reply(Message.assistant("Let me look.", [read, test]), usage))
    print(f"   pending: {[call.name for call in state.pending_calls]}")
    state = then(state, ToolResultEntry, result(test, "2 failed"), call=test, outcome="done")
    state.add_message(Message.user("Also check the retry loop"))  # arrives mid-turn: held
    print(f"   after the first result: pending {[c.name for c in state.pending_calls]}")
    state = then(
        state, ToolResultEntry, result(read, "def refund(): ..."), call=read, outcome="done"
    )
    results = state.messages[-2].tool_results
    print(f"   results in request order: {', '.join(r.call_id for r in results)}")
    show(state)

    print("4. Snapshot, fork and restore")
    before = state.snapshot()
    attempt = state.fork()
    attempt.add_message(Message.user("Try rewriting the module instead"))
    print(f"   the fork has {len(attempt.messages)} messages, the original {len(state.messages)}")
    state.add_message(Message.notice("The tests were flaky"))
    state.set("notes", "flaky tests?")
    state.restore(before)
    print(f"   restored: {len(state.messages)} messages, notes {list(state.get('notes'))}")
    back = state.messages == before.messages and state.extra_data == before.extra_data
    print(f"   messages and extra data are back: {back}")
    print(f"   the history keeps all {len(state.history)} entries, the restore included")

    print("5. The model answers in text, and the run finishes with a JSON answer")
    state = think(state, Reply(Message.assistant("refunds.py retries twice."), usage))
    state.finish({"file": "refunds.py", "line": 42})
    print(f"   answer: {dict(state.answer)}  finished: {state.finished}  turn: {state.turn}")
    print(f"   stopped: {state.stopped}")
    print(f"   usage: {state.usage.input_tokens} in, {state.usage.output_tokens} out")

    print("6. Replay: the history alone rebuilds the same value")
    kinds = Counter(entry.kind for entry in state.history)
    print(f"   {len(state.history)} entries: {dict(kinds)}")
    copy = State(history=state.history)
    print(f"   snapshot equal after replay: {copy.snapshot() == state.snapshot()}")


if __name__ == "__main__":
    main()
