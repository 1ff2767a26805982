"""The timeline's bars for calls that failed, calls still open, and model requests that failed."""

from __future__ import annotations

import pytest

from orchestrator import Agent, Message, State, ToolError, tool
from orchestrator._cli._render import TreeNode

# Private: the CLI's modules (the viewer reads runs through them); the CLI is its public face.
from orchestrator._viewing._reading import read_tree
from orchestrator._viewing._timeline import timeline_data
from orchestrator.testing import FakeModel, tool_call
from stores import MemoryStore


@tool
def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: The key.
    """
    if key == "missing":
        raise ToolError("no such key")
    return f"value of {key}"


def test_a_failed_call_and_an_open_call() -> None:
    store = MemoryStore()
    agent = Agent(
        FakeModel(
            [
                [tool_call("lookup", key="a"), tool_call("lookup", key="missing")],
                tool_call("lookup", key="later"),
            ]
        ),
        tools=[lookup],
        name="looker",
        store=store,
    )
    state = State(messages=[Message.user("Look up a")])
    agent.think(state)
    agent.use_tools(state)
    agent.think(state)  # asks for one more call, which never runs: it stays open
    (info,) = store.list()
    node = TreeNode(info, "looker", state=state)  # the live State, its call still open

    rows = timeline_data(node)["rows"]

    calls = [row for row in rows if row["kind"] == "call"]
    assert [(c["args"]["key"], c["outcome"]) for c in calls] == [
        ("a", "done"),
        ("missing", "error"),
        ("later", None),
    ]
    assert calls[2]["end"] == rows[0]["end"]  # open: up to the State's last entry
    assert [segment["turn"] for segment in rows[0]["model"]] == [1, 2]


def test_a_model_request_that_failed() -> None:
    store = MemoryStore()
    agent = Agent(FakeModel([ConnectionError("model down")]), name="solo", store=store)
    state = State(messages=[Message.user("Hello")])
    with pytest.raises(ConnectionError):
        agent.run(state)
    (info,) = store.list()

    (row,) = timeline_data(read_tree(store, info))["rows"]

    (segment,) = row["model"]
    assert segment["error"] == "ConnectionError: model down"
    assert row["start"] <= segment["start"] <= segment["end"] <= row["end"]


def test_a_state_with_no_history_has_no_bars() -> None:
    store = MemoryStore()
    state = State()
    store.save(state)
    (info,) = store.list()

    assert timeline_data(TreeNode(info, state=state)) == {"start": None, "seconds": 0.0, "rows": []}
