"""The memory of an `Agent`, and the tools its collections give the model.

For each declared collection the model gets three tools: ``state_<name>_list`` (read only:
``where``, ``limit``), ``state_<name>_upsert`` (``id``, and ``doc`` with the collection model's
JSON schema) and ``state_<name>_remove`` (``id``). A document that does not fit the model comes
back to the model as an error result listing each problem with its path, so it can call again
with the problems fixed. An agent's own tool with the same name wins: the generated one is left
out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, cast

import pydantic

from .._base._errors import ToolError, ValidationError
from .._record._store_client import StoreClient
from ._memory import Collection, Memory, no_memory_reason
from ._tools import FunctionTool, Tool

__all__ = ("agent_memory", "collection_tools", "memory_required")

_ANNOTATED: Any = cast("Any", Annotated)  # built at run time, from a model known then
_ID_DOC = "The document's id: a short stable key such as 'reply-anna'."


def agent_memory(name: str | None, store: StoreClient | None, collections: Any) -> Memory | None:
    """The memory of an agent with these settings; None when it has none.

    An agent has a memory when it has a name and a store that keeps memory.

    Raises:
        ValueError: `collections` is given, but the agent has no name or no store.
        TypeError: `collections` is given, but the store keeps no memory; or a collection is
            not declared with a pydantic model class.
    """
    reason = no_memory_reason(name, store)
    if reason is None:
        assert name is not None
        return Memory(name, collections, store)
    if collections is not None:
        error = TypeError if name is not None and store is not None else ValueError
        raise error(f"Agent(collections=...) needs agent memory, but {reason}.")
    return None


def memory_required(name: str | None, store: StoreClient | None) -> ValueError:
    """The error for using the memory of an agent that has none."""
    reason = no_memory_reason(name, store) or "it has none"
    return ValueError(f"This agent has no memory: {reason}.")


def collection_tools(memory: Memory | None, tools: tuple[Tool, ...]) -> tuple[Tool, ...]:
    """`tools` followed by the tools of `memory`'s collections whose names are free.

    Raises:
        ValueError: A tool has a parameter annotated `Memory` (not ``Memory | None``) and the
            agent has no memory.
    """
    if memory is None:
        for item in tools:
            if item.needs_memory:
                raise ValueError(
                    f"The tool {item.name!r} takes the agent's memory (a parameter annotated"
                    " Memory), but the agent has none: give the Agent a name= and a store=, or"
                    " annotate the parameter `Memory | None`."
                )
        return tools
    taken = {item.name for item in tools}
    generated: list[Tool] = []
    for name in memory.collections:
        handle = memory.collection(name)
        for made in (_list_tool(handle), _upsert_tool(handle), _remove_tool(handle)):
            if made.name not in taken:
                generated.append(made)
    return (*tools, *generated)


def _about(handle: Collection) -> str:
    model = handle.model
    doc = (model.__doc__ or "").strip() if model is not None else ""
    inherited = doc == (pydantic.BaseModel.__doc__ or "").strip()
    return "" if not doc or inherited else f" The documents: {doc}"


def _list_tool(handle: Collection) -> Tool:
    async def run(
        where: Annotated[
            dict[str, Any] | None,
            "Keep the documents whose top-level fields equal these values, e.g."
            ' {"status": "open"}.',
        ] = None,
        limit: Annotated[int | None, "Return at most this many documents."] = None,
    ) -> Any:
        try:
            return await handle.alist(where=where, limit=limit)
        except (TypeError, ValueError) as error:
            raise ToolError(str(error)) from None

    name = handle.name
    return FunctionTool(
        run,
        name=f"state_{name}_list",
        description=(
            f"List the documents of the '{name}' collection, kept in your memory across"
            ' conversations. Each comes back as {"id": ..., **fields}, in id order.'
            f"{_about(handle)}"
        ),
        read_only=True,
    )


def _strict(model: type[pydantic.BaseModel] | None) -> Any:
    """The collection's model, refusing fields it does not declare.

    A field the model misspells is then an input error it can fix, not data silently dropped
    (the schema it is shown says ``additionalProperties: false``). A model that allows extra
    fields keeps them.
    """
    if model is None or model.model_config.get("extra") == "allow":
        return model
    namespace = {
        "model_config": pydantic.ConfigDict(extra="forbid"),
        "__module__": model.__module__,
        "__doc__": model.__doc__,  # the schema's description
    }
    return type(model.__name__, (model,), namespace)


def _doc_type(model: type[pydantic.BaseModel] | None) -> Any:
    """The type of the upsert tool's `doc`.

    It is the strict model, or a plain object when the model has no JSON schema (the seed:
    "the doc's JSON Schema, when the schema can produce one").
    """
    strict = _strict(model)
    try:
        pydantic.TypeAdapter(strict).json_schema()
    except pydantic.PydanticUserError:  # e.g. a field of a type JSON schema cannot describe
        return dict[str, Any]
    return strict


def _upsert_tool(handle: Collection) -> Tool:
    async def run(id: str, doc: Any) -> str:
        try:
            stored = await handle.aupsert(id, doc)
        except ValidationError as error:
            problems = "\n".join(f"- doc.{issue}" for issue in error.issues) or str(error)
            raise ToolError(
                f"The document was not stored:\n{problems}\nCall again with it fixed."
            ) from None
        except (TypeError, ValueError) as error:
            raise ToolError(str(error)) from None
        return f"Saved {id!r} in {handle.name}: {_json(stored)}"

    # The document's parameter is typed by the collection's model: its JSON schema is the tool's,
    # and a document that does not fit is an input error listing each problem with its path.
    run.__annotations__ = {
        "id": Annotated[str, pydantic.Field(min_length=1, max_length=512, description=_ID_DOC)],
        "doc": _ANNOTATED[
            _doc_type(handle.model), "The whole document: it replaces any stored one."
        ],
        "return": str,
    }
    name = handle.name
    return FunctionTool(
        run,
        name=f"state_{name}_upsert",
        description=(
            f"Create or replace the document `id` of the '{name}' collection, kept in your"
            f" memory across conversations.{_about(handle)}"
        ),
    )


def _remove_tool(handle: Collection) -> Tool:
    async def run(id: str) -> str:
        try:
            if await handle.aget(id) is None:
                return f"No document {id!r} in {handle.name}: nothing to remove."
            await handle.aremove(id)
        except (TypeError, ValueError) as error:
            raise ToolError(str(error)) from None
        return f"Removed {id!r} from {handle.name}."

    run.__annotations__ = {
        "id": Annotated[str, pydantic.Field(min_length=1, max_length=512, description=_ID_DOC)],
        "return": str,
    }
    name = handle.name
    return FunctionTool(
        run,
        name=f"state_{name}_remove",
        description=f"Delete the document `id` from the '{name}' collection of your memory.",
    )


def _json(value: Mapping[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False)
