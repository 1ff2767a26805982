"""`ConsoleReporter`: the live tree of States, calls and usage on a terminal (rich).

Opt-in: the library is quiet unless an app passes this reporter. It redraws on each event (no
refresh thread, so nothing runs after a run returns) and prints the final tree when the
outermost run ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rich.console import Console
from rich.live import Live
from rich.text import Text
from rich.tree import Tree

from ._reporting import Reporter

if TYPE_CHECKING:
    from .._base._messages import ToolCall
    from .._base._reply import Reply
    from .._record._history import ToolResultEntry
    from .._record._state import State

__all__ = ("ConsoleReporter",)

_STYLE = {"done": "green", "running": "yellow", "denied": "magenta", "unknown": "dim"}
_TEXT_TAIL = 80


@dataclass
class _Call:
    call: ToolCall
    status: str = "running"
    children: list[str] = field(default_factory=list[str])


@dataclass
class _Node:
    state: State
    agent: str = ""
    status: str = "running"
    text: str = ""
    calls: dict[str, _Call] = field(default_factory=dict[str, _Call])


class ConsoleReporter(Reporter):
    """Draws the live tree of a run: each State, its tool calls, and the subagents they start.

    Args:
        console: Where to draw (a `rich.console.Console`); the terminal by default.
        show_text: Whether to show the tail of the model's streamed text.
    """

    def __init__(self, console: Console | None = None, *, show_text: bool = True) -> None:
        self.console: Console = console or Console(stderr=True)
        self.show_text: bool = show_text
        self._nodes: dict[str, _Node] = {}
        self._roots: list[str] = []
        self._live: Live | None = None

    # -- drawing ---------------------------------------------------------------------------------

    def render(self) -> Tree:
        """The tree as it is now."""
        tree = Tree(Text("orchestrator", style="bold"))
        for root in self._roots:
            self._add(tree, root)
        return tree

    def _label(self, node: _Node) -> Text:
        state = node.state
        usage = state.usage
        cost = "" if usage.cost is None else f" ${usage.cost:.4f}"
        label = Text(f"{node.agent or 'agent'} ", style="bold")
        label.append(f"{state.id[:8]} ", style="dim")
        label.append(f"turn {state.turn} · {usage.input_tokens}→{usage.output_tokens} tok{cost} ")
        label.append(node.status, style=_STYLE.get(node.status, "red"))
        if self.show_text and node.text:
            label.append(f"  {node.text[-_TEXT_TAIL:]!r}", style="dim")
        return label

    def _add(self, parent: Tree, state_id: str) -> None:
        node = self._nodes[state_id]
        branch = parent.add(self._label(node))
        for item in node.calls.values():
            call = Text(f"{item.call.name} ", style="cyan")
            call.append(item.status, style=_STYLE.get(item.status, "red"))
            leaf = branch.add(call)
            for child in item.children:
                self._add(leaf, child)

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self.render(), refresh=True)

    # -- hooks -----------------------------------------------------------------------------------

    def on_run_start(self, state: State) -> None:
        """Add the State to the tree (a root unless a call started it) and start drawing."""
        if state.id not in self._nodes:
            self._nodes[state.id] = _Node(state)
            if state.parent_id is None or state.parent_id not in self._nodes:
                self._roots.append(state.id)
        node = self._nodes[state.id]
        node.status = "running"
        for entry in reversed(state.history):
            if entry.kind == "run_start":
                node.agent = entry.content.agent or ""
                break
        if self._live is None:
            self._live = Live(self.render(), console=self.console, auto_refresh=False)
            self._live.start()
        self._refresh()

    def on_think_start(self, state: State) -> None:
        """Show that the model is being asked."""
        self._set_status(state, "thinking")

    def on_text(self, state: State, chunk: str) -> None:
        """Show the tail of the streamed text."""
        node = self._nodes.get(state.id)
        if node is not None:
            node.text = (node.text + chunk)[-_TEXT_TAIL:].replace("\n", " ")
            self._refresh()

    def on_think_end(self, state: State, reply: Reply) -> None:
        """Show the reply's usage."""
        self._set_status(state, "running")

    def on_tool_start(self, state: State, call: ToolCall) -> None:
        """Add the call under its State."""
        node = self._nodes.get(state.id)
        if node is not None:
            node.calls[call.id] = _Call(call)
            self._refresh()

    def on_tool_deferred(self, state: State, call: ToolCall, reason: str | None) -> None:
        """Add the call under its State as waiting for a person, not running."""
        node = self._nodes.get(state.id)
        if node is not None:
            node.calls[call.id] = _Call(call, status="awaiting approval")
            self._refresh()

    def on_tool_end(self, state: State, call: ToolCall, entry: ToolResultEntry) -> None:
        """Show how the call ended."""
        node = self._nodes.get(state.id)
        if node is not None and call.id in node.calls:
            node.calls[call.id].status = entry.outcome
            self._refresh()

    def on_child_start(self, parent: State, call: ToolCall, child: State) -> None:
        """Hang the child State under the call that started it."""
        self._nodes.setdefault(child.id, _Node(child))
        node = self._nodes.get(parent.id)
        if node is not None:
            node.calls.setdefault(call.id, _Call(call)).children.append(child.id)
        self._refresh()

    def on_run_end(self, state: State, error: BaseException | None) -> None:
        """Mark the State done (or failed); the outermost run prints the final tree."""
        status = "done" if error is None else f"failed: {type(error).__name__}"
        self._set_status(state, status)
        finished = all(self._nodes[root].status != "running" for root in self._roots)
        if state.id in self._roots and self._live is not None and finished:
            self._live.stop()
            self._live = None

    def _set_status(self, state: State, status: str) -> None:
        node = self._nodes.get(state.id)
        if node is not None:
            node.status = status
            self._refresh()
