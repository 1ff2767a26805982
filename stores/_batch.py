"""Group commit: saves that arrive while one is being written go out together.

Many States saving at once (a lead with a thousand subagents) would otherwise queue one
transaction and one thread hop each. The first waiting save becomes the writer: it takes every
save queued so far and writes them in one transaction, then keeps writing while more wait. No
task runs in the background: the writer is always one of the callers, and if it is cancelled
after its batch, another waiting caller takes over.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from orchestrator import State

__all__ = ("GroupCommit",)

Flush = Callable[[list[State]], Awaitable[dict[int, ValueError]]]


class _Batch:
    """States queued for one transaction, and what came of it."""

    __slots__ = ("done", "failure", "refused", "states")

    def __init__(self) -> None:
        self.states: dict[int, State] = {}  # by id(state): a State queued twice is written once
        self.done = False
        self.refused: dict[int, ValueError] = {}
        self.failure: BaseException | None = None

    def add(self, state: State) -> None:
        self.states.setdefault(id(state), state)


class GroupCommit:
    """Batches concurrent saves on one event loop; `flush` writes one batch (in a thread)."""

    def __init__(self, flush: Flush) -> None:
        self._flush = flush
        self._open = _Batch()
        self._writing = False
        self._changed = anyio.Event()

    async def save(self, state: State) -> None:
        """Queue `state` and return once a transaction holding it committed.

        Raises what writing it raised: the `ValueError` of a refused State, or the failure of
        the whole transaction.
        """
        batch = self._open
        batch.add(state)
        while not batch.done:
            if self._writing:
                await self._changed.wait()
            else:
                await self._write()
        if batch.failure is not None:
            raise batch.failure
        refused = batch.refused.get(id(state))
        if refused is not None:
            raise refused

    async def _write(self) -> None:
        batch, self._open = self._open, _Batch()
        self._writing = True
        try:
            batch.refused = await self._flush(list(batch.states.values()))
        except Exception as error:
            batch.failure = error
        finally:
            batch.done = True
            self._writing = False
            changed, self._changed = self._changed, anyio.Event()
            changed.set()
