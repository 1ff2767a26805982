"""Tools from MCP servers: `MCPToolset` and its `MCPTool` (the client side of this package)."""

from __future__ import annotations

import base64
import binascii
import difflib
import json
import math
import re
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import anyio
import anyio.abc

from .._base._errors import Issue, OrchestratorError, ToolError
from .._base._json import thaw
from .._base._logs import get_log
from .._base._messages import Image, TextBlock
from .._record._state import State
from .._tooling._memory import Memory
from .._tooling._tools import Tool, ToolInputError, ToolResult, ToolSpec
from .._tooling._toolsets import Toolset

try:
    import httpx2
    import jsonschema
    import jsonschema.validators
    import mcp
    import mcp_types
    from mcp.client.streamable_http import streamable_http_client
except ImportError as _missing:  # pragma: no cover - the message is the point
    raise ImportError(
        "orchestrator.mcp needs the MCP SDK: pip install 'orchestrator[mcp]'"
    ) from _missing

__all__ = ("MCPServerError", "MCPTool", "MCPToolset")

_log = get_log("mcp")

_NAME_CHAR = re.compile(r"[^A-Za-z0-9_-]")
_PAGES = 100  # most pages of tools/list read: a server that pages forever cannot hang a run
_HTTP_TIMEOUT = 30.0  # connect, write and pool; reads of an event stream wait up to 300 s
_HTTP_READ_TIMEOUT = 300.0


class MCPServerError(OrchestratorError):
    """An MCP server could not be started or reached, or did not answer in time."""


# -- one connection ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Connection:
    """An open client session, the tools listed on it, and the event that closes it."""

    client: mcp.Client
    tools: tuple[MCPTool, ...]
    closing: anyio.Event


class MCPTool(Tool):
    """One tool of an MCP server, as the agent's model sees and calls it.

    Made by `MCPToolset` when it connects: its `spec` is the server's description and input
    schema as they are (under the toolset's prefix), its `read_only` the server's
    ``readOnlyHint``.

    Attributes:
        remote_name: The tool's name on the server (`name` adds the toolset's prefix).
        server: The name of the toolset it comes from.
    """

    def __init__(
        self,
        listed: mcp_types.Tool,
        *,
        name: str,
        server: str,
        client: mcp.Client,
        timeout: float | None,
    ) -> None:
        annotations = listed.annotations
        read_only = annotations is not None and annotations.read_only_hint is True
        description = listed.description or listed.title or ""
        super().__init__(name=name, description=description, timeout=timeout, read_only=read_only)
        self.remote_name: str = listed.name
        self.server = server
        self._client = client
        self._schema: dict[str, Any] = dict(listed.input_schema)
        self._validator = _validator(self._schema)

    @property
    def spec(self) -> ToolSpec:
        """The server's description and input schema, as the server gives them."""
        return ToolSpec(self.name, self.description, self._schema)

    def bind(
        self, args: Mapping[str, Any], state: State | None = None, memory: Memory | None = None
    ) -> dict[str, Any]:
        """Check the model's arguments against the server's input schema.

        Raises:
            ToolInputError: The arguments break the schema; every problem is listed.
        """
        arguments = cast("dict[str, Any]", thaw(dict(args)))
        if self._validator is not None:
            problems = sorted(self._validator.iter_errors(arguments), key=_error_path)
            if problems:
                raise ToolInputError(
                    self.name, (Issue(_error_path(e), e.message) for e in problems)
                )
        return {"arguments": arguments}

    async def arun(self, arguments: dict[str, Any]) -> ToolResult:
        """Call the tool on the server and turn its result into the model's.

        Args:
            arguments: The arguments, checked against the server's input schema.
        """
        try:
            result = await self._client.call_tool(self.remote_name, arguments)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as error:
            _log.warning(
                "mcp.call.failed", server=self.server, tool=self.remote_name, error=repr(error)
            )
            raise ToolError(
                f"The MCP server {self.server!r} failed to run {self.remote_name!r}:"
                f" {type(error).__name__}: {error}"
            ) from error
        return ToolResult(_content(result), is_error=result.is_error)


def _unwrap(error: BaseException) -> BaseException:
    """The one error inside groups of one error (task groups wrap what they raise)."""
    found: Any = error
    while isinstance(found, BaseExceptionGroup) and len(cast("Any", found).exceptions) == 1:
        found = cast("Any", found).exceptions[0]
    return cast("BaseException", found)


def _validator(schema: dict[str, Any]) -> Any:
    """A JSON-schema validator of `schema`, or None when the schema itself is not valid."""
    try:
        cls: Any = cast("Any", jsonschema.validators).validator_for(schema)
        cls.check_schema(schema)
        return cls(schema)
    except jsonschema.SchemaError:
        return None  # the server checks the arguments itself


def _error_path(error: Any) -> tuple[str | int, ...]:
    return tuple(cast("Iterable[str | int]", error.absolute_path))


def _content(result: mcp_types.CallToolResult) -> list[TextBlock | Image]:
    """The blocks the model reads for an MCP tool result."""
    blocks: list[TextBlock | Image] = [_block(item) for item in result.content]
    structured = result.structured_content
    # A server that returns structured content also sends it as text (the spec says it
    # should); one that sends no text gets it as JSON here.
    if structured is not None and not any(isinstance(block, TextBlock) for block in blocks):
        blocks.append(TextBlock(json.dumps(structured, ensure_ascii=False)))
    return blocks or [TextBlock("(no content)")]


def _block(item: mcp_types.ContentBlock) -> TextBlock | Image:
    if isinstance(item, mcp_types.TextContent):
        return TextBlock(item.text)
    if isinstance(item, mcp_types.ImageContent):
        try:
            return Image(base64.b64decode(item.data, validate=True), item.mime_type)
        except (ValueError, binascii.Error):
            return TextBlock(f"(an image the model cannot be shown: {item.mime_type})")
    if isinstance(item, mcp_types.AudioContent):
        return TextBlock(f"(audio the model cannot be shown: {item.mime_type})")
    if isinstance(item, mcp_types.ResourceLink):
        return TextBlock(f"(resource: {item.uri})")
    resource = item.resource
    if isinstance(resource, mcp_types.TextResourceContents):
        return TextBlock(f"(resource {resource.uri})\n{resource.text}")
    return TextBlock(f"(resource {resource.uri}: {resource.mime_type or 'binary data'})")


# -- the toolset ---------------------------------------------------------------------------------


def _tool_name(prefix: str, remote: str) -> str:
    """The name the model calls a server's tool by: prefixed, in the characters models take."""
    name = _NAME_CHAR.sub("_", prefix + remote)
    if not name[:1].isalpha() and name[:1] != "_":
        name = "_" + name
    return name[:64]


def _check_seconds(option: str, value: float | None, *, optional: bool) -> float | None:
    if value is None and optional:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        none = ", or None for no limit" if optional else ""
        raise ValueError(f"{option} is a number of seconds greater than 0{none}; got {value!r}.")
    return float(value)


class MCPToolset(Toolset):
    """The tools of one MCP server, for ``Agent(tools=[...])``.

    Make one with `stdio` (a server run as a subprocess) or `http` (a streamable HTTP
    endpoint). A run connects when it starts and disconnects when it returns; inside
    ``async with toolset:`` runs share the block's connection instead.

    Attributes:
        name: What messages and logs call the server.
        only: The names of the server's tools to use, or None for all of them.
        prefix: Put before each tool name the model sees (against clashes).
        timeout: Seconds one call may take (None: no limit).
        connect_timeout: Seconds to connect and list the tools.
    """

    def __init__(
        self,
        target: mcp.StdioServerParameters | str,
        *,
        name: str,
        tools: Iterable[str] | None = None,
        prefix: str = "",
        timeout: float | None = 60.0,
        connect_timeout: float = 30.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Prefer `stdio` and `http`; this takes what they build.

        Raises:
            TypeError: ``tools`` is a str instead of a list of names, or prefix is not a str.
            ValueError: A timeout is not a number of seconds greater than 0.
        """
        if isinstance(tools, str):
            raise TypeError(f"tools takes a list of tool names, e.g. tools=[{tools!r}].")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, e.g. prefix='time_', got {prefix!r}.")
        self.name = name
        self.only: tuple[str, ...] | None = None if tools is None else tuple(tools)
        self.prefix = prefix
        self.timeout: float | None = _check_seconds("timeout", timeout, optional=True)
        self.connect_timeout: float = cast(
            "float", _check_seconds("connect_timeout", connect_timeout, optional=False)
        )
        self._target = target
        self._headers = dict(headers) if headers is not None else None
        self._shared: _Connection | None = None
        self._stack: AsyncExitStack | None = None

    @classmethod
    def stdio(
        cls,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        name: str | None = None,
        tools: Iterable[str] | None = None,
        prefix: str = "",
        timeout: float | None = 60.0,
        connect_timeout: float = 30.0,
    ) -> MCPToolset:
        """A server run as a subprocess, spoken to over its stdin and stdout.

        The process starts when a run (or ``async with``) connects and is stopped when it
        disconnects: its stdin is closed, then it is terminated if it does not exit.

        Args:
            command: The program, e.g. ``"uvx"`` or ``sys.executable``.
            args: Its arguments, e.g. ``["mcp-server-time"]``.
            env: Environment variables for it, over a safe default set (PATH, HOME, ...).
            cwd: Its working directory.
            name: What messages call it (default: the command and its first argument).
            tools: The names of the server's tools to use (default: all).
            prefix: Put before each tool name the model sees, e.g. ``"time_"``.
            timeout: Seconds one call may take before it is cancelled (None: no limit).
            connect_timeout: Seconds to start the server and list its tools.
        """
        target = mcp.StdioServerParameters(
            command=command,
            args=list(args),
            env=None if env is None else dict(env),
            cwd=cwd,
        )
        label = name or " ".join([Path(command).name, *args[:1]])
        return cls(
            target,
            name=label,
            tools=tools,
            prefix=prefix,
            timeout=timeout,
            connect_timeout=connect_timeout,
        )

    @classmethod
    def http(
        cls,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        name: str | None = None,
        tools: Iterable[str] | None = None,
        prefix: str = "",
        timeout: float | None = 60.0,
        connect_timeout: float = 30.0,
    ) -> MCPToolset:
        """A server reached over streamable HTTP, e.g. ``http://127.0.0.1:8000/mcp``.

        Args:
            url: The server's MCP endpoint.
            headers: Sent with every request, e.g. ``{"Authorization": "Bearer ..."}``.
            name: What messages call it (default: the URL).
            tools: The names of the server's tools to use (default: all).
            prefix: Put before each tool name the model sees.
            timeout: Seconds one call may take before it is cancelled (None: no limit).
            connect_timeout: Seconds to connect and list its tools.
        """
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http:// or https:// URL, got {url!r}.")
        return cls(
            url,
            name=name or url,
            tools=tools,
            prefix=prefix,
            timeout=timeout,
            connect_timeout=connect_timeout,
            headers=headers,
        )

    def __repr__(self) -> str:
        return f"<MCPToolset {self.name!r}>"

    # -- connecting ------------------------------------------------------------------------------

    @property
    def tools(self) -> tuple[MCPTool, ...]:
        """The tools of the connection ``async with`` opened.

        Raises:
            RuntimeError: No ``async with`` block has the toolset open.
        """
        if self._shared is None:
            raise RuntimeError(
                f"The MCP toolset {self.name!r} is not open: its tools are known inside"
                " `async with toolset:` (a run also opens it for itself)."
            )
        return self._shared.tools

    def open(self) -> AbstractAsyncContextManager[Sequence[Tool]]:
        """The tools for one run: the shared connection's, or a connection of the run's own."""
        return self._open()

    @asynccontextmanager
    async def _open(self) -> AsyncGenerator[Sequence[Tool]]:
        if self._shared is not None:
            yield self._shared.tools
            return
        async with self._connect() as connection:
            yield connection.tools

    async def __aenter__(self) -> MCPToolset:
        """Connect once for every run inside the block.

        Raises:
            RuntimeError: The toolset is open already.
            MCPServerError: The server could not be started or reached in time.
        """
        if self._stack is not None:
            raise RuntimeError(f"The MCP toolset {self.name!r} is open already.")
        stack = AsyncExitStack()
        self._stack = stack
        try:
            self._shared = await stack.enter_async_context(self._connect())
        except BaseException:
            self._stack = None
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Close the connection (and stop a stdio server's process)."""
        stack, self._stack, self._shared = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    @asynccontextmanager
    async def _connect(self) -> AsyncGenerator[_Connection]:
        """A connection whose client lives in a task of its own, closed on exit.

        An error (the run's, or the server's at the start) leaves as it is, never wrapped in
        the task group's exception group.
        """
        error: BaseException | None = None
        with anyio.CancelScope() as ending:
            async with anyio.create_task_group() as group:
                try:
                    with anyio.fail_after(self.connect_timeout):
                        connection: _Connection = await group.start(self._serve)
                except TimeoutError:
                    error = MCPServerError(
                        f"The MCP server {self.name!r} did not answer within"
                        f" {self.connect_timeout:g} s (connect_timeout): check that the command"
                        " starts an MCP server, or raise connect_timeout."
                    )
                except BaseException as exc:
                    error = exc
                else:
                    try:
                        yield connection
                    except BaseException as exc:
                        error = exc
                    finally:
                        connection.closing.set()
                if error is not None:
                    # Closing must not raise a new cancellation in the error's place.
                    ending.shield = True
        if error is not None:
            raise error

    async def _serve(self, *, task_status: anyio.abc.TaskStatus[_Connection]) -> None:
        """Hold a client session open until the connection closes; hand it over when ready."""
        started = False
        try:
            async with AsyncExitStack() as stack:
                client = await self._client(stack)
                tools = await self._list(client)
                closing = anyio.Event()
                task_status.started(_Connection(client, tools, closing))
                started = True
                await closing.wait()
        except Exception as error:  # the SDK's task groups wrap errors in groups
            inner = _unwrap(error)
            if isinstance(inner, MCPServerError):
                raise inner from None
            if started:
                # A server that dies leaves its calls with error results; closing never fails
                # the run that owns the connection.
                _log.warning("mcp.server.closed", server=self.name, error=repr(inner))
                return
            raise MCPServerError(
                f"Could not connect to the MCP server {self.name!r}: {type(inner).__name__}:"
                f" {inner}"
            ) from error

    async def _make_http(self, stack: AsyncExitStack) -> Any:
        """The streamable HTTP transport, with an HTTP client of our own when headers are set."""
        url = cast("str", self._target)
        if self._headers is None:
            return streamable_http_client(url)
        http = httpx2.AsyncClient(
            headers=self._headers,
            timeout=httpx2.Timeout(_HTTP_TIMEOUT, read=_HTTP_READ_TIMEOUT),
        )
        await stack.enter_async_context(http)
        return streamable_http_client(url, http_client=http)

    async def _client(self, stack: AsyncExitStack) -> mcp.Client:
        """A client session entered on `stack` (its HTTP client too, when it has one)."""
        target: Any = self._target
        if isinstance(target, str):
            target = await self._make_http(stack)
        info = mcp_types.Implementation(name="orchestrator", version="0")
        return await stack.enter_async_context(mcp.Client(target, client_info=info))

    async def _list(self, client: mcp.Client) -> tuple[MCPTool, ...]:
        """The server's tools (the chosen ones), as `MCPTool` objects."""
        listed: list[mcp_types.Tool] = []
        cursor: str | None = None
        for _ in range(_PAGES):
            page = await client.list_tools(cursor=cursor)
            listed.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        by_name = {item.name: item for item in listed}
        if self.only is not None:
            missing = [name for name in self.only if name not in by_name]
            if missing:
                close = difflib.get_close_matches(missing[0], list(by_name), n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise MCPServerError(
                    f"The MCP server {self.name!r} has no tool {missing[0]!r} (tools=): it has"
                    f" {', '.join(sorted(by_name)) or 'none'}.{hint}"
                )
            listed = [by_name[name] for name in self.only]
        tools: dict[str, MCPTool] = {}
        for item in listed:
            name = _tool_name(self.prefix, item.name)
            if name in tools:
                raise MCPServerError(
                    f"The MCP server {self.name!r} has two tools named {name!r} once made into"
                    " names a model takes: choose one with tools=[...]."
                )
            tools[name] = MCPTool(
                item, name=name, server=self.name, client=client, timeout=self.timeout
            )
        return tuple(tools.values())
