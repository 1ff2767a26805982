"""Where an Agent saves: every entry is stored before the model is asked, before a tool runs,
and when the run ends; save points with nothing awaited between them are written as one, so a
loop of one's own saves exactly as the default loop does. A sync store is called off the event
loop thread; a save that fails after an error or a cancellation is a note on it, never instead
of it."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import anyio.to_thread
import pytest

from orchestrator import (
    Agent,
    CallAbandonedError,
    ContextChangeEntry,
    Message,
    State,
    loop,
    tool,
    waiting_for_user,
)
from orchestrator.models import Request
from orchestrator.permissions import AllowByName, DenyByName
from orchestrator.testing import FakeModel, tool_call
from stores import MemoryStore
from tests.doubles import ThreadCheckedStore, results

TIMEOUT = 20  # seconds; only reached when a regression makes something wait forever
NO_SPACE = "No space left on device"


class CountingStore(MemoryStore):
    """A MemoryStore that counts its saves, and wakes `saved()` waiters after each."""

    def __init__(self) -> None:
        super().__init__()
        self.saves = 0
        self._saved = anyio.Event()

    async def asave(self, state: State) -> None:
        self.saves += 1
        await super().asave(state)
        self._saved.set()
        self._saved = anyio.Event()

    async def saved(self) -> None:
        """Wait for the next save to complete."""
        await self._saved.wait()


def stored_entries(store: MemoryStore, state: State) -> int:
    """How many entries of `state` the store holds."""
    infos = [info for info in store.list() if info.id == state.id]
    return infos[0].entries if infos else 0


@loop(until=[waiting_for_user])
async def by_hand(agent: Agent, state: State) -> None:
    """The default loop's steps, written out as a user would."""
    await agent.athink(state)
    if state.pending_calls:
        await agent.ause_tools(state)


@pytest.mark.anyio
async def test_every_entry_is_stored_before_the_model_is_asked_and_before_a_tool_runs() -> None:
    store = MemoryStore()
    state = State(messages=[Message.user("Go")])
    seen: list[tuple[str, int, int]] = []

    def request(reply: Any) -> Any:
        def respond(_: Request) -> Any:
            seen.append(("request", stored_entries(store, state), len(state.history)))
            return reply

        return respond

    @tool
    async def look() -> str:
        """Look."""
        seen.append(("tool", stored_entries(store, state), len(state.history)))
        return "seen"

    model = FakeModel([request(tool_call("look")), request(tool_call("look")), request("Done.")])
    assert await Agent(model, tools=[look], store=store).arun(state) == "Done."
    assert [what for what, _, _ in seen] == ["request", "tool", "request", "tool", "request"]
    for what, stored, recorded in seen:
        assert stored == recorded, what
    assert store.load(state.id).history == state.history


@pytest.mark.anyio
async def test_a_result_is_stored_while_the_other_calls_of_its_turn_run() -> None:
    store = CountingStore()
    state = State(messages=[Message.user("Go")])

    @tool
    async def quick() -> str:
        """Answer at once."""
        return "quick"

    @tool
    async def slow() -> str:
        """Wait until the quick result is stored."""
        with anyio.fail_after(5):
            while not quick_result_stored():
                await store.saved()
        return "slow"

    def quick_result_stored() -> bool:
        # A load closes the calls it finds open with an "unknown" result: look for the real one.
        for entry in store.load(state.id).history:
            if entry.kind == "tool_result" and entry.call.name == "quick":
                return entry.outcome == "done"
        return False

    model = FakeModel([[tool_call("slow"), tool_call("quick")], "Done."])
    assert await Agent(model, tools=[quick, slow], store=store).arun(state) == "Done."


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("script", "saves"),
    [
        # Request 1 with the run's start, reply 1, request 2 with the result, the end with reply 2.
        ([tool_call("look"), "Done."], 4),
        # The same, and the second result is written while the first call still runs.
        ([[tool_call("look"), tool_call("wait")], "Done."], 5),
    ],
)
async def test_a_loop_of_ones_own_saves_exactly_as_the_default_loop(
    script: list[Any], saves: int
) -> None:
    # Issue 13: the default loop saved less than the same steps in a @loop (4 saves against 7),
    # through a flag only the default loop passed. Now the saver coalesces save points itself.
    @tool
    async def look() -> str:
        """Look."""
        return "seen"

    @tool
    async def wait() -> str:
        """Wait until the other call's result is stored."""
        with anyio.fail_after(5):
            while store.saves < 3:
                await store.saved()
        return "waited"

    counts: list[int] = []
    for body in (None, by_hand):
        store = CountingStore()
        state = State(messages=[Message.user("Go")])
        agent = Agent(FakeModel(list(script)), tools=[look, wait], store=store, loop=body)
        assert await agent.arun(state) == "Done."
        assert store.load(state.id).history == state.history
        counts.append(store.saves)
    assert counts == [saves, saves]


@pytest.mark.anyio
async def test_a_save_point_is_written_while_the_loop_awaits_something_else() -> None:
    # A loop of one's own may await anything between the steps: what was recorded before is
    # written meanwhile, not only at the next step.
    store = CountingStore()
    written: list[int] = []

    @loop(until=[waiting_for_user])
    async def slow(agent: Agent, state: State) -> None:
        await agent.athink(state)
        with anyio.fail_after(5):
            while stored_entries(store, state) < len(state.history):
                await store.saved()
        written.append(len(state.history))
        if state.pending_calls:
            await agent.ause_tools(state)

    state = State(messages=[Message.user("Go")])
    assert await Agent(FakeModel(["Done."]), store=store, loop=slow).arun(state) == "Done."
    assert [entry.kind for entry in state.history][: written[0]][-1] == "model_reply"


@pytest.mark.anyio
async def test_athink_and_ause_tools_called_directly_save_what_they_record() -> None:
    @tool
    async def look() -> str:
        """Look."""
        return "seen"

    store = MemoryStore()
    agent = Agent(FakeModel([tool_call("look"), "Done."]), tools=[look], store=store)
    state = State(messages=[Message.user("Go")])
    await agent.athink(state)
    await agent.ause_tools(state)
    assert store.load(state.id).history == state.history  # the turn's last result too
    await agent.athink(state)
    assert state.answer == "Done."
    assert store.load(state.id).history == state.history  # a reply without calls too


@pytest.mark.anyio
async def test_a_run_that_stops_at_once_is_saved() -> None:
    store = MemoryStore()
    state = State(messages=[Message.user("Hi"), Message.assistant("Hello.")])
    await Agent(FakeModel([]), store=store).arun(state)  # waiting for the user: no request
    assert store.load(state.id).history == state.history
    assert [entry.kind for entry in state.history][-2:] == ["run_start", "stop"]


@pytest.mark.anyio
async def test_a_timed_out_sync_tool_cannot_record_after_the_run_saved_its_end() -> None:
    # Found by a review: the run saved, then waited for the timed-out tool's thread, which
    # recorded one more entry that no save wrote. Issue 26: the run no longer waits for the
    # thread, and the abandoned thread's late write is refused, so the store has it all.
    started = threading.Event()
    release = threading.Event()
    finished = threading.Event()
    late: list[BaseException] = []

    class ReleasingStore(MemoryStore):
        """Lets the tool's thread go on once the run's end (its stop) is saved."""

        async def asave(self, state: State) -> None:
            await super().asave(state)
            if state.history[-1].kind == "stop":
                release.set()

    @tool(timeout=0.01)
    def slow(state: State) -> str:
        """Take too long, then try to note progress in the state."""
        started.set()
        try:
            release.wait(5)
            state.set("progress", "late")
        except CallAbandonedError as error:
            late.append(error)
        finally:
            finished.set()
        return "never seen"

    def answer(request: Request) -> str:
        started.wait(5)  # the tool's thread has surely begun before the run can end
        return "Done."

    store = ReleasingStore()
    state = State(messages=[Message.user("Go")])
    agent = Agent(FakeModel([tool_call("slow"), answer]), tools=[slow], store=store)
    assert await agent.arun(state) == "Done."
    assert await anyio.to_thread.run_sync(finished.wait, 5)
    assert [type(error) for error in late] == [CallAbandonedError]
    assert state.get("progress") is None
    assert store.load(state.id).history == state.history


@pytest.mark.anyio
async def test_a_subagents_save_points_are_written_while_its_loop_awaits_something_else() -> None:
    # A child shares the writer of the run it starts in (no task of its own): its save points
    # are written all the same, into the parent's store.
    store = CountingStore()
    written: list[int] = []

    @loop(until=[waiting_for_user])
    async def slow(agent: Agent, state: State) -> None:
        await agent.athink(state)
        with anyio.fail_after(5):
            while stored_entries(store, state) < len(state.history):
                await store.saved()
        written.append(len(state.history))

    child_agent = Agent(FakeModel(["Found it."]), loop=slow)

    @tool
    async def delegate() -> str:
        """Ask the child."""
        return str(await child_agent.arun("Look"))

    state = State(messages=[Message.user("Go")])
    lead = Agent(FakeModel([tool_call("delegate"), "Done."]), tools=[delegate], store=store)
    assert await lead.arun(state) == "Done."
    (child_id,) = [
        i for entry in state.history if entry.kind == "tool_result" for i in entry.child_ids
    ]
    child = store.load(child_id)
    assert [entry.kind for entry in child.history][: written[0]][-1] == "model_reply"
    assert child.history == state.child(child_id).history


# Save points of a run: sync stores, compaction, ask, stopped turns ------------------------------


class BreakableStore(MemoryStore):
    """A `MemoryStore` whose saves fail once `broken` is set (a full disk)."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = False

    def save(self, state: State) -> None:
        if self.broken:
            raise OSError(28, NO_SPACE)
        super().save(state)


@pytest.mark.anyio
async def test_a_sync_store_is_never_called_on_the_event_loop_thread() -> None:
    # Issue 4: "Sync stores are called from worker threads inside async runs, never blocking
    # the event loop."
    store = ThreadCheckedStore(threading.get_ident())
    entered = anyio.Event()

    @tool
    async def look() -> str:
        """Look around."""
        return "seen"

    @tool
    async def hang() -> str:
        """Wait forever."""
        entered.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    helper = Agent(
        FakeModel([tool_call("look"), "helped"]),
        tools=[look],
        name="helper",
        description="Helps.",
    )
    script: list[Any] = [
        [tool_call("look"), tool_call("helper", task="help")],
        "done",
        "The summary.",
        tool_call("hang"),
    ]
    agent = Agent(FakeModel(script), tools=[look, hang, helper], store=store)
    state = State(messages=[Message.user("Go")])
    assert await agent.arun(state) == "done"
    await agent.acompact(state)
    state.add_message(Message.user("Now wait"))
    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as group:
            group.start_soon(agent.arun, state)
            await entered.wait()
            group.cancel_scope.cancel()
    assert store.calls.count("save") >= 10  # the lead and the child (it inherits the store)
    assert store.on_loop == []
    assert store.inner.load(state.id).history == state.history


@pytest.mark.anyio
async def test_compaction_is_a_save_point() -> None:
    # DESIGN 9: "saves every State it runs at each save point: ... after compaction."
    store = MemoryStore()
    agent = Agent(FakeModel(["First answer.", "The summary."]), store=store)
    state = State(messages=[Message.user("Go")])
    await agent.arun(state)
    await agent.acompact(state)
    last = state.history[-1]
    assert isinstance(last, ContextChangeEntry)
    assert last.content.kind == "compact"
    assert store.load(state.id).history == state.history


@pytest.mark.anyio
async def test_an_ask_is_saved_like_a_model_reply() -> None:
    # DESIGN 9: "saves every State it runs at each save point: ... after each model reply";
    # an ask's reply is recorded as an `ask` entry holding the usage spent (DESIGN 5).
    store = MemoryStore()
    agent = Agent(FakeModel(["Hello.", "3"]), store=store)
    state = State(messages=[Message.user("Count the files")])
    await agent.arun(state)
    assert await agent.aask(state, "How many files?", int) == 3
    assert state.history[-1].kind == "ask"
    assert store.load(state.id).history == state.history


@pytest.mark.anyio
async def test_results_cancelled_by_a_stopping_permission_are_saved() -> None:
    # DESIGN 9: "saves every State it runs at each save point: ... after each tool result".
    store = MemoryStore()

    @tool
    async def shell() -> str:
        """Run a shell command."""
        return "ran"

    @tool(parallel=False)
    def read() -> str:
        """Read a file."""
        return "text"

    agent = Agent(
        FakeModel([[tool_call("shell"), tool_call("read")], "never"]),
        tools=[shell, read],
        store=store,
        permissions=[DenyByName(["shell"], stop=True), AllowByName(["read"])],
    )
    state = State(messages=[Message.user("Go")])
    await agent.athink(state)
    await agent.ause_tools(state)
    outcomes = [e.outcome for e in results(state)]
    assert outcomes == ["denied", "cancelled"]
    assert store.load(state.id).history == state.history


@pytest.mark.anyio
@pytest.mark.parametrize("where", ["model", "tool"])
async def test_a_save_failing_after_an_error_is_a_note_and_the_error_wins(where: str) -> None:
    # Issue 4: "at run end (also when the run ends with an exception: the original exception
    # wins, a save failure is attached as a note)".
    store = BreakableStore()
    failure = RuntimeError("the original failure")

    def failing_model(request: Request) -> Any:
        store.broken = True
        return failure

    @tool
    async def explode() -> str:
        """Fail."""
        store.broken = True
        raise failure

    script: list[Any] = [failing_model] if where == "model" else [tool_call("explode")]
    state = State(messages=[Message.user("Go")])
    with pytest.raises(RuntimeError) as caught:
        await Agent(FakeModel(script), tools=[explode], store=store).arun(state)
    assert caught.value is failure
    notes: list[str] = getattr(caught.value, "__notes__", [])
    assert notes
    assert all(NO_SPACE in note and state.id in note for note in notes)
    assert state.history[-1].kind == "error"
    assert state.pending_calls == ()


@pytest.mark.anyio
async def test_a_save_failing_after_a_cancellation_is_a_note_and_the_cancellation_wins() -> None:
    # Issue 4: "the original exception wins, a save failure is attached as a note";
    # DESIGN 3: "a cancellation is always re-raised".
    store = BreakableStore()
    entered = anyio.Event()

    @tool
    async def hang() -> str:
        """Wait forever."""
        store.broken = True
        entered.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    agent = Agent(FakeModel([tool_call("hang"), "never"]), tools=[hang], store=store)
    state = State(messages=[Message.user("Go")])
    seen: list[BaseException] = []

    async def go() -> None:
        try:
            await agent.arun(state)
        except anyio.get_cancelled_exc_class() as cancelled:
            seen.append(cancelled)
            raise

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as group:
            group.start_soon(go)
            await entered.wait()
            group.cancel_scope.cancel()
    (cancelled,) = seen
    notes: list[str] = getattr(cancelled, "__notes__", [])
    assert any(NO_SPACE in note for note in notes)
    assert state.pending_calls == ()
    assert [e.outcome for e in results(state)] == ["interrupted"]
