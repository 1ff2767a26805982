"""Model strings, and the library without the provider SDKs installed."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from orchestrator import Agent
from orchestrator.models import AnthropicModel, OpenAIModel, OpenAIResponsesModel

# Private: how a model string resolves, checked as a unit (Agent("...") is its public face).
from orchestrator.models._base import ollama_base_url, resolve_model


def test_provider_strings() -> None:
    openai = resolve_model("openai:gpt-4o-mini")
    assert isinstance(openai, OpenAIModel)
    assert (openai.name, openai.base_url) == ("gpt-4o-mini", "https://api.openai.com/v1")
    anthropic = resolve_model("anthropic:claude-sonnet-4-5")
    assert isinstance(anthropic, AnthropicModel)
    assert anthropic.name == "claude-sonnet-4-5"
    ollama = resolve_model("ollama:llama3:8b")
    assert isinstance(ollama, OpenAIModel)
    assert (ollama.name, ollama.base_url) == ("llama3:8b", "http://localhost:11434/v1")
    assert Agent("openai:gpt-4o").model.name == "gpt-4o"
    responses = resolve_model("openai-responses:gpt-5-mini")
    assert isinstance(responses, OpenAIResponsesModel)
    assert (responses.name, responses.base_url) == ("gpt-5-mini", "https://api.openai.com/v1")
    assert isinstance(Agent("openai-responses:o4-mini").model, OpenAIResponsesModel)


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("", "http://localhost:11434/v1"),
        ("0.0.0.0", "http://localhost:11434/v1"),
        ("0.0.0.0:9999", "http://localhost:9999/v1"),
        ("gpu-box:11434", "http://gpu-box:11434/v1"),
        ("https://ollama.example", "https://ollama.example:11434/v1"),
    ],
)
def test_ollama_honours_ollama_host(monkeypatch: pytest.MonkeyPatch, host: str, url: str) -> None:
    monkeypatch.setenv("OLLAMA_HOST", host)
    assert ollama_base_url() == url


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ("gpt-4o", "Did you mean 'openai:gpt-4o'?"),
        ("claude-sonnet-4-5", "Did you mean 'anthropic:claude-sonnet-4-5'?"),
        ("opneai:gpt-4o", "Did you mean 'openai:gpt-4o'?"),
        ("openai-response:o3", "Did you mean 'openai-responses:o3'?"),
        ("mistral:large", ""),
        ("openai:", ""),
    ],
)
def test_an_unknown_prefix_lists_the_valid_ones(text: str, hint: str) -> None:
    with pytest.raises(
        ValueError,
        match="'openai:<model>', 'openai-responses:<model>', 'anthropic:<model>', 'ollama:<model>'",
    ) as caught:
        resolve_model(text)
    assert str(caught.value).endswith(hint)


def test_not_a_model() -> None:
    with pytest.raises(TypeError, match="takes a Model"):
        resolve_model(42)  # pyright: ignore[reportArgumentType]


def test_the_library_works_without_the_sdks() -> None:
    script = textwrap.dedent(
        """
        import sys
        for name in ("openai", "anthropic", "httpx2"):
            sys.modules[name] = None  # as if not installed
        import orchestrator
        from orchestrator.models import AnthropicModel, OpenAIModel, Price
        from orchestrator.testing import FakeModel
        print(orchestrator.Agent(FakeModel(["hi"])).run("Say hi"))
        for build in (
            lambda: OpenAIModel("gpt-4o"),
            lambda: orchestrator.Agent("openai-responses:o3"),
            lambda: orchestrator.Agent("anthropic:c"),
        ):
            try:
                build()
            except ImportError as error:
                print(error)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "hi",
        "OpenAIModel needs the 'openai' package, which is not installed:"
        " pip install 'orchestrator[openai]'",
        "OpenAIResponsesModel needs the 'openai' package, which is not installed:"
        " pip install 'orchestrator[openai]'",
        "AnthropicModel needs the 'anthropic' package, which is not installed:"
        " pip install 'orchestrator[anthropic]'",
    ]
