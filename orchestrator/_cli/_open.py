"""Which store a command line names: a URL or a path.

`open_store(url)` has the shape of `stores.open_store`, which is being written beside this: when
it lands, `open_store` here becomes that one and `open_existing` stays the CLI's own rule (a
path, and a store that must already exist, since reading never creates one).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from stores import FileStore, MemoryStore, SQLiteStore

__all__ = ("StoreNotFound", "StoreURLError", "open_existing", "open_store")

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):")  # two letters at least: C: is a drive
_SQLITE_HEADER = b"SQLite format 3\x00"
_FORMS = "sqlite:///runs.db, file:///var/runs, memory:, a .db file or a FileStore folder"


class StoreURLError(ValueError):
    """A store URL that names no backend, or one this version does not have."""


class StoreNotFound(LookupError):
    """The store a command should read is not there."""


def _url_path(url: str, scheme: str) -> str:
    rest = url[len(scheme) + 1 :]
    if not rest.startswith("//"):
        raise StoreURLError(
            f"Store URL {url!r} has no '//' after '{scheme}:': write {scheme}:///path"
            f" (e.g. {_example(scheme)})."
        )
    host, slash, path = rest[2:].partition("/")
    if host not in ("", "localhost"):
        raise StoreURLError(
            f"Store URL {url!r} names the host {host!r}: a {scheme} store is a local"
            f" {'file' if scheme == 'sqlite' else 'folder'}; write {_example(scheme)}."
        )
    if not slash or not path:
        raise StoreURLError(f"Store URL {url!r} has no path: write {_example(scheme)}.")
    # sqlite:///runs.db is relative and sqlite:////var/runs.db absolute (SQLAlchemy's rule);
    # file:///var/runs is the absolute path /var/runs (RFC 8089).
    return path if scheme == "sqlite" else "/" + path


def _example(scheme: str) -> str:
    return "sqlite:///runs.db" if scheme == "sqlite" else "file:///var/runs"


def open_store(url: str) -> Any:
    """The store a URL names: ``memory:``, ``file:///folder``, ``sqlite:///file.db``.

    Raises:
        StoreURLError: The URL has an unknown scheme, no path, or a host; or it is a PostgreSQL
            URL, which this version cannot open.
    """
    match = _SCHEME.match(url)
    scheme = match.group(1).lower() if match else ""
    if scheme == "memory":
        if url[len(scheme) + 1 :].strip("/"):
            raise StoreURLError(f"Store URL {url!r}: a memory store takes nothing after 'memory:'.")
        return MemoryStore()
    if scheme == "sqlite":
        return SQLiteStore(_url_path(url, scheme))
    if scheme == "file":
        return FileStore(_url_path(url, scheme))
    if scheme in ("postgres", "postgresql"):
        raise StoreURLError(
            f"Store URL {url!r} is a PostgreSQL store, which this version of orchestrator"
            " cannot open yet."
        )
    raise StoreURLError(f"Store URL {url!r} has an unknown scheme {scheme!r}: use {_FORMS}.")


def _is_url(target: str) -> bool:
    return _SCHEME.match(target) is not None


def open_existing(target: str) -> Any:
    """The store a command reads: a URL, or a path (a ``.db`` file or a FileStore folder).

    The store must exist: a command that only reads never creates one.

    Raises:
        StoreURLError: A URL `open_store` refuses, or a path that is neither form.
        StoreNotFound: Nothing is at the path.
    """
    if _is_url(target):
        store = open_store(target)
        path = getattr(store, "path", None)
        if path is not None and not Path(path).exists():
            raise StoreNotFound(f"No store at {target!r}: {str(path)!r} does not exist.")
        return store
    path = Path(target)
    if path.is_dir():
        return FileStore(path)
    if path.is_file():
        with path.open("rb") as file:
            header = file.read(len(_SQLITE_HEADER))
        if path.suffix == ".db" or header == _SQLITE_HEADER:
            return SQLiteStore(path)
        raise StoreURLError(
            f"{target!r} is a file, but not an SQLite store (no .db suffix, no SQLite header):"
            f" give {_FORMS}."
        )
    raise StoreNotFound(f"No store at {target!r}: give {_FORMS}.")
