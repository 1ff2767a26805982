"""`Saver`: writes a run's State to its store, deciding itself when.

The layers that know a save point mark it (`Saver.mark`): a reply recorded, a turn's end, a
run's start, an `ask`. Marked save points are written at the run's next checkpoint by a
`Writer`, a task in the run's task group, so marks with nothing awaited between them are one
write, whichever loop made them. Where an entry must be stored before something happens, the
layer awaits `Saver.flush`: before the model is asked, before a tool runs, when the run
returns. So a user's ``@loop`` gets exactly the saves of the default loop.

`flush` writes whatever the State recorded since the saver's last write, marked or not (an
error recorded on the way out, a stop decided by the loop). The error of a write that failed in
the writer is raised, unchanged, by the next `flush`: errors surface there and at the run's
end, where the run's error path saves again. `flush_after` saves on an error path (call it
shielded) and attaches a failure to the error as a note.

A run started inside another (a subagent) shares the writer of the run it starts in: a task
group and a task per child cost more than the rest of a short child run's saving. The writer
counts the savers it serves: while it serves one, nothing started with that saver's saves can
join them, so they commit at once (`StoreClient.save_alone`); with subagents running, a save
first lets the loop run once, so saves started together share one transaction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

from .._base._logs import get_log
from .._record._recording import value_of

if TYPE_CHECKING:
    from .._record._state import State
    from .._record._store_client import StoreClient

__all__ = ("Saver", "Writer")

_log = get_log("agent")


class Writer:
    """Writes the marked save points of the savers given to it, at the next checkpoint.

    Its `run` is a task in the task group of the run that made it; runs started inside that
    run give it their savers too. `close` ends it once that run has written its end.
    """

    __slots__ = ("_closed", "_due", "_wake", "loop", "savers")

    def __init__(self) -> None:
        self.loop = anyio.lowlevel.current_token().native_token  # the event loop it runs on
        self.savers = 0  # savers of runs in progress it serves (`take`, `Saver.close`)
        self._due: list[Saver] = []
        self._wake: anyio.Event | None = None
        self._closed = False

    def here(self) -> bool:
        """Whether this writer runs on the event loop of the caller (so it can take savers)."""
        return not self._closed and anyio.lowlevel.current_token().native_token is self.loop

    def take(self, saver: Saver) -> None:
        """Serve `saver` (of a run starting) until it closes."""
        saver.writer = self
        self.savers += 1

    def add(self, saver: Saver) -> None:
        """Write `saver`'s marked save point at the next checkpoint."""
        self._due.append(saver)
        self._signal()

    def close(self) -> None:
        """End `run` (what it was given is written by the savers' own flushes)."""
        self._closed = True
        self._signal()

    def _signal(self) -> None:
        wake = self._wake
        if wake is not None:
            self._wake = None
            wake.set()

    async def run(self) -> None:
        """Write what is given, until `close`."""
        while not self._closed:
            if self._due:
                due, self._due = self._due, []
                for saver in due:
                    await saver.write_marked()
                continue
            wake = self._wake = anyio.Event()
            await wake.wait()


class Saver:
    """Writes `state` to `store` (None: nothing is ever written); `writer` writes its marks."""

    __slots__ = (
        "_closed",
        "_failure",
        "_idle",
        "_marked",
        "_queued",
        "_writing",
        "_written",
        "state",
        "store",
        "writer",
    )

    def __init__(self, store: StoreClient | None, state: State) -> None:
        self.store = store
        self.state = state
        self.writer: Writer | None = None  # set by `Writer.take` (None: marks wait for a flush)
        self._written = 0  # entries of `state` this saver knows are stored
        self._marked = False  # a save point marked since the last write began
        self._queued = False  # given to the writer and not taken yet
        self._writing = False
        self._idle: anyio.Event | None = None  # set when the write under way ends
        self._failure: Exception | None = None  # of the writer's write, for the next flush
        self._closed = False

    def mark(self) -> None:
        """A save point: what the State recorded so far is written at the next checkpoint.

        Without a writer (no store, or a step outside a run's task group) it waits for a flush.
        """
        self._marked = True
        writer = self.writer
        if writer is not None and not self._queued:
            self._queued = True
            writer.add(self)

    async def flush(self) -> None:
        """Write every entry the State recorded so far, now (after the write under way, if any).

        Raises:
            Exception: The store's error: this write, or one of the writer's, failed.
        """
        if self.store is None:
            return
        failure = self._failure
        if failure is not None:
            self._failure = None
            raise failure
        while self._writing:
            if self._idle is None:
                self._idle = anyio.Event()
            await self._idle.wait()
        if len(value_of(self.state).entries) > self._written:
            await self._write()

    async def flush_after(self, error: BaseException) -> None:
        """`flush` after `error`; a failing write is attached to `error` as a note.

        `error` is what the caller must see, so the save's own failure never replaces it. Call it
        shielded (``anyio.CancelScope(shield=True)``): it runs on the way out of a failure.
        """
        try:
            await self.flush()
        except Exception as save_error:
            error.add_note(f"Saving State {self.state.id} afterwards failed too: {save_error!r}")
            _log.warning("state.save.failed", state_id=self.state.id, error=repr(save_error))

    def close(self) -> None:
        """The run has written its end: the writer writes nothing of it any more."""
        writer = self.writer
        if writer is not None and not self._closed:
            writer.savers -= 1
        self._closed = True

    async def write_marked(self) -> None:
        """Write the marked save point, if it is not written yet: what the writer calls.

        A failure is kept for the next `flush` to raise.
        """
        self._queued = False
        if self._marked and not self._writing and self._failure is None and not self._closed:
            try:
                await self._write()
            except Exception as error:
                self._failure = error

    async def _write(self) -> None:
        store = self.store
        if store is None:  # a saver without a store writes nothing
            return
        self._marked = False
        self._writing = True
        count = len(value_of(self.state).entries)
        writer = self.writer
        try:
            if writer is not None and writer.savers == 1:  # no run saves beside this one
                await store.save_alone(self.state)
            else:
                await store.save(self.state)
        except BaseException:
            self._marked = True  # not written: the next write tries again
            raise
        else:
            self._written = max(self._written, count)
            if self._marked:  # marked while writing: the writer writes that next
                self.mark()
        finally:
            self._writing = False
            idle = self._idle
            if idle is not None:
                self._idle = None
                idle.set()
