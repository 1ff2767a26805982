"""Following a run from another process (issue 27, part 3): how soon a save is seen.

A writer process saves a State one entry at a time, `gap` seconds apart (a run between two
save points), and notes when each save returned; the follower, in this process, waits with
`await_entries` and notes when it sees each entry. The delay is the difference (both clocks
are the machine's monotonic clock, shared by its processes): p50 and p99.

- SQLite: `SQLiteStore.await_entries` polls the State's entry count, 5 ms apart at first,
  backing off to 100 ms; its floor is a bare loop polling ``SELECT max(seq)`` of a one-column
  table on the same schedule, fed by a writer that commits one row a step.
- PostgreSQL: `PostgresStore.await_entries` LISTENs for the NOTIFY each save sends; its floor
  is a bare ``NOTIFY`` from the writer, received by a bare ``LISTEN`` (no store, no read).
  Skipped without a server (``ORCHESTRATOR_TEST_POSTGRES_DSN``).
- A tree (issue 28): the writer saves a child of a root, the follower waits on the root's
  feed (`await_tree_entries`): the delay of the feed against the same floor. And what one look
  of a SQLite follower costs in a big store: a tree of a root and 1,000 children among other
  trees of 100,000 entries, its probe (the tree's last position) and an empty page after its
  last cursor (median): an index lookup each, whatever the size of the table.

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
from stores._sql import tree_end_plan
from stores.backend import POLL_FIRST, POLL_MOST

from .report import Metric

__all__ = ("bench_follow", "main")

DSN_VARIABLE = "ORCHESTRATOR_TEST_POSTGRES_DSN"
_CHANNEL = "follow_bench_floor"
_STATE_ID = "followed"
_ROOT_ID = "tree-root"
_CHILD_ID = "tree-child"


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


def _writer(
    mode: str, target: str, count: int, gap: float, state_id: str = _STATE_ID
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
    command = [sys.executable, "-m", "benchmarks.follow_bench", "write", mode, target]
    return subprocess.Popen(
        [*command, state_id, str(count), str(gap)], env=env, stdout=subprocess.PIPE
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


def _store_delays(store: Any, url: str, count: int, gap: float) -> list[float]:
    store.save(State(id=_STATE_ID, messages=[Message.user("Follow me.")]))
    process = _writer("store", url, count, gap)
    try:
        seen = anyio.run(_follow_store, store, count)
    except BaseException:
        process.kill()
        process.communicate()
        raise
    return _delays_ms(_returned(process), seen)


def _child(state_id: str) -> State:
    """A State started by a call of the root: a message and its link."""
    return State(
        id=state_id,
        history=[
            UserEntry(seq=0, turn=0, at=datetime.now(UTC), content=Message.user("A child.")),
            RunStartEntry(
                seq=1,
                turn=0,
                at=datetime.now(UTC),
                content=RunStart(parent_id=_ROOT_ID, parent_call_id="call"),
            ),
        ],
    )


async def _follow_tree(store: Any, count: int) -> list[float]:
    """When each of the next `count` entries of the tree was seen (`await_tree_entries`)."""
    after = (await store.atree_entries(_ROOT_ID))[-1].cursor
    seen: list[float] = []
    while len(seen) < count:
        with anyio.fail_after(60):
            new = await store.await_tree_entries(_ROOT_ID, after=after)
        now = time.monotonic()
        seen += [now] * len(new)
        after = new[-1].cursor
    return seen


def _tree_delays(store: Any, url: str, count: int, gap: float) -> list[float]:
    """A child of a root saved in another process, followed through the root's feed."""
    store.save(State(id=_ROOT_ID, messages=[Message.user("Follow the tree.")]))
    store.save(_child(_CHILD_ID))
    process = _writer("store", url, count, gap, _CHILD_ID)
    try:
        seen = anyio.run(_follow_tree, store, count)
    except BaseException:
        process.kill()
        process.communicate()
        raise
    return _delays_ms(_returned(process), seen)


def _poll_costs(path: Path, children: int, others: int) -> tuple[float, float]:
    """The probe and the empty page of a follower of a big tree in a big store, in us."""
    with SQLiteStore(path) as store:
        store.save(State(id=_ROOT_ID, messages=[Message.user("A big tree.")]))
        store.save_many([_child(f"kid{k}") for k in range(children)])
        for r in range(others):
            other = State(id=f"other{r}", messages=[Message.user("Another tree.")])
            for i in range(999):
                other.add_message(Message.user(f"step {i}"))
            store.save(other)
        last = store.tree_entries(_ROOT_ID)[-1].cursor
        probes: list[float] = []
        pages: list[float] = []
        for _ in range(300):
            start = time.perf_counter()
            store._run(tree_end_plan(_ROOT_ID))  # pyright: ignore[reportPrivateUsage]
            middle = time.perf_counter()
            store.tree_entries(_ROOT_ID, after=last)
            probes.append(middle - start)
            pages.append(time.perf_counter() - middle)
    return statistics.median(probes) * 1e6, statistics.median(pages) * 1e6


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


def _tree_rows(
    name: str, label: str, delays: Sequence[float], floor: Sequence[float]
) -> list[Metric]:
    metrics = [
        Metric(
            f"follow.tree.{name}.{tag}_ms",
            f"follow a tree on {label} from another process: a child's save to seen, {tag}",
            _percentile(delays, fraction),
            "ms",
        )
        for tag, fraction in (("p50", 0.5), ("p99", 0.99))
    ]
    metrics.append(
        Metric(
            f"follow.tree.{name}.p50.ratio",
            f"  follow a tree on {label} p50 / floor p50",
            statistics.median(delays) / max(statistics.median(floor), 1e-6),
            "x",
        )
    )
    return metrics


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


def bench_follow(
    *, count: int = 200, gap: float = 0.03, progress: Callable[[str], None] = lambda text: None
) -> list[Metric]:
    """The rows of SQLite, and of PostgreSQL when a server is there."""
    metrics: list[Metric] = []
    with tempfile.TemporaryDirectory() as folder:
        progress(f"follow: SQLite, {count} saves {gap * 1000:.0f} ms apart ...")
        with SQLiteStore(Path(folder) / "follow.db") as store:
            delays = _store_delays(store, store.url, count, gap)
            progress(f"follow: a tree on SQLite, {count} saves {gap * 1000:.0f} ms apart ...")
            tree = _tree_delays(store, store.url, count, gap)
        floor = _sqlite_floor(str(Path(folder) / "floor.db"), count, gap)
        metrics += _rows("sqlite", "SQLite", delays, floor)
        metrics += _tree_rows("sqlite", "SQLite", tree, floor)
        others = 100 if count >= 100 else 2
        progress(f"follow: one look at a 1,001-State tree among {others * 1000:,} entries ...")
        probe, page = _poll_costs(Path(folder) / "big.db", 1000, others)
        metrics += [
            Metric(
                "follow.tree.sqlite.probe_us",
                f"  a tree follower's probe, SQLite, 1,001 States among {others * 1000:,} entries",
                probe,
                "µs",
            ),
            Metric(
                "follow.tree.sqlite.empty_page_us",
                "  its read of an empty page after its last cursor",
                page,
                "µs",
            ),
        ]
    dsn = os.environ.get(DSN_VARIABLE)
    if not dsn:
        print(f"follow: PostgreSQL rows skipped: no server ({DSN_VARIABLE} is not set).")
        return metrics
    progress(f"follow: PostgreSQL, {count} saves {gap * 1000:.0f} ms apart ...")
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    store = PostgresStore(dsn, schema=schema)
    try:
        url = store.url
        assert url is not None
        delays = _store_delays(store, url, count, gap)
        progress(f"follow: a tree on PostgreSQL, {count} saves {gap * 1000:.0f} ms apart ...")
        tree = _tree_delays(store, url, count, gap)
    finally:
        store.close()
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as connection:
            connection.execute(cast("LiteralString", f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
    floor = _postgres_floor(dsn, count, gap)
    return [
        *metrics,
        *_rows("postgres", "PostgreSQL", delays, floor),
        *_tree_rows("postgres", "PostgreSQL", tree, floor),
    ]


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
