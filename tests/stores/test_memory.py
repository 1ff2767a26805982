"""`MemoryStore` beyond the contract: it keeps encoded entries, and its async side has no thread."""

# pyright: reportPrivateUsage=false
# This file checks MemoryStore's private storage (its encoded lines, damaged on purpose) and
# the codec's TypeAdapter: no public name reaches them.

from __future__ import annotations

import threading

import anyio
import pytest

from orchestrator import AsyncStore, Message, RunStart, State, StateInfo, Store, StoreDamagedError

# Private: the recording functions have no public name.
from orchestrator._record._recording import begin_think, record_run_start
from stores import MemoryStore, chain_digests, decode_entry, encode_entry, first_digest

# Private: the TypeAdapter behind encode_entry, to check the encoding against it.
from stores._codec import _ENTRY
from stores.backend import bind_state, recover_state, storage_view
from stores.contract import crashed_pending, crashed_waiting, rich_state


def test_it_is_both_a_store_and_an_async_store() -> None:
    store = MemoryStore()
    assert isinstance(store, Store)
    assert isinstance(store, AsyncStore)
    assert repr(store) == "<MemoryStore states=0>"


# MemoryStore keeps its entries in `_states` (private): no public way reaches them to check
# or damage them, as the file and SQLite tests do through the files.


def test_it_keeps_encoded_entries_not_the_live_state() -> None:
    store = MemoryStore()
    state = rich_state()
    store.save(state)
    bind_state(state, None)
    lines = store._states["rich"].lines
    assert all(isinstance(line, bytes) for line in lines)
    assert [decode_entry(line, state_id="rich", index=i) for i, line in enumerate(lines)] == list(
        state.history
    )
    state.restore(state.snapshot())  # recorded after the save: not in the store
    loaded = store.load("rich")
    assert loaded is not state
    assert len(loaded.history) == len(state.history) - 1
    assert loaded.history[0] is not state.history[0]


def forge(store: MemoryStore, state_id: str, lines: list[bytes]) -> None:
    """Store `lines` as the State's entries with valid digests (past the integrity check)."""
    saved = store._states[state_id]
    saved.lines[:] = lines
    saved.digests[:] = chain_digests(first_digest(state_id), lines)


def test_a_damaged_entry_raises_value_error_naming_the_state_and_index() -> None:
    store = MemoryStore()
    store.save(rich_state("hurt"))
    store.save(State(id="fine", messages=[Message.user("ok")]))
    lines = list(store._states["hurt"].lines)
    store._states["hurt"].lines[3] = b'{"seq": 3, "kind": "nope"'
    with pytest.raises(StoreDamagedError, match=r"'hurt'.*entry 3 fails its integrity check"):
        store.load("hurt")
    forge(store, "hurt", [*lines[:3], b'{"seq": 3, "kind": "nope"', *lines[4:]])
    with pytest.raises(StoreDamagedError, match=r"'hurt' is damaged: history entry 3 cannot be"):
        store.load("hurt")
    forge(store, "hurt", [*lines[:3], lines[4], *lines[4:]])
    with pytest.raises(StoreDamagedError, match=r"'hurt'.*entry 3 says it is entry 4"):
        store.load("hurt")
    assert store.load("fine").messages[0].text == "ok"
    assert {info.id for info in store.list()} == {"hurt", "fine"}


def test_a_history_that_does_not_replay_raises_value_error_naming_the_state() -> None:
    store = MemoryStore()
    state = State(id="odd", messages=[Message.user("a")])
    begin_think(state)
    store.save(state)
    lines = store._states["odd"].lines
    # A second request while waiting, with valid digests: only the replay can refuse it.
    forge(store, "odd", [*lines, lines[1].replace(b'"seq":1', b'"seq":2')])
    with pytest.raises(StoreDamagedError, match=r"State 'odd' is damaged: its history cannot be"):
        store.load("odd")


def test_bad_arguments_raise_with_what_to_pass() -> None:
    store = MemoryStore()
    with pytest.raises(TypeError, match="State objects"):
        store.save("not a state")  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match=">= 0"):
        store.list(limit=-1)
    with pytest.raises(TypeError, match="limit must be an int"):
        store.list(limit="2")  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match=r"parent_id '\.\./x' is not valid"):
        store.list(parent_id="../x")
    with pytest.raises(TypeError, match="state_id must be a str"):
        store.load(3)  # pyright: ignore[reportArgumentType]


@pytest.mark.anyio
async def test_the_async_methods_run_on_the_loop_thread_without_workers() -> None:
    threads: list[threading.Thread] = []

    class Watched(MemoryStore):
        def save(self, state: State) -> None:
            threads.append(threading.current_thread())
            super().save(state)

    store = Watched()
    state = State(id="here", messages=[Message.user("hi")])
    await store.asave(state)
    assert threads == [threading.current_thread()]
    assert (await store.aload("here")).messages == state.messages
    assert [info.id for info in await store.alist()] == ["here"]
    await store.adelete("here")
    assert await store.alist() == []


@pytest.mark.anyio
async def test_a_cancelled_asave_saves_nothing() -> None:
    store = MemoryStore()
    with anyio.CancelScope() as scope:
        scope.cancel()
        await store.asave(State(id="never", messages=[Message.user("hi")]))
    assert scope.cancelled_caught
    assert store.list() == []


def test_the_info_a_save_keeps_is_what_info_of_gives() -> None:
    kid = State(id="kid")
    record_run_start(kid, RunStart(parent_id="p", parent_call_id="c"))
    notice_first = State(id="notice", messages=[Message.notice("n"), Message.user("u" * 300)])
    for state in (rich_state(), crashed_pending(), crashed_waiting(), State(), kid, notice_first):
        assert storage_view(state).info == _info_from_snapshot(state)
        store = MemoryStore()
        store.save(state)
        (listed,) = store.list()
        assert listed == storage_view(state).info


def _info_from_snapshot(state: State) -> StateInfo:
    """The info as the public snapshot tells it: what the O(1) info_of must agree with."""
    snap = state.snapshot()
    titles = [m.text for m in snap.messages if m.role == "user" and not m.tool_results and m.text]
    return StateInfo(
        id=state.id,
        parent_id=state.parent_id,
        parent_call_id=state.parent_call_id,
        title=titles[0][:200] if titles else "",
        created_at=snap.created_at,
        updated_at=snap.updated_at,
        turn=snap.turn,
        stopped=snap.stopped,
        finished=snap.finished,
        usage=snap.usage,
        entries=len(snap.history),
    )


def test_each_kind_encodes_to_the_bytes_the_union_gives() -> None:
    # encode_entry takes each kind's own serializer (twice as fast): it must write what the
    # union would, for every kind of entry and value (images are base64).
    recovered = crashed_waiting()
    recover_state(recovered)  # an error entry: the request taken back
    history = [*rich_state().history, *crashed_pending().history, *recovered.history]
    assert {entry.kind for entry in history} >= {
        "context_change", "extra_data", "run_start", "model_request", "model_reply",
        "tool_result", "user", "notice", "error", "stop", "ask",
    }  # fmt: skip
    for entry in history:
        assert encode_entry(entry) == _ENTRY.dump_json(entry)
