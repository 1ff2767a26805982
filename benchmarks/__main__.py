"""Run the benchmarks: ``python -m benchmarks`` (or ``make bench``).

Prints a table of the results next to the previous run's (``benchmarks/results/latest.json``),
then saves this run there. ``--quick`` runs everything at a tiny size, to check that it works,
except the runner rows (a local Ray cluster in a network namespace: the Ray tests check those).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .a2a_bench import bench_a2a
from .agent_bench import bench_parallel_tools, bench_subagents, bench_turns
from .events_bench import bench_events
from .follow_bench import bench_follow
from .inside_bench import bench_inside
from .limits_bench import bench_limits
from .mcp_bench import bench_mcp
from .otel_bench import bench_otel
from .postgres_bench import bench_postgres
from .prompt_bench import bench_fan_out, bench_prompt
from .rate_bench import bench_rate
from .ray_bench import bench_ray
from .reconnect_bench import bench_reconnect
from .report import Metric, load_previous, render, save
from .runs_bench import bench_runs
from .state_bench import bench_materialize, bench_memory, bench_recording, bench_replay
from .store_metrics import bench_stores
from .viewer_bench import bench_viewer
from .workload import build_history

RESULTS = Path(__file__).parent / "results" / "latest.json"


@dataclass(frozen=True, slots=True)
class Config:
    """The sizes a run measures at."""

    replay_sizes: tuple[int, ...]
    record_points: tuple[int, ...]
    record_batch: int
    memory_count: int
    read_size: int
    repeats: int
    turn_counts: tuple[int, ...] = (200, 2_000)
    fanout: int = 1_000
    store_append: int = 10_000
    store_load: int = 100_000
    store_turns: int = 200
    store_crowd: int = 10_000
    inside_turns: int = 200
    rss_turns: int = 2_000
    runs: int = 1_000  # runs followed over HTTP at once (issue 28)
    viewer: tuple[int, int] = (20, 160)  # researchers x turns: a tree of ~10,000 entries (issue 30)
    ray: bool = True  # the runner rows: a local Ray cluster, in a loopback-only namespace

    @property
    def history_size(self) -> int:
        """How many entries the shared recorded history needs."""
        return max(*self.replay_sizes, *self.record_points, self.read_size)


FULL = Config(
    replay_sizes=(10_000, 100_000),
    record_points=(1_000, 100_000),
    record_batch=1_000,
    memory_count=5_000,
    read_size=100_000,
    repeats=5,
)
QUICK = Config(
    replay_sizes=(200, 2_000),
    record_points=(200, 2_000),
    record_batch=200,
    memory_count=200,
    read_size=2_000,
    repeats=2,
    turn_counts=(20, 200),
    fanout=20,
    store_append=300,
    store_load=1_000,
    store_turns=20,
    store_crowd=100,
    inside_turns=20,
    rss_turns=50,
    runs=5,
    viewer=(2, 5),
    ray=False,
)


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run(config: Config) -> list[Metric]:
    """Run every benchmark at the sizes of `config`."""
    _progress(f"recording a history of {config.history_size:,} entries ...")
    start = time.perf_counter()
    recorded = build_history(config.history_size)
    elapsed = time.perf_counter() - start
    size = len(recorded.history)
    metrics = [
        Metric(
            "record.build.us_per_entry",
            f"record {size:,} entries from empty, per entry",
            elapsed / size * 1e6,
            "µs",
        )
    ]
    _progress("replay ...")
    metrics += bench_replay(recorded, config.replay_sizes, config.repeats)
    _progress("recording as history grows ...")
    metrics += bench_recording(recorded, config.record_points, config.record_batch, config.repeats)
    _progress("memory ...")
    metrics += bench_memory(config.memory_count)
    _progress("reads after a change ...")
    metrics += bench_materialize(recorded, config.read_size, config.repeats)
    # The recorded history is millions of objects: alive, it would make every full collection
    # of the garbage collector in the benchmarks below scan it (the 1,000-child fan-out took
    # 1.0 s beside it, 0.7 s without).
    del recorded
    gc.collect()
    _progress("agent loop: turns ...")
    metrics += bench_turns(config.turn_counts, config.repeats)
    _progress("agent loop: parallel tools ...")
    metrics += bench_parallel_tools(config.repeats)
    _progress("events ...")
    metrics += bench_events(
        config.inside_turns, 1_000 if config.rss_turns > 100 else 50, config.repeats
    )
    _progress("subagents ...")
    metrics += bench_subagents(config.repeats)
    metrics += bench_inside(
        config.inside_turns, config.repeats, config.rss_turns, config.fanout, _progress
    )
    _progress("tracing reporter ...")
    # 21 rounds in a full run (a round is 4 runs of ~40 ms): with 7, the machine's noise moved
    # the ratio between x1.12 and x1.24 while the reporter's hooks cost 3.7 µs of ~170 a turn.
    metrics += bench_otel(config.inside_turns, config.repeats * 4 + 1)
    metrics += bench_limits(config.inside_turns, config.repeats * 4 + 1)
    _progress("stores ...")
    metrics += bench_stores(
        config.store_append, config.store_load, config.store_turns, config.store_crowd
    )
    _progress("prompts in the store ...")
    metrics += bench_prompt(config.store_turns)
    metrics += bench_fan_out(20)
    quick = config.store_load < 100_000
    metrics += bench_postgres(
        saves=30 if quick else 300,
        crowd=config.store_crowd if quick else 100,
        rounds=3 if quick else 20,
        load_entries=config.store_load,
        children=config.fanout,
        repeats=1 if quick else config.repeats,
        progress=_progress,
    )
    # A writer process saving a State, the follower here waiting: 30 ms between saves, like
    # save points close together (the polling backs off to 100 ms between saves further apart).
    metrics += bench_follow(count=10 if quick else 200, gap=0.03, progress=_progress)
    # Each run: a tool waiting at a gate, 3 tools of 50 ms, an answer; its SSE client reads
    # about 11 events.
    metrics += bench_runs(count=config.runs, turns=3, gap=0.05, progress=_progress)
    # A client reconnecting 10 events before the end of a stored tree of ~10,000 entries.
    metrics += bench_reconnect(
        turns=2 if quick else 20,
        fan=5 if quick else 80,
        repeats=2 if quick else 5,
        progress=_progress,
    )
    # Issue 29: a rate limiter's cost per turn and per take of a store's row, and its fairness.
    metrics += bench_rate(
        turns=config.inside_turns // 2,
        rounds=config.repeats * 2 + 1,
        acquires=50 if quick else 1_000,
        fair_seconds=0.5 if quick else 3.0,
        progress=_progress,
    )
    metrics += bench_viewer(*config.viewer, repeats=min(config.repeats, 3), progress=_progress)
    _progress("MCP serving ...")
    metrics += bench_mcp(50 if quick else 2_000)
    _progress("A2A calls ...")
    # Issue 31: a remote subagent turn beside the SDK's bare client calling the same server.
    metrics += bench_a2a(calls=5 if quick else 200)
    if config.ray:
        metrics += bench_ray(quick=False, progress=_progress)
    return metrics


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmarks, print the table and save the results; return the exit code."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to check that it runs")
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help="the JSON file to compare with and write (default: benchmarks/results/latest.json;"
        " none with --quick, so a quick run never replaces the real baseline)",
    )
    parser.add_argument("--no-save", action="store_true", help="compare, but do not write")
    args = parser.parse_args(argv)
    results: Path | None = args.results if args.results is not None or args.quick else RESULTS
    previous = load_previous(results) if results is not None else None
    started = time.perf_counter()
    metrics = run(QUICK if args.quick else FULL)
    print(render(metrics, previous))
    print(f"\n{len(metrics)} results in {time.perf_counter() - started:.1f} s", end="")
    if results is None or args.no_save:
        print(" (not saved)")
    else:
        save(results, metrics)
        shown = results.relative_to(Path.cwd()) if results.is_relative_to(Path.cwd()) else results
        print(f", saved to {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
