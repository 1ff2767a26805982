"""Which store a command line names: a URL (`stores.open_store`) or a path.

The CLI's own rules on top of `stores.open_store`: a path works too (a ``.db`` file or a
FileStore folder), and the store must already exist, since reading never creates one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from stores import FileStore, SQLiteStore, open_store

__all__ = ("StoreNotFound", "StoreURLError", "open_existing")

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):")  # two letters at least: C: is a drive
_SQLITE_HEADER = b"SQLite format 3\x00"
_FORMS = (
    "sqlite:///runs.db, file:///var/runs, postgresql://user@host/db, memory:, a .db file or a"
    " FileStore folder"
)


class StoreURLError(ValueError):
    """A store URL that names no backend, or a path that is no store."""


class StoreNotFound(LookupError):
    """The store a command should read is not there."""


def _is_url(target: str) -> bool:
    return _SCHEME.match(target) is not None


def open_existing(target: str) -> Any:
    """The store a command reads: a URL, or a path (a ``.db`` file or a FileStore folder).

    The store must exist: a command that only reads never creates one.

    Raises:
        StoreURLError: A URL `stores.open_store` refuses, or a path that is neither form.
        StoreNotFound: Nothing is at the path.
    """
    if _is_url(target):
        try:
            store = open_store(target)
        except ValueError as error:
            raise StoreURLError(str(error)) from None
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
