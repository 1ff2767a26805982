"""`FileStore`: each State in its own folder of files, the history as JSON lines.

Layout under the store's folder::

    <id>/log.jsonl   one history entry per line, appended and fsynced on each save:
                     ``{"d": "<digest>", "e": <the entry's encoded JSON>}``
    <id>/info.json   the State's `StateInfo`, the stored format version, the digest of the
                     last entry it counts (``head``) and the seal of the listed info chained
                     to it (``seal``, checked by `list`), replaced atomically after each append
    <id>/children.jsonl   ``{"id", "call"}`` of each child State saved here, appended when the
                     child is first saved with its parent link (crash recovery reads it)
    <root>/tree.jsonl   the feed of the tree of a root State: a line per entry of any State of
                     the tree, in the order saved (`stores._file_feed`); info.json keeps each
                     State's root and how many of its entries are in it
    .memory/<agent>/log.jsonl   the agent's memory: one write per line, appended and fsynced
    .memory/<agent>/lock        taken (`flock`) by every memory call, shared to read

A State's folder appears whole or not at all (it is written under a hidden name, then renamed),
files are created with mode 0600 and folders 0700. An entry is saved once its line, newline
included, is on disk: a last line without its newline is what a crash mid-write leaves, so it
is ignored on load and cut before the next append. Lines are split on the newline byte only
(JSON text holds no raw newline, but it may hold U+2028). Each line's digest is chained with the
one before (`stores._codec`), and info.json counts the entries and holds the last one's digest,
so a damaged, missing, repeated or moved line is a `StoreDamagedError` naming the State and the
entry's index. The log may hold more entries than info.json counts (a crash between the two
writes), never fewer. A State folder of format 1 (lines without digests) loads as it is and is
rewritten with digests by its next save.

Many threads may use one store; processes may share the folder (appends take a `flock`), but
each State should be run by one process at a time.

Agent memory (`MemoryBackend`) is a log per agent: a header line (the format version and
the log's own id), then one line per write (``{"space", "key", "value", "effect"?}``, a null
value deletes). A write with an effect key already in the log writes nothing. The store keeps
what it has read of each log and reads only the lines added since, so a call costs the new
lines, not the whole log. When most lines are overwritten ones, the log is rewritten (compacted)
under a new id. Memory is safe for many threads and processes: each call holds the lock file.
"""

from __future__ import annotations

import binascii
import builtins
import contextlib
import dataclasses
import json
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import pydantic

from orchestrator import HistoryEntry, State, StateInfo, StoreError, TreeEntry

from ._codec import (
    DIGEST_SIZE,
    FORMAT_V1,
    FORMAT_V2,
    FORMAT_VERSION,
    chain_digests,
    check_chain,
    check_format,
    damaged,
    decode_entry,
    first_digest,
    listing_seal,
    missing_entries,
)
from ._file_feed import EXAMPLE as FEED_EXAMPLE
from ._file_feed import FEED, Fed, Record, append_records, feed_size, read_records
from ._file_feed import KIND as FEED_KIND
from ._fileio import FILE_MODE as _FILE_MODE
from ._fileio import OPEN_FLAGS as _OPEN_FLAGS
from ._fileio import flock as _flock
from ._fileio import fsync_folder as _fsync_folder
from ._fileio import last_line as _last_line
from ._fileio import read_all as _read_all
from ._fileio import read_at as _read_at
from ._fileio import write_all as _write_all
from ._fileio import write_new_file as _write_new_file
from ._offload import ThreadedClosing
from .backend import (
    Tail,
    TailCache,
    Wakeups,
    adopted,
    bad_cursor,
    bind_state,
    check_after,
    check_limit,
    check_link,
    check_list_args,
    check_memory,
    check_state,
    continuation,
    cursor_parts,
    entries_after,
    make_cursor,
    not_a_root,
    poll_entries,
    rebuild,
    recover_state,
    select,
    storage_view,
    to_adopt,
    validate_id,
)

__all__ = ("FileStore",)

LOG = "log.jsonl"
INFO = "info.json"
CHILDREN = "children.jsonl"
MEMORY_FORMAT = 1
"""The format of agent memory logs (unchanged when States' logs gained digests)."""
_SEAL_HEAD = b'{"d":"'
_SEAL_MID = b'","e":'
_DIGEST_END = len(_SEAL_HEAD) + 2 * DIGEST_SIZE
_ENTRY_AT = _DIGEST_END + len(_SEAL_MID)
_FOLDER_MODE = 0o700
_STRIPES = 64
MEMORY = ".memory"  # not an id, so never a State's folder, and `list` passes it by
_MEMORY_LOCK = "lock"
COMPACT_LINES = 1024
"""A memory log of this many lines, mostly overwritten ones, is compacted."""
_T = TypeVar("_T")
_INFO: pydantic.TypeAdapter[StateInfo] = pydantic.TypeAdapter(StateInfo)


def _seal(digest: bytes, entry: bytes) -> bytes:
    """The log line of an encoded entry and its digest (no newline)."""
    return b"".join((_SEAL_HEAD, digest.hex().encode(), _SEAL_MID, entry, b"}"))


def _sealed(digests: Sequence[bytes], entries: Sequence[bytes]) -> bytes:
    """The log lines of encoded entries and their digests, each with its newline."""
    return b"".join(_sealed_lines(digests, entries))


def _sealed_lines(digests: Sequence[bytes], entries: Sequence[bytes]) -> list[bytes]:
    """The log line of each encoded entry and its digest, with its newline."""
    return [_seal(d, entry) + b"\n" for d, entry in zip(digests, entries, strict=True)]


def _unseal(line: bytes) -> tuple[bytes | None, bytes]:
    """The digest and the encoded entry of a log line; no digest if the line is not sealed."""
    if (
        line.startswith(_SEAL_HEAD)
        and line[_DIGEST_END:_ENTRY_AT] == _SEAL_MID
        and line.endswith(b"}")
    ):
        try:
            return binascii.unhexlify(line[len(_SEAL_HEAD) : _DIGEST_END]), line[_ENTRY_AT:-1]
        except binascii.Error:
            pass
    return None, line


def _seq_of(line: bytes) -> int | None:
    try:
        seq: Any = json.loads(line).get("seq")
    except (ValueError, AttributeError):
        return None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0 else None


def _matches(tail: Tail, fd: int, size: int) -> bool:
    """Whether a log is still as this store left it: `tail.at` bytes, ending in its last line.

    Reading the last line back catches a log another writer changed, or deleted and made again,
    even at the same size.
    """
    if size != tail.at:
        return False
    if tail.count == 0:
        return True
    sealed = _seal(tail.digest, tail.line)
    return _read_at(fd, len(sealed), tail.at - len(sealed) - 1) == sealed


@dataclass(frozen=True, slots=True)
class _Stored:
    """What a State's info.json holds: its info, its format version, its last entry's digest."""

    info: StateInfo
    format: int
    head: bytes | None
    sealed: bool = True  # whether the listed info matches its seal (`stores._codec.listing_seal`)
    fed: Fed = field(default_factory=Fed)  # its place in its tree's feed


def _is_id(name: str) -> bool:
    try:
        validate_id(name)
    except ValueError:
        return False
    return True


class FileStore(ThreadedClosing):
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
        self._where = f"FileStore {str(self._root)!r}"
        self._locks = tuple(threading.Lock() for _ in range(_STRIPES))
        self._tails = TailCache()  # the ends of the logs this store wrote or read
        self._logs: dict[str, _MemoryLog] = {}  # agent: what was read of its memory log
        # the followers in this process of any store on this folder, woken by saves here
        self._wakeups = Wakeups.shared(self.url)

    def __repr__(self) -> str:
        return f"FileStore({str(self._root)!r})"

    @property
    def path(self) -> Path:
        """The folder the States are kept in."""
        return self._root

    def close(self) -> None:
        """Nothing to release (every call opens and closes its files): as every store closes."""

    @property
    def url(self) -> str:
        """The URL `stores.open_store` opens this folder with (absolute), e.g. for a runner."""
        return self._root.absolute().as_uri()

    def _lock_for(self, state_id: str) -> threading.Lock:
        return self._locks[hash(state_id) % _STRIPES]

    # -- save ------------------------------------------------------------------------------------

    def save(self, state: State) -> None:
        """Append the entries of `state` not stored yet, update its info, bind it to this store.

        Raises:
            TypeError: `state` is not a State.
            ValueError: Another history is stored under `state.id` (load it to continue it), or
                its stored format is another version.
            StoreDamagedError: The stored State is damaged (its info, or its last entry).
            StoreError: The files cannot be written (the `OSError` is the cause).
        """
        state = check_state(state)
        self._save(state)
        self._wakeups.saved(((state.id, state.parent_id),))

    def _save(self, state: State) -> None:
        folder = self._root / state.id
        with self._lock_for(state.id), self._failures(state.id):
            try:
                fd = os.open(folder / LOG, os.O_RDWR | os.O_APPEND | _OPEN_FLAGS)
            except FileNotFoundError:
                self._tails.forget(state.id)
                if self._create(state, folder):
                    bind_state(state, self)
                    return
                fd = os.open(folder / LOG, os.O_RDWR | os.O_APPEND | _OPEN_FLAGS)
            try:
                _flock(fd, exclusive=True)
                stored = self._read_info(folder, state.id)
                if stored.format == FORMAT_V1:
                    self._migrate_v1(state.id, folder, fd, stored)
                    os.close(fd)  # the log was replaced: append to the new one
                    fd = os.open(folder / LOG, os.O_RDWR | os.O_APPEND | _OPEN_FLAGS)
                    _flock(fd, exclusive=True)
                    stored = self._read_info(folder, state.id)
                self._append(state, folder, fd, stored)
            finally:
                os.close(fd)
        bind_state(state, self)

    @contextlib.contextmanager
    def _failures(self, state_id: str | None) -> Generator[None, None, None]:
        """Raise a failure of the file system as a `StoreError` naming the store and State."""
        try:
            yield
        except OSError as error:
            about = "" if state_id is None else f" (State {state_id!r})"
            raise StoreError(f"{self._where} failed{about}: {error}") from error

    def _create(self, state: State, folder: Path) -> bool:
        """Write a new State's folder whole; False if another writer made it first."""
        view = storage_view(state)  # its entries and its info agree
        info = view.info
        new = continuation(view, Tail())
        lines = _sealed_lines(new.digests, new.lines)
        data = b"".join(lines)
        self._root.mkdir(mode=_FOLDER_MODE, parents=True, exist_ok=True)
        if info.parent_id is not None:
            self._link_child(info)
        root = self._root_by_links(state.id, info.parent_id)
        # Lines of this State in the feed can only come after its size now.
        fed = Fed(root, uuid.uuid4().hex[:16], 0, max(feed_size(self._root / root), 0))
        draft = self._root / f".new-{state.id}-{uuid.uuid4().hex}"
        os.mkdir(draft, _FOLDER_MODE)
        try:
            _write_new_file(draft / LOG, data)
            _write_new_file(draft / INFO, _encode_info(info, new.tail.digest or None, fed))
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
        self._feed_created(state.id, folder, info, new.tail.digest or None, lines)
        self._tails.put(state.id, dataclasses.replace(new.tail, at=len(data)))
        return True

    def _feed_created(
        self,
        state_id: str,
        folder: Path,
        info: StateInfo,
        head: bytes | None,
        lines: Sequence[bytes],
    ) -> None:
        """Put the entries of a State just made in its tree's feed, under its log's lock.

        Another process may have appended to it in between: it fed them all, and its info.json
        is newer than this one, so nothing is done.
        """
        if not lines:
            return
        fd = os.open(folder / LOG, os.O_RDWR | os.O_APPEND | _OPEN_FLAGS)
        try:
            _flock(fd, exclusive=True)
            stored = self._read_info(folder, state_id)
            if stored.info.entries != len(lines) or stored.fed.count >= len(lines):
                return
            fed = self._feed(state_id, fd, stored, 0, 0, lines)
            _replace_info(folder, info, head, fed)
        finally:
            os.close(fd)

    def _feed(
        self, state_id: str, fd: int, stored: _Stored, at: int, first: int, lines: Sequence[bytes]
    ) -> Fed:
        """Put the entries of `state_id` in its tree's feed, up to the `lines` this save wrote.

        Called under the lock of the State's log (`fd`). `lines` (sealed, newline included)
        were written at byte `at`, entries `first` on. Entries before them that are not fed (a
        crash came between, or the State was written before feeds) are found in the log.
        Returns what its info.json keeps of it then.
        """
        fed = stored.fed
        if fed.root is None or fed.generation is None:  # written before feeds: all join now
            root = fed.root or self._root_by_links(state_id, stored.info.parent_id)
            fed = Fed(root, uuid.uuid4().hex[:16], 0, max(feed_size(self._root / root), 0))
        assert fed.root is not None
        count = first + len(lines)
        if fed.count >= count:
            return fed
        spans: list[tuple[int, int, int]] = []
        if fed.count < first:
            offset = 0
            for seq, line in enumerate(_read_at(fd, at, 0).split(b"\n")[:first]):
                if seq >= fed.count:
                    spans.append((seq, offset, len(line)))
                offset += len(line) + 1
        for seq, line in enumerate(lines, first):
            spans.append((seq, at, len(line) - 1))
            at += len(line)
        size = append_records(
            self._root / fed.root, state_id, fed, spans, check_after=fed.count < first
        )
        return Fed(fed.root, fed.generation, count, fed.at if size is None else size)

    def _root_by_links(self, state_id: str, parent_id: str | None) -> str:
        """The root of a State whose parent is `parent_id`, from the stored parents' info.

        A parent that is not stored ends the walk: the State below it is the root.
        """
        root, current, seen = state_id, parent_id, {state_id}
        while current is not None and current not in seen:
            try:
                parent = self._read_info(self._root / current, current)
            except (ValueError, LookupError):
                break
            if parent.fed.root is not None:
                return parent.fed.root
            root, current = current, parent.info.parent_id
            seen.add(root)
        return root

    def _append(self, state: State, folder: Path, fd: int, stored: _Stored) -> None:
        size = os.fstat(fd).st_size
        known = self._tails.get(state.id)
        if known is None or not _matches(known, fd, size):
            # First save here, or another writer changed the log: read its end again.
            known = self._scan(state.id, fd, size)
        view = storage_view(state)  # its entries and its info agree
        info = view.info
        new = continuation(view, known)
        if not new.lines:
            self._tails.put(state.id, dataclasses.replace(new.tail, at=known.at))
            return
        if info.parent_id is not None and stored.info.parent_id is None:
            self._link_child(info)  # first saved with its parent link
        lines = _sealed_lines(new.digests, new.lines)
        data = b"".join(lines)
        self._tails.forget(state.id)  # if the write fails, read the log again next time
        _write_all(fd, data)
        os.fsync(fd)
        fed = self._feed(state.id, fd, stored, known.at, known.count, lines)
        self._tails.put(state.id, dataclasses.replace(new.tail, at=known.at + len(data)))
        _replace_info(folder, info, new.tail.digest, fed)

    def _scan(self, state_id: str, fd: int, size: int) -> Tail:
        """Read the end of a log this store does not know, and cut a torn last line."""
        end, last = _last_line(fd, size)
        known = Tail(at=end)
        if last is not None:
            digest, line = _unseal(last)
            seq = _seq_of(line)
            if seq is None:
                # The last complete line is damaged: count the lines to name its index.
                seq = _read_at(fd, end, 0).count(b"\n") - 1
            entry = decode_entry(line, state_id=state_id, index=seq, where=self._where)
            if digest is None:
                raise damaged(self._where, state_id, f"history entry {seq} has no digest")
            known = Tail(seq + 1, line, entry, digest, end)
        if end < size:
            os.ftruncate(fd, end)  # a torn line: the save that wrote it never returned
        return known

    def _migrate_v1(self, state_id: str, folder: Path, fd: int, stored: _Stored) -> None:
        """Rewrite a log of format 1 with digests, then its info (under the log's lock)."""
        self._tails.forget(state_id)
        data = _read_all(fd)
        lines = data[: data.rfind(b"\n") + 1].split(b"\n")[:-1]
        # Lines already sealed are what a migration cut off by a crash wrote: checked, kept.
        self._sealed_v1(state_id, stored, lines)
        entries = [_unseal(line)[1] for line in lines]
        if stored.info.entries > len(entries):
            raise _missing(self._where, state_id, stored.info.entries, len(entries))
        digests = chain_digests(first_digest(state_id), entries)
        _replace_file(folder, LOG, _sealed(digests, entries))
        _fsync_folder(folder)
        count = stored.info.entries
        _replace_info(folder, stored.info, digests[count - 1] if count else None, stored.fed)

    def _sealed_v1(self, state_id: str, stored: _Stored, lines: Sequence[bytes]) -> bool:
        """Whether a State whose info.json says format 1 has its log sealed already.

        A migration cut off by a crash leaves that (the log is replaced first, then the info):
        then the seals are checked like any others. A format 1 info.json never holds a head, so
        one that does had its format set back, and the digests may not be turned off so.

        Raises:
            StoreDamagedError: The info.json holds a head, or the sealed log fails its check.
        """
        if stored.head is not None:
            raise damaged(
                self._where,
                state_id,
                f"its {INFO} says format {FORMAT_V1} (before digests) but holds the digest of"
                f" its last entry: its format was set back from {FORMAT_VERSION}",
            )
        sealed = [_unseal(line) for line in lines]
        if not any(digest is not None for digest, _ in sealed):
            return False
        entries = [entry for _, entry in sealed]
        check_chain(self._where, state_id, entries, [digest for digest, _ in sealed])
        if stored.info.entries > len(entries):
            raise _missing(self._where, state_id, stored.info.entries, len(entries))
        return True

    def _link_child(self, info: StateInfo) -> None:
        """Note in its parent's folder that the State of `info` is its child.

        Written before the child's entries, so a crash never leaves a stored child its parent
        does not know. A parent not saved in this store is not told.
        """
        assert info.parent_id is not None
        record = {"id": info.id, "call": info.parent_call_id}
        line = json.dumps(record, separators=(",", ":")).encode() + b"\n"
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | _OPEN_FLAGS
        try:
            fd = os.open(self._root / info.parent_id / CHILDREN, flags, _FILE_MODE)
        except (FileNotFoundError, NotADirectoryError):
            return
        try:
            _flock(fd, exclusive=True)
            size = os.fstat(fd).st_size
            if size and _read_at(fd, 1, size - 1) != b"\n":
                # A torn line (a write cut off by a crash): cut it, or this line would be glued
                # to it and the parent could not be recovered.
                os.ftruncate(fd, _last_line(fd, size)[0])
            _write_all(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    def _children_of(self, parent_id: str) -> builtins.list[StateInfo]:
        """The children saved in this store of the State `parent_id`, as its own list says.

        Only the links: recovery reads each child's own history to check its link (a child
        deleted since is left out there).
        """
        path = self._root / parent_id / CHILDREN
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return []
        children: dict[str, StateInfo] = {}
        for number, line in enumerate(data[: data.rfind(b"\n") + 1].split(b"\n")[:-1], 1):
            try:
                record: Any = json.loads(line)
                child_id, call = record["id"], record["call"]
                validate_id(child_id)
                if not isinstance(call, str):
                    raise TypeError("the call is not a str")
            except (ValueError, TypeError, KeyError):
                raise damaged(
                    self._where, parent_id, f"line {number} of {CHILDREN} cannot be read"
                ) from None
            children.setdefault(
                child_id, StateInfo(id=child_id, parent_id=parent_id, parent_call_id=call)
            )
        return builtins.list(children.values())

    # -- load, list, delete ----------------------------------------------------------------------

    def load(self, state_id: str) -> State:
        """The State saved under `state_id`, recovered if a turn was cut off, bound to this store.

        Raises:
            LookupError: Nothing is saved under `state_id`.
            ValueError: `state_id` is not a valid id (nothing is touched), or the State was
                stored in another format version (the message names both).
            StoreDamagedError: An entry is damaged, missing, repeated or moved, or info.json is
                damaged or missing (the message names the State and the entry's index).
            StoreError: The files cannot be read (the `OSError` is the cause).
        """
        validate_id(state_id, "state_id")
        with self._failures(state_id):
            state = self._read(state_id)
            children: builtins.list[StateInfo] = []
            if state.pending_calls:  # a cut-off call: the children it started stay listed
                for listed in to_adopt(state, self._children_of(state_id)):
                    try:
                        child = self._read(listed.id)
                    except LookupError:
                        continue  # deleted since
                    info = adopted(self._where, state, listed, child)
                    if info is not None:
                        children.append(info)
        recover_state(state, children)
        bind_state(state, self)
        return state

    def _read(self, state_id: str) -> State:
        """The State saved under `state_id` as its history holds it (not recovered, not bound)."""
        folder = self._root / state_id
        with self._lock_for(state_id):
            try:
                stored = self._read_info(folder, state_id)
            except LookupError:
                # A folder appears whole (renamed from a draft) and info.json is only ever
                # replaced: a log without it is damage, not an absent State.
                if not (folder / LOG).exists():
                    raise
                problem = f"{LOG} exists but {INFO} is missing"
                raise damaged(self._where, state_id, problem) from None
            try:
                fd = os.open(folder / LOG, os.O_RDONLY | _OPEN_FLAGS)
            except FileNotFoundError:
                problem = f"{INFO} exists but {LOG} is missing"
                raise damaged(self._where, state_id, problem) from None
            try:
                _flock(fd, exclusive=False)
                data = _read_all(fd)
            finally:
                os.close(fd)
        end = data.rfind(b"\n") + 1  # what follows is a torn line: ignored, cut on next append
        lines = data[:end].split(b"\n")[:-1]
        count = stored.info.entries
        if stored.format == FORMAT_V1 and not self._sealed_v1(state_id, stored, lines):
            if count > len(lines):  # no digests yet: the next save adds them
                raise _missing(self._where, state_id, count, len(lines))
            state = rebuild(state_id, lines, None, where=self._where)
        else:
            sealed = [_unseal(line) for line in lines]
            entries = [entry for _, entry in sealed]
            digests = [digest for digest, _ in sealed]
            if stored.format == FORMAT_V1:  # sealed by a migration a crash cut off: checked
                state = rebuild(state_id, entries, digests, where=self._where)
            else:
                state = rebuild(
                    state_id, entries, digests, where=self._where, count=count, head=stored.head
                )
            if entries:
                with self._lock_for(state_id):
                    known = self._tails.get(state_id)
                    if known is None or known.at == end:
                        tail = Tail(len(entries), entries[-1], None, digests[-1] or b"", end)
                        self._tails.put(state_id, tail.holding(state))
        return state

    # -- following a State (`orchestrator.Followable`, `AsyncFollowable`) -------------------------

    def entries(self, state_id: str, *, after: int = -1) -> tuple[HistoryEntry, ...]:
        """The stored entries of `state_id` after the `seq` `after`, checked as a load checks them.

        Raises:
            LookupError: Nothing is saved under `state_id`.
            ValueError: `state_id` or `after` is not valid.
            StoreDamagedError: An entry is damaged, missing, repeated or moved.
            StoreError: The files cannot be read (the `OSError` is the cause).
        """
        validate_id(state_id, "state_id")
        check_after(after)
        with self._failures(state_id):
            return entries_after(self._read(state_id), after)

    async def aentries(self, state_id: str, *, after: int = -1) -> tuple[HistoryEntry, ...]:
        """`entries` in a worker thread."""
        return await self._offload(self._entries, state_id, after)

    def _entries(self, state_id: str, after: int) -> tuple[HistoryEntry, ...]:
        return self.entries(state_id, after=after)

    async def await_entries(self, state_id: str, *, after: int = -1) -> tuple[HistoryEntry, ...]:
        """Wait for entries of `state_id` after `after`, and return them (see `AsyncFollowable`).

        Another process's appends are seen by polling the size of the State's log, at
        `stores.backend.POLL_FIRST` to `POLL_MOST` intervals; a cancellation ends the wait at once.
        """
        validate_id(state_id, "state_id")
        check_after(after)
        return await poll_entries(
            lambda: self.aentries(state_id, after=after),
            lambda: self._offload(self._log_size, state_id),
            watching=self._wakeups.watching(state_id),
        )

    # -- following a tree (`orchestrator.TreeFollowable`, `AsyncTreeFollowable`) ---------------

    def root_of(self, state_id: str) -> str:
        """The id of the root of the tree of the stored State `state_id`.

        Raises:
            LookupError: Nothing is saved under `state_id`.
            ValueError: `state_id` is not a valid id.
            StoreError: The files cannot be read (the `OSError` is the cause).
        """
        validate_id(state_id, "state_id")
        with self._failures(state_id):
            stored = self._read_info(self._root / state_id, state_id)
            return stored.fed.root or self._root_by_links(state_id, stored.info.parent_id)

    def tree_entries(
        self, root_id: str, *, after: str | None = None, limit: int | None = None
    ) -> tuple[TreeEntry, ...]:
        """The entries of the tree of `root_id` after the cursor `after`, in the order saved.

        The feed is the root's ``tree.jsonl`` (see `stores._file_feed`, which says its limits);
        the cursor is a byte offset in it. Each entry is read from its State's log and checked
        against the digest before it. A State written before feeds joins at its next save.

        Raises:
            LookupError: Nothing is saved under `root_id`.
            ValueError: `root_id` is not a root, or `after` or `limit` is not valid.
            StoreDamagedError: An entry, or a line of the feed, is damaged.
            StoreError: The files cannot be read (the `OSError` is the cause).
        """
        validate_id(root_id, "root_id")
        offset = _feed_offset(after)
        most = check_limit(limit)
        with self._failures(root_id):
            stored = self._read_info(self._root / root_id, root_id)
            root = stored.fed.root or self._root_by_links(root_id, stored.info.parent_id)
            if root != root_id:
                raise not_a_root(root_id, root)
            records = read_records(self._root / root_id, offset, after)
            logs: dict[tuple[str, str], int | None] = {}  # by State and generation: its log
            try:
                return self._entries_of(root_id, records, most, logs)
            finally:
                for fd in logs.values():
                    if fd is not None:
                        os.close(fd)

    def _entries_of(
        self,
        root_id: str,
        records: builtins.list[Record | int],
        most: int | None,
        logs: dict[tuple[str, str], int | None],
    ) -> tuple[TreeEntry, ...]:
        entries: builtins.list[TreeEntry] = []
        for record in records:
            if isinstance(record, int):
                problem = f"the line of its {FEED} that ends at byte {record} cannot be read"
                raise damaged(self._where, root_id, problem)
            state_id = record.state_id
            key = (state_id, record.generation)
            if key not in logs:
                logs[key] = self._log_of(state_id, record.generation)
            fd = logs[key]
            if fd is None:
                continue  # deleted since (and maybe saved again: its new lines follow)
            digest, line = _unseal(_read_at(fd, record.length, record.offset))
            previous: bytes | None = None
            if record.seq:
                before = _last_line(fd, record.offset)[1]
                previous = None if before is None else _unseal(before)[0]
            entry = check_link(self._where, state_id, record.seq, line, digest, previous)
            entries.append(TreeEntry(make_cursor(FEED_KIND, record.end), state_id, entry))
            if most is not None and len(entries) == most:
                break
        return tuple(entries)

    def _log_of(self, state_id: str, generation: str) -> int | None:
        """The log of `state_id`, open, if the State stored is of `generation`; else None."""
        if not _is_id(state_id):
            return None
        folder = self._root / state_id
        try:
            stored = self._read_info(folder, state_id)
        except LookupError:
            return None
        if stored.fed.generation != generation:
            return None
        try:
            return os.open(folder / LOG, os.O_RDONLY | _OPEN_FLAGS)
        except FileNotFoundError:
            return None

    async def aroot_of(self, state_id: str) -> str:
        """`root_of` in a worker thread."""
        return await self._offload(self.root_of, state_id)

    async def atree_entries(
        self, root_id: str, *, after: str | None = None, limit: int | None = None
    ) -> tuple[TreeEntry, ...]:
        """`tree_entries` in a worker thread."""
        return await self._offload(self._tree_entries, root_id, after, limit)

    def _tree_entries(
        self, root_id: str, after: str | None, limit: int | None
    ) -> tuple[TreeEntry, ...]:
        return self.tree_entries(root_id, after=after, limit=limit)

    async def await_tree_entries(
        self, root_id: str, *, after: str | None = None, limit: int | None = None
    ) -> tuple[TreeEntry, ...]:
        """Wait for entries of the tree of `root_id` after `after`; return them, in order.

        Another process's saves are seen by polling the size of the tree's feed, at
        `stores.backend.POLL_FIRST` to `POLL_MOST` intervals; a cancellation ends the wait at once.
        """
        validate_id(root_id, "root_id")
        _feed_offset(after)
        check_limit(limit)
        return await poll_entries(
            lambda: self.atree_entries(root_id, after=after, limit=limit),
            lambda: self._offload(feed_size, self._root / root_id),
            watching=self._wakeups.watching(root_id),
        )

    def _log_size(self, state_id: str) -> int:
        """The size of the log of `state_id` (-1: none): it grows with each save."""
        try:
            return os.stat(self._root / state_id / LOG).st_size
        except FileNotFoundError:
            return -1
        except OSError as error:
            raise StoreError(f"{self._where} failed (State {state_id!r}): {error}") from error

    def list(
        self, *, parent_id: str | None = None, limit: int | None = None
    ) -> builtins.list[StateInfo]:
        """The saved States, most recently updated first; only children of `parent_id` if set.

        A State whose info.json cannot be read is listed with its `damage` (and only its id).

        Raises:
            StoreError: The folder cannot be read (the `OSError` is the cause).
        """
        check_list_args(parent_id, limit)
        with self._failures(None):
            try:
                names = os.listdir(self._root)
            except FileNotFoundError:
                return []
            infos: builtins.list[StateInfo] = []
            for name in names:
                if not _is_id(name):
                    continue  # a folder being written or deleted, or a stranger
                try:
                    stored = self._read_info(self._root / name, name)
                    info = stored.info
                    if not stored.sealed:
                        raise damaged(self._where, name, _UNSEALED)
                except LookupError:
                    continue  # deleted meanwhile, or not a State's folder
                except ValueError as error:
                    info = StateInfo(id=name, damage=str(error))
                if parent_id is None or info.parent_id == parent_id:
                    infos.append(info)
        return select(infos, parent_id=parent_id, limit=limit)

    def _read_info(self, folder: Path, state_id: str) -> _Stored:
        """What the info.json of the State `state_id` in `folder` holds.

        Raises:
            LookupError: The folder has no info.json (no State is saved under this id).
            ValueError: info.json is of another format version.
            StoreDamagedError: info.json is damaged, or names another State.
        """
        path = folder / INFO
        try:
            data = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            raise LookupError(
                f"No State {state_id!r} in {self._where}: save it first, or pick an id from"
                " store.list()."
            ) from None
        try:
            loaded: Any = json.loads(data)
            if not isinstance(loaded, dict):
                raise ValueError("it is not a JSON object")
            fields = cast("dict[str, Any]", loaded)
            found = fields.pop("format", None)
            head: Any = fields.pop("head", None)
            seal: Any = fields.pop("seal", None)
            fields.pop("damage", None)
            fed = _fed_of(fields)
            if head is not None and not (isinstance(head, str) and len(head) == 2 * DIGEST_SIZE):
                raise ValueError(f"its head is {head!r:.50}, not a digest")
            sealed = isinstance(seal, str) and seal == _seal_of(head, fields)
            info = _INFO.validate_python(fields)
        except pydantic.ValidationError as error:
            problem = f"{error.error_count()} problems, first: {error.errors()[0]['msg']}"
            raise damaged(self._where, state_id, f"{INFO} cannot be read ({problem})") from None
        except ValueError as error:
            raise damaged(self._where, state_id, f"{INFO} cannot be read ({error})") from None
        version = check_format(
            found, where=f"State {state_id!r} ({path})", readable=(FORMAT_V1, FORMAT_V2)
        )
        if info.id != state_id:
            raise damaged(
                self._where, state_id, f"its {INFO} says it is State {info.id!r} (moved or copied?)"
            )
        try:
            digest = None if head is None else binascii.unhexlify(head)
        except binascii.Error:
            raise damaged(self._where, state_id, f"the head digest in {INFO} is not hex") from None
        # Format 1 had no seal (nor head: one that has is refused on load, see `_sealed_v1`).
        return _Stored(
            info, version, digest, sealed or (version == FORMAT_V1 and head is None), fed
        )

    def delete(self, state_id: str) -> None:
        """Delete the folder of the State `state_id` (nothing happens if it is absent).

        Raises:
            ValueError: `state_id` is not a valid id (nothing is touched).
        """
        validate_id(state_id, "state_id")
        with self._lock_for(state_id):
            self._tails.forget(state_id)
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
        _replace_file(folder, LOG, data)
        _fsync_folder(folder)
        fresh = _MemoryLog(data[: data.index(b"\n")])
        fresh.read(data, folder / LOG)
        self._logs[agent] = fresh


def _memory_line(record: dict[str, Any]) -> bytes:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def _memory_header() -> bytes:
    return _memory_line({"format": MEMORY_FORMAT, "log": uuid.uuid4().hex})


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
                found = MEMORY_FORMAT
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
        check_format(found, where=f"The agent memory in {path}", current=MEMORY_FORMAT)

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


def _encode_info(info: StateInfo, head: bytes | None, fed: Fed) -> bytes:
    fields: dict[str, Any] = _INFO.dump_python(info, mode="json", exclude={"damage"})
    record = {
        "format": FORMAT_VERSION,
        "head": None if head is None else head.hex(),
        "seal": _seal_of(None if head is None else head.hex(), fields),
        "root": fed.root,
        "generation": fed.generation,
        "fed": fed.count,
        "fed_at": fed.at,
        **fields,
    }
    return json.dumps(record, ensure_ascii=False).encode() + b"\n"


def _seal_of(head: str | None, fields: dict[str, Any]) -> str | None:
    """The seal the listed `fields` of an info.json should carry, in hex (None: no hex head).

    The fields are sealed as their JSON with sorted keys: the same whatever order a tool that
    rewrites the file puts them in.
    """
    try:
        digest = None if head is None else binascii.unhexlify(head)
    except binascii.Error:
        return None
    listing = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return listing_seal(digest, (listing,)).hex()


_UNSEALED = (
    f"its listed info in {INFO} does not match its seal (its title, times, turn, usage, stop,"
    " parent or entry count was changed); its history is whole, so it loads, and its next save"
    " writes the info again"
)


def _replace_info(folder: Path, info: StateInfo, head: bytes | None, fed: Fed) -> None:
    _replace_file(folder, INFO, _encode_info(info, head, fed))


def _feed_offset(after: str | None) -> int:
    """The byte offset a cursor of a tree's feed names (0: its start).

    Raises:
        ValueError: `after` is not a cursor of a `FileStore`.
    """
    parts = cursor_parts(after, FEED_KIND, FEED_EXAMPLE, 1)
    if parts is None:
        return 0
    if not parts[0].isdigit() or parts[0].startswith("0"):
        raise bad_cursor(after, FEED_EXAMPLE)
    return int(parts[0])


def _fed_of(fields: dict[str, Any]) -> Fed:
    """The place in its tree's feed that an info.json's `fields` keep (taken out of them).

    Raises:
        ValueError: A value is not of its type.
    """
    root, generation = fields.pop("root", None), fields.pop("generation", None)
    count, at = fields.pop("fed", 0), fields.pop("fed_at", 0)
    if root is not None and not (isinstance(root, str) and _is_id(root)):
        raise ValueError(f"its root is {root!r:.50}, not an id")
    if generation is not None and not isinstance(generation, str):
        raise ValueError(f"its generation is {generation!r:.50}, not a str")
    for value in (count, at):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"its place in the feed is {value!r:.50}, not an int >= 0")
    return Fed(root, generation, count, at)


def _replace_file(folder: Path, name: str, data: bytes) -> None:
    """Replace the file `name` in `folder` with `data` at once: written aside, then renamed."""
    draft = folder / f".{name}-{uuid.uuid4().hex}"
    try:
        _write_new_file(draft, data)
        os.replace(draft, folder / name)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(draft)


def _missing(where: str, state_id: str, count: int, found: int) -> Exception:
    return damaged(
        where,
        state_id,
        f"its {INFO} counts {count} history entries but {LOG} holds {found}:"
        f" {missing_entries(found, count)}",
    )
