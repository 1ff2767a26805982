"""The example web app's page in a real headless browser (Debian's chromium, over CDP).

The test starts a run from the page, sees the live tree and an approval button, clicks it and
sees the run finish. Screenshots are kept in ``.artifacts/web_app/``.
"""

from __future__ import annotations

from tests.viewer.cdp import Browser
from tests.web_app.conftest import ARTIFACTS, App


def test_the_page_shows_the_tree_and_an_approval_that_finishes_the_run(app: App) -> None:
    server = app.start(latency=0.2)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with Browser(width=1100, height=900) as browser:
        browser.open(server.url + "/", "document.readyState === 'complete'")
        browser.evaluate("document.getElementById('go').click()")
        browser.wait_for("document.querySelector('button.approve') !== null", timeout=30)
        assert browser.evaluate("document.body.dataset.status") == "waiting"
        states = browser.evaluate("document.querySelectorAll('.state').length")
        assert states == 2  # the desk and its mailer subagent
        assert "send_email" in browser.evaluate("document.querySelector('.waiting').textContent")
        browser.screenshot(ARTIFACTS / "waiting.png")

        browser.evaluate("document.querySelector('button.approve').click()")
        browser.wait_for("document.body.dataset.status === 'done'", timeout=30)
        assert browser.evaluate("document.querySelector('button.approve')") is None
        text = browser.evaluate("document.getElementById('text').textContent")
        assert "Done:" in text
        assert "→ waiting" not in browser.evaluate("document.getElementById('tree').textContent")
        browser.screenshot(ARTIFACTS / "done.png")
        for url in browser.requested():
            assert url.startswith(server.url), url
        assert browser.problems() == []
    server.stop()
    assert app.outbox.read_text().count("customer@example.com") == 1
