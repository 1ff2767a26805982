"""Issue 29's measured target: what `Limits` cost a turn.

The harness of issue 13 (`benchmarks.exchange`: a model deciding from the message count, one
async tool a turn), run without limits (the floor) and with a `Limits` setting every field the
run checks per turn (tokens, cost, requests, tool calls, time), in rounds
(`inside_bench.paired`); the ratio is the median of each round's ratio to the floor. Target: at
most 1.1x. A third row runs the same turns in a child of a parent with limits, so each reply
counts up a chain of two budgets.

``python -m benchmarks.limits_bench`` prints only these rows (``--quick``: tiny sizes).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import anyio

from orchestrator import Agent, Limits, tool

from .exchange import Counter, counting_tool, deciding_model
from .inside_bench import paired
from .report import Metric, render

__all__ = ("bench_limits", "main")

TARGET = 1.1  # issue 29: at most 10% more per turn than no limits

EVERY = Limits(
    input_tokens=10**12,
    output_tokens=10**12,
    total_tokens=10**12,
    cost=1e12,
    requests=10**9,
    tool_calls=10**9,
    children=10**9,
    depth=50,
    seconds=1e9,
)


async def turns_seconds(turns: int, limits: Limits | None) -> float:
    """Seconds of one `arun` of `turns` tool turns under `limits`; the Agent built first."""
    counter = Counter()
    agent = Agent(deciding_model(turns), tools=[tool(counting_tool(counter))], max_turns=turns + 1)
    start = time.perf_counter()
    await agent.arun("go", limits=limits)
    elapsed = time.perf_counter() - start
    counter.check(turns)
    return elapsed


def bench_limits(turns: int, repeats: int) -> list[Metric]:
    """µs per turn without limits and with every per-turn limit set; their ratio."""

    def timed(limits: Limits | None) -> Callable[[], float]:
        return lambda: anyio.run(turns_seconds, turns, limits)

    results = paired({"none": timed(None), "limits": timed(EVERY)}, repeats)

    def us(name: str) -> float:
        return statistics.median(results[name]) / turns * 1e6

    pairs = zip(results["limits"], results["none"], strict=True)
    ratio = statistics.median(value / base for value, base in pairs)
    return [
        Metric("limits.none.us", f"per turn, no limits ({turns} turns)", us("none"), "µs"),
        Metric("limits.set.us", "per turn, Limits with every field set", us("limits"), "µs"),
        Metric(
            "limits.ratio",
            "per turn, Limits with every field set / no limits",
            ratio,
            "x",
            f"≤ {TARGET:g}x",
            ratio <= TARGET,
        ),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """Print issue 29's rows (not saved: ``python -m benchmarks`` keeps the results)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.limits_bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to check that it runs")
    args = parser.parse_args(argv)
    metrics = bench_limits(20, 2) if args.quick else bench_limits(200, 21)
    print(render(metrics, None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
