"""Store benchmarks, per backend: append throughput, load time, and bytes per entry.

- append: one State, `entries` entries saved one turn (3 entries) at a time, as an Agent saves;
  only the saves are timed.
- load: one State of `entries` entries, saved once, then loaded (best of `repeats`).
- bytes per entry: what the store holds for that State (after closing it), per entry.
- recovering load (FileStore): a cut-off State loaded among 10 and among 10,000 others.

Each function takes a `Backend` and its sizes (a smoke test runs them tiny) and returns a dict of
numbers. Everything runs on asyncio: a sync backend is called through its sync methods, an
async one (``use_async``) through its ``a``-methods.
"""

from __future__ import annotations

import gc
import importlib
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from unittest import mock

import anyio

from orchestrator import (
    Message,
    Reply,
    RunStart,
    State,
    TextBlock,
    ToolCall,
    ToolResultBlock,
    Usage,
)
from orchestrator._record._recording import (
    begin_think,
    record_reply,
    record_run_start,
    record_tool_result,
)
from stores import encode_entry
from stores._file import FileStore
from stores._memory import MemoryStore
from stores.contract import crashed_pending

__all__ = (
    "Backend",
    "backends",
    "bench_append",
    "bench_load",
    "bench_recovering_load",
    "main",
    "record_turn",
)

_T = TypeVar("_T")
_USAGE = Usage(input_tokens=900, output_tokens=60, requests=1)
Call = Callable[..., Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Backend:
    """A store to measure: how to make one in a folder, and whether to await its methods."""

    name: str
    open: Callable[[Path], Any]
    use_async: bool = False


def _optional(module: str, cls: str) -> Callable[[Path], Any] | None:
    try:
        factory = getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError):
        return None
    return lambda folder: factory(folder / "states.db")


def backends() -> list[Backend]:
    """Every backend this installation has (the ``-async`` ones through their async twins)."""
    found = [
        Backend("memory", lambda _: MemoryStore()),
        Backend("file", FileStore),
        Backend("file-async", FileStore, use_async=True),
    ]
    sqlite = _optional("stores._sqlite", "SQLiteStore")
    if sqlite is not None:
        found += [Backend("sqlite", sqlite), Backend("sqlite-async", sqlite, use_async=True)]
    aiosqlite = _optional("stores._aiosqlite", "AioSQLiteStore")
    if aiosqlite is not None:
        found.append(Backend("aiosqlite", aiosqlite, use_async=True))
    return found


def record_turn(state: State, i: int) -> None:
    """Record one turn of 3 entries: a request, a reply calling a tool, the tool's result."""
    begin_think(state, model="fake")
    call = ToolCall(f"call_{i}", "read_file", {"path": f"src/module_{i % 50}.py"})
    text = f"Reading module {i % 50} to find where the config is parsed."
    record_reply(state, Reply(Message.assistant(text, (call,)), _USAGE, "tool_use", "fake"))
    result = f"def parse_{i}(text):\n    return json.loads(text)  # line {i}\n"
    record_tool_result(state, call, ToolResultBlock(call.id, (TextBlock(result),)), outcome="done")


def _new_state(state_id: str) -> State:
    return State(id=state_id, messages=[Message.user("Find where the config is parsed.")])


def _stored_bytes(store: Any, folder: Path) -> int:
    if isinstance(store, MemoryStore):  # the lines it keeps: each entry as it encodes it
        entries = (entry for info in store.list() for entry in store.entries(info.id))
        return sum(len(encode_entry(entry)) + 1 for entry in entries)
    return sum(item.stat().st_size for item in folder.rglob("*") if item.is_file())


def _run(backend: Backend, folder: Path, body: Callable[[Call], Awaitable[_T]]) -> tuple[_T, int]:
    """Run `body(call)` on asyncio, then close the store and measure the bytes it holds.

    ``await call(name, *args)`` calls the store's method `name`, or its ``a``-twin for an async
    backend.
    """
    store = backend.open(folder)

    async def call(name: str, *args: Any) -> Any:
        if backend.use_async:
            return await getattr(store, f"a{name}")(*args)
        return getattr(store, name)(*args)

    async def main() -> tuple[_T, int]:
        result = await body(call)
        if hasattr(store, "aclose"):
            await store.aclose()
        elif hasattr(store, "close"):
            store.close()  # a WAL is folded into the database
        return result, _stored_bytes(store, folder)

    return anyio.run(main)


def bench_append(backend: Backend, entries: int = 10_000) -> dict[str, float]:
    """Entries appended per second: one State, saved after each turn of 3 entries."""
    turns = max(1, entries // 3)

    async def body(call: Call) -> float:
        state = _new_state("append")
        await call("save", state)
        saving = 0.0
        for i in range(turns):
            record_turn(state, i)
            start = time.perf_counter()
            await call("save", state)
            saving += time.perf_counter() - start
        return saving

    with tempfile.TemporaryDirectory() as folder:
        seconds, _ = _run(backend, Path(folder), body)
    return {
        "entries": turns * 3,
        "seconds": seconds,
        "entries_per_second": turns * 3 / seconds,
        "us_per_save": seconds / turns * 1e6,
    }


def bench_load(backend: Backend, entries: int = 100_000, repeats: int = 3) -> dict[str, float]:
    """Load time of one State of about `entries` entries (best of `repeats`), bytes per entry."""
    state = _new_state("load")
    for i in range(max(1, (entries - 1) // 3)):
        record_turn(state, i)
    size = len(state.history)

    async def body(call: Call) -> float:
        await call("save", state)
        best = float("inf")
        for _ in range(repeats):
            gc.collect()
            start = time.perf_counter()
            loaded = await call("load", "load")
            best = min(best, time.perf_counter() - start)
            if len(loaded.history) != size:
                raise AssertionError(f"{backend.name} loaded {len(loaded.history)} of {size}")
        return best

    with tempfile.TemporaryDirectory() as folder:
        seconds, stored = _run(backend, Path(folder), body)
    return {
        "entries": size,
        "seconds": seconds,
        "entries_per_second": size / seconds,
        "bytes_per_entry": stored / size,
    }


def main(append_entries: int = 10_000, load_entries: int = 100_000) -> None:
    """Measure every backend and print one line each."""
    print(
        f"{'backend':<14}{'appends/s':>12}{'µs/save':>10}"
        f"{'load ' + format(load_entries, ',') + ' (s)':>20}{'bytes/entry':>13}"
    )
    for backend in backends():
        append = bench_append(backend, append_entries)
        load = bench_load(backend, load_entries)
        print(
            f"{backend.name:<14}{append['entries_per_second']:>12,.0f}"
            f"{append['us_per_save']:>10,.0f}{load['seconds']:>20.2f}"
            f"{load['bytes_per_entry']:>13,.0f}"
        )


if __name__ == "__main__":
    main()


def bench_recovering_load(others: int, repeats: int = 5) -> dict[str, float]:
    """FileStore: load a cut-off State (two children, two open calls) among `others` States.

    Recovery closes the open calls and lists the children they started; it reads the State's own
    list of children, so the time must not grow with the store. The other States are written
    with fsync turned off (setup only: it is not what is measured).
    """
    with tempfile.TemporaryDirectory(prefix="recovering_load_") as name:
        store = FileStore(Path(name))
        with mock.patch("os.fsync"):
            store.save(crashed_pending("lead"))
            for kid in ("kid-a", "kid-b"):
                child = State(id=kid, messages=[Message.user("sub task")])
                record_run_start(child, RunStart(parent_id="lead", parent_call_id="c2"))
                store.save(child)
            for i in range(others):
                store.save(State(id=f"other-{i}", messages=[Message.user(f"task {i}")]))
        times: list[float] = []
        for _ in range(repeats):
            fresh = FileStore(Path(name))  # nothing known: what a new process pays
            start = time.perf_counter()
            loaded = fresh.load("lead")
            times.append(time.perf_counter() - start)
            if len(loaded.pending_calls) != 0:
                raise AssertionError("the load did not recover the cut-off calls")
    return {"states": float(others + 3), "ms": min(times) * 1000}
