"""Running the async core from sync code: the one bridge, at the top of the API.

A sync method called from plain code starts an event loop (`anyio.run`). Called from a worker
thread of a running async run (a sync tool, a sync loop body), it hops onto that loop
(`anyio.from_thread.run`). Called on a thread that runs an event loop, it would deadlock, so it
raises `TypeError` naming the async twin.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.from_thread

__all__ = ("run_sync",)

_T = TypeVar("_T")


def _event_loop_running_here() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        return True
    trio: Any = sys.modules.get("trio")
    if trio is not None:
        try:
            trio.lowlevel.current_trio_token()
        except RuntimeError:
            return False
        return True
    return False


def run_sync(func: Callable[..., Awaitable[_T]], *args: Any, name: str) -> _T:
    """Run the coroutine function `func(*args)` to completion from sync code.

    `name` is the sync method's name, used to point at its async twin ``a<name>``.
    """

    async def call() -> _T:
        return await func(*args)

    try:
        return anyio.from_thread.run(call)
    except anyio.NoEventLoopError:
        pass
    if _event_loop_running_here():
        raise TypeError(
            f"{name}() was called on a thread that runs an event loop, where it would block the"
            f" loop: use `await ...a{name}(...)` there instead."
        )
    return anyio.run(call)
