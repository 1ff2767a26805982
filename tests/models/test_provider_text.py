"""Text from a provider that UTF-8 cannot hold, and tool arguments a State cannot record.

A provider's JSON may escape half of a character (``"\\ud83d"``), or split a character's two
halves across stream chunks. The halves of a pair become the character again; a lone half becomes
U+FFFD, so the run saves. Tool arguments a State cannot record (NaN, nested too deep) are an
``input_error`` result the model reads, like arguments that are not JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from orchestrator import EVENT_ADAPTER, Agent, Message, State, TextDelta, tool
from orchestrator.models import AnthropicModel, OpenAIModel

# Private: the key a provider keeps arguments under when they cannot be recorded.
from orchestrator.models._wire import INVALID_ARGUMENTS
from stores import MemoryStore
from tests.doubles import FAST_RETRY, results
from tests.models import wire_anthropic, wire_openai
from tests.models._server import Scripted, ScriptedServer

ReplyMaker = Callable[..., Scripted]


def _openai(server: ScriptedServer) -> tuple[Any, ReplyMaker, ReplyMaker]:
    model = OpenAIModel("gpt-test", api_key="sk-test", base_url=server.url, retry=FAST_RETRY)
    return model, wire_openai.text_reply, wire_openai.calls_reply


def _anthropic(server: ScriptedServer) -> tuple[Any, ReplyMaker, ReplyMaker]:
    model = AnthropicModel(
        "claude-test", api_key="sk-ant-test", base_url=server.url, retry=FAST_RETRY
    )
    return model, wire_anthropic.text_reply, wire_anthropic.calls_reply


PROVIDERS = {"openai": _openai, "anthropic": _anthropic}


@tool
def note(text: str) -> str:
    """Write a note."""
    return f"noted: {text}"


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.anyio
async def test_provider_text_with_lone_surrogates_is_recorded_valid_and_saves(
    provider: str, server: ScriptedServer
) -> None:
    model, text_reply, calls_reply = PROVIDERS[provider](server)
    # The args text escapes a lone half; the reply splits an emoji's halves across two chunks
    # and ends on a lone half.
    server.push(
        calls_reply(("call_1", "note", '{"text": "x\\ud83d"}')),
        text_reply("a ", "\ud83d", "\ude00", " b \ud83d"),
    )
    store = MemoryStore()
    state = State(messages=[Message.user("Take a note")])
    assert await Agent(model, tools=[note], store=store).arun(state) == "a \U0001f600 b \ufffd"
    [call] = state.messages[1].tool_calls
    assert call.args == {"text": "x\ufffd"}
    assert state.messages[2].tool_results[0].text == "noted: x\ufffd"
    loaded = store.load(state.id)
    assert list(loaded.history) == list(state.history)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize(
    "arguments",
    ['{"text": NaN}', '{"text": ' + "[" * 150 + "]" * 150 + "}", '{"text": ' + "[" * 100_000],
    ids=["NaN", "150 levels deep", "100,000 levels deep"],
)
@pytest.mark.anyio
async def test_arguments_a_state_cannot_record_are_an_input_error(
    provider: str, arguments: str, server: ScriptedServer
) -> None:
    model, text_reply, calls_reply = PROVIDERS[provider](server)
    server.push(calls_reply(("call_1", "note", arguments)), text_reply("Sorry."))
    store = MemoryStore()
    state = State(messages=[Message.user("Take a note")])
    assert await Agent(model, tools=[note], store=store).arun(state) == "Sorry."
    [call] = state.messages[1].tool_calls
    assert dict(call.args) == {INVALID_ARGUMENTS: arguments}
    [entry] = results(state)
    assert entry.outcome == "input_error"
    assert list(store.load(state.id).history) == list(state.history)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.anyio
async def test_streamed_text_events_with_lone_surrogates_serialise(
    provider: str, server: ScriptedServer
) -> None:
    model, text_reply, _ = PROVIDERS[provider](server)
    server.push(text_reply("a ", "\ud83d", "\ude00", " b"))
    state = State(messages=[Message.user("Hi")])
    deltas: list[str] = []
    async with Agent(model).events(state) as events:
        async for event in events:
            EVENT_ADAPTER.dump_json(event)  # what an app sends over SSE
            if isinstance(event, TextDelta):
                deltas.append(event.text)
    assert deltas == ["a ", "\ufffd", "\ufffd", " b"]  # live chunks; the reply joins the pair
    assert state.answer == "a \U0001f600 b"
