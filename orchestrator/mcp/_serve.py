"""Serving over MCP: our tools, or an agent as one tool, for any MCP client.

`serve_tools` and `serve_agent` build the SDK's low-level `mcp.server.Server`; `run_stdio` serves
it on this process's stdin and stdout, `http_app` as a streamable HTTP endpoint (a Starlette
app). Each call runs inside the request's task in the SDK's task group, so a client that cancels
the request cancels the call, and nothing outlives it.
"""

from __future__ import annotations

import base64
import fnmatch
import functools
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, cast

import anyio
import anyio.lowlevel

from .._apps._events import Event
from .._base._errors import ToolError, error_text
from .._base._json import thaw
from .._base._logs import get_log
from .._base._messages import Image, Message, TextBlock, ToolCall
from .._base._stopped import StoppedByApproval
from .._base._threads import in_thread
from .._record._state import State
from .._running._agent import Agent
from .._tooling._permissions import (
    AskApproval,
    Deferred,
    Denied,
    DenyByName,
    Permission,
    check_permissions,
    decide,
)
from .._tooling._tool_schema import ToolInputError
from .._tooling._tools import Tool, as_tool_list

try:
    import mcp_types
    from mcp.server import Server, ServerRequestContext
    from mcp.server.stdio import stdio_server
    from starlette.applications import Starlette
except ImportError as _missing:  # pragma: no cover - the message is the point
    raise ImportError(
        "orchestrator.mcp needs the MCP SDK: pip install 'orchestrator[mcp]'"
    ) from _missing

__all__ = ("http_app", "run_stdio", "serve_agent", "serve_tools")

_log = get_log("mcp.serve")

# The worker threads of served sync tools: 40 at once per event loop, whichever server runs them
# (a limiter belongs to the loop it first ran on, and one server may be served by several).
_THREADS: anyio.lowlevel.RunVar[anyio.CapacityLimiter] = anyio.lowlevel.RunVar(
    "orchestrator.mcp.threads"
)
_MAX_THREADS = 40


def _threads() -> anyio.CapacityLimiter:
    limiter = _THREADS.get(None)
    if limiter is None:
        limiter = anyio.CapacityLimiter(_MAX_THREADS)
        _THREADS.set(limiter)
    return limiter


PROMPT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"prompt": {"type": "string", "description": "The task for the agent."}},
    "required": ["prompt"],
    "additionalProperties": False,
}


def _text(text: str, *, error: bool = False) -> mcp_types.CallToolResult:
    return mcp_types.CallToolResult(
        content=[mcp_types.TextContent(type="text", text=text)], is_error=error
    )


def _content(blocks: Iterable[TextBlock | Image]) -> list[mcp_types.ContentBlock]:
    """Our result blocks as MCP content: text as text, images as base64 images."""
    content: list[mcp_types.ContentBlock] = []
    for block in blocks:
        if isinstance(block, Image):
            data = base64.b64encode(block.data).decode("ascii")
            content.append(
                mcp_types.ImageContent(type="image", data=data, mime_type=block.media_type)
            )
        else:
            content.append(mcp_types.TextContent(type="text", text=block.text))
    return content


def _check_no_terminal(permissions: Sequence[Permission] | None, owner: str) -> None:
    """Refuse `AskApproval()` without a callback: it would read the MCP stream as the terminal."""
    for permission in permissions or ():
        if isinstance(permission, AskApproval) and permission.callback is None:
            raise ValueError(
                f"{owner}: AskApproval() asks on the terminal, which an MCP server does not have"
                " (over stdio the terminal is the protocol stream). Pass AskApproval(callback),"
                " or ApproveLater() to refuse such calls as waiting for approval."
            )


def _hidden(permissions: Sequence[Permission] | None, name: str) -> bool:
    """Whether a `DenyByName` rule denies every call of the tool `name`: it is not listed."""
    return any(
        isinstance(permission, DenyByName)
        and any(fnmatch.fnmatchcase(name, pattern) for pattern in permission.patterns)
        for permission in permissions or ()
    )


def _listing(
    tools: Sequence[mcp_types.Tool],
) -> Callable[..., Awaitable[mcp_types.ListToolsResult]]:
    async def list_tools(
        ctx: ServerRequestContext[Any], params: mcp_types.PaginatedRequestParams | None
    ) -> mcp_types.ListToolsResult:
        await anyio.lowlevel.checkpoint()
        return mcp_types.ListToolsResult(tools=list(tools))

    return list_tools


def _mcp_tool(tool: Tool) -> mcp_types.Tool:
    spec = tool.spec
    annotations = mcp_types.ToolAnnotations(read_only_hint=True) if tool.read_only else None
    return mcp_types.Tool(
        name=spec.name,
        description=spec.description or None,
        input_schema=cast("dict[str, Any]", thaw(spec.input_schema)),
        annotations=annotations,
    )


# -- tools -----------------------------------------------------------------------------------------


class _ToolCalls:
    """Runs one MCP `tools/call` of a served tool: permissions, arguments, the call, its result."""

    def __init__(self, tools: Mapping[str, Tool], permissions: Sequence[Permission] | None) -> None:
        self.tools = tools
        self.permissions = permissions

    async def __call__(
        self, ctx: ServerRequestContext[Any], params: mcp_types.CallToolRequestParams
    ) -> mcp_types.CallToolResult:
        tool = self.tools.get(params.name)
        if tool is None or _hidden(self.permissions, params.name):
            known = ", ".join(name for name in self.tools if not _hidden(self.permissions, name))
            return _text(f"No tool named {params.name!r}: this server has {known}.", error=True)
        arguments = dict(params.arguments or {})
        state = State()  # what a tool or a permission reads: a call over MCP has no run
        call = ToolCall(id=f"mcp-{ctx.request_id}", name=tool.name, args=arguments)
        decision, _ = await decide(self.permissions, call, tool, state)
        if isinstance(decision, Denied):
            return _text(f"Denied: {decision.reason}", error=True)
        if isinstance(decision, Deferred):
            why = f" ({decision.reason})" if decision.reason else ""
            return _text(
                f"The tool {tool.name!r} needs a person's approval{why}, which a call over MCP"
                " cannot wait for: it was not run.",
                error=True,
            )
        try:
            kwargs = tool.bind(arguments, state)
            value = await self._invoke(tool, kwargs)
            converted = tool.convert(value)
        except anyio.get_cancelled_exc_class():
            raise
        except (ToolInputError, ToolError) as error:
            return _text(str(error), error=True)
        except _TimedOut as error:
            return _text(str(error), error=True)
        except Exception as error:
            _log.warning("mcp.serve.tool_failed", tool=tool.name, error=repr(error))
            return _text(f"The tool {tool.name!r} failed: {error_text(error)}", error=True)
        return mcp_types.CallToolResult(
            content=_content(converted.content), is_error=converted.is_error
        )

    async def _invoke(self, tool: Tool, kwargs: dict[str, Any]) -> Any:
        if tool.timeout is None:
            return await self._call(tool, kwargs)
        with anyio.move_on_after(tool.timeout):
            return await self._call(tool, kwargs)
        raise _TimedOut(f"The tool {tool.name!r} timed out after {tool.timeout:g} s.")

    async def _call(self, tool: Tool, kwargs: dict[str, Any]) -> Any:
        if tool.is_async:
            return await tool.acall(kwargs)
        # A worker thread, abandoned (not waited for) when the client cancels the call.
        return await in_thread(functools.partial(tool.call, kwargs), _threads())


class _TimedOut(Exception):
    """A served tool ran past its `timeout`."""


def serve_tools(
    tools: Iterable[Tool | Callable[..., Any]],
    *,
    name: str = "orchestrator",
    permissions: Sequence[Permission] | None = None,
    instructions: str | None = None,
) -> Server[Any]:
    """An MCP server whose tools are `tools` (``@tool`` functions or `Tool` objects).

    Each tool is listed with the name, description and input schema a model is shown; a
    read-only tool carries ``readOnlyHint``. A call goes through `permissions` like an agent's
    call: denied, or deferred to a person (a call over MCP cannot wait for one), it is not run
    and the client gets an error result saying why; a tool a `DenyByName` rule names is not
    listed. Wrong arguments, a `ToolError`, a timeout or any other exception of the tool come
    back as error results (``isError``) listing what was wrong: the server goes on. A tool that
    takes the `State` gets a new, empty one for each call; a call over MCP has no run.

    Serve it with `run_stdio` or `http_app`.

    Args:
        tools: The tools to serve.
        name: The server's name, which clients show.
        permissions: Decide each call, as ``Agent(permissions=...)`` does (None: run all).
        instructions: Told to clients at connection: how to use these tools.

    Raises:
        TypeError: A tool is not a tool, or one needs an agent's memory (none is served).
        ValueError: Two tools share a name, or a permission asks on the terminal.
    """
    listed = as_tool_list(tools)
    by_name: dict[str, Tool] = {}
    for tool in listed:
        if tool.needs_memory:
            raise TypeError(
                f"serve_tools: the tool {tool.name!r} needs an agent's Memory, which a call over"
                " MCP does not have: serve an agent that has it (serve_agent) instead."
            )
        by_name[tool.name] = tool
    checked = check_permissions(permissions)
    _check_no_terminal(checked, "serve_tools")
    shown = [_mcp_tool(tool) for tool in listed if not _hidden(checked, tool.name)]
    return Server(
        name,
        instructions=instructions,
        on_list_tools=_listing(shown),
        on_call_tool=_ToolCalls(by_name, checked),
    )


# -- an agent --------------------------------------------------------------------------------------


def _progress(event: Event) -> str | None:
    """What a client is told of `event` as progress, or None for an event it need not see.

    A subagent's steps start with its State's id in brackets.
    """
    where = "" if event.parent_id is None else f"[{event.state_id}] "
    if event.kind == "model_reply":
        calls = ", ".join(call.name for call in event.tool_calls)
        return f"{where}model replied" + (f": calling {calls}" if calls else "")
    if event.kind == "tool_end":
        return f"{where}{event.name} {event.outcome}"
    if event.kind == "child_start":
        return f"{where}subagent {event.agent or 'started'}" + (" started" if event.agent else "")
    return None


def _answer_text(answer: Any) -> str:
    return answer if isinstance(answer, str) else json.dumps(thaw(answer), ensure_ascii=False)


class _AgentCalls:
    """Runs the served agent on the prompt of one MCP call, its steps reported as progress."""

    def __init__(self, agent: Agent, tool_name: str) -> None:
        self.agent = agent
        self.tool_name = tool_name

    async def __call__(
        self, ctx: ServerRequestContext[Any], params: mcp_types.CallToolRequestParams
    ) -> mcp_types.CallToolResult:
        if params.name != self.tool_name:
            return _text(
                f"No tool named {params.name!r}: this server has {self.tool_name}.", error=True
            )
        arguments = dict(params.arguments or {})
        prompt = arguments.get("prompt")
        extra = sorted(set(arguments) - {"prompt"})
        if not isinstance(prompt, str) or not prompt.strip() or extra:
            return _text(
                f"Invalid arguments for the tool {self.tool_name!r}: pass"
                ' {"prompt": "<the task, a non-empty string>"} and nothing else'
                f" (got {json.dumps(arguments, ensure_ascii=False)[:200]}).",
                error=True,
            )
        state = State(messages=[Message.user(prompt)])
        steps = 0
        try:
            async with self.agent.events(state) as events:
                async for event in events:
                    message = _progress(event)
                    if message is not None:
                        steps += 1
                        await ctx.session.report_progress(steps, None, message)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as error:
            _log.warning("mcp.serve.run_failed", state_id=state.id, error=repr(error))
            return _text(f"The run {state.id} failed: {error_text(error)}", error=True)
        stopped = state.stopped
        if isinstance(stopped, StoppedByApproval):
            names = ", ".join(f"{item.call.name} ({item.call.id})" for item in stopped.calls)
            return _text(
                f"The run {state.id} stopped: its calls {names} wait for a person's approval,"
                " which a call over MCP cannot wait for. Approve or deny them"
                " (orchestrator.approve / orchestrator.deny) and run the State again.",
                error=True,
            )
        if state.answer is None:
            return _text(f"The run {state.id} stopped without an answer: {stopped}.", error=True)
        return _text(_answer_text(state.answer))


def serve_agent(
    agent: Agent,
    *,
    tool_name: str | None = None,
    description: str | None = None,
    name: str | None = None,
) -> Server[Any]:
    """An MCP server with one tool that runs `agent` on a prompt and returns its answer.

    The tool takes ``{"prompt": "..."}``. Each call starts a new State (saved in the agent's
    store, if it has one), and the client that asks for progress gets a notification for each
    step of the run and its subagents: a model reply (naming the tools it calls), a tool call
    ending, a subagent starting. The agent's permissions apply inside the run: a call they
    defer to a person stops the run, and the client gets an error result naming the calls that
    wait and the State. A failed run is an error result too; the server goes on. A client that
    cancels the call cancels the run (its pending calls are closed, the State saved).

    Args:
        agent: The agent to serve.
        tool_name: The tool's name (default: the agent's name, else ``"run_agent"``).
        description: What clients are told the tool does (default: the agent's description).
        name: The server's name (default: the agent's name, else ``"orchestrator"``).

    Raises:
        TypeError: `agent` is not an Agent.
        ValueError: The agent's permissions ask on the terminal (an MCP server has none).
    """
    if not isinstance(cast("object", agent), Agent):
        raise TypeError(f"serve_agent takes an Agent, got {type(agent).__name__}.")
    _check_no_terminal(agent.permissions, "serve_agent")
    called = tool_name or agent.name or "run_agent"
    text = (
        description or agent.description or f"Run the agent {called} on a task; returns its answer."
    )
    tool = mcp_types.Tool(name=called, description=text, input_schema=PROMPT_SCHEMA)
    return Server(
        name or agent.name or "orchestrator",
        on_list_tools=_listing([tool]),
        on_call_tool=_AgentCalls(agent, called),
    )


# -- transports ------------------------------------------------------------------------------------


async def run_stdio(server: Server[Any]) -> None:
    """Serve `server` on this process's stdin and stdout until the client closes stdin.

    Nothing else may write to stdout meanwhile: it carries the protocol.
    """
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def http_app(server: Server[Any], *, path: str = "/mcp", stateless: bool = False) -> Starlette:
    """`server` as a streamable HTTP endpoint at `path`: a Starlette app for uvicorn.

    Its lifespan runs the SDK's session manager. Mounted inside another Starlette app (whose
    lifespan does not run a mounted app's), enter ``server.session_manager.run()`` in that
    app's lifespan instead. Requests must come to 127.0.0.1, localhost or [::1] with a matching
    Origin, against DNS rebinding.

    Args:
        server: What `serve_tools` or `serve_agent` built.
        path: Where the endpoint is, e.g. ``"/mcp"``.
        stateless: Serve each request on its own, without sessions (no server-to-client
            requests then).
    """
    if not path.startswith("/"):
        raise ValueError(f"path must start with '/', e.g. '/mcp'; got {path!r}.")
    return server.streamable_http_app(streamable_http_path=path, stateless_http=stateless)
