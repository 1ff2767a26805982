"""The current frame: the run in progress here, and the tool call it is executing.

The library's only context variable. Everything else a run needs travels in its `Run` object,
passed explicitly; the frame is for what cannot be passed, because user code sits in between:

- a tool that runs another agent (``await other.arun(State(...))``, or ``other.run(...)`` from
  a sync tool in a worker thread) starts a child State linked to the call executing;
- a loop body calls ``agent.athink(state)``: the step finds the run it belongs to;
- a sync Agent method called from a worker thread of a run hops onto the loop, where the
  frame is the thread's (anyio copies the context both ways);
- a provider reports a retry (`report_retry`) to the reporters of the think in progress.

Context variables follow tasks and worker threads, so the frame is right in each of them.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._run import CallContext, Run

__all__ = ("Frame", "current_frame", "enter", "leave")


@dataclass(frozen=True, slots=True)
class Frame:
    """Where code runs: in `run`, executing the tool call `call` (None: not in a call).

    `thinking` is true while the run's model request is waited on.
    """

    run: Run
    call: CallContext | None = None
    thinking: bool = False


_current: contextvars.ContextVar[Frame | None] = contextvars.ContextVar(
    "orchestrator_frame", default=None
)

current_frame = _current.get
"""The frame of the code calling it, or None outside any run."""


def enter(frame: Frame) -> contextvars.Token[Frame | None]:
    """Make `frame` current in this task (and what it starts); `leave` with the token."""
    return _current.set(frame)


def leave(token: contextvars.Token[Frame | None]) -> None:
    """Go back to the frame before the `enter` that gave `token`."""
    _current.reset(token)
