"""`State`: one conversation's record, folded from an append-only history.

The public class. What a State holds and the operations that record entries are in
`_record._recording`; typed data's merge and validation in `_record._typed`. Commands
take the State's lock; properties read the current immutable value without locking.
"""

from __future__ import annotations

import difflib
import uuid
from collections.abc import Generator, Iterable, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Never, cast

import anyio.lowlevel

from .._base._json import FrozenDict, freeze_values, same_json, thaw
from .._base._messages import Image, Message, TextBlock, ToolCall
from .._base._reply import Usage
from .._base._stopped import Stopped, StoppedByFinish
from ._fold import cleared_messages, replay
from ._history import (
    AskEntry,
    ContextChange,
    ContextChangeEntry,
    ExtraDataChange,
    ExtraDataEntry,
    HistoryEntry,
    ModelRequestEntry,
    NoticeEntry,
    StopEntry,
    UserEntry,
)
from ._prompt import Prompt
from ._recording import (
    StateParts,
    child_store,
    compacting,
    init_state,
    known_child,
    record,
    record_compact,
    require_closed_turn,
    snapshot_of,
)
from ._recording import bind_state as bind_state
from ._recording import recover_state as recover_state
from ._recording import storage_view as storage_view
from ._recording import validate_id as validate_id
from ._snapshot import StateSnapshot, snapshot_origin
from ._typed import Handler, Schema, merge_value

__all__ = (
    "RESERVED",
    "State",
    "bind_state",
    "recover_state",
    "storage_view",
    "validate_id",
)


_RENAMED = {
    "task": "messages=[Message.user(task)]",
    "context": "messages=[...] (a list of Message objects)",
    "data": "extra_data={...}",
}
_PARAMETERS = ("id", "messages", "extra_data", "history", "schema")


def _unknown_keywords(kwargs: Mapping[str, object]) -> TypeError:
    name = next(iter(kwargs))
    if name in _RENAMED:
        return TypeError(f"State() has no {name}= argument any more: use {_RENAMED[name]}.")
    close = difflib.get_close_matches(name, _PARAMETERS, n=1)
    hint = f" Did you mean {close[0]}=?" if close else ""
    return TypeError(
        f"State() got an unexpected keyword {name}=. It takes {', '.join(_PARAMETERS)}.{hint}"
    )


def _check_new_message(message: object) -> Message:
    if not isinstance(message, Message):
        raise TypeError(
            f"add_message takes a Message, got {type(message).__name__}: use"
            " Message.user(text) or Message.notice(text)."
        )
    if message.role != "user":
        raise ValueError(
            "add_message takes user messages only (Message.user or Message.notice); assistant"
            " messages come from the model."
        )
    for block in message.content:
        if not isinstance(block, TextBlock | Image):
            raise ValueError(
                f"add_message takes text and images only, got a {type(block).__name__} block."
            )
    if not message.text and not message.images:
        raise ValueError("add_message got a message with no text and no image: add some text.")
    return message


def _check_messages(messages: object) -> tuple[Message, ...]:
    if isinstance(messages, str | bytes | Message) or not isinstance(messages, Iterable):
        raise TypeError(
            "messages must be a list of Message objects, e.g. [Message.user(text)],"
            f" got {type(messages).__name__}."
        )
    items = tuple(cast("Iterable[object]", messages))
    for index, item in enumerate(items):
        if not isinstance(item, Message):
            raise TypeError(
                f"messages[{index}] is a {type(item).__name__}, not a Message: wrap text"
                " in Message.user(text)."
            )
    return cast("tuple[Message, ...]", items)


class State(StateParts):
    """One conversation's record: the messages the model sees and everything that happened.

    Create it with the messages to start from, pass it to `agent.run` to keep it after the run,
    or continue it after Ctrl+C. Its methods are the only way to change it and all are
    thread-safe, so tools may call them from worker threads. Read values with the properties, or
    take `snapshot()` for several values that must belong together.

    Example:
        ```python
        state = State(messages=[Message.user("Find the bug")], extra_data={"repo": "api"})
        print(state.messages[0].text, state.extra_data["repo"])
        ```
    """

    __slots__ = ()

    def __init__(
        self,
        *args: Never,
        id: str | None = None,
        messages: Iterable[Message] = (),
        extra_data: Mapping[str, Any] | None = None,
        history: Iterable[HistoryEntry] | None = None,
        schema: Any = None,
        **kwargs: Never,
    ) -> None:
        """Start a State, empty or from messages, extra data or a history (keyword-only).

        Raises:
            TypeError: A positional argument, an unknown keyword, `messages` that is not a list of
                `Message`, a non-JSON `extra_data` value, a `history` item that is not an entry,
                or `history` together with `messages` or `extra_data`.
            ValueError: `id` has other characters, `history` is inconsistent (the message names
                the entry's index), or `extra_data` fails the schema.
        """
        if args:
            raise TypeError(
                "State() takes keyword arguments only, e.g."
                " State(messages=[Message.user('hi')], extra_data={'k': 1})."
            )
        if kwargs:
            raise _unknown_keywords(kwargs)
        state_id = uuid.uuid4().hex if id is None else validate_id(id)
        parsed = None if schema is None else Schema.parse(schema, RESERVED)
        imported = _check_messages(messages)
        if history is not None:
            if imported or extra_data:
                raise TypeError(
                    "State(history=...) cannot be combined with messages= or extra_data=: the"
                    " history already holds them. Add them after, with add_message or set."
                )
            if isinstance(history, str | bytes | Mapping):
                raise TypeError("history must be a sequence of history entries (state.history).")
            folded = replay(history)
            if parsed is not None:
                parsed.validate_data(folded.extra_data)
            init_state(self, id=state_id, folded=folded, schema=parsed)
            return
        init_state(self, id=state_id, folded=replay(()), schema=parsed)
        if imported:
            record(self, ContextChangeEntry, ContextChange(kind="import", messages=imported))
        if extra_data is not None:
            if not isinstance(extra_data, Mapping):
                raise TypeError(
                    f"extra_data must be a dict of JSON values, got {type(extra_data).__name__}."
                )
            data = freeze_values(extra_data, "extra_data")
            if parsed is not None:
                data = freeze_values({**data, **parsed.validate_data(data)}, "extra_data")
            if data:
                record(self, ExtraDataEntry, ExtraDataChange(changed=data))

    # -- reading ---------------------------------------------------------------------------------

    def __repr__(self) -> str:
        value = self._folded
        return (
            f"<State {self._id} turn={value.turn} messages={len(value.messages)}"
            f" entries={len(value.entries)}{' finished' if value.finished else ''}>"
        )

    @property
    def id(self) -> str:
        """The name a store saves this State under. Given with `State(id=...)`, or random."""
        return self._id

    @property
    def parent_id(self) -> str | None:
        """The id of the State whose tool call started this one, or None."""
        return self._folded.parent_id

    @property
    def parent_call_id(self) -> str | None:
        """The `ToolCall.id` of the parent's call that started this State, or None."""
        return self._folded.parent_call_id

    @property
    def history(self) -> tuple[HistoryEntry, ...]:
        """Everything that happened, oldest first. Entries are only ever added."""
        return self._folded.entries.to_tuple()

    @property
    def messages(self) -> tuple[Message, ...]:
        """The messages the model will see at the next think."""
        return self._folded.messages.to_tuple()

    @property
    def pending_calls(self) -> tuple[ToolCall, ...]:
        """Tool calls of this turn that have no result yet, in request order."""
        return self._folded.pending

    @property
    def turn(self) -> int:
        """Completed model replies, plus one while a request waits on the model."""
        return self._folded.turn

    @property
    def usage(self) -> Usage:
        """Tokens, requests and cost of every think, ask and compact, subagents included."""
        return self._folded.usage

    @property
    def extra_data(self) -> FrozenDict[str, Any]:
        """Your own values (read-only JSON). Change them with `edit_extra_data()` or `set`."""
        return self._folded.extra_data

    @property
    def finished(self) -> bool:
        """Whether `finish()` was called (and not undone by `restore`)."""
        return self._folded.finished

    @property
    def answer(self) -> Any:
        """The value given to `finish`, else the text of the latest reply without tool calls."""
        value = self._folded
        return value.answer if value.answer is not None else value.last_text

    @property
    def stopped(self) -> Stopped | None:
        """Why this run is set to stop, or None until something decides that."""
        return self._folded.stopped

    @property
    def children(self) -> tuple[str, ...]:
        """The ids of the subagent States this State's tool calls started, in history order.

        Each is listed once, in the order of the tool results that name it (a call's own
        children in the order they started). Open one with `child(id)`.
        """
        found = dict.fromkeys(
            child
            for entry in self._folded.entries.to_tuple()
            if entry.kind == "tool_result"
            for child in entry.child_ids
        )
        return tuple(found)

    @property
    def created_at(self) -> datetime | None:
        """The `at` of the first history entry (UTC), or None while the history is empty."""
        return self._folded.at_first

    @property
    def updated_at(self) -> datetime | None:
        """The `at` of the latest history entry (UTC), or None while the history is empty."""
        return self._folded.at_last

    @property
    def schema(self) -> Any:
        """The schema given with `State(schema=...)` or bound by an Agent, or None."""
        return None if self._schema is None else self._schema.source

    def prompt_of(
        self, request: ModelRequestEntry | AskEntry | ContextChangeEntry
    ) -> Prompt | None:
        """The prompt (instructions, tools, options) that `request` used, if this history has it.

        `request` is a model request entry of `state.history`, or an `ask` or a compaction
        entry (their requests record their prompt too: the instructions and options, no tools).
        None when the entry did not record one (histories written before prompts were, a
        compaction whose summary the caller gave), or when another State of the tree holds it:
        a subagent's request names the State that stored the prompt first
        (`request.content.prompt_holder`, its ancestor or an earlier sibling), so ask that one:
        ``store.load(holder).prompt_of(request)``.

        Raises:
            TypeError: `request` is not one of those entries.
        """
        if not isinstance(request, ModelRequestEntry | AskEntry | ContextChangeEntry):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(
                f"prompt_of takes a model request, ask or compaction entry of state.history,"
                f" got {type(request).__name__}."
            )
        digest = request.content.prompt
        return None if digest is None else self._folded.prompts.get(digest)

    def snapshot(self) -> StateSnapshot:
        """The current value of this State: frozen, and what `restore` can go back to."""
        return snapshot_of(self)

    # -- typed data ------------------------------------------------------------------------------

    def get(self, key: str, default: Any = None) -> Any:
        """The stored value of `key` (frozen JSON), or the schema's default, or `default`."""
        data = self._folded.extra_data
        if key in data:
            return data[key]
        if self._schema is not None:
            field = self._schema.fields.get(key)
            if field is not None and field.has_default:
                return field.default
        return default

    def has(self, key: str) -> bool:
        """Whether `key` has been set (None counts as a value)."""
        return key in self._folded.extra_data

    def set(self, key: str, value: Any, *, handler: Handler | None = None) -> None:
        """Merge `value` into `key` with its handler, validate it, and record the change.

        The handler is `handler` if given, else the schema's (`merge_lists` for lists,
        `replace_values` otherwise). Nothing is recorded when the value stays the same.

        Raises:
            KeyError: The State has a schema that does not declare `key`.
            TypeError: `value` is not JSON.
            ValueError: The merged value does not match the key's type.
        """
        with self._lock:
            data = self._folded.extra_data
            merged = merge_value(self._schema, data, key, value, handler)
            if key in data and same_json(data[key], merged):
                return
            record(self, ExtraDataEntry, ExtraDataChange(changed={key: merged}))

    # -- commands --------------------------------------------------------------------------------

    def add_message(self, message: Message) -> None:
        """Add a user message or a notice to the conversation.

        While tool calls are pending, or while a think waits on the model, the message is held
        and goes in right after the results or the reply.

        Raises:
            TypeError: `message` is not a `Message`.
            ValueError: It is not a user message, has blocks other than text and images, or has
                no text and no image.
        """
        message = _check_new_message(message)
        record(self, NoticeEntry if message.is_notice else UserEntry, message)

    def finish(self, answer: Any = None) -> None:
        """End the run: `stopped` becomes `StoppedByFinish(answer)` and the loop stops.

        A finished State cannot think, use tools, ask or run again; only `restore` to an earlier
        snapshot takes it back. `None` keeps an earlier answer.

        Raises:
            TypeError: `answer` cannot be turned into JSON.
        """
        record(self, StopEntry, StoppedByFinish(answer))

    def compact(self, summary: str) -> None:
        """Replace the messages with the first user message and `summary`. History keeps all.

        Raises:
            TypeError: `summary` is not a string.
            ValueError: Tool calls are pending, or `summary` is empty.
        """
        record_compact(self, summary, Usage())

    def clear_tool_results(self, keep_last: int = 5) -> None:
        """Blank all but the last `keep_last` tool results in the messages. History keeps them.

        Raises:
            ValueError: Tool calls are pending, or `keep_last` is not an integer >= 0.
        """
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0:
            raise ValueError(f"keep_last must be an integer >= 0, got {keep_last!r}.")
        with self._lock:
            require_closed_turn(self, "clear_tool_results")
            if cleared_messages(self._folded.messages.to_tuple(), keep_last) is None:
                return
            change = ContextChange(kind="clear_tool_results", keep_last=keep_last)
            record(self, ContextChangeEntry, change)

    @contextmanager
    def edit_extra_data(self) -> Generator[dict[str, Any], None, None]:
        """Change `extra_data` inside a ``with`` block, recorded as one entry when it ends.

        The block gets an editable deep copy. Edits take turns (the lock is held for the whole
        block), so ``data["n"] = data.get("n", 0) + 1`` never loses an update. If the block
        raises, nothing changes. If nothing changed, nothing is recorded.

        Raises:
            TypeError: At the end of the block, a value is not JSON (the message names the key).
            ValueError: A key declared in the schema got a value of the wrong type.
        """
        with self._lock:
            before = self._folded.extra_data
            data = cast("dict[str, Any]", thaw(before))
            yield data
            after = freeze_values(data, "extra_data")
            changed = {
                key: value
                for key, value in after.items()
                if key not in before or not same_json(before[key], value)
            }
            removed = [key for key in before if key not in after]
            if self._schema is not None:
                changed.update(self._schema.validate_data(changed))
            if changed or removed:
                record(self, ExtraDataEntry, ExtraDataChange(changed=changed, removed=removed))

    def fork(self) -> State:
        """A new State with the same history and value, a new id, and no store or agent.

        Raises:
            ValueError: The model is being waited on: fork before the think or after it returns.
        """
        with self._lock:
            value = self._folded
            if value.waiting:
                raise ValueError(
                    "fork() while the model is being waited on: fork before think(), or after it"
                    " returns (e.g. in Reporter.on_think_end)."
                )
            copy = State.__new__(State)
            init_state(
                copy,
                id=uuid.uuid4().hex,
                folded=value,
                schema=self._schema,
                children_store=child_store(self),
                children=self._children,
            )
            return copy

    def _child_ids(self) -> set[str]:
        return set(self.children)

    def _find_child(self, child_id: str) -> State | None:
        if not isinstance(child_id, str):
            raise TypeError(f"child_id must be a str, got {type(child_id).__name__}.")
        if child_id not in self._child_ids():
            raise KeyError(
                f"{child_id!r} is not a child of this State: no tool call of its history started"
                " it. A grandchild opens from its parent: state.child(a).child(b)."
            )
        found = known_child(self, child_id)
        if found is None and child_store(self) is None:
            raise ValueError(
                f"The child {child_id!r} is not in memory and this State has no store to load it"
                " from: open it with store.load(child_id) from the store its run used."
            )
        return found

    def child(self, child_id: str) -> State:
        """The subagent State `child_id`, which a tool call of this State started.

        Raises:
            KeyError: `child_id` is not a child of this State.
            ValueError: It is a child, but it is not in memory and no store is bound.
            TypeError: The bound store works only asynchronously: use `achild`.
            LookupError: The store has no State with this id.
        """
        found = self._find_child(child_id)
        if found is not None:
            return found
        client = child_store(self)
        assert client is not None  # _find_child raised otherwise
        store = client.sync_store(
            f"The store bound to this State ({type(client.store).__name__}) works only"
            " asynchronously: use await state.achild(child_id)."
        )
        return store.load(child_id)

    async def achild(self, child_id: str) -> State:
        """The async version of `child`: a child not in memory is loaded with `store.aload`."""
        await anyio.lowlevel.checkpoint()
        found = self._find_child(child_id)
        if found is not None:
            return found
        client = child_store(self)
        assert client is not None  # _find_child raised otherwise
        return await client.load(child_id)  # a sync-only store's in a worker thread

    def restore(self, snapshot: StateSnapshot) -> None:
        """Go back to `snapshot`, taken earlier from this State.

        Every value goes back except `usage` (the tokens were spent) and `history`, which keeps
        everything and gets one `context_change` entry saying the State went back.

        Raises:
            TypeError: `snapshot` is not a `StateSnapshot`.
            ValueError: It is not from this State, tool calls are pending, the model is being
                waited on, a compaction is under way, or it was taken while the model was waited on.
        """
        if not isinstance(snapshot, StateSnapshot):
            raise TypeError(
                "restore takes a StateSnapshot from state.snapshot(),"
                f" got {type(snapshot).__name__}."
            )
        target, taken_by = snapshot_origin(snapshot)
        with self._lock:
            value = self._folded
            size = len(target.entries) if target is not None else -1
            if (
                target is None
                or taken_by != self._id
                or size > len(value.entries)
                or (size > 0 and value.entries.get(size - 1) != target.entries.last())
            ):
                raise ValueError(
                    "restore got a snapshot that is not from this State: take it with"
                    " state.snapshot() on the State you restore (a fork has its own snapshots)."
                )
            require_closed_turn(self, "restore")
            if compacting(self):
                raise ValueError("restore while a compaction is under way: wait for it to end.")
            if target.waiting:
                raise ValueError(
                    "restore got a snapshot taken while the model was being waited on: take"
                    " snapshots between turns."
                )
            change = ContextChange(kind="restore", restored_to=size)
            record(self, ContextChangeEntry, change, lookup=lambda _: target)


RESERVED: frozenset[str] = frozenset(name for name in dir(State) if not name.startswith("_"))
