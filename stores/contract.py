"""The contract every store backend passes, importable to test your own backend.

Subclass `StoreContract` in a test module (its name must start with ``Test``), say which
protocols your store implements, and give a ``store`` fixture returning a new, empty store::

    import pytest
    from stores.contract import StoreContract

    class TestMyStore(StoreContract):
        colours = ("sync", "async")  # it implements Store and AsyncStore
        asyncio_only = False  # its async methods also work on trio

        @pytest.fixture
        def store(self, tmp_path):
            return MyStore(tmp_path / "states")

Each test body is written once and runs in every mode the class declares: ``sync`` calls the
sync methods from plain code; ``asyncio`` and ``trio`` await the ``a``-methods on an event loop
of that library (run through `anyio.from_thread.start_blocking_portal`, so one body covers both
colours). An async store that needs closing on its loop may define ``async def aclose()``; it is
awaited after each async test. The suite needs pytest, anyio, and trio unless `asyncio_only`.

A store may also keep agent memory (`orchestrator.MemoryBackend` / `AsyncMemoryBackend`, the
primitive under `orchestrator.Memory`); set ``keeps_memory = False`` on a contract subclass
whose store does not, and the memory tests check only that `Memory` refuses it.

A store that can be followed (`orchestrator.Followable`, `AsyncFollowable`) mixes in
`FollowContract` too: ``class TestMyStore(FollowContract, StoreContract)``, with the two hooks
its docstring names (how to damage an entry, and the URL another process opens it with). A
store whose trees of States can be followed as one feed (`orchestrator.TreeFollowable`,
`AsyncTreeFollowable`) mixes in `TreeFollowContract` as well, before `FollowContract`.

The save rule every backend follows: a save only adds entries to the history it continues. The
State saved must hold every stored entry (the stored last entry is compared); another State
under an id that is taken, or an older copy with fewer entries, raises `ValueError` saying to
`load` the stored State (or to save under a new id). Saving what is stored writes nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Protocol, cast, runtime_checkable

import pytest
from anyio.from_thread import start_blocking_portal

from orchestrator import (
    Agent,
    AsyncMemoryBackend,
    AsyncStore,
    Memory,
    MemoryBackend,
    Message,
    ModelReplyEntry,
    ModelRequest,
    ModelRequestEntry,
    Reply,
    State,
    Store,
    StoreConflictError,
    TextBlock,
    ToolResultEntry,
    Usage,
    ValidationError,
)
from orchestrator.testing import FakeModel, tool_call

from ._contract_follow import FollowContract
from ._contract_leases import LeaseContract
from ._contract_support import (
    Colour,
    Loop,
    Mode,
    StoreClient,
    appended,
    assert_same,
    crashed_pending,
    crashed_waiting,
    dated,
    echo,
    result_block,
    rich_state,
    tool_call_of,
)
from ._contract_tree import TreeFollowContract
from .backend import storage_view

__all__ = (
    "FollowContract",
    "LeaseContract",
    "StoreClient",
    "StoreContract",
    "TreeFollowContract",
    "crashed_pending",
    "crashed_waiting",
    "rich_state",
)


@runtime_checkable
class _AsyncClosing(Protocol):
    """A store that needs closing on its event loop."""

    async def aclose(self) -> None: ...


class StoreContract:
    """The tests every store passes. Subclass it as ``Test<YourStore>`` with a `store` fixture.

    Class attributes say what the store can do (the suite parametrizes by them; it never skips):
    `colours` lists the protocols of `orchestrator` it implements, ``"sync"`` (`Store`) and/or
    ``"async"`` (`AsyncStore`); `asyncio_only` says its async methods work on asyncio only;
    `keeps_memory` says it keeps agent memory (`orchestrator.MemoryBackend` and/or
    `AsyncMemoryBackend`, as `colours` says).
    """

    colours: ClassVar[tuple[Colour, ...]] = ("sync", "async")
    asyncio_only: ClassVar[bool] = False
    keeps_memory: ClassVar[bool] = True

    # -- set-up ----------------------------------------------------------------------------------

    @classmethod
    def modes(cls) -> list[Mode]:
        """The modes each test runs in: ``sync``, then the event loops the store works on."""
        modes: list[Mode] = []
        if "sync" in cls.colours:
            modes.append("sync")
        if "async" in cls.colours:
            modes.append("asyncio")
            if not cls.asyncio_only:
                modes.append("trio")
        if not modes:
            raise TypeError(f"{cls.__name__}.colours must name 'sync', 'async' or both.")
        return modes

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Run each test that takes `mode` once per mode of `modes()`."""
        if "mode" in metafunc.fixturenames:
            metafunc.parametrize("mode", self.modes())

    @pytest.fixture
    def store(self) -> Any:
        """A new, empty store: override this fixture in your subclass."""
        raise NotImplementedError(
            f"{type(self).__name__} must define a `store` fixture returning a new, empty store."
        )

    @pytest.fixture
    def client(self, store: Any, mode: Mode) -> Iterator[StoreClient]:
        """The store, called in `mode`; an async store's ``aclose`` is awaited at the end."""
        if mode == "sync":
            yield StoreClient(store, None)
            return
        with start_blocking_portal(mode) as portal:
            yield StoreClient(store, portal)
            if isinstance(store, _AsyncClosing):
                portal.call(store.aclose)

    # -- the protocols ---------------------------------------------------------------------------

    def test_implements_the_declared_protocols(self, store: Any) -> None:
        """The store is a `Store` and/or an `AsyncStore`, as `colours` says.

        An async-only store's sync methods, if it has them, raise `TypeError` naming their
        async twins.
        """
        if "sync" in self.colours:
            assert isinstance(store, Store)
        else:
            # An async-only store's sync methods, if it has them, point at the async ones.
            if isinstance(store, Store):
                with pytest.raises(TypeError, match="asave"):
                    store.save(State(id="x"))
                with pytest.raises(TypeError, match="aload"):
                    store.load("x")
                with pytest.raises(TypeError, match="alist"):
                    store.list()
                with pytest.raises(TypeError, match="adelete"):
                    store.delete("x")
        if "async" in self.colours:
            assert isinstance(store, AsyncStore)

    # -- round trips -----------------------------------------------------------------------------

    def test_a_rich_state_round_trips(self, client: StoreClient) -> None:
        """A State with every kind of entry loads back as a new State of equal value and history."""
        state = rich_state()
        client.save(state)
        assert_same(client.load(state.id), state)

    def test_saves_after_every_entry_round_trip(self, client: StoreClient) -> None:
        """Saving after each entry (the history growing one at a time) stores the same history."""
        state = rich_state()
        for size in range(1, len(state.history) + 1):
            prefix = State(id="grown", history=state.history[:size])
            client.save(prefix)
            loaded = client.load("grown")
            if storage_view(prefix).open_turn:  # cut off mid-turn: the load closed the turn
                assert loaded.history[:size] == prefix.history
                assert not storage_view(loaded).open_turn
            else:
                assert_same(loaded, prefix)
        assert client.list()[0].entries == len(state.history)

    def test_an_empty_state_round_trips(self, client: StoreClient) -> None:
        """A State with no entries can be saved and loaded."""
        state = State(id="empty")
        client.save(state)
        loaded = client.load("empty")
        assert loaded.history == ()
        assert loaded.snapshot() == state.snapshot()
        assert client.ids() == ["empty"]

    def test_a_loaded_state_continues_and_round_trips(self, client: StoreClient) -> None:
        """A loaded State takes new entries and saves them after the stored ones."""
        state = rich_state()
        client.save(state)
        loaded = client.load(state.id)
        loaded.restore(loaded.snapshot())
        loaded.add_message(Message.user("one more thing"))
        client.save(loaded)
        assert_same(client.load(state.id), loaded)

    # -- idempotent saves ------------------------------------------------------------------------

    def test_saving_again_writes_nothing_new(self, client: StoreClient) -> None:
        """Saving a State that is stored writes nothing."""
        state = rich_state()
        client.save(state)
        client.save(state)
        client.save(state)
        assert [info.entries for info in client.list()] == [len(state.history)]
        assert len(client.load(state.id).history) == len(state.history)

    def test_a_state_grown_by_three_entries_writes_three(self, client: StoreClient) -> None:
        """A save writes only the entries added since the last save."""
        state = State(id="grows", messages=[Message.user("one")])
        client.save(state)
        for text in ("two", "three", "four"):
            state.add_message(Message.user(text))
        client.save(state)
        assert client.list()[0].entries == 4
        loaded = client.load("grows")
        assert [entry.seq for entry in loaded.history] == [0, 1, 2, 3]
        assert_same(loaded, state)

    def test_an_unchanged_copy_saves_as_a_no_op(self, client: StoreClient) -> None:
        """Two loaded copies of one State, unchanged, both save without error or new entries."""
        client.save(rich_state())
        first, second = client.load("rich"), client.load("rich")
        client.save(first)
        client.save(second)
        assert client.list()[0].entries == len(first.history)

    # -- binding ---------------------------------------------------------------------------------

    def test_save_binds_the_state_to_the_store(self, client: StoreClient) -> None:
        """After `save`, the State is bound to the store: an Agent without one saves it there."""
        state = State(messages=[Message.user("hi")])
        client.save(state)
        assert client.run_agent(Agent(FakeModel(["Hello."])), state) == "Hello."
        assert_same(client.load(state.id), state)

    def test_load_binds_the_state_to_the_store(self, client: StoreClient) -> None:
        """A loaded State is bound to the store it came from: its runs are saved there."""
        client.save(State(id="bound", messages=[Message.user("hi")]))
        loaded = client.load("bound")
        assert client.run_agent(Agent(FakeModel(["Hello."])), loaded) == "Hello."
        assert_same(client.load("bound"), loaded)

    def test_children_open_from_the_store_of_a_loaded_parent(self, client: StoreClient) -> None:
        """`child`/`achild` of a loaded parent load the child from the same store."""
        parent = State(id="parent", messages=[Message.user("delegate")])
        parent = appended(parent, ModelRequestEntry, ModelRequest(model="fake"))
        call = tool_call_of("c1", "helper", task="look")
        parent = appended(parent, ModelReplyEntry, Reply(Message.assistant("", [call])))
        child = dated("kid", datetime.now(UTC), parent=("parent", "c1"))
        done = result_block("c1", TextBlock("done"))
        parent = appended(
            parent, ToolResultEntry, done, call=call, outcome="done", child_ids=("kid",)
        )
        client.save(child)
        client.save(parent)
        opened = client.child(client.load("parent"), "kid")
        assert_same(opened, child)
        assert opened.parent_id == "parent"
        opened.add_message(Message.user("and more"))  # opened from the store: bound to it
        assert client.run_agent(Agent(FakeModel(["More."])), opened) == "More."
        assert_same(client.load("kid"), opened)

    # -- lookups and ids -------------------------------------------------------------------------

    def test_a_missing_id_raises_lookup_error(self, client: StoreClient) -> None:
        """Loading an id that was never saved raises `LookupError` naming it."""
        with pytest.raises(LookupError, match="nothing-here"):
            client.load("nothing-here")

    def test_a_bad_id_raises_value_error(self, client: StoreClient) -> None:
        """An id that is not valid (``../x``) raises `ValueError`, and nothing is created."""
        for bad in ("../x", "a/b", "", "x" * 129):
            with pytest.raises(ValueError, match="not valid"):
                client.load(bad)
            with pytest.raises(ValueError, match="not valid"):
                client.delete(bad)
        assert client.list() == []

    # -- list ------------------------------------------------------------------------------------

    def test_list_is_most_recently_updated_first(self, client: StoreClient) -> None:
        """`list` orders by `updated_at`, newest first; a State saved again moves up."""
        base = datetime(2024, 5, 1, tzinfo=UTC)
        old, new, mid = (
            dated(name, base + timedelta(hours=h))
            for name, h in (("old", 1), ("new", 3), ("mid", 2))
        )
        for state in (old, new, mid):
            client.save(state)
        assert client.ids() == ["new", "mid", "old"]
        old.add_message(Message.user("back again"))  # recorded now: the newest
        client.save(old)
        assert client.ids() == ["old", "new", "mid"]

    def test_list_gives_the_info_of_each_state(self, client: StoreClient) -> None:
        """`list` gives each State's `StateInfo`, equal to the info of the State saved."""
        states = [
            rich_state(),
            crashed_pending(),
            dated("kid", datetime.now(UTC), parent=("p", "c")),
        ]
        for state in states:
            client.save(state)
        by_id = {info.id: info for info in client.list()}
        assert by_id == {state.id: storage_view(state).info for state in states}
        rich = by_id["rich"]
        assert rich.finished
        assert rich.title == "Look at this\u2028screenshot, ünïcode ✓"
        assert rich.entries == len(states[0].history)
        assert (by_id["kid"].parent_id, by_id["kid"].parent_call_id) == ("p", "c")

    def test_list_filters_by_parent_id(self, client: StoreClient) -> None:
        """`list(parent_id=)` gives only the children of that State, newest first."""
        base = datetime(2024, 5, 1, tzinfo=UTC)
        states = [
            dated("a1", base + timedelta(minutes=1), parent=("a", "c1")),
            dated("b1", base + timedelta(minutes=2), parent=("b", "c1")),
            dated("a2", base + timedelta(minutes=3), parent=("a", "c2")),
            dated("a", base + timedelta(minutes=4)),
        ]
        for state in states:
            client.save(state)
        assert client.ids(parent_id="a") == ["a2", "a1"]
        assert client.ids(parent_id="b") == ["b1"]
        assert client.ids(parent_id="nobody") == []
        assert client.ids(parent_id="a", limit=1) == ["a2"]
        assert [info.parent_call_id for info in client.list(parent_id="a")] == ["c2", "c1"]

    def test_list_limit(self, client: StoreClient) -> None:
        """`list(limit=n)` gives the first `n`."""
        base = datetime(2024, 5, 1, tzinfo=UTC)
        for i in range(5):
            client.save(dated(f"s{i}", base + timedelta(seconds=i)))
        assert client.ids(limit=2) == ["s4", "s3"]
        assert client.ids(limit=5) == ["s4", "s3", "s2", "s1", "s0"]
        assert client.ids(limit=50) == ["s4", "s3", "s2", "s1", "s0"]
        assert client.ids(limit=0) == []

    # -- delete ----------------------------------------------------------------------------------

    def test_delete_forgets_the_state(self, client: StoreClient) -> None:
        """A deleted State cannot be loaded and is not listed; the others stay."""
        kept, gone = State(id="kept", messages=[Message.user("a")]), rich_state("gone")
        client.save(kept)
        client.save(gone)
        client.delete("gone")
        with pytest.raises(LookupError):
            client.load("gone")
        assert client.ids() == ["kept"]
        assert_same(client.load("kept"), kept)

    def test_delete_of_a_missing_id_is_fine(self, client: StoreClient) -> None:
        """Deleting an id that is not stored does nothing."""
        client.delete("never-saved")
        client.save(State(id="once", messages=[Message.user("a")]))
        client.delete("once")
        client.delete("once")
        assert client.list() == []

    def test_an_id_can_be_used_again_after_delete(self, client: StoreClient) -> None:
        """After a delete, a new State may be saved under the same id."""
        first = rich_state("reused")
        client.save(first)
        client.delete("reused")
        second = State(id="reused", messages=[Message.user("a new start")])
        client.save(second)
        second.add_message(Message.user("and more"))
        client.save(second)
        assert_same(client.load("reused"), second)

    # -- the save rule ---------------------------------------------------------------------------

    def test_another_history_under_a_taken_id_is_refused(self, client: StoreClient) -> None:
        """Saving a different State under a stored id raises `StoreConflictError` (`load` it)."""
        first = State(id="taken", messages=[Message.user("first")])
        client.save(first)
        other = State(id="taken", messages=[Message.user("second")])
        other.add_message(Message.user("more"))
        with pytest.raises(StoreConflictError, match=r"taken.*load"):
            client.save(other)
        assert_same(client.load("taken"), first)
        assert client.list()[0].entries == 1

    def test_an_older_copy_is_refused(self, client: StoreClient) -> None:
        """Saving a copy that is behind the stored history, or diverged, is a conflict."""
        client.save(State(id="copied", messages=[Message.user("start")]))
        ahead, behind = client.load("copied"), client.load("copied")
        ahead.add_message(Message.user("ahead"))
        client.save(ahead)
        with pytest.raises(StoreConflictError, match=r"copied.*load"):
            client.save(behind)
        behind.add_message(Message.user("diverged"))
        behind.add_message(Message.user("further"))
        with pytest.raises(StoreConflictError, match=r"copied.*load"):
            client.save(behind)
        assert_same(client.load("copied"), ahead)

    def test_a_batch_save_refuses_only_the_states_that_do_not_continue(
        self, client: StoreClient
    ) -> None:
        """A batch save (`BatchStore`, `AsyncBatchStore`, if the store has one) saves the others.

        The refused States' errors come back by position; the rest are saved, as `save` would
        save each. A store without a batch save passes at once: the library saves one by one.
        """
        client.save(State(id="taken", messages=[Message.user("first")]))
        fresh = State(id="fresh", messages=[Message.user("new")])
        other = State(id="taken", messages=[Message.user("another history")])
        other.add_message(Message.user("more"))
        grown = client.load("taken")
        grown.add_message(Message.user("grown"))
        refused = client.save_many([fresh, other, State(id="empty")])
        if refused is None:
            return
        assert list(refused) == [1]
        assert isinstance(refused[1], StoreConflictError)
        assert "taken" in str(refused[1])
        assert_same(client.load("fresh"), fresh)
        assert client.load("empty").history == ()
        fresh.add_message(Message.user("again"))
        assert client.save_many([fresh, grown]) == {}
        assert_same(client.load("fresh"), fresh)
        assert_same(client.load("taken"), grown)

    # -- crash recovery --------------------------------------------------------------------------

    def test_a_request_waiting_on_the_model_is_taken_back(self, client: StoreClient) -> None:
        """A request cut off while waiting on the model is taken back on load; the State runs on."""
        state = crashed_waiting()
        stored = len(state.history)
        client.save(state)
        loaded = client.load(state.id)
        assert loaded.history[:stored] == state.history
        added = loaded.history[stored:]
        assert [entry.kind for entry in added] == ["error"]
        assert "taken back" in str(added[0].content)
        assert loaded.turn == 0
        assert loaded.messages == state.messages
        assert client.list()[0].entries == stored  # loading writes nothing
        self._check_saved_once(client, loaded, stored + 1)
        answer = client.run_agent(Agent(FakeModel(["Done."]), store=client.store), loaded)
        assert answer == "Done."
        assert_same(client.load(state.id), loaded)

    def test_pending_calls_get_an_unknown_result(self, client: StoreClient) -> None:
        """Calls cut off without a result get an ``unknown`` result on load, never a re-run."""
        state = crashed_pending()
        stored = len(state.history)
        client.save(state)
        loaded = client.load(state.id)
        assert loaded.history[:stored] == state.history
        added = loaded.history[stored:]
        assert all(isinstance(entry, ToolResultEntry) for entry in added)
        results = cast("list[ToolResultEntry]", list(added))
        assert [(entry.call.id, entry.outcome) for entry in results] == [
            ("c2", "unknown"),
            ("c3", "unknown"),
        ]
        for entry in results:
            assert entry.content.is_error
            assert "may or may not have run" in entry.content.text
        assert loaded.pending_calls == ()
        assert [block.call_id for block in loaded.messages[-1].tool_results] == ["c1", "c2", "c3"]
        self._check_saved_once(client, loaded, stored + 2)
        agent = Agent(FakeModel(["I will check b.py first."]), store=client.store)
        assert client.run_agent(agent, loaded) == "I will check b.py first."
        assert_same(client.load(state.id), loaded)

    def test_children_of_a_cut_off_call_stay_listed(self, client: StoreClient) -> None:
        """The children a cut-off call started are in its ``unknown`` result, usage included."""
        client.save(crashed_pending("lead"))
        start = datetime(2026, 1, 1, tzinfo=UTC)
        for minute, (kid, call) in enumerate((("kid-a", "c2"), ("kid-b", "c2"), ("kid-c", "c3"))):
            child = dated(kid, start + timedelta(minutes=minute), parent=("lead", call))
            child = appended(child, ModelRequestEntry, ModelRequest(model="fake"))
            spent = Reply(Message.assistant("on it"), Usage(input_tokens=10 + minute))
            child = appended(child, ModelReplyEntry, spent)
            client.save(child)
        client.save(dated("stranger", start, parent=("someone-else", "c2")))
        loaded = client.load("lead")
        added = cast("list[ToolResultEntry]", list(loaded.history[-2:]))
        assert [(entry.call.id, entry.child_ids) for entry in added] == [
            ("c2", ("kid-a", "kid-b")),
            ("c3", ("kid-c",)),
        ]
        assert [entry.usage.input_tokens for entry in added] == [10 + 11, 12]
        assert client.load("kid-b").parent_call_id == "c2"

    def test_a_cut_off_state_left_by_an_agent_runs_on(self, client: StoreClient) -> None:
        """An Agent runs a recovered State on to an answer, saving it through the store."""
        state = crashed_pending("agent-run")
        client.save(state)
        loaded = client.load("agent-run")
        model = FakeModel([tool_call("echo", text="again"), "All done."])
        answer = client.run_agent(Agent(model, tools=[echo], store=client.store), loaded)
        assert answer == "All done."
        again = client.load("agent-run")
        assert_same(again, loaded)
        assert [entry.outcome for entry in again.history if isinstance(entry, ToolResultEntry)] == [
            "done",
            "unknown",
            "unknown",
            "done",
        ]

    @staticmethod
    def _check_saved_once(client: StoreClient, loaded: State, size: int) -> None:
        """The recovered entries are saved by the next save, and a load does not add them again."""
        assert len(loaded.history) == size
        client.save(loaded)
        assert client.list()[0].entries == size
        for _ in range(2):
            again = client.load(loaded.id)
            assert_same(again, loaded)
            client.save(again)
        assert client.list()[0].entries == size

    # -- concurrency -----------------------------------------------------------------------------

    def test_concurrent_saves_of_many_states(self, client: StoreClient) -> None:
        """Many threads (and tasks) save many States, new and growing, at once; nothing is lost."""
        workers, rounds = 8, 6
        own = [
            State(id=f"worker-{i}", messages=[Message.user(f"task {i}")]) for i in range(workers)
        ]
        shared = State(id="shared", messages=[Message.user("everyone writes here")])

        def work(i: int) -> Iterator[State]:
            for r in range(rounds):
                own[i].add_message(Message.user(f"worker {i} round {r}"))
                yield own[i]
                shared.add_message(Message.user(f"shared by {i} round {r}"))
                yield shared
                state = State(id=f"new-{i}-{r}", messages=[Message.user("fresh")])
                yield state
                state.add_message(Message.user("grown"))
                yield state

        client.concurrently(workers, work)
        for state in [*own, shared]:
            assert_same(client.load(state.id), state)
        infos = client.list()
        assert len(infos) == workers + 1 + workers * rounds
        assert {info.id: info.entries for info in infos}["shared"] == 1 + workers * rounds
        assert all(
            client.load(f"new-{i}-{r}").messages[-1].text == "grown"
            for i in range(workers)
            for r in range(rounds)
        )

    def test_saves_of_one_state_while_it_records(self, client: StoreClient) -> None:
        """Workers recording into one State and saving it at once store all its entries in order."""
        state = State(id="busy", messages=[Message.user("go")])
        lock = threading.Lock()

        def work(i: int) -> Iterator[State]:
            for r in range(20):
                with lock:  # several workers record into one State, like parallel tool calls
                    state.add_message(Message.user(f"{i}.{r}"))
                yield state

        client.concurrently(6, work)
        client.save(state)
        assert_same(client.load("busy"), state)
        assert client.list()[0].entries == 1 + 6 * 20

    # -- agent memory ----------------------------------------------------------------------------

    def _needs_memory(self, client: StoreClient) -> None:
        """For a store that keeps no memory: `Memory` refuses it. The caller then stops."""
        with pytest.raises(TypeError, match="keeps agent memory"):
            Memory.open("digest", None, client.store)

    def test_implements_the_memory_protocols(self, store: Any) -> None:
        """A store that keeps memory is a `MemoryBackend` and/or `AsyncMemoryBackend`.

        An async-only store's sync memory methods raise `TypeError` naming their async twins.
        """
        if not self.keeps_memory:
            with pytest.raises(TypeError, match="keeps agent memory"):
                Memory.open("digest", None, store)
            return
        if "sync" in self.colours:
            assert isinstance(store, MemoryBackend)
        else:
            if isinstance(store, MemoryBackend):  # its sync methods point at the async ones
                with pytest.raises(TypeError, match="amemory_get"):
                    store.memory_get("a", "kv", "k")
                with pytest.raises(TypeError, match="amemory_scan"):
                    store.memory_scan("a", "kv")
                with pytest.raises(TypeError, match="amemory_put"):
                    store.memory_put("a", "kv", "k", "1")
        if "async" in self.colours:
            assert isinstance(store, AsyncMemoryBackend)

    def test_memory_round_trips_text_per_key(self, client: StoreClient) -> None:
        """Written text reads back, a missing key reads None, a scan gives a space in key order."""
        if not self.keeps_memory:
            return self._needs_memory(client)
        assert client.memory_get("digest", "kv", "nothing") is None
        assert client.memory_scan("digest", "kv") == []
        texts = {
            "b": '{"a":[1,2.5,null,true]}',
            "a": '"line\\nbreak \u2028 ünïcode ✓"',
            "é": "1042",
            "Z": "null",
            "a b/c:d": '""',
        }
        for key, text in texts.items():
            assert client.memory_put("digest", "kv", key, text) is True
        for key, text in texts.items():
            assert client.memory_get("digest", "kv", key) == text
        assert client.memory_scan("digest", "kv") == sorted(texts.items())
        assert client.memory_put("digest", "kv", "b", "2") is True
        assert client.memory_get("digest", "kv", "b") == "2"

    def test_memory_none_deletes(self, client: StoreClient) -> None:
        """Writing None deletes the key; deleting a missing key is fine."""
        if not self.keeps_memory:
            return self._needs_memory(client)
        client.memory_put("digest", "kv", "k", "1")
        assert client.memory_put("digest", "kv", "k", None) is True
        assert client.memory_get("digest", "kv", "k") is None
        assert client.memory_put("digest", "kv", "never", None) is True
        assert client.memory_scan("digest", "kv") == []

    def test_memory_spaces_and_agents_are_separate(self, client: StoreClient) -> None:
        """A key lives in one space of one agent: other spaces and agents never see it."""
        if not self.keeps_memory:
            return self._needs_memory(client)
        client.memory_put("digest", "kv", "k", "1")
        client.memory_put("digest", "collection:loops", "k", "2")
        client.memory_put("other", "kv", "k", "3")
        assert client.memory_get("digest", "kv", "k") == "1"
        assert client.memory_get("digest", "collection:loops", "k") == "2"
        assert client.memory_get("other", "kv", "k") == "3"
        assert client.memory_get("nobody", "kv", "k") is None
        assert client.memory_scan("digest", "kv") == [("k", "1")]
        assert client.memory_scan("other", "collection:loops") == []
        client.memory_put("other", "kv", "k", None)
        assert client.memory_get("digest", "kv", "k") == "1"

    def test_memory_effect_key_applies_once(self, client: StoreClient) -> None:
        """A write whose effect key the agent's store has seen changes nothing and says so."""
        if not self.keeps_memory:
            return self._needs_memory(client)
        assert client.memory_put("digest", "kv", "k", "1", "s:c1:0") is True
        assert client.memory_put("digest", "kv", "k", "2", "s:c1:0") is False
        assert client.memory_put("digest", "kv", "k", None, "s:c1:0") is False
        assert client.memory_get("digest", "kv", "k") == "1"
        assert client.memory_put("digest", "kv", "k", "3", "s:c1:1") is True
        assert client.memory_get("digest", "kv", "k") == "3"
        # Effect keys belong to one agent: another agent's write with the same key applies.
        assert client.memory_put("other", "kv", "k", "4", "s:c1:0") is True
        assert client.memory_get("other", "kv", "k") == "4"

    def test_memory_replayed_writes_end_on_the_last_write(self, client: StoreClient) -> None:
        """Replaying upsert A, upsert B, upsert A with their keys writes nothing: A stays last."""
        if not self.keeps_memory:
            return self._needs_memory(client)
        writes = [("A", '"first"', "s:c:0"), ("B", '"b"', "s:c:1"), ("A", '"last"', "s:c:2")]
        assert [client.memory_put("digest", "kv", *write) for write in writes] == [True] * 3
        assert [client.memory_put("digest", "kv", *write) for write in writes] == [False] * 3
        assert client.memory_scan("digest", "kv") == [("A", '"last"'), ("B", '"b"')]

    def test_memory_is_kept_beside_the_states(self, client: StoreClient) -> None:
        """Memory is not a State: `list` does not show it, and deleting States keeps it."""
        if not self.keeps_memory:
            return self._needs_memory(client)
        client.memory_put("digest", "kv", "k", "1")
        assert client.list() == []
        client.save(State(id="digest", messages=[Message.user("hi")]))
        assert client.ids() == ["digest"]
        client.delete("digest")
        assert client.memory_get("digest", "kv", "k") == "1"

    def test_memory_refuses_bad_arguments(self, client: StoreClient) -> None:
        """A bad agent name, an empty space or key, or data that is not text raise at once."""
        if not self.keeps_memory:
            return self._needs_memory(client)
        for bad in ("../x", "a/b", "", "x" * 129):
            with pytest.raises(ValueError, match="not valid"):
                client.memory_get(bad, "kv", "k")
            with pytest.raises(ValueError, match="not valid"):
                client.memory_put(bad, "kv", "k", "1")
        with pytest.raises(ValueError, match="empty"):
            client.memory_put("digest", "kv", "", "1")
        with pytest.raises(ValueError, match="empty"):
            client.memory_scan("digest", "")
        with pytest.raises(TypeError, match="JSON text"):
            client.memory_put("digest", "kv", "k", cast("Any", 1))
        assert client.memory_scan("digest", "kv") == []

    def test_concurrent_memory_writes(self, client: StoreClient) -> None:
        """Many writers at once: every write lands, and an effect key wins exactly once."""
        if not self.keeps_memory:
            return self._needs_memory(client)
        workers, rounds = 6, 8

        def puts(i: int) -> Iterator[tuple[str, str, str, str | None]]:
            for r in range(rounds):
                yield ("digest", f"w{i}-{r}", str(r), None)
                yield ("digest", f"race-{r}", str(i), f"shared:call:{r}")
                yield (f"agent-{i % 2}", f"w{i}-{r}", str(i), f"own:{i}:{r}")

        results = client.concurrent_puts(workers, puts)
        assert results.count(True) == workers * rounds * 2 + rounds
        assert results.count(False) == (workers - 1) * rounds
        rows = dict(client.memory_scan("digest", "kv"))
        assert len(rows) == workers * rounds + rounds
        assert all(rows[f"w{i}-{r}"] == str(r) for i in range(workers) for r in range(rounds))
        assert all(rows[f"race-{r}"] in {str(i) for i in range(workers)} for r in range(rounds))
        assert len(client.memory_scan("agent-0", "kv")) == (workers // 2) * rounds

    def test_memory_api_over_the_store(self, client: StoreClient) -> None:
        """`Memory` works over the store: validated upserts, where and limit, removal."""
        if not self.keeps_memory:
            return self._needs_memory(client)
        memory = client.memory("digest")
        stored = client.upsert(memory, "reply-anna", {"title": "Reply to Anna", "status": "open"})
        assert stored == {
            "id": "reply-anna",
            "title": "Reply to Anna",
            "status": "open",
            "due": None,
        }
        client.upsert(memory, "call-bob", Loop(title="Call Bob", status="resolved"))
        with pytest.raises(ValidationError) as raised:
            client.upsert(memory, "x", {"title": "X", "status": "later"})
        assert [issue.path for issue in raised.value.issues] == [("status",)]
        assert [doc["id"] for doc in client.loops(memory)] == ["call-bob", "reply-anna"]
        assert client.loops(memory, where={"status": "open"}, limit=10) == [stored]
        assert client.loops(memory, limit=1) == [
            {"id": "call-bob", "title": "Call Bob", "status": "resolved", "due": None}
        ]
        assert client.loops(client.memory("other")) == []
