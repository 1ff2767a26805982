"""The pieces the provider models share: retry policy, Retry-After, error mapping, SSE, args."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime
from typing import Any

import httpx2
import pytest

from orchestrator import AuthError, ContextTooLongError, ProviderError, RateLimitError
from orchestrator.models import OpenAIModel, Price, RetryPolicy

# Private: the pieces both provider models share (retries, SSE, arguments), checked as units.
from orchestrator.models._retry import Provider, Secret, StreamBroken, parse_retry_after
from orchestrator.models._wire import INVALID_ARGUMENTS, SSEDecoder, SSEEvent, parse_tool_args

KEY = "sk-shared-SECRET-42424242"


def provider() -> Provider:
    return Provider("OpenAI", "gpt-x", "https://api.example/v1", "OPENAI_API_KEY", "OpenAIModel")


# -- retry policy ----------------------------------------------------------------------------------


def test_backoff_doubles_with_jitter_and_is_capped() -> None:
    policy = RetryPolicy(base=1, max_delay=5)
    assert [policy.delay(n, rand=lambda: 1.0) for n in (1, 2, 3, 4)] == [1, 2, 4, 5]
    assert [policy.delay(n, rand=lambda: 0.0) for n in (1, 2, 3)] == [0.5, 1, 2]
    assert 0.5 <= policy.delay(1) <= 1


def test_retry_after_wins_up_to_the_cap() -> None:
    policy = RetryPolicy(base=1, max_delay=60)
    assert policy.delay(1, 7) == 7
    assert policy.delay(3, 0) == 0
    assert policy.delay(1, 600) == 60


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"retries": -1}, ValueError),
        ({"retries": 1.5}, ValueError),
        ({"base": -1}, ValueError),
        ({"base": "1"}, TypeError),
        ({"max_delay": float("inf")}, TypeError),
    ],
)
def test_retry_policy_is_checked(options: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error, match="RetryPolicy"):
        RetryPolicy(**options)


def test_parse_retry_after() -> None:
    assert parse_retry_after({"retry-after": "3"}) == 3
    assert parse_retry_after({"retry-after": "1.5"}) == 1.5
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert parse_retry_after({"retry-after-ms": "nope", "retry-after": "2"}) == 2
    assert parse_retry_after({"retry-after": "-4"}) == 0
    assert parse_retry_after({}) is None
    assert parse_retry_after({"retry-after": "soon"}) is None
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    date = "Wed, 01 Jan 2025 12:00:30 GMT"
    assert parse_retry_after({"retry-after": date}, now=now) == 30
    assert parse_retry_after({"retry-after": "Wed, 01 Jan 2025 11:00:00 GMT"}, now=now) == 0
    assert parse_retry_after(httpx2.Headers({"Retry-After": "5"})) == 5


# -- error mapping ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "kind", "retryable"),
    [
        (401, {"error": {"message": "bad key"}}, AuthError, False),
        (403, {"error": {"message": "no access"}}, AuthError, False),
        (429, {"error": {"message": "slow", "code": "rate_limit_exceeded"}}, RateLimitError, True),
        (429, {"error": {"message": "pay", "code": "insufficient_quota"}}, RateLimitError, False),
        (
            400,
            {"error": {"code": "context_length_exceeded", "message": "x"}},
            ContextTooLongError,
            False,
        ),
        (400, {"error": {"message": "prompt is too long: 9 > 8"}}, ContextTooLongError, False),
        (
            400,
            {"error": "the request exceeds the available context size"},
            ContextTooLongError,
            False,
        ),
        (
            413,
            {"error": {"type": "request_too_large", "message": "big"}},
            ContextTooLongError,
            False,
        ),
        (400, {"error": {"message": "bad param"}}, ProviderError, False),
        (404, {"error": {"message": "no such model"}}, ProviderError, False),
        (408, None, ProviderError, True),
        (500, "Internal Server Error", ProviderError, True),
        (502, {"detail": "bad gateway"}, ProviderError, True),
        (529, {"type": "error", "error": {"type": "overloaded_error"}}, ProviderError, True),
    ],
)
def test_status_failure(status: int, body: object, kind: type[Exception], retryable: bool) -> None:
    failure = provider().status_failure(status, body, {"retry-after": "2"}, "req_1")
    assert type(failure.error) is kind
    assert failure.retryable is retryable
    assert failure.retry_after == (2 if retryable else None)
    assert f"HTTP {status}" in str(failure.error)
    assert "req_1" in str(failure.error)


def test_messages_say_what_to_do() -> None:
    auth = str(provider().status_failure(401, {"error": {"message": "x"}}).error)
    assert "Set OPENAI_API_KEY to a valid key, or pass OpenAIModel(..., api_key=...)" in auth
    missing = str(provider().missing_key())
    assert "set the OPENAI_API_KEY environment variable" in missing
    not_found = str(provider().status_failure(404, {}).error)
    assert "Check the model name and base_url" in not_found
    assert "Gpt" not in provider().subject + not_found


def test_the_key_is_redacted_from_error_bodies() -> None:
    secret = provider().with_secret(Secret(KEY))
    body = {"error": {"message": f"Incorrect API key provided: {KEY}"}}
    message = str(secret.status_failure(401, body).error)
    assert KEY not in message
    assert "Incorrect API key provided: ***" in message
    assert KEY not in repr(secret)


def test_secret_never_shows() -> None:
    secret = Secret(KEY)
    assert KEY not in repr(secret)
    assert KEY not in str(secret)
    assert KEY not in f"{secret}"
    assert secret.reveal() == KEY
    with pytest.raises(TypeError, match="not pickled"):
        pickle.dumps(secret)


def test_classify_shared_errors() -> None:
    ended = provider().classify(StreamBroken("ended the stream early"))
    assert ended is not None
    assert ended.retryable
    assert "OpenAI ended the stream early" in str(ended.error)
    event = provider().classify(StreamBroken("sent an error event", status=401, body={}))
    assert event is not None
    assert isinstance(event.error, AuthError)
    dropped = provider().classify(httpx2.ReadError("connection reset"))
    assert dropped is not None
    assert dropped.retryable
    assert "Could not reach OpenAI at https://api.example/v1" in str(dropped.error)
    assert provider().classify(KeyError("a bug of ours")) is None


def test_timeouts_are_retried_and_say_which_wait_ran_out() -> None:
    timed = Provider(
        "OpenAI",
        "gpt-x",
        "https://api.example/v1",
        "OPENAI_API_KEY",
        "OpenAIModel",
        timeout=30,
        connect_timeout=10,
    )
    read = timed.classify(httpx2.ReadTimeout("timed out"))
    assert read is not None
    assert read.retryable
    assert "OpenAI sent nothing for 30 s while answering 'gpt-x' (ReadTimeout)" in str(read.error)
    assert "pass OpenAIModel(..., timeout=...) to wait longer" in str(read.error)
    assert read.cause == "ReadTimeout: nothing arrived for 30 s"
    connect = timed.classify(httpx2.ConnectTimeout("timed out"))
    assert connect is not None
    assert connect.retryable
    assert "Could not connect to OpenAI at https://api.example/v1 within 10 s" in str(connect.error)
    pool = timed.classify(httpx2.PoolTimeout("timed out"))
    assert pool is not None
    assert "timed out after 30 s (PoolTimeout)" in str(pool.error)
    unknown = provider().timeout_failure(TimeoutError())
    assert "timed out after the time allowed (TimeoutError)" in str(unknown.error)


# -- server-sent events ----------------------------------------------------------------------------


def test_sse_decoder_handles_any_chunking() -> None:
    stream = (
        b": a comment\r\n"
        b"event: message_start\r\n"
        b'data: {"a": 1}\r\n\r\n'
        b"data: line one\n"
        b"data:line two\n\n"
        b"event: ping\n\n"
        b"data: [DONE]\n\n"
        b"data: \xc3\xa9t\xc3\xa9"
    )
    expected = [
        SSEEvent("message_start", '{"a": 1}'),
        SSEEvent(None, "line one\nline two"),
        SSEEvent(None, "[DONE]"),
        SSEEvent(None, "été"),
    ]
    for size in (1, 2, 3, 7, len(stream)):
        decoder = SSEDecoder()
        events: list[SSEEvent] = []
        for start in range(0, len(stream), size):
            events += decoder.feed(stream[start : start + size])
        events += decoder.close()
        assert events == expected, size


# -- tool arguments --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "args"),
    [
        ('{"path": "a.py"}', {"path": "a.py"}),
        ("", {}),
        ("  ", {}),
        ('{"path": "a.p', {INVALID_ARGUMENTS: '{"path": "a.p'}),
        ("[1, 2]", {INVALID_ARGUMENTS: "[1, 2]"}),
        ("null", {INVALID_ARGUMENTS: "null"}),
    ],
)
def test_parse_tool_args(raw: str, args: dict[str, Any]) -> None:
    assert parse_tool_args(raw) == args


# -- price and settings ----------------------------------------------------------------------------


def test_price_cost() -> None:
    price = Price(input=3, output=15, cache_read=0.3, cache_write=3.75)
    cost = price.cost(
        input_tokens=1_000_000, output_tokens=1_000, cache_read_tokens=500_000, cache_write_tokens=0
    )
    assert cost == pytest.approx(500_000 * 3e-6 + 500_000 * 0.3e-6 + 1_000 * 15e-6)
    plain = Price(input=1, output=2)
    assert plain.cost(input_tokens=10, output_tokens=10, cache_read_tokens=4) == pytest.approx(
        30e-6
    )


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"input": -1, "output": 1}, ValueError),
        ({"input": True, "output": 1}, TypeError),
        ({"input": 1, "output": "2"}, TypeError),
        ({"input": 1, "output": 1, "cache_read": float("nan")}, ValueError),
    ],
)
def test_price_is_checked(options: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error, match="Price"):
        Price(**options)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"name": ""}, ValueError, "model name"),
        ({"base_url": "localhost:8000"}, ValueError, "http:// or https://"),
        ({"api_key": ""}, TypeError, "api_key"),
        ({"price": 3}, TypeError, r"Price\(input=..., output=...\)"),
        ({"context_window": 0}, ValueError, "context_window"),
        ({"max_tokens": "many"}, ValueError, "max_tokens"),
        ({"temperature": "hot"}, TypeError, "temperature"),
        ({"params": {"messages": []}}, ValueError, "may not set"),
        ({"params": ["seed"]}, TypeError, "params"),
        ({"headers": {"X-A": 1}}, TypeError, "headers"),
        ({"retry": 3}, TypeError, "RetryPolicy"),
    ],
)
def test_settings_are_checked(options: dict[str, Any], error: type[Exception], match: str) -> None:
    settings: dict[str, Any] = {"name": "gpt-x", **options}
    with pytest.raises(error, match=match):
        OpenAIModel(**settings)


def test_model_properties_and_repr() -> None:
    price = Price(input=1, output=2)
    model = OpenAIModel(
        "m", base_url="http://localhost:8000/v1/", api_key=KEY, price=price, context_window=8192
    )
    assert model.name == "m"
    assert model.context_window == 8192
    assert model.base_url == "http://localhost:8000/v1"
    assert model.price is price
    assert model.retry == RetryPolicy()
    assert repr(model) == "OpenAIModel('m', base_url='http://localhost:8000/v1')"
    assert KEY not in repr(model)
    with pytest.raises(AttributeError):
        model.__dict__  # noqa: B018 - slots only: the key is not in a __dict__ either
