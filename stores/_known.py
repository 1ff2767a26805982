"""The stored ends of histories one SQLite connection knows, so a save need not read them.

A save must know where the stored history of its State ends (`stores._memory.Tail`) to write
only the entries after it and to check that the State continues it. Reading that end back costs
a query and the encoding of one entry per State and save: with a thousand subagents saving each
turn, that was a third of the time the store took. A connection that wrote or read the end itself
already knows it, and it stays true as long as no other connection wrote to the file, which
SQLite counts for us: ``PRAGMA data_version`` changes exactly when another connection committed.
"""

from __future__ import annotations

from ._memory import Tail

__all__ = ("KnownTails",)


class KnownTails:
    """The tails one connection wrote or read, by State id; forgotten when another one writes.

    Only the `limit` most recently used are kept, so a long-lived store holds a bounded number
    (each keeps one entry and its encoded line).
    """

    __slots__ = ("_limit", "_tails", "_version")

    def __init__(self, limit: int = 4096) -> None:
        self._limit = limit
        self._tails: dict[str, Tail] = {}
        self._version: object = None

    def current(self, version: object) -> bool:
        """Whether the file is still at the `version` given to `trust`; else forget every tail.

        `version` is the file's ``data_version``, read inside the transaction once its lock is
        taken, so it cannot change before the commit.
        """
        if version == self._version:
            return True
        self._tails.clear()
        self._version = None
        return False

    def trust(self, version: object) -> None:
        """Keep tails while the file stays at `version` (its format was checked at it)."""
        self._version = version

    def get(self, state_id: str) -> Tail | None:
        """The known tail of `state_id`, or None (then read it from the file)."""
        return self._tails.get(state_id)

    def put(self, state_id: str, tail: Tail) -> None:
        """Remember `tail` once the transaction that wrote or read it committed."""
        tails = self._tails
        tails.pop(state_id, None)  # to the end: the most recently used is forgotten last
        tails[state_id] = tail
        if len(tails) > self._limit:
            del tails[next(iter(tails))]

    def forget(self, state_id: str) -> None:
        """Drop the tail of `state_id` (it was deleted through this connection)."""
        self._tails.pop(state_id, None)
