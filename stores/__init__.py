"""stores: where orchestrator States are kept.

`Store` (sync) and `AsyncStore` (async) are the two protocols; the backends are `MemoryStore`,
`FileStore` (JSONL files), `SQLiteStore` (sqlite3) and `AioSQLiteStore` (aiosqlite).
"""

from ._base import AsyncStore as AsyncStore
from ._base import StateInfo as StateInfo
from ._base import Store as Store
from ._base import info_of as info_of
from ._codec import FORMAT_VERSION as FORMAT_VERSION

__all__ = ("FORMAT_VERSION", "AsyncStore", "StateInfo", "Store", "info_of")
