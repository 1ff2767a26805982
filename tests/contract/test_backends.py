"""Every backend of `stores` passes the one contract suite (`stores.contract`).

The SQLite backends are imported inside their fixtures, so this file works before they exist.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

from orchestrator import State
from stores._file import FileStore
from stores._memory import MemoryStore
from stores.contract import StoreContract


class TestMemoryStore(StoreContract):
    @pytest.fixture
    def store(self) -> MemoryStore:
        return MemoryStore()


class StatesOnly(MemoryStore):
    """A store that keeps States but no agent memory, like a third-party one may."""

    keeps_memory = False  # what `Memory` asks before it trusts the memory methods


class TestStoreWithoutMemory(StoreContract):
    keeps_memory = False

    @pytest.fixture
    def store(self) -> StatesOnly:
        return StatesOnly()


class TestFileStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> FileStore:
        return FileStore(tmp_path / "states")


def _backend(module: str, name: str, path: Path) -> Any:
    return getattr(importlib.import_module(module), name)(path)


class TestSQLiteStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Any:
        store = _backend("stores._sqlite", "SQLiteStore", tmp_path / "states.db")
        yield store
        close = getattr(store, "close", None)
        if close is not None:
            close()


class TestAioSQLiteStore(StoreContract):
    colours = ("async",)
    asyncio_only = True

    @pytest.fixture
    def store(self, tmp_path: Path) -> Any:
        return _backend("stores._aiosqlite", "AioSQLiteStore", tmp_path / "states.db")


def _guide_backend() -> type[Any]:
    """The `DictStore` the stores guide writes from public names: it must pass the contract."""
    page = Path(__file__).resolve().parents[2] / "docs" / "guides" / "stores.md"
    text = page.read_text(encoding="utf-8")
    start = text.index("```python\nimport threading\n")
    code = text[start + len("```python\n") : text.index("\n```", start)]
    code = code[: code.index("\nmine = DictStore()")]  # the class, not the example after it
    namespace: dict[str, Any] = {"State": State, "__name__": "guide_dict_store"}
    exec(compile(code, f"{page}:DictStore", "exec"), namespace)
    return namespace["DictStore"]


class TestGuideDictStore(StoreContract):
    colours = ("sync",)
    keeps_memory = False

    @pytest.fixture
    def store(self) -> Any:
        return _guide_backend()()
