"""What a fresh process loads: a run with a scripted model pays only for what it uses."""

from __future__ import annotations

import subprocess
import sys
import textwrap

RUN = textwrap.dedent(
    """
    import sys
    from orchestrator import Agent, tool
    from orchestrator.testing import FakeModel, tool_call

    def count(n: int) -> str:
        return "ok"

    Agent(FakeModel([tool_call("count", n=1), "done"]), tools=[tool(count)]).run("Go")
    print(sorted(name for name in sys.argv[1:] if name in sys.modules))
    import orchestrator, orchestrator.models
    print(orchestrator.EVENT_ADAPTER is not None, orchestrator.models.RetryPolicy.__name__)
    print(sorted(name for name in sys.argv[1:] if name in sys.modules))
    """
)

# Modules a run of the default loop with a FakeModel never needs: the pydantic event models
# (with their TypeAdapter, ~2 MB of the run's peak RSS), the provider models (~0.6 MB), and
# pydantic's model building with its plugin loader, which imports importlib.metadata (3 MB:
# a tool with plain arguments is validated by pydantic-core directly).
LAZY = (
    "importlib.metadata",
    "orchestrator._apps._events",
    "orchestrator.models._anthropic",
    "orchestrator.models._openai",
    "orchestrator.models._retry",
    "pydantic._internal._model_construction",
    "pydantic.main",
)


def test_a_run_with_a_fake_model_imports_no_events_providers_or_model_building() -> None:
    done = subprocess.run(
        [sys.executable, "-c", RUN, *LAZY], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stderr == ""
    assert done.stdout.splitlines() == [
        "[]",
        "True RetryPolicy",
        str(sorted(set(LAZY) - {"orchestrator.models._anthropic", "orchestrator.models._openai"})),
    ]
