"""The library's logging: quiet and cheap until the app turns it on."""

from __future__ import annotations

import subprocess
import sys
import textwrap

RUN = textwrap.dedent(
    """
    import logging, sys
    from orchestrator import Agent
    from orchestrator.testing import FakeModel

    if sys.argv[1] == "debug":
        logging.basicConfig(level=logging.DEBUG, stream=sys.stdout, format="%(message)s")
    Agent(FakeModel(["done"]), name="quiet").run("Go")
    print("structlog" in sys.modules, "rich" in sys.modules)
    """
)


def _run(mode: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", RUN, mode], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stderr == ""
    return done.stdout.splitlines()


def test_a_run_that_logs_nothing_never_imports_structlog() -> None:
    # structlog imports rich and pygments when they are installed: 11 MB of a fresh process.
    assert _run("quiet") == ["False False"]


def test_a_run_logs_its_events_once_the_app_enables_logging() -> None:
    lines = _run("debug")
    assert any("state.run.started" in line and "agent=quiet" in line for line in lines), lines
    assert lines[-1].startswith("True")
