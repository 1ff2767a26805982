"""`TreeNode`: one State of a tree as the CLI and the viewer read it from a store."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from orchestrator import State, StateInfo, ToolCall

from ._marks import Cost, cost_of
from ._views import info_data

__all__ = ("TreeNode",)


class TreeNode:
    """One State of a tree, read from the store: its info, its agent, its children."""

    def __init__(
        self,
        info: StateInfo,
        agent: str | None = None,
        call: ToolCall | None = None,
        damage: str | None = None,
        state: State | None = None,
    ) -> None:
        self.info = info
        self.agent = agent
        self.call = call
        self.damage = damage or info.damage
        self.state = state  # the State read, None when it could not be
        self.children: list[TreeNode] = []

    def walk(self) -> Iterator[TreeNode]:
        """This node and every node under it, each before its children, in order.

        Walked with a list, not by recursion: a chain of subagents may be deeper than
        Python's recursion limit.
        """
        pending: list[TreeNode] = [self]
        while pending:
            node = pending.pop()
            yield node
            pending.extend(reversed(node.children))

    def costs(self) -> dict[int, Cost]:
        """The cost of each node's subtree (its own requests and its subagents'), by ``id(node)``.

        Each request without a price is counted (`Cost.unpriced`), where a `Usage` sum only
        says the cost is unknown.
        """
        costs: dict[int, Cost] = {}
        for node in reversed(list(self.walk())):  # children first
            own = Cost() if node.state is None else cost_of(node.state)
            costs[id(node)] = sum((costs[id(child)] for child in node.children), own)
        return costs

    def data(self) -> dict[str, Any]:
        """The node as JSON, its children nested.

        ``cost`` is the State's own model requests, ``tree_cost`` its and its subagents', each
        counting the requests that had no price.
        """
        nodes = list(self.walk())
        found: dict[int, dict[str, Any]] = {}
        costs = self.costs()
        for node in reversed(nodes):  # children first: each one's data is ready for its parent
            data = info_data(node.info, agent=node.agent)
            data["cost"] = (Cost() if node.state is None else cost_of(node.state)).data()
            data["tree_cost"] = costs[id(node)].data()
            if node.damage is not None:
                data["damage"] = node.damage
                data["status"] = "damaged"
            call = node.call
            data["call"] = None if call is None else {"id": call.id, "name": call.name}
            data["children"] = [found.pop(id(child)) for child in node.children]
            found[id(node)] = data
        return found[id(self)]
