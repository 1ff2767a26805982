"""The feed of a tree of States in a `FileStore`: one append-only file in the root's folder.

``<root>/tree.jsonl`` holds one line per entry of any State of the tree, in the order they were
saved: ``{"s": <State id>, "g": <its generation>, "q": <seq>, "o": <offset>, "n": <length>}``,
where the entry's line sits in the State's log (`o` bytes in, `n` bytes long). A save appends
its State's lines under the State's log lock, then under the feed's own lock (``flock``), after
its entries are in the log and before its info.json says they are fed: so a reader finds the
entries of every line it reads, and lines are never reordered once written. A cursor is the
byte offset after a line (``file:<offset>``).

A State's info.json keeps its place in the feed (`Fed`): its root, its generation (a State
deleted and saved again under its id is a new generation: lines of the old one are skipped),
how many of its entries are in the feed, and the feed's size just after the last of them. A
save that finds fewer entries fed than its log held before it (a crash between the log and the
feed, or between the feed and the info) looks at the lines after that size for the ones that
made it, and appends only the others: never twice, never lost.

Limits: a line is an ``fsync`` more per save; a follower reads the new lines, then each entry
from its State's log (one small read, and one for the entry before it, to check its link);
deleting the root deletes the feed; a cursor of another tree of the same store may be taken
for one of this one's if it falls on a line's end.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._fileio import FILE_MODE, OPEN_FLAGS, flock, last_line, read_at, write_all
from .backend import bad_cursor

__all__ = (
    "EXAMPLE",
    "FEED",
    "KIND",
    "Fed",
    "Record",
    "append_records",
    "feed_size",
    "read_records",
)

FEED = "tree.jsonl"
KIND = "file"
"""The kind of a `FileStore` cursor (``file:<offset>``)."""
EXAMPLE = "file:1024"


@dataclass(frozen=True, slots=True)
class Fed:
    """Where a State is in its tree's feed, as its info.json keeps it.

    `root` is its tree's root and `generation` tells this State from one deleted before it
    under its id (None for both: written before feeds; they are found at its next save).
    `count` of its entries are in the feed, the last of them before byte `at`.
    """

    root: str | None = None
    generation: str | None = None
    count: int = 0
    at: int = 0


@dataclass(frozen=True, slots=True)
class Record:
    """One line of a feed: entry `seq` of `state_id` (of `generation`) at `offset` in its log."""

    state_id: str
    generation: str
    seq: int
    offset: int
    length: int
    end: int  # where the line ends in the feed: the cursor after it


def _line(state_id: str, generation: str, seq: int, offset: int, length: int) -> bytes:
    record = {"s": state_id, "g": generation, "q": seq, "o": offset, "n": length}
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


def _parse(line: bytes, end: int) -> Record | None:
    """The record of a feed line; None if it does not read."""
    try:
        loaded: Any = json.loads(line)
        record = Record(loaded["s"], loaded["g"], loaded["q"], loaded["o"], loaded["n"], end)
    except (ValueError, TypeError, KeyError):
        return None
    fields = (record.seq, record.offset, record.length)
    if not isinstance(record.state_id, str) or not isinstance(record.generation, str):
        return None
    if any(isinstance(value, bool) or not isinstance(value, int) or value < 0 for value in fields):
        return None
    return record


def _lines(data: bytes, start: int) -> list[tuple[bytes, int]]:
    """The complete lines of `data` (read from byte `start`), each with where it ends."""
    found: list[tuple[bytes, int]] = []
    at = 0
    while (newline := data.find(b"\n", at)) >= 0:
        found.append((data[at:newline], start + newline + 1))
        at = newline + 1
    return found


def feed_size(folder: Path) -> int:
    """The size of the feed in the root's `folder` (0: none yet; -1: no such folder)."""
    try:
        return os.stat(folder / FEED).st_size
    except FileNotFoundError:
        return 0 if folder.is_dir() else -1


def append_records(
    folder: Path,
    state_id: str,
    fed: Fed,
    spans: list[tuple[int, int, int]],
    *,
    check_after: bool,
) -> int | None:
    """Append a line per `(seq, offset, length)` of `spans` to the feed in the root's `folder`.

    With `check_after`, the lines after byte `fed.at` are read first and the entries found
    there (of this generation) are left out: a crash came between the feed and the info.
    Returns the feed's size after the lines; None when the root's folder is gone (the root was
    deleted: nobody follows the tree).
    """
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | OPEN_FLAGS
    try:
        fd = os.open(folder / FEED, flags, FILE_MODE)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        flock(fd, exclusive=True)
        size = os.fstat(fd).st_size
        if size and read_at(fd, 1, size - 1) != b"\n":
            size = last_line(fd, size)[0]  # a torn line a crash left: cut it
            os.ftruncate(fd, size)
        if check_after and fed.at < size:
            done = {
                record.seq
                for line, end in _lines(read_at(fd, size - fed.at, fed.at), fed.at)
                if (record := _parse(line, end)) is not None
                and record.state_id == state_id
                and record.generation == fed.generation
            }
            spans = [span for span in spans if span[0] not in done]
        if spans:
            assert fed.generation is not None
            data = b"".join(_line(state_id, fed.generation, *span) for span in spans)
            write_all(fd, data)
            os.fsync(fd)
            size += len(data)
        return size
    finally:
        os.close(fd)


def read_records(folder: Path, after: int, cursor: str | None) -> list[Record | int]:
    """The records of the feed in the root's `folder` after byte `after` (the `cursor`).

    A line that does not read is given as the byte where it ends (the caller reports the
    damage).

    Raises:
        ValueError: `after` is past the end of the feed, or not the end of a line.
    """
    try:
        fd = os.open(folder / FEED, os.O_RDONLY | OPEN_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        if after:
            raise bad_cursor(cursor, EXAMPLE, "it is past the end of this tree's feed") from None
        return []
    try:
        size = os.fstat(fd).st_size
        if after > size:
            raise bad_cursor(cursor, EXAMPLE, "it is past the end of this tree's feed")
        if after and read_at(fd, 1, after - 1) != b"\n":
            raise bad_cursor(cursor, EXAMPLE, "it is not the end of a line of this tree's feed")
        data = read_at(fd, size - after, after)
    finally:
        os.close(fd)
    return [_parse(line, end) or end for line, end in _lines(data, after)]
