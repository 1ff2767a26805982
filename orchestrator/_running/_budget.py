"""Budgets: the `Limits` of the runs of a tree, and what the tree has spent against them.

A run with limits (its agent's, its call's, its tool's: the tighter of them) has a `Budget`;
a run without any shares the budget of the run above it. Each budget points to the one above
it, so spending flows up the chain as it happens: a reply of a child three levels down counts
at once against every ancestor's limit, not when the child ends.

A budget starts from what its State already spent, folded from the history (`state.usage`
holds the usage of the children whose calls closed; the tool calls and children are this
State's own), so a reloaded run keeps its budget. The counters themselves live only for the
run: they are the sum of the history, kept current between entries.

Checks happen before a model request (`before_request`: the request is refused when a limit
is used up, or the State's next input would pass an input or total token limit: its last
request's input plus output tokens, since a conversation only grows), before a turn's tool
calls (`before_tools`) and before a child starts (`before_child`). A request sent under the
limit may spend past it, so with N States running at once a token or cost limit is overshot by
at most what N requests spend (one in flight per running State). Requests, tool calls,
children and depth are reserved when checked, and never overshot by runs here.

A child run elsewhere is counted from what it saves (`spend_elsewhere`, read from the store's
tree feed by `orchestrator._running._remote`), and stopped once `used_up` finds a limit above
it used up; it also keeps to the limits it was given (`remaining`).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from .._base._errors import LimitReachedError
from .._base._limits import Limits
from .._base._logs import get_log
from .._base._stopped import StoppedByLimit
from .._record._history import ModelReplyEntry, ToolResultEntry
from .._record._recording import close_pending, record_stop

if TYPE_CHECKING:
    from .._base._reply import Usage
    from .._record._state import State

__all__ = (
    "Budget",
    "allow_request",
    "before_child",
    "before_request",
    "before_tools",
    "budget_for",
    "last_context",
    "remaining",
    "spend",
    "spend_elsewhere",
    "stop_for_limit",
    "used_up",
)

_log = get_log("limits")

_SPENT_AT_ONCE = ("input_tokens", "output_tokens", "total_tokens", "cost")


class Budget:
    """The limits of one run, what its tree spent, and the budget of the run above it."""

    __slots__ = (
        "by",
        "depth",
        "last",
        "limits",
        "maximum",
        "most_cost",
        "most_input",
        "most_output",
        "most_requests",
        "most_seconds",
        "most_tool_calls",
        "most_total",
        "owner",
        "parent",
        "spent",
        "started",
    )

    def __init__(self, limits: Limits, state: State, parent: Budget | None, depth: int) -> None:
        self.limits = limits
        self.maximum: dict[str, float] = dict(limits.set())
        self.owner = state.id
        self.parent = parent
        self.depth = depth  # the owner's depth below its root run
        self.started = time.monotonic()
        self.spent = _spent_in(state)
        self.by: dict[str, str] = {}  # for each limit reached, the State that spent the last of it
        self.last: str | None = None  # the State that spent last
        # Each maximum as an attribute (inf: none), for the checks of every turn.
        most = self.maximum.get
        self.most_input = most("input_tokens", math.inf)
        self.most_output = most("output_tokens", math.inf)
        self.most_total = most("total_tokens", math.inf)
        self.most_cost = most("cost", math.inf)
        self.most_requests = most("requests", math.inf)
        self.most_tool_calls = most("tool_calls", math.inf)
        self.most_seconds = most("seconds", math.inf)

    def stop(self, limit: str, by: str) -> StoppedByLimit:
        """The stop that `limit` of this budget gives, reached by the State `by`."""
        spent = self.elapsed() if limit == "seconds" else self.spent.get(limit, 0)
        return StoppedByLimit(
            limit=limit,
            maximum=self.maximum[limit],
            spent=spent,
            owner=self.owner,
            by=self.by.get(limit) or (by if limit not in _SPENT_AT_ONCE else self.last or by),
        )

    def elapsed(self) -> float:
        """Seconds since the owner's run started."""
        return time.monotonic() - self.started


def budget_for(
    limits: Limits | None, state: State, parent: Budget | None, depth: int
) -> Budget | None:
    """The budget of a run on `state`: its own if it has `limits`, else the one above it."""
    if limits is None or not limits.set():
        return parent
    return Budget(limits, state, parent, depth)


def last_context(state: State) -> int:
    """The input plus output tokens of `state`'s last reply: its next request holds both."""
    for entry in reversed(state.history):
        if isinstance(entry, ModelReplyEntry):
            usage = entry.content.usage
            return usage.input_tokens + usage.output_tokens
        if entry.kind == "context_change":
            return 0  # compacted or restored: the context is not the one the reply saw
    return 0


def _spent_in(state: State) -> dict[str, float]:
    """What `state` has spent, folded from its history."""
    usage = state.usage
    tool_calls = children = 0
    for entry in state.history:
        if isinstance(entry, ToolResultEntry) and not entry.late:
            tool_calls += 1
            children += len(entry.child_ids)
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "cost": usage.cost or 0.0,
        "requests": usage.requests,
        "tool_calls": tool_calls,
        "children": children,
    }


def before_request(
    budget: Budget, state_id: str, estimate: int, *, reserve: bool = True
) -> StoppedByLimit | None:
    """The stop a new model request of `state_id` meets, or None (the request is counted).

    `estimate` is how many input tokens the request is expected to have (0: unknown). With
    `reserve` false, only checked: the request is counted when it is sent.
    """
    needed = max(estimate, 1)
    chain: list[Budget] = []
    item: Budget | None = budget
    while item is not None:
        maximum, spent = item.maximum, item.spent
        if (  # the common case first: nothing near a limit
            spent["requests"] < item.most_requests - 1
            and spent["input_tokens"] + needed <= item.most_input
            and spent["total_tokens"] + needed <= item.most_total
            and spent["output_tokens"] < item.most_output
            and spent["cost"] < item.most_cost
            and (item.most_seconds == math.inf or item.elapsed() < item.most_seconds)
        ):
            chain.append(item)
            item = item.parent
            continue
        for limit, most in maximum.items():
            if limit == "requests":
                over = spent["requests"] + 1 > most
            elif limit in ("input_tokens", "total_tokens"):
                over = spent[limit] + needed > most
            elif limit in ("output_tokens", "cost"):
                over = spent[limit] >= most
            elif limit == "seconds":
                over = item.elapsed() >= most
            else:
                continue
            if over:
                return item.stop(limit, state_id)
        chain.append(item)
        item = item.parent
    if reserve:
        for item in chain:
            item.spent["requests"] += 1
    return None


def spend(budget: Budget, state_id: str, usage: Usage) -> None:
    """Count `usage`, which `state_id` just spent, against every budget up the chain."""
    total = usage.input_tokens + usage.output_tokens
    cost = usage.cost or 0.0
    item: Budget | None = budget
    while item is not None:
        spent = item.spent
        spent["input_tokens"] += usage.input_tokens
        spent["output_tokens"] += usage.output_tokens
        spent["total_tokens"] += total
        spent["cost"] += cost
        item.last = state_id
        if (
            spent["input_tokens"] < item.most_input
            and spent["output_tokens"] < item.most_output
            and spent["total_tokens"] < item.most_total
            and spent["cost"] < item.most_cost
        ):
            item = item.parent
            continue
        for limit in _SPENT_AT_ONCE:
            most = item.maximum.get(limit)
            if most is not None and spent[limit] >= most and limit not in item.by:
                item.by[limit] = state_id
        item = item.parent


def before_tools(budget: Budget, state_id: str, count: int) -> StoppedByLimit | None:
    """The stop that `count` tool calls of `state_id` meet, or None (they are counted).

    A token or cost limit used up stops the calls too: the run is to stop, not go on.
    """
    chain: list[Budget] = []
    item: Budget | None = budget
    while item is not None:
        maximum, spent = item.maximum, item.spent
        if (  # the common case first: nothing near a limit
            spent["tool_calls"] + count <= item.most_tool_calls
            and spent["input_tokens"] < item.most_input
            and spent["total_tokens"] < item.most_total
            and spent["output_tokens"] < item.most_output
            and spent["cost"] < item.most_cost
            and (item.most_seconds == math.inf or item.elapsed() < item.most_seconds)
        ):
            chain.append(item)
            item = item.parent
            continue
        for limit, most in maximum.items():
            if limit == "tool_calls":
                over = spent["tool_calls"] + count > most
            elif limit in _SPENT_AT_ONCE:
                over = spent[limit] >= most
            elif limit == "seconds":
                over = item.elapsed() >= most
            else:
                continue
            if over:
                return item.stop(limit, state_id)
        chain.append(item)
        item = item.parent
    for item in chain:
        item.spent["tool_calls"] += count
    return None


def before_child(budget: Budget, state_id: str, depth: int) -> StoppedByLimit | None:
    """The stop a new child of `state_id`, `depth` levels below its root, meets, or None.

    When it starts, it is counted against every `children` limit up the chain.
    """
    chain: list[Budget] = []
    item: Budget | None = budget
    while item is not None:
        maximum, spent = item.maximum, item.spent
        most = maximum.get("children")
        if most is not None and spent["children"] + 1 > most:
            return item.stop("children", state_id)
        most = maximum.get("depth")
        if most is not None and depth - item.depth > most:
            return StoppedByLimit(
                limit="depth",
                maximum=most,
                spent=depth - item.depth,
                owner=item.owner,
                by=state_id,
            )
        chain.append(item)
        item = item.parent
    for item in chain:
        item.spent["children"] += 1
    return None


def stop_for_limit(state: State, stopped: StoppedByLimit) -> None:
    """Stop `state`'s run for `stopped`: its pending calls closed, the stop recorded.

    Logged as the warning ``state.limit.reached`` (the library configures no logging).
    """
    _log.warning(
        "state.limit.reached",
        state_id=state.id,
        limit=stopped.limit,
        maximum=stopped.maximum,
        spent=stopped.spent,
        owner=stopped.owner,
        by=stopped.by,
    )
    if state.pending_calls:
        close_pending(state, "cancelled", f"(not run: {stopped})")
    record_stop(state, stopped)


def remaining(budget: Budget, depth: int, resumed: State | None = None) -> Limits:
    """What is left of every limit up the chain, for a child `depth` levels below its root.

    A child run elsewhere (another process or machine) gets it as limits of its own, so it
    keeps to them even where the budgets here only learn what it spent when it ends. A
    `resumed` child (a crash cut it off) gets what it spent before on top: its own budget
    folds that from its history again, and may only spend what is left from now on.
    """
    before = {} if resumed is None else _spent_in(resumed)
    left: dict[str, float] = {}
    item: Budget | None = budget
    while item is not None:
        for limit, most in item.maximum.items():
            if limit == "seconds":
                value = most - item.elapsed()
            elif limit == "depth":
                value = most - (depth - item.depth)
            elif limit == "children":
                value = most - item.spent["children"]
            else:
                value = most - item.spent[limit]
            value = max(value, 0) + before.get(limit, 0)
            left[limit] = min(value, left.get(limit, value))
        item = item.parent
    whole: dict[str, Any] = {
        name: int(value) if name not in ("cost", "seconds") else value
        for name, value in left.items()
    }
    return Limits(**whole)


def spend_elsewhere(
    budget: Budget, state_id: str, usage: Usage, *, tool_calls: int = 0, children: int = 0
) -> None:
    """Count what `state_id`, a run elsewhere, spent: `usage` (its requests too), and its calls.

    A child run elsewhere is counted from what it saved (`orchestrator._running._remote`):
    each reply as the store's feed shows it, and the rest when it ends.
    """
    spend(budget, state_id, usage)
    counts = (("requests", usage.requests), ("tool_calls", tool_calls), ("children", children))
    item: Budget | None = budget
    while item is not None:
        spent = item.spent
        for limit, amount in counts:
            if amount:
                spent[limit] += amount
                most = item.maximum.get(limit)
                if most is not None and spent[limit] >= most and limit not in item.by:
                    item.by[limit] = state_id
        item = item.parent


def used_up(budget: Budget) -> StoppedByLimit | None:
    """The stop of the first limit up the chain that the tree has used up, or None.

    A token or cost limit is used up when nothing is left (no request of the tree would be
    sent); a count (requests, tool calls, children) when the tree went past it, which only
    runs elsewhere can do. A run elsewhere is stopped when this is not None.
    """
    item: Budget | None = budget
    while item is not None:
        spent = item.spent
        for limit, most in item.maximum.items():
            if limit in ("depth", "seconds"):
                continue  # a run elsewhere is given what is left of them, and keeps to it
            if spent[limit] > most or (limit in _SPENT_AT_ONCE and spent[limit] >= most):
                return item.stop(limit, item.by.get(limit) or item.last or item.owner)
        item = item.parent
    return None


def allow_request(budget: Budget | None, state_id: str, estimate: int) -> None:
    """Count a model request of `state_id` against `budget`, or refuse it.

    Raises:
        LimitReachedError: A limit up the chain has nothing left for it.
    """
    if budget is not None:
        refused = before_request(budget, state_id, estimate)
        if refused is not None:
            raise LimitReachedError(refused)
