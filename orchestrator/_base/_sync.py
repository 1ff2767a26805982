"""Running the async core from sync code: the one bridge, at the top of the API.

A sync method called from plain code starts an event loop (`anyio.run`). Called from a worker
thread of a running async run (a sync tool, a sync loop body: `_base._threads`), it hops
onto that loop, inside the tool call's task group; from an anyio worker thread of your own, with
`anyio.from_thread.run`. Called on a thread that runs an event loop, it would deadlock, so it
raises `TypeError` naming the async twin.

`is_async_callable` is the one test of what is async. The other way, a store's async twins or
its sync methods in a worker thread, is `orchestrator._record._store_client`'s.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.from_thread

from ._threads import current_job

__all__ = ("is_async_callable", "run_sync")

_T = TypeVar("_T")


def is_async_callable(value: object) -> bool:
    """Whether calling `value` gives a coroutine: an async function, or an async `__call__`."""
    method = getattr(type(value), "__call__", None)  # noqa: B004 - not a callable() test
    return _coroutine_function(value) or _coroutine_function(method)


def _coroutine_function(value: object) -> bool:
    # Cached: asked again and again of the same few functions (loop bodies, stores' twins).
    try:
        return _coroutine_function_cached(value)
    except TypeError:  # unhashable
        return inspect.iscoroutinefunction(value)


@functools.lru_cache(maxsize=256)
def _coroutine_function_cached(value: object) -> bool:
    return inspect.iscoroutinefunction(value)


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

    job = current_job()
    if job is not None:
        return job.hop(call)
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
