"""An agent served over A2A 1.0, called by the official SDK's own client.

Most tests reach the app in process (httpx's ASGI transport), on asyncio and trio; the ones
marked `over_http` run uvicorn on 127.0.0.1 (asyncio: uvicorn has no trio loop) so the client
streams over a real socket.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from a2a.client import A2ACardResolver, Client, ClientConfig, create_client
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import A2AError
from google.protobuf.json_format import MessageToDict

from orchestrator import Agent, Limits, State, tool
from orchestrator import Message as ChatMessage
from orchestrator.a2a import a2a_routes, agent_card
from orchestrator.apps import Runs, asgi_app
from orchestrator.permissions import ApproveLater
from orchestrator.testing import FakeModel, tool_call
from stores import MemoryStore
from tests.apps.serving import serving

pytestmark = pytest.mark.anyio

SENT: list[str] = []
RELEASE: dict[str, anyio.Event] = {}
ENTERED: dict[str, anyio.Event] = {}


def event(events: dict[str, anyio.Event], key: str) -> anyio.Event:
    return events.setdefault(key, anyio.Event())


@pytest.fixture(autouse=True)
def _clear() -> None:
    SENT.clear()
    RELEASE.clear()
    ENTERED.clear()


@tool
def send(to: str) -> str:
    """Send a mail."""
    SENT.append(to)
    return f"sent to {to}"


@tool
async def hold(key: str) -> str:
    """Wait until the test releases `key`."""
    event(ENTERED, key).set()
    await event(RELEASE, key).wait()
    return f"released {key}"


@tool
def found(city: str, state: State) -> str:
    """Give the city found."""
    state.finish({"city": city})
    return "found"


def mailer(replies: list[Any] | None = None) -> Agent:
    return Agent(
        FakeModel(replies or [tool_call("send", to="bob"), "mailed bob"]),
        name="mailer",
        description="Sends mail for you.",
        tools=[send],
        permissions=[ApproveLater("send", reason="mail leaves the house")],
    )


def greeter(*answers: Any) -> Agent:
    return Agent(FakeModel(list(answers) or ["hello there"]), name="greeter", description="Greets.")


def holder() -> Agent:
    return Agent(FakeModel([tool_call("hold", key="k"), "held"]), name="holder", tools=[hold])


def user(text: str = "", *, task_id: str = "", context_id: str = "", data: Any = None) -> Message:
    parts = [Part(text=text)] if text else []
    if data is not None:
        from a2a.helpers.proto_helpers import new_data_part

        parts.append(new_data_part(data))
    return Message(
        role=Role.ROLE_USER,
        message_id=f"m-{text}-{task_id}",
        task_id=task_id,
        context_id=context_id,
        parts=parts,
    )


@asynccontextmanager
async def a2a_client(
    runs: Runs, agent: str, *, streaming: bool = True, base: str | None = None
) -> AsyncGenerator[Client]:
    """The SDK's client for `agent`, in process unless `base` names a server."""
    if base is None:
        app = asgi_app(runs, routes=a2a_routes(runs), viewer=False)
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://127.0.0.1")
        base = "http://127.0.0.1"
    else:
        http = httpx.AsyncClient()
    async with http:
        client = await create_client(
            f"{base}/a2a/{agent}", ClientConfig(httpx_client=http, streaming=streaming)
        )
        async with client:
            yield client


async def collect(client: Client, message: Message, **config: Any) -> list[StreamResponse]:
    request = SendMessageRequest(message=message, configuration=SendMessageConfiguration(**config))
    return [event async for event in client.send_message(request)]


def kinds(events: list[StreamResponse]) -> list[str]:
    found: list[str] = []
    for event in events:
        kind = event.WhichOneof("payload")
        if kind == "status_update":
            found.append(
                TaskState.Name(event.status_update.status.state).removeprefix("TASK_STATE_")
            )
        else:
            found.append(str(kind))
    return found


def final_task(events: list[StreamResponse]) -> Task:
    (event,) = events
    assert event.WhichOneof("payload") == "task"
    return event.task


async def test_the_card_names_the_agent_its_tools_and_the_url_it_answers_at() -> None:
    async with Runs([mailer()], MemoryStore()) as runs:
        app = asgi_app(runs, routes=a2a_routes(runs), viewer=False)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app)) as http:
            resolver = A2ACardResolver(http, "http://127.0.0.1/a2a/mailer")
            card = await resolver.get_agent_card()
    assert card.name == "mailer"
    assert card.description == "Sends mail for you."
    assert card.capabilities.streaming
    assert [skill.id for skill in card.skills] == ["mailer", "send"]
    assert card.skills[1].description == "Send a mail."
    (interface,) = card.supported_interfaces
    assert interface.url == "http://127.0.0.1/a2a/mailer/"
    assert interface.protocol_binding == "JSONRPC"
    assert interface.protocol_version == "1.0"


def test_an_agent_without_a_name_has_no_card() -> None:
    with pytest.raises(ValueError, match="needs a name"):
        agent_card(Agent(FakeModel([])), "http://127.0.0.1/")


async def test_a_handler_for_an_unknown_agent_says_which_there_are() -> None:
    async with Runs([greeter()], MemoryStore()) as runs:
        with pytest.raises(KeyError, match="'greeter'"):
            a2a_routes(runs, ["nobody"])


async def test_a_message_runs_the_agent_and_the_task_completes_with_its_answer() -> None:
    store = MemoryStore()
    async with Runs([greeter()], store) as runs, a2a_client(runs, "greeter") as client:
        events = await collect(client, user("hi"))
        assert kinds(events) == ["task", "WORKING", "WORKING", "artifact_update", "COMPLETED"]
        said = events[2].status_update.status.message
        assert said.parts[0].text == "hello there"
        assert MessageToDict(said.metadata)["orchestrator"] in ("text", "text_delta")
        task_id = events[0].task.id
        artifact = events[-2].artifact_update.artifact
        assert (artifact.artifact_id, [part.text for part in artifact.parts]) == (
            "answer",
            ["hello there"],
        )
        stored = await client.get_task(GetTaskRequest(id=task_id))
    assert stored.status.state == TaskState.TASK_STATE_COMPLETED
    assert [part.text for part in stored.artifacts[0].parts] == ["hello there"]
    assert [(m.role, m.parts[0].text) for m in stored.history] == [
        (Role.ROLE_USER, "hi"),
        (Role.ROLE_AGENT, "hello there"),
    ]
    assert stored.context_id == task_id
    assert MessageToDict(stored.metadata)["usage"]["requests"] == 1
    assert store.load(task_id).answer == "hello there"


async def test_the_streamed_text_and_tool_calls_come_as_working_status_messages() -> None:
    agent = Agent(
        FakeModel([tool_call("send", to="amy"), "mailed amy"]), name="mailer", tools=[send]
    )
    async with Runs([agent], MemoryStore()) as runs, a2a_client(runs, "mailer") as client:
        events = await collect(client, user("mail amy"))
    marks = [
        MessageToDict(e.status_update.status.message.metadata).get("orchestrator")
        for e in events
        if e.WhichOneof("payload") == "status_update"
    ]
    # The text comes as it streams (text_delta) or, to a follower that came after, whole (text).
    assert marks[:3] == [None, "tool_calls", "tool_result"]
    assert marks[3] in ("text", "text_delta")
    assert marks[-1] is None
    calls = MessageToDict(events[2].status_update.status.message.parts[0].data)
    assert calls["tool_calls"][0]["tool"] == "send"
    assert calls["tool_calls"][0]["args"] == {"to": "amy"}
    texts = [
        e.status_update.status.message.parts[0].text
        for e in events
        if e.WhichOneof("payload") == "status_update"
        and MessageToDict(e.status_update.status.message.metadata).get("orchestrator")
        in ("text", "text_delta")
    ]
    assert "".join(texts) == "mailed amy"
    assert SENT == ["amy"]


async def test_send_message_without_streaming_answers_the_finished_task() -> None:
    async with (
        Runs([greeter()], MemoryStore()) as runs,
        a2a_client(runs, "greeter", streaming=False) as client,
    ):
        task = final_task(await collect(client, user("hi")))
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert [part.text for part in task.artifacts[0].parts] == ["hello there"]


async def test_a_structured_answer_is_a_data_part() -> None:
    agent = Agent(FakeModel([tool_call("found", city="Oslo")]), name="finder", tools=[found])
    async with Runs([agent], MemoryStore()) as runs, a2a_client(runs, "finder") as client:
        events = await collect(client, user("where?"))
    artifact = events[-2].artifact_update.artifact
    assert MessageToDict(artifact.parts[0].data) == {"city": "Oslo"}


async def test_a_waiting_approval_is_input_required_and_approve_continues_the_run() -> None:
    store = MemoryStore()
    async with Runs([mailer()], store) as runs, a2a_client(runs, "mailer") as client:
        events = await collect(client, user("mail bob"))
        assert kinds(events)[-1] == "INPUT_REQUIRED"
        status = events[-1].status_update.status
        waiting = MessageToDict(status.message.parts[1].data)["waiting"]
        assert [(w["tool"], w["args"], w["reason"]) for w in waiting] == [
            ("send", {"to": "bob"}, "mail leaves the house")
        ]
        assert "Reply 'approve'" in status.message.parts[0].text
        task_id = events[0].task.id
        stored = await client.get_task(GetTaskRequest(id=task_id))
        assert stored.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        assert SENT == []
        again = await collect(client, user("approve", task_id=task_id))
    assert kinds(again)[-1] == "COMPLETED"
    assert SENT == ["bob"]
    approval = [entry for entry in store.load(task_id).history if entry.kind == "approval"]
    assert [(e.content.approved, e.content.by) for e in approval] == [(True, "a2a")]  # type: ignore[union-attr]


async def test_other_text_denies_the_waiting_call_with_that_reason() -> None:
    store = MemoryStore()
    agent = mailer([tool_call("send", to="bob"), "I did not mail bob"])
    async with Runs([agent], store) as runs, a2a_client(runs, "mailer") as client:
        task_id = (await collect(client, user("mail bob")))[0].task.id
        again = await collect(client, user("not today", task_id=task_id))
    assert kinds(again)[-1] == "COMPLETED"
    assert SENT == []
    result = next(e for e in store.load(task_id).history if e.kind == "tool_result")
    assert "not today" in result.content.text  # type: ignore[union-attr]


async def test_a_data_part_decides_call_by_call_and_names_unknown_calls() -> None:
    store = MemoryStore()
    async with (
        Runs([mailer()], store) as runs,
        a2a_client(runs, "mailer", streaming=False) as client,
    ):
        first = await collect(client, user("mail bob"))
        task_id = final_task(first).id
        waiting = MessageToDict(final_task(first).status.message.parts[1].data)["waiting"]
        with pytest.raises(A2AError, match="No call 'nope' waits"):
            await collect(client, user(task_id=task_id, data={"approve": ["nope"]}))
        again = await collect(
            client, user(task_id=task_id, data={"approve": [waiting[0]["call_id"]]})
        )
    assert final_task(again).status.state == TaskState.TASK_STATE_COMPLETED
    assert SENT == ["bob"]


async def test_a_follow_up_message_continues_the_conversation() -> None:
    store = MemoryStore()
    async with (
        Runs([greeter("hello", "bye")], store) as runs,
        a2a_client(runs, "greeter") as client,
    ):
        task_id = (await collect(client, user("hi")))[0].task.id
        again = await collect(client, user("leaving", task_id=task_id))
    assert again[0].task.id == task_id
    assert [part.text for part in again[-2].artifact_update.artifact.parts] == ["bye"]
    assert [m.text for m in store.load(task_id).messages] == ["hi", "hello", "leaving", "bye"]


async def test_a_context_id_names_a_new_conversation() -> None:
    store = MemoryStore()
    async with Runs([greeter()], store) as runs, a2a_client(runs, "greeter") as client:
        events = await collect(client, user("hi", context_id="chat-7"))
    assert events[0].task.id == "chat-7"
    assert store.load("chat-7").answer == "hello there"


async def test_bad_messages_get_errors_that_say_what_to_send() -> None:
    async with (
        Runs([greeter()], MemoryStore()) as runs,
        a2a_client(runs, "greeter", streaming=False) as client,
    ):
        with pytest.raises(A2AError, match="no text"):
            await collect(client, user(data={"x": 1}))
        with pytest.raises(A2AError, match="No task"):
            await collect(client, user("hi", task_id="missing"))
        with pytest.raises(A2AError, match="context id"):
            await collect(client, user("hi", context_id="bad id!"))
        with pytest.raises(A2AError, match="No task"):
            await client.get_task(GetTaskRequest(id="missing"))


async def test_cancel_stops_the_run_and_the_task_is_canceled() -> None:
    store = MemoryStore()
    async with (
        Runs([holder()], store) as runs,
        a2a_client(runs, "holder", streaming=False) as client,
    ):
        task = final_task(await collect(client, user("hold"), return_immediately=True))
        assert task.status.state == TaskState.TASK_STATE_WORKING
        with anyio.fail_after(10):
            await event(ENTERED, "k").wait()
        cancelled = await client.cancel_task(CancelTaskRequest(id=task.id))
        assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
        with pytest.raises(A2AError, match="not working"):
            await client.cancel_task(CancelTaskRequest(id=task.id))
        stored = await client.get_task(GetTaskRequest(id=task.id))
    assert stored.status.state == TaskState.TASK_STATE_CANCELED
    assert runs.running == ()


async def test_a_failed_run_is_a_failed_task_saying_why() -> None:
    agent = Agent(FakeModel([RuntimeError("the model is down")]), name="broken")
    async with Runs([agent], MemoryStore()) as runs, a2a_client(runs, "broken") as client:
        events = await collect(client, user("hi"))
    assert kinds(events)[-1] == "FAILED"
    assert "the model is down" in events[-1].status_update.status.message.parts[0].text


async def test_tasks_list_gives_this_agents_tasks_a_page_at_a_time() -> None:
    store = MemoryStore()
    agents = [greeter("a", "b", "c"), mailer()]
    async with Runs(agents, store) as runs, a2a_client(runs, "greeter") as client:
        ids = [(await collect(client, user("hi")))[0].task.id for _ in range(3)]
        async with a2a_client(runs, "mailer") as other:
            mailed = (await collect(other, user("mail bob")))[0].task.id
            listed = await other.list_tasks(ListTasksRequest())
            assert [task.id for task in listed.tasks] == [mailed]
            with pytest.raises(A2AError, match="No task"):
                await other.get_task(GetTaskRequest(id=ids[0]))
        first = await client.list_tasks(ListTasksRequest(page_size=2))
        second = await client.list_tasks(
            ListTasksRequest(page_size=2, page_token=first.next_page_token)
        )
        done = await client.list_tasks(
            ListTasksRequest(status=TaskState.TASK_STATE_COMPLETED, include_artifacts=True)
        )
        for token in ("x", "x@2020-01-01", "a@not-a-time"):
            with pytest.raises(A2AError, match="pageToken"):
                await client.list_tasks(ListTasksRequest(page_token=token))
    # the newest run is the mailer's: the first page loads it to tell, and holds one task
    assert first.total_size == 4
    assert [t.id for t in first.tasks] == [ids[2]]
    assert [t.id for t in second.tasks] == [ids[1], ids[0]]
    assert second.next_page_token == ""
    assert len(done.tasks) == 3
    assert all(task.artifacts for task in done.tasks)
    assert not any(task.artifacts for task in first.tasks)


async def test_a_task_updated_after_its_page_is_not_listed_again() -> None:
    async with (
        Runs([greeter("a", "b", "c", "d")], MemoryStore()) as runs,
        a2a_client(runs, "greeter") as client,
    ):
        ids = [(await collect(client, user("hi")))[0].task.id for _ in range(3)]
        first = await client.list_tasks(ListTasksRequest(page_size=2))
        # the last task of the page runs again: it is listed first now, at a later time
        await collect(client, user("again", task_id=ids[1]))
        second = await client.list_tasks(
            ListTasksRequest(page_size=2, page_token=first.next_page_token)
        )
    assert [t.id for t in first.tasks] == [ids[2], ids[1]]
    assert [t.id for t in second.tasks] == [ids[0]]
    assert second.next_page_token == ""


class CountingStore(MemoryStore):
    """A MemoryStore that counts the States loaded from it."""

    def __init__(self) -> None:
        super().__init__()
        self.loads = 0

    def load(self, state_id: str) -> State:
        self.loads += 1
        return super().load(state_id)


async def test_tasks_list_loads_only_its_page_and_pages_walk_every_task_once() -> None:
    store = CountingStore()
    for index in range(300):
        stored = State(id=f"plain-{index:03}")
        stored.add_message(ChatMessage.user(f"hi {index}"))
        store.save(stored)
    async with Runs([greeter("a", "b", "c"), mailer()], store) as runs:
        async with a2a_client(runs, "mailer") as other:
            mailed = (await collect(other, user("mail bob")))[0].task.id
            store.loads = 0
            waiting = await other.list_tasks(
                ListTasksRequest(status=TaskState.TASK_STATE_INPUT_REQUIRED)
            )
            waiting_loads = store.loads
        async with a2a_client(runs, "greeter") as client:
            ran = [(await collect(client, user("hi")))[0].task.id for _ in range(2)]
            seen: list[str] = []
            loads: list[int] = []
            token = later = ""
            for _ in range(20):
                store.loads = 0
                page = await client.list_tasks(ListTasksRequest(page_size=40, page_token=token))
                loads.append(store.loads)
                seen.extend(task.id for task in page.tasks)
                token = page.next_page_token
                if len(loads) == 1:  # a run listed first now shifts no later page
                    later = (await collect(client, user("hi")))[0].task.id
                if not token:
                    break
    assert token == ""
    assert max(loads) <= 40
    assert len(loads) == 8  # 303 runs, 40 a page
    assert sorted(seen) == sorted([f"plain-{i:03}" for i in range(300)] + ran)
    assert seen[:2] == ran[::-1]
    assert mailed not in seen
    assert later not in seen
    assert [task.id for task in waiting.tasks] == [mailed]
    assert waiting_loads == 1  # the listing tells the one waiting run: only it is loaded


async def test_subscribe_gives_a_stopped_task_as_it_is() -> None:
    async with Runs([mailer()], MemoryStore()) as runs, a2a_client(runs, "mailer") as client:
        task_id = (await collect(client, user("mail bob")))[0].task.id
        events = [e async for e in client.subscribe(SubscribeToTaskRequest(id=task_id))]
    assert kinds(events) == ["task"]
    assert events[0].task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_over_http_a_client_streams_a_run_another_client_subscribed_to() -> None:
    async with Runs([holder()], MemoryStore()) as runs:
        app = asgi_app(runs, routes=a2a_routes(runs))
        async with serving(app) as base, a2a_client(runs, "holder", base=base) as client:
            seen: list[StreamResponse] = []
            rest: list[StreamResponse] = []
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    seen.extend(await collect(client, user("hold")))

                group.start_soon(stream)
                with anyio.fail_after(10):
                    await event(ENTERED, "k").wait()
                (task_id,) = runs.running
                async with a2a_client(runs, "holder", base=base) as watcher:
                    watching = watcher.subscribe(SubscribeToTaskRequest(id=task_id))
                    first = await anext(watching)
                    assert first.task.status.state == TaskState.TASK_STATE_WORKING
                    event(RELEASE, "k").set()
                    rest.extend([event async for event in watching])
    assert kinds(rest)[-1] == "COMPLETED"
    assert kinds(seen)[-1] == "COMPLETED"
    assert [p.text for p in seen[-2].artifact_update.artifact.parts] == ["held"]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_over_http_the_token_guards_the_a2a_routes() -> None:
    token = "t" * 24
    async with Runs([greeter()], MemoryStore()) as runs:
        app = asgi_app(runs, routes=a2a_routes(runs), token=token)
        async with serving(app) as base, httpx.AsyncClient() as http:
            refused = await http.get(f"{base}/a2a/greeter/.well-known/agent-card.json")
            assert refused.status_code == 401
            http.headers["Authorization"] = f"Bearer {token}"
            client = await create_client(f"{base}/a2a/greeter", ClientConfig(httpx_client=http))
            events = await collect(client, user("hi"))
    assert kinds(events)[-1] == "COMPLETED"


def test_routes_need_a_clean_prefix() -> None:
    runs = Runs([greeter()], MemoryStore())
    with pytest.raises(ValueError, match="prefix"):
        a2a_routes(runs, prefix="a2a/")


async def test_a_follow_up_that_decides_some_calls_leaves_the_others_waiting() -> None:
    agent = mailer([[tool_call("send", to="amy"), tool_call("send", to="bob")], "mailed both"])
    async with (
        Runs([agent], MemoryStore()) as runs,
        a2a_client(runs, "mailer", streaming=False) as client,
    ):
        first = final_task(await collect(client, user("mail both")))
        waiting = MessageToDict(first.status.message.parts[1].data)["waiting"]
        amy, bob = (call["call_id"] for call in waiting)
        half = final_task(await collect(client, user(task_id=first.id, data={"approve": [amy]})))
        assert half.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        assert SENT == []
        done = final_task(
            await collect(client, user(task_id=first.id, data={"deny": [bob], "reason": "no"}))
        )
    assert done.status.state == TaskState.TASK_STATE_COMPLETED
    assert SENT == ["amy"]


async def test_a_streamed_partial_decision_gives_the_waiting_task_only() -> None:
    agent = mailer([[tool_call("send", to="amy"), tool_call("send", to="bob")], "mailed both"])
    async with Runs([agent], MemoryStore()) as runs, a2a_client(runs, "mailer") as client:
        first = await collect(client, user("mail both"))
        waiting = MessageToDict(first[-1].status_update.status.message.parts[1].data)["waiting"]
        again = await collect(
            client, user(task_id=first[0].task.id, data={"approve": [waiting[0]["call_id"]]})
        )
    assert kinds(again) == ["task"]
    assert again[0].task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED


async def test_follow_ups_that_cannot_decide_say_what_to_send() -> None:
    async with (
        Runs([mailer()], MemoryStore()) as runs,
        a2a_client(runs, "mailer", streaming=False) as client,
    ):
        task_id = final_task(await collect(client, user("mail bob"))).id
        with pytest.raises(A2AError, match="must be a list of call ids"):
            await collect(client, user(task_id=task_id, data={"approve": "all"}))
        with pytest.raises(A2AError, match="reply 'approve'"):
            await collect(client, user(task_id=task_id, data={"other": 1}))
    assert SENT == []


async def test_a_working_task_takes_no_message_and_its_context_starts_no_other_run() -> None:
    async with (
        Runs([holder()], MemoryStore()) as runs,
        a2a_client(runs, "holder", streaming=False) as client,
    ):
        task = final_task(await collect(client, user("hold"), return_immediately=True))
        with anyio.fail_after(10):
            await event(ENTERED, "k").wait()
        with pytest.raises(A2AError, match="is working"):
            await collect(client, user("more", task_id=task.id))
        with pytest.raises(A2AError, match="is working"):
            await collect(client, user("more", context_id=task.id))
        event(RELEASE, "k").set()
        with anyio.fail_after(10):
            await runs.wait(task.id)
        done = await client.get_task(GetTaskRequest(id=task.id, history_length=1))
    assert done.status.state == TaskState.TASK_STATE_COMPLETED
    assert [m.parts[0].text for m in done.history] == ["held"]


async def test_a_run_stopped_at_a_limit_is_a_failed_task() -> None:
    agent = Agent(
        FakeModel([tool_call("send", to="amy"), "mailed amy"]),
        name="mailer",
        tools=[send],
        limits=Limits(requests=1),
    )
    async with (
        Runs([agent], MemoryStore()) as runs,
        a2a_client(runs, "mailer", streaming=False) as client,
    ):
        task = final_task(await collect(client, user("mail amy")))
    assert task.status.state == TaskState.TASK_STATE_FAILED
    assert "requests" in task.status.message.parts[0].text


async def test_tasks_list_filters_by_context_state_and_time_and_bounds_its_page() -> None:
    async with Runs([greeter("a", "b")], MemoryStore()) as runs, a2a_client(runs, "greeter") as c:
        first = (await collect(c, user("hi", context_id="chat-a")))[0].task.id
        await collect(c, user("hi", context_id="chat-b"))
        by_context = await c.list_tasks(ListTasksRequest(context_id="chat-a"))
        failed = await c.list_tasks(ListTasksRequest(status=TaskState.TASK_STATE_FAILED))
        later = ListTasksRequest()
        later.status_timestamp_after.FromSeconds(4_000_000_000)  # in 2096
        none_later = await c.list_tasks(later)
        with pytest.raises(A2AError, match="pageSize"):
            await c.list_tasks(ListTasksRequest(page_size=1000))
    assert [task.id for task in by_context.tasks] == [first]
    assert list(failed.tasks) == []
    assert list(none_later.tasks) == []


async def test_push_notifications_and_the_extended_card_are_not_served() -> None:
    async with (
        Runs([greeter()], MemoryStore()) as runs,
        a2a_client(runs, "greeter", streaming=False) as client,
    ):
        task_id = final_task(await collect(client, user("hi"))).id
        calls = [
            client.create_task_push_notification_config(
                TaskPushNotificationConfig(task_id=task_id, url="http://127.0.0.1:9/hook")
            ),
            client.get_task_push_notification_config(
                GetTaskPushNotificationConfigRequest(task_id=task_id, id="x")
            ),
            client.list_task_push_notification_configs(
                ListTaskPushNotificationConfigsRequest(task_id=task_id)
            ),
            client.delete_task_push_notification_config(
                DeleteTaskPushNotificationConfigRequest(task_id=task_id, id="x")
            ),
        ]
        for call in calls:
            with pytest.raises(A2AError, match="not supported"):
                await call
        # The SDK's client answers with the card it has when the card offers no extended one.
        app = asgi_app(runs, routes=a2a_routes(runs), viewer=False)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app)) as http:
            answer = await http.post(
                "http://127.0.0.1/a2a/greeter/",
                json={"jsonrpc": "2.0", "id": 1, "method": "GetExtendedAgentCard", "params": {}},
                headers={"A2A-Version": "1.0"},
            )
    assert "extended" in answer.json()["error"]["message"].lower()


async def test_a_task_run_by_another_service_on_the_store_is_seen_and_cancelled_there() -> None:
    store = MemoryStore()  # two services on one store stand for two processes
    async with (
        Runs([holder()], store, lease=0.25) as owner,
        Runs([holder()], store, lease=0.25) as other,
        a2a_client(owner, "holder", streaming=False) as client,
        a2a_client(other, "holder", streaming=False) as elsewhere,
    ):
        task = final_task(await collect(client, user("hold"), return_immediately=True))
        with anyio.fail_after(10):
            await event(ENTERED, "k").wait()
        seen = await elsewhere.get_task(GetTaskRequest(id=task.id))
        assert seen.status.state == TaskState.TASK_STATE_WORKING
        listed = await elsewhere.list_tasks(ListTasksRequest())
        assert [(t.id, t.status.state) for t in listed.tasks] == [
            (task.id, TaskState.TASK_STATE_WORKING)
        ]
        with anyio.fail_after(10):
            cancelled = await elsewhere.cancel_task(CancelTaskRequest(id=task.id))
        assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
        assert owner.running == ()


async def test_a_context_id_continues_its_conversation_and_no_other_agents() -> None:
    store = MemoryStore()
    async with (
        Runs([greeter("hello", "bye"), mailer()], store) as runs,
        a2a_client(runs, "greeter", streaming=False) as client,
        a2a_client(runs, "mailer", streaming=False) as other,
    ):
        first = final_task(await collect(client, user("hi", context_id="chat-9")))
        again = final_task(await collect(client, user("leaving", context_id="chat-9")))
        with pytest.raises(A2AError, match="not a conversation of this agent"):
            await collect(other, user("mail bob", context_id="chat-9"))
        waiting = final_task(await collect(other, user("mail bob", context_id="mail-1")))
        decided = final_task(await collect(other, user("yes", context_id="mail-1")))
    assert first.id == again.id == "chat-9"
    assert [part.text for part in again.artifacts[0].parts] == ["bye"]
    assert waiting.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert decided.status.state == TaskState.TASK_STATE_COMPLETED
    assert SENT == ["bob"]
