"""Running a turn's tool calls in worker tasks.

All `parallel=True` calls start at once in one task group (async tools as tasks, sync tools in
worker threads, at most `Run.thread_limiter`'s at once: 40 unless `max_concurrency` says
otherwise), then `parallel=False` calls run one by one in request order. Each result is
recorded as it finishes and written while the other calls run; the State puts them into
`messages` together, in request order, once the last call has a result. The State is stored
before any tool runs.

A call a permission defers to a person (`Deferred`) gets no result: it stays pending, the turn's
other calls run, and the turn ends with a `StoppedByApproval` stop listing it, with the calls of
subagents that stopped the same way. The next run carries out the decisions recorded meanwhile:
an approved call runs, a denied one gets an error result, and a subagent call continues its
child State, handing it this State's decisions on its calls first (`hand_down`).

Failures: a `ToolError`, wrong arguments, an unknown tool, a timeout or a return value that is
not JSON become error results the model can act on; so does any other exception with
``Agent(tool_errors="to_model")``. Otherwise any other exception waits for the calls still
running, closes the rest as ``aborted`` and is re-raised unchanged. A cancellation closes every
pending call as ``interrupted`` and is re-raised at once: a sync tool's thread is abandoned, not
waited for (`orchestrator._base._threads`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from .._apps._approvals import hand_down
from .._base._errors import ToolError, error_text, is_interruption
from .._base._logs import get_log
from .._base._messages import Image, TextBlock, ToolCall, ToolResultBlock
from .._base._reply import NO_USAGE, Usage
from .._base._stopped import AwaitingCall, StoppedByApproval, StoppedByPermission
from .._base._threads import in_thread
from .._record._history import Outcome, ToolResultEntry
from .._record._recording import (
    check_update,
    child_store,
    close_pending,
    known_children,
    merge_turn,
    record_stop,
    record_tool_result,
    store_of,
    value_of,
)
from .._tooling._permissions import Allowed, Decision, Deferred, Denied, decide
from .._tooling._tools import Tool, ToolInputError
from ._budget import before_tools, stop_for_limit
from ._frame import CallContext, Frame, enter, leave

if TYPE_CHECKING:
    from .._record._state import State
    from ._run import Run

__all__ = ("use_tools",)

_log = get_log("tools")

INTERRUPTED = "(interrupted by user)"
ALLOWED = Allowed()
STILL_WAITING = Deferred()  # a subagent's calls still wait: `awaiting` lists them already


def _text(text: str) -> tuple[TextBlock | Image, ...]:
    return (TextBlock(text),)


class _Turn:
    """One `use_tools` call: its outcome flags, and the calls it runs."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.state = run.state
        self.tools: Mapping[str, Tool] = run.settings.tools
        self.handlers = run.settings.handlers
        self.fatal: BaseException | None = None
        self.contexts: dict[str, CallContext] = {}  # calls that started, by call id
        self.stopped = False
        self.scope: anyio.CancelScope | None = None
        self.awaiting: dict[str, tuple[AwaitingCall, ...]] = {}  # by call id: for a person

    async def run_calls(self, calls: tuple[ToolCall, ...]) -> None:
        parallel: list[ToolCall] = []
        serial: list[ToolCall] = []
        for call in calls:  # an unknown tool's call runs with the parallel ones (its error)
            tool = self.tools.get(call.name)
            (parallel if tool is None or tool.parallel else serial).append(call)
        saver = self.run.saver
        try:
            await saver.flush()  # the reply that asked for the calls, before any runs
            if len(parallel) == 1 and not serial:
                # One call needs no task group (nor a scope: there is no other call to cancel).
                await self.run_call(parallel[0])
            elif parallel:
                async with anyio.create_task_group() as group:
                    self.scope = group.cancel_scope
                    for call in parallel:
                        group.start_soon(self.run_call, call, name=f"tool {call.name} {call.id}")
            for call in serial:
                if self.fatal is not None or self.stopped:
                    break
                await saver.flush()  # the results before it
                await self.run_call(call)
        except BaseException as error:  # a cancellation from outside: run_call keeps the rest
            with anyio.CancelScope(shield=True):
                await self._close(error)
                await saver.flush_after(error)
            raise
        if self.awaiting and not self.stopped and self.fatal is None:
            waiting = tuple(item for call in calls for item in self.awaiting.get(call.id, ()))
            record_stop(self.state, StoppedByApproval(waiting))
        if self.stopped:
            text = "(cancelled: a permission stopped the run)"
            await self._report_closed(close_pending(self.state, "cancelled", text, self._links()))
            merge_turn(self.state, self.handlers)
        # The turn's end is a save point: marked here, on the way back to the loop, so the next
        # step's save writes it with its own when nothing is awaited in between.
        saver.mark()
        if self.fatal is not None:
            with anyio.CancelScope(shield=True):
                await self._close(self.fatal)
                await saver.flush_after(self.fatal)
            raise self.fatal

    async def _close(self, error: BaseException) -> None:
        """Close the calls still pending after `error`: interrupted, or aborted."""
        if is_interruption(error):
            closed = close_pending(self.state, "interrupted", INTERRUPTED, self._links())
        else:
            text = f"(aborted: {type(error).__name__})"
            closed = close_pending(self.state, "aborted", text, self._links())
        merge_turn(self.state, self.handlers)
        await self._report_closed(closed)

    async def _report_closed(self, entries: tuple[ToolResultEntry, ...]) -> None:
        """Report the end of calls that were closed without running to their end.

        Each waits for a slow events consumer first (a consumer that left is not waited for).
        """
        run = self.run
        for entry in entries:
            if run.pacers:
                await run.pace()
            run.report("on_tool_end", self.state, entry.call, entry)

    async def run_call(self, call: ToolCall) -> None:
        """Run one call; an exception other than a cancellation is kept, never raised here.

        Keeping it (in `fatal`) lets the turn wait for the calls still running and re-raise the
        same object afterwards, instead of a task group's exception group. Ctrl+C (or any
        BaseException) also cancels the calls still running.
        """
        slots = self.run.slots
        try:
            if slots is None:
                await self._run_call(call)
            else:
                async with slots:
                    await self._run_call(call)
        except anyio.get_cancelled_exc_class():
            raise
        except BaseException as error:
            if self.fatal is None:
                self.fatal = error
            if not isinstance(error, Exception) and self.scope is not None:
                self.scope.cancel()

    async def _decide(self, call: ToolCall, tool: Tool, context: CallContext) -> Decision:
        """Decide `call`: a person's recorded decision, a continued subagent, or permissions."""
        run, state = self.run, self.state
        value = value_of(state)
        if value.awaiting:
            record = value.decisions.get(call.id)
            if record is not None:
                if record.approved:
                    return ALLOWED
                by = f" by {record.by}" if record.by else ""
                return Denied(f"a person denied it{by}: {record.reason or 'no reason given'}")
            owner = next((item.state_id for item in value.awaiting if item.via == call.id), None)
            if owner is not None:
                child = await _open_child(run, state, owner)
                return await self._continue(call, child, context)
        if run.settings.permissions is None:
            return ALLOWED
        decision, by = await decide(run.settings.permissions, call, tool, state)
        if isinstance(decision, Denied) and decision.stop:
            self._stop(call, by)
        return decision

    async def _continue(self, call: ToolCall, child: State, context: CallContext) -> Decision:
        """Continue `child`, the subagent `call` waits on, with this State's decisions on it.

        The decisions are handed down and recorded in `child` (saved, so a runner that loads
        it elsewhere sees them) before it runs. The call was allowed when it first ran.
        """
        before = value_of(child)
        try:
            waiting = hand_down(self.state, child, call.id)
        except ValueError as error:
            raise _Result("error", f"(not run: {error})") from None
        if waiting:  # the child holds a decision this State never made: not carried out
            self.awaiting[call.id] = waiting
            return STILL_WAITING
        store = store_of(child)
        if store is not None and value_of(child) is not before:
            await store.save(child)
        context.resume = child
        return ALLOWED

    async def _run_call(self, call: ToolCall) -> None:
        run, state = self.run, self.state
        settings = run.settings
        debugging = _log.debugging  # asked once: it costs a call into logging
        started = time.perf_counter() if debugging else 0.0
        tool = self.tools.get(call.name)
        context = self.contexts[call.id] = CallContext(run, call)
        outcome: Outcome = "done"
        update: dict[str, Any] | None = None
        try:
            # No permissions, nothing waiting: every call is allowed, with no await on the way.
            if tool is not None and (settings.permissions is not None or value_of(state).awaiting):
                decision = await self._decide(call, tool, context)
            else:
                decision = ALLOWED
            if run.pacers:  # a slow events consumer slows the run here
                await self._pace(shield=isinstance(decision, Denied))  # a denial ends at once
            if isinstance(decision, Deferred):
                if decision is STILL_WAITING:  # `awaiting` lists its subagent's calls already
                    return
                self.awaiting[call.id] = (AwaitingCall(state.id, call, decision.reason),)
                run.report("on_tool_deferred", state, call, decision.reason)
                return  # no result, and no start: the call waits for a person
            run.report("on_tool_start", state, call)  # decided: it starts (or ends at once)
            if tool is None:
                names = ", ".join(sorted(self.tools)) or "none"
                raise _Result("error", f"Unknown tool {call.name!r}. The tools are: {names}.")
            if isinstance(decision, Denied):
                raise _Result("denied", f"(denied: {decision.reason})")
            try:
                kwargs = tool.bind(call.args, state, memory=settings.memory)
            except ToolInputError as error:
                raise _Result("input_error", str(error)) from None
            with run.tool_scope(call):  # a tracer's call span is current in the tool's code
                value = await self._invoke(tool, kwargs, context)
            resumed = context.resume
            # Continued here, or elsewhere and adopted (an agent tool's runner): by id.
            if resumed is not None and all(child.id != resumed.id for child in context.children):
                raise _Result(
                    "error",
                    f"The tool {call.name} did not continue its subagent State {resumed.id}, which"
                    " a person's decision was waiting on, so that decision was not carried out."
                    " A tool that starts a subagent itself continues it with"
                    " `agent.arun(orchestrator.resumed_child() or State(...))`.",
                )
            if context.suspended:
                # A subagent stopped for a person: this call waits with it, with no result.
                self.awaiting[call.id] = tuple(
                    AwaitingCall(item.state_id, item.call, item.reason, call.id)
                    for stopped in context.suspended
                    for item in stopped.calls
                )
                return
            try:
                converted = tool.convert(value)
            except TypeError as error:
                raise _Result("error", str(error)) from None
            content, is_error = converted.content, converted.is_error
            if converted.state_update:
                try:
                    update = check_update(state, converted.state_update, tool.output_handlers)
                except (ValueError, KeyError, TypeError) as error:
                    raise _Result(
                        "error", f"The tool's state update was refused: {error}"
                    ) from None
            if is_error:
                outcome = "error"
        except _Result as result:
            outcome, content, is_error = result.outcome, _text(result.text), True
        except ToolError as error:
            outcome, content, is_error = "error", _text(str(error) or type(error).__name__), True
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as error:
            if any(error is failure for failure in context.failures):
                # A subagent of this call failed: the model gets an error result it can act on.
                text = f"(a subagent of this call failed: {error_text(error)})"
            elif settings.tool_errors == "to_model":
                text = f"(the tool raised {error_text(error)})"
            else:
                _log.warning(
                    "state.tool.raised",
                    state_id=state.id,
                    call_id=call.id,
                    tool=call.name,
                    error=repr(error),
                )
                if self.fatal is None:
                    self.fatal = error
                return
            outcome, content, is_error = "error", _text(text), True
            if run.pacers:
                await self._pace(shield=True)  # and before its end is reported
            entry = self._record(call, content, is_error, outcome, context, update)
            run.report("on_tool_end", state, call, entry)
            await self._save_result()
            return
        if run.pacers:
            await self._pace(shield=True)  # and before its end is reported
        entry = self._record(call, content, is_error, outcome, context, update)
        if debugging:  # the fields cost time on every call: only when they are logged
            _log.debug(
                "state.tool.finished",
                state_id=state.id,
                turn=state.turn,
                call_id=call.id,
                tool=call.name,
                outcome=outcome,
                ms=round((time.perf_counter() - started) * 1000, 3),
            )
        run.report("on_tool_end", state, call, entry)
        await self._save_result()

    async def _pace(self, *, shield: bool) -> None:
        """Wait while a slow events consumer is a full buffer behind (`Run.pace`).

        Shielded before a call's end is reported: a stop that cancels the turn meanwhile does
        not turn the result the call has into ``cancelled``. A consumer that left is never
        waited for.
        """
        with anyio.CancelScope(shield=shield):
            await self.run.pace()

    async def _save_result(self) -> None:
        """Write a result at once while the turn's other calls still run.

        So a crash during a slow call keeps the results that came before it. The result that
        closes the turn is a save point marked when the turn returns: the loop's next step
        writes it with its own save.
        """
        if value_of(self.state).pending:
            await self.run.saver.flush()

    async def _invoke(self, tool: Tool, kwargs: dict[str, Any], context: CallContext) -> Any:
        timeout = tool.timeout if tool.timeout is not None else self.run.settings.tool_timeout
        token = enter(Frame(self.run, context))  # subagents started by the tool link to it
        try:
            if timeout is None:
                return await self._call(tool, kwargs)
            with anyio.move_on_after(timeout):
                return await self._call(tool, kwargs)
            raise _Result("error", f"(timed out after {timeout:g} s)")
        finally:
            leave(token)

    async def _call(self, tool: Tool, kwargs: dict[str, Any]) -> Any:
        if tool.is_async:
            return await tool.acall(kwargs)
        # A worker thread, bounded per run. Python cannot stop a thread: when the call is
        # cancelled or times out, the thread is abandoned (its late result dropped, its later
        # State writes and agent runs refused) and the run goes on at once.
        return await in_thread(functools.partial(tool.call, kwargs), self.run.thread_limiter())

    def _links(self) -> dict[str, tuple[list[str], Usage]]:
        return {
            call_id: (context.child_ids, _children_usage(context))
            for call_id, context in self.contexts.items()
            if context.child_ids
        }

    def _record(
        self,
        call: ToolCall,
        content: tuple[TextBlock | Image, ...],
        is_error: bool,
        outcome: Outcome,
        context: CallContext,
        update: dict[str, Any] | None,
    ) -> ToolResultEntry:
        """Record the call's result; the last one closes the turn and merges its updates."""
        entry = record_tool_result(
            self.state,
            call,
            ToolResultBlock(call.id, content, is_error),
            outcome=outcome,
            child_ids=context.child_ids,
            usage=_children_usage(context),
            state_update=update,
        )
        merge_turn(self.state, self.handlers)  # when the turn's last result closed it
        return entry

    def _stop(self, call: ToolCall, permission: str | None) -> None:
        if self.stopped:
            return
        self.stopped = True
        record_stop(self.state, StoppedByPermission(call, permission or "permissions"))
        if self.scope is not None:
            self.scope.cancel()


_MAX_DEPTH = 1000  # a tree of subagents deeper than this is a loop in the stored links


async def _open_child(run: Run, state: State, owner_id: str) -> State:
    """The subagent State of `state` that leads to `owner_id`: from the store, or in memory.

    `owner_id` is the State a waiting call belongs to: the child itself, or a State further
    down (its child, or theirs). The child holds the decisions made on it directly; the ones
    `state` holds are handed down next.
    """
    store = child_store(state) or run.store
    if store is not None:
        child = await store.load(owner_id)
        for _ in range(_MAX_DEPTH):
            if child.parent_id == state.id or child.parent_id is None:
                break
            child = await store.load(child.parent_id)
        if child.parent_id != state.id:
            raise ValueError(
                f"State {state.id} waits on a call of State {owner_id}, which the store does not"
                " link to it as a subagent (or to a subagent of it)."
            )
        return child
    child_in_memory = _leading_to(state, owner_id)
    if child_in_memory is None:
        raise ValueError(
            f"State {state.id} waits on its subagent State {owner_id}, which is not in memory and"
            " there is no store to load it from: run the State loaded from its store."
        )
    return child_in_memory


def _leading_to(state: State, owner_id: str) -> State | None:
    """The child of `state` in memory that is, or leads down to, the State `owner_id`."""
    for child in known_children(state):
        if child.id == owner_id or _leading_to(child, owner_id) is not None:
            return child
    return None


def _children_usage(context: CallContext) -> Usage:
    usage = NO_USAGE
    for child in context.children:
        usage = usage + child.usage
    return usage


class _Result(Exception):
    """An error result for the model, raised to leave a call's steps early."""

    def __init__(self, outcome: Outcome, text: str) -> None:
        super().__init__(text)
        self.outcome: Outcome = outcome
        self.text = text


async def use_tools(run: Run) -> None:
    """Run the State's pending calls with the run's tools: the core of `Agent.ause_tools`.

    A `Limits` above the run with no tool calls, tokens, cost or time left closes the calls
    unrun instead (outcome ``cancelled``) and records `StoppedByLimit`.

    Raises:
        ValueError: A model request is waiting for its reply.
    """
    state = run.state
    if value_of(state).waiting:
        raise ValueError("use_tools while the model is being waited on: think first.")
    calls = state.pending_calls
    if not calls:
        await anyio.lowlevel.checkpoint()
        return
    await anyio.lowlevel.checkpoint_if_cancelled()
    if run.budget is not None:
        refused = before_tools(run.budget, state.id, len(calls))
        if refused is not None:  # the calls are closed unrun, and the run stops
            stop_for_limit(state, refused)
            return
    await _Turn(run).run_calls(calls)
