"""Retries and error mapping, written once for `OpenAIModel` and `AnthropicModel`.

- `RetryPolicy` and `run_with_retries`: exponential backoff with jitter that honours
  ``Retry-After``, on 429, 5xx, connection errors and timeouts, until something visible arrived
  (text sent to the caller, or a tool call); each retry is reported (`report_retry`) and logged.
- `Provider`: turns an HTTP status, a provider error body, a timeout or a broken connection into
  `ProviderError`, `RateLimitError`, `AuthError` or `ContextTooLongError`, with a message that
  says what to do and never holds the API key (`Secret`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import email.utils
import json
import math
import random
import re
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

import anyio

from .._apps._reporting import report_retry
from .._base._errors import AuthError, ContextTooLongError, ProviderError, RateLimitError
from .._base._logs import get_log

__all__ = (
    "Failure",
    "Progress",
    "Provider",
    "RetryPolicy",
    "Secret",
    "StreamBroken",
    "parse_retry_after",
    "run_with_retries",
)

_T = TypeVar("_T")
_log = get_log("models")

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

    Retried: rate limits (429), server errors (5xx, 408, 409) and connection errors.
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


# -- secrets ---------------------------------------------------------------------------------------


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
    cause: str = ""


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
    """Who a request goes to, for error messages: the provider, the model, where, which key.

    `label` is the provider's name (``"OpenAI"``); `official` says whether `url` is its own API.
    Errors about any other server name it as ``the OpenAI-compatible server at <url>``, so a
    message never blames the provider for what a proxy or a local server did.
    """

    label: str
    model: str
    url: str
    key_env: str
    owner: str
    secret: Secret | None = field(default=None, repr=False)
    official: bool = True
    timeout: float | None = None
    connect_timeout: float | None = None

    @property
    def name(self) -> str:
        """Who answers, as errors name it: ``"Anthropic"``, or the compatible server at its URL."""
        return self.label if self.official else f"the {self.label}-compatible server at {self.url}"

    @property
    def subject(self) -> str:
        """The name, capitalized to start a sentence."""
        return _capital(self.name)

    @property
    def located(self) -> str:
        """The name with where it is: ``"Anthropic at https://…"``, or a compatible server's."""
        return f"{self.label} at {self.url}" if self.official else self.name

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
            f"No API key for {self.name} (model {self.model!r}): set the {self.key_env}"
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
                    f"{self.subject} refused the API key for {model} ({detail}). Set {self.key_env}"
                    f" to a valid key, or pass {self.owner}(..., api_key=...)."
                )
            )
        if status == 403:
            return Failure(
                AuthError(
                    f"{self.subject} denied access to {model} ({detail}). Check that the key in"
                    f" {self.key_env} (or api_key=) may use this model."
                )
            )
        if status == 429 and codes & _QUOTA_CODES:
            return Failure(
                RateLimitError(
                    f"{self.subject} says the account is out of quota ({detail}). Check the plan"
                    " and billing: retrying will not help."
                )
            )
        if status == 429:
            return Failure(
                RateLimitError(
                    f"{self.subject} rate-limited the request to {model} ({detail}). Lower the load"
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
                    f"{_capital(self.located)} has no model {model} ({detail})."
                    " Check the model name and base_url."
                )
            )
        if status >= 500 or status in _RETRY_STATUSES:
            return Failure(
                ProviderError(f"{self.subject} failed to answer for {model} ({detail})."),
                retryable=True,
                retry_after=retry_after,
            )
        return Failure(
            ProviderError(
                f"{self.subject} rejected the request for {model} ({detail}). Check the model's"
                " options (params=...) and the conversation it was sent."
            )
        )

    def connection_failure(self, error: BaseException) -> Failure:
        """Map a connection error or timeout to a retryable `ProviderError`."""
        cause = f"{type(error).__name__}: {self.redact(str(error) or 'no detail')}"
        return Failure(
            ProviderError(
                f"Could not reach {self.located} for {self.model!r} ({cause})."
                " Check the network and base_url."
            ),
            retryable=True,
            cause=cause,
        )

    def timeout_failure(self, error: BaseException) -> Failure:
        """Map a timeout to a retryable `ProviderError` that names the wait and how to change it.

        `error` is the HTTP client's timeout (``httpx2.ConnectTimeout``, ``ReadTimeout``, …), or
        the SDK's wrapper when it has no such cause.
        """
        import httpx2

        name = type(error).__name__
        longer = f"pass {self.owner}(..., timeout=...) to wait longer"
        if isinstance(error, httpx2.ConnectTimeout):
            wait = _seconds(self.connect_timeout)
            cause = f"{name}: no connection within {wait}"
            message = (
                f"Could not connect to {self.located} within {wait} for"
                f" {self.model!r} ({name}). Check the network and base_url."
            )
        elif isinstance(error, httpx2.ReadTimeout):
            wait = _seconds(self.timeout)
            cause = f"{name}: nothing arrived for {wait}"
            message = (
                f"{self.subject} sent nothing for {wait} while answering {self.model!r} ({name})."
                f" It may be stalled or overloaded; if it is only slow, {longer}."
            )
        else:
            wait = _seconds(self.timeout)
            cause = f"{name}: timed out after {wait}"
            message = (
                f"The request to {self.name} for {self.model!r} timed out after {wait}"
                f" ({name}). Check the network and base_url, or {longer}."
            )
        return Failure(ProviderError(message), retryable=True, cause=cause)

    def classify(self, error: Exception) -> Failure | None:
        """Map the errors every provider shares: broken streams, timeouts, transport errors.

        Returns None for anything else, which then propagates unchanged.
        """
        if isinstance(error, StreamBroken):
            if error.status is not None:
                return self.status_failure(error.status, error.body)
            return Failure(
                ProviderError(f"{self.subject} {self.redact(str(error))} (model {self.model!r})."),
                retryable=True,
            )
        if _is_timeout(error):
            return self.timeout_failure(error)
        if _is_transport_error(error):
            return self.connection_failure(error)
        if isinstance(error, json.JSONDecodeError):
            return Failure(
                ProviderError(
                    f"{self.subject} sent a stream event that is not JSON for {self.model!r}"
                    f" ({error}). Check that base_url points at a compatible API."
                ),
                retryable=True,
            )
        return None

    def broke_off(self, failure: Failure) -> ProviderError:
        """The error for a stream that failed after something visible reached the caller."""
        return ProviderError(
            f"The reply of {self.model!r} from {self.name} broke off mid-stream"
            f" ({failure.cause or failure.error}). The partial reply is dropped (a think is"
            " taken back): run it again."
        )


def _capital(text: str) -> str:
    """`text` with its first letter capitalized, to start a sentence."""
    return text[:1].upper() + text[1:]


def _seconds(timeout: float | None) -> str:
    """A timeout as text: ``"0.5 s"``, or ``"the time allowed"`` when it is not known."""
    return "the time allowed" if timeout is None else f"{timeout:g} s"


def _is_timeout(error: Exception) -> bool:
    import httpx2

    return isinstance(error, httpx2.TimeoutException)


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
    """What one attempt did that the caller can see: text sent to ``on_text``, or a tool call."""

    emitted: bool = False


async def run_with_retries(
    policy: RetryPolicy,
    provider: Provider,
    send: Callable[[Progress], Awaitable[_T]],
    classify: Callable[[Exception], Failure | None],
) -> _T:
    """Run `send` until it succeeds, retrying what `classify` calls retryable.

    A failure after something visible arrived (text sent to ``on_text``, or a tool call) is not
    retried: it raises `ProviderError`.
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
                provider=provider.name,
                model=provider.model,
                retries=retry,
                ms=round((time.perf_counter() - started) * 1000, 1),
            )
            return result
        error = _final_error(policy, provider, failure, progress, retry)
        if error is not None:
            _log.warning(
                "model.request.failed",
                provider=provider.name,
                model=provider.model,
                retries=retry,
                error=f"{type(error).__name__}: {error}",
            )
            raise error
        retry += 1
        delay = policy.delay(retry, failure.retry_after)
        _log.warning(
            "model.request.retry",
            provider=provider.name,
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
