"""A scripted HTTP/1.1 server on loopback that plays a provider API for the model tests.

It runs `http.server` in a thread, so it answers whichever event loop (asyncio or trio) the
client under test runs on. Each request takes the next scripted `Scripted` response: a JSON body
with a status and headers, or a `text/event-stream` of SSE events sent as chunks, optionally cut
off after a number of events to play a connection that drops mid-reply.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Generator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ("Recorded", "Scripted", "ScriptedServer", "serve", "sse")


def sse(*events: Mapping[str, Any] | str, named: bool = False) -> tuple[str, ...]:
    """Frame events as SSE: JSON objects (named by their ``type`` when `named`) or raw data."""
    frames: list[str] = []
    for event in events:
        if isinstance(event, str):
            frames.append(f"data: {event}\n\n")
            continue
        prefix = f"event: {event['type']}\n" if named else ""
        frames.append(f"{prefix}data: {json.dumps(event)}\n\n")
    return tuple(frames)


@dataclass(frozen=True)
class Scripted:
    """One scripted response: JSON (`body`) or an event stream (`events`)."""

    status: int = 200
    body: Any = None
    events: Sequence[str] | None = None
    headers: Mapping[str, str] = field(default_factory=dict[str, str])
    cut_after: int | None = None
    hold_after: int | None = None
    resume: threading.Event | None = None


@dataclass(frozen=True)
class Recorded:
    """One request the server received."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: Any


Script = Scripted | Callable[[Recorded], Scripted]


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    errors: list[BaseException]

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Keep handler errors (a client that hung up) for the test, off stderr."""
        import sys

        error = sys.exc_info()[1]
        if error is not None:
            self.errors.append(error)


class ScriptedServer:
    """The server: `push` responses, point a client at `url`, read `requests` afterwards.

    A scripted item is a `Scripted` response, or a function that builds one from the request.
    `hold_after` events, a stream waits for `resume` to be set before it goes on.
    """

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self._script: list[Script] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                """Stay quiet: the suite fails on anything written to stderr."""

            def do_POST(self) -> None:
                owner._handle(self)

            def do_GET(self) -> None:
                owner._handle(self)

        self._http = _QuietServer(("127.0.0.1", 0), Handler)
        self._http.errors = []
        host, port = self._http.server_address[:2]
        self.url = f"http://{host!s}:{port}"
        self._thread = threading.Thread(target=self._http.serve_forever, args=(0.01,), daemon=True)

    def push(self, *responses: Script) -> None:
        """Queue responses, answered in order, one per request."""
        with self._lock:
            self._script.extend(responses)

    def reset(self) -> None:
        """Forget the requests received and the responses not used yet (for a shared server)."""
        with self._lock:
            self.requests.clear()
            self._script.clear()

    @property
    def pending(self) -> int:
        """How many scripted responses are still unused."""
        with self._lock:
            return len(self._script)

    def start(self) -> None:
        """Serve in a background thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._http.shutdown()
        self._http.server_close()
        self._thread.join()

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        body: Any = json.loads(raw) if raw else None
        headers = {key.lower(): value for key, value in handler.headers.items()}
        recorded = Recorded(handler.command, handler.path, headers, body)
        with self._lock:
            self.requests.append(recorded)
            script = self._script.pop(0) if self._script else None
        scripted = script(recorded) if callable(script) else script
        if scripted is None:
            scripted = Scripted(500, {"error": {"message": "no scripted response left"}})
        if scripted.events is None:
            self._send_json(handler, scripted)
        else:
            self._send_events(handler, scripted, scripted.events)

    @staticmethod
    def _send_json(handler: BaseHTTPRequestHandler, scripted: Scripted) -> None:
        data = json.dumps(scripted.body).encode()
        handler.send_response(scripted.status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        for key, value in scripted.headers.items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(data)
        handler.wfile.flush()

    @staticmethod
    def _send_events(
        handler: BaseHTTPRequestHandler, scripted: Scripted, events: Sequence[str]
    ) -> None:
        handler.send_response(scripted.status)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Transfer-Encoding", "chunked")
        for key, value in scripted.headers.items():
            handler.send_header(key, value)
        handler.end_headers()
        for number, event in enumerate(events):
            if scripted.cut_after is not None and number >= scripted.cut_after:
                break
            if number == scripted.hold_after and scripted.resume is not None:
                scripted.resume.wait(timeout=30)
            data = event.encode()
            handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            handler.wfile.flush()
        if scripted.cut_after is not None:
            # Drop the connection without the last chunk: the client sees a broken stream.
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
            return
        handler.wfile.write(b"0\r\n\r\n")
        handler.wfile.flush()


@contextmanager
def serve() -> Generator[ScriptedServer]:
    """A started `ScriptedServer`, stopped on exit."""
    server = ScriptedServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
