"""The cluster guide's code blocks and examples/distributed.py run (on a local Ray cluster).

Both start Ray, so they run here, with the Ray tests inside a loopback-only network namespace,
instead of in tests/test_docs.py and tests/test_examples.py. Each runs in a process of its own,
which starts and stops its own cluster, as a reader's program does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runners.conftest import only_loopback
from tests.test_docs import python_blocks

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guides" / "cluster.md"
EXAMPLE = ROOT / "examples" / "distributed.py"
OFFLINE = {
    key: value
    for key, value in os.environ.items()
    if key not in {"OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OLLAMA_HOST", "DATABASE_URL"}
}


@pytest.fixture(autouse=True)
def loopback_only() -> None:
    if not only_loopback():
        pytest.fail("Ray runs only inside scripts/in_netns.sh (a loopback-only namespace).")


def run(args: list[str], cwd: Path) -> str:
    done = subprocess.run(
        args,
        cwd=cwd,
        env={**OFFLINE, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    # Ray logs its own diagnostics to stderr; a Python error fails the run.
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout


def test_the_example_runs_its_children_on_workers(tmp_path: Path) -> None:
    lines = [line.strip() for line in run([sys.executable, str(EXAMPLE)], tmp_path).splitlines()]
    assert lines == [
        "Findings:",
        "- pool: release 4.2 cut the checkout database pool from 50 to 5 connections",
        "- alert: only the error rate was alerted on, so detection took 5 minutes",
        "- fix: the pool size is now checked in review and alerted on at 80%",
        "children: 3, each linked to its call: True",
        "ran outside this process: True",
        "requests: 8 (the lead 2, each researcher 2)",
    ]


def test_the_guides_blocks_run_in_order(tmp_path: Path) -> None:
    blocks = python_blocks(GUIDE.read_text(encoding="utf-8"))
    assert len(blocks) >= 4
    program = "\n".join(block.code for block in blocks) + "\nprint('ok')\n"
    assert run([sys.executable, "-c", program], tmp_path).splitlines() == ["ok"]


def test_the_guides_registry_is_the_examples_code() -> None:
    """The registry block is the example's, so what the guide shows is what the workers run."""
    registry = python_blocks(GUIDE.read_text(encoding="utf-8"))[0].code
    body = registry[registry.index("FACTS = {") :]
    assert body in EXAMPLE.read_text(encoding="utf-8")
