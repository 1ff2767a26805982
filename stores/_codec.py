"""The stored format of history entries: one pydantic `TypeAdapter`, versioned.

Every backend writes an entry as the JSON text `encode_entry` gives and reads it back with
`decode_entry`. The format version is stored beside the entries (`FORMAT_VERSION`); a store
refuses data written in another version, naming both. JSON text never holds a raw newline, so
one entry is one line; split on the newline byte only (U+2028 may appear raw inside strings).
"""

from __future__ import annotations

from typing import Annotated, Any

import pydantic
import pydantic_core

from orchestrator import HistoryEntry

__all__ = ("FORMAT_VERSION", "check_format", "decode_entry", "encode_entry")

FORMAT_VERSION = 1

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


def decode_entry(data: str | bytes, *, state_id: str, index: int) -> HistoryEntry:
    """The entry stored as `data`, which must be entry `index` of the State `state_id`.

    Raises:
        ValueError: The data is not a valid entry, or its `seq` is not `index`. The message
            names the State and the index, so the damaged place can be found.
    """
    try:
        entry: HistoryEntry = _ENTRY.validate_json(data)
    except (pydantic.ValidationError, ValueError, TypeError) as error:
        raise ValueError(
            f"State {state_id!r}: history entry {index} is damaged and cannot be read"
            f" ({_first_problem(error)}). Restore the store from a backup, or delete the State."
        ) from None
    if entry.seq != index:
        raise ValueError(
            f"State {state_id!r}: history entry {index} says it is entry {entry.seq}; the"
            " stored history is out of order or has a gap. Restore the store from a backup, or"
            " delete the State."
        )
    return entry


def _first_problem(error: Exception) -> str:
    if isinstance(error, pydantic.ValidationError):
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return f"{where}: {first['msg']}" if where else str(first["msg"])
    return str(error)


def check_format(found: object, *, where: str) -> None:
    """Refuse data written in another format version than this library's.

    Raises:
        ValueError: `found` is not `FORMAT_VERSION`; the message names both versions.
    """
    if found == FORMAT_VERSION:
        return
    if isinstance(found, int) and not isinstance(found, bool) and found > FORMAT_VERSION:
        hint = "it was written by a newer orchestrator: upgrade orchestrator to read it"
    else:
        hint = "it was written by an older or unknown version: migrate it, or start a new store"
    raise ValueError(
        f"{where} has stored format version {found!r}, but this orchestrator reads version"
        f" {FORMAT_VERSION}; {hint}."
    )
