"""A script that never closes its store still exits, and what it saved is on disk.

A newcomer forgets ``async with`` or ``close()``: sqlite3 forgives that, and so must every store.
Each test runs such a script in a real process (``sys.executable``) with a bounded ``timeout``,
so a process that hangs at exit fails the test instead of hanging the suite; then this process
loads the State the script saved.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator import State
from stores import AioSQLiteStore, FileStore, SQLiteStore

ROOT = Path(__file__).resolve().parents[2]

# The store is a module global that nothing closes, as in a first script. Its run has a tool
# call, so several save points write entries.
SCRIPT = """
import asyncio, json, sys
from orchestrator import Agent, Message, State, tool
from orchestrator.testing import FakeModel, tool_call
from stores import {store_class}

store = {store_class}({store_args})


@tool
def add(a: int, b: int) -> int:
    \"\"\"Add two numbers.\"\"\"
    return a + b


async def main() -> State:
    agent = Agent(FakeModel([tool_call("add", a=1, b=2), "3."]), tools=[add], store=store)
    state = State(id="unclosed", messages=[Message.user("1 + 2?")])
    await agent.arun(state)
    return state


state = asyncio.run(main())
print(json.dumps({{"kinds": [entry.kind for entry in state.history], "answer": state.answer}}))
"""


def run_unclosed(store_class: str, store_args: str, cwd: Path) -> dict[str, Any]:
    """Run the script with this store; it must exit by itself, with status 0."""
    code = textwrap.dedent(SCRIPT.format(store_class=store_class, store_args=store_args))
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=60,  # a bound for a hang, far above the ~1 s the script needs
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"a script that never closed its {store_class} did not exit: it hung")
    assert done.returncode == 0, done.stderr
    saved: dict[str, Any] = json.loads(done.stdout)
    assert saved["answer"] == "3."
    assert saved["kinds"].count("tool_result") == 1
    return saved


def assert_loaded(loaded: State, saved: dict[str, Any]) -> None:
    assert [entry.kind for entry in loaded.history] == saved["kinds"]
    assert loaded.answer == saved["answer"]
    assert loaded.pending_calls == ()


def test_an_unclosed_memory_store_exits(tmp_path: Path) -> None:
    run_unclosed("MemoryStore", "", tmp_path)  # nothing outlives the process to check


def test_an_unclosed_file_store_exits_with_its_state_saved(tmp_path: Path) -> None:
    saved = run_unclosed("FileStore", "'runs'", tmp_path)
    assert_loaded(FileStore(tmp_path / "runs").load("unclosed"), saved)


def test_an_unclosed_sqlite_store_exits_with_its_state_saved(tmp_path: Path) -> None:
    saved = run_unclosed("SQLiteStore", "'runs.db'", tmp_path)
    store = SQLiteStore(tmp_path / "runs.db")
    try:
        assert_loaded(store.load("unclosed"), saved)
    finally:
        store.close()


def test_an_unclosed_aiosqlite_store_exits_with_its_state_saved(tmp_path: Path) -> None:
    # aiosqlite's connection thread is not a daemon, and Python waits for such threads before
    # any finalizer runs: the process hung in threading._shutdown until the store made it one.
    saved = run_unclosed("AioSQLiteStore", "'runs.db'", tmp_path)

    async def load() -> State:
        async with AioSQLiteStore(tmp_path / "runs.db") as store:
            return await store.aload("unclosed")

    assert_loaded(anyio.run(load, backend="asyncio"), saved)
