"""The core of `State`: its attributes, the recording protocol, and the hooks the library uses.

`State` (in `orchestrator._state`) adds the public API on top. Every change goes through
`StateCore._record`, which builds one history entry and passes it through the fold
(`orchestrator._fold`): the fold is the protocol. The hooks below are for the agent loop and
the stores only; each records entries through `_record`.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import re
import sys
import threading
from collections.abc import Generator, Iterable, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

import pydantic_core

from ._fold import Folded, Inconsistent, Lookup, entry_turn, fold
from ._history import (
    KIND_OF,
    AskEntry,
    AskRecord,
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
)
from ._json import freeze, same_json, thaw
from ._messages import Message, TextBlock, ToolCall, ToolResultBlock
from ._reply import NO_USAGE, Reply, Usage
from ._snapshot import StateSnapshot
from ._stopped import Stopped
from ._typed import Handler, Schema, SchemaField, replace_values

if TYPE_CHECKING:
    from ._state import State

__all__ = ("StateCore", "error_text", "is_interruption", "validate_id")

_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


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


class StateCore:
    """The attributes of a State and the one way it changes (`_record`)."""

    __slots__ = (
        "__weakref__",
        "_children",
        "_children_store",
        "_compacting",
        "_effect_scope",
        "_folded",
        "_id",
        "_lock",
        "_recorded",
        "_running",
        "_schema",
        "_snapshot",
        "_store",
    )

    _id: str
    _lock: threading.RLock
    _folded: Folded
    _schema: Schema | None
    _store: Any
    _children_store: Any
    _children: dict[str, State]
    _compacting: bool
    _running: bool
    _effect_scope: str | None
    _recorded: BaseException | None
    _snapshot: tuple[Folded, StateSnapshot] | None

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
            if self._folded.due:
                names = ", ".join(sorted({entry.call.name for entry in self._folded.due}))
                raise ValueError(
                    f"The state updates of the last turn ({names}) wait to be merged by the tools'"
                    " handlers: run the State with the agent that has those tools (agent.arun or"
                    " agent.athink merge them first)."
                )
            messages = self._folded.messages
            self._record(ModelRequestEntry, ModelRequest(model=model, message_count=len(messages)))
            return messages

    def _record_reply(self, reply: Reply) -> ModelReplyEntry:
        if not isinstance(reply, Reply):
            raise TypeError(
                f"A model must return a Reply, got {type(reply).__name__}: return"
                " Reply(Message.assistant(text, tool_calls), Usage(...))."
            )
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
    ) -> ToolResultEntry:
        """Record `call`'s result; a call that is no longer pending gets a `late` entry.

        A state update is due until the turn closes; then the agent merges the turn's updates
        (`_merge_due`), which needs the tools' handlers: code the history cannot hold.
        """
        with self._lock:
            late = call.id not in self._folded.pending_ids
            entry = self._record(
                ToolResultEntry,
                result,
                call=call,
                outcome=outcome,
                child_ids=tuple(child_ids),
                late=late,
                usage=usage or NO_USAGE,
                state_update=state_update,
                merge_due=state_update is not None and not late,
            )
            return cast("ToolResultEntry", entry)

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

    def _merge_due(self, handlers: Mapping[str, Mapping[str, Handler]]) -> None:
        """Merge the state updates of the turn that closed, in request order; `handlers` by call id.

        `handlers` are the tools' own handlers of each due result's call (the agent that ran
        them has them). Each key merges through the tool's handler, else its schema field's,
        else `replace_values`, so calls of one turn never see each other's updates and the later
        call in request order wins a replace. Recorded as one `extra_data` entry marked
        `turn_merge` (even when nothing changed: it says the merge happened). An update that no
        longer validates once merged with the ones before it is not applied, and a notice tells
        the model so.
        """
        with self._lock:
            due = self._folded.due
            if not due:
                return
            staged = dict(self._folded.extra_data)
            changed: dict[str, Any] = {}
            refused: list[str] = []
            for entry in due:
                call, own = entry.call, handlers.get(entry.call.id, {})
                attempt: dict[str, Any] = {}
                try:
                    for key, value in (entry.state_update or {}).items():
                        field = self._schema.fields.get(key) if self._schema is not None else None
                        merge = own.get(key) or (
                            field.handler if field is not None else replace_values
                        )
                        current = attempt[key] if key in attempt else staged.get(key)
                        merged = merge(thaw(current) if current is not None else None, thaw(value))
                        attempt[key] = (
                            field.validate(merged) if field is not None else freeze(merged)
                        )
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
            self._record(ExtraDataEntry, ExtraDataChange(changed=changed, turn_merge=True))
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
                raise ValueError(
                    "A compaction of this State is already under way: wait for it to end."
                )
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
        return self._folded.entries.after(seq)
