"""`orchestrator serve`: a `Runs` service over HTTP, from a shell.

It imports the agents (``--agents module:function``, a function that takes nothing and returns
them), opens the store, enters `Runs` and serves `asgi_app` with uvicorn until Ctrl+C; leaving
cancels every run still going, and each saves itself. Bound to anything but this machine, it
needs a token: an open port must not let anyone run agents.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import anyio

from orchestrator import Agent

from ._replaying import FactoryError, load_function

__all__ = ("is_loopback", "listener_on", "load_agents", "serve_runs")


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def load_agents(spec: str) -> Sequence[Agent] | Mapping[str, Agent]:
    """The agents the function ``module:function`` returns (a list of named Agents, or a dict).

    Raises:
        FactoryError: `spec` names no such function, or it returned something else.
    """
    build = load_function(spec, "a function that takes nothing and returns the agents")
    agents: object = build()
    if isinstance(agents, Agent):
        return [agents]
    if isinstance(agents, Mapping):
        items = cast("Mapping[object, object]", agents)
        if all(isinstance(k, str) and isinstance(v, Agent) for k, v in items.items()):
            return cast("Mapping[str, Agent]", agents)
    elif isinstance(agents, list | tuple):
        listed = cast("Sequence[object]", agents)
        if listed and all(isinstance(agent, Agent) for agent in listed):
            return cast("Sequence[Agent]", agents)
    kind = type(cast("object", agents)).__name__
    raise FactoryError(
        f"--agents {spec} must return Agents (a list of named agents, or a dict of name ->"
        f" Agent), got {kind}."
    )


def listener_on(host: str, port: int) -> socket.socket:
    """A socket listening on `host`:`port` (0: a free port), before the server that serves it.

    It listens at once, so a client that read the printed URL connects (queued until the
    server accepts) instead of being refused while the server starts.

    Raises:
        OSError: The port cannot be listened on (it is taken, or not allowed).
    """
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host.strip("[]"), port))
        listener.listen(2048)  # uvicorn's own backlog
    except BaseException:
        listener.close()
        raise
    return listener


def serve_runs(
    agents: Sequence[Agent] | Mapping[str, Agent],
    store: Any,
    *,
    host: str,
    port: int,
    token: str | None,
    hosts: Sequence[str],
    origins: Sequence[str],
    max_runs: int,
    lease: float,
    ready: Callable[[str], None],
    a2a: bool = False,
) -> None:
    """Serve `agents` over HTTP on `host`:`port` until interrupted; `ready(url)` once listening.

    With `a2a`, each agent is served over A2A too (`orchestrator.a2a.a2a_routes`).
    """
    import uvicorn  # the apps extra: imported only by the command that needs it

    from orchestrator.apps import Runs, asgi_app

    if a2a:
        from orchestrator.a2a import a2a_routes  # the a2a extra: only when asked for
    else:
        a2a_routes = None

    listener = listener_on(host, port)  # here, so a taken port is said before runs open
    try:
        bound = listener.getsockname()[1]

        async def main() -> None:
            async with Runs(agents, store, max_runs=max_runs, lease=lease) as runs:
                routes = [] if a2a_routes is None else a2a_routes(runs)
                app = asgi_app(runs, token=token, hosts=hosts, origins=origins, routes=routes)
                config = uvicorn.Config(app, log_level="warning", lifespan="off")
                server = uvicorn.Server(config)
                ready(f"http://{host}:{bound}")
                await server.serve(sockets=[listener])

        with contextlib.suppress(KeyboardInterrupt):  # uvicorn stops on Ctrl+C, then raises it
            anyio.run(main)
    finally:
        listener.close()
