"""The viewer in a real headless browser (Debian's chromium): the tree, the timeline, a State.

Each test leaves a screenshot in the artifacts folder (``.artifacts/viewer/``, or
``$ORCHESTRATOR_ARTIFACTS/viewer``); the run's summary names it. The browser is driven over the
DevTools protocol on a pipe (`tests.viewer.cdp`), and every URL it asked for is checked to be
the viewer's own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

# Private: the viewer server of the CLI, started in the test's process.
from orchestrator._viewing._viewer import Viewer, ViewerServer, running
from stores import SQLiteStore
from tests.viewer.cdp import Browser
from tests.viewer.conftest import ARTIFACTS, Research

READY = "document.body.dataset.state === 'ready'"


@pytest.fixture(scope="module")
def server(research: Research) -> Iterator[ViewerServer]:
    with SQLiteStore(research.path) as store, running(Viewer(store, "runs.db")) as server:
        yield server


@pytest.fixture
def browser(server: ViewerServer) -> Iterator[Browser]:
    with Browser(width=1400, height=1000) as browser:
        yield browser
        # Whatever the test did, the page reached nothing but the viewer and threw nothing.
        assert browser.requested(), "the page requested nothing"
        for url in browser.requested():
            assert url.startswith(server.url), f"the page requested {url}"
        assert browser.problems() == []


def js(browser: Browser, expression: str) -> Any:
    return browser.evaluate(expression)


def texts(browser: Browser, selector: str) -> list[str]:
    return js(
        browser, f"[...document.querySelectorAll({json.dumps(selector)})].map(e => e.textContent)"
    )


def boxes(browser: Browser, selector: str) -> list[dict[str, float]]:
    """The rectangles of the elements `selector` finds, in page pixels."""
    return js(
        browser,
        f"[...document.querySelectorAll({json.dumps(selector)})].map(e => {{"
        " const r = e.getBoundingClientRect();"
        " return {left: r.left, right: r.right, width: r.width, top: r.top}; })",
    )


def test_the_run_shows_its_tree_timeline_and_messages(
    browser: Browser, server: ViewerServer, research: Research
) -> None:
    browser.open(server.url, READY + " && document.querySelectorAll('.bar-call').length > 0")

    assert js(browser, "location.hash") == ""  # the newest run is shown first
    assert texts(browser, ".run .run-head strong") == ["lead"]
    assert js(browser, "document.getElementById('store').textContent") == "runs.db · 4 States"
    # The tree: the lead and its three researchers, each under the call that started it.
    nodes = texts(browser, ".tree-node strong")
    assert nodes == ["lead", "researcher", "researcher", "researcher"]
    assert len(texts(browser, "ul.tree > li > ul > li > .tree-node")) == 3
    assert all("← research call_" in text for text in texts(browser, ".tree-node")[1:])
    # The timeline: a row per State, a bar per call and per model request.
    assert len(boxes(browser, ".tl-state .bar-state")) == 4
    assert len(boxes(browser, ".bar-model")) == research.lead.usage.requests == 11
    assert len(boxes(browser, ".bar-call")) == 12
    title = js(browser, "document.getElementById('timeline-total').textContent")
    assert title.endswith(" · 4 States · 12 tool calls")
    # The three research calls ran at once: their bars overlap on the screen.
    research_bars = [
        box
        for box, name in zip(
            boxes(browser, ".tl-call .bar-call"), texts(browser, ".tl-call .call-name"), strict=True
        )
        if name == "research"
    ]
    assert len(research_bars) == 3
    assert max(b["left"] for b in research_bars) < min(b["right"] for b in research_bars)
    assert all(b["width"] > 100 for b in research_bars)
    # The lead's State: its answer and its messages.
    assert js(browser, "document.getElementById('state-title').textContent") == (
        f"lead {research.lead.id}"
    )
    assert research.lead.answer in texts(browser, "#facts td")[-1]
    roles = texts(browser, "#messages .role")
    assert roles == ["user", "assistant", "tool results", "assistant"]  # not "user"
    assert texts(browser, "#messages .block-call .call-name") == ["→ research"] * 3

    browser.screenshot(ARTIFACTS / "run.png")


def test_picking_a_researcher_shows_its_state(
    browser: Browser, server: ViewerServer, research: Research
) -> None:
    lead = research.lead
    browser.open(
        f"{server.url}#/run/{lead.id}", READY + " && !!document.querySelector('.tl-state')"
    )
    child = js(browser, "document.querySelectorAll('.tree-node')[1].dataset.id")

    js(browser, "document.querySelectorAll('.tree-node')[1].click()")
    browser.wait_for(
        f"{READY} && document.getElementById('state-title').textContent.endsWith('{child}')"
    )

    assert js(browser, "location.hash") == f"#/run/{lead.id}/state/{child}"
    selected = js(browser, "[...document.querySelectorAll('.selected')].map(e => e.dataset.id)")
    assert selected == [lead.id, child, child]  # the run, the tree node, the timeline row
    facts = dict(zip(texts(browser, "#facts th"), texts(browser, "#facts td"), strict=True))
    assert facts["agent"] == "researcher, model offline, 1 run"
    assert facts["parent"].startswith(lead.id)
    data = json.loads(js(browser, "document.querySelector('pre.data').textContent"))
    assert set(data) == {"queries", "sources", "findings"}
    assert [m.text for m in research.researchers[0].messages][:1] != []
    calls = texts(browser, "#messages .block-call .call-name")
    assert calls == ["→ search", "→ read", "→ read"]
    assert len(texts(browser, "#messages .block-result")) == 3

    browser.screenshot(ARTIFACTS / "researcher.png")

    # The address keeps what is shown: a reload comes back to the same State.
    browser.send("Page.reload")
    browser.wait_for(
        f"!!document.body && {READY} &&"
        f" document.getElementById('state-title').textContent.endsWith('{child}')"
    )


def test_a_timeline_row_and_a_subagent_link_open_their_state(
    browser: Browser, server: ViewerServer, research: Research
) -> None:
    lead = research.lead
    browser.open(
        f"{server.url}#/run/{lead.id}", READY + " && !!document.querySelector('.tl-state')"
    )
    last = js(browser, "[...document.querySelectorAll('.tl-state')].at(-1).dataset.id")

    js(browser, "[...document.querySelectorAll('.tl-state')].at(-1).click()")
    browser.wait_for(f"{READY} && location.hash.endsWith('{last}')")
    assert js(browser, "document.querySelector('.tl-state.selected').dataset.id") == last

    js(browser, "document.querySelector('#facts a').click()")  # its parent: the lead
    browser.wait_for(
        f"{READY} && document.getElementById('state-title').textContent.endsWith('{lead.id}')"
    )
    # The lead's first subagent: its link read before the click, which may re-render the page.
    first = js(browser, "document.querySelector('.child-link').getAttribute('href')")
    js(browser, "document.querySelector('.child-link').click()")
    browser.wait_for(f"{READY} && location.hash === '{first}'")


def test_a_state_that_is_not_there_shows_the_error(browser: Browser, server: ViewerServer) -> None:
    browser.open(f"{server.url}#/run/feedface", "document.body.dataset.state === 'error'")

    message = js(browser, "document.getElementById('error').textContent")
    assert message == "No State 'feedface' in runs.db."
    assert js(browser, "document.getElementById('error').hidden") is False

    browser.screenshot(ARTIFACTS / "missing.png")
    # The 404 the page was answered shows in the browser's log: that one is expected.
    browser.events[:] = [
        (method, params)
        for method, params in browser.events
        if not (method == "Log.entryAdded" and "404" in params["entry"]["text"])
    ]
