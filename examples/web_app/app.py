"""The web app: Starlette, one task group for every run, events as server-sent events.

Starlette, not FastAPI: the app needs routes, a lifespan that owns a task group, and a streaming
response. Starlette has exactly that; FastAPI would add request models and dependency injection
on top, which nine small routes do not need, and the events already are pydantic models.

Routes:
    GET  /                            the page (static/index.html)
    POST /runs                        {"prompt": "..."} starts a run: {"id": ...}
    GET  /runs                        the stored runs (roots), newest first
    GET  /runs/{id}                   the run's tree as JSON (States, calls, waiting calls)
    GET  /runs/{id}/events            its events as server-sent events (Last-Event-ID resumes)
    POST /runs/{id}/calls/{call}/approve   {"by": ..., "reason": ...}
    POST /runs/{id}/calls/{call}/deny      {"by": ..., "reason": ...}

Every run is a task of the app's task group; stopping the app cancels them, and each saves
itself (its open calls closed as interrupted). A run that waits for a person is stored, so it can
be approved after a restart: the decision is recorded and the run continues in this process.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import anyio
import anyio.abc
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from orchestrator import (
    Agent,
    Message,
    State,
    StoreConflictError,
    aapprove,
    adeny,
    awaiting,
    thaw,
)
from stores import SQLiteStore

STATIC = Path(__file__).parent / "static"


@dataclass
class RunLog:
    """What the app streams of one run: its events as JSON, in order, and its status."""

    events: list[str] = field(default_factory=list[str])
    status: str = "running"  # running, waiting, done, failed, cancelled
    changed: anyio.Event = field(default_factory=anyio.Event)

    def add(self, kind: str, data: str) -> None:
        self.events.append(json.dumps({"kind": kind, "data": data}))
        self.ping()

    def ping(self) -> None:
        changed, self.changed = self.changed, anyio.Event()
        changed.set()


class Runs:
    """The runs of this app process, each a task of `group`."""

    def __init__(
        self, store: SQLiteStore, build: Callable[[], Agent], group: anyio.abc.TaskGroup
    ) -> None:
        self.store = store
        self.build = build
        self.group = group
        self.logs: dict[str, RunLog] = {}
        self.busy: set[str] = set()

    async def start(self, prompt: str) -> str:
        state = State(messages=[Message.user(prompt)])
        await self.store.asave(state)  # stored (and bound: the run saves there) from the start
        self.logs[state.id] = RunLog()
        self._launch(state)
        return state.id

    def _launch(self, state: State) -> None:
        self.busy.add(state.id)
        log = self.logs.setdefault(state.id, RunLog())
        log.status = "running"
        self.group.start_soon(self._drive, state, log, name=f"run {state.id}")

    async def _drive(self, state: State, log: RunLog) -> None:
        agent = self.build()
        try:
            async with agent.events(state) as events:
                async for event in events:
                    log.add(event.kind, event.model_dump_json())
            log.status = "waiting" if awaiting(state) else "done"
        except anyio.get_cancelled_exc_class():
            log.status = "cancelled"
            raise
        except Exception as error:
            log.status = "failed"
            log.add("error", json.dumps({"error": f"{type(error).__name__}: {error}"}))
        finally:
            self.busy.discard(state.id)
            log.ping()

    async def decide(
        self, run_id: str, call_id: str, approved: bool, by: str | None, reason: str | None
    ) -> State:
        """Record a decision; once nothing waits any more, continue the run here."""
        if run_id in self.busy:
            raise ValueError(f"run {run_id} is running; decide once it waits")
        state = await self.store.aload(run_id)
        await (aapprove if approved else adeny)(state, call_id, by=by, reason=reason)
        if not awaiting(state) and run_id not in self.busy:
            self._launch(await self.store.aload(run_id))
        return state


def tree(store: SQLiteStore, state: State) -> dict[str, Any]:
    """`state` and its subagents as JSON: calls with their results, and the waiting calls."""
    results = {e.call.id: e for e in state.history if e.kind == "tool_result"}
    calls: list[dict[str, Any]] = []
    for entry in state.history:
        if entry.kind != "model_reply":
            continue
        for call in entry.content.message.tool_calls:
            result = results.get(call.id)
            calls.append(
                {
                    "id": call.id,
                    "name": call.name,
                    "args": thaw(call.args),
                    "outcome": None if result is None else result.outcome,
                    "result": None if result is None else result.content.text,
                }
            )
    children = [
        tree(store, store.load(info.id))
        for info in reversed(store.list(parent_id=state.id))  # oldest first
    ]
    return {
        "id": state.id,
        "parent_id": state.parent_id,
        "finished": state.finished,
        "answer": thaw(state.answer),
        "stopped": None if state.stopped is None else str(state.stopped),
        "calls": calls,
        "awaiting": [
            {
                "state_id": item.state_id,
                "call_id": item.call.id,
                "name": item.call.name,
                "args": thaw(item.call.args),
                "reason": item.reason,
            }
            for item in awaiting(state)
        ],
        "children": children,
    }


def create_app(
    store_path: str | Path, build: Callable[[], Agent], *, keepalive: float = 15.0
) -> Starlette:
    """The app, saving runs in the SQLite file `store_path`, with an agent from `build()`."""
    store = SQLiteStore(store_path)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncGenerator[None]:
        async with anyio.create_task_group() as group:
            app.state.runs = Runs(store, build, group)
            try:
                yield
            finally:
                group.cancel_scope.cancel()  # every run is cancelled and saves itself
        store.close()

    def runs_of(request: Request) -> Runs:
        return request.app.state.runs

    async def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    async def start(request: Request) -> Response:
        body: Any = await request.json()
        prompt: Any = None
        if isinstance(body, dict):
            prompt = cast("dict[str, Any]", body).get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            return JSONResponse({"error": 'send {"prompt": "..."}'}, status_code=400)
        run_id = await runs_of(request).start(prompt)
        return JSONResponse({"id": run_id}, status_code=201)

    async def listing(request: Request) -> Response:
        infos = await store.alist(parent_id=None)
        return JSONResponse(
            [{"id": info.id, "title": info.title} for info in infos if info.parent_id is None]
        )

    async def show(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        try:
            state = await store.aload(run_id)
        except LookupError:
            return JSONResponse({"error": f"no run {run_id}"}, status_code=404)
        data = await anyio.to_thread.run_sync(tree, store, state)
        data["status"] = _status(runs_of(request), run_id, state)
        return JSONResponse(data)

    async def events(request: Request) -> Response:
        runs = runs_of(request)
        run_id = request.path_params["run_id"]
        log = runs.logs.get(run_id)
        if log is None:
            return JSONResponse({"error": f"run {run_id} streams nothing here"}, status_code=404)
        # An EventSource sends Last-Event-ID when it reconnects; a new one passes ?after=.
        last = request.headers.get("last-event-id") or request.query_params.get("after")
        return StreamingResponse(
            _sse(log, _after(last), keepalive),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store"},
        )

    async def decide(request: Request) -> Response:
        run_id, call_id = request.path_params["run_id"], request.path_params["call_id"]
        approved = request.path_params["verdict"] == "approve"
        body: Any = await request.json() if await request.body() else {}
        by, reason = body.get("by"), body.get("reason")
        try:
            await runs_of(request).decide(run_id, call_id, approved, by, reason)
        except LookupError as error:  # no such run, or no such waiting call
            return JSONResponse({"error": str(error).strip('"')}, status_code=404)
        except (ValueError, StoreConflictError) as error:
            return JSONResponse({"error": str(error)}, status_code=409)
        return JSONResponse({"id": run_id, "call_id": call_id, "approved": approved})

    return Starlette(
        routes=[
            Route("/", index),
            Route("/runs", start, methods=["POST"]),
            Route("/runs", listing, methods=["GET"]),
            Route("/runs/{run_id}", show),
            Route("/runs/{run_id}/events", events),
            Route("/runs/{run_id}/calls/{call_id}/{verdict:str}", decide, methods=["POST"]),
        ],
        lifespan=lifespan,
    )


def _status(runs: Runs, run_id: str, state: State) -> str:
    if run_id in runs.busy:
        return "running"
    if awaiting(state):
        return "waiting"
    return "done" if state.answer is not None else "stopped"


# Event ids are "<boot>.<index>": the index in this process's log of the run. A run continued
# after a restart has a new log, so an id from another boot replays this process's log whole.
_BOOT = secrets.token_hex(4)


def _after(last: str | None) -> int:
    """Where a stream starts, given the id of the last event the client saw (or None)."""
    boot, _, index = (last or "").partition(".")
    return int(index) + 1 if boot == _BOOT and index.isdigit() else 0


async def _sse(log: RunLog, start_at: int, keepalive: float) -> AsyncIterator[str]:
    """The log's events from `start_at` as SSE, following it until the run stops running."""
    index = start_at
    while True:
        changed = log.changed
        while index < len(log.events):
            item = json.loads(log.events[index])
            yield f"id: {_BOOT}.{index}\nevent: {item['kind']}\ndata: {item['data']}\n\n"
            index += 1
        if log.status != "running":
            yield f"event: end\ndata: {json.dumps({'status': log.status})}\n\n"
            return
        with anyio.move_on_after(keepalive):
            await changed.wait()
            continue
        yield ": keepalive\n\n"
