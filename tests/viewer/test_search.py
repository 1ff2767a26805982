"""Search and filters over the runs of a store: ``/api/runs?q=&agent=&status=&since=&until=``."""

from __future__ import annotations

import json
from datetime import timedelta
from http import HTTPStatus

import pytest

from orchestrator import Agent, Message, State
from orchestrator._viewing._search import RunFilter  # private: under test
from orchestrator._viewing._viewer import Viewer, viewer_answer  # private: under test
from orchestrator.testing import FakeModel, tool_call
from stores import MemoryStore


@pytest.fixture
def viewer() -> Viewer:
    store = MemoryStore()
    refunds = Agent(FakeModel(["Twice.", "None."]), name="refunds", store=store)
    refunds.run(State(id="r1", messages=[Message.user("Why are refunds paid twice?")]))
    looper = Agent(FakeModel([tool_call("nothing")] * 3), name="looper", store=store, max_turns=1)
    looper.run(State(id="l1", messages=[Message.user("Loop on invoices")]))
    refunds.run(State(id="r2", messages=[Message.user("Which invoices failed?")]))
    return Viewer(store, "memory")


def ids(viewer: Viewer, query: str) -> list[str]:
    return sorted(run["id"] for run in viewer.runs(where=RunFilter.parse(query))["runs"])


def test_no_filter_lists_every_run(viewer: Viewer) -> None:
    assert ids(viewer, "") == ["l1", "r1", "r2"]


def test_text_is_found_in_titles_ignoring_case(viewer: Viewer) -> None:
    assert ids(viewer, "q=INVOICES") == ["l1", "r2"]
    assert ids(viewer, "q=paid+twice") == ["r1"]
    assert ids(viewer, "q=nowhere") == []


def test_agent_and_status_filter_and_combine(viewer: Viewer) -> None:
    assert ids(viewer, "agent=refunds") == ["r1", "r2"]
    assert ids(viewer, "status=turn+limit") == ["l1"]
    assert ids(viewer, "status=answered&q=invoices") == ["r2"]
    assert viewer.runs(where=RunFilter.parse("agent=refunds"))["total"] == 2


def test_since_and_until_bound_the_last_update(viewer: Viewer) -> None:
    second = viewer.store.load("l1").updated_at
    assert second is not None
    assert ids(viewer, f"since={second.isoformat()}".replace("+", "%2B")) == ["l1", "r2"]
    before = (second - timedelta(microseconds=1)).isoformat().replace("+", "%2B")
    assert ids(viewer, f"until={before}") == ["r1"]
    day = second.date()
    assert ids(viewer, f"since={day}&until={day}") == ["l1", "r1", "r2"]  # the whole day
    assert ids(viewer, f"until={day - timedelta(days=1)}") == []


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("since=yesterday", "since must be an ISO date or time"),
        ("until=2026-13-01", "until must be an ISO date or time"),
        ("who=ann", "Unknown filter 'who'"),
    ],
)
def test_a_bad_filter_is_answered_with_how_to_write_it(
    viewer: Viewer, query: str, said: str
) -> None:
    status, _, body = viewer_answer(viewer, "/api/runs", query)

    assert status == HTTPStatus.UNPROCESSABLE_ENTITY
    assert said in json.loads(body)["error"]
