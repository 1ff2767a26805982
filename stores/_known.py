"""What one SQLite connection knows of the States it stored, so a save need not read it back.

A save must know where the stored history of its State ends (`stores._memory.Tail`) to write
only the entries after it and to check that the State continues it. Reading that end back costs
a query and the encoding of one entry per State and save: with a thousand subagents saving each
turn, that was a third of the time the store took. A connection that wrote or read the end itself
already knows it, and it stays true as long as no other connection wrote to the file, which
SQLite counts for us: ``PRAGMA data_version`` changes exactly when another connection committed.
"""

from __future__ import annotations

from ._memory import Tail

__all__ = ("KnownStates",)


_LONGEST_LINE = 64 * 1024  # bytes of a last entry's encoded line worth keeping


class KnownStates:
    """What one connection wrote or read of each State, by id; forgotten when another writes.

    Only the `limit` most recently used are kept, so a long-lived store holds a bounded number
    (each keeps one entry and its encoded line).
    """

    __slots__ = ("_limit", "_states", "_version")

    def __init__(self, limit: int = 4096) -> None:
        self._limit = limit
        self._states: dict[str, Tail] = {}
        self._version: object = None

    def current(self, version: object) -> bool:
        """Whether the file is still at the `version` given to `trust`; else forget everything.

        `version` is the file's ``data_version``, read inside the transaction once its lock is
        taken, so it cannot change before the commit.
        """
        if version == self._version:
            return True
        self._states.clear()
        self._version = None
        return False

    def trust(self, version: object) -> None:
        """Keep what is known while the file stays at `version` (its format was checked at it)."""
        self._version = version

    def get(self, state_id: str) -> Tail | None:
        """What is known of `state_id`, or None (then read its tail from the file)."""
        return self._states.get(state_id)

    def put(self, state_id: str, tail: Tail) -> None:
        """Remember `tail` once the transaction that wrote or read it committed.

        A State whose last entry is long (an image, say) is not kept: its next save reads the
        end back, rather than this holding megabytes after the State is gone.
        """
        states = self._states
        states.pop(state_id, None)  # to the end: the most recently used is forgotten last
        if len(tail.line) > _LONGEST_LINE:
            return
        states[state_id] = tail
        if len(states) > self._limit:
            del states[next(iter(states))]

    def forget(self, state_id: str) -> None:
        """Drop what is known of `state_id`: it was deleted, or a write of it is under way."""
        self._states.pop(state_id, None)
