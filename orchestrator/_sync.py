"""Running the async core from sync code: the one bridge, at the top of the API.

A sync method called from plain code starts an event loop (`anyio.run`). Called from a worker
thread of a running async run (a sync tool, a sync loop body: `orchestrator._threads`), it hops
onto that loop, inside the tool call's task group; from an anyio worker thread of your own, with
`anyio.from_thread.run`. Called on a thread that runs an event loop, it would deadlock, so it
raises `TypeError` naming the async twin.

The other way, `call_twin` awaits an object's async twin of a method, or runs the sync one in a
worker thread; `is_async_callable` is the one test of what is async.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import anyio
import anyio.from_thread

from ._threads import current_job

__all__ = ("call_twin", "is_async_callable", "run_sync")

_T = TypeVar("_T")


def is_async_callable(value: object) -> bool:
    """Whether calling `value` gives a coroutine: an async function, or an async `__call__`."""
    method = getattr(type(value), "__call__", None)  # noqa: B004 - not a callable() test
    return _coroutine_function(value) or _coroutine_function(method)


def call_twin(owner: object, method: str, *args: Any, **kwargs: Any) -> Awaitable[Any]:
    """`owner`'s async twin of `method` (``"a" + method``) called, or `method` in a thread.

    So a sync-only store (or memory backend) never blocks the event loop. Await the result. A
    plain function, not a coroutine: an agent calls it at every save, and the twin's own
    coroutine is awaited without one more wrapped around it. Whether a class has the async twin
    is asked once per class; an object whose class lacks it may still have one of its own.
    """
    name = _async_twin_of(type(owner), method)
    if name is not None:
        return cast("Awaitable[Any]", getattr(owner, name)(*args, **kwargs))
    twin = getattr(owner, "a" + method, None)
    if twin is not None and _coroutine_function(getattr(twin, "__func__", twin)):
        return cast("Awaitable[Any]", twin(*args, **kwargs))
    call = functools.partial(getattr(owner, method), *args, **kwargs)
    return anyio.to_thread.run_sync(call)


@functools.lru_cache(maxsize=256)
def _async_twin_of(cls: type, method: str) -> str | None:
    """The name of the async twin of `method` that `cls` defines, or None."""
    name = sys.intern("a" + method)
    return name if inspect.iscoroutinefunction(getattr(cls, name, None)) else None


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
