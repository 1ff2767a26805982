"""Group commit: saves that arrive while one is being written go out together.

Many States saving at once (a lead with a thousand subagents) would otherwise queue one
transaction and one thread hop each. Saves join the open batch; the first to join leads it:
it writes the batch as soon as no other batch is being written, while the others of the batch
sleep until it is written. So each save wakes once, and only the leader twice. No task runs in
the background: the writer is always one of the callers. A leader cancelled before it starts
writing hands the lead to another save of its batch; once it starts, the write is shielded, so
the saves of its batch are never told they were written when they were not.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from orchestrator import State

__all__ = ("GroupCommit",)

Flush = Callable[[list[State]], Awaitable[dict[int, ValueError]]]


class _Batch:
    """States queued for one transaction, and what came of it."""

    __slots__ = ("changed", "done", "failure", "led", "refused", "states", "turn")

    def __init__(self) -> None:
        self.states: dict[int, State] = {}  # by id(state): a State queued twice is written once
        self.led = False  # a save of this batch has taken the lead
        self.turn = anyio.Event()  # set when the batch before it is written: the leader writes
        self.changed = anyio.Event()  # set when it is written, or its leader was cancelled
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

    async def save(self, state: State) -> None:
        """Queue `state` and return once a transaction holding it committed.

        Raises what writing it raised: the `ValueError` of a refused State, or the failure of
        the whole transaction.
        """
        batch = self._open
        batch.add(state)
        while not batch.done:
            if batch.led:
                await batch.changed.wait()
            else:
                await self._lead(batch)
        if batch.failure is not None:
            raise batch.failure
        refused = batch.refused.get(id(state))
        if refused is not None:
            raise refused

    async def _lead(self, batch: _Batch) -> None:
        """Wait until no other batch is being written, then write `batch` (still the open one)."""
        batch.led = True
        try:
            while self._writing:
                await batch.turn.wait()
        except BaseException:  # cancelled before writing: another save of the batch leads
            batch.led = False
            changed, batch.changed = batch.changed, anyio.Event()
            changed.set()
            raise
        self._open = _Batch()
        self._writing = True
        try:
            with anyio.CancelScope(shield=True):  # a cancellation waits until it is written
                batch.refused = await self._flush(list(batch.states.values()))
        except Exception as error:
            batch.failure = error
        except BaseException as error:  # e.g. KeyboardInterrupt: raised here, not in every save
            batch.failure = RuntimeError(f"The write was interrupted ({error!r}); save again.")
            raise
        finally:
            batch.done = True
            self._writing = False
            batch.changed.set()
            if self._open.led:
                self._open.turn.set()
