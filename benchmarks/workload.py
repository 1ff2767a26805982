"""A realistic, deterministic history, recorded through the real State methods and loop hooks.

One turn of the mix: sometimes a user message, a model request, a reply that either asks for two
tool calls (their results recorded out of order) or answers in text, and sometimes an
`extra_data` edit. About 4.5 entries per turn.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator import (
    HistoryEntry,
    Message,
    Reply,
    State,
    TextBlock,
    ToolCall,
    ToolResultBlock,
    Usage,
)
from orchestrator._record._recording import begin_think, record_reply, record_tool_result

__all__ = ("USAGE", "Recorded", "build_history", "record_turn", "record_until")

USAGE = Usage(input_tokens=10, output_tokens=5, requests=1)


def record_turn(state: State, i: int) -> int:
    """Record turn number `i` of the mix on `state`; return how many entries it added."""
    added = 0
    if i % 3 == 0:
        state.add_message(Message.user(f"Step {i}: read module {i % 17} and say what it does."))
        added += 1
    begin_think(state, model="fake")
    added += 1
    if i % 5 == 4:
        record_reply(state, Reply(Message.assistant(f"Step {i} is done."), USAGE))
        added += 1
    else:
        calls = (
            ToolCall(f"call_{i}_0", "tool", {"x": i}),
            ToolCall(f"call_{i}_1", "tool", {"x": i + 1}),
        )
        record_reply(state, Reply(Message.assistant("..", calls), USAGE))
        added += 1
        for call in reversed(calls):  # the second call finishes first
            record_tool_result(
                state, call, ToolResultBlock(call.id, (TextBlock("result text"),)), outcome="done"
            )
            added += 1
    if i % 4 == 0:
        with state.edit_extra_data() as data:
            data["step"] = i
            data["module"] = f"m{i % 17}"
        added += 1
    return added


def record_until(state: State, entries: int, first_turn: int = 0) -> tuple[int, int]:
    """Record whole turns from `first_turn` until at least `entries` entries were added.

    Returns the number of entries added and the next turn number.
    """
    added = 0
    turn = first_turn
    while added < entries:
        added += record_turn(state, turn)
        turn += 1
    return added, turn


@dataclass(frozen=True, slots=True)
class Recorded:
    """A recorded history and where its turns end (a prefix ending there has no open turn)."""

    history: tuple[HistoryEntry, ...]
    turn_ends: tuple[int, ...]

    def closed_prefix(self, at_least: int) -> tuple[tuple[HistoryEntry, ...], int]:
        """The shortest prefix with at least `at_least` entries that ends between turns, and
        the number of the turn that comes next.
        """
        for turn, end in enumerate(self.turn_ends):
            if end >= at_least:
                return self.history[:end], turn + 1
        raise ValueError(f"the recorded history has fewer than {at_least} entries")


def build_history(entries: int) -> Recorded:
    """Record the mix on a new State until it has at least `entries` entries."""
    state = State(messages=[Message.user("Find the bug in this repo")], extra_data={"repo": "api"})
    size = 2  # the import and the extra_data entries
    ends: list[int] = []
    turn = 0
    while size < entries:
        size += record_turn(state, turn)
        ends.append(size)
        turn += 1
    return Recorded(state.history, tuple(ends))
