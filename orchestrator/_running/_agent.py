"""`Agent`: the settings that run a State, and its actions as sync and async twins.

The async methods are the core; each sync method runs its twin through the one bridge in
`orchestrator._base._sync`. Settings are fixed after construction: `agent.copy(**changes)` makes a
variant.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast, overload

import pydantic

from .._apps._reporting import DEFAULT_BUFFER, Reporter
from .._base._json import JSONValue
from .._base._limits import Limits
from .._base._link import Link
from .._base._messages import Message
from .._base._reply import Reply
from .._base._sync import run_sync
from .._record._state import RESERVED, State
from .._record._storage import AsyncStore, Store
from .._record._store_client import client_of
from .._record._typed import Schema, SchemaSource
from .._tooling._memory import Memory
from .._tooling._memory_tools import agent_memory, collection_tools, memory_required
from .._tooling._permissions import Permission, check_permissions
from .._tooling._tools import Tool, as_tool_list, check_outputs_against_schema
from .._tooling._toolsets import Toolset
from ..models import Model
from ..models._base import resolve_model
from ._ask import ask, compact
from ._execute import use_tools
from ._loop import Loop, LoopBody, default_loop, default_loop_with, is_default_loop
from ._run import DEFAULT_MAX_SUBAGENT_DEPTH, Run, Settings, run_agent, step
from ._runner import Runner
from ._subagents import AgentTool, check_runner
from ._think import think

if TYPE_CHECKING:
    from .._apps._events import Events

__all__ = ("Agent",)


def _as_iterable(tools: Any) -> Iterable[Any]:
    if isinstance(tools, str | bytes) or not isinstance(tools, Iterable):
        raise TypeError(
            f"tools must be a list of tools (functions, @tool objects, Agents), got {tools!r}."
        )
    return cast("Iterable[Any]", tools)


_T = TypeVar("_T")


_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _check_limits(limits: object) -> None:
    """Refuse `limits` that are not a `Limits` (or None)."""
    if limits is not None and not isinstance(limits, Limits):
        raise TypeError(
            f"limits must be a Limits, e.g. limits=Limits(total_tokens=100_000), got"
            f" {type(limits).__name__}."
        )


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

    Bounds a model cannot grow: `max_concurrency` is how many tool calls of a turn run at once
    (all parallel async calls unless set), and also how many sync tool calls of a run run at
    once in worker threads (40 unless set). `max_subagent_depth` is how many levels of
    subagents a run nests (10 unless set): a deeper one is not started, and the tool call that
    started it gets an error result naming the setting. `tool_timeout` is a tool call's time
    limit (a tool's own ``timeout`` wins); a sync tool whose call is cancelled or timed out is
    abandoned at once (see `CallAbandonedError`). `limits` (`Limits`) bound what each run
    spends, its subagents included: reaching one stops the run with `StoppedByLimit`.

    Tool errors: a `ToolError` (and wrong arguments, an unknown tool, a timeout) is an error
    result the model reads. Any other exception from a tool aborts the run and is raised, unless
    ``tool_errors="to_model"``: then it too becomes an error result (its type and message),
    recorded in history, and the model goes on. Cancellation and a `BaseException` (Ctrl+C)
    always end the run.

    Example:
        ```python
        agent = Agent(FakeModel(["Hello!"]), instructions="Be brief.")
        print(agent.run("Say hello"))
        ```
    """

    __slots__ = ("_description", "_given", "_settings", "_tools")

    def __init__(
        self,
        model: Model | str,
        *,
        instructions: str | None = None,
        tools: Iterable[Tool | Agent | Toolset | Callable[..., Any]] = (),
        name: str | None = None,
        description: str | None = None,
        store: Store | AsyncStore | None = None,
        state_schema: SchemaSource | None = None,
        collections: Mapping[str, type[pydantic.BaseModel]] | None = None,
        permissions: Iterable[Permission] | None = None,
        reporter: Reporter | None = None,
        loop: Loop | LoopBody | None = None,
        max_concurrency: int | None = None,
        tool_timeout: float | None = None,
        max_turns: int | None = None,
        runner: Runner | None = None,
        max_subagent_depth: int | None = None,
        tool_errors: Literal["raise", "to_model"] = "raise",
        limits: Limits | None = None,
    ) -> None:
        self._given: dict[str, Any] = {
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
            "runner": runner,
            "max_subagent_depth": max_subagent_depth,
            "tool_errors": tool_errors,
            "limits": limits,
        }
        resolved = resolve_model(model)
        if instructions is not None and not isinstance(instructions, str):
            raise TypeError(f"instructions must be a str, got {type(instructions).__name__}.")
        if name is not None and (not isinstance(name, str) or not _NAME.fullmatch(name)):
            raise ValueError(
                f"Agent name {name!r} is not valid: use 1 to 64 letters, digits, '_' or '-'."
            )
        if description is not None and not isinstance(description, str):
            raise TypeError(f"description must be a str, got {type(description).__name__}.")
        self._description = description
        items = list(_as_iterable(tools))
        toolsets = tuple(item for item in items if isinstance(item, Toolset))
        own = as_tool_list(
            AgentTool(item) if isinstance(item, Agent) else item
            for item in items
            if not isinstance(item, Toolset)
        )
        client = None if store is None else client_of(store)  # the store resolved once
        memory = agent_memory(name, client, collections)
        self._tools = collection_tools(memory, own)  # own tools win a name clash
        schema = (
            None
            if state_schema is None
            else Schema.parse(state_schema, RESERVED, owner="Agent(state_schema=)")
        )
        for item in self._tools:
            check_outputs_against_schema(item, schema)
        if reporter is not None and not isinstance(reporter, Reporter):
            raise TypeError(
                f"reporter must be a Reporter (subclass it), got {type(reporter).__name__}."
            )
        if max_concurrency is not None and (
            isinstance(max_concurrency, bool)
            or not isinstance(max_concurrency, int)
            or max_concurrency < 1
        ):
            raise ValueError(f"max_concurrency must be an integer >= 1, got {max_concurrency!r}.")
        if tool_errors not in ("raise", "to_model"):
            raise ValueError(
                f'tool_errors must be "raise" (an exception from a tool aborts the run) or'
                f' "to_model" (the model reads it as an error result), got {tool_errors!r}.'
            )
        if tool_timeout is not None and (
            isinstance(tool_timeout, bool)
            or not isinstance(tool_timeout, int | float)
            or tool_timeout <= 0
        ):
            raise ValueError(f"tool_timeout must be a number of seconds > 0, got {tool_timeout!r}.")
        check_runner(runner)
        if max_subagent_depth is not None and (
            isinstance(max_subagent_depth, bool)
            or not isinstance(max_subagent_depth, int)
            or max_subagent_depth < 0
        ):
            raise ValueError(
                f"max_subagent_depth must be an integer >= 0, the most levels of subagents a run"
                f" nests (0: none), got {max_subagent_depth!r}."
            )
        _check_limits(limits)
        self._settings = Settings(
            model=resolved,
            instructions=instructions,
            tools={item.name: item for item in self._tools},
            handlers={item.name: item.output_handlers for item in self._tools},
            specs=tuple(item.spec for item in self._tools),
            name=name,
            store=client,
            schema=schema,
            memory=memory,
            permissions=check_permissions(permissions),
            reporter=reporter,
            loop=_loop_for(loop, max_turns),
            max_concurrency=max_concurrency,
            tool_timeout=None if tool_timeout is None else float(tool_timeout),
            max_subagent_depth=(
                DEFAULT_MAX_SUBAGENT_DEPTH if max_subagent_depth is None else max_subagent_depth
            ),
            runner=runner,
            toolsets=toolsets,
            tool_errors=tool_errors,
            limits=limits,
        )

    def __repr__(self) -> str:
        settings = self._settings
        tools = list(settings.tools)
        return f"Agent(name={settings.name!r}, model={settings.model.name!r}, tools={tools})"

    # -- settings (read-only) ------------------------------------------------------------------

    @property
    def model(self) -> Model:
        """The model this agent asks."""
        return self._settings.model

    @property
    def instructions(self) -> str | None:
        """The system instructions sent with every request."""
        return self._settings.instructions

    @property
    def tools(self) -> tuple[Tool, ...]:
        """The tools the model may call, but for those of the toolsets (known once opened)."""
        return self._tools

    @property
    def toolsets(self) -> tuple[Toolset, ...]:
        """The toolsets each run opens, whose tools join `tools` for that run."""
        return self._settings.toolsets

    @property
    def name(self) -> str | None:
        """The agent's name (recorded in `run_start`; scopes its memory)."""
        return self._settings.name

    @property
    def description(self) -> str | None:
        """What this agent does (shown to a parent model when it is a tool)."""
        return self._description

    @property
    def store(self) -> Store | AsyncStore | None:
        """Where the States this agent runs are saved, or None."""
        client = self._settings.store
        return None if client is None else client.store

    @property
    def memory(self) -> Memory:
        """The agent's memory: state that outlives its runs, scoped to its name, in its store.

        Raises:
            ValueError: The agent has no name or no store (the message says what to add).
        """
        settings = self._settings
        if settings.memory is None:
            raise memory_required(settings.name, settings.store)
        return settings.memory

    @property
    def state_schema(self) -> SchemaSource | None:
        """The typed-data schema bound to the States this agent runs, or None."""
        schema = self._settings.schema
        return None if schema is None else schema.source

    @property
    def permissions(self) -> tuple[Permission, ...] | None:
        """The permission rules, or None when every call is allowed."""
        return self._settings.permissions

    @property
    def reporter(self) -> Reporter | None:
        """The reporter that sees this agent's runs, or None."""
        return self._settings.reporter

    @property
    def loop(self) -> Loop | LoopBody:
        """The loop `run` runs."""
        return self._settings.loop

    @property
    def max_turns(self) -> int | None:
        """The most turns one run of the default loop takes (50 unless set).

        None when the agent runs a loop of its own (``loop=``), whose ``@loop(limit=...)``
        applies.
        """
        loop = self._settings.loop
        return loop.limit if is_default_loop(loop) else None

    @property
    def max_concurrency(self) -> int | None:
        """How many tool calls of one turn run at once (None: all parallel calls).

        It also bounds the worker threads of a run's sync tools, 40 when None: a thread keeps
        its place until it ends, even when its call was abandoned.
        """
        return self._settings.max_concurrency

    @property
    def max_subagent_depth(self) -> int:
        """How many levels of subagents a run of this agent may nest below it (10 unless set).

        A subagent that would nest deeper is not started: the tool call that started it gets
        an error result naming this setting (a `SubagentDepthError`), and the run goes on.
        """
        return self._settings.max_subagent_depth

    @property
    def limits(self) -> Limits | None:
        """What each run of the agent may spend, its subagents included (None: no limits)."""
        return self._settings.limits

    @property
    def tool_timeout(self) -> float | None:
        """The default time limit of a tool call in seconds (a tool's own `timeout` wins)."""
        return self._settings.tool_timeout

    @property
    def tool_errors(self) -> Literal["raise", "to_model"]:
        """What an exception from a tool does: abort the run, or reach the model as a result."""
        return self._settings.tool_errors

    @property
    def runner(self) -> Runner | None:
        """Where the children of this agent's subagent tools run (None: here, `LocalRunner`).

        A tool's own ``agent.as_tool(runner=...)`` wins.
        """
        return self._settings.runner

    def copy(self, **changes: Any) -> Agent:
        """A new Agent with these settings changed, e.g. ``agent.copy(instructions="...")``."""
        unknown = set(changes) - set(self._given)
        if unknown:
            raise TypeError(
                f"Agent.copy got unknown settings {sorted(unknown)}: it takes"
                f" {', '.join(self._given)}."
            )
        return Agent(**{**self._given, **changes})

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

    async def arun(
        self, state: State | str, *, link: Link | None = None, limits: Limits | None = None
    ) -> JSONValue:
        """Run the loop on `state` (a `str` starts a new State) and return `state.answer`.

        `link` runs it as the child of that tool call (`parent_id`, `parent_call_id`, memory
        effect keys scoped to its place), wherever the parent runs: what a runner's worker
        does. Without it, a State first run inside a tool call is that call's child.

        The run ends when the model answers, a stop is decided, at the turn limit
        (`max_turns`) or at one of the `limits` (``state.stopped`` says which, and names the
        setting to raise). `limits` bound this run and its subagents beside the agent's own
        ``Agent(limits=)``: the tighter of each field holds. What the State spent before
        counts (it is in its history), so a resumed run keeps its budget.

        When the run is cancelled or an exception leaves it, the error is recorded once, pending
        calls are closed, the State is saved, and the exception is re-raised unchanged.

        Raises:
            ValueError: The State is finished or already running, or it is the child of
                another call than `link`'s.
        """
        state = self._as_state(state)
        self._require_unfinished(state, "run")
        if link is not None and not isinstance(link, Link):
            raise TypeError(f"link must be a Link, got {type(link).__name__}.")
        _check_limits(limits)
        await run_agent(self, self._settings, state, link=link, limits=limits)
        return state.answer

    def events(
        self, state: State | str, *, buffer: int = DEFAULT_BUFFER, limits: Limits | None = None
    ) -> AbstractAsyncContextManager[Events]:
        """Run `state` (a `str` starts a new State) in the block and stream its events.

        The events cover the run and every subagent it starts: run start and end, text as it
        streams, model replies, tool calls starting and ending, children starting, calls that
        wait for a person (`ApprovalNeeded`) and retries. Each is a frozen pydantic model with
        a `kind`, the State's id and parent's id, the call's id, a time and a `seq`; JSON with
        ``event.model_dump_json()``. The agent's own reporter keeps seeing the run too.

        The buffer bounds the run whatever its size: before each step reports (a run or
        subagent starting or ending, a model reply, a tool call starting, waiting or ending),
        the run waits while `buffer` events are unread, so at most `Events.bound` (`buffer` + 3)
        ever wait and a slow consumer slows the run. Text and retry notices that come while the
        buffer is full are held for their State and come before its next event: nothing is
        lost. Leaving the block before the run ends cancels it (its pending calls are closed,
        the State saved). `limits` bound the run as in `arun`. When the run fails, the
        iteration raises its exception after the last event.

        Example:
            ```python
            async with agent.events("Plan the release") as events:
                async for event in events:
                    if event.kind == "text":
                        print(event.text, end="")
            ```

        Raises:
            ValueError: The State is finished, or `buffer` is not an integer >= 1.
        """
        from .._apps._events import open_events  # pydantic event models: built for streams only

        state = self._as_state(state)
        self._require_unfinished(state, "run")
        settings = self._settings

        _check_limits(limits)

        async def start(reporter: Reporter) -> None:
            await run_agent(self, settings, state, (reporter,), limits=limits)

        return open_events(state, start, buffer=buffer)

    def run(
        self, state: State | str, *, link: Link | None = None, limits: Limits | None = None
    ) -> JSONValue:
        """The sync twin of `arun`."""

        async def call() -> JSONValue:
            return await self.arun(state, link=link, limits=limits)

        return run_sync(call, name="run")

    async def athink(self, state: State) -> Reply:
        """Send one model request with `state.messages` and record the reply.

        A failed request is taken back (the turn is restored) and its error recorded.

        Raises:
            ValueError: The State is finished, calls are pending, or a request is waiting.
        """
        self._require_unfinished(state, "think")
        return await step(self, self._settings, state, think)

    def think(self, state: State) -> Reply:
        """The sync twin of `athink`."""
        return run_sync(self.athink, state, name="think")

    async def ause_tools(self, state: State) -> None:
        """Run `state.pending_calls` with this agent's tools and record every result."""
        self._require_unfinished(state, "use_tools")
        await step(self, self._settings, state, use_tools)

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

        The context does not change; the exchange is recorded as one `ask` entry, which names
        the prompt its requests sent (the instructions and options, no tools; `state.prompt_of`
        gives it). A reply that does not validate is shown to the model with the error, up to
        `retries` times.

        Raises:
            OutputError: No valid answer after the retries.
            ValueError: The State is finished, or calls are pending.
        """
        self._require_unfinished(state, "ask")

        async def asked(run: Run) -> Any:
            return await ask(run, prompt, returns, retries)

        return await step(self, self._settings, state, asked)

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
        """Have the model summarize the conversation, then `state.compact(summary)`.

        The compaction names the prompt its request sent (the instructions and options, no
        tools), as an `ask` does.
        """
        await step(self, self._settings, state, compact)

    def compact(self, state: State) -> None:
        """The sync twin of `acompact`."""
        run_sync(self.acompact, state, name="compact")

    def as_tool(
        self,
        name: str | None = None,
        description: str | None = None,
        *,
        runner: Runner | None = None,
        resume: bool = True,
        limits: Limits | None = None,
    ) -> Tool:
        """This agent as a tool: the model passes a task, a child State runs it.

        The tool's result is the child's answer. `name` and `description` default to the
        agent's own, and one of each is needed. `runner` is where its children run (default:
        the parent agent's ``runner=``, else here). With `resume` (the default), a child that
        a crash cut off continues from its stored history when the parent runs again, and
        its answer reaches the parent. `limits` are each child's slice (beside the agent's own
        and every limit above the parent: the tighter holds); a child that reaches a limit gives
        the call an error result naming it.
        """
        _check_limits(limits)
        return AgentTool(
            self, name=name, description=description, runner=runner, resume=resume, limits=limits
        )
