"""Model wrappers tell the options of the model they wrap, so a run records them.

`RateLimited` forwards its model's options; `FallbackModel` gives its first model's (a prompt
is recorded before the request, when which model answers is not known yet).
"""

from __future__ import annotations

import pytest

from orchestrator import Agent, AskEntry, Message, PromptEntry, State
from orchestrator.models import (
    AnthropicModel,
    FallbackModel,
    ModelWithOptions,
    OpenAIModel,
    RateLimit,
    RateLimited,
    RetryPolicy,
)
from orchestrator.testing import FakeModel
from tests.models._llmock import LLMock

KEY = "sk-llmock-SECRET-5a5a5a5a"
NO_RETRY = RetryPolicy(retries=0)


def openai(mockapi: LLMock) -> OpenAIModel:
    return OpenAIModel(
        "gpt-4o",
        base_url=mockapi.base_url("openai"),
        api_key=KEY,
        temperature=0.2,
        max_tokens=300,
        retry=NO_RETRY,
    )


def recorded_options(state: State) -> list[dict[str, object]]:
    prompts = [entry.content for entry in state.history if isinstance(entry, PromptEntry)]
    return [dict(prompt.options) for prompt in prompts]


@pytest.mark.anyio
async def test_a_rate_limited_provider_model_records_its_options(mockapi: LLMock) -> None:
    await mockapi.script({"type": "reply", "text": "Hi."}, {"type": "reply", "text": "A greeting."})
    inner = openai(mockapi)
    model = RateLimited(inner, RateLimit(requests_per_minute=6000))
    assert isinstance(model, ModelWithOptions)
    assert model.options == inner.options
    assert inner.options["temperature"] == 0.2
    agent = Agent(model, instructions="Be brief.")
    state = State(messages=[Message.user("Hi")])
    assert await agent.arun(state) == "Hi."
    assert await agent.aask(state, "What was that?") == "A greeting."
    # The turn and the ask sent the same (no tools): one prompt, with the wrapped options.
    assert recorded_options(state) == [inner.options]
    ask = next(entry for entry in state.history if isinstance(entry, AskEntry))
    prompt = state.prompt_of(ask)
    assert prompt is not None
    assert prompt.options == inner.options


@pytest.mark.anyio
async def test_a_fallback_records_its_first_models_options(mockapi: LLMock) -> None:
    # The primary fails, the secondary answers: the prompt was recorded with the primary's.
    await mockapi.script(
        {"type": "fail", "status": 500, "times": 1, "retry_after": 0},
        {"type": "reply", "text": "From the secondary."},
    )
    primary = openai(mockapi)
    secondary = AnthropicModel(
        "claude-sonnet-4-5", base_url=mockapi.base_url("anthropic"), api_key=KEY
    )
    model = FallbackModel([primary, secondary])
    assert model.options == primary.options != secondary.options
    state = State(messages=[Message.user("Hi")])
    assert await Agent(model).arun(state) == "From the secondary."
    assert recorded_options(state) == [primary.options]


def test_wrappers_of_a_model_without_options_tell_none() -> None:
    plain = FakeModel(["hi"])
    assert RateLimited(plain, RateLimit(requests_per_minute=60)).options == {}
    assert FallbackModel([plain, FakeModel(["spare"])]).options == {}
    options = RateLimited(FallbackModel([plain]), RateLimit(requests_per_minute=60)).options
    assert options == {}
