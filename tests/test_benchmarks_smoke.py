"""The benchmarks still run: each benchmark at a tiny size, and the CLI once with --quick.

No timing is asserted here: the numbers are for `make bench` to print, not for the test suite.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import sqlite3
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from benchmarks import __main__ as cli
from benchmarks import peak_rss
from benchmarks.exchange import Counter, agent_seconds, floor_seconds
from benchmarks.inside_bench import SQLiteFloor, bench_inside, paired, save_points
from benchmarks.limits_bench import bench_limits
from benchmarks.mcp_bench import bench_mcp
from benchmarks.otel_bench import bench_otel
from benchmarks.report import Metric, Previous, format_change, load_previous, render, save
from benchmarks.state_bench import (
    bench_materialize,
    bench_memory,
    bench_recording,
    bench_replay,
    best_of,
)
from benchmarks.viewer_bench import bench_viewer
from benchmarks.workload import Recorded, build_history, record_turn
from orchestrator import State
from stores import decode_entry

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def recorded() -> Recorded:
    return build_history(300)


def check(metrics: list[Metric], keys: set[str]) -> dict[str, Metric]:
    by_key = {m.key: m for m in metrics}
    assert set(by_key) == keys
    for m in metrics:
        assert isinstance(m.value, float | int)
        assert math.isfinite(m.value)
        assert m.value > 0, m
        assert m.label
        assert m.unit
    return by_key


def test_record_turn_counts_what_it_records() -> None:
    state = State()
    for turn in range(12):
        before = len(state.history)
        added = record_turn(state, turn)
        assert added == len(state.history) - before
        assert state.pending_calls == ()
    kinds = {entry.kind for entry in state.history}
    assert kinds == {"user", "model_request", "model_reply", "tool_result", "extra_data"}


def test_build_history_ends_turns_where_it_says(recorded: Recorded) -> None:
    assert len(recorded.history) >= 300
    assert list(recorded.turn_ends) == sorted(set(recorded.turn_ends))
    assert recorded.turn_ends[-1] == len(recorded.history)
    prefix, next_turn = recorded.closed_prefix(150)
    assert len(prefix) >= 150
    assert len(prefix) in recorded.turn_ends
    state = State(history=prefix)
    assert state.pending_calls == ()
    assert state.turn == next_turn
    with pytest.raises(ValueError, match="fewer than"):
        recorded.closed_prefix(len(recorded.history) + 1)


def test_best_of_takes_the_smallest() -> None:
    results = iter([3.0, 1.0, 2.0])
    assert best_of(3, lambda: next(results)) == 1.0
    with pytest.raises(ValueError, match="at least 1"):
        best_of(0, lambda: 1.0)


def test_bench_replay(recorded: Recorded) -> None:
    metrics = check(
        bench_replay(recorded, (100, 200), repeats=1),
        {
            "replay.100.seconds",
            "replay.100.us_per_entry",
            "replay.200.seconds",
            "replay.200.us_per_entry",
            "replay.ratio",
        },
    )
    seconds = metrics["replay.200.seconds"].value
    assert metrics["replay.200.us_per_entry"].value == pytest.approx(seconds / 200 * 1e6)
    assert metrics["replay.ratio"].target is not None
    assert metrics["replay.ratio"].ok is not None
    assert metrics["replay.200.seconds"].target is None  # only the 100,000 size has a target


def test_bench_recording(recorded: Recorded) -> None:
    metrics = check(
        bench_recording(recorded, (50, 200), batch=40, repeats=1),
        {
            "record.at_50.us_per_entry",
            "record.user.at_50.us_per_entry",
            "record.at_200.us_per_entry",
            "record.user.at_200.us_per_entry",
            "record.ratio",
        },
    )
    assert metrics["record.ratio"].value == pytest.approx(
        metrics["record.at_200.us_per_entry"].value / metrics["record.at_50.us_per_entry"].value
    )


def test_bench_memory() -> None:
    metrics = check(
        bench_memory(100),
        {
            "memory.user.bytes_per_entry",
            "memory.tool_result.bytes_per_entry",
            "memory.mix.bytes_per_entry",
        },
    )
    for m in metrics.values():
        assert 50 < m.value < 100_000, m  # an entry holds real objects, not megabytes


def test_bench_materialize(recorded: Recorded) -> None:
    check(
        bench_materialize(recorded, 200, repeats=1),
        {
            "read.snapshot.at_200.ms",
            "read.messages.at_200.ms",
            "read.history.at_200.ms",
            "read.snapshot_cached.at_200.us",
        },
    )


def test_results_round_trip_and_table(tmp_path: Path) -> None:
    path = tmp_path / "results" / "latest.json"
    assert load_previous(path) is None
    metrics = [
        Metric("a", "first", 2.0, "s", target="< 1 s", ok=False),
        Metric("b", "second", 0.5, "x"),
    ]
    save(path, metrics)
    payload = json.loads(path.read_text(encoding="utf-8"))
    assert payload["metrics"]["a"] == {"label": "first", "value": 2.0, "unit": "s"}
    previous = load_previous(path)
    assert previous is not None
    assert previous.values == {"a": 2.0, "b": 0.5}

    table = render([Metric("a", "first", 3.0, "s", target="< 1 s", ok=False)], previous)
    row = next(line for line in table.splitlines() if line.startswith("first"))
    assert "3.00 s" in row
    assert "2.00 s" in row
    assert "+50.0%" in row
    assert "MISSED" in row
    assert "none (this run becomes the baseline)" in render(metrics, None)

    path.write_text("{not json", encoding="utf-8")
    assert load_previous(path) is None
    assert format_change(1.0, None) == "-"
    assert format_change(0.9, 1.0) == "-10.0%"
    assert format_change(1.0000001, 1.0) == "0.0%"


# The whole quick run waits more than it computes (servers, subprocesses, a browser starting):
# about 45 s of CPU and 60-120 s of wall time, so the test that makes one gets more than 120 s.
# It runs as users run it, in a process of its own: in this one, whose heap holds what thousands
# of tests left, each round's full garbage collection made the same run take 2.5 times as long.
WHOLE_QUICK_RUN = pytest.mark.timeout(360)


@WHOLE_QUICK_RUN
def test_cli_quick_runs_every_benchmark_and_compares_with_the_previous_run(tmp_path: Path) -> None:
    path = tmp_path / "latest.json"
    save(path, [Metric("replay.200.seconds", "replay 200 entries", 1.0, "s")])
    before = load_previous(path)
    assert isinstance(before, Previous)

    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--results", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=330,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = done.stdout
    assert f"previous run: {before.created_at}" in out
    row = next(line for line in out.splitlines() if line.startswith("replay 200 entries "))
    assert "1.00 s" in row
    assert "%" in row
    assert f"saved to {path}" in out

    saved = load_previous(path)
    assert saved is not None
    assert {"replay.ratio", "record.ratio", "memory.user.bytes_per_entry"} <= set(saved.values)
    assert {"turn.none.default.ratio", "turn.sqlite.user.ratio", "rss.50.mb"} <= set(saved.values)
    assert {"rate.turn.ratio", "mcp.sync.ratio", "a2a.call.overhead_ms"} <= set(saved.values)


def test_cli_quick_without_results_never_touches_the_baseline(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # What is measured does not matter here (the test above runs it all): only where it goes.
    baseline = tmp_path / "latest.json"
    save(baseline, [Metric("replay.200.seconds", "replay 200 entries", 1.0, "s")])
    kept = baseline.read_bytes()
    measured: list[cli.Config] = []

    def run(config: cli.Config) -> list[Metric]:
        measured.append(config)
        return [Metric("replay.200.seconds", "replay 200 entries", 2.0, "s")]

    monkeypatch.setattr(cli, "RESULTS", baseline)
    monkeypatch.setattr(cli, "run", run)
    assert cli.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "(not saved)" in out
    assert "previous run: none" in out  # a quick run is not compared with the real baseline
    assert measured == [cli.QUICK]
    assert baseline.read_bytes() == kept

    assert cli.main([]) == 0  # a full run compares with the baseline and replaces it
    out = capsys.readouterr().out
    assert "previous run: none" not in out
    assert "+100.0%" in out
    assert measured == [cli.QUICK, cli.FULL]
    replaced = load_previous(baseline)
    assert replaced is not None
    assert replaced.values == {"replay.200.seconds": 2.0}


# -- issue 13: each target beside its floor ----------------------------------------------------


@pytest.mark.parametrize("user_loop", [False, True])
def test_the_agent_makes_one_tool_call_a_turn(user_loop: bool) -> None:
    # agent_seconds checks the calls itself: a run that made another number would raise.
    assert anyio.run(agent_seconds, 4, user_loop) > 0


def test_the_floor_makes_one_tool_call_a_turn() -> None:
    assert anyio.run(floor_seconds, 4) > 0


def test_a_wrong_number_of_calls_is_an_error() -> None:
    counter = Counter()
    counter.calls = 3
    with pytest.raises(RuntimeError, match="3 tool calls in 4 turns"):
        counter.check(4)


def test_save_points_cut_the_history_before_each_model_request() -> None:
    points = save_points(3)
    assert len(points) == 3 + 2  # one before each of the 4 requests, then the rest
    assert all(point[-1].kind == "model_request" for point in points[:-1])
    assert "model_request" not in {entry.kind for entry in points[-1]}
    entries = [entry for point in points for entry in point]
    assert [entry.seq for entry in entries] == list(range(len(entries)))


def test_save_points_before_tools_also_cut_after_each_reply_that_calls_tools() -> None:
    points = save_points(3, before_tools=True)
    assert len(points) == 3 + 3 + 2  # the 3 replies that call the tool add a point each
    ends = [point[-1] for point in points[:-1]]
    assert [end.kind for end in ends] == ["model_request", "model_reply"] * 3 + ["model_request"]
    kinds = [entry.kind for point in points for entry in point]
    assert kinds == [entry.kind for point in save_points(3) for entry in point]


@pytest.mark.parametrize(
    ("in_thread", "before_tools"), [(True, False), (False, False), (True, True)]
)
def test_the_sqlite_floor_commits_every_entry(
    tmp_path: Path, in_thread: bool, before_tools: bool
) -> None:
    points = save_points(3, before_tools=before_tools)
    db = SQLiteFloor(tmp_path / "floor.db")
    try:
        commit = db.commit if in_thread else db.commit_here
        anyio.run(functools.partial(floor_seconds, before_tools=before_tools), 3, commit, points)
    finally:
        db.close()
    with contextlib.closing(sqlite3.connect(tmp_path / "floor.db")) as check:
        rows = check.execute("SELECT seq, data FROM entries ORDER BY seq").fetchall()
        mode = check.execute("PRAGMA journal_mode").fetchone()
    entries = [entry for point in points for entry in point]
    assert [decode_entry(data, state_id="x", index=seq) for seq, data in rows] == entries
    assert mode == ("wal",)


def test_paired_starts_each_round_one_further_along() -> None:
    order: list[str] = []

    def run(name: str) -> float:
        order.append(name)
        return float(len(order))

    results = paired({name: lambda name=name: run(name) for name in "abc"}, 3)
    assert order == ["a", "b", "c", "a", "b", "c", "b", "c", "a", "c", "a", "b"]  # a warm-up first
    assert results == {"a": [4.0, 9.0, 11.0], "b": [5.0, 7.0, 12.0], "c": [6.0, 8.0, 10.0]}

    order.clear()
    paired({name: lambda name=name: run(name) for name in "ab"}, 1, warm_up=False)
    assert order == ["a", "b"]


def test_peak_rss_prints_the_peak_of_the_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert peak_rss.main(["floor", "5"]) == 0
    assert int(capsys.readouterr().out) > 1_000_000
    assert peak_rss.main(["nothing", "5"]) == 2


def test_bench_inside() -> None:
    started: list[str] = []
    metrics = bench_inside(3, 1, 5, 3, started.append)
    by_key = check(
        metrics,
        {
            "turn.none.floor.us",
            "turn.none.default.us",
            "turn.none.default.ratio",
            "turn.none.user.us",
            "turn.none.user.ratio",
            "turn.sqlite.floor.us",
            "turn.sqlite.floor_here.us",
            "turn.sqlite.floor_points.us",
            "turn.sqlite.floor_points_here.us",
            "turn.sqlite.default.us",
            "turn.sqlite.default.ratio",
            "turn.sqlite.default.points_ratio",
            "turn.sqlite.default.points_here_ratio",
            "turn.sqlite.default.here_ratio",
            "turn.sqlite_thread.default.points_ratio",
            "turn.sqlite.user.us",
            "turn.sqlite.user.ratio",
            "turn.sqlite.user.points_ratio",
            "turn.sqlite.user.points_here_ratio",
            "turn.sqlite.user.here_ratio",
            "turn.sqlite_thread.user.points_ratio",
            "turn.aiosqlite.default.us",
            "turn.aiosqlite.default.ratio",
            "turn.aiosqlite.user.us",
            "turn.aiosqlite.user.ratio",
            "tools.async.50.warm.ms",
            "tools.async.50.floor.ms",
            "tools.async.50.ratio",
            "tools.sync.50.warm.ms",
            "tools.sync.50.floor.ms",
            "tools.sync.50.ratio",
            "rss.5.mb",
            "rss.import.mb",
            "rss.5.floor.mb",
            "subagents.fanout.3.s",
            "subagents.fanout.3.peak_mb",
            "subagents.fanout.3.sqlite.s",
            "subagents.fanout.3.sqlite.ratio",
            "subagents.fanout.3.aiosqlite.s",
        },
    )
    assert len(started) == 5
    targets = {
        "turn.none.default.us": "≤ 100 µs",
        "turn.none.user.ratio": "≤ 2.5x",
        "turn.sqlite.default.us": "≤ 300 µs",
        "turn.sqlite.user.ratio": "≤ 2x",
        "turn.sqlite.default.points_ratio": "≤ 1.5x",
        "turn.aiosqlite.default.ratio": "≤ 1.5x",
        "tools.async.50.warm.ms": "≤ 15 ms",
        "tools.sync.50.warm.ms": "≤ 30 ms",
        "rss.5.mb": "≤ 40 MB",
    }
    for key, target in targets.items():
        assert by_key[key].target == target
        assert by_key[key].ok is not None
    assert by_key["turn.none.floor.us"].target is None
    # A process that imports the library holds more than one that does not.
    assert by_key["rss.import.mb"].value > by_key["rss.5.floor.mb"].value


def test_bench_otel() -> None:
    by_key = check(
        bench_otel(5, 1),
        {
            "otel.none.us",
            "otel.noop.us",
            "otel.idle.us",
            "otel.idle.ratio",
            "otel.recording.us",
            "otel.recording.ratio",
        },
    )
    assert by_key["otel.idle.ratio"].target == "≤ 1.2x"


def test_bench_mcp() -> None:
    """Issue 31: a served tool's call beside the bare SDK tool's, sync and async."""
    keys = {
        f"mcp.{kind}.{row}"
        for kind in ("sync", "async")
        for row in ("serve_tools.p50_us", "bare.p50_us", "ratio")
    }
    by_key = check(bench_mcp(3), keys)
    for kind in ("sync", "async"):
        ours, bare = by_key[f"mcp.{kind}.serve_tools.p50_us"], by_key[f"mcp.{kind}.bare.p50_us"]
        assert by_key[f"mcp.{kind}.ratio"].value == pytest.approx(ours.value / bare.value)


def test_bench_limits() -> None:
    """Issue 29: per turn with every limit set, beside the floor without limits."""
    by_key = check(bench_limits(5, 1), {"limits.none.us", "limits.set.us", "limits.ratio"})
    assert by_key["limits.ratio"].target == "≤ 1.1x"


# -- issue 27, part 3: following a run from another process ----------------------------------


def test_bench_follow() -> None:
    """The SQLite rows (PostgreSQL's need a server): each delay beside its floor, in ms."""
    from benchmarks.follow_bench import bench_follow

    metrics = {metric.key: metric for metric in bench_follow(count=3, gap=0.01)}
    for key in ("follow.sqlite.p50_ms", "follow.sqlite.floor.p99_ms", "follow.tree.sqlite.p99_ms"):
        assert metrics[key].unit == "ms"
        assert metrics[key].value > 0
    assert metrics["follow.sqlite.p50.ratio"].value > 0
    assert metrics["follow.tree.sqlite.p50.ratio"].value > 0
    assert metrics["follow.tree.sqlite.probe_us"].value > 0


# -- issue 30: what the model was told, recorded ------------------------------------------------


def test_bench_prompt() -> None:
    """A short run with the prompt beside its floor: the same history without prompts."""
    from benchmarks.prompt_bench import bench_prompt, recorded_run, without_prompts

    metrics = check(
        bench_prompt(turns=5),
        {
            f"prompt.{part}"
            for part in (
                "sqlite.floor.kb",
                "sqlite.kb",
                "sqlite.growth",
                "entries.floor.kb",
                "entries.kb",
                "entries.growth",
                "child.growth",
            )
        },
    )
    assert metrics["prompt.entries.kb"].value > metrics["prompt.entries.floor.kb"].value
    state = recorded_run(3)
    floor = without_prompts(state)
    assert [entry.kind for entry in state.history if entry.kind != "prompt"] == [
        entry.kind for entry in floor.history
    ]
    assert floor.messages == state.messages


def test_bench_prompt_fan_out() -> None:
    """A lead and a few subagents of one agent: one copy of their prompt, beside a copy each."""
    from benchmarks.prompt_bench import bench_fan_out, recorded_tree, with_copies, without_prompts

    metrics = check(
        bench_fan_out(children=3),
        {
            f"prompt.fanout.{part}"
            for part in (
                "entries.floor.kb",
                "entries.kb",
                "entries.growth",
                "entries.copies.growth",
                "sqlite.growth",
                "sqlite.copies.growth",
            )
        },
    )
    growth = metrics["prompt.fanout.entries.growth"].value
    assert growth < metrics["prompt.fanout.entries.copies.growth"].value
    tree = recorded_tree(3)
    held = [sum(entry.kind == "prompt" for entry in state.history) for state in tree]
    # The lead's prompt, and the subagents' once: held by whichever subagent asked first.
    assert (held[0], sorted(held[1:])) == (1, [0, 0, 1])
    copies = with_copies(tree)
    assert [sum(entry.kind == "prompt" for entry in state.history) for state in copies] == [
        1,
        1,
        1,
        1,
    ]
    for state, copy, floor in zip(tree, copies, map(without_prompts, tree), strict=True):
        assert copy.messages == state.messages == floor.messages


# -- issue 28: runs followed over HTTP -----------------------------------------------------------


def test_bench_runs() -> None:
    """A few runs, each followed by an SSE client, beside as many bare SSE streams."""
    from benchmarks.runs_bench import bench_runs

    metrics = {metric.key: metric for metric in bench_runs(count=3, turns=1, gap=0.01)}
    names = ("p50_ms", "p99_ms", "events_per_s", "rss_per_run_kb", "idle_cpu")
    assert set(metrics) == {
        *(f"runs.{name}" for name in names),
        *(f"runs.floor.{name}" for name in names),
        "runs.p50.ratio",
    }
    for metric in metrics.values():
        assert math.isfinite(metric.value), metric  # RSS may even shrink, at this size
    for side in ("runs", "runs.floor"):
        assert metrics[f"{side}.p50_ms"].value <= metrics[f"{side}.p99_ms"].value
        assert metrics[f"{side}.events_per_s"].value > 0


def test_bench_a2a() -> None:
    """A few remote subagent turns beside the SDK's bare client, against the SDK's server."""
    from benchmarks.a2a_bench import bench_a2a

    metrics = {metric.key: metric for metric in bench_a2a(calls=3)}
    assert set(metrics) == {"a2a.call.floor.p50_ms", "a2a.call.p50_ms", "a2a.call.overhead_ms"}
    assert metrics["a2a.call.floor.p50_ms"].value > 0
    assert metrics["a2a.call.p50_ms"].value > 0
    overhead = metrics["a2a.call.p50_ms"].value - metrics["a2a.call.floor.p50_ms"].value
    assert metrics["a2a.call.overhead_ms"].value == pytest.approx(overhead)


def test_bench_reconnect() -> None:
    """A reconnect near the end of a small stored tree, beside reading its tail, per store."""
    from benchmarks.reconnect_bench import bench_reconnect

    metrics = {metric.key: metric for metric in bench_reconnect(turns=2, fan=3, repeats=1)}
    for name in ("memory", "sqlite"):
        assert metrics[f"reconnect.{name}.ms"].value > 0
        assert metrics[f"reconnect.{name}.floor.ms"].value > 0
        assert metrics[f"reconnect.{name}.ratio"].unit == "x"
    assert len(metrics) == 6


def test_the_rate_benchmark_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks.rate_bench import bench_rate

    monkeypatch.delenv("ORCHESTRATOR_TEST_POSTGRES_DSN", raising=False)
    metrics = bench_rate(turns=3, rounds=1, acquires=5, fair_seconds=0.2, progress=lambda _: None)
    by_key = {m.key: m for m in metrics}
    assert {
        "rate.turn.ratio",
        "rate.turn.tokens.ratio",
        "rate.take.sqlite.p50.us",
        "rate.take.sqlite.floor.p50.us",
        "rate.slot.sqlite.p50.us",
        "rate.slot.sqlite.floor.p50.us",
        "rate.fair.sqlite.jain",
        "rate.fair.sqlite.rate",
    } <= set(by_key)
    assert not any(
        key.startswith(("rate.take.postgres", "rate.slot.postgres", "rate.fair.postgres"))
        for key in by_key
    )
    for metric in metrics:
        assert math.isfinite(metric.value)
        assert metric.value > 0, metric


def test_viewer_bench_measures_the_api_show_and_paint_beside_their_floors() -> None:
    metrics = bench_viewer(2, 3, 1, lambda _: None)
    keys = {
        "viewer.load_tree.floor.ms",
        "viewer.api_run.ms",
        "viewer.show.floor.ms",
        "viewer.show.ms",
        "viewer.paint.floor.ms",
        "viewer.paint.ms",
        *(
            f"viewer.state_json.{who}.{part}"
            for who in ("lead", "researcher")
            for part in ("floor.kb", "kb")
        ),
    }
    by_key = check(metrics, keys)
    assert "-entry tree, 3 States" in by_key["viewer.api_run.ms"].label
    for who in ("lead", "researcher"):  # a page holds its history and the requests' messages
        page = by_key[f"viewer.state_json.{who}.kb"].value
        assert page > by_key[f"viewer.state_json.{who}.floor.kb"].value > 0
