"""`OpenAIModel`: Chat Completions through the official ``openai`` SDK.

Any server that speaks the Chat Completions API works through `base_url`: OpenAI itself, vLLM,
Ollama, the llama.cpp server, OpenRouter. The SDK is an optional extra
(``pip install 'orchestrator[openai]'``), imported when a model is built, never when the library
is. Every request streams; its events are read from the SDK's streaming response. Reasoning a
server streams beside the reply (``reasoning_content``, ``reasoning``, ``thinking_blocks``) comes
back as a `ReasoningBlock` (to read) plus a `RawBlock` of this server, sent back to it only.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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

__all__ = (
    "OPENAI_URL",
    "OpenAIModel",
    "chat_messages",
    "chat_tools",
    "import_openai",
    "user_pieces",
)

OPENAI_URL = "https://api.openai.com/v1"
_RESERVED = frozenset({"model", "messages", "tools", "stream", "stream_options"})
_REQUIRED = frozenset({"model", "messages"})
# Fields some compatible servers (vLLM, DeepSeek, llama.cpp, OpenRouter) use for reasoning;
# LiteLLM's proxy also sends Claude's thinking as `thinking_blocks` (see _thinking_piece).
_REASONING_FIELDS = ("reasoning_content", "reasoning")
_KEPT = frozenset({"role", "content", "tool_calls", "name", "tool_call_id"})


def import_openai(owner: str = "OpenAIModel"):  # the module, so pyright knows the SDK's types
    """The ``openai`` SDK module, or an `ImportError` naming the install command for `owner`."""
    try:
        import openai
    except ImportError as error:
        raise missing_sdk("openai", extra="openai", owner=owner) from error
    return openai


# -- request mapping (pure) ------------------------------------------------------------------------


def _image_part(image: Image) -> dict[str, Any]:
    url = f"data:{image.media_type};base64,{image.to_base64()}"
    return {"type": "image_url", "image_url": {"url": url}}


def _content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A single text part as a plain string (every server takes it), else the parts."""
    if len(parts) == 1 and parts[0]["type"] == "text":
        return cast("str", parts[0]["text"])
    return parts


def user_pieces(message: Message) -> tuple[list[tuple[str, str]], list[TextBlock | Image]]:
    """A user message as OpenAI's APIs take it: tool outputs first, then the other content.

    Returns the tool results as ``(call id, text)`` (an error's text starts with ``Error:``) and
    the text and images that follow them. A tool output is text only, so a result's images
    follow, introduced by a line naming their call.
    """
    outputs: list[tuple[str, str]] = []
    parts: list[TextBlock | Image] = []
    for block in message.content:
        if isinstance(block, ToolResultBlock):
            images = [item for item in block.content if isinstance(item, Image)]
            text = block.text or ("(the result is the images below)" if images else "")
            outputs.append((block.call_id, f"Error: {text}" if block.is_error else text))
            if images:
                parts.append(TextBlock(f"Images from tool call {block.call_id}:"))
                parts.extend(images)
        elif isinstance(block, TextBlock):
            if block.text:
                parts.append(block)
        elif isinstance(block, Image):
            parts.append(block)
    return outputs, parts


def _user(message: Message) -> list[dict[str, Any]]:
    """A user message: its tool results as ``tool`` messages, then the rest as one user message."""
    outputs, pieces = user_pieces(message)
    out: list[dict[str, Any]] = [
        {"role": "tool", "tool_call_id": call_id, "content": text} for call_id, text in outputs
    ]
    parts = [
        {"type": "text", "text": piece.text} if isinstance(piece, TextBlock) else _image_part(piece)
        for piece in pieces
    ]
    if parts:
        out.append({"role": "user", "content": _content(parts)})
    return out


def _assistant(message: Message, provider: str | None) -> dict[str, Any]:
    """An assistant message; `provider` set echoes its reasoning fields back (same server)."""
    text = message.text
    entry: dict[str, Any] = {"role": "assistant", "content": text or None}
    calls = [
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(thaw(call.args))},
        }
        for call in message.tool_calls
    ]
    if calls:
        entry["tool_calls"] = calls
    else:
        entry["content"] = text
    for block in message.content:
        if isinstance(block, RawBlock) and block.provider == provider:
            for key, value in as_dict(thaw(block.data)).items():
                if key not in _KEPT:
                    entry[key] = value
    return entry


def _loop_start(messages: Sequence[Message]) -> int:
    """Where the current tool loop starts: just after the last user message with content."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.role == "user" and any(
            isinstance(block, TextBlock | Image) for block in message.content
        ):
            return index + 1
    return 0


def chat_messages(request: Request, provider: str) -> list[dict[str, Any]]:
    """The Chat Completions ``messages`` for `request`.

    Reasoning kept in `RawBlock`s of `provider` goes back only within the current tool loop
    (after the last user message), which is what servers that want it back expect, and servers
    that refuse it never see (they see no tool loop).
    """
    out: list[dict[str, Any]] = []
    if request.system:
        out.append({"role": "system", "content": request.system})
    start = _loop_start(request.messages)
    for index, message in enumerate(request.messages):
        if message.role == "assistant":
            out.append(_assistant(message, provider if index >= start else None))
        else:
            out.extend(_user(message))
    return out


def chat_tools(specs: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """The Chat Completions ``tools`` for these specs."""
    return [
        {
            "type": "function",
            "function": {
                "name": spec.name,
                "description": spec.description,
                "parameters": thaw(spec.input_schema),
            },
        }
        for spec in specs
    ]


# -- reading the stream (sans-I/O) -----------------------------------------------------------------


@dataclass(slots=True)
class _Call:
    id: str = ""
    name: str = ""
    args: list[str] = field(default_factory=list[str])


class _ChatStream:
    """Accumulates ``chat.completion.chunk`` events into a `Reply`."""

    def __init__(self, provider: str, model: str) -> None:
        self.provider = provider
        self.model = model
        self.text: list[str] = []
        self.reasoning: dict[str, list[str]] = {}
        self.thinking: list[dict[str, Any]] = []
        self.calls: dict[int, _Call] = {}
        self.finish: str | None = None
        self.usage: dict[str, Any] = {}
        self.error: StreamBroken | None = None

    def has_visible(self) -> bool:
        """Whether the reply holds a tool call yet.

        Text counts once it reaches ``on_text`` (the reader sees to that); reasoning shows
        nothing while it streams, so a stream that breaks after it is sent again.
        """
        return bool(self.calls)

    def handle(self, event: SSEEvent) -> str | None:
        """Take one event; return the text it adds, for ``on_text``."""
        data = event.data.strip()
        if self.error is not None or not data or data == "[DONE]":
            return None
        chunk = as_dict(json.loads(data))
        error = chunk.get("error")
        if error:
            code = as_dict(error).get("code")
            status = code if isinstance(code, int) and 400 <= code < 600 else 500
            self.error = StreamBroken("sent an error event", status=status, body=chunk)
            return None
        if isinstance(chunk.get("model"), str) and chunk["model"]:
            self.model = chunk["model"]
        if isinstance(chunk.get("usage"), dict):
            self.usage = as_dict(chunk["usage"])
        added: list[str] = []
        choices: object = chunk.get("choices")
        for choice in cast("list[Any]", choices) if isinstance(choices, list) else []:
            choice = as_dict(choice)
            if as_int(choice.get("index")) != 0:
                continue
            delta = as_dict(choice.get("delta"))
            content = delta.get("content")
            if isinstance(content, str) and content:
                self.text.append(content)
                added.append(content)
            for name in _REASONING_FIELDS:
                part = delta.get(name)
                if isinstance(part, str) and part:
                    self.reasoning.setdefault(name, []).append(part)
            blocks: object = delta.get("thinking_blocks")
            for piece in cast("list[Any]", blocks) if isinstance(blocks, list) else []:
                self._thinking_piece(as_dict(piece))
            calls: object = delta.get("tool_calls")
            for call in cast("list[Any]", calls) if isinstance(calls, list) else []:
                self._call_delta(as_dict(call))
            if isinstance(choice.get("finish_reason"), str):
                self.finish = choice["finish_reason"]
        return "".join(added) or None

    def _thinking_piece(self, piece: dict[str, Any]) -> None:
        """Add a piece of a thinking block, as LiteLLM's proxy streams Claude's thinking.

        Thinking text extends the open block, a signature closes it (so thinking text after it
        starts the next block), and any other block type (such as ``redacted_thinking``) arrives
        whole. A piece's ``index`` (its place in the stream, which older proxies leave out) is
        dropped: the joined blocks are the ones LiteLLM's reply without a stream holds, the form
        it takes back.
        """
        piece = {key: value for key, value in piece.items() if key != "index"}
        if not piece:
            return
        kind = piece.get("type", "thinking")
        text = piece.get("thinking")
        last = self.thinking[-1] if self.thinking else None
        if kind != "thinking":
            self.thinking.append(piece)
            return
        if last is None or last.get("type") != "thinking" or ("signature" in last and text):
            last = {"type": "thinking", "thinking": ""}
            self.thinking.append(last)
        for key, value in piece.items():
            if key == "thinking" and isinstance(value, str):
                last["thinking"] += value
            elif key == "signature" and isinstance(value, str) and value:
                last["signature"] = str(last.get("signature", "")) + value
            elif key not in ("type", "thinking", "signature") and value is not None:
                last[key] = value

    def _call_delta(self, delta: dict[str, Any]) -> None:
        index = delta.get("index")
        call_id = delta.get("id")
        if not isinstance(index, int) or isinstance(index, bool):
            # A server that leaves out the index: a new id starts a new call.
            known = {call.id for call in self.calls.values()}
            new = not self.calls or (isinstance(call_id, str) and call_id not in known)
            index = len(self.calls) if new else max(self.calls)
        call = self.calls.setdefault(index, _Call())
        if isinstance(call_id, str) and call_id and not call.id:
            call.id = call_id
        function = as_dict(delta.get("function"))
        name = function.get("name")
        if isinstance(name, str) and name and not call.name:
            call.name = name
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call.args.append(arguments)
        elif isinstance(arguments, dict):
            call.args.append(json.dumps(arguments))

    def reply(self, price: Price | None) -> Reply:
        """The reply, once the stream has ended.

        Raises:
            StreamBroken: The stream carried an error, or ended before the reply was complete.
        """
        if self.error is not None:
            raise self.error
        if self.finish is None:
            raise StreamBroken("ended the stream before the reply was complete")
        blocks: list[Block] = []
        reasoning: dict[str, Any] = {name: "".join(parts) for name, parts in self.reasoning.items()}
        thoughts = [str(block.get("thinking", "")) for block in self.thinking]
        text = next(iter(reasoning.values()), None) or "\n\n".join(filter(None, thoughts))
        if self.thinking:
            # Sent back as they came (to this server only): Claude behind the server wants them
            # in the next request of a tool loop.
            reasoning["thinking_blocks"] = self.thinking
        if reasoning:
            blocks.append(ReasoningBlock(text))
            blocks.append(RawBlock(self.provider, reasoning))
        if self.text:
            blocks.append(TextBlock("".join(self.text)))
        for _, call in sorted(self.calls.items()):
            call_id = call.id or f"call_{uuid.uuid4().hex[:24]}"
            blocks.append(ToolCall(call_id, call.name, parse_tool_args("".join(call.args))))
        return Reply(
            Message("assistant", tuple(blocks)),
            self._usage(price),
            stop_reason=self.finish,
            model=self.model,
        )

    def _usage(self, price: Price | None) -> Usage:
        usage = self.usage
        input_tokens = as_int(usage.get("prompt_tokens"))
        output_tokens = as_int(usage.get("completion_tokens"))
        details = as_dict(usage.get("prompt_tokens_details"))
        # OpenAI reports cached_tokens; DeepSeek reports prompt_cache_hit_tokens.
        cached = as_int(details.get("cached_tokens")) or as_int(
            usage.get("prompt_cache_hit_tokens")
        )
        reasoning = as_int(as_dict(usage.get("completion_tokens_details")).get("reasoning_tokens"))
        return request_usage(
            price,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cache_read_tokens=cached,
            reasoning_tokens=reasoning,
        )


# -- the model -------------------------------------------------------------------------------------


class OpenAIModel(SettingsModel):
    """A model served through the Chat Completions API, on the official ``openai`` SDK.

    Works with OpenAI and with any compatible server through `base_url` (vLLM, Ollama, the
    llama.cpp server, OpenRouter). Constructing one touches no network and needs no key: the key
    is read when the first request is made. Each request streams (text goes to ``on_text`` as it
    arrives), and is retried with backoff on rate limits, server errors, connection errors and
    timeouts until something visible arrives (text, or a tool call).

    Args:
        name: The model name the server knows, e.g. ``"gpt-4o"``.
        base_url: The API root, e.g. ``"http://localhost:8000/v1"``; OpenAI's when left out (or
            the ``OPENAI_BASE_URL`` environment variable).
        api_key: The API key. Left out, it is read from the `api_key_env` variable; a server at
            a custom `base_url` that needs no key then gets a placeholder.
        api_key_env: The environment variable that holds the key (``OPENAI_API_KEY``).
        price: Prices per million tokens; when given, `Usage.cost` is filled in.
        context_window: How many tokens fit in one request, when you know it.
        max_tokens: A cap on the reply's tokens (``max_completion_tokens`` for OpenAI).
        temperature: The sampling temperature.
        params: More request fields, sent as they are (``{"reasoning_effort": "low"}``).
        headers: Extra HTTP headers for every request.
        retry: The retry policy (`RetryPolicy()` when left out).
        rate_limit: A `RateLimit` every request (each retry too) waits for; the server's
            rate-limit headers tighten it and a 429 holds it back for every caller.
        timeout: Seconds to wait for each read of the reply (for it to start, then for each
            next piece of the stream), and to connect (10 at most); 300 when left out. A
            timeout before anything visible arrived is retried like a dropped connection.

    Raises:
        ImportError: The ``openai`` package is not installed; the message names the command.
        TypeError: An argument has the wrong type.
        ValueError: An argument has a wrong value.

    Example:
        ```python
        agent = Agent(OpenAIModel("gpt-4o-mini", price=Price(input=0.15, output=0.6)))
        local = OpenAIModel("qwen2.5", base_url="http://localhost:8000/v1")
        ```
    """

    __slots__ = ("_settings",)

    official_url = OPENAI_URL
    label = "OpenAI"

    def __init__(
        self,
        name: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        price: Price | None = None,
        context_window: int | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        retry: RetryPolicy | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        rate_limit: RateLimit | None = None,
    ) -> None:
        import_openai()
        resolved = base_url or os.environ.get("OPENAI_BASE_URL") or OPENAI_URL
        self._settings = Settings.parse(
            "OpenAIModel",
            name=name,
            base_url=resolved.rstrip("/"),
            api_key=api_key,
            api_key_env=api_key_env,
            price=price,
            context_window=context_window,
            max_tokens=max_tokens,
            temperature=temperature,
            params=params,
            headers=headers,
            retry=retry,
            timeout=timeout,
            rate_limit=rate_limit,
            reserved=_RESERVED,
        )

    @property
    def _provider_id(self) -> str:
        """Whose `RawBlock`s this model sends back: OpenAI's, or this server's."""
        return "openai" if self._official else f"openai@{self._settings.base_url}"

    def request_body(self, request: Request) -> dict[str, Any]:
        """The JSON body a request sends, but for the streaming fields: to check what is sent."""
        settings = self._settings
        body: dict[str, Any] = {
            "model": settings.name,
            "messages": chat_messages(request, self._provider_id),
        }
        if request.tools:
            body["tools"] = chat_tools(request.tools)
        if settings.max_tokens is not None:
            body["max_completion_tokens" if self._official else "max_tokens"] = settings.max_tokens
        if settings.temperature is not None:
            body["temperature"] = settings.temperature
        body.update(settings.params)
        return body

    async def respond(self, request: Request, *, on_text: TextCallback | None = None) -> Reply:
        """Send `request` and stream the reply.

        Raises:
            AuthError: No API key is set, or the server refused it.
            RateLimitError: The server kept refusing for now, after the retries.
            ContextTooLongError: The request does not fit the model's context window.
            ProviderError: Any other failure, a reply that broke off mid-stream included.
        """
        sdk = import_openai()

        def open_response(client: Any, body: dict[str, Any]) -> Any:
            # Only the required fields go through the SDK's signature; the rest as they are.
            return client.chat.completions.with_streaming_response.create(
                model=body["model"],
                messages=body["messages"],
                stream=True,
                stream_options={"include_usage": True},
                extra_body={key: body[key] for key in body.keys() - _REQUIRED} or None,
            )

        return await self._stream(
            request,
            on_text,
            sdk=sdk,
            client_class=sdk.AsyncOpenAI,
            open_response=open_response,
            new_stream=lambda: _ChatStream(self._provider_id, self._settings.name),
        )
