"""Structured answers (`ask`) and model-written summaries (`compact`)."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import pydantic

from .._base._errors import OutputError
from .._base._messages import Message
from .._base._reply import Usage
from .._record._recording import compaction, record_ask, record_compact, require_closed_turn
from ..models import Request
from ._budget import allow_request, spend
from ._think import saved_holder

if TYPE_CHECKING:
    from ._run import Run

__all__ = ("ask", "compact", "extract_json")

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)

COMPACT_PROMPT = (
    "Summarize the conversation so far for your own later use: the task, what was done, what"
    " was found, and what is left. Keep names, numbers and decisions. Reply with the summary only."
)


def extract_json(text: str) -> Any:
    """The JSON value in a model's reply.

    It is the whole text, a fenced block, or the outermost object or array in it. Raises
    `ValueError` when there is none.
    """
    candidates = [text.strip()]
    candidates += [match.strip() for match in _FENCE.findall(text)]
    for opener, closer in ("{}", "[]"):
        start, end = text.find(opener), text.rfind(closer)
        if 0 <= start < end:
            candidates.append(text[start : end + 1])
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    raise ValueError("the reply holds no JSON value")


def _instructions(adapter: pydantic.TypeAdapter[Any], returns: Any) -> str:
    if returns is str:
        return ""
    schema = json.dumps(adapter.json_schema(), ensure_ascii=False)
    return (
        "\n\nAnswer with only a JSON value (no other text) that matches this JSON schema:\n"
        + schema
    )


def _parse(adapter: pydantic.TypeAdapter[Any], returns: Any, text: str) -> Any:
    if returns is str:
        if not text.strip():
            raise ValueError("the reply is empty")
        return text
    return adapter.validate_python(extract_json(text))


async def ask(run: Run, prompt: str, returns: Any, retries: int) -> Any:
    """The core of `Agent.aask`: the exchange is recorded as one `ask` entry, a save point.

    A failed exchange that was paid for is recorded too (its usage), and the error raised. Its
    requests count against the run's limits like a think's (`LimitReachedError` when none is
    left).
    """
    state, settings = run.state, run.settings
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("ask needs a question: pass a non-empty prompt str.")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an integer >= 0, got {retries!r}.")
    require_closed_turn(state, "ask")
    try:
        adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(returns)
    except pydantic.PydanticSchemaGenerationError as error:
        raise TypeError(f"ask cannot validate the type {returns!r}: {error}") from None
    messages = [*state.messages, Message.user(prompt + _instructions(adapter, returns))]
    told = settings.prompt_without_tools  # what its requests tell the model besides messages

    def record(answer: Any, usage: Usage, error: str | None = None) -> None:
        holder = saved_holder(run, told)
        record_ask(state, prompt, answer, usage, error=error, prompt=told, holder=holder)
        run.saver.mark()

    usage = Usage()
    problem = ""
    for _ in range(retries + 1):
        request = Request(system=settings.instructions, messages=tuple(messages))
        allow_request(run.budget, state.id, run.estimate)
        try:
            reply = await settings.model.respond(request)
        except BaseException as error:
            if not usage.is_empty():  # earlier replies were paid for: keep their usage
                record(None, usage, f"{type(error).__name__}: {error}")
            raise
        usage = usage + reply.usage
        if run.budget is not None:
            spend(run.budget, state.id, reply.usage)
        try:
            value = _parse(adapter, returns, reply.message.text)
        except (ValueError, pydantic.ValidationError) as error:
            problem = str(error)
            messages += [
                reply.message,
                Message.user(
                    f"That answer is not valid: {problem}\nAnswer again with only the value."
                ),
            ]
            continue
        record(adapter.dump_python(value, mode="json"), usage)
        return value
    record(None, usage, problem)
    raise OutputError(
        f"The model gave no valid answer to ask(..., returns={_name(returns)})"
        f" after {retries + 1} tries; the last problem: {problem}. Make the prompt clearer or"
        " raise retries."
    )


def _name(tp: Any) -> str:
    return str(getattr(tp, "__name__", tp))


async def compact(run: Run) -> None:
    """The core of `Agent.acompact`: the model writes a summary, then the State is compacted.

    The compaction (or, for an empty summary, what the request spent) is a save point.
    """
    state, settings = run.state, run.settings
    with compaction(state):
        require_closed_turn(state, "compact")
        messages = state.messages
        request = Request(
            system=settings.instructions, messages=(*messages, Message.user(COMPACT_PROMPT))
        )
        allow_request(run.budget, state.id, run.estimate)
        reply = await settings.model.respond(request)
        if run.budget is not None:
            spend(run.budget, state.id, reply.usage)
        summary = reply.message.text.strip()
        told = settings.prompt_without_tools  # what the request told the model
        holder = saved_holder(run, told)
        if not summary:
            # Nothing to compact with, but the request was paid for: record what it spent.
            record_ask(
                state,
                COMPACT_PROMPT,
                None,
                reply.usage,
                error="empty summary",
                prompt=told,
                holder=holder,
            )
            run.saver.mark()
            raise OutputError("The model returned an empty summary, so nothing was compacted.")
        record_compact(
            state, summary, reply.usage, covered=len(messages), prompt=told, holder=holder
        )
        run.saver.mark()
