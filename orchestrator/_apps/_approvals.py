"""Approvals that wait: a person decides the calls a permission deferred, in any process.

A permission that returns `Deferred` (such as `ApproveLater`) stops the run with
`StoppedByApproval` once the turn's other calls are done; the State is saved. Later, maybe in
another process, ``state = store.load(id)``, then `approve` or `deny` each waiting call, then run
the State again: approved calls run exactly once, denied calls get error results the model reads.

A decision is a history entry (`ApprovalEntry`: the call, approved or not, who, why; when is the
entry's time), so a State still is its history. A subagent's waiting calls are listed at its
parent (and up to the root, `AwaitingCall.via` naming the call that leads there).

One source of truth: a decision is recorded and saved only in the State it was made on, in one
save, so it takes effect at every level or at none, whatever fails or dies. When that State
runs again and continues the waiting subagent, it hands its decisions on that subagent's calls
down (`hand_down`): the subagent records them in its own history just before it runs, and each
level does the same for the next one. A decision a subagent holds that its parent never made
(one made on the subagent State itself, or one an earlier version wrote there when the root's
save then failed) is never carried out by the parent's run: the call stays waiting at the
parent until it is decided there. Opposite decisions in a parent and its subagent carry out
neither: the parent's call gets an error result that says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio.lowlevel

from .._base._stopped import AwaitingCall
from .._base._sync import run_sync
from .._record._history import ApprovalRecord
from .._record._recording import record_approval, store_of, take_back, value_of

if TYPE_CHECKING:
    from .._record._state import State

__all__ = ("aapprove", "adeny", "approve", "awaiting", "deny", "hand_down")


def awaiting(state: State) -> tuple[AwaitingCall, ...]:
    """The calls of `state` and its subagents that wait for a decision, in request order.

    Empty when nothing waits. A call leaves the tuple once it is decided.
    """
    value = value_of(state)
    return tuple(item for item in value.awaiting if item.call.id not in value.decisions)


def _plan(
    state: State, call_id: str, approved: bool, by: str | None, reason: str | None
) -> tuple[AwaitingCall, ApprovalRecord] | None:
    """The waiting call `call_id` and the decision to record; None if it is made already.

    Raises:
        TypeError: An argument has the wrong type.
        KeyError: No call `call_id` waits for a decision (the message lists those that do).
        ValueError: The call was decided the other way already.
    """
    if not isinstance(call_id, str):
        raise TypeError(f"call_id must be the str id of a waiting call, got {call_id!r}.")
    for name, value in (("by", by), ("reason", reason)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{name} must be a str or None, got {type(value).__name__}.")
    folded = value_of(state)
    item = next((item for item in folded.awaiting if item.call.id == call_id), None)
    if item is None:
        waiting = ", ".join(f"{i.call.id} ({i.call.name} in {i.state_id})" for i in awaiting(state))
        raise KeyError(
            f"No call {call_id!r} of State {state.id} waits for a decision. The calls waiting"
            f" are: {waiting or 'none'}."
        )
    earlier = folded.decisions.get(call_id)
    if earlier is not None:
        if earlier.approved == approved:
            return None  # deciding twice is harmless
        done = "approved" if earlier.approved else "denied"
        who = f" by {earlier.by}" if earlier.by else ""
        raise ValueError(
            f"The call {call_id} ({item.call.name}) was {done}{who} already, and a decision is"
            " final. Run the State to carry it out."
        )
    return item, ApprovalRecord(call_id=call_id, approved=approved, by=by, reason=reason)


async def _decide(
    state: State, call_id: str, approved: bool, by: str | None, reason: str | None
) -> None:
    """Record the decision in `state` alone and save it: one save, so all of it or none.

    A save that fails takes the decision back out of `state` (unless something else was
    recorded in it meanwhile), so the call stays decidable.
    """
    plan = _plan(state, call_id, approved, by, reason)
    store = store_of(state)
    before = value_of(state)
    if plan is not None:
        record_approval(state, plan[1])
    if store is None:
        await anyio.lowlevel.checkpoint()
        return
    after = value_of(state)
    try:
        await store.save(state)
    except BaseException:
        take_back(state, before, after)
        raise


def hand_down(parent: State, child: State, call_id: str) -> tuple[AwaitingCall, ...]:
    """Record in `child` the decisions `parent` holds on the calls that wait through `call_id`.

    The run of `parent` calls it before it continues `child`, the subagent State its waiting
    call `call_id` started: the child's own run then carries the decisions out, and its
    history says who made them. A decision the child holds already is left as it is, and so is
    a call the child no longer waits on.

    Returns:
        Empty when `child` may be continued. Otherwise the calls (as `parent` lists them) that
        must stay waiting, and nothing was recorded: `child` holds a decision on one of them
        that `parent` never made, which the parent's run must not carry out.

    Raises:
        ValueError: `child` holds the opposite of one of `parent`'s decisions (nothing is
            recorded).
    """
    value, known = value_of(parent), value_of(child)
    items = tuple(item for item in value.awaiting if item.via == call_id)
    waiting_in_child = {item.call.id for item in known.awaiting}
    records: list[ApprovalRecord] = []
    for item in items:
        mine, theirs = value.decisions.get(item.call.id), known.decisions.get(item.call.id)
        if theirs is None:
            if mine is not None and item.call.id in waiting_in_child:
                records.append(mine)
        elif mine is None:
            return items
        elif mine.approved != theirs.approved:
            raise ValueError(
                f"The call {item.call.id} ({item.call.name}) was {_done(mine)} in State"
                f" {parent.id} and {_done(theirs)} in its subagent State {child.id}, so it was"
                " not carried out and the subagent was not continued."
            )
    for record in records:
        record_approval(child, record)
    return ()


def _done(record: ApprovalRecord) -> str:
    done = "approved" if record.approved else "denied"
    return f"{done} by {record.by}" if record.by else done


def approve(
    state: State, call_id: str, *, by: str | None = None, reason: str | None = None
) -> None:
    """Approve the waiting call `call_id`: the next run of `state` runs it, once.

    The decision is recorded in `state` alone and, when `state` is bound to a store, saved in
    one save: it takes effect whole or not at all, whatever fails or dies on the way. When this
    returns, it is stored. When the save fails (`StoreConflictError`: another copy of `state`
    was saved meanwhile, so load it again and decide again; or any error of the store), the
    decision is taken back out of `state` and the call stays decidable. A call of a subagent
    is carried out by the next run of `state`, which hands the decision down to the subagent
    before it continues it. Approving a call that is approved already records nothing (it only
    saves `state`).

    Args:
        state: The State that stopped with `StoppedByApproval` (the root of the tree).
        call_id: The id of a call in `awaiting(state)`.
        by: Who decided (recorded).
        reason: Why (recorded).

    Raises:
        KeyError: No such call waits; the message lists the calls that do.
        ValueError: The call was denied already.
        StoreConflictError: Another copy of `state` was saved since it was loaded; nothing was
            decided (a `ValueError`).
        TypeError: Called on a thread that runs an event loop (use `aapprove` there).
    """
    run_sync(_decide, state, call_id, True, by, reason, name="approve")


def deny(state: State, call_id: str, *, by: str | None = None, reason: str | None = None) -> None:
    """Deny the waiting call `call_id`: the next run gives it an error result the model reads.

    Recorded and saved like `approve`, whole or not at all; denying a call denied already
    records nothing (it only saves `state`).

    Raises:
        KeyError: No such call waits; the message lists the calls that do.
        ValueError: The call was approved already.
        StoreConflictError: Another copy of `state` was saved since it was loaded; nothing was
            decided (a `ValueError`).
        TypeError: Called on a thread that runs an event loop (use `adeny` there).
    """
    run_sync(_decide, state, call_id, False, by, reason, name="deny")


async def aapprove(
    state: State, call_id: str, *, by: str | None = None, reason: str | None = None
) -> None:
    """The async twin of `approve`, for request handlers (a sync store is used from a thread)."""
    await _decide(state, call_id, True, by, reason)


async def adeny(
    state: State, call_id: str, *, by: str | None = None, reason: str | None = None
) -> None:
    """The async twin of `deny`."""
    await _decide(state, call_id, False, by, reason)
