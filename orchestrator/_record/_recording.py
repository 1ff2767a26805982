"""The recording protocol: what a State holds, and every operation that records an entry.

`State` (in `orchestrator._record._state`) is the public class; its parts are declared here, in
`StateParts`, and only the functions of this module touch them. Each operation builds one
history entry and passes it through the fold (`orchestrator._record._fold`), under the State's lock:
the fold is the protocol. The agent's layers (think, tool execution, ask, the loop, subagent
links) and the stores call these functions by their public names; none reaches into a State.

`init_state` is the one constructor path: `State(...)` and `fork()` both end in it.
"""

from __future__ import annotations

import re
import threading
from collections import ChainMap
from collections.abc import Generator, Iterable, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from .._base._errors import error_text, is_interruption
from .._base._json import same_json
from .._base._messages import Message, TextBlock, ToolCall, ToolResultBlock
from .._base._reply import NO_USAGE, Reply, Usage
from .._base._stopped import Stopped
from .._base._threads import refuse_abandoned
from ._fold import Folded, Inconsistent, Lookup, Seq, entry_turn, fold
from ._history import (
    KIND_OF,
    ApprovalEntry,
    ApprovalRecord,
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
    PromptEntry,
    RunStart,
    RunStartEntry,
    StopEntry,
    ToolResultEntry,
)
from ._prompt import Prompt
from ._snapshot import StateSnapshot
from ._storage import StateInfo, StorageView
from ._store_client import AnyStore, StoreClient, client_of
from ._typed import Handler, Schema, as_json, merge_value

if TYPE_CHECKING:
    from ._state import State

__all__ = (
    "Recorder",
    "StateParts",
    "add_child",
    "begin_run",
    "begin_think",
    "bind_client",
    "bind_schema",
    "bind_state",
    "bind_store",
    "check_update",
    "child_store",
    "close_pending",
    "compacting",
    "compaction",
    "end_run",
    "held_for_decision",
    "id_of",
    "init_state",
    "known_child",
    "known_children",
    "lock_of",
    "merge_turn",
    "record",
    "record_approval",
    "record_ask",
    "record_compact",
    "record_error",
    "record_reply",
    "record_run_start",
    "record_stop",
    "record_tool_result",
    "recover_state",
    "require_closed_turn",
    "schema_of",
    "snapshot_of",
    "storage_view",
    "store_of",
    "take_back",
    "validate_id",
    "value_of",
)

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


class StateParts:
    """What a State holds. `State` adds the public API; this module's functions change it.

    The folded value (`orchestrator._record._fold.Folded`) is the State's whole value; the rest is
    what a live object needs besides: its lock, schema, the store it is bound to, the children
    it started (the same objects while in memory), and whether a run or a compaction is under
    way.
    """

    __slots__ = (
        "__weakref__",
        "_children",
        "_children_store",
        "_client",
        "_compacting",
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
    _store: AnyStore | None
    _client: StoreClient | None  # of `_store`, resolved when first asked for
    _children_store: StoreClient | None
    _children: dict[str, State]
    _compacting: bool
    _running: bool
    _recorded: BaseException | None
    _snapshot: tuple[Folded, StateSnapshot] | None


# -- the parts' operations ----------------------------------------------------------------------


class Recorder(StateParts):
    """The operations on a State's parts: the only code that reads or changes them.

    A subclass of `StateParts` so it may use the parts' names; never instantiated, and not a
    base of `State` (which gains no names from it). The module binds each operation to its
    name (`record = Recorder.record`), which is what the other layers call.
    """

    __slots__ = ()

    @staticmethod
    def init_state(
        state: StateParts,
        *,
        id: str,
        folded: Folded,
        schema: Schema | None = None,
        children_store: StoreClient | None = None,
        children: Mapping[str, State] | None = None,
    ) -> None:
        """Give `state` all its parts: the one constructor path of `State(...)` and `fork()`.

        `children_store` is where a fork opens the children its original started (the original's
        store); `children` are the child objects it already knows (copied, never shared).
        """
        state._id = id
        state._lock = threading.RLock()
        state._folded = folded
        state._schema = schema
        state._store = None
        state._client = None
        state._children_store = children_store
        state._children = dict(children) if children else {}
        state._compacting = False
        state._running = False
        state._recorded = None
        state._snapshot = None

    @staticmethod
    def value_of(state: StateParts) -> Folded:
        """The folded value of `state` at this moment (immutable: read it without a lock)."""
        return state._folded

    @staticmethod
    def schema_of(state: StateParts) -> Schema | None:
        """The schema bound to `state`, or None."""
        return state._schema

    @staticmethod
    def store_of(state: StateParts) -> StoreClient | None:
        """The client of the store `state` is bound to (saved to or loaded from), or None.

        Resolved the first time it is asked for, then kept: a store binds a State at every save,
        and most States never need their store's client (their run has its agent's).
        """
        store = state._store
        if store is None:
            return None
        client = state._client
        if client is None or client.store is not store:
            client = state._client = client_of(store)
        return client

    @staticmethod
    def child_store(state: StateParts) -> StoreClient | None:
        """Where `state`'s children not in memory load from: its store, or its original's."""
        client = store_of(state)
        return client if client is not None else state._children_store

    @staticmethod
    def known_child(state: StateParts, child_id: str) -> State | None:
        """The child `child_id` if it is in memory (this State's run started it), else None."""
        return state._children.get(child_id)

    @staticmethod
    def known_children(state: StateParts) -> tuple[State, ...]:
        """The children of `state` in memory (its runs started them), in the order they started."""
        return tuple(state._children.values())

    @staticmethod
    def snapshot_of(state: StateParts) -> StateSnapshot:
        """`state.snapshot()`: made once per value."""
        value = state._folded
        cached = state._snapshot
        if cached is not None and cached[0] is value:
            return cached[1]
        snap = value.snapshot(state._id)
        state._snapshot = (value, snap)
        return snap

    @staticmethod
    def id_of(state: StateParts) -> str:
        """The id of `state`."""
        return state._id

    @staticmethod
    def lock_of(state: StateParts) -> threading.RLock:
        """The lock every change of `state` holds: hold it to make several steps one."""
        return state._lock

    @staticmethod
    def record(
        state: StateParts,
        entry_type: type[HistoryEntry],
        content: Any,
        *,
        lookup: Lookup | None = None,
        **fields: Any,
    ) -> HistoryEntry:
        """Build one entry of `entry_type` and fold it into `state`: the only way a State changes.

        Raises:
            ValueError: The entry cannot follow the ones before it.
            CallAbandonedError: Called from a sync tool's thread whose call was abandoned (checked
                under the lock: such a write lands before the call's result, or not at all).
        """
        with state._lock:
            refuse_abandoned()
            value = state._folded
            kind = KIND_OF[entry_type]
            entry = entry_type(
                seq=len(value.entries),
                turn=entry_turn(value, kind),
                at=datetime.now(UTC),
                content=content,
                **fields,
            )
            try:
                state._folded = fold(value, entry, lookup)
            except Inconsistent as error:
                raise ValueError(f"Cannot record a {kind} entry: {error}.") from None
            return entry

    @staticmethod
    def record_error(
        state: StateParts, error: BaseException | str, *, again: bool = False
    ) -> ErrorEntry | None:
        """Record a failure as ``"TypeName: message"``; a waiting request is taken back.

        An exception object is recorded once per run: the run that it leaves does not record it a
        second time. `again` records it even so (a failed think must always be taken back).
        """
        if isinstance(error, str):
            return cast("ErrorEntry", record(state, ErrorEntry, error))
        with state._lock:
            recorded = state._recorded
            same = recorded is error or (
                recorded is not None and is_interruption(recorded) and is_interruption(error)
            )
            if same and not again:
                return None
            state._recorded = error
            return cast("ErrorEntry", record(state, ErrorEntry, error_text(error)))

    @staticmethod
    def take_back(state: StateParts, before: Folded, after: Folded) -> bool:
        """Give `state` its value `before` again, if it still is `after`; whether it did.

        For entries that must not stay in memory when their save failed (a person's decision,
        which the caller may make again): what was recorded from `before` to `after` goes, unless
        something else was recorded since, which then keeps it (the next save writes both).
        """
        with state._lock:
            if state._folded is not after:
                return False
            state._folded = before
            state._snapshot = None
            return True

    @staticmethod
    @contextmanager
    def compaction(state: StateParts) -> Generator[None, None, None]:
        """Mark a compaction of `state` as under way (`restore` refuses meanwhile)."""
        with state._lock:
            if state._compacting:
                raise ValueError(
                    "A compaction of this State is already under way: wait for it to end."
                )
            state._compacting = True
        try:
            yield
        finally:
            state._compacting = False

    @staticmethod
    def compacting(state: StateParts) -> bool:
        """Whether a compaction of `state` is under way."""
        return state._compacting

    @staticmethod
    def begin_run(state: StateParts) -> None:
        """Mark a run of `state` as started: one run at a time per State.

        Raises:
            ValueError: `state` is already running.
        """
        with state._lock:
            if state._running:
                raise ValueError(
                    f"State {state._id} is already running: one run at a time per State. Wait for"
                    " it to end, or run a fork()."
                )
            state._running = True

    @staticmethod
    def end_run(state: StateParts) -> None:
        """Mark the run of `state` as ended."""
        state._running = False
        state._recorded = None

    @staticmethod
    def bind_schema(state: StateParts, schema: Schema) -> None:
        """Bind an agent's `schema` to `state` (validating its data), or check they are the same.

        Raises:
            ValueError: The data fails the schema, or `state` has another schema.
        """
        with state._lock:
            if state._schema is None:
                schema.validate_data(state._folded.extra_data)
                state._schema = schema
            elif state._schema != schema:
                raise ValueError(
                    f"State {state._id} has a schema that differs from the agent's state_schema:"
                    " run it with an agent of the same schema, or a State without one."
                )

    @staticmethod
    def add_child(state: StateParts, child: State) -> None:
        """Keep `child`, which a tool call of `state` started, so `state.child(id)` returns it."""
        state._children[child.id] = child

    @staticmethod
    def bind_store(state: StateParts, store: AnyStore) -> None:
        """Bind `state` to `store`; its client is resolved when first asked for."""
        state._store = store

    @staticmethod
    def bind_client(state: StateParts, client: StoreClient) -> None:
        """Bind `state` to the store of `client`, already resolved (a child, to its parent's)."""
        state._store = client.store
        state._client = client


init_state = Recorder.init_state
value_of = Recorder.value_of
schema_of = Recorder.schema_of
store_of = Recorder.store_of
child_store = Recorder.child_store
known_child = Recorder.known_child
known_children = Recorder.known_children
snapshot_of = Recorder.snapshot_of
id_of = Recorder.id_of
lock_of = Recorder.lock_of
record = Recorder.record
record_error = Recorder.record_error
take_back = Recorder.take_back
compaction = Recorder.compaction
compacting = Recorder.compacting
begin_run = Recorder.begin_run
end_run = Recorder.end_run
bind_schema = Recorder.bind_schema
add_child = Recorder.add_child
bind_store = Recorder.bind_store
bind_client = Recorder.bind_client


# -- the records ---------------------------------------------------------------------------------


def require_closed_turn(state: StateParts, what: str) -> None:
    """Raise `ValueError` if the model is waited on or calls are pending: `what` needs neither."""
    value = value_of(state)
    if value.waiting:
        raise ValueError(f"{what}() while the model is being waited on: call it between turns.")
    if value.pending:
        names = ", ".join(call.name for call in value.pending)
        raise ValueError(
            f"{what}() while tool calls are pending ({names}): every call needs a result"
            " first (agent.use_tools(state))."
        )


# -- a turn --------------------------------------------------------------------------------------


def begin_think(
    state: StateParts,
    *,
    model: str | None = None,
    prompt: Prompt | None = None,
    holder: str | None = None,
) -> Seq[Message]:
    """Record a model request; return the messages the request must carry (a view).

    The request names `prompt` by digest. A prompt this State has not recorded is recorded just
    before it, unless `holder` names another State of the same tree and store that holds it
    (the caller saves that one first): the request names that State instead.

    Raises:
        ValueError: The State is finished, its turn is open, or a turn's updates wait to merge.
    """
    with lock_of(state):
        value = value_of(state)
        if value.finished:
            raise ValueError(
                "This State is finished: it cannot think again. Restore an earlier snapshot,"
                " or start a new State from state.messages."
            )
        require_closed_turn(state, "think")
        if value.due:
            names = ", ".join(sorted({entry.call.name for entry in value.due}))
            raise ValueError(
                f"The state updates of the last turn ({names}) wait to be merged by the tools'"
                " handlers: run the State with the agent that has those tools (agent.arun or"
                " agent.athink merge them first)."
            )
        messages = value.messages
        digest, holder = _name_prompt(state, value, prompt, holder)
        request = ModelRequest(
            model=model, message_count=len(messages), prompt=digest, prompt_holder=holder
        )
        record(state, ModelRequestEntry, request)
        return messages


def _name_prompt(
    state: StateParts, value: Folded, prompt: Prompt | None, holder: str | None
) -> tuple[str | None, str | None]:
    """The digest and holder an entry names for `prompt`; the prompt recorded first if due.

    A prompt this State has not recorded is recorded now, unless `holder` names another State
    of the tree that holds it: the entry names that State. Called under the State's lock, just
    before the entry that names it (a model request, an ask, a compaction) is recorded.
    """
    if prompt is None:
        return None, None
    if prompt.digest in value.prompts or holder == id_of(state):
        holder = None
    if holder is None and prompt.digest not in value.prompts:
        record(state, PromptEntry, prompt)
    return prompt.digest, holder


def record_reply(state: StateParts, reply: Reply) -> ModelReplyEntry:
    """Record the model's `reply` to the waiting request."""
    if not isinstance(reply, Reply):
        raise TypeError(
            f"A model must return a Reply, got {type(reply).__name__}: return"
            " Reply(Message.assistant(text, tool_calls), Usage(...))."
        )
    return cast("ModelReplyEntry", record(state, ModelReplyEntry, reply))


def record_stop(state: StateParts, stopped: Stopped) -> StopEntry:
    """Record why the run stops (or, for `StoppedByFinish`, that the State is finished)."""
    return cast("StopEntry", record(state, StopEntry, stopped))


def record_approval(state: StateParts, decision: ApprovalRecord) -> ApprovalEntry:
    """Record a person's decision on a call that waits for one.

    Raises:
        ValueError: The call waits for no decision, or it is decided already.
    """
    return cast("ApprovalEntry", record(state, ApprovalEntry, decision))


def held_for_decision(value: Folded) -> frozenset[str]:
    """The pending calls of `value` that wait for a person: not to be closed on a load.

    A call waits while one of the calls it leads to (itself, or a subagent's call) has no
    decision, or was decided after the latest run start (no run has taken it up yet). Once a
    run has started with the decision, the call may have run: a load closes it as ``unknown``.
    """
    held: set[str] = set()
    for item in value.awaiting:
        call_id = item.call.id
        if call_id not in value.decisions or call_id in value.decided_now:
            held.add(item.via or call_id)
    return frozenset(held)


def record_run_start(state: StateParts, start: RunStart) -> RunStartEntry:
    """Record a run's start; the first one sets the State's parent links."""
    return cast("RunStartEntry", record(state, RunStartEntry, start))


def record_ask(
    state: StateParts,
    question: str,
    answer: Any,
    usage: Usage,
    error: str | None = None,
    *,
    prompt: Prompt | None = None,
    holder: str | None = None,
) -> AskEntry:
    """Record an `ask` exchange: the question, the answer as JSON (or the error), its usage.

    The entry names `prompt`, what its requests told the model, as `begin_think` does.
    """
    with lock_of(state):
        digest, holder = _name_prompt(state, value_of(state), prompt, holder)
        entry = AskRecord(
            question=question,
            answer=answer,
            usage=usage,
            error=error,
            prompt=digest,
            prompt_holder=holder,
        )
        return cast("AskEntry", record(state, AskEntry, entry))


def record_tool_result(
    state: StateParts,
    call: ToolCall,
    result: ToolResultBlock,
    *,
    outcome: Outcome,
    child_ids: Iterable[str] = (),
    usage: Usage | None = None,
    state_update: Mapping[str, Any] | None = None,
) -> ToolResultEntry:
    """Record `call`'s result; a call that is no longer pending gets a `late` entry.

    A state update is due until the turn closes; then the turn's updates are merged with the
    tools' handlers (`merge_turn`), which the agent that ran them has.
    """
    with lock_of(state):
        late = call.id not in value_of(state).pending_ids
        entry = record(
            state,
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


def close_pending(
    state: StateParts,
    outcome: Outcome,
    text: str,
    links: Mapping[str, tuple[Iterable[str], Usage]] | None = None,
    keep: frozenset[str] = frozenset(),
) -> tuple[ToolResultEntry, ...]:
    """Give every pending call an error result `text` with `outcome`; return the entries.

    `links` gives, by call id, the subagent States a call started and what they spent. The
    calls whose ids are in `keep` stay pending.
    """
    links = links or {}
    with lock_of(state):
        entries: list[ToolResultEntry] = []
        for call in value_of(state).pending:
            if call.id in keep:
                continue
            child_ids, usage = links.get(call.id, ((), None))
            entries.append(
                record_tool_result(
                    state,
                    call,
                    ToolResultBlock(call.id, (TextBlock(text),), is_error=True),
                    outcome=outcome,
                    child_ids=child_ids,
                    usage=usage,
                )
            )
        return tuple(entries)


def merge_turn(state: StateParts, handlers: Mapping[str, Mapping[str, Handler]]) -> None:
    """Merge the state updates of the turn that closed, in request order.

    `handlers` are the handlers of each tool, by tool name (an agent's tools). Each key merges
    through the tool's handler, else its schema field's, else `replace_values`, so calls of one
    turn never see each other's updates and the later call in request order wins a replace.
    Recorded as one `extra_data` entry marked `turn_merge` (even when nothing changed: it says
    the merge happened). An update that no longer validates once merged with the ones before it
    is not applied, and a notice tells the model so.

    The handlers are code the history cannot hold, so a due update of a tool that `handlers`
    lacks is an error, never a merge by another rule.

    Raises:
        ValueError: A tool whose update is due is not in `handlers`.
    """
    if not value_of(state).due:  # the common case, read without the lock (values never change)
        return
    with lock_of(state):
        due = value_of(state).due
        if not due:
            return
        missing = sorted({entry.call.name for entry in due if entry.call.name not in handlers})
        if missing:
            raise ValueError(
                f"State {id_of(state)} has state updates from {', '.join(missing)} waiting to be"
                " merged with those tools' handlers, and this agent has no such tool: run the"
                " State with the agent whose tools made them."
            )
        schema = schema_of(state)
        before = value_of(state).extra_data
        changed: dict[str, Any] = {}
        refused: list[str] = []
        for entry in due:
            call, own = entry.call, handlers[entry.call.name]
            attempt: dict[str, Any] = {}
            data = ChainMap(attempt, changed, before)
            try:
                for key, value in (entry.state_update or {}).items():
                    attempt[key] = merge_value(schema, data, key, value, own.get(key))
            except (ValueError, TypeError, KeyError) as error:
                refused.append(f"the state update of {call.name} ({call.id}): {error}")
                continue
            changed.update(attempt)
        changed = {
            key: value
            for key, value in changed.items()
            if key not in before or not same_json(before[key], value)
        }
        record(state, ExtraDataEntry, ExtraDataChange(changed=changed, turn_merge=True))
        for text in refused:
            record(state, NoticeEntry, Message.notice(f"Not applied, {text}"))


def check_update(
    state: StateParts, update: Mapping[str, Any], handlers: Mapping[str, Handler] | None = None
) -> dict[str, Any]:
    """A tool's state update, checked now against the schema and the current values.

    Raises `KeyError` for an undeclared key, `TypeError` for a non-JSON value and
    `ValueError` for a value its key's type refuses. Returns the update as frozen JSON.
    """
    checked: dict[str, Any] = {}
    with lock_of(state):
        schema, data = schema_of(state), value_of(state).extra_data
        for key, value in update.items():
            merge_value(schema, data, key, value, handlers.get(key) if handlers else None)
            checked[key] = as_json(key, None if schema is None else schema.field(key), value)
    return checked


# -- context changes -----------------------------------------------------------------------------


def record_compact(
    state: StateParts,
    summary: str,
    usage: Usage,
    covered: int | None = None,
    *,
    prompt: Prompt | None = None,
    holder: str | None = None,
) -> None:
    """Record a compaction to `summary` of the first `covered` messages (None: all).

    A summary the model wrote names `prompt`, what its request told the model, as
    `begin_think` does (None: a summary given by the caller).

    Raises:
        TypeError: `summary` is not a str.
        ValueError: `summary` is empty, or the turn is open.
    """
    if not isinstance(summary, str):
        raise TypeError(f"compact takes the summary as a str, got {type(summary).__name__}.")
    if not summary.strip():
        raise ValueError("compact got an empty summary: say what the model should keep.")
    with lock_of(state):
        require_closed_turn(state, "compact")
        digest, holder = _name_prompt(state, value_of(state), prompt, holder)
        change = ContextChange(
            kind="compact",
            summary=summary,
            usage=usage,
            covered=covered,
            prompt=digest,
            prompt_holder=holder,
        )
        record(state, ContextChangeEntry, change)


# -- runs ----------------------------------------------------------------------------------------


# -- what a store uses (public through `stores.backend`) -------------------------------------------


def storage_view(state: State) -> StorageView:
    """What a store writes of `state`: its id, entries and info, all of this moment."""
    return StorageView(id_of(state), value_of(state))


def bind_state(state: State, store: object) -> None:
    """Bind `state` to `store`: what `save` and `load` do, so `child` can open its children."""
    bind_store(state, cast("AnyStore", store))


def recover_state(state: State, children: Iterable[StateInfo] = ()) -> tuple[HistoryEntry, ...]:
    """Close the turn a crash cut off in a loaded `state`; return the entries that added.

    Every backend calls it on load (a third-party one too). A request that was waiting on the
    model is taken back; each pending call gets an ``unknown`` result (the tool may or may not
    have run, so it is never run again on its own). `children` are the stored States whose
    `parent_id` is this State: the ones a cut-off call started stay listed in its result, with
    their usage, so `state.child(id)` still opens them. A store's links are not covered by its
    digests: give the info of each child from its own history, checked with
    `stores.backend.adopted`, never a listing as stored. The added entries are written by the
    next save.
    """
    with lock_of(state):
        start = len(value_of(state).entries)
        links = storage_view(state).links(children)
        if value_of(state).waiting:
            record_error(
                state,
                "Interrupted: the process stopped while the model was being waited on;"
                " the request was taken back.",
            )
        if value_of(state).pending:
            close_pending(
                state,
                "unknown",
                "(unknown: the process stopped while this call was open; the tool may or may"
                " not have run. Check its effects before running it again.)",
                links,
                keep=held_for_decision(value_of(state)),  # they wait for a person, not a tool
            )
        return value_of(state).entries.after(start)
