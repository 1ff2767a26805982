"""Fixtures of the provider model tests: loopback servers and a clean environment.

`server` is our own scripted server (`tests.models._server`); `mockapi` is LLMock, a third-party
mock of the provider APIs (`tests.models._llmock`), started once per session in a subprocess and
reset before each test.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

from tests.models._llmock import LLMock, run_llmock
from tests.models._server import ScriptedServer, serve

_VARIABLES = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_ORG_ID",
    "OPENAI_PROJECT_ID",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_CUSTOM_HEADERS",
    "OLLAMA_HOST",
)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:  # pyright: ignore[reportUnusedFunction]
    """No key or URL of the machine running the tests leaks into them."""
    for name in _VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server() -> Generator[ScriptedServer]:
    """A started scripted server on 127.0.0.1, stopped after the test."""
    with serve() as running:
        yield running


@pytest.fixture(scope="session")
def llmock_process() -> Generator[LLMock]:
    """One LLMock server on 127.0.0.1 for the session, killed at its end."""
    with run_llmock() as running:
        yield running


@pytest.fixture
def mockapi(llmock_process: LLMock) -> LLMock:
    """The session's LLMock server, with no requests and no behaviours left from other tests."""
    llmock_process.reset()
    return llmock_process
