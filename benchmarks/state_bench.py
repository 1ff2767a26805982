"""Benchmarks of the foundation: replay, recording cost as history grows, memory, reads.

Each function takes its sizes as arguments (the smoke test runs them tiny) and returns `Metric`s.
Times are the best of `repeats` runs measured with `time.perf_counter`; set-up is not timed.
"""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections.abc import Callable, Sequence

from orchestrator import HistoryEntry, Message, Reply, State, TextBlock, ToolCall, ToolResultBlock
from orchestrator._record._recording import begin_think, record_reply, record_tool_result

from .report import Metric
from .workload import USAGE, Recorded, record_until

__all__ = ("bench_materialize", "bench_memory", "bench_recording", "bench_replay", "best_of")

# What the foundation issue asks for.
REPLAY_LIMIT_SIZE = 100_000
REPLAY_LIMIT_SECONDS = 1.0
LINEAR_SLACK = 1.25  # a ratio up to 25% above linear still counts as linear
FLAT_SLACK = 1.5  # recording at the large size may cost up to 1.5x the small one


def best_of(repeats: int, run: Callable[[], float]) -> float:
    """The smallest of `repeats` results of `run()`, which returns the seconds it measured."""
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    results: list[float] = []
    for _ in range(repeats):
        gc.collect()
        results.append(run())
    return min(results)


def _size(n: int) -> str:
    return f"{n:,}"


def bench_replay(recorded: Recorded, sizes: Sequence[int], repeats: int) -> list[Metric]:
    """`State(history=h)` for the first `size` entries of the mix, for each of `sizes`."""
    metrics: list[Metric] = []
    seconds: dict[int, float] = {}
    for size in sizes:
        history = recorded.history[:size]
        if len(history) != size:
            raise ValueError(f"the recorded history has fewer than {size} entries")

        def run(history: tuple[HistoryEntry, ...] = history) -> float:
            start = time.perf_counter()
            State(history=history)
            return time.perf_counter() - start

        best = best_of(repeats, run)
        seconds[size] = best
        at_limit = size == REPLAY_LIMIT_SIZE
        metrics.append(
            Metric(
                f"replay.{size}.seconds",
                f"replay {_size(size)} entries",
                best,
                "s",
                target=f"< {REPLAY_LIMIT_SECONDS:g} s" if at_limit else None,
                ok=best < REPLAY_LIMIT_SECONDS if at_limit else None,
            )
        )
        metrics.append(
            Metric(
                f"replay.{size}.us_per_entry",
                f"replay {_size(size)} entries, per entry",
                best / size * 1e6,
                "µs",
            )
        )
    if len(sizes) >= 2:
        small, large = min(sizes), max(sizes)
        expected = large / small
        ratio = seconds[large] / seconds[small]
        metrics.append(
            Metric(
                "replay.ratio",
                f"replay {_size(large)} / {_size(small)}",
                ratio,
                "x",
                target=f"about {expected:g} (linear)",
                ok=ratio <= expected * LINEAR_SLACK,
            )
        )
    return metrics


def bench_recording(
    recorded: Recorded, points: Sequence[int], batch: int, repeats: int
) -> list[Metric]:
    """The cost per entry of recording `batch` more entries when the history already has about
    `point` entries, for each of `points`: whole turns of the mix, and user messages alone (no
    think, so only the fold). Flat means O(1) amortized recording.
    """
    metrics: list[Metric] = []
    per_entry: dict[int, float] = {}
    for point in points:
        prefix, next_turn = recorded.closed_prefix(point)

        def mix(prefix: tuple[HistoryEntry, ...] = prefix, next_turn: int = next_turn) -> float:
            state = State(history=prefix)
            start = time.perf_counter()
            added, _ = record_until(state, batch, next_turn)
            return (time.perf_counter() - start) / added

        def users(prefix: tuple[HistoryEntry, ...] = prefix) -> float:
            state = State(history=prefix)
            messages = [Message.user(f"one more thing ({i})") for i in range(batch)]
            start = time.perf_counter()
            for message in messages:
                state.add_message(message)
            return (time.perf_counter() - start) / batch

        best = best_of(repeats, mix)
        per_entry[point] = best
        metrics.append(
            Metric(
                f"record.at_{point}.us_per_entry",
                f"record {_size(batch)} entries at {_size(point)}, per entry",
                best * 1e6,
                "µs",
            )
        )
        metrics.append(
            Metric(
                f"record.user.at_{point}.us_per_entry",
                f"add_message x {_size(batch)} at {_size(point)}, per entry",
                best_of(repeats, users) * 1e6,
                "µs",
            )
        )
    if len(points) >= 2:
        small, large = min(points), max(points)
        ratio = per_entry[large] / per_entry[small]
        metrics.append(
            Metric(
                "record.ratio",
                f"record at {_size(large)} / at {_size(small)}",
                ratio,
                "x",
                target="about 1 (flat)",
                ok=ratio <= FLAT_SLACK,
            )
        )
    return metrics


def _traced(run: Callable[[], None]) -> int:
    """The bytes still allocated after `run()` (what it keeps alive), measured by tracemalloc."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        run()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def bench_memory(count: int) -> list[Metric]:
    """Bytes kept per history entry: a typical user message, a tool result, the whole mix.

    The measured objects include the message or result itself, as a caller would create it.
    """
    users = State()

    def add_users() -> None:
        for i in range(count):
            users.add_message(Message.user(f"Step {i}: read module {i % 17} and say what it does."))

    user_bytes = _traced(add_users)

    results = State(messages=[Message.user("go")])
    turns = max(1, count // 2)
    results_bytes = 0

    def add_results() -> None:
        # Only the result recording is counted: the think and the reply are subtracted out.
        nonlocal results_bytes
        for i in range(turns):
            calls = (ToolCall(f"c{i}_0", "tool", {"x": i}), ToolCall(f"c{i}_1", "tool", {"x": i}))
            begin_think(results, model="fake")
            record_reply(results, Reply(Message.assistant("..", calls), USAGE))
            before = tracemalloc.get_traced_memory()[0]
            for call in calls:
                block = ToolResultBlock(call.id, (TextBlock("result text"),))
                record_tool_result(results, call, block, outcome="done")
            results_bytes += tracemalloc.get_traced_memory()[0] - before

    _traced(add_results)

    mix = State()
    mix_entries = 0

    def add_mix() -> None:
        nonlocal mix_entries
        mix_entries, _ = record_until(mix, count)

    mix_bytes = _traced(add_mix)
    return [
        Metric(
            "memory.user.bytes_per_entry", "memory per user message entry", user_bytes / count, "B"
        ),
        Metric(
            "memory.tool_result.bytes_per_entry",
            "memory per tool result entry",
            results_bytes / (2 * turns),
            "B",
        ),
        Metric(
            "memory.mix.bytes_per_entry",
            "memory per entry of the mix",
            mix_bytes / mix_entries,
            "B",
        ),
    ]


def bench_materialize(recorded: Recorded, size: int, repeats: int) -> list[Metric]:
    """The first read after a change of `snapshot()`, `messages` and `history` at `size` entries,
    and a repeated `snapshot()` (cached).
    """
    prefix, _ = recorded.closed_prefix(size)
    state = State(history=prefix)
    counter = 0

    def first_read(read: Callable[[], object]) -> Callable[[], float]:
        def run() -> float:
            nonlocal counter
            counter += 1
            state.add_message(Message.user(f"one more thing ({counter})"))
            start = time.perf_counter()
            read()
            return time.perf_counter() - start

        return run

    def cached() -> float:
        state.snapshot()
        start = time.perf_counter()
        state.snapshot()
        return time.perf_counter() - start

    snapshot = best_of(repeats, first_read(state.snapshot))
    messages = best_of(repeats, first_read(lambda: state.messages))
    history = best_of(repeats, first_read(lambda: state.history))
    again = best_of(repeats, cached)
    at = _size(len(prefix))
    return [
        Metric(
            f"read.snapshot.at_{size}.ms", f"first snapshot() at {at} entries", snapshot * 1e3, "ms"
        ),
        Metric(
            f"read.messages.at_{size}.ms", f"first .messages at {at} entries", messages * 1e3, "ms"
        ),
        Metric(
            f"read.history.at_{size}.ms", f"first .history at {at} entries", history * 1e3, "ms"
        ),
        Metric(
            f"read.snapshot_cached.at_{size}.us",
            f"cached snapshot() at {at} entries",
            again * 1e6,
            "µs",
        ),
    ]
