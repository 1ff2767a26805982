"""Reading a store for the commands and the viewer: an agent's name, the tree of a run.

`tree` and `view` both draw the tree of subagents under a State: it is read here, once.
"""

from __future__ import annotations

import builtins
from typing import Protocol

from orchestrator import OrchestratorError, State, StateInfo, ToolCall

from ..testing._replay import agent_name
from ._tree import TreeNode

__all__ = ("Readable", "agent_of", "read_tree")


class Readable(Protocol):
    """What the command line and the viewer read of a store: `list` and `load`."""

    def list(
        self, *, parent_id: str | None = None, limit: int | None = None
    ) -> builtins.list[StateInfo]:
        """The saved States, most recently updated first."""
        ...

    def load(self, state_id: str) -> State:
        """The State saved under `state_id`."""
        ...


def agent_of(store: Readable, info: StateInfo) -> str | None:
    """The agent that ran a listed State, read from its history (None if it cannot be read)."""
    if info.damage is not None:
        return None
    try:
        return agent_name(store.load(info.id))
    except (LookupError, OrchestratorError, ValueError):
        return None


def read_tree(store: Readable, info: StateInfo) -> TreeNode:
    """The tree of States under `info`, each child under the call that started it.

    Each node keeps the State it loaded (`TreeNode.state`); a State that cannot be loaded is a
    node with its damage and no children. The tree is walked with a list, not by recursion, so
    a chain of subagents of any depth is read.
    """
    root = _node(store, info, None)
    seen = {info.id}
    pending = [root]
    while pending:
        node = pending.pop()
        if node.state is None:
            continue
        calls = {
            tool_call.id: tool_call
            for entry in node.state.history
            if entry.kind == "model_reply"
            for tool_call in entry.tool_calls
        }
        children: list[StateInfo] = store.list(parent_id=node.info.id)
        children.sort(key=lambda child: (child.created_at is None, child.created_at or 0, child.id))
        for child in children:
            if child.id not in seen:
                seen.add(child.id)
                kid = _node(store, child, calls.get(child.parent_call_id or ""))
                node.children.append(kid)
                pending.append(kid)
    return root


def _node(store: Readable, info: StateInfo, call: ToolCall | None) -> TreeNode:
    """The node of one State, loaded, without its children."""
    if info.damage is not None:
        return TreeNode(info, call=call)
    try:
        state: State = store.load(info.id)
    except (LookupError, OrchestratorError, ValueError) as error:
        return TreeNode(info, call=call, damage=str(error))
    return TreeNode(info, agent_name(state), call, state=state)
