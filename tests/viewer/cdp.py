"""A small Chrome DevTools Protocol client for Debian's headless `chromium`, over a pipe.

Chromium started with ``--remote-debugging-pipe`` reads protocol messages from its file
descriptor 3 and writes to 4, each a JSON object ended by a NUL byte. That needs no WebSocket
library and opens no debugging port: the browser listens on nothing.

Chromium is kept to loopback: it resolves no host name but 127.0.0.1 (`--host-resolver-rules`),
sends anything else to a proxy on a closed loopback port, which refuses it at once (so an IP
address outside 127.0.0.0/8 is not reached either), and its background services (updates,
sync, safe browsing, metrics) are off. The tests also check every request the page made.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

__all__ = ("Browser", "CDPError", "chromium_path")

FLAGS = (
    "--headless",
    "--no-sandbox",  # root in a container: the sandbox cannot start
    "--disable-gpu",
    "--disable-quic",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-breakpad",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--disable-features=Translate,MediaRouter,OptimizationHints,AutofillServerCommunication",
    "--metrics-recording-only",
    "--no-pings",
    "--mute-audio",
    "--password-store=basic",
    "--hide-scrollbars",
    "--force-color-profile=srgb",
    # Only 127.0.0.1 resolves; every other destination goes to a proxy on a closed port.
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
    "--proxy-server=http://127.0.0.1:9",
)


def _above_nine(fd: int) -> int:
    """`fd` moved to a number above 9 (the old number is closed)."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return moved


class CDPError(RuntimeError):
    """The browser answered a command with an error, or did not answer in time."""


def chromium_path() -> str:
    """The `chromium` program; the tests fail (never skip) without it."""
    found = shutil.which("chromium")
    if found is None:
        raise RuntimeError(
            "Debian's chromium is not installed: run scripts/ensure_chromium.sh (as root), which"
            " `make unit` and `make test` run first."
        )
    return found


class Browser:
    """A headless Chromium with one page, driven over the DevTools protocol.

    Events the page sends are kept in `events` (method, params), so a test can read what was
    requested, logged or thrown.
    """

    def __init__(self, *, width: int = 1400, height: int = 1000, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._next_id = 0
        self._buffer = b""
        self._profile = tempfile.TemporaryDirectory(prefix="orchestrator-chromium-")
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()
        # The browser's ends become its fds 3 and 4. Moved above 9 first, so that the
        # redirections cannot overwrite one another whatever numbers the pipes got.
        to_browser_read = _above_nine(to_browser_read)
        from_browser_write = _above_nine(from_browser_write)
        script = f'exec "$0" "$@" 3<&{to_browser_read} 4>&{from_browser_write}'
        self._log = Path(self._profile.name) / "chromium.log"
        with self._log.open("wb") as log:
            self._process = subprocess.Popen(
                [
                    "bash",  # dash takes no fd above 9 in a redirection
                    "-c",
                    script,
                    chromium_path(),
                    *FLAGS,
                    f"--user-data-dir={self._profile.name}",
                    f"--window-size={width},{height}",
                    "--remote-debugging-pipe",
                    "about:blank",
                ],
                pass_fds=(to_browser_read, from_browser_write),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        os.close(to_browser_read)
        os.close(from_browser_write)
        try:
            targets = self.send("Target.getTargets")["targetInfos"]
            page = next(t["targetId"] for t in targets if t["type"] == "page")
            attached = self.send("Target.attachToTarget", targetId=page, flatten=True)
            self._session: str | None = attached["sessionId"]
            for domain in ("Page", "Runtime", "Network", "Log"):
                self.send(f"{domain}.enable")
            self.send(
                "Emulation.setDeviceMetricsOverride",
                width=width,
                height=height,
                deviceScaleFactor=1,
                mobile=False,
            )
        except BaseException:
            self.close()
            raise

    # -- the protocol ---------------------------------------------------------------------------

    def send(self, method: str, /, **params: Any) -> dict[str, Any]:
        """Send one command (to the page once attached) and return its result."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        session = getattr(self, "_session", None)
        if session is not None and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._receive(deadline, method)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise CDPError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append((reply["method"], reply.get("params", {})))

    def _receive(self, deadline: float, waiting_for: str) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CDPError(f"No answer to {waiting_for} within {self.timeout} s.")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 16)
                if not chunk:
                    raise CDPError(
                        f"The browser closed its pipe while waiting for {waiting_for}; its"
                        f" log ends with:\n{self.log_tail()}"
                    )
                self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def log_tail(self, lines: int = 20) -> str:
        """The last lines chromium wrote on its stderr."""
        try:
            text = self._log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    # -- what the tests do ----------------------------------------------------------------------

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited if it is a promise)."""
        result = self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise CDPError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, *, timeout: float | None = None) -> Any:
        """Poll `expression` until it is truthy; return its value."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise CDPError(f"{expression!r} was still {value!r} after {timeout} s.")
            time.sleep(0.05)

    def open(self, url: str, ready: str) -> None:
        """Go to `url` and wait until the page's `ready` expression is truthy."""
        self.send("Page.navigate", url=url)
        self.wait_for(f"document.URL === {json.dumps(url)} && !!document.body && ({ready})")

    def screenshot(self, path: Path, *, full_page: bool = True) -> Path:
        """Save a PNG of the page (all of it, not only the window, by default)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.send("Page.getLayoutMetrics")["cssContentSize"]
            params["clip"] = {
                "x": 0,
                "y": 0,
                "width": size["width"],
                "height": size["height"],
                "scale": 1,
            }
            params["captureBeyondViewport"] = True
        data = self.send("Page.captureScreenshot", **params)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)  # a test may be the first to write there
        path.write_bytes(base64.b64decode(data))
        return path

    def requested(self) -> list[str]:
        """Every URL the page asked for, in order."""
        return [
            params["request"]["url"]
            for method, params in self.events
            if method == "Network.requestWillBeSent"
        ]

    def problems(self) -> list[str]:
        """Exceptions thrown in the page, and console or log errors."""
        found: list[str] = []
        for method, params in self.events:
            if method == "Runtime.exceptionThrown":
                found.append(json.dumps(params["exceptionDetails"]))
            elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
                found.append(json.dumps(params["args"]))
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                found.append(params["entry"]["text"])
        return found

    # -- closing --------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the browser, wait for it to exit, and remove its profile folder."""
        if self._process.poll() is None:
            with contextlib.suppress(CDPError, OSError):
                self.send("Browser.close")
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        for fd in (self._to_browser, self._from_browser):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._profile.cleanup()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
