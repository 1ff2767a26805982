"""Shared test configuration: every async test runs on asyncio and on trio; shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stores import FileStore, MemoryStore, SQLiteStore


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
