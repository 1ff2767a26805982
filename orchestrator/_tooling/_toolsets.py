"""Toolsets: tools an agent gets only when a run opens them, such as an MCP server's.

An item of ``Agent(tools=[...])`` may be a `Toolset`. Its tools are not known when the Agent is
built (building touches no network): each run opens the toolset before it starts and closes it
when it returns, and the tools the toolset gives join the agent's own for that run. A step called
on its own (``await agent.athink(state)`` outside a run) opens them for that step.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any, ClassVar, Protocol, TypeVar

from ._tools import Tool

__all__ = ("Toolset", "WithToolsets", "open_toolsets")


class Toolset(ABC):
    """Tools known only once something is open: a connection to a server, for example.

    Put one in ``Agent(tools=[...])``. A run enters ``toolset.open()`` before it starts and
    leaves it when it returns (after a failure or a cancellation too); the tools it yields are
    the agent's for that run, beside its own. Subclass it and write `open`.

    Attributes:
        name: What error messages call the toolset.
    """

    name: str = "toolset"

    @abstractmethod
    def open(self) -> AbstractAsyncContextManager[Sequence[Tool]]:
        """An async context manager that yields the tools and closes what it opened on exit.

        Each run enters it once, in the task that runs the agent, so it may hold a task group.
        """


class WithToolsets(Protocol):
    """Settings that hold tools and toolsets: what `open_toolsets` opens.

    A dataclass (the run's settings), so it can give a copy with the opened tools added.
    """

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    @property
    def tools(self) -> Mapping[str, Tool]:
        """The tools, by name."""
        ...

    @property
    def toolsets(self) -> Sequence[Toolset]:
        """The toolsets to open."""
        ...


_Settings = TypeVar("_Settings", bound=WithToolsets)


@asynccontextmanager
async def open_toolsets(settings: _Settings) -> AsyncGenerator[_Settings]:
    """Open the toolsets of `settings`; yield the settings with their tools added.

    Raises:
        ValueError: A toolset's tool has the name of another tool of the agent.
        TypeError: A toolset yielded something that is not a `Tool`.
    """
    async with AsyncExitStack() as stack:
        tools = dict(settings.tools)
        for toolset in settings.toolsets:
            given = await stack.enter_async_context(toolset.open())
            for item in given:
                if not isinstance(item, Tool):
                    raise TypeError(
                        f"The toolset {toolset.name!r} gave {item!r}, not a Tool: its open()"
                        " must yield a list of Tool objects."
                    )
                if item.name in tools:
                    raise ValueError(
                        f"The toolset {toolset.name!r} has a tool named {item.name!r}, and the"
                        " agent has one already: tool names must be unique. Give the toolset a"
                        " prefix, or leave one of the two out."
                    )
                tools[item.name] = item
        yield dataclasses.replace(
            settings,
            tools=tools,
            handlers={name: item.output_handlers for name, item in tools.items()},
            specs=tuple(item.spec for item in tools.values()),
        )
