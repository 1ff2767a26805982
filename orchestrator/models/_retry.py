"""What the provider models share: retries, error mapping, event streams, secrets, tool args.

Written once for `OpenAIModel` and `AnthropicModel`:

- `RetryPolicy` and `run_with_retries`: exponential backoff with jitter that honours
  ``Retry-After``, on 429, 5xx and connection errors, while nothing has streamed to the caller;
  each retry is reported (`report_retry`) and logged.
- `Provider`: turns an HTTP status, a provider error body or a broken connection into
  `ProviderError`, `RateLimitError`, `AuthError` or `ContextTooLongError`, with a message that
  says what to do and never holds the API key.
- `SSEDecoder` and `read_events`: a server-sent event stream read from the SDK's streaming
  response, closed on every path (cancellation included).
- `parse_tool_args`: a provider's tool-call argument text as a dict; text that is not a JSON
  object becomes ``{INVALID_ARGUMENTS: text}``, which the tool's argument check reports back to
  the model as an ``input_error`` instead of crashing the loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import email.utils
import json
import math
import os
import random
import re
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar, cast

import anyio
import anyio.lowlevel
import anyio.to_thread

from .._errors import AuthError, ContextTooLongError, ProviderError, RateLimitError
from .._logs import get_log
from .._reporting import report_retry
from ._price import Price

if TYPE_CHECKING:
    import httpx2

    from ._base import TextCallback

__all__ = (
    "INVALID_ARGUMENTS",
    "Failure",
    "Progress",
    "Provider",
    "RetryPolicy",
    "SSEDecoder",
    "SSEEvent",
    "Secret",
    "Settings",
    "StreamBroken",
    "as_dict",
    "as_int",
    "missing_sdk",
    "parse_retry_after",
    "parse_tool_args",
    "read_events",
    "run_with_retries",
    "shared_ssl_context",
)

_T = TypeVar("_T")
_log = get_log("models")

INVALID_ARGUMENTS = "__invalid_arguments__"
"""The key of the args a tool call gets when the provider sent arguments that are not JSON."""

# -- retry policy ----------------------------------------------------------------------------------


def _number(owner: str, name: str, value: object, *, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TypeError(f"{owner}.{name} must be a number, got {value!r}.")
    if value < minimum:
        raise ValueError(f"{owner}.{name} must be >= {minimum}, got {value!r}.")
    return float(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How a provider model retries a request that failed before its reply started to stream.

    Retried: rate limits (429), server errors (5xx, 408, 409, 529) and connection errors.
    The n-th retry waits ``base * 2 ** (n - 1)`` seconds, scaled by a random factor in
    [0.5, 1], or what the server's ``Retry-After`` asks; never more than `max_delay`.

    Args:
        retries: How many times to retry after the first attempt (0 turns retrying off).
        base: The first backoff delay in seconds.
        max_delay: The longest wait in seconds, ``Retry-After`` included.

    Example:
        ```python
        model = OpenAIModel("gpt-4o", retry=RetryPolicy(retries=8, max_delay=120))
        ```
    """

    retries: int = 4
    base: float = 0.5
    max_delay: float = 30.0

    def __post_init__(self) -> None:
        retries: object = self.retries
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"RetryPolicy.retries must be an int >= 0, got {retries!r}.")
        _number("RetryPolicy", "base", self.base, minimum=0)
        _number("RetryPolicy", "max_delay", self.max_delay, minimum=0)

    def delay(
        self,
        retry: int,
        retry_after: float | None = None,
        *,
        rand: Callable[[], float] = random.random,
    ) -> float:
        """Seconds to wait before the `retry`-th retry (1 for the first).

        `retry_after` is what the server asked for; it wins over the backoff, up to `max_delay`.
        """
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_delay)
        backoff = min(self.base * 2.0 ** max(retry - 1, 0), self.max_delay)
        return backoff * (0.5 + 0.5 * rand())


def parse_retry_after(headers: Mapping[str, str], *, now: datetime | None = None) -> float | None:
    """The wait a response asks for, in seconds, or None.

    Reads ``retry-after-ms`` (milliseconds, sent by OpenAI) and ``retry-after`` (seconds, or an
    HTTP date). `headers` is matched case-insensitively when it is an ``httpx2.Headers``;
    plain dicts should use lower-case names.
    """
    millis = headers.get("retry-after-ms")
    if millis is not None:
        with contextlib.suppress(ValueError):
            value = float(millis) / 1000
            if math.isfinite(value):
                return max(value, 0.0)
    text = headers.get("retry-after")
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        return max(value, 0.0) if math.isfinite(value) else None
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)


# -- secrets and SDK loading ---------------------------------------------------------------------


class Secret:
    """An API key that never shows in a repr, a str or a log line; `reveal()` gives the value."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The key itself, for the SDK client only."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError(
            "An API key is not pickled: pass it again, or set its environment variable."
        )


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
    api_key: Secret | None
    api_key_env: str
    price: Price | None
    context_window: int | None
    max_tokens: int | None
    temperature: float | None
    params: Mapping[str, Any]
    headers: Mapping[str, str]
    retry: RetryPolicy

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
        reserved: frozenset[str],
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
        )

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


# -- errors --------------------------------------------------------------------------------------

_CONTEXT_CODES = frozenset(
    {"context_length_exceeded", "exceed_context_size_error", "request_too_large"}
)
_CONTEXT_TEXT = re.compile(
    r"context.?(length|window|size)|maximum context|prompt is too long|too many (input )?tokens"
    r"|input is too long|exceeds? the (available|maximum) context|reduce the length",
    re.IGNORECASE,
)
_QUOTA_CODES = frozenset({"insufficient_quota", "billing_hard_limit_reached"})
_RETRY_STATUSES = frozenset({408, 409, 425, 429})


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt: the error to raise, whether a retry may help, and the server's wait."""

    error: ProviderError
    retryable: bool = False
    retry_after: float | None = None


class StreamBroken(Exception):
    """An event stream ended early or carried an error event (internal; mapped by `Provider`)."""

    def __init__(self, message: str, *, status: int | None = None, body: object = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


def _error_details(body: object) -> tuple[str, frozenset[str]]:
    """The message and the error codes/types of a provider's error body."""
    inner: object = body
    if isinstance(body, Mapping):
        outer = cast("Mapping[str, object]", body)
        inner = outer.get("error", outer)
    codes: set[str] = set()
    message = ""
    if isinstance(inner, Mapping):
        fields = cast("Mapping[str, object]", inner)
        for key in ("code", "type"):
            value = fields.get(key)
            if isinstance(value, str | int) and not isinstance(value, bool):
                codes.add(str(value))
        found = fields.get("message")
        message = found if isinstance(found, str) else json.dumps(fields, default=str)
    elif isinstance(inner, str):
        message = inner
    elif inner is not None:
        message = str(inner)
    message = " ".join(message.split())
    return (message[:500] + "…" if len(message) > 500 else message), frozenset(codes)


@dataclass(frozen=True, slots=True)
class Provider:
    """Who a request goes to, for error messages: the provider, the model, where, which key."""

    label: str
    model: str
    url: str
    key_env: str
    owner: str
    secret: Secret | None = field(default=None, repr=False)

    def with_secret(self, secret: Secret) -> Provider:
        """The same provider, knowing the key to redact from messages."""
        return dataclasses.replace(self, secret=secret)

    def redact(self, text: str) -> str:
        """`text` with the API key replaced by ``***``."""
        if self.secret is not None and len(self.secret.reveal()) >= 4:
            text = text.replace(self.secret.reveal(), "***")
        return text

    def missing_key(self) -> AuthError:
        """The error for a request made with no API key at all."""
        return AuthError(
            f"No API key for {self.label} (model {self.model!r}): set the {self.key_env}"
            f" environment variable, or pass {self.owner}(..., api_key=...)."
        )

    def status_failure(
        self,
        status: int,
        body: object,
        headers: Mapping[str, str] | None = None,
        request_id: str | None = None,
    ) -> Failure:
        """Map an HTTP error status and its body to the error to raise."""
        message, codes = _error_details(body)
        detail = f"HTTP {status}" + (f": {self.redact(message)}" if message else "")
        if request_id:
            detail += f" [request id {request_id}]"
        retry_after = None if headers is None else parse_retry_after(headers)
        model = repr(self.model)
        if status == 401:
            return Failure(
                AuthError(
                    f"{self.label} refused the API key for {model} ({detail}). Set {self.key_env}"
                    f" to a valid key, or pass {self.owner}(..., api_key=...)."
                )
            )
        if status == 403:
            return Failure(
                AuthError(
                    f"{self.label} denied access to {model} ({detail}). Check that the key in"
                    f" {self.key_env} (or api_key=) may use this model."
                )
            )
        if status == 429 and codes & _QUOTA_CODES:
            return Failure(
                RateLimitError(
                    f"{self.label} says the account is out of quota ({detail}). Check the plan"
                    " and billing: retrying will not help."
                )
            )
        if status == 429:
            return Failure(
                RateLimitError(
                    f"{self.label} rate-limited the request to {model} ({detail}). Lower the load"
                    " (Agent(max_concurrency=...)), retry later, or ask for a higher limit."
                ),
                retryable=True,
                retry_after=retry_after,
            )
        if status == 413 or (
            400 <= status < 500 and (codes & _CONTEXT_CODES or _CONTEXT_TEXT.search(message))
        ):
            return Failure(
                ContextTooLongError(
                    f"The request does not fit the context window of {model} ({detail})."
                    " Shorten the conversation: agent.compact(state), or"
                    " state.clear_tool_results(), then run again."
                )
            )
        if status == 404:
            return Failure(
                ProviderError(
                    f"{self.label} has no model {model} at {self.url} ({detail})."
                    " Check the model name and base_url."
                )
            )
        if status >= 500 or status in _RETRY_STATUSES:
            return Failure(
                ProviderError(f"{self.label} failed to answer for {model} ({detail})."),
                retryable=True,
                retry_after=retry_after,
            )
        return Failure(
            ProviderError(
                f"{self.label} rejected the request for {model} ({detail}). Check the model's"
                " options (params=...) and the conversation it was sent."
            )
        )

    def connection_failure(self, error: BaseException) -> Failure:
        """Map a connection error or timeout to a retryable `ProviderError`."""
        detail = self.redact(str(error) or type(error).__name__)
        return Failure(
            ProviderError(
                f"Could not reach {self.label} at {self.url} for {self.model!r}"
                f" ({type(error).__name__}: {detail}). Check the network and base_url."
            ),
            retryable=True,
        )

    def classify(self, error: Exception) -> Failure | None:
        """Map the errors every provider shares: broken streams and transport errors.

        Returns None for anything else, which then propagates unchanged.
        """
        if isinstance(error, StreamBroken):
            if error.status is not None:
                return self.status_failure(error.status, error.body)
            return Failure(
                ProviderError(f"{self.label} {self.redact(str(error))} (model {self.model!r})."),
                retryable=True,
            )
        if _is_transport_error(error):
            return self.connection_failure(error)
        if isinstance(error, json.JSONDecodeError):
            return Failure(
                ProviderError(
                    f"{self.label} sent a stream event that is not JSON for {self.model!r}"
                    f" ({error}). Check that base_url points at a compatible API."
                ),
                retryable=True,
            )
        return None

    def broke_off(self, failure: Failure) -> ProviderError:
        """The error for a stream that failed after text reached the caller."""
        return ProviderError(
            f"The reply of {self.model!r} broke off mid-stream: {failure.error} The partial"
            " reply is dropped (a think is taken back); run it again."
        )


def _is_transport_error(error: Exception) -> bool:
    import httpx2

    return isinstance(
        error,
        httpx2.TransportError
        | anyio.EndOfStream
        | anyio.BrokenResourceError
        | ssl.SSLError
        | OSError,
    )


# -- the retry loop --------------------------------------------------------------------------------


@dataclass(slots=True)
class Progress:
    """What one attempt did that the caller can see: text sent to ``on_text``."""

    emitted: bool = False


async def run_with_retries(
    policy: RetryPolicy,
    provider: Provider,
    send: Callable[[Progress], Awaitable[_T]],
    classify: Callable[[Exception], Failure | None],
) -> _T:
    """Run `send` until it succeeds, retrying what `classify` calls retryable.

    A failure after text reached ``on_text`` is not retried: it raises `ProviderError`.
    Cancellation always propagates; an exception `classify` does not know propagates unchanged.
    The SDK's exception is not chained to the error raised, so its request (which holds the
    API key in a header) is not kept alive by it.
    """
    retry = 0
    started = time.perf_counter()
    while True:
        progress = Progress()
        try:
            result = await send(progress)
        except ProviderError:
            raise
        except Exception as exc:
            failure = classify(exc)
            if failure is None:
                raise
        else:
            _log.debug(
                "model.request.finished",
                provider=provider.label,
                model=provider.model,
                retries=retry,
                ms=round((time.perf_counter() - started) * 1000, 1),
            )
            return result
        error = _final_error(policy, provider, failure, progress, retry)
        if error is not None:
            _log.warning(
                "model.request.failed",
                provider=provider.label,
                model=provider.model,
                retries=retry,
                error=f"{type(error).__name__}: {error}",
            )
            raise error
        retry += 1
        delay = policy.delay(retry, failure.retry_after)
        _log.warning(
            "model.request.retry",
            provider=provider.label,
            model=provider.model,
            attempt=retry,
            delay=round(delay, 3),
            error=f"{type(failure.error).__name__}: {failure.error}",
        )
        report_retry(retry, delay, failure.error)
        await anyio.sleep(delay)


def _final_error(
    policy: RetryPolicy, provider: Provider, failure: Failure, progress: Progress, retry: int
) -> ProviderError | None:
    """The error to raise now, or None to retry."""
    if progress.emitted:
        return provider.broke_off(failure)
    if not failure.retryable:
        return failure.error
    if retry >= policy.retries:
        if retry == 0:
            return failure.error
        return type(failure.error)(f"{failure.error} Gave up after {retry + 1} attempts.")
    return None


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
) -> None:
    """Feed each event of `response` to `handle`; text it returns goes to `on_text`.

    The response is read to its end and closed on every path, shielded from cancellation.
    """
    decoder = SSEDecoder()
    try:
        async with contextlib.aclosing(response.aiter_bytes()) as chunks:
            async for chunk in chunks:
                for event in decoder.feed(chunk):
                    _emit(handle(event), on_text, progress)
        for event in decoder.close():
            _emit(handle(event), on_text, progress)
    finally:
        with anyio.CancelScope(shield=True):
            await response.aclose()


def _emit(text: str | None, on_text: TextCallback | None, progress: Progress) -> None:
    if text:
        progress.emitted = True
        if on_text is not None:
            on_text(text)


# -- tool arguments --------------------------------------------------------------------------------


def parse_tool_args(raw: str) -> dict[str, Any]:
    """A tool call's argument text as a dict.

    Empty text means no arguments. Text that is not a JSON object (cut off, malformed, a list)
    gives ``{INVALID_ARGUMENTS: raw}``: the tool's argument check then refuses it with an
    ``input_error`` result the model can read and fix, and the loop goes on.
    """
    if not raw.strip():
        return {}
    try:
        value: object = json.loads(raw)
    except ValueError:
        return {INVALID_ARGUMENTS: raw}
    if isinstance(value, dict):
        return dict(cast("dict[str, Any]", value))
    return {INVALID_ARGUMENTS: raw}
