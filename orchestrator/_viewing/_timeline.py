"""The timeline of a run: its States, model requests and tool calls as bars over time.

Built from the `at` time of each history entry, so a saved run draws the same as it ran:

- a State's bar goes from its first entry to its last;
- a model request's, inside its State's bar, from the request to the reply (or error);
- a tool call's from the model reply that asked for it to its result (to the State's last
  entry while it has none).

Rows come in the tree's order: a State, then each of its calls, each followed by the States
it started. Calls of one turn that ran in parallel are bars that overlap.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pydantic_core

from orchestrator import State

from ._marks import cost_of, marks, waits
from ._tree import TreeNode
from ._views import model_calls, status, tool_runs, usage_data

__all__ = ("timeline_data",)


def _span(state: State) -> tuple[datetime, datetime] | None:
    history = state.history
    return (history[0].at, history[-1].at) if history else None


def _starts(root: TreeNode) -> list[datetime]:
    """The first moment of every State under `root` (itself included)."""
    spans = (None if node.state is None else _span(node.state) for node in root.walk())
    return [span[0] for span in spans if span is not None]


def timeline_data(root: TreeNode) -> dict[str, Any]:
    """The bars of the run under `root`, in seconds from its first entry, as JSON.

    Returns ``{"start": ISO time, "seconds": total, "rows": [...]}``. Each row has ``kind``
    (``"state"`` or ``"call"``), ``id``, ``depth``, ``start`` and ``end`` (seconds, None for a
    State that could not be read); a State row has its ``agent``, ``status`` and ``model``
    segments, its own ``cost`` and its ``marks`` (recoveries, resumes, stops, decisions); a call
    row its ``name``, ``state_id``, ``outcome`` (None while open), the ``children`` it started
    and its ``waiting`` for a person (None if it did not wait).
    """
    starts = _starts(root)
    if not starts:
        return {"start": None, "seconds": 0.0, "rows": []}
    origin = min(starts)
    rows = _rows(root, origin)
    ends = [row["end"] for row in rows if row["end"] is not None]
    return {"start": origin.isoformat(), "seconds": max(ends, default=0.0), "rows": rows}


def _offset(moment: datetime, origin: datetime) -> float:
    return round((moment - origin).total_seconds(), 6)


def _rows(root: TreeNode, origin: datetime) -> list[dict[str, Any]]:
    """The rows under `root`: each State, then each of its calls and the States it started.

    Walked with a list of what is left to write (a row, or a State to open), not by
    recursion, so a chain of subagents of any depth is drawn.
    """
    rows: list[dict[str, Any]] = []
    pending: list[dict[str, Any] | tuple[TreeNode, int]] = [(root, 0)]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            rows.append(item)
            continue
        node, depth = item
        rows.append(_state_row(node, depth, origin))
        pending.extend(reversed(_under(node, depth, origin)))
    return rows


def _state_row(node: TreeNode, depth: int, origin: datetime) -> dict[str, Any]:
    info = node.info
    state = node.state
    span = None if state is None else _span(state)
    row: dict[str, Any] = {
        "kind": "state",
        "id": info.id,
        "depth": depth,
        "agent": node.agent,
        "status": "damaged" if node.damage else status(info.stopped, info.finished),
        "damage": node.damage,
        "turn": info.turn,
        "usage": usage_data(info.usage),
        "call": None if node.call is None else {"id": node.call.id, "name": node.call.name},
        "start": None if span is None else _offset(span[0], origin),
        "end": None if span is None else _offset(span[1], origin),
        "model": [],
        "marks": [],
        "cost": None,
    }
    if state is None or span is None:
        return row
    row["cost"] = cost_of(state).data()
    row["marks"] = [{**mark, "at": _offset(mark["at"], origin)} for mark in marks(state)]
    for call in model_calls(state):
        end = call.reply or call.error
        row["model"].append(
            {
                "turn": call.request.turn,
                "start": _offset(call.request.at, origin),
                "end": _offset(span[1] if end is None else end.at, origin),
                "error": None if call.error is None else call.error.content,
            }
        )
    return row


def _under(
    node: TreeNode, depth: int, origin: datetime
) -> list[dict[str, Any] | tuple[TreeNode, int]]:
    """What comes under a State's row, in order: each call's row, then the States it started."""
    state = node.state
    span = None if state is None else _span(state)
    if state is None or span is None:
        return []
    under: list[dict[str, Any] | tuple[TreeNode, int]] = []
    placed: set[str] = set()
    waiting = waits(state)
    for tool in tool_runs(state):
        result = tool.result
        wait = waiting.get(tool.call.id)
        under.append(
            {
                "kind": "call",
                "id": tool.call.id,
                "depth": depth + 1,
                "name": tool.call.name,
                "args": pydantic_core.to_jsonable_python(tool.call.args),
                "state_id": state.id,
                "outcome": None if result is None else result.outcome,
                "children": list(tool.children),
                "start": _offset(tool.asked.at, origin),
                "end": _offset(span[1] if result is None else result.at, origin),
                "waiting": None if wait is None else wait.data(lambda at: _offset(at, origin)),
            }
        )
        for child in node.children:
            if child.call is not None and child.call.id == tool.call.id:
                placed.add(child.info.id)
                under.append((child, depth + 2))
    # a child whose call is not in the history (damage)
    under += [(child, depth + 1) for child in node.children if child.info.id not in placed]
    return under
