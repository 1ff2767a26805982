"""A remote A2A agent called as a subagent tool, against an A2A server on 127.0.0.1.

The server is our own `a2a_routes` on the SDK's JSON-RPC routes, run by uvicorn (asyncio: uvicorn
has no trio loop).
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from a2a.server.context import ServerCallContext
from a2a.server.tasks.inmemory_task_store import InMemoryTaskStore
from a2a.types.a2a_pb2 import TaskState

from orchestrator import Agent, Message, Reply, State, Usage, tool
from orchestrator.a2a import TASK_KEY, A2ACallError, A2AModel, a2a_agent, a2a_routes
from orchestrator.apps import Runs, asgi_app
from orchestrator.testing import FakeModel, tool_call
from stores import FileStore, MemoryStore
from tests.a2a.calls import recorded_task
from tests.a2a.sdk_server import EchoExecutor, sdk_app
from tests.apps.serving import serving

pytestmark = pytest.mark.anyio
ON_ASYNCIO = pytest.mark.parametrize("anyio_backend", ["asyncio"])

ROOT = Path(__file__).resolve().parents[2]
ENTERED: dict[str, anyio.Event] = {}


@pytest.fixture(autouse=True)
def _clear() -> None:
    ENTERED.clear()


def entered(key: str) -> anyio.Event:
    return ENTERED.setdefault(key, anyio.Event())


@tool
async def hold(key: str) -> str:
    """Wait until cancelled."""
    entered(key).set()
    await anyio.sleep_forever()
    return key


@asynccontextmanager
async def served(agent: Agent, store: MemoryStore) -> AsyncGenerator[tuple[Runs, str]]:
    """A Runs service of `agent` served over A2A on 127.0.0.1; the service and its base URL."""
    async with (
        Runs([agent], store) as runs,
        serving(asgi_app(runs, routes=a2a_routes(runs))) as base,
    ):
        yield runs, base


def remote_greeter(model: FakeModel) -> Agent:
    return Agent(model, name="greeter", description="Greets.")


def lead(tool_name: str, url: str, *after: Any) -> Agent:
    remote = a2a_agent(url, name=tool_name, description="A remote agent.")
    return Agent(
        FakeModel([tool_call(tool_name, task="say hello"), *(after or ["all done"])]),
        tools=[remote.as_tool()],
    )


@ON_ASYNCIO
async def test_a_remote_agent_is_a_subagent_whose_child_records_the_task() -> None:
    reply = Reply(
        Message.assistant("hello there"), Usage(input_tokens=5, output_tokens=7, requests=1)
    )
    remote_model = FakeModel([reply])
    remote_store = MemoryStore()
    store = MemoryStore()
    async with served(remote_greeter(remote_model), remote_store) as (_runs, base):
        agent = lead("greeter", f"{base}/a2a/greeter").copy(store=store)
        state = State(messages=[Message.user("go")])
        await agent.arun(state)
    assert state.answer == "all done"
    result = next(e for e in state.history if e.kind == "tool_result")
    assert result.content.text == "hello there"  # type: ignore[union-attr]
    (child_id,) = result.child_ids  # type: ignore[union-attr]
    child = store.load(child_id)
    assert child.parent_id == state.id
    recorded = child.get(TASK_KEY)
    assert recorded["status"] == "completed"
    assert recorded["url"] == f"{base}/a2a/greeter"
    assert [m["text"] for m in recorded["messages"]] == ["say hello", "hello there"]
    assert recorded["artifacts"][0]["id"] == "answer"
    remote_task = remote_store.load(recorded["task_id"])
    assert remote_task.answer == "hello there"
    assert (child.usage.input_tokens, child.usage.output_tokens) == (5, 7)
    assert state.usage.input_tokens >= 5
    assert len(remote_model.requests) == 1


@ON_ASYNCIO
async def test_a_failed_remote_task_is_an_error_result_for_the_model() -> None:
    remote_model = FakeModel([RuntimeError("remote model down")])
    async with served(remote_greeter(remote_model), MemoryStore()) as (_runs, base):
        state = State(messages=[Message.user("go")])
        await lead("greeter", f"{base}/a2a/greeter").arun(state)
    result = next(e for e in state.history if e.kind == "tool_result")
    assert result.content.is_error  # type: ignore[union-attr]
    assert "remote model down" in result.content.text  # type: ignore[union-attr]


@ON_ASYNCIO
async def test_cancelling_the_parent_cancels_the_remote_task() -> None:
    holder = Agent(FakeModel([tool_call("hold", key="r")]), name="holder", tools=[hold])
    remote_store = MemoryStore()
    store = MemoryStore()
    async with served(holder, remote_store) as (runs, base):
        agent = lead("holder", f"{base}/a2a/holder").copy(store=store)
        state = State(messages=[Message.user("go")])
        async with anyio.create_task_group() as group:
            group.start_soon(agent.arun, state)
            with anyio.fail_after(10):
                await entered("r").wait()
                await recorded_task(store)
            group.cancel_scope.cancel()
        (remote_id,) = [info.id for info in remote_store.list()]
        with anyio.fail_after(10):
            info = await runs.wait(remote_id)
    assert info.status == "idle"  # cancelled: its last run ended on the cancel
    assert remote_store.load(remote_id).history[-1].content.startswith("Cancelled")  # type: ignore[union-attr]
    child_id = next(iter(store.load(state.id).children))
    assert store.load(child_id).get(TASK_KEY)["task_id"] == remote_id


@ON_ASYNCIO
async def test_a_resume_re_attaches_to_the_remote_task_and_never_sends_again() -> None:
    remote_model = FakeModel(["hello there"])
    async with served(remote_greeter(remote_model), MemoryStore()) as (_runs, base):
        url = f"{base}/a2a/greeter"
        first = State(messages=[Message.user("hi")])
        await Agent(A2AModel(url), name="greeter").arun(first)
        task_id = first.get(TASK_KEY)["task_id"]
        # A State that recorded the send (its task id came back), as a crash leaves it.
        again = State(messages=[Message.user("hi")])
        again.set(TASK_KEY, {"url": url, "message_id": "x", "for": 1, "task_id": task_id})
        await Agent(A2AModel(url), name="greeter").arun(again)
        # One that recorded the send, not the task id: the message is never sent again.
        lost = State(messages=[Message.user("hi")])
        lost.set(TASK_KEY, {"url": url, "message_id": "y", "for": 1, "task_id": None})
        with pytest.raises(A2ACallError, match="not sent again"):
            await Agent(A2AModel(url), name="greeter").arun(lost)
    assert again.answer == "hello there"
    assert again.get(TASK_KEY)["task_id"] == task_id
    assert len(remote_model.requests) == 1  # the remote agent ran once


def test_a_bad_url_says_what_to_give() -> None:
    with pytest.raises(ValueError, match="http"):
        A2AModel("ftp://x")


# -- against the SDK's own server --------------------------------------------------------------


@ON_ASYNCIO
async def test_the_sdks_own_server_answers_a_subagent_call() -> None:
    executor, tasks = EchoExecutor(), InMemoryTaskStore()
    store = MemoryStore()
    async with serving(sdk_app(executor, tasks)) as base:
        agent = lead("echo", base).copy(store=store)
        state = State(messages=[Message.user("go")])
        await agent.arun(state)
    result = next(e for e in state.history if e.kind == "tool_result")
    assert result.content.text == "echo: say hello"  # type: ignore[union-attr]
    (child_id,) = result.child_ids  # type: ignore[union-attr]
    recorded = store.load(child_id).get(TASK_KEY)
    assert recorded["status"] == "completed"
    assert recorded["artifacts"][0]["name"] == "echo"
    assert recorded["messages"][0] == {"role": "user", "text": "say hello"}
    assert executor.executed == ["say hello"]
    assert store.load(child_id).usage.requests == 1  # the SDK server reports no usage


@ON_ASYNCIO
async def test_cancelling_a_call_cancels_the_task_on_the_sdks_server() -> None:
    executor, tasks = EchoExecutor(), InMemoryTaskStore()
    store = MemoryStore()
    async with serving(sdk_app(executor, tasks)) as base:
        agent = Agent(
            FakeModel([tool_call("echo", task="hold on")]),
            tools=[a2a_agent(base, name="echo", description="Echoes.").as_tool()],
            store=store,
        )
        state = State(messages=[Message.user("go")])
        async with anyio.create_task_group() as group:
            group.start_soon(agent.arun, state)
            with anyio.fail_after(10):
                await executor.holding.wait()
                await recorded_task(store)  # the call knows the remote task: it can cancel it
            group.cancel_scope.cancel()
    task_id = await recorded_task(store)
    assert executor.cancelled == [task_id]
    stored = await tasks.get(task_id, ServerCallContext())
    assert stored is not None
    assert stored.status.state == TaskState.TASK_STATE_CANCELED


def slow_echo_lead(base: str, store: MemoryStore) -> tuple[Agent, State]:
    """A lead whose one call asks the SDK server's echo agent for a ``slow`` task; its State."""
    agent = Agent(
        FakeModel([tool_call("echo", task="slow")]),
        tools=[a2a_agent(base, name="echo", description="Echoes.").as_tool()],
        store=store,
    )
    return agent, State(messages=[Message.user("go")])


@ON_ASYNCIO
async def test_a_call_cancelled_before_the_task_id_came_back_still_cancels_the_task() -> None:
    executor, tasks = EchoExecutor(), InMemoryTaskStore()
    store = MemoryStore()
    async with serving(sdk_app(executor, tasks)) as base:
        agent, state = slow_echo_lead(base, store)
        call = anyio.CancelScope()

        async def run() -> None:
            with call:
                await agent.arun(state)

        async with anyio.create_task_group() as group:
            group.start_soon(run)
            with anyio.fail_after(10):
                await executor.slow.wait()  # sent; the task's first event not yet
            call.cancel()
            for _ in range(10):  # the cancel reaches the call before the first event
                await anyio.lowlevel.checkpoint()
            executor.release.set()
    (child,) = [info for info in store.list() if info.parent_id is not None]
    recorded = store.load(child.id).get(TASK_KEY)
    assert recorded["task_id"]
    assert recorded["cancel"] == "cancelled"
    assert executor.cancelled == [recorded["task_id"]]
    stored = await tasks.get(recorded["task_id"], ServerCallContext())
    assert stored is not None
    assert stored.status.state == TaskState.TASK_STATE_CANCELED


@ON_ASYNCIO
async def test_a_call_cancelled_whose_task_id_never_comes_back_ends_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The call reads on for the task's id for a grace period (5 s), then gives up: it ends
    # cancelled, and its child records that the remote task could not be cancelled.
    monkeypatch.setattr("orchestrator.a2a._calling._CANCEL_GRACE", 0.2)
    executor, tasks = EchoExecutor(), InMemoryTaskStore()
    store = MemoryStore()
    async with serving(sdk_app(executor, tasks)) as base:
        agent, state = slow_echo_lead(base, store)
        call = anyio.CancelScope()
        ended = anyio.Event()

        async def run() -> None:
            with call:
                await agent.arun(state)
            ended.set()

        async with anyio.create_task_group() as group:
            group.start_soon(run)
            with anyio.fail_after(10):
                await executor.slow.wait()  # sent; the task's first event never comes
            call.cancel()
            with anyio.fail_after(10):
                await ended.wait()  # the call ended with no first event
            executor.release.set()  # only now: the server's task is let go
    (child,) = [info for info in store.list() if info.parent_id is not None]
    recorded = store.load(child.id).get(TASK_KEY)
    assert recorded["task_id"] is None
    assert recorded["cancel"] == "no task id came back within 0.2 s: not cancelled"
    assert executor.cancelled == []
    assert call.cancelled_caught


@ON_ASYNCIO
async def test_a_resume_re_attaches_to_a_task_of_the_sdks_server() -> None:
    executor, tasks = EchoExecutor(), InMemoryTaskStore()
    async with serving(sdk_app(executor, tasks)) as base:
        first = State(messages=[Message.user("hi")])
        await Agent(A2AModel(base), name="echo").arun(first)
        task_id = first.get(TASK_KEY)["task_id"]
        again = State(messages=[Message.user("hi")])
        again.set(TASK_KEY, {"url": base, "message_id": "x", "for": 1, "task_id": task_id})
        await Agent(A2AModel(base), name="echo").arun(again)
    assert again.answer == "echo: hi"
    assert executor.executed == ["hi"]


# -- a real crash: the calling process dies mid-call --------------------------------------------

CRASHING_LEAD = """
import os, sys
import anyio
from orchestrator import Agent, Message, State
from orchestrator.a2a import TASK_KEY, a2a_agent
from orchestrator.testing import FakeModel, tool_call
from stores import FileStore

store = FileStore(sys.argv[1])
remote = a2a_agent(sys.argv[2], name="holder", description="Holds.").as_tool()
agent = Agent(FakeModel([tool_call("holder", task="hold on")]), tools=[remote], store=store)


async def main() -> None:
    state = State(id="lead", messages=[Message.user("go")])
    async with anyio.create_task_group() as group:
        group.start_soon(agent.arun, state)
        for _ in range(1000):
            await anyio.sleep(0.01)
            for info in store.list():
                if info.parent_id and (store.load(info.id).get(TASK_KEY) or {}).get("task_id"):
                    os._exit(1)  # the remote task is known and saved: die, cleaning nothing up


anyio.run(main)
"""


@ON_ASYNCIO
async def test_a_crash_mid_call_leaves_it_unknown_and_the_resume_re_attaches(
    tmp_path: Path,
) -> None:
    release = anyio.Event()

    @tool
    async def wait_here(key: str) -> str:
        """Wait until the test releases it."""
        entered(key).set()
        await release.wait()
        return "released"

    remote_model = FakeModel([tool_call("wait_here", key="r"), "held and done"])
    holder = Agent(remote_model, name="holder", tools=[wait_here])
    store = FileStore(tmp_path / "runs")
    async with served(holder, MemoryStore()) as (runs, base):
        url = f"{base}/a2a/holder"
        done = await anyio.run_process(
            [sys.executable, "-c", CRASHING_LEAD, str(tmp_path / "runs"), url],
            cwd=ROOT,
            check=False,
        )
        assert done.returncode == 1, done.stderr.decode()
        assert entered("r").is_set()
        crashed = store.load("lead")
        result = next(e for e in crashed.history if e.kind == "tool_result")
        assert result.outcome == "unknown"  # type: ignore[union-attr]
        (child_id,) = result.child_ids  # type: ignore[union-attr]
        release.set()  # the remote task goes on without its caller
        again = Agent(
            FakeModel(["Done after the resume."]),
            tools=[a2a_agent(url, name="holder", description="Holds.").as_tool()],
            store=store,
        )
        await again.arun(crashed)
        assert runs.running == ()
    assert crashed.answer == "Done after the resume."
    late = [e for e in crashed.history if e.kind == "tool_result" and e.late]  # type: ignore[union-attr]
    assert [e.content.text for e in late] == ["held and done"]  # type: ignore[union-attr]
    child = store.load(child_id)
    assert child.get(TASK_KEY)["status"] == "completed"
    assert len(remote_model.requests) == 2  # one remote run: its tool call, then its answer
    assert [r.messages[0].text for r in remote_model.requests] == ["hold on", "hold on"]


async def test_a_call_through_a_transport_runs_on_asyncio_and_trio() -> None:
    remote_model = FakeModel(["hello there"])
    async with Runs([remote_greeter(remote_model)], MemoryStore()) as runs:
        app = asgi_app(runs, routes=a2a_routes(runs), viewer=False)
        remote = a2a_agent(
            "http://127.0.0.1/a2a/greeter",
            name="greeter",
            description="Greets.",
            transport=httpx.ASGITransport(app),
            headers={"X-Caller": "lead"},
        )
        agent = Agent(
            FakeModel([tool_call("greeter", task="say hello"), "all done"]),
            tools=[remote.as_tool()],
        )
        state = State(messages=[Message.user("go")])
        await agent.arun(state)
    assert state.answer == "all done"
    (child_id,) = state.children
    assert state.child(child_id).answer == "hello there"
    assert [r.messages[0].text for r in remote_model.requests] == ["say hello"]


@ON_ASYNCIO
async def test_an_answer_without_a_task_is_the_messages_text() -> None:
    executor, tasks = EchoExecutor(), InMemoryTaskStore()
    async with serving(sdk_app(executor, tasks)) as base:
        state = State(messages=[Message.user("message me")])
        await Agent(A2AModel(base), name="echo").arun(state)
    assert state.answer == "echo: message me"
    assert state.get(TASK_KEY)["status"] == "completed"


async def test_a_structured_remote_answer_comes_back_as_json() -> None:
    @tool
    def found(city: str, state: State) -> str:
        """Give the city found."""
        state.finish({"city": city})
        return "found"

    finder = Agent(
        FakeModel([tool_call("found", city="Oslo")]), name="finder", description="Finds cities."
    )
    finder = finder.copy(tools=[found])
    async with Runs([finder], MemoryStore()) as runs:
        app = asgi_app(runs, routes=a2a_routes(runs), viewer=False)
        model = A2AModel("http://127.0.0.1/a2a/finder", transport=httpx.ASGITransport(app))
        state = State(messages=[Message.user("where?")])
        await Agent(model, name="finder").arun(state)
    assert json.loads(state.answer) == [{"data": {"city": "Oslo"}}]


@ON_ASYNCIO
async def test_a_resume_re_attaches_to_a_task_still_working() -> None:
    release = anyio.Event()

    @tool
    async def wait_here() -> str:
        """Wait until the test releases it."""
        await release.wait()
        return "released"

    remote_model = FakeModel([tool_call("wait_here"), "worked it out"])
    holder = Agent(remote_model, name="holder", tools=[wait_here])
    async with served(holder, MemoryStore()) as (runs, base):
        url = f"{base}/a2a/holder"
        handle = await runs.start("holder", "work")  # as if our process had sent it, then died
        cut_off = State(messages=[Message.user("work")])
        cut_off.set(TASK_KEY, {"url": url, "message_id": "x", "for": 1, "task_id": handle.state_id})
        async with anyio.create_task_group() as group:
            group.start_soon(Agent(A2AModel(url), name="holder").arun, cut_off)
            await anyio.sleep(0.2)  # mostly re-attached by now: it subscribes to the task
            release.set()
    assert cut_off.answer == "worked it out"
    assert len(remote_model.requests) == 2


@ON_ASYNCIO
async def test_a_task_the_server_does_not_know_cannot_be_re_attached_to() -> None:
    async with served(remote_greeter(FakeModel([])), MemoryStore()) as (_runs, base):
        url = f"{base}/a2a/greeter"
        lost = State(messages=[Message.user("hi")])
        lost.set(TASK_KEY, {"url": url, "message_id": "x", "for": 1, "task_id": "gone"})
        with pytest.raises(A2ACallError, match="cannot be re-attached"):
            await Agent(A2AModel(url), name="greeter").arun(lost)


async def test_a_call_to_a_server_sharing_the_callers_store() -> None:
    store = MemoryStore()
    async with Runs([remote_greeter(FakeModel(["hello there"]))], store) as runs:
        app = asgi_app(runs, routes=a2a_routes(runs), viewer=False)
        remote = a2a_agent(
            "http://127.0.0.1/a2a/greeter",
            name="greeter",
            description="Greets.",
            transport=httpx.ASGITransport(app),
        )
        agent = Agent(
            FakeModel([tool_call("greeter", task="say hello"), "all done"]),
            tools=[remote.as_tool()],
            store=store,
        )
        state = State(messages=[Message.user("go")])
        await agent.arun(state)
    (child_id,) = state.children
    task_id = store.load(child_id).get(TASK_KEY)["task_id"]
    assert task_id != child_id  # the remote run is a State of its own in the shared store
    assert store.load(task_id).answer == "hello there"
    assert state.answer == "all done"
