"""`OpenAIResponsesModel` against a loopback server that plays the Responses API exactly.

LLMock's Responses router (tests/models/test_llmock.py) is the third-party check of the tool
loop, errors and stream faults; this fake scripts what LLMock cannot: reasoning items with
encrypted content, usage details, error events and failed responses.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pydantic
import pytest

from orchestrator import (
    Agent,
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
from orchestrator.models import OpenAIModel, OpenAIResponsesModel, Price, Request

# Private: the exact args a model is shown for arguments that are not JSON.
from orchestrator.models._wire import INVALID_ARGUMENTS
from stores import SQLiteStore
from tests.doubles import FAST_RETRY, StreamRecorder, hello_request, read_file
from tests.models._server import Scripted, ScriptedServer, sse
from tests.models.wire_openai import text_reply as chat_text_reply
from tests.models.wire_responses import (
    MODEL,
    call_item,
    completed,
    created,
    error,
    message_item,
    reasoning_item,
    reply,
    response,
    text_reply,
)

KEY = "sk-test-SECRET-responses-0123"
PNG = b"\x89PNG\r\n\x1a\n-not-really-a-png"


def make_model(server: ScriptedServer, **options: Any) -> OpenAIResponsesModel:
    settings: dict[str, Any] = {"api_key": KEY, "retry": FAST_RETRY, **options}
    return OpenAIResponsesModel("gpt-test", base_url=f"{server.url}/v1", **settings)


def provider_of(server: ScriptedServer) -> str:
    """Whose raw blocks a model at this server sends back."""
    return f"openai-responses@{server.url}/v1"


@tool
def weather(city: str) -> str:
    """Tell the weather in a city."""
    return f"Sunny in {city}."


# -- the request -----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_request_body_maps_every_block(server: ScriptedServer) -> None:
    model = make_model(server, max_tokens=100, temperature=0.5, params={"reasoning": {"x": 1}})
    kept = reasoning_item("rs_1", "gAAAA-secret", "Looking at the file.")
    messages = (
        Message.user("Look at this", Image(PNG, "image/png")),
        Message(
            "assistant",
            (
                ReasoningBlock("Looking at the file."),
                RawBlock(provider_of(server), kept),
                RawBlock("openai-responses", reasoning_item("rs_0", "from OpenAI itself")),
                RawBlock("anthropic", {"type": "thinking", "thinking": "x", "signature": "s"}),
                RawBlock(provider_of(server), {"reasoning_content": "not an item"}),
                TextBlock("Checking."),
                ToolCall("call_1", "read_file", {"path": "a.py"}),
            ),
        ),
        Message(
            "user",
            (
                ToolResultBlock("call_1", (TextBlock("boom"), Image(PNG, "image/png"))),
                TextBlock("Now?"),
            ),
        ),
    )
    server.push(text_reply("Done."))
    reply_ = await model.respond(Request("Be brief.", messages, (read_file.spec,)))

    assert reply_.message.text == "Done."
    [sent] = server.requests
    assert sent.path == "/v1/responses"
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    image = {
        "type": "input_image",
        "image_url": "data:image/png;base64," + Image(PNG, "image/png").to_base64(),
    }
    assert sent.body == {
        "model": "gpt-test",
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Look at this"}, image]},
            kept,  # this server's reasoning item, back where it was, encrypted content whole
            {"role": "assistant", "content": "Checking."},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "read_file",
                "arguments": '{"path": "a.py"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "boom"},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Images from tool call call_1:"},
                    image,
                    {"type": "input_text", "text": "Now?"},
                ],
            },
        ],
        "tools": [
            {
                "type": "function",
                "name": "read_file",
                "description": read_file.spec.description,
                "parameters": json.loads(json.dumps(read_file.spec.input_schema)),
                "strict": False,
            }
        ],
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "max_output_tokens": 100,
        "temperature": 0.5,
        "reasoning": {"x": 1},
        "stream": True,
    }


def test_options_and_reserved_params() -> None:
    model = OpenAIResponsesModel("o4-mini", params={"reasoning": {"effort": "low"}}, max_tokens=9)
    assert model.options == {
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "max_output_tokens": 9,
        "reasoning": {"effort": "low"},
    }
    assert repr(model) == "OpenAIResponsesModel('o4-mini')"
    with pytest.raises(ValueError, match=r"OpenAIResponsesModel\(params=...\) may not set"):
        OpenAIResponsesModel("o4-mini", params={"input": []})
    with pytest.raises(ValueError, match="needs a model name"):
        OpenAIResponsesModel(" ")
    with pytest.raises(TypeError, match=r"OpenAIResponsesModel\(timeout=...\)"):
        OpenAIResponsesModel("o4-mini", timeout="soon")  # pyright: ignore[reportArgumentType]


# -- the reply -------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_reply_with_reasoning_text_calls_and_usage(server: ScriptedServer) -> None:
    price = Price(input=2, output=8, cache_read=0.5)
    model = make_model(server, price=price)
    thought = reasoning_item("rs_1", "gAAAA-encrypted", "First I look.", "Then I run.")
    server.push(
        reply(
            thought,
            message_item("I'll check."),
            call_item("call_a", "read_file", '{"path": "a.py"}'),
            call_item("call_b", "run", "{not json"),
            end=completed(120, 30, cached=100, reasoning=12),
        )
    )
    chunks: list[str] = []
    reply_ = await model.respond(hello_request(), on_text=chunks.append)

    assert reply_.message.content == (
        ReasoningBlock("First I look.\n\nThen I run."),
        RawBlock(provider_of(server), thought),
        TextBlock("I'll check."),
        ToolCall("call_a", "read_file", {"path": "a.py"}),
        ToolCall("call_b", "run", {INVALID_ARGUMENTS: "{not json"}),
    )
    assert chunks == ["I'll ", "check."]
    assert reply_.stop_reason == "tool_calls"
    assert reply_.model == MODEL
    assert reply_.usage.cost == pytest.approx((20 * 2 + 100 * 0.5 + 30 * 8) / 1_000_000)
    assert reply_.usage == Usage(
        input_tokens=120,
        output_tokens=30,
        cache_read_tokens=100,
        requests=1,
        cost=reply_.usage.cost,
        reasoning_tokens=12,  # of the 30 output tokens, priced with them
    )


@pytest.mark.anyio
async def test_an_incomplete_reply_says_why(server: ScriptedServer) -> None:
    cut = response("incomplete", incomplete_details={"reason": "max_output_tokens"})
    server.push(reply(message_item("Half"), end={"type": "response.incomplete", "response": cut}))
    reply_ = await make_model(server).respond(hello_request())
    assert (reply_.message.text, reply_.stop_reason) == ("Half", "max_output_tokens")
    assert reply_.usage == Usage(requests=1)  # no usage sent: none counted


# -- reasoning items across turns ------------------------------------------------------------------


def _loop_replies(server: ScriptedServer) -> tuple[dict[str, Any], dict[str, Any]]:
    first = reasoning_item("rs_1", "gAAAA-first", "Need the weather.")
    second = reasoning_item("rs_2", "gAAAA-second")
    server.push(
        reply(first, call_item("call_w", "weather", '{"city": "Paris"}')),
        reply(second, message_item("Sunny in Paris.")),
    )
    return first, second


@pytest.mark.anyio
async def test_reasoning_items_go_back_on_the_next_turn(server: ScriptedServer) -> None:
    first, second = _loop_replies(server)
    state = State(messages=[Message.user("Weather in Paris?")])
    assert await Agent(make_model(server), tools=[weather]).arun(state) == "Sunny in Paris."

    _, sent = (request.body["input"] for request in server.requests)
    assert sent == [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        first,
        {
            "type": "function_call",
            "call_id": "call_w",
            "name": "weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_w", "output": "Sunny in Paris."},
    ]
    # The answer's own reasoning item is in the history too, for the turn after it.
    assert RawBlock(provider_of(server), second) in state.messages[-1].content


@pytest.mark.anyio
async def test_other_models_leave_the_reasoning_items_out(server: ScriptedServer) -> None:
    _loop_replies(server)
    state = State(messages=[Message.user("Weather in Paris?")])
    await Agent(make_model(server), tools=[weather]).arun(state)
    state.add_message(Message.user("And tomorrow?"))

    server.push(chat_text_reply("Also sunny."))
    chat = OpenAIModel("gpt-test", base_url=f"{server.url}/v1", api_key=KEY)
    assert await Agent(chat, tools=[weather]).arun(state) == "Also sunny."
    assert "gAAAA" not in json.dumps(server.requests[-1].body)
    # Nor does the same API at another server (its encrypted content is not theirs).
    elsewhere = OpenAIResponsesModel("gpt-test", base_url="http://127.0.0.1:9/v1")
    assert "gAAAA" not in json.dumps(elsewhere.request_body(Request(None, state.messages)))


def test_reasoning_items_survive_the_store_and_a_new_process(
    server: ScriptedServer, tmp_path: Path
) -> None:
    first, second = _loop_replies(server)
    path = tmp_path / "runs.db"
    state = State(id="trip", messages=[Message.user("Weather in Paris?")])
    Agent(make_model(server), tools=[weather], store=SQLiteStore(path)).run(state)

    server.push(text_reply("Rain tomorrow."))
    script = textwrap.dedent(
        f"""
        from orchestrator import Agent, Message
        from orchestrator.models import OpenAIResponsesModel
        from stores import SQLiteStore

        state = SQLiteStore({str(path)!r}).load("trip")
        state.add_message(Message.user("And tomorrow?"))
        model = OpenAIResponsesModel("gpt-test", base_url={server.url + "/v1"!r}, api_key="k")
        print(Agent(model).run(state))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Rain tomorrow."

    sent = server.requests[-1].body["input"]
    reasoning = [item for item in sent if item.get("type") == "reasoning"]
    assert reasoning == [first, second]  # both turns' items, whole, in their places
    assert sent.index(second) == len(sent) - 3  # before the answer it led to, then the question
    assert sent[-2:] == [
        {"role": "assistant", "content": "Sunny in Paris."},
        {"role": "user", "content": [{"type": "input_text", "text": "And tomorrow?"}]},
    ]


# -- structured answers ----------------------------------------------------------------------------


class Forecast(pydantic.BaseModel):
    """A forecast."""

    city: str
    celsius: int


@pytest.mark.anyio
async def test_ask_returns_a_validated_value(server: ScriptedServer) -> None:
    server.push(
        text_reply('{"city": "Paris", "celsius": "warm"}'),
        text_reply('```json\n{"city": "Paris", "celsius": 21}\n```'),
    )
    state = State(messages=[Message.user("Plan a trip to Paris.")])
    answer = await Agent(make_model(server)).aask(state, "The forecast?", Forecast)
    assert answer == Forecast(city="Paris", celsius=21)
    first, retry = (request.body["input"] for request in server.requests)
    assert "matches this JSON schema" in first[-1]["content"][0]["text"]
    assert "That answer is not valid" in retry[-1]["content"][0]["text"]


# -- errors ----------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_429_then_500_are_retried(server: ScriptedServer) -> None:
    server.push(
        error(429, "Slow down", "rate_limit_exceeded", retry_after="0"),
        Scripted(500, {"error": {"message": "oops"}}),
        text_reply("fine"),
    )
    reporter = StreamRecorder()
    state = State(messages=[Message.user("Hi")])
    assert (await Agent(make_model(server), reporter=reporter).athink(state)).message.text == "fine"
    assert [type(failure) for _, _, failure in reporter.retries] == [RateLimitError, ProviderError]
    assert reporter.text == ["fi", "ne"]


@pytest.mark.anyio
async def test_a_context_error_is_not_retried(server: ScriptedServer) -> None:
    server.push(error(400, "Your input exceeds the context window", "context_length_exceeded"))
    with pytest.raises(ContextTooLongError, match=r"agent\.compact\(state\)"):
        await make_model(server).respond(hello_request())
    assert len(server.requests) == 1


@pytest.mark.anyio
async def test_error_events_and_failed_responses(server: ScriptedServer) -> None:
    busy = {"type": "error", "code": "rate_limit_exceeded", "message": "Too busy"}
    failed = response("failed", error={"code": "server_error", "message": "It broke"})
    server.push(
        Scripted(events=sse(created(), busy, named=True)),
        Scripted(events=sse(created(), {"type": "response.failed", "response": failed})),
        text_reply("ok"),
    )
    reporter = StreamRecorder()
    state = State(messages=[Message.user("Hi")])
    assert (await Agent(make_model(server), reporter=reporter).athink(state)).message.text == "ok"
    [(_, _, limited), (_, _, broke)] = reporter.retries
    assert isinstance(limited, RateLimitError)
    assert "Too busy" in str(limited)
    assert "It broke" in str(broke)

    too_long = {"type": "error", "code": "context_length_exceeded", "message": "Too long"}
    server.push(Scripted(events=sse(created(), too_long)))
    with pytest.raises(ContextTooLongError, match="Too long"):
        await make_model(server).respond(hello_request())


# Our reader stops at the malformed event; httpx2 then leaves one inner async generator to the
# garbage collector, and trio warns while it finalizes it (as in test_llmock's corrupted chunk).
@pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning")
@pytest.mark.anyio
async def test_a_stream_cut_or_malformed_before_text_is_retried(server: ScriptedServer) -> None:
    whole = text_reply("Hello world")
    assert whole.events is not None
    server.push(
        Scripted(events=whole.events[:2]),  # ends cleanly, before text and response.completed
        Scripted(events=(*whole.events[:1], "event: x\ndata: {not json\n\n")),
        whole,
    )
    reporter = StreamRecorder()
    state = State(messages=[Message.user("Hi")])
    agent = Agent(make_model(server), reporter=reporter)
    assert (await agent.athink(state)).message.text == "Hello world"
    [(_, _, ended), (_, _, malformed)] = reporter.retries
    assert "ended the stream before the reply was complete" in str(ended)
    assert "not JSON" in str(malformed)
    assert reporter.text == ["Hello", " world"]


@pytest.mark.anyio
async def test_a_stream_cut_after_text_is_not_retried(server: ScriptedServer) -> None:
    whole = text_reply("Hello world")
    assert whole.events is not None
    server.push(Scripted(events=whole.events, cut_after=3))  # created, added, "Hello", cut
    reporter = StreamRecorder()
    state = State(messages=[Message.user("Hi")])
    with pytest.raises(ProviderError, match="broke off mid-stream"):
        await Agent(make_model(server), reporter=reporter).athink(state)
    assert reporter.text == ["Hello"]
    assert len(server.requests) == 1
    assert state.messages == (Message.user("Hi"),)


@pytest.mark.anyio
async def test_a_refusal_streams_and_items_only_in_the_response_are_read(
    server: ScriptedServer,
) -> None:
    refusal = {"type": "refusal", "refusal": "I can't help with that."}
    item = {"type": "message", "id": "msg_1", "role": "assistant", "content": [refusal]}
    delta = {"type": "response.refusal.delta", "output_index": 0, "delta": "I can't help"}
    rest = {"type": "response.refusal.delta", "output_index": 0, "delta": " with that."}
    done = {"type": "response.output_item.done", "output_index": 0, "item": item}
    server.push(Scripted(events=sse(created(), delta, rest, done, completed(), named=True)))
    chunks: list[str] = []
    reply_ = await make_model(server).respond(hello_request(), on_text=chunks.append)
    assert reply_.message.text == "I can't help with that."
    assert chunks == ["I can't help", " with that."]

    # A server that sends only the completed response, its output items in it.
    thought = reasoning_item("rs_9", "gAAAA-only")
    whole = response("completed", output=[thought, call_item("call_z", "weather", "{}")])
    server.push(Scripted(events=sse({"type": "response.completed", "response": whole})))
    reply_ = await make_model(server).respond(hello_request())
    assert reply_.message.content == (
        RawBlock(provider_of(server), thought),
        ToolCall("call_z", "weather", {}),
    )
    assert reply_.stop_reason == "tool_calls"


@pytest.mark.anyio
async def test_a_call_without_an_id_gets_one_and_done_markers_are_skipped(
    server: ScriptedServer,
) -> None:
    nameless = {"type": "function_call", "name": "weather", "arguments": '{"city": "Oslo"}'}
    whole = reply(nameless)
    assert whole.events is not None
    server.push(Scripted(events=(*whole.events, "data: [DONE]\n\n")))
    reply_ = await make_model(server).respond(hello_request())
    [call] = reply_.message.tool_calls
    assert call.id.startswith("call_")
    assert (call.name, dict(call.args)) == ("weather", {"city": "Oslo"})
