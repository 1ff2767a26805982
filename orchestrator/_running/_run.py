"""One run: the object `arun` builds and every layer of the run works with.

`Agent.arun` makes a `Run` (the agent's `Settings`, the State, its saver, its reporters, its
tool limiters, its subagent depth, the tool call it hangs under) and passes it
explicitly to the loop's steps, tool execution, `ask` and subagent linking; none of them reaches
back into the Agent. A step called on its own (``await agent.athink(state)`` outside a run) gets
a run of its own for the call (`step`); called from a loop body, it finds its run through the
current frame (`orchestrator._running._frame`).

A child run's place (the tool call it hangs under) comes from the frame when a tool runs
another agent here, or explicitly as a `Link` (``agent.arun(state, link=...)``): what a runner
does, here or on another machine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypeVar

import anyio

from .._apps._reporting import Pacer, Reporter
from .._base._errors import LimitReachedError, is_interruption
from .._base._limits import Limits
from .._base._link import Link
from .._base._logs import get_log
from .._base._messages import Message
from .._base._stopped import StoppedByApproval
from .._record._history import RunStart
from .._record._prompt import Prompt
from .._record._recording import (
    begin_run,
    bind_schema,
    close_pending,
    end_run,
    merge_turn,
    record_error,
    record_run_start,
    store_of,
    value_of,
)
from .._tooling._toolsets import open_toolsets
from ..models import ModelWithOptions
from ._budget import Budget, before_child, budget_for, last_context
from ._execute import use_tools
from ._frame import CallContext, Frame, current_frame, enter, leave
from ._loop import Loop, LoopBody, run_body
from ._saver import Saver, Writer
from ._subagents import cut_off, depth_below, link_child, parent_call, resume_children
from ._think import Held

if TYPE_CHECKING:
    from .._base._messages import ToolCall
    from .._record._state import State
    from .._record._store_client import StoreClient
    from .._record._typed import Handler, Schema
    from .._tooling._memory import Memory
    from .._tooling._permissions import Permission
    from .._tooling._tools import Tool, ToolSpec
    from .._tooling._toolsets import Toolset
    from ..models import Model
    from ._agent import Agent
    from ._runner import Runner

__all__ = (
    "DEFAULT_MAX_SUBAGENT_DEPTH",
    "DEFAULT_SYNC_THREADS",
    "Run",
    "Settings",
    "ToolErrors",
    "run_agent",
    "step",
)

_T = TypeVar("_T")
_log = get_log("agent")
_NOTHING = nullcontext()  # the tool scope of a run whose reporters give none

DEFAULT_SYNC_THREADS = 40
"""How many sync tool calls of one run run at once (worker threads) unless `max_concurrency` is
set: as many as anyio's default thread limiter. A model asking for 10,000 calls in one reply
gets them run 40 at a time, not 10,000 threads."""

DEFAULT_MAX_SUBAGENT_DEPTH = 10
"""How many levels of subagents a run may nest below it unless `max_subagent_depth` is set: a
sync tool whose agent runs itself stops there instead of growing without bound."""


ToolErrors: TypeAlias = Literal["raise", "to_model"]
"""What an exception from a tool (other than a `ToolError`) does: abort the run, or reach the
model as an error result."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """An Agent's settings as its runs use them: checked and built once, with the Agent."""

    model: Model
    instructions: str | None
    tools: Mapping[str, Tool]  # by name
    handlers: Mapping[str, Mapping[str, Handler]]  # each tool's state-update handlers, by name
    specs: tuple[ToolSpec, ...]
    name: str | None
    store: StoreClient | None  # resolved once, when the Agent is made
    schema: Schema | None
    memory: Memory | None
    permissions: tuple[Permission, ...] | None
    reporter: Reporter | None
    loop: Loop | LoopBody
    max_concurrency: int | None
    tool_timeout: float | None
    max_subagent_depth: int = DEFAULT_MAX_SUBAGENT_DEPTH
    runner: Runner | None = None  # where the children of its subagent tools run (None: here)
    toolsets: tuple[Toolset, ...] = ()  # opened by each run: their tools join `tools`
    tool_errors: ToolErrors = "raise"
    limits: Limits | None = None  # what each run of the agent may spend, its subtree included
    prompt: Prompt = field(init=False)  # what each request tells the model, made once
    # What the requests of ask and compact tell it: the same instructions and options, no tools.
    prompt_without_tools: Prompt = field(init=False)

    def __post_init__(self) -> None:
        model = self.model
        options = model.options if isinstance(model, ModelWithOptions) else None
        prompt = Prompt.of(self.instructions, self.specs, options)
        bare = prompt if not self.specs else Prompt.of(self.instructions, (), options)
        object.__setattr__(self, "prompt", prompt)
        object.__setattr__(self, "prompt_without_tools", bare)


class Run:
    """One run of an Agent's settings on a State: what its loop, tools and ask work with.

    `parent_call` is the tool call the run's State is to hang under (a subagent), `parent_link`
    the link ``arun(link=...)`` gave, if any, and `linked_call` the call once the run start
    recorded the link; `effect_scope` is what its memory writes are keyed under (its place in
    that call; None: the State's id). `writer` writes the marked save points of this run and of
    the runs started in it. `depth` is how many subagent levels the run is below its root run in
    this process (0: a root). `budget` holds the limits of the run and of the runs above it
    (None: no limits), `limits` the run's own (its agent's and its call's, recorded in its run
    start); `estimate` is the input tokens its next model request is expected to have: what its
    model's last reply reported, and `reported` names the messages that counted (their origin,
    count and last; None: not known). `held` maps the digest of each prompt a State of the run's
    tree records in full to that State: shared by the runs of one tree and store in this
    process, so a child names its ancestor's or earlier sibling's prompt, not a copy. `fed` is
    the last cursor of the store's tree feed read while a child of the run ran elsewhere: the
    next such child is followed from there (a new child saved nothing before it). `counted`
    lists the cut-off children the run continued here: they spend against its budget as they
    run, so the store's feed does not count them again.
    """

    __slots__ = (
        "agent",
        "budget",
        "counted",
        "depth",
        "effect_scope",
        "estimate",
        "fed",
        "held",
        "limits",
        "linked_call",
        "pacers",
        "parent_call",
        "parent_link",
        "reported",
        "reporters",
        "saver",
        "scopers",
        "settings",
        "slots",
        "state",
        "store",
        "threads",
        "writer",
    )

    def __init__(
        self,
        agent: Agent,
        settings: Settings,
        state: State,
        *,
        store: StoreClient | None,
        reporters: tuple[Reporter, ...],
    ) -> None:
        self.agent = agent  # what the loop body is called with
        self.settings = settings
        self.state = state
        self.store = store
        self.saver = Saver(store, state)
        self.writer: Writer | None = None  # writes marked save points: this run's, its children's
        self.reporters = reporters
        # The reporters the run waits for at each step (an events stream with a full buffer).
        self.pacers = tuple(reporter for reporter in reporters if isinstance(reporter, Pacer))
        # The reporters with a context for tool code (a tracer's current span): asked per call.
        self.scopers = tuple(
            reporter
            for reporter in reporters
            if getattr(type(reporter), "tool_scope", Reporter.tool_scope) is not Reporter.tool_scope
        )
        self.parent_call: CallContext | None = None  # the call to link the State to
        self.parent_link: Link | None = None  # the link `arun(link=)` gave, if any
        self.linked_call: CallContext | None = None  # that call, once linked
        self.effect_scope: str | None = None
        self.depth = 0
        self.budget: Budget | None = None
        self.limits: Limits | None = None
        self.estimate = 0
        self.reported: tuple[object, int, Message] | None = None
        self.held: dict[str, Held] = {}
        self.fed: str | None = None
        self.counted: list[str] = []
        limit = settings.max_concurrency
        # How many calls run at once (None: all of a turn), and worker threads for sync tools.
        self.slots = anyio.CapacityLimiter(limit) if limit else None
        self.threads: anyio.CapacityLimiter | None = None

    def report(self, hook: str, *args: Any) -> None:
        """Call `hook` of every reporter of the run with `args`."""
        for reporter in self.reporters:
            getattr(reporter, hook)(*args)

    async def pace(self) -> None:
        """Wait until every reporter that paces the run has room: called before each step reports.

        It returns with no await after its last check, so the step's reports (made right
        after, with no await between) find room: that keeps an events stream's buffer bound.
        """
        pacers = self.pacers
        while True:  # waiting for one lets another fill: until all have room at once
            for reporter in pacers:
                await reporter.pace()
            if len(pacers) == 1 or not any(reporter.full() for reporter in pacers):
                return

    def tool_scope(self, call: ToolCall) -> AbstractContextManager[object]:
        """The context the reporters give `call`'s tool code (`Reporter.tool_scope`)."""
        scopers, state = self.scopers, self.state
        if not scopers:
            return _NOTHING
        if len(scopers) == 1:
            return scopers[0].tool_scope(state, call)
        stack = ExitStack()
        for reporter in scopers:
            stack.enter_context(reporter.tool_scope(state, call))
        return stack

    def thread_limiter(self) -> anyio.CapacityLimiter:
        """The limiter of the run's sync tool threads: `max_concurrency`, else 40.

        A thread keeps its token until it ends, so threads abandoned by a cancellation or a
        timeout count too: a run never has more sync tool threads than this.
        """
        threads = self.threads
        if threads is None:
            limit = self.settings.max_concurrency or DEFAULT_SYNC_THREADS
            threads = self.threads = anyio.CapacityLimiter(limit)
        return threads


def _reporters(own: Reporter | None, frame: Frame | None) -> tuple[Reporter, ...]:
    """`own`, then the reporters of the run this one starts in: a child reports to both."""
    inherited = frame.run.reporters if frame is not None else ()
    if own is None or any(own is reporter for reporter in inherited):
        return inherited
    return (own, *inherited)


Failed = Callable[["Run", BaseException], None]
"""Records that an error ends a run (`arun`'s: pending calls closed, the error recorded)."""


def within(
    run: Run, body: Callable[[Run], Awaitable[_T]], fail: Failed | None = None
) -> Awaitable[_T]:
    """`body(run)` in `run`'s frame, with a writer; saved when it returns or fails. Await it.

    A run started inside another shares its writer; else the run's task group holds one.
    Nothing of the run keeps going after it returns: its writer ends (or writes nothing of it
    any more) once the end is written; a sync tool's thread still running was abandoned (its
    late writes are refused). `fail` records a failure first. A plain function: a run inside
    another (a subagent) awaits `_saved` directly, one coroutine less per child.
    """
    frame = current_frame()
    shared = frame.run.writer if frame is not None else None
    if shared is not None and shared.here():
        run.writer = shared
        if run.saver.store is not None:
            shared.take(run.saver)
        return _saved(run, body, fail)
    if run.saver.store is not None:
        return _with_writer(run, body, fail)
    return _saved(run, body, fail)


async def _saved(run: Run, body: Callable[[Run], Awaitable[_T]], fail: Failed | None) -> _T:
    """`body(run)` in `run`'s frame, then its State saved; on a failure too (shielded)."""
    saver = run.saver
    token = enter(Frame(run))
    try:
        result = await body(run)
        await saver.flush()
    except BaseException as error:
        with anyio.CancelScope(shield=True):
            if fail is not None:
                fail(run, error)
            await saver.flush_after(error)
        raise
    finally:
        saver.close()
        leave(token)
    return result


async def _with_writer(run: Run, body: Callable[[Run], Awaitable[_T]], fail: Failed | None) -> _T:
    """`_saved(run, body, fail)` with a writer of its own, in a task group."""
    writer = run.writer = Writer()
    writer.take(run.saver)
    error: BaseException | None = None
    results: list[_T] = []
    with anyio.CancelScope() as ending:
        async with anyio.create_task_group() as group:
            group.start_soon(writer.run, name=f"writer of State {run.state.id}")
            try:
                results.append(await _saved(run, body, fail))
            except BaseException as exc:  # re-raised below, not in an exception group
                error = exc
                # Ending the task group must not raise a new cancellation in its place.
                ending.shield = True
            finally:
                writer.close()
    if error is not None:
        raise error
    return results[0]


def step(
    agent: Agent, settings: Settings, state: State, action: Callable[[Run], Awaitable[_T]]
) -> Awaitable[_T]:
    """`action` on `state`: in the run in progress, or in a run of its own for this call.

    A loop body's ``agent.athink(state)`` is a step of the run that called the body (found
    through the frame). Anywhere else (a script, a tool using another agent) the step is a run
    of its own, saved when it returns. Await the result (a plain function: a step of a run adds
    no coroutine of its own).
    """
    frame = current_frame()
    if (
        frame is not None
        and frame.call is None
        and frame.run.state is state
        and frame.run.agent is agent  # its settings, with the tools of its opened toolsets
    ):
        return action(frame.run)
    if settings.toolsets:
        return _with_toolsets(step, agent, settings, state, action)
    store = settings.store if settings.store is not None else store_of(state)
    run = Run(agent, settings, state, store=store, reporters=_reporters(settings.reporter, frame))
    if settings.limits is not None:  # the agent's limits hold for a step on its own too
        run.budget = budget_for(settings.limits, state, None, 0)
        run.estimate = last_context(state)
    return within(run, action)


async def _with_toolsets(
    function: Callable[..., Awaitable[_T]], agent: Agent, settings: Settings, *args: Any
) -> _T:
    """`function(agent, settings, *args)` with the toolsets of `settings` open around it."""
    async with open_toolsets(settings) as opened:
        return await function(agent, dataclasses.replace(opened, toolsets=()), *args)


def run_agent(
    agent: Agent,
    settings: Settings,
    state: State,
    reporters: tuple[Reporter, ...] = (),
    *,
    link: Link | None = None,
    limits: Limits | None = None,
) -> Awaitable[None]:
    """The core of `Agent.arun`: run `settings.loop` on `state` in a run of its own.

    `reporters` see this run too (and its subagents'), beside the agent's own. `link` runs it
    as the child of that call (a runner's child run); else a State started in a tool call is
    the child of that call. An agent with toolsets opens them first, for the run. `limits`
    bound this run beside the agent's own (the tighter of each). Await the result (a plain
    function: a run without toolsets adds no coroutine of its own).
    """
    if settings.toolsets:
        return _with_toolsets(_run_agent, agent, settings, state, reporters, link, limits)
    return _run_agent(agent, settings, state, reporters, link, limits)


async def _run_agent(
    agent: Agent,
    settings: Settings,
    state: State,
    reporters: tuple[Reporter, ...],
    link: Link | None,
    limits: Limits | None = None,
) -> None:
    frame = current_frame()
    parent = parent_call(frame, state, link)
    depth = depth_below(parent, settings.max_subagent_depth)
    above = None if parent is None else parent.run.budget
    above_run = None if parent is None else parent.run
    if (
        parent is None
        and link is not None
        and frame is not None
        and frame.run.state.id == link.parent_id
    ):
        above = frame.run.budget  # a cut-off child its parent continues
        above_run = frame.run
        if above is not None:
            above_run.counted.append(state.id)  # it spends against the limits above as it runs
    if parent is not None and above is not None and link is None:  # an agent tool checked it
        refused = before_child(above, parent.run.state.id, depth)
        if refused is not None:
            error = LimitReachedError(refused)
            parent.failures.append(error)
            raise error
    own = settings.limits.tighter(limits) if settings.limits is not None else limits
    store = settings.store if settings.store is not None else store_of(state)
    if store is None and parent is not None:
        store = parent.run.store  # a child is saved in its parent's store unless it has its own
    run = Run(
        agent,
        settings,
        state,
        store=store,
        reporters=(*_reporters(settings.reporter, frame), *reporters),
    )
    run.parent_call = parent
    run.parent_link = link
    run.depth = depth
    if above_run is not None and _same_store(above_run.store, store):
        run.held = above_run.held  # the tree's prompts: a child names them, stores no copy
    run.limits = own
    run.budget = budget_for(own, state, above, depth)
    if parent is not None and above is not None:
        parent.counted.append(state.id)  # it spends against the limits above as it runs
    if run.budget is not None:
        run.estimate = last_context(state)
    begin_run(state)
    error: BaseException | None = None
    try:
        await within(run, _run_loop, _failed)
        stopped = state.stopped
        if run.linked_call is not None and isinstance(stopped, StoppedByApproval):
            run.linked_call.suspended.append(stopped)  # the parent's call waits with it
    except BaseException as exc:
        error = exc
        raise
    finally:
        end_run(state)
        _log.info(
            "state.run.finished",
            state_id=state.id,
            turn=state.turn,
            error=None if error is None else repr(error),
        )
        if run.pacers:
            with anyio.CancelScope(shield=True):  # a consumer that left is not waited for
                await run.pace()
        run.report("on_run_end", state, error)


def _same_store(one: StoreClient | None, other: StoreClient | None) -> bool:
    """Whether runs saved with `one` and `other` save to the same store (or both to none)."""
    if one is None or other is None:
        return one is other
    return one.store is other.store


async def _run_loop(run: Run) -> None:
    state, settings = run.state, run.settings
    if settings.schema is not None:
        bind_schema(state, settings.schema)
    if run.pacers:
        await run.pace()  # before the start (and a subagent's link) is reported
    _start(run, run.parent_call, run.parent_link)
    merge_turn(state, settings.handlers)  # of a turn a crash or a fork cut off
    run.saver.mark()  # written with the first request, or the run's end
    run.report("on_run_start", state)
    _log.info("state.run.started", state_id=state.id, agent=settings.name)
    if cut_off(state):
        await resume_children(run)  # before the model starts that work over
    if value_of(state).awaiting:
        # Calls waited for a person: the decided ones run (or get their denial) first.
        await use_tools(run)
    loop = settings.loop
    if isinstance(loop, Loop):
        await loop(run.agent, state)
    else:
        await run_body(loop, run.agent, state)


def _failed(run: Run, error: BaseException) -> None:
    """Record that `error` ends the run: its pending calls closed, the error recorded once."""
    state = run.state
    if run.linked_call is not None:
        run.linked_call.failures.append(error)  # the parent's call tells a child's failure apart
    if state.pending_calls:
        if is_interruption(error):
            close_pending(state, "interrupted", "(interrupted by user)")
        else:
            close_pending(state, "aborted", f"(aborted: {type(error).__name__})")
    record_error(state, error)


def _start(run: Run, parent: CallContext | None, link: Link | None) -> None:
    """Record the run's start, naming the tool call `parent` or `link` it hangs under, if any.

    The subagents layer then links the State to that call (`link_child`).
    """
    state, settings = run.state, run.settings
    if link is not None:
        parent_id, parent_call_id = link.parent_id, link.call_id
    elif parent is not None:
        parent_id, parent_call_id = parent.run.state.id, parent.call.id
    else:
        parent_id = parent_call_id = None
    start = RunStart(
        parent_id=parent_id,
        parent_call_id=parent_call_id,
        agent=settings.name,
        model=settings.model.name,
        tools=tuple(settings.tools),
        limits=run.limits,
    )
    record_run_start(state, start)
    link_child(run, parent, link)
