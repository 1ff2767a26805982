"""What each model request of a State sent: the messages of its history folded up to it.

Replay compares them with what a request sends now; the viewer and `show` list them. Derived
from the history alone, so it lives with the record.
"""

from __future__ import annotations

import bisect

from .._base._messages import Message
from ._history import ContextChangeEntry, ModelRequestEntry
from ._state import State

__all__ = ("request_messages",)

# The context changes that rewrite earlier messages; every other entry only appends to them.
_REWRITES = frozenset({"compact", "clear_tool_results", "restore"})


def request_messages(state: State) -> dict[int, tuple[Message, ...]]:
    """The messages each model request of `state` sent, by the request entry's `seq`.

    A request's messages are those of the history folded up to it: what the model was sent.
    Between two changes that rewrite messages (a compaction, cleared tool results, a restore)
    messages are only appended, so one fold at the end of each such stretch gives the messages
    of every request in it, as the first `message_count` of them: a long State is read in one
    pass, not one fold per request (which grows with the square of its turns).
    """
    history = state.history
    stretch_ends = [
        entry.seq
        for entry in history
        if isinstance(entry, ContextChangeEntry) and entry.content.kind in _REWRITES
    ]
    stretch_ends.append(len(history))
    folded: dict[int, tuple[Message, ...]] = {}
    sent: dict[int, tuple[Message, ...]] = {}
    for entry in history:
        if isinstance(entry, ModelRequestEntry):
            end = stretch_ends[bisect.bisect_right(stretch_ends, entry.seq)]
            if end not in folded:
                folded[end] = tuple(State(history=history[:end]).messages)
            sent[entry.seq] = folded[end][: entry.content.message_count]
    return sent
