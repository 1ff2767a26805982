"""`asgi_app`: a `Runs` service over HTTP (Starlette): REST, server-sent events, AG-UI, Vercel.

Routes (JSON in and out; a run is its root State's id):

    POST /runs                                   {"agent", "input", "state_id"?, "limits"?}
                                                 -> 201 run
    GET  /runs                                   ?limit=N: the stored runs, newest first
    GET  /runs/{id}                              the run's info
    GET  /runs/{id}/events                       its events as SSE; Last-Event-ID or ?after=
    POST /runs/{id}/cancel                       -> the run, once it is saved
    POST /runs/{id}/calls/{call_id}/approve      {"by"?, "reason"?} -> the run
    POST /runs/{id}/calls/{call_id}/deny         {"by"?, "reason"?} -> the run
    POST /agents/{agent}/agui                    an AG-UI RunAgentInput -> the run as AG-UI SSE
    POST /agents/{agent}/vercel                  an AI SDK chat request -> a UI message stream
    POST /session                                {"token"} -> 204, a cookie that holds it

Safe by default: only the Host names given are served (127.0.0.1 and localhost unless told
otherwise); with a `token`, every request needs ``Authorization: Bearer <token>``, or the
cookie ``POST /session`` sets (HttpOnly, SameSite=Strict, for this browser session): a page
cannot put a header on an ``EventSource``, so the viewer signs in that way. The viewer's page
and its scripts hold no run data and load without the token, to ask for it. A request
that changes something must send JSON (``Content-Type: application/json``) and, when a
browser sends an ``Origin``, one that is allowed (the app's own, or one listed), so another
site's page cannot start or approve runs; a body larger than `max_body` is refused. Bad input
gets a 4xx with ``{"error": "..."}`` that says what to send, never a 500.

A run's ``"limits"`` (``{"total_tokens": 20000, "cost": 0.5}``: any fields of `Limits`, each a
number >= 0 or null) bound it beside its agent's own limits, the tighter of each field holding:
a caller can tighten what an agent may spend, never loosen it. Give an agent the most a caller
may have it spend as ``Agent(limits=...)``.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import anyio
import pydantic
from ag_ui.core import RunAgentInput, TextInputContent
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from .._apps._events import limit_info
from .._base._errors import StoreConflictError
from .._base._json import thaw
from .._base._limits import LIMIT_NAMES, Limits
from .._base._stopped import StoppedByApproval
from .._record._recording import validate_id
from .._record._store_client import client_of
from . import agui, vercel
from ._following import Followed, Following
from ._runs import RunInfo, Runs, TooManyRunsError

__all__ = ("DEFAULT_HOSTS", "DEFAULT_MAX_BODY", "SESSION_COOKIE", "asgi_app", "run_json")

DEFAULT_HOSTS = ("127.0.0.1", "localhost", "[::1]")
"""The Host names served unless `hosts` is given: this machine only."""

DEFAULT_MAX_BODY = 1 << 20
"""The largest request body read (bytes) unless `max_body` is given."""

SESSION_COOKIE = "orchestrator_token"
"""The cookie ``POST /session`` sets: it holds the token, for pages that cannot send headers."""

_SHELL = re.compile(r"/viewer/?|/viewer/index\.html|/viewer/static/[A-Za-z0-9_.-]+")
"""The viewer's page and scripts: no run data, served without the token so it can ask for it."""

_KEEPALIVE = 15.0


class _BadRequest(Exception):
    """What was sent cannot be used: a 4xx answer with the message."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def run_json(info: RunInfo) -> dict[str, Any]:
    """A run's info as the JSON the app answers with."""
    stopped = info.stopped
    waiting: list[dict[str, Any]] = []
    if isinstance(stopped, StoppedByApproval):
        waiting = [
            {
                "state_id": item.state_id,
                "call_id": item.call.id,
                "name": item.call.name,
                "args": thaw(item.call.args),
                "reason": item.reason,
            }
            for item in stopped.calls
        ]
    usage = info.usage
    return {
        "id": info.state_id,
        "status": info.status,
        "title": info.title,
        "turn": info.turn,
        "entries": info.entries,
        "usage": {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "requests": usage.requests,
            "cost": usage.cost,
        },
        "stopped": None if stopped is None else str(stopped),
        "stop_kind": None if stopped is None else stopped.kind,
        "limit": limit_info(stopped),
        "waiting": waiting,
        "created_at": None if info.created_at is None else info.created_at.isoformat(),
        "updated_at": None if info.updated_at is None else info.updated_at.isoformat(),
    }


def _limits(body: dict[str, Any]) -> Limits | None:
    """The body's ``"limits"`` object as `Limits`, or None when it is absent or null."""
    value = body.get("limits")
    if value is None:
        return None
    known = ", ".join(LIMIT_NAMES)
    if not isinstance(value, dict):
        raise _BadRequest(
            f'"limits" must be a JSON object such as {{"total_tokens": 20000}} (fields: {known}),'
            f" got {json.dumps(value)}."
        )
    given = cast("dict[str, Any]", value)
    for name, amount in given.items():
        if name not in LIMIT_NAMES:
            raise _BadRequest(f'"limits" has no field {json.dumps(name)}: use {known}.')
        try:
            Limits(**{name: amount})  # the field's own check, named the way JSON says it
        except ValueError:
            what = "a number" if name in ("cost", "seconds") else "a whole number"
            raise _BadRequest(
                f'"limits.{name}" must be {what} >= 0, or null for no limit, got'
                f" {json.dumps(amount)}."
            ) from None
    return Limits(**given)


@dataclass(frozen=True, slots=True)
class _Guard:
    """The checks every request passes before a route sees it (ASGI middleware)."""

    app: ASGIApp
    token: str | None
    origins: frozenset[str]
    hosts: frozenset[str]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            status, message = refusal
            extra = {"WWW-Authenticate": "Bearer"} if status == 401 else None
            await JSONResponse({"error": message}, status, headers=extra)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope, headers: Headers) -> tuple[int, str] | None:
        if "*" not in self.hosts and _host_name(headers.get("host", "")) not in self.hosts:
            return 400, (
                "This app does not serve that Host name: reach it by a listed one, or list"
                " it in asgi_app(..., hosts=[...])."
            )
        if self.token is not None and not self._signed_in(scope, headers):
            return 401, (
                "Send the service's token: Authorization: Bearer <token> (or sign in with"
                ' POST /session {"token": ...}, which sets a cookie).'
            )
        if scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return None
        origin = headers.get("origin")
        if origin is not None and origin not in self.origins and origin != _own_origin(scope):
            return 403, (
                f"Requests from the origin {origin!r} may not change runs: serve the page from"
                " this app, or list its origin in asgi_app(..., origins=[...])."
            )
        kind = headers.get("content-type", "").partition(";")[0].strip().lower()
        if kind != "application/json":
            return 415, "Send the body as JSON, with Content-Type: application/json."
        return None

    def _signed_in(self, scope: Scope, headers: Headers) -> bool:
        """Whether the request may pass without a token check, or carries the token."""
        assert self.token is not None
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if scope["method"] == "GET" and _SHELL.fullmatch(path):
            return True
        if scope["method"] == "POST" and path == "/session":
            return True  # the route checks the token it is given
        scheme, _, credential = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            return _same(credential.strip(), self.token)
        cookie = Request(scope).cookies.get(SESSION_COOKIE)
        return cookie is not None and _same(cookie, self.token)


def _same(given: str, token: str) -> bool:
    """Whether `given` is `token`, compared in constant time."""
    return secrets.compare_digest(given.encode(), token.encode())


def _host_name(host: str) -> str:
    """The name in a Host header, without its port ("[::1]:80" is "[::1]")."""
    if host.startswith("["):
        return host[: host.find("]") + 1]
    return host.rpartition(":")[0] if ":" in host else host


def _own_origin(scope: Scope) -> str:
    headers = Headers(scope=scope)
    return f"{scope.get('scheme', 'http')}://{headers.get('host', '')}"


async def _body(request: Request, limit: int) -> dict[str, Any]:
    """The request's JSON object, read up to `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _BadRequest(f"The body is larger than {limit} bytes: send less.", 413)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _BadRequest(f"The body is larger than {limit} bytes: send less.", 413)
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw:
        return {}
    try:
        value: Any = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise _BadRequest(f"The body is not valid JSON ({error}): send a JSON object.") from None
    except RecursionError:  # a small body can nest deeper than the parser goes
        raise _BadRequest("The body's JSON nests too deeply: send a flatter JSON object.") from None
    if not isinstance(value, dict):
        raise _BadRequest(f"Send a JSON object, not {type(value).__name__}.")
    return cast("dict[str, Any]", value)


def _text(body: dict[str, Any], key: str) -> str | None:
    """The string `key` of `body`, or None when it is absent or null."""
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _BadRequest(f'"{key}" must be a string, got {json.dumps(value)}.')
    return value


def _run_id(value: str, what: str = "run id") -> str:
    """`value` if it can name a run (a State id), else a 400 that says what an id looks like."""
    try:
        return validate_id(value, what)
    except (TypeError, ValueError) as error:
        raise _BadRequest(str(error)) from None


def _path_run_id(request: Request) -> str:
    return _run_id(request.path_params["run_id"])


def _required_text(body: dict[str, Any], key: str) -> str:
    value = _text(body, key)
    if value is None:
        raise _BadRequest(f'Send "{key}" (a string) in the JSON body.')
    return value


Handler = Callable[[Request], Awaitable[Response]]


def _answering(handler: Handler) -> Handler:
    """`handler`, with what the service raises answered as 4xx JSON."""

    async def answer(request: Request) -> Response:
        try:
            return await handler(request)
        except _BadRequest as error:
            return JSONResponse({"error": str(error)}, error.status)
        except TooManyRunsError as error:
            return JSONResponse({"error": str(error)}, 429)
        except KeyError as error:  # no such agent, no such waiting call
            return JSONResponse({"error": str(error.args[0] if error.args else error)}, 404)
        except LookupError as error:  # no such run
            return JSONResponse({"error": str(error)}, 404)
        except (ValueError, StoreConflictError) as error:  # running, finished, decided
            return JSONResponse({"error": str(error)}, 409)
        except TypeError as error:
            return JSONResponse({"error": str(error)}, 400)

    return answer


def _agui_input(body: dict[str, Any]) -> RunAgentInput:
    try:
        return RunAgentInput.model_validate(body)
    except pydantic.ValidationError as error:
        raise _BadRequest(
            f"Send an AG-UI RunAgentInput (threadId, runId, messages, ...): {error}"
        ) from None


def _agui_text(run_input: RunAgentInput) -> str:
    """The text of the newest user message of an AG-UI run's input."""
    for message in reversed(run_input.messages):
        if message.role != "user":
            continue
        content: Any = message.content
        if isinstance(content, str):
            return content
        texts = [part.text for part in content if isinstance(part, TextInputContent)]
        if texts:
            return "".join(texts)
    raise _BadRequest("The AG-UI input has no user message to answer: add one to `messages`.")


def _agui_verdict(status: str, payload: Any) -> tuple[bool, str | None]:
    """Whether an answer to an interrupt approves the call, and why (AG-UI `resume`).

    ``resolved`` approves unless its payload says ``{"approved": false}``; ``cancelled`` denies.
    """
    details: dict[str, Any] = cast("dict[str, Any]", payload) if isinstance(payload, dict) else {}
    reason = details.get("reason")
    approved = status == "resolved" and details.get("approved", True) is not False
    return approved, reason if isinstance(reason, str) else None


def _vercel_text(message: Any) -> str:
    """The text of a UI message (its ``text`` parts), which must be the user's."""
    if not isinstance(message, dict) or cast("dict[str, Any]", message).get("role") != "user":
        raise _BadRequest("The newest message must be the user's (role: user) or approve calls.")
    parts = cast("dict[str, Any]", message).get("parts")
    texts: list[str] = []
    for part in cast("list[Any]", parts if isinstance(parts, list) else []):
        fields = cast("dict[str, Any]", part) if isinstance(part, dict) else {}
        text = fields.get("text")
        if fields.get("type") == "text" and isinstance(text, str):
            texts.append(text)
    if not texts:
        raise _BadRequest("The user's message has no text part: send what the agent should answer.")
    return "".join(texts)


def _vercel_decisions(message: Any) -> list[tuple[str, bool, str | None]]:
    """The approvals a UI message answers: its tool parts whose approval was responded to."""
    if not isinstance(message, dict) or cast("dict[str, Any]", message).get("role") != "assistant":
        return []
    found: list[tuple[str, bool, str | None]] = []
    for part in cast("list[Any]", cast("dict[str, Any]", message).get("parts") or []):
        if not isinstance(part, dict):
            continue
        fields = cast("dict[str, Any]", part)
        approval = fields.get("approval")
        if fields.get("state") != "approval-responded" or not isinstance(approval, dict):
            continue
        answer = cast("dict[str, Any]", approval)
        call_id, approved, reason = answer.get("id"), answer.get("approved"), answer.get("reason")
        if not isinstance(call_id, str) or not isinstance(approved, bool):
            raise _BadRequest(
                'An approval response needs "id" (the call\'s) and "approved" (bool).'
            )
        found.append((call_id, approved, reason if isinstance(reason, str) else None))
    return found


def _sse(event_id: str | None, kind: str, data: str) -> bytes:
    head = "" if event_id is None else f"id: {event_id}\n"
    return f"{head}event: {kind}\ndata: {data}\n\n".encode()


async def _with_keepalive(
    following: Following, encode: Callable[[Any], Sequence[bytes]], keepalive: float
) -> AsyncIterator[bytes]:
    """The encoded events of `following`, with a comment line when nothing came for a while."""
    iterator = aiter(following)
    while True:
        item: Any = None
        with anyio.move_on_after(keepalive):
            try:
                item = await anext(iterator)
            except StopAsyncIteration:
                return
        if item is None:
            yield b": keepalive\n\n"
            continue
        for data in encode(item):
            yield data


def _viewer_mount(runs: Runs, keepalive: float) -> tuple[BaseRoute, BaseRoute]:
    """The run viewer's page under ``/viewer/``, read-only, following the run it shows."""
    from .._viewing._viewer import SECURITY_HEADERS, Viewer, viewer_answer

    client = client_of(runs.store)
    if client.is_async:
        raise ValueError(
            f"The viewer reads the store from a worker thread, which {type(runs.store).__name__}"
            " cannot be used from: make the app with asgi_app(..., viewer=False)."
        )
    page = Viewer(client.sync_store("unreachable: checked above"), runs.store_name)

    async def answer(request: Request) -> Response:
        path = "/" + request.path_params.get("path", "")
        status, kind, body = await anyio.to_thread.run_sync(
            lambda: viewer_answer(page, path, request.url.query, live=True)
        )
        return Response(body, status, headers=SECURITY_HEADERS, media_type=kind)

    async def events(request: Request) -> Response:
        following = runs.follow(request.path_params["run_id"])
        try:
            await following.ready()
        except (ValueError, LookupError) as error:
            raise _BadRequest(str(error), 404) from None

        def encode(item: Followed) -> Sequence[bytes]:
            return (_sse(item.id, item.event.kind, "{}"),)

        return StreamingResponse(
            _with_keepalive(following, encode, keepalive),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store"},
        )

    async def slash(request: Request) -> Response:
        return RedirectResponse(request.url.path + "/", 308)

    return Mount(
        "/viewer",
        routes=[
            Route("/events/{run_id}", _answering(events), methods=["GET"]),
            Route("/{path:path}", answer, methods=["GET"]),
        ],
    ), Route("/viewer", slash, methods=["GET"])


def asgi_app(
    runs: Runs,
    *,
    token: str | None = None,
    hosts: Sequence[str] = DEFAULT_HOSTS,
    origins: Sequence[str] = (),
    max_body: int = DEFAULT_MAX_BODY,
    keepalive: float = _KEEPALIVE,
    viewer: bool = True,
    routes: Sequence[BaseRoute] = (),
) -> Starlette:
    """The HTTP app of `runs` (see the module's docstring for the routes and the checks).

    `runs` is entered by the caller (an app's lifespan, or ``orchestrator serve``). `hosts` are
    the Host names served (``"*"`` serves any: only behind a proxy that checks them);
    `origins` the browser origins besides the app's own that may change runs; `keepalive` the
    seconds between comment lines on a quiet event stream. With `viewer` (and a store with a
    sync API), the read-only run viewer of ``orchestrator view`` is at ``/viewer/``, live: it
    follows the run it shows and redraws it as events come. `routes` are served too, behind
    the same checks: ``routes=a2a_routes(runs)`` (`orchestrator.a2a`) serves the agents over
    A2A.
    """
    if token is not None and (not isinstance(token, str) or len(token) < 16):
        raise ValueError(
            "token must be a string of at least 16 characters: make one with"
            " secrets.token_urlsafe()."
        )
    if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body < 1:
        raise ValueError(f"max_body must be a positive number of bytes, got {max_body!r}.")

    async def start(request: Request) -> Response:
        body = await _body(request, max_body)
        agent = _required_text(body, "agent")
        state_id = _text(body, "state_id")
        if state_id is not None:
            _run_id(state_id, '"state_id"')
        text = _text(body, "input")
        if text is not None and not text.strip():
            raise _BadRequest('"input" is empty: send the text the agent should answer.')
        limits = _limits(body)
        handle = await runs.start(agent, text, state_id=state_id, limits=limits)
        info = await runs.get(handle.state_id)
        return JSONResponse(run_json(info), 201, headers={"Location": f"/runs/{handle.state_id}"})

    async def listing(request: Request) -> Response:
        raw = request.query_params.get("limit")
        if raw is not None and not raw.isdigit():
            raise _BadRequest(f"limit must be a whole number, got {raw!r}.")
        found = await runs.list(limit=None if raw is None else int(raw))
        return JSONResponse([run_json(info) for info in found])

    async def show(request: Request) -> Response:
        return JSONResponse(run_json(await runs.get(_path_run_id(request))))

    async def events(request: Request) -> Response:
        after = request.headers.get("last-event-id") or request.query_params.get("after")
        following = runs.follow(_path_run_id(request), after=after or None)
        try:
            await following.ready()
        except ValueError as error:  # a bad event id, or a subagent's id
            raise _BadRequest(str(error)) from None

        def encode(item: Any) -> Sequence[bytes]:
            return (_sse(item.id, item.event.kind, item.event.model_dump_json()),)

        return StreamingResponse(
            _with_keepalive(following, encode, keepalive),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def agui_run(request: Request) -> Response:
        body = await _body(request, max_body)
        agent = request.path_params["agent"]
        run_input = _agui_input(body)
        thread = _run_id(run_input.thread_id, "threadId")
        if run_input.resume:
            since = (await runs.get(thread)).entries
            for answer in run_input.resume:
                approved, reason = _agui_verdict(answer.status, answer.payload)
                decide = runs.approve if approved else runs.deny
                await decide(thread, answer.interrupt_id, reason=reason)
        else:
            handle = await runs.start(agent, _agui_text(run_input), state_id=thread)
            since = handle.since
        following = runs.follow(thread, since=since)
        await following.ready()
        stream = agui.AGUIStream(thread_id=thread, run_id=run_input.run_id, root_id=thread)

        def encode(item: Followed) -> Sequence[bytes]:
            return [agui.encode(event) for event in stream.feed(item.event)]

        return StreamingResponse(
            _with_keepalive(following, encode, keepalive), media_type=agui.MEDIA_TYPE
        )

    async def vercel_run(request: Request) -> Response:
        body = await _body(request, max_body)
        agent = request.path_params["agent"]
        chat = _run_id(_required_text(body, "id"), '"id"')
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _BadRequest('Send "messages": the chat\'s UI messages, the newest last.')
        decisions = _vercel_decisions(cast("list[Any]", messages)[-1])
        if decisions:
            since = (await runs.get(chat)).entries
            for call_id, approved, reason in decisions:
                decide = runs.approve if approved else runs.deny
                await decide(chat, call_id, reason=reason)
        else:
            text = _vercel_text(cast("list[Any]", messages)[-1])
            handle = await runs.start(agent, text, state_id=chat)
            since = handle.since
        following = runs.follow(chat, since=since)
        await following.ready()
        stream = vercel.VercelStream(root_id=chat)

        async def chunks() -> AsyncIterator[bytes]:
            async for data in _with_keepalive(following, encode, keepalive):
                yield data
            for chunk in stream.end():
                yield vercel.encode(chunk)
            yield vercel.DONE

        def encode(item: Followed) -> Sequence[bytes]:
            return [vercel.encode(chunk) for chunk in stream.feed(item.event)]

        return StreamingResponse(chunks(), headers=vercel.HEADERS)

    async def cancel(request: Request) -> Response:
        await _body(request, max_body)
        return JSONResponse(run_json(await runs.cancel(_path_run_id(request))))

    async def decide(request: Request) -> Response:
        body = await _body(request, max_body)
        run_id, call_id = _path_run_id(request), request.path_params["call_id"]
        verdict = request.path_params["verdict"]
        if verdict not in ("approve", "deny"):
            raise _BadRequest(f"Decide with .../approve or .../deny, not {verdict!r}.", 404)
        decide = runs.approve if verdict == "approve" else runs.deny
        info = await decide(run_id, call_id, by=_text(body, "by"), reason=_text(body, "reason"))
        return JSONResponse(run_json(info))

    async def session(request: Request) -> Response:
        body = await _body(request, max_body)
        given = _required_text(body, "token")
        if token is None:
            return Response(status_code=204)  # nothing to sign in to
        if not _same(given, token):
            return JSONResponse({"error": "That is not the service's token."}, 401)
        answer = Response(status_code=204)
        answer.set_cookie(
            SESSION_COOKIE,
            token,
            path=request.scope.get("root_path") or "/",
            secure=request.url.scheme == "https",
            httponly=True,
            samesite="strict",
        )
        return answer

    extra: list[BaseRoute] = [Route("/session", _answering(session), methods=["POST"])]
    if viewer:
        extra.extend(_viewer_mount(runs, keepalive))
    extra.extend(routes)
    return Starlette(
        routes=[
            Route("/runs", _answering(start), methods=["POST"]),
            Route("/runs", _answering(listing), methods=["GET"]),
            Route("/runs/{run_id}", _answering(show), methods=["GET"]),
            Route("/runs/{run_id}/events", _answering(events), methods=["GET"]),
            Route("/runs/{run_id}/cancel", _answering(cancel), methods=["POST"]),
            Route("/runs/{run_id}/calls/{call_id}/{verdict}", _answering(decide), methods=["POST"]),
            Route("/agents/{agent}/agui", _answering(agui_run), methods=["POST"]),
            Route("/agents/{agent}/vercel", _answering(vercel_run), methods=["POST"]),
            *extra,
        ],
        middleware=[
            Middleware(_Guard, token=token, origins=frozenset(origins), hosts=frozenset(hosts))
        ],
    )
