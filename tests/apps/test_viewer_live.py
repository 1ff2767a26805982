"""The run viewer mounted in `asgi_app` at /viewer/: read-only, and live (it follows the run).

Over HTTP first (the page, its API, its event stream), then in headless chromium served by
uvicorn: the page shows a run holding in a tool, and redraws it when the run goes on, without
a reload. Screenshots at 1400 and 800 px land in the artifacts folder.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from orchestrator.apps import Runs, asgi_app
from stores import SQLiteStore
from tests.apps.serving import serving
from tests.apps.test_runs import GATES, SENT, gate, helper_agent
from tests.viewer.cdp import Browser
from tests.viewer.conftest import ARTIFACTS

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _clear() -> None:
    SENT.clear()
    GATES.clear()


async def test_the_viewer_is_mounted_read_only_and_follows_runs(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "runs.db") as store:
        async with Runs([helper_agent()], store) as runs:
            transport = httpx.ASGITransport(app=asgi_app(runs))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as web:
                handle = await runs.start("helper", "say hi")
                await handle.wait()
                moved = await web.get("/viewer")
                assert moved.status_code == 308
                assert moved.headers["location"].endswith("/viewer/")
                page = await web.get("/viewer/")
                assert page.status_code == 200
                assert "default-src 'none'" in page.headers["content-security-policy"]
                assert b'src="static/viewer.js"' in page.content
                assert (await web.get("/viewer/static/viewer.js")).status_code == 200
                assert (await web.get("/viewer/api/config")).json() == {"live": True}
                listed = (await web.get("/viewer/api/runs")).json()
                assert [run["id"] for run in listed["runs"]] == [handle.state_id]
                tree = (await web.get(f"/viewer/api/runs/{handle.state_id}")).json()
                assert tree["id"] == handle.state_id
                events = await web.get(f"/viewer/events/{handle.state_id}")
                assert events.text.count("event: ") == 3
                assert (await web.get("/viewer/events/absent")).status_code == 404
                assert (await web.get("/viewer/api/states/absent")).status_code == 404
                assert (await web.post("/viewer/api/runs", json={})).status_code == 405


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # uvicorn serves on asyncio only
async def test_the_page_redraws_a_run_as_it_goes_on_without_a_reload(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "runs.db") as store:
        async with Runs([helper_agent()], store) as runs, serving(asgi_app(runs)) as base:
            handle = await runs.start("helper", "hold page")
            await gate("page").entered.wait()
            url = f"{base}/viewer/#/run/{handle.state_id}"
            await anyio.to_thread.run_sync(_watch, url, handle.state_id, _release)


def _release() -> None:
    anyio.from_thread.run_sync(gate("page").release.set)


def _watch(url: str, run_id: str, release: object) -> None:
    """In a worker thread: the page shows the run open, then answered, with no reload."""
    assert callable(release)
    ready = "document.body.dataset.state === 'ready'"
    with Browser(width=1400, height=1000) as browser:
        browser.open(url, ready)
        assert browser.evaluate("document.body.dataset.live") == "yes"
        assert browser.evaluate("document.getElementById('reload').hidden") is True
        badge = "document.querySelector('#run-list .run .badge, #run-list .run [class*=status]')"
        first = browser.evaluate(f"{badge} && {badge}.textContent")
        assert first == "open"
        browser.evaluate("window.stillHere = true")
        browser.screenshot(ARTIFACTS / "live-open.png")
        release()
        browser.wait_for(f"{badge} && {badge}.textContent === 'answered'", timeout=20)
        assert browser.evaluate("window.stillHere") is True  # redrawn, not reloaded
        browser.screenshot(ARTIFACTS / "live-answered-1400.png")
        browser.send(
            "Emulation.setDeviceMetricsOverride",
            width=800,
            height=1000,
            deviceScaleFactor=1,
            mobile=False,
        )
        browser.screenshot(ARTIFACTS / "live-answered-800.png")
        assert all(url.startswith("http://127.0.0.1:") for url in browser.requested())
        assert browser.problems() == []
        assert run_id


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # uvicorn serves on asyncio only
async def test_with_a_token_the_page_asks_for_it_then_follows_the_run(tmp_path: Path) -> None:
    token = "a-token-for-the-viewer-page"
    with SQLiteStore(tmp_path / "runs.db") as store:
        async with (
            Runs([helper_agent()], store) as runs,
            serving(asgi_app(runs, token=token)) as base,
        ):
            handle = await runs.start("helper", "hold signin")
            await gate("signin").entered.wait()
            url = f"{base}/viewer/#/run/{handle.state_id}"
            await anyio.to_thread.run_sync(_sign_in, url, token, _release_sign_in)


def _release_sign_in() -> None:
    anyio.from_thread.run_sync(gate("signin").release.set)


def _sign_in(url: str, token: str, release: object) -> None:
    """In a worker thread: a wrong token is said, the right one shows the run, then it goes on."""
    assert callable(release)
    with Browser(width=1400, height=1000) as browser:
        browser.open(url, "document.body.dataset.state === 'sign-in'")
        assert browser.evaluate("document.getElementById('run-list').children.length") == 0
        browser.screenshot(ARTIFACTS / "live-sign-in.png")
        submit = "document.querySelector('#sign-in button').click()"
        browser.evaluate(f"document.getElementById('token').value = 'wrong-token'; {submit}")
        browser.wait_for("!document.getElementById('sign-in-error').hidden")
        said = browser.evaluate("document.getElementById('sign-in-error').textContent")
        assert said == "That is not the service's token."
        browser.evaluate(f"document.getElementById('token').value = {token!r}; {submit}")
        browser.wait_for("document.body.dataset.state === 'ready'", timeout=20)
        assert browser.evaluate("document.getElementById('sign-in').hidden") is True
        badge = "document.querySelector('#run-list .run [class*=status]')"
        assert browser.evaluate(f"{badge} && {badge}.textContent") == "open"
        release()  # the run goes on: the event stream, signed in by the cookie, redraws it
        browser.wait_for(f"{badge} && {badge}.textContent === 'answered'", timeout=20)
        assert browser.evaluate("document.cookie") == ""  # HttpOnly: no script reads it
        browser.screenshot(ARTIFACTS / "live-signed-in.png")
