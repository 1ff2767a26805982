"""Runs followed over HTTP (issue 28): `count` runs in one process, each followed by an SSE client.

A process of its own (so its memory is its own) serves `asgi_app(runs)` with uvicorn on
127.0.0.1, with a `MemoryStore`, and reads ``GET /runs/{id}/events`` with one httpx stream
per run, in the same event loop. Each run is a `FakeModel` agent: it first calls a tool that
waits at a gate, then `turns` calls of a tool that takes `gap` seconds, then answers.

1. All runs wait at the gate, every client connected: the runs are idle and followed. The
   process's RSS over what it held before the runs (server, client and one warmed-up run),
   divided by `count`, is the memory per idle followed run; its CPU time over a second of
   this, the cost of waiting.
2. The gate opens: each event's delay is when its client read it minus the event's `at` (when
   the run recorded it; the machine's clock): p50 and p99. Events per second: every event the
   clients read after the gate opened, over the time until the last stream ended.

The floor is the same process with a bare Starlette SSE endpoint per client instead, through
the same server and client: each stream sends the events the runs sent (as many, as large, in
as many bursts `gap` apart, each stamped with the time it is sent), after the same gate.

``python -m benchmarks.runs_bench [--quick]`` prints the rows; the process that serves is this
module too (``python -m benchmarks.runs_bench serve runs|floor COUNT TURNS GAP [SHAPE]``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import ssl
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request as HTTPRequest
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from orchestrator import Agent, tool
from orchestrator.apps import Runs, asgi_app
from orchestrator.models import Request
from orchestrator.testing import FakeModel, tool_call
from stores import MemoryStore

from .report import Metric

__all__ = ("Shape", "Side", "bench_runs", "main")

_SECONDS = 300.0
"""The most one phase may take; past it the phase fails."""
_SETTLE = 1.0
"""Seconds the idle runs are left before their memory is read (the waits back off); a
tenth of that for fewer than 100 runs."""


@dataclass(frozen=True, slots=True)
class Shape:
    """What each followed run sent: the floor sends as much, the same way."""

    before: int
    """Events each stream gave before the gate opened (the stored start of the run)."""
    after: int
    """Events each stream gave after."""
    size: int
    """Bytes of an event's data, on average."""


@dataclass(frozen=True, slots=True)
class Side:
    """What one phase (the runs, or the floor) measured."""

    p50_ms: float
    p99_ms: float
    events_per_s: float
    rss_per_run_kb: float
    idle_cpu: float
    """CPU seconds per second while every stream waited at the gate."""
    shape: Shape


# -- the runs --------------------------------------------------------------------------------------


class _Gate:
    """The gate every run (or floor stream) waits at, then passes once it opens."""

    def __init__(self) -> None:
        self._go: anyio.Event | None = None
        self.waiting = 0

    @property
    def go(self) -> anyio.Event:
        """The event that opens the gate (made in the running event loop)."""
        if self._go is None:
            self._go = anyio.Event()
        return self._go

    def close(self) -> None:
        """A closed gate again, that no one waits at."""
        self._go, self.waiting = anyio.Event(), 0


_gate = _Gate()


@tool
async def wait_at_gate() -> str:
    """Wait until the benchmark opens the gate."""
    _gate.waiting += 1
    await _gate.go.wait()
    return "open"


def _worker(turns: int, gap: float) -> Agent:
    @tool
    async def work(step: int) -> str:
        """Work for a while."""
        await anyio.sleep(gap)
        return f"step {step} done"

    def reply(request: Request) -> Any:
        results = sum(len(message.tool_results) for message in request.messages)
        if results == 0:
            return tool_call("wait_at_gate")
        if results <= turns:
            return tool_call("work", step=results)
        return "All done."

    replies: list[Callable[[Request], Any]] = [reply] * 1_000_000
    return Agent(FakeModel(replies), tools=[wait_at_gate, work], max_turns=turns + 3, name="worker")


# -- the clients -----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Read:
    """What one client read."""

    before: int = 0
    after: int = 0
    size: int = 0
    last: float = 0.0


class _Clients:
    """One httpx stream per URL, each reading SSE events and timing those after the gate.

    Each stream has a client of its own: httpx's connection pool looks at every connection it
    holds when a request starts or ends, so one client of 1,000 streams spent 59 of 75 s there.
    """

    def __init__(self, client: Callable[[], httpx.AsyncClient], count: int) -> None:
        self.client = client
        self.count = count
        self.opened = 0
        self.all_open = anyio.Event()
        self.go_at = float("inf")
        self.delays: list[float] = []
        self.reads: list[_Read] = []

    async def read(self, url: str) -> None:
        read = _Read()
        self.reads.append(read)
        async with self.client() as client, client.stream("GET", url) as response:
            response.raise_for_status()
            self.opened += 1
            if self.opened == self.count:
                self.all_open.set()
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                now = time.time()
                at = datetime.fromisoformat(json.loads(line[6:])["at"]).timestamp()
                read.size += len(line) - 6
                if at >= self.go_at:
                    read.after += 1
                    read.last = now
                    self.delays.append((now - at) * 1000)
                else:
                    read.before += 1


async def _until(condition: Callable[[], bool]) -> None:
    """Look every 10 ms until `condition()` holds (the phase's deadline bounds it)."""
    for _ in range(int(_SECONDS * 100)):
        if condition():
            return
        await anyio.sleep(0.01)
    raise TimeoutError("the benchmark waited too long for its servers or its runs")


def _rss() -> int:
    """This process's resident memory now, in bytes (Linux: /proc/self/statm)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _measure(
    app: Starlette,
    count: int,
    urls: Callable[[], Awaitable[list[str]]],
    warm_up: Callable[[httpx.AsyncClient], Awaitable[None]],
    idle: float,
) -> Side:
    """Serve `app`, warm up, follow the `urls()` streams through the gate; what was measured."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", backlog=4096)
    )
    tls = ssl.create_default_context()  # made once: httpx makes one per client otherwise

    def client() -> httpx.AsyncClient:
        timeout = httpx.Timeout(_SECONDS, connect=30.0)
        return httpx.AsyncClient(base_url=base, timeout=timeout, verify=tls, trust_env=False)

    clients = _Clients(client, count)
    held = baseline = 0
    idle_cpu = 0.0
    with anyio.fail_after(_SECONDS):
        async with anyio.create_task_group() as group:
            group.start_soon(server.serve)
            await _until(lambda: server.started)
            async with client() as warming:
                await warm_up(warming)
            gc.collect()
            baseline = _rss()
            async with anyio.create_task_group() as readers:
                for url in await urls():
                    readers.start_soon(clients.read, url)
                await clients.all_open.wait()
                await _until(lambda: _gate.waiting >= count)
                await anyio.sleep(_SETTLE if count >= 100 else _SETTLE / 10)
                gc.collect()
                held = _rss() - baseline
                cpu, wall = time.process_time(), time.perf_counter()
                await anyio.sleep(idle)
                idle_cpu = (time.process_time() - cpu) / (time.perf_counter() - wall)
                clients.go_at = time.time()
                _gate.go.set()
            server.should_exit = True
    reads = clients.reads
    events = sum(read.after for read in reads)
    took = max(read.last for read in reads) - clients.go_at
    delays = sorted(clients.delays)
    return Side(
        p50_ms=_percentile(delays, 0.5),
        p99_ms=_percentile(delays, 0.99),
        events_per_s=events / took,
        rss_per_run_kb=held / count / 1024,
        idle_cpu=idle_cpu,
        shape=Shape(
            before=round(statistics.mean(read.before for read in reads)),
            after=round(statistics.mean(read.after for read in reads)),
            size=round(
                sum(read.size for read in reads) / max(1, events + sum(r.before for r in reads))
            ),
        ),
    )


async def _serve_runs(count: int, turns: int, gap: float, idle: float) -> Side:
    """The runs' side: `count` runs of `_worker`, each followed over HTTP."""
    store = MemoryStore()
    async with Runs([_worker(turns, gap)], store, max_runs=count + 1) as runs:
        app = asgi_app(runs)

        async def warm_up(client: httpx.AsyncClient) -> None:
            _gate.go.set()
            handle = await runs.start("worker", "Warm up.")
            async with client.stream("GET", f"/runs/{handle.state_id}/events") as response:
                async for _ in response.aiter_lines():
                    pass
            await handle.wait()
            _gate.close()

        async def urls() -> list[str]:
            found: list[str] = []
            for number in range(count):
                handle = await runs.start("worker", f"Run {number}.")
                found.append(f"/runs/{handle.state_id}/events")
            return found

        return await _measure(app, count, urls, warm_up, idle)


# -- the floor -------------------------------------------------------------------------------------


def _floor_app(shape: Shape, turns: int, gap: float) -> Starlette:
    """A bare SSE endpoint that sends what a followed run sent, the same way."""
    padding = "x" * max(0, shape.size - len('{"at":"2026-01-01T00:00:00.000000+00:00","pad":""}'))

    def event(number: int) -> bytes:
        at = datetime.now(UTC).isoformat()
        data = json.dumps({"at": at, "pad": padding})
        return f"id: {number}\nevent: floor\ndata: {data}\n\n".encode()

    async def send() -> AsyncIterator[bytes]:
        _gate.waiting += 1
        for number in range(shape.before):
            yield event(number)
        await _gate.go.wait()
        bursts = turns + 1
        for number in range(shape.after):
            if number and number * bursts // shape.after != (number - 1) * bursts // shape.after:
                await anyio.sleep(gap)
            yield event(shape.before + number)

    async def events(request: HTTPRequest) -> Response:
        return StreamingResponse(send(), media_type="text/event-stream")

    return Starlette(routes=[Route("/floor/{number}/events", events, methods=["GET"])])


async def _serve_floor(count: int, turns: int, gap: float, idle: float, shape: Shape) -> Side:
    """The floor's side: `count` bare SSE streams, sending what the runs' streams sent."""
    app = _floor_app(shape, turns, gap)

    async def warm_up(client: httpx.AsyncClient) -> None:
        _gate.go.set()
        async with client.stream("GET", "/floor/warm/events") as response:
            async for _ in response.aiter_lines():
                pass
        _gate.close()

    async def urls() -> list[str]:
        return [f"/floor/{number}/events" for number in range(count)]

    return await _measure(app, count, urls, warm_up, idle)


# -- the rows --------------------------------------------------------------------------------------


def _percentile(ordered: Sequence[float], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def _phase(side: str, count: int, turns: int, gap: float, shape: Shape | None = None) -> Side:
    """Run one side in a process of its own; what it measured."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
    command = [sys.executable, "-m", "benchmarks.runs_bench", "serve", side]
    command += [str(count), str(turns), str(gap)]
    if shape is not None:
        command.append(json.dumps(asdict(shape)))
    done = subprocess.run(
        command, env=env, capture_output=True, timeout=_SECONDS + 60, check=False, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"the {side} process failed ({done.returncode}):\n{done.stderr}")
    found = json.loads(done.stdout)
    numbers = {key: float(value) for key, value in found.items() if key != "shape"}
    return Side(**numbers, shape=Shape(**found["shape"]))


def bench_runs(
    *,
    count: int = 1_000,
    turns: int = 3,
    gap: float = 0.05,
    progress: Callable[[str], None] = lambda text: None,
) -> list[Metric]:
    """The rows: `count` followed runs beside `count` bare SSE streams."""
    progress(f"runs: {count:,} runs of {turns} tool turns, each followed over HTTP ...")
    runs = _phase("runs", count, turns, gap)
    shape = runs.shape
    progress(
        f"runs: each stream gave {shape.before} events before the gate, {shape.after} after,"
        f" {shape.size} bytes each; the floor, {count:,} bare SSE streams sending as many ..."
    )
    floor = _phase("floor", count, turns, gap, shape)
    size = f"{count:,} runs"
    rows = [
        ("p50_ms", "added delay per event (read - recorded), p50", "ms"),
        ("p99_ms", "added delay per event, p99", "ms"),
        ("events_per_s", "events per second, every client", "/s"),
        ("rss_per_run_kb", "RSS per idle followed run (all in one process)", "KB"),
        ("idle_cpu", "CPU s per s while every run is idle and followed", "s"),
    ]
    metrics: list[Metric] = []
    for name, label, unit in rows:
        metrics += [
            Metric(f"runs.{name}", f"runs over SSE, {size}: {label}", getattr(runs, name), unit),
            Metric(
                f"runs.floor.{name}",
                f"  floor: bare Starlette SSE, {count:,} streams",
                getattr(floor, name),
                unit,
            ),
        ]
    metrics.append(
        Metric(
            "runs.p50.ratio",
            "  runs p50 delay / floor p50",
            runs.p50_ms / max(floor.p50_ms, 1e-6),
            "x",
        )
    )
    return metrics


def main(argv: Sequence[str] | None = None) -> int:
    """Print the rows (or, as ``serve ...``, be the process that serves one side)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["serve"]:
        side, count, turns, gap = args[1], int(args[2]), int(args[3]), float(args[4])
        idle = 1.0 if count >= 100 else 0.2
        if side == "runs":
            found = anyio.run(_serve_runs, count, turns, gap, idle, backend="asyncio")
        else:
            shape = Shape(**json.loads(args[5]))
            found = anyio.run(_serve_floor, count, turns, gap, idle, shape, backend="asyncio")
        sys.stdout.write(json.dumps(asdict(found)))
        return 0
    parser = argparse.ArgumentParser(prog="python -m benchmarks.runs_bench")
    parser.add_argument("--quick", action="store_true", help="a few runs, to check it runs")
    parser.add_argument("--count", type=int, default=None, help="how many runs (default 1,000)")
    parsed = parser.parse_args(args)
    count = parsed.count or (10 if parsed.quick else 1_000)
    for metric in bench_runs(count=count, progress=lambda text: print(text, file=sys.stderr)):
        sys.stdout.write(f"{metric.label:<75} {metric.value:10.2f} {metric.unit}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
