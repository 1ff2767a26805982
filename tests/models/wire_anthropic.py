"""Replies of the Anthropic Messages wire (named SSE events), scripted for `_server`."""

from __future__ import annotations

from typing import Any

from tests.models._server import Scripted, sse


def start(input_tokens: int = 10, written: int = 0, read: int = 0) -> dict[str, Any]:
    usage = {
        "input_tokens": input_tokens,
        "output_tokens": 1,
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": read,
    }
    message: dict[str, Any] = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test-20250101",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    return {"type": "message_start", "message": message}


def block_start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def delta(index: int, **fields: Any) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": fields}


def stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def end(reason: str, output_tokens: int) -> tuple[dict[str, Any], ...]:
    message_delta = {
        "type": "message_delta",
        "delta": {"stop_reason": reason, "stop_sequence": None},
        "usage": {"output_tokens": output_tokens},
    }
    return (message_delta, {"type": "message_stop"})


def text_reply(*pieces: str, input_tokens: int = 10) -> Scripted:
    events = [start(input_tokens), block_start(0, {"type": "text", "text": ""})]
    events += [delta(0, type="text_delta", text=piece) for piece in pieces]
    events += [stop(0), *end("end_turn", 5)]
    return Scripted(events=sse(*events, named=True))


def calls_reply(*calls: tuple[str, str, str]) -> Scripted:
    events: list[dict[str, Any]] = [start(20)]
    for index, (call_id, name, arguments) in enumerate(calls):
        block: dict[str, Any] = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
        events += [block_start(index, block)]
        events += [delta(index, type="input_json_delta", partial_json=arguments), stop(index)]
    events += end("tool_use", 8)
    return Scripted(events=sse(*events, named=True))


def error(status: int, kind: str, message: str, **headers: str) -> Scripted:
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return Scripted(status, body, headers={k.replace("_", "-"): v for k, v in headers.items()})
