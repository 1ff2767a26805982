"""`State`: one conversation's record, folded from an append-only history.

Every change goes through `State._record`, which builds one history entry and passes it through
the fold (`orchestrator._fold`). Commands take one lock; properties read the current immutable
value without locking.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import re
import sys
import threading
import uuid
from collections.abc import Generator, Iterable, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Never, cast

import anyio.lowlevel
import anyio.to_thread
import pydantic_core

from ._fold import Folded, Inconsistent, Lookup, cleared_messages, entry_turn, fold, replay
from ._history import (
    KIND_OF,
    AskEntry,
    AskRecord,
    ContextChange,
    ContextChangeEntry,
    ErrorEntry,
    ExtraDataChange,
    ExtraDataEntry,
    HistoryEntry,
    ModelReplyEntry,
    ModelRequest,
    ModelRequestEntry,
    NoticeEntry,
    Outcome,
    RunStart,
    RunStartEntry,
    StopEntry,
    ToolResultEntry,
    UserEntry,
)
from ._json import FrozenDict, freeze, same_json, thaw
from ._messages import Image, Message, TextBlock, ToolCall, ToolResultBlock
from ._reply import Reply, Usage
from ._snapshot import StateSnapshot, snapshot_origin
from ._stopped import Stopped, StoppedByFinish
from ._typed import Handler, Schema, SchemaField, replace_values

__all__ = ("State", "validate_id")

_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")

_RENAMED = {
    "task": "messages=[Message.user(task)]",
    "context": "messages=[...] (a list of Message objects)",
    "data": "extra_data={...}",
}
_PARAMETERS = ("id", "messages", "extra_data", "history", "schema")


def validate_id(value: object, what: str = "id") -> str:
    """Return `value` if it is a valid State id; raise `TypeError`/`ValueError` saying why not."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}.")
    if not _ID.fullmatch(value):
        shown = value if len(value) <= 40 else value[:37] + "..."
        raise ValueError(
            f"{what} {shown!r} is not valid: use 1 to 128 ASCII letters, digits, '_' or '-'"
            f" (it is {len(value)} characters long)."
        )
    return value


def _now() -> datetime:
    return datetime.now(UTC)


def _unknown_keywords(kwargs: Mapping[str, object]) -> TypeError:
    name = next(iter(kwargs))
    if name in _RENAMED:
        return TypeError(f"State() has no {name}= argument any more: use {_RENAMED[name]}.")
    close = difflib.get_close_matches(name, _PARAMETERS, n=1)
    hint = f" Did you mean {close[0]}=?" if close else ""
    return TypeError(
        f"State() got an unexpected keyword {name}=. It takes {', '.join(_PARAMETERS)}.{hint}"
    )


def is_interruption(error: BaseException) -> bool:
    """Whether `error` is a cancellation (asyncio or trio) or Ctrl+C, also outside a loop."""
    if isinstance(error, asyncio.CancelledError | KeyboardInterrupt):
        return True
    trio: Any = sys.modules.get("trio")
    return trio is not None and isinstance(error, trio.Cancelled)


def error_text(error: BaseException) -> str:
    """How an exception is recorded: ``"TypeName: message"``."""
    if is_interruption(error):
        return f"{type(error).__name__}: interrupted"
    message = str(error)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def _as_json(key: str, field: SchemaField | None, value: Any) -> Any:
    """`value` as frozen JSON.

    A declared key also takes what pydantic can turn into JSON (a datetime, an enum member),
    since its type validates it.
    """
    if field is not None:
        with contextlib.suppress(pydantic_core.PydanticSerializationError):
            value = pydantic_core.to_jsonable_python(value)
    return freeze(value, f"state[{key!r}]")


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


class State:
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

    __slots__ = (
        "__weakref__",
        "_children",
        "_children_store",
        "_compacting",
        "_effect_scope",
        "_folded",
        "_handlers",
        "_id",
        "_lock",
        "_recorded",
        "_running",
        "_schema",
        "_snapshot",
        "_store",
    )

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
        self._id = uuid.uuid4().hex if id is None else validate_id(id)
        self._lock = threading.RLock()
        self._schema = None if schema is None else Schema.parse(schema, RESERVED)
        self._store: Any = None
        self._children_store: Any = None  # a fork opens children from its original's store
        self._children: dict[str, State] = {}
        self._compacting = False
        self._running = False
        # What a subagent's memory writes are keyed under: its place in the parent's call, so a
        # replayed call's new child writes under the same keys (None: this State's id).
        self._effect_scope: str | None = None
        self._recorded: BaseException | None = None
        self._handlers: dict[str, Mapping[str, Handler]] = {}
        self._snapshot: tuple[Folded, StateSnapshot] | None = None
        imported = self._check_messages(messages)
        if history is not None:
            if imported or extra_data:
                raise TypeError(
                    "State(history=...) cannot be combined with messages= or extra_data=: the"
                    " history already holds them. Add them after, with add_message or set."
                )
            if isinstance(history, str | bytes | Mapping):
                raise TypeError("history must be a sequence of history entries (state.history).")
            self._folded = replay(history)
            if self._schema is not None:
                self._check_schema_data(self._folded.extra_data)
            return
        self._folded = replay(())
        if imported:
            self._record(ContextChangeEntry, ContextChange(kind="import", messages=imported))
        if extra_data is not None:
            if not isinstance(extra_data, Mapping):
                raise TypeError(
                    f"extra_data must be a dict of JSON values, got {type(extra_data).__name__}."
                )
            data = cast("FrozenDict[str, Any]", freeze(extra_data, "extra_data"))
            if self._schema is not None:
                data = FrozenDict[str, Any]({**data, **self._check_schema_data(data)})
            if data:
                self._record(ExtraDataEntry, ExtraDataChange(changed=data))

    @staticmethod
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

    def _check_schema_data(
        self, data: Mapping[str, Any], schema: Schema | None = None
    ) -> dict[str, Any]:
        schema = schema or self._schema
        assert schema is not None
        checked: dict[str, Any] = {}
        for key, value in data.items():
            field = schema.fields.get(key)
            if field is not None:
                checked[key] = field.validate(thaw(value))
        return checked

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

    def snapshot(self) -> StateSnapshot:
        """The current value of this State: frozen, and what `restore` can go back to."""
        value = self._folded
        cached = self._snapshot
        if cached is not None and cached[0] is value:
            return cached[1]
        snap = value.snapshot(self._id)
        self._snapshot = (value, snap)
        return snap

    # -- typed data ------------------------------------------------------------------------------

    def _field(self, key: str) -> SchemaField | None:
        if not isinstance(key, str):
            raise TypeError(f"State keys are strings, got {type(key).__name__}.")
        if self._schema is None:
            return None
        field = self._schema.fields.get(key)
        if field is None:
            declared = ", ".join(repr(name) for name in self._schema.fields) or "none"
            close = difflib.get_close_matches(key, list(self._schema.fields), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise KeyError(
                f"{key!r} is not a key of this State's schema (declared: {declared}).{hint}"
                " Add it to the schema to store it."
            )
        return field

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
            field = self._field(key)
            merged = self._merged(key, field, value, handler)
            data = self._folded.extra_data
            if key in data and same_json(data[key], merged):
                return
            self._record(ExtraDataEntry, ExtraDataChange(changed={key: merged}))

    def _merged(
        self, key: str, field: SchemaField | None, value: Any, handler: Handler | None
    ) -> Any:
        new = thaw(_as_json(key, field, value))
        data = self._folded.extra_data
        current = thaw(data[key]) if key in data else None
        merge = handler or (field.handler if field is not None else replace_values)
        merged = merge(current, new)
        if field is None:
            return freeze(merged, f"state[{key!r}]")
        return field.validate(merged)

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
        self._record(NoticeEntry if message.is_notice else UserEntry, message)

    def finish(self, answer: Any = None) -> None:
        """End the run: `stopped` becomes `StoppedByFinish(answer)` and the loop stops.

        A finished State cannot think, use tools, ask or run again; only `restore` to an earlier
        snapshot takes it back. `None` keeps an earlier answer.

        Raises:
            TypeError: `answer` cannot be turned into JSON.
        """
        self._record(StopEntry, StoppedByFinish(answer))

    def compact(self, summary: str) -> None:
        """Replace the messages with the first user message and `summary`. History keeps all.

        Raises:
            TypeError: `summary` is not a string.
            ValueError: Tool calls are pending, or `summary` is empty.
        """
        self._compact(summary, Usage())

    def _compact(self, summary: str, usage: Usage, covered: int | None = None) -> None:
        if not isinstance(summary, str):
            raise TypeError(f"compact takes the summary as a str, got {type(summary).__name__}.")
        if not summary.strip():
            raise ValueError("compact got an empty summary: say what the model should keep.")
        with self._lock:
            self._require_closed_turn("compact")
            change = ContextChange(kind="compact", summary=summary, usage=usage, covered=covered)
            self._record(ContextChangeEntry, change)

    def clear_tool_results(self, keep_last: int = 5) -> None:
        """Blank all but the last `keep_last` tool results in the messages. History keeps them.

        Raises:
            ValueError: Tool calls are pending, or `keep_last` is not an integer >= 0.
        """
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0:
            raise ValueError(f"keep_last must be an integer >= 0, got {keep_last!r}.")
        with self._lock:
            self._require_closed_turn("clear_tool_results")
            if cleared_messages(self._folded.messages.to_tuple(), keep_last) is None:
                return
            change = ContextChange(kind="clear_tool_results", keep_last=keep_last)
            self._record(ContextChangeEntry, change)

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
            after = cast("FrozenDict[str, Any]", freeze(data, "extra_data"))
            changed = {
                key: value
                for key, value in after.items()
                if key not in before or not same_json(before[key], value)
            }
            removed = [key for key in before if key not in after]
            if self._schema is not None:
                changed.update(self._check_schema_data(changed))
            if changed or removed:
                self._record(ExtraDataEntry, ExtraDataChange(changed=changed, removed=removed))

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
            copy._id = uuid.uuid4().hex
            copy._lock = threading.RLock()
            copy._folded = value
            copy._schema = self._schema
            copy._store = None
            copy._children_store = self._store or self._children_store
            copy._children = self._children
            copy._compacting = False
            copy._effect_scope = None
            copy._running = False
            copy._recorded = None
            copy._handlers = {}
            copy._snapshot = None
            return copy

    def _child_ids(self) -> set[str]:
        return {
            child
            for entry in self._folded.entries.to_tuple()
            if entry.kind == "tool_result"
            for child in entry.child_ids
        }

    def _find_child(self, child_id: str) -> State | None:
        if not isinstance(child_id, str):
            raise TypeError(f"child_id must be a str, got {type(child_id).__name__}.")
        if child_id not in self._child_ids():
            raise KeyError(
                f"{child_id!r} is not a child of this State: no tool call of its history started"
                " it. A grandchild opens from its parent: state.child(a).child(b)."
            )
        found = self._children.get(child_id)
        if found is None and self._child_store() is None:
            raise ValueError(
                f"The child {child_id!r} is not in memory and this State has no store to load it"
                " from: open it with store.load(child_id) from the store its run used."
            )
        return found

    def _child_store(self) -> Any:
        return self._store if self._store is not None else self._children_store

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
        store = self._child_store()
        load = getattr(store, "load", None)
        if getattr(store, "async_only", False) or not callable(load):
            raise TypeError(
                f"The store bound to this State ({type(store).__name__}) works only"
                " asynchronously: use await state.achild(child_id)."
            )
        return cast("State", load(child_id))

    async def achild(self, child_id: str) -> State:
        """The async version of `child`: a child not in memory is loaded with `store.aload`."""
        await anyio.lowlevel.checkpoint()
        found = self._find_child(child_id)
        if found is not None:
            return found
        store = self._child_store()
        aload: Any = getattr(store, "aload", None)
        if aload is not None:
            return cast("State", await aload(child_id))
        # A sync-only store: load in a worker thread, never on the event loop.
        return cast("State", await anyio.to_thread.run_sync(store.load, child_id))

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
            self._require_closed_turn("restore")
            if self._compacting:
                raise ValueError("restore while a compaction is under way: wait for it to end.")
            if target.waiting:
                raise ValueError(
                    "restore got a snapshot taken while the model was being waited on: take"
                    " snapshots between turns."
                )
            change = ContextChange(kind="restore", restored_to=size)
            self._record(ContextChangeEntry, change, lookup=lambda _: target)

    # -- the recording protocol ------------------------------------------------------------------

    def _require_closed_turn(self, what: str) -> None:
        value = self._folded
        if value.waiting:
            raise ValueError(f"{what}() while the model is being waited on: call it between turns.")
        if value.pending:
            names = ", ".join(call.name for call in value.pending)
            raise ValueError(
                f"{what}() while tool calls are pending ({names}): every call needs a result"
                " first (agent.use_tools(state))."
            )

    def _record(
        self,
        entry_type: type[HistoryEntry],
        content: Any,
        *,
        lookup: Lookup | None = None,
        **fields: Any,
    ) -> HistoryEntry:
        """Build one entry of `entry_type` and fold it in: the only way this State changes."""
        with self._lock:
            value = self._folded
            kind = KIND_OF[entry_type]
            entry = entry_type(
                seq=len(value.entries),
                turn=entry_turn(value, kind),
                at=_now(),
                content=content,
                **fields,
            )
            try:
                self._folded = fold(value, entry, lookup)
            except Inconsistent as error:
                raise ValueError(f"Cannot record a {kind} entry: {error}.") from None
            return entry

    # -- hooks for the agent loop and the stores (library use only) ------------------------------

    def _begin_think(self, *, model: str | None = None) -> Sequence[Message]:
        """Record a model request; returns the messages the request must carry (a view)."""
        with self._lock:
            if self._folded.finished:
                raise ValueError(
                    "This State is finished: it cannot think again. Restore an earlier snapshot,"
                    " or start a new State from state.messages."
                )
            self._require_closed_turn("think")
            messages = self._folded.messages
            self._record(ModelRequestEntry, ModelRequest(model=model, message_count=len(messages)))
            return messages

    def _record_reply(self, reply: Reply) -> ModelReplyEntry:
        if not isinstance(reply, Reply):
            raise TypeError(f"A model must return a Reply, got {type(reply).__name__}.")
        return cast("ModelReplyEntry", self._record(ModelReplyEntry, reply))

    def _record_error(
        self, error: BaseException | str, *, again: bool = False
    ) -> ErrorEntry | None:
        """Record a failure as ``"TypeName: message"``.

        An exception object is recorded once per run: the run that it leaves does not record it
        a second time. `again` records it even so (a failed think must always be taken back).
        """
        if isinstance(error, str):
            return cast("ErrorEntry", self._record(ErrorEntry, error))
        with self._lock:
            recorded = self._recorded
            same = recorded is error or (
                recorded is not None and is_interruption(recorded) and is_interruption(error)
            )
            if same and not again:
                return None
            self._recorded = error
            return cast("ErrorEntry", self._record(ErrorEntry, error_text(error)))

    def _record_stop(self, stopped: Stopped) -> StopEntry:
        return cast("StopEntry", self._record(StopEntry, stopped))

    def _record_run_start(self, start: RunStart) -> RunStartEntry:
        return cast("RunStartEntry", self._record(RunStartEntry, start))

    def _record_ask(
        self, question: str, answer: Any, usage: Usage, error: str | None = None
    ) -> AskEntry:
        record = AskRecord(question=question, answer=answer, usage=usage, error=error)
        return cast("AskEntry", self._record(AskEntry, record))

    def _record_tool_result(
        self,
        call: ToolCall,
        result: ToolResultBlock,
        *,
        outcome: Outcome,
        child_ids: Iterable[str] = (),
        usage: Usage | None = None,
        state_update: Mapping[str, Any] | None = None,
        handlers: Mapping[str, Handler] | None = None,
    ) -> ToolResultEntry:
        """Record `call`'s result; a call that is no longer pending gets a `late` entry.

        When it is the turn's last result, the turn's state updates are applied in request order
        as one `extra_data` entry.
        """
        with self._lock:
            late = call.id not in self._folded.pending_ids
            calls = self._folded.calls
            earlier = self._folded.results  # this turn's results so far, as the fold holds them
            if handlers and not late:
                self._handlers[call.id] = handlers
            entry = self._record(
                ToolResultEntry,
                result,
                call=call,
                outcome=outcome,
                child_ids=tuple(child_ids),
                late=late,
                usage=usage or Usage(),
                state_update=state_update,
            )
            entry = cast("ToolResultEntry", entry)
            if not late and not self._folded.pending:
                self._apply_turn_updates(calls, (*earlier.to_tuple(), entry))
            return entry

    def _close_pending(
        self,
        outcome: Outcome,
        text: str,
        links: Mapping[str, tuple[Iterable[str], Usage]] | None = None,
    ) -> tuple[ToolResultEntry, ...]:
        """Give every pending call an error result `text` with `outcome`.

        `links` gives, by call id, the subagent States a call started and what they spent.
        """
        links = links or {}
        with self._lock:
            entries: list[ToolResultEntry] = []
            for call in self._folded.pending:
                child_ids, usage = links.get(call.id, ((), None))
                entries.append(
                    self._record_tool_result(
                        call,
                        ToolResultBlock(call.id, (TextBlock(text),), is_error=True),
                        outcome=outcome,
                        child_ids=child_ids,
                        usage=usage,
                    )
                )
            return tuple(entries)

    def _apply_turn_updates(
        self, calls: tuple[ToolCall, ...], results: tuple[ToolResultEntry, ...]
    ) -> None:
        """Apply the state updates of the turn that just closed, in request order.

        `results` are the turn's results as the fold held them (after a restore, only those of
        the restored timeline). Each key merges through its handler, so calls of one turn never
        see each other's updates and the later call in request order wins a replace. Recorded
        as one `extra_data` entry. An update that no longer validates once merged with the
        ones before it is not applied, and a notice tells the model so.
        """
        updates = {entry.call.id: entry.state_update for entry in results if entry.state_update}
        handlers, self._handlers = self._handlers, {}
        if not updates:
            return
        staged = dict(self._folded.extra_data)
        changed: dict[str, Any] = {}
        refused: list[str] = []
        for call in calls:
            attempt: dict[str, Any] = {}
            try:
                for key, value in (updates.get(call.id) or {}).items():
                    field = self._schema.fields.get(key) if self._schema is not None else None
                    merge = handlers.get(call.id, {}).get(key) or (
                        field.handler if field is not None else replace_values
                    )
                    current = attempt[key] if key in attempt else staged.get(key)
                    merged = merge(thaw(current) if current is not None else None, thaw(value))
                    attempt[key] = field.validate(merged) if field is not None else freeze(merged)
            except (ValueError, TypeError) as error:
                refused.append(f"the state update of {call.name} ({call.id}): {error}")
                continue
            staged.update(attempt)
            changed.update(attempt)
        before = self._folded.extra_data
        changed = {
            key: value
            for key, value in changed.items()
            if key not in before or not same_json(before[key], value)
        }
        if changed:
            self._record(ExtraDataEntry, ExtraDataChange(changed=changed))
        for text in refused:
            self._record(NoticeEntry, Message.notice(f"Not applied, {text}"))

    def _check_update(
        self, update: Mapping[str, Any], handlers: Mapping[str, Handler] | None = None
    ) -> dict[str, Any]:
        """A tool's state update, checked now against the schema and the current values.

        Raises `KeyError` for an undeclared key, `TypeError` for a non-JSON value and
        `ValueError` for a value its key's type refuses. Returns the update as frozen JSON.
        """
        checked: dict[str, Any] = {}
        with self._lock:
            for key, value in update.items():
                field = self._field(key)
                handler = handlers.get(key) if handlers else None
                self._merged(key, field, value, handler)
                checked[key] = _as_json(key, field, value)
        return checked

    @contextmanager
    def _compaction(self) -> Generator[None, None, None]:
        """Mark a compaction as under way (restore refuses meanwhile)."""
        with self._lock:
            if self._compacting:
                raise ValueError("A compaction of this State is already under way.")
            self._compacting = True
        try:
            yield
        finally:
            self._compacting = False

    def _begin_run(self) -> None:
        with self._lock:
            if self._running:
                raise ValueError(
                    f"State {self._id} is already running: one run at a time per State. Wait for"
                    " it to end, or run a fork()."
                )
            self._running = True

    def _end_run(self) -> None:
        self._running = False
        self._recorded = None

    def _recover(
        self, links: Mapping[str, tuple[Iterable[str], Usage]] | None = None
    ) -> tuple[HistoryEntry, ...]:
        """Close a turn that a crash cut off, as a store does on load; returns the new entries.

        A request that was waiting on the model is taken back (an `error` entry), and each
        pending call gets an ``unknown`` result: the tool may or may not have run, so it is never
        run again on its own.
        """
        with self._lock:
            start = len(self._folded.entries)
            if self._folded.waiting:
                self._record_error(
                    "Interrupted: the process stopped while the model was being waited on;"
                    " the request was taken back."
                )
            if self._folded.pending:
                self._close_pending(
                    "unknown",
                    "(unknown: the process stopped while this call was open; the tool may or may"
                    " not have run. Check its effects before running it again.)",
                    links,
                )
            return self._entries_from(start)

    def _bind_store(self, store: Any) -> None:
        self._store = store

    def _bind_schema(self, schema: Schema) -> None:
        with self._lock:
            if self._schema is None:
                self._check_schema_data(self._folded.extra_data, schema)
                self._schema = schema
            elif self._schema != schema:
                raise ValueError(
                    f"State {self._id} has a schema that differs from the agent's state_schema:"
                    " run it with an agent of the same schema, or a State without one."
                )

    def _add_child(self, child: State) -> None:
        self._children[child.id] = child

    def _entries_from(self, seq: int) -> tuple[HistoryEntry, ...]:
        """The entries from position `seq` on (what a store has not written yet)."""
        entries = self._folded.entries
        return tuple(entries.get(i) for i in range(seq, len(entries)))

    @classmethod
    def _from_entries(cls, state_id: str, entries: Iterable[HistoryEntry]) -> State:
        """A State rebuilt from stored entries under its saved id."""
        return cls(id=state_id, history=entries)


RESERVED: frozenset[str] = frozenset(name for name in dir(State) if not name.startswith("_"))
