"""The contract of a store whose trees of States can be followed (`orchestrator.TreeFollowable`).

Public through `stores.contract`. Mix `TreeFollowContract` into a `StoreContract` subclass (with
`FollowContract`, whose two hooks it uses: how to damage a stored entry, and the URL another
process opens the store with)::

    class TestMyStore(TreeFollowContract, FollowContract, StoreContract):
        ...

A tree is a root State and the States started under it. Its feed must hold every entry of them
all, each once, each State's in order, in one order that every reader agrees on (a follower
reading live, a reader afterwards, a reader in another process) and that a cursor resumes
exactly. The writers save a root and several children at once, from threads or from another
process; this module is that process too: ``python -m stores._contract_tree write URL ROOT
CHILDREN TURNS`` saves, ``python -m stores._contract_tree read URL ROOT`` prints the feed.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

import anyio
import pytest

from orchestrator import (
    AsyncTreeFollowable,
    Message,
    RunStart,
    RunStartEntry,
    State,
    StoreDamagedError,
    TreeEntry,
    TreeFollowable,
    UserEntry,
)

from ._contract_support import Colour, StoreClient, appended

__all__ = ("TreeFollowContract", "write_tree")

_T = TypeVar("_T")

CHILDREN = 4
"""How many children the writers start under the root, saving at once."""
TURNS = 6
"""How many saves each State of the tree makes, one entry each."""
_SECONDS = 60.0
"""The most a test waits for the writers (they end in about a second)."""


def linked(state_id: str, parent_id: str, call_id: str = "call") -> State:
    """A new State started by the call `call_id` of `parent_id`: a message and its link."""
    entries: list[Any] = [
        UserEntry(seq=0, turn=0, at=datetime.now(UTC), content=Message.user(f"text of {state_id}"))
    ]
    state = State(id=state_id, history=entries)
    return appended(state, RunStartEntry, RunStart(parent_id=parent_id, parent_call_id=call_id))


def _grow(state: State, texts: list[str]) -> State:
    for text in texts:
        state.add_message(Message.user(text))
    return state


def write_tree(save: Callable[[State], None], root: State, children: int, turns: int) -> None:
    """Save `children` children of `root` and `root` itself, `turns` times each, all at once.

    Each writer is a thread; each save adds one entry. The children are saved first when they
    start (their parent is stored), so the store gives each one the root's tree.
    """
    failures: list[BaseException] = []

    def run(state: State) -> None:
        try:
            for turn in range(turns):
                if turn or state.id == root.id:
                    state.add_message(Message.user(f"{state.id} turn {turn}"))
                save(state)
                time.sleep(0.001 * (turn % 3))
        except BaseException as error:  # reported below
            failures.append(error)

    states = [root, *(linked(f"{root.id}-kid{k}", root.id, f"call{k}") for k in range(children))]
    threads = [threading.Thread(target=run, args=(state,), daemon=True) for state in states]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(_SECONDS)
    if failures:
        raise failures[0]


def _key(item: TreeEntry) -> tuple[str, int]:
    return item.state_id, item.index


def _check_feed(feed: tuple[TreeEntry, ...] | list[TreeEntry]) -> None:
    """Each entry once, each State's in order from 0, each cursor different."""
    keys = [_key(item) for item in feed]
    assert len(set(keys)) == len(keys), "an entry is repeated"
    assert len({item.cursor for item in feed}) == len(feed), "a cursor is repeated"
    by_state: dict[str, list[int]] = {}
    for state_id, index in keys:
        by_state.setdefault(state_id, []).append(index)
    for state_id, seqs in by_state.items():
        assert seqs == list(range(len(seqs))), f"{state_id}: {seqs}"
    for item in feed:
        assert item.entry.seq == item.index


class TreeFollowContract:
    """The tests every store whose trees can be followed passes; mix it into a contract class."""

    # -- helpers ---------------------------------------------------------------------------------

    @staticmethod
    def tree(
        client: StoreClient, root_id: str, after: str | None = None, limit: int | None = None
    ) -> tuple[TreeEntry, ...]:
        """`tree_entries` or `atree_entries`."""
        if client.portal is None:
            return cast("TreeFollowable", client.store).tree_entries(
                root_id, after=after, limit=limit
            )
        store = cast("AsyncTreeFollowable", client.store)

        async def read() -> tuple[TreeEntry, ...]:
            return await store.atree_entries(root_id, after=after, limit=limit)

        return client.call(read)

    @staticmethod
    def root(client: StoreClient, state_id: str) -> str:
        """`root_of` or `aroot_of`."""
        if client.portal is None:
            return cast("TreeFollowable", client.store).root_of(state_id)
        return client.call(cast("AsyncTreeFollowable", client.store).aroot_of, state_id)

    @staticmethod
    def awaited(client: StoreClient, func: Callable[[], Awaitable[_T]]) -> _T:
        """Run `func()` on the client's event loop (in ``sync`` mode, on a new asyncio loop)."""
        if client.portal is None:
            return anyio.run(func)
        return client.call(func)

    def wait(self, client: StoreClient, root_id: str, after: str | None) -> tuple[TreeEntry, ...]:
        """The next entries of the tree after `after`, waited for with `await_tree_entries`."""
        store = cast("AsyncTreeFollowable", client.store)

        async def wait() -> tuple[TreeEntry, ...]:
            with anyio.move_on_after(_SECONDS):
                return await store.await_tree_entries(root_id, after=after)
            return ()

        return self.awaited(client, wait)

    @contextmanager
    def tree_writer(self, store: Any, root: State) -> Generator[Callable[[], None]]:
        """Start `write_tree` in another process (or a thread here); yield `join`."""
        url = cast("Any", self).writer_url(store)  # from `FollowContract`
        if url is None:
            failures: list[BaseException] = []

            def run() -> None:
                try:
                    write_tree(store.save, root, CHILDREN, TURNS)
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
        process = _module_process("write", url, root.id, str(CHILDREN), str(TURNS))

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

    def saved_tree(self, client: StoreClient) -> tuple[State, list[State]]:
        """A root of 3 entries and two children of 2 and 4, saved in turns (interleaved)."""
        root = _grow(State(id="root", messages=[Message.user("text-0")]), ["text-1"])
        client.save(root)
        kids = [linked("kid0", "root", "c0"), linked("kid1", "root", "c1")]
        for kid in kids:
            client.save(kid)
        client.save(_grow(root, ["text-2"]))
        client.save(_grow(kids[1], ["more", "and more"]))
        return root, kids

    # -- the protocols ---------------------------------------------------------------------------

    def test_implements_the_tree_protocols(self, store: Any) -> None:
        """A store whose trees can be followed is `AsyncTreeFollowable`; a sync one, both.

        An async-only store's sync `tree_entries`, if it has one, raises `TypeError` naming
        `atree_entries`.
        """
        assert isinstance(store, AsyncTreeFollowable)
        colours: tuple[Colour, ...] = cast("Any", self).colours  # from `StoreContract`
        if "sync" in colours:
            assert isinstance(store, TreeFollowable)
        elif isinstance(store, TreeFollowable):
            with pytest.raises(TypeError, match="atree_entries"):
                store.tree_entries("x")

    # -- roots -----------------------------------------------------------------------------------

    def test_a_state_takes_its_parents_root(self, client: StoreClient) -> None:
        self.saved_tree(client)
        grandchild = linked("grandkid", "kid1", "c9")
        client.save(grandchild)
        stranger = linked("stranger", "not-stored", "c0")  # its parent is not in this store
        client.save(stranger)
        assert [self.root(client, i) for i in ("root", "kid0", "kid1", "grandkid")] == ["root"] * 4
        assert self.root(client, "stranger") == "stranger"
        with pytest.raises(LookupError, match="nope"):
            self.root(client, "nope")

    def test_a_parent_and_child_saved_together_share_the_root(self, client: StoreClient) -> None:
        client.save(State(id="root", messages=[Message.user("go")]))
        child, grandchild = linked("kid", "root"), linked("grandkid", "kid")
        if client.save_many([grandchild, child]) is None:  # no batch save: one at a time
            client.save(child)
            client.save(grandchild)
        assert self.root(client, "grandkid") == "root"
        assert {item.state_id for item in self.tree(client, "root")} == {"root", "kid", "grandkid"}

    # -- the feed --------------------------------------------------------------------------------

    def test_the_feed_holds_every_entry_of_the_tree_once(self, client: StoreClient) -> None:
        root, kids = self.saved_tree(client)
        client.save(State(id="other", messages=[Message.user("not in the tree")]))
        feed = self.tree(client, "root")
        _check_feed(feed)
        assert sorted(_key(item) for item in feed) == sorted(
            (state.id, entry.seq) for state in (root, *kids) for entry in state.history
        )
        for item in feed:
            owner = next(state for state in (root, *kids) if state.id == item.state_id)
            assert item.entry == owner.history[item.index]
        # the order of the saves: the root's first two, the children's first, ...
        assert [_key(item) for item in feed][:3] == [("root", 0), ("root", 1), ("kid0", 0)]
        assert self.tree(client, "other")[0].state_id == "other"

    def test_the_rest_after_any_cursor_is_exact(self, client: StoreClient) -> None:
        self.saved_tree(client)
        feed = self.tree(client, "root")
        for at, item in enumerate(feed):
            assert self.tree(client, "root", item.cursor) == feed[at + 1 :]
        assert self.tree(client, "root", feed[-1].cursor) == ()

    def test_pages_of_any_size_make_the_whole_feed(self, client: StoreClient) -> None:
        self.saved_tree(client)
        feed = self.tree(client, "root")
        for size in (1, 2, 3, len(feed), len(feed) + 5):
            pages: list[TreeEntry] = []
            after: str | None = None
            while page := self.tree(client, "root", after, size):
                assert len(page) <= size
                pages += page
                after = page[-1].cursor
            assert tuple(pages) == feed

    def test_new_entries_come_after_every_cursor_given(self, client: StoreClient) -> None:
        root, kids = self.saved_tree(client)
        seen = self.tree(client, "root")
        client.save(_grow(kids[0], ["late"]))
        client.save(_grow(root, ["later"]))
        new = self.tree(client, "root", seen[-1].cursor)
        assert [_key(item) for item in new] == [("kid0", 2), ("root", 3)]
        assert self.tree(client, "root") == (*seen, *new)

    def test_a_deleted_states_positions_are_never_given_again(self, client: StoreClient) -> None:
        root, _ = self.saved_tree(client)
        late = linked("late", "root")
        client.save(_grow(late, ["x", "y"]))  # the newest entries of the store
        last = self.tree(client, "root")[-1]
        assert last.state_id == "late"
        client.delete("late")
        client.save(_grow(root, ["after the delete"]))
        new = self.tree(client, "root", last.cursor)
        assert [_key(item) for item in new] == [("root", 3)]

    # -- refusals --------------------------------------------------------------------------------

    def test_a_tree_of_a_missing_or_non_root_state_is_refused(self, client: StoreClient) -> None:
        self.saved_tree(client)
        with pytest.raises(LookupError, match="nope"):
            self.tree(client, "nope")
        with pytest.raises(ValueError, match=r"'kid1' is not the root.*'root'"):
            self.tree(client, "kid1")

    @pytest.mark.parametrize(
        "after", ["", "x", "7", "zz:1", ":", "sqlite:", "mem:-1", "file:a", "pg:1", 3, b"x"]
    )
    def test_a_malformed_cursor_says_what_a_cursor_is(
        self, client: StoreClient, after: Any
    ) -> None:
        self.saved_tree(client)
        with pytest.raises(ValueError, match=r"cursor"):
            self.tree(client, "root", after)

    def test_another_kind_of_stores_cursor_is_named(self, client: StoreClient) -> None:
        self.saved_tree(client)
        mine = self.tree(client, "root")[0].cursor
        kind = mine.partition(":")[0]
        others = {"mem": "mem:1", "file": "file:0", "sqlite": "sqlite:1", "pg": "pg:3.0.root"}
        for other, cursor in others.items():
            if other != kind:
                with pytest.raises(ValueError, match=r"a cursor of .* and this is"):
                    self.tree(client, "root", cursor)

    @pytest.mark.parametrize("limit", [0, -1, True, 1.0, "2"])
    def test_a_bad_limit_is_refused(self, client: StoreClient, limit: Any) -> None:
        self.saved_tree(client)
        with pytest.raises(ValueError, match="limit must be"):
            self.tree(client, "root", None, limit)

    def test_a_damaged_entry_in_the_feed_is_store_damaged_error(
        self, client: StoreClient, store: Any
    ) -> None:
        root = _grow(State(id="root", messages=[Message.user("text-0")]), ["text-1", "text-2"])
        client.save(root)
        cast("Any", self).damage(store, "root", 1)  # from `FollowContract`
        with pytest.raises(StoreDamagedError, match=r"'root'.*entry 1"):
            self.tree(client, "root")

    # -- waiting ---------------------------------------------------------------------------------

    def test_a_wait_returns_at_once_when_entries_are_there(self, client: StoreClient) -> None:
        self.saved_tree(client)
        feed = self.tree(client, "root")
        assert self.wait(client, "root", feed[2].cursor) == feed[3:]
        assert self.wait(client, "root", None) == feed

    def test_a_wait_returns_when_a_child_saves(self, client: StoreClient, store: Any) -> None:
        _, kids = self.saved_tree(client)
        last = self.tree(client, "root")[-1].cursor
        waiting = cast("AsyncTreeFollowable", store)
        child = _grow(kids[0], ["from the child"])

        async def save() -> None:
            if client.portal is None:
                await anyio.to_thread.run_sync(store.save, child)
            else:
                await store.asave(child)

        async def wait_while_a_child_saves() -> tuple[TreeEntry, ...]:
            found: list[tuple[TreeEntry, ...]] = []

            async def follow() -> None:
                found.append(await waiting.await_tree_entries("root", after=last))

            with anyio.fail_after(_SECONDS):
                async with anyio.create_task_group() as group:
                    group.start_soon(follow)
                    await anyio.sleep(0.02)  # the follower waits first, most of the time
                    await save()
            return found[0]

        new = self.awaited(client, wait_while_a_child_saves)
        assert [_key(item) for item in new] == [("kid0", 2)]

    @pytest.mark.timeout(20)
    def test_a_cancelled_wait_ends(self, client: StoreClient) -> None:
        """A wait with nothing to find ends when its scope is cancelled (else this hangs)."""
        root, _ = self.saved_tree(client)
        last = self.tree(client, "root")[-1].cursor
        store = cast("AsyncTreeFollowable", client.store)

        async def wait() -> bool:
            with anyio.move_on_after(0.05) as scope:
                await store.await_tree_entries("root", after=last)
            return scope.cancelled_caught

        assert self.awaited(client, wait)
        client.save(_grow(root, ["after"]))  # the store still works after the abandoned wait
        assert [_key(item) for item in self.wait(client, "root", last)] == [("root", 3)]

    def test_a_wait_for_a_missing_root_raises_lookup_error(self, client: StoreClient) -> None:
        store = cast("AsyncTreeFollowable", client.store)
        with pytest.raises(LookupError, match="nope"):
            self.awaited(client, lambda: store.await_tree_entries("nope"))

    # -- many writers, many readers --------------------------------------------------------------

    @pytest.mark.timeout(120)
    def test_followers_agree_on_one_order_while_a_tree_saves_at_once(
        self, client: StoreClient, store: Any
    ) -> None:
        """A follower reading live, a reader afterwards, and one in another process agree.

        The root and its children save at once (in another process when the store has a URL);
        the follower waits after its last cursor each time. What it saw, in its order, is the
        feed read afterwards: every entry once, each State's in order, nothing after it found
        before it later.
        """
        root = State(id="tree", messages=[Message.user("start")])
        client.save(root)
        total = 1 + TURNS + CHILDREN * (2 + TURNS - 1)
        seen: list[TreeEntry] = []
        with self.tree_writer(store, root) as join:
            deadline = time.monotonic() + _SECONDS
            while len(seen) < total and time.monotonic() < deadline:
                new = self.wait(client, "tree", seen[-1].cursor if seen else None)
                assert new, "the wait ended with nothing new"
                seen += new
            join()
        _check_feed(seen)
        assert len(seen) == total
        assert tuple(seen) == self.tree(client, "tree")
        picks = random.Random(7).sample(range(total), 6)
        for at in picks:  # resuming after any cursor gives exactly the rest
            assert self.tree(client, "tree", seen[at].cursor) == tuple(seen[at + 1 :])
        url = cast("Any", self).writer_url(store)
        if url is not None:  # a reader in another process sees the same order and cursors
            process = _module_process("read", url, "tree")
            out, err = process.communicate(timeout=_SECONDS)
            assert process.returncode == 0, err.decode()
            assert json.loads(out) == [[item.cursor, *_key(item)] for item in seen]


def _module_process(*args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
    return subprocess.Popen(
        [sys.executable, "-m", "stores._contract_tree", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _main(command: str, url: str, root_id: str, *rest: str) -> None:
    from stores import PostgresStore, SQLiteStore, open_store

    store = open_store(url)  # a FileStore, SQLiteStore or PostgresStore
    try:
        if command == "write":
            write_tree(store.save, store.load(root_id), int(rest[0]), int(rest[1]))
            sys.stdout.write("done\n")
        else:
            feed = cast("TreeFollowable", store).tree_entries(root_id)
            sys.stdout.write(json.dumps([[item.cursor, *_key(item)] for item in feed]))
    finally:
        if isinstance(store, SQLiteStore | PostgresStore):
            store.close()


if __name__ == "__main__":
    _main(*sys.argv[1:])
