"""The provider models against LLMock, a third-party mock of the provider APIs.

`OpenAIModel` (Chat Completions), `OpenAIResponsesModel` (LLMock's Responses router) and
`AnthropicModel` run the same tests.

LLMock (``llmock`` on PyPI) scripts replies, tool calls, HTTP errors in each provider's own
format, and stream faults; see `tests.models._llmock`. These tests run the same behaviour our own
fake server checks, against someone else's reading of the wire.
"""

from __future__ import annotations

from typing import Any, Literal

import pydantic
import pytest

from orchestrator import (
    Agent,
    AuthError,
    ContextTooLongError,
    Message,
    PromptEntry,
    ProviderError,
    RateLimitError,
    State,
    tool,
)
from orchestrator.models import AnthropicModel, OpenAIModel, OpenAIResponsesModel, RetryPolicy
from tests.doubles import FAST_RETRY, StreamRecorder
from tests.models._llmock import LLMock

KEY = "sk-llmock-SECRET-5a5a5a5a"
PROVIDERS = ("openai", "openai-responses", "anthropic")
Provider = Literal["openai", "openai-responses", "anthropic"]
# How many stream events each wire sends before the first text: OpenAI's role chunk;
# Anthropic's message_start, an empty text block and a ping; the Responses API's
# response.created, response.in_progress, the message item and its empty text part.
BEFORE_TEXT = {"openai": 1, "anthropic": 3, "openai-responses": 4}


def build(mockapi: LLMock, provider: Provider, **options: Any) -> Any:
    settings: dict[str, Any] = {"api_key": KEY, "retry": FAST_RETRY, **options}
    if provider == "openai":
        return OpenAIModel("gpt-4o", base_url=mockapi.base_url("openai"), **settings)
    if provider == "openai-responses":
        return OpenAIResponsesModel("gpt-4o", base_url=mockapi.base_url("openai"), **settings)
    return AnthropicModel("claude-sonnet-4-5", base_url=mockapi.base_url("anthropic"), **settings)


def reply(text: str, **fields: Any) -> dict[str, Any]:
    return {"type": "reply", "text": text, **fields}


def fault(kind: str, after_chunks: int, **fields: Any) -> dict[str, Any]:
    return {"type": "stream_fault", "kind": kind, "after_chunks": after_chunks, **fields}


ran: list[tuple[str, int]] = []


@tool
def weather(city: str, days: int) -> str:
    """Tell the weather.

    Args:
        city: Where.
        days: How many days ahead.
    """
    ran.append((city, days))
    return f"Sunny in {city} for {days} days."


# -- tool calls ------------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.anyio
async def test_a_tool_loop_over_each_wire(mockapi: LLMock, provider: Provider) -> None:
    ran.clear()
    call = {"name": "weather", "arguments": {"city": "Paris", "days": 2}}
    await mockapi.script(
        reply("Let me check.", tool_calls=[call]), reply("It will be sunny in Paris.")
    )
    reporter = StreamRecorder()
    agent = Agent(build(mockapi, provider), tools=[weather], reporter=reporter)
    state = State(messages=[Message.user("Weather in Paris for two days?")])
    assert await agent.arun(state) == "It will be sunny in Paris."

    assert ran == [("Paris", 2)]
    [call_made] = state.messages[1].tool_calls
    assert (call_made.name, dict(call_made.args)) == ("weather", {"city": "Paris", "days": 2})
    assert "".join(reporter.text) == "Let me check.It will be sunny in Paris."
    first, second = await mockapi.requests()
    assert first["status"] == second["status"] == 200
    if provider == "openai-responses":
        assert first["path"] == second["path"] == "/v1/responses"
        assert second["body"]["input"][-2:] == [
            {
                "type": "function_call",
                "call_id": call_made.id,
                "name": "weather",
                "arguments": '{"city": "Paris", "days": 2}',
            },
            {
                "type": "function_call_output",
                "call_id": call_made.id,
                "output": "Sunny in Paris for 2 days.",
            },
        ]
        assert state.usage.requests == 2
        return
    messages = second["body"]["messages"]
    if provider == "openai":
        assert messages[-1] == {
            "role": "tool",
            "tool_call_id": call_made.id,
            "content": "Sunny in Paris for 2 days.",
        }
    else:
        [result] = messages[-1]["content"]
        assert result["type"] == "tool_result"
        assert result["tool_use_id"] == call_made.id
        assert result["content"][0]["text"] == "Sunny in Paris for 2 days."
    assert state.usage.requests == 2


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.anyio
async def test_malformed_tool_arguments_reach_the_model_as_an_input_error(
    mockapi: LLMock, provider: Provider
) -> None:
    ran.clear()
    call = {"name": "weather", "arguments": {"city": "Paris", "days": 2}}
    await mockapi.script(
        reply("", tool_calls=[call]),
        {"type": "tool_fault", "kind": "malformed_arguments"},
        reply("Sorry, let me fix that."),
    )
    agent = Agent(build(mockapi, provider), tools=[weather])
    state = State(messages=[Message.user("Weather in Paris?")])
    assert await agent.arun(state) == "Sorry, let me fix that."
    assert ran == []
    [entry] = [entry for entry in state.history if entry.kind == "tool_result"]
    assert entry.outcome == "input_error"  # pyright: ignore[reportAttributeAccessIssue]


# -- HTTP errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.anyio
async def test_a_rate_limit_is_retried_after_what_the_server_asks(
    mockapi: LLMock, provider: Provider
) -> None:
    await mockapi.script({"type": "fail", "status": 429, "retry_after": 0}, reply("ok"))
    reporter = StreamRecorder()
    agent = Agent(build(mockapi, provider), reporter=reporter)
    reply_ = await agent.athink(State(messages=[Message.user("Hi")]))
    assert reply_.message.text == "ok"
    [(attempt, delay, error)] = reporter.retries
    assert (attempt, delay) == (1, 0.0)
    assert isinstance(error, RateLimitError)
    assert [request["status"] for request in await mockapi.requests()] == [429, 200]


@pytest.mark.parametrize(
    ("provider", "status"),
    [("openai", 500), ("openai", 503), ("openai-responses", 500), ("anthropic", 529)],
)
@pytest.mark.anyio
async def test_server_errors_are_retried(mockapi: LLMock, provider: Provider, status: int) -> None:
    await mockapi.script({"type": "fail", "status": status, "times": 2}, reply("fine"))
    model = build(mockapi, provider)
    state = State(messages=[Message.user("Hi")])
    assert (await Agent(model).athink(state)).message.text == "fine"
    assert [request["status"] for request in await mockapi.requests()] == [status, status, 200]


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.anyio
async def test_errors_that_a_retry_cannot_fix(mockapi: LLMock, provider: Provider) -> None:
    await mockapi.script(
        {"type": "fail", "status": 401},
        {"type": "fail", "status": 400, "message": "prompt is too long: 300000 tokens > 200000"},
    )
    agent = Agent(build(mockapi, provider))
    state = State(messages=[Message.user("Hi")])
    with pytest.raises(AuthError, match="refused the API key") as caught:
        await agent.athink(state)
    assert KEY not in str(caught.value)
    with pytest.raises(ContextTooLongError, match=r"agent\.compact\(state\)"):
        await agent.athink(state)
    assert [request["status"] for request in await mockapi.requests()] == [401, 400]
    assert state.messages == (Message.user("Hi"),)


# -- stream faults ---------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.anyio
async def test_a_stream_that_ends_early_before_any_text_is_retried(
    mockapi: LLMock, provider: Provider
) -> None:
    # LLMock's "truncate" ends the HTTP response cleanly, with no finish reason: only the
    # missing end of the reply tells it apart from a whole one.
    await mockapi.script(fault("truncate", 1), reply("Hello world", times=2))
    model = build(mockapi, provider)
    state = State(messages=[Message.user("Hi")])
    reporter = StreamRecorder()
    assert (await Agent(model, reporter=reporter).athink(state)).message.text == "Hello world"
    assert "".join(reporter.text) == "Hello world"
    faults = [request["fault"] for request in await mockapi.requests()]
    assert faults == ["stream:truncate@1", None]


# Our reader stops at the corrupted chunk; httpx2 then leaves one inner async generator to the
# garbage collector (see test_anthropic.test_on_text_errors_propagate), and trio warns while it
# finalizes it. The response itself is closed: only that warning is let through here.
@pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning")
@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.anyio
async def test_a_corrupted_chunk_before_any_text_is_retried(
    mockapi: LLMock, provider: Provider
) -> None:
    await mockapi.script(fault("malformed", 0), reply("Hello world", times=2))
    reporter = StreamRecorder()
    agent = Agent(build(mockapi, provider), reporter=reporter)
    reply_ = await agent.athink(State(messages=[Message.user("Hi")]))
    assert reply_.message.text == "Hello world"
    [(_, _, error)] = reporter.retries
    assert "not JSON" in str(error)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.anyio
async def test_a_connection_dropped_after_text_is_not_retried(
    mockapi: LLMock, provider: Provider
) -> None:
    # What each wire sends before its first text, "Hello ", then the drop.
    after = BEFORE_TEXT[provider] + 1
    await mockapi.script(fault("disconnect", after), reply("Hello world", times=2))
    reporter = StreamRecorder()
    agent = Agent(build(mockapi, provider), reporter=reporter)
    state = State(messages=[Message.user("Hi")])
    with pytest.raises(ProviderError, match="broke off mid-stream"):
        await agent.athink(state)
    assert reporter.text == ["Hello "]
    assert reporter.retries == []
    assert len(await mockapi.requests()) == 1
    assert state.messages == (Message.user("Hi"),)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.anyio
async def test_a_connection_dropped_before_any_text_is_retried(
    mockapi: LLMock, provider: Provider
) -> None:
    # Issue 12, item 7: the drop comes after what each wire sends before its first text,
    # which shows nothing yet.
    after = BEFORE_TEXT[provider]
    await mockapi.script(fault("disconnect", after), reply("Hello world", times=2))
    reporter = StreamRecorder()
    agent = Agent(build(mockapi, provider), reporter=reporter)
    reply_ = await agent.athink(State(messages=[Message.user("Hi")]))
    assert reply_.message.text == "Hello world"
    assert reporter.text == ["Hello ", "world"]
    [(attempt, _, error)] = reporter.retries
    assert attempt == 1
    assert isinstance(error, ProviderError)
    requests = await mockapi.requests()
    assert [request["fault"] for request in requests] == [f"stream:disconnect@{after}", None]


# -- timeouts --------------------------------------------------------------------------------------
# A test whose healthy attempt must read within the timeout uses 1 s, so a busy machine does not
# turn a slow healthy read into one more timeout; where every attempt stalls, 0.5 s.


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.anyio
async def test_a_stream_stalled_before_any_text_times_out_and_is_retried(
    mockapi: LLMock, provider: Provider
) -> None:
    # Issue 12, item 7: a timeout before anything visible arrived is retried like a dropped
    # connection. LLMock holds the stream for a minute after the first chunks.
    after = BEFORE_TEXT[provider]
    await mockapi.script(fault("stall", after, stall_seconds=60), reply("Hello world", times=2))
    reporter = StreamRecorder()
    agent = Agent(build(mockapi, provider, timeout=1.0), reporter=reporter)
    reply_ = await agent.athink(State(messages=[Message.user("Hi")]))
    assert reply_.message.text == "Hello world"
    assert reporter.text == ["Hello ", "world"]
    [(attempt, _, error)] = reporter.retries
    assert attempt == 1
    assert "sent nothing for 1 s" in str(error)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.anyio
async def test_a_server_that_never_answers_times_out_after_the_retries(
    mockapi: LLMock, provider: Provider
) -> None:
    await mockapi.script({"type": "delay", "seconds": 60, "times": 3})
    policy = RetryPolicy(retries=2, base=0.001, max_delay=0.01)
    model = build(mockapi, provider, timeout=0.5, retry=policy)
    reporter = StreamRecorder()
    state = State(messages=[Message.user("Hi")])
    with pytest.raises(ProviderError, match=r"sent nothing for 0\.5 s.*Gave up after 3 attempts"):
        await Agent(model, reporter=reporter).athink(state)
    assert [attempt for attempt, _, _ in reporter.retries] == [1, 2]
    assert state.messages == (Message.user("Hi"),)


# -- keys and names --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_anthropic_at_a_custom_base_url_needs_no_key(mockapi: LLMock) -> None:
    # Issue 12, item 7: like OpenAIModel, a custom base_url with no key set gets a placeholder
    # (LLMock takes any key), and errors name the server at its URL, not Anthropic.
    url = mockapi.base_url("anthropic")
    model = AnthropicModel("claude-sonnet-4-5", base_url=url, retry=FAST_RETRY)
    await mockapi.script(reply("Hello world"))
    state = State(messages=[Message.user("Hi")])
    assert (await Agent(model).athink(state)).message.text == "Hello world"
    # An error behaviour goes first, whatever the order it was queued in: queued only now.
    await mockapi.script({"type": "fail", "status": 401})
    with pytest.raises(AuthError) as caught:
        await Agent(model).athink(state)
    message = str(caught.value)
    assert message.startswith(f"The Anthropic-compatible server at {url} refused the API key")
    assert "Set ANTHROPIC_API_KEY to a valid key" in message


# -- the Responses API -----------------------------------------------------------------------------


class Forecast(pydantic.BaseModel):
    """A forecast."""

    city: str
    celsius: int


@pytest.mark.anyio
async def test_a_structured_answer_over_the_responses_api(mockapi: LLMock) -> None:
    await mockapi.script(reply('{"city": "Paris", "celsius": 21}'))
    model = build(mockapi, "openai-responses", max_tokens=300, params={"reasoning": {"x": 1}})
    state = State(messages=[Message.user("Plan a trip to Paris.")])
    answer = await Agent(model).aask(state, "The forecast?", Forecast)
    assert answer == Forecast(city="Paris", celsius=21)
    [prompt] = [entry.content for entry in state.history if isinstance(entry, PromptEntry)]
    assert dict(prompt.options) == model.options
    assert model.options["max_output_tokens"] == 300
    [request] = await mockapi.requests()
    assert request["path"] == "/v1/responses"
    assert request["body"]["store"] is False
    assert "matches this JSON schema" in request["body"]["input"][-1]["content"][0]["text"]
