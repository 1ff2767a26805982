"""`OpenAIResponsesModel`: the OpenAI Responses API through the official ``openai`` SDK.

The Responses API is the one OpenAI's reasoning models keep their reasoning across turns with.
Requests are not stored by the server (``store=False``): each reply's reasoning items come back
encrypted (``include=["reasoning.encrypted_content"]``) and are kept in the history as
`RawBlock`s of this server, which the next request sends back as they came. Other models skip
them. Settings, errors, retries and rate limits are `OpenAIModel`'s (`SettingsModel`).
"""

from __future__ import annotations

import json
import os
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
)
from .._base._reply import Reply, Usage
from ._base import Request, TextCallback
from ._openai import OPENAI_URL, import_openai, user_pieces
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
    parse_tool_args,
)

if TYPE_CHECKING:
    from .._tooling._tools import ToolSpec

__all__ = ("OpenAIResponsesModel", "responses_input", "responses_tools")

_RESERVED = frozenset({"model", "input", "instructions", "tools", "stream"})
_REQUIRED = frozenset({"model", "input"})
# What an error event's code means, as the HTTP status the same error would have had.
_EVENT_STATUS = {
    "rate_limit_exceeded": 429,
    "insufficient_quota": 429,
    "context_length_exceeded": 400,
    "invalid_prompt": 400,
}


# -- request mapping (pure) ------------------------------------------------------------------------


def _image_part(image: Image) -> dict[str, Any]:
    url = f"data:{image.media_type};base64,{image.to_base64()}"
    return {"type": "input_image", "image_url": url}


def _user(message: Message) -> list[dict[str, Any]]:
    """A user message: its tool results as ``function_call_output`` items, then the rest."""
    outputs, pieces = user_pieces(message)
    out: list[dict[str, Any]] = [
        {"type": "function_call_output", "call_id": call_id, "output": text}
        for call_id, text in outputs
    ]
    parts = [
        {"type": "input_text", "text": piece.text}
        if isinstance(piece, TextBlock)
        else _image_part(piece)
        for piece in pieces
    ]
    if parts:
        out.append({"role": "user", "content": parts})
    return out


def _assistant(message: Message, provider: str) -> list[dict[str, Any]]:
    """An assistant message as output items, in its order; `provider`'s raw items as they came."""
    out: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, RawBlock):
            item = as_dict(thaw(block.data))
            if block.provider == provider and item.get("type"):  # an item, not other data
                out.append(item)
        elif isinstance(block, TextBlock):
            if block.text:
                out.append({"role": "assistant", "content": block.text})
        elif isinstance(block, ToolCall):
            arguments = json.dumps(thaw(block.args))
            out.append(
                {
                    "type": "function_call",
                    "call_id": block.id,
                    "name": block.name,
                    "arguments": arguments,
                }
            )
    return out


def responses_input(request: Request, provider: str) -> list[dict[str, Any]]:
    """The Responses API ``input`` items for the messages of `request`.

    Items kept in `RawBlock`s of `provider` (reasoning) go back where they were, before the
    text or tool calls that followed them; other providers' raw blocks are left out.
    """
    out: list[dict[str, Any]] = []
    for message in request.messages:
        if message.role == "assistant":
            out.extend(_assistant(message, provider))
        else:
            out.extend(_user(message))
    return out


def responses_tools(specs: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """The Responses API ``tools`` for these specs.

    ``strict`` is off: the API's strict mode wants every property required, which a tool with
    optional arguments is not.
    """
    return [
        {
            "type": "function",
            "name": spec.name,
            "description": spec.description,
            "parameters": thaw(spec.input_schema),
            "strict": False,
        }
        for spec in specs
    ]


# -- reading the stream (sans-I/O) -----------------------------------------------------------------


class _ResponsesStream:
    """Accumulates Responses API stream events into a `Reply`.

    Each finished output item (``response.output_item.done``) becomes blocks, in output order;
    text deltas (a refusal's too) go to ``on_text`` as they come, and stand in for a message
    item that never finished. A server that sends no item events has its items read from the
    completed response's ``output``.
    """

    def __init__(self, provider: str, model: str) -> None:
        self.provider = provider
        self.model = model
        self.items: dict[int, dict[str, Any]] = {}
        self.deltas: dict[int, list[str]] = {}
        self.calls = 0
        self.response: dict[str, Any] | None = None
        self.error: StreamBroken | None = None

    def has_visible(self) -> bool:
        """Whether a tool call has started (text counts once it reaches ``on_text``)."""
        return self.calls > 0

    def handle(self, event: SSEEvent) -> str | None:
        """Take one event; return the text it adds, for ``on_text``."""
        data = event.data.strip()
        if self.error is not None or not data or data == "[DONE]":
            return None
        payload = as_dict(json.loads(data))
        kind = payload.get("type", event.event)
        index = as_int(payload.get("output_index"))
        if kind in ("response.output_text.delta", "response.refusal.delta"):
            delta = payload.get("delta")
            if isinstance(delta, str) and delta:
                self.deltas.setdefault(index, []).append(delta)
                return delta
        elif kind == "response.output_item.added":
            if as_dict(payload.get("item")).get("type") == "function_call":
                self.calls += 1
        elif kind == "response.output_item.done":
            self.items[index] = as_dict(payload.get("item"))
        elif kind in ("response.completed", "response.incomplete"):
            self.response = as_dict(payload.get("response"))
            model = self.response.get("model")
            if isinstance(model, str) and model:
                self.model = model
        elif kind == "response.failed":
            error = as_dict(as_dict(payload.get("response")).get("error"))
            self.error = _broken("sent a failed response", error)
        elif kind == "error":
            self.error = _broken("sent an error event", as_dict(payload.get("error")) or payload)
        return None

    def reply(self, price: Price | None) -> Reply:
        """The reply, once the stream has ended.

        Raises:
            StreamBroken: The stream carried an error, or ended before the reply was complete.
        """
        if self.error is not None:
            raise self.error
        if self.response is None:
            raise StreamBroken("ended the stream before the reply was complete")
        if not self.items and not self.deltas:
            output: object = self.response.get("output")
            items = cast("list[Any]", output) if isinstance(output, list) else []
            self.items = {index: as_dict(item) for index, item in enumerate(items)}
        blocks: list[Block] = []
        calls = False
        for index in sorted(self.items.keys() | self.deltas.keys()):
            item = self.items.get(index, {"type": "message", "content": []})
            kind = item.get("type")
            if kind == "message":
                text = _message_text(item) or "".join(self.deltas.get(index, ()))
                if text:
                    blocks.append(TextBlock(text))
            elif kind == "function_call":
                calls = True
                call_id = item.get("call_id")
                if not isinstance(call_id, str) or not call_id:
                    call_id = f"call_{uuid.uuid4().hex[:24]}"
                arguments = item.get("arguments")
                args = parse_tool_args(arguments if isinstance(arguments, str) else "")
                blocks.append(ToolCall(call_id, str(item.get("name", "")), args))
            elif kind == "reasoning":
                summary = _summary_text(item)
                if summary:
                    blocks.append(ReasoningBlock(summary))
                blocks.append(RawBlock(self.provider, item))
        status = self.response.get("status")
        reason = as_dict(self.response.get("incomplete_details")).get("reason")
        if status == "incomplete" and isinstance(reason, str):
            stop = reason
        else:
            stop = "tool_calls" if calls else "stop"
        return Reply(
            Message("assistant", tuple(blocks)),
            self._usage(price),
            stop_reason=stop,
            model=self.model,
        )

    def _usage(self, price: Price | None) -> Usage:
        usage = as_dict(self.response.get("usage") if self.response else None)
        cached = as_int(as_dict(usage.get("input_tokens_details")).get("cached_tokens"))
        reasoning = as_int(as_dict(usage.get("output_tokens_details")).get("reasoning_tokens"))
        return request_usage(
            price,
            input_tokens=as_int(usage.get("input_tokens")),
            output_tokens=as_int(usage.get("output_tokens")),
            cache_read_tokens=cached,
            reasoning_tokens=reasoning,
        )


def _broken(what: str, error: dict[str, Any]) -> StreamBroken:
    code = error.get("code")
    status = _EVENT_STATUS.get(code, 500) if isinstance(code, str) else 500
    return StreamBroken(what, status=status, body={"error": error})


def _message_text(item: Mapping[str, Any]) -> str:
    """The text of a message item: its ``output_text`` parts (and a refusal), joined."""
    parts: object = item.get("content")
    texts: list[str] = []
    for part in cast("list[Any]", parts) if isinstance(parts, list) else []:
        part = as_dict(part)
        text = part.get("text") if part.get("type") == "output_text" else part.get("refusal")
        if isinstance(text, str):
            texts.append(text)
    return "".join(texts)


def _summary_text(item: Mapping[str, Any]) -> str:
    """The readable summary of a reasoning item, its parts a paragraph each."""
    parts: object = item.get("summary")
    texts = (
        [as_dict(part).get("text") for part in cast("list[Any]", parts)]
        if isinstance(parts, list)
        else []
    )
    return "\n\n".join(text for text in texts if isinstance(text, str) and text)


# -- the model -------------------------------------------------------------------------------------


class OpenAIResponsesModel(SettingsModel):
    """A model served through the OpenAI Responses API, on the official ``openai`` SDK.

    What OpenAI's reasoning models need to keep their reasoning across the turns of a tool
    loop: each request goes with ``store=False`` and asks for the reasoning items encrypted
    (``include=["reasoning.encrypted_content"]``); they are kept in the history as `RawBlock`s
    and sent back on the next request, and their summaries (when the request asks for one, with
    ``params={"reasoning": {"summary": "auto"}}``) are `ReasoningBlock`s to read. Any server
    that speaks the Responses API works through `base_url`. Everything else is as for
    `OpenAIModel`: the key is read at the first request, each request streams, and rate limits,
    server errors, dropped connections and timeouts are retried until something visible arrives.

    Args:
        name: The model name the server knows, e.g. ``"gpt-5-mini"``.
        base_url: The API root; OpenAI's when left out (or the ``OPENAI_BASE_URL`` variable).
        api_key: The API key. Left out, it is read from the `api_key_env` variable; a server at
            a custom `base_url` that needs no key then gets a placeholder.
        api_key_env: The environment variable that holds the key (``OPENAI_API_KEY``).
        price: Prices per million tokens; when given, `Usage.cost` is filled in.
        context_window: How many tokens fit in one request, when you know it.
        max_tokens: A cap on the reply's tokens, reasoning included (``max_output_tokens``).
        temperature: The sampling temperature.
        params: More request fields, sent as they are (``{"reasoning": {"effort": "low"}}``);
            they may replace ``store`` and ``include``.
        headers: Extra HTTP headers for every request.
        retry: The retry policy (`RetryPolicy()` when left out).
        rate_limit: A `RateLimit` every request (each retry too) waits for.
        timeout: Seconds to wait for each read of the reply, and to connect (10 at most); 300
            when left out.

    Raises:
        ImportError: The ``openai`` package is not installed; the message names the command.
        TypeError: An argument has the wrong type.
        ValueError: An argument has a wrong value.

    Example:
        ```python
        agent = Agent(OpenAIResponsesModel("gpt-5-mini", params={"reasoning": {"effort": "low"}}))
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
        import_openai("OpenAIResponsesModel")
        resolved = base_url or os.environ.get("OPENAI_BASE_URL") or OPENAI_URL
        self._settings = Settings.parse(
            "OpenAIResponsesModel",
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
        """Whose `RawBlock`s this model sends back: OpenAI's Responses API, or this server's."""
        where = "" if self._official else f"@{self._settings.base_url}"
        return f"openai-responses{where}"

    def request_body(self, request: Request) -> dict[str, Any]:
        """The JSON body a request sends, but for ``stream``: to check what is sent."""
        settings = self._settings
        body: dict[str, Any] = {
            "model": settings.name,
            "input": responses_input(request, self._provider_id),
        }
        if request.system:
            body["instructions"] = request.system
        if request.tools:
            body["tools"] = responses_tools(request.tools)
        body["store"] = False
        body["include"] = ["reasoning.encrypted_content"]
        if settings.max_tokens is not None:
            body["max_output_tokens"] = settings.max_tokens
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
        sdk = import_openai("OpenAIResponsesModel")

        def open_response(client: Any, body: dict[str, Any]) -> Any:
            # Only the required fields go through the SDK's signature; the rest as they are.
            return client.responses.with_streaming_response.create(
                model=body["model"],
                input=body["input"],
                stream=True,
                extra_body={key: body[key] for key in body.keys() - _REQUIRED} or None,
            )

        return await self._stream(
            request,
            on_text,
            sdk=sdk,
            client_class=sdk.AsyncOpenAI,
            open_response=open_response,
            new_stream=lambda: _ResponsesStream(self._provider_id, self._settings.name),
        )
