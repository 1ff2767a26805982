"""``orchestrator view``: a read-only web page on 127.0.0.1 showing the runs of a store.

The server is the standard library's `http.server` (`ThreadingHTTPServer`): the viewer is one
person's local page that asks for a few JSON documents, so a dependency-free server that ships
with Python is enough, and ``pip install orchestrator`` stays as small as it is. The page is
plain HTML, CSS and JavaScript shipped in the package (``viewer/``), with no build step and
nothing fetched from elsewhere.

What it serves:

- ``/``: the page; ``/static/NAME``: its script and style sheet;
- ``/api/runs``: the runs (States no tool call started), the most recently updated first;
  ``?q=&agent=&status=&since=&until=`` keeps those that match (`RunFilter`);
- ``/api/runs/ID``: the tree of the run ``ID`` and its timeline (`timeline_data`);
- ``/api/states/ID``: one State: what ``show --json`` prints and its messages.

It only reads: it never saves, deletes or changes anything in the store, and it answers GET
and HEAD only. It listens on 127.0.0.1 alone and answers only requests addressed to that
address or to ``localhost`` (so a web page elsewhere cannot reach it through DNS rebinding), and
its Content-Security-Policy lets the page load and fetch from the viewer itself only.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Generator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from orchestrator import OrchestratorError, StateInfo
from stores import redact_url
from stores.backend import validate_id

from ._jsontext import dumps
from ._reading import Readable, agent_of, read_tree
from ._search import RunFilter
from ._timeline import timeline_data
from ._views import info_data, messages_data, prompt_holders, state_data

__all__ = (
    "HOST",
    "SECURITY_HEADERS",
    "STATIC_TYPES",
    "Viewer",
    "ViewerServer",
    "running",
    "serve",
    "viewer_answer",
)

HOST = "127.0.0.1"
_RUNS_SHOWN = 200  # the page lists this many runs unless it asks for more
STATIC_TYPES = {
    "index.html": "text/html; charset=utf-8",
    "viewer.js": "text/javascript; charset=utf-8",
    "viewer.css": "text/css; charset=utf-8",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self';"
        " img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_ROUTE = re.compile(r"/api/(runs|states)(?:/([^/]+))?")


class NotFound(LookupError):
    """What a request asked for is not there: HTTP 404."""


class Viewer:
    """What the page shows of one store, as JSON: read at each request, never cached.

    A run that is still going shows its new entries when the page reloads. One lock keeps the
    store to one reader at a time, whichever backend it is.

    Args:
        store: An open store (`stores.SQLiteStore`, `stores.FileStore`, ...).
        name: How the store was named on the command line, shown on the page without its
            passwords (`stores.redact_url`).
    """

    def __init__(self, store: Readable, name: str) -> None:
        self.store = store
        self.name = redact_url(name)
        self._lock = threading.Lock()

    def runs(self, limit: int = _RUNS_SHOWN, where: RunFilter | None = None) -> dict[str, Any]:
        """The runs of the store, the most recently updated first, at most `limit` of them.

        `where` keeps the runs that match it; ``total`` counts the runs that match.
        """
        where = where or RunFilter()
        with self._lock:
            infos: list[StateInfo] = self.store.list()
            roots = [info for info in infos if info.parent_id is None]
            if where.empty:
                total = len(roots)
                shown = roots[:limit] if limit else roots
                runs = [info_data(info, agent=agent_of(self.store, info)) for info in shown]
            else:
                every = (info_data(info, agent=agent_of(self.store, info)) for info in roots)
                found = [run for run in every if where.matches(run)]
                total = len(found)
                runs = found[:limit] if limit else found
        return {"store": self.name, "states": len(infos), "total": total, "runs": runs}

    def run(self, state_id: str) -> dict[str, Any]:
        """The tree under the State `state_id` and its timeline."""
        with self._lock:
            info = self._find(self._infos(), state_id)
            root = read_tree(self.store, info)
        return {"id": info.id, "tree": root.data(), "timeline": timeline_data(root)}

    def state(self, state_id: str) -> dict[str, Any]:
        """One State as ``show --json`` has it, with its messages and the id of its run."""
        with self._lock:
            infos = self._infos()
            info = self._find(infos, state_id)
            state = self.store.load(info.id)
            holders = prompt_holders(state, self.store.load)  # a child names its tree's prompts
        root = info
        seen = {root.id}
        while root.parent_id in infos and root.parent_id not in seen:
            root = infos[root.parent_id]
            seen.add(root.id)
        data = state_data(state, holders=holders)
        data["messages"] = messages_data(state.messages)
        data["run_id"] = root.id
        return data

    def _infos(self) -> dict[str, StateInfo]:
        return {info.id: info for info in self.store.list()}

    def _find(self, infos: dict[str, StateInfo], state_id: str) -> StateInfo:
        validate_id(state_id, "State id")
        info = infos.get(state_id)
        if info is None:
            raise NotFound(f"No State {state_id!r} in {self.name}.")
        return info


class ViewerServer(ThreadingHTTPServer):
    """The HTTP server of a `Viewer`, on 127.0.0.1.

    Each request runs in a thread of its own (a browser opens a few connections at once);
    those threads are daemons, so Ctrl+C never waits for an idle browser connection.
    """

    daemon_threads = True

    def __init__(self, viewer: Viewer, port: int = 0) -> None:
        self.viewer = viewer
        super().__init__((HOST, port), _Handler)

    @property
    def port(self) -> int:
        """The port it listens on (the one the system picked for port 0)."""
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        """The page's address."""
        return f"http://{HOST}:{self.port}/"


class _Handler(BaseHTTPRequestHandler):
    timeout = 10  # seconds an idle connection may hold its thread
    server_version = "orchestrator-viewer"
    sys_version = ""  # no Python version in the Server header

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet: the command prints its address and nothing per request."""

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, *, body: bool) -> None:
        port = self._server.port
        host = (self.headers.get("Host") or "").lower()
        if host not in (f"{HOST}:{port}", f"localhost:{port}"):
            self._json(HTTPStatus.FORBIDDEN, {"error": f"Unknown host {host!r}."}, body)
            return
        parts = urlsplit(self.path)
        status, kind, data = viewer_answer(self._server.viewer, parts.path, parts.query)
        self._send(status, kind, data, body)

    @property
    def _server(self) -> ViewerServer:
        server = self.server
        assert isinstance(server, ViewerServer)
        return server

    def _json(self, status: HTTPStatus, data: Any, body: bool) -> None:
        text = dumps(data)
        self._send(status, "application/json; charset=utf-8", text.encode(), body)

    def _send(self, status: HTTPStatus, kind: str, data: bytes, body: bool) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        for name, value in SECURITY_HEADERS.items():
            self.send_header(name, value)
        self.end_headers()
        if body:
            self.wfile.write(data)


_JSON = "application/json; charset=utf-8"


def viewer_answer(
    viewer: Viewer, path: str, query: str = "", *, live: bool = False
) -> tuple[HTTPStatus, str, bytes]:
    """The answer to a GET of `path` (from the page's root) of the viewer: status, type, body.

    Whatever serves the page calls this (the command's own server, or `orchestrator.apps`'s
    app, where the page is `live`: it follows each run's events instead of a Reload button) and
    adds `SECURITY_HEADERS`. It reads the store, so call it off the event loop.
    """
    if path in ("/", "/index.html"):
        return _file("index.html")
    if path.startswith("/static/"):
        return _file(path.removeprefix("/static/"))
    if path == "/api/config":
        return HTTPStatus.OK, _JSON, dumps({"live": live}).encode()
    route = _ROUTE.fullmatch(path)
    if route is None:
        return _error(HTTPStatus.NOT_FOUND, f"Nothing at {path}.")
    what, state_id = route.groups()
    try:
        if what == "runs" and state_id is None:
            limit = parse_qs(query).get("limit", [str(_RUNS_SHOWN)])[-1]
            if not limit.isdigit():
                raise ValueError(f"limit must be a whole number, got {limit!r}.")
            data = viewer.runs(int(limit), RunFilter.parse(query))
        elif state_id is None:
            raise NotFound("Give a State id: /api/states/ID.")
        elif what == "runs":
            data = viewer.run(state_id)
        else:
            data = viewer.state(state_id)
    except LookupError as error:
        return _error(HTTPStatus.NOT_FOUND, _line(error))
    except (OrchestratorError, ValueError) as error:
        # A bad id, or a State or store that cannot be read (damage): said, not crashed on.
        return _error(HTTPStatus.UNPROCESSABLE_ENTITY, _line(error))
    except Exception as error:  # one request fails; the viewer goes on serving
        return _error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(error).__name__}: {_line(error)}")
    return HTTPStatus.OK, _JSON, dumps(data).encode()


def _file(name: str) -> tuple[HTTPStatus, str, bytes]:
    kind = STATIC_TYPES.get(name)
    if kind is None:
        return _error(HTTPStatus.NOT_FOUND, f"No file {name!r}.")
    data = resources.files(__package__ or "orchestrator._viewing").joinpath("viewer", name)
    return HTTPStatus.OK, kind, data.read_bytes()


def _error(status: HTTPStatus, message: str) -> tuple[HTTPStatus, str, bytes]:
    return status, _JSON, dumps({"error": message}).encode()


def _line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def serve(viewer: Viewer, port: int, ready: Callable[[str], None]) -> None:
    """Serve `viewer` on 127.0.0.1:`port` until Ctrl+C; `ready(url)` is called once listening.

    Raises:
        OSError: The port cannot be listened on (it is taken, or not allowed).
    """
    server = ViewerServer(viewer, port)
    try:
        ready(server.url)
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass  # Ctrl+C: the way to stop it
    finally:
        server.server_close()


@contextlib.contextmanager
def running(viewer: Viewer, port: int = 0) -> Generator[ViewerServer]:
    """A `ViewerServer` serving in a thread while the block runs; stopped and closed after."""
    server = ViewerServer(viewer, port)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        thread.join()
        server.server_close()
