"""`FallbackModel`: the next model answers when one fails before anything visible streamed.

Against LLMock (a third-party mock of the provider APIs) answering 500 and 429, and against
models of our own that fail in the ways a provider model can.
"""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator import (
    Agent,
    Message,
    ModelReplyEntry,
    ProviderError,
    RateLimitError,
    Reply,
    State,
)
from orchestrator.models import (
    AnthropicModel,
    FallbackModel,
    OpenAIModel,
    Request,
    RetryPolicy,
    TextCallback,
)
from orchestrator.testing import FakeModel
from tests.models._llmock import LLMock

KEY = "sk-llmock-SECRET-5a5a5a5a"
ONE_RETRY = RetryPolicy(retries=1, base=0.001, max_delay=0.01)


def reply_models(state: State) -> list[str | None]:
    """The model each recorded reply of `state` names."""
    return [entry.content.model for entry in state.history if isinstance(entry, ModelReplyEntry)]


@pytest.mark.parametrize("status", [500, 429])
@pytest.mark.anyio
async def test_a_failing_provider_falls_back_to_the_next(mockapi: LLMock, status: int) -> None:
    # The primary's two attempts (one retry) fail; the secondary, another provider, answers.
    await mockapi.script(
        {"type": "fail", "status": status, "times": 2, "retry_after": 0},
        {"type": "reply", "text": "From the secondary."},
    )
    primary = OpenAIModel(
        "gpt-4o", base_url=mockapi.base_url("openai"), api_key=KEY, retry=ONE_RETRY
    )
    secondary = AnthropicModel(
        "claude-sonnet-4-5", base_url=mockapi.base_url("anthropic"), api_key=KEY
    )
    state = State(messages=[Message.user("Hi")])
    agent = Agent(FallbackModel([primary, secondary]))
    assert await agent.arun(state) == "From the secondary."
    requests = await mockapi.requests()
    assert [request["status"] for request in requests] == [status, status, 200]
    assert ["anthropic" in request["path"] for request in requests] == [False, False, True]
    [answered] = reply_models(state)
    assert str(answered).startswith("claude")


@pytest.mark.anyio
async def test_the_primary_answers_when_it_can(mockapi: LLMock) -> None:
    await mockapi.script({"type": "reply", "text": "From the primary."})
    primary = OpenAIModel("gpt-4o", base_url=mockapi.base_url("openai"), api_key=KEY)
    model = FallbackModel([primary, FakeModel(["never"], name="spare")])
    state = State(messages=[Message.user("Hi")])
    assert await Agent(model).arun(state) == "From the primary."
    assert reply_models(state) == ["gpt-4o"]
    assert len(await mockapi.requests()) == 1


class Failing:
    """A model that streams `text` (if any), then raises `error`."""

    def __init__(self, name: str, error: BaseException, text: str = "") -> None:
        self.name = name
        self.context_window: int | None = 1000
        self.error = error
        self.text = text
        self.asked = 0

    async def respond(self, request: Request, *, on_text: TextCallback | None = None) -> Reply:
        self.asked += 1
        if self.text and on_text is not None:
            on_text(self.text)
        raise self.error


@pytest.mark.parametrize(
    "error", [ProviderError("down"), RateLimitError("busy"), TimeoutError("slow")]
)
@pytest.mark.anyio
async def test_errors_before_anything_streamed_fall_back(error: BaseException) -> None:
    first = Failing("first", error)
    model = FallbackModel([first, FakeModel(["Spare answer."], name="spare")])
    state = State(messages=[Message.user("Hi")])
    assert await Agent(model).arun(state) == "Spare answer."
    assert first.asked == 1
    assert reply_models(state) == ["spare"]


@pytest.mark.anyio
async def test_a_failure_after_text_streamed_is_raised() -> None:
    spare = FakeModel(["never"], name="spare")
    model = FallbackModel([Failing("first", ProviderError("broke off"), text="Hal"), spare])
    seen: list[str] = []
    request = Request(system=None, messages=(Message.user("Hi"),))
    with pytest.raises(ProviderError, match="broke off"):
        await model.respond(request, on_text=seen.append)
    assert seen == ["Hal"]
    assert spare.requests == []


@pytest.mark.anyio
async def test_other_errors_are_not_fallen_back_on() -> None:
    spare = FakeModel(["never"], name="spare")
    model = FallbackModel([Failing("first", ValueError("a bug")), spare])
    with pytest.raises(ValueError, match="a bug"):
        await model.respond(Request(system=None, messages=(Message.user("Hi"),)))
    assert spare.requests == []


@pytest.mark.anyio
async def test_when_every_model_fails_the_error_names_each() -> None:
    model = FallbackModel(
        [Failing("first", ProviderError("down")), Failing("second", RateLimitError("busy"))]
    )
    with pytest.raises(RateLimitError) as raised:
        await model.respond(Request(system=None, messages=(Message.user("Hi"),)))
    assert str(raised.value) == (
        "Every model of FallbackModel failed: first: ProviderError: down;"
        " second: RateLimitError: busy"
    )


@pytest.mark.anyio
async def test_one_model_fails_as_itself() -> None:
    error = ProviderError("down")
    with pytest.raises(ProviderError) as raised:
        await FallbackModel([Failing("only", error)]).respond(
            Request(system=None, messages=(Message.user("Hi"),))
        )
    assert raised.value is error


def test_it_names_its_first_model_and_the_smallest_window() -> None:
    model = FallbackModel([Failing("first", ProviderError("x")), FakeModel([], name="spare")])
    assert model.name == "first"
    assert model.context_window == 1000
    assert [m.name for m in model.models] == ["first", "spare"]
    assert repr(model).startswith("FallbackModel([")


@pytest.mark.parametrize(
    ("models", "error", "match"),
    [
        ([], ValueError, "non-empty list"),
        ("openai:gpt-4o", ValueError, "non-empty list"),
        ([object()], TypeError, "takes a Model"),
        (["nope"], ValueError, "provider:model"),
    ],
)
def test_bad_models_say_how_to_fix_them(models: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        FallbackModel(models)
