"""The plans of `PostgresStore`'s calls: the steps of each, on the statements of `_postgres_sql`.

A plan yields `Query` objects and receives their rows (see `stores._plan`); it does no I/O and
holds no SQL text. `stores._postgres` drives them. What a save writes, and a load's steps, are
the ones SQLite's plans take too (`stores._plan`).

A save (`save_plan`) is one statement for a whole group commit. A State whose stored end moved
since this store knew it (another writer saved it, or a State it took for new is not) is read
back and tried again with the State as it is then; one that does not continue what is stored
is refused with a `ValueError` saying to load it again.
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator import HistoryEntry, State, StateInfo, StoreConflictError, TreeEntry

from ._codec import damaged
from ._plan import (
    ListChildren,
    Plan,
    Query,
    Read,
    Row,
    Work,
    Write,
    bind_written,
    checked_history,
    not_found,
    plan_writes,
)
from ._plan import entries_plan as entries_of
from ._plan import load_plan as load_state
from ._postgres_sql import Sql, StateRows, info_of_row, state_row
from .backend import (
    StorageView,
    Tail,
    TailCache,
    bad_cursor,
    check_limit,
    check_link,
    check_list_args,
    check_memory,
    cursor_parts,
    make_cursor,
    not_a_root,
    root_from,
    storage_view,
    validate_id,
)

__all__ = (
    "delete_plan",
    "entries_plan",
    "list_plan",
    "load_plan",
    "memory_get_plan",
    "memory_put_plan",
    "memory_scan_plan",
    "root_of_plan",
    "save_plan",
    "tree_cursor",
    "tree_plan",
)

_SAVE_TRIES = 32  # a State that other writers keep moving on is refused after this many tries


def save_plan(
    sql: Sql, states: Sequence[State], store: object, where: str, known: TailCache
) -> Plan[dict[int, ValueError]]:
    """Save `states` (a group commit) in one statement; bind each one saved; the refused.

    Each State's stored end is taken from `known` (what this store wrote or read); one it does
    not know is taken to be new. A State whose end changed meanwhile (another writer, or a
    wrong guess) is read back and tried again. A refused State (it does not continue the stored
    history) is left out and its `ValueError` returned, keyed by its position in `states`; the
    others are written. A failure of the database fails them all.
    """
    pending = [(at, storage_view(state)) for at, state in enumerate(states)]
    ends: dict[str, Tail | None] = {state.id: known.get(state.id) for state in states}
    moved: set[str] = set()  # known ends another writer moved on: a refusal is a conflict

    def refusal(view: StorageView, stored: Tail | None, error: ValueError) -> ValueError:
        return _conflict(view, stored) if stored is not None and view.id in moved else error

    refused: dict[int, ValueError] = {}
    for _ in range(_SAVE_TRIES):
        for at, _view in pending:
            refused.pop(at, None)
        writes = plan_writes(
            ((at, view, ends.get(view.id)) for at, view in pending), refused, refusal
        )
        rows = StateRows()
        new = {view.id: write.view for view, write in _new_writes(writes)}
        for write in writes.values():
            if write.stored is None or write.lines:
                root = root_from(write.view, new)
                state_row(
                    rows, write.view, write.stored, write.end, write.lines, write.digests, root
                )
        written: set[str] = set()
        if len(rows):
            for state_id in rows.ids:
                known.forget(state_id)  # until the commit is known to have happened
            result: list[Row] = yield rows.query(sql)
            written = {str(row[0]) for row in result}
        lost = [state_id for state_id in rows.ids if state_id not in written]
        saved = [write for state_id, write in writes.items() if state_id not in lost]
        for write in saved:
            known.put(write.view.id, write.end)
        bind_written(saved, states, store)
        if not lost:
            return refused
        # Another writer changed these States since their end was known (or one was guessed
        # new and is not): read where they end now, and try them again.
        moved |= {state_id for state_id in lost if ends[state_id] is not None}
        found: list[Row] = yield Query(sql.ends, (lost,))
        ends = dict.fromkeys(lost)
        for state_id, count, head, line in found:
            ends[str(state_id)] = _stored_end(str(state_id), count, head, line, where)
        # The States as they are now: one saved from several threads may have grown since.
        pending = [(at, storage_view(states[at])) for at, view in pending if view.id in ends]
    for at, view in pending:
        refused.setdefault(
            at,
            StoreConflictError(
                f"State {view.id!r} was saved by another writer again and again while this save"
                f" ran ({_SAVE_TRIES} tries), so it is not saved. Load it again with"
                f" store.load({view.id!r}) and continue that one, and let one writer at a time"
                " save a State."
            ),
        )
    return refused


def _new_writes(writes: dict[str, Write]) -> list[tuple[StorageView, Write]]:
    """The writes of States believed new (their states row is inserted)."""
    return [(write.view, write) for write in writes.values() if write.stored is None]


def _stored_end(state_id: str, count: object, head: object, line: object, where: str) -> Tail:
    if not isinstance(count, int) or count < 0:
        raise damaged(where, state_id, f"its states row is damaged (entries = {count!r})")
    if count == 0:
        return Tail()
    if not isinstance(line, bytes) or not isinstance(head, bytes):
        raise damaged(where, state_id, f"history entry {count - 1} or its digest is missing")
    return Tail(count, line, None, head)


def _conflict(view: StorageView, stored: Tail) -> StoreConflictError:
    state_id = view.id
    return StoreConflictError(
        f"State {state_id!r} cannot be saved: another writer saved it meanwhile (the store now"
        f" holds {stored.count} entries, and this State does not continue them), so saving it"
        " would interleave two histories. Load it again with"
        f" store.load({state_id!r}) and continue that one, or save this one under a new id"
        " (state.fork())."
    )


def _reader(sql: Sql, where: str, known: TailCache) -> Read:
    return lambda state_id: _read(sql, state_id, where, known)


def _children(sql: Sql, where: str) -> ListChildren:
    return lambda state_id: _list(sql, state_id, None, where, sealed=False)


def load_plan(sql: Sql, state_id: str, store: object, where: str, known: TailCache) -> Plan[State]:
    """Read the State `state_id` in one statement, rebuild it, close a cut-off turn.

    The entries that closing the turn adds are not written here: the next save writes them.

    Raises:
        TypeError, ValueError: `state_id` is not a valid id (at once, before any I/O).
        LookupError: No State has this id.
        StoreDamagedError: A damaged entry (naming the State and the index), or a missing one.
    """
    return load_state(_reader(sql, where, known), _children(sql, where), state_id, store, where)


def _read(sql: Sql, state_id: str, where: str, known: TailCache) -> Plan[State]:
    """The State `state_id` as its history holds it, read in one statement (not recovered)."""
    rows: list[Row] = yield Query(sql.load, (state_id,))
    if not rows:
        raise not_found(state_id, where)
    expected, head = rows[0][0], rows[0][1]
    stored = rows if rows[0][2] is not None else []
    lines = [row[2] for row in stored]
    digests = [row[3] for row in stored]
    state = checked_history(state_id, expected, head, lines, digests, where)
    if lines:
        last = storage_view(state).entry(len(lines) - 1)
        known.put(state_id, Tail(len(lines), lines[-1], last, digests[-1]))
    else:
        known.put(state_id, Tail())
    return state


def entries_plan(
    sql: Sql, state_id: str, after: int, where: str, known: TailCache
) -> Plan[tuple[HistoryEntry, ...]]:
    """The entries of `state_id` after the `seq` `after`, read and checked as a load reads them.

    Raises:
        TypeError, ValueError: `state_id` or `after` is not valid (at once, before any I/O).
        LookupError: No State has this id.
        StoreDamagedError: A damaged entry (naming the State and the index), or a missing one.
    """
    return entries_of(_reader(sql, where, known), state_id, after)


def list_plan(
    sql: Sql, parent_id: str | None, limit: int | None, where: str
) -> Plan[list[StateInfo]]:
    """The `StateInfo` of the saved States, most recently updated first.

    Raises:
        TypeError, ValueError: `parent_id` is not a valid id, or `limit` is not None or an
            int >= 0 (at once, before any I/O).
    """
    check_list_args(parent_id, limit)
    return _list(sql, parent_id, limit, where)


def _list(
    sql: Sql, parent_id: str | None, limit: int | None, where: str, *, sealed: bool = True
) -> Plan[list[StateInfo]]:
    if parent_id is None:
        rows: list[Row] = yield Query(sql.list_all, (limit,))
    else:
        rows = yield Query(sql.list_children, (parent_id, limit))
    return [info_of_row(row, where, sealed=sealed) for row in rows]


def delete_plan(sql: Sql, state_id: str, known: TailCache) -> Plan[None]:
    """Forget the State `state_id` and its entries; nothing happens if it is absent.

    Run it in a transaction: it locks the row, then deletes the row and the entries.

    Raises:
        TypeError, ValueError: `state_id` is not a valid id (at once, before any I/O).
    """
    validate_id(state_id, "state_id")
    return _delete(sql, state_id, known)


def _delete(sql: Sql, state_id: str, known: TailCache) -> Plan[None]:
    known.forget(state_id)
    yield Query(sql.lock_state, (state_id,))
    yield Query(sql.delete, (state_id, state_id))


# -- the feed of a tree ----------------------------------------------------------------------

_KIND = "pg"
_EXAMPLE = "pg:7421.3.run-1"


def root_of_plan(sql: Sql, state_id: str, where: str) -> Plan[str]:
    """The root of the tree of the stored State `state_id`.

    Raises:
        TypeError, ValueError: `state_id` is not a valid id (at once, before any I/O).
        LookupError: No State has this id.
    """
    validate_id(state_id, "state_id")
    return _root_of(sql, state_id, where)


def _root_of(sql: Sql, state_id: str, where: str) -> Plan[str]:
    rows: list[Row] = yield Query(sql.root_of, (state_id,))
    if not rows:
        raise not_found(state_id, where)
    return str(rows[0][0])


def tree_cursor(after: str | None) -> tuple[int, str, int]:
    """The (transaction id, State id, seq) a cursor names; (0, "", -1) before the first entry.

    Raises:
        ValueError: `after` is not a cursor of a PostgreSQL store.
    """
    parts = cursor_parts(after, _KIND, _EXAMPLE, 3)
    if parts is None:
        return 0, "", -1
    xid, seq, state_id = parts
    try:
        validate_id(state_id)
    except ValueError:
        raise bad_cursor(after, _EXAMPLE) from None
    for number in (xid, seq):
        if not number.isdigit() or (number.startswith("0") and number != "0"):
            raise bad_cursor(after, _EXAMPLE)
    return int(xid), state_id, int(seq)


def tree_plan(
    sql: Sql, root_id: str, after: str | None, limit: int | None, where: str
) -> Plan[tuple[tuple[TreeEntry, ...], bool]]:
    """The settled entries of the tree of `root_id` after `after`; whether more are held back.

    Held back: rows of transactions that committed while an older one is still open. They join
    the feed, after every cursor given so far, once it ends; a follower looks again soon.

    Raises:
        TypeError, ValueError: A bad argument (at once, before any I/O), a cursor past what this
            server has given, or `root_id` is not a root.
        LookupError: No State `root_id` is stored.
        StoreDamagedError: An entry fails the check of its link of the chain.
    """
    validate_id(root_id, "root_id")
    xid, state_id, seq = tree_cursor(after)
    return _tree(sql, root_id, after, (xid, state_id, seq), check_limit(limit), where)


def _tree(
    sql: Sql,
    root_id: str,
    after: str | None,
    cursor: tuple[int, str, int],
    limit: int | None,
    where: str,
) -> Plan[tuple[tuple[TreeEntry, ...], bool]]:
    xid, state_id, seq = cursor
    params = {"root": root_id, "xid": str(xid), "state": state_id, "seq": seq, "limit": limit}
    rows: list[Row] = yield Query(sql.tree, params)
    root, xmax = rows[0][0], int(rows[0][1])
    if root is None:
        raise not_found(root_id, where)
    if root != root_id:
        raise not_a_root(root_id, str(root))
    if xid >= xmax:
        raise bad_cursor(after, _EXAMPLE, "it is past what this store has given")
    settled: list[Row] = []
    held = False
    for row in rows:
        if row[2] is None:
            break  # the page is empty
        if not row[3]:
            held = True
            break
        settled.append(row)

    def checked() -> tuple[TreeEntry, ...]:
        return tuple(
            TreeEntry(
                make_cursor(_KIND, at, index, owner),
                owner,
                check_link(where, owner, index, bytes(data), digest, previous),
            )
            for _, _, at, _, owner, index, data, digest, previous in settled
        )

    entries: tuple[TreeEntry, ...] = yield Work(checked)
    return entries, held and not entries


# -- agent memory --------------------------------------------------------------------------


def _check_nul(*texts: str | None) -> None:
    for text in texts:
        if text is not None and "\x00" in text:
            raise ValueError(
                f"{text[:40]!r} holds the NUL character (U+0000), which PostgreSQL text cannot"
                " hold: remove it from the memory key or space."
            )


def memory_get_plan(sql: Sql, agent: str, space: str, key: str) -> Plan[str | None]:
    """The text stored under `key` in the agent's space, or None.

    Raises:
        TypeError, ValueError: A bad agent name, space or key (at once, before any I/O).
    """
    check_memory(agent, space, key)
    _check_nul(space, key)
    return _memory_get(sql, agent, space, key)


def _memory_get(sql: Sql, agent: str, space: str, key: str) -> Plan[str | None]:
    rows: list[Row] = yield Query(sql.memory_get, (agent, space, key))
    return str(rows[0][0]) if rows else None


def memory_scan_plan(sql: Sql, agent: str, space: str) -> Plan[list[tuple[str, str]]]:
    """Every ``(key, text)`` of the agent's space, in key order (code points).

    Raises:
        TypeError, ValueError: A bad agent name or space (at once, before any I/O).
    """
    check_memory(agent, space)
    _check_nul(space)
    return _memory_scan(sql, agent, space)


def _memory_scan(sql: Sql, agent: str, space: str) -> Plan[list[tuple[str, str]]]:
    rows: list[Row] = yield Query(sql.memory_scan, (agent, space))
    return [(str(row[0]), str(row[1])) for row in rows]


def memory_put_plan(
    sql: Sql, agent: str, space: str, key: str, data: str | None, effect: str | None
) -> Plan[bool]:
    """Write `data` under `key` (None deletes it), once per `effect` key; whether it applied.

    One statement: with an effect key, the key is inserted with the write, so both happen or
    neither, and a write whose key is stored already writes nothing.

    Raises:
        TypeError, ValueError: A bad argument (at once, before any I/O).
    """
    check_memory(agent, space, key, data=data, effect=effect)
    _check_nul(space, key, effect)
    return _memory_put(sql, agent, space, key, data, effect)


def _memory_put(
    sql: Sql, agent: str, space: str, key: str, data: str | None, effect: str | None
) -> Plan[bool]:
    if effect is None:
        if data is None:
            yield Query(sql.memory_delete, (agent, space, key))
        else:
            yield Query(sql.memory_set, (agent, space, key, data))
        return True
    params = {"agent": agent, "space": space, "key": key, "value": data, "effect": effect}
    statement = sql.memory_delete_once if data is None else sql.memory_set_once
    rows: list[Row] = yield Query(statement, params)
    return bool(rows[0][0])
