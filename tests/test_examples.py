"""Every program in examples/ runs to the end and says what it should."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# distributed.py starts a Ray cluster: it runs inside a loopback-only network namespace, with
# the Ray tests (tests/runners/test_cluster_docs.py), never here.
RAY_EXAMPLES = {"distributed.py"}
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.py") if p.name not in RAY_EXAMPLES)

# Lines each example must print (whole lines, leading and trailing spaces ignored).
EXPECTED: dict[str, tuple[str, ...]] = {
    "quickstart.py": (
        "notes: ['look at refunds', 'check the retry loop']",
        "refused: 'owner' is not declared; has('owner') is False",
        "pending: ['read_file', 'run_tests']",
        "after the first result: pending ['read_file']",
        "results in request order: call_1, call_2",
        "3. user brings the results of call_1, call_2",
        "4. user: Also check the retry loop",
        "the fork has 5 messages, the original 4",
        "messages and extra data are back: True",
        "answer: {'file': 'refunds.py', 'line': 42}  finished: True  turn: 2",
        "snapshot equal after replay: True",
    ),
    "parallel_agents.py": (
        "answer: Refunds are retried without an idempotency key.",
        "- code_reader: 'refund(' found in payments/refund.py:42",
        "- log_reader: payments: 17 x TimeoutError in refund()",
        "- test_runner: refunds: 2 failed (test_refund_retry, test_refund_twice)",
        "peak tools running at once: 3",
        "states in the tree: 4",
        "reopened code_reader from runs.db with achild: code_reader: 'refund(' found in"
        " payments/refund.py:42",
        "same as the State that ran: True; its parent is the lead: True",
    ),
    "real_model.py": ("model: fake", "answer: 6 times 7 is 42."),
    "research_team.py": (
        "question: What was the root cause of the checkout outage on March 12, how was it"
        " detected, and what changed after the outage?",
        "What was the root cause of the checkout outage on March 12?",
        "- Root cause: release 4.2 changed the database connection pool of the checkout service"
        " from 50 to 5 connections. (postmortem.txt:2)",
        "How was it detected?",
        "- Detection took 5 minutes because only the error rate was alerted on, not pool"
        " saturation. (postmortem.txt:6)",
        "What changed after the outage?",
        "sources the lead's state holds: postmortem.txt, retry-policy.txt, incident-report.txt",
        "tree:",
    ),
}

# Examples run offline: a provider key in the environment would make real_model.py call out.
_OFFLINE_ENV = {
    key: value
    for key, value in os.environ.items()
    if key not in {"OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OLLAMA_HOST"}
}


def test_examples_exist() -> None:
    names = {path.name for path in EXAMPLES}
    assert "quickstart.py" in names
    assert set(EXPECTED) <= names, f"EXPECTED names a missing example: {set(EXPECTED) - names}"


@pytest.mark.parametrize("path", EXAMPLES, ids=[path.name for path in EXAMPLES])
def test_example_runs(path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(path)],
        cwd=ROOT,
        env=_OFFLINE_ENV,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"{path.name} failed:\n{done.stdout}\n{done.stderr}"
    assert done.stderr == "", f"{path.name} wrote to stderr:\n{done.stderr}"
    lines = [line.strip() for line in done.stdout.splitlines()]
    assert lines, f"{path.name} printed nothing"
    for expected in EXPECTED.get(path.name, ()):
        assert expected in lines, f"{path.name} did not print {expected!r}:\n{done.stdout}"


def test_research_team_asks_a_real_model_only_with_its_key() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "research_team.py"), "--model", "openai:gpt-4o"],
        cwd=ROOT,
        env=_OFFLINE_ENV,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr == (
        "research_team.py: --model openai:gpt-4o needs OPENAI_API_KEY set in the environment.\n"
    )


def test_research_team_replays_offline(tmp_path: Path) -> None:
    """The saved run replays with the agents of `build`: the line the example prints works."""
    store = tmp_path / "runs.db"
    example = [sys.executable, str(ROOT / "examples" / "research_team.py")]
    done = subprocess.run(
        [*example, "--store", str(store), "--latency", "0"],
        cwd=ROOT,
        env=_OFFLINE_ENV,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    (line,) = [line.strip() for line in done.stdout.splitlines() if " replay " in line]
    replay = line.split()[1:]  # without the command's path
    assert replay[-2:] == ["--agents", "examples.research_team:build"]

    again = subprocess.run(
        [sys.executable, "-m", "orchestrator", *replay],
        cwd=ROOT,
        env=_OFFLINE_ENV,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout == (
        "matched: 11 requests of 4 States answered from the recording (1 run of agent 'lead')\n"
    )
