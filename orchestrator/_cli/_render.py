"""How the commands draw: rich tables and trees built from `_views`.

User text (messages, tool results, ids) goes into `rich.text.Text` objects, never into markup,
so a ``[bracket]`` in a message is shown as written.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

import pydantic_core
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from orchestrator import (
    ApprovalEntry,
    AskEntry,
    ContextChangeEntry,
    ErrorEntry,
    ExtraDataEntry,
    HistoryEntry,
    Message,
    ModelReplyEntry,
    ModelRequestEntry,
    NoticeEntry,
    PromptEntry,
    RunStartEntry,
    State,
    StateInfo,
    StopEntry,
    TextBlock,
    ToolCall,
    ToolResultBlock,
    ToolResultEntry,
    Usage,
    UserEntry,
)

from .._viewing._marks import Cost, cost_of, marks, waits
from .._viewing._tree import TreeNode
from .._viewing._views import model_calls, run_of, seconds, sent_by_request, status

__all__ = (
    "happened_table",
    "history_table",
    "node_label",
    "runs_table",
    "show_view",
    "state_header",
    "tree_view",
)

_STATUS_STYLE = {"answered": "green", "finished": "green", "open": "yellow", "damaged": "red"}


def cost(usage: Usage) -> str:
    """The cost in dollars, or ``-`` when unknown."""
    return "-" if usage.cost is None else f"${usage.cost:.4f}"


def tokens(usage: Usage) -> str:
    """Input and output tokens, ``1,200→300``."""
    return f"{usage.input_tokens:,}→{usage.output_tokens:,}"


def reasoning(usage: Usage) -> str:
    """How many of the output tokens were reasoning, `` (40 reasoning)``; nothing if none."""
    return f" ({usage.reasoning_tokens:,} reasoning)" if usage.reasoning_tokens else ""


def when(moment: datetime | None) -> str:
    """A moment in local time, to the second."""
    return "-" if moment is None else moment.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def cut(text: str, limit: int | None) -> str:
    """`text`, cut to `limit` characters with a note of how much was left out."""
    if limit is None or len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit:,} more characters; --full shows all)"


def _status_text(word: str) -> Text:
    return Text(word, style=_STATUS_STYLE.get(word, "magenta"))


def runs_table(rows: Sequence[tuple[StateInfo, str | None]]) -> Table:
    """The `runs` table: one row per State, with the agent's name when it was read."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in ("id", "agent", "status", "turn", "tokens", "cost", "updated", "title"):
        right = name in ("turn", "tokens", "cost")
        table.add_column(name, justify="right" if right else "left", no_wrap=name != "title")
    for info, agent in rows:
        word = status(info.stopped, info.finished, info.damage)
        table.add_row(
            Text(info.id[:12]),
            Text(agent or "-"),
            _status_text(word),
            str(info.turn),
            tokens(info.usage),
            cost(info.usage),
            when(info.updated_at),
            Text(info.damage if info.damage else cut(info.title, 60)),
        )
    return table


def state_header(state: State, limit: int | None) -> Table:
    """The facts of a State: who ran it, its status, times, usage, answer, children."""
    run = run_of(state)
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    agent = Text(run.agent or "(unnamed agent)")
    agent.append(f"  model {run.model or '-'}, {run.runs} run{'s' if run.runs != 1 else ''}")
    table.add_row("state", Text(state.id))
    table.add_row("agent", agent)
    if state.parent_id is not None:
        table.add_row("parent", Text(f"{state.parent_id} (call {state.parent_call_id})"))
    table.add_row("status", Text(f"{status(state.stopped, state.finished)} at turn {state.turn}"))
    if state.stopped is not None:
        table.add_row("stop", Text(str(state.stopped)))
    took = seconds(state.created_at, state.updated_at)
    table.add_row(
        "time",
        Text(
            f"{when(state.created_at)} → {when(state.updated_at)}"
            + ("" if took is None else f" ({took:.3f} s)")
        ),
    )
    usage = state.usage
    table.add_row(
        "usage",
        Text(
            f"{usage.input_tokens:,} in, {usage.output_tokens:,} out tokens{reasoning(usage)};"
            f" {usage.requests} requests; cost {cost(usage)} (subagents included)"
        ),
    )
    own = cost_of(state)
    requests = own.priced + own.unpriced
    table.add_row("cost", Text(f"{own.text()} for its own {requests} model requests"))
    answer = state.answer
    if answer is not None:
        shown = answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False)
        table.add_row("answer", Text(cut(shown, limit)))
    if state.children:
        table.add_row("children", Text(", ".join(state.children)))
    return table


def happened_table(state: State) -> Table | None:
    """Recoveries, resumes, waits for a person and stops other than an answer; None if none.

    The decisions themselves are rows of the history.
    """
    rows = [m for m in marks(state) if m["text"] != "answered" and m["kind"] != "approval"]
    waited = waits(state).values()
    if not rows and not waited:
        return None
    table = Table(box=None, pad_edge=False, show_header=False)
    table.add_column(justify="right", no_wrap=True)
    table.add_column(no_wrap=True, style="bold")
    table.add_column()
    start = state.created_at
    for mark in rows:
        table.add_row(f"+{seconds(start, mark['at']) or 0:.3f}s", mark["kind"], mark["text"])
    for wait in waited:
        took = seconds(wait.since, wait.decided_at)
        said = "no decision yet"
        if took is not None:
            word = "approved" if wait.approved else "denied"
            said = f"{word}{f' by {wait.by}' if wait.by else ''} after {took:.3f} s"
        why = f" ({wait.reason})" if wait.reason else ""
        table.add_row(
            f"+{seconds(start, wait.since) or 0:.3f}s", "waited", f"{wait.call_id}{why}: {said}"
        )
    return table


def _message_text(message: Message, limit: int | None) -> Text:
    text = Text()
    for block in message.content:
        if text:
            text.append("\n")
        if isinstance(block, TextBlock):
            text.append(cut(block.text, limit))
        elif isinstance(block, ToolCall):
            text.append(_call_text(block, limit))
        elif isinstance(block, ToolResultBlock):
            text.append(f"result of {block.call_id}: ", style="cyan")
            text.append(cut(block.text, limit))
        else:
            text.append(f"({block.kind} block)", style="dim")
    return text


def _call_text(call: ToolCall, limit: int | None) -> Text:
    args = json.dumps(call.args, ensure_ascii=False)
    text = Text("call ", style="cyan")
    text.append(call.name, style="bold cyan")
    text.append(f"({cut(args, limit)})  [{call.id}]")
    return text


def _price(usage: Usage) -> str:
    return "unpriced" if usage.cost is None else f"${usage.cost:.4f}"


def _usage_text(usage: Usage) -> str:
    return f"{tokens(usage)} tok, {cost(usage)}"


def _entry_row(
    entry: HistoryEntry, limit: int | None, asked: dict[str, tuple[datetime, ToolCall]]
) -> tuple[str, Text]:
    """The label and the details of one history entry (`asked`: each call seen, and when)."""
    if isinstance(entry, RunStartEntry):
        start = entry.content
        text = Text(f"agent {start.agent or '(unnamed)'}, model {start.model or '-'}")
        if start.tools:
            text.append(f"; tools: {', '.join(start.tools)}")
        if start.parent_id is not None:
            text.append(f"; started by call {start.parent_call_id} of {start.parent_id}")
        return "run start", text
    if isinstance(entry, UserEntry | NoticeEntry):
        return entry.kind, _message_text(entry.content, limit)
    if isinstance(entry, ContextChangeEntry):
        change = entry.content
        if change.kind == "import":
            text = Text()
            for message in change.messages:
                if text:
                    text.append("\n")
                text.append(f"{message.role}: ", style="bold")
                text.append(_message_text(message, limit))
            return "messages", text
        if change.kind == "compact":
            return "compacted", Text(cut(change.summary or "", limit))
        if change.kind == "clear_tool_results":
            return "cleared", Text(f"tool results cleared, the last {change.keep_last} kept")
        return "restored", Text(f"went back to entry {change.restored_to}")
    if isinstance(entry, ExtraDataEntry):
        change = entry.content
        parts = [
            f"{key} = {json.dumps(value, ensure_ascii=False)}"
            for key, value in change.changed.items()
        ]
        parts += [f"{key} removed" for key in change.removed]
        label = "data (merge)" if change.turn_merge else "data"
        return label, Text(cut("; ".join(parts), limit))
    if isinstance(entry, ModelRequestEntry):
        request = entry.content
        count = request.message_count
        return "request", Text(
            f"{count} message{'' if count == 1 else 's'} to {request.model or 'the model'}",
            style="dim",
        )
    if isinstance(entry, ModelReplyEntry):
        reply = entry.content
        for call in entry.tool_calls:
            asked[call.id] = (entry.at, call)
        text = _message_text(reply.message, limit) if reply.message.content else Text("(empty)")
        text.append(
            f"\n{_usage_text(reply.usage)}; stop reason {reply.stop_reason or '-'}", style="dim"
        )
        return "reply", text
    if isinstance(entry, ToolResultEntry):
        took = seconds(asked[entry.call.id][0] if entry.call.id in asked else None, entry.at)
        text = Text(f"{entry.call.name} ", style="bold cyan")
        text.append(f"[{entry.call.id}] ")
        text.append(entry.outcome, style="green" if entry.outcome == "done" else "red")
        if took is not None:
            text.append(f" in {took:.3f} s")
        if entry.late:
            text.append(" (late)", style="yellow")
        if entry.child_ids:
            text.append(f"; subagents {', '.join(entry.child_ids)} ({_usage_text(entry.usage)})")
        text.append("\n")
        text.append(cut(entry.content.text, limit))
        return "tool result", text
    if isinstance(entry, ErrorEntry):
        return "error", Text(cut(entry.content, limit), style="red")
    if isinstance(entry, StopEntry):
        return "stop", Text(str(entry.content))
    if isinstance(entry, AskEntry):
        record = entry.content
        answer = record.error if record.error else json.dumps(record.answer, ensure_ascii=False)
        return "ask", Text(cut(f"{record.question} → {answer}", limit))
    if isinstance(entry, ApprovalEntry):
        return "approval", _approval_text(entry, limit, asked)
    if isinstance(entry, PromptEntry):
        prompt = entry.content
        text = Text(f"[{prompt.digest}] ", style="dim")
        text.append(cut(prompt.instructions or "(no instructions)", limit))
        text.append(f"\ntools: {', '.join(prompt.tool_names) or '(none)'}", style="dim")
        if prompt.options:
            options = json.dumps(dict(prompt.options), ensure_ascii=False, sort_keys=True)
            text.append(f"; options: {cut(options, limit)}", style="dim")
        return "prompt", text
    content = json.dumps(pydantic_core.to_jsonable_python(entry.content), ensure_ascii=False)
    return str(entry.kind), Text(cut(content, limit))  # pragma: no cover - a kind added later


def _approval_text(
    entry: ApprovalEntry, limit: int | None, asked: dict[str, tuple[datetime, ToolCall]]
) -> Text:
    """A person's decision: approved or denied, which call, by whom, and why."""
    record = entry.content
    text = Text(
        "approved" if record.approved else "denied", style="green" if record.approved else "red"
    )
    call = asked[record.call_id][1] if record.call_id in asked else None
    text.append(" call ")
    if call is not None:
        text.append(call.name, style="bold cyan")
        text.append(" ")
    text.append(f"[{record.call_id}]")
    if record.by:
        text.append(f" by {record.by}")
    if record.reason:
        text.append(f": {cut(record.reason, limit)}")
    return text


def history_table(state: State, limit: int | None) -> Table:
    """The history of a State, one row per entry, timed from its first entry."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("at", justify="right", no_wrap=True)
    table.add_column("what", no_wrap=True, style="bold")
    table.add_column("")
    start = state.created_at
    asked: dict[str, tuple[datetime, ToolCall]] = {}
    sent = sent_by_request(state)
    first = min(sent, default=-1)
    for entry in state.history:
        label, details = _entry_row(entry, limit, asked)
        told = sent.get(entry.seq) if isinstance(entry, ModelRequestEntry) else None
        if told is not None and told.earlier:
            details.append(f" ({len(told.new)} new)", style="dim")
        elif told is not None and told.count and entry.seq != first:
            details.append(" (the context was rewritten: all of them new)", style="dim")
        offset = seconds(start, entry.at)
        table.add_row(f"+{offset or 0:.3f}s", label, details)
    return table


def timings_table(state: State) -> Table | None:
    """The model requests and their times, or None if there were none."""
    calls = model_calls(state)
    if not calls:
        return None
    table = Table(box=None, pad_edge=False, header_style="bold", title_justify="left")
    for name in ("turn", "model", "seconds", "tokens", "cost", "stop reason"):
        table.add_column(name, justify="left" if name in ("model", "stop reason") else "right")
    for call in calls:
        reply = call.reply
        took = call.seconds
        table.add_row(
            str(call.request.turn),
            call.request.content.model or "-",
            "-" if took is None else f"{took:.3f}",
            "-" if reply is None else tokens(reply.content.usage),
            "-" if reply is None else _price(reply.content.usage),
            "error"
            if call.error is not None
            else (reply.content.stop_reason or "-")
            if reply is not None
            else "no reply",
        )
    return table


def show_view(state: State, limit: int | None) -> RenderableType:
    """Everything `show` prints of a State."""
    parts: list[RenderableType] = [state_header(state, limit), Text("")]
    happened = happened_table(state)
    if happened is not None:
        parts += [Text("What happened", style="bold underline"), happened, Text("")]
    timings = timings_table(state)
    if timings is not None:
        parts += [Text("Model requests", style="bold underline"), timings, Text("")]
    parts += [Text("History", style="bold underline"), history_table(state, limit)]
    return Group(*parts)


def node_label(node: TreeNode, tree_cost: Cost | None = None) -> Text:
    """The line of `node` in a drawn tree.

    `tree_cost` is its subtree's: shown when a request had no price, where the usage's sum
    would only say ``-``.
    """
    info = node.info
    text = Text(f"{node.agent or '(unnamed agent)'} ", style="bold")
    text.append(f"{info.id[:12]} ", style="dim")
    word = "damaged" if node.damage else status(info.stopped, info.finished)
    text.append(word, style=_STATUS_STYLE.get(word, "magenta"))
    price = cost(info.usage)
    if info.usage.cost is None and tree_cost is not None:
        price = tree_cost.text()
    text.append(
        f" · turn {info.turn} · {tokens(info.usage)} tok · {info.usage.requests} req · {price}"
    )
    if node.call is not None:
        text.append(f"  ← {node.call.name} {node.call.id}", style="dim")
    if node.damage:
        text.append(f"\n{node.damage}", style="red")
    return text


DEEPEST_DRAWN = 12
"""Subagents nested deeper than this are drawn at this level, each line saying its own."""


def tree_view(root: TreeNode) -> Tree:
    """The tree of States under `root`, each under the call that started it.

    A chain deeper than `DEEPEST_DRAWN` would leave no room for its lines (each level takes
    four columns): the States below that level are listed, in order, under the one at that
    level, each line starting with its level.
    """
    costs = root.costs()
    tree = Tree(node_label(root, costs[id(root)]))
    pending: list[tuple[Tree, TreeNode, int]] = [
        (tree, child, 1) for child in reversed(root.children)
    ]
    while pending:
        branch, node, level = pending.pop()
        if level <= DEEPEST_DRAWN:
            twig = branch.add(node_label(node, costs[id(node)]))
        else:
            label = Text(f"level {level}: ", style="dim")
            label.append(node_label(node, costs[id(node)]))
            twig = branch
            branch.add(label)
        pending.extend((twig, child, level + 1) for child in reversed(node.children))
    return tree
