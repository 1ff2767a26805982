"""`open_store(url)`: any backend of `stores` from one URL, for configs, CLIs and workers."""

from __future__ import annotations

import urllib.parse
from typing import Any

from ._file import FileStore
from ._memory import MemoryStore
from ._postgres import PostgresStore
from ._sqlite import SQLiteStore

__all__ = ("open_store",)

_SCHEMES = (
    "memory: (a MemoryStore)",
    "file:///path/to/folder (a FileStore)",
    "sqlite:///runs.db, relative, or sqlite:////abs/runs.db (an SQLiteStore)",
    "postgresql://user@host:5432/db (a PostgresStore; postgres:// too)",
)


def open_store(url: str, **options: Any) -> Any:
    """The store a URL names; `options` go to its constructor (e.g. ``pool_size=4``).

    - ``memory:``: a `MemoryStore` (nothing outlives the process);
    - ``file:///var/runs``: a `FileStore` in that folder;
    - ``sqlite:///runs.db`` (relative to the working folder) or ``sqlite:////var/runs.db``
      (absolute: four slashes): an `SQLiteStore`;
    - ``postgresql://user:password@host:5432/db`` (or ``postgres://``): a `PostgresStore`;
      a ``schema=`` query parameter picks its PostgreSQL schema.

    The password of a URL never appears in the store's repr or in an error.

    Raises:
        TypeError: `url` is not a str.
        ValueError: The scheme is not one of these (the message lists them), or the URL
            lacks its path.
    """
    if not isinstance(url, str):
        raise TypeError(f"open_store takes a URL (a str), got {type(url).__name__}.")
    scheme, _, rest = url.partition(":")
    scheme = scheme.lower()
    if scheme == "memory" and rest in ("", "//"):
        return MemoryStore(**options)
    if scheme == "file":
        parts = urllib.parse.urlsplit(url)
        if parts.netloc not in ("", "localhost") or not parts.path:
            raise ValueError(
                f"{url!r} names no local folder: write file:///absolute/path (three slashes)."
            )
        return FileStore(urllib.parse.unquote(parts.path), **options)
    if scheme == "sqlite":
        if not rest.startswith("///") or len(rest) == 3:
            raise ValueError(
                f"{url!r} names no file: write sqlite:///runs.db (relative to the working"
                " folder) or sqlite:////var/runs.db (absolute)."
            )
        return SQLiteStore(urllib.parse.unquote(rest[3:]), **options)
    if scheme in ("postgresql", "postgres"):
        dsn, schema = _without_schema(url)
        if schema is not None:
            options = {"schema": schema, **options}
        return PostgresStore(dsn, **options)
    shown = _redacted(url)
    raise ValueError(
        f"open_store cannot open {shown!r}: unknown scheme {scheme + ':'!r}. The URLs it"
        f" opens: {'; '.join(_SCHEMES)}."
    )


def _without_schema(url: str) -> tuple[str, str | None]:
    """`url` without a ``schema=`` query parameter (libpq refuses it), and its value."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    schemas = [value for key, value in query if key == "schema"]
    if not schemas:
        return url, None
    kept = urllib.parse.urlencode([(key, value) for key, value in query if key != "schema"])
    return urllib.parse.urlunsplit(parts._replace(query=kept)), schemas[-1]


def _redacted(url: str) -> str:
    """`url` with any password replaced by ``***``."""
    try:
        parts = urllib.parse.urlsplit(url)
        password = parts.password
    except ValueError:
        return url.split("@")[-1] if "@" in url else url
    if not password:
        return url
    netloc = parts.netloc.replace(f":{password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
