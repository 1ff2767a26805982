"""What the viewer and `show` tell besides calls: costs, approvals, recoveries, resumes, stops."""

from __future__ import annotations

import pytest

from orchestrator import Agent, Message, Reply, State, ToolCall, Usage, approve, tool
from orchestrator._cli._render import node_label  # private: under test
from orchestrator._viewing._marks import Cost, cost_of, marks, waits  # private: under test
from orchestrator._viewing._reading import read_tree  # private: under test
from orchestrator._viewing._viewer import Viewer  # private: under test
from orchestrator._viewing._views import state_data  # private: under test
from orchestrator.permissions import AllowByName, ApproveLater
from orchestrator.testing import FakeModel, tool_call
from stores import MemoryStore


def priced(text: str, cost: float, *calls: ToolCall) -> Reply:
    usage = Usage(input_tokens=10, requests=1, cost=cost)
    return Reply(Message.assistant(text, calls), usage)


@pytest.mark.parametrize(
    ("cost", "text"),
    [
        (Cost(), "-"),
        (Cost(0.012, priced=2), "$0.0120"),
        (Cost(0.012, priced=2, unpriced=3), "$0.0120 + 3 unpriced"),
        (Cost(unpriced=2), "2 unpriced"),
    ],
)
def test_a_cost_says_how_many_requests_had_no_price(cost: Cost, text: str) -> None:
    assert cost.text() == text


def test_the_cost_of_a_state_counts_priced_and_unpriced_requests() -> None:
    state = State(messages=[Message.user("hi")])
    Agent(FakeModel([priced("", 0.25, tool_call("look")), "done"]), tools=[look]).run(state)

    assert cost_of(state) == Cost(0.25, priced=1, unpriced=1)
    assert state.usage.cost is None  # the sum says only "unknown"; the roll-up says more
    calls = state_data(state)["model_calls"]
    assert [call["cost"] for call in calls] == [0.25, "unpriced"]
    assert calls[0]["reply"]["blocks"][0]["name"] == "look"
    assert calls[1]["reply"]["blocks"] == [{"kind": "text", "text": "done"}]
    told = [call["prompt"] for call in calls]  # what the model was told, from the history
    assert told[0] == told[1]  # one prompt, recorded once, named by both requests
    assert [spec["name"] for spec in told[0]["tools"]] == ["look"]
    requests = [entry for entry in state.history if entry.kind == "model_request"]
    assert {told[0]["digest"]} == {entry.content.prompt for entry in requests}


@tool
def look() -> str:
    """Look around."""
    return "looked"


def test_the_tree_rolls_up_the_cost_of_its_subagents() -> None:
    researcher = Agent(FakeModel([priced("found", 0.5)] * 2), name="researcher")
    lead = Agent(
        FakeModel([[tool_call("researcher", task="a"), tool_call("researcher", task="b")], "ok"]),
        tools=[researcher.as_tool(description="Research a task.")],
        name="lead",
        store=MemoryStore(),
    )
    store = lead.store
    assert isinstance(store, MemoryStore)
    state = State(id="lead1", messages=[Message.user("go")])
    lead.run(state)

    tree = Viewer(store, "memory").run("lead1")["tree"]
    assert tree["cost"]["text"] == "2 unpriced"
    assert tree["tree_cost"]["text"] == "$1.0000 + 2 unpriced"
    assert [child["cost"]["text"] for child in tree["children"]] == ["$0.5000", "$0.5000"]
    (info,) = [info for info in store.list() if info.id == "lead1"]
    root = read_tree(store, info)
    drawn = node_label(root, root.costs()[id(root)]).plain
    assert drawn.endswith("· $1.0000 + 2 unpriced")  # `tree` says it too, not "-"


def test_a_crash_cut_call_is_marked_recovered_and_the_next_run_resumed() -> None:
    store = MemoryStore()
    crashed: list[State] = []

    @tool
    def snap() -> str:
        """Take what the store holds now, as a crash would leave it."""
        crashed.append(store.load("s1"))
        return "ok"

    agent = Agent(FakeModel([tool_call("snap"), "done"]), tools=[snap], store=store)
    agent.run(State(id="s1", messages=[Message.user("go")]))
    recovered = crashed[0].fork()  # the run went on in the store: resume a copy elsewhere
    recovered.add_message(Message.user("Did it snap?"))
    Agent(FakeModel(["again"])).run(recovered)

    kinds = [(mark["kind"], mark["text"]) for mark in marks(recovered)]
    assert kinds[0][0] == "recovered"
    assert kinds[0][1].startswith("a crash cut the call snap (")
    assert ("resumed", "run 2 started") in kinds
    assert kinds[-1] == ("stopped", "answered")


def test_a_call_that_waited_for_approval_says_who_when_and_why() -> None:
    agent = Agent(
        FakeModel([[tool_call("send", to="bob"), tool_call("look")], "sent"]),
        tools=[send, look],
        store=MemoryStore(),
        permissions=[AllowByName("look"), ApproveLater("send", reason="mail leaves the house")],
    )
    state = State(id="m1", messages=[Message.user("mail bob")])
    agent.run(state)
    (call_id,) = [call.id for call in state.pending_calls]

    (waiting,) = waits(state).values()
    assert (waiting.call_id, waiting.reason, waiting.decided_at) == (
        call_id,
        "mail leaves the house",
        None,
    )
    assert state_data(state)["status"] == "waiting for approval"

    approve(state, call_id, by="ann", reason="fine")
    agent.run(state)
    waiting = waits(state)[call_id]
    assert (waiting.approved, waiting.by, waiting.why) == (True, "ann", "fine")
    assert waiting.decided_at is not None
    assert waiting.since <= waiting.decided_at
    texts = [mark["text"] for mark in marks(state)]
    assert f"{call_id} approved by ann: fine" in texts
    assert f"waiting for approval of send ({call_id})" in texts
    (sent,) = [call for call in state_data(state)["tool_calls"] if call["id"] == call_id]
    assert sent["waiting"]["by"] == "ann"


@tool
def send(to: str) -> str:
    """Send a message."""
    return f"sent to {to}"
