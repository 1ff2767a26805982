"""`Runs`: agent runs as a service an app owns, each a task of the service, not of a request.

``async with Runs(agents, store) as runs:`` in an app's lifespan. `start` saves the State and
runs it in the service's task group, so a client that disconnects never cancels it; `cancel`,
`approve` and `deny` act on it by id from any request, and a decision that leaves nothing waiting
continues the run in the background. Every run is saved to the service's store as it goes
(that is where `get` and `list` read it), so a run that waits for a person survives a restart:
the decision is recorded and the run continues in the process that took it.

Leaving the block cancels every run still going; each records the interruption, closes its
pending calls and is saved before the block returns (a cancelled run saves itself, shielded).

An agent is found by its name, which each run records in its history (`RunStart.agent`): the
process that continues a run after an approval or a restart looks its agent up by that name.

``start(..., limits=Limits(...))`` bounds one run and its subagents beside the agent's own
``Agent(limits=)``: the tighter of each field holds, so a caller can tighten an agent's limits,
never loosen them. What the run spent before is in its history, so a run started again on the
same State keeps its budget. The limits a run was given are in its history (`RunStart.limits`),
so a run that waits for a decision continues under them, whichever process takes it.
"""

from __future__ import annotations

import builtins
import math
import os
import secrets
import socket
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Literal

import anyio
import anyio.abc

from .._apps._approvals import aapprove, adeny, awaiting
from .._apps._events import Event, TextDelta
from .._base._errors import OrchestratorError
from .._base._limits import Limits
from .._base._messages import Message
from .._base._reply import Usage
from .._base._stopped import Stopped, StoppedByApproval, StoppedByUntil
from .._record._history import RunStart, RunStartEntry
from .._record._leases import AsyncRunLeases
from .._record._state import State
from .._record._storage import AsyncTreeFollowable, StateInfo, title_of
from .._record._store_client import AnyStore, StoreClient, client_of
from .._running._agent import Agent
from .._running._loop import waiting_for_user
from ._following import Following

if TYPE_CHECKING:
    from types import TracebackType

__all__ = (
    "DEFAULT_LEASE",
    "DEFAULT_MAX_RUNS",
    "RunHandle",
    "RunInfo",
    "RunStatus",
    "Runs",
    "TooManyRunsError",
)

DEFAULT_LEASE = 10.0
"""Seconds a service's lease on a run it runs lasts unless renewed (`Runs(lease=...)`): how
long after its process dies another process may take the run over."""

_RENEWALS = 5  # a lease is renewed five times over its length: cancels are seen that often

DEFAULT_MAX_RUNS = 100
"""How many runs one `Runs` service runs at once unless `max_runs` is set."""

RunStatus = Literal["running", "waiting", "answered", "finished", "stopped", "idle"]
"""Where a run is: running in this service; waiting for a person to approve or deny a call;
answered (the model replied and waits for the user: another message continues it); finished
(`State.finish` was called: it cannot run again); stopped for another reason (`RunInfo.stopped`
says which: a limit, an `until`, a permission); or idle: stored and not running (never run, or
its last run failed, was cancelled or was cut off by a crash)."""


class TooManyRunsError(OrchestratorError):
    """`Runs.start` was called while `max_runs` runs were running."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunInfo:
    """What a service knows of one run: its State's stored info and whether it runs here."""

    state_id: str
    status: RunStatus
    title: str = ""
    turn: int = 0
    usage: Usage = field(default_factory=Usage)
    stopped: Stopped | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    entries: int = 0
    """How many entries the State's history holds: ``follow(..., since=entries)`` gives the
    events of what runs from here on."""


def _status(stopped: Stopped | None, finished: bool, running: bool) -> RunStatus:
    if running:
        return "running"
    if finished:
        return "finished"
    if isinstance(stopped, StoppedByApproval):
        return "waiting"
    if isinstance(stopped, StoppedByUntil) and stopped.name == waiting_for_user.__name__:
        return "answered"
    return "idle" if stopped is None else "stopped"


def _info_of(info: StateInfo, running: bool) -> RunInfo:
    return RunInfo(
        state_id=info.id,
        status=_status(info.stopped, info.finished, running),
        title=info.title,
        turn=info.turn,
        usage=info.usage,
        stopped=info.stopped,
        created_at=info.created_at,
        updated_at=info.updated_at,
        entries=info.entries,
    )


def _info_of_state(state: State, running: bool) -> RunInfo:
    return RunInfo(
        state_id=state.id,
        status=_status(state.stopped, state.finished, running),
        title=title_of(state.messages),
        turn=state.turn,
        usage=state.usage,
        stopped=state.stopped,
        created_at=state.created_at,
        updated_at=state.updated_at,
        entries=len(state.history),
    )


class _Running:
    """One run in the service: its State, its agent, the scope that cancels it, its end.

    It keeps the text deltas of its tree's replies still streaming (`deltas`, each numbered by
    `seq`), the live part a follower adds to the stored events; a reply's deltas go once the
    reply is recorded, as it is then stored whole. Each of `watchers` (a waiting follower's
    wake-up) is called on each new delta and at the run's end.
    """

    __slots__ = (
        "agent",
        "deltas",
        "done",
        "error",
        "limits",
        "scope",
        "seq",
        "state",
        "watchers",
    )

    def __init__(self, agent: Agent, state: State, limits: Limits | None) -> None:
        self.agent = agent
        self.state = state
        self.limits = limits
        self.scope = anyio.CancelScope()
        self.done = anyio.Event()
        self.error: BaseException | None = None
        self.deltas: builtins.list[tuple[int, TextDelta]] = []
        self.seq = 0
        self.watchers: set[Callable[[], object]] = set()

    def take(self, event: Event) -> None:
        """Keep what followers need of a live event of the run."""
        if event.kind == "text":
            self.seq += 1
            self.deltas.append((self.seq, event))
            self.wake()
        elif event.kind == "model_reply":
            replied = event.state_id
            self.deltas = [item for item in self.deltas if item[1].state_id != replied]

    def wake(self) -> None:
        """Wake the followers waiting for this run (on the service's event loop)."""
        for watcher in tuple(self.watchers):
            watcher()


@dataclass(frozen=True, slots=True)
class RunHandle:
    """A run `Runs.start` started: its State's id, the live State, and the service it runs in.

    `since` is where the run begins in its State's history (the index of the input it was
    given): `follow` gives the events from there.
    """

    state_id: str
    state: State
    runs: Runs
    since: int = 0

    def follow(self) -> Following:
        """The events of this run (not the State's earlier ones), as `Runs.follow` gives them."""
        return self.runs.follow(self.state_id, since=self.since)

    async def wait(self) -> RunInfo:
        """Wait until the run is no longer running in this service; its info then."""
        return await self.runs.wait(self.state_id)

    async def cancel(self) -> RunInfo:
        """Cancel the run (see `Runs.cancel`)."""
        return await self.runs.cancel(self.state_id)


def _agents_by_name(agents: Mapping[str, Agent] | Sequence[Agent]) -> dict[str, Agent]:
    if isinstance(agents, Mapping):
        named = dict(agents)
    else:
        named: dict[str, Agent] = {}
        for agent in agents:
            if not isinstance(agent, Agent):
                raise TypeError(f"Runs takes Agents, got {type(agent).__name__}.")
            if agent.name is None:
                raise ValueError(
                    "Every agent of a Runs service needs a name (Agent(..., name='support')):"
                    " a run records it, and the process that continues the run finds its agent"
                    " by it."
                )
            if agent.name in named:
                raise ValueError(f"Two agents are named {agent.name!r}: give each its own name.")
            named[agent.name] = agent
    if not named:
        raise ValueError("Runs needs at least one agent to run.")
    for name, agent in named.items():
        if not isinstance(agent, Agent):
            raise TypeError(f"Runs takes Agents, got {type(agent).__name__} for {name!r}.")
    return named


class Runs:
    """The agent runs of an app: started, cancelled and decided by id, each saved as it goes.

    `agents` are the agents the service runs, by name (a sequence of named agents, or a
    mapping). Every run is saved to `store`; an agent that has its own store must use the same
    one. At most `max_runs` run at once; `start` past that raises `TooManyRunsError`.

    Example:
        ```python
        async with Runs([agent], store) as runs:
            handle = await runs.start("support", "Where is my order?")
            info = await handle.wait()
        ```
    """

    def __init__(
        self,
        agents: Mapping[str, Agent] | Sequence[Agent],
        store: AnyStore,
        *,
        max_runs: int = DEFAULT_MAX_RUNS,
        lease: float = DEFAULT_LEASE,
    ) -> None:
        if isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 1:
            raise ValueError(f"max_runs must be an integer >= 1, got {max_runs!r}.")
        if isinstance(lease, bool) or not isinstance(lease, int | float) or not lease > 0:
            raise ValueError(f"lease must be a positive number of seconds, got {lease!r}.")
        self._agents = _agents_by_name(agents)
        for name, agent in self._agents.items():
            if agent.store is not None and agent.store is not store:
                raise ValueError(
                    f"Agent {name!r} saves to another store than the service's: give it"
                    " store=None (the service saves every run to its own store) or the same"
                    " store."
                )
        self._client: StoreClient = client_of(store)
        self._max_runs = max_runs
        self._running: dict[str, _Running] = {}
        self._deciding = anyio.Lock()
        self._group: anyio.abc.TaskGroup | None = None
        self._boot = secrets.token_hex(4)
        self._owner = f"{socket.gethostname()}/{os.getpid()}/{self._boot}"
        self._leases = store if isinstance(store, AsyncRunLeases) else None
        self._lease = float(lease)
        """Names this service's live text in event ids (another service's seq means nothing)."""
        self._stack: AsyncExitStack | None = None

    @property
    def store(self) -> AnyStore:
        """The store every run is saved to."""
        return self._client.store

    @property
    def store_name(self) -> str:
        """The store as people name it: its URL (without passwords), else its kind."""
        return self._client.url or type(self._client.store).__name__

    @property
    def agents(self) -> Mapping[str, Agent]:
        """The agents the service runs, by name."""
        return dict(self._agents)

    @property
    def running(self) -> tuple[str, ...]:
        """The ids of the runs running in this service now, oldest first."""
        return tuple(self._running)

    async def __aenter__(self) -> Runs:
        if self._stack is not None:
            raise RuntimeError("This Runs service is open already: enter it once.")
        stack = AsyncExitStack()
        self._group = await stack.enter_async_context(anyio.create_task_group())
        self._stack = stack
        if self._leases is not None:
            self._group.start_soon(self._renew, self._leases, name="renew run leases")
        return self

    @property
    def owner(self) -> str:
        """Who this service is in the store's run leases: host, process id and a random token."""
        return self._owner

    async def _renew(self, leases: AsyncRunLeases) -> None:
        """Renew the leases of the runs running here; stop those another process cancelled."""
        while True:
            await anyio.sleep(self._lease / _RENEWALS)
            ids = builtins.list(self._running)
            if not ids:
                continue
            for state_id in await leases.arenew_runs(self._owner, ids, seconds=self._lease):
                running = self._running.get(state_id)
                if running is not None:
                    running.scope.cancel()

    async def _claim(self, state_id: str) -> None:
        """Take the lease of `state_id` (a store without leases has none to take).

        Raises:
            ValueError: Another process runs it.
        """
        if self._leases is None:
            return
        holder = await self._leases.aclaim_run(state_id, self._owner, seconds=self._lease)
        if holder is not None:
            raise ValueError(
                f"Run {state_id} is running in another process ({holder}): follow it, or"
                " cancel it first (runs.cancel works from any process sharing the store)."
            )

    async def _release(self, state_id: str) -> None:
        if self._leases is not None:
            with anyio.CancelScope(shield=True):
                await self._leases.arelease_run(state_id, self._owner)

    async def _runs_elsewhere(self, state_id: str) -> bool:
        return bool(await self._elsewhere([state_id]))

    async def _elsewhere(self, state_ids: Sequence[str]) -> dict[str, str]:
        """The other processes running `state_ids`, by id (none without leases)."""
        if self._leases is None or not state_ids:
            return {}
        owners = await self._leases.arun_owners(state_ids)
        return {key: owner for key, owner in owners.items() if owner != self._owner}

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        stack, group = self._stack, self._group
        if stack is None or group is None:
            raise RuntimeError("This Runs service is not open: it was left already.")
        group.cancel_scope.cancel()  # every run records the interruption and saves itself
        try:
            return await stack.__aexit__(kind, error, traceback)
        finally:
            self._stack = self._group = None

    def _open_group(self) -> anyio.abc.TaskGroup:
        if self._group is None:
            raise RuntimeError(
                "The Runs service is not open: use it inside `async with Runs(...) as runs:`"
                " (an app's lifespan)."
            )
        return self._group

    def _agent(self, name: str) -> Agent:
        agent = self._agents.get(name)
        if agent is None:
            known = ", ".join(repr(known) for known in self._agents)
            raise KeyError(f"No agent named {name!r} in this service; it runs {known}.")
        return agent

    async def start(
        self,
        agent: str,
        input: str | Message | None = None,
        *,
        state_id: str | None = None,
        limits: Limits | None = None,
    ) -> RunHandle:
        """Start a run of the agent named `agent` in the service; return once it is saved.

        `input` is the user's message. Without `state_id` the run has a new State; with one,
        the stored State of that id continues (`input`, if given, is added to it first), or a
        new State gets that id. The run goes on after the caller (a request) is gone.

        `limits` bound this run and its subagents beside the agent's own limits: the tighter
        of each field holds, so they can tighten the agent's limits, never loosen them. What
        the State spent before counts (its history holds it), so a continued run keeps its
        budget. A decision continues the run under the same limits, whichever process takes it
        (the run's history records them).

        Raises:
            KeyError: No agent has that name.
            TooManyRunsError: `max_runs` runs are running.
            TypeError: `limits` is not a `Limits`.
            ValueError: The State is running here already, is finished, or a new State has no
                input.
        """
        if limits is not None and not isinstance(limits, Limits):
            raise TypeError(
                f"limits must be a Limits, e.g. limits=Limits(total_tokens=100_000), got"
                f" {type(limits).__name__}."
            )
        group = self._open_group()
        chosen = self._agent(agent)
        if state_id is not None and state_id in self._running:
            raise ValueError(
                f"Run {state_id} is running already: follow it, or cancel it before starting"
                " it again."
            )
        self._check_room()
        message = _message(input)
        new_id = uuid.uuid4().hex if state_id is None else state_id
        await self._claim(new_id)
        try:
            state, since = await self._prepare(new_id, state_id is None, message)
            if state.id in self._running:  # started by another request while this one saved
                raise ValueError(f"Run {state.id} is running already: follow it, or cancel it.")
            self._check_room()
        except BaseException:
            if new_id not in self._running:
                await self._release(new_id)
            raise
        return self._launch(group, chosen, state, since, limits)

    async def _prepare(
        self, state_id: str, new: bool, message: Message | None
    ) -> tuple[State, int]:
        """The State a run starts on, with the input added and saved; where the run begins."""
        if new:
            state = State(id=state_id)
        else:
            try:
                state = await self._client.load(state_id)
            except LookupError:
                state = State(id=state_id)
        if state.finished:
            raise ValueError(
                f"Run {state.id} is finished, so it cannot run again: start a new run (with"
                " the messages it needs) instead."
            )
        since = len(state.history)
        if message is not None:
            state.add_message(message)
        elif not state.messages:
            raise ValueError(f"Run {state.id} is new: give the input the agent should answer.")
        await self._client.save(state)  # listed, and bound: the run saves there as it goes
        return state, since

    def _check_room(self) -> None:
        if len(self._running) >= self._max_runs:
            raise TooManyRunsError(
                f"{len(self._running)} runs are running, the most this service runs at once"
                f" (max_runs={self._max_runs}): wait for one to end, cancel one, or make the"
                " service with a higher Runs(..., max_runs=N)."
            )

    def _launch(
        self,
        group: anyio.abc.TaskGroup,
        agent: Agent,
        state: State,
        since: int,
        limits: Limits | None,
    ) -> RunHandle:
        running = _Running(agent, state, limits)
        self._running[state.id] = running
        group.start_soon(self._drive, running, name=f"run {state.id}")
        return RunHandle(state.id, state, self, since)

    async def _drive(self, running: _Running) -> None:
        try:
            with running.scope:
                async with running.agent.events(running.state, limits=running.limits) as events:
                    async for event in events:
                        running.take(event)
        except Exception as error:  # recorded in the State's history by the run itself
            running.error = error
        finally:
            del self._running[running.state.id]
            await self._release(running.state.id)
            running.done.set()
            running.wake()

    async def wait(self, state_id: str) -> RunInfo:
        """Wait until run `state_id` is not running in this service; its info then.

        Raises:
            LookupError: No run of that id is stored.
        """
        running = self._running.get(state_id)
        if running is not None:
            await running.done.wait()
        return await self.get(state_id)

    async def cancel(self, state_id: str) -> RunInfo:
        """Cancel run `state_id` and wait until it is saved; its info then.

        The run records the interruption and closes its pending calls (their tools may have
        run: they are closed as interrupted, never re-run), as any cancelled run does.

        A run another process runs (sharing the store's run leases) is asked to cancel: its
        process sees the request within a fifth of the lease, cancels and saves it; this
        returns once it did (or its process died and the lease ran out).

        Raises:
            LookupError: The run is not running.
        """
        running = self._running.get(state_id)
        if running is not None:
            running.scope.cancel()
            await running.done.wait()
            return await self.get(state_id)
        owner = None if self._leases is None else await self._leases.arequest_cancel(state_id)
        if owner is None:
            raise LookupError(
                f"Run {state_id} is not running, so there is nothing to cancel: see its"
                " status with runs.get(state_id)."
            )
        while True:  # the owner sees the request when it next renews its leases
            if not await self._elsewhere([state_id]):
                return await self.get(state_id)
            await anyio.sleep(self._lease / _RENEWALS)

    async def approve(
        self, state_id: str, call_id: str, *, by: str | None = None, reason: str | None = None
    ) -> RunInfo:
        """Approve the waiting call `call_id` of run `state_id` (or of one of its subagents).

        The decision is recorded and saved; once no call waits any more, the run continues
        in the background, its approved calls run exactly once.

        Raises:
            LookupError: No run of that id is stored, or no call `call_id` waits in it.
            ValueError: The run is running, or the call was denied already.
        """
        return await self._decide(state_id, call_id, True, by, reason)

    async def deny(
        self, state_id: str, call_id: str, *, by: str | None = None, reason: str | None = None
    ) -> RunInfo:
        """Deny the waiting call `call_id` of run `state_id`: the model reads the denial.

        As `approve`, the run continues once no call waits.
        """
        return await self._decide(state_id, call_id, False, by, reason)

    async def _decide(
        self, state_id: str, call_id: str, approved: bool, by: str | None, reason: str | None
    ) -> RunInfo:
        group = self._open_group()
        async with self._deciding:  # one decision at a time: each reads the one before it
            if state_id in self._running:
                raise ValueError(
                    f"Run {state_id} is running: a call can be decided once the run stops to"
                    " wait for it."
                )
            await self._claim(state_id)  # no other process runs or decides it meanwhile
            launched = False
            try:
                state = await self._client.load(state_id)
                decide = aapprove if approved else adeny
                await decide(state, call_id, by=by, reason=reason)
                if awaiting(state):
                    return _info_of_state(state, running=False)
                self._check_room()
                start = _last_start(state)
                self._launch(
                    group, self._agent_of(start, state), state, len(state.history), start.limits
                )
                launched = True
                return _info_of_state(state, running=True)
            finally:
                if not launched:
                    await self._release(state_id)

    def _agent_of(self, start: RunStart, state: State) -> Agent:
        """The agent `start`, the last run start of `state`, ran with, found by its name."""
        if start.agent is None:
            raise LookupError(
                f"Run {state.id} records no agent name, so this service cannot tell which agent"
                " continues it: run it with agent.arun(state) yourself."
            )
        return self._agent(start.agent)

    def follow(self, state_id: str, *, after: str | None = None, since: int = 0) -> Following:
        """The events of run `state_id` and all its subagents: what is stored, then live.

        Each comes with an `id`; ``after=`` the id of the last event a client saw (an SSE
        ``Last-Event-ID``) continues exactly after it: nothing lost, nothing twice. The events
        that runs record (starts, replies, tool results, approvals, ends; `DurableEvent`) come
        from the store, in the order the saves committed, so any process that shares the store
        follows a run the same way, also after a restart. Text as it streams (`TextDelta`) comes
        only from the service running the run, while the reply streams; the reply's whole text
        always comes in its `ModelReplied`. Iteration ends once the run has ended and is not
        running in this service; a run another process runs is followed while that process holds
        its lease (a store with run leases), or until its end is stored.

        `since` leaves out the events of the run's State before that entry index (and of
        subagents that ran before it): ``since=info.entries`` before a decision, or
        `RunHandle.follow`, gives just the runs from there on.

        Use it in ``async for``; errors come at the first step, or at ``await
        following.ready()`` (what a server awaits before it answers). Leaving the loop early
        needs no cleanup.

        Raises:
            TypeError: The store cannot follow a tree of States (`AsyncTreeFollowable`).
            LookupError: No run of that id is stored.
            ValueError: `state_id` is a subagent (follow its root run), or `after` is not an
                event id of this run.
        """
        if isinstance(since, bool) or not isinstance(since, int) or since < 0:
            raise ValueError(f"since must be an entry index (an int >= 0), got {since!r}.")
        return Following(
            self._tree_feed,
            self._running.get,
            self._boot,
            state_id,
            after,
            since,
            None if self._leases is None else self._runs_elsewhere,
            self._lease / _RENEWALS,
        )

    def _tree_feed(self) -> AsyncTreeFollowable:
        """The store, as a feed of trees of States."""
        store = self._client.store
        if isinstance(store, AsyncTreeFollowable):
            return store
        raise TypeError(
            f"{type(store).__name__} cannot follow a tree of States (it has no"
            " `await_tree_entries`): follow runs with a store that can, such as SQLiteStore,"
            " AioSQLiteStore, PostgresStore or MemoryStore."
        )

    async def get(self, state_id: str) -> RunInfo:
        """The info of run `state_id`: live if it runs here, else as stored.

        Raises:
            LookupError: No run of that id is stored.
        """
        running = self._running.get(state_id)
        if running is not None:
            return _info_of_state(running.state, running=True)
        # The lease before the State: a run elsewhere saves its end before it gives the lease
        # back, so a lease seen gone means the load below shows that end (read the other way
        # round, a run ending between the two reads looked as it was before it ran).
        elsewhere = await self._elsewhere([state_id])
        state = await self._client.load(state_id)
        return _info_of_state(state, running=state_id in self._running or bool(elsewhere))

    async def list(self, *, limit: int | None = None) -> builtins.list[RunInfo]:
        """The stored runs (root States, not subagents), most recently updated first."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise TypeError(f"limit must be an int or None, got {limit!r}.")
        wanted = math.inf if limit is None else limit
        roots: builtins.list[StateInfo] = []
        for info in await self._client.list():
            if len(roots) >= wanted:
                break
            if info.parent_id is None and info.damage is None:
                roots.append(info)
        elsewhere = await self._elsewhere([info.id for info in roots])
        return [
            _info_of(info, running=info.id in self._running or info.id in elsewhere)
            for info in roots
        ]


def _message(input: str | Message | None) -> Message | None:
    if input is None or isinstance(input, Message):
        return input
    if isinstance(input, str):
        if not input.strip():
            raise ValueError("The input is empty: give the text the agent should answer.")
        return Message.user(input)
    raise TypeError(f"input must be a str or a Message, got {type(input).__name__}.")


def _last_start(state: State) -> RunStart:
    """The last run start `state` recorded: its agent and limits (empty when it has none)."""
    for entry in reversed(state.history):
        if isinstance(entry, RunStartEntry):
            return entry.content
    return RunStart()
