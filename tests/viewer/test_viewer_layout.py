"""The viewer in headless chromium at 1400 and 800 px: labels fit, waits and marks drawn, search.

Screenshots go to the artifacts folder (``.artifacts/viewer/``), like the other browser tests.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator import Agent, Message, State, approve, tool
from orchestrator._viewing._viewer import Viewer, ViewerServer, running  # private: the server
from orchestrator.permissions import AllowByName, ApproveLater
from orchestrator.testing import FakeModel, tool_call
from stores import SQLiteStore
from tests.viewer.cdp import Browser
from tests.viewer.conftest import ARTIFACTS, Research

READY = "document.body.dataset.state === 'ready'"


@tool
def send(to: str) -> str:
    """Send a message."""
    return f"sent to {to}"


@tool
def look() -> str:
    """Look around."""
    return "looked"


@pytest.fixture(scope="module")
def mail_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with a run whose call waited for ann's approval, and one still waiting."""
    path = tmp_path_factory.mktemp("mail") / "runs.db"
    with SQLiteStore(path) as store:

        def mailer(replies: list[Any]) -> Agent:
            return Agent(
                FakeModel(replies),
                tools=[send, look],
                store=store,
                name="mailer",
                permissions=[AllowByName("look"), ApproveLater("send", reason="mail leaves")],
            )

        done = State(id="mail_done", messages=[Message.user("mail bob")])
        agent = mailer([[tool_call("send", to="bob"), tool_call("look")], "sent"])
        agent.run(done)
        approve(done, done.pending_calls[0].id, by="ann", reason="bob expects it")
        agent.run(done)
        waiting = State(id="mail_waiting", messages=[Message.user("mail carol")])
        mailer([tool_call("send", to="carol")]).run(waiting)
    return path


def served(path: Path, name: str) -> Iterator[ViewerServer]:
    with SQLiteStore(path) as store, running(Viewer(store, name)) as server:
        yield server


@pytest.fixture(scope="module")
def mail_server(mail_store: Path) -> Iterator[ViewerServer]:
    yield from served(mail_store, "mail.db")


@pytest.fixture(scope="module")
def research_server(research: Research) -> Iterator[ViewerServer]:
    yield from served(research.path, "runs.db")


def browse(width: int) -> Browser:
    return Browser(width=width, height=900)


def js(browser: Browser, expression: str) -> Any:
    return browser.evaluate(expression)


def rects(browser: Browser, selector: str) -> list[dict[str, float]]:
    return js(
        browser,
        f"[...document.querySelectorAll({json.dumps(selector)})].map(e => {{"
        " const r = e.getBoundingClientRect();"
        " return {left: r.left, right: r.right, text: e.textContent}; })",
    )


def lane_edges(browser: Browser) -> tuple[float, float]:
    (lane, *_) = rects(browser, ".tl-call .tl-lane")
    return lane["left"], lane["right"]


@pytest.mark.parametrize("width", [1400, 800])
def test_the_timeline_fits_its_width_and_its_labels_do_not_overlap(
    research_server: ViewerServer, width: int
) -> None:
    with browse(width) as browser:
        browser.open(research_server.url, READY + " && !!document.querySelector('.bar-call')")

        box = js(
            browser, "(b => [b.scrollWidth, b.clientWidth])(document.getElementById('timeline'))"
        )
        assert box[0] <= box[1], "the timeline scrolls sideways"
        assert js(browser, "document.documentElement.scrollWidth") <= width
        left, right = lane_edges(browser)
        for label in rects(browser, ".bar-text"):
            assert left - 1 <= label["left"], label
            assert label["right"] <= right + 1, label  # never cut at the lane's edge
        inside = js(
            browser,
            "[...document.querySelectorAll('.bar-text-inside')]"
            ".map(e => getComputedStyle(e).color)",
        )
        assert set(inside) <= {"rgb(255, 255, 255)"}  # a label on a bar is white, readable
        ticks = rects(browser, ".tick")
        assert len(ticks) >= 2
        for before, after in itertools.pairwise(ticks):
            assert before["right"] <= after["left"], (before, after)
        browser.screenshot(ARTIFACTS / f"timeline-{width}.png")
        assert browser.problems() == []


def test_a_call_that_waited_for_approval_is_drawn_waiting_then_running(
    mail_server: ViewerServer,
) -> None:
    with browse(1400) as browser:
        browser.open(
            f"{mail_server.url}#/run/mail_done", READY + " && !!document.querySelector('.bar-wait')"
        )

        (wait,) = js(browser, "[...document.querySelectorAll('.bar-wait')].map(e => e.title)")
        assert "waited" in wait
        assert "(mail leaves); approved by ann: bob expects it" in wait
        marks = js(browser, "[...document.querySelectorAll('#marks li')].map(e => e.textContent)")
        assert any("approved by ann: bob expects it" in mark for mark in marks)
        assert any("waiting for approval of send" in mark for mark in marks)
        assert any("resumed" in mark for mark in marks)
        browser.screenshot(ARTIFACTS / "approval.png")

        browser.open(f"{mail_server.url}#/run/mail_waiting", READY + " && location.hash !== ''")
        # The run before had one waiting bar too: wait for this run's facts, then look.
        browser.wait_for(
            "document.querySelector('#facts .status')?.textContent === 'waiting for approval'"
        )
        browser.wait_for(  # drawn waiting, not as the tool running (it never ran)
            "[...document.querySelectorAll('.bar-text')]"
            ".some(e => e.textContent === 'waiting for approval')"
        )
        assert js(browser, "document.querySelectorAll('.bar-wait').length") == 1
        assert browser.problems() == []


def test_the_search_lists_the_runs_that_match(mail_server: ViewerServer) -> None:
    with browse(800) as browser:
        browser.open(mail_server.url, READY + " && document.querySelectorAll('.run').length === 2")

        js(
            browser,
            "(f => { f.elements.status.value = 'waiting for approval';"
            " f.dispatchEvent(new Event('submit', {cancelable: true})); })"
            "(document.getElementById('search'))",
        )
        browser.wait_for(f"{READY} && document.querySelectorAll('.run').length === 1")
        assert js(browser, "document.querySelector('.run').dataset.id") == "mail_waiting"

        js(
            browser,
            "(f => { f.elements.status.value = ''; f.elements.q.value = 'nobody';"
            " f.dispatchEvent(new Event('submit', {cancelable: true})); })"
            "(document.getElementById('search'))",
        )
        browser.wait_for(f"{READY} && document.querySelectorAll('.run').length === 0")
        assert js(browser, "document.getElementById('run-list').textContent") == "No run matches."
        browser.screenshot(ARTIFACTS / "search-800.png")
        assert browser.problems() == []
