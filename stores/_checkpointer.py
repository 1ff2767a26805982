"""`Checkpointer`: copies an SQLite file's write-ahead log back into the file, off the turn.

`SQLiteStore` turns SQLite's automatic checkpoints off (one runs inside the commit that finds
the log long, with its fsyncs, so a save would wait for it) and wakes its checkpointer once the
log holds `CHECKPOINT_FRAMES` frames. The checkpointer is a thread of the store, like
aiosqlite's connection thread: started at its first wake, stopped and joined by the store's
`close`. Each pass, in that thread:

1. copies the log back into the file with a connection of its own (PASSIVE: saves go on
   meanwhile, on the event loop too), twice: the second pass copies what was committed
   during the first;
2. then runs the store's `finish` (`SQLiteStore` holds its lock there, so none of its saves
   commits meanwhile): it copies what was committed during the second pass and starts the
   log again.

A pass that fails (an I/O error, a lock another process holds) is given up: the next commit
that finds the log long wakes the checkpointer again. The checkpointer holds the store weakly
(through `finish`), so a store dropped without `close` is still collected, and its thread ends.
"""

from __future__ import annotations

import sqlite3
import threading
import weakref
from collections.abc import Callable

from ._sql import CHECKPOINT, CHECKPOINT_FRAMES, SET_SYNCHRONOUS
from ._wal import WalIndex

__all__ = ("Checkpointer",)


class Checkpointer:
    """Checkpoints the SQLite file at `path` in a thread of its own, each time it is woken.

    `finish` is called after each pass of its own connection, in its thread: the store copies
    the rest of the log and starts it again there, with its writes held back. `finish` is held
    weakly when it is a bound method: once its object is collected, the thread ends.
    """

    __slots__ = ("_closed", "_due", "_finish", "_path", "_thread", "_wake")

    def __init__(self, path: str, finish: Callable[[], None]) -> None:
        """Checkpoint the file at `path`; nothing starts until the first `wake`."""
        self._path = path
        self._finish: Callable[[], Callable[[], None] | None] = (
            weakref.WeakMethod(finish) if hasattr(finish, "__self__") else lambda: finish
        )
        self._wake = threading.Condition()
        self._due = False
        self._closed = False
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        """Run a pass soon (start the thread if it is not running); return at once.

        A wake while a pass runs asks for one more pass after it. After `close`, nothing.
        """
        with self._wake:
            if self._closed:
                return
            self._due = True
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"checkpoint {self._path}", daemon=True
                )
                self._thread.start()
            else:
                self._wake.notify()

    def close(self, *, join: bool = True) -> None:
        """Stop the thread: a pass under way ends first, no other starts; wait for it (`join`)."""
        with self._wake:
            self._closed = True
            thread = self._thread
            self._wake.notify()
        if join and thread is not None and thread is not threading.current_thread():
            thread.join()

    def _next(self) -> bool:
        """Wait until a pass is due (True) or the checkpointer is closed (False)."""
        with self._wake:
            while not self._due and not self._closed:
                self._wake.wait()
            self._due = False
            return not self._closed

    def _run(self) -> None:
        connection: sqlite3.Connection | None = None
        wal: WalIndex | None = None
        try:
            while self._next():
                try:
                    if connection is None:
                        connection = sqlite3.connect(self._path, isolation_level=None)
                        connection.execute(SET_SYNCHRONOUS)
                    if wal is None:
                        wal = WalIndex(self._path)
                    if not self._pass(connection, wal):
                        return  # the store is gone
                except (sqlite3.Error, OSError):
                    # Given up: the log is copied back by the next pass, which the next commit
                    # that finds it long asks for (and SQLite copies all of it at the close).
                    pass
        finally:
            if wal is not None:
                wal.close()
            if connection is not None:
                connection.close()

    def _pass(self, connection: sqlite3.Connection, wal: WalIndex) -> bool:
        """One pass, if the log is still long; False if the store is gone.

        A method of its own, so that no variable of the thread's loop holds the store while
        it waits for the next wake.
        """
        frames = wal.frames()
        if frames is None or frames[0] < CHECKPOINT_FRAMES:
            return True  # started again since the wake (by the pass before)
        # Twice: the second copies what was committed during the first (up to a few hundred
        # frames), so `finish`, which holds saves back, copies little.
        connection.execute(CHECKPOINT).fetchall()
        connection.execute(CHECKPOINT).fetchall()
        finish = self._finish()
        if finish is None:
            return False
        finish()
        return True
