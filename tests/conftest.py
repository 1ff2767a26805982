"""Shared test configuration: every async test runs on asyncio and on trio; shared fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from stores import FileStore, MemoryStore, SQLiteStore


def pytest_configure(config: pytest.Config) -> None:
    """Leave out the terminal size a parallel run's workers inherit.

    pytest-xdist starts its workers with ``COLUMNS=80`` and ``LINES=24``: the CLI's tests, and
    the commands they run, would then wrap their output at 80 columns, where a plain run (no
    terminal) gets the CLI's own 120.
    """
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run each `@pytest.mark.anyio` test once per backend."""
    return str(request.param)


@pytest.fixture(params=["memory", "file", "sqlite"])
def sync_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[MemoryStore | FileStore | SQLiteStore]:
    """Each store backend with sync methods, new and empty (the SQLite one closed after)."""
    if request.param == "memory":
        yield MemoryStore()
    elif request.param == "file":
        yield FileStore(tmp_path / "runs")
    else:
        with SQLiteStore(tmp_path / "runs.db") as store:
            yield store
