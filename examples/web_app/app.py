"""The web app: a `Runs` service over HTTP (`asgi_app`), with a page mounted beside it.

`Runs` owns the runs: each is a task of the service, saved as it goes, so a browser that goes
away never stops one, and stopping the app cancels and saves every run still going. `asgi_app`
serves them (see `orchestrator.apps.asgi_app` for every route and its checks):

    GET  /                                   the page (static/index.html)
    POST /runs                               {"agent": "desk", "input": "..."} starts a run
    GET  /runs/{id}                          the run: its status and the calls waiting
    GET  /runs/{id}/events                   its events and its subagents' as server-sent
                                             events; Last-Event-ID (or ?after=) continues
    POST /runs/{id}/calls/{call}/approve     {"by": ..., "reason": ...}
    POST /runs/{id}/calls/{call}/deny        {"by": ..., "reason": ...}
    POST /runs/{id}/cancel                   {}
    GET  /viewer/                            the read-only run viewer, live

The page sends JSON from its own origin, so the app's CSRF checks (JSON content type, allowed
Origin) let it through; another site's page cannot start, decide or cancel runs.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route

from orchestrator import Agent
from orchestrator.apps import Runs, asgi_app
from stores import SQLiteStore

STATIC = Path(__file__).parent / "static"


def create_app(
    store_path: str | Path, agents: Sequence[Agent], *, keepalive: float = 15.0
) -> Starlette:
    """The app: `agents` run in a `Runs` service that saves them in the SQLite file `store_path`."""
    store = SQLiteStore(store_path)
    runs = Runs(agents, store)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncGenerator[None]:
        with store:  # closed after the service, which saves every run it cancels on the way out
            async with runs:
                yield

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    return Starlette(
        routes=[Route("/", page), Mount("/", asgi_app(runs, keepalive=keepalive))],
        lifespan=lifespan,
    )
