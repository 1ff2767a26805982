"""The plans of the SQL stores, and their drivers: written once for SQLite and PostgreSQL.

A *plan* is a generator that yields the operations of one store call in order, each a `Query`,
a `QueryMany` or a `Work` (CPU work an async driver may move off the event loop), and receives
each one's result; its return value is the call's result. A plan does no I/O: `run_plan`
carries one out with a sync `execute` (`SQLiteStore`, `PostgresStore`), `arun_plan` with an
async one (`AioSQLiteStore`), like httpx drives one auth flow from a sync and an async client.
The SQL itself is each dialect's (`stores._sql` for SQLite, `stores._postgres_sql`).

The steps every SQL store takes the same way are here too:

- `plan_writes`: what a save writes, for each State id of a batch, after its stored end (the
  new entries, encoded with their digests, the end once written, the States it binds), and
  which States are refused, by position; each dialect turns it into its rows.
- `load_plan`, `entries_plan`: a load (read, keep the cut-off calls' children, recover, bind)
  and the entries after a position, on a dialect's own read and list plans.
- `checked_history`: a read history checked against its row, rebuilt into a State.
- `usage_json`, `stopped_json`, `micros`, `json_of`: the values a states row holds.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, TypeAlias, TypeVar

import pydantic

from orchestrator import HistoryEntry, State, StateInfo, Stopped, Usage

from ._codec import check_chain, damaged
from .backend import (
    StorageView,
    Tail,
    adopted,
    bind_state,
    check_after,
    continuation,
    entries_after,
    rebuild,
    recover_state,
    to_adopt,
    validate_id,
)

__all__ = (
    "EPOCH",
    "HEAVY_ENTRIES",
    "MICROSECOND",
    "STOPPED",
    "UNSEALED",
    "USAGE",
    "ListChildren",
    "Operation",
    "Plan",
    "Query",
    "QueryMany",
    "Read",
    "Refusal",
    "Row",
    "Work",
    "Write",
    "arun_plan",
    "bind_written",
    "checked_history",
    "entries_plan",
    "entry_columns",
    "json_of",
    "load_plan",
    "micros",
    "not_found",
    "plan_writes",
    "run_plan",
    "stopped_json",
    "usage_json",
)

_T = TypeVar("_T")
Row: TypeAlias = tuple[Any, ...]

# -- operations and drivers -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Query:
    """Run `sql` with `params`; the plan receives every row it returns (`list[Row]`).

    `retry_busy` asks an SQLite driver to retry while SQLite answers "database is locked":
    switching a new file to WAL does not wait through the busy timeout when another process
    opens the file at the same moment.
    """

    sql: str
    params: Sequence[Any] | Mapping[str, Any] = ()
    retry_busy: bool = False


@dataclass(frozen=True, slots=True)
class QueryMany:
    """Run `sql` once per row of `rows` (``executemany``); the plan receives the rows changed.

    The count is the driver's ``rowcount``: the rows the statements inserted, updated or
    deleted. `rows` may be an iterator (it is read once): ``zip`` over columns hands sqlite3
    one reused tuple, where a list of rows keeps a tuple per row alive until the statement ends.
    """

    sql: str
    rows: Iterable[Sequence[Any]]


@dataclass(frozen=True, slots=True)
class Work:
    """Call `func()` and send its result; an async driver may run it in a worker thread."""

    func: Callable[[], Any]
    heavy: bool = False  # worth a thread hop (decoding or encoding many entries)


Operation: TypeAlias = Query | QueryMany | Work
Plan: TypeAlias = Generator[Operation, Any, _T]

HEAVY_ENTRIES = 256
"""More entries than this are encoded or decoded off the event loop by an async driver."""


def run_plan(plan: Plan[_T], execute: Callable[[Operation], Any]) -> _T:
    """Drive `plan` to its end with the sync `execute`; return the plan's result.

    An exception from `execute` closes the plan and propagates; the caller rolls back.
    """
    try:
        operation = next(plan)
        while True:
            operation = plan.send(execute(operation))
    except StopIteration as done:
        return done.value
    finally:
        plan.close()


async def arun_plan(plan: Plan[_T], execute: Callable[[Operation], Awaitable[Any]]) -> _T:
    """`run_plan` with an async `execute`: each operation awaited in turn."""
    try:
        operation = next(plan)
        while True:
            operation = plan.send(await execute(operation))
    except StopIteration as done:
        return done.value
    finally:
        plan.close()


# -- what a save writes -----------------------------------------------------------------------


@dataclass(slots=True)
class Write:
    """What a save writes for one State id: new entries after `stored`, and its row at `end`.

    Several States of a batch may share an id: each continues what the one before wrote, and
    the row is the last one's (`view`). `positions` are those States' places in the batch.
    """

    stored: Tail | None  # the stored end it continues (None: believed new)
    end: Tail  # the end once written
    view: StorageView  # the last State's view: its row is written
    lines: list[bytes] = field(default_factory=list[bytes])
    digests: list[bytes] = field(default_factory=list[bytes])
    positions: list[int] = field(default_factory=list[int])

    @property
    def first(self) -> int:
        """The `seq` of the first new entry."""
        return self.end.count - len(self.lines)


Refusal = Callable[[StorageView, "Tail | None", ValueError], ValueError]
"""The error a refused save raises, given its view, the end it was checked against and why."""


def _as_is(view: StorageView, stored: Tail | None, error: ValueError) -> ValueError:
    return error


def plan_writes(
    saves: Iterable[tuple[int, StorageView, Tail | None]],
    refused: dict[int, ValueError],
    refusal: Refusal = _as_is,
) -> dict[str, Write]:
    """What to write for each `(position, view, stored end)` of a batch, by State id (no I/O).

    A State that does not continue its stored end goes to `refused` under its position, with
    the error `refusal` makes of it. Two States under one id are taken in turn, the second
    after what the first writes (so it is refused, unless it continues the first).
    """
    writes: dict[str, Write] = {}
    for at, view, stored in saves:
        state_id = view.id
        write = writes.get(state_id)
        tail = write.end if write is not None else (stored or Tail())
        try:
            new = continuation(view, tail)
        except ValueError as error:
            refused[at] = refusal(view, stored, error)
            continue
        if write is None:
            write = writes[state_id] = Write(stored, new.tail, view)
        write.end, write.view = new.tail, view
        write.lines += new.lines
        write.digests += new.digests
        write.positions.append(at)
    return writes


def entry_columns(
    writes: Iterable[Write],
) -> tuple[list[str], list[int], list[bytes], list[bytes]]:
    """The new entries of `writes` as four columns: state ids, seqs, lines, digests."""
    ids: list[str] = []
    seqs: list[int] = []
    lines: list[bytes] = []
    digests: list[bytes] = []
    for write in writes:
        ids += [write.view.id] * len(write.lines)
        seqs += range(write.first, write.end.count)
        lines += write.lines
        digests += write.digests
    return ids, seqs, lines, digests


def bind_written(writes: Iterable[Write], states: Sequence[State], store: object) -> None:
    """Bind the States of `writes` (by position in `states`) to `store`: they are saved."""
    for write in writes:
        for at in write.positions:
            bind_state(states[at], store)


# -- loading --------------------------------------------------------------------------------

Read = Callable[[str], Plan[State]]
"""A dialect's read of one State as its history holds it (not recovered, not bound)."""
ListChildren = Callable[[str], Plan[list[StateInfo]]]
"""A dialect's listing of a State's children, unsealed (recovery checks each link itself)."""


def load_plan(
    read: Read, children: ListChildren, state_id: str, store: object, where: str
) -> Plan[State]:
    """Read the State `state_id`, close a cut-off turn, bind it to `store`.

    The children a cut-off call started stay in its result, each checked against its own
    history. The entries closing the turn adds are not written here: the next save writes them.

    Raises:
        TypeError, ValueError: `state_id` is not a valid id (at once, before any I/O).
        LookupError: No State has this id.
        StoreDamagedError: What `read` finds damaged.
    """
    validate_id(state_id, "state_id")
    return _load(read, children, state_id, store, where)


def _load(
    read: Read, children: ListChildren, state_id: str, store: object, where: str
) -> Plan[State]:
    state = yield from read(state_id)
    kept: list[StateInfo] = []
    if state.pending_calls:  # a cut-off call: the children it started stay listed
        listed = yield from children(state_id)
        for info in to_adopt(state, listed):
            try:
                child = yield from read(info.id)
            except LookupError:
                continue  # deleted since
            found = adopted(where, state, info, child)
            if found is not None:
                kept.append(found)
    recover_state(state, kept)
    bind_state(state, store)
    return state


def entries_plan(read: Read, state_id: str, after: int) -> Plan[tuple[HistoryEntry, ...]]:
    """The entries of `state_id` after the `seq` `after`, read and checked as a load reads them.

    Raises:
        TypeError, ValueError: `state_id` or `after` is not valid (at once, before any I/O).
        LookupError: No State has this id.
        StoreDamagedError: What `read` finds damaged.
    """
    validate_id(state_id, "state_id")
    check_after(after)
    return _entries(read, state_id, after)


def _entries(read: Read, state_id: str, after: int) -> Plan[tuple[HistoryEntry, ...]]:
    state = yield from read(state_id)
    return entries_after(state, after)


def not_found(state_id: str, where: str) -> LookupError:
    """The error of a load of a State the store does not hold."""
    return LookupError(
        f"No State {state_id!r} in {where}: check the id, or list the saved ones with store.list()."
    )


def checked_history(
    state_id: str,
    expected: object,
    head: object,
    lines: Sequence[bytes],
    digests: Sequence[object],
    where: str,
) -> State:
    """The State of a read history, checked against its row (`expected` entries, `head`).

    Raises:
        StoreDamagedError: The row's count is not an int, the chain of digests fails, or more
            entries are stored than it counts (they are written together, in one transaction).
    """
    if not isinstance(expected, int) or isinstance(expected, bool):
        raise damaged(where, state_id, f"its states row is damaged (entries = {expected!r})")
    check_chain(where, state_id, lines, digests, count=expected, head=head)
    if len(lines) > expected:
        raise damaged(
            where,
            state_id,
            f"its states row counts {expected} history entries but {len(lines)} are stored:"
            f" history entry {expected} is extra",
        )
    return rebuild(state_id, lines, None, where=where)  # its chain is checked above


# -- the values of a states row -------------------------------------------------------------

USAGE: pydantic.TypeAdapter[Usage] = pydantic.TypeAdapter(Usage)
STOPPED: pydantic.TypeAdapter[Stopped | None] = pydantic.TypeAdapter(
    Annotated[Stopped | None, pydantic.Field(discriminator="kind")]
)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)

UNSEALED = (
    "its listed info does not match its seal (its title, times, turn, usage, stop, parent or"
    " entry count was changed); its history is whole, so it loads, and its next save writes the"
    " row again"
)
"""Why a states row whose listed values do not match its seal is damaged."""


@functools.lru_cache(maxsize=1024)
def usage_json(usage: Usage) -> str:
    """`usage` as JSON, remembered: most saves write a Usage written before.

    It changes only with replies and results, and is frozen (its JSON never changes).
    """
    return USAGE.dump_json(usage).decode()


def stopped_json(stopped: Stopped | None) -> str | None:
    """Why a State stopped, as JSON; None if it did not."""
    return None if stopped is None else STOPPED.dump_json(stopped).decode()


def micros(at: datetime) -> int:
    """`at` as microseconds since 1970 (a naive time of a State is UTC)."""
    aware = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    return (aware - EPOCH) // MICROSECOND


def json_of(adapter: pydantic.TypeAdapter[_T], value: object, column: str) -> _T:
    """The value of the JSON text in `column`; a `ValueError` naming it if it does not read.

    Raises:
        TypeError: `value` is not text.
    """
    if not isinstance(value, str):
        raise TypeError(f"{column} holds {type(value).__name__} {value!r:.40}, not str")
    try:
        return adapter.validate_json(value)
    except pydantic.ValidationError as error:
        first = error.errors()[0]
        raise ValueError(f"{column} holds JSON that does not read: {first['msg']}") from None
