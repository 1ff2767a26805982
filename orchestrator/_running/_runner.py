"""The runner protocol, the job a runner gets, and `LocalRunner`.

A subagent tool does not run its child itself: it hands a `ChildJob` to a runner and gets the
child's State back once the child's run ended. `LocalRunner` runs it here, in the parent's
task; `RayRunner` (`orchestrator.runners.RayRunner`) on a Ray cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import anyio.lowlevel

from .._base._limits import Limits
from .._base._link import Link
from .._base._messages import Message
from .._record._state import State
from .._record._store_client import AnyStore, client_of

if TYPE_CHECKING:
    from ._agent import Agent

__all__ = ("ChildJob", "LocalRunner", "Runner", "load_state", "save_state")


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildJob:
    """One child run: which agent runs it, where it hangs, and what it does.

    Attributes:
        agent: The subagent (a runner elsewhere rebuilds it by `agent.name`).
        link: The parent State and tool call the child hangs under.
        state_id: The child State's id (the parent lists it before the child starts).
        task: The task of a new child; None continues the stored State `state_id` (a child
            that a crash cut off), from its own history.
        store: The parent's store, where the child is saved (None: not saved).
        deadline: When the child must stop, in `time.time()` seconds (the parent's
            deadline), or None.
        state: The child State itself, when the parent has it in memory and continues it (a
            runner here runs this object; a runner elsewhere loads `state_id`).
        trace_context: What the parent's reporters give the child to carry
            (`Reporter.trace_context`): with an `OtelReporter`, the W3C trace context
            (``traceparent``) of the call's span. A runner elsewhere sends it, so the child's
            spans there hang under the call; a runner here has no need of it.
        limits: The child's own limits (its tool's slice), or None.
        remaining: What is left of the limits above the child when it starts, or None. A
            runner here ignores it (the child spends against them live); a runner elsewhere
            gives it to the child as limits of its own, so it keeps to them there (the parent
            also counts what it saves, from the store's tree feed, and stops it at a limit).
    """

    agent: Agent
    link: Link
    state_id: str
    task: str | None
    store: AnyStore | None = None
    deadline: float | None = None
    state: State | None = None
    trace_context: Mapping[str, str] = field(default_factory=dict[str, str])
    limits: Limits | None = None
    remaining: Limits | None = None

    async def open_state(self, store: AnyStore | None = None) -> State:
        """The child's State: a new one with the task, or the one to continue.

        Args:
            store: Where to load a stored child from (default: the job's `state` when it has
                one, else the job's store).

        Raises:
            ValueError: The job continues a stored child, but there is no store.
            LookupError: The store has no State `state_id`.
        """
        if self.state is not None and store is None:
            await anyio.lowlevel.checkpoint()
            return self.state
        store = self.store if store is None else store
        if self.task is not None:
            await anyio.lowlevel.checkpoint()
            return State(id=self.state_id, messages=[Message.user(self.task)])
        if store is None:
            raise ValueError(
                f"Cannot continue the child State {self.state_id}: the job has no store to"
                " load it from. Give the parent agent a store."
            )
        return await load_state(store, self.state_id)


@runtime_checkable
class Runner(Protocol):
    """Where a subagent's child runs execute: `LocalRunner` (here) or `RayRunner`.

    `run` runs the job's child to its end, linked to the job's call
    (``await agent.arun(state, link=job.link)``), and returns the child State as it ended,
    with its answer and usage. A cancellation of `run` stops the child, which records
    ``interrupted`` and is saved, before `run` re-raises it. A child that fails raises (a
    `ChildRunError` when the State is elsewhere, carrying it when it could be loaded).
    """

    def check(self, job: ChildJob) -> None:
        """Refuse, before anything starts, a job this runner cannot run (`ValueError`).

        The error ends the parent's run: it is a setup mistake, not the model's to handle.
        """
        ...

    async def run(self, job: ChildJob) -> State:
        """Run the job's child to its end and return its State."""
        ...


class LocalRunner:
    """Runs each child here, in the parent's task: the default, and today's behaviour.

    The child shares the parent's process, reporters and store; a cancellation of the parent
    reaches it at once.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return "LocalRunner()"

    def check(self, job: ChildJob) -> None:
        """Every job runs here."""

    async def run(self, job: ChildJob) -> State:
        """Run the job's child in this task and return its State."""
        state = await job.open_state()
        await job.agent.arun(state, link=job.link, limits=job.limits)
        return state


async def load_state(store: AnyStore, state_id: str) -> State:
    """Load `state_id` from `store` (an async store, or a sync one in a worker thread)."""
    return await client_of(store).load(state_id)


async def save_state(store: AnyStore, state: State) -> None:
    """Save `state` in `store` (an async store, or a sync one in a worker thread)."""
    await client_of(store).save(state)
