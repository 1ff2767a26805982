"""What both provider models promise alike (issue 7, DESIGN section 11): keys, construction
without network, retries, streams that break, and whole runs with subagents over each wire.

Each test runs for `OpenAIModel` and `AnthropicModel` against the scripted loopback server of
`tests.models._server`, on asyncio and trio; each cites the sentence it checks.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pydantic
import pytest

from orchestrator import (
    Agent,
    AuthError,
    Memory,
    Message,
    ProviderError,
    RateLimitError,
    State,
)
from orchestrator.models import AnthropicModel, OpenAIModel, RetryPolicy
from stores import MemoryStore, SQLiteStore
from tests.doubles import FAST_RETRY, StreamRecorder, assert_replays, results
from tests.models import wire_anthropic as an
from tests.models import wire_openai as oa
from tests.models._server import Recorded, Scripted, ScriptedServer

KEY = "sk-providers-SECRET-9f8e7d6c5b4a"

# -- the two models --------------------------------------------------------------------------------


def openai(server: ScriptedServer, **options: Any) -> OpenAIModel:
    settings: dict[str, Any] = {"api_key": KEY, "retry": FAST_RETRY, **options}
    return OpenAIModel("gpt-r", base_url=f"{server.url}/v1", **settings)


def anthropic(server: ScriptedServer, **options: Any) -> AnthropicModel:
    settings: dict[str, Any] = {"api_key": KEY, "retry": FAST_RETRY, **options}
    return AnthropicModel("claude-r", base_url=server.url, **settings)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# -- keys and construction -------------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.anyio
async def test_a_custom_base_url_without_a_key_gets_a_placeholder(
    server: ScriptedServer, provider: str
) -> None:
    # Issue 12, item 7: the models guide says "A model at a custom base_url with no key set
    # sends a placeholder instead, since local servers usually need none", for both models;
    # a server that does want a key says so, and the error names the variable to set.
    if provider == "openai":
        model: Any = OpenAIModel("gpt-r", base_url=f"{server.url}/v1", retry=FAST_RETRY)
        server.push(oa.text_reply("hello"))
        where = f"the OpenAI-compatible server at {server.url}/v1"
    else:
        model = AnthropicModel("claude-r", base_url=server.url, retry=FAST_RETRY)
        server.push(an.text_reply("hello"))
        where = f"the Anthropic-compatible server at {server.url}"
    state = State(messages=[Message.user("Hi")])
    assert (await Agent(model).athink(state)).message.text == "hello"
    [sent] = server.requests
    assert "not-needed" in sent.headers.get("authorization", "") + sent.headers.get("x-api-key", "")
    server.push(Scripted(401, {"error": {"type": "authentication_error", "message": "no"}}))
    with pytest.raises(AuthError) as caught:
        await Agent(model).athink(state)
    message = str(caught.value)
    assert message.startswith(where[:1].upper() + where[1:] + " refused the API key")
    assert "Set " + ("OPENAI_API_KEY" if provider == "openai" else "ANTHROPIC_API_KEY") in message


def test_construction_needs_no_network_and_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 7, item 1: "No network and no key needed to construct one".
    def no_network(*args: object, **kwargs: object) -> Any:
        raise AssertionError("a model touched the network while being built")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket.socket, "connect_ex", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    built = [
        OpenAIModel("gpt-4o"),
        OpenAIModel("qwen", base_url="http://gpu-box:8000/v1"),
        AnthropicModel("claude-sonnet-4-5"),
        Agent("openai:gpt-4o").model,
        Agent("anthropic:claude-sonnet-4-5").model,
        Agent("ollama:llama3").model,
    ]
    assert [model.name for model in built] == [
        "gpt-4o",
        "qwen",
        "claude-sonnet-4-5",
        "gpt-4o",
        "claude-sonnet-4-5",
        "llama3",
    ]


@pytest.mark.parametrize(
    ("module", "build"),
    [
        ("openai", lambda: OpenAIModel("gpt-4o")),
        ("openai", lambda: Agent("openai:gpt-4o")),
        ("openai", lambda: Agent("ollama:llama3")),
        ("anthropic", lambda: AnthropicModel("claude-sonnet-4-5")),
        ("anthropic", lambda: Agent("anthropic:claude-sonnet-4-5")),
    ],
)
def test_a_missing_extra_names_the_install_command(
    monkeypatch: pytest.MonkeyPatch, module: str, build: Callable[[], object]
) -> None:
    # Issue 7, item 1: "using one without its extra raises an error naming the install command".
    monkeypatch.setitem(sys.modules, module, None)  # as if the SDK were not installed
    with pytest.raises(ImportError, match=re.escape(f"pip install 'orchestrator[{module}]'")):
        build()


@pytest.mark.parametrize(
    ("text", "variable"),
    [("openai:gpt-4o", "OPENAI_API_KEY"), ("anthropic:claude-sonnet-4-5", "ANTHROPIC_API_KEY")],
)
@pytest.mark.anyio
async def test_a_run_without_a_key_fails_at_the_first_request_naming_the_variable(
    text: str, variable: str
) -> None:
    # Issue 7, item 1: "a missing key fails at the first request with AuthError saying which
    # variable to set"; item 5: "the think is taken back".
    agent = Agent(text)
    state = State(messages=[Message.user("Hi")])
    with pytest.raises(AuthError, match=f"set the {variable} environment variable"):
        await agent.arun(state)
    assert state.messages == (Message.user("Hi"),)
    assert state.history[-1].kind == "error"
    assert_replays(state)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.anyio
async def test_the_key_is_read_at_the_first_request(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch, provider: str
) -> None:
    # Issue 7, item 1: "No ... key needed to construct one; a missing key fails at the first
    # request" - so a key set after construction is the one used.
    if provider == "openai":
        model: Any = OpenAIModel("gpt-r", base_url=f"{server.url}/v1", api_key_env="LATE_KEY")
        server.push(oa.text_reply("ok"))
    else:
        model = AnthropicModel("claude-r", base_url=server.url, api_key_env="LATE_KEY")
        server.push(an.text_reply("ok"))
    monkeypatch.setenv("LATE_KEY", "sk-set-later-123456")
    reply = await Agent(model).athink(State(messages=[Message.user("Hi")]))
    assert reply.message.text == "ok"
    [sent] = server.requests
    assert "sk-set-later-123456" in sent.headers.get("authorization", "") + sent.headers.get(
        "x-api-key", ""
    )


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.anyio
async def test_keys_never_reach_logs_history_reprs_or_errors(
    server: ScriptedServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    provider: str,
) -> None:
    # Issue 7, item 6: "API keys never appear in logs, reprs, error messages or history."
    caplog.set_level(logging.DEBUG)  # every logger, the SDKs' and HTTP client's included
    echoed = {"error": {"message": f"Incorrect API key provided: {KEY}", "type": "auth"}}
    server.push(Scripted(500, {"error": {"message": f"upstream saw {KEY}"}}))
    server.push(Scripted(401, echoed))
    if provider == "openai":
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        model: Any = OpenAIModel("gpt-r", base_url=f"{server.url}/v1", retry=FAST_RETRY)
    else:
        monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
        model = AnthropicModel("claude-r", base_url=server.url, retry=FAST_RETRY)
    reporter = StreamRecorder()
    agent = Agent(model, reporter=reporter)
    state = State(messages=[Message.user("Hi")])
    with pytest.raises(AuthError) as caught:
        await agent.athink(state)
    assert len(server.requests) == 2
    assert caplog.records  # something was logged, and none of it holds the key
    seen = [
        caplog.text,
        str(caught.value),
        repr(caught.value),
        repr(state.history),
        repr(state.snapshot()),
        repr(agent),
        repr(model),
        *(str(error) for _, _, error in reporter.retries),
    ]
    assert all(KEY not in text for text in seen)


# -- retries ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.anyio
async def test_a_5xx_retry_after_is_honoured_and_reported(
    server: ScriptedServer, provider: str
) -> None:
    # Issue 7, item 5: "retries with exponential backoff and jitter that honour Retry-After, on
    # 429/5xx/connection errors"; "Retries are reported to the Reporter".
    slow = RetryPolicy(retries=1, base=5, max_delay=10)  # a backoff would be 2.5 s or more
    busy = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
    if provider == "openai":
        model: Any = openai(server, retry=slow)
        server.push(Scripted(503, busy, headers={"Retry-After": "0"}), oa.text_reply("ok"))
    else:
        model = anthropic(server, retry=slow)
        server.push(Scripted(529, busy, headers={"Retry-After": "0"}), an.text_reply("ok"))
    reporter = StreamRecorder()
    reply = await Agent(model, reporter=reporter).athink(State(messages=[Message.user("Hi")]))
    assert reply.message.text == "ok"
    [(attempt, delay, error)] = reporter.retries
    assert (attempt, delay) == (1, 0.0)
    assert isinstance(error, ProviderError)
    assert not isinstance(error, RateLimitError)
    assert len(server.requests) == 2


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.anyio
async def test_connection_errors_are_retried_reported_and_logged(
    caplog: pytest.LogCaptureFixture, provider: str
) -> None:
    # Issue 7, item 5: retries "on 429/5xx/connection errors"; "Retries are reported to the
    # Reporter and logged."
    caplog.set_level(logging.WARNING, logger="orchestrator")
    url = f"http://127.0.0.1:{free_port()}"
    policy = RetryPolicy(retries=2, base=0.001, max_delay=0.01)
    model: Any = (
        OpenAIModel("gpt-r", base_url=f"{url}/v1", api_key=KEY, retry=policy)
        if provider == "openai"
        else AnthropicModel("claude-r", base_url=url, api_key=KEY, retry=policy)
    )
    reporter = StreamRecorder()
    state = State(messages=[Message.user("Hi")])
    with pytest.raises(ProviderError, match="Gave up after 3 attempts"):
        await Agent(model, reporter=reporter).athink(state)
    assert [attempt for attempt, _, _ in reporter.retries] == [1, 2]
    assert all(isinstance(error, ProviderError) for _, _, error in reporter.retries)
    logged = [r for r in caplog.records if r.name.startswith("orchestrator.models")]
    assert sum("model.request.retry" in record.getMessage() for record in logged) == 2
    assert all(record.levelno == logging.WARNING for record in logged)
    assert KEY not in caplog.text
    assert state.messages == (Message.user("Hi"),)


# -- streams that break ----------------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.anyio
async def test_a_stream_cut_mid_reply_leaves_a_saved_state_that_replays(
    server: ScriptedServer, tmp_path: Path, provider: str
) -> None:
    # Issue 7, item 5: "a stream that drops mid-reply raises ProviderError (the think is taken
    # back, the State stays consistent)"; DESIGN 3: "State(history=s.history).snapshot() ==
    # s.snapshot() always holds".
    if provider == "openai":
        model: Any = openai(server)
        server.push(
            Scripted(events=oa.text_reply("Hel", "lo").events, cut_after=3), oa.text_reply("Again")
        )
    else:
        model = anthropic(server)
        server.push(
            Scripted(events=an.text_reply("Hel", "lo").events, cut_after=3), an.text_reply("Again")
        )
    with SQLiteStore(tmp_path / "runs.db") as store:
        reporter = StreamRecorder()
        agent = Agent(model, store=store, reporter=reporter)
        state = State(messages=[Message.user("Hi")])
        with pytest.raises(ProviderError, match="mid-stream"):
            await agent.athink(state)
        assert reporter.text
        assert reporter.retries == []
        assert state.messages == (Message.user("Hi"),)
        assert state.usage.requests == 0
        assert_replays(state)
        loaded = await store.aload(state.id)
        assert loaded.snapshot() == state.snapshot()
        reply = await agent.athink(loaded)
        assert reply.message.text == "Again"
        assert loaded.messages[-1].text == "Again"
        assert len(server.requests) == 2


# -- whole runs: subagents that keep memory, over each wire ----------------------------------------


class Note(pydantic.BaseModel):
    """A note to keep."""

    text: str
    done: bool = False


def _openai_script(request: Recorded) -> Scripted:
    messages = request.body["messages"]
    last = messages[-1]
    if messages[0]["content"] == "Delegate.":
        if last["role"] == "user":
            return oa.calls_reply(
                ("call_a", "noter", '{"task": "A"}'), ("call_b", "noter", '{"task": "B"}')
            )
        return oa.text_reply("All ", "noted.")
    task = messages[1]["content"]
    if last["role"] == "user":
        doc = json.dumps({"id": task, "doc": {"text": f"note {task}"}})
        return oa.calls_reply((f"call_up_{task}", "state_notes_upsert", doc))
    return oa.text_reply(f"Noted {task}")


def _anthropic_script(request: Recorded) -> Scripted:
    body = request.body
    first = body["messages"][-1]["content"][0]
    if body["system"] == "Delegate.":
        if first["type"] == "text":
            return an.calls_reply(
                ("toolu_a", "noter", '{"task": "A"}'), ("toolu_b", "noter", '{"task": "B"}')
            )
        return an.text_reply("All ", "noted.")
    task = body["messages"][0]["content"][0]["text"]
    if first["type"] == "text":
        doc = json.dumps({"id": task, "doc": {"text": f"note {task}"}})
        return an.calls_reply((f"toolu_up_{task}", "state_notes_upsert", doc))
    return an.text_reply(f"Noted {task}")


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.anyio
async def test_a_run_with_subagents_that_keep_memory_over_each_wire(
    server: ScriptedServer, provider: str
) -> None:
    # Issue 7, Tests: "a full agent run with subagents against each fake server"; issue 6,
    # item 3: the model gets the state_<collection>_* tools "with the document's JSON schema".
    build = openai if provider == "openai" else anthropic
    script = _openai_script if provider == "openai" else _anthropic_script
    store = MemoryStore()
    noter = Agent(
        build(server),
        name="noter",
        description="Takes one note.",
        instructions="Take notes.",
        store=store,
        collections={"notes": Note},
    )
    lead = Agent(build(server), instructions="Delegate.", tools=[noter])
    server.push(*[script] * 6)
    reporter = StreamRecorder()
    state = State(messages=[Message.user("Note A and B")])
    assert await lead.copy(reporter=reporter).arun(state) == "All noted."

    assert await Memory.open("noter", {"notes": Note}, store).collection("notes").alist() == [
        {"id": "A", "text": "note A", "done": False},
        {"id": "B", "text": "note B", "done": False},
    ]
    entries = results(state)
    assert [entry.outcome for entry in entries] == ["done", "done"]
    for entry in entries:
        [child_id] = entry.child_ids
        child = state.child(child_id)
        assert child.parent_id == state.id
        assert child.parent_call_id == entry.call.id
        assert [e.outcome for e in results(child)] == ["done"]
    assert state.usage.requests == 6
    assert "".join(reporter.text).count("noted.") == 1
    child_request = next(
        r for r in server.requests if "Take notes." in json.dumps(r.body)[:2000]
    ).body
    if provider == "openai":
        specs = {t["function"]["name"]: t["function"]["parameters"] for t in child_request["tools"]}
    else:
        specs = {t["name"]: t["input_schema"] for t in child_request["tools"]}
    assert set(specs) == {"state_notes_list", "state_notes_upsert", "state_notes_remove"}
    upsert = specs["state_notes_upsert"]
    assert upsert["required"] == ["id", "doc"]
    assert upsert["$defs"]["Note"]["required"] == ["text"]
    assert set(specs["state_notes_list"]["properties"]) == {"where", "limit"}
    assert specs["state_notes_remove"]["required"] == ["id"]
