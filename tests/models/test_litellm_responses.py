"""`OpenAIResponsesModel` through LiteLLM's real proxy, its ``/v1/responses`` endpoint.

The proxy (``litellm[proxy]``, started on 127.0.0.1 by `tests.models._litellm`) routes the model
to an upstream that speaks the Responses API: our scripted server, which replies with encrypted
reasoning items before a tool call and an answer. The test reads what the upstream received on
the tool loop's second request: the first reply's reasoning item, whole, in its place, after
the round trip through someone else's reading of the API.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

from orchestrator import Agent, Message, RawBlock, State, ToolCall, tool
from orchestrator.models import OpenAIResponsesModel
from tests.doubles import FAST_RETRY
from tests.models._litellm import MASTER_KEY, LiteLLMProxy, run_litellm
from tests.models._server import ScriptedServer, serve
from tests.models.wire_responses import (
    call_item,
    completed,
    message_item,
    reasoning_item,
    reply,
)

pytestmark = pytest.mark.timeout(180)  # the first test also waits for the proxy to start

MODEL = "gpt-reasoner"


@pytest.fixture(scope="module")
def upstream_server() -> Generator[ScriptedServer]:
    """One Responses API scripted server for the module, behind the proxy."""
    with serve() as running:
        yield running


@pytest.fixture(scope="module")
def proxy(upstream_server: ScriptedServer) -> Generator[LiteLLMProxy]:
    """One LiteLLM proxy for the module, routing `MODEL` to the upstream as OpenAI."""
    with run_litellm({MODEL: (f"openai/{MODEL}", upstream_server.url + "/v1")}) as running:
        yield running


@pytest.fixture
def upstream(upstream_server: ScriptedServer) -> ScriptedServer:
    """The upstream, with no requests and no responses left from other tests."""
    upstream_server.reset()
    return upstream_server


@tool
def weather(city: str) -> str:
    """Tell the weather in a city."""
    return f"Sunny in {city}."


@pytest.mark.anyio
async def test_reasoning_items_round_trip_through_the_proxy(
    proxy: LiteLLMProxy, upstream: ScriptedServer
) -> None:
    first = reasoning_item("rs_1", "gAAAA-first", "Need the weather.")
    second = reasoning_item("rs_2", "gAAAA-second")
    upstream.push(
        reply(first, call_item("call_w", "weather", '{"city": "Paris"}')),
        reply(second, message_item("Sunny in Paris."), end=completed(40, 9, cached=8, reasoning=6)),
    )
    model = OpenAIResponsesModel(
        MODEL, base_url=f"{proxy.url}/v1", api_key=MASTER_KEY, retry=FAST_RETRY
    )
    state = State(messages=[Message.user("Weather in Paris?")])
    assert await Agent(model, tools=[weather]).arun(state) == "Sunny in Paris."

    kept = f"openai-responses@{proxy.url}/v1"
    assert state.messages[1].content[1:] == (
        RawBlock(kept, first),
        ToolCall("call_w", "weather", {"city": "Paris"}),
    )
    assert RawBlock(kept, second) in state.messages[3].content
    assert state.usage.reasoning_tokens == 6
    assert state.usage.cache_read_tokens == 8

    asked = [request.body for request in upstream.requests if request.path == "/v1/responses"]
    assert len(asked) == 2
    assert asked[1]["store"] is False
    assert asked[1]["include"] == ["reasoning.encrypted_content"]
    assert asked[1]["input"][1:] == [
        first,
        {
            "type": "function_call",
            "call_id": "call_w",
            "name": "weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_w", "output": "Sunny in Paris."},
    ]
