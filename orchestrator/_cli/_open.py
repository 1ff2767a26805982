"""Which store a command line names: a URL or a path, opened by `stores.open_store`.

The CLI's own rule on top of `stores.open_store` (which opens paths too): the store must already
exist, since reading never creates one, and a folder must hold a FileStore's States.
"""

from __future__ import annotations

from pathlib import Path

from stores import FileStore, OpenedStore, SQLiteStore, open_store, redact_url

__all__ = ("StoreNotFound", "StoreURLError", "open_existing")

_FORMS = (
    "sqlite:///runs.db, file:///var/runs, postgresql://user@host/db, memory:, a .db file or a"
    " FileStore folder"
)


class StoreURLError(ValueError):
    """A store URL that names no backend, or a path that is no store."""


class StoreNotFound(LookupError):
    """The store a command should read is not there."""


def open_existing(target: str) -> OpenedStore:
    """The store a command reads: a URL, or a path (a ``.db`` file or a FileStore folder).

    The store must exist: a command that only reads never creates one. Messages show `target`
    without its passwords (`stores.redact_url`).

    Raises:
        StoreURLError: A URL or path `stores.open_store` refuses, or a folder that holds
            something other than a FileStore's States.
        StoreNotFound: Nothing is at the path.
    """
    shown = redact_url(target)
    try:
        store = open_store(target)
    except ValueError as error:
        raise StoreURLError(str(error)) from None
    if not isinstance(store, FileStore | SQLiteStore):  # a server's, or memory's: no path
        return store
    path = store.path
    if not Path(path).exists():
        where = "" if str(path) == target else f"{redact_url(str(path))!r} does not exist;"
        raise StoreNotFound(f"No store at {shown!r}: {where} give {_FORMS}.")
    if isinstance(store, FileStore) and not _holds_states(store):
        raise StoreURLError(
            f"{shown!r} is a folder, but not a FileStore: it holds no States (no <id>/info.json),"
            f" only other files. Give {_FORMS}."
        )
    return store


def _holds_states(store: FileStore) -> bool:
    """Whether a FileStore's folder holds States, or nothing but the store's own hidden files.

    A folder of other files (a project, a home folder) is no store: reading it would list
    nothing and say no more.
    """
    if store.list(limit=1):
        return True
    return not any(not child.name.startswith(".") for child in store.path.iterdir())
