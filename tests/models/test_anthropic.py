"""`AnthropicModel` against a loopback server that speaks the Messages API (JSON and SSE)."""

from __future__ import annotations

import json
import threading
from typing import Any

import anyio
import pytest
import structlog

from orchestrator import (
    Agent,
    AuthError,
    ContextTooLongError,
    Image,
    Message,
    ProviderError,
    RateLimitError,
    RawBlock,
    ReasoningBlock,
    State,
    TextBlock,
    ToolCall,
    ToolResultBlock,
    Usage,
)
from orchestrator.models import AnthropicModel, Price, Request, RetryPolicy

# Private: the exact text a model is shown for arguments that are not JSON.
from orchestrator.models._wire import INVALID_ARGUMENTS
from tests.doubles import FAST_RETRY, StreamRecorder, hello_request, read_file
from tests.models._server import Recorded, Scripted, ScriptedServer, sse
from tests.models.wire_anthropic import (
    block_start,
    calls_reply,
    delta,
    end,
    error,
    start,
    stop,
    text_reply,
)

KEY = "sk-ant-test-SECRET-0123456789"
PNG = b"\x89PNG\r\n\x1a\n-not-really-a-png"
B64 = Image(PNG, "image/png").to_base64()


def make_model(server: ScriptedServer, **options: Any) -> AnthropicModel:
    settings: dict[str, Any] = {"api_key": KEY, "retry": FAST_RETRY, **options}
    return AnthropicModel("claude-test", base_url=server.url, **settings)


# -- the request -----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_request_body_maps_every_block(server: ScriptedServer) -> None:
    model = make_model(
        server,
        max_tokens=4000,
        temperature=1,
        thinking_budget=2048,
        params={"top_k": 5},
        headers={"anthropic-beta": "test-beta"},
    )
    thinking = {"type": "thinking", "thinking": "hmm", "signature": "sig=="}
    messages = (
        Message.user("Look at this", Image(PNG, "image/png")),
        Message(
            "assistant",
            (
                ReasoningBlock("hmm"),
                RawBlock("anthropic", thinking),
                RawBlock("openai", {"reasoning_content": "not for anthropic"}),
                TextBlock("Checking."),
                ToolCall("call_1", "read_file", {"path": "a.py"}),
                ToolCall("call.2/x", "read_file", {"path": "b.py"}),
            ),
        ),
        Message(
            "user",
            (
                ToolResultBlock("call_1", (TextBlock("print(1)"), Image(PNG, "image/png"))),
                ToolResultBlock("call.2/x", (TextBlock("no such file"),), is_error=True),
            ),
        ),
        Message.notice("Also look at c.py"),
    )
    server.push(text_reply("Done."))
    request = Request("Be brief.", messages, (read_file.spec,))
    reply = await model.respond(request)

    assert reply.message.text == "Done."
    [sent] = server.requests
    assert sent.method == "POST"
    assert sent.path == "/v1/messages"
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert sent.headers["anthropic-beta"] == "test-beta"
    assert "anthropic-version" in sent.headers
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64}}
    assert sent.body == {
        "model": "claude-test",
        "max_tokens": 4000,
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Look at this"}, image]},
            {
                "role": "assistant",
                "content": [
                    thinking,
                    {"type": "text", "text": "Checking."},
                    {
                        "type": "tool_use",
                        "id": "call_1",
                        "name": "read_file",
                        "input": {"path": "a.py"},
                    },
                    {
                        "type": "tool_use",
                        "id": "call_2_x",
                        "name": "read_file",
                        "input": {"path": "b.py"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "call_1",
                        "content": [{"type": "text", "text": "print(1)"}, image],
                    },
                    {
                        "type": "tool_result",
                        "tool_use_id": "call_2_x",
                        "content": [{"type": "text", "text": "no such file"}],
                        "is_error": True,
                    },
                    {
                        "type": "text",
                        "text": "[notice] Also look at c.py",
                        "cache_control": {"type": "ephemeral"},
                    },
                ],
            },
        ],
        "tools": [
            {
                "name": "read_file",
                "description": read_file.spec.description,
                "input_schema": json.loads(json.dumps(read_file.spec.input_schema)),
            }
        ],
        "temperature": 1.0,
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "top_k": 5,
        "stream": True,
    }


def test_request_body_without_cache_or_options() -> None:
    model = AnthropicModel("claude-3-haiku-20240307", cache=False)
    body = model.request_body(hello_request())
    assert body == {
        "model": "claude-3-haiku-20240307",
        "max_tokens": 4096,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
    }
    assert AnthropicModel("claude-sonnet-4-5").request_body(hello_request())["max_tokens"] == 8192
    assert AnthropicModel("claude-sonnet-4-5").context_window == 200_000
    assert repr(model) == "AnthropicModel('claude-3-haiku-20240307')"


def test_thinking_budget_is_checked() -> None:
    with pytest.raises(ValueError, match=">= 1024"):
        AnthropicModel("claude-x", thinking_budget=100)
    with pytest.raises(ValueError, match="below max_tokens"):
        AnthropicModel("claude-x", thinking_budget=9000)
    with pytest.raises(ValueError, match="params"):
        AnthropicModel("claude-x", params={"system": "no"})


# -- the reply -------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_reply_with_thinking_text_calls_and_usage(server: ScriptedServer) -> None:
    price = Price(input=3, output=15, cache_read=0.3, cache_write=3.75)
    model = make_model(server, price=price)
    events = [
        start(50, written=10, read=200),
        block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
        delta(0, type="thinking_delta", thinking="Let me "),
        delta(0, type="thinking_delta", thinking="think."),
        delta(0, type="signature_delta", signature="c2ln"),
        stop(0),
        block_start(1, {"type": "text", "text": ""}),
        delta(1, type="text_delta", text="I'll "),
        delta(1, type="text_delta", text="check."),
        stop(1),
        block_start(2, {"type": "tool_use", "id": "toolu_a", "name": "read_file", "input": {}}),
        delta(2, type="input_json_delta", partial_json='{"pa'),
        delta(2, type="input_json_delta", partial_json='th": "a.py"}'),
        stop(2),
        block_start(3, {"type": "tool_use", "id": "toolu_b", "name": "run", "input": {}}),
        delta(3, type="input_json_delta", partial_json=""),
        stop(3),
        block_start(4, {"type": "redacted_thinking", "data": "opaque"}),
        stop(4),
        {"type": "ping"},
        *end("tool_use", 40),
    ]
    server.push(Scripted(events=sse(*events, named=True)))
    chunks: list[str] = []
    reply = await model.respond(hello_request(), on_text=chunks.append)

    assert reply.message.content == (
        ReasoningBlock("Let me think."),
        RawBlock(
            "anthropic", {"type": "thinking", "thinking": "Let me think.", "signature": "c2ln"}
        ),
        TextBlock("I'll check."),
        ToolCall("toolu_a", "read_file", {"path": "a.py"}),
        ToolCall("toolu_b", "run", {}),
        RawBlock("anthropic", {"type": "redacted_thinking", "data": "opaque"}),
    )
    assert chunks == ["I'll ", "check."]
    assert reply.stop_reason == "tool_use"
    assert reply.model == "claude-test-20250101"
    cost = (50 * 3 + 200 * 0.3 + 10 * 3.75 + 40 * 15) / 1_000_000
    assert reply.usage.cost == pytest.approx(cost)
    assert reply.usage == Usage(
        input_tokens=260,
        output_tokens=40,
        cache_read_tokens=200,
        cache_write_tokens=10,
        requests=1,
        cost=reply.usage.cost,
    )


@pytest.mark.anyio
async def test_thinking_goes_back_as_it_came(server: ScriptedServer) -> None:
    model = make_model(server)
    first = Scripted(
        events=sse(
            start(),
            block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
            delta(0, type="thinking_delta", thinking="Plan."),
            delta(0, type="signature_delta", signature="sig"),
            stop(0),
            block_start(1, {"type": "tool_use", "id": "toolu_1", "name": "read_file"}),
            delta(1, type="input_json_delta", partial_json='{"path": "x"}'),
            stop(1),
            *end("tool_use", 9),
            named=True,
        )
    )
    server.push(first, text_reply("Read it."))
    agent = Agent(model, tools=[read_file])
    assert await agent.arun("Read x") == "Read it."
    assistant = server.requests[1].body["messages"][1]
    assert assistant == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Plan.", "signature": "sig"},
            {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "x"}},
        ],
    }


@pytest.mark.anyio
async def test_cut_off_tool_arguments_become_an_input_error(server: ScriptedServer) -> None:
    server.push(calls_reply(("toolu_1", "read_file", '{"path": "a.p')), text_reply("Sorry."))
    agent = Agent(make_model(server), tools=[read_file])
    state = State(messages=[Message.user("Read a.py")])
    assert await agent.arun(state) == "Sorry."
    [call] = state.messages[1].tool_calls
    assert dict(call.args) == {INVALID_ARGUMENTS: '{"path": "a.p'}
    [entry] = [entry for entry in state.history if entry.kind == "tool_result"]
    assert entry.outcome == "input_error"  # pyright: ignore[reportAttributeAccessIssue]
    result = server.requests[1].body["messages"][-1]["content"][0]
    assert result["type"] == "tool_result"
    assert result["is_error"] is True
    assert "Invalid arguments for the tool 'read_file'" in result["content"][0]["text"]


# -- errors and retries ----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_401_is_an_auth_error_without_the_key(server: ScriptedServer) -> None:
    server.push(error(401, "authentication_error", f"invalid x-api-key {KEY}"))
    agent = Agent(make_model(server))
    state = State(messages=[Message.user("Hi")])
    with structlog.testing.capture_logs() as logs, pytest.raises(AuthError) as caught:
        await agent.athink(state)
    message = str(caught.value)
    assert "ANTHROPIC_API_KEY" in message
    assert KEY not in message
    assert len(server.requests) == 1
    assert KEY not in repr(logs) + repr(state.history) + repr(agent.model)
    assert state.messages == (Message.user("Hi"),)


@pytest.mark.anyio
async def test_429_honours_retry_after_then_succeeds(server: ScriptedServer) -> None:
    limited = error(429, "rate_limit_error", "Slow down", retry_after="0")
    server.push(limited, text_reply("ok"))
    reporter = StreamRecorder()
    agent = Agent(make_model(server), reporter=reporter)
    reply = await agent.athink(State(messages=[Message.user("Hi")]))
    assert reply.message.text == "ok"
    [(attempt, delay, failure)] = reporter.retries
    assert (attempt, delay) == (1, 0.0)
    assert isinstance(failure, RateLimitError)
    assert reporter.text == ["ok"]


@pytest.mark.anyio
async def test_overloaded_then_success(server: ScriptedServer) -> None:
    server.push(error(529, "overloaded_error", "Overloaded"), text_reply("fine"))
    reply = await make_model(server).respond(hello_request())
    assert reply.message.text == "fine"
    assert len(server.requests) == 2


@pytest.mark.anyio
async def test_500_then_success(server: ScriptedServer) -> None:
    server.push(error(500, "api_error", "Internal"), text_reply("fine"))
    reply = await make_model(server).respond(hello_request())
    assert reply.message.text == "fine"


@pytest.mark.anyio
async def test_context_too_long(server: ScriptedServer) -> None:
    server.push(error(400, "invalid_request_error", "prompt is too long: 210000 tokens > 200000"))
    with pytest.raises(ContextTooLongError, match="context window"):
        await make_model(server).respond(hello_request())
    assert len(server.requests) == 1


@pytest.mark.anyio
async def test_a_stream_cut_mid_reply_is_taken_back(server: ScriptedServer) -> None:
    server.push(
        Scripted(events=text_reply("Hel", "lo").events, cut_after=3), text_reply("Hello again")
    )
    reporter = StreamRecorder()
    agent = Agent(make_model(server), reporter=reporter)
    state = State(messages=[Message.user("Hi")])
    with pytest.raises(ProviderError, match="broke off mid-stream"):
        await agent.athink(state)
    assert reporter.text == ["Hel"]
    assert len(server.requests) == 1
    assert state.messages == (Message.user("Hi"),)
    reply = await agent.athink(state)
    assert reply.message.text == "Hello again"


@pytest.mark.anyio
async def test_a_stream_cut_before_anything_visible_is_retried(server: ScriptedServer) -> None:
    # Issue 12, item 7: message_start, an empty text block and a ping are not content yet.
    empty_text = Scripted(
        events=sse(
            start(),
            block_start(0, {"type": "text", "text": ""}),
            {"type": "ping"},
            delta(0, type="text_delta", text="late"),
            named=True,
        ),
        cut_after=3,
    )
    # Thinking is not shown to anyone either: a stream cut mid-thought is sent again.
    thinking = Scripted(
        events=sse(
            start(),
            block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
            delta(0, type="thinking_delta", thinking="Let me see."),
            delta(0, type="thinking_delta", thinking=" More."),
            named=True,
        ),
        cut_after=3,
    )
    server.push(empty_text, thinking, text_reply("whole"))
    reporter = StreamRecorder()
    agent = Agent(make_model(server), reporter=reporter)
    state = State(messages=[Message.user("Hi")])
    reply = await agent.athink(state)
    assert reply.message.text == "whole"
    assert reporter.text == ["whole"]
    assert [attempt for attempt, _, _ in reporter.retries] == [1, 2]
    assert len(server.requests) == 3


@pytest.mark.anyio
async def test_a_stream_cut_after_a_tool_call_started_is_not_retried(
    server: ScriptedServer,
) -> None:
    events = sse(
        start(),
        block_start(0, {"type": "text", "text": ""}),
        stop(0),
        block_start(1, {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {}}),
        delta(1, type="input_json_delta", partial_json='{"pa'),
        named=True,
    )
    server.push(Scripted(events=events, cut_after=4), text_reply("again"))
    with pytest.raises(ProviderError, match="broke off mid-stream"):
        await make_model(server).respond(hello_request())
    assert len(server.requests) == 1


@pytest.mark.anyio
async def test_an_anthropic_stream_dropped_mid_tool_call_is_not_retried(
    server: ScriptedServer,
) -> None:
    # Issue 7, item 5: retries happen "before the stream starts; a stream that drops mid-reply
    # raises ProviderError".
    events = sse(
        start(),
        block_start(0, {"type": "tool_use", "id": "toolu_1", "name": "run"}),
        delta(0, type="input_json_delta", partial_json='{"cmd": "rm -'),
        delta(0, type="input_json_delta", partial_json='rf /tmp/x"}'),
        named=True,
    )
    server.push(Scripted(events=events, cut_after=3), text_reply("a second reply"))
    state = State(messages=[Message.user("Hi")])
    with pytest.raises(ProviderError):
        await Agent(make_model(server)).athink(state)
    assert len(server.requests) == 1
    assert state.messages == (Message.user("Hi"),)


@pytest.mark.anyio
async def test_an_error_event_mid_stream(server: ScriptedServer) -> None:
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    before_text = Scripted(events=sse(start(), overloaded, named=True))
    after_text = Scripted(
        events=sse(
            start(),
            block_start(0, {"type": "text", "text": ""}),
            delta(0, type="text_delta", text="Par"),
            overloaded,
            named=True,
        )
    )
    server.push(before_text, text_reply("retried"), after_text)
    model = make_model(server)
    assert (await model.respond(hello_request())).message.text == "retried"
    with pytest.raises(ProviderError, match=r"broke off mid-stream .*HTTP 529: Overloaded"):
        await model.respond(hello_request())


@pytest.mark.anyio
async def test_a_stream_stalled_before_any_text_times_out_and_is_retried(
    server: ScriptedServer,
) -> None:
    resume = threading.Event()
    # message_start, the empty text block and a ping arrive; then nothing.
    events = sse(
        start(),
        block_start(0, {"type": "text", "text": ""}),
        {"type": "ping"},
        delta(0, type="text_delta", text="late"),
        named=True,
    )
    server.push(Scripted(events=events, hold_after=3, resume=resume), text_reply("whole"))
    reporter = StreamRecorder()
    agent = Agent(make_model(server, timeout=1.0), reporter=reporter)
    try:
        reply = await agent.athink(State(messages=[Message.user("Hi")]))
    finally:
        resume.set()
    assert reply.message.text == "whole"
    assert reporter.text == ["whole"]
    [(attempt, _, error)] = reporter.retries
    assert attempt == 1
    assert "sent nothing for 1 s" in str(error)
    assert "AnthropicModel(..., timeout=...)" in str(error)
    assert AnthropicModel("claude-x").timeout == 300


@pytest.mark.anyio
async def test_a_missing_key_fails_at_the_first_request() -> None:
    model = AnthropicModel("claude-sonnet-4-5")
    with pytest.raises(AuthError, match="set the ANTHROPIC_API_KEY environment variable") as caught:
        await model.respond(hello_request())
    assert str(caught.value).startswith("No API key for Anthropic (model 'claude-sonnet-4-5')")


@pytest.mark.anyio
async def test_errors_name_the_anthropic_compatible_server_at_its_url(
    server: ScriptedServer,
) -> None:
    # Issue 12, item 7: a custom base_url is not Anthropic, and the errors say so.
    where = f"the Anthropic-compatible server at {server.url}"
    server.push(*[error(503, "api_error", "Down")] * 2, error(404, "not_found_error", "no"))
    model = make_model(server, retry=RetryPolicy(retries=1, base=0.001))
    with pytest.raises(ProviderError) as failed:
        await model.respond(hello_request())
    assert str(failed.value).startswith(f"T{where[1:]} failed to answer for 'claude-test'")
    with pytest.raises(ProviderError) as missing:
        await model.respond(hello_request())
    assert str(missing.value).startswith(f"T{where[1:]} has no model 'claude-test' (HTTP 404")
    assert str(missing.value).count(server.url) == 1
    server.push(Scripted(events=text_reply("Hel", "lo").events, cut_after=3))
    with pytest.raises(ProviderError) as broken:
        await model.respond(hello_request())
    assert f"The reply of 'claude-test' from {where} broke off mid-stream" in str(broken.value)


@pytest.mark.anyio
async def test_cancellation_propagates(server: ScriptedServer) -> None:
    resume = threading.Event()
    events = text_reply("one", "two").events
    server.push(Scripted(events=events, hold_after=3, resume=resume))
    model = make_model(server)
    try:
        with anyio.CancelScope() as scope:

            def on_text(text: str) -> None:
                scope.cancel()

            await model.respond(hello_request(), on_text=on_text)
        assert scope.cancelled_caught
    finally:
        resume.set()


# -- a whole run -----------------------------------------------------------------------------------


def _child_reply(request: Recorded) -> Scripted:
    task = request.body["messages"][-1]["content"][0]["text"]
    return text_reply(f"Found {task}", input_tokens=7)


@pytest.mark.anyio
async def test_an_agent_run_with_subagents(server: ScriptedServer) -> None:
    researcher = Agent(
        make_model(server),
        name="researcher",
        description="Researches one topic.",
        instructions="Research.",
    )
    lead = Agent(make_model(server), instructions="Delegate.", tools=[researcher])
    server.push(
        calls_reply(
            ("toolu_a", "researcher", '{"task": "topic A"}'),
            ("toolu_b", "researcher", '{"task": "topic B"}'),
        ),
        _child_reply,
        _child_reply,
        text_reply("Both ", "done."),
    )
    state = State(messages=[Message.user("Research A and B")])
    assert await lead.arun(state) == "Both done."

    entries = [entry for entry in state.history if entry.kind == "tool_result"]
    assert len(entries) == 2
    for entry in entries:
        [child_id] = entry.child_ids  # pyright: ignore[reportAttributeAccessIssue]
        child = state.child(child_id)
        assert child.parent_id == state.id
        assert child.answer == f"Found {child.messages[0].text}"
    final = server.requests[-1].body
    assert final["system"] == "Delegate."
    results = {
        block["tool_use_id"]: block["content"][0]["text"]
        for block in final["messages"][-1]["content"]
        if block["type"] == "tool_result"
    }
    assert results == {"toolu_a": "Found topic A", "toolu_b": "Found topic B"}
    assert {request.body["system"] for request in server.requests[1:3]} == {"Research."}
    assert state.usage.requests == 4


@pytest.mark.anyio
async def test_server_tool_blocks_and_citations_are_kept(server: ScriptedServer) -> None:
    citation = {"type": "char_location", "cited_text": "x", "document_index": 0}
    events = [
        start(),
        block_start(0, {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search"}),
        delta(0, type="input_json_delta", partial_json='{"query": "anyio"}'),
        stop(0),
        block_start(1, {"type": "text", "text": "Anyio "}),
        delta(1, type="citations_delta", citation=citation),
        delta(1, type="text_delta", text="is great."),
        stop(1),
        {"type": "some_future_event"},
        *end("end_turn", 3),
    ]
    server.push(Scripted(events=sse(*events, named=True)), text_reply("ok"))
    model = make_model(server)
    chunks: list[str] = []
    reply = await model.respond(hello_request(), on_text=chunks.append)
    use = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search"}
    assert reply.message.content == (
        RawBlock("anthropic", {**use, "input": {"query": "anyio"}}),
        TextBlock("Anyio is great."),
    )
    assert chunks == ["Anyio ", "is great."]
    # Sent back as they came, with an empty assistant message left out.
    empty = Message("assistant", ())
    await model.respond(Request(None, (Message.user("Hi"), reply.message, empty)))
    assert server.requests[1].body["messages"][1]["content"][0] == {
        **use,
        "input": {"query": "anyio"},
    }
    assert len(server.requests[1].body["messages"]) == 2


# When the reader stops early, httpx2 leaves one inner async generator to the garbage collector
# (AsyncResponseStream.__aiter__ does not close the pool's stream); trio then warns while it
# finalizes it. The response itself is closed: only that warning is let through here.
@pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning")
@pytest.mark.anyio
async def test_on_text_errors_propagate(server: ScriptedServer) -> None:
    server.push(text_reply("boom"))

    def on_text(text: str) -> None:
        raise KeyError(text)

    with pytest.raises(KeyError, match="boom"):
        await make_model(server).respond(hello_request(), on_text=on_text)
    assert len(server.requests) == 1
