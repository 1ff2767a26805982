"""Subagents: an Agent used as a tool, and the children a crash cut off.

A tool call links every new State that an agent runs while the call executes (from an async
tool, or from a sync tool in a worker thread: the current frame, `_running._frame`, follows
both). The link is recorded in the child's first `run_start` (`parent_id`, `parent_call_id`);
the parent's `tool_result` lists the `child_ids` and adds their usage when the call closes.

An `AgentTool` hands its child run to a runner (`orchestrator.runners`) as a `ChildJob` with an
explicit `Link`: here (`LocalRunner`, the default) or on other machines (`RayRunner`). A child
elsewhere is counted against the limits above it from what it saves (`_running._remote`).

Resume: when a crash cut off a subagent call, the loaded parent shows the call closed
``unknown`` with its children listed. Running the parent again first continues each child that
had not ended, from its own stored history (its own cut-off calls are closed ``unknown`` too,
never re-run), and delivers each child's answer to the parent: a ``late`` result for the call
(with the usage the child spent since) and a notice the model reads, so it does not start that
work over. ``agent.as_tool(resume=False)`` turns it off for a tool. A child continued
elsewhere counts against the limits above it as it saves, as on its first run: only what it
spends after the reload (the reloaded budget holds what it spent before).
"""

from __future__ import annotations

import math
import time
import uuid
from typing import TYPE_CHECKING, Any

import anyio

from .._base._errors import (
    LimitReachedError,
    StoreDamagedError,
    SubagentDepthError,
    ToolError,
    error_text,
    is_interruption,
)
from .._base._limits import Limits
from .._base._link import Link, child_scope
from .._base._messages import Message, TextBlock, ToolCall, ToolResultBlock
from .._base._reply import Usage, usage_since
from .._base._stopped import StoppedByApproval, StoppedByLimit
from .._record._history import ToolResultEntry
from .._record._recording import add_child, bind_client, record_tool_result, store_of, value_of
from .._record._state import State
from .._record._storage import AsyncTreeFollowable
from .._tooling._tools import Tool
from ._budget import before_child, remaining, spend_elsewhere
from ._frame import CallContext, Frame, current_frame
from ._remote import Spending, run_followed
from ._runner import ChildJob, LocalRunner, Runner

if TYPE_CHECKING:
    from ._agent import Agent
    from ._run import Run

__all__ = (
    "AgentTool",
    "cut_off",
    "depth_below",
    "depth_refused",
    "link_child",
    "parent_call",
    "resume_children",
    "resumed_child",
    "trace_context",
)

LOCAL = LocalRunner()


def deadline() -> float | None:
    """The caller's deadline as a `time.time()` value (what another process can use), or None."""
    left = anyio.current_effective_deadline()
    if math.isinf(left):
        return None
    return time.time() + (left - anyio.current_time())


def resumed_child() -> State | None:
    """In a tool call run again after a person's decision: the subagent State to continue.

    A call whose subagent stopped for a person's approval waits with it; once decided, the next
    run calls the tool again. An agent given as a tool continues that State by itself. A tool
    that starts a subagent itself must continue it too, or the decision is lost with it::

        @tool
        async def research(question: str) -> str:
            child = resumed_child() or State(messages=[Message.user(question)])
            return await researcher.arun(child)

    None outside such a call (and outside any tool call).
    """
    frame = current_frame()
    call = None if frame is None else frame.call
    return None if call is None else call.resume


class AgentTool(Tool):
    """An agent as a tool: the model passes a task and a new child State runs it.

    The child's answer is the result (a structured answer comes back as JSON). A child that
    fails gives the model an error result it can act on; a cancellation is re-raised. The
    child runs on `runner` (default: the parent agent's ``runner=``, else here); a child that a
    crash cut off is continued when the parent runs again, unless `resume` is false. A child
    that stopped for a person's decision (`StoppedByApproval`) is continued, not started again,
    when its parent's call runs after the decision.
    """

    def __init__(
        self,
        agent: Agent,
        *,
        name: str | None = None,
        description: str | None = None,
        runner: Runner | None = None,
        resume: bool = True,
        limits: Limits | None = None,
    ):
        name = name or agent.name
        description = description or agent.description
        if not name or not description:
            raise ValueError(
                "An agent used as a tool needs a name and a description: Agent(...,"
                " name='coder', description='Writes and fixes code'), or"
                " agent.as_tool(name=..., description=...)."
            )
        check_runner(runner)
        if not isinstance(resume, bool):
            raise TypeError(f"resume must be True or False, got {resume!r}.")
        super().__init__(name=name, description=description)
        self.agent = agent
        self.runner = runner
        self.resume = resume
        self.limits = limits

    def runner_for(self, run: Run) -> Runner:
        """The runner of this tool's children in `run`: its own, the run's agent's, or here."""
        runner: Runner | None = self.runner or run.settings.runner
        return LOCAL if runner is None else runner

    async def arun(self, task: str) -> Any:
        """Run the subagent on a new State.

        Args:
            task: The whole task for the subagent: it sees only this message.
        """
        frame = current_frame()
        context = None if frame is None else frame.call
        if context is None:  # called outside a run's tool call: a State of its own, here
            return await self._guarded(self.agent.arun(State(messages=[Message.user(task)])))
        depth, limit = context.run.depth + 1, self.agent.max_subagent_depth
        if depth > limit:  # refused before a child is listed: the call gets an error result
            error = SubagentDepthError(depth_refused(depth, limit))
            raise ToolError(f"The subagent {self.name!r} failed: {error_text(error)}") from error
        resume = context.resume  # a child that stopped for a person's decision, continued
        budget = context.run.budget
        if budget is not None and resume is None:  # counted before it is listed
            refused = before_child(budget, context.run.state.id, depth)
            if refused is not None:
                error = LimitReachedError(refused)
                raise ToolError(
                    f"The subagent {self.name!r} failed: {error_text(error)}"
                ) from error
        state_id = uuid.uuid4().hex if resume is None else resume.id
        job = ChildJob(
            agent=self.agent,
            link=context.link_child(state_id),
            state_id=state_id,
            task=task if resume is None else None,
            store=None if context.run.store is None else context.run.store.store,
            deadline=deadline(),
            state=resume,
            trace_context=trace_context(context.run, context.call),
            limits=self.limits,
            remaining=None if budget is None else remaining(budget, depth),
        )
        runner = self.runner_for(context.run)
        runner.check(job)  # a setup mistake ends the run: it is not the model's to handle
        spending = None
        if budget is not None:
            after = context.run.fed if resume is None else None  # a new child: from the tail
            spending = Spending(budget, state_id, context.counted, after=after)
        feed = _feed(context.run, runner, spending)
        try:
            if feed is None or spending is None:
                child = await self._guarded(runner.run(job), context)
            else:  # elsewhere: counted from the store's feed as it saves
                child = await self._guarded(run_followed(runner, job, feed, spending), context)
        finally:
            if spending is not None and state_id not in context.counted:
                _count_elsewhere(spending, context, state_id)  # what was not counted yet
                context.run.fed = spending.cursor or context.run.fed
        halted = None if spending is None else spending.stopped
        if halted is not None:
            raise ToolError(f"The subagent {self.name!r} was stopped: {halted}")
        if child is None:  # pragma: no cover - only a stopped child is missing
            raise ToolError(f"The subagent {self.name!r} saved nothing.")
        stopped = child.stopped
        if isinstance(stopped, StoppedByApproval) and all(
            stopped is not known for known in context.suspended
        ):
            context.suspended.append(stopped)  # run elsewhere: the parent's call waits with it
        if isinstance(stopped, StoppedByLimit) and stopped.limit != "turns":
            raise ToolError(f"The subagent {self.name!r} stopped: {stopped}")
        return child.answer

    async def _guarded(self, child_run: Any, context: CallContext | None = None) -> Any:
        """Await `child_run`; a failure becomes a `ToolError` for the model (its State kept)."""
        try:
            result = await child_run
        except Exception as error:
            if is_interruption(error):
                raise
            state = getattr(error, "state", None)
            if context is not None and isinstance(state, State):
                context.adopt(state)  # a remote child's usage rolls up even when it failed
            raise ToolError(f"The subagent {self.name!r} failed: {error_text(error)}") from error
        if context is not None and isinstance(result, State):
            context.adopt(result)
        return result

    async def resume_call(self, run: Run, entry: ToolResultEntry) -> None:
        """Continue the children of the cut-off call `entry` and deliver their answers."""
        client = run.store
        parent = run.state
        answers: list[str] = []
        spent = Usage()
        failed = False
        for index, child_id in enumerate(entry.child_ids):
            child = await (client.load(child_id) if client else parent.achild(child_id))
            _check_link(parent, entry.call, child)
            before = child.usage
            budget, spending = run.budget, None
            if not child.finished and child.stopped is None:  # it had not ended: continue it
                job = ChildJob(
                    agent=self.agent,
                    link=Link(
                        parent_id=parent.id,
                        call_id=entry.call.id,
                        scope=child_scope(
                            run.effect_scope or parent.id, entry.turn, entry.call.id, index
                        ),
                    ),
                    state_id=child_id,
                    task=None,
                    store=None if client is None else client.store,
                    deadline=deadline(),
                    trace_context=trace_context(run, entry.call),
                    limits=self.limits,
                    remaining=None if budget is None else remaining(budget, run.depth + 1, child),
                )
                runner = self.runner_for(run)
                runner.check(job)
                if budget is not None:
                    spending = Spending(budget, child_id, run.counted, before=before)
                feed = _feed(run, runner, spending)
                try:
                    if feed is None or spending is None:
                        child = await runner.run(job)
                    else:  # elsewhere: counted from the store's feed as it saves
                        await spending.known(feed, parent.id)  # in the reloaded budget
                        child = await _resumed(runner, job, feed, spending)
                except Exception as error:
                    if is_interruption(error):
                        raise
                    failed = True
                    answers.append(f"(the subagent failed: {error_text(error)})")
                    state = getattr(error, "state", None)
                    if isinstance(state, State):
                        spent = spent + usage_since(state.usage, before)
                    continue
            spent = spent + usage_since(child.usage, before)
            halted = None if spending is None else spending.stopped
            if halted is not None:  # a limit above was used up: stopped as it ran
                failed = True
                answers.append(f"(the subagent was stopped: {halted})")
                continue
            stopped = child.stopped
            if isinstance(stopped, StoppedByLimit) and stopped.limit != "turns":
                failed = True
                answers.append(f"(the subagent stopped: {stopped})")
                continue
            converted = self.convert(child.answer)
            answers.append(_text(converted.content))
            failed = failed or converted.is_error
        text = "\n".join(answers)
        record_tool_result(
            parent,
            entry.call,
            ToolResultBlock(entry.call.id, (TextBlock(text),), is_error=failed),
            outcome="error" if failed else "done",
            child_ids=entry.child_ids,
            usage=spent,
        )
        parent.add_message(
            Message.notice(
                f"The call {entry.call.id} ({entry.call.name}) was cut off when the process"
                f" stopped; its subagent went on from where it was and returned:\n{text}"
            )
        )


def _check_link(parent: State, call: ToolCall, child: State) -> None:
    """Refuse to continue `child` for `call` unless its own history says `call` started it.

    The parent's result lists the child by id; the child's first ``run_start`` (covered by its
    digests) names its parent and call. A State that names another is not this call's work,
    and its answer must never reach the model as the subagent's.
    """
    if child.parent_id == parent.id and child.parent_call_id == call.id:
        return
    raise StoreDamagedError(
        f"State {parent.id!r}: the call {call.id} ({call.name}) lists State {child.id!r} as its"
        f" subagent, but that State's own history says it was started by"
        f" {child.parent_id!r}, call {child.parent_call_id!r}: the link was changed, so its"
        " answer is not delivered. Restore the store from a backup."
    )


def parent_call(frame: Frame | None, state: State, link: Link | None) -> CallContext | None:
    """The tool call executing here that a run of `state` hangs under, or None.

    With a `link` (a runner's child run), the call it names when that call executes here; else
    the call executing now, when `state` starts in it (or is the subagent it continues).

    Raises:
        ValueError: `state` already hangs under another call than `link`'s.
    """
    return _parent_of(frame, state) if link is None else _call_of_link(frame, state, link)


def _parent_of(frame: Frame | None, state: State) -> CallContext | None:
    """The tool call that `state` becomes a child of: the one executing, on its first run."""
    if frame is None or frame.call is None or frame.run.state is state:
        return None
    if frame.call.resume is state:
        return frame.call  # a subagent the call started before, continued
    return None if value_of(state).linked else frame.call


def _call_of_link(frame: Frame | None, state: State, link: Link) -> CallContext | None:
    """The call executing here that `link` names, or None (the call is elsewhere).

    Raises:
        ValueError: `state` already hangs under another call than `link`'s.
    """
    value = value_of(state)
    if value.linked and (value.parent_id, value.parent_call_id) != (link.parent_id, link.call_id):
        raise ValueError(
            f"State {state.id} is the child of call {value.parent_call_id!r} of State"
            f" {value.parent_id!r}, so it cannot run linked to call {link.call_id!r} of State"
            f" {link.parent_id!r}: give the link it was started with, or none."
        )
    if frame is None or frame.call is None:
        return None
    call = frame.call
    if call.run.state.id == link.parent_id and call.call.id == link.call_id:
        return call
    return None


def _feed(run: Run, runner: Runner, spending: Spending | None) -> AsyncTreeFollowable | None:
    """The tree feed that counts a child of `run` on `runner` as it saves, or None (at its end).

    None for a child run here (it spends against the limits as it runs), for a run without
    limits, and for a store without a tree feed.
    """
    client = run.store
    if spending is None or client is None or isinstance(runner, LocalRunner):
        return None
    store = client.store
    return store if isinstance(store, AsyncTreeFollowable) else None


async def _resumed(
    runner: Runner, job: ChildJob, feed: AsyncTreeFollowable, spending: Spending
) -> State:
    """Continue the cut-off child of `job` on `runner`, counted as it saves; it as it ended.

    What the feed did not show is counted when it ends (when it fails too, from its State).
    """
    try:
        child = await run_followed(runner, job, feed, spending)
    except Exception as error:
        state = getattr(error, "state", None)
        if isinstance(state, State):
            _count_rest(spending, state)
        raise
    if child is None:  # pragma: no cover - a resumed child was saved before
        raise LookupError(f"The subagent's State {job.state_id!r} is no longer stored.")
    _count_rest(spending, child)
    return child


def _count_rest(spending: Spending, child: State) -> None:
    """Count what `child`, ended, spent that its follower did not count (unless it ran here)."""
    if child.id not in spending.counted:
        spend_elsewhere(spending.budget, child.id, spending.rest(child))


def _count_elsewhere(spending: Spending, context: CallContext, state_id: str) -> None:
    """Count what the child `state_id`, run elsewhere, spent that was not counted yet."""
    for child in context.children:
        if child.id == state_id:
            spend_elsewhere(spending.budget, state_id, spending.rest(child))
            return


def depth_below(parent: CallContext | None, limit: int) -> int:
    """How many subagent levels a run under `parent` is below its root run.

    Raises:
        SubagentDepthError: deeper than `limit`; the parent's call gets it as its error result.
    """
    depth = 0 if parent is None else parent.run.depth + 1
    if depth > limit:
        error = SubagentDepthError(depth_refused(depth, limit))
        if parent is not None:
            parent.failures.append(error)
        raise error
    return depth


def link_child(run: Run, parent: CallContext | None, link: Link | None) -> None:
    """Link the State of `run`, whose start is recorded, to the tool call `parent` or `link`.

    With a `link` whose call executes elsewhere, only the State records it: the parent's call
    lists the child itself. A child linked here joins its call's children, rolls its usage up
    to the parent and is reported started.
    """
    state = run.state
    if link is not None:
        run.effect_scope = link.scope
    if parent is None:
        return
    owner = parent.run.state
    if link is None:
        run.effect_scope = parent.next_scope()
        parent.child_ids.append(state.id)
    elif state.id not in parent.child_ids:
        parent.child_ids.append(state.id)
    run.linked_call = parent
    parent.children.append(state)
    add_child(owner, state)
    if run.settings.store is None and store_of(state) is None and run.store is not None:
        bind_client(state, run.store)  # so state.child(id) of a loaded parent opens it
    run.report("on_child_start", owner, parent.call, state)


def depth_refused(depth: int, limit: int) -> str:
    """Why a subagent `depth` levels below its root run was not started (`limit` is lower)."""
    return (
        f"A subagent would run {depth} levels deep, past the limit of {limit}"
        f" (its agent's max_subagent_depth), so it was not started. A subagent that starts"
        f" itself again and again stops here; if the task needs deeper subagents, raise it"
        f" with Agent(max_subagent_depth=N)."
    )


def trace_context(run: Run, call: ToolCall) -> dict[str, str]:
    """What the reporters of `run` give a child of `call` to carry (`Reporter.trace_context`)."""
    carried: dict[str, str] = {}
    for reporter in run.reporters:
        carried.update(reporter.trace_context(run.state, call))
    return carried


def _text(content: tuple[Any, ...]) -> str:
    return "\n".join(block.text for block in content if isinstance(block, TextBlock))


def check_runner(runner: object) -> None:
    """Refuse anything but a `Runner` (or None)."""
    if runner is not None and not isinstance(runner, Runner):
        raise TypeError(
            f"runner must be a Runner (LocalRunner, RayRunner, or an object with"
            f" `async def run(job)`), got {type(runner).__name__}."
        )


def cut_off(state: State) -> list[ToolResultEntry]:
    """The subagent calls of `state` a crash cut off, not delivered yet, the model unaware.

    They are the results closed ``unknown`` (on load) that list children, after the last
    model reply and without a ``late`` result since.
    """
    entries = value_of(state).entries
    delivered: set[str] = set()
    found: list[ToolResultEntry] = []
    for index in range(len(entries) - 1, -1, -1):
        entry = entries.get(index)
        if entry.kind == "model_reply" or entry.kind == "model_request":
            break
        if entry.kind == "tool_result":
            if entry.late:
                delivered.add(entry.call.id)
            elif entry.outcome == "unknown" and entry.child_ids and entry.call.id not in delivered:
                found.append(entry)
    found.reverse()
    return found


async def resume_children(run: Run) -> None:
    """Continue the children of the run's cut-off subagent calls, each call's at once."""
    calls: list[tuple[AgentTool, ToolResultEntry]] = []
    for entry in cut_off(run.state):
        tool = run.settings.tools.get(entry.call.name)
        if isinstance(tool, AgentTool) and tool.resume:
            calls.append((tool, entry))
    if len(calls) == 1:
        await calls[0][0].resume_call(run, calls[0][1])
    elif calls:
        async with anyio.create_task_group() as group:
            for tool, entry in calls:
                group.start_soon(tool.resume_call, run, entry)
