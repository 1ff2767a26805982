"""Each model request in ``show --json`` and the viewer carries the messages it sent (issue 30).

A request lists only the messages the previous request did not send (``new_messages``) and how
many it shares with it (``earlier_messages``); the whole list a request sent is rebuilt from
them here and checked against what the model was actually given.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from orchestrator import Agent, Message, State, tool
from orchestrator._cli import cli  # private: the command under test
from orchestrator._viewing._viewer import Viewer, ViewerServer, running  # private: under test
from orchestrator._viewing._views import messages_data, state_data  # private: under test
from orchestrator.testing import FakeModel, tool_call
from stores import SQLiteStore
from tests.viewer.cdp import Browser
from tests.viewer.conftest import ARTIFACTS

READY = "document.body.dataset.state === 'ready'"


@tool
def look(topic: str) -> str:
    """Look a topic up."""
    return f"notes on {topic}"


def rebuilt(calls: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The whole list of messages each request sent, from the shared count and the new ones."""
    sent: list[list[dict[str, Any]]] = []
    before: list[dict[str, Any]] = []
    for call in calls:
        assert call["earlier_messages"] <= len(before)
        messages = before[: call["earlier_messages"]] + call["new_messages"]
        assert len(messages) == call["messages"]
        sent.append(messages)
        before = messages
    return sent


def received(model: FakeModel) -> list[list[dict[str, Any]]]:
    """The messages of each request `model` was given, as JSON."""
    return [messages_data(tuple(request.messages)) for request in model.requests]


def test_each_request_of_a_run_with_tool_calls_carries_what_it_sent() -> None:
    model = FakeModel([tool_call("look", topic="a"), tool_call("look", topic="b"), "done"])
    state = State(messages=[Message.user("Read up on a and b")])
    Agent(model, tools=[look]).run(state)
    calls = state_data(state)["model_calls"]
    assert rebuilt(calls) == received(model)
    assert [call["earlier_messages"] for call in calls] == [0, 1, 3]
    # Each request adds the previous reply (a tool call) and its result: never the whole list.
    assert [len(call["new_messages"]) for call in calls] == [1, 2, 2]
    second = calls[1]["new_messages"]
    assert second[0]["blocks"][0] | {"id": "x"} == {
        "kind": "tool_call",
        "id": "x",
        "name": "look",
        "args": {"topic": "a"},
    }
    assert second[1]["blocks"][0]["text"] == "notes on a"


def test_a_request_after_a_compaction_carries_the_compacted_messages() -> None:
    model = FakeModel([tool_call("look", topic="a"), "first", "second"])
    state = State(messages=[Message.user("Read up on a")])
    agent = Agent(model, tools=[look])
    agent.run(state)
    state.compact("We read up on a.")
    state.add_message(Message.user("And now?"))
    agent.run(state)
    calls = state_data(state)["model_calls"]
    assert rebuilt(calls) == received(model)
    after = calls[-1]
    # The compaction rewrote the messages: the request shares none with the one before.
    assert after["earlier_messages"] == 0
    assert after["messages"] == 3  # the task, the summary and the question: not all 5 before
    assert "We read up on a." in json.dumps(after["new_messages"])


def test_a_child_state_shows_the_messages_its_requests_sent(tmp_path: Path) -> None:
    child_model = FakeModel([tool_call("look", topic="c"), "c is fine"])
    helper = Agent(child_model, tools=[look], name="helper", description="Helps.")
    path = tmp_path / "runs.db"
    root = State(messages=[Message.user("Check c")])
    with SQLiteStore(path) as store:
        lead_model = FakeModel([tool_call("helper", task="check c"), "done"])
        Agent(lead_model, tools=[helper], store=store).run(root)
        (child_id,) = store.load(root.id).children
        child = store.load(child_id)
        from_api = Viewer(store, "runs.db").state(child_id)["model_calls"]
    calls = state_data(child)["model_calls"]
    assert rebuilt(calls) == received(child_model)
    assert "check c" in json.dumps(calls[0]["new_messages"])
    assert from_api == calls  # the viewer's /api/states/ID has the same facts
    shown = CliRunner().invoke(cli, ["show", str(path), child_id, "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["model_calls"] == calls


# -- in headless chromium ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compacted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ViewerServer, str]]:
    """The viewer of a store with a run that called a tool twice, then was compacted."""
    path = tmp_path_factory.mktemp("sent") / "runs.db"
    state = State(messages=[Message.user("Read up on a and b")])
    with SQLiteStore(path) as store:
        replies = [tool_call("look", topic="a"), tool_call("look", topic="b"), "read", "more"]
        agent = Agent(FakeModel(replies), tools=[look], store=store, name="reader")
        agent.run(state)
        state.compact("We read up on a and b.")
        state.add_message(Message.user("And now?"))
        agent.run(state)
        with running(Viewer(store, "runs.db")) as server:
            yield server, state.id


def opened(browser: Browser, selector: str) -> None:
    """Click the summary of the `<details>` that `selector` finds, as a person opens it."""
    browser.evaluate(f"document.querySelector({json.dumps(selector)}).click()")


def shown(browser: Browser, selector: str) -> list[str]:
    """The text of each element `selector` finds that is drawn (not inside a closed fold)."""
    return browser.evaluate(
        f"[...document.querySelectorAll({json.dumps(selector)})]"
        ".filter(e => e.getClientRects().length).map(e => e.innerText)"
    )


@pytest.mark.parametrize("width", [1400, 800])
def test_a_request_opens_on_the_messages_it_sent(
    compacted: tuple[ViewerServer, str], width: int
) -> None:
    server, run_id = compacted
    with Browser(width=width, height=900) as browser:
        browser.open(f"{server.url}#/run/{run_id}", READY)
        # Collapsed at first: nothing of what the requests sent is drawn, not even built.
        assert browser.evaluate("document.querySelectorAll('.sent .msg').length") == 0
        heads = shown(browser, ".request > details > summary")
        assert len(heads) == 4
        second = ".request:nth-child(2) > details"
        opened(browser, f"{second} > summary")
        opened(browser, f"{second} > .sent > summary")
        browser.wait_for("document.querySelectorAll('.sent .msg').length > 0")
        assert shown(browser, f"{second} > .sent > summary") == [
            "messages sent (3): 2 new, 1 sent before"
        ]
        new = shown(browser, f"{second} > .sent > .msg")
        assert len(new) == 2
        assert '→ look(topic="a")' in new[0]
        assert new[1].lower().startswith("tool results")
        assert "notes on a" in new[1]
        opened(browser, f"{second} .sent-earlier > summary")
        browser.wait_for("document.querySelectorAll('.sent-earlier .msg').length > 0")
        (earlier,) = shown(browser, f"{second} .sent-earlier > .msg")
        assert "Read up on a and b" in earlier
        # After the compaction the request sent the summary, all of it shown.
        last = ".request:nth-child(4) > details"
        opened(browser, f"{last} > summary")
        opened(browser, f"{last} > .sent > summary")
        browser.wait_for(f"document.querySelectorAll({json.dumps(last + ' .sent > .msg')}).length")
        (head,) = shown(browser, f"{last} > .sent > summary")
        assert head.startswith("messages sent (3): all 3 shown: the context was rewritten")
        assert "We read up on a and b." in "\n".join(shown(browser, f"{last} > .sent > .msg"))
        assert browser.evaluate("document.documentElement.scrollWidth") <= width
        browser.evaluate("document.getElementById('requests').scrollIntoView()")
        browser.screenshot(ARTIFACTS / f"request-messages-{width}.png", full_page=False)
        assert browser.problems() == []
        for url in browser.requested():
            assert url.startswith(server.url), url


def test_show_says_how_many_messages_each_request_added(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    state = State(messages=[Message.user("Read up on a")])
    with SQLiteStore(path) as store:
        agent = Agent(FakeModel([tool_call("look", topic="a"), "read"]), tools=[look])
        agent.run(state)
        state.compact("We read up on a.")
        state.add_message(Message.user("And now?"))
        Agent(FakeModel(["more"]), tools=[look], store=store).run(state)
    shown = CliRunner().invoke(cli, ["show", str(path), state.id, "--full"], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    requests = [
        line.split("request", 1)[1].strip()
        for line in shown.output.splitlines()
        if " request " in line
    ]
    assert requests == [
        "1 message to fake",
        "3 messages to fake (2 new)",
        "3 messages to fake (the context was rewritten: all of them new)",
    ]
