"""The contract of a store whose States can be followed (`orchestrator.AsyncFollowable`).

Public through `stores.contract`. Mix `FollowContract` into a `StoreContract` subclass of a
store that implements `orchestrator.Followable` and/or `orchestrator.AsyncFollowable`, and
say how to damage a stored entry and how another process opens the store::

    class TestMyStore(FollowContract, StoreContract):
        def damage(self, store, state_id, seq):
            ...  # change the stored bytes of entry `seq`, behind the store's back

        def writer_url(self, store):
            return store.url  # what stores.open_store opens in another process; None: a thread

A follower reads the entries after the last `seq` it has (`entries` in ``sync`` mode, a wait
with `await_entries` in the async modes) while a writer in another process saves the State turn
by turn: it must see every entry exactly once, in order. This module is also that writer:
``python -m stores._contract_follow URL STATE_ID TURNS``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

import anyio
import pytest

from orchestrator import (
    AsyncFollowable,
    Followable,
    HistoryEntry,
    Message,
    State,
    StoreDamagedError,
    UserEntry,
)

from ._contract_support import Colour, StoreClient

__all__ = ("FollowContract", "write_turns")

_T = TypeVar("_T")

TURNS = 12
"""How many saves the writer makes, one entry each."""
_SECONDS = 60.0
"""The most a test waits for the writer (it ends in about a second)."""


def write_turns(save: Callable[[State], None], state: State, turns: int) -> None:
    """Add `turns` user messages to `state`, saving after each, a few milliseconds apart."""
    for turn in range(turns):
        state.add_message(Message.user(f"turn {turn}"))
        save(state)
        time.sleep(0.003 * (turn % 3))  # some saves back to back, some apart


def _texts(entries: tuple[HistoryEntry, ...] | list[HistoryEntry]) -> list[str]:
    return [entry.content.text for entry in entries if isinstance(entry, UserEntry)]


def _seqs(entries: tuple[HistoryEntry, ...] | list[HistoryEntry]) -> list[int]:
    return [entry.seq for entry in entries]


def _grown(state_id: str, count: int) -> State:
    state = State(id=state_id, messages=[Message.user("text-0")])
    for index in range(1, count):
        state.add_message(Message.user(f"text-{index}"))
    return state


class FollowContract:
    """The tests every followable store passes; mix it into a `StoreContract` subclass."""

    def damage(self, store: Any, state_id: str, seq: int) -> None:
        """Change the stored entry `seq` of `state_id` (its text ``text-<seq>``) in place."""
        raise NotImplementedError(
            f"{type(self).__name__} must define damage(store, state_id, seq): change the stored"
            " bytes of that entry behind the store's back (e.g. text-1 to text-X)."
        )

    def writer_url(self, store: Any) -> str | None:
        """The URL another process opens `store` with (None: the writer is a thread here)."""
        return None

    # -- helpers ---------------------------------------------------------------------------------

    @staticmethod
    def entries(client: StoreClient, state_id: str, after: int = -1) -> tuple[HistoryEntry, ...]:
        """`entries` or `aentries`."""
        if client.portal is None:
            return cast("Followable", client.store).entries(state_id, after=after)
        store = cast("AsyncFollowable", client.store)

        async def read() -> tuple[HistoryEntry, ...]:
            return await store.aentries(state_id, after=after)

        return client.call(read)

    @staticmethod
    def awaited(client: StoreClient, func: Callable[[], Awaitable[_T]]) -> _T:
        """Run `func()` on the client's event loop (in ``sync`` mode, on a new asyncio loop)."""
        if client.portal is None:
            return anyio.run(func)
        return client.call(func)

    @staticmethod
    def follow(client: StoreClient, state_id: str, after: int) -> tuple[HistoryEntry, ...]:
        """The next entries after `after`: waited for (async), or polled with `entries` (sync)."""
        if client.portal is None:
            store = cast("Followable", client.store)
            deadline = time.monotonic() + _SECONDS
            while time.monotonic() < deadline:
                new = store.entries(state_id, after=after)
                if new:
                    return new
                time.sleep(0.002)
            return ()
        waiting = cast("AsyncFollowable", client.store)

        async def wait() -> tuple[HistoryEntry, ...]:
            with anyio.move_on_after(_SECONDS):
                return await waiting.await_entries(state_id, after=after)
            return ()

        return client.call(wait)

    @contextmanager
    def writer(self, store: Any, state: State, turns: int) -> Generator[Callable[[], None]]:
        """Start saving `turns` turns of `state` in another process (or a thread); yield `join`."""
        url = self.writer_url(store)
        if url is None:
            failures: list[BaseException] = []

            def run() -> None:
                try:
                    write_turns(store.save, state, turns)
                except BaseException as error:  # reported by join
                    failures.append(error)

            thread = threading.Thread(target=run, daemon=True)
            thread.start()

            def join_thread() -> None:
                thread.join(_SECONDS)
                assert not thread.is_alive()
                assert not failures, failures

            yield join_thread
            thread.join(_SECONDS)
            return
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
        process = subprocess.Popen(
            [sys.executable, "-m", "stores._contract_follow", url, state.id, str(turns)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

        def join_process() -> None:
            out, err = process.communicate(timeout=_SECONDS)
            assert process.returncode == 0, err.decode()
            assert out.strip() == b"done"

        try:
            yield join_process
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()

    # -- entries after a position ----------------------------------------------------------------

    def test_implements_the_follow_protocols(self, store: Any) -> None:
        """A followable store is `AsyncFollowable`; a sync one is `Followable` too.

        An async-only store's sync `entries`, if it has one, raises `TypeError` naming
        `aentries`.
        """
        assert isinstance(store, AsyncFollowable)
        colours: tuple[Colour, ...] = cast("Any", self).colours  # from `StoreContract`
        if "sync" in colours:
            assert isinstance(store, Followable)
        elif isinstance(store, Followable):
            with pytest.raises(TypeError, match="aentries"):
                store.entries("x")

    def test_entries_after_minus_one_are_the_whole_history(self, client: StoreClient) -> None:
        state = _grown("followed", 4)
        client.save(state)
        got = self.entries(client, state.id)
        assert got == tuple(state.history)
        assert _seqs(got) == [0, 1, 2, 3]

    def test_entries_after_a_position_are_the_rest_in_order(self, client: StoreClient) -> None:
        state = _grown("followed", 5)
        client.save(state)
        assert self.entries(client, state.id, 1) == tuple(state.history[2:])
        assert self.entries(client, state.id, 4) == ()  # after the last: nothing yet
        assert self.entries(client, state.id, 40) == ()
        state.add_message(Message.user("text-5"))
        client.save(state)
        assert _texts(self.entries(client, state.id, 4)) == ["text-5"]

    def test_entries_of_a_missing_state_raise_lookup_error(self, client: StoreClient) -> None:
        with pytest.raises(LookupError, match="nope"):
            self.entries(client, "nope")

    @pytest.mark.parametrize("after", [-2, True, 1.0, "0"])
    def test_entries_refuse_a_bad_position(self, client: StoreClient, after: Any) -> None:
        client.save(_grown("followed", 2))
        with pytest.raises(ValueError, match="after must be"):
            self.entries(client, "followed", after)

    def test_a_damaged_entry_is_store_damaged_error(self, client: StoreClient, store: Any) -> None:
        state = _grown("followed", 4)
        client.save(state)
        self.damage(store, state.id, 1)
        for after in (-1, 0, 3):  # checked as a load checks: the whole chain, not the rest only
            with pytest.raises(StoreDamagedError, match=r"'followed'.*entry 1"):
                self.entries(client, state.id, after)

    # -- waiting for new entries -----------------------------------------------------------------

    def test_a_wait_returns_at_once_when_entries_are_there(self, client: StoreClient) -> None:
        state = _grown("followed", 3)
        client.save(state)
        assert self.follow(client, state.id, 0) == tuple(state.history[1:])

    def test_a_wait_for_a_missing_state_raises_lookup_error(self, client: StoreClient) -> None:
        store = cast("AsyncFollowable", client.store)
        with pytest.raises(LookupError, match="nope"):
            self.awaited(client, lambda: store.await_entries("nope"))

    @pytest.mark.timeout(20)
    def test_a_cancelled_wait_ends(self, client: StoreClient) -> None:
        """A wait with nothing to find ends when its scope is cancelled (else this hangs)."""
        state = _grown("followed", 2)
        client.save(state)
        store = cast("AsyncFollowable", client.store)

        async def wait() -> bool:
            with anyio.move_on_after(0.05) as scope:
                await store.await_entries(state.id, after=1)
            return scope.cancelled_caught

        assert self.awaited(client, wait)
        state.add_message(Message.user("text-2"))
        client.save(state)  # the store still works after the abandoned wait
        assert _texts(self.follow(client, state.id, 1)) == ["text-2"]

    @pytest.mark.timeout(120)
    def test_a_follower_sees_each_entry_another_process_saves_once(
        self, client: StoreClient, store: Any
    ) -> None:
        state = _grown("followed", 1)
        client.save(state)
        seen = list(self.entries(client, state.id))
        with self.writer(store, state, TURNS) as join:
            deadline = time.monotonic() + _SECONDS
            while len(seen) < 1 + TURNS and time.monotonic() < deadline:
                after = seen[-1].seq
                new = self.follow(client, state.id, after)
                assert new, "the wait ended with nothing new"
                assert _seqs(new) == list(range(after + 1, after + 1 + len(new)))  # none lost
                seen += new
            join()
        assert _seqs(seen) == list(range(1 + TURNS))  # each once, in order
        assert _texts(seen) == [f"turn {turn}" for turn in range(TURNS)]
        assert tuple(seen) == self.entries(client, state.id)


def _main(url: str, state_id: str, turns: int) -> None:
    from stores import PostgresStore, SQLiteStore, open_store

    store = open_store(url)  # a FileStore, SQLiteStore or PostgresStore
    try:
        write_turns(store.save, store.load(state_id), turns)
    finally:
        if isinstance(store, SQLiteStore | PostgresStore):
            store.close()


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    sys.stdout.write("done\n")
