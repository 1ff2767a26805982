"""Issue 18's measured target: what the tracing reporter costs a turn when nothing is exported.

The harness of issue 13 (`benchmarks.exchange`: a model deciding from the message count, one
async tool a turn), run with no reporter (the floor), with the no-op `Reporter` (what any hook
call costs), with `OtelReporter` and no tracer provider configured (the target: at most 20% more
than no reporter), and, for reference, with `OtelReporter` recording into the SDK's in-memory
exporter. The variants run in rounds (`inside_bench.paired`); a ratio is the median of each
round's ratio to the floor.

``python -m benchmarks.otel_bench`` prints only these rows (``--quick``: tiny sizes).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import anyio

from orchestrator import Agent, Reporter, tool
from orchestrator.otel import OtelReporter

from .exchange import Counter, counting_tool, deciding_model
from .inside_bench import paired
from .report import Metric, render

__all__ = ("bench_otel", "main")

TARGET = 1.2  # issue 18: at most 20% more per turn than no reporter


async def turns_seconds(turns: int, reporter: Reporter | None) -> float:
    """Seconds of one `arun` of `turns` tool turns with `reporter`; the Agent built first."""
    counter = Counter()
    agent = Agent(
        deciding_model(turns),
        tools=[tool(counting_tool(counter))],
        max_turns=turns + 1,
        reporter=reporter,
    )
    start = time.perf_counter()
    await agent.arun("go")
    elapsed = time.perf_counter() - start
    counter.check(turns)
    return elapsed


def _recording() -> Reporter | None:
    """An `OtelReporter` recording into the SDK's in-memory exporter, or None without the SDK."""
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    except ImportError:  # pragma: no cover - the SDK is a dev dependency
        return None
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    return OtelReporter(tracer_provider=provider)


def bench_otel(turns: int, repeats: int) -> list[Metric]:
    """µs per turn: no reporter, the no-op Reporter, OtelReporter idle and recording."""

    def timed(make: Callable[[], Reporter | None]) -> Callable[[], float]:
        return lambda: anyio.run(turns_seconds, turns, make())

    runs: dict[str, Callable[[], float]] = {
        "none": timed(lambda: None),
        "noop": timed(Reporter),
        "idle": timed(OtelReporter),
    }
    if _recording() is not None:
        runs["recording"] = timed(_recording)
    results = paired(runs, repeats)

    def us(name: str) -> float:
        return statistics.median(results[name]) / turns * 1e6

    def ratio(name: str) -> float:
        pairs = zip(results[name], results["none"], strict=True)
        return statistics.median(value / base for value, base in pairs)

    idle = ratio("idle")
    metrics = [
        Metric("otel.none.us", f"per turn, no reporter ({turns} turns)", us("none"), "µs"),
        Metric("otel.noop.us", "per turn, the no-op Reporter", us("noop"), "µs"),
        Metric("otel.idle.us", "per turn, OtelReporter, no tracer provider", us("idle"), "µs"),
        Metric(
            "otel.idle.ratio",
            "per turn, OtelReporter with no tracer provider / no reporter",
            idle,
            "x",
            f"≤ {TARGET:g}x",
            idle <= TARGET,
        ),
    ]
    if "recording" in results:
        metrics += [
            Metric(
                "otel.recording.us",
                "per turn, OtelReporter recording (SDK, in-memory exporter)",
                us("recording"),
                "µs",
            ),
            Metric(
                "otel.recording.ratio",
                "per turn, OtelReporter recording / no reporter",
                ratio("recording"),
                "x",
            ),
        ]
    return metrics


def main(argv: Sequence[str] | None = None) -> int:
    """Print issue 18's rows (not saved: ``python -m benchmarks`` keeps the results)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.otel_bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to check that it runs")
    args = parser.parse_args(argv)
    metrics = bench_otel(20, 2) if args.quick else bench_otel(200, 21)
    print(render(metrics, None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
