"""Load for rate limits: a server that refuses above its rate, and processes sharing a limit.

- `CountingServer`: a Chat Completions server that counts requests per second and answers 429
  to a request that would make more than `per_second` within the last second; it keeps every
  arrival time, so the rate the requests came at can be measured. Given `hold`, it answers
  each request that many seconds after it came, and counts the requests in flight
  (`most_in_flight`). It runs in a thread, so processes and event loops of any kind can call it.
- ``python -m benchmarks.rate_load SPEC``: a process asking a model through a `RateLimit`
  shared in a store. SPEC is JSON: ``store`` (``"sqlite"`` or ``"postgres"``), ``where`` (the
  file, or the DSN), ``schema``, ``key``, ``rpm`` (or None), ``concurrent`` and ``lease``
  (optional), ``base_url``, ``requests`` (how many to
  send, or 0 to send until ``seconds`` ran out), ``seconds``, ``tasks`` (concurrent senders)
  and ``backend`` (``"asyncio"`` or ``"trio"``). It opens the store and prints ``ready``,
  waits for a line on stdin (so every process starts together), sends, then prints its counts
  as JSON: ``ok`` (answered), ``limited`` (429s), and ``acquire_us`` (how long each take of
  the limit's row took, in microseconds).
- `start_workers`: start those processes and wait until each is ready; `run_workers`: start
  them, let them go together, and read their counts.

The tests (tests/models/test_rate_processes.py) and the rate benchmark both use them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Generator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from orchestrator import Message, RateLimitError
from orchestrator.models import OpenAIModel, RateLimit, Request, RetryPolicy
from orchestrator.models._rate import AsyncRateLimits, RateAsk, RateTimes
from stores import PostgresStore, SQLiteStore

__all__ = (
    "CountingServer",
    "TimedTakes",
    "counting_server",
    "run_workers",
    "start_workers",
    "stop_workers",
)

ROOT = Path(__file__).resolve().parents[1]


def _sse(*chunks: object) -> bytes:
    return b"".join(f"data: {json.dumps(chunk)}\n\n".encode() for chunk in chunks)


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {"id": "c", "object": "chat.completion.chunk", "model": "gpt-4o", "choices": [choice]}


_REPLY = (
    _sse(
        _chunk({"role": "assistant", "content": "ok"}),
        _chunk({}, "stop"),
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "choices": [],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1},
        },
    )
    + b"data: [DONE]\n\n"
)


_LIMITED = b'{"error": {"message": "Rate limit reached", "type": "requests", "code": null}}'


class CountingServer:
    """Serves until stopped; `served` and `limited` are the arrival times (monotonic).

    Each request is answered `hold` seconds after it came (cut short when the server stops);
    `in_flight` counts the requests not answered yet, `most_in_flight` the most at once.
    """

    def __init__(self, per_second: int, hold: float = 0.0) -> None:
        self.per_second = per_second
        self.hold = hold
        self.served: list[float] = []
        self.limited: list[float] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self._window: deque[float] = deque()
        self._accepted: dict[int, float] = {}  # connection: when it was accepted
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                came = owner.came(self.request)
                owner.enter()
                try:
                    if owner.hold:
                        owner._stopping.wait(owner.hold)
                        came = time.monotonic()
                    allowed = owner.arrive(came)
                finally:
                    owner.leave()
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

        class Server(ThreadingHTTPServer):
            # Hundreds of senders connect at once (a client per request): the default backlog
            # of 5 refuses connections under load.
            request_queue_size = 1024

            def process_request(self, request: Any, client_address: Any) -> None:
                # Stamped as it is accepted, before its thread starts: a loaded machine that
                # is slow to run the handler threads does not bunch their arrival times.
                owner.accepted(request)
                super().process_request(request, client_address)

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client killed mid-request (the lease tests) is no error of the server

        self._http = Server(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        host, port = self._http.server_address[:2]
        self.url = f"http://{host!s}:{port}/v1"
        self._thread = threading.Thread(target=self._http.serve_forever, args=(0.01,), daemon=True)

    def start(self) -> None:
        """Serve in a background thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop serving (cutting held requests short) and close the socket."""
        self._stopping.set()
        self._http.shutdown()
        self._http.server_close()
        self._thread.join()

    def accepted(self, connection: object) -> None:
        """Note when `connection` was accepted: its first request's arrival."""
        with self._lock:
            self._accepted[id(connection)] = time.monotonic()

    def came(self, connection: object) -> float:
        """When the request just read on `connection` came: its accept for the first."""
        with self._lock:
            return self._accepted.pop(id(connection), None) or time.monotonic()

    def enter(self) -> None:
        """Count a request in flight."""
        with self._lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)

    def leave(self) -> None:
        """Count a request answered."""
        with self._lock:
            self.in_flight -= 1

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
        """Requests served per second: the slope of the count over time (least squares).

        A fit over every arrival, so one late first request or one early last one (a new
        connection, the machine's jitter) does not move it as it moves first-to-last.
        """
        served = sorted(self.served)
        count = len(served)
        mean_t = sum(served) / count
        mean_i = (count - 1) / 2
        covariance = sum((t - mean_t) * (i - mean_i) for i, t in enumerate(served))
        variance = sum((t - mean_t) ** 2 for t in served)
        return covariance / variance


@contextmanager
def counting_server(per_second: int, hold: float = 0.0) -> Generator[CountingServer]:
    """A started `CountingServer`, stopped on exit."""
    server = CountingServer(per_second, hold)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class TimedTakes:
    """A rate-limit table that notes how long each take takes."""

    def __init__(self, table: AsyncRateLimits) -> None:
        self.table = table
        self.micros: list[float] = []

    async def arate_take(self, key: str, ask: RateAsk) -> RateTimes:
        started = time.perf_counter()
        times = await self.table.arate_take(key, ask)
        self.micros.append((time.perf_counter() - started) * 1e6)
        return times

    async def arate_hold(self, key: str, seconds: float, tolerance: float) -> None:
        await self.table.arate_hold(key, seconds, tolerance)

    async def arate_settle(self, key: str, tokens: float) -> None:
        await self.table.arate_settle(key, tokens)

    async def arate_slot_take(self, key: str, most: int, holder: str, lease: float) -> int | None:
        return await self.table.arate_slot_take(key, most, holder, lease)

    async def arate_slot_renew(self, key: str, slot: int, holder: str, lease: float) -> bool:
        return await self.table.arate_slot_renew(key, slot, holder, lease)

    async def arate_slot_release(self, key: str, slot: int, holder: str) -> None:
        await self.table.arate_slot_release(key, slot, holder)


def _open_store(spec: dict[str, Any]) -> Any:
    if spec["store"] == "sqlite":
        return SQLiteStore(spec["where"])
    return PostgresStore(spec["where"], schema=spec["schema"], pool_size=2)


async def _main(spec: dict[str, Any]) -> dict[str, Any]:
    with _open_store(spec) as store:
        timed = TimedTakes(store)
        limit = RateLimit(
            requests_per_minute=spec["rpm"],
            concurrent=spec.get("concurrent"),
            lease=spec.get("lease", 30.0),
            store=timed,
            key=spec["key"],
        )
        model = OpenAIModel(
            "gpt-4o",
            base_url=spec["base_url"],
            api_key="sk-test",
            rate_limit=limit,
            retry=RetryPolicy(retries=0),
        )
        request = Request(system=None, messages=(Message.user("Hi"),))
        await store.arate_settle("warm-up", 0.0)  # the connection is open before the start
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        counts = {"ok": 0, "limited": 0}
        left = spec["requests"]
        deadline = time.monotonic() + spec["seconds"]

        async def sender() -> None:
            nonlocal left
            while (left > 0) if spec["requests"] else (time.monotonic() < deadline):
                left -= 1
                try:
                    await model.respond(request)
                except RateLimitError:
                    counts["limited"] += 1
                else:
                    counts["ok"] += 1

        async with anyio.create_task_group() as group:
            for _ in range(spec["tasks"]):
                group.start_soon(sender)
    return {**counts, "acquire_us": timed.micros}


def start_workers(specs: list[dict[str, Any]]) -> list[subprocess.Popen[str]]:
    """Start a worker per spec and wait until each is ready: a line to its stdin lets it go.

    The caller waits for them and closes their pipes (`run_workers` does both).
    """
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "benchmarks.rate_load", json.dumps(spec)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for spec in specs
    ]
    try:
        for worker in workers:
            assert worker.stdout is not None
            line = worker.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"a rate_load worker failed to start (it said {line!r})")
    except BaseException:
        stop_workers(workers)
        raise
    return workers


def stop_workers(workers: list[subprocess.Popen[str]]) -> None:
    """Kill the workers still running, and close every worker's pipes."""
    for worker in workers:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        for pipe in (worker.stdin, worker.stdout):
            if pipe is not None:
                pipe.close()


def run_workers(specs: list[dict[str, Any]], *, timeout: float = 120) -> list[dict[str, Any]]:
    """Start a worker per spec, let them go together once all are ready, and read their counts."""
    workers = start_workers(specs)
    try:
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        results: list[dict[str, Any]] = []
        for worker in workers:
            out, _ = worker.communicate(timeout=timeout)
            if worker.returncode != 0:
                raise RuntimeError(f"a rate_load worker failed (exit code {worker.returncode})")
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results
    finally:
        stop_workers(workers)


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    result = anyio.run(_main, spec, backend=spec["backend"])
    print(json.dumps(result), flush=True)
