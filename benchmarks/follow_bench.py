"""Following a run from another process (issues 27 and 28): how soon a save is seen.

A writer process saves a State one entry at a time, `gap` seconds apart (a run between two
save points), and notes when each save returned; the follower, in this process, waits with
`await_entries` and notes when it sees each entry. The delay is the difference (both clocks
are the machine's monotonic clock, shared by its processes): p50 and p99.

The tree rows (issue 28: what `Runs.follow` waits with) do the same with a tree: the writer
saves a root and a child started under it in turn, one entry a save, and the follower waits
with `await_tree_entries` on the root, as a follower in another process than the run does.

- SQLite: `SQLiteStore.await_entries` polls the State's entry count, 5 ms apart at first,
  backing off to 100 ms; its floor is a bare loop polling ``SELECT max(seq)`` of a one-column
  table on the same schedule, fed by a writer that commits one row a step.
- PostgreSQL: `PostgresStore.await_entries` LISTENs for the NOTIFY each save sends; its floor
  is a bare ``NOTIFY`` from the writer, received by a bare ``LISTEN`` (no store, no read).
  Skipped without a server (``ORCHESTRATOR_TEST_POSTGRES_DSN``).

``python -m benchmarks.follow_bench [--quick]`` prints the rows; the writer is this module too
(``python -m benchmarks.follow_bench write MODE TARGET STATE_ID COUNT GAP``).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, LiteralString, cast

import anyio

from orchestrator import Message, RunStart, RunStartEntry, State, UserEntry
from stores import PostgresStore, SQLiteStore, open_store
from stores.backend import POLL_FIRST, POLL_MOST

from .report import Metric

__all__ = ("bench_follow", "main")

DSN_VARIABLE = "ORCHESTRATOR_TEST_POSTGRES_DSN"
_CHANNEL = "follow_bench_floor"
_STATE_ID = "followed"
_CHILD_ID = "followed-child"


# -- the writer process --------------------------------------------------------------------------


def _write(mode: str, target: str, state_id: str, count: int, gap: float) -> list[float]:
    """Make `count` saves (or bare commits), `gap` apart; when each returned."""
    returned: list[float] = []
    if mode == "store":
        store = open_store(target)
        try:
            state = store.load(state_id)
            for step in range(count):
                time.sleep(gap)
                state.add_message(Message.user(f"step {step}"))
                store.save(state)
                returned.append(time.monotonic())
        finally:
            if isinstance(store, SQLiteStore | PostgresStore):
                store.close()
    elif mode == "tree":
        store = open_store(target)
        try:
            states = [store.load(state_id), _child(state_id)]
            store.save(states[1])  # before the clock: the child joins the tree
            for step in range(count):
                time.sleep(gap)
                state = states[step % 2]
                state.add_message(Message.user(f"step {step}"))
                store.save(state)
                returned.append(time.monotonic())
        finally:
            if isinstance(store, SQLiteStore | PostgresStore):
                store.close()
    elif mode == "sqlite":
        db = sqlite3.connect(target, isolation_level=None)
        try:
            for step in range(count):
                time.sleep(gap)
                db.execute("INSERT INTO steps VALUES (?)", (step,))
                returned.append(time.monotonic())
        finally:
            db.close()
    else:
        import psycopg

        with psycopg.connect(target, autocommit=True) as connection:
            for step in range(count):
                time.sleep(gap)
                connection.execute(cast("LiteralString", f"NOTIFY {_CHANNEL}, '{step}'"))
                returned.append(time.monotonic())
    return returned


def _child(root_id: str) -> State:
    """A State started by a call of `root_id`: a message, and the run start that links it."""
    now = datetime.now(UTC)
    start = RunStart(parent_id=root_id, parent_call_id="call")
    return State(
        id=_CHILD_ID,
        history=[
            UserEntry(seq=0, turn=0, at=now, content=Message.user("Look there.")),
            RunStartEntry(seq=1, turn=0, at=now, content=start),
        ],
    )


def _writer(mode: str, target: str, count: int, gap: float) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
    command = [sys.executable, "-m", "benchmarks.follow_bench", "write", mode, target]
    return subprocess.Popen(
        [*command, _STATE_ID, str(count), str(gap)], env=env, stdout=subprocess.PIPE
    )


def _returned(process: subprocess.Popen[bytes]) -> list[float]:
    out, _ = process.communicate(timeout=600)
    if process.returncode != 0:
        raise RuntimeError(f"the writer process failed ({process.returncode})")
    return [float(at) for at in json.loads(out)]


def _delays_ms(returned: Sequence[float], seen: Sequence[float]) -> list[float]:
    return sorted((s - r) * 1000 for r, s in zip(returned, seen, strict=True))


# -- the followers ---------------------------------------------------------------------------------


async def _follow_store(store: Any, count: int) -> list[float]:
    """When each of the next `count` entries of the State was seen (`await_entries`)."""
    after = len(await store.aentries(_STATE_ID)) - 1
    seen: list[float] = []
    while len(seen) < count:
        with anyio.fail_after(60):
            new = await store.await_entries(_STATE_ID, after=after)
        now = time.monotonic()
        seen += [now] * len(new)
        after = new[-1].seq
    return seen


async def _follow_tree(store: Any, count: int) -> list[float]:
    """When each of the writer's `count` timed saves of the tree was seen (`await_tree_entries`).

    The feed from its start holds the root's first entries and the child's first save (made
    before the writer's clock starts): those are read, not timed.
    """
    untimed = {_STATE_ID: len(await store.aentries(_STATE_ID)), _CHILD_ID: 2}
    cursor: str | None = None
    seen: list[float] = []
    while len(seen) < count:
        with anyio.fail_after(60):
            new = await store.await_tree_entries(_STATE_ID, after=cursor)
        now = time.monotonic()
        seen += [now for item in new if item.entry.seq >= untimed[item.state_id]]
        cursor = new[-1].cursor
    return seen


def _store_delays(
    store: Any, url: str, count: int, gap: float, *, tree: bool = False
) -> list[float]:
    store.save(State(id=_STATE_ID, messages=[Message.user("Follow me.")]))
    process = _writer("tree" if tree else "store", url, count, gap)
    try:
        seen = anyio.run(_follow_tree if tree else _follow_store, store, count)
    except BaseException:
        process.kill()
        process.communicate()
        raise
    return _delays_ms(_returned(process), seen)


def _sqlite_floor(path: str, count: int, gap: float) -> list[float]:
    """The bare loop: poll ``max(seq)`` on the schedule of `await_entries`, no store."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("CREATE TABLE steps (seq INTEGER)")
    process = _writer("sqlite", path, count, gap)
    seen: list[float] = []
    last, interval = -1, POLL_FIRST
    deadline = time.monotonic() + 60 + count * gap
    try:
        while len(seen) < count and time.monotonic() < deadline:
            (top,) = db.execute("SELECT max(seq) FROM steps").fetchone()
            if top is not None and top > last:
                seen += [time.monotonic()] * (top - last)
                last, interval = top, POLL_FIRST
                continue
            time.sleep(interval)
            interval = min(interval * 2, POLL_MOST)
    finally:
        db.close()
    return _delays_ms(_returned(process), seen)


def _postgres_floor(dsn: str, count: int, gap: float) -> list[float]:
    """A bare NOTIFY from the writer, received by a bare LISTEN: no store, no read."""
    import psycopg

    seen: list[float] = []
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(f"LISTEN {_CHANNEL}")
        process = _writer("postgres", dsn, count, gap)
        for _ in connection.notifies(timeout=60 + count * gap, stop_after=count):
            seen.append(time.monotonic())
    return _delays_ms(_returned(process), seen)


# -- the rows --------------------------------------------------------------------------------------


def _percentile(ordered: Sequence[float], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def _rows(name: str, label: str, delays: Sequence[float], floor: Sequence[float]) -> list[Metric]:
    metrics: list[Metric] = []
    for tag, fraction in (("p50", 0.5), ("p99", 0.99)):
        metrics += [
            Metric(
                f"follow.{name}.{tag}_ms",
                f"follow {label} from another process: save to seen, {tag}",
                _percentile(delays, fraction),
                "ms",
            ),
            Metric(
                f"follow.{name}.floor.{tag}_ms",
                f"  floor: {label} bare {'poll' if name == 'sqlite' else 'NOTIFY'}, {tag}",
                _percentile(floor, fraction),
                "ms",
            ),
        ]
    metrics.append(
        Metric(
            f"follow.{name}.p50.ratio",
            f"  follow {label} p50 / floor p50",
            statistics.median(delays) / max(statistics.median(floor), 1e-6),
            "x",
        )
    )
    return metrics


def _tree_rows(
    name: str, label: str, delays: Sequence[float], floor: Sequence[float]
) -> list[Metric]:
    """The tree's delays, p50 and p99, and p50 over the floor's (the State rows give it)."""
    metrics = [
        Metric(
            f"follow.{name}.tree.{tag}_ms",
            f"follow a tree in {label} from another process (await_tree_entries), {tag}",
            _percentile(delays, fraction),
            "ms",
        )
        for tag, fraction in (("p50", 0.5), ("p99", 0.99))
    ]
    metrics.append(
        Metric(
            f"follow.{name}.tree.p50.ratio",
            f"  follow a tree in {label} p50 / floor p50",
            statistics.median(delays) / max(statistics.median(floor), 1e-6),
            "x",
        )
    )
    return metrics


def bench_follow(
    *, count: int = 200, gap: float = 0.03, progress: Callable[[str], None] = lambda text: None
) -> list[Metric]:
    """The rows of SQLite, and of PostgreSQL when a server is there."""
    metrics: list[Metric] = []
    with tempfile.TemporaryDirectory() as folder:
        progress(f"follow: SQLite, {count} saves {gap * 1000:.0f} ms apart ...")
        with SQLiteStore(Path(folder) / "follow.db") as store:
            delays = _store_delays(store, store.url, count, gap)
        with SQLiteStore(Path(folder) / "tree.db") as store:
            tree = _store_delays(store, store.url, count, gap, tree=True)
        floor = _sqlite_floor(str(Path(folder) / "floor.db"), count, gap)
        metrics += _rows("sqlite", "SQLite", delays, floor)
        metrics += _tree_rows("sqlite", "SQLite", tree, floor)
    dsn = os.environ.get(DSN_VARIABLE)
    if not dsn:
        print(f"follow: PostgreSQL rows skipped: no server ({DSN_VARIABLE} is not set).")
        return metrics
    progress(f"follow: PostgreSQL, {count} saves {gap * 1000:.0f} ms apart ...")
    delays = _postgres_delays(dsn, count, gap, tree=False)
    tree = _postgres_delays(dsn, count, gap, tree=True)
    floor = _postgres_floor(dsn, count, gap)
    metrics += _rows("postgres", "PostgreSQL", delays, floor)
    return metrics + _tree_rows("postgres", "PostgreSQL", tree, floor)


def _postgres_delays(dsn: str, count: int, gap: float, *, tree: bool) -> list[float]:
    """`_store_delays` on a store in a schema of its own, dropped afterwards."""
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    store = PostgresStore(dsn, schema=schema)
    try:
        url = store.url
        assert url is not None
        return _store_delays(store, url, count, gap, tree=tree)
    finally:
        store.close()
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as connection:
            connection.execute(cast("LiteralString", f"DROP SCHEMA IF EXISTS {schema} CASCADE"))


def main(argv: Sequence[str] | None = None) -> int:
    """Print the rows (or, as ``write ...``, be the writer process)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["write"]:
        mode, target, state_id, count, gap = args[1:6]
        returned = _write(mode, target, state_id, int(count), float(gap))
        sys.stdout.write(json.dumps(returned))
        return 0
    parser = argparse.ArgumentParser(prog="python -m benchmarks.follow_bench")
    parser.add_argument("--quick", action="store_true", help="a few saves, to check it runs")
    quick = parser.parse_args(args).quick
    for metric in bench_follow(count=10 if quick else 200, gap=0.02 if quick else 0.03):
        sys.stdout.write(f"{metric.label:<70} {metric.value:10.2f} {metric.unit}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
