"""`Runs`: runs owned by a service, started, cancelled and decided by id, saved as they go."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator import (
    Agent,
    Message,
    ModelReplied,
    Reply,
    State,
    StateInfo,
    StoppedByApproval,
    TextBlock,
    TextDelta,
    ToolResultBlock,
    ToolResultEntry,
    Usage,
    tool,
)
from orchestrator.apps import Followed, Runs, TooManyRunsError
from orchestrator.models import Request, TextCallback
from orchestrator.permissions import AllowByName, ApproveLater
from orchestrator.testing import FakeModel, tool_call
from stores import MemoryStore, SQLiteStore

pytestmark = pytest.mark.anyio

SENT: list[str] = []


class Gate:
    """Where a held tool call waits: `entered` once it holds, `release` to let it go."""

    def __init__(self) -> None:
        self.entered = anyio.Event()
        self.release = anyio.Event()


GATES: dict[str, Gate] = {}


def gate(key: str) -> Gate:
    return GATES.setdefault(key, Gate())


@pytest.fixture(autouse=True)
def _clear() -> None:
    SENT.clear()
    GATES.clear()


@tool
def send(to: str) -> str:
    """Send a message."""
    SENT.append(to)
    return f"sent to {to}"


@tool
async def hold(key: str) -> str:
    """Wait until the test releases `key`."""
    held = gate(key)
    held.entered.set()
    await held.release.wait()
    return f"released {key}"


def _answer(request: Request) -> Any:
    """A reply from the last message: call the tool it names, else answer."""
    last = request.messages[-1]
    text = last.text
    if last.role == "user" and text.startswith("hold "):
        return tool_call("hold", key=text.removeprefix("hold "))
    if last.role == "user" and text.startswith("mail "):
        return [tool_call("send", to=name) for name in text.removeprefix("mail ").split()]
    results = [block for block in last.content if isinstance(block, ToolResultBlock)]
    if results:
        text = " ".join(
            part.text for block in results for part in block.content if isinstance(part, TextBlock)
        )
    return f"done: {text}"


def helper_agent(store: Any = None, name: str = "helper") -> Agent:
    return Agent(
        FakeModel([_answer] * 500),
        name=name,
        tools=[send, hold],
        permissions=[AllowByName("hold"), ApproveLater("send", reason="mail leaves the house")],
        store=store,
    )


async def _released(key: str) -> None:
    """Release the held tool `key`, once the run is holding in it."""
    await gate(key).entered.wait()
    gate(key).release.set()


async def test_a_run_outlives_the_request_that_started_it() -> None:
    store = MemoryStore()
    started: list[str] = []
    async with Runs([helper_agent()], store) as runs:
        with anyio.CancelScope() as request:
            started.append((await runs.start("helper", "hold a")).state_id)
            request.cancel()  # the client disconnects
            await anyio.sleep_forever()
        assert runs.running == tuple(started)
        await _released("a")
        info = await runs.wait(started[0])
    assert info.status == "answered"
    loaded = store.load(started[0])
    assert loaded.answer == "done: released a"
    assert loaded.history[0].kind == "user"


async def test_start_saves_the_state_before_it_returns() -> None:
    store = MemoryStore()
    async with Runs([helper_agent()], store) as runs:
        handle = await runs.start("helper", "hold b")
        assert store.load(handle.state_id).messages[0].text == "hold b"
        assert (await runs.get(handle.state_id)).status == "running"
        await _released("b")
        await handle.wait()


async def test_leaving_the_block_cancels_every_run_and_saves_it() -> None:
    store = MemoryStore()
    async with Runs([helper_agent()], store) as runs:
        first = await runs.start("helper", "hold x")
        second = await runs.start("helper", "hold y")
        await gate("x").entered.wait()
        await gate("y").entered.wait()
    for handle in (first, second):
        loaded = store.load(handle.state_id)
        (result,) = [e for e in loaded.history if isinstance(e, ToolResultEntry)]
        assert result.outcome == "interrupted"
        assert not loaded.pending_calls
    async with Runs([helper_agent()], store) as again:
        assert {info.status for info in await again.list()} == {"idle"}


async def test_cancel_stops_the_run_and_returns_once_it_is_saved() -> None:
    store = MemoryStore()
    async with Runs([helper_agent()], store) as runs:
        handle = await runs.start("helper", "hold c")
        await gate("c").entered.wait()
        info = await runs.cancel(handle.state_id)
        assert info.status == "idle"
        assert runs.running == ()
        loaded = store.load(handle.state_id)
        assert [e.outcome for e in loaded.history if isinstance(e, ToolResultEntry)] == [
            "interrupted"
        ]
        with pytest.raises(LookupError, match="is not running"):
            await runs.cancel(handle.state_id)


async def test_an_approval_continues_the_run_in_the_background() -> None:
    store = MemoryStore()
    async with Runs([helper_agent()], store) as runs:
        handle = await runs.start("helper", "mail bob")
        waiting = await handle.wait()
        assert waiting.status == "waiting"
        assert isinstance(waiting.stopped, StoppedByApproval)
        (item,) = waiting.stopped.calls
        info = await runs.approve(handle.state_id, item.call.id, by="ann", reason="fine")
        assert info.status == "running"
        done = await runs.wait(handle.state_id)
    assert done.status == "answered"
    assert SENT == ["bob"]


async def test_a_denial_reaches_the_model_and_the_run_goes_on() -> None:
    store = MemoryStore()
    async with Runs([helper_agent()], store) as runs:
        handle = await runs.start("helper", "mail eve")
        stopped = (await handle.wait()).stopped
        assert isinstance(stopped, StoppedByApproval)
        await runs.deny(handle.state_id, stopped.calls[0].call.id, reason="no")
        assert (await runs.wait(handle.state_id)).status == "answered"
    assert SENT == []
    (result,) = [e for e in store.load(handle.state_id).history if e.kind == "tool_result"]
    assert result.outcome == "denied"


async def test_the_run_continues_only_once_every_waiting_call_is_decided() -> None:
    store = MemoryStore()
    async with Runs([helper_agent()], store) as runs:
        handle = await runs.start("helper", "mail ann bob")
        stopped = (await handle.wait()).stopped
        assert isinstance(stopped, StoppedByApproval)
        first, second = (item.call.id for item in stopped.calls)
        assert (await runs.approve(handle.state_id, first)).status == "waiting"
        assert runs.running == ()
        assert SENT == []
        assert (await runs.approve(handle.state_id, second)).status == "running"
        assert (await runs.wait(handle.state_id)).status == "answered"
    assert sorted(SENT) == ["ann", "bob"]


async def test_deciding_a_running_run_or_an_unknown_call_is_refused() -> None:
    store = MemoryStore()
    async with Runs([helper_agent()], store) as runs:
        handle = await runs.start("helper", "hold d")
        with pytest.raises(ValueError, match="is running"):
            await runs.approve(handle.state_id, "call_1")
        await _released("d")
        await handle.wait()
        with pytest.raises(KeyError, match="call_1"):
            await runs.approve(handle.state_id, "call_1")
        with pytest.raises(LookupError):
            await runs.approve("no-such-run", "call_1")


async def test_a_restarted_service_continues_a_waiting_run(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    with SQLiteStore(path) as store:
        async with Runs([helper_agent()], store) as runs:
            handle = await runs.start("helper", "mail dan")
            stopped = (await handle.wait()).stopped
    assert isinstance(stopped, StoppedByApproval)
    with SQLiteStore(path) as store:  # another service, as after a restart
        async with Runs([helper_agent()], store) as runs:
            assert [info.status for info in await runs.list()] == ["waiting"]
            await runs.approve(handle.state_id, stopped.calls[0].call.id)
            assert (await runs.wait(handle.state_id)).status == "answered"
    assert SENT == ["dan"]


async def test_past_max_runs_start_says_how_to_go_on() -> None:
    store = MemoryStore()
    async with Runs([helper_agent()], store, max_runs=1) as runs:
        first = await runs.start("helper", "hold e")
        with pytest.raises(TooManyRunsError, match=r"max_runs=1.*Runs\(\.\.\., max_runs=N\)"):
            await runs.start("helper", "hold f")
        await _released("e")
        await first.wait()
        second = await runs.start("helper", "say hi")
        assert (await second.wait()).status == "answered"
    assert len(store.list()) == 2  # the refused start saved nothing


async def test_start_continues_a_stored_state_and_refuses_what_cannot_run() -> None:
    store = MemoryStore()
    async with Runs([helper_agent()], store) as runs:
        handle = await runs.start("helper", "hold g", state_id="chat-1")
        assert handle.state_id == "chat-1"
        with pytest.raises(ValueError, match="running already"):
            await runs.start("helper", "again", state_id="chat-1")
        await _released("g")
        await handle.wait()
        more = await runs.start("helper", "say more", state_id="chat-1")  # the conversation goes on
        assert (await more.wait()).turn == 3
        assert store.load("chat-1").answer == "done: say more"
        final = State(id="final", messages=[Message.user("hi")])
        final.finish("the end")
        store.save(final)
        with pytest.raises(ValueError, match="finished"):
            await runs.start("helper", "more", state_id="final")
        with pytest.raises(ValueError, match="give the input"):
            await runs.start("helper", state_id="new-one")
        with pytest.raises(KeyError, match=r"No agent named 'nobody'.*'helper'"):
            await runs.start("nobody", "hi")
        with pytest.raises(TypeError, match="input must be a str or a Message"):
            await runs.start("helper", 42)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="empty"):
            await runs.start("helper", "  ")
        resumed = await runs.start("helper", Message.user("say more"), state_id="kept")
        assert (await resumed.wait()).status == "answered"


async def test_list_shows_roots_newest_first_with_their_status() -> None:
    store = MemoryStore()
    child = helper_agent(name="child")
    parent = Agent(
        FakeModel([tool_call("child", task="say hi"), "parent done"]),
        name="parent",
        tools=[child.as_tool(description="Asks the child")],
    )
    async with Runs([helper_agent(), parent], store) as runs:
        done = await runs.start("parent", "go")
        await done.wait()
        held = await runs.start("helper", "hold h")
        listed = await runs.list()
        assert [(info.state_id, info.status) for info in listed] == [
            (held.state_id, "running"),
            (done.state_id, "answered"),
        ]
        assert [info.state_id for info in await runs.list(limit=1)] == [held.state_id]
        await _released("h")
        await held.wait()
    assert len(store.list()) == 3  # the child is stored, and is not a run of its own


async def test_fifty_runs_at_once_all_finish() -> None:
    store = MemoryStore()
    async with Runs([helper_agent()], store) as runs:
        handles = [await runs.start("helper", f"say {n}") for n in range(50)]
        infos = [await handle.wait() for handle in handles]
    assert {info.status for info in infos} == {"answered"}
    assert sorted(store.load(h.state_id).answer for h in handles) == sorted(
        f"done: say {n}" for n in range(50)
    )


async def test_outside_the_block_the_service_says_how_to_open_it() -> None:
    runs = Runs([helper_agent()], MemoryStore())
    with pytest.raises(RuntimeError, match="async with Runs"):
        await runs.start("helper", "hi")
    async with runs:
        with pytest.raises(RuntimeError, match="open already"):
            await runs.__aenter__()


def test_agents_need_names_and_the_service_store() -> None:
    store = MemoryStore()
    with pytest.raises(ValueError, match="needs a name"):
        Runs([Agent(FakeModel([]))], store)
    with pytest.raises(ValueError, match="Two agents are named 'helper'"):
        Runs([helper_agent(), helper_agent()], store)
    with pytest.raises(ValueError, match="another store"):
        Runs([helper_agent(store=MemoryStore())], store)
    with pytest.raises(ValueError, match="max_runs"):
        Runs([helper_agent()], store, max_runs=0)
    with pytest.raises(ValueError, match="at least one agent"):
        Runs([], store)
    assert list(Runs({"a": helper_agent(store=store)}, store).agents) == ["a"]


async def test_a_run_that_fails_is_idle_and_its_error_is_in_its_history() -> None:
    store = MemoryStore()
    agent = Agent(FakeModel([RuntimeError("the provider broke")]), name="broken")
    async with Runs([agent], store) as runs:
        handle = await runs.start("broken", "hi")
        info = await handle.wait()
    assert info.status == "idle"
    loaded = store.load(handle.state_id)
    assert [e.content for e in loaded.history if e.kind == "error"] == [
        "RuntimeError: the provider broke"
    ]


async def test_a_state_given_to_the_store_first_runs_under_its_id() -> None:
    store = MemoryStore()
    store.save(State(id="seeded", messages=[Message.user("say seeded")]))
    async with Runs([helper_agent()], store) as runs:
        handle = await runs.start("helper", state_id="seeded")
        assert (await handle.wait()).status == "answered"
    assert store.load("seeded").answer == "done: say seeded"


class StreamingModel:
    """A model that streams its reply in two chunks and waits between them for the test."""

    def __init__(self) -> None:
        self.between = Gate()

    @property
    def name(self) -> str:
        return "streaming"

    @property
    def context_window(self) -> int | None:
        return None

    async def respond(self, request: Request, *, on_text: TextCallback | None = None) -> Reply:
        assert on_text is not None
        on_text("Hello, ")
        self.between.entered.set()
        await self.between.release.wait()
        on_text("world.")
        return Reply(message=Message.assistant("Hello, world."), usage=Usage(requests=1))


class StatesOnly:
    """A store that keeps States and nothing more: no tree feed, no run leases."""

    def __init__(self) -> None:
        self.inner = MemoryStore()

    def save(self, state: State) -> None:
        self.inner.save(state)

    def load(self, state_id: str) -> State:
        return self.inner.load(state_id)

    def list(self, *, parent_id: str | None = None, limit: int | None = None) -> list[StateInfo]:
        return self.inner.list(parent_id=parent_id, limit=limit)

    def delete(self, state_id: str) -> None:
        self.inner.delete(state_id)


async def _all(runs: Runs, state_id: str, after: str | None = None) -> list[Followed]:
    return [item async for item in runs.follow(state_id, after=after)]


def tree_agent() -> Agent:
    child = Agent(FakeModel([_answer] * 50), name="child", tools=[send])
    return Agent(
        FakeModel([tool_call("child", task="say hi"), "parent done"]),
        name="parent",
        tools=[child.as_tool(description="Asks the child")],
    )


async def test_follow_gives_the_whole_tree_in_order_and_ends_with_the_run() -> None:
    store = MemoryStore()
    async with Runs([tree_agent()], store) as runs:
        handle = await runs.start("parent", "go")
        followed = await _all(runs, handle.state_id)
    kinds = [(item.event.kind, item.event.state_id == handle.state_id) for item in followed]
    assert kinds[0] == ("run_start", True)
    assert kinds[-1] == ("run_end", True)
    assert ("child_start", False) in kinds
    assert ("run_end", False) in kinds
    child_events = [item.event for item in followed if item.event.state_id != handle.state_id]
    assert {event.parent_id for event in child_events} == {handle.state_id}
    assert len({item.id for item in followed}) == len(followed)


async def test_follow_after_any_event_gives_exactly_the_rest() -> None:
    store = MemoryStore()
    async with Runs([tree_agent()], store) as runs:
        handle = await runs.start("parent", "go")
        await handle.wait()
        every = await _all(runs, handle.state_id)
        for at, item in enumerate(every):
            rest = await _all(runs, handle.state_id, after=item.id)
            assert [followed.id for followed in rest] == [
                followed.id for followed in every[at + 1 :]
            ]
            assert [followed.event for followed in rest] == [f.event for f in every[at + 1 :]]


async def test_a_follower_sees_text_while_it_streams_and_reconnects_exactly() -> None:
    store = MemoryStore()
    model = StreamingModel()
    agent = Agent(model, name="talker")
    async with Runs([agent], store) as runs:
        handle = await runs.start("talker", "hi")
        await model.between.entered.wait()
        seen: list[Followed] = []
        async for item in runs.follow(handle.state_id):
            seen.append(item)
            if item.event.kind == "text":
                break  # the client drops while the reply streams
        assert [item.event.kind for item in seen] == ["run_start", "text"]
        first_text = seen[-1]
        assert isinstance(first_text.event, TextDelta)
        assert first_text.event.text == "Hello, "
        model.between.release.set()
        rest = await _all(runs, handle.state_id, after=first_text.id)
    kinds = [item.event.kind for item in rest]
    # The second chunk, unless the reply was recorded first: its whole text is in model_reply.
    assert kinds[0] in ("text", "model_reply")
    texts = [item.event.text for item in rest if isinstance(item.event, TextDelta)]
    assert texts in ([], ["world."])  # never "Hello, " again
    (reply,) = [item.event for item in rest if item.event.kind == "model_reply"]
    assert isinstance(reply, ModelReplied)
    assert reply.text == "Hello, world."
    assert kinds[-2:] == ["model_reply", "run_end"]
    assert "run_start" not in kinds


async def test_a_follower_of_a_finished_run_gets_no_text_deltas_only_the_reply() -> None:
    store = MemoryStore()
    async with Runs([helper_agent()], store) as runs:
        handle = await runs.start("helper", "say x")
        await handle.wait()
        kinds = [item.event.kind for item in await _all(runs, handle.state_id)]
    assert kinds == ["run_start", "model_reply", "run_end"]


async def test_another_service_on_the_store_follows_a_run_until_its_end_is_stored(
    tmp_path: Path,
) -> None:
    path = tmp_path / "shared.db"
    with SQLiteStore(path) as store_a, SQLiteStore(path) as store_b:
        async with (
            Runs([helper_agent()], store_a) as owner,
            Runs([helper_agent()], store_b) as other,
        ):
            handle = await owner.start("helper", "hold z")
            await gate("z").entered.wait()
            seen: list[str] = []

            async def follow_elsewhere() -> None:
                async for item in other.follow(handle.state_id):
                    seen.append(item.event.kind)

            async with anyio.create_task_group() as group:
                group.start_soon(follow_elsewhere)
                gate("z").release.set()
    assert seen == ["run_start", "model_reply", "tool_end", "model_reply", "run_end"]


async def test_follow_refuses_bad_ids_subagents_and_stores_that_cannot_follow(
    tmp_path: Path,
) -> None:
    store = MemoryStore()
    async with Runs([tree_agent()], store) as runs:
        handle = await runs.start("parent", "go")
        every = await _all(runs, handle.state_id)
        child_id = next(i.event.state_id for i in every if i.event.state_id != handle.state_id)
        with pytest.raises(ValueError, match="follow run"):
            await _all(runs, child_id)
        with pytest.raises(ValueError, match="not an event id"):
            await _all(runs, handle.state_id, after="nonsense")
        with pytest.raises(ValueError, match="cursor"):
            await _all(runs, handle.state_id, after="sqlite:1/0")
        with pytest.raises(LookupError):
            await _all(runs, "no-such-run")
    async with Runs([helper_agent()], StatesOnly()) as runs:
        with pytest.raises(TypeError, match="cannot follow a tree"):
            await _all(runs, "anything")


async def test_a_handle_follows_its_own_run_and_since_skips_what_came_before() -> None:
    store = MemoryStore()
    async with Runs([tree_agent(), helper_agent()], store) as runs:
        first = await runs.start("helper", "say one", state_id="talk")
        await first.wait()
        second = await runs.start("helper", "say two", state_id="talk")
        # Live text may come too while the reply streams (a follower woken at once sees it).
        followed = [item async for item in second.follow() if item.event.kind != "text"]
        assert [item.event.kind for item in followed] == ["run_start", "model_reply", "run_end"]
        reply = followed[1].event
        assert isinstance(reply, ModelReplied)
        assert reply.text == "done: say two"
        everything = await _all(runs, "talk")
        assert len(everything) == 6
        assert [item.id for item in everything[3:]] == [item.id for item in followed]


async def test_since_a_decision_gives_the_run_that_carries_it_out() -> None:
    store = MemoryStore()
    async with Runs([helper_agent()], store) as runs:
        handle = await runs.start("helper", "mail kim")
        waiting = await handle.wait()
        stopped = waiting.stopped
        assert isinstance(stopped, StoppedByApproval)
        following = runs.follow(handle.state_id, since=waiting.entries)
        await following.ready()
        await runs.approve(handle.state_id, stopped.calls[0].call.id)
        kinds = [item.event.kind async for item in following]
    assert kinds == ["run_start", "tool_end", "model_reply", "run_end"]
    with pytest.raises(ValueError, match="since must be"):
        runs.follow(handle.state_id, since=-1)


async def test_two_hundred_followers_of_one_run_see_the_same_stored_events(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "followed.db") as store:
        async with Runs([tree_agent(), helper_agent()], store) as runs:
            handle = await runs.start("parent", "go")
            seen: list[list[str]] = [[] for _ in range(200)]

            async def follow(into: list[str]) -> None:
                async for item in runs.follow(handle.state_id):
                    if item.event.kind != "text":  # live text is not stored: followers differ
                        into.append(item.id)

            with anyio.fail_after(120):
                async with anyio.create_task_group() as group:
                    for into in seen:
                        group.start_soon(follow, into)
            stored = [item.id for item in await _all(runs, handle.state_id)]
    assert all(ids == stored for ids in seen)
    assert len(stored) >= 8


async def test_reconnecting_at_random_points_while_the_tree_runs_loses_and_repeats_nothing() -> (
    None
):
    store = MemoryStore()
    children = [
        Agent(
            FakeModel([tool_call("hold", key=f"kid{n}"), f"kid {n} done"]),
            name=f"kid{n}",
            tools=[hold],
            permissions=[AllowByName("hold")],
        )
        for n in range(3)
    ]
    parent = Agent(
        FakeModel([[tool_call(f"kid{n}", task="go") for n in range(3)], "all done"]),
        name="boss",
        tools=[kid.as_tool(description=f"Kid {n}") for n, kid in enumerate(children)],
    )
    chooser = random.Random(7)
    async with Runs([parent], store) as runs:
        handle = await runs.start("boss", "go")
        seen: list[Followed] = []
        last: str | None = None
        released = 0
        with anyio.fail_after(60):
            for _ in range(200):  # bounded: each round reads a few events, then drops
                wanted = chooser.randint(1, 3)
                got = 0
                ended = False
                async for item in runs.follow(handle.state_id, after=last):
                    seen.append(item)
                    last = item.id
                    got += 1
                    if got == wanted:
                        break
                else:
                    ended = True
                if ended:
                    break
                if released < 3 and chooser.random() < 0.5:
                    await gate(f"kid{released}").entered.wait()
                    gate(f"kid{released}").release.set()
                    released += 1
        stored = [item.id for item in await _all(runs, handle.state_id)]
    durable = [item.id for item in seen if item.event.kind != "text"]
    assert durable == stored
    assert len(set(item.id for item in seen)) == len(seen)  # nothing twice
