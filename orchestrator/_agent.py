"""`Agent`: the settings that run a State, and its actions as sync and async twins.

The async methods are the core; each sync method runs its twin through the one bridge in
`orchestrator._sync`. Settings are fixed after construction: `agent.copy(**changes)` makes a
variant.
"""

from __future__ import annotations

import contextvars
import re
import threading
from collections.abc import Iterable
from typing import Any, TypeVar, cast, overload

import anyio

from ._ask import ask as _ask
from ._ask import compact as _compact
from ._errors import is_interruption
from ._execute import CallContext, current_call, merge_due, run_tools, stragglers, wait_for
from ._history import RunStart
from ._logs import get_log
from ._loop import Loop, LoopBody, default_loop, default_loop_with, is_default_loop, run_body
from ._memory import Memory
from ._memory_tools import agent_memory, collection_tools, memory_required
from ._messages import Message, ToolCall
from ._permissions import Permission, check_permissions
from ._recording import (
    add_child,
    begin_run,
    begin_think,
    bind_schema,
    bind_state,
    close_pending,
    end_run,
    record_error,
    record_reply,
    record_run_start,
    store_of,
    value_of,
)
from ._reply import Reply
from ._reporting import Reporter, thinking
from ._state import RESERVED, State
from ._subagents import AgentTool
from ._sync import call_twin, run_sync
from ._tools import Tool, as_tool_list, check_outputs_against_schema
from ._typed import Schema
from .models import Model, Request
from .models._base import resolve_model

__all__ = ("Agent",)

# The reporter of the run in progress: children that have none of their own report to it.
_run_reporters: contextvars.ContextVar[tuple[Reporter, ...]] = contextvars.ContextVar(
    "orchestrator_run_reporters", default=()
)


def _as_iterable(tools: Any) -> Iterable[Any]:
    if isinstance(tools, str | bytes) or not isinstance(tools, Iterable):
        raise TypeError(
            f"tools must be a list of tools (functions, @tool objects, Agents), got {tools!r}."
        )
    return cast("Iterable[Any]", tools)


_T = TypeVar("_T")
_log = get_log("agent")


_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _loop_for(loop: Loop | LoopBody | None, max_turns: int | None) -> Loop | LoopBody:
    """The loop an Agent runs: `loop`, or the default loop limited to `max_turns` turns.

    `max_turns` is the default loop's limit only: a loop of your own has its own
    (``@loop(limit=N)``), so giving both is refused rather than one of them ignored.
    """
    if loop is not None and not callable(loop):
        raise TypeError(f"loop must be a @loop function or body(agent, state), got {loop!r}.")
    if max_turns is None:
        return default_loop if loop is None else loop
    if isinstance(max_turns, bool) or not isinstance(max_turns, int):
        raise TypeError(
            f"max_turns must be an int, the most turns (model requests) one run takes, got"
            f" {max_turns!r}: e.g. Agent(model, max_turns=200)."
        )
    if max_turns < 1:
        raise ValueError(
            f"max_turns must be at least 1, got {max_turns}: it is the most turns (model"
            " requests) one run takes."
        )
    if loop is not None:
        raise ValueError(
            f"Agent got both loop= and max_turns={max_turns}: max_turns is the limit of the"
            " default loop, and a loop of your own sets its own with @loop(limit=N). Give the"
            " limit to your @loop, or leave out loop= (in agent.copy(), pass max_turns=None"
            " with a new loop=)."
        )
    return default_loop_with(max_turns)


class Agent:
    """The settings that run a State: model, instructions, tools, store, permissions.

    Each action has an async method (`arun`, `athink`, `ause_tools`, `aask`, `acompact`) and a
    sync twin without the ``a``. Constructing an Agent never touches the network.

    `run` repeats turns (think, then the tools asked for) until the model answers, at most
    `max_turns` turns (50 unless set; then ``state.stopped`` is `StoppedByLimit`). A loop of
    your own (``loop=``) takes its limit from ``@loop(limit=...)`` instead: giving it with
    `max_turns` raises `ValueError`.

    Example:
        ```python
        agent = Agent(FakeModel(["Hello!"]), instructions="Be brief.")
        print(agent.run("Say hello"))
        ```
    """

    __slots__ = (
        "_description",
        "_instructions",
        "_loop",
        "_max_concurrency",
        "_memory",
        "_model",
        "_name",
        "_permissions",
        "_reporter",
        "_schema",
        "_settings",
        "_specs",
        "_store",
        "_tool_timeout",
        "_tools",
        "_tools_by_name",
    )

    def __init__(
        self,
        model: Model | str,
        *,
        instructions: str | None = None,
        tools: Iterable[Tool | Any] = (),
        name: str | None = None,
        description: str | None = None,
        store: Any = None,
        state_schema: Any = None,
        collections: Any = None,
        permissions: Iterable[Permission] | None = None,
        reporter: Reporter | None = None,
        loop: Loop | LoopBody | None = None,
        max_concurrency: int | None = None,
        tool_timeout: float | None = None,
        max_turns: int | None = None,
    ) -> None:
        self._settings: dict[str, Any] = {
            "model": model,
            "instructions": instructions,
            "tools": tools,
            "name": name,
            "description": description,
            "store": store,
            "state_schema": state_schema,
            "collections": collections,
            "permissions": permissions,
            "reporter": reporter,
            "loop": loop,
            "max_concurrency": max_concurrency,
            "tool_timeout": tool_timeout,
            "max_turns": max_turns,
        }
        self._model = resolve_model(model)
        if instructions is not None and not isinstance(instructions, str):
            raise TypeError(f"instructions must be a str, got {type(instructions).__name__}.")
        self._instructions = instructions
        if name is not None and (not isinstance(name, str) or not _NAME.fullmatch(name)):
            raise ValueError(
                f"Agent name {name!r} is not valid: use 1 to 64 letters, digits, '_' or '-'."
            )
        self._name = name
        if description is not None and not isinstance(description, str):
            raise TypeError(f"description must be a str, got {type(description).__name__}.")
        self._description = description
        self._tools = as_tool_list(
            AgentTool(item) if isinstance(item, Agent) else item for item in _as_iterable(tools)
        )
        self._memory = agent_memory(name, store, collections)
        self._tools = collection_tools(self._memory, self._tools)  # own tools win a name clash
        self._tools_by_name = {tool.name: tool for tool in self._tools}
        self._specs = tuple(tool.spec for tool in self._tools)
        self._schema = (
            None
            if state_schema is None
            else Schema.parse(state_schema, RESERVED, owner="Agent(state_schema=)")
        )
        for tool in self._tools:
            check_outputs_against_schema(tool, self._schema)
        self._store = store
        self._permissions = check_permissions(permissions)
        if reporter is not None and not isinstance(reporter, Reporter):
            raise TypeError(
                f"reporter must be a Reporter (subclass it), got {type(reporter).__name__}."
            )
        self._reporter = reporter
        self._loop: Loop | LoopBody = _loop_for(loop, max_turns)
        if max_concurrency is not None and (
            isinstance(max_concurrency, bool)
            or not isinstance(max_concurrency, int)
            or max_concurrency < 1
        ):
            raise ValueError(f"max_concurrency must be an integer >= 1, got {max_concurrency!r}.")
        self._max_concurrency = max_concurrency
        if tool_timeout is not None and (
            isinstance(tool_timeout, bool)
            or not isinstance(tool_timeout, int | float)
            or tool_timeout <= 0
        ):
            raise ValueError(f"tool_timeout must be a number of seconds > 0, got {tool_timeout!r}.")
        self._tool_timeout = None if tool_timeout is None else float(tool_timeout)

    def __repr__(self) -> str:
        tools = list(self._tools_by_name)
        return f"Agent(name={self._name!r}, model={self._model.name!r}, tools={tools})"

    # -- settings (read-only) ------------------------------------------------------------------

    @property
    def model(self) -> Model:
        """The model this agent asks."""
        return self._model

    @property
    def instructions(self) -> str | None:
        """The system instructions sent with every request."""
        return self._instructions

    @property
    def tools(self) -> tuple[Tool, ...]:
        """The tools the model may call."""
        return self._tools

    @property
    def name(self) -> str | None:
        """The agent's name (recorded in `run_start`; scopes its memory)."""
        return self._name

    @property
    def description(self) -> str | None:
        """What this agent does (shown to a parent model when it is a tool)."""
        return self._description

    @property
    def store(self) -> Any:
        """Where the States this agent runs are saved, or None."""
        return self._store

    @property
    def memory(self) -> Memory:
        """The agent's memory: state that outlives its runs, scoped to its name, in its store.

        Raises:
            ValueError: The agent has no name or no store (the message says what to add).
        """
        if self._memory is None:
            raise memory_required(self._name, self._store)
        return self._memory

    @property
    def state_schema(self) -> Any:
        """The typed-data schema bound to the States this agent runs, or None."""
        return None if self._schema is None else self._schema.source

    @property
    def permissions(self) -> tuple[Permission, ...] | None:
        """The permission rules, or None when every call is allowed."""
        return self._permissions

    @property
    def reporter(self) -> Reporter | None:
        """The reporter that sees this agent's runs, or None."""
        return self._reporter

    @property
    def loop(self) -> Loop | LoopBody:
        """The loop `run` runs."""
        return self._loop

    @property
    def max_turns(self) -> int | None:
        """The most turns one run of the default loop takes (50 unless set).

        None when the agent runs a loop of its own (``loop=``), whose ``@loop(limit=...)``
        applies.
        """
        return self._loop.limit if is_default_loop(self._loop) else None

    @property
    def max_concurrency(self) -> int | None:
        """How many tool calls of one turn run at once (None: all parallel calls)."""
        return self._max_concurrency

    @property
    def tool_timeout(self) -> float | None:
        """The default time limit of a tool call in seconds (a tool's own `timeout` wins)."""
        return self._tool_timeout

    def copy(self, **changes: Any) -> Agent:
        """A new Agent with these settings changed, e.g. ``agent.copy(instructions="...")``."""
        unknown = set(changes) - set(self._settings)
        if unknown:
            raise TypeError(
                f"Agent.copy got unknown settings {sorted(unknown)}: it takes"
                f" {', '.join(self._settings)}."
            )
        return Agent(**{**self._settings, **changes})

    # -- running ---------------------------------------------------------------------------------

    def _as_state(self, state: State | str) -> State:
        if isinstance(state, str):
            if not state.strip():
                raise ValueError("run got an empty prompt: pass the task as text or a State.")
            return State(messages=[Message.user(state)])
        if not isinstance(state, State):
            raise TypeError(
                f"run takes a State or a prompt str, got {type(state).__name__}:"
                " use State(messages=[Message.user(text)])."
            )
        return state

    @staticmethod
    def _require_unfinished(state: State, action: str) -> None:
        if not isinstance(state, State):
            raise TypeError(f"{action} takes a State, got {type(state).__name__}.")
        if state.finished:
            raise ValueError(
                f"State {state.id} is finished, so it cannot {action} again: restore a snapshot"
                " taken before finish(), or start a new State from state.messages."
            )

    async def arun(self, state: State | str) -> Any:
        """Run the loop on `state` (a `str` starts a new State) and return `state.answer`.

        The run ends when the model answers, a stop is decided, or at the turn limit
        (`max_turns`; ``state.stopped`` says which, and names the setting to raise).

        When the run is cancelled or an exception leaves it, the error is recorded once, pending
        calls are closed, the State is saved, and the exception is re-raised unchanged.

        Raises:
            ValueError: The State is finished or already running.
        """
        state = self._as_state(state)
        self._require_unfinished(state, "run")
        begin_run(state)
        error: BaseException | None = None
        reporter_token = _run_reporters.set(self._reporters())
        threads: list[threading.Event] = []
        threads_token = stragglers.set(threads)
        link: CallContext | None = None
        try:
            if self._schema is not None:
                bind_schema(state, self._schema)
            link = self._start(state)
            merge_due(state, self._tools_by_name)  # of a turn a crash or a fork cut off
            if not is_default_loop(self._loop):  # which saves it with its first request
                await self._save(state)
            self._report("on_run_start", state)
            _log.info("state.run.started", state_id=state.id, agent=self._name)
            await self._run_loop(state)
            await self._save(state)
            await self._save_late_entries(state, threads)
        except BaseException as exc:
            error = exc
            if link is not None:
                link.failures.append(exc)  # the parent's call tells a child's failure apart
            with anyio.CancelScope(shield=True):
                self._close_after(state, exc)
                await self._save_after(state, exc)
                await self._save_late_entries(state, threads, exc)
            raise
        finally:
            await wait_for(threads)  # nothing runs on after the run (waited for above already)
            stragglers.reset(threads_token)
            end_run(state)
            _run_reporters.reset(reporter_token)
            _log.info(
                "state.run.finished",
                state_id=state.id,
                turn=state.turn,
                error=None if error is None else repr(error),
            )
            self._report("on_run_end", state, error)
        return state.answer

    def _start(self, state: State) -> CallContext | None:
        """Record the run's start; link `state` to the tool call running it, if any.

        Returns the call's context when `state` became its child.
        """
        parent = current_call.get()
        link = parent is not None and parent.state is not state and not value_of(state).linked
        start = RunStart(
            parent_id=parent.state.id if parent is not None and link else None,
            parent_call_id=parent.call.id if parent is not None and link else None,
            agent=self._name,
            model=self._model.name,
            tools=tuple(self._tools_by_name),
        )
        record_run_start(state, start)
        if parent is not None and link:
            scope = parent.state._effect_scope or parent.state.id
            place = f"{parent.state.turn}:{parent.call.id}/{len(parent.child_ids)}"
            state._effect_scope = f"{scope}:{place}"
            parent.child_ids.append(state.id)
            parent.children.append(state)
            add_child(parent.state, state)
            if self._store is None and store_of(state) is None:
                inherited = parent.agent._store_for(parent.state)
                if inherited is not None:
                    bind_state(state, inherited)
            self._report("on_child_start", parent.state, parent.call, state)
            return parent
        return None

    async def _run_loop(self, state: State) -> None:
        body = self._loop
        token = current_call.set(None)
        try:
            if isinstance(body, Loop):
                await body(self, state)
            else:
                await run_body(body, self, state)
        finally:
            current_call.reset(token)

    def _close_after(self, state: State, error: BaseException) -> None:
        if state.pending_calls:
            if is_interruption(error):
                close_pending(state, "interrupted", "(interrupted by user)")
            else:
                close_pending(state, "aborted", f"(aborted: {type(error).__name__})")
        record_error(state, error)

    def run(self, state: State | str) -> Any:
        """The sync twin of `arun`."""
        return run_sync(self.arun, state, name="run")

    async def athink(self, state: State) -> Reply:
        """Send one model request with `state.messages` and record the reply.

        A failed request is taken back (the turn is restored) and its error recorded.

        Raises:
            ValueError: The State is finished, calls are pending, or a request is waiting.
        """
        return await self._think(state)

    async def _think(self, state: State, *, saved_next: bool = False) -> Reply:
        """`athink`; with `saved_next`, a reply without calls is saved by the caller's next save."""
        self._require_unfinished(state, "think")
        merge_due(state, self._tools_by_name)
        messages = begin_think(state, model=self._model.name)
        self._report("on_think_start", state)
        request = Request(system=self._instructions, messages=messages, tools=self._specs)
        # Saved before the wait, so a crash during it is recovered: the request is taken back.
        await self._save_or_take_back(state)
        reporters = self._reporters()

        def on_text(chunk: str) -> None:
            for reporter in reporters:
                reporter.on_text(state, chunk)

        token = thinking.set((state, reporters))
        try:
            reply = self._check_reply(await self._model.respond(request, on_text=on_text))
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                record_error(state, exc, again=True)
                await self._save_after(state, exc)
            raise
        finally:
            thinking.reset(token)
        record_reply(state, reply)
        if _log.debugging:  # the fields cost time on every think: only when they are logged
            _log.debug(
                "state.think.finished",
                state_id=state.id,
                turn=state.turn,
                calls=len(reply.message.tool_calls),
            )
        if not saved_next or reply.message.tool_calls:  # calls: saved before any tool runs
            await self._save(state)
        self._report("on_think_end", state, reply)
        return reply

    def _check_reply(self, reply: object) -> Reply:
        if not isinstance(reply, Reply):
            raise TypeError(
                f"The model {self._model.name!r} returned a {type(reply).__name__}, not a Reply."
            )
        calls = reply.message.tool_calls
        if len({call.id for call in calls}) == len(calls) and all(call.id for call in calls):
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

    def think(self, state: State) -> Reply:
        """The sync twin of `athink`."""
        return run_sync(self.athink, state, name="think")

    async def ause_tools(self, state: State) -> None:
        """Run `state.pending_calls` with this agent's tools and record every result."""
        await self._use_tools(state)

    async def _use_tools(self, state: State, *, saved_next: bool = False) -> None:
        """`ause_tools`; with `saved_next`, the last result is saved by the caller's next save."""
        self._require_unfinished(state, "use_tools")
        if value_of(state).waiting:
            raise ValueError("use_tools while the model is being waited on: think first.")
        await run_tools(self, state, saved_next=saved_next)

    def use_tools(self, state: State) -> None:
        """The sync twin of `ause_tools`."""
        run_sync(self.ause_tools, state, name="use_tools")

    @overload
    async def aask(self, state: State, prompt: str) -> str: ...
    @overload
    async def aask(
        self, state: State, prompt: str, returns: type[_T], *, retries: int = 2
    ) -> _T: ...
    async def aask(self, state: State, prompt: str, returns: Any = str, *, retries: int = 2) -> Any:
        """Ask the model a question about `state` and return a value of type `returns`.

        The context does not change; the exchange is recorded as one `ask` entry. A reply that
        does not validate is shown to the model with the error, up to `retries` times.

        Raises:
            OutputError: No valid answer after the retries.
            ValueError: The State is finished, or calls are pending.
        """
        self._require_unfinished(state, "ask")
        try:
            value = await _ask(self, state, prompt, returns, retries)
        except BaseException as error:
            with anyio.CancelScope(shield=True):
                await self._save_after(state, error)  # a failed ask still spent tokens
            raise
        await self._save(state)  # the ask entry holds the tokens it spent
        return value

    @overload
    def ask(self, state: State, prompt: str) -> str: ...
    @overload
    def ask(self, state: State, prompt: str, returns: type[_T], *, retries: int = 2) -> _T: ...
    def ask(self, state: State, prompt: str, returns: Any = str, *, retries: int = 2) -> Any:
        """The sync twin of `aask`."""

        async def call() -> Any:
            return await self.aask(state, prompt, returns, retries=retries)

        return run_sync(call, name="ask")

    async def acompact(self, state: State) -> None:
        """Have the model summarize the conversation, then `state.compact(summary)`."""
        await _compact(self, state)
        await self._save(state)

    def compact(self, state: State) -> None:
        """The sync twin of `acompact`."""
        run_sync(self.acompact, state, name="compact")

    def as_tool(self, name: str | None = None, description: str | None = None) -> Tool:
        """This agent as a tool: the model passes a task, a child State runs it.

        The tool's result is the child's answer. `name` and `description` default to the
        agent's own, and one of each is needed.
        """
        return AgentTool(self, name=name, description=description)

    # -- plumbing --------------------------------------------------------------------------------

    def _reporters(self) -> tuple[Reporter, ...]:
        """This agent's reporter, then those of the runs it runs inside.

        So a child reports to its parent's reporter too.
        """
        inherited = _run_reporters.get()
        own = self._reporter
        if own is None or any(own is reporter for reporter in inherited):
            return inherited
        return (own, *inherited)

    def _report(self, hook: str, *args: Any) -> None:
        for reporter in self._reporters():
            getattr(reporter, hook)(*args)

    def _store_for(self, state: State) -> Any:
        """Where `state` is saved: this agent's store, else the store it was loaded from."""
        return self._store if self._store is not None else store_of(state)

    async def _save(self, state: State) -> None:
        """Save `state` at a save point; a sync store runs in a worker thread."""
        store = self._store_for(state)
        if store is None:
            return
        await call_twin(store, "save", state)

    async def _save_late_entries(
        self, state: State, threads: list[threading.Event], error: BaseException | None = None
    ) -> None:
        """Wait for the run's timed-out sync tools, then save what they recorded meanwhile.

        Such a tool's thread runs on after its call got a timeout result, and may still change
        the State (``state.set``): the run saves once more after them, not before.
        """
        if not threads:
            return
        await wait_for(threads)
        if error is None:
            await self._save(state)
        else:
            await self._save_after(state, error)

    async def _save_or_take_back(self, state: State) -> None:
        """Save a recorded request; if that fails (or is cancelled), take the request back."""
        try:
            await self._save(state)
        except BaseException as error:
            with anyio.CancelScope(shield=True):
                record_error(state, error, again=True)
                await self._save_after(state, error)
            raise

    async def _save_after(self, state: State, error: BaseException) -> None:
        """Save after `error`; a failing save is attached to it as a note, `error` wins."""
        try:
            await self._save(state)
        except Exception as save_error:  # the original error is what the caller must see
            error.add_note(f"Saving State {state.id} afterwards failed too: {save_error!r}")
            _log.warning("state.save.failed", state_id=state.id, error=repr(save_error))
