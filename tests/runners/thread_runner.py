"""`ThreadRunner`: a runner elsewhere, in this process, for tests without Ray.

Each child runs on an event loop of its own in a new thread, in an empty context, through the
Ray worker's body (`ChildWorker`): its agent rebuilt by name from a registry, the store opened
by URL. So, as on a Ray worker, the parent's budgets cannot see it spend; a cancellation of
`run` cancels the child there and waits until it recorded ``interrupted`` and was saved.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from orchestrator import State
from orchestrator.runners import ChildJob, ChildRunError
from orchestrator.runners._ray import ChildWorker, RayJob

__all__ = ("ThreadRunner",)


class ThreadRunner:
    """Runs each child in a thread of its own, on its own event loop (asyncio)."""

    def __init__(self, registry: str) -> None:
        self.registry = registry

    def check(self, job: ChildJob) -> None:
        """A child needs a store with a URL, as on a worker."""
        RayJob.of(job)

    async def run(self, job: ChildJob) -> State:
        """Run the job's child in a new thread; return it as it was saved."""
        remote = RayJob.of(job)
        worker = ChildWorker(self.registry)
        started = threading.Event()
        done = anyio.Event()
        token = anyio.lowlevel.current_token()
        there: dict[str, Any] = {}
        failed: list[str | None] = []

        async def main() -> None:
            with anyio.CancelScope() as scope:
                there["scope"], there["token"] = scope, anyio.lowlevel.current_token()
                started.set()
                failed.append(await worker.run(remote))

        def in_thread() -> None:
            try:
                anyio.run(main)
            finally:
                started.set()
                anyio.from_thread.run_sync(done.set, token=token)

        thread = threading.Thread(target=contextvars.Context().run, args=(in_thread,))
        thread.start()
        try:
            await done.wait()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(started.wait)
                with contextlib.suppress(RuntimeError, KeyError):  # it ended meanwhile
                    anyio.from_thread.run_sync(there["scope"].cancel, token=there["token"])
                await done.wait()
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(thread.join)  # it ends once `done` is set
        store: Any = job.store
        state: State = await store.aload(job.state_id)
        if failed and failed[0] is not None:
            raise ChildRunError(
                f"The child failed: {failed[0]}", state_id=job.state_id, state=state
            )
        return state
