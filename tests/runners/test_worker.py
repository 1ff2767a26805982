"""The worker side of RayRunner, without Ray: a `ChildWorker` runs a `RayJob` here.

What a Ray actor does on a worker (open the store by URL, rebuild the agent from the registry,
run the child linked to its call) is plain code; these tests run it in this process.
"""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path

import pytest

from orchestrator import Agent, Link, ToolResultEntry
from orchestrator.runners._ray import ChildWorker, RayJob, load_registry
from orchestrator.runners.contract import REGISTRY
from orchestrator.testing import FakeModel
from stores import SQLiteStore

pytestmark = pytest.mark.anyio

LINK = Link(parent_id="lead", call_id="call_1", scope="lead:1:call_1/0")


def job(store: SQLiteStore, task: str | None, deadline: float | None = None) -> RayJob:
    return RayJob(
        agent="contract_child",
        link=LINK,
        state_id="kid",
        task=task,
        store_url=store.url,
        deadline=deadline,
    )


async def test_a_job_runs_its_child_linked_and_saved_in_the_store_of_its_url(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    assert await ChildWorker(REGISTRY).run(job(store, "turns 2")) is None
    child = store.load("kid")
    assert (child.parent_id, child.parent_call_id) == ("lead", "call_1")
    assert child.answer == "answer to turns 2"
    assert child.usage.requests == 2


async def test_a_failing_child_is_saved_and_its_error_returned_as_text(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    failed = await ChildWorker(REGISTRY).run(job(store, "fail"))
    assert failed == "RuntimeError: the model is down"
    assert [entry.kind for entry in store.load("kid").history][-1] == "error"


async def test_a_child_stops_at_the_deadline_of_its_job(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    marker = tmp_path / "waiting"
    worker = ChildWorker(REGISTRY)
    assert await worker.run(job(store, f"wait {marker}", deadline=time.time() + 1)) is None
    results = [e for e in store.load("kid").history if isinstance(e, ToolResultEntry)]
    assert [r.outcome for r in results] == ["interrupted"]
    assert marker.exists()


async def test_a_continued_child_goes_on_from_its_stored_history(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    worker = ChildWorker(REGISTRY)
    marker = tmp_path / "waiting"
    await worker.run(job(store, f"wait {marker}", deadline=time.time() + 1))
    assert await worker.run(job(store, None)) is None  # task None: continue `kid`
    child = store.load("kid")
    assert child.answer == f"answer to wait {marker}"
    assert child.usage.requests == 2


def test_a_registry_must_give_named_agents(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("registry_under_test")
    monkeypatch.setitem(sys.modules, "registry_under_test", module)
    with pytest.raises(TypeError, match="has no function 'agents'"):
        load_registry("registry_under_test", None)
    module.build = lambda store: {"a": Agent(FakeModel([]), name="a")}  # type: ignore[attr-defined]
    assert list(load_registry("registry_under_test:build", None)) == ["a"]
    module.agents = lambda store: [Agent(FakeModel([]))]  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="each item must be an Agent with a name"):
        load_registry("registry_under_test", None)
    module.agents = lambda store: 3  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="must return a list of Agents"):
        load_registry("registry_under_test", None)
