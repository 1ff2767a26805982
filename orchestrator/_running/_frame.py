"""The current frame: the run in progress here, and the tool call it is executing.

Kept in the library's only context variable (`orchestrator._base._here`). Everything else a run
needs travels in its `Run` object, passed explicitly; the frame is for what cannot be passed,
because user code sits in between:

- a tool that runs another agent (``await other.arun(State(...))``, or ``other.run(...)`` from
  a sync tool in a worker thread) starts a child State linked to the call executing;
- a loop body calls ``agent.athink(state)``: the step finds the run it belongs to;
- a sync Agent method called from a worker thread of a run hops onto the loop, where the
  frame is the thread's (anyio copies the context both ways);
- a provider reports a retry (`report_retry`) to the reporters of the think in progress.

Context variables follow tasks and worker threads, so the frame is right in each of them.
The layers below the run reach the frame through `orchestrator._base._here.Place` (a memory write's
effect key, a provider's retry): they never import this module.
"""

from __future__ import annotations

import contextvars
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from .._base import _here
from .._base._link import Link, child_scope
from .._record._recording import add_child

if TYPE_CHECKING:
    from .._base._messages import ToolCall
    from .._base._stopped import StoppedByApproval
    from .._record._state import State
    from ._run import Run

__all__ = ("CallContext", "Frame", "current_frame", "enter", "leave")


@dataclass(frozen=True, slots=True)
class Frame:
    """Where code runs: in `run`, executing the tool call `call` (None: not in a call).

    `thinking` is true while the run's model request is waited on. It is the `Place` the
    layers below the run see.
    """

    run: Run
    call: CallContext | None = None
    thinking: bool = False

    def effect_key(self) -> str | None:
        """The effect key of the next memory write of the tool call running here, or None."""
        context = self.call
        if context is None:
            return None
        # The turn keeps a call id reused by a later turn apart; a replay of the same turn (after
        # restore) has the same turn, call and ordinal, so it writes once.
        run = self.run
        scope = run.effect_scope or run.state.id  # a subagent: its place in the parent's call
        return f"{scope}:{run.state.turn}:{context.call.id}:{next(context.ordinals)}"

    def report_retry(self, attempt: int, delay: float, error: BaseException) -> None:
        """Tell the reporters of the think in progress that the model request is retried."""
        if self.thinking:
            run = self.run
            for reporter in run.reporters:
                reporter.on_retry(run.state, attempt, delay, error)

    def report_rate_limit(self, limit: str, delay: float) -> None:
        """Tell the reporters of the think in progress that it waits for a rate limit."""
        if self.thinking:
            run = self.run
            for reporter in run.reporters:
                reporter.on_rate_limit(run.state, limit, delay)


current_frame = cast("Callable[[], Frame | None]", _here.current)
"""The frame of the code calling it, or None outside any run."""


enter = cast("Callable[[Frame], contextvars.Token[Frame | None]]", _here.enter)
"""Make a frame current in this task (and what it starts); `leave` with the token it gives."""

leave = cast("Callable[[contextvars.Token[Frame | None]], None]", _here.leave)
"""Go back to the frame before the `enter` that gave the token."""


# The builtin `list`, typed: not `list[str]` as the factory (calling a generic alias costs 7x
# more: it tries to set __orig_class__ on the list), nor a Python function (a frame per list):
# every tool call makes a context with four lists.
_new_list = cast("Callable[[], list[Any]]", list)


@dataclass(slots=True)
class CallContext:
    """A tool call being executed by `run`: subagents started in it link to it."""

    run: Run
    call: ToolCall
    child_ids: list[str] = field(default_factory=_new_list)
    children: list[State] = field(default_factory=_new_list)
    failures: list[BaseException] = field(default_factory=_new_list)  # of children
    # Numbers the call's memory writes: their effect keys are state id, call id, ordinal.
    ordinals: itertools.count[int] = field(default_factory=itertools.count)
    # A subagent State this call started before and continues now (its calls were decided).
    resume: State | None = None
    # The approval stops of the subagents this call ran: the call waits with them.
    suspended: list[StoppedByApproval] = field(default_factory=_new_list)
    # The children that spent against the run's limits as they ran (here, not elsewhere).
    counted: list[str] = field(default_factory=_new_list)

    def next_scope(self) -> str:
        """The effect scope of the next child of this call: its place in the call.

        The same whether the child runs here or elsewhere.
        """
        run = self.run
        scope = run.effect_scope or run.state.id
        return child_scope(scope, run.state.turn, self.call.id, len(self.child_ids))

    def link_child(self, state_id: str) -> Link:
        """The link of a new child `state_id` of this call, listed now, before it runs anywhere.

        Its scope (the prefix of its memory effect keys) is its place in the call, the same
        whether it runs here or elsewhere.
        """
        scope = self.next_scope()
        self.child_ids.append(state_id)
        return Link(parent_id=self.run.state.id, call_id=self.call.id, scope=scope)

    def adopt(self, child: State) -> None:
        """Keep `child`, run elsewhere, as this call's: its usage rolls up, `child()` finds it."""
        if child.id not in self.child_ids:
            self.child_ids.append(child.id)
        if all(known.id != child.id for known in self.children):
            self.children.append(child)
            add_child(self.run.state, child)
