"""`Memory`: an agent's state that outlives its runs, kept in the store.

A memory belongs to one agent name in one store. It holds a key-value space (`get`, `set`,
`delete`) and typed document collections (`collection(name)`: `list`, `get`, `upsert`,
`remove`), each method with an async twin prefixed ``a``. Collections are declared with a
pydantic model; only declared collections are writable, and a document is validated by its
model before anything is stored (`ValidationError` with one `Issue` per problem otherwise).

What a store keeps (the memory primitive every backend implements, `MemoryBackend`): JSON text
under ``(agent, space, key)``, where the space is ``"kv"`` or ``"collection:<name>"``. This
module is the one place that encodes and decodes that text.

Effect keys: a write made while a tool call runs carries the key
``"<state id>:<call id>:<ordinal>"`` (the ordinal counts the call's writes from 0). The store
applies a write with a key it has seen once only, atomically with recording the key, so a call
run again with the same id (a replayed turn, a retried call) repeats no write, and a replayed
sequence upsert A, upsert B, upsert A still ends on its last write. Writes outside tool calls
carry no key and always apply.
"""

from __future__ import annotations

import builtins
import difflib
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any, cast

import pydantic

from .._base import _here
from .._base._errors import Issue, ValidationError
from .._base._json import freeze
from .._record._recording import validate_id
from .._record._storage import AsyncMemoryBackend, MemoryBackend
from .._record._store_client import AnyStore, StoreClient, client_of

__all__ = (
    "KV_SPACE",
    "Collection",
    "Memory",
    "collection_space",
    "no_memory_reason",
    "validate_key",
    "validate_space",
)

KV_SPACE = "kv"
"""The space of the key-value part of a memory."""

MAX_KEY = 512
MAX_SPACE = 128
_COLLECTION = re.compile(r"[A-Za-z0-9_-]{1,51}")


def collection_space(name: str) -> str:
    """The space that holds the documents of the collection `name`."""
    return f"collection:{name}"


# -- checks (shared with the stores) ------------------------------------------------------------


def _check_text(value: object, what: str, longest: int) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}.")
    if not value:
        raise ValueError(f"{what} is empty: give a non-empty str.")
    if len(value) > longest:
        raise ValueError(
            f"{what} is {len(value)} characters long, over the limit of {longest}: pick a"
            " shorter one."
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"{what} {value!r} holds a lone surrogate, which cannot be stored as UTF-8."
        ) from None
    return value


def validate_key(value: object, what: str = "key") -> str:
    """`value` if it is a valid memory key or document id: a str of 1 to 512 characters."""
    return _check_text(value, what, MAX_KEY)


def validate_space(value: object) -> str:
    """`value` if it is a valid memory space name: a str of 1 to 128 characters."""
    return _check_text(value, "space", MAX_SPACE)


# -- the codec: the one place memory values become text, and back -----------------------------


def _encode(value: Any, what: str) -> str:
    # freeze makes text valid (a lone surrogate becomes U+FFFD), as in a State, so it encodes.
    return json.dumps(freeze(value, what), ensure_ascii=False, separators=(",", ":"))


def _decode(text: object, where: str) -> Any:
    try:
        if not isinstance(text, str | bytes):
            raise TypeError(f"the store returned a {type(text).__name__}")
        return json.loads(text)
    except (ValueError, TypeError) as error:
        raise ValueError(
            f"{where} is damaged in the store and cannot be read ({error}). Write it again,"
            " or restore the store from a backup."
        ) from None


# -- the store ----------------------------------------------------------------------------------


def no_memory_reason(name: str | None, store: StoreClient | None) -> str | None:
    """Why an agent named `name` with `store` has no memory (None: it has one)."""
    if name is None and store is None:
        return (
            "the agent has no name and no store: add both, e.g. Agent(..., name='digest',"
            " store=SQLiteStore('agent.db'))"
        )
    if name is None:
        return "the agent has no name, which scopes its memory: add one, e.g. name='digest'"
    if store is None:
        return (
            "the agent has no store to keep its memory in: add one, e.g."
            " store=SQLiteStore('agent.db')"
        )
    if not store.keeps_memory:
        return (
            f"its store {store.store!r} keeps no agent memory: use MemoryStore, FileStore,"
            " SQLiteStore or AioSQLiteStore (or give the store memory_get, memory_scan and"
            " memory_put)"
        )
    return None


def _check_store(store: object) -> StoreClient:
    """The client of `store`, which must keep agent memory (anything else is a `TypeError`)."""
    if store is None or isinstance(store, StoreClient):  # an agent's: resolved already
        client = store
    else:  # any object is resolved (one keeping only memory too); one keeping none is refused
        client = client_of(cast("AnyStore", store))
    if client is None or not client.keeps_memory:
        shown = "None" if client is None else repr(client.store)
        raise TypeError(
            f"Memory needs a store that keeps agent memory, got {shown}: use MemoryStore,"
            " FileStore, SQLiteStore or AioSQLiteStore (a third-party store needs memory_get,"
            " memory_scan and memory_put, or their async twins)."
        )
    return client


def _effect_key() -> str | None:
    """The effect key of the next write of the tool call running here, or None."""
    place = _here.current()
    return None if place is None else place.effect_key()


class _Store:
    """Calls the memory methods of a store: the sync ones, or the async twins."""

    __slots__ = ("_client",)

    def __init__(self, client: StoreClient) -> None:
        self._client = client

    def check_sync(self, method: str, twin: str) -> MemoryBackend:
        """The sync memory methods; refuse an async-only store, naming `twin`."""
        return self._client.sync_memory(
            f"{self._client.store!r} works only asynchronously, so this memory does too: use"
            f" `await {twin}(...)` in async code (an async tool), or a store with sync"
            " methods such as SQLiteStore."
        )

    def call(self, method: str, twin: str, *args: Any, **kwargs: Any) -> Any:
        """Call the store's sync `method`; `twin` names the async method to use instead."""
        backend = self.check_sync(method, twin)
        methods: dict[str, Callable[..., Any]] = {
            "memory_get": backend.memory_get,
            "memory_scan": backend.memory_scan,
            "memory_put": backend.memory_put,
        }
        return methods[method](*args, **kwargs)

    async def acall(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Await the store's async twin of `method` (a sync-only store's runs in a thread)."""
        client = self._client
        methods: dict[str, Callable[..., Awaitable[Any]]] = {
            "memory_get": client.memory_get,
            "memory_scan": client.memory_scan,
            "memory_put": client.memory_put,
        }
        return await methods[method](*args, **kwargs)

    def put(self, agent: str, space: str, key: str, text: str | None, twin: str) -> None:
        """Write `text` (None: delete) under `key` of `agent`'s `space`, once per effect."""
        self.check_sync("memory_put", twin)
        effect = _effect_key()
        self.call("memory_put", twin, agent, space, key, text, effect=effect)

    async def aput(self, agent: str, space: str, key: str, text: str | None) -> None:
        """The async twin of `put`."""
        await self.acall("memory_put", agent, space, key, text, effect=_effect_key())


# -- documents ----------------------------------------------------------------------------------


def _check_model(name: str, model: object) -> type[pydantic.BaseModel]:
    if not (isinstance(model, type) and issubclass(model, pydantic.BaseModel)):
        raise TypeError(
            f"The collection {name!r} must be declared with a pydantic model class, e.g."
            f" collections={{{name!r}: Loop}} where `class Loop(pydantic.BaseModel): ...`;"
            f" got {model!r}."
        )
    for field, info in model.model_fields.items():
        if "id" in (field, info.alias):
            raise ValueError(
                f"The collection {name!r}: the model {model.__name__} has a field 'id', but a"
                " document's id is its key (upsert(id, doc)), which list() returns as 'id'."
                " Rename the field."
            )
    return model


def _check_collections(collections: object) -> dict[str, type[pydantic.BaseModel]]:
    if collections is None:
        return {}
    if not isinstance(collections, Mapping):
        raise TypeError(
            "collections maps collection names to pydantic models, e.g. {'loops': Loop}; got"
            f" {type(collections).__name__}."
        )
    checked: dict[str, type[pydantic.BaseModel]] = {}
    for name, model in cast("Mapping[object, object]", collections).items():
        if not isinstance(name, str) or not _COLLECTION.fullmatch(name):
            raise ValueError(
                f"The collection name {name!r} is not valid: use 1 to 51 letters, digits, '_' or"
                " '-' (the model gets tools named state_<name>_list, _upsert and _remove)."
            )
        checked[name] = _check_model(name, model)
    return checked


def _issues(error: pydantic.ValidationError, doc: object = None) -> tuple[Issue, ...]:
    """Each problem with its path into `doc`.

    Pydantic's locations also name the union member it tried (``("priority", "int")``); a
    part that cannot index the document where it stands is such a name, and is left out.
    """
    return tuple(
        Issue(_doc_path(doc, tuple(detail["loc"])), detail["msg"]) for detail in error.errors()
    )


def _doc_path(doc: object, loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
    path: list[str | int] = []
    current: object = doc
    for part in loc:
        if isinstance(current, Mapping):
            path.append(part)
            current = cast("Mapping[object, object]", current).get(part)
        elif isinstance(current, list) and isinstance(part, int):
            items = cast("list[object]", current)
            path.append(part)
            current = items[part] if -len(items) <= part < len(items) else None
        elif current is None:  # past what the document holds (a missing field): keep it all
            path.append(part)
        # else: a scalar cannot be indexed: the part names a union member, not a place
    return tuple(path)


def _same(a: object, b: object) -> bool:
    """JSON equality: numbers by value (1 == 1.0), but a bool is never a number."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        da, db = cast("dict[str, Any]", a), cast("dict[str, Any]", b)
        return da.keys() == db.keys() and all(_same(da[key], db[key]) for key in da)
    if isinstance(a, list) and isinstance(b, list):
        la, lb = cast("list[Any]", a), cast("list[Any]", b)
        return len(la) == len(lb) and all(_same(x, y) for x, y in zip(la, lb, strict=True))
    return (isinstance(a, str) and isinstance(b, str) and a == b) or (a is None and b is None)


def _check_where(where: object) -> dict[str, Any] | None:
    if where is None:
        return None
    if not isinstance(where, Mapping):
        raise TypeError(
            "where maps top-level fields to the values they must equal, e.g."
            f" where={{'status': 'open'}}; got {type(where).__name__}."
        )
    return cast("dict[str, Any]", freeze(where, "where"))


def _check_limit(limit: object) -> int | None:
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int or None, got {type(limit).__name__}.")
    if limit < 0:
        raise ValueError(f"limit must be >= 0 (or None for all), got {limit}.")
    return limit


class Collection:
    """The documents of one collection of a `Memory`: ``memory.collection("loops")``.

    A document is a JSON object stored under its id. `list` returns each as
    ``{"id": id, **doc}``, in id order. `upsert` validates the document with the collection's
    pydantic model and stores the model's output (its JSON dump, by alias); `remove` deletes
    it. A collection the memory does not declare can be read, not written.

    Example:
        ```python
        loops = memory.collection("loops")
        loops.upsert("reply-anna", {"title": "Reply to Anna", "status": "open"})
        loops.list(where={"status": "open"}, limit=10)
        # [{'id': 'reply-anna', 'title': 'Reply to Anna', 'status': 'open', 'due': None}]
        loops.remove("reply-anna")
        ```
    """

    __slots__ = ("_memory", "_model", "_name", "_space", "_store")

    def __init__(
        self, memory: Memory, store: _Store, name: str, model: type[pydantic.BaseModel] | None
    ) -> None:
        self._memory = memory
        self._store = store  # the memory's
        self._name = name
        self._model = model
        self._space = collection_space(name)

    def __repr__(self) -> str:
        model = "undeclared" if self._model is None else self._model.__name__
        return f"<Collection {self._name!r} of {self._memory.agent_name!r} ({model})>"

    @property
    def name(self) -> str:
        """The collection's name."""
        return self._name

    @property
    def model(self) -> type[pydantic.BaseModel] | None:
        """The pydantic model documents are validated with (None: not declared, read-only)."""
        return self._model

    # -- the sans-IO core -------------------------------------------------------------------------

    def _where(self, doc_id: str) -> str:
        return f"Document {doc_id!r} of the collection {self._name!r} ({self._memory.agent_name})"

    def _document(self, key: str, text: object) -> dict[str, Any]:
        doc = _decode(text, self._where(key))
        if not isinstance(doc, dict):
            raise ValueError(
                f"{self._where(key)} is not a JSON object in the store: upsert it again, or"
                " remove it."
            )
        fields = cast("dict[str, Any]", doc)
        return {"id": key, **{name: value for name, value in fields.items() if name != "id"}}

    def _writable(self, action: str) -> type[pydantic.BaseModel]:
        if self._model is not None:
            return self._model
        declared = list(self._memory.collections)
        close = difflib.get_close_matches(self._name, declared, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"Cannot {action} in the collection {self._name!r}: the memory of"
            f" {self._memory.agent_name!r} does not declare it (declared:"
            f" {', '.join(declared) or 'none'}).{hint} Only declared collections are writable:"
            f" add it to collections={{{self._name!r}: Model}}."
        )

    def _validated(self, doc_id: object, doc: object) -> tuple[str, str, dict[str, Any]]:
        """The key, the stored text and the stored document of an upsert; nothing is stored."""
        model = self._writable("upsert")
        key = validate_key(doc_id, "id")
        if isinstance(doc, pydantic.BaseModel) and not isinstance(doc, model):
            doc = doc.model_dump()
        try:
            instance = model.model_validate(doc)
        except pydantic.ValidationError as error:
            given = cast("object", doc) if isinstance(doc, Mapping) else None
            issues = _issues(error, given)
            shown = "; ".join(str(issue) for issue in issues)
            raise ValidationError(
                f"{self._where(key)} does not fit {model.__name__}, so nothing was stored: {shown}",
                issues,
            ) from None
        output: Any = instance.model_dump(mode="json", by_alias=True)
        if "id" in output:
            issue = Issue(("id",), "'id' is the document's key: pass it as upsert(id, doc)")
            raise ValidationError(
                f"{self._where(key)}: {issue}. Nothing was stored.", (issue,)
            ) from None
        return key, _encode(output, "the document"), {"id": key, **output}

    def _selected(
        self, rows: object, where: dict[str, Any] | None, limit: int | None
    ) -> builtins.list[dict[str, Any]]:
        chosen: builtins.list[dict[str, Any]] = []
        for key, text in cast("builtins.list[tuple[str, str]]", rows):
            if limit is not None and len(chosen) >= limit:
                break
            doc = self._document(key, text)
            if where is None or all(
                field in doc and _same(doc[field], value) for field, value in where.items()
            ):
                chosen.append(doc)
        return chosen

    # -- the sync and async shells ----------------------------------------------------------------

    def list(
        self, where: Mapping[str, Any] | None = None, limit: int | None = None
    ) -> builtins.list[dict[str, Any]]:
        """The documents as ``{"id": id, **doc}``, in id order.

        Args:
            where: Keep the documents whose top-level fields equal these values (JSON
                equality: ``1 == 1.0``, but ``True`` is not ``1``); ``"id"`` works too.
            limit: Return at most this many (None: all).

        Raises:
            TypeError, ValueError: `where` is not a dict of JSON values, or `limit` is not
                None or an int >= 0; the store is async-only (use `alist`).
        """
        checked, count = _check_where(where), _check_limit(limit)
        rows = self._store.call(
            "memory_scan", "collection.alist", self._memory.agent_name, self._space
        )
        return self._selected(rows, checked, count)

    async def alist(
        self, where: Mapping[str, Any] | None = None, limit: int | None = None
    ) -> builtins.list[dict[str, Any]]:
        """The async twin of `list`."""
        checked, count = _check_where(where), _check_limit(limit)
        rows = await self._store.acall("memory_scan", self._memory.agent_name, self._space)
        return self._selected(rows, checked, count)

    def get(self, id: str) -> dict[str, Any] | None:
        """The document `id` as ``{"id": id, **doc}``, or None if there is none."""
        key = validate_key(id, "id")
        text = self._store.call(
            "memory_get", "collection.aget", self._memory.agent_name, self._space, key
        )
        return None if text is None else self._document(key, text)

    async def aget(self, id: str) -> dict[str, Any] | None:
        """The async twin of `get`."""
        key = validate_key(id, "id")
        text = await self._store.acall("memory_get", self._memory.agent_name, self._space, key)
        return None if text is None else self._document(key, text)

    def upsert(self, id: str, doc: Any) -> dict[str, Any]:
        """Validate `doc` with the collection's model, then create or replace the document `id`.

        The model's output is stored (defaults filled in, unknown fields dropped unless the
        model keeps them). Returns the stored document as ``{"id": id, **doc}``.

        Raises:
            ValidationError: `doc` does not fit the model; `.issues` holds each problem with
                its path (e.g. ``("status",)``). Nothing is stored.
            ValueError: The collection is not declared (only declared ones are writable), or
                `id` is empty or longer than 512 characters.
            TypeError: The store is async-only (use `aupsert`).
        """
        key, text, stored = self._validated(id, doc)
        self._store.put(self._memory.agent_name, self._space, key, text, "collection.aupsert")
        return stored

    async def aupsert(self, id: str, doc: Any) -> dict[str, Any]:
        """The async twin of `upsert`."""
        key, text, stored = self._validated(id, doc)
        await self._store.aput(self._memory.agent_name, self._space, key, text)
        return stored

    def remove(self, id: str) -> None:
        """Delete the document `id` (nothing happens if there is none).

        Raises:
            ValueError: The collection is not declared (only declared ones are writable).
            TypeError: The store is async-only (use `aremove`).
        """
        self._writable("remove")
        self._store.put(
            self._memory.agent_name, self._space, validate_key(id, "id"), None, "collection.aremove"
        )

    async def aremove(self, id: str) -> None:
        """The async twin of `remove`."""
        self._writable("remove")
        await self._store.aput(self._memory.agent_name, self._space, validate_key(id, "id"), None)


class Memory:
    """An agent's state that outlives its runs: key-value data and typed collections.

    It is scoped to the agent name and kept in the store, so two agents with different names
    never see each other's memory, and a later run (in this process or another) sees what an
    earlier one wrote. An `Agent` with a name and a store has one (`agent.memory`); a tool gets
    it by a parameter annotated `Memory`. `Memory.open` builds the same thing for scripts,
    admin tasks and tests.

    Values are JSON (dicts with str keys, lists, str, int, float, bool, None; dataclasses and
    pydantic models become dicts) and come back as new plain dicts and lists. Each method has
    an async twin prefixed ``a``; with an async-only store (`AioSQLiteStore`) only those work.

    Example:
        ```python
        memory = Memory.open("digest", {"loops": Loop}, MemoryStore())
        memory.set("lastUid", 1042)
        memory.get("lastUid")  # 1042
        memory.collection("loops").upsert("reply-anna", {"title": "Reply", "status": "open"})
        ```
    """

    __slots__ = ("_agent", "_collections", "_handles", "_raw_store", "_store")

    def __init__(
        self,
        agent_name: str,
        collections: Mapping[str, type[pydantic.BaseModel]] | None,
        store: object,
    ) -> None:
        """The memory of the agent `agent_name` in `store`; see `open`."""
        self._agent = validate_id(agent_name, "agent_name")
        declared = _check_collections(collections)
        self._collections: Mapping[str, type[pydantic.BaseModel]] = MappingProxyType(declared)
        client = _check_store(store)
        self._raw_store = cast("MemoryBackend | AsyncMemoryBackend", client.store)
        self._store = _Store(client)
        self._handles = {
            name: Collection(self, self._store, name, model) for name, model in declared.items()
        }

    @classmethod
    def open(
        cls,
        agent_name: str,
        collections: Mapping[str, type[pydantic.BaseModel]] | None,
        store: object,
    ) -> Memory:
        """The memory of the agent `agent_name` in `store`, outside any run.

        Args:
            agent_name: The agent's name (what ``Agent(name=...)`` says): 1 to 128 letters,
                digits, ``_`` or ``-``.
            collections: The declared collections, ``{"loops": LoopModel}`` (None: none).
            store: A store that keeps agent memory (`MemoryStore`, `FileStore`,
                `SQLiteStore`, `AioSQLiteStore`).

        Raises:
            TypeError: A collection's model is not a pydantic model class, or the store keeps
                no memory.
            ValueError: The agent name or a collection name is not valid, or a model has a
                field named ``id`` (the id is the document's key).
        """
        return cls(agent_name, collections, store)

    def __repr__(self) -> str:
        return f"<Memory of {self._agent!r} in {self._raw_store!r}>"

    @property
    def agent_name(self) -> str:
        """The name of the agent this memory belongs to."""
        return self._agent

    @property
    def store(self) -> MemoryBackend | AsyncMemoryBackend:
        """The store the memory is kept in."""
        return self._raw_store

    @property
    def collections(self) -> Mapping[str, type[pydantic.BaseModel]]:
        """The declared collections: name to pydantic model (read-only)."""
        return self._collections

    def collection(self, name: str) -> Collection:
        """The collection `name`; an undeclared one can be read but not written.

        Raises:
            ValueError: `name` is not a valid collection name.
        """
        handle = self._handles.get(name)
        if handle is not None:
            return handle
        if not isinstance(name, str) or not _COLLECTION.fullmatch(name):
            raise ValueError(
                f"The collection name {name!r} is not valid: use 1 to 51 letters, digits, '_' or"
                f" '-' (declared: {', '.join(self._collections) or 'none'})."
            )
        return Collection(self, self._store, name, None)

    # -- key-value ------------------------------------------------------------------------------

    def _key_where(self, key: str) -> str:
        return f"The memory key {key!r} of {self._agent!r}"

    def get(self, key: str) -> Any:
        """The value stored under `key`, or None when there is none.

        Raises:
            TypeError, ValueError: `key` is not a str of 1 to 512 characters; the store is
                async-only (use `aget`).
        """
        key = validate_key(key)
        text = self._store.call("memory_get", "memory.aget", self._agent, KV_SPACE, key)
        return None if text is None else _decode(text, self._key_where(key))

    async def aget(self, key: str) -> Any:
        """The async twin of `get`."""
        key = validate_key(key)
        text = await self._store.acall("memory_get", self._agent, KV_SPACE, key)
        return None if text is None else _decode(text, self._key_where(key))

    def set(self, key: str, value: Any) -> None:
        """Store the JSON `value` under `key`, replacing what was there.

        Raises:
            TypeError: `value` is not JSON (the message names the place), or the store is
                async-only (use `aset`).
            ValueError: `key` is not a str of 1 to 512 characters.
        """
        key = validate_key(key)
        self._store.put(
            self._agent, KV_SPACE, key, _encode(value, f"memory[{key!r}]"), "memory.aset"
        )

    async def aset(self, key: str, value: Any) -> None:
        """The async twin of `set`."""
        key = validate_key(key)
        await self._store.aput(self._agent, KV_SPACE, key, _encode(value, f"memory[{key!r}]"))

    def delete(self, key: str) -> None:
        """Forget the value under `key` (nothing happens if there is none)."""
        key = validate_key(key)
        self._store.put(self._agent, KV_SPACE, key, None, "memory.adelete")

    async def adelete(self, key: str) -> None:
        """The async twin of `delete`."""
        key = validate_key(key)
        await self._store.aput(self._agent, KV_SPACE, key, None)
