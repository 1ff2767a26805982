"""stores: where orchestrator States are kept.

The backends are `MemoryStore`, `FileStore` (JSONL files), `SQLiteStore` (sqlite3),
`AioSQLiteStore` (aiosqlite, async only) and `PostgresStore` (psycopg 3, the
``orchestrator[postgres]`` extra); `open_store(url)` opens any of them from a URL or a path,
and `redact_url(url)` shows a URL without its passwords. They implement the protocols of
`orchestrator` (`orchestrator.Store`, `orchestrator.AsyncStore`) and keep agent memory beside
the States (`orchestrator.MemoryBackend`, the primitive under `orchestrator.Memory`), reading
States only through `stores.backend.storage_view`.
`stores.backend` holds what only a backend needs, for third-party ones too; `stores.contract`
is the test suite every backend passes.
"""

from ._aiosqlite import AioSQLiteStore as AioSQLiteStore
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
from ._open import OpenedStore as OpenedStore
from ._open import open_store as open_store
from ._postgres import PostgresStore as PostgresStore
from ._redact import redact_url as redact_url
from ._redact import url_secrets as url_secrets
from ._sqlite import SQLiteStore as SQLiteStore

__all__ = (
    "FORMAT_VERSION",
    "AioSQLiteStore",
    "FileStore",
    "MemoryStore",
    "OpenedStore",
    "PostgresStore",
    "SQLiteStore",
    "ThreadedAsync",
    "chain_digests",
    "check_chain",
    "check_format",
    "decode_entry",
    "encode_entry",
    "first_digest",
    "open_store",
    "redact_url",
    "url_secrets",
)
