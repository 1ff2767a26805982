"""A crash, made reproducible: the store as it was on disk while a subagent call ran.

`crash_during` runs a lead whose subagent call is cut off at a chosen moment (`cut`), copies
the SQLite file at that moment (what a killed process leaves: every save before a tool runs
is on disk), then cancels the run. The copy is the store after the crash.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import anyio.to_thread

from orchestrator import Agent, Message, State

__all__ = ("copy_sqlite", "crash_during")


def copy_sqlite(source: Path, target: Path) -> None:
    """A consistent copy of the SQLite file `source` (its WAL included) at `target`."""
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
    src.close()
    dst.close()


async def crash_during(
    lead: Agent, task: str, db: Path, after: Path, cut: Callable[[], Awaitable[None]]
) -> str:
    """Run `lead` on `task` until `cut()` returns, copy `db` to `after`; the lead's id.

    `cut` waits for the moment to crash at (a tool started, a child ended).
    """
    state = State(messages=[Message.user(task)])
    async with anyio.create_task_group() as group:

        async def run() -> None:
            await lead.arun(state)

        group.start_soon(run)
        await cut()
        await anyio.to_thread.run_sync(copy_sqlite, db, after)
        group.cancel_scope.cancel()
    return state.id
