"""Fixtures of the store tests: where a store of the test keeps its data."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def path(tmp_path: Path) -> Path:
    """The database file of an SQLite store (not created yet)."""
    return tmp_path / "states.db"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The folder of a `FileStore` (not created yet)."""
    return tmp_path / "states"
