"""The viewer and `orchestrator show` on a tree of about 10,000 entries (issue 30).

A lead asks a researcher one task per turn; each researcher runs many turns of a tool that does
nothing, all saved in SQLite. Each number stands beside its floor, measured in the same run:

- ``/api/runs/ID`` (the tree and its timeline, in process) beside reading the tree from the
  store (`read_tree`: every State loaded, each under its call), which it cannot go below;
- ``orchestrator show`` of the lead, a new process, beside ``show`` of a one-entry State (the
  interpreter, the imports and the store opening);
- the JSON a State's page reads (``/api/states/ID``) of the lead and of one researcher (its
  model requests with the messages each sent) beside the history it carries, which it holds
  whole and cannot go below;
- the first paint of the run in headless chromium (from navigation to the page's
  ``orchestrator:drawn`` performance mark: runs, tree, timeline and the lead drawn) beside the
  same page on a one-entry store. Without chromium that row is left out and says so.
"""

from __future__ import annotations

import gc
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator import Agent, Message, State, tool
from orchestrator._viewing._jsontext import dumps  # the viewer's JSON, as it is served
from orchestrator._viewing._reading import read_tree  # the viewer's own reading, in process
from orchestrator._viewing._viewer import Viewer, running
from orchestrator.testing import FakeModel, tool_call
from stores import SQLiteStore

from .report import Metric

__all__ = ("bench_viewer",)

_ROOT = Path(__file__).resolve().parent.parent
_DRAWN = "performance.getEntriesByName('orchestrator:drawn').length > 0"


@tool
async def noop(x: int) -> str:
    """Do nothing."""
    return "ok"


def _build(path: Path, children: int, turns: int) -> tuple[str, int]:
    """Save the tree in `path`; return the lead's id and the tree's number of entries."""
    replies: list[Any] = ([tool_call("noop", x=i) for i in range(turns)] + ["found"]) * children
    researcher = Agent(FakeModel(replies), tools=[noop], name="researcher", max_turns=turns + 1)
    lead_replies: list[Any] = [tool_call("researcher", task=f"task {i}") for i in range(children)]
    with SQLiteStore(path) as store:
        lead = Agent(
            FakeModel([*lead_replies, "done"]),
            tools=[researcher.as_tool(description="Research a task.")],
            name="lead",
            store=store,
            max_turns=children + 1,
        )
        state = State(messages=[Message.user("Research it all")])
        lead.run(state)
        entries = sum(len(store.load(info.id).history) for info in store.list())
    return state.id, entries


def _tiny(path: Path) -> str:
    with SQLiteStore(path) as store:
        state = State(messages=[Message.user("hello")])
        Agent(FakeModel(["hi"]), name="lead", store=store).run(state)
    return state.id


def _best(work: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best


def _show(path: Path, state_id: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "orchestrator", "show", str(path), state_id],
        cwd=_ROOT,
        capture_output=True,
        check=True,
        timeout=120,
    )


def _sizes(viewer: Viewer, state_id: str) -> tuple[int, int]:
    """The bytes of ``/api/states/ID`` and of the history in it."""
    data = viewer.state(state_id)
    return len(dumps(data)), len(dumps(data["history"]))


def _paint(path: Path, repeats: int) -> float | None:
    """The best first paint of the newest run of `path`, in ms, or None without chromium."""
    if shutil.which("chromium") is None:
        return None
    sys.path.insert(0, str(_ROOT))
    from tests.viewer.cdp import Browser  # the tests' DevTools client, over a pipe

    best = float("inf")
    with SQLiteStore(path) as store, running(Viewer(store, path.name)) as server:
        for _ in range(repeats):
            with Browser(width=1400, height=1000, timeout=120) as browser:
                browser.open(server.url, _DRAWN)
                drawn = browser.evaluate(
                    "performance.getEntriesByName('orchestrator:drawn')[0].startTime"
                )
                best = min(best, float(json.dumps(drawn)))
    return best


def bench_viewer(
    children: int, turns: int, repeats: int, progress: Callable[[str], None]
) -> list[Metric]:
    """The viewer's API and first paint, and `show`, on a tree of `children` x `turns` turns."""
    with tempfile.TemporaryDirectory(prefix="orchestrator-viewer-bench-") as folder:
        big, small = Path(folder) / "tree.db", Path(folder) / "tiny.db"
        progress(f"viewer: saving a tree of {children} x {turns} turns ...")
        lead_id, entries = _build(big, children, turns)
        tiny_id = _tiny(small)
        with SQLiteStore(big) as store:
            viewer = Viewer(store, big.name)
            infos = store.list()
            (root,) = [info for info in infos if info.id == lead_id]
            loads = _best(lambda: read_tree(store, root), repeats)
            api = _best(lambda: viewer.run(lead_id), repeats)
            researcher = store.load(lead_id).children[0]
            sizes = {
                who: _sizes(viewer, state_id)
                for who, state_id in (("lead", lead_id), ("researcher", researcher))
            }
        progress("viewer: orchestrator show ...")
        show = _best(lambda: _show(big, lead_id), repeats)
        show_floor = _best(lambda: _show(small, tiny_id), repeats)
        progress("viewer: first paint in chromium ...")
        paint = _paint(big, repeats)
        paint_floor = _paint(small, repeats)
    label = f"{entries:,}-entry tree, {len(infos)} States"
    metrics = [
        Metric(
            "viewer.load_tree.floor.ms",
            f"read the tree (read_tree) of a {label}",
            loads * 1e3,
            "ms",
        ),
        Metric(
            "viewer.api_run.ms", f"/api/runs/ID (tree + timeline) of a {label}", api * 1e3, "ms"
        ),
        Metric(
            "viewer.show.floor.ms",
            "orchestrator show of a 1-entry State (process)",
            show_floor * 1e3,
            "ms",
        ),
        Metric("viewer.show.ms", f"orchestrator show of the lead of a {label}", show * 1e3, "ms"),
    ]
    for who, (whole, history) in sizes.items():
        metrics += [
            Metric(
                f"viewer.state_json.{who}.floor.kb",
                f"/api/states/ID of the {who}: its history alone",
                history / 1024,
                "KB",
            ),
            Metric(
                f"viewer.state_json.{who}.kb",
                f"/api/states/ID of the {who} (model requests with their messages)",
                whole / 1024,
                "KB",
            ),
        ]
    if paint is not None and paint_floor is not None:
        metrics += [
            Metric(
                "viewer.paint.floor.ms", "first paint, a 1-entry run (chromium)", paint_floor, "ms"
            ),
            Metric("viewer.paint.ms", f"first paint of a {label} (chromium)", paint, "ms"),
        ]
    else:
        progress("viewer: no chromium, the first paint rows are left out")
    return metrics
