"""`open_store(url)`: any backend of `stores` from a URL or a path, for configs, CLIs, workers."""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path
from typing import Any, TypeAlias

from ._file import FileStore
from ._memory import MemoryStore
from ._postgres import PostgresStore
from ._redact import redact_url, url_secrets
from ._sqlite import SQLiteStore

__all__ = ("OpenedStore", "open_store")

OpenedStore: TypeAlias = MemoryStore | FileStore | SQLiteStore | PostgresStore
"""What `open_store` opens: a backend that is both an `orchestrator.Store` and an `AsyncStore`."""

_SCHEMES = (
    "memory: (a MemoryStore)",
    "file:///path/to/folder (a FileStore)",
    "sqlite:///runs.db, relative, or sqlite:////abs/runs.db (an SQLiteStore)",
    "postgresql://user@host:5432/db (a PostgresStore; postgres:// too)",
    "or a path: a folder is a FileStore, a file an SQLiteStore",
)
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):")  # two letters at least: C: is a drive
_SQLITE_HEADER = b"SQLite format 3\x00"


def _is_url(target: str) -> bool:
    """Whether `target` is a URL (``scheme:...``, two letters at least) rather than a path."""
    return _SCHEME.match(target) is not None


def open_store(url: str, **options: Any) -> OpenedStore:
    """The store a URL or a path names; `options` go to its constructor (e.g. ``pool_size=4``).

    - ``memory:``: a `MemoryStore` (nothing outlives the process);
    - ``file:///var/runs``: a `FileStore` in that folder;
    - ``sqlite:///runs.db`` (relative to the working folder) or ``sqlite:////var/runs.db``
      (absolute: four slashes): an `SQLiteStore`;
    - ``postgresql://user:password@host:5432/db`` (or ``postgres://``): a `PostgresStore`;
      a ``schema=`` query parameter picks its PostgreSQL schema;
    - a path (``runs.db``, ``/var/runs``): a folder that exists is a `FileStore`, anything else
      an `SQLiteStore` (made on first use); a file that exists must have the ``.db`` suffix or
      be an SQLite database.

    The passwords of a URL never appear in the store's repr or in an error (`redact_url`).

    Raises:
        TypeError: `url` is not a str.
        ValueError: The scheme is not one of these (the message lists them), the URL lacks
            its path or has a query it cannot use, or the path is a file but no SQLite store.
    """
    if not isinstance(url, str):
        raise TypeError(f"open_store takes a URL (a str), got {type(url).__name__}.")
    if not _is_url(url):
        return _open_path(url, options)
    shown = redact_url(url)
    scheme, _, rest = url.partition(":")
    scheme = scheme.lower()
    if scheme == "memory" and rest in ("", "//"):
        return MemoryStore(**options)
    if scheme in ("file", "sqlite"):
        return _open_local(scheme, url, shown, options)
    if scheme in ("postgresql", "postgres"):
        dsn, schema = _without_schema(url)
        if schema is not None:
            options = {"schema": schema, **options}
        return PostgresStore(dsn, **options)
    raise ValueError(
        f"open_store cannot open {shown!r}: unknown scheme {scheme + ':'!r}. The URLs it"
        f" opens: {'; '.join(_SCHEMES)}."
    )


def _open_local(
    scheme: str, url: str, shown: str, options: dict[str, Any]
) -> FileStore | SQLiteStore:
    """The FileStore of a ``file:`` URL, the SQLiteStore of an ``sqlite:`` one."""
    parts = urllib.parse.urlsplit(url)
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise ValueError(
            f"{shown!r} has a query or fragment ({scheme}: URLs take none): write a"
            " character ? or # of the path as %3F or %23."
        )
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path:
            raise ValueError(
                f"{shown!r} names no local folder: write file:///absolute/path (three slashes)."
            )
        return FileStore(urllib.parse.unquote(parts.path), **options)
    rest = url.partition(":")[2]
    if not rest.startswith("///") or len(rest) == 3:
        raise ValueError(
            f"{shown!r} names no file: write sqlite:///runs.db (relative to the working"
            " folder) or sqlite:////var/runs.db (absolute)."
        )
    return SQLiteStore(urllib.parse.unquote(rest[3:]), **options)


def _open_path(target: str, options: dict[str, Any]) -> FileStore | SQLiteStore:
    """The store at a path: a folder is a FileStore, a file (or nothing yet) an SQLiteStore."""
    if not target:
        raise ValueError(
            f"open_store takes a URL or a path, got ''. It opens: {'; '.join(_SCHEMES)}."
        )
    if url_secrets(target):  # libpq's key=value form: never a file named after a password
        raise ValueError(
            f"open_store cannot open {redact_url(target)!r}: it looks like libpq's key=value"
            " DSN, and open_store takes URLs. Write postgresql://user:password@host:5432/db,"
            " or give the DSN to PostgresStore(dsn)."
        )
    path = Path(target)
    if path.is_dir():
        return FileStore(path, **options)
    if path.is_file():
        with path.open("rb") as file:
            header = file.read(len(_SQLITE_HEADER))
        if path.suffix != ".db" and header != _SQLITE_HEADER:
            raise ValueError(
                f"{redact_url(target)!r} is a file, but not an SQLite store (no .db suffix, no"
                f" SQLite header): give an SQLite file, a FileStore folder or a URL"
                f" ({'; '.join(_SCHEMES)})."
            )
    return SQLiteStore(path, **options)


def _without_schema(url: str) -> tuple[str, str | None]:
    """`url` without a ``schema=`` query parameter (libpq refuses it), and its value."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    schemas = [value for key, value in query if key == "schema"]
    if not schemas:
        return url, None
    kept = urllib.parse.urlencode([(key, value) for key, value in query if key != "schema"])
    return urllib.parse.urlunsplit(parts._replace(query=kept)), schemas[-1]
