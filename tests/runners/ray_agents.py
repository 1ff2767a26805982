"""The agents the Ray tests' workers rebuild by name (the registry ``tests.runners.ray_agents``).

The researcher's model decides each reply from its task, so any number of children run on one
registry: ``"turns N"`` takes N turns, ``"remember KEY"`` writes memory, ``"wait PATH"`` touches
PATH and waits, ``"die PATH"`` touches PATH and kills its worker with SIGKILL, and
``"vanish PATH"`` does that as its run starts, before anything of the child is saved.
The spender (``"spend N"``) spends `SPENT` per reply for N turns, pausing in a tool each turn.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from orchestrator import Agent, Memory, Message, Reply, Reporter, State, ToolCall, Usage, tool
from orchestrator.models import Request
from orchestrator.otel import OtelReporter
from orchestrator.permissions import ApproveLater
from orchestrator.testing import FakeModel

__all__ = (
    "SPENT",
    "JsonLines",
    "agents",
    "decide",
    "publisher",
    "researcher",
    "spender",
    "traced",
)


def decide(request: Request) -> Any:
    """The researcher's next reply, from its task and how many turns it took."""
    task = request.messages[0].text
    turns = sum(1 for message in request.messages if message.role == "assistant")
    verb, _, arg = task.partition(" ")
    if verb == "turns" and turns + 1 < int(arg):
        return ToolCall(f"call_{turns}", "note", {"text": f"step {turns}"})
    if verb in ("remember", "wait", "die") and turns == 0:
        return ToolCall(f"call_{verb}", verb, {"arg": arg})
    return f"answer to {task}"


@tool
def note(text: str) -> str:
    """Take a note.

    Args:
        text: The note.
    """
    return f"noted {text}"


@tool
def remember(arg: str, memory: Memory) -> str:
    """Remember a key.

    Args:
        arg: The key.
    """
    memory.set(arg, True)
    return "remembered"


@tool
async def wait(arg: str) -> str:
    """Touch a file, then wait (until cancelled).

    Args:
        arg: The file to touch.
    """
    await anyio.Path(arg).write_text(str(os.getpid()))
    await anyio.sleep(120)
    return "waited"


@tool
def die(arg: str) -> str:
    """Touch a file, then kill this process.

    Args:
        arg: The file to touch.
    """
    Path(arg).touch()
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


class Vanish(Reporter):
    """Kills the worker as a ``"vanish PATH"`` run starts: before the child's first save."""

    def on_run_start(self, state: State) -> None:
        verb, _, arg = state.messages[0].text.partition(" ")
        if verb == "vanish":
            Path(arg).touch()
            os.kill(os.getpid(), signal.SIGKILL)


def researcher(store: Any = None, reporter: Reporter | None = None) -> Agent:
    """The researcher, saving in `store` (its memory is kept there too), seen by `reporter`.

    Without a reporter it has `Vanish`, so a ``"vanish PATH"`` task kills its worker.
    """
    return Agent(
        FakeModel([decide] * 10_000),
        name="researcher",
        description="Researches one question",
        tools=[note, remember, wait, die],
        store=store,
        reporter=Vanish() if reporter is None else reporter,
    )


@tool
def publish(arg: str) -> str:
    """Publish: append a line to a file (a person approves it first).

    Args:
        arg: The file.
    """
    with Path(arg).open("a", encoding="utf-8") as out:
        out.write("published\n")
    return "published"


def _publishing(request: Request) -> Any:
    """The publisher publishes once (``"publish PATH"``), then answers."""
    if not any(message.role == "assistant" for message in request.messages):
        return ToolCall("call_publish", "publish", {"arg": request.messages[0].text.split(" ")[1]})
    return "publisher done"


def publisher(store: Any = None) -> Agent:
    """An agent whose `publish` calls wait for a person's approval."""
    return Agent(
        FakeModel([_publishing] * 100),
        name="publisher",
        description="Publishes, once a person approves",
        tools=[publish],
        store=store,
        permissions=[ApproveLater("publish", reason="it goes public")],
    )


SPENT = Usage(input_tokens=100, output_tokens=10, requests=1)
"""What each of the spender's replies spends."""


def _spending(request: Request) -> Reply:
    """A pause each turn, ``"spend N"`` times, then the answer; each reply spends `SPENT`."""
    turns = sum(1 for message in request.messages if message.role == "assistant")
    if turns + 1 < int(request.messages[0].text.split(" ")[1]):
        message = Message.assistant(tool_calls=[ToolCall(f"call_{turns}", "pause", {})])
        return Reply(message, SPENT, stop_reason="tool_use")
    return Reply(Message.assistant("spent"), SPENT, stop_reason="end_turn")


@tool
async def pause() -> str:
    """Wait a tenth of a second (a tool that takes time)."""
    await anyio.sleep(0.1)
    return "paused"


def spender(store: Any = None) -> Agent:
    """An agent whose every reply spends tokens (`SPENT`), for the limits of a remote child."""
    return Agent(
        FakeModel([_spending] * 10_000),
        name="spender",
        description="Spends tokens for a number of turns",
        tools=[pause],
        store=store,
    )


def agents(store: Any) -> list[Agent]:
    """The registry: the agents a worker can run, built on the worker's store."""
    return [researcher(store), publisher(store), spender(store)]


def traced(store: Any) -> list[Agent]:
    """The registry ``tests.runners.ray_agents:traced``: the researcher, traced on the worker.

    Its spans go, one JSON line each as they end, to ``spans.jsonl`` beside the store's SQLite
    file, where the test reads what the worker process exported.
    """
    provider = TracerProvider()
    exporter = JsonLines(Path(store.path).parent / "spans.jsonl")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return [researcher(store, OtelReporter(tracer_provider=provider))]


class JsonLines(SpanExporter):
    """Appends each span to a file as one JSON line: name, trace id, span id, parent id (hex)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Append `spans` to the file."""
        with self.path.open("a", encoding="utf-8") as out:
            for span in spans:
                context, parent = span.get_span_context(), span.parent
                assert context is not None
                record = {
                    "name": span.name,
                    "trace_id": f"{context.trace_id:032x}",
                    "span_id": f"{context.span_id:016x}",
                    "parent_id": None if parent is None else f"{parent.span_id:016x}",
                }
                out.write(json.dumps(record) + "\n")
        return SpanExportResult.SUCCESS
