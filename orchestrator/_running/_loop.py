"""`@loop`: a loop body repeated until a stop is decided, an `until` function says so, or a limit.

Before each turn it checks, in order: a decided stop (`finish`, a permission stop, any `stopped`
value), each `until` function (`StoppedByUntil(fn.__name__)`), the `Limits` of the run and above
it (`StoppedByLimit(limit=...)`), the turn limit (`StoppedByLimit(N)`).

A run cut off by its limit says which setting raises it: `str(state.stopped)` names
`Agent(max_turns=...)` and `@loop(limit=...)`, and the log event ``state.loop.limit_reached`` (a
warning) names the one that applies. The library stays quiet otherwise: no `warnings.warn`.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, TypeAlias, TypeGuard, cast, overload

from .._base._logs import get_log
from .._base._stopped import (
    StoppedByApproval,
    StoppedByFinish,
    StoppedByLimit,
    StoppedByPermission,
    StoppedByUntil,
)
from .._base._sync import is_async_callable
from .._base._threads import in_thread
from .._record._recording import record_stop, value_of
from ._budget import before_request, stop_for_limit
from ._frame import current_frame

if TYPE_CHECKING:
    from .._record._state import State
    from ._agent import Agent

__all__ = (
    "Loop",
    "LoopBody",
    "default_loop",
    "default_loop_with",
    "is_default_loop",
    "loop",
    "run_body",
    "waiting_for_user",
)

LoopBody: TypeAlias = "Callable[[Agent, State], Awaitable[None]] | Callable[[Agent, State], None]"
Until: TypeAlias = "Callable[[State], bool]"

DEFAULT_LIMIT = 50
"""The turns one run takes at most when nobody set a limit."""

_log = get_log("loop")


def waiting_for_user(state: State) -> bool:
    """Whether the model has answered and waits for the user.

    True when no call is pending and the last message is the model's reply without tool calls,
    or there are no messages at all.
    """
    value = value_of(state)
    if value.pending or value.held:
        return False
    if not value.messages:
        return True
    last = value.messages.last()
    return last.role == "assistant" and not last.tool_calls


async def run_body(body: LoopBody, agent: Agent, state: State) -> None:
    """Run one call of `body`: awaited if async, in a worker thread if sync.

    A sync body runs in a worker thread so that the sync Agent methods it calls can hop back
    onto the event loop. A cancelled run abandons it, like a sync tool (`_base._threads`).
    """
    await _runner(body)(agent, state)


def _runner(body: LoopBody) -> Callable[[Agent, State], Awaitable[None]]:
    """`body` as an async function: itself if async, else a call in a worker thread."""
    if is_async_callable(body):
        return cast("Callable[[Agent, State], Awaitable[None]]", body)

    async def threaded(agent: Agent, state: State) -> None:
        await in_thread(functools.partial(body, agent, state))

    return threaded


class Loop:
    """A loop body with its stop rules: what `@loop(...)` returns. Call it with (agent, state).

    `limit` is the most turns one call runs (50 unless set).
    """

    __slots__ = ("body", "limit", "until")

    def __init__(self, body: LoopBody, *, until: Iterable[Until] = (), limit: int = DEFAULT_LIMIT):
        if not callable(body):
            raise TypeError(f"@loop decorates a function body(agent, state), got {body!r}.")
        until = tuple(until)
        for fn in until:
            if not callable(fn):
                raise TypeError(f"@loop(until=[...]) takes functions of the state, got {fn!r}.")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"@loop(limit=...) must be an integer >= 1, got {limit!r}.")
        self.body: LoopBody = body
        self.until: tuple[Until, ...] = until
        self.limit: int = limit

    def __repr__(self) -> str:
        names = [getattr(fn, "__name__", repr(fn)) for fn in self.until]
        body = getattr(self.body, "__name__", self.body)
        return f"Loop({body!r}, until={names}, limit={self.limit})"

    async def __call__(self, agent: Agent, state: State) -> None:
        run = _runner(self.body)  # asked once per call: inspect is slow for a per-turn check
        turns = 0
        while self._should_continue(state, turns):
            await run(agent, state)
            turns += 1

    def _should_continue(self, state: State, turns: int) -> bool:
        # A decided stop ends the loop. An until/limit reason left by an earlier @loop call does
        # not: this call checks its own until functions and limit again.
        stopped = state.stopped
        if state.finished or isinstance(
            stopped, StoppedByFinish | StoppedByPermission | StoppedByApproval
        ):
            return False
        if isinstance(stopped, StoppedByLimit) and stopped.limit != "turns":
            return False  # a `Limits` stop of this run (its tool calls were refused)
        for fn in self.until:
            if fn(state):
                record_stop(state, StoppedByUntil(getattr(fn, "__name__", repr(fn))))
                return False
        frame = current_frame()
        run = None if frame is None else frame.run
        budget = None if run is None or run.state is not state else run.budget
        if run is not None and budget is not None:
            refused = before_request(budget, state.id, run.estimate, reserve=False)
            if refused is not None:
                stop_for_limit(state, refused)
                return False
        if turns >= self.limit:
            record_stop(state, StoppedByLimit(self.limit))
            self._tell_limit(state)
            return False
        return True

    def _tell_limit(self, state: State) -> None:
        """Log that the limit cut `state`'s run off, naming the setting that raises it."""
        setting = "Agent(max_turns=N)" if is_default_loop(self) else "@loop(limit=N)"
        _log.warning(
            "state.loop.limit_reached", state_id=state.id, turns=self.limit, setting=setting
        )


@overload
def loop(body: LoopBody, /) -> Loop: ...
@overload
def loop(
    *, until: Iterable[Until] | Until = (), limit: int = DEFAULT_LIMIT
) -> Callable[[LoopBody], Loop]: ...
def loop(
    body: LoopBody | None = None,
    /,
    *,
    until: Iterable[Until] | Until = (),
    limit: int = DEFAULT_LIMIT,
) -> Loop | Callable[[LoopBody], Loop]:
    """Turn ``def body(agent, state)`` (or ``async def``) into a loop with stop rules.

    `limit` is the most turns one run takes (50 when left out). Give the loop to an Agent with
    ``loop=``: its limit is this one, and ``Agent(max_turns=...)`` (the default loop's) cannot
    be combined with it.

    Example:
        ```python
        @loop(until=[waiting_for_user], limit=10)
        async def my_loop(agent, state):
            await agent.athink(state)
            if state.pending_calls:
                await agent.ause_tools(state)
        ```
    """
    if callable(until):  # one function instead of a list
        until = (until,)
    elif isinstance(until, str | bytes) or not isinstance(until, Iterable):
        raise TypeError(
            f"@loop(until=...) takes a list of functions of the state, e.g."
            f" until=[waiting_for_user], got {until!r}."
        )
    until = tuple(until)
    if body is not None:  # used bare: @loop
        return Loop(body, until=until, limit=limit)

    def decorate(body: LoopBody) -> Loop:
        return Loop(body, until=until, limit=limit)

    return decorate


async def _default_body(agent: Agent, state: State) -> None:
    # Exactly what a user's loop body does: the run's saver makes the saves of both the same.
    await agent.athink(state)
    if state.pending_calls:
        await agent.ause_tools(state)


default_loop = Loop(_default_body, until=(waiting_for_user,))
"""The loop `run` runs unless the Agent has its own: think, then use_tools; 50 turns at most."""


def default_loop_with(max_turns: int) -> Loop:
    """The default loop limited to `max_turns` turns."""
    return Loop(_default_body, until=default_loop.until, limit=max_turns)


def is_default_loop(body: object) -> TypeGuard[Loop]:
    """Whether `body` is the default loop, with any limit (`Agent(max_turns=...)` sets it)."""
    return isinstance(body, Loop) and body.body is _default_body
