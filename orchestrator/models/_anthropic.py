"""`AnthropicModel`: the Messages API through the official ``anthropic`` SDK.

The SDK is an optional extra (``pip install 'orchestrator[anthropic]'``), imported when a model
is built, never when the library is. Every request streams; its events are read from the SDK's
streaming response. Thinking blocks come back as a `ReasoningBlock` (to read) plus a `RawBlock`
of provider ``"anthropic"`` (with the signature), which is what is sent back, to Anthropic only.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from .._base._json import thaw
from .._base._messages import (
    Block,
    Image,
    Message,
    RawBlock,
    ReasoningBlock,
    TextBlock,
    ToolCall,
    ToolResultBlock,
)
from .._base._reply import Reply, Usage
from ._base import Request, TextCallback
from ._price import Price, request_usage
from ._rate import RateLimit
from ._retry import RetryPolicy, StreamBroken
from ._wire import (
    DEFAULT_TIMEOUT,
    Settings,
    SettingsModel,
    SSEEvent,
    as_dict,
    as_int,
    missing_sdk,
    parse_tool_args,
)

if TYPE_CHECKING:
    from .._tooling._tools import ToolSpec

__all__ = ("ANTHROPIC_URL", "AnthropicModel", "anthropic_messages", "anthropic_tools")

ANTHROPIC_URL = "https://api.anthropic.com"
PROVIDER = "anthropic"
_RESERVED = frozenset({"model", "messages", "tools", "stream", "system", "max_tokens"})
_REQUIRED = frozenset({"model", "max_tokens", "messages"})
_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_CACHEABLE = frozenset({"text", "image", "tool_result", "tool_use", "document"})
# Blocks that show the caller nothing while they stream (text shows through on_text).
_UNSEEN = frozenset({"text", "thinking", "redacted_thinking"})
# The HTTP status each error type of a mid-stream ``error`` event stands for.
_ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "overloaded_error": 529,
}


def _import_anthropic():  # the module, so pyright knows the SDK's types
    try:
        import anthropic
    except ImportError as error:
        raise missing_sdk("anthropic", extra="anthropic", owner="AnthropicModel") from error
    return anthropic


def _default_max_tokens(name: str) -> int:
    """8192, or 4096 for the Claude 3 models that allow no more."""
    old = name.startswith("claude-3-") and not name.startswith(("claude-3-5", "claude-3-7"))
    return 4096 if old else 8192


# -- request mapping (pure) ------------------------------------------------------------------------


def _tool_id(value: str) -> str:
    """A tool-call id as Anthropic accepts it (letters, digits, ``_`` and ``-``)."""
    return _ID_UNSAFE.sub("_", value) or "call"


def _image(image: Image) -> dict[str, Any]:
    source = {"type": "base64", "media_type": image.media_type, "data": image.to_base64()}
    return {"type": "image", "source": source}


def _result(block: ToolResultBlock) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    for item in block.content:
        if isinstance(item, Image):
            content.append(_image(item))
        elif item.text:
            content.append({"type": "text", "text": item.text})
    entry: dict[str, Any] = {"type": "tool_result", "tool_use_id": _tool_id(block.call_id)}
    if content:
        entry["content"] = content
    if block.is_error:
        entry["is_error"] = True
    return entry


def _user_blocks(message: Message) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, ToolResultBlock):
            blocks.append(_result(block))
        elif isinstance(block, TextBlock):
            if block.text:
                blocks.append({"type": "text", "text": block.text})
        elif isinstance(block, Image):
            blocks.append(_image(block))
    return blocks


def _assistant_blocks(message: Message) -> list[dict[str, Any]]:
    """Text, tool calls, and this provider's raw blocks (thinking); other reasoning is left out."""
    blocks: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, RawBlock):
            data = as_dict(thaw(block.data))
            if block.provider == PROVIDER and data.get("type"):
                blocks.append(data)
        elif isinstance(block, TextBlock):
            if block.text:
                blocks.append({"type": "text", "text": block.text})
        elif isinstance(block, ToolCall):
            blocks.append(
                {
                    "type": "tool_use",
                    "id": _tool_id(block.id),
                    "name": block.name,
                    "input": thaw(block.args),
                }
            )
    return blocks


def _not_a_result(block: dict[str, Any]) -> bool:
    return block["type"] != "tool_result"


def anthropic_messages(messages: Sequence[Message], *, cache: bool) -> list[dict[str, Any]]:
    """The Messages API ``messages`` for these messages.

    Turns of the same role are merged (tool results first in a user turn, as the API wants),
    empty messages are left out, and with `cache` the last block carries a prompt-cache mark,
    so the next request of a tool loop reads the whole conversation from the cache.
    """
    turns: list[dict[str, Any]] = []
    for message in messages:
        user = message.role == "user"
        blocks = _user_blocks(message) if user else _assistant_blocks(message)
        if not blocks:
            continue
        if turns and turns[-1]["role"] == message.role:
            blocks = turns[-1]["content"] + blocks
            turns.pop()
        if user:
            blocks.sort(key=_not_a_result)
        turns.append({"role": message.role, "content": blocks})
    if cache and turns:
        last = turns[-1]["content"][-1]
        if last["type"] in _CACHEABLE:
            turns[-1]["content"][-1] = {**last, "cache_control": {"type": "ephemeral"}}
    return turns


def anthropic_tools(specs: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """The Messages API ``tools`` for these specs."""
    return [
        {
            "name": spec.name,
            "description": spec.description,
            "input_schema": thaw(spec.input_schema),
        }
        for spec in specs
    ]


# -- reading the stream (sans-I/O) -----------------------------------------------------------------


class _MessageStream:
    """Accumulates Messages API stream events into a `Reply`."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.blocks: dict[int, dict[str, Any]] = {}
        self.json: dict[int, list[str]] = {}
        self.usage: dict[str, int] = {}
        self.stop_reason: str | None = None
        self.done = False
        self.error: StreamBroken | None = None

    def has_visible(self) -> bool:
        """Whether the reply holds a block someone acts on: a tool call or a server tool block.

        Text counts once it reaches ``on_text`` (the reader sees to that); an empty text block,
        a ping or thinking show nothing yet, so a stream that breaks after them is sent again.
        """
        return any(block.get("type") not in _UNSEEN for block in self.blocks.values())

    def handle(self, event: SSEEvent) -> str | None:
        """Take one event; return the text it adds, for ``on_text``."""
        data = event.data.strip()
        if self.error is not None or self.done or not data:
            return None
        payload = as_dict(json.loads(data))
        kind = payload.get("type") or event.event
        if kind == "message_start":
            message = as_dict(payload.get("message"))
            if isinstance(message.get("model"), str) and message["model"]:
                self.model = message["model"]
            self._count(message.get("usage"))
        elif kind == "content_block_start":
            block = dict(as_dict(payload.get("content_block")))
            self.blocks[as_int(payload.get("index"))] = block
            text = block.get("text")
            return text if block.get("type") == "text" and isinstance(text, str) else None
        elif kind == "content_block_delta":
            return self._delta(as_int(payload.get("index")), as_dict(payload.get("delta")))
        elif kind == "message_delta":
            stop = as_dict(payload.get("delta")).get("stop_reason")
            if isinstance(stop, str):
                self.stop_reason = stop
            self._count(payload.get("usage"))
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            kind = as_dict(payload.get("error")).get("type")
            status = _ERROR_STATUS.get(kind, 500) if isinstance(kind, str) else 500
            self.error = StreamBroken("sent an error event", status=status, body=payload)
        return None

    def _count(self, usage: object) -> None:
        for key, value in as_dict(usage).items():
            if isinstance(value, int) and not isinstance(value, bool):
                self.usage[key] = value

    def _delta(self, index: int, delta: dict[str, Any]) -> str | None:
        block = self.blocks.setdefault(index, {})
        kind = delta.get("type")
        if kind == "text_delta" and isinstance(delta.get("text"), str):
            block["text"] = str(block.get("text", "")) + delta["text"]
            return delta["text"]
        if kind == "thinking_delta" and isinstance(delta.get("thinking"), str):
            block["thinking"] = str(block.get("thinking", "")) + delta["thinking"]
        elif kind == "signature_delta" and isinstance(delta.get("signature"), str):
            block["signature"] = str(block.get("signature", "")) + delta["signature"]
        elif kind == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            self.json.setdefault(index, []).append(delta["partial_json"])
        elif kind == "citations_delta" and "citation" in delta:
            citations: object = block.get("citations")
            known = cast("list[Any]", citations) if isinstance(citations, list) else []
            block["citations"] = [*known, delta["citation"]]
        return None

    def reply(self, price: Price | None) -> Reply:
        """The reply, once the stream has ended.

        Raises:
            StreamBroken: The stream carried an error, or ended before ``message_stop``.
        """
        if self.error is not None:
            raise self.error
        if not self.done:
            raise StreamBroken("ended the stream before the reply was complete")
        blocks: list[Block] = []
        for index, block in sorted(self.blocks.items()):
            blocks.extend(self._blocks(index, block))
        return Reply(
            Message("assistant", tuple(blocks)),
            self._usage(price),
            stop_reason=self.stop_reason,
            model=self.model,
        )

    def _blocks(self, index: int, block: dict[str, Any]) -> list[Block]:
        kind = block.get("type")
        if kind == "text":
            text = block.get("text")
            return [TextBlock(text)] if isinstance(text, str) and text else []
        if kind == "thinking":
            thinking = str(block.get("thinking", ""))
            raw = {
                "type": "thinking",
                "thinking": thinking,
                "signature": block.get("signature", ""),
            }
            return [ReasoningBlock(thinking), RawBlock(PROVIDER, raw)]
        parts = self.json.get(index)
        if parts is not None:
            block = {**block, "input": parse_tool_args("".join(parts))}
        if kind == "tool_use":
            call_id = block.get("id")
            name = block.get("name")
            return [
                ToolCall(
                    call_id
                    if isinstance(call_id, str) and call_id
                    else f"toolu_{uuid.uuid4().hex}",
                    name if isinstance(name, str) else "",
                    as_dict(block.get("input")),
                )
            ]
        # redacted_thinking, server tool blocks and what comes next: kept to send back as is.
        return [RawBlock(PROVIDER, block)] if kind else []

    def _usage(self, price: Price | None) -> Usage:
        fresh = self.usage.get("input_tokens", 0)
        written = self.usage.get("cache_creation_input_tokens", 0)
        read = self.usage.get("cache_read_input_tokens", 0)
        output = self.usage.get("output_tokens", 0)
        total = fresh + written + read
        return request_usage(
            price,
            input_tokens=total,
            output_tokens=output,
            cache_read_tokens=read,
            cache_write_tokens=written,
        )


# -- the model -------------------------------------------------------------------------------------


class AnthropicModel(SettingsModel):
    """A Claude model through the Messages API, on the official ``anthropic`` SDK.

    Constructing one touches no network and needs no key: the key is read when the first
    request is made. Each request streams (text goes to ``on_text`` as it arrives), and is
    retried with backoff on rate limits, overload, server errors, connection errors and
    timeouts until something visible arrives (text, or a tool call).

    Args:
        name: The model name, e.g. ``"claude-sonnet-4-5"``.
        base_url: The API root; Anthropic's when left out (or ``ANTHROPIC_BASE_URL``). Any
            other is an Anthropic-compatible server, and errors name it so, with its URL.
        api_key: The API key. Left out, it is read from the `api_key_env` variable; a server at
            a custom `base_url` that needs no key then gets a placeholder.
        api_key_env: The environment variable that holds the key (``ANTHROPIC_API_KEY``).
        price: Prices per million tokens; when given, `Usage.cost` is filled in.
        context_window: How many tokens fit in one request (200,000 for Claude models when
            left out).
        max_tokens: The cap on the reply's tokens, which the API requires (8192 when left out;
            4096 for the Claude 3 models that allow no more).
        temperature: The sampling temperature.
        thinking_budget: Turn on extended thinking with this many tokens (at least 1024).
        cache: Mark the end of each request for prompt caching (on by default), so each
            request of a tool loop reads the conversation so far from the cache.
        params: More request fields, sent as they are (``{"top_k": 5}``).
        headers: Extra HTTP headers for every request (``{"anthropic-beta": "..."}``).
        retry: The retry policy (`RetryPolicy()` when left out).
        rate_limit: A `RateLimit` every request (each retry too) waits for; the server's
            rate-limit headers tighten it and a 429 holds it back for every caller.
        timeout: Seconds to wait for each read of the reply (for it to start, then for each
            next piece of the stream), and to connect (10 at most); 300 when left out. A
            timeout before anything visible arrived is retried like a dropped connection.

    Raises:
        ImportError: The ``anthropic`` package is not installed; the message names the command.
        TypeError: An argument has the wrong type.
        ValueError: An argument has a wrong value.

    Example:
        ```python
        agent = Agent(AnthropicModel("claude-sonnet-4-5", price=Price(input=3, output=15)))
        ```
    """

    __slots__ = ("_cache", "_settings", "_thinking")

    official_url = ANTHROPIC_URL
    label = "Anthropic"

    def __init__(
        self,
        name: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        api_key_env: str = "ANTHROPIC_API_KEY",
        price: Price | None = None,
        context_window: int | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        thinking_budget: int | None = None,
        cache: bool = True,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        retry: RetryPolicy | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        rate_limit: RateLimit | None = None,
    ) -> None:
        _import_anthropic()
        resolved = base_url or os.environ.get("ANTHROPIC_BASE_URL") or ANTHROPIC_URL
        claude = isinstance(name, str) and name.startswith("claude")
        self._settings = Settings.parse(
            "AnthropicModel",
            name=name,
            base_url=resolved.rstrip("/"),
            api_key=api_key,
            api_key_env=api_key_env,
            price=price,
            context_window=200_000 if context_window is None and claude else context_window,
            max_tokens=max_tokens,
            temperature=temperature,
            params=params,
            headers=headers,
            retry=retry,
            timeout=timeout,
            rate_limit=rate_limit,
            reserved=_RESERVED,
        )
        if thinking_budget is not None and (
            isinstance(thinking_budget, bool)
            or not isinstance(thinking_budget, int)
            or thinking_budget < 1024
        ):
            raise ValueError(
                f"AnthropicModel(thinking_budget=...) must be an int >= 1024, got"
                f" {thinking_budget!r}."
            )
        limit = max_tokens or _default_max_tokens(self._settings.name)
        if thinking_budget is not None and thinking_budget >= limit:
            raise ValueError(
                f"AnthropicModel(thinking_budget={thinking_budget}) must be below max_tokens"
                f" ({limit}): pass a larger max_tokens=..., or a smaller budget."
            )
        if not isinstance(cache, bool):
            raise TypeError(f"AnthropicModel(cache=...) must be True or False, got {cache!r}.")
        self._thinking = thinking_budget
        self._cache = cache

    def request_body(self, request: Request) -> dict[str, Any]:
        """The JSON body a request sends, but for ``stream``: to check what a model is sent."""
        settings = self._settings
        body: dict[str, Any] = {
            "model": settings.name,
            "max_tokens": settings.max_tokens or _default_max_tokens(settings.name),
            "messages": anthropic_messages(request.messages, cache=self._cache),
        }
        if request.system:
            body["system"] = request.system
        if request.tools:
            body["tools"] = anthropic_tools(request.tools)
        if settings.temperature is not None:
            body["temperature"] = settings.temperature
        if self._thinking is not None:
            body["thinking"] = {"type": "enabled", "budget_tokens": self._thinking}
        body.update(settings.params)
        return body

    @property
    def options(self) -> dict[str, Any]:
        """What every request sends besides the prompt and messages, and whether it caches."""
        return {**super().options, "cache": self._cache}

    async def respond(self, request: Request, *, on_text: TextCallback | None = None) -> Reply:
        """Send `request` and stream the reply.

        Raises:
            AuthError: No API key is set, or the API refused it.
            RateLimitError: The API kept refusing for now, after the retries.
            ContextTooLongError: The request does not fit the model's context window.
            ProviderError: Any other failure, a reply that broke off mid-stream included.
        """
        sdk = _import_anthropic()

        def open_response(client: Any, body: dict[str, Any]) -> Any:
            # Only the required fields go through the SDK's signature; the rest as they are.
            return client.messages.with_streaming_response.create(
                model=body["model"],
                max_tokens=body["max_tokens"],
                messages=body["messages"],
                stream=True,
                extra_body={key: body[key] for key in body.keys() - _REQUIRED} or None,
            )

        return await self._stream(
            request,
            on_text,
            sdk=sdk,
            client_class=sdk.AsyncAnthropic,
            open_response=open_response,
            new_stream=lambda: _MessageStream(self._settings.name),
        )
