"""The stored format of history entries: one pydantic `TypeAdapter`, versioned and chained.

Every backend writes an entry as the JSON text `encode_entry` gives and reads it back with
`decode_entry`. JSON text never holds a raw newline, so one entry is one line; split on the
newline byte only (U+2028 may appear raw inside strings).

Each stored entry carries a digest (`chain_digests`): BLAKE2b of its encoded line and of the
digest before it, the first chained from the State's id. A load checks the whole chain
(`check_chain`), so an edited byte, a removed, repeated or reordered entry, or entries copied
from another State are a `StoreDamagedError` naming the State and the entry, never a silently
different State. The digests detect damage and careless edits; they are not a signature (anyone
who can write the store can compute them again).

The format version is stored beside the entries (`FORMAT_VERSION`). Version 1 had no digests: a
store reads it and adds them (`FORMAT_V1`); version 2 had no feeds of trees: a store reads it
and adds them (`FORMAT_V2`); any other version is refused, naming both.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Annotated, Any

import pydantic
import pydantic_core

from orchestrator import HistoryEntry, StoreDamagedError

__all__ = (
    "DIGEST_SIZE",
    "FORMAT_V1",
    "FORMAT_V2",
    "FORMAT_VERSION",
    "chain_digests",
    "check_chain",
    "check_format",
    "damaged",
    "decode_entry",
    "encode_entry",
    "first_digest",
    "listing_seal",
    "missing_entries",
)

FORMAT_VERSION = 3
"""The stored format this library writes: 3 since a store keeps the feed of each tree of States.

Version 2 (entries carry chained digests) is read and migrated: an SQL store gives its
entries their places in the feed when it opens, a `FileStore` State joins its tree's feed at
its next save.
"""
FORMAT_V2 = 2
"""The format before the feeds of trees: still read, and migrated."""
FORMAT_V1 = 1
"""The format before digests: still read, and given digests when its store is written."""
DIGEST_SIZE = 16
"""Bytes of an entry's digest (BLAKE2b-128)."""

_ENTRY: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(
    Annotated[HistoryEntry, pydantic.Field(discriminator="kind")],
    config=pydantic.ConfigDict(ser_json_bytes="base64", val_json_bytes="base64"),
)


def _serializers_by_kind() -> dict[str, pydantic_core.SchemaSerializer]:
    """One serializer per entry kind, made from the union's own schema (so the same bytes).

    Going through the tagged union costs about twice as much per entry as the serializer of
    the entry's kind, and a store encodes every entry it writes. Should a pydantic version lay
    the schema out otherwise, there are none, and `encode_entry` uses the union.
    """
    schema: Any = _ENTRY.core_schema
    definitions: list[Any] = schema["definitions"] if schema["type"] == "definitions" else []
    union = schema["schema"] if schema["type"] == "definitions" else schema
    if union["type"] != "tagged-union":
        return {}
    config = pydantic_core.CoreConfig(ser_json_bytes="base64", val_json_bytes="base64")
    return {
        kind: pydantic_core.SchemaSerializer(
            {"type": "definitions", "schema": choice, "definitions": definitions}, config
        )
        for kind, choice in union["choices"].items()
        if isinstance(kind, str)
    }


_BY_KIND = _serializers_by_kind()


def encode_entry(entry: HistoryEntry) -> bytes:
    """`entry` as one line of JSON (UTF-8, no newline)."""
    serializer = _BY_KIND.get(entry.kind)
    return _ENTRY.dump_json(entry) if serializer is None else serializer.to_json(entry)


def decode_entry(
    data: str | bytes, *, state_id: str, index: int, where: str = "the store"
) -> HistoryEntry:
    """The entry stored as `data`, which must be entry `index` of the State `state_id`.

    Raises:
        StoreDamagedError: The data is not a valid entry, or its `seq` is not `index`. The
            message names `where` (the store), the State and the index.
    """
    try:
        entry: HistoryEntry = _ENTRY.validate_json(data)
    except (pydantic.ValidationError, ValueError, TypeError) as error:
        raise damaged(
            where, state_id, f"history entry {index} cannot be read ({_first_problem(error)})"
        ) from None
    if entry.seq != index:
        raise damaged(
            where,
            state_id,
            f"history entry {index} says it is entry {entry.seq}: the stored history is out of"
            " order or has a gap",
        )
    return entry


def damaged(where: str, state_id: str, problem: str) -> StoreDamagedError:
    """The error for damage in the stored State `state_id`: where, what, and what to do."""
    return StoreDamagedError(
        f"{where}: State {state_id!r} is damaged: {problem}. Restore the store from a backup,"
        f" or delete the State (store.delete({state_id!r})) to keep the others."
    )


def missing_entries(found: int, count: int) -> str:
    """Which entries are missing when `found` of `count` are stored: "entry 3 is missing"."""
    if count - found == 1:
        return f"history entry {found} is missing"
    return f"history entries {found} to {count - 1} are missing"


def first_digest(state_id: str) -> bytes:
    """The digest an empty history of `state_id` ends with: where its chain starts."""
    return hashlib.blake2b(state_id.encode(), digest_size=DIGEST_SIZE).digest()


def chain_digests(previous: bytes, lines: Iterable[bytes]) -> list[bytes]:
    """The digest of each of `lines`, chained from `previous` (the digest before the first)."""
    blake2b = hashlib.blake2b
    digests: list[bytes] = []
    for line in lines:
        previous = blake2b(previous + line, digest_size=DIGEST_SIZE).digest()
        digests.append(previous)
    return digests


def listing_seal(head: bytes | None, listing: Sequence[object]) -> bytes:
    """The digest of a State's listed info (`listing`, as stored), chained to its `head`.

    What `list` shows (title, times, turn, stopped, usage, parent ids, the entry count) is
    stored beside the history, not in it: a store keeps this seal with it and checks it when it
    lists, so an edited listing shows as damage instead of a different title or usage.
    `listing` is the values the backend stores, in its order (a row's columns; str, int,
    float, bool or None each); `head` is the digest of the State's last entry (None: none).
    A row's ``repr`` is the canonical form: exact for these types, and cheaper than JSON.
    """
    data = repr(tuple(listing)).encode("utf-8", "surrogatepass")
    return hashlib.blake2b((head or b"") + data, digest_size=DIGEST_SIZE).digest()


def check_chain(
    where: str,
    state_id: str,
    lines: Sequence[bytes],
    digests: Sequence[object],
    *,
    head: object = None,
    count: int | None = None,
) -> None:
    """Check the stored digests of a whole history, and what the State's info says of it.

    `digests[i]` is the stored digest of `lines[i]`. `count` and `head` are what the State's
    info (its row, its info file) says: how many entries are stored and the last one's digest.
    A log may hold more entries than its info counts (a crash between the two writes), never
    fewer.

    Raises:
        StoreDamagedError: The first entry whose digest does not match (changed, or an entry
            before it removed, repeated or reordered), or entries missing from the end.
    """
    previous = first_digest(state_id)
    blake2b = hashlib.blake2b
    for index, line in enumerate(lines):
        previous = blake2b(previous + line, digest_size=DIGEST_SIZE).digest()
        if previous != digests[index]:
            raise damaged(
                where,
                state_id,
                f"history entry {index} fails its integrity check (it was changed, or an entry"
                " before it was removed, repeated or moved)",
            )
    if count is None:
        return
    if count < 0:
        raise damaged(where, state_id, f"its info counts {count} history entries")
    if count > len(lines):
        raise damaged(
            where,
            state_id,
            f"its info counts {count} history entries but {len(lines)} are stored:"
            f" {missing_entries(len(lines), count)}",
        )
    if count and head != digests[count - 1]:
        raise damaged(
            where,
            state_id,
            f"history entry {count - 1} does not match the digest its info holds (the entries"
            " or the info were changed)",
        )


def _first_problem(error: Exception) -> str:
    if isinstance(error, pydantic.ValidationError):
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return f"{where}: {first['msg']}" if where else str(first["msg"])
    return str(error)


def check_format(
    found: object, *, where: str, current: int = FORMAT_VERSION, readable: Sequence[int] = ()
) -> int:
    """The format version `found`, if this library reads it: `current`, or one of `readable`.

    Raises:
        ValueError: A newer version; the message names both, and says to upgrade.
        StoreDamagedError: A version no orchestrator wrote (or none): damage, naming both.
    """
    if isinstance(found, int) and not isinstance(found, bool):
        if found == current or found in readable:
            return found
        if found > current:
            raise ValueError(
                f"{where} has stored format version {found!r}, but this orchestrator reads"
                f" version {current}; it was written by a newer orchestrator: upgrade"
                " orchestrator to read it."
            )
    # No orchestrator wrote this version (or none at all): the version itself is damaged.
    raise StoreDamagedError(
        f"{where} has stored format version {found!r}, but this orchestrator reads version"
        f" {current}; it was written by an older or unknown version, or is damaged: restore it"
        " from a backup, or start a new store."
    )
