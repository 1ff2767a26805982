"""Replies of the OpenAI Responses API wire, scripted for `_server`: named SSE events."""

from __future__ import annotations

from typing import Any

from tests.models._server import Scripted, sse

MODEL = "gpt-test-2025"


def response(status: str = "in_progress", **fields: Any) -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "status": status, "model": MODEL, **fields}


def created() -> dict[str, Any]:
    return {"type": "response.created", "response": response()}


def usage(prompt: int, completion: int, cached: int = 0, reasoning: int = 0) -> dict[str, Any]:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }


def completed(prompt: int = 10, completion: int = 5, **details: int) -> dict[str, Any]:
    done = response("completed", usage=usage(prompt, completion, **details))
    return {"type": "response.completed", "response": done}


def reasoning_item(item_id: str, secret: str, *summary: str) -> dict[str, Any]:
    parts = [{"type": "summary_text", "text": text} for text in summary]
    return {"type": "reasoning", "id": item_id, "summary": parts, "encrypted_content": secret}


def message_item(text: str) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    return {"type": "message", "id": "msg_1", "role": "assistant", "content": [part]}


def call_item(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def item_events(index: int, item: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of one output item: added, its deltas, done."""
    added = {"type": "response.output_item.added", "output_index": index}
    done = {"type": "response.output_item.done", "output_index": index, "item": item}
    events: list[dict[str, Any]] = []
    if item["type"] == "message":
        events.append({**added, "item": {**item, "content": []}})
        text = item["content"][0]["text"]
        for piece in (text[: len(text) // 2], text[len(text) // 2 :]):
            events.append(
                {"type": "response.output_text.delta", "output_index": index, "delta": piece}
            )
    elif item["type"] == "function_call":
        events.append({**added, "item": {**item, "arguments": ""}})
        events.append(
            {
                "type": "response.function_call_arguments.delta",
                "output_index": index,
                "delta": item["arguments"],
            }
        )
    else:
        events.append({**added, "item": item})
    events.append(done)
    return events


def reply(*items: dict[str, Any], end: dict[str, Any] | None = None) -> Scripted:
    """A streamed reply of these output items, ended by `end` (a completed response)."""
    events = [created()]
    for index, item in enumerate(items):
        events += item_events(index, item)
    events.append(end or completed())
    return Scripted(events=sse(*events, named=True))


def text_reply(text: str) -> Scripted:
    return reply(message_item(text))


def error(status: int, message: str, code: str | None = None, **headers: str) -> Scripted:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": code}}
    return Scripted(status, body, headers={k.replace("_", "-"): v for k, v in headers.items()})
