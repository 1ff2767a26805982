"""The file operations of the file-backed stores: locks, whole reads and writes, the last line.

`FileStore` and the feeds of its trees (`stores._file_feed`) share them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = (
    "FILE_MODE",
    "OPEN_FLAGS",
    "flock",
    "fsync_folder",
    "last_line",
    "read_all",
    "read_at",
    "write_all",
    "write_new_file",
)

FILE_MODE = 0o600
OPEN_FLAGS = getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)  # no newline translation
_CHUNK = 64 * 1024

if sys.platform == "win32":  # pragma: no cover - no flock, no folder fsync on Windows

    def flock(fd: int, *, exclusive: bool) -> None:
        pass

    def fsync_folder(path: Path) -> None:
        pass

else:
    import fcntl

    def flock(fd: int, *, exclusive: bool) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)

    def fsync_folder(path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | OPEN_FLAGS)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_at(fd: int, size: int, offset: int) -> bytes:
    # lseek and read, not pread, which Windows lacks; each call opens its own descriptor.
    os.lseek(fd, offset, os.SEEK_SET)
    parts: list[bytes] = []
    while size > 0:
        part = os.read(fd, size)
        if not part:
            break
        parts.append(part)
        size -= len(part)
    return b"".join(parts)


def read_all(fd: int) -> bytes:
    return read_at(fd, os.fstat(fd).st_size, 0)


def write_new_file(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | OPEN_FLAGS, FILE_MODE)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def last_line(fd: int, size: int) -> tuple[int, bytes | None]:
    """Where the complete lines of the log end, and the last complete line (None if none).

    Reads backwards from the end, only as far as the last line reaches.
    """
    start, buffer = size, b""
    while True:
        newline = buffer.rfind(b"\n")
        if newline >= 0:
            before = buffer.rfind(b"\n", 0, newline)
            if before >= 0:
                return start + newline + 1, buffer[before + 1 : newline]
            if start == 0:
                return newline + 1, buffer[:newline]
        elif start == 0:
            return 0, None
        step = min(start, max(_CHUNK, len(buffer)))
        start -= step
        buffer = read_at(fd, step, start) + buffer
