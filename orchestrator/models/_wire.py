"""The wire plumbing the provider models share: settings, SDK loading, TLS, SSE, tool args.

- `Settings`: a provider model's checked constructor arguments, the API key kept as a `Secret`.
- `shared_ssl_context`: one TLS context for the per-request HTTP clients.
- `SSEDecoder` and `read_events`: a server-sent event stream read from the SDK's streaming
  response, closed on every path (cancellation included).
- `parse_tool_args`: a provider's tool-call argument text as a dict; text that is not a JSON
  object becomes ``{INVALID_ARGUMENTS: text}``, which the tool's argument check reports back to
  the model as an ``input_error`` instead of crashing the loop.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import ssl
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast

import anyio
import anyio.lowlevel
import anyio.to_thread

from .._base._errors import RateLimitError
from .._base._json import freeze_values, valid_text
from .._base._messages import INVALID_ARGUMENTS as _INVALID_ARGUMENTS
from ._base import Request, estimate_tokens
from ._price import Price
from ._rate import RateLimit, RateTicket
from ._retry import Failure, Progress, Provider, RetryPolicy, Secret, run_with_retries

if TYPE_CHECKING:
    import httpx2

    from .._base._reply import Reply
    from ._base import TextCallback

__all__ = (
    "CONNECT_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "INVALID_ARGUMENTS",
    "SSEDecoder",
    "SSEEvent",
    "Settings",
    "as_dict",
    "as_int",
    "missing_sdk",
    "parse_tool_args",
    "read_events",
    "shared_ssl_context",
)

INVALID_ARGUMENTS = _INVALID_ARGUMENTS
"""The key of the args a tool call gets when the provider sent arguments that are not JSON."""

DEFAULT_TIMEOUT = 300.0
"""Seconds a provider model waits for each read of a reply when no ``timeout=`` is given.

Reasoning models and local servers can stay silent for minutes before their first token, and a
timeout before anything visible arrived is retried (the whole prompt sent, and paid for, again),
so the default sits well above such silences; it is half the SDKs' own 600 s.
"""

CONNECT_TIMEOUT = 10.0
"""The longest wait to connect, in seconds (``timeout`` when that is shorter)."""


def missing_sdk(module: str, *, extra: str, owner: str) -> ImportError:
    """The error for a provider SDK that is not installed: it names the install command."""
    return ImportError(
        f"{owner} needs the {module!r} package, which is not installed:"
        f" pip install 'orchestrator[{extra}]'"
    )


def as_dict(value: object) -> dict[str, Any]:
    """`value` when it is a JSON object, else an empty dict (for reading provider JSON)."""
    return cast("dict[str, Any]", value) if isinstance(value, dict) else {}


def as_int(value: object) -> int:
    """`value` when it is a count (an int >= 0), else 0 (for reading provider JSON)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return 0


# -- settings --------------------------------------------------------------------------------------


def _optional_int(owner: str, name: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}({name}=...) must be an int >= 1 or None, got {value!r}.")
    return value


def _timeout(owner: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{owner}(timeout=...) must be a number of seconds, got {value!r}.")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{owner}(timeout=...) must be a finite number > 0, got {value!r}.")
    return float(value)


def _str_mapping(owner: str, name: str, value: object, *, values: bool) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{owner}({name}=...) must be a dict, got {type(value).__name__}.")
    items = dict(cast("Mapping[object, object]", value))
    for key, item in items.items():
        if not isinstance(key, str) or (values and not isinstance(item, str)):
            raise TypeError(f"{owner}({name}=...) must map str to str, got {key!r}: {item!r}.")
    return cast("dict[str, Any]", items)


@dataclass(frozen=True, slots=True)
class Settings:
    """A provider model's checked settings (shared by `OpenAIModel` and `AnthropicModel`)."""

    owner: str
    name: str
    base_url: str
    api_key: Secret | None = field(repr=False)
    api_key_env: str
    price: Price | None
    context_window: int | None
    max_tokens: int | None
    temperature: float | None
    params: Mapping[str, Any]
    headers: Mapping[str, str] = field(repr=False)  # may hold credentials too
    retry: RetryPolicy
    timeout: float = DEFAULT_TIMEOUT
    rate_limit: RateLimit | None = None

    @classmethod
    def parse(
        cls,
        owner: str,
        *,
        name: object,
        base_url: object,
        api_key: object,
        api_key_env: object,
        price: object,
        context_window: object,
        max_tokens: object,
        temperature: object,
        params: object,
        headers: object,
        retry: object,
        timeout: object,
        reserved: frozenset[str],
        rate_limit: object = None,
    ) -> Settings:
        """Check every setting and say how to fix the first wrong one.

        Raises:
            TypeError: A setting has the wrong type.
            ValueError: A setting has a wrong value.
        """
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{owner} needs a model name such as 'gpt-4o', got {name!r}.")
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"{owner}(base_url=...) must be an http:// or https:// URL, got {base_url!r}."
            )
        if api_key is not None and (not isinstance(api_key, str) or not api_key):
            raise TypeError(f"{owner}(api_key=...) must be a non-empty str or None.")
        if not isinstance(api_key_env, str) or not api_key_env:
            raise TypeError(f"{owner}(api_key_env=...) must name an environment variable.")
        if price is not None and not isinstance(price, Price):
            raise TypeError(
                f"{owner}(price=...) takes a Price(input=..., output=...), got {price!r}."
            )
        if temperature is not None and (
            isinstance(temperature, bool) or not isinstance(temperature, int | float)
        ):
            raise TypeError(f"{owner}(temperature=...) must be a number, got {temperature!r}.")
        extra = _str_mapping(owner, "params", params, values=False)
        clash = sorted(reserved & set(extra))
        if clash:
            raise ValueError(
                f"{owner}(params=...) may not set {clash}: the model fills them in from the"
                " Request. Pass other request fields only."
            )
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise TypeError(f"{owner}(retry=...) takes a RetryPolicy(...), got {retry!r}.")
        if rate_limit is not None and not isinstance(rate_limit, RateLimit):
            raise TypeError(
                f"{owner}(rate_limit=...) takes a RateLimit(requests_per_minute=...),"
                f" got {rate_limit!r}."
            )
        return cls(
            owner=owner,
            name=name,
            base_url=base_url,
            api_key=None if api_key is None else Secret(api_key),
            api_key_env=api_key_env,
            price=price,
            context_window=_optional_int(owner, "context_window", context_window),
            max_tokens=_optional_int(owner, "max_tokens", max_tokens),
            temperature=None if temperature is None else float(cast("float", temperature)),
            params=MappingProxyType(extra),
            headers=MappingProxyType(_str_mapping(owner, "headers", headers, values=True)),
            retry=RetryPolicy() if retry is None else retry,
            timeout=_timeout(owner, timeout),
            rate_limit=rate_limit,
        )

    @property
    def connect_timeout(self) -> float:
        """The longest wait to connect: `timeout`, but never more than `CONNECT_TIMEOUT`."""
        return min(self.timeout, CONNECT_TIMEOUT)

    def key(self, provider: Provider, *, placeholder: bool) -> Secret:
        """The API key: given, or read from the environment now.

        With `placeholder`, a server that may need no key (a custom base_url) gets a stand-in.

        Raises:
            AuthError: No key is given or set, and no placeholder will do.
        """
        if self.api_key is not None:
            return self.api_key
        value = os.environ.get(self.api_key_env, "").strip()
        if value:
            return Secret(value)
        if placeholder:
            return Secret("not-needed")
        raise provider.missing_key()


# -- TLS -----------------------------------------------------------------------------------------


_ssl_lock = threading.Lock()
_ssl_contexts: list[ssl.SSLContext] = []


def _build_ssl_context() -> ssl.SSLContext:
    with _ssl_lock:
        if not _ssl_contexts:
            import httpx2

            _ssl_contexts.append(httpx2.create_ssl_context())
        return _ssl_contexts[0]


async def shared_ssl_context() -> ssl.SSLContext:
    """One TLS context for every request, built once in a worker thread (it reads CA files).

    Each request gets its own HTTP client (so nothing outlives a call or crosses event loops);
    sharing the context keeps that cheap.
    """
    if _ssl_contexts:
        await anyio.lowlevel.checkpoint()
        return _ssl_contexts[0]
    return await anyio.to_thread.run_sync(_build_ssl_context)


# -- server-sent events ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One server-sent event: its name (None when unnamed) and its data lines joined."""

    event: str | None
    data: str


class SSEDecoder:
    """Bytes in, events out: a small, sans-I/O reader of ``text/event-stream``."""

    __slots__ = ("_buffer", "_data", "_event")

    def __init__(self) -> None:
        self._buffer = b""
        self._event: str | None = None
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """The events `chunk` completes."""
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        events: list[SSEEvent] = []
        for raw in lines:
            event = self._line(raw.removesuffix(b"\r").decode("utf-8", errors="replace"))
            if event is not None:
                events.append(event)
        return events

    def close(self) -> list[SSEEvent]:
        """The event left when the stream ends without a final blank line."""
        events = self.feed(b"\n") if self._buffer else []
        if self._data:
            events.append(SSEEvent(self._event, "\n".join(self._data)))
            self._event, self._data = None, []
        return events

    def _line(self, line: str) -> SSEEvent | None:
        if not line:
            if not self._data:
                self._event = None
                return None
            event = SSEEvent(self._event, "\n".join(self._data))
            self._event, self._data = None, []
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None


async def read_events(
    response: httpx2.Response,
    handle: Callable[[SSEEvent], str | None],
    on_text: TextCallback | None,
    progress: Progress,
    has_visible: Callable[[], bool],
) -> None:
    """Feed each event of `response` to `handle`; text it returns goes to `on_text`.

    Once something visible arrived (text passed to `on_text`, or what `has_visible()` reports:
    a tool call), the attempt counts as started: a stream that breaks after that is not re-sent,
    so nothing is shown or asked for twice. Before that (a ping, an empty block, reasoning), a
    break is retried like a dropped connection. The response is read to its end and closed on
    every path, shielded from cancellation.
    """
    decoder = SSEDecoder()
    try:
        async with contextlib.aclosing(response.aiter_bytes()) as chunks:
            async for chunk in chunks:
                for event in decoder.feed(chunk):
                    _emit(handle(event), on_text, progress)
                    if has_visible():
                        progress.emitted = True
        for event in decoder.close():
            _emit(handle(event), on_text, progress)
    finally:
        with anyio.CancelScope(shield=True):
            await response.aclose()


def _emit(text: str | None, on_text: TextCallback | None, progress: Progress) -> None:
    if text:
        progress.emitted = True
        if on_text is not None:
            # A chunk may hold half of a character: shown as U+FFFD, as the reply records it
            # (whose joined text makes a pair split across two chunks whole again).
            on_text(valid_text(text))


# -- tool arguments --------------------------------------------------------------------------------


def parse_tool_args(raw: str) -> dict[str, Any]:
    """A tool call's argument text as a dict.

    Empty text means no arguments. Text that is not a JSON object (cut off, malformed, a list)
    or that a State cannot record (NaN, nested too deep, a huge int) gives
    ``{INVALID_ARGUMENTS: raw}``: the tool's argument check then refuses it with an
    ``input_error`` result the model can read and fix, and the loop goes on.
    """
    if not raw.strip():
        return {}
    try:
        value: object = json.loads(raw)
    except (ValueError, RecursionError):
        return {INVALID_ARGUMENTS: raw}
    if isinstance(value, dict):
        try:
            return freeze_values(cast("dict[str, Any]", value), "the arguments")
        except TypeError:
            return {INVALID_ARGUMENTS: raw}
    return {INVALID_ARGUMENTS: raw}


async def _hold_on_429(ticket: RateTicket, failure: Failure | None, retry: RetryPolicy) -> None:
    """Hold the whole rate limit back after a 429, as long as this caller's retry will wait."""
    if failure is not None and failure.retryable and isinstance(failure.error, RateLimitError):
        await ticket.hold(retry.delay(1, failure.retry_after))


class ReplyStream(Protocol):
    """A provider's reply as its server-sent events come in."""

    def handle(self, event: SSEEvent) -> str | None:
        """Take one event; return the text it adds, if any."""
        ...

    def has_visible(self) -> bool:
        """Whether the reply holds something besides text that the caller acts on (a tool call)."""
        ...

    def reply(self, price: Price | None) -> Reply:
        """The finished reply, its usage priced with `price`."""
        ...


# What a request body holds besides its options, in each wire (Chat Completions, Responses,
# Anthropic's Messages).
_PROMPT_FIELDS = frozenset({"model", "messages", "system", "tools", "input", "instructions"})


class SettingsModel:
    """What `OpenAIModel` and `AnthropicModel` share: their checked settings and the accessors.

    A subclass sets `official_url` (the provider's own API root) and `label` (how errors name
    the provider), and builds `_settings` in its constructor.
    """

    __slots__ = ()

    official_url: ClassVar[str]
    label: ClassVar[str]
    _settings: Settings

    @property
    def name(self) -> str:
        """The model name sent to the server."""
        return self._settings.name

    @property
    def context_window(self) -> int | None:
        """How many tokens fit in one request, or None when unknown."""
        return self._settings.context_window

    @property
    def base_url(self) -> str:
        """The API root requests go to."""
        return self._settings.base_url

    @property
    def price(self) -> Price | None:
        """The prices `Usage.cost` is computed from, or None."""
        return self._settings.price

    @property
    def retry(self) -> RetryPolicy:
        """The retry policy."""
        return self._settings.retry

    @property
    def rate_limit(self) -> RateLimit | None:
        """The rate limit every request (each retry too) waits for, or None."""
        return self._settings.rate_limit

    @property
    def timeout(self) -> float:
        """Seconds to wait for each read of a reply (and, at most 10 of them, to connect)."""
        return self._settings.timeout

    @property
    def _official(self) -> bool:
        return self._settings.base_url == self.official_url

    def __repr__(self) -> str:
        where = "" if self._official else f", base_url={self._settings.base_url!r}"
        return f"{type(self).__name__}({self._settings.name!r}{where})"

    def _provider(self) -> Provider:
        settings = self._settings
        return Provider(
            self.label,
            settings.name,
            settings.base_url,
            settings.api_key_env,
            type(self).__name__,
            official=self._official,
            timeout=settings.timeout,
            connect_timeout=settings.connect_timeout,
        )

    def request_body(self, request: Request) -> dict[str, Any]:
        """The JSON body of `request` for this provider's API."""
        raise NotImplementedError

    @property
    def options(self) -> dict[str, Any]:
        """What every request sends besides the instructions, tools and messages (JSON).

        Its max tokens, temperature and extra `params`, as the request body has them: the
        options recorded with each prompt.
        """
        body = self.request_body(Request(system=None, messages=()))
        return {key: value for key, value in body.items() if key not in _PROMPT_FIELDS}

    async def _stream(
        self,
        request: Request,
        on_text: TextCallback | None,
        *,
        sdk: Any,
        client_class: Callable[..., Any],
        open_response: Callable[[Any, dict[str, Any]], AbstractAsyncContextManager[Any]],
        new_stream: Callable[[], ReplyStream],
    ) -> Reply:
        """Send `request` through the provider's SDK and stream its reply, with retries.

        Both official SDKs have the same shape: a client class taking the key, the base URL, a
        timeout and an httpx client, `APIStatusError`, `APIConnectionError` and its subclass
        `APITimeoutError`. `open_response(client, body)` opens the streaming response;
        `new_stream()` reads one attempt's events.
        """
        import httpx2

        settings = self._settings
        provider = self._provider()
        # A server at a custom base_url may need no key (a local one): it gets a placeholder.
        key = settings.key(provider, placeholder=not self._official)
        provider = provider.with_secret(key)
        body = self.request_body(request)
        context = await shared_ssl_context()
        client = client_class(
            api_key=key.reveal(),
            base_url=settings.base_url,
            max_retries=0,
            # Each read of the stream waits at most `timeout` (the SDKs' default is 600 s).
            timeout=httpx2.Timeout(settings.timeout, connect=settings.connect_timeout),
            default_headers=dict(settings.headers),
            http_client=sdk.DefaultAsyncHttpxClient(verify=context),
        )

        async def attempt(progress: Progress, ticket: RateTicket | None) -> Reply:
            stream = new_stream()
            async with open_response(client, body) as response:
                if ticket is not None:
                    await ticket.read_headers(response.http_response.headers)
                await read_events(
                    response.http_response, stream.handle, on_text, progress, stream.has_visible
                )
            return stream.reply(settings.price)

        limit = settings.rate_limit
        tokens = estimate_tokens(request) if limit is not None and limit.counts_tokens else 0

        async def send(progress: Progress) -> Reply:
            if limit is None:
                return await attempt(progress, None)
            async with limit.request(tokens) as ticket:
                try:
                    reply = await attempt(progress, ticket)
                except Exception as error:
                    await _hold_on_429(ticket, classify(error), settings.retry)
                    raise
                await ticket.settle(reply.usage)
                return reply

        def classify(error: Exception) -> Failure | None:
            if isinstance(error, sdk.APITimeoutError):
                # The SDK's wrapper says only "Request timed out"; its cause says which wait.
                return provider.timeout_failure(error.__cause__ or error)
            if isinstance(error, sdk.APIStatusError):
                status: Any = error  # the SDK's error type, which only the SDK module knows
                return provider.status_failure(
                    status.status_code, status.body, status.response.headers, status.request_id
                )
            if isinstance(error, sdk.APIConnectionError):
                return provider.connection_failure(error)
            return provider.classify(error)

        try:
            return await run_with_retries(settings.retry, provider, send, classify)
        finally:
            with anyio.CancelScope(shield=True):
                await client.close()
