"""Where an SQLite file's write-ahead log stands, read from its index without SQLite.

A commit in WAL mode with ``synchronous = NORMAL`` writes its pages to the log and does not
fsync, except in two cases: a checkpoint runs inside it (automatic checkpoints, which
`SQLiteStore` turns off), or the log starts again from its first frame (the log was empty, or
a checkpoint copied all of it back), when SQLite syncs the log's new header. `WalIndex` reads
the two numbers that tell: how many frames the log holds (``mxFrame``) and how many of them a
checkpoint copied back (``nBackfill``), from the shared-memory index (the ``-shm`` file) every
connection to the file maps. It is read with one ``pread`` and never waits on a lock.

The layout is SQLite's file format (https://sqlite.org/walformat.html), in native byte order:
the index header (48 bytes, twice), then the checkpoint info, whose first field is
``nBackfill``.
"""

from __future__ import annotations

import os
import struct

__all__ = ("WalIndex",)

_VERSION = 3007000  # iVersion of the index header
_HEADER = struct.Struct("=I4xI4xI")  # iVersion, iChange, mxFrame (byte 16)
_HEADER_SIZE = 48
_BACKFILL = struct.Struct("=I")  # nBackfill, first field after the two header copies
_READ = 2 * _HEADER_SIZE + _BACKFILL.size


class WalIndex:
    """The index of the write-ahead log of the SQLite file at `path`, opened for reading.

    Open it once a connection has the file open in WAL mode (the index file exists while any
    connection does). `frames()` gives ``(mxFrame, nBackfill)``, or None when the index cannot
    be read or is not one this module knows: then nothing may be assumed about the log.
    """

    __slots__ = ("_fd",)

    def __init__(self, path: str) -> None:
        """Open the index of the SQLite file at `path`.

        Raises:
            OSError: There is no index file (the file is not open in WAL mode), or this system
                has no ``os.pread`` (Windows).
        """
        if not hasattr(os, "pread"):
            raise OSError("os.pread is not available here")
        self._fd: int | None = os.open(path + "-shm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))

    def frames(self) -> tuple[int, int] | None:
        """``(frames in the log, frames a checkpoint copied back)``, or None if unreadable."""
        if self._fd is None:
            return None
        try:
            data = os.pread(self._fd, _READ, 0)
        except OSError:
            return None
        if len(data) < _READ:
            return None
        version, _change, frames = _HEADER.unpack_from(data, 0)
        if version != _VERSION or data[:_HEADER_SIZE] != data[_HEADER_SIZE : 2 * _HEADER_SIZE]:
            return None  # not initialised, or a writer is changing it right now
        (backfilled,) = _BACKFILL.unpack_from(data, 2 * _HEADER_SIZE)
        return frames, backfilled

    def close(self) -> None:
        """Close the index file; `frames()` then returns None."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
