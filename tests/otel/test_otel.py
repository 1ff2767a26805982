"""`orchestrator.otel`: the spans of a run tree, read back with the SDK's in-memory exporter."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from orchestrator import (
    Agent,
    Image,
    Message,
    ReasoningBlock,
    Reply,
    State,
    TextBlock,
    ToolCall,
    ToolError,
    ToolResultBlock,
    ToolResultEntry,
    Usage,
    tool,
)
from orchestrator._record._recording import record_tool_result
from orchestrator.models import Request
from orchestrator.otel import OtelReporter
from orchestrator.permissions import AllowByName
from orchestrator.testing import FakeModel, tool_call

pytestmark = pytest.mark.anyio


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    yield memory
    memory.clear()


def provider_for(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def reply(text: str = "", *calls: Any, tokens: tuple[int, int] = (10, 2)) -> Reply:
    message = Message.assistant(text, tool_calls=calls)
    usage = Usage(input_tokens=tokens[0], output_tokens=tokens[1], requests=1)
    return Reply(message, usage, stop_reason="end_turn", model="fake-1")


@tool
async def lookup(topic: str) -> str:
    """Look a topic up."""
    await anyio.lowlevel.checkpoint()
    return f"facts about {topic}"


@tool
def broken() -> str:
    """Always fails."""
    raise ToolError("no luck")


def team(reporter: OtelReporter) -> tuple[Agent, State]:
    """A lead that starts two researchers in parallel (each calls a tool) and calls a tool."""

    def research(request: Request) -> Reply:
        return reply("", tool_call("lookup", topic=request.messages[0].text))

    def researcher_model() -> FakeModel:
        return FakeModel([research, reply("found it", tokens=(7, 3))])

    researcher = Agent(
        researcher_model(),
        name="researcher",
        description="Researches a topic.",
        tools=[lookup],
    )
    other = researcher.copy(model=researcher_model())
    lead = Agent(
        FakeModel(
            [
                reply(
                    "",
                    tool_call("researcher", task="cats"),
                    tool_call("other", task="dogs"),
                    tool_call("broken"),
                ),
                reply("all done", tokens=(20, 5)),
            ]
        ),
        name="lead",
        tools=[researcher, other.as_tool(name="other", description="Researches too."), broken],
        reporter=reporter,
    )
    return lead, State(messages=[Message.user("Study pets")])


# -- the tree ------------------------------------------------------------------------------------


def state_tree(state: State) -> tuple[Any, ...]:
    """The shape of a State's run: its model requests, its calls and the children they ran."""
    requests = sum(1 for entry in state.history if entry.kind == "model_request")
    calls = sorted(
        (
            entry.call.name,
            entry.call.id,
            entry.outcome,
            tuple(state_tree(state.child(child)) for child in entry.child_ids),
        )
        for entry in state.history
        if isinstance(entry, ToolResultEntry)
    )
    return (state.id, requests, tuple(calls))


def span_tree(spans: list[ReadableSpan], root: ReadableSpan) -> tuple[Any, ...]:
    """The same shape, read from the spans under `root` (a run's span)."""

    def children(span: ReadableSpan) -> list[ReadableSpan]:
        assert span.context is not None
        return [
            s for s in spans if s.parent is not None and s.parent.span_id == span.context.span_id
        ]

    attributes = root.attributes or {}
    below = children(root)
    requests = sum(1 for s in below if (s.attributes or {})["gen_ai.operation.name"] == "chat")
    calls = sorted(
        (
            str((s.attributes or {})["gen_ai.tool.name"]),
            str((s.attributes or {})["gen_ai.tool.call.id"]),
            str((s.attributes or {})["orchestrator.tool.outcome"]),
            tuple(span_tree(spans, child) for child in children(s)),
        )
        for s in below
        if (s.attributes or {})["gen_ai.operation.name"] == "execute_tool"
    )
    return (attributes["orchestrator.state.id"], requests, tuple(calls))


async def test_the_span_tree_matches_the_state_tree(exporter: InMemorySpanExporter) -> None:
    lead, state = team(OtelReporter(tracer_provider=provider_for(exporter)))
    assert await lead.arun(state) == "all done"
    spans = list(exporter.get_finished_spans())
    (root,) = [s for s in spans if s.parent is None]
    assert root.name == "invoke_agent lead"
    assert span_tree(spans, root) == state_tree(state)
    # Two children, each with its tool call: the tree is three runs deep in places.
    assert len([s for s in spans if s.name == "invoke_agent researcher"]) == 2
    assert len([s for s in spans if s.name == "execute_tool lookup"]) == 2
    assert len(spans) == 3 + 2 * 3 + 2 + 3  # runs, children's chats and lookups, chats, calls


async def test_spans_carry_the_gen_ai_attributes(exporter: InMemorySpanExporter) -> None:
    lead, state = team(OtelReporter(tracer_provider=provider_for(exporter)))
    await lead.arun(state)
    spans = {span.name: span for span in exporter.get_finished_spans() if span.parent is None}
    run = dict(spans["invoke_agent lead"].attributes or {})
    assert run["gen_ai.operation.name"] == "invoke_agent"
    assert run["gen_ai.agent.name"] == "lead"
    assert run["gen_ai.conversation.id"] == state.id
    assert run["gen_ai.usage.input_tokens"] == state.usage.input_tokens == 10 + 20 + 2 * (10 + 7)

    finished = list(exporter.get_finished_spans())
    chats = [
        s for s in finished if dict(s.attributes or {}).get("orchestrator.state.id") == state.id
    ]
    (first, last) = sorted(
        (s for s in chats if s.name.startswith("chat")), key=lambda s: s.start_time or 0
    )
    attributes = dict(last.attributes or {})
    assert last.name == "chat fake"
    assert attributes["gen_ai.request.model"] == "fake"
    assert attributes["gen_ai.response.model"] == "fake-1"
    assert attributes["gen_ai.usage.input_tokens"] == 20
    assert attributes["gen_ai.usage.output_tokens"] == 5
    assert attributes["gen_ai.response.finish_reasons"] == ("end_turn",)
    assert "gen_ai.input.messages" not in attributes  # no contents unless asked for

    (failed,) = [s for s in finished if s.name == "execute_tool broken"]
    assert dict(failed.attributes or {})["orchestrator.tool.outcome"] == "error"
    assert failed.status.status_code is trace.StatusCode.ERROR
    assert "gen_ai.tool.call.result" not in dict(failed.attributes or {})
    assert first.end_time is not None


async def test_contents_only_when_asked_for(exporter: InMemorySpanExporter) -> None:
    reporter = OtelReporter(tracer_provider=provider_for(exporter), capture_content=True)
    agent = Agent(
        FakeModel([reply("", tool_call("lookup", topic="owls")), reply("Owls hoot.")]),
        tools=[lookup],
        reporter=reporter,
    )
    await agent.arun("Tell me about owls")
    spans = {span.name: dict(span.attributes or {}) for span in exporter.get_finished_spans()}
    tool_span = spans["execute_tool lookup"]
    assert json.loads(str(tool_span["gen_ai.tool.call.arguments"])) == {"topic": "owls"}
    assert tool_span["gen_ai.tool.call.result"] == "facts about owls"
    chats = [
        dict(s.attributes or {})
        for s in sorted(exporter.get_finished_spans(), key=lambda s: s.start_time or 0)
        if s.name == "chat fake"
    ]
    sent = json.loads(str(chats[1]["gen_ai.input.messages"]))
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[0]["parts"] == [{"type": "text", "content": "Tell me about owls"}]
    assert sent[1]["parts"][0]["name"] == "lookup"
    assert sent[2]["parts"][0]["response"] == "facts about owls"
    answer = json.loads(str(chats[1]["gen_ai.output.messages"]))
    assert answer == [{"role": "assistant", "parts": [{"type": "text", "content": "Owls hoot."}]}]


async def test_a_failed_run_and_a_denied_call_are_errors(exporter: InMemorySpanExporter) -> None:
    reporter = OtelReporter(tracer_provider=provider_for(exporter))
    model = FakeModel([reply("", tool_call("lookup", topic="x")), RuntimeError("model down")])
    agent = Agent(model, tools=[lookup], reporter=reporter, permissions=[AllowByName("none")])
    with pytest.raises(RuntimeError, match="model down"):
        await agent.arun("go")
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert dict(spans["execute_tool lookup"].attributes or {})["error.type"] == "denied"
    run = spans["invoke_agent"]
    assert run.status.status_code is trace.StatusCode.ERROR
    assert dict(run.attributes or {})["error.type"] == "RuntimeError"
    chats = [s for s in exporter.get_finished_spans() if s.name == "chat fake"]
    assert len(chats) == 2  # the failed request's span ended too
    assert any(s.status.status_code is trace.StatusCode.ERROR for s in chats)


async def test_a_cancelled_run_ends_its_open_spans(exporter: InMemorySpanExporter) -> None:
    reporter = OtelReporter(tracer_provider=provider_for(exporter))

    @tool
    async def block() -> str:
        """Wait forever."""
        scope.cancel()
        await anyio.sleep_forever()
        return "never"

    agent = Agent(FakeModel([tool_call("block")]), tools=[block], reporter=reporter)
    with anyio.CancelScope() as scope:
        await agent.arun("go")
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert set(spans) == {"invoke_agent", "chat fake", "execute_tool block"}
    assert dict(spans["execute_tool block"].attributes or {})["orchestrator.tool.outcome"] == (
        "interrupted"
    )


async def test_a_root_run_hangs_under_the_apps_current_span(
    exporter: InMemorySpanExporter,
) -> None:
    provider = provider_for(exporter)
    agent = Agent(FakeModel(["hi"]), reporter=OtelReporter(tracer_provider=provider))
    with provider.get_tracer("app").start_as_current_span("request") as request:
        await agent.arun("hello")
    run = next(s for s in exporter.get_finished_spans() if s.name == "invoke_agent")
    assert run.parent is not None
    assert run.parent.span_id == request.get_span_context().span_id


async def test_nothing_is_recorded_without_a_configured_provider(
    exporter: InMemorySpanExporter,
) -> None:
    # The global provider is the API's default (no SDK installed as global): the reporter's
    # spans do not record, and no exporter of a provider the app did not make sees any.
    assert not isinstance(trace.get_tracer_provider(), TracerProvider)
    reporter = OtelReporter()
    lead, state = team(reporter)
    provider_for(exporter)  # made, but not the global one
    assert await lead.arun(state) == "all done"
    assert exporter.get_finished_spans() == ()
    assert reporter.tracer.start_span("probe").is_recording() is False


async def test_retries_and_blocks_of_every_kind(exporter: InMemorySpanExporter) -> None:
    reporter = OtelReporter(tracer_provider=provider_for(exporter), capture_content=True)
    png = Image(b"\x89PNG", "image/png")
    state = State(messages=[Message.user("look", png)])
    reporter.on_run_start(state)  # hooks called as a provider and the loop would
    reporter.on_think_start(state)
    reporter.on_retry(state, 1, 0.5, RuntimeError("busy"))
    message = Message("assistant", (ReasoningBlock("hmm"), TextBlock("a cat")))
    reporter.on_think_end(state, Reply(message))
    reporter.on_run_end(state, None)
    (chat,) = [s for s in exporter.get_finished_spans() if s.name == "chat"]
    (retry,) = chat.events
    assert retry.name == "retry"
    assert dict(retry.attributes or {}) == {
        "attempt": 1,
        "delay_s": 0.5,
        "error.type": "RuntimeError",
    }
    attributes = dict(chat.attributes or {})
    sent = json.loads(str(attributes["gen_ai.input.messages"]))
    assert sent[0]["parts"][1] == {"type": "blob", "modality": "image", "mime_type": "image/png"}
    answer = json.loads(str(attributes["gen_ai.output.messages"]))
    assert answer[0]["parts"][0] == {"type": "reasoning", "content": "hmm"}
    # A step outside a run: its model request hangs under the current span, and ends.
    exporter.clear()
    reporter.on_think_start(state)
    reporter.on_think_end(state, Reply(Message.assistant("ok")))
    reporter.on_run_end(state, None)
    assert [s.name for s in exporter.get_finished_spans()] == ["chat"]


async def test_the_trace_context_a_child_carries_names_its_call_span_else_its_run_span(
    exporter: InMemorySpanExporter,
) -> None:
    reporter = OtelReporter(tracer_provider=provider_for(exporter))
    state = State(messages=[Message.user("go")])
    call = ToolCall("call_1", "researcher", {"task": "dig"})
    reporter.on_run_start(state)
    reporter.on_tool_start(state, call)
    in_call = reporter.trace_context(state, call)
    result = ToolResultBlock(call.id, (TextBlock("dug"),))
    reporter.on_tool_end(state, call, record_tool_result(state, call, result, outcome="done"))
    after_call = reporter.trace_context(state, call)  # a resumed child: under the run
    reporter.on_run_end(state, None)
    spans = {span.name: span.get_span_context() for span in exporter.get_finished_spans()}
    for carried, name in ((in_call, "execute_tool researcher"), (after_call, "invoke_agent")):
        context = spans[name]
        assert context is not None
        assert carried["traceparent"].startswith(
            f"00-{context.trace_id:032x}-{context.span_id:016x}-"
        )
    assert OtelReporter().trace_context(state, call) == {}  # no provider: nothing to carry


async def test_a_deferred_call_has_no_span_until_it_runs_once_approved(
    exporter: InMemorySpanExporter,
) -> None:
    """A call waiting for a person never ran: an event on the run span, no execute_tool span."""
    from orchestrator import aapprove
    from orchestrator.permissions import ApproveLater
    from stores import MemoryStore

    store = MemoryStore()
    reporter = OtelReporter(tracer_provider=provider_for(exporter))

    def agent(replies: list[Any]) -> Agent:
        return Agent(
            FakeModel(replies),
            tools=[lookup],
            store=store,
            reporter=reporter,
            permissions=[ApproveLater("lookup", reason="costly")],
        )

    state = State(id="waits", messages=[Message.user("go")])
    await agent([reply("", tool_call("lookup", topic="x"))]).arun(state)
    first = exporter.get_finished_spans()
    assert not [span for span in first if span.name.startswith("execute_tool")]
    (run,) = [span for span in first if span.name.startswith("invoke_agent")]
    (event,) = [event for event in run.events if event.name == "orchestrator.tool.deferred"]
    call_id = state.pending_calls[0].id
    assert dict(event.attributes or {}) == {
        "gen_ai.tool.name": "lookup",
        "gen_ai.tool.call.id": call_id,
        "orchestrator.reason": "costly",
    }
    exporter.clear()
    loaded = store.load("waits")
    await aapprove(loaded, call_id, by="ann")
    await agent([reply("done")]).arun(loaded)
    (tool_span,) = [s for s in exporter.get_finished_spans() if s.name == "execute_tool lookup"]
    assert dict(tool_span.attributes or {})["gen_ai.tool.call.id"] == call_id
    assert dict(tool_span.attributes or {})["orchestrator.tool.outcome"] == "done"


def ids(span: ReadableSpan) -> tuple[int, int]:
    """The span's trace id and span id."""
    context = span.get_span_context()
    assert context is not None
    return context.trace_id, context.span_id


@pytest.mark.parametrize("colour", ["async", "sync"])
async def test_spans_made_inside_a_tool_hang_under_its_execute_tool_span(
    exporter: InMemorySpanExporter, colour: str
) -> None:
    """The call's span is current while its tool runs: in its task, or its worker thread."""
    provider = provider_for(exporter)
    library = provider.get_tracer("a-library")  # say, an instrumented HTTP or MCP client

    @tool
    async def fetch_async() -> str:
        """Fetch (async)."""
        with library.start_as_current_span("library request"):
            await anyio.lowlevel.checkpoint()
        return "fetched"

    @tool
    def fetch_sync() -> str:
        """Fetch (in a worker thread)."""
        with library.start_as_current_span("library request"):
            return "fetched"

    name = f"fetch_{colour}"
    agent = Agent(
        FakeModel([[tool_call(name), tool_call(name)], "done"]),
        tools=[fetch_async, fetch_sync],
        reporter=OtelReporter(tracer_provider=provider),
    )
    assert await agent.arun("go") == "done"
    spans = exporter.get_finished_spans()
    calls = {ids(span)[1]: span for span in spans if span.name == f"execute_tool {name}"}
    inner = [span for span in spans if span.name == "library request"]
    assert len(calls) == len(inner) == 2
    parents = {span.parent.span_id for span in inner if span.parent is not None}
    assert parents == set(calls)  # each under its own call's span
    assert {ids(span)[0] for span in spans} == {ids(inner[0])[0]}
    assert trace.get_current_span() is trace.INVALID_SPAN  # nothing left current after the run
