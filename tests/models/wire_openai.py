"""Replies of the OpenAI Chat Completions wire, scripted for `_server`."""

from __future__ import annotations

from typing import Any

from tests.models._server import Scripted, sse


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-test-2024",
        "choices": [choice],
    }


def usage_chunk(
    prompt: int, completion: int, cached: int = 0, reasoning: int = 0
) -> dict[str, Any]:
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [], "usage": usage}


def text_reply(*pieces: str, prompt: int = 10, completion: int = 5) -> Scripted:
    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": piece}) for piece in pieces]
    chunks += [chunk(finish="stop"), usage_chunk(prompt, completion)]
    return Scripted(events=sse(*chunks, "[DONE]"))


def call_chunk(index: int, call_id: str, name: str, arguments: str) -> dict[str, Any]:
    function = {"name": name, "arguments": arguments}
    call = {"index": index, "id": call_id, "type": "function", "function": function}
    return chunk({"tool_calls": [call]})


def calls_reply(*calls: tuple[str, str, str]) -> Scripted:
    deltas = [call_chunk(index, *call) for index, call in enumerate(calls)]
    return Scripted(events=sse(*deltas, chunk(finish="tool_calls"), usage_chunk(20, 8), "[DONE]"))


def error(status: int, message: str, code: str | None = None, **headers: str) -> Scripted:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": code}}
    return Scripted(status, body, headers={k.replace("_", "-"): v for k, v in headers.items()})
