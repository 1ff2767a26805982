"""LiteLLM's proxy (``litellm[proxy]`` on PyPI), run on 127.0.0.1 for the model tests.

The proxy is started as a subprocess (``python -m litellm.proxy.proxy_cli``) with a config that
routes model names to upstream servers on loopback, so a test sees what a real LiteLLM makes of
our requests on its way to the upstream API. Nothing leaves the loopback: every download LiteLLM
would make at startup (the model cost map, Anthropic's beta headers, and the like) is switched to
its local copy by LiteLLM's own ``LITELLM_LOCAL_*`` variables, proxy variables are dropped, and
the upstreams are on 127.0.0.1. Startup takes seconds (it imports much), so tests share one proxy
per module. Its output goes to a file, shown when it fails to start.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Generator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ("MASTER_KEY", "LiteLLMProxy", "run_litellm")

# The proxy refuses to start without a master key; clients send it as their API key.
MASTER_KEY = "sk-litellm-test-6f1c2a9e4b7d3850a1c4e2f9b6d8a3c7"

# LiteLLM's switches to its bundled copies of what it would otherwise download at startup.
_OFFLINE = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
    "LITELLM_LOCAL_BLOG_POSTS": "True",
    "LITELLM_LOCAL_POLICY_TEMPLATES": "True",
    "LITELLM_LOCAL_AUTOROUTER_PRESETS": "True",
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
}
_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy")
_STARTUP_LIMIT = 90.0  # seconds; it takes 10 to 25 on a busy 2-core machine


@dataclass(frozen=True)
class LiteLLMProxy:
    """A running proxy: its API root (``url``, with ``/v1`` for the OpenAI endpoint)."""

    url: str


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _config(routes: Mapping[str, tuple[str, str]]) -> dict[str, object]:
    """Each model name routed to (LiteLLM's model id, the upstream's base URL), with a dummy key."""
    models = [
        {
            "model_name": name,
            "litellm_params": {"model": model, "api_base": base, "api_key": "upstream-dummy-key"},
        }
        for name, (model, base) in routes.items()
    ]
    return {"model_list": models, "general_settings": {"master_key": MASTER_KEY}}


def _wait_ready(process: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + _STARTUP_LIMIT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            with urllib.request.urlopen(url + "/health/liveliness", timeout=2) as response:
                if response.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.2)
    output = log.read_text(errors="replace")[-4000:]
    raise RuntimeError(
        f"LiteLLM's proxy did not start within {_STARTUP_LIMIT:.0f} s"
        f" (exit {process.poll()}):\n{output}"
    )


@contextmanager
def run_litellm(routes: Mapping[str, tuple[str, str]]) -> Generator[LiteLLMProxy]:
    """A started LiteLLM proxy on 127.0.0.1 routing `routes`, stopped on exit."""
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "config.yaml"
        config.write_text(json.dumps(_config(routes)))  # JSON is YAML
        log = Path(folder) / "proxy.log"
        env = {key: value for key, value in os.environ.items() if key not in _PROXY_VARIABLES}
        env.update(_OFFLINE)
        port = _free_port()
        command = [sys.executable, "-m", "litellm.proxy.proxy_cli", "--config", str(config)]
        command += ["--host", "127.0.0.1", "--port", str(port)]
        with log.open("wb") as output:
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, env=env
            )
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_ready(process, url, log)
            yield LiteLLMProxy(url)
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
