"""Approvals that wait: a person decides the calls a permission deferred, in any process.

A permission that returns `Deferred` (such as `ApproveLater`) stops the run with
`StoppedByApproval` once the turn's other calls are done; the State is saved. Later, maybe in
another process, ``state = store.load(id)``, then `approve` or `deny` each waiting call, then run
the State again: approved calls run exactly once, denied calls get error results the model reads.

A decision is a history entry (`ApprovalEntry`: the call, approved or not, who, why; when is the
entry's time), so a State still is its history. A subagent's waiting calls are listed at its
parent (and up to the root, `AwaitingCall.via` naming the call that leads there): a decision made
at the root is recorded there and in the subagent State the call belongs to, which is saved, and
the next run of the root continues that subagent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._history import ApprovalRecord
from ._recording import child_store, known_child, record_approval, store_of, value_of
from ._stopped import AwaitingCall
from ._sync import call_twin, run_sync

if TYPE_CHECKING:
    from ._state import State

__all__ = ("aapprove", "adeny", "approve", "awaiting", "deny")


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


def _owner_in_memory(state: State, item: AwaitingCall) -> State | None:
    """The State the call belongs to, when no store holds it: `state` or a child in memory."""
    if item.state_id == state.id:
        return state
    return known_child(state, item.state_id)


def _no_owner(state: State, item: AwaitingCall) -> ValueError:
    return ValueError(
        f"The call {item.call.id} belongs to the subagent State {item.state_id}, which is not"
        f" in memory, and State {state.id} is bound to no store to load it from: decide on the"
        " State loaded from its store (store.load(id))."
    )


async def _decide(
    state: State, call_id: str, approved: bool, by: str | None, reason: str | None
) -> None:
    """Record the decision in `state` and in the State the call belongs to; save both."""
    plan = _plan(state, call_id, approved, by, reason)
    if plan is None:
        return
    item, record = plan
    store: Any = child_store(state)
    if item.state_id != state.id:
        if store is not None:
            owner: State = await call_twin(store, "load", item.state_id)
            record_approval(owner, record)
            await call_twin(store, "save", owner)
        else:
            found = _owner_in_memory(state, item)
            if found is None:
                raise _no_owner(state, item)
            record_approval(found, record)
    record_approval(state, record)
    if store_of(state) is not None:
        await call_twin(store_of(state), "save", state)


def approve(
    state: State, call_id: str, *, by: str | None = None, reason: str | None = None
) -> None:
    """Approve the waiting call `call_id`: the next run of `state` runs it, once.

    The decision is recorded in `state` and in the subagent State the call belongs to (loaded
    from the store, then saved); `state` is saved when it is bound to a store. Approving a call
    that is approved already does nothing.

    Args:
        state: The State that stopped with `StoppedByApproval` (the root of the tree).
        call_id: The id of a call in `awaiting(state)`.
        by: Who decided (recorded).
        reason: Why (recorded).

    Raises:
        KeyError: No such call waits; the message lists the calls that do.
        ValueError: The call was denied already.
        TypeError: Called on a thread that runs an event loop (use `aapprove` there).
    """
    run_sync(_decide, state, call_id, True, by, reason, name="approve")


def deny(state: State, call_id: str, *, by: str | None = None, reason: str | None = None) -> None:
    """Deny the waiting call `call_id`: the next run gives it an error result the model reads.

    Recorded and saved like `approve`; denying a call denied already does nothing.

    Raises:
        KeyError: No such call waits; the message lists the calls that do.
        ValueError: The call was approved already.
        TypeError: Called on a thread that runs an event loop (use `adeny` there).
    """
    run_sync(_decide, state, call_id, False, by, reason, name="deny")


async def aapprove(
    state: State, call_id: str, *, by: str | None = None, reason: str | None = None
) -> None:
    """The async twin of `approve` (a sync store is used from a worker thread)."""
    await _decide(state, call_id, True, by, reason)


async def adeny(
    state: State, call_id: str, *, by: str | None = None, reason: str | None = None
) -> None:
    """The async twin of `deny`."""
    await _decide(state, call_id, False, by, reason)
