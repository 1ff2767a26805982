"""Runner benchmarks (issue 15): RayRunner on a local Ray cluster, beside LocalRunner.

Ray binds to the machine's external interface, so these run inside a loopback-only network
namespace: ``python -m benchmarks`` starts ``scripts/in_netns.sh python -m benchmarks.ray_bench``
and reads the rows it prints (JSON); where a namespace cannot be made, the rows are skipped
with a line saying so. The shared store is an SQLite file (PostgreSQL listens outside the
namespace). The children are the contract's agents (`orchestrator.runners.contract`).

- dispatch overhead per remote child: children run one at a time, each answering at once; the
  parent's wall time of one child minus the child's own run on the worker (its first to its
  last history entry). Its floor, in the same run: the same measure for `LocalRunner`.
- fan-out: a lead whose 100 children take 3 turns each, on 2 actors, and the same with
  `LocalRunner` (wall time of each), with the children's concurrency (the most whose runs
  overlapped, from their histories).
- resume after a crash: a lead whose 5 children answered and 5 were cut off waiting, copied at
  the crash, run again: its model requests, against the count with nothing finished asked
  again (the lead 1, each cut-off child 1).
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from orchestrator import Agent, Link, Message, State, ToolCall, ToolResultEntry
from orchestrator.runners import ChildJob, LocalRunner, RayRunner, Runner
from orchestrator.runners.contract import REGISTRY, child, crash_during
from orchestrator.testing import FakeModel
from stores import SQLiteStore

from .report import Metric

__all__ = ("bench_ray", "measure")

ROOT = Path(__file__).resolve().parent.parent


def _child_seconds(state: State) -> float:
    """The child's own run: from its first history entry to its last."""
    history = state.history
    return (history[-1].at - history[0].at).total_seconds()


async def _dispatch(runner: Runner, store: Any, count: int) -> list[float]:
    """Per child, the parent's wall seconds minus the child's own run, one child at a time."""
    agent = child(store)
    overheads: list[float] = []
    for index in range(count):
        state_id = uuid.uuid4().hex
        job = ChildJob(
            agent=agent,
            link=Link(parent_id="bench", call_id=f"call_{index}", scope=f"bench:1:{index}/0"),
            state_id=state_id,
            task="answer at once",
            store=store,
        )
        runner.check(job)
        start = time.perf_counter()
        state = await runner.run(job)
        overheads.append(time.perf_counter() - start - _child_seconds(state))
    return overheads


def _lead(store: Any, runner: Runner, tasks: list[str]) -> Agent:
    calls = [ToolCall(f"call_{n}", "contract_child", {"task": t}) for n, t in enumerate(tasks)]
    return Agent(
        FakeModel([calls, "done"]),
        name="contract_lead",
        tools=[child(store)],
        store=store,
        runner=runner,
    )


def _concurrency(store: Any, lead: State) -> int:
    """The most children whose runs overlapped (from their histories)."""
    events: list[tuple[float, int]] = []
    for entry in lead.history:
        if isinstance(entry, ToolResultEntry):
            for child_id in entry.child_ids:
                history = store.load(child_id).history
                events += [(history[0].at.timestamp(), 1), (history[-1].at.timestamp(), -1)]
    running = peak = 0
    for _, step in sorted(events):
        running += step
        peak = max(peak, running)
    return peak


async def _fanout(runner: Runner, store: Any, children: int) -> tuple[float, int]:
    """Wall seconds of a lead with `children` children x 3 turns; their concurrency."""
    state = State(messages=[Message.user("go")])
    start = time.perf_counter()
    await _lead(store, runner, ["turns 3"] * children).arun(state)
    elapsed = time.perf_counter() - start
    return elapsed, _concurrency(store, state)


def _needed(task: str) -> int:
    """The model requests a contract child's whole run takes for `task`."""
    verb, _, arg = task.partition(" ")
    return int(arg) if verb == "turns" else 2


async def _resume(runner: Runner, folder: Path, children: int) -> tuple[int, int, float]:
    """Model requests of the resumed tree, what its unfinished work needs, seconds.

    Needed: the lead's next request, and each cut-off child's requests not made before the
    crash. Anything more would be finished work asked again.
    """
    db, after = folder / "crash.db", folder / "after.db"
    markers = [folder / f"wait{n}" for n in range(children)]
    tasks = ["turns 1"] * children + [f"wait {marker}" for marker in markers]
    state = State(messages=[Message.user("go")])

    async def cut() -> None:
        with anyio.fail_after(120):
            while not all(marker.exists() and marker.read_text() for marker in markers):  # noqa: ASYNC110
                await anyio.sleep(0.02)

    await crash_during(_lead(SQLiteStore(db), runner, tasks), state, db, after, cut)
    store = SQLiteStore(after)
    loaded = store.load(state.id)
    needed = 1
    for entry in loaded.history:
        if isinstance(entry, ToolResultEntry) and entry.outcome == "unknown":
            for child_id in entry.child_ids:
                kid = store.load(child_id)
                needed += _needed(kid.messages[0].text) - kid.usage.requests
    before = loaded.usage.requests
    again = Agent(
        FakeModel(["done"]),
        name="contract_lead",
        tools=[child(store)],
        store=store,
        runner=runner,
    )
    start = time.perf_counter()
    await again.arun(loaded)
    elapsed = time.perf_counter() - start
    return loaded.usage.requests - before, needed, elapsed


def measure(quick: bool) -> list[dict[str, Any]]:
    """Start a local cluster, run each benchmark, return the rows (inside the namespace)."""
    ray: Any = importlib.import_module("ray")  # its stubs are partly untyped

    dispatches, children, crash = (10, 20, 2) if quick else (200, 100, 5)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=80 * 1024 * 1024,
        log_to_driver=False,
    )
    rows: list[dict[str, Any]] = []
    ray_runner = RayRunner(REGISTRY, actors=2)
    try:
        with tempfile.TemporaryDirectory() as name:
            folder = Path(name)
            store = SQLiteStore(folder / "runs.db")
            anyio.run(_dispatch, ray_runner, store, 5)  # starts the actors, opens their stores
            remote = anyio.run(_dispatch, ray_runner, store, dispatches)
            local = anyio.run(_dispatch, LocalRunner(), store, dispatches)
            rows.append(
                {
                    "key": "runners.ray.dispatch_ms",
                    "label": f"RayRunner: dispatch overhead per child (median of {dispatches})",
                    "value": statistics.median(remote) * 1000,
                    "unit": "ms",
                    "target": "≤ 5 ms",
                    "ok": statistics.median(remote) * 1000 <= 5,
                }
            )
            rows.append(
                {
                    "key": "runners.local.dispatch_ms",
                    "label": "  floor: LocalRunner, the same measure",
                    "value": statistics.median(local) * 1000,
                    "unit": "ms",
                }
            )
            for name_, runner in (("ray", ray_runner), ("local", LocalRunner())):
                seconds, peak = anyio.run(_fanout, runner, store, children)
                where = "RayRunner, 2 actors" if name_ == "ray" else "LocalRunner"
                rows.append(
                    {
                        "key": f"runners.{name_}.fanout_s",
                        "label": f"{where}: {children} children x 3 turns, wall",
                        "value": seconds,
                        "unit": "s",
                    }
                )
                rows.append(
                    {
                        "key": f"runners.{name_}.fanout_concurrency",
                        "label": f"  {where}: children running at once (peak)",
                        "value": peak,
                        "unit": "children",
                    }
                )
            made, floor, seconds = anyio.run(_resume, ray_runner, folder, crash)
            rows.append(
                {
                    "key": "runners.ray.resume_requests",
                    "label": f"RayRunner: resume after a crash ({crash} done, {crash} cut off),"
                    " model requests",
                    "value": made,
                    "unit": "requests",
                    "target": f"= {floor}, what the unfinished work needs",
                    "ok": made == floor,
                }
            )
            rows.append(
                {
                    "key": "runners.ray.resume_s",
                    "label": "  RayRunner: that resume, wall",
                    "value": seconds,
                    "unit": "s",
                }
            )
    finally:
        ray_runner.shutdown()
        ray.shutdown()
    return rows


def bench_ray(quick: bool, progress: Callable[[str], None]) -> list[Metric]:
    """The rows of `measure`, run in a loopback-only namespace; none (said) if it cannot be."""
    progress("runners (Ray, in a loopback-only network namespace) ...")
    command = [str(ROOT / "scripts" / "in_netns.sh"), sys.executable, "-m", "benchmarks.ray_bench"]
    done = subprocess.run(
        [*command, *(["--quick"] if quick else [])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        progress(f"runners: skipped, the namespace run failed: {last}")
        return []
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    return [Metric(**row) for row in rows]


def main() -> None:
    """Inside the namespace: print the rows as one JSON line."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ray_bench")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(json.dumps(measure(args.quick)))


if __name__ == "__main__":
    main()
