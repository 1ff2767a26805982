"""Both provider models through LiteLLM's real proxy, in front of an Anthropic-compatible server.

Issue 26, item 11: Claude's thinking must survive LiteLLM's OpenAI endpoint. The proxy
(``litellm[proxy]``, started on 127.0.0.1 by `tests.models._litellm`) turns Claude's thinking
into ``reasoning_content`` and ``thinking_blocks`` on its Chat Completions stream, and turns the
``thinking_blocks`` of an assistant message back into thinking blocks on the Anthropic request.
Upstream is our scripted server playing Anthropic's Messages API: it replies with thinking before
a tool call, and the tests read what it received on the tool loop's second request.

Both models always stream, so LiteLLM always asks the upstream for a stream. LiteLLM's reply
without a stream is the form its docs say to send back; a test checks that what `OpenAIModel`
keeps from the stream is that form, block for block.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Literal

import httpx
import pytest

from orchestrator import Agent, Message, RawBlock, ReasoningBlock, State
from orchestrator.models import AnthropicModel, OpenAIModel, Request
from tests.doubles import FAST_RETRY, read_file
from tests.models._litellm import MASTER_KEY, LiteLLMProxy, run_litellm
from tests.models._server import Scripted, ScriptedServer, serve, sse
from tests.models.wire_anthropic import block_start, delta, end, start, stop, text_reply

pytestmark = pytest.mark.timeout(180)  # the first test also waits for the proxy to start

MODEL = "claude-thinking"
THINKING = {"type": "thinking", "thinking": "Let me read a.py.", "signature": "c2lnLTE="}
REDACTED = {"type": "redacted_thinking", "data": "b3BhcXVlLTE="}


@pytest.fixture(scope="module")
def upstream_server() -> Generator[ScriptedServer]:
    """One Anthropic-compatible scripted server for the module, behind the proxy."""
    with serve() as running:
        yield running


@pytest.fixture(scope="module")
def proxy(upstream_server: ScriptedServer) -> Generator[LiteLLMProxy]:
    """One LiteLLM proxy for the module, routing `MODEL` to the upstream as Anthropic."""
    with run_litellm({MODEL: ("anthropic/claude-sonnet-4-5", upstream_server.url)}) as running:
        yield running


@pytest.fixture
def upstream(upstream_server: ScriptedServer) -> ScriptedServer:
    """The upstream, with no requests and no responses left from other tests."""
    upstream_server.reset()
    return upstream_server


def tool_use(index: int, call_id: str, path: str) -> list[dict[str, Any]]:
    block: dict[str, Any] = {"type": "tool_use", "id": call_id, "name": "read_file", "input": {}}
    arguments = f'{{"path": "{path}"}}'
    return [
        block_start(index, block),
        delta(index, type="input_json_delta", partial_json=arguments),
    ]


def thinking_events() -> list[dict[str, Any]]:
    """A thinking block streamed as Claude streams it: text pieces, then its signature."""
    return [
        block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
        delta(0, type="thinking_delta", thinking="Let me "),
        delta(0, type="thinking_delta", thinking="read a.py."),
        delta(0, type="signature_delta", signature=THINKING["signature"]),
        stop(0),
    ]


def thinking_then_call() -> tuple[Scripted, list[dict[str, Any]]]:
    """Thinking, then one tool call; and the assistant content Claude wants back."""
    events = [start(20), *thinking_events(), *tool_use(1, "toolu_1", "a.py"), stop(1)]
    events += end("tool_use", 8)
    call = {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a.py"}}
    return Scripted(events=sse(*events, named=True)), [THINKING, call]


def thinking_redacted_text_and_calls() -> tuple[Scripted, list[dict[str, Any]]]:
    """Thinking, redacted thinking, text, then two tool calls."""
    events = [start(20), *thinking_events(), block_start(1, REDACTED), stop(1)]
    events += [block_start(2, {"type": "text", "text": ""})]
    events += [delta(2, type="text_delta", text="Reading both."), stop(2)]
    events += [*tool_use(3, "toolu_1", "a.py"), stop(3), *tool_use(4, "toolu_2", "b.py"), stop(4)]
    events += end("tool_use", 8)
    calls = [
        {"type": "tool_use", "id": f"toolu_{n}", "name": "read_file", "input": {"path": path}}
        for n, path in ((1, "a.py"), (2, "b.py"))
    ]
    text = {"type": "text", "text": "Reading both."}
    return Scripted(events=sse(*events, named=True)), [THINKING, REDACTED, text, *calls]


def build(proxy: LiteLLMProxy, endpoint: Literal["openai", "anthropic"]) -> Any:
    """A model of ours at one of the proxy's endpoints."""
    if endpoint == "openai":
        return OpenAIModel(MODEL, base_url=f"{proxy.url}/v1", api_key=MASTER_KEY, retry=FAST_RETRY)
    return AnthropicModel(MODEL, base_url=proxy.url, api_key=MASTER_KEY, retry=FAST_RETRY)


@pytest.mark.anyio
@pytest.mark.parametrize("endpoint", ["openai", "anthropic"])
@pytest.mark.parametrize("script", [thinking_then_call, thinking_redacted_text_and_calls])
async def test_claude_thinking_reaches_the_upstream_again_through_litellm(
    proxy: LiteLLMProxy,
    upstream: ScriptedServer,
    endpoint: Literal["openai", "anthropic"],
    script: Any,
) -> None:
    first, assistant_content = script()
    upstream.push(first, text_reply("Done."))
    state = State(messages=[Message.user("Read a.py")])

    assert await Agent(build(proxy, endpoint), tools=[read_file]).arun(state) == "Done."

    assert [request.path for request in upstream.requests] == ["/v1/messages"] * 2
    # The tool loop's second request carries the thinking, signed, before the tool calls.
    sent = upstream.requests[1].body["messages"]
    assert sent[1] == {"role": "assistant", "content": assistant_content}
    reply = state.messages[1]
    assert reply.content[0] == ReasoningBlock("Let me read a.py.")


@pytest.mark.anyio
async def test_thinking_from_litellm_goes_to_no_other_server(
    proxy: LiteLLMProxy, upstream: ScriptedServer
) -> None:
    # What the proxy's OpenAI endpoint sent is kept for that server: a plain OpenAI-compatible
    # server given the same conversation sees none of it.
    first, _ = thinking_then_call()
    upstream.push(first, text_reply("Done."))
    state = State(messages=[Message.user("Read a.py")])
    model = build(proxy, "openai")
    await Agent(model, tools=[read_file]).arun(state)

    kept = [block for block in state.messages[1].content if isinstance(block, RawBlock)]
    assert [block.provider for block in kept] == [f"openai@{proxy.url}/v1"]
    request = Request(None, state.messages)
    assert model.request_body(request)["messages"][1]["thinking_blocks"]
    other = OpenAIModel("gpt-test", base_url="http://127.0.0.1:9/v1", api_key="sk-other")
    echoed = other.request_body(request)["messages"][1]
    assert set(echoed) == {"role", "content", "tool_calls"}


def whole_message(content: list[dict[str, Any]]) -> Scripted:
    """The same reply as one JSON message, as Anthropic answers a request without a stream."""
    body = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": content,
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 20, "output_tokens": 8},
    }
    return Scripted(body=body)


@pytest.mark.anyio
@pytest.mark.parametrize("script", [thinking_then_call, thinking_redacted_text_and_calls])
async def test_thinking_is_kept_as_litellm_gives_it_without_a_stream(
    proxy: LiteLLMProxy, upstream: ScriptedServer, script: Any
) -> None:
    # The blocks joined from the stream's pieces are the blocks LiteLLM's reply without a stream
    # holds: whole, signed, without the pieces' stream positions.
    first, content = script()
    upstream.push(first, whole_message(content))
    model = build(proxy, "openai")
    request = Request(None, (Message.user("Read a.py"),), (read_file.spec,))
    reply = await model.respond(request)
    [kept] = [block for block in reply.message.content if isinstance(block, RawBlock)]

    body = {"model": MODEL, "messages": [{"role": "user", "content": "Read a.py"}]}
    body["tools"] = model.request_body(request)["tools"]
    headers = {"authorization": f"Bearer {MASTER_KEY}"}
    async with httpx.AsyncClient(base_url=proxy.url, headers=headers, timeout=60) as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    message: dict[str, Any] = response.json()["choices"][0]["message"]
    assert "stream" not in upstream.requests[1].body

    thinking = [block for block in content if block["type"] in ("thinking", "redacted_thinking")]
    assert message["thinking_blocks"] == thinking
    assert kept.data["thinking_blocks"] == thinking
    assert kept.data["reasoning_content"] == message["reasoning_content"] == THINKING["thinking"]
