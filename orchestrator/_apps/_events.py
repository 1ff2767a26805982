"""Events: a run and its whole subagent tree as a stream of typed, JSON-ready values.

``async with agent.events(state) as events: async for event in events: ...`` runs the agent in a
task of the block and gives its events in order. Each event is a frozen pydantic model with a
`kind` discriminator, the State it is about (`state_id`, `parent_id`), the tool call when there is
one (`call_id`), when it happened (`at`) and its place in the stream (`seq`, from 0). A subagent's
events carry its parent State (`parent_id`) and the parent's tool call that started it
(`parent_call_id`), so a UI can draw the tree. Parse one back with
``EVENT_ADAPTER.validate_json(text)``.

A run's stored history gives the same events again, except the live-only ones (text deltas,
retry notices, tool starts): see `orchestrator.apps.history_events`.

The stream is a reporter the run feeds, so it sees what every `Reporter` sees and the app's own
reporter keeps working beside it. The buffer is bounded: before each step reports (a run or a
subagent starting or ending, a model reply, a tool call starting or ending, a call closed) the
run waits while `buffer` events are unread, then reports with no await in between, so at most
`Events.bound` (`buffer` + 3: the most one step adds, less one) wait unread, whatever the number
of calls or subagents. Text and retry notices arrive from the model while it
streams, where the run cannot wait: when the buffer is full they are held for their State
(text joined, the latest retry kept) and come before that State's next event. Leaving the block
before the run ends cancels the run: its pending calls are closed as interrupted and the State
is saved, as for any cancelled run; nothing waits for the consumer that left.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, TypeAlias

import anyio
import anyio.lowlevel
import pydantic

from .._base._errors import error_text
from .._base._json import thaw
from .._base._stopped import StoppedByApproval, StoppedByLimit
from ._reporting import DEFAULT_BUFFER, Reporter

if TYPE_CHECKING:
    from .._base._messages import ToolCall
    from .._base._reply import Reply, Usage
    from .._record._history import ToolResultEntry
    from .._record._state import State

__all__ = (
    "EVENT_ADAPTER",
    "ApprovalNeeded",
    "AwaitingInfo",
    "CallInfo",
    "ChildStarted",
    "Event",
    "Events",
    "ModelReplied",
    "RateLimitWaited",
    "Retrying",
    "RunEnded",
    "RunStarted",
    "TextDelta",
    "ToolDeferred",
    "ToolEnded",
    "ToolStarted",
    "limit_info",
    "open_events",
    "usage_info",
)


class _EventBase(pydantic.BaseModel):
    """What every event has: its place, its time, and the State and call it is about."""

    model_config: ClassVar[pydantic.ConfigDict] = pydantic.ConfigDict(frozen=True)

    seq: int = 0
    at: datetime
    state_id: str
    parent_id: str | None = None
    parent_call_id: str | None = None
    call_id: str | None = None


class CallInfo(pydantic.BaseModel):
    """A tool call as events show it: its id, tool name and arguments (JSON)."""

    model_config: ClassVar[pydantic.ConfigDict] = pydantic.ConfigDict(frozen=True)

    id: str
    name: str
    args: dict[str, Any]


class AwaitingInfo(pydantic.BaseModel):
    """A call that waits for a person's decision, in the State `state_id` (the root or a child)."""

    model_config: ClassVar[pydantic.ConfigDict] = pydantic.ConfigDict(frozen=True)

    state_id: str
    call: CallInfo
    reason: str | None = None


class RunStarted(_EventBase):
    """A run of the State began (the root's, or a subagent's)."""

    kind: Literal["run_start"] = "run_start"
    agent: str | None = None


class RunEnded(_EventBase):
    """A run ended: its answer, why it stopped (`stopped`, `stop_kind`), or its `error`.

    A run stopped by a limit has `limit`: its ``name``, ``maximum``, what was ``spent``, the
    State whose limit it is (``owner``) and the State that spent the last of it (``by``).
    """

    kind: Literal["run_end"] = "run_end"
    answer: Any = None
    stopped: str | None = None
    stop_kind: str | None = None
    limit: dict[str, Any] | None = None
    error: str | None = None
    usage: dict[str, Any] = pydantic.Field(default_factory=dict[str, Any])


class TextDelta(_EventBase):
    """A chunk of a reply's text, as the model streams it."""

    kind: Literal["text"] = "text"
    text: str
    turn: int = 0  # the State's turn: the model request whose reply this text is part of


class ModelReplied(_EventBase):
    """The model replied (recorded): its text, the calls it asks for, what it cost."""

    kind: Literal["model_reply"] = "model_reply"
    text: str
    tool_calls: list[CallInfo] = pydantic.Field(default_factory=list[CallInfo])
    usage: dict[str, Any] = pydantic.Field(default_factory=dict[str, Any])


class ToolStarted(_EventBase):
    """A tool call is about to run (`call_id`): allowed, or about to end with its error.

    A call deferred to a person has `ToolDeferred` instead, and this event only when it runs
    once approved (in a later run).
    """

    kind: Literal["tool_start"] = "tool_start"
    name: str
    args: dict[str, Any]


class ToolDeferred(_EventBase):
    """A permission deferred a tool call (`call_id`) to a person: it waits, not running.

    The run stops with `ApprovalNeeded` listing it. Approved, it starts (`ToolStarted`) in
    the run that carries out the decision; denied, it starts and ends with an error there.
    """

    kind: Literal["tool_deferred"] = "tool_deferred"
    name: str
    args: dict[str, Any]
    reason: str | None = None


class ToolEnded(_EventBase):
    """A tool call's result is recorded: how it ended, its text, the subagents it started."""

    kind: Literal["tool_end"] = "tool_end"
    name: str
    outcome: str
    result: str
    is_error: bool = False
    child_ids: list[str] = pydantic.Field(default_factory=list[str])


class ChildStarted(_EventBase):
    """A tool call (`call_id`) of `parent_id` started the subagent State `state_id`."""

    kind: Literal["child_start"] = "child_start"
    agent: str | None = None


class ApprovalNeeded(_EventBase):
    """The run stopped: these calls wait for a person to approve or deny them."""

    kind: Literal["approval_needed"] = "approval_needed"
    calls: list[AwaitingInfo]


class Retrying(_EventBase):
    """The model request failed with `error` and is tried again after `delay` seconds."""

    kind: Literal["retry"] = "retry"
    attempt: int
    delay: float
    error: str


class RateLimitWaited(_EventBase):
    """The model request waits `delay` seconds for the rate limit `limit` before it is sent.

    A `delay` of 0 is a wait for a free concurrent slot, whose length is not known.
    """

    kind: Literal["rate_limit"] = "rate_limit"
    limit: str
    delay: float


Event: TypeAlias = Annotated[
    RunStarted
    | RunEnded
    | TextDelta
    | ModelReplied
    | ToolStarted
    | ToolDeferred
    | ToolEnded
    | ChildStarted
    | ApprovalNeeded
    | Retrying
    | RateLimitWaited,
    pydantic.Field(discriminator="kind"),
]
"""One event of a run: check `kind` to know which."""

EVENT_ADAPTER: pydantic.TypeAdapter[Event] = pydantic.TypeAdapter(Event)
"""Reads an event back from JSON (``EVENT_ADAPTER.validate_json(text)``) and writes it."""

_OVER = 3
"""How far past `buffer` the unread events may go: the most one step adds at once, less one.

A step reports only when at most `buffer` - 1 events are unread. The most it adds is a run's end
with calls awaiting approval: the retry notice and text held for its State, `ApprovalNeeded`
and `RunEnded` (four).
"""


def _now() -> datetime:
    return datetime.now(UTC)


def usage_info(usage: Usage) -> dict[str, Any]:
    """`usage` as events show it."""
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "requests": usage.requests,
        "cost": usage.cost,
    }


def limit_info(stopped: object) -> dict[str, Any] | None:
    """The limit a run stopped at, as events and the run JSON show it (None: not a limit)."""
    if not isinstance(stopped, StoppedByLimit):
        return None
    return {
        "name": stopped.limit,
        "maximum": stopped.turns if stopped.limit == "turns" else stopped.maximum,
        "spent": stopped.spent,
        "owner": stopped.owner,
        "by": stopped.by,
    }


def call_info(call: ToolCall) -> CallInfo:
    """`call` as events show it."""
    return CallInfo(id=call.id, name=call.name, args=thaw(call.args))


def awaiting_infos(stopped: StoppedByApproval) -> list[AwaitingInfo]:
    """The calls of an approval stop, as events show them."""
    return [
        AwaitingInfo(state_id=item.state_id, call=call_info(item.call), reason=item.reason)
        for item in stopped.calls
    ]


class Events:
    """The events of one run and its subagents: iterate with ``async for``.

    `state` is the State being run (a prompt given to `agent.events` starts a new one: read its
    id here). The iteration ends after the root run's `RunEnded`; if the run failed, the
    iteration then raises the run's exception.
    """

    def __init__(self, state: State, buffer: int) -> None:
        if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 1:
            raise ValueError(f"events(buffer=...) must be an integer >= 1, got {buffer!r}.")
        self._state = state
        self._limit = buffer
        self._queue: deque[Event] = deque()
        self._held: dict[str, list[Event]] = {}  # text and retries that came while full
        self._seq = 0
        self._left = False  # the consumer left the block: nothing waits for it any more
        self._done = False
        self._error: BaseException | None = None
        self._wake: anyio.Event | None = None  # set when an event arrives or the run ends
        self._waiting: deque[anyio.Event] = deque()  # steps waiting for room, first come first

    @property
    def state(self) -> State:
        """The State this stream runs."""
        return self._state

    @property
    def unread(self) -> int:
        """How many events wait for the consumer now."""
        return len(self._queue)

    @property
    def bound(self) -> int:
        """The most events that ever wait unread: `buffer` + 3, whatever the size of the run.

        The run waits before each step while `buffer` are unread; a step adds at most four.
        """
        return self._limit + _OVER

    def __aiter__(self) -> Events:
        return self

    async def __anext__(self) -> Event:
        while not self._queue:
            if self._done:
                error, self._error = self._error, None
                if error is not None:
                    raise error
                raise StopAsyncIteration
            self._let_one_in()  # nothing to read: a step that waits may go
            wake = self._wake = anyio.Event()
            await wake.wait()
        event = self._queue.popleft()
        if len(self._queue) < self._limit:
            self._let_one_in()
        return event

    def push(self, event: Event) -> None:
        """Add `event` (its `seq` set here), after the events held for its State.

        A text delta or a retry or rate-limit notice that comes while the buffer is full is held
        instead: text joined into the held text, a notice replacing the held one (notices come
        before any text of a model request).
        """
        if self._left:
            return  # nobody reads any more
        queue, state_id = self._queue, event.state_id
        if isinstance(event, TextDelta | Retrying | RateLimitWaited) and len(queue) >= self._limit:
            self._hold(event)
            return
        held = self._held.pop(state_id, None)
        if held is not None:
            for item in held:
                self._append(item)
        self._append(event)
        self._notify()

    def _hold(self, event: TextDelta | Retrying | RateLimitWaited) -> None:
        held = self._held.setdefault(event.state_id, [])
        if isinstance(event, Retrying | RateLimitWaited):
            # One notice is held, the latest: the bound counts one.
            notices = Retrying | RateLimitWaited
            held[:] = [item for item in held if not isinstance(item, notices)] + [event]
        elif held and isinstance(last := held[-1], TextDelta):
            held[-1] = last.model_copy(update={"text": last.text + event.text})
        else:
            held.append(event)

    def _append(self, event: Event) -> None:
        self._queue.append(event.model_copy(update={"seq": self._seq}))
        self._seq += 1

    def _notify(self) -> None:
        wake = self._wake
        if wake is not None:
            self._wake = None
            wake.set()

    def full(self) -> bool:
        """Whether `buffer` events are unread (and the consumer is still there to read them)."""
        return len(self._queue) >= self._limit and not self._done and not self._left

    async def pace(self) -> None:
        """Return once fewer than `buffer` events are unread: how a slow consumer slows the run.

        The check is the last thing it does (no await after it), so an event reported right
        after it finds room. It returns at once when the consumer left the block.
        """
        await anyio.lowlevel.checkpoint()
        while self.full():
            turn = anyio.Event()
            self._waiting.append(turn)
            try:
                await turn.wait()
            except BaseException:  # cancelled: its turn, if it had come, goes to the next
                if turn.is_set():
                    self._let_one_in()
                else:
                    self._waiting.remove(turn)
                raise
        if len(self._queue) + 1 < self._limit:
            self._let_one_in()  # room for more than this step: the next one may go too

    def _let_one_in(self) -> None:
        """Wake the step that has waited longest: one per free place, not all of them."""
        if self._waiting:
            self._waiting.popleft().set()

    def leave(self) -> None:
        """The consumer left the block: the run stops waiting for it and its events are dropped."""
        self._left = True
        self._queue.clear()
        self._held.clear()
        self._wake_producers()

    def end(self, error: BaseException | None) -> None:
        """The run is over (with `error`, raised after the last event): the iteration ends."""
        self._done = True
        self._error = error
        for held in self._held.values():  # a State whose end was never reported
            for item in held:
                self._append(item)
        self._held.clear()
        self._notify()
        self._wake_producers()

    def _wake_producers(self) -> None:
        waiting = self._waiting
        while waiting:
            waiting.popleft().set()


class _Sink(Reporter):
    """The reporter that turns a run's hooks into events of `events`."""

    def __init__(self, events: Events) -> None:
        self.events = events

    async def pace(self) -> None:
        """Let the run wait for the consumer (the run calls it before each step reports)."""
        await self.events.pace()

    def full(self) -> bool:
        """Whether the run should wait for the consumer before its next step reports."""
        return self.events.full()

    def on_run_start(self, state: State) -> None:
        self.events.push(
            RunStarted(
                at=_now(),
                state_id=state.id,
                parent_id=state.parent_id,
                parent_call_id=state.parent_call_id,
                agent=_agent_of(state),
            )
        )

    def on_text(self, state: State, chunk: str) -> None:
        self.events.push(
            TextDelta(
                at=_now(),
                state_id=state.id,
                parent_id=state.parent_id,
                parent_call_id=state.parent_call_id,
                text=chunk,
                turn=state.turn,
            )
        )

    def on_think_end(self, state: State, reply: Reply) -> None:
        message = reply.message
        self.events.push(
            ModelReplied(
                at=_now(),
                state_id=state.id,
                parent_id=state.parent_id,
                parent_call_id=state.parent_call_id,
                text=message.text,
                tool_calls=[call_info(call) for call in message.tool_calls],
                usage=usage_info(reply.usage),
            )
        )

    def on_retry(self, state: State, attempt: int, delay: float, error: BaseException) -> None:
        self.events.push(
            Retrying(
                at=_now(),
                state_id=state.id,
                parent_id=state.parent_id,
                parent_call_id=state.parent_call_id,
                attempt=attempt,
                delay=delay,
                error=f"{type(error).__name__}: {error}",
            )
        )

    def on_rate_limit(self, state: State, limit: str, delay: float) -> None:
        self.events.push(
            RateLimitWaited(
                at=_now(),
                state_id=state.id,
                parent_id=state.parent_id,
                parent_call_id=state.parent_call_id,
                limit=limit,
                delay=delay,
            )
        )

    def on_tool_start(self, state: State, call: ToolCall) -> None:
        self.events.push(
            ToolStarted(
                at=_now(),
                state_id=state.id,
                parent_id=state.parent_id,
                parent_call_id=state.parent_call_id,
                call_id=call.id,
                name=call.name,
                args=thaw(call.args),
            )
        )

    def on_tool_deferred(self, state: State, call: ToolCall, reason: str | None) -> None:
        self.events.push(
            ToolDeferred(
                at=_now(),
                state_id=state.id,
                parent_id=state.parent_id,
                parent_call_id=state.parent_call_id,
                call_id=call.id,
                name=call.name,
                args=thaw(call.args),
                reason=reason,
            )
        )

    def on_tool_end(self, state: State, call: ToolCall, entry: ToolResultEntry) -> None:
        self.events.push(
            ToolEnded(
                at=_now(),
                state_id=state.id,
                parent_id=state.parent_id,
                parent_call_id=state.parent_call_id,
                call_id=call.id,
                name=call.name,
                outcome=entry.outcome,
                result=entry.content.text,
                is_error=entry.content.is_error,
                child_ids=list(entry.child_ids),
            )
        )

    def on_child_start(self, parent: State, call: ToolCall, child: State) -> None:
        self.events.push(
            ChildStarted(
                at=_now(),
                state_id=child.id,
                parent_id=parent.id,
                parent_call_id=call.id,
                call_id=call.id,
                agent=_agent_of(child),
            )
        )

    def on_run_end(self, state: State, error: BaseException | None) -> None:
        stopped = None if error is not None else state.stopped
        if isinstance(stopped, StoppedByApproval):
            self.events.push(
                ApprovalNeeded(
                    at=_now(),
                    state_id=state.id,
                    parent_id=state.parent_id,
                    parent_call_id=state.parent_call_id,
                    calls=awaiting_infos(stopped),
                )
            )
        self.events.push(
            RunEnded(
                at=_now(),
                state_id=state.id,
                parent_id=state.parent_id,
                parent_call_id=state.parent_call_id,
                answer=thaw(state.answer) if error is None else None,
                stopped=None if stopped is None else str(stopped),
                stop_kind=None if stopped is None else stopped.kind,
                limit=limit_info(stopped),
                error=None if error is None else error_text(error),
                usage=usage_info(state.usage),
            )
        )


def _agent_of(state: State) -> str | None:
    """The agent name of the State's latest run start."""
    for entry in reversed(state.history):
        if entry.kind == "run_start":
            return entry.content.agent
    return None


@asynccontextmanager
async def open_events(
    state: State, start: Callable[[Reporter], Awaitable[object]], *, buffer: int = DEFAULT_BUFFER
) -> AsyncGenerator[Events]:
    """Run ``start(reporter)`` in a task of the block; yield the stream its reporter feeds.

    What `Agent.events` returns. The task group is the block's: when the block ends before the
    run, the run is cancelled (and saves itself, as every cancelled run does); nothing keeps
    running after the block.
    """
    events = Events(state, buffer)
    sink = _Sink(events)

    async def drive() -> None:
        try:
            await start(sink)
        except Exception as error:
            events.end(error)
        except BaseException:
            events.end(None)
            raise
        else:
            events.end(None)

    error: BaseException | None = None
    with anyio.CancelScope() as ending:
        async with anyio.create_task_group() as group:
            group.start_soon(drive, name=f"events of State {state.id}")
            try:
                yield events
            except BaseException as exc:  # re-raised below, not in an exception group
                error = exc
                ending.shield = True  # ending the group must not raise in its place
            finally:
                events.leave()  # a run closing its calls does not wait for a reader gone
                group.cancel_scope.cancel()
    if error is not None:
        raise error
