"""`FileStore`: each State in its own folder of files, the history as JSON lines.

Layout under the store's folder::

    <id>/log.jsonl   one encoded history entry per line, appended and fsynced on each save
    <id>/info.json   the State's `StateInfo` and the stored format version, replaced atomically

A State's folder appears whole or not at all (it is written under a hidden name, then renamed),
files are created with mode 0600 and folders 0700. An entry is saved once its line, newline
included, is on disk: a last line without its newline is what a crash mid-write leaves, so it
is ignored on load and cut before the next append. Lines are split on the newline byte only
(JSON text holds no raw newline, but it may hold U+2028). Any other damaged line is an error
naming the State and the entry's index.

Many threads may use one store; processes may share the folder (appends take a `flock`), but
each State should be run by one process at a time.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import shutil
import sys
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pydantic

from orchestrator import State
from orchestrator._state import validate_id

from ._base import StateInfo, info_of
from ._codec import FORMAT_VERSION, check_format, decode_entry
from ._memory import (
    Tail,
    check_list_args,
    check_state,
    continuation,
    rebuild,
    select,
)
from ._offload import ThreadedAsync

__all__ = ("FileStore",)

LOG = "log.jsonl"
INFO = "info.json"
_FILE_MODE = 0o600
_FOLDER_MODE = 0o700
_CHUNK = 64 * 1024
_STRIPES = 64
_INFO: pydantic.TypeAdapter[StateInfo] = pydantic.TypeAdapter(StateInfo)
_OPEN_FLAGS = getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)  # no newline translation

if sys.platform == "win32":  # pragma: no cover - no flock, no folder fsync on Windows

    def _flock(fd: int, *, exclusive: bool) -> None:
        pass

    def _fsync_folder(path: Path) -> None:
        pass

else:
    import fcntl

    def _flock(fd: int, *, exclusive: bool) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)

    def _fsync_folder(path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_at(fd: int, size: int, offset: int) -> bytes:
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


def _read_all(fd: int) -> bytes:
    return _read_at(fd, os.fstat(fd).st_size, 0)


def _write_new_file(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS, _FILE_MODE)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _last_line(fd: int, size: int) -> tuple[int, bytes | None]:
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
        buffer = _read_at(fd, step, start) + buffer


def _seq_of(line: bytes) -> int | None:
    try:
        seq: Any = json.loads(line).get("seq")
    except (ValueError, AttributeError):
        return None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0 else None


@dataclass(frozen=True, slots=True)
class _Known:
    """What this store last wrote or read of a log: its tail, where it ends, its last line."""

    tail: Tail
    end: int  # the size of the log, all lines complete
    last: int  # the length of the last line, newline left out

    @classmethod
    def after(cls, tail: Tail, end: int, lines: Sequence[bytes]) -> _Known:
        """What is known once `lines` are the last lines of a log of `end` bytes."""
        return cls(tail, end, len(lines[-1]) if lines else 0)

    def matches(self, fd: int, size: int) -> bool:
        """Whether the log is still as this store left it (its size, and its last line).

        Reading the last line back catches a log another writer changed, or deleted and made
        again, even at the same size.
        """
        if size != self.end:
            return False
        if self.tail.count == 0:
            return True
        line = _read_at(fd, self.last, self.end - self.last - 1)
        return Tail.of(self.tail.count, line).digest == self.tail.digest


def _is_id(name: str) -> bool:
    try:
        validate_id(name)
    except ValueError:
        return False
    return True


class FileStore(ThreadedAsync):
    """Keeps each State in a folder under `path`: ``<id>/log.jsonl`` and ``<id>/info.json``.

    The folder is made on the first save. `save` appends only the new entries and fsyncs them,
    so a crash loses at most the save under way. The async methods (`asave`, ...) run the sync
    ones in a worker thread.

    Example:
        ```python
        store = FileStore("runs")
        agent = Agent(FakeModel(["Hi!"]), store=store)
        state = State(messages=[Message.user("Hello")])
        agent.run(state)
        print(store.load(state.id).answer)
        ```
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """Use the folder `path` (made on the first save if it does not exist)."""
        self._root = Path(path)
        self._locks = tuple(threading.Lock() for _ in range(_STRIPES))
        self._known: dict[str, _Known] = {}

    def __repr__(self) -> str:
        return f"FileStore({str(self._root)!r})"

    @property
    def path(self) -> Path:
        """The folder the States are kept in."""
        return self._root

    def _lock_for(self, state_id: str) -> threading.Lock:
        return self._locks[hash(state_id) % _STRIPES]

    # -- save ------------------------------------------------------------------------------------

    def save(self, state: State) -> None:
        """Append the entries of `state` not stored yet, update its info, bind it to this store.

        Raises:
            TypeError: `state` is not a State.
            ValueError: Another history is stored under `state.id` (load it to continue it), its
                stored format is another version, or its last stored entry is damaged.
            OSError: The files cannot be written.
        """
        state = check_state(state)
        folder = self._root / state.id
        with self._lock_for(state.id):
            try:
                fd = os.open(folder / LOG, os.O_RDWR | os.O_APPEND | _OPEN_FLAGS)
            except FileNotFoundError:
                self._known.pop(state.id, None)
                if self._create(state, folder):
                    state._bind_store(self)
                    return
                fd = os.open(folder / LOG, os.O_RDWR | os.O_APPEND | _OPEN_FLAGS)
            try:
                _flock(fd, exclusive=True)
                self._append(state, folder, fd)
            finally:
                os.close(fd)
        state._bind_store(self)

    def _create(self, state: State, folder: Path) -> bool:
        """Write a new State's folder whole; False if another writer made it first."""
        info = info_of(state)
        lines, tail = continuation(state, Tail())
        data = b"".join(line + b"\n" for line in lines)
        self._root.mkdir(mode=_FOLDER_MODE, parents=True, exist_ok=True)
        draft = self._root / f".new-{state.id}-{uuid.uuid4().hex}"
        os.mkdir(draft, _FOLDER_MODE)
        try:
            _write_new_file(draft / LOG, data)
            _write_new_file(draft / INFO, _encode_info(info))
            try:
                os.rename(draft, folder)
            except OSError:
                if folder.is_dir():
                    return False  # another process created it meanwhile: append to it
                raise
            _fsync_folder(self._root)
        finally:
            if draft.exists():
                shutil.rmtree(draft, ignore_errors=True)
        self._known[state.id] = _Known.after(tail, len(data), lines)
        return True

    def _append(self, state: State, folder: Path, fd: int) -> None:
        size = os.fstat(fd).st_size
        known = self._known.get(state.id)
        if known is None or not known.matches(fd, size):
            # First save here, or another writer changed the log: read its end again.
            _read_info(folder, state.id)
            known = self._scan(state.id, fd, size)
        info = info_of(state)  # before the entries: it never claims more than stored
        lines, tail = continuation(state, known.tail)
        if not lines:
            self._known[state.id] = _Known(tail, known.end, known.last)
            return
        data = b"".join(line + b"\n" for line in lines)
        self._known.pop(state.id, None)  # if the write fails, read the log again next time
        _write_all(fd, data)
        os.fsync(fd)
        self._known[state.id] = _Known.after(tail, known.end + len(data), lines)
        _replace_info(folder, info)

    def _scan(self, state_id: str, fd: int, size: int) -> _Known:
        """Read the end of a log this store does not know, and cut a torn last line."""
        end, last = _last_line(fd, size)
        known = _Known(Tail(), end, 0)
        if last is not None:
            seq = _seq_of(last)
            if seq is None:
                # The last complete line is damaged: count the lines to name its index.
                seq = _read_at(fd, end, 0).count(b"\n") - 1
            entry = decode_entry(last, state_id=state_id, index=seq)
            known = _Known(Tail.of(seq + 1, last, entry), end, len(last))
        if end < size:
            os.ftruncate(fd, end)  # a torn line: the save that wrote it never returned
        return known

    # -- load, list, delete ----------------------------------------------------------------------

    def load(self, state_id: str) -> State:
        """The State saved under `state_id`, recovered if a turn was cut off, bound to this store.

        Raises:
            LookupError: Nothing is saved under `state_id`.
            ValueError: `state_id` is not a valid id (nothing is touched), the State was stored
                in another format version (the message names both), or an entry is damaged (the
                message names the State and the entry's index).
        """
        validate_id(state_id, "state_id")
        folder = self._root / state_id
        with self._lock_for(state_id):
            _read_info(folder, state_id)
            try:
                fd = os.open(folder / LOG, os.O_RDONLY | _OPEN_FLAGS)
            except FileNotFoundError:
                raise ValueError(
                    f"State {state_id!r}: {folder / INFO} exists but {LOG} is missing. Restore"
                    f" the folder from a backup, or delete the State (store.delete({state_id!r}))."
                ) from None
            try:
                _flock(fd, exclusive=False)
                data = _read_all(fd)
            finally:
                os.close(fd)
        end = data.rfind(b"\n") + 1  # what follows is a torn line: ignored, cut on next append
        lines = data[:end].split(b"\n")[:-1]
        state = rebuild(state_id, lines)
        if lines:
            with self._lock_for(state_id):
                known = self._known.get(state_id)
                if known is None or known.end == end:
                    tail = Tail.of(len(lines), lines[-1]).holding(state)
                    self._known[state_id] = _Known.after(tail, end, lines)
        state._recover()
        state._bind_store(self)
        return state

    def list(
        self, *, parent_id: str | None = None, limit: int | None = None
    ) -> builtins.list[StateInfo]:
        """The saved States, most recently updated first; only children of `parent_id` if set.

        Raises:
            ValueError: A State's info.json is damaged or in another format version.
        """
        check_list_args(parent_id, limit)
        try:
            names = os.listdir(self._root)
        except FileNotFoundError:
            return []
        infos: builtins.list[StateInfo] = []
        for name in names:
            if not _is_id(name):
                continue  # a folder being written or deleted, or a stranger
            try:
                info = _read_info(self._root / name, name)
            except LookupError:
                continue  # deleted meanwhile, or not a State's folder
            if parent_id is None or info.parent_id == parent_id:
                infos.append(info)
        return select(infos, parent_id=parent_id, limit=limit)

    def delete(self, state_id: str) -> None:
        """Delete the folder of the State `state_id` (nothing happens if it is absent).

        Raises:
            ValueError: `state_id` is not a valid id (nothing is touched).
        """
        validate_id(state_id, "state_id")
        with self._lock_for(state_id):
            self._known.pop(state_id, None)
            trash = self._root / f".del-{state_id}-{uuid.uuid4().hex}"
            try:
                os.rename(self._root / state_id, trash)
            except FileNotFoundError:
                return
            shutil.rmtree(trash)


def _encode_info(info: StateInfo) -> bytes:
    fields: dict[str, Any] = _INFO.dump_python(info, mode="json")
    return json.dumps({"format": FORMAT_VERSION, **fields}, ensure_ascii=False).encode() + b"\n"


def _replace_info(folder: Path, info: StateInfo) -> None:
    draft = folder / f".info-{uuid.uuid4().hex}"
    try:
        _write_new_file(draft, _encode_info(info))
        os.replace(draft, folder / INFO)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(draft)


def _read_info(folder: Path, state_id: str) -> StateInfo:
    """The info of the State in `folder`, after checking its format version.

    Raises:
        LookupError: The folder has no info.json (no State is saved under this id).
        ValueError: info.json is damaged, or of another format version.
    """
    path = folder / INFO
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        raise LookupError(
            f"No State {state_id!r} in {str(folder.parent)!r}: save it first, or pick an id from"
            " store.list()."
        ) from None
    try:
        loaded: Any = json.loads(data)
        if not isinstance(loaded, dict):
            raise ValueError("it is not a JSON object")
    except ValueError as error:
        raise ValueError(
            f"State {state_id!r}: {path} is damaged ({error}). Restore it from a backup, or"
            f" delete the State (store.delete({state_id!r}))."
        ) from None
    fields = cast("dict[str, Any]", loaded)
    check_format(fields.pop("format", None), where=f"State {state_id!r} ({path})")
    try:
        return _INFO.validate_python(fields)
    except pydantic.ValidationError as error:
        raise ValueError(
            f"State {state_id!r}: {path} is damaged ({error.error_count()} problems, first:"
            f" {error.errors()[0]['msg']}). Restore it from a backup, or delete the State."
        ) from None
