"""The worker side of RayRunner, without Ray: a `ChildWorker` runs a `RayJob` here.

What a Ray actor does on a worker (open the store by URL, rebuild the agent from the registry,
run the child linked to its call) is plain code; these tests run it in this process.
"""

from __future__ import annotations

import sys
import time
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext

from orchestrator import Agent, Link, State, tool
from orchestrator._running._runner import load_state
from orchestrator.otel import OtelReporter
from orchestrator.runners import ChildJob
from orchestrator.runners._ray import ChildWorker, RayJob, load_registry
from orchestrator.runners.contract import REGISTRY
from orchestrator.testing import FakeModel, tool_call
from stores import SQLiteStore
from tests.doubles import results

pytestmark = pytest.mark.anyio

LINK = Link(parent_id="lead", call_id="call_1", scope="lead:1:call_1/0")


def job(store: SQLiteStore, task: str | None, deadline: float | None = None) -> RayJob:
    return RayJob(
        agent="contract_child",
        link=LINK,
        state_id="kid",
        task=task,
        store_url=store.url,
        deadline=deadline,
    )


async def test_a_job_runs_its_child_linked_and_saved_in_the_store_of_its_url(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    assert await ChildWorker(REGISTRY).run(job(store, "turns 2")) is None
    child = store.load("kid")
    assert (child.parent_id, child.parent_call_id) == ("lead", "call_1")
    assert child.answer == "answer to turns 2"
    assert child.usage.requests == 2


async def test_a_failing_child_is_saved_and_its_error_returned_as_text(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    failed = await ChildWorker(REGISTRY).run(job(store, "fail"))
    assert failed == "RuntimeError: the model is down"
    assert [entry.kind for entry in store.load("kid").history][-1] == "error"


async def test_a_child_stops_at_the_deadline_of_its_job(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    marker = tmp_path / "waiting"
    worker = ChildWorker(REGISTRY)
    assert await worker.run(job(store, f"wait {marker}", deadline=time.time() + 1)) is None
    assert [r.outcome for r in results(store.load("kid"))] == ["interrupted"]
    assert marker.exists()


async def test_a_continued_child_goes_on_from_its_stored_history(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    worker = ChildWorker(REGISTRY)
    marker = tmp_path / "waiting"
    await worker.run(job(store, f"wait {marker}", deadline=time.time() + 1))
    assert await worker.run(job(store, None)) is None  # task None: continue `kid`
    child = store.load("kid")
    assert child.answer == f"answer to wait {marker}"
    assert child.usage.requests == 2


def test_a_registry_must_give_named_agents(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("registry_under_test")
    monkeypatch.setitem(sys.modules, "registry_under_test", module)
    with pytest.raises(TypeError, match="has no function 'agents'"):
        load_registry("registry_under_test", None)
    module.build = lambda store: {"a": Agent(FakeModel([]), name="a")}  # type: ignore[attr-defined]
    assert list(load_registry("registry_under_test:build", None)) == ["a"]
    module.agents = lambda store: [Agent(FakeModel([]))]  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="each item must be an Agent with a name"):
        load_registry("registry_under_test", None)
    module.agents = lambda store: 3  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="must return a list of Agents"):
        load_registry("registry_under_test", None)


@tool
def note(text: str) -> str:
    """Take a note."""
    return f"noted {text}"


class InProcessRunner:
    """RayRunner without Ray: each job goes as a `RayJob` to a `ChildWorker` in this process."""

    def __init__(self, registry: str) -> None:
        self.worker = ChildWorker(registry)
        self.sent: list[RayJob] = []

    def check(self, job: ChildJob) -> None:
        """Every job runs."""

    async def run(self, job: ChildJob) -> State:
        remote = RayJob.of(job)
        self.sent.append(remote)
        assert await self.worker.run(remote) is None
        assert job.store is not None
        return await load_state(job.store, job.state_id)


def traced_lead(store: SQLiteStore, runner: InProcessRunner, reporter: OtelReporter) -> Agent:
    """A lead whose subagent `digger` runs on `runner`; its own spans go to `reporter`."""
    digger = Agent(FakeModel([]), name="digger", description="Digs.")  # rebuilt on the worker
    return Agent(
        FakeModel([tool_call("digger", task="dig"), "done"]),
        name="lead",
        tools=[digger],
        store=store,
        runner=runner,
        reporter=reporter,
    )


@pytest.fixture
def worker_spans(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """The registry ``traced_registry``: `digger`, traced by its own provider (the worker's)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    module = types.ModuleType("traced_registry")

    def agents(store: Any) -> list[Agent]:
        digger = Agent(
            FakeModel([tool_call("note", text="x"), "dug"]),
            name="digger",
            tools=[note],
            store=store,
            reporter=OtelReporter(tracer_provider=provider),
        )
        return [digger]

    module.agents = agents  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "traced_registry", module)
    return exporter


def span(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    (found,) = [s for s in spans if s.name == name]
    return found


def ids(span: ReadableSpan) -> SpanContext:
    context = span.get_span_context()
    assert context is not None
    return context


async def test_a_remote_child_run_span_hangs_under_the_parent_call_span(
    tmp_path: Path, worker_spans: InMemorySpanExporter
) -> None:
    parent_spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(parent_spans))
    runner = InProcessRunner("traced_registry")
    lead = traced_lead(
        SQLiteStore(tmp_path / "runs.db"), runner, OtelReporter(tracer_provider=provider)
    )
    assert await lead.arun("go") == "done"

    call = span(parent_spans.get_finished_spans(), "execute_tool digger")
    (sent,) = runner.sent
    context = ids(call)
    traceparent = sent.trace_context["traceparent"]  # version-trace id-span id-flags
    assert traceparent.startswith(f"00-{context.trace_id:032x}-{context.span_id:016x}-")
    remote = worker_spans.get_finished_spans()
    run = span(remote, "invoke_agent digger")
    assert ids(run).trace_id == context.trace_id
    assert run.parent is not None
    assert (run.parent.span_id, run.parent.is_remote) == (context.span_id, True)
    tool_span = span(remote, "execute_tool note")  # the child's own spans nest under its run
    assert tool_span.parent is not None
    assert tool_span.parent.span_id == ids(run).span_id


async def test_without_a_tracing_parent_the_remote_child_starts_its_own_trace(
    tmp_path: Path, worker_spans: InMemorySpanExporter
) -> None:
    runner = InProcessRunner("traced_registry")
    lead = traced_lead(SQLiteStore(tmp_path / "runs.db"), runner, OtelReporter())  # no provider
    assert await lead.arun("go") == "done"
    assert runner.sent[0].trace_context == {}
    assert span(worker_spans.get_finished_spans(), "invoke_agent digger").parent is None
