"""Stores for the viewer's tests, written by running agents, and where screenshots are kept."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator import State
from stores import SQLiteStore

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "research_team.py"
# Screenshots of the browser tests, kept after the run (CI keeps the workspace).
ARTIFACTS = Path(os.environ.get("ORCHESTRATOR_ARTIFACTS", ROOT / ".artifacts")) / "viewer"


@dataclass(frozen=True)
class Research:
    """A store the research team example wrote: its path and the lead's State, loaded."""

    path: Path
    lead: State
    researchers: tuple[State, ...]


@pytest.fixture(scope="session")
def research(tmp_path_factory: pytest.TempPathFactory) -> Research:
    """Run examples/research_team.py once (offline, 50 ms a request) into an SQLite store."""
    path = tmp_path_factory.mktemp("research") / "runs.db"
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")}
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--store", str(path), "--latency", "0.05"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    with SQLiteStore(path) as store:
        (root,) = [info for info in store.list() if info.parent_id is None]
        lead = store.load(root.id)
        children = [
            lead.child(child)
            for entry in lead.history
            if entry.kind == "tool_result"
            for child in entry.child_ids
        ]
    return Research(path, lead, tuple(children))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say where the browser tests left their screenshots."""
    if ARTIFACTS.is_dir() and any(ARTIFACTS.glob("*.png")):
        terminalreporter.write_line(f"viewer screenshots: {ARTIFACTS}")
