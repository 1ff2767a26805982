"""Sync code of a run in worker threads, and its way back onto the event loop.

A run's sync tools and sync loop bodies run here (`in_thread`), in daemon threads the module
keeps (idle ones are reused). The sync Agent methods they call hop back onto the run's event
loop (`hop`): each hop is a task in a task group of the call waiting for the thread, so it
lives in that call's cancel scope like any other task.

A thread cannot be stopped. When the call waiting for it is cancelled (the run is cancelled,
Ctrl+C, or the tool's timeout), the thread is abandoned: the call returns at once, the hops in
flight are cancelled, the thread's late result is dropped, and from then on the thread may not
run an agent nor change a State (both raise `CallAbandonedError` in it). It keeps its place
in the limiter until it ends, so abandoned threads count against the bound too. Daemon threads
never hold up the end of the process: one Ctrl+C exits while an abandoned thread still runs.

Why not `anyio.to_thread` and `anyio.from_thread`: anyio's asyncio worker threads are not
daemon threads (the interpreter waits for them at exit), and with them nested (a sync tool
runs an agent whose sync tool runs an agent), a cancellation can leave the asyncio loop
spinning forever: a task that `from_thread.run` starts in a cancel scope whose cancellation was
already delivered never gets it, and anyio's `checkpoint_if_cancelled` waits for it with
``sleep(0)`` in a loop (anyio 4.16).
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import queue
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import anyio
import anyio.lowlevel

from ._errors import CallAbandonedError

__all__ = ("current_job", "in_thread", "refuse_abandoned")

_T = TypeVar("_T")

IDLE_SECONDS = 10.0
"""How long an idle worker thread waits for work before it ends."""

_local = threading.local()  # `job`: the call a worker thread runs, while it runs it


@dataclass(slots=True)
class _Hop:
    """A coroutine function a worker thread asked the loop to run, in the thread's context."""

    func: Callable[[], Awaitable[Any]]
    context: contextvars.Context
    done: threading.Event
    value: Any = None
    error: BaseException | None = None


@dataclass(slots=True)
class _Ended:
    """The thread's function returned `value` or raised `error`."""

    value: Any
    error: BaseException | None


_Message = _Hop | _Ended


class Job:
    """One call of sync code in a worker thread, seen from both sides.

    The loop side waits for messages (hops to run, the end); the thread side posts them with
    the loop's thread-safe scheduler. `abandoned` is set on the loop thread and read by the
    worker thread: a plain flag, written once.
    """

    __slots__ = (
        "abandoned",
        "arrived",
        "context",
        "ended",
        "func",
        "inbox",
        "limiter",
        "schedule",
    )

    def __init__(
        self,
        func: Callable[[], Any],
        schedule: Callable[[Callable[[], None]], object],
        limiter: anyio.CapacityLimiter | None,
    ) -> None:
        self.func = func
        self.context = contextvars.copy_context()  # the calling task's: the frame included
        self.schedule = schedule
        self.limiter = limiter
        self.abandoned = False
        self.ended = False
        self.inbox: deque[_Message] = deque()  # on the loop thread only, like `arrived`
        self.arrived = anyio.Event()

    # -- the worker thread's side ----------------------------------------------------------------

    def work(self) -> None:
        """Run the function in the thread (in the calling task's context), then post its end."""
        if self.abandoned:  # given up before a thread took it: it never runs
            self._post(_Ended(None, None))
            return
        _local.job = self
        try:
            value, error = self.context.run(self.func), None
        except BaseException as exc:  # carried to the loop and raised there
            value, error = None, exc
        finally:
            _local.job = None
        self._post(_Ended(value, error))

    def hop(self, func: Callable[[], Awaitable[_T]]) -> _T:
        """Run `func()` on the loop, in this thread's context, and wait for its result.

        Raises:
            CallAbandonedError: The call was abandoned, before or while `func` ran.
        """
        self.refuse_if_abandoned()
        hop = _Hop(func, contextvars.copy_context(), threading.Event())
        self._post(hop)
        hop.done.wait()
        if hop.error is not None:
            raise hop.error
        return cast("_T", hop.value)

    def refuse_if_abandoned(self) -> None:
        """Raise `CallAbandonedError` if the loop gave up waiting for this thread."""
        if self.abandoned:
            raise CallAbandonedError(
                "This thread's tool call was abandoned (cancelled or timed out): its result is"
                " dropped, and it can no longer run an agent or change a State. Return from"
                " the tool."
            )

    def _post(self, message: _Message) -> None:
        try:
            self.schedule(lambda: self._deliver(message))
        except RuntimeError:  # the event loop has ended: nobody waits for anything any more
            if isinstance(message, _Hop):
                message.error = _abandoned()
                message.done.set()

    # -- the loop's side -------------------------------------------------------------------------

    def _deliver(self, message: _Message) -> None:
        """On the loop thread: hand `message` to the waiting call, or settle it if abandoned."""
        if isinstance(message, _Ended):
            self.ended = True
        if not self.abandoned:
            self.inbox.append(message)
            self.arrived.set()
        else:
            self._settle(message)

    def _settle(self, message: _Message) -> None:
        """A message nobody waits for: a hop is refused, an end frees the thread's token."""
        if isinstance(message, _Hop):
            message.error = _abandoned()
            message.done.set()
        elif self.limiter is not None:
            self.limiter.release_on_behalf_of(self)  # the abandoned thread has ended

    async def wait(self) -> _Ended:
        """Run the hops the thread asks for until it ends; abandon it if cancelled meanwhile.

        A cancellation or Ctrl+C is re-raised unchanged, not inside an exception group.
        """
        error: BaseException | None = None
        async with anyio.create_task_group() as hops:
            try:
                while True:
                    await self.arrived.wait()
                    self.arrived = anyio.Event()
                    while self.inbox:
                        message = self.inbox.popleft()
                        if isinstance(message, _Ended):
                            return message
                        # The hop's task gets a copy of the thread's context (start_soon copies
                        # the current one): a subagent it starts links to the thread's call.
                        message.context.run(hops.start_soon, _run_hop, message)
            except BaseException as exc:  # cancelled (or Ctrl+C): give up on the thread
                self._abandon()  # first: the hops being cancelled tell the thread so
                error = exc
                hops.cancel_scope.cancel()
        raise error if error is not None else AssertionError("unreachable: returned above")

    def _abandon(self) -> None:
        """Stop waiting for the thread: its hops and its result are refused from now on."""
        self.abandoned = True
        while self.inbox:  # what the thread sent meanwhile: hops to refuse
            message = self.inbox.popleft()
            if isinstance(message, _Hop):
                self._settle(message)
        if self.ended and self.limiter is not None:
            self.limiter.release_on_behalf_of(self)  # else when the thread ends


def _abandoned() -> CallAbandonedError:
    return CallAbandonedError(
        "This thread's tool call was abandoned (cancelled or timed out) while it ran an"
        " agent: that run was cancelled. Return from the tool."
    )


async def _run_hop(hop: _Hop) -> None:
    try:
        hop.value = await hop.func()
    except anyio.get_cancelled_exc_class():
        hop.error = _abandoned()  # only the call's own cancellation reaches a hop
        raise
    except BaseException as error:  # raised in the thread, whatever it is
        hop.error = error
    finally:
        hop.done.set()


def _scheduler() -> Callable[[Callable[[], None]], object]:
    """The running loop's way to take a callback from another thread, without waiting.

    `loop.call_soon_threadsafe` on asyncio, `TrioToken.run_sync_soon` on trio; both raise
    `RuntimeError` once the loop has ended.
    """
    native = anyio.lowlevel.current_token().native_token
    if isinstance(native, asyncio.AbstractEventLoop):
        return native.call_soon_threadsafe
    return cast("Any", native).run_sync_soon


async def in_thread(func: Callable[[], _T], limiter: anyio.CapacityLimiter | None = None) -> _T:
    """Run `func()` in a worker thread and return its result; abandon it when cancelled.

    `limiter` bounds the threads: a thread keeps its token until it ends, abandoned or not.
    The sync Agent methods `func` calls hop onto this loop (`current_job`). An exception from
    `func` is raised here unchanged.
    """
    job = Job(func, _scheduler(), limiter)
    if limiter is not None:
        await limiter.acquire_on_behalf_of(job)
    try:
        _WORKERS.submit(job)
        ended = await job.wait()
    finally:
        if limiter is not None and not job.abandoned:
            limiter.release_on_behalf_of(job)
    if ended.error is not None:
        raise ended.error
    return cast("_T", ended.value)


def current_job() -> Job | None:
    """The call this worker thread runs, or None (another thread, or between calls)."""
    job: Job | None = getattr(_local, "job", None)
    return job


def refuse_abandoned() -> None:
    """Raise `CallAbandonedError` in a worker thread whose call was abandoned.

    The State calls it under its lock before it records anything, so a write from such a
    thread either lands before the call's result (interrupted or timed out) or not at all.
    """
    job: Job | None = getattr(_local, "job", None)
    if job is not None:
        job.refuse_if_abandoned()


class _Worker(threading.Thread):
    """A daemon thread that runs jobs, and ends after `IDLE_SECONDS` without one."""

    def __init__(self, pool: _Workers) -> None:
        super().__init__(name="orchestrator worker", daemon=True)
        self.pool = pool
        self.jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()

    def run(self) -> None:
        while True:
            try:
                job = self.jobs.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                if self.pool.retire(self):
                    return
                continue  # taken for a job just now: it is on its way
            job.work()
            del job
            self.pool.rest(self)


class _Workers:
    """The idle worker threads, reused by the next job; a new one when none is idle."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.idle: list[_Worker] = []

    def submit(self, job: Job) -> None:
        with self.lock:
            worker = self.idle.pop() if self.idle else None
        if worker is None:
            worker = _Worker(self)
            worker.start()
        worker.jobs.put(job)

    def rest(self, worker: _Worker) -> None:
        with self.lock:
            self.idle.append(worker)

    def retire(self, worker: _Worker) -> bool:
        """Whether idle `worker` may end: it was not taken for a job meanwhile."""
        with self.lock:
            if worker in self.idle:
                self.idle.remove(worker)
                return True
            return False

    def forget(self) -> None:
        """After a fork: the parent's threads do not exist in the child."""
        self.lock = threading.Lock()
        self.idle = []


_WORKERS = _Workers()
os.register_at_fork(after_in_child=_WORKERS.forget)
