"""A Chat Completions server that counts requests per second and answers 429 above its limit.

It plays a provider's rate limit: a request that would make more than `per_second` requests
within the last second is answered 429 (and not counted as served). Every request's arrival
time is kept, so a test can measure the rate it was sent at. It runs in a thread, so processes
and event loops of any kind can call it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Generator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.models.wire_openai import text_reply

__all__ = ("CountingServer", "counting_server")

_REPLY = "".join(text_reply("ok").events or ()).encode()
_LIMITED = b'{"error": {"message": "Rate limit reached", "type": "requests", "code": null}}'


class CountingServer:
    """Serves until stopped; `served` and `limited` are the arrival times (monotonic)."""

    def __init__(self, per_second: int) -> None:
        self.per_second = per_second
        self.served: list[float] = []
        self.limited: list[float] = []
        self._window: deque[float] = deque()
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                allowed = owner.arrive(time.monotonic())
                body = _REPLY if allowed else _LIMITED
                self.send_response(200 if allowed else 429)
                kind = "text/event-stream" if allowed else "application/json"
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                if not allowed:
                    self.send_header("retry-after-ms", "50")
                self.end_headers()
                self.wfile.write(body)
                self.wfile.flush()

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        host, port = self._http.server_address[:2]
        self.url = f"http://{host!s}:{port}/v1"
        self._thread = threading.Thread(target=self._http.serve_forever, args=(0.01,), daemon=True)

    def start(self) -> None:
        """Serve in a background thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._http.shutdown()
        self._http.server_close()
        self._thread.join()

    def arrive(self, now: float) -> bool:
        """Count a request arriving at `now`; whether it is within the limit."""
        with self._lock:
            window = self._window
            while window and window[0] <= now - 1.0:
                window.popleft()
            if len(window) >= self.per_second:
                self.limited.append(now)
                return False
            window.append(now)
            self.served.append(now)
            return True

    def rate(self) -> float:
        """Requests served per second, from the first to the last."""
        served = sorted(self.served)
        return (len(served) - 1) / (served[-1] - served[0])


@contextmanager
def counting_server(per_second: int) -> Generator[CountingServer]:
    """A started `CountingServer`, stopped on exit."""
    server = CountingServer(per_second)
    server.start()
    try:
        yield server
    finally:
        server.stop()
