"""`orchestrator mcp-serve`: an agent or tools served over MCP, from a shell.

The function named ``module:function`` takes nothing and returns an `Agent` (served as one tool
by `serve_agent`), a list of tools (`serve_tools`), or an MCP server already built. Over stdio
(the default) nothing else is written to stdout, which carries the protocol; over HTTP the
server listens on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, cast

import anyio

from orchestrator import Agent
from orchestrator.mcp import http_app, run_stdio, serve_agent, serve_tools

from ._replaying import FactoryError, load_function
from ._serving import listener_on

__all__ = ("load_server", "serve_http", "serve_stdio")

_HOST = "127.0.0.1"


def load_server(spec: str) -> Any:
    """The MCP server for what ``module:function`` returns.

    Raises:
        FactoryError: `spec` names no such function, or it returned something else.
    """
    from mcp.server import Server

    build = load_function(spec, "a function that takes nothing and returns what to serve")
    made: object = build()
    if isinstance(made, Server):
        return cast("Server[Any]", made)
    if isinstance(made, Agent):
        return serve_agent(made)
    if isinstance(made, list | tuple):
        try:
            return serve_tools(cast("list[Any]", made))
        except TypeError as error:
            raise FactoryError(f"{spec} returned a list that is not tools: {error}") from None
    raise FactoryError(
        f"{spec} must return an Agent, a list of tools or an MCP server (serve_tools,"
        f" serve_agent), got {type(made).__name__}."
    )


def serve_stdio(server: Any) -> None:
    """Serve `server` on stdin and stdout until the client closes stdin."""
    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(run_stdio, server)


def serve_http(server: Any, *, port: int, path: str, ready: Callable[[str], None]) -> None:
    """Serve `server` at http://127.0.0.1:`port``path` until interrupted; `ready(url)` first."""
    import uvicorn  # the apps extra: imported only by the command that needs it

    app = http_app(server, path=path)
    listener = listener_on(_HOST, port)
    try:
        bound = listener.getsockname()[1]

        async def main() -> None:
            config = uvicorn.Config(app, log_level="warning", lifespan="on")
            ready(f"http://{_HOST}:{bound}{path}")
            await uvicorn.Server(config).serve(sockets=[listener])

        with contextlib.suppress(KeyboardInterrupt):
            anyio.run(main)
    finally:
        listener.close()
