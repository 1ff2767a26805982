"""The fold: a State's value computed from its history, one entry at a time.

``fold(value, entry)`` is a pure function. Recording, `State(history=...)`, loading and `fork`
all go through it, so a State rebuilt from its history always has the same value.

Recording is O(1) amortized: message and entry sequences share append-only backing lists between
successive values, and tuples are only built when somebody reads them.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any, ClassVar, TypeVar, cast, overload

from .._base._json import FrozenDict, empty_dict, freeze_values
from .._base._messages import Message, TextBlock, ToolCall, ToolResultBlock
from .._base._reply import Usage
from .._base._stopped import AwaitingCall, Stopped, StoppedByApproval, StoppedByFinish
from ._history import (
    ENTRY_TYPES,
    ApprovalEntry,
    ApprovalRecord,
    ContextChangeEntry,
    ErrorEntry,
    ExtraDataEntry,
    HistoryEntry,
    ModelReplyEntry,
    ModelRequestEntry,
    PromptEntry,
    StopEntry,
    ToolResultEntry,
)
from ._prompt import Prompt
from ._snapshot import StateSnapshot, with_origin

__all__ = ("CLEARED", "Folded", "Inconsistent", "Seq", "cleared_messages", "fold", "replay")

CLEARED = "(cleared: kept in history)"

_T = TypeVar("_T")
_GROW = threading.Lock()


class Inconsistent(ValueError):
    """An entry cannot follow the ones before it."""


class Seq(Sequence[_T]):
    """An immutable sequence that appends in O(1) by sharing its backing list.

    Appending to the longest sequence of a backing list extends that list in place; appending to
    a shorter one (an older value, after a restore) copies its prefix first. It is also a cheap
    read-only view: a model request holds the messages as a `Seq`, not a copy.
    """

    __slots__ = ("_items", "_len", "_tuple")

    def __init__(self, items: list[_T], length: int) -> None:
        self._items = items
        self._len = length
        self._tuple: tuple[_T, ...] | None = None

    @classmethod
    def of(cls, items: Iterable[_T]) -> Seq[_T]:
        """A sequence holding `items`."""
        backing = list(items)
        return cls(backing, len(backing))

    def append(self, item: _T) -> Seq[_T]:
        """A new sequence with `item` at the end; this one is unchanged."""
        with _GROW:
            items = self._items
            if self._len == 0:
                items = []  # never grow a list shared by every empty sequence
            elif len(items) != self._len:
                items = items[: self._len]
            items.append(item)
        return Seq(items, self._len + 1)

    def extend(self, items: Iterable[_T]) -> Seq[_T]:
        """A new sequence with `items` at the end."""
        result = self
        for item in items:
            result = result.append(item)
        return result

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> _T: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[_T, ...]: ...
    def __getitem__(self, index: int | slice) -> _T | tuple[_T, ...]:
        if isinstance(index, slice):
            return self.to_tuple()[index]
        size = self._len
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError("sequence index out of range")
        return self._items[index]

    def __iter__(self) -> Iterator[_T]:
        # islice stops at our length even if the backing list grows meanwhile.
        return itertools.islice(self._items, self._len)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Seq | tuple | list):
            items = cast("Sequence[object]", other)
            return len(items) == self._len and all(
                a is b or a == b for a, b in zip(self, items, strict=True)
            )
        return NotImplemented

    __hash__: ClassVar[None] = None  # type: ignore[assignment]  # equal to lists: unhashable

    def __repr__(self) -> str:
        return f"Seq({list(self)!r})"

    @property
    def origin(self) -> object:
        """What the items live in: sequences of one origin have the same items where both have one.

        Appending never changes an item already there (a shorter sequence copies first), so
        what is known of an origin's first items stays true: a cache may key on it.
        """
        return self._items

    def last(self) -> _T:
        """The last item; the sequence must not be empty."""
        return self._items[self._len - 1]

    def get(self, index: int) -> _T:
        """The item at `index` (0 <= index < len)."""
        if not 0 <= index < self._len:
            raise IndexError(index)
        return self._items[index]

    def after(self, start: int) -> tuple[_T, ...]:
        """The items from `start` on, as a tuple (one slice of the backing list)."""
        return tuple(self._items[max(0, start) : self._len])

    def to_tuple(self) -> tuple[_T, ...]:
        """The items as a tuple, built once per sequence."""
        if self._tuple is None:
            # One slice, atomic under the GIL: another thread may append to the backing list.
            self._tuple = tuple(self._items[: self._len])
        return self._tuple


_NO_ENTRIES: Seq[Any] = Seq([], 0)


class Folded:
    """The folded value of a history: what a snapshot is made from. Never changed once built."""

    __slots__ = (
        "answer",
        "at_first",
        "at_last",
        "awaiting",
        "calls",
        "decided_now",
        "decisions",
        "due",
        "entries",
        "extra_data",
        "finished",
        "held",
        "last_text",
        "linked",
        "messages",
        "parent_call_id",
        "parent_id",
        "pending",
        "pending_ids",
        "prompts",
        "results",
        "stopped",
        "turn",
        "usage",
        "waiting",
    )

    entries: Seq[HistoryEntry]
    messages: Seq[Message]
    turn: int
    usage: Usage
    extra_data: FrozenDict[str, Any]
    finished: bool
    answer: Any  # given to finish(), or None
    last_text: str | None  # text of the latest reply without tool calls
    stopped: Stopped | None
    linked: bool  # a run_start has set the parent links
    parent_id: str | None
    parent_call_id: str | None
    waiting: bool  # a model request has no reply yet
    calls: tuple[ToolCall, ...]  # the open turn's calls, in request order
    pending: tuple[ToolCall, ...]
    pending_ids: tuple[str, ...]  # the ids of `pending`, to find a call in C speed
    prompts: dict[str, Prompt]  # the prompts recorded, by digest (never changed)
    results: Seq[ToolResultEntry]  # the open turn's results, in the order they came
    held: tuple[Message, ...]  # added while the turn was open: they go in after it
    due: tuple[ToolResultEntry, ...]  # the closed turn's results whose updates wait to merge
    at_first: datetime | None
    at_last: datetime | None
    awaiting: tuple[AwaitingCall, ...]  # the open turn's calls waiting for a person
    decisions: dict[str, ApprovalRecord]  # decided ones of them, by call id (never changed)
    decided_now: frozenset[str]  # decided since the latest run start: not run yet

    def copy(self) -> Folded:
        """A shallow copy, to be changed before anyone else sees it.

        The fold copies the value once per entry: one assignment per slot, written out, is
        about twice as fast as a loop over the slots (a test checks that it copies them all).
        """
        new = object.__new__(Folded)
        new.answer = self.answer
        new.at_first = self.at_first
        new.at_last = self.at_last
        new.awaiting = self.awaiting
        new.calls = self.calls
        new.decided_now = self.decided_now
        new.decisions = self.decisions
        new.due = self.due
        new.entries = self.entries
        new.extra_data = self.extra_data
        new.finished = self.finished
        new.held = self.held
        new.last_text = self.last_text
        new.linked = self.linked
        new.messages = self.messages
        new.parent_call_id = self.parent_call_id
        new.parent_id = self.parent_id
        new.pending = self.pending
        new.pending_ids = self.pending_ids
        new.prompts = self.prompts
        new.results = self.results
        new.stopped = self.stopped
        new.turn = self.turn
        new.usage = self.usage
        new.waiting = self.waiting
        return new

    @property
    def open_turn(self) -> bool:
        """Whether the model is waited on or tool calls are pending."""
        return self.waiting or bool(self.pending)

    def snapshot(self, state_id: str | None) -> StateSnapshot:
        """The public value, with tuples built now."""
        answer = self.answer if self.answer is not None else self.last_text
        snap = StateSnapshot(
            history=self.entries.to_tuple(),
            messages=self.messages.to_tuple(),
            pending_calls=self.pending,
            turn=self.turn,
            usage=self.usage,
            extra_data=self.extra_data,
            finished=self.finished,
            answer=answer,
            stopped=self.stopped,
            created_at=self.at_first,
            updated_at=self.at_last,
        )
        return with_origin(snap, self, state_id)


def _empty() -> Folded:
    new = object.__new__(Folded)
    new.entries = _NO_ENTRIES
    new.messages = _NO_ENTRIES
    new.turn = 0
    new.usage = Usage()
    new.extra_data = empty_dict()
    new.finished = False
    new.answer = None
    new.last_text = None
    new.stopped = None
    new.linked = False
    new.parent_id = None
    new.parent_call_id = None
    new.waiting = False
    new.calls = ()
    new.pending = ()
    new.pending_ids = ()
    new.prompts = {}
    new.results = _NO_ENTRIES
    new.held = ()
    new.due = ()
    new.at_first = None
    new.at_last = None
    new.awaiting = ()
    new.decisions = {}
    new.decided_now = frozenset()
    return new


EMPTY = _empty()

Lookup = Callable[[int], Folded]


def entry_turn(value: Folded, kind: str) -> int:
    """The `turn` an entry of `kind` gets when recorded after `value`."""
    return value.turn + 1 if kind == "model_request" else value.turn


def _flush_held(new: Folded) -> None:
    if new.held:
        new.messages = new.messages.extend(new.held)
        new.held = ()


def _require_closed_turn(value: Folded, what: str) -> None:
    if value.waiting:
        raise Inconsistent(f"{what} while the model is being waited on")
    if value.pending:
        raise Inconsistent(f"{what} while tool calls are pending")


def first_user_message(messages: Iterable[Message]) -> Message | None:
    """The first user message that is not a message of tool results."""
    for message in messages:
        if message.role == "user" and not message.tool_results:
            return message
    return None


def compacted_messages(messages: Iterable[Message], summary: str) -> tuple[Message, ...]:
    """The messages after a compaction: the first user message, then the summary."""
    first = first_user_message(messages)
    note = Message.notice(f"Summary of the conversation so far:\n{summary}")
    return (first, note) if first is not None else (note,)


def cleared_messages(messages: tuple[Message, ...], keep_last: int) -> tuple[Message, ...] | None:
    """The messages with all but the last `keep_last` tool results blanked, or None if unchanged."""
    seen = 0
    changed = False
    out: list[Message] = []
    for message in reversed(messages):
        if message.role != "user" or not message.tool_results:
            out.append(message)
            continue
        blocks: list[Any] = []
        for block in reversed(message.content):
            if isinstance(block, ToolResultBlock):
                seen += 1
                if seen > keep_last and block.content != (TextBlock(CLEARED),):
                    block = ToolResultBlock(block.call_id, (TextBlock(CLEARED),), block.is_error)
                    changed = True
            blocks.append(block)
        out.append(Message("user", tuple(reversed(blocks))))
    if not changed:
        return None
    return tuple(reversed(out))


def _context_change(new: Folded, entry: ContextChangeEntry, lookup: Lookup | None) -> None:
    change = entry.content
    _require_closed_turn(new, f"a {change.kind} context change")
    _named_prompt(new, change.prompt, change.prompt_holder, f"a {change.kind} context change")
    if change.kind == "import":
        new.messages = new.messages.extend(change.messages)
    elif change.kind == "compact":
        if not change.summary or not change.summary.strip():
            raise Inconsistent("a compaction without a summary")
        messages = new.messages.to_tuple()
        covered = len(messages) if change.covered is None else change.covered
        if not 0 <= covered <= len(messages):
            raise Inconsistent(f"a compaction covering {covered} of {len(messages)} messages")
        kept = compacted_messages(messages[:covered], change.summary) + messages[covered:]
        new.messages = Seq[Message].of(kept)
        new.usage = new.usage + change.usage
    elif change.kind == "clear_tool_results":
        keep = change.keep_last
        if keep is None or keep < 0:
            raise Inconsistent(f"clear_tool_results with keep_last={keep!r}")
        cleared = cleared_messages(new.messages.to_tuple(), keep)
        if cleared is not None:
            new.messages = Seq[Message].of(cleared)
    else:  # restore
        target_len = change.restored_to
        if target_len is None or not 0 <= target_len < len(new.entries):
            raise Inconsistent(f"a restore to position {target_len!r}, which is not before it")
        if lookup is None:
            raise Inconsistent("a restore with nothing to restore to")
        target = lookup(target_len)
        if target.waiting:
            raise Inconsistent("a restore to a point where the model was being waited on")
        for name in ("messages", "turn", "extra_data", "finished", "answer", "last_text"):
            setattr(new, name, getattr(target, name))
        for name in ("stopped", "calls", "pending", "pending_ids", "results", "held"):
            setattr(new, name, getattr(target, name))


def _extra_data(new: Folded, entry: ExtraDataEntry, lookup: Lookup | None) -> None:
    change = entry.content
    if change.turn_merge:
        new.due = ()
    data = dict(new.extra_data)
    data.update(change.changed)
    for key in change.removed:
        data.pop(key, None)
    new.extra_data = freeze_values(data, "extra_data")


def _run_start(new: Folded, entry: HistoryEntry, lookup: Lookup | None) -> None:
    if new.waiting:
        raise Inconsistent("a run started while the model is being waited on")
    assert entry.kind == "run_start"
    new.stopped = None
    new.decided_now = frozenset()  # this run runs the decided calls
    if not new.linked:
        new.linked = True
        new.parent_id = entry.content.parent_id
        new.parent_call_id = entry.content.parent_call_id


def _model_request(new: Folded, entry: ModelRequestEntry, lookup: Lookup | None) -> None:
    _require_closed_turn(new, "a model request")
    if new.due:
        raise Inconsistent("a model request while the last turn's state updates wait to merge")
    _named_prompt(new, entry.content.prompt, entry.content.prompt_holder, "a model request")
    new.turn += 1
    new.waiting = True


def _named_prompt(new: Folded, digest: str | None, holder: str | None, what: str) -> None:
    """Check the prompt an entry (`what`) names: recorded before it, or held by `holder`."""
    if holder is not None:  # held by another State of the tree: the store keeps it there
        if digest is None:
            raise Inconsistent(f"{what} naming State {holder!r} but no prompt digest")
    elif digest is not None and digest not in new.prompts:
        raise Inconsistent(f"{what} naming the prompt {digest!r}, which is not recorded")


def _prompt(new: Folded, entry: PromptEntry, lookup: Lookup | None) -> None:
    digest = entry.content.digest
    if digest in new.prompts:
        raise Inconsistent(f"the prompt {digest!r} recorded a second time")
    new.prompts = {**new.prompts, digest: entry.content}


def _model_reply(new: Folded, entry: ModelReplyEntry, lookup: Lookup | None) -> None:
    if not new.waiting:
        raise Inconsistent("a model reply without a model request waiting for it")
    reply = entry.content
    new.waiting = False
    new.messages = new.messages.append(reply.message)
    new.usage = new.usage + reply.usage
    calls = reply.message.tool_calls
    if len({call.id for call in calls}) != len(calls):
        raise Inconsistent("a model reply with two tool calls of the same id")
    if calls:
        new.calls = calls
        new.pending = calls
        new.pending_ids = tuple(call.id for call in calls)
        new.results = _NO_ENTRIES
    else:
        new.last_text = reply.message.text
        _flush_held(new)


def _tool_result(new: Folded, entry: ToolResultEntry, lookup: Lookup | None) -> None:
    call = entry.call
    if entry.content.call_id != call.id:
        raise Inconsistent(f"a result for {entry.content.call_id!r} recorded for call {call.id!r}")
    if not entry.usage.is_empty():
        new.usage = new.usage + entry.usage
    if entry.late:
        return
    try:
        index = new.pending_ids.index(call.id)
    except ValueError:
        raise Inconsistent(f"a result for the call {call.id!r}, which is not pending") from None
    new.pending = new.pending[:index] + new.pending[index + 1 :]
    new.pending_ids = new.pending_ids[:index] + new.pending_ids[index + 1 :]
    new.results = new.results.append(entry)
    if new.awaiting:
        new.awaiting = tuple(
            item for item in new.awaiting if item.call.id != call.id and item.via != call.id
        )
    if not new.pending:
        new.awaiting = ()
        new.decisions = {}
        new.decided_now = frozenset()
        by_id = {result.call.id: result for result in new.results.to_tuple()}
        ordered = tuple(by_id[item.id] for item in new.calls)
        new.messages = new.messages.append(Message("user", tuple(r.content for r in ordered)))
        new.due = tuple(result for result in ordered if result.merge_due)
        new.calls = ()
        new.results = _NO_ENTRIES
        _flush_held(new)


def _message(new: Folded, entry: HistoryEntry, lookup: Lookup | None) -> None:
    assert entry.kind == "user" or entry.kind == "notice"
    if new.open_turn:
        new.held = (*new.held, entry.content)
    else:
        new.messages = new.messages.append(entry.content)


def _error(new: Folded, entry: ErrorEntry, lookup: Lookup | None) -> None:
    if new.waiting:
        new.waiting = False
        new.turn -= 1
        _flush_held(new)
    new.stopped = None


def _stop(new: Folded, entry: StopEntry, lookup: Lookup | None) -> None:
    stopped = entry.content
    new.stopped = stopped
    if isinstance(stopped, StoppedByApproval):
        for item in stopped.calls:
            if (item.via or item.call.id) not in new.pending_ids:
                raise Inconsistent(
                    f"an approval stop for the call {item.via or item.call.id!r}, which is not"
                    " pending"
                )
        new.awaiting = stopped.calls
        ids = {item.call.id for item in stopped.calls}
        new.decisions = {key: value for key, value in new.decisions.items() if key in ids}
    if isinstance(stopped, StoppedByFinish):
        new.finished = True
        if stopped.answer is not None:
            new.answer = stopped.answer


def _ask(new: Folded, entry: HistoryEntry, lookup: Lookup | None) -> None:
    assert entry.kind == "ask"
    asked = entry.content
    _named_prompt(new, asked.prompt, asked.prompt_holder, "an ask")
    new.usage = new.usage + asked.usage


def _approval(new: Folded, entry: ApprovalEntry, lookup: Lookup | None) -> None:
    record = entry.content
    if not any(item.call.id == record.call_id for item in new.awaiting):
        raise Inconsistent(f"a decision on the call {record.call_id!r}, which waits for none")
    if record.call_id in new.decisions:
        raise Inconsistent(f"a second decision on the call {record.call_id!r}")
    new.decisions = {**new.decisions, record.call_id: record}
    new.decided_now = new.decided_now | {record.call_id}


_STEPS: dict[str, Callable[[Folded, Any, Lookup | None], None]] = {
    "context_change": _context_change,
    "extra_data": _extra_data,
    "run_start": _run_start,
    "model_request": _model_request,
    "model_reply": _model_reply,
    "tool_result": _tool_result,
    "user": _message,
    "notice": _message,
    "error": _error,
    "stop": _stop,
    "ask": _ask,
    "approval": _approval,
    "prompt": _prompt,
}


def fold(value: Folded, entry: HistoryEntry, lookup: Lookup | None = None) -> Folded:
    """The value after `entry`. Raises `Inconsistent` if the entry cannot follow `value`.

    `lookup(n)` gives the value after the first `n` entries; only a restore entry needs it.
    """
    new = value.copy()
    _step(new, entry, lookup)
    return new


def _step(new: Folded, entry: HistoryEntry, lookup: Lookup | None) -> None:
    """Change `new`, a value nobody else sees yet, into the value after `entry`.

    Every step replaces the containers it changes and never changes one in place, so a value
    copied before the step (`Folded.copy` is shallow) keeps what it held.
    """
    position = len(new.entries)
    if entry.seq != position:
        raise Inconsistent(f"its seq is {entry.seq}, but it is at position {position}")
    expected = entry_turn(new, entry.kind)
    if entry.turn != expected:
        raise Inconsistent(f"its turn is {entry.turn}, but the turn there is {expected}")
    new.entries = new.entries.append(entry)
    if new.at_first is None:
        new.at_first = entry.at
    new.at_last = entry.at
    _STEPS[entry.kind](new, entry, lookup)


def replay(entries: Iterable[HistoryEntry]) -> Folded:
    """Fold a whole history into its value.

    Raises `TypeError` for an item that is not an entry, and `ValueError` naming the index of an
    entry that cannot follow the ones before it.
    """
    items = list(entries)
    targets: set[int] = set()
    for index, entry in enumerate(items):
        if not isinstance(entry, ENTRY_TYPES):
            raise TypeError(
                f"history[{index}] is a {type(entry).__name__}, not a history entry: pass"
                " other_state.history or what a store loaded."
            )
        if isinstance(entry, ContextChangeEntry) and entry.content.restored_to is not None:
            targets.add(entry.content.restored_to)
    saved: dict[int, Folded] = {}
    if 0 in targets:
        saved[0] = EMPTY
    # One value, changed entry by entry: nobody sees it before replay returns, so the copy that
    # `fold` makes per entry is needed only where a restore will look back.
    value = EMPTY.copy()
    for index, entry in enumerate(items):
        try:
            _step(value, entry, saved.__getitem__)
        except Inconsistent as error:
            raise ValueError(
                f"history[{index}] ({entry.kind}) cannot follow the entries before it: {error}."
                " Pass a whole history, unchanged, as other_state.history or a store gives it."
            ) from None
        if index + 1 in targets:
            saved[index + 1] = value.copy()
    return value
