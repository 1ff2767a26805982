"""What the commands show of a State, as plain data: one source for the text and the JSON.

Everything here reads public names only: `StateInfo`, `State` and its history entries.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pydantic_core

from orchestrator import (
    ErrorEntry,
    Image,
    Message,
    ModelReplyEntry,
    ModelRequestEntry,
    Prompt,
    RunStartEntry,
    State,
    StateInfo,
    Stopped,
    StoppedByApproval,
    StoppedByFinish,
    StoppedByLimit,
    StoppedByPermission,
    StoppedByUntil,
    TextBlock,
    ToolCall,
    ToolResultBlock,
    ToolResultEntry,
    Usage,
)
from stores import encode_entry

from .._record._sent import request_messages
from ._marks import Waiting, cost_of, marks, waits

__all__ = (
    "ModelCall",
    "RunOf",
    "Sent",
    "ToolRun",
    "info_data",
    "messages_data",
    "model_calls",
    "prompt_holders",
    "prompt_in",
    "run_of",
    "seconds",
    "sent_by_request",
    "state_data",
    "status",
    "tool_runs",
    "usage_data",
)

ANSWERED = "waiting_for_user"  # the default loop's `until`: the model answered


def status(stopped: Stopped | None, finished: bool, damage: str | None = None) -> str:
    """A State's status in a word or three: why it stopped, or that it did not.

    The same words begin ``str(stopped)``, which adds the details (which call, which setting).
    """
    if damage is not None:
        return "damaged"
    if finished or isinstance(stopped, StoppedByFinish):
        return "finished"
    if isinstance(stopped, StoppedByUntil):
        return "answered" if stopped.name == ANSWERED else f"stopped by {stopped.name}"
    if isinstance(stopped, StoppedByLimit):
        if stopped.limit == "turns":
            return f"turn limit ({stopped.turns})"
        return f"limit {stopped.limit} reached"
    if isinstance(stopped, StoppedByPermission):
        return f"denied by {stopped.permission}"
    if isinstance(stopped, StoppedByApproval):
        return "waiting for approval"
    return "open"  # no stop recorded: running, failed, or cut off


def status_kind(stopped: Stopped | None) -> str:
    """The `kind` of a stop, or ``"none"``: what ``runs --stopped`` filters on."""
    return "none" if stopped is None else stopped.kind


def usage_data(usage: Usage) -> dict[str, Any]:
    """A `Usage` as JSON."""
    return pydantic_core.to_jsonable_python(usage)


def info_data(info: StateInfo, *, agent: str | None = None) -> dict[str, Any]:
    """A `StateInfo` as JSON, with its status and its agent's name (None when unknown)."""
    data: dict[str, Any] = pydantic_core.to_jsonable_python(info)
    data["status"] = status(info.stopped, info.finished, info.damage)
    data["agent"] = agent
    return data


def seconds(start: datetime | None, end: datetime | None) -> float | None:
    """The seconds from `start` to `end`, to the millisecond, or None if one is missing."""
    if start is None or end is None:
        return None
    return round((end - start).total_seconds(), 3)


@dataclass(frozen=True, slots=True)
class RunOf:
    """Who ran a State: its first run's agent and model, and how many runs it had."""

    agent: str | None = None
    model: str | None = None
    tools: tuple[str, ...] = ()
    runs: int = 0


def run_of(state: State) -> RunOf:
    """The agent, model and tools of `state`'s first run, and its number of runs."""
    starts = [entry for entry in state.history if isinstance(entry, RunStartEntry)]
    if not starts:
        return RunOf()
    first = starts[0].content
    return RunOf(agent=first.agent, model=first.model, tools=first.tools, runs=len(starts))


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One model request and what answered it: the reply, or an error."""

    request: ModelRequestEntry
    reply: ModelReplyEntry | None = None
    error: ErrorEntry | None = None

    @property
    def seconds(self) -> float | None:
        """How long the model took."""
        end = self.reply or self.error
        return seconds(self.request.at, None if end is None else end.at)


def model_calls(state: State) -> list[ModelCall]:
    """Each request of `state` with the reply or error that answered it, in order.

    A request still waiting (a live State; a loaded one has its wait closed) is left out.
    """
    found: list[ModelCall] = []
    waiting: ModelRequestEntry | None = None
    for entry in state.history:
        if isinstance(entry, ModelRequestEntry):
            waiting = entry
        elif waiting is not None and isinstance(entry, ModelReplyEntry):
            found.append(ModelCall(waiting, reply=entry))
            waiting = None
        elif waiting is not None and isinstance(entry, ErrorEntry):
            found.append(ModelCall(waiting, error=entry))
            waiting = None
    return found


@dataclass(frozen=True, slots=True)
class ToolRun:
    """One tool call: the reply that asked for it and the result it got (None while open)."""

    call: ToolCall
    asked: ModelReplyEntry
    result: ToolResultEntry | None = None
    children: tuple[str, ...] = field(default=())

    @property
    def seconds(self) -> float | None:
        """From the reply that asked for the call to its result: the call's time, at most."""
        return seconds(self.asked.at, None if self.result is None else self.result.at)


def tool_runs(state: State) -> list[ToolRun]:
    """Each tool call of `state`, in the order the model asked for them, with its result."""
    runs: dict[str, ToolRun] = {}
    for entry in state.history:
        if isinstance(entry, ModelReplyEntry):
            for call in entry.tool_calls:
                runs[call.id] = ToolRun(call, entry)
        elif isinstance(entry, ToolResultEntry) and not entry.late:
            asked = runs.get(entry.call.id)
            if asked is not None:
                runs[entry.call.id] = ToolRun(asked.call, asked.asked, entry, entry.child_ids)
    return list(runs.values())


def _block_data(block: Any) -> dict[str, Any]:
    if isinstance(block, TextBlock):
        return {"kind": "text", "text": block.text}
    if isinstance(block, ToolCall):
        args = pydantic_core.to_jsonable_python(block.args)
        return {"kind": "tool_call", "id": block.id, "name": block.name, "args": args}
    if isinstance(block, ToolResultBlock):
        return {
            "kind": "tool_result",
            "call_id": block.call_id,
            "text": block.text,
            "is_error": block.is_error,
        }
    if isinstance(block, Image):
        return {"kind": "image", "media_type": block.media_type, "bytes": len(block.data)}
    text = getattr(block, "text", None)  # a reasoning block; a raw one has no text
    return {"kind": str(getattr(block, "kind", "block")), "text": text}


def messages_data(messages: tuple[Message, ...]) -> list[dict[str, Any]]:
    """Messages as JSON: each one's role, whether it is a notice, and its blocks.

    A block is its ``kind`` and its fields (text, a call's name and arguments, a result's text);
    an image is its media type and size, not its bytes.
    """
    return [
        {
            "role": message.role,
            "notice": message.is_notice,
            "blocks": [_block_data(block) for block in message.content],
        }
        for message in messages
    ]


def _entry_data(entry: Any) -> Any:
    return json.loads(encode_entry(entry))


def prompt_holders(state: State, load: Callable[[str], State]) -> dict[str, State]:
    """The States holding the prompts that `state`'s requests name elsewhere, by id.

    A child's request may name a prompt its ancestor or an earlier sibling stored (the tree
    stores each prompt once); `load` opens such a State. One that does not load is left out
    (its requests show no prompt).
    """
    holders: dict[str, State] = {}
    missing: set[str] = set()
    for entry in state.history:
        if not isinstance(entry, ModelRequestEntry):
            continue
        holder = entry.content.prompt_holder
        if holder is None or holder in holders or holder in missing:
            continue
        try:
            holders[holder] = load(holder)
        except (LookupError, ValueError):  # gone, or damaged: its prompt is not shown
            missing.add(holder)
    return holders


def prompt_in(
    state: State, request: ModelRequestEntry, holders: Mapping[str, State]
) -> Prompt | None:
    """The prompt `request` of `state` used: from its own history or from its holder's."""
    prompt = state.prompt_of(request)
    holder = holders.get(request.content.prompt_holder or "")
    return prompt if prompt is not None or holder is None else holder.prompt_of(request)


def state_data(
    state: State, *, full_history: bool = True, holders: Mapping[str, State] | None = None
) -> dict[str, Any]:
    """What ``show --json`` prints: the State's facts, its calls with timings, its history."""
    run = run_of(state)
    stopped = state.stopped
    waiting = waits(state)
    data: dict[str, Any] = {
        "id": state.id,
        "parent_id": state.parent_id,
        "parent_call_id": state.parent_call_id,
        "agent": run.agent,
        "model": run.model,
        "tools": list(run.tools),
        "runs": run.runs,
        "status": status(stopped, state.finished),
        "stopped": None if stopped is None else pydantic_core.to_jsonable_python(stopped),
        "stop_reason": None if stopped is None else str(stopped),
        "finished": state.finished,
        "answer": pydantic_core.to_jsonable_python(state.answer),
        "extra_data": pydantic_core.to_jsonable_python(state.extra_data),
        "turn": state.turn,
        "created_at": _iso(state.created_at),
        "updated_at": _iso(state.updated_at),
        "seconds": seconds(state.created_at, state.updated_at),
        "usage": usage_data(state.usage),
        "children": list(state.children),
        "cost": cost_of(state).data(),
        "marks": [{**mark, "at": _iso(mark["at"])} for mark in marks(state)],
        "model_calls": _calls_data(state, holders or {}),
        "tool_calls": [
            {
                "id": tool.call.id,
                "name": tool.call.name,
                "args": pydantic_core.to_jsonable_python(tool.call.args),
                "outcome": None if tool.result is None else tool.result.outcome,
                "seconds": tool.seconds,
                "result": None if tool.result is None else tool.result.content.text,
                "children": list(tool.children),
                "usage": None if tool.result is None else usage_data(tool.result.usage),
                "waiting": _waiting_data(waiting.get(tool.call.id)),
            }
            for tool in tool_runs(state)
        ],
    }
    if full_history:
        data["history"] = [_entry_data(entry) for entry in state.history]
    return data


def _waiting_data(waiting: Waiting | None) -> dict[str, Any] | None:
    return None if waiting is None else waiting.data(_iso)


@dataclass(frozen=True, slots=True)
class Sent:
    """What one model request sent, told against the request before it.

    A request sends every message of the conversation so far, and most of them were sent by
    the request before it too: its messages are that request's first `earlier` and its `new`
    ones. After a context change that rewrote them (a compaction, cleared tool results, a
    restore) it shares none (`earlier` is 0) and `new` is all it sent.
    """

    earlier: int
    new: tuple[Message, ...]

    @property
    def count(self) -> int:
        """How many messages the request sent."""
        return self.earlier + len(self.new)


def sent_by_request(state: State) -> dict[int, Sent]:
    """What each model request of `state` sent (`Sent`), by the request entry's `seq`."""
    found: dict[int, Sent] = {}
    before: tuple[Message, ...] = ()
    for seq, messages in sorted(request_messages(state).items()):
        earlier = len(before) if messages[: len(before)] == before else 0
        found[seq] = Sent(earlier, messages[earlier:])
        before = messages
    return found


def _calls_data(state: State, holders: Mapping[str, State]) -> list[dict[str, Any]]:
    """Each model request of `state` as JSON (`_call_data`), with the messages it sent.

    ``new_messages`` are those the request before it did not send, ``earlier_messages`` how
    many it shares with it (`Sent`): a 200-turn run lists each message about once, not 200
    times, and a reader rebuilds a request's whole list from the requests before it.
    """
    sent = sent_by_request(state)
    found: list[dict[str, Any]] = []
    for call in model_calls(state):
        told = sent[call.request.seq]
        data = _call_data(state, call, holders)
        data["earlier_messages"] = told.earlier
        data["new_messages"] = messages_data(told.new)
        found.append(data)
    return found


def _call_data(state: State, call: ModelCall, holders: Mapping[str, State]) -> dict[str, Any]:
    """One model request as JSON: when, how long, what it was sent, the reply and its cost.

    ``prompt`` is what the model was told (instructions, tools, options) where the history
    records it, or the history of the State of `holders` it names, else None.
    """
    reply = call.reply
    usage = None if reply is None else reply.content.usage
    return {
        "request_seq": call.request.seq,
        "turn": call.request.turn,
        "at": _iso(call.request.at),
        "seconds": call.seconds,
        "messages": call.request.content.message_count,
        "model": call.request.content.model,
        "stop_reason": None if reply is None else reply.content.stop_reason,
        "usage": None if usage is None else usage_data(usage),
        "cost": None if usage is None else ("unpriced" if usage.cost is None else usage.cost),
        "reply": None if reply is None else messages_data((reply.content.message,))[0],
        "tool_calls": [] if reply is None else [c.id for c in reply.tool_calls],
        "error": None if call.error is None else call.error.content,
        "prompt": _prompt_data(prompt_in(state, call.request, holders)),
    }


def _prompt_data(prompt: Prompt | None) -> dict[str, Any] | None:
    """What the model was told, as JSON; None for a request recorded before prompts were."""
    if prompt is None:
        return None
    return {
        "digest": prompt.digest,
        "instructions": prompt.instructions,
        "tools": pydantic_core.to_jsonable_python(prompt.tools),
        "options": pydantic_core.to_jsonable_python(prompt.options),
    }


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()
