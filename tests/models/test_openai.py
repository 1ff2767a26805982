"""`OpenAIModel` against a loopback server that speaks Chat Completions (JSON and SSE)."""

from __future__ import annotations

import json
import socket
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
    tool,
)
from orchestrator.models import OpenAIModel, Price, Request, RetryPolicy

# Private: the exact text a model is shown for arguments that are not JSON.
from orchestrator.models._wire import INVALID_ARGUMENTS
from tests.doubles import FAST_RETRY, StreamRecorder, hello_request, read_file, results
from tests.models._server import Recorded, Scripted, ScriptedServer, serve, sse
from tests.models.wire_openai import (
    call_chunk,
    calls_reply,
    chunk,
    error,
    text_reply,
    usage_chunk,
)

KEY = "sk-test-SECRET-0123456789abcdef"
PNG = b"\x89PNG\r\n\x1a\n-not-really-a-png"


def make_model(server: ScriptedServer, **options: Any) -> OpenAIModel:
    settings: dict[str, Any] = {"api_key": KEY, "retry": FAST_RETRY, **options}
    return OpenAIModel("gpt-test", base_url=f"{server.url}/v1", **settings)


# -- the request -----------------------------------------------------------------------------------


@tool
def run(cmd: str, timeout: int = 10) -> str:
    """Run a shell command."""
    return f"ran {cmd} for {timeout}s"


@pytest.mark.anyio
async def test_request_body_maps_every_block(server: ScriptedServer) -> None:
    model = make_model(
        server, max_tokens=100, temperature=0.5, params={"seed": 7}, headers={"X-Team": "qa"}
    )
    same = f"openai@{server.url}/v1"
    messages = (
        Message.user("Look at this", Image(PNG, "image/png")),
        Message(
            "assistant",
            (
                ReasoningBlock("hmm"),
                RawBlock(same, {"reasoning_content": "hmm"}),
                RawBlock("anthropic", {"type": "thinking", "thinking": "x", "signature": "s"}),
                TextBlock("Checking."),
                ToolCall("call_1", "read_file", {"path": "a.py"}),
                ToolCall("call_2", "run", {"cmd": "ls"}),
            ),
        ),
        Message(
            "user",
            (
                ToolResultBlock("call_1", (TextBlock("print(1)"), Image(PNG, "image/png"))),
                ToolResultBlock("call_2", (TextBlock("boom"),), is_error=True),
            ),
        ),
    )
    server.push(text_reply("Done."))
    request = Request("Be brief.", messages, (read_file.spec, run.spec))
    reply = await model.respond(request)

    assert reply.message.text == "Done."
    [sent] = server.requests
    assert sent.method == "POST"
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert sent.headers["x-team"] == "qa"
    image_url = {"url": "data:image/png;base64," + Image(PNG, "image/png").to_base64()}
    assert sent.body == {
        "model": "gpt-test",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look at this"},
                    {"type": "image_url", "image_url": image_url},
                ],
            },
            {
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "run", "arguments": '{"cmd": "ls"}'},
                    },
                ],
                "reasoning_content": "hmm",
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "print(1)"},
            {"role": "tool", "tool_call_id": "call_2", "content": "Error: boom"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Images from tool call call_1:"},
                    {"type": "image_url", "image_url": image_url},
                ],
            },
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "read_file",
                    "description": read_file.spec.description,
                    "parameters": json.loads(json.dumps(read_file.spec.input_schema)),
                },
            },
            {
                "type": "function",
                "function": {
                    "name": "run",
                    "description": "Run a shell command.",
                    "parameters": json.loads(json.dumps(run.spec.input_schema)),
                },
            },
        ],
        "max_tokens": 100,
        "temperature": 0.5,
        "seed": 7,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    schema = sent.body["tools"][1]["function"]["parameters"]
    assert schema["required"] == ["cmd"]
    assert schema["additionalProperties"] is False


@pytest.mark.anyio
async def test_reasoning_goes_back_only_within_the_tool_loop(server: ScriptedServer) -> None:
    model = make_model(server)
    same = f"openai@{server.url}/v1"
    old_turn = Message("assistant", (RawBlock(same, {"reasoning_content": "old"}), TextBlock("A")))
    messages = (Message.user("Q1"), old_turn, Message.user("Q2"))
    server.push(text_reply("B"))
    await model.respond(Request(None, messages))
    assistant = server.requests[0].body["messages"][1]
    assert assistant == {"role": "assistant", "content": "A"}


@pytest.mark.anyio
async def test_reasoning_goes_back_to_the_same_server_only(server: ScriptedServer) -> None:
    # Issue 7, item 3: "reasoning/thinking blocks kept and sent back only to the same provider".
    events = sse(
        chunk({"role": "assistant", "reasoning_content": "Look first."}),
        call_chunk(0, "call_1", "read_file", '{"path": "a.py"}'),
        chunk(finish="tool_calls"),
        "[DONE]",
    )
    server.push(Scripted(events=events), text_reply("same"))
    agent = Agent(make_model(server), tools=[read_file])
    state = State(messages=[Message.user("Check a.py")])
    await agent.athink(state)
    await agent.ause_tools(state)
    before = state.snapshot()
    with serve() as other:
        other.push(text_reply("other"))
        await agent.copy(model=make_model(other)).athink(state)
        [to_other] = other.requests
    state.restore(before)
    await agent.athink(state)
    to_same = server.requests[1]
    assistant_same = to_same.body["messages"][1]
    assistant_other = to_other.body["messages"][1]
    assert assistant_same["reasoning_content"] == "Look first."
    assert assistant_same["tool_calls"] == assistant_other["tool_calls"]
    assert "reasoning_content" not in assistant_other
    assert "reasoning" not in json.dumps(assistant_other)


def thinking(text: str = "", signature: str | None = None) -> dict[str, Any]:
    """A piece of a thinking block as LiteLLM's proxy streams it for Claude."""
    return {"type": "thinking", "thinking": text, "signature": signature}


@pytest.mark.anyio
async def test_thinking_blocks_go_back_to_the_same_server_in_a_tool_loop(
    server: ScriptedServer,
) -> None:
    # Issue 12, item 7: LiteLLM's proxy streams Claude's thinking as `thinking_blocks` beside
    # `reasoning_content`; Claude with extended thinking refuses a tool loop's next request
    # without them.
    events = sse(
        chunk(
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "Read ",
                "thinking_blocks": [thinking("Read ")],
            }
        ),
        chunk({"reasoning_content": "it.", "thinking_blocks": [thinking("it.")]}),
        chunk({"reasoning_content": "", "thinking_blocks": [thinking(signature="c2ln")]}),
        chunk({"thinking_blocks": [{"type": "redacted_thinking", "data": "opaque"}]}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
                    }
                ]
            }
        ),
        chunk(finish="tool_calls"),
        usage_chunk(20, 8),
        "[DONE]",
    )
    server.push(Scripted(events=events), text_reply("Read it."))
    agent = Agent(make_model(server), tools=[read_file])
    state = State(messages=[Message.user("Read a.py")])
    assert await agent.arun(state) == "Read it."

    blocks = [
        {"type": "thinking", "thinking": "Read it.", "signature": "c2ln"},
        {"type": "redacted_thinking", "data": "opaque"},
    ]
    same = f"openai@{server.url}/v1"
    reply = state.messages[1]
    assert reply.content[:2] == (
        ReasoningBlock("Read it."),
        RawBlock(same, {"reasoning_content": "Read it.", "thinking_blocks": blocks}),
    )
    assistant = server.requests[1].body["messages"][1]
    assert assistant["thinking_blocks"] == blocks
    assert assistant["reasoning_content"] == "Read it."
    assert assistant["tool_calls"][0]["id"] == "call_1"
    # Another server never sees them.
    other = OpenAIModel("gpt-test", base_url="http://127.0.0.1:9/v1", api_key=KEY)
    echoed = other.request_body(Request(None, state.messages))["messages"][1]
    assert "thinking_blocks" not in echoed


@pytest.mark.anyio
async def test_thinking_blocks_alone_and_whole(server: ScriptedServer) -> None:
    # A server that sends only thinking blocks, each whole in one chunk: the reasoning read
    # from them, each signature closing its block.
    events = sse(
        chunk({"thinking_blocks": [thinking("First.", "s1")]}),
        chunk({"thinking_blocks": [thinking("Second.", "s2")]}),
        chunk({"content": "Done."}),
        chunk(finish="stop"),
    )
    server.push(Scripted(events=events))
    reply = await make_model(server).respond(hello_request())
    same = f"openai@{server.url}/v1"
    first = {"type": "thinking", "thinking": "First.", "signature": "s1"}
    second = {"type": "thinking", "thinking": "Second.", "signature": "s2"}
    assert reply.message.content == (
        ReasoningBlock("First.\n\nSecond."),
        RawBlock(same, {"thinking_blocks": [first, second]}),
        TextBlock("Done."),
    )


def test_the_official_api_gets_max_completion_tokens() -> None:
    model = OpenAIModel("o3-mini", max_tokens=50)
    body = model.request_body(hello_request())
    assert body["max_completion_tokens"] == 50
    assert "max_tokens" not in body
    assert repr(model) == "OpenAIModel('o3-mini')"


# -- the reply -------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_reply_with_reasoning_text_calls_and_usage(server: ScriptedServer) -> None:
    price = Price(input=2, output=8, cache_read=0.5)
    model = make_model(server, price=price)
    events = sse(
        chunk({"role": "assistant", "reasoning_content": "Let me "}),
        chunk({"reasoning_content": "think."}),
        chunk({"content": "I'll "}),
        chunk({"content": "check."}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": '{"pa'},
                    }
                ]
            }
        ),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "run", "arguments": '{"cmd": "ls"}'},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'th": "a.py"}'}}]}),
        chunk(finish="tool_calls"),
        usage_chunk(120, 30, cached=100, reasoning=9),
        "[DONE]",
    )
    server.push(Scripted(events=events))
    chunks: list[str] = []
    reply = await model.respond(hello_request(), on_text=chunks.append)

    same = f"openai@{server.url}/v1"
    assert reply.message.content == (
        ReasoningBlock("Let me think."),
        RawBlock(same, {"reasoning_content": "Let me think."}),
        TextBlock("I'll check."),
        ToolCall("call_a", "read_file", {"path": "a.py"}),
        ToolCall("call_b", "run", {"cmd": "ls"}),
    )
    assert chunks == ["I'll ", "check."]
    assert reply.stop_reason == "tool_calls"
    assert reply.model == "gpt-test-2024"
    assert reply.usage.cost == pytest.approx((20 * 2 + 100 * 0.5 + 30 * 8) / 1_000_000)
    assert reply.usage == Usage(
        input_tokens=120,
        output_tokens=30,
        cache_read_tokens=100,
        requests=1,
        cost=reply.usage.cost,
        reasoning_tokens=9,
    )


@pytest.mark.anyio
async def test_no_price_means_no_cost_and_missing_usage_counts_zero(
    server: ScriptedServer,
) -> None:
    events = sse(chunk({"content": "ok"}), chunk(finish="stop"), "[DONE]")
    server.push(Scripted(events=events))
    reply = await make_model(server).respond(hello_request())
    assert reply.usage == Usage(requests=1)
    assert reply.usage.cost is None


@pytest.mark.anyio
async def test_calls_without_index_or_id_are_kept_apart(server: ScriptedServer) -> None:
    calls = [
        {"id": "c1", "function": {"name": "read_file", "arguments": '{"path": "x"}'}},
        {"id": "c2", "function": {"name": "run", "arguments": {"cmd": "ls"}}},
    ]
    events = sse(*(chunk({"tool_calls": [call]}) for call in calls), chunk(finish="tool_calls"))
    server.push(Scripted(events=events))
    reply = await make_model(server).respond(hello_request())
    assert reply.message.tool_calls == (
        ToolCall("c1", "read_file", {"path": "x"}),
        ToolCall("c2", "run", {"cmd": "ls"}),
    )


@pytest.mark.anyio
async def test_cut_off_tool_arguments_become_an_input_error(server: ScriptedServer) -> None:
    ran: list[str] = []

    @tool
    def note(text: str) -> str:
        """Write a note."""
        ran.append(text)
        return "noted"

    server.push(calls_reply(("call_1", "note", '{"text": "unfinished')), text_reply("Sorry."))
    agent = Agent(make_model(server), tools=[note])
    state = State(messages=[Message.user("Take a note")])
    assert await agent.arun(state) == "Sorry."

    assert ran == []
    [call] = state.messages[1].tool_calls
    assert dict(call.args) == {INVALID_ARGUMENTS: '{"text": "unfinished'}
    [entry] = [entry for entry in state.history if entry.kind == "tool_result"]
    assert entry.outcome == "input_error"  # pyright: ignore[reportAttributeAccessIssue]
    tool_message = server.requests[1].body["messages"][-1]
    assert tool_message["role"] == "tool"
    assert tool_message["content"].startswith("Error: Invalid arguments for the tool 'note'")


# -- errors and retries ----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_401_is_an_auth_error_without_the_key(server: ScriptedServer) -> None:
    server.push(error(401, f"Incorrect API key provided: {KEY}.", "invalid_api_key"))
    agent = Agent(make_model(server))
    state = State(messages=[Message.user("Hi")])
    with structlog.testing.capture_logs() as logs, pytest.raises(AuthError) as caught:
        await agent.athink(state)
    message = str(caught.value)
    assert "OPENAI_API_KEY" in message
    assert "HTTP 401" in message
    assert KEY not in message
    assert "***" in message
    assert caught.value.__cause__ is None
    assert len(server.requests) == 1
    everything = repr(logs) + repr(state.history) + repr(agent) + repr(agent.model)
    assert KEY not in everything
    assert state.messages == (Message.user("Hi"),)
    assert not state.pending_calls


@pytest.mark.anyio
async def test_429_honours_retry_after_then_succeeds(server: ScriptedServer) -> None:
    server.push(error(429, "Slow down", "rate_limit_exceeded", retry_after="7"), text_reply("ok"))
    reporter = StreamRecorder()
    policy = RetryPolicy(retries=2, base=0.001, max_delay=0.02)
    agent = Agent(make_model(server, retry=policy), reporter=reporter)
    state = State(messages=[Message.user("Hi")])
    with structlog.testing.capture_logs() as logs:
        reply = await agent.athink(state)
    assert reply.message.text == "ok"
    [(attempt, delay, failure)] = reporter.retries
    assert attempt == 1
    assert delay == 0.02  # Retry-After 7 s, capped by max_delay
    assert isinstance(failure, RateLimitError)
    assert "HTTP 429" in str(failure)
    assert reporter.text == ["ok"]
    retries = [log for log in logs if log["event"] == "model.request.retry"]
    assert [(log["attempt"], log["delay"]) for log in retries] == [(1, 0.02)]
    assert KEY not in repr(logs)
    assert len(server.requests) == 2


@pytest.mark.anyio
async def test_500_then_success_is_retried(server: ScriptedServer) -> None:
    server.push(Scripted(500, {"error": {"message": "oops"}}), text_reply("fine"))
    reply = await make_model(server).respond(hello_request())
    assert reply.message.text == "fine"
    assert len(server.requests) == 2


@pytest.mark.anyio
async def test_retries_run_out(server: ScriptedServer) -> None:
    server.push(*[Scripted(503, {"error": {"message": "busy"}})] * 3)
    model = make_model(server, retry=RetryPolicy(retries=2, base=0.001))
    with pytest.raises(ProviderError, match=r"HTTP 503.*Gave up after 3 attempts"):
        await model.respond(hello_request())
    assert len(server.requests) == 3


@pytest.mark.anyio
async def test_quota_429_is_not_retried(server: ScriptedServer) -> None:
    server.push(error(429, "You exceeded your current quota", "insufficient_quota"))
    with pytest.raises(RateLimitError, match="out of quota"):
        await make_model(server).respond(hello_request())
    assert len(server.requests) == 1


@pytest.mark.anyio
async def test_context_too_long(server: ScriptedServer) -> None:
    message = "This model's maximum context length is 128000 tokens. You sent 130000 tokens."
    server.push(error(400, message, "context_length_exceeded"))
    with pytest.raises(ContextTooLongError, match=r"compact\(state\)"):
        await make_model(server).respond(hello_request())
    assert len(server.requests) == 1


@pytest.mark.anyio
async def test_other_4xx_is_not_retried(server: ScriptedServer) -> None:
    server.push(error(400, "Unknown parameter: 'foo'"))
    with pytest.raises(ProviderError, match="Unknown parameter") as caught:
        await make_model(server).respond(hello_request())
    assert type(caught.value) is ProviderError
    assert len(server.requests) == 1


@pytest.mark.anyio
async def test_a_stream_cut_mid_reply_is_taken_back(server: ScriptedServer) -> None:
    events = sse(
        chunk({"role": "assistant", "content": "Hel"}), chunk({"content": "lo"}), chunk({})
    )
    server.push(Scripted(events=events, cut_after=2), text_reply("Hello again"))
    reporter = StreamRecorder()
    agent = Agent(make_model(server), reporter=reporter)
    state = State(messages=[Message.user("Hi")])
    with pytest.raises(ProviderError, match="broke off mid-stream"):
        await agent.athink(state)
    assert reporter.text == ["Hel", "lo"]
    assert reporter.retries == []
    assert len(server.requests) == 1
    assert state.messages == (Message.user("Hi"),)
    assert [entry.kind for entry in state.history][-1] == "error"
    # The State stays consistent: the same think runs again.
    reply = await agent.athink(state)
    assert reply.message.text == "Hello again"
    assert state.messages[-1].text == "Hello again"


@pytest.mark.anyio
async def test_an_openai_stream_dropped_mid_tool_call_is_not_retried(
    server: ScriptedServer,
) -> None:
    # Issue 7, item 5: retries happen "before the stream starts; a stream that drops mid-reply
    # raises ProviderError".
    events = sse(
        chunk({"role": "assistant", "reasoning_content": "I will run it."}),
        call_chunk(0, "call_1", "run", '{"cmd": "rm -'),
        chunk({}),
    )
    server.push(Scripted(events=events, cut_after=2), text_reply("a second reply"))
    state = State(messages=[Message.user("Hi")])
    with pytest.raises(ProviderError):
        await Agent(make_model(server)).athink(state)
    assert len(server.requests) == 1
    assert state.messages == (Message.user("Hi"),)


@pytest.mark.anyio
async def test_a_stream_cut_before_any_text_is_retried(server: ScriptedServer) -> None:
    events = sse(chunk({"role": "assistant"}), chunk({"content": "late"}))
    server.push(Scripted(events=events, cut_after=1), text_reply("whole"))
    chunks: list[str] = []
    reply = await make_model(server).respond(hello_request(), on_text=chunks.append)
    assert reply.message.text == "whole"
    assert chunks == ["whole"]


@pytest.mark.anyio
async def test_a_stream_cut_after_reasoning_only_is_retried(server: ScriptedServer) -> None:
    # Issue 12, item 7: retried until something visible arrived (text, or a tool call);
    # reasoning reaches no one while it streams.
    events = sse(
        chunk({"role": "assistant", "reasoning_content": "Let me "}),
        chunk({"reasoning_content": "think."}),
        chunk({"content": "late"}),
    )
    server.push(Scripted(events=events, cut_after=2), text_reply("whole"))
    chunks: list[str] = []
    reply = await make_model(server).respond(hello_request(), on_text=chunks.append)
    assert reply.message.text == "whole"
    assert chunks == ["whole"]
    assert len(server.requests) == 2


@pytest.mark.anyio
async def test_a_stream_that_ends_early_or_with_an_error_event(server: ScriptedServer) -> None:
    ended = Scripted(events=sse(chunk({"role": "assistant"})))
    failed = Scripted(events=sse({"error": {"message": "upstream went away", "code": 502}}))
    server.push(ended, failed, text_reply("third time"))
    reply = await make_model(server).respond(hello_request())
    assert reply.message.text == "third time"
    assert len(server.requests) == 3


# -- timeouts --------------------------------------------------------------------------------------
# A test whose healthy attempt must read within the timeout uses 1 s, so a busy machine does not
# turn a slow healthy read into one more timeout; where every attempt stalls, 0.5 s.


def test_the_timeout_is_checked_and_finite_by_default() -> None:
    assert OpenAIModel("gpt-4o").timeout == 300
    assert OpenAIModel("gpt-4o", timeout=2.5).timeout == 2.5
    bad: list[tuple[Any, type[Exception]]] = [
        (0, ValueError),
        (-1, ValueError),
        (float("inf"), ValueError),
        (float("nan"), ValueError),
        ("5", TypeError),
        (True, TypeError),
        (None, TypeError),
    ]
    for value, kind in bad:
        with pytest.raises(kind, match=r"OpenAIModel\(timeout=\.\.\.\)"):
            OpenAIModel("gpt-4o", timeout=value)


@pytest.mark.anyio
async def test_a_stream_stalled_before_any_text_times_out_and_is_retried(
    server: ScriptedServer,
) -> None:
    resume = threading.Event()
    stalled = Scripted(events=text_reply("late").events, hold_after=1, resume=resume)
    server.push(stalled, text_reply("whole"))
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
    assert type(error) is ProviderError
    assert "sent nothing for 1 s" in str(error)
    assert "OpenAIModel(..., timeout=...)" in str(error)
    assert len(server.requests) == 2


@pytest.mark.anyio
async def test_a_server_that_never_answers_times_out_after_the_retries(
    server: ScriptedServer,
) -> None:
    resume = threading.Event()

    def stall(request: Recorded) -> Scripted:
        resume.wait(timeout=30)  # holds the response back: not even the headers arrive
        return text_reply("too late")

    server.push(stall, stall)
    model = make_model(server, timeout=0.5, retry=RetryPolicy(retries=1, base=0.001))
    try:
        with pytest.raises(ProviderError, match=r"sent nothing for 0\.5 s.*Gave up after 2"):
            await model.respond(hello_request())
    finally:
        resume.set()
    assert len(server.requests) == 2


@pytest.mark.anyio
async def test_a_stream_stalled_after_text_is_not_retried(server: ScriptedServer) -> None:
    resume = threading.Event()
    stalled = Scripted(events=text_reply("Hel", "lo").events, hold_after=2, resume=resume)
    server.push(stalled, text_reply("again"))
    chunks: list[str] = []
    try:
        with pytest.raises(ProviderError, match=r"broke off mid-stream \(ReadTimeout: nothing"):
            await make_model(server, timeout=1.0).respond(hello_request(), on_text=chunks.append)
    finally:
        resume.set()
    assert chunks == ["Hel"]
    assert len(server.requests) == 1


@pytest.mark.anyio
async def test_an_unreachable_server_is_retried_then_fails() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = OpenAIModel(
        "m", base_url=f"http://127.0.0.1:{port}/v1", retry=RetryPolicy(retries=1, base=0.001)
    )
    with pytest.raises(ProviderError, match=r"Could not reach .*Gave up after 2 attempts") as e:
        await model.respond(hello_request())
    where = f"the OpenAI-compatible server at http://127.0.0.1:{port}/v1"
    assert str(e.value).startswith(f"Could not reach {where} for 'm' (")


@pytest.mark.anyio
async def test_a_missing_key_fails_at_the_first_request() -> None:
    model = OpenAIModel("gpt-4o")  # no key, no network at construction
    with pytest.raises(AuthError, match="set the OPENAI_API_KEY environment variable"):
        await model.respond(hello_request())
    other = OpenAIModel("gpt-4o", api_key_env="MY_OPENAI_KEY")
    with pytest.raises(AuthError, match="MY_OPENAI_KEY"):
        await other.respond(hello_request())


@pytest.mark.anyio
async def test_the_key_comes_from_the_environment(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_KEY", "sk-from-env")
    model = OpenAIModel("m", base_url=f"{server.url}/v1", api_key_env="MY_KEY")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-this-one")
    server.push(text_reply("a"), text_reply("b"))
    await model.respond(hello_request())
    # A custom server with no key set gets a placeholder (local servers need none).
    monkeypatch.delenv("OPENAI_API_KEY")
    await OpenAIModel("m", base_url=f"{server.url}/v1").respond(hello_request())
    keys = [request.headers["authorization"] for request in server.requests]
    assert keys == ["Bearer sk-from-env", "Bearer not-needed"]


@pytest.mark.anyio
async def test_cancellation_propagates_and_closes_the_stream(server: ScriptedServer) -> None:
    resume = threading.Event()
    events = sse(chunk({"content": "one"}), chunk({"content": "two"}), chunk(finish="stop"))
    server.push(Scripted(events=events, hold_after=1, resume=resume))
    model = make_model(server)
    try:
        with anyio.CancelScope() as scope:

            def on_text(text: str) -> None:
                scope.cancel()

            await model.respond(hello_request(), on_text=on_text)
        assert scope.cancelled_caught
    finally:
        resume.set()
    assert len(server.requests) == 1


# -- a whole run -----------------------------------------------------------------------------------


def _child_reply(request: Recorded) -> Scripted:
    task = request.body["messages"][-1]["content"]
    return text_reply(f"Found {task}", prompt=7, completion=3)


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
            ("call_a", "researcher", '{"task": "topic A"}'),
            ("call_b", "researcher", '{"task": "topic B"}'),
        ),
        _child_reply,
        _child_reply,
        text_reply("Both ", "done."),
    )
    state = State(messages=[Message.user("Research A and B")])
    assert await lead.arun(state) == "Both done."

    children = [entry for entry in state.history if entry.kind == "tool_result"]
    assert len(children) == 2
    for entry in children:
        [child_id] = entry.child_ids  # pyright: ignore[reportAttributeAccessIssue]
        child = state.child(child_id)
        assert child.parent_id == state.id
        assert child.answer == f"Found {child.messages[0].text}"
    final = server.requests[-1].body["messages"]
    results = {message["tool_call_id"]: message["content"] for message in final[3:5]}
    assert results == {"call_a": "Found topic A", "call_b": "Found topic B"}
    child_systems = {request.body["messages"][0]["content"] for request in server.requests[1:3]}
    assert child_systems == {"Research."}
    assert state.usage.requests == 4
    assert state.usage.input_tokens == 20 + 7 + 7 + 10


@pytest.mark.anyio
async def test_a_subagent_whose_stream_breaks_becomes_the_parent_calls_error_result(
    server: ScriptedServer,
) -> None:
    # DESIGN 8: "a child's failure becomes the parent call's error result unless it is a
    # cancellation"; issue 7, item 5: a stream dropped mid-reply "raises ProviderError".
    def script(request: Recorded) -> Scripted:
        messages = request.body["messages"]
        if messages[0]["content"] == "Delegate.":
            if messages[-1]["role"] == "user":
                return calls_reply(("call_a", "helper", '{"task": "A"}'))
            return text_reply("Recovered.")
        return Scripted(events=text_reply("Par", "tial").events, cut_after=3)

    helper = Agent(make_model(server), name="helper", description="Helps.", instructions="Help.")
    lead = Agent(make_model(server), instructions="Delegate.", tools=[helper])
    server.push(script, script, script)
    state = State(messages=[Message.user("Go")])
    assert await lead.arun(state) == "Recovered."
    [entry] = results(state)
    assert entry.outcome == "error"
    assert entry.content.is_error
    assert "mid-stream" in entry.content.text
    assert KEY not in entry.content.text
    tool_message = server.requests[-1].body["messages"][-1]
    assert tool_message["role"] == "tool"
    assert tool_message["content"].startswith("Error: ")


@pytest.mark.anyio
async def test_an_ollama_string_runs_against_the_local_server(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OLLAMA_HOST", server.url.removeprefix("http://"))
    server.push(text_reply("Hi from llama"))
    assert await Agent("ollama:llama3").arun("Hi") == "Hi from llama"
    [sent] = server.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer ollama"
    assert sent.body["model"] == "llama3"
