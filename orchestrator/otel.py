"""Traces of runs with OpenTelemetry: `OtelReporter` (``pip install 'orchestrator[otel]'``).

A reporter that turns a run into spans, named and labelled after the OpenTelemetry GenAI
semantic conventions (``gen_ai.*``), nested like the tree of States:

- ``invoke_agent {agent}``: one run of a State (``gen_ai.agent.name``,
  ``gen_ai.conversation.id`` and ``orchestrator.state.id`` = the State's id, its usage);
- ``chat {model}``: one model request under its run (``gen_ai.request.model``,
  ``gen_ai.usage.input_tokens``, ``gen_ai.usage.output_tokens``, the finish reason);
- ``execute_tool {tool}``: one tool call under its run (``gen_ai.tool.name``,
  ``gen_ai.tool.call.id``, ``orchestrator.tool.outcome``), current while the tool runs, so
  spans the tool makes (an MCP client's, say) hang under it; a call deferred to a person has
  none until it runs, only an ``orchestrator.tool.deferred`` event on its run's span;
- a subagent's run under the span of the tool call that started it, here or on a runner's
  worker (the job carries the call span's W3C trace context, `trace_context`, and the worker
  runs the child under it).

A root run hangs under the span current where it started (a web request's, say). Message
contents (the messages, the reply, tool arguments and results) are recorded only with
``capture_content=True``. It uses only the OpenTelemetry API: nothing is recorded or exported
unless the app configured a tracer provider (the SDK, an exporter), and without one each hook
costs little.

Example:
    ```python
    from orchestrator import Agent
    from orchestrator.otel import OtelReporter
    from orchestrator.testing import FakeModel

    agent = Agent(FakeModel(["Hello!"]), reporter=OtelReporter())
    ```
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, TypeVar

from ._apps._reporting import Reporter
from ._base._messages import Image, Message, ReasoningBlock, TextBlock, ToolCall, ToolResultBlock

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
except ImportError as _missing:  # pragma: no cover - the message is the point
    raise ImportError(
        "orchestrator.otel needs the OpenTelemetry API: pip install 'orchestrator[otel]'"
    ) from _missing

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ._base._reply import Reply
    from ._record._history import ToolResultEntry
    from ._record._state import State

__all__ = ("OtelReporter",)

_SCOPE = "orchestrator"
_T = TypeVar("_T")


class OtelReporter(Reporter):
    """Spans for each run, model request and tool call, nested like the tree of States.

    Pass it as ``Agent(reporter=OtelReporter())``: subagents report to their parent's
    reporter, so one reporter on the root agent traces the whole tree.

    Args:
        tracer_provider: Where the spans go; the app's global provider by default (with none
            configured, nothing is recorded).
        capture_content: Whether to record message contents: the messages sent, the reply,
            tool arguments and results. Off by default: they may hold personal data.
    """

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        capture_content: bool = False,
    ) -> None:
        self.tracer: trace.Tracer = trace.get_tracer(_SCOPE, tracer_provider=tracer_provider)
        self.capture_content = capture_content
        self._runs: dict[str, trace.Span] = {}  # by State id
        self._thinks: dict[str, trace.Span] = {}  # the model request in progress, by State id
        self._calls: dict[tuple[str, str], trace.Span] = {}  # by State id and call id
        self._parents: dict[str, otel_context.Context] = {}  # a child's: its parent call's span

    # -- runs ------------------------------------------------------------------------------------

    def on_run_start(self, state: State) -> None:
        """Start the run's span, under the call that started it (or the current span)."""
        agent = _agent_name(state)
        parent = self._parents.pop(state.id, None)
        span = self.tracer.start_span(
            f"invoke_agent {agent}" if agent else "invoke_agent",
            context=parent,
            kind=trace.SpanKind.INTERNAL,
        )
        if span.is_recording():
            span.set_attribute("gen_ai.operation.name", "invoke_agent")
            if agent:
                span.set_attribute("gen_ai.agent.name", agent)
            span.set_attribute("gen_ai.conversation.id", state.id)
            span.set_attribute("orchestrator.state.id", state.id)
            if state.parent_id is not None:
                span.set_attribute("orchestrator.parent.id", state.parent_id)
            if state.parent_call_id is not None:
                span.set_attribute("orchestrator.parent_call.id", state.parent_call_id)
        self._runs[state.id] = span

    def on_run_end(self, state: State, error: BaseException | None) -> None:
        """End the run's span (and a model request it left open), with its usage."""
        think = self._thinks.pop(state.id, None)
        if think is not None:
            _fail(think, error)
            think.end()
        for key in [key for key in self._calls if key[0] == state.id]:
            call = self._calls.pop(key)
            _fail(call, error)
            call.end()
        span = self._runs.pop(state.id, None)
        if span is None:
            return
        if span.is_recording():
            usage = state.usage
            span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
            span.set_attribute("orchestrator.turn", state.turn)
            if state.stopped is not None:
                span.set_attribute("orchestrator.stopped", type(state.stopped).__name__)
            if error is not None:
                _fail(span, error)
        span.end()

    # -- model requests --------------------------------------------------------------------------

    def on_think_start(self, state: State) -> None:
        """Start the model request's span under its run."""
        span = self._start(state.id, trace.SpanKind.CLIENT, "chat", _requested_model, state)
        if span.is_recording():
            model = _requested_model(state)
            span.set_attribute("gen_ai.operation.name", "chat")
            if model:
                span.set_attribute("gen_ai.request.model", model)
            span.set_attribute("orchestrator.state.id", state.id)
            span.set_attribute("orchestrator.turn", state.turn)
            if self.capture_content:
                span.set_attribute("gen_ai.input.messages", _messages_json(state.messages))
        self._thinks[state.id] = span

    def on_retry(self, state: State, attempt: int, delay: float, error: BaseException) -> None:
        """Note the retry on the model request's span."""
        span = self._thinks.get(state.id)
        if span is not None and span.is_recording():
            span.add_event(
                "retry",
                {"attempt": attempt, "delay_s": delay, "error.type": type(error).__qualname__},
            )

    def on_think_end(self, state: State, reply: Reply) -> None:
        """End the model request's span with the reply's usage and finish reason."""
        span = self._thinks.pop(state.id, None)
        if span is None:
            return
        if span.is_recording():
            usage = reply.usage
            span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
            if reply.model:
                span.set_attribute("gen_ai.response.model", reply.model)
            if reply.stop_reason:
                span.set_attribute("gen_ai.response.finish_reasons", (reply.stop_reason,))
            if self.capture_content:
                span.set_attribute("gen_ai.output.messages", _messages_json([reply.message]))
        span.end()

    # -- tool calls ------------------------------------------------------------------------------

    def on_tool_start(self, state: State, call: ToolCall) -> None:
        """Start the tool call's span under its run."""
        span = self._start(state.id, trace.SpanKind.INTERNAL, "execute_tool", _name_of, call)
        if span.is_recording():
            span.set_attribute("gen_ai.operation.name", "execute_tool")
            span.set_attribute("gen_ai.tool.name", call.name)
            span.set_attribute("gen_ai.tool.call.id", call.id)
            span.set_attribute("gen_ai.tool.type", "function")
            span.set_attribute("orchestrator.state.id", state.id)
            if self.capture_content:
                span.set_attribute("gen_ai.tool.call.arguments", _json(call.args))
        self._calls[state.id, call.id] = span

    def on_tool_deferred(self, state: State, call: ToolCall, reason: str | None) -> None:
        """Note on the run's span that a call waits for a person: it gets no span, not running.

        Its ``execute_tool`` span starts when it runs once approved, under that later run.
        """
        span = self._runs.get(state.id)
        if span is not None and span.is_recording():
            attributes = {"gen_ai.tool.name": call.name, "gen_ai.tool.call.id": call.id}
            if reason is not None:
                attributes["orchestrator.reason"] = reason
            span.add_event("orchestrator.tool.deferred", attributes)

    def tool_scope(self, state: State, call: ToolCall) -> AbstractContextManager[object]:
        """Make the call's span current while its tool runs (in the task that runs it).

        So spans made inside the tool by code that uses the current span (the MCP SDK's client
        requests, an instrumented HTTP client) are its children, in the run's trace.
        """
        span = self._calls.get((state.id, call.id))
        if span is None or not span.get_span_context().is_valid:
            return nullcontext()
        return trace.use_span(
            span, end_on_exit=False, record_exception=False, set_status_on_exception=False
        )

    def on_child_start(self, parent: State, call: ToolCall, child: State) -> None:
        """Remember that the child's run goes under the call's span."""
        span = self._calls.get((parent.id, call.id))
        if span is not None:
            self._parents[child.id] = trace.set_span_in_context(span)

    def trace_context(self, state: State, call: ToolCall) -> Mapping[str, str]:
        """The W3C trace context of `call`'s span (of the run's, outside a call), to carry.

        A runner sends it with a child run it runs elsewhere (a `RayRunner` worker), so the
        child's run span there has `call`'s span as parent: one trace across the cluster. It
        is what `opentelemetry.propagate.inject` writes (``traceparent``, ``tracestate``, the
        app's baggage); empty when the span records nothing (no tracer provider).
        """
        span = self._calls.get((state.id, call.id)) or self._runs.get(state.id)
        if span is None or not span.get_span_context().is_valid:
            return {}
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        return carrier

    def on_tool_end(self, state: State, call: ToolCall, entry: ToolResultEntry) -> None:
        """End the tool call's span with its outcome (and its result, when asked for)."""
        span = self._calls.pop((state.id, call.id), None)
        if span is None:
            return
        if span.is_recording():
            span.set_attribute("orchestrator.tool.outcome", entry.outcome)
            if entry.child_ids:
                span.set_attribute("orchestrator.child.ids", tuple(entry.child_ids))
            if entry.outcome != "done":
                span.set_attribute("error.type", entry.outcome)
                span.set_status(trace.Status(trace.StatusCode.ERROR, entry.outcome))
            if self.capture_content:
                span.set_attribute("gen_ai.tool.call.result", entry.content.text)
        span.end()

    # -- helpers ---------------------------------------------------------------------------------

    def _start(
        self,
        state_id: str,
        kind: trace.SpanKind,
        operation: str,
        detail: Callable[[_T], str | None],
        source: _T,
    ) -> trace.Span:
        """Start a span ``"{operation} {detail(source)}"`` under the run of `state_id`.

        Outside a run it goes under the current span. Under a run whose span is the API's
        no-op one (no tracer provider configured) it is that span: nothing records, so the
        hooks skip making spans, contexts and names (a turn pays a few dict look-ups).
        """
        run = self._runs.get(state_id)
        if run is not None and not run.get_span_context().is_valid:
            return run
        name = detail(source)
        return self.tracer.start_span(
            f"{operation} {name}" if name else operation,
            context=None if run is None else trace.set_span_in_context(run),
            kind=kind,
        )


def _name_of(call: ToolCall) -> str:
    return call.name


def _agent_name(state: State) -> str | None:
    for entry in reversed(state.history):
        if entry.kind == "run_start":
            return entry.content.agent
    return None


def _requested_model(state: State) -> str | None:
    for entry in reversed(state.history):
        if entry.kind == "model_request":
            return entry.content.model
    return None


def _fail(span: trace.Span, error: BaseException | None) -> None:
    """Mark `span` failed by `error` (a cancellation too: the work did not finish)."""
    if error is None or not span.is_recording():
        return
    span.set_attribute("error.type", type(error).__qualname__)
    span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}"))
    if isinstance(error, Exception):
        span.record_exception(error)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _messages_json(messages: Iterable[Message]) -> str:
    """Messages in the GenAI conventions' shape: roles with typed parts (no image bytes)."""
    return _json([{"role": m.role, "parts": [_part(b) for b in m.content]} for m in messages])


def _part(block: object) -> dict[str, Any]:
    if isinstance(block, TextBlock):
        return {"type": "text", "content": block.text}
    if isinstance(block, ToolCall):
        return {"type": "tool_call", "id": block.id, "name": block.name, "arguments": block.args}
    if isinstance(block, ToolResultBlock):
        text = "".join(part.text for part in block.content if isinstance(part, TextBlock))
        return {"type": "tool_call_response", "id": block.call_id, "response": text}
    if isinstance(block, ReasoningBlock):
        return {"type": "reasoning", "content": block.text}
    if isinstance(block, Image):
        return {"type": "blob", "modality": "image", "mime_type": block.media_type}
    return {"type": type(block).__name__}
