"""The example web app's page in a real headless browser (Debian's chromium, over CDP).

The page starts a run, follows its events live (an EventSource on /runs/{id}/events), shows the
tree and an approval button, and sees the run end once it is clicked; another run is cancelled
from the page. At 1400 and 800 px wide; screenshots are kept in ``.artifacts/web_app/``.
"""

from __future__ import annotations

import pytest

from tests.viewer.cdp import Browser
from tests.web_app.conftest import ARTIFACTS, App


@pytest.mark.parametrize("width", [1400, 800])
def test_the_page_shows_the_tree_and_an_approval_that_finishes_the_run(
    app: App, width: int
) -> None:
    server = app.start(latency=0.2)
    with Browser(width=width, height=900) as browser:
        browser.open(server.url + "/", "document.readyState === 'complete'")
        browser.evaluate("document.getElementById('go').click()")
        browser.wait_for("document.querySelector('button.approve') !== null", timeout=30)
        assert browser.evaluate("document.body.dataset.status") == "waiting"
        states = browser.evaluate("document.querySelectorAll('.state').length")
        assert states == 2  # the desk and its mailer subagent
        waiting = browser.evaluate("document.querySelector('.waiting').textContent")
        assert "send_email" in waiting
        assert "mail leaves the company" in waiting
        tree = browser.evaluate("document.getElementById('tree').textContent")
        assert "waits for a person" in tree
        assert "lookup" in tree
        log = browser.evaluate("document.getElementById('log').textContent")
        assert "approval_needed" in log
        browser.screenshot(ARTIFACTS / f"waiting-{width}.png")

        browser.evaluate("document.querySelector('button.approve').click()")
        browser.wait_for("document.body.dataset.status === 'answered'", timeout=30)
        assert browser.evaluate("document.querySelector('button.approve')") is None
        text = browser.evaluate("document.getElementById('text').textContent")
        assert text.startswith("Done:")
        tree = browser.evaluate("document.getElementById('tree').textContent")
        assert "waits for a person" not in tree
        assert "→ done" in tree
        browser.screenshot(ARTIFACTS / f"done-{width}.png")
        for url in browser.requested():
            assert url.startswith(server.url), url
        assert browser.problems() == []
    server.stop()
    assert app.outbox.read_text().count("customer@example.com") == 1


def test_the_page_cancels_a_run(app: App) -> None:
    server = app.start(latency=30)  # the first model step takes 30 s: running at the click
    with Browser(width=1100, height=700) as browser:
        browser.open(server.url + "/", "document.readyState === 'complete'")
        browser.evaluate("document.getElementById('go').click()")
        browser.wait_for("!document.getElementById('cancel').disabled", timeout=30)
        assert browser.evaluate("document.body.dataset.status") == "running"
        browser.evaluate("document.getElementById('cancel').click()")
        browser.wait_for("document.body.dataset.status === 'idle'", timeout=30)
        assert browser.evaluate("document.getElementById('cancel').disabled") is True
        note = browser.evaluate("document.querySelector('.state .note').textContent")
        assert note not in ("", "running")  # the run's end says why
        browser.screenshot(ARTIFACTS / "cancelled.png")
        assert browser.problems() == []
    server.stop()
    assert not app.outbox.exists()
