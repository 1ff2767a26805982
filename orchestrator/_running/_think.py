"""One model request of a run, recorded: the core of `Agent.athink`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from .._base._logs import get_log
from .._base._messages import Message, ToolCall
from .._base._reply import Reply
from .._record._fold import Seq
from .._record._prompt import Prompt
from .._record._recording import begin_think, merge_turn, record_error, record_reply
from ..models import Model, Request
from ..models._base import message_tokens
from ._budget import allow_request, spend
from ._frame import Frame, enter, leave

if TYPE_CHECKING:
    from ._run import Run

__all__ = ("Held", "saved_holder", "think")

_log = get_log("agent")


class Held:
    """The State of a tree that records a prompt in full, and whether that is saved yet.

    A State naming it waits for `saved`, so a stored name never points to a prompt not yet
    stored (the holder's failed save wakes it too: the holder saves it with its next save).
    """

    __slots__ = ("saved", "state_id")

    def __init__(self, state_id: str) -> None:
        self.state_id = state_id
        self.saved = anyio.Event()


def saved_holder(run: Run, prompt: Prompt) -> str | None:
    """The State of the run's tree whose saved history holds `prompt`, or None.

    For a request that records its entry after the exchange (`ask`, `compact`): it names a
    State that stored the prompt already, else records the prompt itself. It waits for none
    and claims none, so a think never waits for it.
    """
    held = run.held.get(prompt.digest)
    return held.state_id if held is not None and held.saved.is_set() else None


async def think(run: Run) -> Reply:
    """Send one model request with the State's messages and record the reply.

    The request is stored before the model is asked, so a crash while it waits is recovered
    (the request taken back). A failed request, or a failed save of it, is taken back here and
    its error recorded; the reply is a save point. Its spending counts at once against the
    limits of the run and of every run above it.

    Raises:
        LimitReachedError: A limit of the run or above it has nothing left for the request.
    """
    state, settings, budget = run.state, run.settings, run.budget
    allow_request(budget, state.id, run.estimate)
    merge_turn(state, settings.handlers)
    prompt = settings.prompt
    held = run.held.get(prompt.digest)
    mine = held is None  # the tree's first request with it: its State keeps it for the tree
    if held is None:
        held = run.held[prompt.digest] = Held(state.id)
    holder = None if mine else held.state_id
    messages = begin_think(state, model=settings.model.name, prompt=prompt, holder=holder)
    run.report("on_think_start", state)
    request = Request(settings.instructions, messages, settings.specs, _estimate(run, messages))
    try:
        if not mine and not held.saved.is_set():
            await held.saved.wait()  # the prompt it names is stored before the name is
        await run.saver.flush()
        if mine:
            held.saved.set()
        reply = await _respond(run, request)
        if run.pacers:
            await run.pace()  # a slow events consumer slows the run here
    except BaseException as error:
        with anyio.CancelScope(shield=True):
            if mine and not held.saved.is_set():  # not saved: the States waiting go on
                held.saved.set()
            record_error(state, error, again=True)
            await run.saver.flush_after(error)
        raise
    record_reply(state, reply)
    usage = reply.usage
    if budget is not None:
        spend(budget, state.id, usage)
    run.estimate = usage.input_tokens + usage.output_tokens  # the next request holds both
    run.reported = (messages.origin, len(messages) + 1, reply.message) if run.estimate else None
    run.saver.mark()
    if _log.debugging:  # the fields cost time on every think: only when they are logged
        _log.debug(
            "state.think.finished",
            state_id=state.id,
            turn=state.turn,
            calls=len(reply.message.tool_calls),
        )
    run.report("on_think_end", state, reply)
    return reply


def _estimate(run: Run, messages: Seq[Message]) -> int | None:
    """The input tokens of a request carrying `messages`, or None when not known.

    What the model reported for the conversation at its last reply, plus the messages since
    (the tool results): a rate limit then paces the request without counting all of it.
    """
    reported = run.reported
    if reported is None:
        return None
    origin, count, last = reported
    if messages.origin is not origin or len(messages) < count or messages[count - 1] is not last:
        return None  # compacted, restored or branched since: not the conversation reported
    return run.estimate + message_tokens(messages.after(count))


async def _respond(run: Run, request: Request) -> Reply:
    """The model's reply to `request`, text streamed to the run's reporters."""
    state, reporters, model = run.state, run.reporters, run.settings.model

    def on_text(chunk: str) -> None:
        for reporter in reporters:
            reporter.on_text(state, chunk)

    token = enter(Frame(run, thinking=True))  # a provider's retries reach the reporters
    try:
        return check_reply(model, await model.respond(request, on_text=on_text))
    finally:
        leave(token)


def check_reply(model: Model, reply: object) -> Reply:
    """`reply` if it is a `Reply` whose calls have distinct ids; repeated or empty ids renewed.

    Raises:
        TypeError: `reply` is not a `Reply`.
    """
    if not isinstance(reply, Reply):
        raise TypeError(f"The model {model.name!r} returned a {type(reply).__name__}, not a Reply.")
    ids = [call.id for call in reply.message.tool_calls]
    if all(ids) and len(set(ids)) == len(ids):
        return reply
    # Give repeated or empty call ids fresh ones: every call needs its own result.
    seen: set[str] = set()
    blocks: list[Any] = []
    for index, block in enumerate(reply.message.content):
        if isinstance(block, ToolCall):
            if not block.id or block.id in seen:
                block = ToolCall(f"{block.id or 'call'}_{index}", block.name, block.args)
            seen.add(block.id)
        blocks.append(block)
    message = Message("assistant", tuple(blocks))
    return Reply(message, reply.usage, reply.stop_reason, reply.model)
