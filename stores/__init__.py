"""stores: where orchestrator States are kept.

`Store` (sync) and `AsyncStore` (async) are the two protocols; the backends are `MemoryStore`,
`FileStore` (JSONL files), `SQLiteStore` (sqlite3) and `AioSQLiteStore` (aiosqlite, async
only). Each also keeps agent memory beside the States (`MemoryBackend`, `AsyncMemoryBackend`:
the primitive under `orchestrator.Memory`). `stores.contract` is the test suite every backend
passes, for third-party ones too.
"""

from ._aiosqlite import AioSQLiteStore as AioSQLiteStore
from ._base import AsyncMemoryBackend as AsyncMemoryBackend
from ._base import AsyncStore as AsyncStore
from ._base import MemoryBackend as MemoryBackend
from ._base import StateInfo as StateInfo
from ._base import Store as Store
from ._base import bind_state as bind_state
from ._base import info_of as info_of
from ._base import recover_state as recover_state
from ._codec import FORMAT_VERSION as FORMAT_VERSION
from ._codec import chain_digests as chain_digests
from ._codec import check_chain as check_chain
from ._codec import check_format as check_format
from ._codec import decode_entry as decode_entry
from ._codec import encode_entry as encode_entry
from ._codec import first_digest as first_digest
from ._file import FileStore as FileStore
from ._memory import MemoryStore as MemoryStore
from ._offload import ThreadedAsync as ThreadedAsync
from ._sqlite import SQLiteStore as SQLiteStore

__all__ = (
    "FORMAT_VERSION",
    "AioSQLiteStore",
    "AsyncMemoryBackend",
    "AsyncStore",
    "FileStore",
    "MemoryBackend",
    "MemoryStore",
    "SQLiteStore",
    "StateInfo",
    "Store",
    "ThreadedAsync",
    "bind_state",
    "chain_digests",
    "check_chain",
    "check_format",
    "decode_entry",
    "encode_entry",
    "first_digest",
    "info_of",
    "recover_state",
)
