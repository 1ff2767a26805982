"""The Vercel AI SDK UI message stream: a run's events as the npm `ai` package reads them.

``async for data in vercel_sse(events): ...`` turns the events of one run of a root State and
its subagents (what `agent.events` yields, or durable events read from a store) into the
chunks of the UI message stream protocol (v1, read by `ai` 5 and later), as server-sent events
ending with ``data: [DONE]``; send them with `HEADERS` (``x-vercel-ai-ui-message-stream: v1``).
`VercelStream` does the mapping one event at a time. Needs nothing beyond the library.

The stream is one assistant message (``start`` ... ``finish``) for one run of the root:

- Each model reply of the root is a step (``start-step`` ... ``finish-step``): its text as
  ``text-start``/``text-delta``/``text-end`` (streamed when the deltas are there, else the
  stored reply's text at once), its tool calls as ``tool-input-start`` then
  ``tool-input-available`` with the arguments (dynamic tools: the client needs no tool
  definitions), their results as ``tool-output-available`` or ``tool-output-error``.
- A call of the root waiting for a person: ``tool-approval-request`` (its approval id is the
  call's id). Every waiting call of the tree, the subagents' too, is also listed in a
  ``data-approval`` part (`calls`: each with `state_id`, `call_id`, `name`, `args`, `reason`).
- Subagents are not messages of their own in this protocol: each one is a ``data-subagent``
  part whose id is the child State's id, updated as it goes (`state_id`, `parent_id`,
  `parent_call_id`, `agent`, `status` running/done/waiting/failed, its latest `text`, its
  `answer` or `error`), so a UI can draw the tree under the call that started it.
- A retried model request: a transient ``data-retry`` part. The run's end: an ``error`` chunk
  if it failed, then ``finish`` (`finishReason` ``stop``, ``tool-calls`` while calls wait for
  a person, ``error``) with `messageMetadata` holding the State id, the stop and the usage.

Events after the root's run ends are not read: a later run (the one carrying out an approval)
is a new stream.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator
from typing import Any

from .. import (
    ApprovalNeeded,
    ChildStarted,
    Event,
    ModelReplied,
    RateLimitWaited,
    Retrying,
    RunEnded,
    RunStarted,
    TextDelta,
    ToolDeferred,
    ToolEnded,
    ToolStarted,
)

__all__ = ("DONE", "HEADERS", "VercelStream", "encode", "vercel_chunks", "vercel_sse")

HEADERS: dict[str, str] = {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    "x-vercel-ai-ui-message-stream": "v1",
    "x-accel-buffering": "no",
}
"""The response headers of a UI message stream (the ones the `ai` package sends)."""

Chunk = dict[str, Any]


class VercelStream:
    """Maps our events to UI message stream chunks, one at a time.

    `message_id` is the assistant message's id (the root State's id unless given). The root is
    the State of the first event unless `root_id` says which. `done` turns true once the root's
    run ended; later events give nothing.
    """

    def __init__(self, *, message_id: str | None = None, root_id: str | None = None) -> None:
        self.message_id: str | None = message_id
        self.root_id: str | None = root_id
        self.done: bool = False
        self._started = False
        self._step = False  # a step is open
        self._replied = False  # the open step's reply came: the next text starts a new step
        self._text: str | None = None  # the id of the text part being streamed
        self._parts = 0
        self._calls: dict[str, tuple[str, Any]] = {}  # calls announced: name and input
        self._args: dict[str, tuple[str, Any]] = {}  # calls seen start or wait: name and args
        self._children: dict[str, Chunk] = {}  # each subagent's data, by State id

    def feed(self, event: Event) -> list[Chunk]:
        """The chunks `event` stands for (often one, sometimes none)."""
        if self.done:
            return []
        if self.root_id is None:
            self.root_id = event.state_id
        out: list[Chunk] = []
        if not self._started:
            self._started = True
            out.append({"type": "start", "messageId": self.message_id or self.root_id})
        if event.state_id != self.root_id:
            out.extend(self._child(event))
            return out
        if isinstance(event, TextDelta):
            out.extend(self._next_step())
            if self._text is None:
                self._text = self._part_id()
                out.append({"type": "text-start", "id": self._text})
            out.append({"type": "text-delta", "id": self._text, "delta": event.text})
        elif isinstance(event, ModelReplied):
            out.extend(self._reply(event))
        elif isinstance(event, ToolStarted | ToolDeferred):
            self._args[event.call_id or ""] = (event.name, event.args)
            if isinstance(event, ToolDeferred):
                out.extend(self._announce(event.call_id or ""))
                request: Chunk = {
                    "type": "tool-approval-request",
                    "approvalId": event.call_id,
                    "toolCallId": event.call_id,
                }
                if event.reason is not None:
                    request["reason"] = event.reason
                out.append(request)
        elif isinstance(event, ToolEnded):
            call_id = event.call_id or ""
            out.extend(self._announce(call_id, event.name))
            if event.is_error:
                out.append(
                    {
                        "type": "tool-output-error",
                        "toolCallId": call_id,
                        "errorText": event.result,
                        "dynamic": True,
                    }
                )
            else:
                out.append(
                    {
                        "type": "tool-output-available",
                        "toolCallId": call_id,
                        "output": event.result,
                        "dynamic": True,
                    }
                )
        elif isinstance(event, ApprovalNeeded):
            out.append(
                {
                    "type": "data-approval",
                    "id": f"{event.state_id}-approval",
                    "data": {
                        "state_id": event.state_id,
                        "calls": [
                            {
                                "state_id": item.state_id,
                                "call_id": item.call.id,
                                "name": item.call.name,
                                "args": item.call.args,
                                "reason": item.reason,
                            }
                            for item in event.calls
                        ],
                    },
                }
            )
        elif isinstance(event, Retrying | RateLimitWaited):
            out.append(_notice(event))
        elif isinstance(event, RunEnded):
            out.extend(self._end(event))
        return out

    def end(self) -> list[Chunk]:
        """What closes a stream whose root run never ended in it (the events stopped)."""
        if self.done or not self._started:
            return []
        self.done = True
        return [*self._close_step(), {"type": "finish", "finishReason": "other"}]

    def _part_id(self) -> str:
        self._parts += 1
        return f"{self.root_id}-p{self._parts}"

    def _open_step(self) -> list[Chunk]:
        if self._step:
            return []
        self._step, self._replied = True, False
        return [{"type": "start-step"}]

    def _next_step(self) -> list[Chunk]:
        """Open the step of a new reply, closing the last one's if its reply came."""
        out = self._close_step() if self._replied else []
        out.extend(self._open_step())
        return out

    def _close_step(self) -> list[Chunk]:
        out: list[Chunk] = []
        if self._text is not None:
            out.append({"type": "text-end", "id": self._text})
            self._text = None
        if self._step:
            self._step = False
            out.append({"type": "finish-step"})
        return out

    def _reply(self, event: ModelReplied) -> list[Chunk]:
        out = self._next_step()
        self._replied = True
        if self._text is not None:
            out.append({"type": "text-end", "id": self._text})
            self._text = None
        elif event.text:
            part = self._part_id()
            out.append({"type": "text-start", "id": part})
            out.append({"type": "text-delta", "id": part, "delta": event.text})
            out.append({"type": "text-end", "id": part})
        for call in event.tool_calls:
            self._args[call.id] = (call.name, call.args)
            out.extend(self._announce(call.id))
        return out

    def _announce(self, call_id: str, name: str | None = None) -> list[Chunk]:
        """The chunks that make `call_id` a part of the message, once."""
        if call_id in self._calls:
            return []
        known = self._args.get(call_id)
        tool, args = known if known is not None else (name or "tool", None)
        self._calls[call_id] = (tool, args)
        base = {"toolCallId": call_id, "toolName": tool, "dynamic": True}
        return [
            *self._open_step(),
            {"type": "tool-input-start", **base},
            {"type": "tool-input-available", **base, "input": args},
        ]

    def _child(self, event: Event) -> list[Chunk]:
        data = self._children.get(event.state_id)
        if data is None:
            data = self._children[event.state_id] = {
                "state_id": event.state_id,
                "parent_id": event.parent_id,
                "parent_call_id": event.parent_call_id,
                "agent": None,
                "status": "running",
                "text": None,
                "answer": None,
                "error": None,
            }
        if isinstance(event, ChildStarted | RunStarted):
            data["agent"] = event.agent or data["agent"]
            data["status"] = "running"
        elif isinstance(event, ModelReplied):
            data["text"] = event.text
        elif isinstance(event, RunEnded):
            if event.error is not None:
                data["status"], data["error"] = "failed", event.error
            elif event.stop_kind == "approval":
                data["status"] = "waiting"
            else:
                data["status"], data["answer"] = "done", event.answer
        elif isinstance(event, Retrying | RateLimitWaited):
            return [_notice(event)]
        else:
            return []
        return [{"type": "data-subagent", "id": event.state_id, "data": dict(data)}]

    def _end(self, event: RunEnded) -> list[Chunk]:
        self.done = True
        out = self._close_step()
        if event.error is not None:
            out.append({"type": "error", "errorText": event.error})
            reason = "error"
        elif event.stop_kind == "approval":
            reason = "tool-calls"
        else:
            reason = "stop"
        metadata = {
            "state_id": event.state_id,
            "stop_kind": event.stop_kind,
            "stopped": event.stopped,
            "usage": event.usage,
        }
        out.append({"type": "finish", "finishReason": reason, "messageMetadata": metadata})
        return out


def _notice(event: Retrying | RateLimitWaited) -> Chunk:
    """A retry or a wait for a rate limit, as a transient data part."""
    if isinstance(event, RateLimitWaited):
        data = {"state_id": event.state_id, "limit": event.limit, "delay": event.delay}
        return {"type": "data-rate-limit", "data": data, "transient": True}
    return {
        "type": "data-retry",
        "data": {
            "state_id": event.state_id,
            "attempt": event.attempt,
            "delay": event.delay,
            "error": event.error,
        },
        "transient": True,
    }


def encode(chunk: Chunk) -> bytes:
    """`chunk` as one server-sent event: ``data: {json}``."""
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"
"""The last server-sent event of a stream."""


async def vercel_chunks(
    events: AsyncIterable[Event], *, message_id: str | None = None, root_id: str | None = None
) -> AsyncIterator[Chunk]:
    """The UI message stream chunks of `events`, up to the end of the root's run.

    An async generator of events left unread past that end is closed here.
    """
    stream = VercelStream(message_id=message_id, root_id=root_id)
    iterator = aiter(events)
    try:
        async for event in iterator:
            for chunk in stream.feed(event):
                yield chunk
            if stream.done:
                return
        for chunk in stream.end():
            yield chunk
    finally:
        if isinstance(iterator, AsyncGenerator):
            await iterator.aclose()


async def vercel_sse(
    events: AsyncIterable[Event], *, message_id: str | None = None, root_id: str | None = None
) -> AsyncIterator[bytes]:
    """The body of a UI message stream response (send it with `HEADERS`), ``[DONE]`` last."""
    async for chunk in vercel_chunks(events, message_id=message_id, root_id=root_id):
        yield encode(chunk)
    yield DONE
