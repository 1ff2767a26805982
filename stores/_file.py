"""`FileStore`: each State in its own folder of files, the history as JSON lines.

Layout under the store's folder::

    <id>/log.jsonl   one encoded history entry per line, appended and fsynced on each save
    <id>/info.json   the State's `StateInfo` and the stored format version, replaced atomically
    .memory/<agent>/log.jsonl   the agent's memory: one write per line, appended and fsynced
    .memory/<agent>/lock        taken (`flock`) by every memory call, shared to read

A State's folder appears whole or not at all (it is written under a hidden name, then renamed),
files are created with mode 0600 and folders 0700. An entry is saved once its line, newline
included, is on disk: a last line without its newline is what a crash mid-write leaves, so it
is ignored on load and cut before the next append. Lines are split on the newline byte only
(JSON text holds no raw newline, but it may hold U+2028). Any other damaged line is an error
naming the State and the entry's index.

Many threads may use one store; processes may share the folder (appends take a `flock`), but
each State should be run by one process at a time.

Agent memory (`stores.MemoryBackend`) is a log per agent: a header line (the format version and
the log's own id), then one line per write (``{"space", "key", "value", "effect"?}``, a null
value deletes). A write with an effect key already in the log writes nothing. The store keeps
what it has read of each log and reads only the lines added since, so a call costs the new
lines, not the whole log. When most lines are overwritten ones, the log is rewritten (compacted)
under a new id. Memory is safe for many threads and processes: each call holds the lock file.
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import pydantic

from orchestrator import State
from orchestrator._state import validate_id

from ._base import StateInfo, bind_state, info_of, recover_state
from ._codec import FORMAT_VERSION, check_format, decode_entry
from ._memory import (
    Tail,
    check_list_args,
    check_memory,
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
MEMORY = ".memory"  # not an id, so never a State's folder, and `list` passes it by
_MEMORY_LOCK = "lock"
COMPACT_LINES = 1024
"""A memory log of this many lines, mostly overwritten ones, is compacted."""
_T = TypeVar("_T")
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
        return line == self.tail.line


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
        self._logs: dict[str, _MemoryLog] = {}  # agent: what was read of its memory log

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
        # Checked on every save: another process may have moved this State to another format.
        _read_info(folder, state.id)
        if known is None or not known.matches(fd, size):
            # First save here, or another writer changed the log: read its end again.
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
            known = _Known(Tail(seq + 1, last, entry), end, len(last))
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
                    tail = Tail(len(lines), lines[-1]).holding(state)
                    self._known[state_id] = _Known.after(tail, end, lines)
        children = self.list(parent_id=state_id) if state.pending_calls else ()
        recover_state(state, children)
        bind_state(state, self)
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

    # -- agent memory ----------------------------------------------------------------------------

    def memory_get(self, agent: str, space: str, key: str) -> str | None:
        """The text stored under `key` in the agent's space, or None (see `MemoryBackend`)."""
        check_memory(agent, space, key)
        return self._with_memory(agent, lambda log: log.spaces.get(space, {}).get(key))

    def memory_scan(self, agent: str, space: str) -> builtins.list[tuple[str, str]]:
        """Every ``(key, text)`` of the agent's space, in key order."""
        check_memory(agent, space)
        return self._with_memory(agent, lambda log: sorted(log.spaces.get(space, {}).items()))

    def memory_put(
        self, agent: str, space: str, key: str, data: str | None, *, effect: str | None = None
    ) -> bool:
        """Append the write of `data` under `key` (None deletes it), once per `effect` key.

        Returns whether it applied: False when the log holds the effect key already.

        Raises:
            ValueError: The agent's memory log is damaged or of another format version.
            OSError: The files cannot be written.
        """
        check_memory(agent, space, key, data=data, effect=effect)
        record: dict[str, Any] = {"space": space, "key": key, "value": data}
        if effect is not None:
            record["effect"] = effect
        line = _memory_line(record)
        folder = self._root / MEMORY / agent
        with self._lock_for(f"{MEMORY}/{agent}"):
            self._root.mkdir(mode=_FOLDER_MODE, parents=True, exist_ok=True)
            for path in (self._root / MEMORY, folder):
                try:
                    os.mkdir(path, _FOLDER_MODE)
                except FileExistsError:
                    continue
                _fsync_folder(path.parent)
            lock = os.open(folder / _MEMORY_LOCK, os.O_RDWR | os.O_CREAT | _OPEN_FLAGS, _FILE_MODE)
            try:
                _flock(lock, exclusive=True)
                try:
                    fd = os.open(folder / LOG, os.O_RDWR | os.O_APPEND | _OPEN_FLAGS)
                except FileNotFoundError:
                    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS
                    fd = os.open(folder / LOG, flags, _FILE_MODE)
                    _fsync_folder(folder)
                try:
                    log = self._catch_up(agent, fd, folder / LOG, cut=True)
                    if effect is not None and effect in log.effects:
                        return False
                    data_out = line if log.end else _memory_header() + line
                    del self._logs[agent]  # if the write fails, read the log again next time
                    _write_all(fd, data_out)
                    os.fsync(fd)
                    if not log.end:
                        log.header = data_out[: data_out.index(b"\n")]
                    log.read(data_out, folder / LOG)
                    self._logs[agent] = log
                finally:
                    os.close(fd)
                if log.lines >= COMPACT_LINES and log.lines > 2 * (
                    1 + len(log.effects) + sum(len(values) for values in log.spaces.values())
                ):
                    self._compact(agent, folder, log)
            finally:
                os.close(lock)  # releases the flock
        return True

    def _with_memory(self, agent: str, read: Callable[[_MemoryLog], _T]) -> _T:
        """`read` of the agent's memory log brought up to date, under a shared lock."""
        folder = self._root / MEMORY / agent
        with self._lock_for(f"{MEMORY}/{agent}"):
            try:
                lock = os.open(folder / _MEMORY_LOCK, os.O_RDONLY | _OPEN_FLAGS)
            except (FileNotFoundError, NotADirectoryError):
                lock = None  # nothing written yet, or a log restored without its lock file
            try:
                if lock is not None:
                    _flock(lock, exclusive=False)
                try:
                    fd = os.open(folder / LOG, os.O_RDONLY | _OPEN_FLAGS)
                except (FileNotFoundError, NotADirectoryError):
                    self._logs.pop(agent, None)
                    return read(_MemoryLog())
                try:
                    return read(self._catch_up(agent, fd, folder / LOG, cut=False))
                finally:
                    os.close(fd)
            finally:
                if lock is not None:
                    os.close(lock)

    def _catch_up(self, agent: str, fd: int, path: Path, *, cut: bool) -> _MemoryLog:
        """The agent's memory log, with the lines added since this store last read it.

        A log with another header (compacted, or made again) is read from its start. With
        `cut`, a torn last line (a write that never returned) is cut off.
        """
        size = os.fstat(fd).st_size
        head = _read_at(fd, min(size, 256), 0)
        newline = head.find(b"\n")
        header = head[:newline] if newline >= 0 else b""
        log = self._logs.pop(agent, None)
        if log is None or not header or log.header != header or size < log.end:
            log = _MemoryLog(header)
        if size > log.end:
            log.read(_read_at(fd, size - log.end, log.end), path)
        if cut and log.end < size:
            os.ftruncate(fd, log.end)
        self._logs[agent] = log
        return log

    def _compact(self, agent: str, folder: Path, log: _MemoryLog) -> None:
        """Rewrite the agent's memory log without its overwritten lines (under the lock)."""
        data = log.compacted()
        draft = folder / f".compact-{uuid.uuid4().hex}"
        try:
            _write_new_file(draft, data)
            os.replace(draft, folder / LOG)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(draft)
        _fsync_folder(folder)
        fresh = _MemoryLog(data[: data.index(b"\n")])
        fresh.read(data, folder / LOG)
        self._logs[agent] = fresh


def _memory_line(record: dict[str, Any]) -> bytes:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def _memory_header() -> bytes:
    return _memory_line({"format": FORMAT_VERSION, "log": uuid.uuid4().hex})


@dataclass(slots=True)
class _MemoryLog:
    """What this store has read of one agent's memory log: its lines up to `end`."""

    header: bytes = b""  # the first line, which names the log (a compacted log has a new one)
    end: int = 0
    lines: int = 0
    spaces: dict[str, dict[str, str]] = field(default_factory=dict[str, dict[str, str]])
    effects: set[str] = field(default_factory=set[str])

    def read(self, data: bytes, path: Path) -> None:
        """Apply the complete lines of `data`, which starts at `end`; a torn last one waits."""
        complete = data.rfind(b"\n") + 1
        for line in data[:complete].split(b"\n")[:-1]:
            self._apply(line, path)
        self.end += complete

    def _apply(self, line: bytes, path: Path) -> None:
        self.lines += 1
        try:
            loaded: Any = json.loads(line)
            if not isinstance(loaded, dict):
                raise ValueError("it is not a JSON object")
            record = cast("dict[str, Any]", loaded)
            if "format" in record:
                found: object = record["format"]
            else:
                found = FORMAT_VERSION
                effect, space = record.get("effect"), record.get("space")
                if effect is not None and not isinstance(effect, str):
                    raise ValueError("its effect key is not a str")
                if space is not None:
                    key, value = record["key"], record["value"]
                    if not (isinstance(space, str) and isinstance(key, str)):
                        raise ValueError("its space or key is not a str")
                    if value is not None and not isinstance(value, str):
                        raise ValueError("its value is not JSON text")
                    if value is None:
                        self.spaces.get(space, {}).pop(key, None)
                    else:
                        self.spaces.setdefault(space, {})[key] = value
                if effect is not None:
                    self.effects.add(effect)
        except (ValueError, KeyError) as error:
            raise ValueError(
                f"The agent memory in {path} is damaged at line {self.lines} ({error}). Restore"
                " the file from a backup, or delete it to forget this agent's memory."
            ) from None
        check_format(found, where=f"The agent memory in {path}")

    def compacted(self) -> bytes:
        """The log rewritten: a new header, each value once, each effect key once."""
        lines = [_memory_header()]
        for space, values in sorted(self.spaces.items()):
            lines += (
                _memory_line({"space": space, "key": key, "value": value})
                for key, value in sorted(values.items())
            )
        lines += (_memory_line({"effect": effect}) for effect in sorted(self.effects))
        return b"".join(lines)


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
